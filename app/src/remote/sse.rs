//! Server-sent events as OpenAI-compatible servers stream them: `data: {json}` lines, events separated
//! by a blank line, `: comment` keep-alives, and `data: [DONE]` at the end (the caller's business).

use std::io::{self, BufRead};

/// The longest line accepted: a misbehaving server cannot make the client buffer without bound.
const MAX_LINE: usize = 8 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server names its events.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

pub struct SseReader<R> {
    inner: R,
    line: Vec<u8>,
}

impl<R: BufRead> SseReader<R> {
    pub fn new(inner: R) -> SseReader<R> {
        SseReader {
            inner,
            line: Vec::new(),
        }
    }

    /// The next event with data; `Ok(None)` when the stream ends. An event cut off inside a line is
    /// dropped; one whose last line is complete is still delivered at the end of the stream.
    pub fn next_event(&mut self) -> io::Result<Option<SseEvent>> {
        let mut event: Option<String> = None;
        let mut data: Option<String> = None;
        loop {
            self.line.clear();
            let n = io::Read::take(&mut self.inner, MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut self.line)?;
            if n == 0 {
                return Ok(data.map(|data| SseEvent { event, data }));
            }
            let terminated = self.line.last() == Some(&b'\n');
            if !terminated {
                if self.line.len() > MAX_LINE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a server-sent event line longer than 8 MiB",
                    ));
                }
                // The stream ended inside this line.
                return Ok(data.map(|data| SseEvent { event, data }));
            }
            let text = String::from_utf8_lossy(&self.line);
            let line = text.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                match data.take() {
                    Some(data) => return Ok(Some(SseEvent { event, data })),
                    None => {
                        event = None; // an event without data is ignored
                        continue;
                    }
                }
            }
            if line.starts_with(':') {
                continue; // a comment (keep-alive)
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "event" => event = Some(value.to_string()),
                _ => {} // id, retry and unknown fields do not matter here
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &str) -> Vec<SseEvent> {
        let mut r = SseReader::new(stream.as_bytes());
        let mut out = Vec::new();
        while let Some(e) = r.next_event().unwrap() {
            out.push(e);
        }
        out
    }

    fn data(d: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: d.into(),
        }
    }

    #[test]
    fn data_lines_comments_and_crlf() {
        let got = events(
            ": ping\n\ndata: {\"a\":1}\n\ndata:{\"b\":2}\r\n\r\nid: 7\nretry: 10\ndata: x\ndata: y\n\n\n\ndata: [DONE]\n\n",
        );
        assert_eq!(
            got,
            vec![
                data("{\"a\":1}"),
                data("{\"b\":2}"),
                data("x\ny"),
                data("[DONE]")
            ]
        );
    }

    #[test]
    fn named_events_and_the_end_of_the_stream() {
        let got = events("event: error\ndata: {\"error\":{}}\n\nevent: lonely\n\ndata: last\n");
        assert_eq!(
            got,
            vec![
                SseEvent {
                    event: Some("error".into()),
                    data: "{\"error\":{}}".into()
                },
                data("last")
            ]
        );
        // Cut inside a line: that event is lost, the earlier ones are not.
        assert_eq!(events("data: one\n\ndata: {\"cho"), vec![data("one")]);
        assert_eq!(events(""), vec![]);
    }
}
