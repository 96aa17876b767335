//! The Chat tab with a Remote backend, against the in-test OpenAI-like server on 127.0.0.1: switch a
//! conversation to Remote, list the server's models, send, watch the reply stream in, Stop, and a
//! server that goes away mid-reply (an error under the partial text). The conversation keeps its
//! backend across a restart, and its key only when remembered.

use std::time::Duration;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

use super::DriftApp;
use super::chat_tests::{
    PATIENCE, chat_harness, last_content, send, set_number, type_into, wait_for_reply,
};
use super::test_support::{step_until, temp_root};
use crate::remote::test_server::{Behaviour, Failure, TestServer};

fn pieces(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("word{i} ")).collect()
}

fn set_text(h: &mut Harness<'static, DriftApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.run();
    h.get_by_label(label).set_text_value_accesskit(text);
    h.run();
}

fn last_error(h: &Harness<'static, DriftApp>) -> Option<String> {
    let c = h.state().chat.current_conversation();
    c.messages.last().and_then(|m| m.error.clone())
}

#[test]
fn a_remote_conversation_streams_stops_and_survives_a_server_that_goes_away() {
    let server = TestServer::start(Behaviour {
        models: vec!["tiny-remote".into()],
        api_key: Some("k-123".into()),
        pieces: pieces(30),
        delay: Duration::from_millis(40),
        ..Behaviour::default()
    });
    let root = temp_root("chat-remote");
    let mut h = chat_harness(&root);
    h.run();

    h.get_by_label("Remote server").click();
    h.run();
    assert!(h.state().chat.current_conversation().backend.use_remote);
    h.get_by_label("No server chosen");
    type_into(&mut h, "Server URL", &format!("{}/v1", server.url));

    // A wrong key: the model list says so.
    type_into(&mut h, "API key", "wrong");
    h.get_by_label("Refresh").click();
    step_until(&mut h, PATIENCE, "the model list to fail", |h| {
        h.state().chat.remote_models.error.is_some()
    });
    h.run();
    h.get_by_label_contains("refused the API key");

    // The right key: the server's only model is listed and picked.
    set_text(&mut h, "API key", "k-123");
    h.get_by_label("Refresh").click();
    step_until(&mut h, PATIENCE, "the model list", |h| {
        !h.state().chat.remote_models.models.is_empty()
    });
    h.run();
    assert_eq!(h.state().chat.remote_models.models, ["tiny-remote"]);
    assert_eq!(
        h.state().chat.current_conversation().backend.remote.model,
        "tiny-remote"
    );
    h.get_by_label("1 model on the server");
    h.get_by_label("kept only until Drift closes");
    set_number(&mut h, "Temperature", 0.25);

    send(&mut h, "Hello remote");
    step_until(&mut h, PATIENCE, "streamed text", |h| {
        h.state().chat.is_generating() && !last_content(h).is_empty()
    });
    h.get_by_label_contains("Chat: receiving from the server");
    wait_for_reply(&mut h);
    let conv = h.state().chat.current_conversation().clone();
    let reply = &conv.messages[1];
    assert_eq!(reply.content, pieces(30).concat());
    assert_eq!(reply.error, None);
    let stats = reply.stats.as_ref().expect("stats under the reply");
    assert_eq!(
        (stats.decode_tokens, stats.stop_reason.as_str()),
        (30, "eos")
    );
    assert_eq!(
        stats.prefill_tokens, 2,
        "the server's usage (its word count)"
    );
    assert!(stats.decode_tokens_per_s > 0.0);
    h.get_by_label_contains("30 tokens · prefill 2 tokens");
    let req = server.requests().pop().unwrap();
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.authorization.as_deref(), Some("Bearer k-123"));
    assert_eq!(req.body["model"], "tiny-remote");
    assert_eq!(req.body["messages"][0]["content"], "Hello remote");
    assert_eq!(req.body["temperature"], 0.25);
    // Saved with its backend, and without the key (not remembered).
    let file = root.join(format!("data/conversations/{}.json", conv.id));
    let saved = std::fs::read_to_string(&file).unwrap();
    assert!(saved.contains("\"use_remote\": true") && saved.contains(&server.url));
    assert!(!saved.contains("k-123"), "{saved}");

    // Stop mid-stream keeps the text so far.
    send(&mut h, "Again, please");
    step_until(&mut h, PATIENCE, "streamed text", |h| {
        !last_content(h).is_empty()
    });
    h.get_by_label("Stop").click();
    h.step();
    wait_for_reply(&mut h);
    let stopped = h.state().chat.current_conversation().messages[3].clone();
    assert!(!stopped.content.is_empty() && stopped.content.len() < pieces(30).concat().len());
    assert_eq!(stopped.stats.unwrap().stop_reason, "cancelled");

    // A server that drops the connection after three pieces.
    let flaky = TestServer::start(Behaviour {
        models: vec!["tiny-remote".into()],
        pieces: pieces(10),
        failure: Failure::CloseAfter(3),
        ..Behaviour::default()
    });
    set_text(&mut h, "Server URL", &flaky.url);
    send(&mut h, "And once more");
    wait_for_reply(&mut h);
    assert_eq!(
        last_content(&h),
        pieces(3).concat(),
        "the partial reply is kept"
    );
    let why = last_error(&h).expect("an error under the reply");
    assert!(why.contains("before the reply was finished"), "{why}");
    h.get_by_label_contains("Error: the connection to");

    // Restart: still remote, same server and model; the key was for the session only.
    let id = h.state().chat.current.clone();
    drop(h);
    let mut h = chat_harness(&root);
    h.run();
    let c = h.state().chat.current_conversation().clone();
    assert_eq!(c.id, id);
    assert!(c.backend.use_remote);
    assert_eq!(c.backend.remote.url, flaky.url);
    assert_eq!(c.backend.remote.model, "tiny-remote");
    assert_eq!(c.backend.remote.api_key, "");
    assert_eq!(c.messages.len(), 6);
    assert_eq!(c.messages[5].content, pieces(3).concat());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_remembered_key_is_saved_and_local_stays_one_click_away() {
    let server = TestServer::start(Behaviour {
        api_key: Some("k-keep".into()),
        ..Behaviour::default()
    });
    let root = temp_root("chat-remote-key");
    let mut h = chat_harness(&root);
    h.run();
    h.get_by_label("Remote server").click();
    h.run();
    type_into(&mut h, "Server URL", &server.url);
    type_into(&mut h, "API key", "k-keep");
    type_into(&mut h, "Remote model", "test-model");
    h.get_by_label("Remember key").click();
    h.run();
    h.get_by_label("saved with the conversation");
    send(&mut h, "hi");
    wait_for_reply(&mut h);
    assert_eq!(last_content(&h), "Hello, world!");
    let id = h.state().chat.current.clone();

    // Back to local: the model row returns; the server's fields are kept for later.
    h.get_by_label("Local").click();
    h.run();
    h.get_by_label("Load");
    assert!(h.query_by_label("Server URL").is_none());
    h.get_by_label("Remote server").click();
    h.run();
    h.get_by_label("Remote server");
    drop(h);

    let saved =
        std::fs::read_to_string(root.join(format!("data/conversations/{id}.json"))).unwrap();
    assert!(saved.contains("\"api_key\": \"k-keep\""), "{saved}");
    let mut h = chat_harness(&root);
    h.run();
    let c = h.state().chat.current_conversation().clone();
    assert_eq!(c.backend.remote.api_key, "k-keep");
    assert!(c.backend.use_remote);
    // The list of a remote conversation is fetched at start.
    step_until(&mut h, PATIENCE, "the model list", |h| {
        !h.state().chat.remote_models.models.is_empty()
    });
    let _ = std::fs::remove_dir_all(&root);
}
