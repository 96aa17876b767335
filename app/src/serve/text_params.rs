//! The fields of `/v1/chat/completions` and `/v1/completions` requests, checked and turned into the
//! engine's options. Errors name the offending field (OpenAI's `param`). Unknown fields are ignored,
//! as OpenAI-compatible servers do; features Drift lacks (tools, logprobs, n > 1) are refused.

use drift_engine::generate::GenerateOptions;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::api_error::ApiError;

/// At most this many stop sequences, as OpenAI allows.
const MAX_STOPS: usize = 4;

/// What to generate from.
pub enum TextInput {
    Chat(Vec<Message>),
    /// A raw prompt (`/v1/completions`).
    Prompt(String),
}

pub struct TextRequest {
    pub model: String,
    pub input: TextInput,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// `max_tokens` as asked; `None` means up to the end of the context.
    pub max_tokens: Option<usize>,
    pub options: GenerateOptions,
}

/// The body as a JSON object.
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request(
            "The request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}"
        ))),
    }
}

/// An optional field (`null` counts as absent) of type `T`.
pub fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| ApiError::bad_param(name, format!("'{name}': {e}"))),
    }
}

pub fn required<T: DeserializeOwned>(obj: &Map<String, Value>, name: &str) -> Result<T, ApiError> {
    field(obj, name)?.ok_or_else(|| ApiError::bad_param(name, format!("'{name}' is required")))
}

/// A number field within `range` (inclusive).
pub fn ranged(
    obj: &Map<String, Value>,
    name: &str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    match field::<f64>(obj, name)? {
        Some(v) if !(lo..=hi).contains(&v) => Err(ApiError::bad_param(
            name,
            format!("'{name}' must be between {lo} and {hi}, got {v}"),
        )),
        v => Ok(v),
    }
}

/// OpenAI's `seed` is a signed 64-bit integer; Drift's RNG takes its bits. Absent: a fresh seed.
pub fn seed(obj: &Map<String, Value>) -> Result<u64, ApiError> {
    Ok(match field::<i64>(obj, "seed")? {
        Some(s) => s as u64,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    })
}

fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(n) = field::<u64>(obj, "n")?
        && n != 1
    {
        return Err(ApiError::bad_param(
            "n",
            "Drift returns one choice per request: 'n' must be 1",
        ));
    }
    if field::<bool>(obj, "logprobs")?.unwrap_or(false) {
        return Err(ApiError::bad_param(
            "logprobs",
            "'logprobs' is not supported",
        ));
    }
    if obj.get("logprobs").is_some_and(Value::is_number) {
        return Err(ApiError::bad_param(
            "logprobs",
            "'logprobs' is not supported",
        ));
    }
    for name in ["tools", "functions"] {
        if obj
            .get(name)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(ApiError::bad_param(
                name,
                format!("'{name}' (tool calling) is not supported"),
            ));
        }
    }
    if let Some(Value::Object(f)) = obj.get("response_format")
        && f.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "text")
    {
        return Err(ApiError::bad_param(
            "response_format",
            "only the 'text' response format is supported",
        ));
    }
    Ok(())
}

fn stop_sequences(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let stops = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad_param("stop", "'stop' must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::bad_param(
                "stop",
                "'stop' must be a string or an array of strings",
            ));
        }
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::bad_param(
            "stop",
            format!("at most {MAX_STOPS} stop sequences"),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad_param(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    Ok(stops)
}

/// Sampling as OpenAI defines it (temperature 1, top_p 1, nothing else) unless the request asks for
/// more; `top_k`, `min_p` and `repeat_penalty` are accepted as extra fields (as llama.cpp's server does).
fn sampling(obj: &Map<String, Value>) -> Result<SamplingParams, ApiError> {
    let temperature = ranged(obj, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = ranged(obj, "top_p", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    Ok(SamplingParams {
        // top_p 0 keeps only the most likely token.
        temperature: if top_p == 0.0 { 0.0 } else { temperature },
        top_p: top_p.max(f32::MIN_POSITIVE),
        top_k: field::<usize>(obj, "top_k")?.unwrap_or(0),
        min_p: ranged(obj, "min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32,
        repeat_penalty: ranged(obj, "repeat_penalty", 0.01, 10.0)?.unwrap_or(1.0) as f32,
        repeat_window: SamplingParams::default().repeat_window,
        seed: seed(obj)?,
    })
}

fn max_tokens(obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    // Newer clients send max_completion_tokens; it wins when both are present.
    for name in ["max_completion_tokens", "max_tokens"] {
        if let Some(n) = field::<u64>(obj, name)? {
            if n == 0 {
                return Err(ApiError::bad_param(
                    name,
                    format!("'{name}' must be at least 1"),
                ));
            }
            return Ok(Some(n.min(usize::MAX as u64) as usize));
        }
    }
    Ok(None)
}

fn content_text(content: &Value, index: usize) -> Result<String, ApiError> {
    let param = format!("messages.[{index}].content");
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => Ok(t.to_string()),
                    (kind, _) => Err(ApiError::bad_param(
                        &param,
                        format!(
                            "content parts of type {} are not supported (text only)",
                            kind.unwrap_or("?")
                        ),
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("\n")),
        _ => Err(ApiError::bad_param(
            &param,
            "'content' must be a string or an array of text parts",
        )),
    }
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let items: Vec<Value> = required(obj, "messages")?;
    if items.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "'messages' must not be empty",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_param(
                    &format!("messages.[{i}].role"),
                    "every message needs a 'role'",
                )
            })?;
            let role = match role {
                // OpenAI's newer name for the system role.
                "developer" => "system",
                "system" | "user" | "assistant" => role,
                other => {
                    return Err(ApiError::bad_param(
                        &format!("messages.[{i}].role"),
                        format!(
                            "role '{other}' is not supported (system, developer, user, assistant)"
                        ),
                    ));
                }
            };
            let content = content_text(m.get("content").unwrap_or(&Value::Null), i)?;
            Ok(Message::new(role, &content))
        })
        .collect()
}

fn prompt(obj: &Map<String, Value>) -> Result<String, ApiError> {
    match obj.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().unwrap_or_default().to_string())
        }
        None | Some(Value::Null) => Err(ApiError::bad_param("prompt", "'prompt' is required")),
        Some(_) => Err(ApiError::bad_param(
            "prompt",
            "'prompt' must be a string (one prompt per request)",
        )),
    }
}

fn parse(body: &[u8], chat: bool) -> Result<TextRequest, ApiError> {
    let obj = json_object(body)?;
    let model: String = required(&obj, "model")?;
    refuse_unsupported(&obj)?;
    let input = if chat {
        TextInput::Chat(messages(&obj)?)
    } else {
        if field::<bool>(&obj, "echo")?.unwrap_or(false) {
            return Err(ApiError::bad_param("echo", "'echo' is not supported"));
        }
        TextInput::Prompt(prompt(&obj)?)
    };
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let max_tokens = max_tokens(&obj)?;
    Ok(TextRequest {
        model,
        input,
        stream: field::<bool>(&obj, "stream")?.unwrap_or(false),
        include_usage,
        max_tokens,
        options: GenerateOptions {
            sampling: sampling(&obj)?,
            max_tokens: max_tokens.unwrap_or(usize::MAX),
            stop: stop_sequences(&obj)?,
        },
    })
}

pub fn parse_chat(body: &[u8]) -> Result<TextRequest, ApiError> {
    parse(body, true)
}

pub fn parse_completion(body: &[u8]) -> Result<TextRequest, ApiError> {
    parse(body, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        parse_chat(body.as_bytes()).err().expect("refused")
    }

    #[test]
    fn parses_openai_fields() {
        let r = parse_chat(
            br#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}],
                "temperature":0,"top_p":0.5,"max_tokens":7,"stop":"\n","seed":-1,"stream":true,
                "stream_options":{"include_usage":true},"n":1,"user":"ignored"}"#,
        )
        .ok()
        .unwrap();
        let TextInput::Chat(m) = &r.input else {
            panic!()
        };
        assert_eq!(
            (m[0].role.as_str(), m[1].content.as_str()),
            ("system", "hi\nthere")
        );
        assert_eq!(r.options.sampling.temperature, 0.0);
        assert_eq!(r.options.sampling.top_p, 0.5);
        assert_eq!(r.options.sampling.seed, u64::MAX);
        assert_eq!((r.max_tokens, r.options.max_tokens), (Some(7), 7));
        assert_eq!(r.options.stop, vec!["\n".to_string()]);
        assert!(r.stream && r.include_usage);
        let c = parse_completion(br#"{"model":"m","prompt":["once"],"stop":["a","b"]}"#)
            .ok()
            .unwrap();
        assert!(matches!(c.input, TextInput::Prompt(ref p) if p == "once"));
        assert_eq!(c.options.sampling.temperature, 1.0);
        assert_eq!(c.max_tokens, None);
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(err("{nope").status, 400);
        assert_eq!(err("[1]").status, 400);
        assert_eq!(err(r#"{"messages":[]}"#).param.as_deref(), Some("model"));
        assert_eq!(
            err(r#"{"model":"m","messages":[]}"#).param.as_deref(),
            Some("messages")
        );
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        for (extra, param) in [
            (r#""temperature":3"#, "temperature"),
            (r#""temperature":"hot""#, "temperature"),
            (r#""max_tokens":0"#, "max_tokens"),
            (r#""stop":[""]"#, "stop"),
            (r#""stop":["a","b","c","d","e"]"#, "stop"),
            (r#""n":2"#, "n"),
            (r#""tools":[{"type":"function"}]"#, "tools"),
            (r#""seed":1.5"#, "seed"),
        ] {
            let e = err(&format!("{{{m},{extra}}}"));
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{extra}: {e:?}"
            );
        }
        let e = err(r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#);
        assert_eq!(e.param.as_deref(), Some("messages.[0].role"));
        let e =
            err(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#);
        assert_eq!(e.param.as_deref(), Some("messages.[0].content"));
    }
}
