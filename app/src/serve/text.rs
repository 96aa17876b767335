//! `POST /v1/chat/completions` and `POST /v1/completions`: one generation on the shared GPU, answered
//! as one JSON object or streamed as server-sent events (`chat.completion.chunk` / `text_completion`
//! objects, then `data: [DONE]`). A client that hangs up cancels its generation.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

use drift_engine::generate::{Generation, LlmSession, StopReason};
use serde_json::{Value, json};

use super::Served;
use super::Shared;
use super::api_error::ApiError;
use super::http::{EventStream, Request, client_gone, write_json};
use super::openai::{finish_reason, response_id, unix_now, usage};
use super::text_params::{TextInput, TextRequest, parse_chat, parse_completion};

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Completion,
}

/// What every object of one response repeats.
struct Header {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Header {
    fn object(&self, choice: Value, streamed: bool) -> Value {
        let object = match (self.endpoint, streamed) {
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Completion, _) => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [choice],
        })
    }

    /// One streamed piece of text (and, at the end, the finish reason).
    fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        self.object(choice, true)
    }

    fn complete(&self, g: &Generation) -> Value {
        let finish = finish_reason(g.stop_reason);
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": g.text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish,
            }),
            Endpoint::Completion => {
                json!({"index": 0, "text": g.text, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut v = self.object(choice, false);
        v["usage"] = usage(g.prompt_tokens, g.tokens.len());
        v
    }

    /// The last streamed object when the client asked for usage: no choices, the token counts.
    fn usage_chunk(&self, g: &Generation) -> Value {
        let mut v = self.chunk("", None);
        v["choices"] = json!([]);
        v["usage"] = usage(g.prompt_tokens, g.tokens.len());
        v
    }
}

pub fn chat_completions(
    shared: &Shared,
    req: &Request,
    conn: &TcpStream,
) -> Result<Served, ApiError> {
    run(shared, conn, Endpoint::Chat, parse_chat(&req.body)?)
}

pub fn completions(shared: &Shared, req: &Request, conn: &TcpStream) -> Result<Served, ApiError> {
    run(
        shared,
        conn,
        Endpoint::Completion,
        parse_completion(&req.body)?,
    )
}

fn prompt_ids(session: &LlmSession, input: &TextInput) -> Result<Vec<u32>, ApiError> {
    let (ids, param) = match input {
        TextInput::Chat(messages) => {
            let text = session.render(messages).map_err(|e| {
                ApiError::bad_param(
                    "messages",
                    format!("the model's chat template refused these messages: {e}"),
                )
            })?;
            // The template writes its own BOS.
            (session.tokenizer.encode(&text, false), "messages")
        }
        TextInput::Prompt(text) => (session.tokenizer.encode(text, true), "prompt"),
    };
    let ids = ids
        .map_err(|e| ApiError::bad_param(param, format!("could not tokenize the {param}: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::bad_param(param, format!("the {param} is empty")));
    }
    let context = session.model.max_ctx;
    if ids.len() + 1 > context {
        return Err(ApiError::bad_param(
            param,
            format!(
                "This model's context holds {context} tokens; the {param} takes {} (start the server with a larger --context, or send less)",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(ids)
}

fn run(
    shared: &Shared,
    conn: &TcpStream,
    endpoint: Endpoint,
    mut req: TextRequest,
) -> Result<Served, ApiError> {
    let entry = shared.registry.llm(&req.model)?;
    let _turn = shared.queue.acquire();
    if client_gone(conn) {
        return Ok(Served::gone("before its turn on the GPU"));
    }
    let mut loaded = shared.registry.loaded();
    let session = loaded.llm(&shared.gpu, entry, shared.registry.context())?;
    let prompt = prompt_ids(session, &req.input)?;
    let room = session.model.max_ctx - prompt.len();
    req.options.max_tokens = req.max_tokens.unwrap_or(room).min(room);
    let header = Header {
        endpoint,
        id: response_id(if endpoint == Endpoint::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: entry.id.clone(),
    };
    let outcome = if req.stream {
        stream(shared, conn, session, &prompt, &req, &header)
    } else {
        respond(shared, conn, session, &prompt, &req, &header)
    };
    if outcome.as_ref().is_err_and(|e| e.status == 500)
        || outcome.as_ref().is_ok_and(|s| s.status == 500)
    {
        // An engine failure mid-generation may leave the session's cache out of step with the GPU.
        loaded.forget_llm();
    }
    outcome
}

fn cancelled_after(g: &Generation) -> String {
    let n = g.tokens.len();
    format!(
        "generation cancelled after {n} token{}",
        if n == 1 { "" } else { "s" }
    )
}

fn summary(model: &str, g: &Generation) -> String {
    format!(
        "{model}: {} prompt + {} completion tokens, {:.1} tok/s, finish {}",
        g.prompt_tokens,
        g.tokens.len(),
        g.decode_tokens_per_s,
        finish_reason(g.stop_reason)
    )
}

fn respond(
    shared: &Shared,
    conn: &TcpStream,
    session: &mut LlmSession,
    prompt: &[u32],
    req: &TextRequest,
    header: &Header,
) -> Result<Served, ApiError> {
    let cancel = AtomicBool::new(false);
    let g = session
        .generate(&shared.gpu, prompt, &req.options, &cancel, &mut |_| {
            if client_gone(conn) {
                cancel.store(true, Ordering::Relaxed);
            }
        })
        .map_err(|e| ApiError::server(format!("generation failed: {e}")))?;
    if g.stop_reason == StopReason::Cancelled {
        return Ok(Served::gone(&cancelled_after(&g)));
    }
    let _ = write_json(conn, 200, &header.complete(&g));
    Ok(Served::ok(summary(&header.model, &g)))
}

fn stream(
    shared: &Shared,
    conn: &TcpStream,
    session: &mut LlmSession,
    prompt: &[u32],
    req: &TextRequest,
    header: &Header,
) -> Result<Served, ApiError> {
    let Ok(mut events) = EventStream::start(conn) else {
        return Ok(Served::gone("before the stream started"));
    };
    let mut lost = false;
    if header.endpoint == Endpoint::Chat {
        let mut first = header.chunk("", None);
        first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
        lost = events.send(&first.to_string()).is_err();
    }
    let cancel = AtomicBool::new(lost);
    let result = session.generate(&shared.gpu, prompt, &req.options, &cancel, &mut |piece| {
        if !lost
            && (events.send(&header.chunk(piece, None).to_string()).is_err() || client_gone(conn))
        {
            lost = true;
            cancel.store(true, Ordering::Relaxed);
        }
    });
    let g = match result {
        Ok(g) => g,
        Err(e) => {
            // The status line is gone; the error travels as an event (the SDKs raise it).
            let error = ApiError::server(format!("generation failed: {e}"));
            let _ = events.send(&error.to_json().to_string());
            let _ = events.finish();
            return Ok(Served {
                status: 500,
                note: error.message,
            });
        }
    };
    if lost || g.stop_reason == StopReason::Cancelled {
        return Ok(Served::gone(&cancelled_after(&g)));
    }
    let finish = header.chunk("", Some(finish_reason(g.stop_reason)));
    let mut sent = events.send(&finish.to_string());
    if req.include_usage {
        sent = sent.and_then(|_| events.send(&header.usage_chunk(&g).to_string()));
    }
    if sent
        .and_then(|_| events.send("[DONE]"))
        .and_then(|_| events.finish())
        .is_err()
    {
        return Ok(Served::gone("before the end of the stream"));
    }
    Ok(Served::ok(summary(&header.model, &g)))
}
