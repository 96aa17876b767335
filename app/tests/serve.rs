//! `drift serve` as clients use it: the real binary on a free loopback port with the tiny fixture
//! chat model (engine/tests/fixtures/llm/llama3-rope-tied) and the tiny single-file SD checkpoint,
//! driven by raw HTTP from Rust and by the official `openai` Python package. Text and images are
//! compared with the engine run directly in this process (same device, same settings).
//! The CLIP vocabulary comes from `DRIFT_CLIP_VOCAB` or ~/.cache/drift/clip/ (.ci/run provides it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use drift_engine::diffusion::image::RgbImage;
use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline};
use drift_engine::diffusion::schedulers::SchedulerKind;
use drift_engine::generate::{GenerateOptions, Generation, StopReason};
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};
use serde_json::{Value, json};

mod common;

use common::scratch;

const CHAT_MODEL: &str = "llama3-rope-tied";
const IMAGE_MODEL: &str = "sd1_tiny";
const KEY: &str = "test-key-1234";

fn chat_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/llm")
        .join(CHAT_MODEL)
}

/// A running `drift serve` child; killed when dropped. Its stderr (the access log) is collected.
struct DriftServe {
    child: Child,
    /// `127.0.0.1:PORT`
    addr: String,
    log: Arc<Mutex<String>>,
}

impl DriftServe {
    fn start(checkpoint: &Path, extra: &[&str]) -> DriftServe {
        let mut child = Command::new(env!("CARGO_BIN_EXE_drift"))
            .args(["serve", "--port", "0", "--api-key", KEY, "--model"])
            .arg(chat_fixture())
            .arg("--image-model")
            .arg(checkpoint)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("drift runs");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .trim()
            .strip_prefix("drift serve: listening on http://")
            .and_then(|rest| rest.strip_suffix("/v1"))
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "unexpected first line {first:?}; log: {}",
                    log.lock().unwrap()
                )
            })
            .to_string();
        DriftServe { child, addr, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to 20 s for a line of the access log that contains `needle`.
    fn wait_for_log(&self, needle: &str) -> String {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no log line with {needle:?}; log:\n{}", self.log());
    }
}

impl Drop for DriftServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// `(status, body)` of a request with the given key (or none).
fn call(
    server: &DriftServe,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let url = server.url(path);
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut resp = match (method, body) {
        ("GET", _) => {
            let mut r = agent().get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        (_, body) => {
            let mut r = agent().post(&url).content_type("application/json");
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(body.unwrap_or(""))
        }
    }
    .unwrap();
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap();
    (status, text)
}

fn post_json(server: &DriftServe, path: &str, body: &Value) -> Value {
    let (status, text) = call(server, "POST", path, Some(KEY), Some(&body.to_string()));
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The `data:` payloads of a server-sent event stream (the body of a chunked response, de-chunked by
/// ureq).
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn assert_error(status_and_body: (u16, String), status: u16, code: Option<&str>) -> Value {
    let (got, body) = status_and_body;
    assert_eq!(got, status, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(
        e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    if let Some(code) = code {
        assert_eq!(e["code"], code, "{body}");
    }
    v
}

/// The engine run directly: what the server should answer at temperature 0.
struct Reference {
    gpu: Gpu,
}

impl Reference {
    fn generate(
        &self,
        input: Result<Vec<Message>, &str>,
        max_tokens: usize,
        stop: &[&str],
    ) -> Generation {
        let mut session = open_llm(&self.gpu, &chat_fixture(), None, QuantScheme::None).unwrap();
        let prompt = match input {
            Ok(messages) => session
                .tokenizer
                .encode(&session.render(&messages).unwrap(), false),
            Err(raw) => session.tokenizer.encode(raw, true),
        }
        .unwrap();
        let options = GenerateOptions {
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
        };
        session
            .generate(
                &self.gpu,
                &prompt,
                &options,
                &AtomicBool::new(false),
                &mut |_| {},
            )
            .unwrap()
    }

    fn image(&self, checkpoint: &Path, width: usize, height: usize, seed: u64) -> RgbImage {
        let mut pipe = SdPipeline::open(&self.gpu, checkpoint, width, height).unwrap();
        let req = ImageRequest {
            prompt: "a red square".into(),
            negative: "blurry".into(),
            steps: 2,
            cfg: 5.0,
            seed,
            scheduler: SchedulerKind::Euler,
            init: None,
            latents: None,
        };
        pipe.generate(&self.gpu, &req, &mut |_, _, _| true)
            .unwrap()
            .image
    }
}

fn finish(stop: StopReason) -> &'static str {
    match stop {
        StopReason::Eos | StopReason::StopString => "stop",
        _ => "length",
    }
}

fn decode_png(b64: &str) -> RgbImage {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    RgbImage {
        width: info.width as usize,
        height: info.height as usize,
        pixels: buf,
    }
}

fn chat_body(max_tokens: Option<usize>, stream: bool) -> Value {
    let mut body = json!({
        "model": CHAT_MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

fn chat_messages() -> Vec<Message> {
    vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Name a colour."),
    ]
}

/// A raw streamed request: reads until the first content chunk, then hangs up.
fn hang_up_mid_stream(server: &DriftServe) -> String {
    let body = chat_body(None, true).to_string();
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    // The role chunk, then the first content chunk.
    while String::from_utf8_lossy(&got).matches("data: ").count() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn rust_client_against_drift_serve() {
    let dir = scratch("serve-rust");
    let checkpoint = common::unpack_checkpoint(&dir.0, IMAGE_MODEL);
    let server = DriftServe::start(&checkpoint, &["--idle-timeout", "2"]);
    let reference = Reference {
        gpu: Gpu::new(&GpuOptions::from_env()).unwrap(),
    };

    // Models.
    let (status, body) = call(&server, "GET", "/v1/models", Some(KEY), None);
    assert_eq!(status, 200, "{body}");
    let models: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [CHAT_MODEL, IMAGE_MODEL]);
    assert_eq!(models["object"], "list");

    // A non-streamed chat completion equals the engine's own greedy reply, with usage.
    let expected = reference.generate(Ok(chat_messages()), 12, &[]);
    let reply = post_json(&server, "/v1/chat/completions", &chat_body(Some(12), false));
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["model"], CHAT_MODEL);
    assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        expected.text.as_str()
    );
    assert_eq!(
        reply["choices"][0]["finish_reason"],
        finish(expected.stop_reason)
    );
    let usage = &reply["usage"];
    assert_eq!(usage["prompt_tokens"], expected.prompt_tokens);
    assert_eq!(usage["completion_tokens"], expected.tokens.len());
    assert_eq!(
        usage["total_tokens"],
        expected.prompt_tokens + expected.tokens.len()
    );

    // The same, streamed: role chunk, content chunks, finish chunk, usage chunk, [DONE].
    let (status, body) = call(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(KEY),
        Some(&chat_body(Some(12), true).to_string()),
    );
    assert_eq!(status, 200, "{body}");
    let data = events(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"])
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, expected.text);
    let n = chunks.len();
    assert_eq!(
        chunks[n - 2]["choices"][0]["finish_reason"],
        finish(expected.stop_reason)
    );
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(&chunks[n - 1]["usage"], usage);

    // A stop sequence from the middle of the reply ends it there.
    let stop = expected
        .text
        .chars()
        .nth(expected.text.chars().count() / 2)
        .unwrap()
        .to_string();
    let stopped = reference.generate(Ok(chat_messages()), 12, &[&stop]);
    assert_eq!(stopped.stop_reason, StopReason::StopString);
    let mut body = chat_body(Some(12), false);
    body["stop"] = json!([stop]);
    let reply = post_json(&server, "/v1/chat/completions", &body);
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        stopped.text.as_str()
    );
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");

    // A raw completion, streamed and not.
    let expected = reference.generate(Err("Once upon a time"), 6, &[]);
    let body = json!({"model": CHAT_MODEL, "prompt": "Once upon a time", "temperature": 0, "max_tokens": 6});
    let reply = post_json(&server, "/v1/completions", &body);
    assert_eq!(reply["object"], "text_completion");
    assert_eq!(reply["choices"][0]["text"], expected.text.as_str());
    assert_eq!(reply["usage"]["prompt_tokens"], expected.prompt_tokens);
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (status, text) = call(
        &server,
        "POST",
        "/v1/completions",
        Some(KEY),
        Some(&streamed_body.to_string()),
    );
    assert_eq!(status, 200, "{text}");
    let data = events(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, expected.text);

    // Images: two 24x16 PNGs (seeds 5 and 6) equal to the pipeline run here, within 2/255 per channel
    // (the same kernels on the same device; the margin only allows for rounding differences).
    let reply = post_json(
        &server,
        "/v1/images/generations",
        &json!({"model": IMAGE_MODEL, "prompt": "a red square", "size": "24x16", "n": 2,
                "response_format": "b64_json", "steps": 2, "negative_prompt": "blurry", "cfg_scale": 5,
                "seed": 5, "scheduler": "euler"}),
    );
    let data = reply["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, item) in data.iter().enumerate() {
        let got = decode_png(item["b64_json"].as_str().unwrap());
        assert_eq!((got.width, got.height), (24, 16));
        let want = reference.image(&checkpoint, 24, 16, 5 + i as u64);
        let worst = got
            .pixels
            .iter()
            .zip(&want.pixels)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(
            worst <= 2,
            "image {i} differs from the engine's by {worst}/255"
        );
    }

    // Errors in OpenAI's shape.
    assert_error(
        call(&server, "GET", "/v1/models", Some("wrong"), None),
        401,
        Some("invalid_api_key"),
    );
    assert_error(
        call(&server, "GET", "/v1/models", None, None),
        401,
        Some("invalid_api_key"),
    );
    assert_error(
        call(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some("{\"model\": "),
        ),
        400,
        None,
    );
    let mut unknown = chat_body(Some(3), false);
    unknown["model"] = json!("gpt-17");
    let e = assert_error(
        call(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(&unknown.to_string()),
        ),
        400,
        Some("model_not_found"),
    );
    assert_eq!(e["error"]["param"], "model");
    let mut hot = chat_body(Some(3), false);
    hot["temperature"] = json!(9);
    let e = assert_error(
        call(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(&hot.to_string()),
        ),
        400,
        None,
    );
    assert_eq!(e["error"]["param"], "temperature");
    assert_error(
        call(
            &server,
            "POST",
            "/v1/images/generations",
            Some(KEY),
            Some(r#"{"prompt":"x","size":"20x20"}"#),
        ),
        400,
        None,
    );
    assert_error(
        call(&server, "GET", "/v1/nothing", Some(KEY), None),
        404,
        Some("unknown_url"),
    );
    assert_error(
        call(&server, "GET", "/v1/chat/completions", Some(KEY), None),
        405,
        None,
    );
    // Larger than the 1 MiB default: refused before the body is read, and the client still gets the answer.
    let big = format!(
        "{{\"model\":\"{CHAT_MODEL}\",\"pad\":\"{}\"}}",
        "x".repeat(1_100_000)
    );
    assert_error(
        call(
            &server,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(&big),
        ),
        413,
        Some("request_too_large"),
    );

    // A client that hangs up mid-stream cancels its generation (well before the context's end), and
    // the server keeps answering.
    let got = hang_up_mid_stream(&server);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let line = server.wait_for_log("generation cancelled after");
    let tokens: usize = line
        .split("cancelled after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(tokens < 200, "cancelled only after {tokens} tokens: {line}");
    let reply = post_json(&server, "/v1/chat/completions", &chat_body(Some(3), false));
    assert_eq!(reply["usage"]["completion_tokens"], 3);

    // A client that sends half a request and goes quiet is dropped after the idle timeout (2 s here).
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le")
        .unwrap();
    let t = Instant::now();
    let mut rest = Vec::new();
    let closed = slow.read_to_end(&mut rest).is_ok();
    assert!(
        closed && rest.is_empty(),
        "the idle connection got {rest:?}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "closed after {:?}",
        t.elapsed()
    );
    let (status, _) = call(&server, "GET", "/v1/models", Some(KEY), None);
    assert_eq!(status, 200);
}

/// `$DRIFT_PYTHON`, else the venv .ci/run makes (`$DRIFT_CACHE` or ~/.cache/drift, `pyenv/`), else python3.
fn python() -> String {
    if let Ok(p) = std::env::var("DRIFT_PYTHON") {
        return p;
    }
    let cache = std::env::var_os("DRIFT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drift")));
    cache
        .map(|c| c.join("pyenv/bin/python"))
        .filter(|p| p.is_file())
        .map_or_else(|| "python3".into(), |p| p.to_string_lossy().into_owned())
}

#[test]
fn openai_python_package_against_drift_serve() {
    let python = python();
    let has_openai = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openai {
        let why = format!(
            "{python} cannot import the `openai` package: pip install openai (or point DRIFT_PYTHON at a Python that has it)"
        );
        if std::env::var("DRIFT_SKIP_OPENAI_PY").as_deref() == Ok("1") {
            eprintln!("skipped: {why}");
            return;
        }
        panic!("{why}; DRIFT_SKIP_OPENAI_PY=1 skips this test");
    }
    let dir = scratch("serve-python");
    let checkpoint = common::unpack_checkpoint(&dir.0, IMAGE_MODEL);
    let server = DriftServe::start(&checkpoint, &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_openai.py");
    let out = Command::new(&python)
        .arg(script)
        .args([&server.url("/v1"), KEY, CHAT_MODEL, IMAGE_MODEL])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    // The abandoned stream was cancelled on the server.
    server.wait_for_log("client disconnected");
}

#[test]
fn refuses_to_listen_beyond_loopback_without_a_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_drift"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--model"])
        .arg(chat_fixture())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("refusing to listen on 0.0.0.0")
            && err.contains("--api-key"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_drift"))
        .args(["serve", "--port", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nothing to serve"),
        "{err}"
    );
}
