//! One streamed completion. A reader thread makes the request and parses the server-sent events; the
//! caller's thread takes the chunks from a channel, so it can stop at any moment (Stop in the UI)
//! without waiting for the server's next byte. When the caller goes, the reader's next send fails and
//! it drops the connection, which tells the server to stop generating.

use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::error::{ErrorKind, RemoteError, RequestContext};
use super::sse::SseReader;

/// How often the caller looks at its cancel flag while nothing arrives.
const CANCEL_POLL: Duration = Duration::from_millis(20);
/// The most of an error response's body that is read.
const ERROR_BODY_LIMIT: u64 = 64 << 10;

/// Everything the reader thread needs (owned: it may outlive the call when cancelled).
pub struct StreamRequest {
    pub agent: ureq::Agent,
    pub url: String,
    pub api_key: Option<String>,
    pub body: String,
    pub base: String,
    pub model: String,
    pub idle_secs: u64,
}

/// Token counts as the server reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: usize,
    #[serde(default)]
    pub completion_tokens: usize,
}

/// How a streamed reply ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The server's `finish_reason` (`stop`, `length`, …), or "stop" when it sent `[DONE]` without one.
    Server(String),
    /// The caller stopped it.
    Cancelled,
}

impl Finish {
    /// The server's word, or "cancelled".
    pub fn name(&self) -> &str {
        match self {
            Finish::Server(why) => why,
            Finish::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct StreamedReply {
    pub text: String,
    /// Chunks that carried text (servers send about one token per chunk).
    pub chunks: usize,
    pub usage: Option<Usage>,
    pub finish: Finish,
    /// From sending the request to the first text.
    #[serde(skip)]
    pub first_text_after: Option<Duration>,
    /// From the first text to the last.
    #[serde(skip)]
    pub text_span: Duration,
}

/// Speeds as seen from this side of the network (the server's queueing and the network included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speeds {
    /// 0 when the server did not report usage.
    pub prompt_tokens: usize,
    pub prompt_tokens_per_s: f64,
    /// From the server's usage, else the number of text chunks.
    pub completion_tokens: usize,
    pub completion_tokens_per_s: f64,
}

impl StreamedReply {
    pub fn speeds(&self) -> Speeds {
        let usage = self.usage.unwrap_or_default();
        let completion_tokens = match self.usage {
            Some(u) if u.completion_tokens > 0 => u.completion_tokens,
            _ => self.chunks,
        };
        let prompt_tokens_per_s = match self.first_text_after {
            Some(t) if usage.prompt_tokens > 0 && t > Duration::ZERO => {
                usage.prompt_tokens as f64 / t.as_secs_f64()
            }
            _ => 0.0,
        };
        // The first token came with the prompt's processing; the rest over the span.
        let span = self.text_span.as_secs_f64();
        let completion_tokens_per_s = if completion_tokens > 1 && span > 0.0 {
            (completion_tokens - 1) as f64 / span
        } else {
            0.0
        };
        Speeds {
            prompt_tokens: usage.prompt_tokens,
            prompt_tokens_per_s,
            completion_tokens,
            completion_tokens_per_s,
        }
    }
}

/// What the reader thread sends.
enum Item {
    /// One parsed chunk: its text (maybe empty), finish reason and usage when present.
    Chunk {
        text: String,
        finish_reason: Option<String>,
        usage: Option<Usage>,
    },
    /// `data: [DONE]`.
    Done,
    /// The body ended without `[DONE]`.
    Eof,
    Failed(RemoteError),
}

pub fn run(
    request: StreamRequest,
    ctx: &RequestContext<'_>,
    cancel: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<StreamedReply, RemoteError> {
    let started = Instant::now();
    let (tx, rx) = channel();
    let base = request.base.clone();
    // The status error needs the request context's wording; the reader owns a copy of its parts.
    let sent_key = ctx.sent_key;
    std::thread::Builder::new()
        .name("drift-remote-stream".into())
        .spawn(move || read_stream(request, sent_key, &tx))
        .map_err(|e| {
            RemoteError::new(
                ErrorKind::Unreachable,
                format!("no thread for the request: {e}"),
            )
        })?;
    collect(&rx, &base, started, cancel, on_text)
}

/// The caller's side: chunks into text and callbacks, until the end, an error or `cancel`.
fn collect(
    rx: &Receiver<Item>,
    base: &str,
    started: Instant,
    cancel: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<StreamedReply, RemoteError> {
    let mut reply = StreamedReply {
        text: String::new(),
        chunks: 0,
        usage: None,
        finish: Finish::Cancelled,
        first_text_after: None,
        text_span: Duration::ZERO,
    };
    let mut finish_reason: Option<String> = None;
    loop {
        if cancel.load(Ordering::SeqCst) {
            reply.finish = Finish::Cancelled;
            return Ok(reply);
        }
        let item = match rx.recv_timeout(CANCEL_POLL) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(RemoteError::new(
                    ErrorKind::Protocol,
                    format!("reading the stream from {base} stopped unexpectedly"),
                ));
            }
        };
        match item {
            Item::Chunk {
                text,
                finish_reason: f,
                usage,
            } => {
                if !text.is_empty() {
                    let now = started.elapsed();
                    let first = *reply.first_text_after.get_or_insert(now);
                    reply.text_span = now - first;
                    reply.chunks += 1;
                    reply.text.push_str(&text);
                    on_text(&text);
                }
                if f.is_some() {
                    finish_reason = f;
                }
                if usage.is_some() {
                    reply.usage = usage;
                }
            }
            Item::Done => {
                reply.finish = Finish::Server(finish_reason.unwrap_or_else(|| "stop".into()));
                return Ok(reply);
            }
            // A server that said why it finished but not [DONE] has still finished.
            Item::Eof => match finish_reason {
                Some(f) => {
                    reply.finish = Finish::Server(f);
                    return Ok(reply);
                }
                None => return Err(RemoteError::ended_early(base)),
            },
            Item::Failed(e) => return Err(e),
        }
    }
}

/// The reader thread: request, status, then events until `[DONE]`, the end, an error, or the caller
/// leaving (a failed send).
fn read_stream(req: StreamRequest, sent_key: bool, tx: &Sender<Item>) {
    let mut call = req
        .agent
        .post(&req.url)
        .header("Content-Type", "application/json")
        .header("Accept", "text/event-stream");
    if let Some(k) = &req.api_key {
        call = call.header("Authorization", format!("Bearer {k}"));
    }
    let mut resp = match call.send(&req.body) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Item::Failed(RemoteError::from_transport(
                e,
                &req.base,
                req.idle_secs,
            )));
            return;
        }
    };
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp
            .body_mut()
            .with_config()
            .limit(ERROR_BODY_LIMIT)
            .read_to_string()
            .unwrap_or_default();
        let ctx = RequestContext {
            base: &req.base,
            url: &req.url,
            model: Some(&req.model),
            sent_key,
        };
        let _ = tx.send(Item::Failed(RemoteError::from_status(status, &body, &ctx)));
        return;
    }
    let mut events = SseReader::new(BufReader::new(resp.into_body().into_reader()));
    loop {
        let item = match events.next_event() {
            Ok(None) => Item::Eof,
            Ok(Some(ev)) if ev.data.trim() == "[DONE]" => Item::Done,
            Ok(Some(ev)) => parse_chunk(&ev.data, &req.base),
            Err(e) => Item::Failed(RemoteError::mid_stream(&e, &req.base, req.idle_secs)),
        };
        let last = !matches!(item, Item::Chunk { .. });
        if tx.send(item).is_err() || last {
            return; // dropping the reader closes the connection
        }
    }
}

/// One `data:` payload: a chat chunk (`choices[0].delta.content`), a completion chunk
/// (`choices[0].text`), a usage-only chunk, or an error object sent mid-stream.
fn parse_chunk(data: &str, base: &str) -> Item {
    let v: serde_json::Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            let mut shown: String = data.chars().take(120).collect();
            if data.chars().count() > 120 {
                shown.push('…');
            }
            return Item::Failed(RemoteError::new(
                ErrorKind::Protocol,
                format!("the server at {base} streamed something that is not JSON ({e}): {shown}"),
            ));
        }
    };
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let message = err
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .or_else(|| err.as_str().map(str::to_string))
            .unwrap_or_else(|| err.to_string());
        return Item::Failed(RemoteError::new(
            ErrorKind::Server,
            format!("the server at {base} stopped with an error: {message}"),
        ));
    }
    let choice = v
        .get("choices")
        .and_then(|c| c.as_array())
        .and_then(|c| c.iter().find(|c| c["index"].as_u64().unwrap_or(0) == 0));
    let text = choice
        .and_then(|c| c.pointer("/delta/content").or_else(|| c.get("text")))
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .to_string();
    let finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(|f| f.as_str())
        .map(str::to_string);
    let usage = v
        .get("usage")
        .filter(|u| !u.is_null())
        .and_then(|u| serde_json::from_value(u.clone()).ok());
    Item::Chunk {
        text,
        finish_reason,
        usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(item: Item) -> (String, Option<String>, Option<Usage>) {
        match item {
            Item::Chunk {
                text,
                finish_reason,
                usage,
            } => (text, finish_reason, usage),
            Item::Failed(e) => panic!("failed: {e}"),
            _ => panic!("not a chunk"),
        }
    }

    #[test]
    fn chunks_in_the_shapes_servers_send() {
        let chat = r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}"#;
        assert_eq!(chunk(parse_chunk(chat, "b")), ("Hel".into(), None, None));
        let role_only = r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#;
        assert_eq!(chunk(parse_chunk(role_only, "b")).0, "");
        let last = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}"#;
        assert_eq!(chunk(parse_chunk(last, "b")).1.as_deref(), Some("length"));
        let usage =
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;
        assert_eq!(
            chunk(parse_chunk(usage, "b")).2,
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 4
            })
        );
        let completion = r#"{"object":"text_completion","choices":[{"index":0,"text":" upon","finish_reason":null}]}"#;
        assert_eq!(chunk(parse_chunk(completion, "b")).0, " upon");
    }

    #[test]
    fn errors_inside_the_stream() {
        let Item::Failed(e) = parse_chunk(
            r#"{"error":{"message":"out of memory","code":500}}"#,
            "http://b",
        ) else {
            panic!("an error object is a failure")
        };
        assert_eq!(e.kind, ErrorKind::Server);
        assert!(e.message.ends_with("out of memory"), "{e}");
        let Item::Failed(e) = parse_chunk("{\"choices\": [", "http://b") else {
            panic!("cut JSON is a failure")
        };
        assert_eq!(e.kind, ErrorKind::Protocol);
    }

    #[test]
    fn speeds_from_usage_or_chunks() {
        let mut r = StreamedReply {
            text: "abc".into(),
            chunks: 3,
            usage: None,
            finish: Finish::Server("stop".into()),
            first_text_after: Some(Duration::from_millis(500)),
            text_span: Duration::from_secs(1),
        };
        let s = r.speeds();
        assert_eq!((s.prompt_tokens, s.completion_tokens), (0, 3));
        assert_eq!(s.prompt_tokens_per_s, 0.0);
        assert!((s.completion_tokens_per_s - 2.0).abs() < 1e-12);
        r.usage = Some(Usage {
            prompt_tokens: 100,
            completion_tokens: 5,
        });
        let s = r.speeds();
        assert_eq!(s.completion_tokens, 5);
        assert!((s.prompt_tokens_per_s - 200.0).abs() < 1e-9);
        assert!((s.completion_tokens_per_s - 4.0).abs() < 1e-12);
    }
}
