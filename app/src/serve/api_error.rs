//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! clients expect (the official SDKs pick their exception class from the status).

use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error` or `server_error`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request_error", message)
    }

    /// A bad value of one request field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::bad_request(message).with_param(param)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            401,
            "authentication_error",
            "Incorrect API key provided: send it as 'Authorization: Bearer KEY'",
        )
        .with_code("invalid_api_key")
    }

    pub fn unknown_route(method: &str, path: &str) -> ApiError {
        ApiError::new(
            404,
            "invalid_request_error",
            format!("Unknown request URL: {method} {path}"),
        )
        .with_code("unknown_url")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            405,
            "invalid_request_error",
            format!("{path} does not accept {method}"),
        )
        .with_code("method_not_allowed")
    }

    pub fn unknown_model(id: &str, available: &[&str]) -> ApiError {
        ApiError::bad_param(
            "model",
            format!(
                "The model '{id}' does not exist on this server; available: {}",
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ),
        )
        .with_code("model_not_found")
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            413,
            "invalid_request_error",
            format!("The request body is larger than this server's limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    /// The engine failed (a model that does not load, out of GPU memory, a device error).
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "server_error", message)
    }

    /// A malformed HTTP request (not a malformed API request).
    pub fn http(status: u16, message: impl Into<String>) -> ApiError {
        ApiError::new(status, "invalid_request_error", message)
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_openais_shape() {
        let e = ApiError::unknown_model("gpt-9", &["tiny"]).to_json();
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["param"], "model");
        assert_eq!(e["error"]["code"], "model_not_found");
        assert!(e["error"]["message"].as_str().unwrap().contains("tiny"));
        let s = ApiError::server("boom").to_json();
        assert_eq!(s["error"]["param"], Value::Null);
        assert_eq!(s["error"]["code"], Value::Null);
    }
}
