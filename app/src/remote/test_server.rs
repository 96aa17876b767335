//! A small OpenAI-like server for tests: real sockets on 127.0.0.1, HTTP/1.1, `GET /v1/models`, and
//! `POST /v1/chat/completions` / `/v1/completions` streamed as server-sent events, with scripted
//! failures (an error status, a connection dropped mid-stream, a stall). Used by the client's tests,
//! the chat tab's UI tests and `app/tests/remote.rs` (which includes this file by path), so it needs
//! nothing but std and serde_json.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What goes wrong, if anything.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    None,
    /// Answer every completion with this status and body.
    Status(u16, String),
    /// Send this many pieces, then drop the connection (no `[DONE]`).
    CloseAfter(usize),
    /// Send this many pieces, then an OpenAI error object inside the stream.
    ErrorEventAfter(usize, String),
    /// Send this many pieces, then nothing until the server is dropped.
    StallAfter(usize),
}

#[derive(Clone, Debug)]
pub struct Behaviour {
    pub models: Vec<String>,
    /// The key a request must carry (`Authorization: Bearer …`); `None`: no key needed.
    pub api_key: Option<String>,
    /// The streamed reply, one chunk per piece.
    pub pieces: Vec<String>,
    pub delay: Duration,
    /// Send a usage chunk when the request asks for one.
    pub usage: bool,
    /// `Transfer-Encoding: chunked` (as most servers do), else a body delimited by closing.
    pub chunked: bool,
    pub failure: Failure,
}

impl Default for Behaviour {
    fn default() -> Behaviour {
        Behaviour {
            models: vec!["test-model".into()],
            api_key: None,
            pieces: vec!["Hello".into(), ", ".into(), "world".into(), "!".into()],
            delay: Duration::ZERO,
            usage: true,
            chunked: true,
            failure: Failure::None,
        }
    }
}

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: serde_json::Value,
}

/// What the server saw of the client while streaming.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamLog {
    /// Pieces written before the client went away (a write failed).
    pub client_left_after: Option<usize>,
}

pub struct TestServer {
    /// `http://127.0.0.1:PORT` (no `/v1`).
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    log: Arc<Mutex<StreamLog>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(behaviour: Behaviour) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
        let addr = listener.local_addr().expect("bound address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::new(Mutex::new(StreamLog::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Shared {
            behaviour: Arc::new(behaviour),
            requests: requests.clone(),
            log: log.clone(),
            stop: stop.clone(),
        };
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let shared = shared.clone();
                std::thread::spawn(move || shared.serve(conn));
            }
        });
        TestServer {
            url: format!("http://{addr}"),
            requests,
            log,
            stop,
            addr,
            accept: Some(accept),
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub fn stream_log(&self) -> StreamLog {
        *self.log.lock().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone)]
struct Shared {
    behaviour: Arc<Behaviour>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    log: Arc<Mutex<StreamLog>>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn serve(&self, mut conn: TcpStream) {
        let Some(req) = read_request(&mut conn) else {
            return;
        };
        self.requests.lock().unwrap().push(req.clone());
        let b = &self.behaviour;
        if let Some(key) = &b.api_key
            && req.authorization.as_deref() != Some(&format!("Bearer {key}"))
        {
            let msg = if req.authorization.is_some() {
                "Incorrect API key provided"
            } else {
                "You didn't provide an API key"
            };
            return respond_json(&mut conn, 401, &openai_error(msg, "invalid_api_key"));
        }
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/v1/models") => {
                let data: Vec<_> = b
                    .models
                    .iter()
                    .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "test"}))
                    .collect();
                respond_json(
                    &mut conn,
                    200,
                    &serde_json::json!({"object": "list", "data": data}).to_string(),
                )
            }
            ("POST", "/v1/chat/completions") => self.complete(&mut conn, &req, true),
            ("POST", "/v1/completions") => self.complete(&mut conn, &req, false),
            _ => respond(&mut conn, 404, "text/plain", "404 page not found"),
        }
    }

    fn complete(&self, conn: &mut TcpStream, req: &Recorded, chat: bool) {
        let b = &self.behaviour;
        let model = req.body["model"].as_str().unwrap_or_default().to_string();
        if !b.models.contains(&model) {
            let msg = format!("The model `{model}` does not exist.");
            return respond_json(conn, 404, &openai_error(&msg, "model_not_found"));
        }
        if let Failure::Status(status, body) = &b.failure {
            return respond_json(conn, *status, body);
        }
        let framing = if b.chunked {
            "Transfer-Encoding: chunked\r\n"
        } else {
            ""
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
             Connection: close\r\n{framing}\r\n"
        );
        if conn.write_all(head.as_bytes()).is_err() {
            return;
        }
        let send = |conn: &mut TcpStream, payload: &str| -> bool {
            let event = format!("data: {payload}\n\n");
            let bytes = if b.chunked {
                format!("{:x}\r\n{event}\r\n", event.len())
            } else {
                event
            };
            conn.write_all(bytes.as_bytes())
                .and_then(|_| conn.flush())
                .is_ok()
        };
        let chunk = |text: Option<&str>, finish: Option<&str>| {
            if chat {
                let delta = match text {
                    Some(t) => serde_json::json!({"content": t}),
                    None => serde_json::json!({}),
                };
                serde_json::json!({"id": "chatcmpl-test", "object": "chat.completion.chunk",
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            } else {
                serde_json::json!({"id": "cmpl-test", "object": "text_completion", "model": model,
                    "choices": [{"index": 0, "text": text.unwrap_or(""), "finish_reason": finish}]})
            }
            .to_string()
        };
        if chat {
            let role = serde_json::json!({"object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]});
            if !send(conn, &role.to_string()) {
                return;
            }
        }
        let cut_after = match &b.failure {
            Failure::CloseAfter(n) | Failure::ErrorEventAfter(n, _) | Failure::StallAfter(n) => *n,
            _ => usize::MAX,
        };
        for (i, piece) in b.pieces.iter().enumerate() {
            if i == cut_after {
                break;
            }
            if i > 0 {
                std::thread::sleep(b.delay);
            }
            if !send(conn, &chunk(Some(piece), None)) {
                self.log.lock().unwrap().client_left_after = Some(i);
                return;
            }
        }
        match &b.failure {
            Failure::CloseAfter(_) => {
                let _ = conn.shutdown(Shutdown::Both);
                return;
            }
            Failure::ErrorEventAfter(_, msg) => {
                send(conn, &openai_error(msg, "server_error"));
                let _ = conn.shutdown(Shutdown::Both);
                return;
            }
            Failure::StallAfter(_) => {
                while !self.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            _ => {}
        }
        send(conn, &chunk(None, Some("stop")));
        if b.usage && req.body["stream_options"]["include_usage"] == true {
            let prompt_tokens = prompt_words(&req.body);
            let usage = serde_json::json!({"object": "chat.completion.chunk", "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": b.pieces.len(),
                          "total_tokens": prompt_tokens + b.pieces.len()}});
            send(conn, &usage.to_string());
        }
        send(conn, "[DONE]");
        if b.chunked {
            let _ = conn.write_all(b"0\r\n\r\n");
        }
    }
}

/// A stand-in token count: the prompt's words.
fn prompt_words(body: &serde_json::Value) -> usize {
    let chat = body["messages"].as_array().map(|ms| {
        ms.iter()
            .map(|m| {
                m["content"]
                    .as_str()
                    .unwrap_or("")
                    .split_whitespace()
                    .count()
            })
            .sum::<usize>()
    });
    chat.unwrap_or_else(|| {
        body["prompt"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .count()
    })
}

fn openai_error(message: &str, code: &str) -> String {
    serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null,
        "code": code}})
    .to_string()
}

fn read_request(conn: &mut TcpStream) -> Option<Recorded> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut length = 0usize;
    let mut authorization = None;
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => authorization = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Recorded {
        method,
        path,
        authorization,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    })
}

fn respond_json(conn: &mut TcpStream, status: u16, body: &str) {
    respond(conn, status, "application/json", body)
}

fn respond(conn: &mut TcpStream, status: u16, content_type: &str, body: &str) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(text.as_bytes());
}
