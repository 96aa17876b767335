//! The OpenAI-compatible local server: `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions` and `POST /v1/images/generations` over HTTP/1.1, on the app's one GPU.
//! A fixed pool of threads accepts connections; every generation holds the `GpuQueue` for its length,
//! so server requests and the window's own chat and image jobs take turns on the device.
//! `drift serve` runs one; the window can start and stop one on its own `Gpu` (dropping stops it).

mod api_error;
mod http;
mod images;
mod openai;
mod registry;
mod text;
mod text_params;

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use drift_engine::Gpu;

use crate::gui::gpu_queue::GpuQueue;
use api_error::ApiError;
use http::{ReadError, Request};
use registry::ModelRegistry;
pub use registry::model_id;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port ([`Server::addr`] tells which).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set; required to listen beyond loopback.
    pub api_key: Option<String>,
    /// Chat models (Hugging Face folders or GGUF files); their ids are the file or folder names.
    pub models: Vec<PathBuf>,
    /// A Stable Diffusion 1.x model (diffusers folder or single-file checkpoint).
    pub image_model: Option<PathBuf>,
    /// KV cache length for chat models (default: the engine's).
    pub context: Option<usize>,
    /// Connections served at once (more wait in the listen backlog).
    pub threads: usize,
    pub max_body_bytes: usize,
    /// How long a socket may sit without progress: a request that does not arrive, or a stream the
    /// client stops reading. The connection is then closed and its generation cancelled.
    pub idle_timeout: Duration,
    /// One line per request on stderr.
    pub access_log: bool,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            models: Vec::new(),
            image_model: None,
            context: None,
            threads: 4,
            max_body_bytes: 1 << 20,
            idle_timeout: Duration::from_secs(60),
            access_log: false,
        }
    }
}

impl ServerConfig {
    /// The addresses to bind, after checking that a server reachable from other machines has a key.
    pub fn bind_addresses(&self) -> Result<Vec<SocketAddr>> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .with_context(|| format!("--host {}", self.host))?
            .collect();
        let keyed = self.api_key.as_deref().is_some_and(|k| !k.is_empty());
        if let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback())
            && !keyed
        {
            bail!(
                "refusing to listen on {} ({}): other machines could use it without a key; \
                 pass --api-key KEY (clients send 'Authorization: Bearer KEY') or keep the default --host 127.0.0.1",
                self.host,
                open.ip()
            );
        }
        if self.threads == 0 {
            bail!("--threads must be at least 1");
        }
        Ok(addrs)
    }

    /// Checks everything that needs no GPU: the address, the key, the model paths and ids.
    pub fn validate(&self) -> Result<()> {
        if self.models.is_empty() && self.image_model.is_none() {
            bail!("nothing to serve: pass --model PATH (chat) and/or --image-model PATH");
        }
        self.bind_addresses()?;
        ModelRegistry::new(&self.models, self.image_model.as_deref(), self.context)?;
        Ok(())
    }
}

/// What request handlers share.
struct Shared {
    gpu: Arc<Gpu>,
    queue: GpuQueue,
    registry: ModelRegistry,
    config: ServerConfig,
}

/// How a request ended, for the access log.
struct Served {
    status: u16,
    note: String,
}

impl Served {
    fn ok(note: String) -> Served {
        Served { status: 200, note }
    }

    /// The client went away (499, nginx's "client closed request").
    fn gone(when: &str) -> Served {
        Served {
            status: 499,
            note: format!("client disconnected: {when}"),
        }
    }
}

pub struct Server {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds and starts the worker threads; models load on their first request.
    pub fn start(config: ServerConfig, gpu: Arc<Gpu>, queue: GpuQueue) -> Result<Server> {
        let addrs = config.bind_addresses()?;
        let registry = ModelRegistry::new(
            &config.models,
            config.image_model.as_deref(),
            config.context,
        )?;
        let listener = TcpListener::bind(&addrs[..])
            .with_context(|| format!("could not listen on {}:{}", config.host, config.port))?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let threads = config.threads;
        let shared = Arc::new(Shared {
            gpu,
            queue,
            registry,
            config,
        });
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let listener = listener.try_clone()?;
            let shared = Arc::clone(&shared);
            let stopping = Arc::clone(&stopping);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("drift-serve-{i}"))
                    .spawn(move || accept_loop(&listener, &shared, &stopping))?,
            );
        }
        Ok(Server {
            addr,
            stopping,
            workers,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Each worker blocks in accept(): one connection per worker wakes it to see the flag.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let mut woken = true;
        for _ in &self.workers {
            woken &= TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        }
        if woken {
            for w in self.workers.drain(..) {
                let _ = w.join();
            }
        }
        // Otherwise the workers are left to end with the process rather than hang the caller.
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Shared, stopping: &AtomicBool) {
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => serve_connection(shared, stream),
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                log::warn!("drift serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_connection(shared: &Shared, mut stream: TcpStream) {
    let started = Instant::now();
    let idle = Some(shared.config.idle_timeout);
    if stream.set_read_timeout(idle).is_err() || stream.set_write_timeout(idle).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let request = match http::read_request(&mut stream, shared.config.max_body_bytes) {
        Ok(r) => r,
        Err(ReadError::Gone) => return,
        Err(ReadError::Refused { error, unread_body }) => {
            let _ = http::write_error(&stream, &error);
            if unread_body {
                http::close_after_unread_body(&stream, 4 * shared.config.max_body_bytes);
            }
            log_request(shared, "?", "?", error.status, &error.message, started);
            return;
        }
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        route(shared, &request, &stream)
    }))
    .unwrap_or_else(|_| {
        Err(ApiError::server(
            "internal error: the request handler panicked",
        ))
    });
    let (status, note) = match outcome {
        Ok(served) => (served.status, served.note),
        Err(error) => {
            let _ = http::write_error(&stream, &error);
            (error.status, error.message)
        }
    };
    log_request(
        shared,
        &request.method,
        &request.path,
        status,
        &note,
        started,
    );
}

fn log_request(
    shared: &Shared,
    method: &str,
    path: &str,
    status: u16,
    note: &str,
    started: Instant,
) {
    if shared.config.access_log {
        let secs = started.elapsed().as_secs_f64();
        let sep = if note.is_empty() { "" } else { " " };
        eprintln!("{method} {path} {status} {secs:.2}s{sep}{note}");
    }
}

/// Compares without an early exit, so response timing does not reveal how much of a key was right.
fn same_key(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn authorized(shared: &Shared, request: &Request) -> bool {
    let Some(key) = shared.config.api_key.as_deref().filter(|k| !k.is_empty()) else {
        return true;
    };
    request
        .header("authorization")
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .is_some_and(|given| same_key(given.trim().as_bytes(), key.as_bytes()))
}

fn route(shared: &Shared, request: &Request, stream: &TcpStream) -> Result<Served, ApiError> {
    if !authorized(shared, request) {
        return Err(ApiError::unauthorized());
    }
    let path = request.path.trim_end_matches('/');
    let method = request.method.as_str();
    let expect = |wanted: &str| {
        if method == wanted {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(method, path))
        }
    };
    match path {
        "/v1/models" => {
            expect("GET")?;
            let _ = http::write_json(stream, 200, &shared.registry.list_json());
            Ok(Served::ok(String::new()))
        }
        "/v1/chat/completions" => {
            expect("POST")?;
            text::chat_completions(shared, request, stream)
        }
        "/v1/completions" => {
            expect("POST")?;
            text::completions(shared, request, stream)
        }
        "/v1/images/generations" => {
            expect("POST")?;
            images::generations(shared, request, stream)
        }
        _ => match path.strip_prefix("/v1/models/") {
            Some(id) => {
                expect("GET")?;
                let model = shared.registry.model_json(id).ok_or_else(|| {
                    ApiError::http(
                        404,
                        format!("The model '{id}' does not exist on this server"),
                    )
                    .with_code("model_not_found")
                })?;
                let _ = http::write_json(stream, 200, &model);
                Ok(Served::ok(String::new()))
            }
            None => Err(ApiError::unknown_route(method, &request.path)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_machines_need_a_key() {
        let config = |host: &str, key: Option<&str>| ServerConfig {
            host: host.into(),
            port: 0,
            api_key: key.map(str::to_string),
            ..ServerConfig::default()
        };
        assert!(config("127.0.0.1", None).bind_addresses().is_ok());
        assert!(config("::1", None).bind_addresses().is_ok());
        let e = config("0.0.0.0", None)
            .bind_addresses()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--api-key"), "{e}");
        assert!(config("0.0.0.0", Some("")).bind_addresses().is_err());
        assert!(config("0.0.0.0", Some("k")).bind_addresses().is_ok());
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secreT", b"secret"));
        assert!(!same_key(b"secret!", b"secret"));
        assert!(!same_key(b"", b"secret"));
    }
}
