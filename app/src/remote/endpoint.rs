//! Where an OpenAI-compatible server lives. Users paste base URLs in every form servers document them
//! (`http://host:8000`, `http://host:8000/v1`, `localhost:11434/v1/`); all of them name the same API.

use super::error::RemoteError;

/// A server's base URL without the `/v1` suffix, e.g. `http://127.0.0.1:8080`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    base: String,
}

impl Endpoint {
    /// Accepts a URL with or without a trailing `/v1` (and slashes); a URL without a scheme is taken
    /// as `http://`.
    pub fn parse(url: &str) -> Result<Endpoint, RemoteError> {
        let url = url.trim();
        if url.is_empty() {
            return Err(RemoteError::bad_url(url, "the server URL is empty"));
        }
        let with_scheme = match url.split_once("://") {
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") => url.to_string(),
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => url.to_string(),
            Some((scheme, _)) => {
                return Err(RemoteError::bad_url(
                    url,
                    &format!("{scheme}:// is not supported (use http:// or https://)"),
                ));
            }
            None => format!("http://{url}"),
        };
        let mut base = with_scheme.trim_end_matches('/');
        if let Some(stripped) = base.strip_suffix("/v1") {
            base = stripped.trim_end_matches('/');
        }
        let host = base.split_once("://").map_or("", |(_, rest)| rest);
        if host.is_empty() || host.starts_with('/') {
            return Err(RemoteError::bad_url(url, "the URL has no host"));
        }
        if base.contains(['?', '#']) || base.chars().any(char::is_whitespace) {
            return Err(RemoteError::bad_url(
                url,
                "a base URL has no query, fragment or spaces",
            ));
        }
        Ok(Endpoint {
            base: base.to_string(),
        })
    }

    /// The base URL as shown to the user (no `/v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `path` under `/v1`, e.g. `api("models")` → `http://host:8080/v1/models`.
    pub fn api(&self, path: &str) -> String {
        format!("{}/v1/{}", self.base, path.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form_gives_the_same_api_urls() {
        for url in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080/v1/",
            "  http://127.0.0.1:8080/v1// ",
            "127.0.0.1:8080/v1",
        ] {
            let e = Endpoint::parse(url).unwrap();
            assert_eq!(e.base(), "http://127.0.0.1:8080", "{url}");
            assert_eq!(
                e.api("chat/completions"),
                "http://127.0.0.1:8080/v1/chat/completions"
            );
        }
        // A prefix path (a proxy, OpenRouter's /api) is kept.
        let e = Endpoint::parse("https://openrouter.ai/api/v1").unwrap();
        assert_eq!(e.api("models"), "https://openrouter.ai/api/v1/models");
        // Only a whole trailing `/v1` segment is dropped.
        let e = Endpoint::parse("http://h/serve/v10").unwrap();
        assert_eq!(e.api("models"), "http://h/serve/v10/v1/models");
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        for (url, why) in [
            ("", "empty"),
            ("ftp://host", "ftp:// is not supported"),
            ("http://", "no host"),
            ("http:///v1", "no host"),
            ("http://host/v1?x=1", "no query"),
        ] {
            let e = Endpoint::parse(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url:?}: {e}");
        }
    }
}
