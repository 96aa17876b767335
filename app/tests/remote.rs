//! `drift generate/chat --remote`: the real binary against OpenAI-compatible servers over loopback
//! sockets. First a small in-test server (app/src/remote/test_server.rs, scripted: slow streams, error
//! statuses, keys, a connection dropped mid-stream), then `drift serve` itself with the tiny fixture
//! model: the same text as the local engine at temperature 0, and a server killed mid-reply.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)] // each includer uses part of it
#[path = "../src/remote/test_server.rs"]
mod test_server;

use test_server::{Behaviour, Failure, TestServer};

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn drift_with(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drift"));
    cmd.args(args)
        .env_remove("DRIFT_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("drift runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn drift(args: &[&str]) -> Run {
    drift_with(args, &[], "")
}

/// `drift generate --remote URL --model test-model --prompt hi`.
fn generate_hi(url: &str) -> Run {
    drift(&[
        "generate",
        "--remote",
        url,
        "--model",
        "test-model",
        "--prompt",
        "hi",
    ])
}

fn words(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("w{i} ")).collect()
}

#[test]
fn generate_streams_the_servers_text_in_order_as_it_arrives() {
    let server = TestServer::start(Behaviour {
        pieces: words(5),
        delay: Duration::from_millis(250),
        ..Behaviour::default()
    });
    let url = format!("{}/v1/", server.url);
    let args = [
        "generate",
        "--remote",
        &url,
        "--model",
        "test-model",
        "--prompt",
        "hi there",
        "--temperature",
        "0",
        "--max-tokens",
        "9",
        "--seed",
        "5",
        "--top-p",
        "0.5",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_drift"))
        .args(args)
        .env_remove("DRIFT_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Timestamp every read of stdout: the first words show before the last one was sent.
    let mut stdout = child.stdout.take().unwrap();
    let mut text = Vec::new();
    let mut first_at = None;
    let mut buf = [0u8; 256];
    loop {
        let n = stdout.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        first_at.get_or_insert_with(Instant::now);
        text.extend_from_slice(&buf[..n]);
    }
    let streamed_for = first_at.unwrap().elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{stderr}");
    assert_eq!(
        String::from_utf8(text).unwrap(),
        format!("{}\n", words(5).concat())
    );
    assert!(
        streamed_for >= Duration::from_millis(600),
        "{streamed_for:?}: not streamed"
    );
    assert!(
        stderr.contains("[2 prompt tokens, 5 generated;"),
        "{stderr}"
    );
    assert!(stderr.contains("stop: stop]"), "{stderr}");

    // One request, at /v1 once, with the sampling flags in the OpenAI fields.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(r.body["model"], "test-model");
    assert_eq!(
        r.body["messages"],
        serde_json::json!([{"role": "user", "content": "hi there"}])
    );
    assert_eq!(
        (
            &r.body["temperature"],
            &r.body["max_tokens"],
            &r.body["seed"],
            &r.body["top_p"]
        ),
        (
            &serde_json::json!(0.0),
            &serde_json::json!(9),
            &serde_json::json!(5),
            &serde_json::json!(0.5)
        )
    );
    assert_eq!(r.body["stream"], true);
}

#[test]
fn raw_prompts_use_completions_and_json_reports_the_counts() {
    let server = TestServer::start(Behaviour::default());
    let run = drift(&[
        "generate",
        "--remote",
        &server.url,
        "--model",
        "test-model",
        "--prompt",
        "Once upon a",
        "--raw",
        "--json",
        "--system",
        "ignored for raw",
    ]);
    assert!(run.ok, "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["text"], "Hello, world!");
    assert_eq!(
        (v["prompt_tokens"].as_u64(), v["completion_tokens"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(v["stop_reason"], "stop");
    let r = &server.requests()[0];
    assert_eq!(r.path, "/v1/completions");
    assert_eq!(r.body["prompt"], "Once upon a");
}

#[test]
fn models_are_listed_and_a_single_one_is_picked() {
    let server = TestServer::start(Behaviour {
        models: vec!["alpha".into(), "beta".into()],
        ..Behaviour::default()
    });
    for url in [server.url.clone(), format!("{}/v1", server.url)] {
        let run = drift(&["chat", "--remote", &url, "--list-models"]);
        assert!(run.ok, "{}", run.stderr);
        assert_eq!(run.stdout, "alpha\nbeta\n");
    }
    // Two models and no --model: the error names them.
    let run = drift(&["generate", "--remote", &server.url, "--prompt", "hi"]);
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("serves 2 models; choose one with --model: alpha, beta"),
        "{}",
        run.stderr
    );
    // A model the server does not have: its own words.
    let run = drift(&[
        "generate",
        "--remote",
        &server.url,
        "--model",
        "gamma",
        "--prompt",
        "hi",
    ]);
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("has no model \"gamma\" (HTTP 404): The model `gamma` does not exist."),
        "{}",
        run.stderr
    );

    let single = TestServer::start(Behaviour::default());
    let run = drift(&["generate", "--remote", &single.url, "--prompt", "hi"]);
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(run.stdout, "Hello, world!\n");
    assert_eq!(
        single.requests().last().unwrap().body["model"],
        "test-model"
    );
}

#[test]
fn an_error_status_gives_the_servers_message() {
    let body = r#"{"error": {"message": "the GPU is busy, try again", "type": "server_error"}}"#;
    let server = TestServer::start(Behaviour {
        failure: Failure::Status(503, body.into()),
        ..Behaviour::default()
    });
    let run = generate_hi(&server.url);
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&format!(
            "the server at {} failed (HTTP 503): the GPU is busy, try again",
            server.url
        )),
        "{}",
        run.stderr
    );
    // Not an API at all (a plain 404 page): the URL is the suspect.
    let run = drift(&[
        "chat",
        "--remote",
        &format!("{}/api", server.url),
        "--list-models",
    ]);
    assert!(!run.ok);
    assert!(
        run.stderr.contains("is not") || run.stderr.contains("OpenAI-compatible server?"),
        "{}",
        run.stderr
    );
    // Nobody listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let run = drift(&[
        "generate", "--remote", &url, "--model", "m", "--prompt", "hi",
    ]);
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains(&format!("Is the server running at {url}?")),
        "{}",
        run.stderr
    );
}

#[test]
fn a_server_that_closes_mid_stream_is_an_error_and_the_partial_text_stays() {
    for chunked in [true, false] {
        let server = TestServer::start(Behaviour {
            pieces: words(6),
            failure: Failure::CloseAfter(3),
            chunked,
            ..Behaviour::default()
        });
        let run = generate_hi(&server.url);
        assert!(!run.ok, "chunked {chunked}");
        assert_eq!(
            run.stdout,
            format!("{}\n", words(3).concat()),
            "chunked {chunked}"
        );
        assert!(
            run.stderr.contains("before the reply was finished"),
            "chunked {chunked}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("the text so far is kept"),
            "{}",
            run.stderr
        );

        let run = drift(&[
            "generate",
            "--remote",
            &server.url,
            "--model",
            "test-model",
            "--prompt",
            "hi",
            "--json",
        ]);
        assert!(!run.ok);
        let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(v["text"], words(3).concat());
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("before the reply was finished")
        );
    }
}

#[test]
fn a_missing_or_wrong_key_is_a_401_message() {
    let server = TestServer::start(Behaviour {
        api_key: Some("right-key".into()),
        ..Behaviour::default()
    });
    let gen_args = |key: Option<&'static str>| {
        let mut a = vec![
            "generate",
            "--remote",
            server.url.as_str(),
            "--model",
            "test-model",
            "--prompt",
            "hi",
        ];
        if let Some(k) = key {
            a.extend(["--api-key", k]);
        }
        a
    };
    let run = drift(&gen_args(None));
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("wants an API key (HTTP 401): You didn't provide an API key"),
        "{}",
        run.stderr
    );
    let run = drift(&gen_args(Some("wrong-key")));
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("refused the API key (HTTP 401): Incorrect API key provided"),
        "{}",
        run.stderr
    );
    let run = drift(&gen_args(Some("right-key")));
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        server.requests().last().unwrap().authorization.as_deref(),
        Some("Bearer right-key")
    );
    // The key may come from the environment instead of the command line.
    let run = drift_with(&gen_args(None), &[("DRIFT_API_KEY", "right-key")], "");
    assert!(run.ok, "{}", run.stderr);
}

#[test]
fn chat_sends_the_whole_conversation_each_turn() {
    let server = TestServer::start(Behaviour::default());
    let run = drift_with(
        &[
            "chat",
            "--remote",
            &server.url,
            "--model",
            "test-model",
            "--system",
            "Be kind.",
        ],
        &[],
        "first question\nsecond question\n/reset\nthird\n/quit\n",
    );
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(run.stdout.matches("Hello, world!").count(), 3);
    assert!(
        run.stderr
            .contains(&format!("chatting with test-model at {}", server.url))
    );
    let reqs = server.requests();
    let roles = |i: usize| -> Vec<String> {
        reqs[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                format!(
                    "{}:{}",
                    m["role"].as_str().unwrap(),
                    m["content"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        roles(1),
        [
            "system:Be kind.",
            "user:first question",
            "assistant:Hello, world!",
            "user:second question"
        ]
    );
    assert_eq!(
        roles(2),
        ["system:Be kind.", "user:third"],
        "/reset forgets the turns"
    );
}

// ---- against `drift serve` ----

const CHAT_MODEL: &str = "llama3-rope-tied";

fn chat_fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/llm")
        .join(CHAT_MODEL)
        .to_string_lossy()
        .into_owned()
}

/// `drift serve` on a free loopback port; killed when dropped.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start() -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_drift"))
            .args(["serve", "--port", "0", "--model", &chat_fixture()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("drift serve runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("drift serve: listening on ")
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("unexpected first line from drift serve: {line:?}")
            })
            .to_string();
        Serve { child, url }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn generate_remote_against_drift_serve_equals_the_local_engine() {
    let serve = Serve::start();
    let listed = drift(&["generate", "--remote", &serve.url, "--list-models"]);
    assert!(listed.ok, "{}", listed.stderr);
    assert_eq!(listed.stdout, format!("{CHAT_MODEL}\n"));

    let common = [
        "--prompt",
        "Tell me about GPUs.",
        "--system",
        "Be brief.",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--json",
    ];
    let fixture = chat_fixture();
    let mut local_args = vec!["generate", "--model", fixture.as_str()];
    local_args.extend(common);
    let local = drift(&local_args);
    assert!(local.ok, "{}", local.stderr);
    let mut remote_args = vec![
        "generate",
        "--remote",
        serve.url.as_str(),
        "--model",
        CHAT_MODEL,
    ];
    remote_args.extend(common);
    let remote = drift(&remote_args);
    assert!(remote.ok, "{}", remote.stderr);
    let local: serde_json::Value = serde_json::from_str(&local.stdout).unwrap();
    let remote: serde_json::Value = serde_json::from_str(&remote.stdout).unwrap();
    assert!(!local["text"].as_str().unwrap().is_empty());
    assert_eq!(remote["text"], local["text"]);
    assert_eq!(remote["prompt_tokens"], local["prompt_tokens"]);
    assert_eq!(
        remote["completion_tokens"].as_u64().unwrap() as usize,
        local["tokens"].as_array().unwrap().len()
    );
}

#[test]
fn a_drift_serve_killed_mid_reply_leaves_an_error_and_the_partial_text() {
    let mut serve = Serve::start();
    // Temperature 1 with this seed writes until the fixture's 256-position context is full.
    let mut client = Command::new(env!("CARGO_BIN_EXE_drift"))
        .args([
            "generate",
            "--remote",
            &serve.url,
            "--model",
            CHAT_MODEL,
            "--prompt",
            "Write a long story.",
            "--temperature",
            "1",
            "--seed",
            "1",
            "--max-tokens",
            "100000",
        ])
        .env_remove("DRIFT_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = client.stdout.take().unwrap();
    let mut text = vec![0u8; 1];
    stdout.read_exact(&mut text).unwrap();
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    stdout.read_to_end(&mut text).unwrap();
    let mut stderr = String::new();
    client
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = client.wait().unwrap();
    assert!(
        !status.success(),
        "the reply finished before the server was killed: {stderr}"
    );
    assert!(stderr.contains("before the reply was finished"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&text).trim().is_empty(),
        "the partial text was printed"
    );
}
