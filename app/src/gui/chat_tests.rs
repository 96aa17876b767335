//! The Chat tab driven through its widgets, on a tiny Llama fixture (random weights, a real tokenizer
//! and chat template) running on the test GPU: load, send, streamed text in the transcript, Stop,
//! Regenerate, Edit and resend, and conversations that survive a restart.

use std::path::PathBuf;
use std::time::Duration;

use eframe::egui::OutputCommand;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

use super::DriftApp;
use super::conversations::{ChatMessage, Role};
use super::test_support::{step_until, temp_root, test_app};

/// Loading and replies on lavapipe take seconds; this bounds a hang, not a slow machine.
pub(super) const PATIENCE: Duration = Duration::from_secs(60);

fn fixture_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/llm/llama3-rope-tied")
}

/// The whole app on a fresh harness. The fixture's random weights write arbitrary characters (U+FFFD
/// among them) that the bundled fonts lack: draw tofu for them as the real window does, instead of the
/// harness's default panic.
pub(super) fn chat_harness(root: &std::path::Path) -> Harness<'static, DriftApp> {
    Harness::builder()
        .with_size(eframe::egui::vec2(1100.0, 720.0))
        .allow_missing_glyphs()
        .wgpu()
        .build_ui_state(|ui, app: &mut DriftApp| app.show(ui), test_app(root))
}

/// Types `text` into the text field labelled `label`.
pub(super) fn type_into(h: &mut Harness<'static, DriftApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.run();
    h.get_by_label(label).type_text(text);
    h.run();
}

pub(super) fn set_number(h: &mut Harness<'static, DriftApp>, label: &str, value: f64) {
    h.get_by_label(label).set_value_accesskit(value);
    h.run();
}

/// With seed 1 and temperature 1 the fixture writes until its context (256 positions) is full:
/// ~220 tokens, about a second on lavapipe, so a reply is still streaming a few frames after it starts.
fn fix_seed(h: &mut Harness<'static, DriftApp>, seed: u64) {
    h.get_by_label("Fixed seed").click();
    h.run();
    set_number(h, "Seed", seed as f64);
    assert_eq!(
        h.state().chat.current_conversation().settings.seed,
        Some(seed)
    );
}

/// Loads the fixture through the model row and waits for it.
fn load_fixture(h: &mut Harness<'static, DriftApp>) {
    type_into(h, "Model", &fixture_model().display().to_string());
    h.get_by_label("Load").click();
    step_until(h, PATIENCE, "the model to load", |h| {
        h.state().chat.model.loaded.is_some() || h.state().chat.model.error.is_some()
    });
    assert_eq!(h.state().chat.model.error, None);
    h.run();
    // The context asked for (4096 by default) is capped by the model's 256 positions.
    assert_eq!(h.state().chat.model.context, 256);
    h.get_by_label_contains("loaded: llama3-rope-tied (context 256 tokens)");
}

pub(super) fn send(h: &mut Harness<'static, DriftApp>, text: &str) {
    type_into(h, "Message", text);
    h.get_by_label("Send").click();
    h.step();
    assert!(h.state().chat.is_generating(), "Send started a reply");
}

pub(super) fn last_content(h: &Harness<'static, DriftApp>) -> String {
    let c = h.state().chat.current_conversation();
    c.messages
        .last()
        .map(|m| m.content.clone())
        .unwrap_or_default()
}

pub(super) fn wait_for_reply(h: &mut Harness<'static, DriftApp>) {
    step_until(h, PATIENCE, "the reply to finish", |h| {
        !h.state().chat.is_generating()
    });
    h.run();
}

/// Equal messages; speeds within 1e-12 relative (serde_json's float parsing may be off by one ulp).
fn assert_same_messages(a: &[ChatMessage], b: &[ChatMessage]) {
    assert_eq!(a.len(), b.len());
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.role, &x.content, &x.error),
            (y.role, &y.content, &y.error)
        );
        match (&x.stats, &y.stats) {
            (Some(s), Some(t)) => {
                assert_eq!(
                    (s.prefill_tokens, s.decode_tokens, &s.stop_reason),
                    (t.prefill_tokens, t.decode_tokens, &t.stop_reason)
                );
                assert!(close(s.prefill_tokens_per_s, t.prefill_tokens_per_s));
                assert!(close(s.decode_tokens_per_s, t.decode_tokens_per_s));
            }
            (s, t) => assert_eq!(s, t),
        }
    }
}

#[test]
fn a_streamed_reply_is_saved_and_the_conversation_survives_a_restart() {
    let root = temp_root("chat-stream");
    let mut h = chat_harness(&root);
    h.run();
    // Empty state: nothing loaded yet, and a way to the Models tab.
    h.get_by_label("No model loaded");
    h.get_by_label("Open the Models tab").click();
    h.run();
    assert_eq!(h.state().tab, super::Tab::Models);
    h.get_by_label("Chat").click();
    h.run();

    load_fixture(&mut h);
    assert_eq!(
        h.state().app.settings.last_chat_model,
        Some(fixture_model()),
        "the loaded model is remembered"
    );
    set_number(&mut h, "Max tokens", 200.0);
    set_number(&mut h, "Temperature", 1.0);
    fix_seed(&mut h, 1);
    assert_eq!(
        h.state().chat.current_conversation().settings.max_tokens,
        200
    );

    send(&mut h, "Hello there, tiny model!");
    // The user's message is on disk before the reply starts.
    let id = h.state().chat.current.clone();
    let file = root.join(format!("data/conversations/{id}.json"));
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("Hello there, tiny model!")
    );
    // Streaming: text shows up while the reply is still being written.
    step_until(&mut h, PATIENCE, "streamed text", |h| {
        h.state().chat.is_generating() && !last_content(h).is_empty()
    });
    h.get_by_label_contains("Chat: generating");
    wait_for_reply(&mut h);
    let conv = h.state().chat.current_conversation().clone();
    assert_eq!(conv.title, "Hello there, tiny model!");
    assert_eq!(conv.messages.len(), 2);
    let reply = &conv.messages[1];
    assert_eq!(reply.role, Role::Assistant);
    let stats = reply.stats.as_ref().expect("stats under the reply");
    assert!(stats.decode_tokens >= 1 && stats.decode_tokens <= 200);
    assert!(stats.prefill_tokens > 5, "the whole templated prompt ran");
    assert!(stats.prefill_tokens_per_s > 0.0);
    h.get_by_label_contains(&format!("{} tokens · prefill", stats.decode_tokens));
    assert!(
        h.state().app.perf.lock().unwrap().replies.len() == 1,
        "the reply's speed is in the performance log"
    );

    // Copy puts the reply's text on the clipboard.
    let reply_text = reply.content.clone();
    h.get_all_by_label("Copy").last().unwrap().click();
    h.step();
    assert!(
        h.output()
            .platform_output
            .commands
            .contains(&OutputCommand::CopyText(reply_text)),
        "copied"
    );

    // Regenerate replaces the last reply.
    h.get_by_label("Regenerate").click();
    h.step();
    assert!(h.state().chat.is_generating());
    wait_for_reply(&mut h);
    assert_eq!(h.state().chat.current_conversation().messages.len(), 2);

    // Edit the user message and resend: the later messages are replaced.
    h.get_by_label("Edit").click();
    h.run();
    let edited = h.get_by_label("Edited message");
    edited.focus();
    h.run();
    h.get_by_label("Edited message")
        .set_text_value_accesskit("A new question");
    h.run();
    h.get_by_label("Send edited").click();
    h.step();
    wait_for_reply(&mut h);
    let conv = h.state().chat.current_conversation().clone();
    assert_eq!(conv.messages.len(), 2);
    assert_eq!(conv.messages[0].content, "A new question");
    assert!(conv.messages[1].stats.is_some());

    // Restart: a new app on the same folders lists the conversation with its messages; a corrupt
    // file next to it is skipped with a warning in the UI and left as it was.
    drop(h);
    let corrupt = root.join("data/conversations/chat-1-0.json");
    std::fs::write(&corrupt, "{\"title\": \"cut short").unwrap();
    let mut h = chat_harness(&root);
    h.run();
    assert_eq!(h.state().chat.notices.len(), 1);
    h.get_by_label_contains("chat-1-0.json (left untouched)");
    assert_eq!(h.state().chat.conversations.len(), 1);
    let restored = h.state().chat.current_conversation().clone();
    assert_eq!(restored.id, conv.id);
    assert_same_messages(&restored.messages, &conv.messages);
    assert_eq!(restored.model, Some(fixture_model()));
    assert_eq!(restored.settings.max_tokens, 200);
    // The title follows the (edited) first message: in the list and in the transcript.
    assert_eq!(restored.title, "A new question");
    assert_eq!(h.get_all_by_label("A new question").count(), 2);
    drop(h);
    assert_eq!(
        std::fs::read_to_string(&corrupt).unwrap(),
        "{\"title\": \"cut short"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn stop_cancels_a_long_generation() {
    let root = temp_root("chat-stop");
    let mut h = chat_harness(&root);
    h.run();
    load_fixture(&mut h);
    // As long as the model's context allows (256 positions); sampling reads back every token.
    set_number(&mut h, "Max tokens", 100000.0);
    set_number(&mut h, "Temperature", 1.0);
    fix_seed(&mut h, 1);

    // While another job holds the device, the reply waits in the queue; Stop cancels it there.
    let queue = h.state().app.gpu_queue.clone();
    let device = queue.acquire();
    send(&mut h, "Are you waiting?");
    step_until(&mut h, PATIENCE, "the reply to queue", |h| {
        queue.waiting() == 1
            && h.query_by_label_contains("Chat: waiting for the GPU")
                .is_some()
    });
    h.get_by_label("Stop").click();
    h.step();
    drop(device);
    wait_for_reply(&mut h);
    let queued = h.state().chat.current_conversation().messages[1].clone();
    assert_eq!(queued.content, "");
    assert_eq!(queued.stats.unwrap().stop_reason, "cancelled");

    // Mid-stream.
    send(&mut h, "Write a long story.");
    step_until(&mut h, PATIENCE, "streamed text", |h| {
        !last_content(h).is_empty()
    });
    h.get_by_label("Stop").click();
    h.step();
    wait_for_reply(&mut h);
    let conv = h.state().chat.current_conversation();
    let stats = conv.messages[3].stats.as_ref().expect("stats");
    assert!(stats.decode_tokens >= 1);
    assert_eq!(stats.stop_reason, "cancelled");
    assert_eq!(h.get_all_by_label_contains("· stopped").count(), 2);
    // The stopped reply was saved too.
    let saved = std::fs::read_to_string(
        root.join("data/conversations")
            .join(format!("{}.json", conv.id)),
    )
    .unwrap();
    assert!(saved.contains("\"cancelled\""));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn conversations_can_be_renamed_searched_and_deleted() {
    let root = temp_root("chat-list");
    // The fixture in the models folder: the picker's Library lists it.
    let in_library = root.join("data/models/tiny-chat");
    std::fs::create_dir_all(&in_library).unwrap();
    for f in std::fs::read_dir(fixture_model()).unwrap().flatten() {
        std::fs::copy(f.path(), in_library.join(f.file_name())).unwrap();
    }
    let mut h = chat_harness(&root);
    h.run();
    step_until(&mut h, PATIENCE, "the library listing", |h| {
        !h.state().chat.library.models.is_empty()
    });
    h.get_by_label("Library").click();
    h.run();
    h.get_by_label("tiny-chat").click();
    h.run();
    assert_eq!(
        h.state().chat.current_conversation().model,
        Some(in_library.clone())
    );
    h.get_by_label("Load").click();
    step_until(&mut h, PATIENCE, "the model to load", |h| {
        h.state().chat.model.loaded.is_some() || h.state().chat.model.error.is_some()
    });
    assert_eq!(h.state().chat.model.error, None);
    set_number(&mut h, "Max tokens", 4.0);
    h.state_mut().app.settings.profiling = true;
    send(&mut h, "first topic");
    wait_for_reply(&mut h);
    {
        let perf = h.state().app.perf.lock().unwrap();
        let run = perf.last_run.as_ref().expect("a decode step was profiled");
        assert_eq!(run.label, "decode token");
        assert!(run.profile.dispatches.len() > 4);
        assert_eq!(perf.replies.len(), 1);
        assert_eq!(perf.replies[0].decode_tokens, 4);
    }
    h.get_by_label("New conversation").click();
    h.run();
    send(&mut h, "second topic");
    wait_for_reply(&mut h);
    assert_eq!(h.state().chat.conversations.len(), 2);

    h.get_by_label("Rename").click();
    h.run();
    h.get_by_label("New title").focus();
    h.run();
    h.get_by_label("New title")
        .set_text_value_accesskit("Renamed chat");
    h.run();
    h.get_by_label("Save title").click();
    h.run();
    assert_eq!(h.state().chat.current_conversation().title, "Renamed chat");

    // Search (case-insensitive, titles and content): only the other conversation matches.
    type_into(&mut h, "Search", "FIRST");
    assert!(h.query_by_label("first topic").is_some());
    assert!(h.query_by_label("Renamed chat").is_none());
    h.get_by_label("Search").set_text_value_accesskit("");
    h.run();
    assert!(h.query_by_label("Renamed chat").is_some());

    h.get_by_label("Delete").click();
    h.run();
    h.get_by_label("Yes, delete").click();
    h.run();
    assert_eq!(h.state().chat.conversations.len(), 1);
    let left = &h.state().chat.conversations[0];
    assert_eq!(left.title, "first topic");
    let files: Vec<_> = std::fs::read_dir(root.join("data/conversations"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, vec![format!("{}.json", left.id)]);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_model_that_does_not_load_is_an_error_in_the_ui() {
    let root = temp_root("chat-error");
    let mut h = chat_harness(&root);
    h.run();
    let missing = root.join("no-such-model.gguf");
    type_into(&mut h, "Model", &missing.display().to_string());
    h.get_by_label("Load").click();
    step_until(&mut h, PATIENCE, "the load to fail", |h| {
        h.state().chat.model.error.is_some()
    });
    h.run();
    h.get_by_label_contains("could not load");
    assert!(h.state().chat.model.loaded.is_none());

    // Sending tries the model again; the reply carries the reason inline.
    send(&mut h, "hello?");
    wait_for_reply(&mut h);
    let reply = h.state().chat.current_conversation().messages[1].clone();
    assert!(
        reply
            .error
            .as_deref()
            .unwrap()
            .contains("no-such-model.gguf")
    );
    h.get_by_label_contains("Error: could not load");
    h.get_by_label("Regenerate");
    let _ = std::fs::remove_dir_all(&root);
}
