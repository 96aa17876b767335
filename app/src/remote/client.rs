//! A client for OpenAI-compatible servers (vLLM, Ollama, llama.cpp's server, LM Studio, `drift serve`):
//! `GET /v1/models` and streamed `POST /v1/chat/completions` (or `/v1/completions` for a raw prompt).
//! Blocking (ureq), meant for worker threads; a streamed reply can be cancelled at any moment.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use drift_engine::tokenize::chat_template::Message;
use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::error::{ErrorKind, RemoteError, RequestContext};
use super::stream::{self, StreamedReply};

/// How long to wait. `idle` bounds every wait for the server (the response, then each chunk): a big
/// model on a busy server may take a while to start, so it is generous by default.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(300),
        }
    }
}

/// The sampling fields of the OpenAI API; `None` leaves the server's default.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sampling {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

/// What to complete: a conversation (the server applies its chat template) or raw text.
pub enum Prompt<'a> {
    Chat(&'a [Message]),
    Raw(&'a str),
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RemoteModel {
    pub id: String,
    #[serde(default)]
    pub owned_by: Option<String>,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<RemoteModel>,
}

#[derive(Clone)]
pub struct RemoteClient {
    endpoint: Endpoint,
    api_key: Option<String>,
    timeouts: Timeouts,
    agent: ureq::Agent,
}

impl RemoteClient {
    /// `url`: the server's base URL, with or without `/v1`. An empty key is no key.
    pub fn new(url: &str, api_key: Option<&str>) -> Result<RemoteClient, RemoteError> {
        RemoteClient::with_timeouts(url, api_key, Timeouts::default())
    }

    pub fn with_timeouts(
        url: &str,
        api_key: Option<&str>,
        timeouts: Timeouts,
    ) -> Result<RemoteClient, RemoteError> {
        let endpoint = Endpoint::parse(url)?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("drift/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(timeouts.connect))
            .timeout_per_read(Some(timeouts.idle))
            .build()
            .into();
        Ok(RemoteClient {
            endpoint,
            api_key: api_key
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_string),
            timeouts,
            agent,
        })
    }

    pub fn base(&self) -> &str {
        self.endpoint.base()
    }

    /// The server's models (`GET /v1/models`), in the server's order.
    pub fn list_models(&self) -> Result<Vec<RemoteModel>, RemoteError> {
        let url = self.endpoint.api("models");
        let mut req = self.agent.get(&url);
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let idle = self.timeouts.idle.as_secs();
        let mut resp = req
            .call()
            .map_err(|e| RemoteError::from_transport(e, self.base(), idle))?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .map_err(|e| RemoteError::mid_stream(&e.into_io(), self.base(), idle))?;
        if status != 200 {
            return Err(RemoteError::from_status(
                status,
                &body,
                &self.context(&url, None),
            ));
        }
        let list: ModelList = serde_json::from_str(&body).map_err(|e| {
            RemoteError::new(
                ErrorKind::Protocol,
                format!("{url} did not answer with a model list ({e})"),
            )
        })?;
        Ok(list.data)
    }

    /// Streams a completion of `prompt` by `model`, calling `on_text` with each piece of text as it
    /// arrives. Setting `cancel` stops reading at once and drops the connection (the result is then
    /// the text so far, marked cancelled). On an error the pieces already delivered are all there is.
    pub fn stream(
        &self,
        model: &str,
        prompt: Prompt<'_>,
        sampling: &Sampling,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<StreamedReply, RemoteError> {
        let (path, body) = request_body(model, prompt, sampling);
        let url = self.endpoint.api(path);
        let ctx = self.context(&url, Some(model));
        let request = stream::StreamRequest {
            agent: self.agent.clone(),
            url: url.clone(),
            api_key: self.api_key.clone(),
            body: body.to_string(),
            base: self.base().to_string(),
            model: model.to_string(),
            idle_secs: self.timeouts.idle.as_secs(),
        };
        stream::run(request, &ctx, cancel, on_text)
    }

    fn context<'a>(&'a self, url: &'a str, model: Option<&'a str>) -> RequestContext<'a> {
        RequestContext {
            base: self.base(),
            url,
            model,
            sent_key: self.api_key.is_some(),
        }
    }
}

/// The endpoint path and JSON body of a streamed request. `include_usage` asks for token counts in a
/// last chunk (servers that do not know it ignore it; the count of chunks is the fallback).
fn request_body(
    model: &str,
    prompt: Prompt<'_>,
    sampling: &Sampling,
) -> (&'static str, serde_json::Value) {
    let mut body = serde_json::to_value(sampling).expect("plain fields serialize");
    let obj = body.as_object_mut().expect("a struct is an object");
    obj.insert("model".into(), model.into());
    obj.insert("stream".into(), true.into());
    obj.insert(
        "stream_options".into(),
        serde_json::json!({"include_usage": true}),
    );
    let path = match prompt {
        Prompt::Chat(messages) => {
            obj.insert(
                "messages".into(),
                serde_json::to_value(messages).expect("messages serialize"),
            );
            "chat/completions"
        }
        Prompt::Raw(text) => {
            obj.insert("prompt".into(), text.into());
            "completions"
        }
    };
    (path, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies_have_the_openai_shape() {
        let msgs = [
            Message::new("system", "be brief"),
            Message::new("user", "hi"),
        ];
        let sampling = Sampling {
            temperature: Some(0.0),
            max_tokens: Some(7),
            seed: Some(3),
            ..Sampling::default()
        };
        let (path, body) = request_body("m1", Prompt::Chat(&msgs), &sampling);
        assert_eq!(path, "chat/completions");
        assert_eq!(
            body,
            serde_json::json!({
                "model": "m1",
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "temperature": 0.0,
                "max_tokens": 7,
                "seed": 3
            })
        );
        let stop = Sampling {
            stop: vec!["\n".into()],
            top_p: Some(0.5),
            ..Sampling::default()
        };
        let (path, body) = request_body("m2", Prompt::Raw("Once"), &stop);
        assert_eq!(path, "completions");
        assert_eq!(body["prompt"], "Once");
        assert_eq!(body["stop"], serde_json::json!(["\n"]));
        assert_eq!(body["top_p"], 0.5);
        assert!(body.get("temperature").is_none());
    }
}
