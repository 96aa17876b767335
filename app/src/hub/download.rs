//! Resumable, sha256-verified file downloads (Hugging Face layout, but any HTTP(S) URL works).
//!
//! Bytes stream into `<dest>.part`; a small JSON sidecar `<dest>.part.json` records the URL, the
//! expected hash/size, the bytes written and the server's ETag. A later call (same process after a
//! dropped connection, or a new process after a crash) resumes with `Range: bytes=N-`, re-hashing
//! the existing part first so the final sha256 covers the whole file. A server that ignores Range
//! (replies 200) or whose ETag changed restarts cleanly from 0. Only a file whose size and sha256
//! match is renamed (atomically, same directory) onto `dest`; a hash mismatch deletes the part.
//!
//! This file only uses std and external crates so that the integration test can include it with
//! `#[path]` (the app is a binary crate).

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The public hub; `HF_ENDPOINT` overrides it (mirrors, tests).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Read/write chunk size while streaming.
const CHUNK: usize = 256 * 1024;
/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Free space kept beyond the file itself (the filesystem needs some room too).
const SPACE_MARGIN: u64 = 16 * 1024 * 1024;

/// `HF_ENDPOINT` or the public hub, without a trailing slash.
pub fn hf_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
        .trim_end_matches('/')
        .to_string()
}

/// The token to send: the explicit one (settings) if any, else `HF_TOKEN`.
pub fn hf_token(explicit: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(|| std::env::var("HF_TOKEN").ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// `{endpoint}/{repo}/resolve/{revision}/{file}` (the hub redirects this to its CDN).
pub fn hf_url(endpoint: &str, repo: &str, revision: &str, file: &str) -> String {
    format!(
        "{}/{}/resolve/{}/{}",
        endpoint.trim_end_matches('/'),
        repo.trim_matches('/'),
        revision,
        file.trim_start_matches('/')
    )
}

/// What the finished file must be. `sha256` is lowercase or uppercase hex.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    pub sha256: Option<String>,
    pub size: Option<u64>,
}

/// A progress report, sent at most every ~100 ms and once at the end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Bytes of the file on disk so far (including bytes from an earlier, resumed run).
    pub done: u64,
    /// Total size when known (expected size or the server's Content-Length/Content-Range).
    pub total: Option<u64>,
    /// Bytes per second received in this call.
    pub rate: f64,
    /// Estimated time left, when the total and a rate are known.
    pub eta: Option<Duration>,
}

/// How to download.
pub struct DownloadOptions<'a> {
    /// Bearer token; `None` falls back to `HF_TOKEN` (see [`hf_token`]).
    pub token: Option<String>,
    /// Attempts after a failure (dropped connection, timeout, 5xx, 429). The count restarts
    /// whenever an attempt made progress, so a long download on a flaky link still finishes.
    pub retries: u32,
    /// First wait between attempts; doubled after each failure without progress, capped at 30 s.
    pub backoff: Duration,
    /// Set to true to stop; the part and sidecar are kept so a later call resumes.
    pub cancel: Option<Arc<AtomicBool>>,
    pub progress: Option<&'a dyn Fn(Progress)>,
    /// No byte received for this long counts as a dropped connection.
    pub read_timeout: Duration,
    /// Test hook: writes to the part fail with "no space left" once it would exceed this size.
    #[doc(hidden)]
    pub fail_writes_after: Option<u64>,
}

impl Default for DownloadOptions<'_> {
    fn default() -> Self {
        Self {
            token: None,
            retries: 5,
            backoff: Duration::from_millis(500),
            cancel: None,
            progress: None,
            read_timeout: Duration::from_secs(30),
            fail_writes_after: None,
        }
    }
}

/// What a successful call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadOutcome {
    pub path: PathBuf,
    pub size: u64,
    /// Lowercase hex sha256 of the file.
    pub sha256: String,
    /// True when `dest` already held the verified file and nothing was fetched.
    pub already_present: bool,
    /// Bytes of an existing `.part` that were kept when this call started.
    pub resumed_from: u64,
    /// Body bytes received over the network by this call (all attempts).
    pub bytes_fetched: u64,
    /// HTTP requests made (all attempts, not counting redirects).
    pub requests: u32,
    /// Times the part was discarded and the download restarted from 0 (Range ignored,
    /// ETag changed).
    pub restarts: u32,
    /// True when the file's sha256 was checked against an expected one (not only computed).
    pub verified: bool,
}

/// Why a download failed. Messages are meant for the user.
#[derive(Debug)]
pub enum DownloadError {
    /// 401/403: a gated or private repo.
    Unauthorized {
        status: u16,
        url: String,
        had_token: bool,
    },
    NotFound {
        url: String,
    },
    /// Another HTTP status that retrying will not fix (or 5xx after all retries).
    Http {
        status: u16,
        url: String,
    },
    /// Connection problems that outlasted the retries; the part is kept for a later resume.
    Network {
        url: String,
        attempts: u32,
        last: String,
    },
    /// The finished file's sha256 differs; the part was deleted.
    HashMismatch {
        expected: String,
        actual: String,
    },
    /// The server's size or the finished size differs from the expected one; the part was deleted.
    SizeMismatch {
        expected: u64,
        actual: u64,
    },
    /// Not enough free space (checked before starting, or a write failed with ENOSPC).
    DiskFull {
        needed: Option<u64>,
        available: Option<u64>,
        path: PathBuf,
    },
    Cancelled,
    Io {
        context: String,
        source: io::Error,
    },
    BadExpectation(String),
}

impl fmt::Display for DownloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unauthorized {
                status,
                url,
                had_token,
            } => {
                write!(
                    f,
                    "access denied (HTTP {status}) for {url}: \
                     gated model: needs a Hugging Face token"
                )?;
                if *had_token {
                    write!(
                        f,
                        " (the token given was refused: accept the model's license on its \
                         Hugging Face page, \
                         and check the token's permissions)"
                    )
                } else {
                    write!(f, " (set HF_TOKEN or add one in the settings)")
                }
            }
            Self::NotFound { url } => {
                write!(
                    f,
                    "not found (HTTP 404): {url} (check the repo id, revision and file name)"
                )
            }
            Self::Http { status, url } => write!(f, "HTTP {status} from {url}"),
            Self::Network {
                url,
                attempts,
                last,
            } => write!(
                f,
                "download of {url} failed after {attempts} attempts ({last}); \
                 the partial file is kept and the next try resumes it"
            ),
            Self::HashMismatch { expected, actual } => write!(
                f,
                "sha256 mismatch: expected {expected}, got {actual}; \
                 the corrupted partial file was deleted"
            ),
            Self::SizeMismatch { expected, actual } => write!(
                f,
                "size mismatch: expected {expected} bytes, got {actual}; \
                 the partial file was deleted"
            ),
            Self::DiskFull {
                needed,
                available,
                path,
            } => {
                write!(f, "disk full: not enough free space for {}", path.display())?;
                if let (Some(n), Some(a)) = (needed, available) {
                    write!(f, " (needs {n} bytes, {a} available)")?;
                }
                Ok(())
            }
            Self::Cancelled => write!(
                f,
                "download cancelled (the partial file is kept for resuming)"
            ),
            Self::Io { context, source } => write!(f, "{context}: {source}"),
            Self::BadExpectation(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for DownloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, DownloadError>;

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> DownloadError {
    let context = context.into();
    move |source| DownloadError::Io { context, source }
}

/// The sidecar next to the part. `bytes` is informational (the part's length is the truth: bytes
/// are only ever appended, so whatever reached the disk is a valid prefix).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartState {
    pub url: String,
    pub sha256: Option<String>,
    pub size: Option<u64>,
    pub bytes: u64,
    pub etag: Option<String>,
}

/// `<dest>.part`
pub fn part_path(dest: &Path) -> PathBuf {
    with_suffix(dest, ".part")
}

/// `<dest>.part.json`
pub fn sidecar_path(dest: &Path) -> PathBuf {
    with_suffix(dest, ".part.json")
}

fn with_suffix(dest: &Path, suffix: &str) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Free bytes available to this user on the filesystem holding `dir` (None where unknown).
pub fn free_space(dir: &Path) -> Option<u64> {
    sys::free_space(dir)
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::ffi::CString;
    use std::os::raw::{c_char, c_int};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    unsafe extern "C" {
        // `buf` points at a `struct statvfs`; on 64-bit Linux (glibc and musl) it starts with
        // unsigned long f_bsize, f_frsize, then 64-bit f_blocks, f_bfree, f_bavail, ...
        fn statvfs(path: *const c_char, buf: *mut u64) -> c_int;
    }

    pub fn free_space(dir: &Path) -> Option<u64> {
        let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
        // The real struct is 112 bytes; 32 words leave ample room.
        let mut buf = [0u64; 32];
        // SAFETY: `c` is NUL-terminated, `buf` is larger than struct statvfs and suitably aligned.
        let rc = unsafe { statvfs(c.as_ptr(), buf.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        let (frsize, bavail) = (buf[1], buf[4]);
        Some(frsize.saturating_mul(bavail))
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod sys {
    use std::path::Path;
    pub fn free_space(_dir: &Path) -> Option<u64> {
        None
    }
}

fn check_space(dest: &Path, needed: u64) -> Result<()> {
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Some(available) = free_space(dir)
        && available < needed.saturating_add(SPACE_MARGIN)
    {
        return Err(DownloadError::DiskFull {
            needed: Some(needed),
            available: Some(available),
            path: dest.to_path_buf(),
        });
    }
    Ok(())
}

fn sha256_of_file(path: &Path, limit: Option<u64>) -> io::Result<(Sha256, u64)> {
    let f = File::open(path)?;
    let mut r = f.take(limit.unwrap_or(u64::MAX));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((h, n))
}

fn normalize_sha(s: &str) -> Result<String> {
    let s = s.trim().to_ascii_lowercase();
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(DownloadError::BadExpectation(format!(
            "expected sha256 is not 64 hex digits: {s:?}"
        )));
    }
    Ok(s)
}

/// Tracks rate/ETA and throttles progress callbacks.
struct Meter<'a> {
    cb: Option<&'a dyn Fn(Progress)>,
    start: Instant,
    start_done: u64,
    last: Option<Instant>,
}

impl Meter<'_> {
    fn report(&mut self, done: u64, total: Option<u64>, force: bool) {
        let Some(cb) = self.cb else { return };
        let now = Instant::now();
        if !force
            && self
                .last
                .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let secs = (now - self.start).as_secs_f64();
        let rate = if secs > 0.0 {
            done.saturating_sub(self.start_done) as f64 / secs
        } else {
            0.0
        };
        let eta = match total {
            Some(t) if rate > 0.0 => Some(Duration::from_secs_f64(
                t.saturating_sub(done) as f64 / rate,
            )),
            Some(t) if t <= done => Some(Duration::ZERO),
            _ => None,
        };
        cb(Progress {
            done,
            total,
            rate,
            eta,
        });
    }
}

/// What one HTTP attempt ended with.
enum Attempt {
    /// The body was read to the end (the part may still be short if the server lied).
    Complete,
    /// Retry (after backoff): dropped connection, timeout, 5xx, short body.
    Retry(String),
    /// Start again from byte 0 without waiting (Range ignored with nothing usable, ETag changed).
    Restart,
}

/// The running state of one download.
struct Job<'a, 'b> {
    url: &'a str,
    dest: &'a Path,
    part: PathBuf,
    sidecar: PathBuf,
    expected_sha: Option<String>,
    expected: &'a Expected,
    opts: &'a DownloadOptions<'b>,
    token: Option<String>,
    agent: ureq::Agent,
    file: File,
    hasher: Sha256,
    done: u64,
    total: Option<u64>,
    etag: Option<String>,
    fetched: u64,
    requests: u32,
    restarts: u32,
    meter: Meter<'b>,
}

/// Downloads `url` to `dest`, resuming a `.part` left by an earlier call, verifying size and
/// sha256 when given, retrying transient failures. See the module docs.
pub fn download_file(
    url: &str,
    dest: &Path,
    expected: Expected,
    opts: DownloadOptions<'_>,
) -> Result<DownloadOutcome> {
    let expected_sha = expected.sha256.as_deref().map(normalize_sha).transpose()?;

    // Already there and verified: nothing to do.
    if dest.is_file()
        && (expected_sha.is_some() || expected.size.is_some())
        && let Ok((h, n)) = sha256_of_file(dest, None)
    {
        let sha = hex::encode(h.finalize());
        if expected.size.is_none_or(|s| s == n) && expected_sha.as_ref().is_none_or(|e| *e == sha) {
            return Ok(DownloadOutcome {
                path: dest.to_path_buf(),
                size: n,
                sha256: sha,
                already_present: true,
                resumed_from: 0,
                bytes_fetched: 0,
                requests: 0,
                restarts: 0,
                verified: expected_sha.is_some(),
            });
        }
    }
    if let Some(dir) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    }

    let part = part_path(dest);
    let sidecar = sidecar_path(dest);

    // Keep an existing part only if its sidecar describes this same download.
    let state: Option<PartState> = fs::read(&sidecar)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|s: &PartState| {
            s.url == url
                && s.sha256.as_deref().map(str::to_ascii_lowercase) == expected_sha
                && s.size == expected.size
        });
    let keep = state.is_some() && part.is_file();
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(!keep)
        .open(&part)
        .map_err(io_err(format!("opening {}", part.display())))?;

    // Re-hash what is already there so the final hash covers the whole file.
    let (hasher, done) = if keep {
        let (h, n) =
            sha256_of_file(&part, None).map_err(io_err(format!("reading {}", part.display())))?;
        if expected.size.is_some_and(|s| n > s) {
            file.set_len(0).map_err(io_err("truncating the part"))?;
            (Sha256::new(), 0)
        } else {
            (h, n)
        }
    } else {
        (Sha256::new(), 0)
    };
    file.seek(SeekFrom::Start(done))
        .map_err(io_err("seeking the part"))?;

    if let Some(size) = expected.size {
        check_space(dest, size - done)?;
    }

    let token = hf_token(opts.token.as_deref());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(10)
        // Same-host redirects (renamed repos) still need the token; the CDN URLs are signed.
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        // Byte offsets must be those of the stored file, never of a compressed stream.
        .accept_encoding("identity")
        .timeout_connect(Some(Duration::from_secs(20)))
        .timeout_recv_response(Some(opts.read_timeout))
        .timeout_recv_body(None)
        .timeout_per_read(Some(opts.read_timeout))
        .build()
        .into();

    let job = Job {
        url,
        dest,
        part,
        sidecar,
        expected_sha,
        expected: &expected,
        opts: &opts,
        token,
        agent,
        file,
        hasher,
        done,
        total: expected.size,
        etag: state.and_then(|s| s.etag),
        fetched: 0,
        requests: 0,
        restarts: 0,
        meter: Meter {
            cb: opts.progress,
            start: Instant::now(),
            start_done: done,
            last: None,
        },
    };
    job.save_state()?;
    job.run(done)
}

impl Job<'_, '_> {
    fn cancelled(&self) -> bool {
        self.opts
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn save_state(&self) -> Result<()> {
        let s = PartState {
            url: self.url.to_string(),
            sha256: self.expected_sha.clone(),
            size: self.expected.size,
            bytes: self.done,
            etag: self.etag.clone(),
        };
        // Write-then-rename so a crash never leaves a half-written sidecar.
        let tmp = with_suffix(&self.sidecar, ".tmp");
        let json = serde_json::to_vec_pretty(&s).expect("PartState serialises");
        fs::write(&tmp, json)
            .and_then(|_| fs::rename(&tmp, &self.sidecar))
            .map_err(io_err(format!("writing {}", self.sidecar.display())))
    }

    fn remove_part(&self) {
        let _ = fs::remove_file(&self.part);
        let _ = fs::remove_file(&self.sidecar);
    }

    fn restart_from_zero(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .map_err(io_err("truncating the part"))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(io_err("seeking the part"))?;
        self.hasher = Sha256::new();
        self.done = 0;
        self.restarts += 1;
        self.meter.start_done = 0;
        Ok(())
    }

    fn run(mut self, resumed_from: u64) -> Result<DownloadOutcome> {
        let mut failures = 0u32;
        loop {
            if self.cancelled() {
                self.save_state()?;
                return Err(DownloadError::Cancelled);
            }
            let before = self.done;
            let r = self.attempt();
            // Persist what we have whatever happened, so a new process can resume.
            let _ = self.file.flush();
            let last_err = match r {
                Err(e) => {
                    if matches!(
                        e,
                        DownloadError::HashMismatch { .. } | DownloadError::SizeMismatch { .. }
                    ) {
                        self.remove_part();
                    } else {
                        self.save_state()?;
                    }
                    return Err(e);
                }
                Ok(Attempt::Complete) => {
                    if self.total.is_none_or(|t| self.done >= t) {
                        return self.finish(resumed_from);
                    }
                    format!(
                        "body ended early at {} of {:?} bytes",
                        self.done, self.total
                    )
                }
                Ok(Attempt::Restart) => {
                    self.restart_from_zero()?;
                    self.save_state()?;
                    if self.restarts > self.opts.retries + 2 {
                        return Err(DownloadError::Network {
                            url: self.url.to_string(),
                            attempts: self.requests,
                            last: "the server keeps changing the file".into(),
                        });
                    }
                    continue;
                }
                Ok(Attempt::Retry(msg)) => msg,
            };
            self.save_state()?;
            if self.done > before {
                failures = 0;
            }
            failures += 1;
            if failures > self.opts.retries {
                return Err(DownloadError::Network {
                    url: self.url.to_string(),
                    attempts: self.requests,
                    last: last_err,
                });
            }
            let shift = (failures - 1).min(16);
            let wait = self
                .opts
                .backoff
                .saturating_mul(1 << shift)
                .min(MAX_BACKOFF);
            log::info!("download {}: {last_err}; retrying in {wait:?}", self.url);
            // Sleep in slices so cancel stays responsive.
            let until = Instant::now() + wait;
            while Instant::now() < until && !self.cancelled() {
                std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
            }
        }
    }

    /// One HTTP request, streaming into the part from `self.done`.
    fn attempt(&mut self) -> Result<Attempt> {
        let mut req = self.agent.get(self.url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let offset = self.done;
        if offset > 0 {
            req = req.header("Range", format!("bytes={offset}-"));
        }
        self.requests += 1;
        let mut resp = match req.call() {
            Ok(r) => r,
            Err(e) => return Ok(Attempt::Retry(format!("request failed: {e}"))),
        };
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|s| s.trim().to_string())
        };
        let etag = header("etag");
        let content_length = header("content-length").and_then(|v| v.parse::<u64>().ok());
        let content_range = header("content-range");
        let url = self.url.to_string();
        match status {
            401 | 403 => {
                return Err(DownloadError::Unauthorized {
                    status,
                    url,
                    had_token: self.token.is_some(),
                });
            }
            404 => return Err(DownloadError::NotFound { url }),
            416 if offset > 0 => {
                // Nothing past our offset: complete if the part has the full size, else start over.
                let total = content_range
                    .as_deref()
                    .and_then(parse_total)
                    .or(self.total);
                if total == Some(offset) {
                    self.total = total;
                    return Ok(Attempt::Complete);
                }
                return Ok(Attempt::Restart);
            }
            408 | 429 | 500..=599 => return Ok(Attempt::Retry(format!("HTTP {status}"))),
            200 | 206 => {}
            _ => return Err(DownloadError::Http { status, url }),
        }

        let total = if status == 206 {
            let cr = content_range.as_deref().unwrap_or("");
            let start = parse_start(cr);
            if start != Some(offset) {
                // A range we did not ask for: safest is a fresh start.
                return Ok(Attempt::Restart);
            }
            parse_total(cr).or_else(|| content_length.map(|l| l + offset))
        } else {
            content_length
        };
        // The file changed on the server since the part was written: its bytes are useless.
        if status == 206
            && let (Some(old), Some(new)) = (&self.etag, &etag)
            && old != new
        {
            log::info!(
                "download {}: ETag changed ({old} -> {new}), restarting",
                self.url
            );
            self.etag = etag;
            return Ok(Attempt::Restart);
        }
        if status == 200 && self.done > 0 {
            // Range ignored: the body starts at byte 0.
            log::info!(
                "download {}: server ignored Range, restarting from 0",
                self.url
            );
            self.restart_from_zero()?;
        }
        self.etag = etag.or(self.etag.take());
        if let (Some(exp), Some(t)) = (self.expected.size, total)
            && exp != t
        {
            return Err(DownloadError::SizeMismatch {
                expected: exp,
                actual: t,
            });
        }
        if self.expected.size.is_none()
            && let Some(t) = total
        {
            check_space(self.dest, t.saturating_sub(self.done))?;
        }
        self.total = total.or(self.total);
        self.save_state()?;

        let mut reader = resp.body_mut().as_reader();
        let mut buf = vec![0u8; CHUNK];
        loop {
            if self.cancelled() {
                return Err(DownloadError::Cancelled);
            }
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(Attempt::Complete),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Ok(Attempt::Retry(format!("connection dropped: {e}"))),
            };
            self.fetched += n as u64;
            if self.total.is_some_and(|t| self.done + n as u64 > t) {
                return Err(DownloadError::SizeMismatch {
                    expected: self.total.unwrap_or(0),
                    actual: self.done + n as u64,
                });
            }
            self.write(&buf[..n])?;
            self.meter.report(self.done, self.total, false);
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        let res = if self
            .opts
            .fail_writes_after
            .is_some_and(|cap| self.done + data.len() as u64 > cap)
        {
            Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated: no space left on device",
            ))
        } else {
            self.file.write_all(data)
        };
        match res {
            Ok(()) => {
                self.hasher.update(data);
                self.done += data.len() as u64;
                Ok(())
            }
            Err(e) => {
                // A partial write may have reached the disk: cut the part back to what is hashed.
                let _ = self.file.set_len(self.done);
                let _ = self.file.seek(SeekFrom::Start(self.done));
                if e.kind() == io::ErrorKind::StorageFull
                    || e.kind() == io::ErrorKind::QuotaExceeded
                {
                    Err(DownloadError::DiskFull {
                        needed: self.total.map(|t| t - self.done),
                        available: free_space(self.part.parent().unwrap_or(Path::new("."))),
                        path: self.dest.to_path_buf(),
                    })
                } else {
                    Err(io_err(format!("writing {}", self.part.display()))(e))
                }
            }
        }
    }

    fn finish(mut self, resumed_from: u64) -> Result<DownloadOutcome> {
        self.file
            .sync_all()
            .map_err(io_err(format!("syncing {}", self.part.display())))?;
        self.meter
            .report(self.done, self.total.or(Some(self.done)), true);
        if let Some(exp) = self.expected.size
            && exp != self.done
        {
            self.remove_part();
            return Err(DownloadError::SizeMismatch {
                expected: exp,
                actual: self.done,
            });
        }
        let sha = hex::encode(std::mem::take(&mut self.hasher).finalize());
        if let Some(exp) = &self.expected_sha
            && *exp != sha
        {
            self.remove_part();
            return Err(DownloadError::HashMismatch {
                expected: exp.clone(),
                actual: sha,
            });
        }
        drop(self.file);
        fs::rename(&self.part, self.dest).map_err(io_err(format!(
            "renaming {} into place",
            self.part.display()
        )))?;
        let _ = fs::remove_file(&self.sidecar);
        Ok(DownloadOutcome {
            path: self.dest.to_path_buf(),
            size: self.done,
            sha256: sha,
            already_present: false,
            resumed_from,
            bytes_fetched: self.fetched,
            requests: self.requests,
            restarts: self.restarts,
            verified: self.expected_sha.is_some(),
        })
    }
}

/// What a server says about a file before it is fetched. The hub answers a HEAD on a `resolve` URL
/// of an LFS file with a redirect to its CDN that carries the object's sha256 in `X-Linked-Etag` and
/// its size in `X-Linked-Size`; a regular git file answers 200 with its size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteFile {
    /// Lowercase hex, when the server reported one.
    pub sha256: Option<String>,
    pub size: Option<u64>,
    /// `X-Repo-Commit`: the commit the revision resolved to.
    pub commit: Option<String>,
}

/// `"abc..."`, `W/"abc..."` -> the sha256, if the ETag is one (64 hex digits).
fn sha256_from_etag(etag: &str) -> Option<String> {
    let s = etag
        .trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase();
    (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())).then_some(s)
}

/// `http://host:port/a/b` -> `http://host:port`
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    url[start..].find('/').map_or(url, |i| &url[..start + i])
}

/// Asks the server about `url` with HEAD requests that do not follow the CDN redirect (so the
/// hub's headers are seen); same-host redirects (renamed repos) are followed. Transient failures
/// are retried like downloads; 401/403/404 give the same errors as [`download_file`].
pub fn probe(url: &str, opts: &DownloadOptions<'_>) -> Result<RemoteFile> {
    let token = hf_token(opts.token.as_deref());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .accept_encoding("identity")
        .timeout_connect(Some(Duration::from_secs(20)))
        .timeout_global(Some(opts.read_timeout.max(Duration::from_secs(1))))
        .build()
        .into();
    let mut url = url.to_string();
    let mut failures = 0u32;
    let mut hops = 0u32;
    loop {
        let mut req = agent.head(&url);
        if let Some(t) = &token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let transient = match req.call() {
            Err(e) => format!("request failed: {e}"),
            Ok(resp) => {
                let status = resp.status().as_u16();
                let header = |name: &str| {
                    resp.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(|s| s.trim().to_string())
                };
                let linked_sha = header("x-linked-etag")
                    .as_deref()
                    .and_then(sha256_from_etag);
                let linked_size = header("x-linked-size").and_then(|v| v.parse::<u64>().ok());
                let commit = header("x-repo-commit");
                match status {
                    401 | 403 => {
                        return Err(DownloadError::Unauthorized {
                            status,
                            url,
                            had_token: token.is_some(),
                        });
                    }
                    404 => return Err(DownloadError::NotFound { url }),
                    200..=299 => {
                        return Ok(RemoteFile {
                            sha256: linked_sha,
                            size: linked_size
                                .or_else(|| header("content-length").and_then(|v| v.parse().ok())),
                            commit,
                        });
                    }
                    300..=399 => {
                        let location = header("location").unwrap_or_default();
                        if (linked_sha.is_some() || linked_size.is_some())
                            || !location.starts_with('/')
                            || hops >= 5
                        {
                            return Ok(RemoteFile {
                                sha256: linked_sha,
                                size: linked_size,
                                commit,
                            });
                        }
                        hops += 1;
                        url = format!("{}{location}", origin(&url));
                        continue;
                    }
                    408 | 429 | 500..=599 => format!("HTTP {status}"),
                    _ => return Err(DownloadError::Http { status, url }),
                }
            }
        };
        failures += 1;
        if failures > opts.retries {
            return Err(DownloadError::Network {
                url,
                attempts: failures,
                last: transient,
            });
        }
        let shift = (failures - 1).min(16);
        std::thread::sleep(opts.backoff.saturating_mul(1 << shift).min(MAX_BACKOFF));
    }
}

/// [`download_file`] for hub `resolve` URLs: when `expected` has no sha256, the LFS sha256 and
/// size the hub reports ([`probe`]) become the expectation, so every large file is verified even
/// when the caller knew no hash. The hub's size wins over a caller's size hint.
pub fn download_hub_file(
    url: &str,
    dest: &Path,
    expected: Expected,
    opts: DownloadOptions<'_>,
) -> Result<DownloadOutcome> {
    let expected = if expected.sha256.is_none() {
        let remote = probe(url, &opts)?;
        Expected {
            sha256: remote.sha256,
            size: remote.size.or(expected.size),
        }
    } else {
        expected
    };
    download_file(url, dest, expected, opts)
}

/// `bytes 100-199/1000` -> 100
fn parse_start(content_range: &str) -> Option<u64> {
    let r = content_range.trim().strip_prefix("bytes")?.trim_start();
    r.split('-').next()?.trim().parse().ok()
}

/// `bytes 100-199/1000` or `bytes */1000` -> 1000
fn parse_total(content_range: &str) -> Option<u64> {
    content_range.rsplit('/').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_layout_and_content_range() {
        assert_eq!(
            hf_url(
                "https://huggingface.co/",
                "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
                "main",
                "a/b.gguf"
            ),
            "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/main/a/b.gguf"
        );
        assert_eq!(parse_start("bytes 100-199/1000"), Some(100));
        assert_eq!(parse_total("bytes 100-199/1000"), Some(1000));
        assert_eq!(parse_total("bytes */1000"), Some(1000));
        assert_eq!(parse_total("bytes 0-9/*"), None);
        assert_eq!(
            sidecar_path(Path::new("/x/m.gguf")),
            PathBuf::from("/x/m.gguf.part.json")
        );
    }

    #[test]
    fn linked_etags_and_origins() {
        let h = "74a4da8c9fdbcd15bd1f6d01d621410d31c6fc00986f5eb687824e7b93d7a9db";
        assert_eq!(sha256_from_etag(&format!("\"{h}\"")).as_deref(), Some(h));
        assert_eq!(
            sha256_from_etag(&format!("W/\"{}\"", h.to_uppercase())).as_deref(),
            Some(h)
        );
        // A git blob id (sha1) is not a sha256.
        assert_eq!(
            sha256_from_etag("\"2febf68cea25bf4611be02b7536f2488a5ba523b\""),
            None
        );
        assert_eq!(origin("http://127.0.0.1:8/a/b?c"), "http://127.0.0.1:8");
        assert_eq!(origin("https://huggingface.co"), "https://huggingface.co");
    }
}
