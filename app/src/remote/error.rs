//! What can go wrong talking to a remote server, each case worded so the user knows what to do.

use std::fmt;

/// Which kind of failure (tests and callers branch on it; the message is for people).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The URL itself is unusable.
    BadUrl,
    /// No connection: refused, unknown host, connect timeout.
    Unreachable,
    /// HTTP 401/403: a key is needed or was refused.
    Unauthorized,
    /// HTTP 404: no such model (or not an OpenAI-compatible API at that URL).
    NotFound,
    /// Another 4xx: the server did not accept the request.
    Rejected,
    /// HTTP 5xx, or an error object sent inside the stream.
    Server,
    /// The stream stopped before the reply was finished: the server went away.
    Interrupted,
    /// The server sent nothing for too long.
    Timeout,
    /// The server answered something that is not the OpenAI API's shape.
    Protocol,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteError {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteError {}

/// What a failed request was about, for the wording of its error.
pub struct RequestContext<'a> {
    /// The server's base URL as the user knows it.
    pub base: &'a str,
    pub url: &'a str,
    pub model: Option<&'a str>,
    pub sent_key: bool,
}

impl RemoteError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> RemoteError {
        RemoteError {
            kind,
            message: message.into(),
        }
    }

    pub fn bad_url(url: &str, why: &str) -> RemoteError {
        RemoteError::new(ErrorKind::BadUrl, format!("bad server URL {url:?}: {why}"))
    }

    /// A response with an error status; `body` is what the server sent with it.
    pub fn from_status(status: u16, body: &str, ctx: &RequestContext<'_>) -> RemoteError {
        let said = server_message(body);
        let suffix = said.as_deref().map_or(String::new(), |m| format!(": {m}"));
        let base = ctx.base;
        match status {
            401 | 403 if ctx.sent_key => RemoteError::new(
                ErrorKind::Unauthorized,
                format!("the server at {base} refused the API key (HTTP {status}){suffix}"),
            ),
            401 | 403 => RemoteError::new(
                ErrorKind::Unauthorized,
                format!(
                    "the server at {base} wants an API key (HTTP {status}){suffix}; give one with \
                     the request (--api-key, or the API key field)"
                ),
            ),
            // An OpenAI-shaped 404 is about the model; a bare one means the path is not an API.
            404 if said.is_some() && ctx.model.is_some() => RemoteError::new(
                ErrorKind::NotFound,
                format!(
                    "the server at {base} has no model {:?} (HTTP 404){suffix}",
                    ctx.model.unwrap_or_default()
                ),
            ),
            404 => RemoteError::new(
                ErrorKind::NotFound,
                format!(
                    "{} was not found (HTTP 404){suffix}: is {base} an OpenAI-compatible server?",
                    ctx.url
                ),
            ),
            500..=599 => RemoteError::new(
                ErrorKind::Server,
                format!(
                    "the server at {base} failed (HTTP {status}){}",
                    if suffix.is_empty() {
                        ", without saying why".to_string()
                    } else {
                        suffix
                    }
                ),
            ),
            _ => RemoteError::new(
                ErrorKind::Rejected,
                format!("the server at {base} rejected the request (HTTP {status}){suffix}"),
            ),
        }
    }

    /// A failure before any response arrived.
    pub fn from_transport(e: ureq::Error, base: &str, idle_secs: u64) -> RemoteError {
        use ureq::Timeout;
        match e {
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                RemoteError::new(
                    ErrorKind::Unreachable,
                    format!(
                        "could not connect to {base}: connection refused. Is the server running \
                         at {base}?"
                    ),
                )
            }
            ureq::Error::HostNotFound => RemoteError::new(
                ErrorKind::Unreachable,
                format!("could not find the host of {base} (name lookup failed)"),
            ),
            ureq::Error::Timeout(Timeout::Connect | Timeout::Resolve) => RemoteError::new(
                ErrorKind::Unreachable,
                format!("timed out connecting to {base}. Is the server running at {base}?"),
            ),
            ureq::Error::Timeout(_) => RemoteError::new(
                ErrorKind::Timeout,
                format!("the server at {base} did not answer within {idle_secs} s"),
            ),
            ureq::Error::ConnectionFailed | ureq::Error::Io(_) => RemoteError::new(
                ErrorKind::Unreachable,
                format!("could not reach {base}: {e}. Is the server running at {base}?"),
            ),
            other => RemoteError::new(
                ErrorKind::Unreachable,
                format!("could not reach {base}: {other}"),
            ),
        }
    }

    /// A read error after the response began: the connection dropped or went quiet.
    pub fn mid_stream(e: &std::io::Error, base: &str, idle_secs: u64) -> RemoteError {
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ) || e.to_string().to_lowercase().contains("timeout");
        if timed_out {
            RemoteError::new(
                ErrorKind::Timeout,
                format!(
                    "the server at {base} sent nothing for {idle_secs} s; gave up (the text so far \
                     is kept)"
                ),
            )
        } else {
            RemoteError::new(
                ErrorKind::Interrupted,
                format!(
                    "the connection to {base} broke before the reply was finished ({e}); the \
                     server may have stopped (the text so far is kept)"
                ),
            )
        }
    }

    /// The stream ended cleanly but without `data: [DONE]` or a finish reason.
    pub fn ended_early(base: &str) -> RemoteError {
        RemoteError::new(
            ErrorKind::Interrupted,
            format!(
                "the server at {base} closed the stream before the reply was finished (no [DONE]); \
                 it may have stopped or crashed (the text so far is kept)"
            ),
        )
    }
}

/// The human part of an error body: OpenAI's `{"error": {"message": …}}`, or the shapes other servers
/// use (`{"error": "…"}`, `{"detail": "…"}`, `{"message": "…"}`), else the start of the text.
pub fn server_message(body: &str) -> Option<String> {
    let body = body.trim();
    if body.is_empty() {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("message"));
        if let Some(m) = found {
            return Some(match m.as_str() {
                Some(s) => s.trim().to_string(),
                None => m.to_string(),
            });
        }
        // JSON, but not an error shape we know: show it as it is (short).
    } else if body.starts_with('<') {
        // An HTML error page says nothing useful in a terminal or a label.
        return None;
    }
    const MAX: usize = 300;
    let mut s: String = body.chars().take(MAX).collect();
    if body.chars().count() > MAX {
        s.push('…');
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(sent_key: bool) -> RequestContext<'static> {
        RequestContext {
            base: "http://h:1",
            url: "http://h:1/v1/chat/completions",
            model: Some("m"),
            sent_key,
        }
    }

    #[test]
    fn server_messages_in_the_shapes_servers_use() {
        let openai = r#"{"error": {"message": "The model `x` does not exist", "type": "invalid_request_error"}}"#;
        assert_eq!(
            server_message(openai).as_deref(),
            Some("The model `x` does not exist")
        );
        assert_eq!(
            server_message(r#"{"error": "model 'x' not found"}"#).as_deref(),
            Some("model 'x' not found")
        );
        assert_eq!(
            server_message(r#"{"detail": "Not Found"}"#).as_deref(),
            Some("Not Found")
        );
        assert_eq!(server_message("  ").as_deref(), None);
        assert_eq!(server_message("<html>404</html>").as_deref(), None);
        assert_eq!(
            server_message("plain words").as_deref(),
            Some("plain words")
        );
        assert_eq!(
            server_message(&"x".repeat(400)).unwrap().chars().count(),
            301
        );
    }

    #[test]
    fn statuses_become_advice() {
        let e = RemoteError::from_status(401, "", &ctx(false));
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        assert!(e.message.contains("wants an API key"), "{e}");
        let e = RemoteError::from_status(401, r#"{"error":{"message":"bad key"}}"#, &ctx(true));
        assert!(e.message.contains("refused the API key") && e.message.ends_with("bad key"));
        let e = RemoteError::from_status(404, r#"{"error":{"message":"no such"}}"#, &ctx(false));
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("has no model \"m\""), "{e}");
        let e = RemoteError::from_status(404, "<html></html>", &ctx(false));
        assert!(e.message.contains("OpenAI-compatible"), "{e}");
        let e = RemoteError::from_status(503, r#"{"error":{"message":"overloaded"}}"#, &ctx(false));
        assert_eq!(e.kind, ErrorKind::Server);
        assert!(e.message.ends_with("(HTTP 503): overloaded"), "{e}");
        let e = RemoteError::from_status(500, "", &ctx(false));
        assert!(e.message.contains("without saying why"), "{e}");
        let e = RemoteError::from_status(400, r#"{"detail":"bad temperature"}"#, &ctx(false));
        assert_eq!(e.kind, ErrorKind::Rejected);
        assert!(e.message.ends_with("bad temperature"), "{e}");
    }
}
