//! The client against the in-test OpenAI-like server over real loopback sockets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use drift_engine::tokenize::chat_template::Message;

use super::client::Timeouts;
use super::error::{ErrorKind, RemoteError};
use super::test_server::{Behaviour, Failure, TestServer};
use super::{Finish, Prompt, RemoteClient, Sampling, StreamedReply};

fn chat(
    client: &RemoteClient,
    model: &str,
    cancel: &AtomicBool,
) -> (Vec<(String, Instant)>, Result<StreamedReply, RemoteError>) {
    let msgs = [Message::new("user", "say hello to the world")];
    let mut got = Vec::new();
    let r = client.stream(
        model,
        Prompt::Chat(&msgs),
        &Sampling {
            temperature: Some(0.0),
            max_tokens: Some(16),
            ..Sampling::default()
        },
        cancel,
        &mut |t| got.push((t.to_string(), Instant::now())),
    );
    (got, r)
}

fn texts(got: &[(String, Instant)]) -> Vec<&str> {
    got.iter().map(|(t, _)| t.as_str()).collect()
}

#[test]
fn pieces_stream_in_order_and_as_they_are_sent() {
    let server = TestServer::start(Behaviour {
        delay: Duration::from_millis(150),
        ..Behaviour::default()
    });
    let client = RemoteClient::new(&server.url, None).unwrap();
    let (got, r) = chat(&client, "test-model", &AtomicBool::new(false));
    let reply = r.unwrap();
    assert_eq!(texts(&got), ["Hello", ", ", "world", "!"]);
    assert_eq!(reply.text, "Hello, world!");
    assert_eq!(reply.finish, Finish::Server("stop".into()));
    // Streaming, not buffered: the first piece came well before the last (3 delays of 150 ms apart).
    let spread = got[3].1 - got[0].1;
    assert!(spread >= Duration::from_millis(300), "{spread:?}");
    let s = reply.speeds();
    assert_eq!((s.prompt_tokens, s.completion_tokens), (5, 4));
    assert!(
        s.completion_tokens_per_s > 0.0 && s.completion_tokens_per_s < 20.0,
        "{s:?}"
    );

    // What the server received: the OpenAI request shape, at /v1 once.
    let req = &server.requests()[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["messages"][0]["content"], "say hello to the world");
    assert_eq!(req.body["max_tokens"], 16);
    assert_eq!(req.authorization, None);
}

#[test]
fn a_close_delimited_stream_and_a_raw_completion() {
    let server = TestServer::start(Behaviour {
        chunked: false,
        usage: false,
        ..Behaviour::default()
    });
    let client = RemoteClient::new(&format!("{}/v1/", server.url), None).unwrap();
    let mut got = String::new();
    let reply = client
        .stream(
            "test-model",
            Prompt::Raw("Once upon"),
            &Sampling::default(),
            &AtomicBool::new(false),
            &mut |t| got.push_str(t),
        )
        .unwrap();
    assert_eq!(got, "Hello, world!");
    assert_eq!(reply.usage, None);
    assert_eq!(
        reply.speeds().completion_tokens,
        4,
        "counted from the chunks"
    );
    let req = &server.requests()[0];
    assert_eq!(req.path, "/v1/completions");
    assert_eq!(req.body["prompt"], "Once upon");
}

#[test]
fn models_are_listed_with_or_without_a_trailing_v1() {
    let server = TestServer::start(Behaviour {
        models: vec!["big".into(), "small".into()],
        ..Behaviour::default()
    });
    for url in [server.url.clone(), format!("{}/v1", server.url)] {
        let ids: Vec<String> = RemoteClient::new(&url, None)
            .unwrap()
            .list_models()
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(ids, ["big", "small"]);
    }
    assert!(server.requests().iter().all(|r| r.path == "/v1/models"));
}

#[test]
fn keys_missing_wrong_and_right() {
    let server = TestServer::start(Behaviour {
        api_key: Some("sekrit".into()),
        ..Behaviour::default()
    });
    let none = RemoteClient::new(&server.url, None).unwrap();
    let e = none.list_models().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unauthorized);
    assert!(e.message.contains("wants an API key"), "{e}");
    let wrong = RemoteClient::new(&server.url, Some("nope")).unwrap();
    let (_, r) = chat(&wrong, "test-model", &AtomicBool::new(false));
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unauthorized);
    assert!(e.message.contains("refused the API key"), "{e}");
    assert!(e.message.contains("Incorrect API key provided"), "{e}");
    let right = RemoteClient::new(&server.url, Some(" sekrit ")).unwrap();
    let (_, r) = chat(&right, "test-model", &AtomicBool::new(false));
    assert_eq!(r.unwrap().text, "Hello, world!");
    assert_eq!(
        server.requests().last().unwrap().authorization.as_deref(),
        Some("Bearer sekrit")
    );
}

#[test]
fn statuses_and_errors_in_the_stream_carry_the_servers_message() {
    let server = TestServer::start(Behaviour::default());
    let client = RemoteClient::new(&server.url, None).unwrap();
    let (_, r) = chat(&client, "no-such-model", &AtomicBool::new(false));
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("no model \"no-such-model\""), "{e}");
    assert!(e.message.contains("does not exist"), "{e}");

    let body = r#"{"error": {"message": "CUDA out of memory", "type": "server_error"}}"#;
    let failing = TestServer::start(Behaviour {
        failure: Failure::Status(500, body.into()),
        ..Behaviour::default()
    });
    let client = RemoteClient::new(&failing.url, None).unwrap();
    let (_, r) = chat(&client, "test-model", &AtomicBool::new(false));
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Server);
    assert!(e.message.ends_with("(HTTP 500): CUDA out of memory"), "{e}");

    let mid = TestServer::start(Behaviour {
        failure: Failure::ErrorEventAfter(2, "the engine crashed".into()),
        ..Behaviour::default()
    });
    let client = RemoteClient::new(&mid.url, None).unwrap();
    let (got, r) = chat(&client, "test-model", &AtomicBool::new(false));
    assert_eq!(texts(&got), ["Hello", ", "]);
    assert!(r.unwrap_err().message.ends_with("the engine crashed"));
}

#[test]
fn a_server_that_goes_away_mid_stream_is_an_error_after_the_partial_text() {
    for chunked in [true, false] {
        let server = TestServer::start(Behaviour {
            failure: Failure::CloseAfter(2),
            chunked,
            ..Behaviour::default()
        });
        let client = RemoteClient::new(&server.url, None).unwrap();
        let (got, r) = chat(&client, "test-model", &AtomicBool::new(false));
        assert_eq!(texts(&got), ["Hello", ", "], "chunked {chunked}");
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Interrupted, "chunked {chunked}: {e}");
        assert!(e.message.contains("before the reply was finished"), "{e}");
    }
}

#[test]
fn nobody_listening_asks_whether_the_server_runs() {
    // A port that was free a moment ago: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let client = RemoteClient::new(&url, None).unwrap();
    let e = client.list_models().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable);
    assert!(
        e.message
            .contains(&format!("Is the server running at {url}?")),
        "{e}"
    );
    let (_, r) = chat(&client, "m", &AtomicBool::new(false));
    assert_eq!(r.unwrap_err().kind, ErrorKind::Unreachable);
    // Not an OpenAI API at that path: a plain 404 says so.
    let server = TestServer::start(Behaviour::default());
    let e = RemoteClient::new(&format!("{}/api", server.url), None)
        .unwrap()
        .list_models()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(
        e.message.contains("is not") || e.message.contains("OpenAI-compatible"),
        "{e}"
    );
}

#[test]
fn cancel_returns_at_once_and_drops_the_connection() {
    let server = TestServer::start(Behaviour {
        pieces: (0..200).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(30),
        ..Behaviour::default()
    });
    let client = RemoteClient::new(&server.url, None).unwrap();
    let cancel = AtomicBool::new(false);
    let msgs = [Message::new("user", "go on")];
    let mut pieces = 0;
    let reply = client
        .stream(
            "test-model",
            Prompt::Chat(&msgs),
            &Sampling::default(),
            &cancel,
            &mut |_| {
                pieces += 1;
                if pieces == 3 {
                    cancel.store(true, Ordering::SeqCst);
                }
            },
        )
        .unwrap();
    assert_eq!(reply.finish, Finish::Cancelled);
    assert_eq!(reply.text, "w0 w1 w2 ");
    // The server notices within a few pieces: its writes fail once the connection is gone.
    let t = Instant::now();
    while server.stream_log().client_left_after.is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the connection stayed open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.stream_log().client_left_after.unwrap() < 20);
}

#[test]
fn a_stalled_server_times_out_and_stop_works_while_waiting() {
    let server = TestServer::start(Behaviour {
        failure: Failure::StallAfter(1),
        ..Behaviour::default()
    });
    let quick = Timeouts {
        connect: Duration::from_secs(5),
        idle: Duration::from_millis(400),
    };
    let client = RemoteClient::with_timeouts(&server.url, None, quick).unwrap();
    let (got, r) = chat(&client, "test-model", &AtomicBool::new(false));
    assert_eq!(texts(&got), ["Hello"]);
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");

    // Cancelled while the server says nothing: back within a moment, not after the idle timeout.
    let patient = RemoteClient::new(&server.url, None).unwrap();
    let cancel = AtomicBool::new(false);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            cancel.store(true, Ordering::SeqCst);
        });
        let (got, r) = chat(&patient, "test-model", &cancel);
        assert_eq!(texts(&got), ["Hello"]);
        assert_eq!(r.unwrap().finish, Finish::Cancelled);
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
