//! Just enough HTTP/1.1 for the API, on a plain `TcpStream`: one request per connection (every
//! response says `Connection: close`), request bodies with a Content-Length up to a limit, JSON
//! responses, and server-sent events in chunked transfer encoding. Owning this layer keeps control of
//! what matters for a local inference server: socket timeouts, size limits, and noticing a client
//! that went away so its generation can be cancelled.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use serde_json::Value;

use super::api_error::ApiError;

/// The request line and headers may take this much; more is refused (431).
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header of this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub enum ReadError {
    /// The client closed the connection or timed out before a whole request arrived: nobody to answer.
    Gone,
    /// A request that is answered with this error. `unread_body`: the client may still be sending.
    Refused { error: ApiError, unread_body: bool },
}

fn refused(error: ApiError, unread_body: bool) -> ReadError {
    ReadError::Refused { error, unread_body }
}

/// Reads one request. Socket timeouts (set by the caller) bound how long a slow client can take.
pub fn read_request(stream: &mut TcpStream, max_body: usize) -> Result<Request, ReadError> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(ReadError::Gone),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(ReadError::Gone),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let request = Request {
                    method: parsed.method.unwrap_or_default().to_string(),
                    path: parsed
                        .path
                        .unwrap_or("/")
                        .split('?')
                        .next()
                        .unwrap_or("/")
                        .to_string(),
                    headers: parsed
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect(),
                    body: buf[head_len..].to_vec(),
                };
                return read_body(stream, request, max_body);
            }
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
                return Err(refused(
                    ApiError::http(431, "The request headers are too large"),
                    true,
                ));
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Err(refused(
                    ApiError::http(431, "The request has too many headers"),
                    true,
                ));
            }
            Err(e) => {
                return Err(refused(
                    ApiError::http(400, format!("Malformed HTTP request: {e}")),
                    true,
                ));
            }
        }
    }
}

fn read_body(
    stream: &mut TcpStream,
    mut request: Request,
    max_body: usize,
) -> Result<Request, ReadError> {
    if request.header("transfer-encoding").is_some() {
        return Err(refused(
            ApiError::http(
                411,
                "Send the request body with a Content-Length header (chunked request bodies are not supported)",
            ),
            true,
        ));
    }
    let length = match request.header("content-length") {
        None => 0,
        Some(v) => v.trim().parse::<usize>().map_err(|_| {
            refused(
                ApiError::http(400, format!("Content-Length '{v}' is not a number")),
                true,
            )
        })?,
    };
    if length > max_body {
        return Err(refused(ApiError::too_large(max_body), true));
    }
    if request
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        && request.body.len() < length
    {
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| ReadError::Gone)?;
    }
    if request.body.len() > length {
        // Bytes after the body would be a second, pipelined request; one request per connection.
        request.body.truncate(length);
    }
    let have = request.body.len();
    request.body.resize(length, 0);
    stream
        .read_exact(&mut request.body[have..])
        .map_err(|_| ReadError::Gone)?;
    Ok(request)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "",
    }
}

pub fn write_json(mut stream: &TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    if status == 401 {
        out.push_str("WWW-Authenticate: Bearer\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

pub fn write_error(stream: &TcpStream, error: &ApiError) -> std::io::Result<()> {
    write_json(stream, error.status, &error.to_json())
}

/// A `text/event-stream` response: each event is one chunk, written straight to the socket.
pub struct EventStream<'a> {
    stream: &'a TcpStream,
}

impl<'a> EventStream<'a> {
    pub fn start(mut stream: &'a TcpStream) -> std::io::Result<EventStream<'a>> {
        stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        )?;
        stream.flush()?;
        Ok(EventStream { stream })
    }

    /// Sends `data: {data}` as one event.
    pub fn send(&mut self, data: &str) -> std::io::Result<()> {
        let event = format!("data: {data}\n\n");
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        let mut s = self.stream;
        s.write_all(chunk.as_bytes())?;
        s.flush()
    }

    /// The chunked encoding's last chunk.
    pub fn finish(self) -> std::io::Result<()> {
        let mut s = self.stream;
        s.write_all(b"0\r\n\r\n")?;
        s.flush()
    }
}

/// True when the client closed its side or the connection broke. Polled between tokens: a client
/// that hangs up mid-generation cancels it without waiting for a write to fail.
pub fn client_gone(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let gone = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    };
    let restored = stream.set_nonblocking(false).is_ok();
    gone || !restored
}

/// After answering a request whose body was not read (413 and the like): stop sending, then read and
/// discard what the client still sends for a moment, so closing does not reset the connection before
/// the client has read the answer.
pub fn close_after_unread_body(mut stream: &TcpStream, max_discard: usize) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 8192];
    let mut discarded = 0;
    while discarded < max_discard {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => discarded += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair over loopback: (client, server).
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (c, s)
    }

    fn status(r: Result<Request, ReadError>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(ReadError::Gone) => 0,
            Err(ReadError::Refused { error, .. }) => error.status,
        }
    }

    #[test]
    fn reads_a_request_sent_in_pieces() {
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || {
            c.write_all(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Le")
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b"ngth: 7\r\nAuthorization: Bearer k\r\n\r\n{\"a\"")
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b":1}").unwrap();
            c
        });
        let r = read_request(&mut s, 100).ok().unwrap();
        t.join().unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/x"));
        assert_eq!(r.header("AUTHORIZATION"), Some("Bearer k"));
        assert_eq!(r.body, b"{\"a\":1}");
    }

    #[test]
    fn refuses_large_bodies_chunked_bodies_and_garbage() {
        let (mut c, mut s) = pair();
        c.write_all(b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
            .unwrap();
        assert_eq!(status(read_request(&mut s, 100)), 413);
        let (mut c, mut s) = pair();
        c.write_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap();
        assert_eq!(status(read_request(&mut s, 100)), 411);
        let (mut c, mut s) = pair();
        c.write_all(b"\x00\x01 not http\r\n\r\n").unwrap();
        assert_eq!(status(read_request(&mut s, 100)), 400);
        let (mut c, mut s) = pair();
        c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        c.write_all(&vec![b'x'; MAX_HEAD_BYTES + 10]).unwrap();
        assert_eq!(status(read_request(&mut s, 100)), 431);
        let (c, mut s) = pair();
        drop(c);
        assert_eq!(status(read_request(&mut s, 100)), 0);
    }

    #[test]
    fn notices_a_client_that_hung_up() {
        let (c, s) = pair();
        assert!(!client_gone(&s));
        drop(c);
        std::thread::sleep(Duration::from_millis(20));
        assert!(client_gone(&s));
    }
}
