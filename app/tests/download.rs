//! Resumable, verified downloads against a real HTTP/1.1 server on 127.0.0.1 (no mocks): the server
//! below serves one byte array with Range support and switchable faults, and `/hub/file.bin`
//! answers like the Hugging Face `resolve` endpoint (a redirect carrying `X-Linked-Etag`).

// The app is a binary crate, so the modules are compiled into this test directly.
#[allow(dead_code)]
#[path = "../src/hub/download.rs"]
mod download;
#[allow(dead_code)]
#[path = "../src/hub/manager.rs"]
mod manager;

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use download::{
    DownloadError, DownloadOptions, Expected, PartState, Progress, download_file,
    download_hub_file, hf_url, part_path, probe, sidecar_path,
};
use manager::{DownloadManager, FileRequest, JobRequest, JobState, ManagerOptions};
use sha2::{Digest, Sha256};

const SIZE: usize = 300_000;

#[derive(Default)]
struct Faults {
    /// Close the connection after this many body bytes, for the next response only.
    drop_after: Option<usize>,
    /// Answer Range requests with 200 and the whole body.
    ignore_range: bool,
    /// Answer this many requests with 500 first.
    fail_500: u32,
    /// Answer every request with this status (404, 401...).
    status: Option<u16>,
    /// Flip one byte of the served body.
    corrupt: Option<usize>,
    /// Require `Authorization: Bearer <token>` (401 otherwise).
    require_token: Option<String>,
    /// Pause this long after every 16 KiB of body (slow links, overlapping downloads).
    throttle: Option<Duration>,
}

#[derive(Default)]
struct Log {
    /// Range start of each request for the file (None: no Range header).
    ranges: Vec<Option<u64>>,
    /// Body bytes written to sockets.
    body_bytes: u64,
    /// Bodies being sent now, and the most at once.
    active: u32,
    max_active: u32,
}

/// Counts a body in flight for as long as it lives.
struct Active<'a>(&'a Mutex<Log>);

impl<'a> Active<'a> {
    fn new(log: &'a Mutex<Log>) -> Self {
        let mut l = log.lock().unwrap();
        l.active += 1;
        l.max_active = l.max_active.max(l.active);
        Active(log)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap().active -= 1;
    }
}

struct Server {
    base: String,
    data: Arc<Mutex<(Vec<u8>, String)>>,
    faults: Arc<Mutex<Faults>>,
    log: Arc<Mutex<Log>>,
}

fn content(seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..SIZE)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = Server {
            base,
            data: Arc::new(Mutex::new((content(1), "\"v1\"".to_string()))),
            faults: Arc::default(),
            log: Arc::default(),
        };
        let (data, faults, log) = (
            server.data.clone(),
            server.faults.clone(),
            server.log.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (data, faults, log) = (data.clone(), faults.clone(), log.clone());
                std::thread::spawn(move || {
                    let _ = handle(stream, &data, &faults, &log);
                });
            }
        });
        server
    }

    fn url(&self) -> String {
        format!("{}/file.bin", self.base)
    }

    fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap());
    }

    fn ranges(&self) -> Vec<Option<u64>> {
        self.log.lock().unwrap().ranges.clone()
    }

    fn body_bytes(&self) -> u64 {
        self.log.lock().unwrap().body_bytes
    }

    fn expected(&self) -> Expected {
        let d = self.data.lock().unwrap();
        Expected {
            sha256: Some(sha(&d.0)),
            size: Some(d.0.len() as u64),
        }
    }
}

fn handle(
    mut stream: TcpStream,
    data: &Mutex<(Vec<u8>, String)>,
    faults: &Mutex<Faults>,
    log: &Mutex<Log>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let method = line.split_whitespace().next().unwrap_or("GET").to_string();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        let (name, value) = h.split_once(':').unwrap_or((&h, ""));
        let value = value.trim().to_string();
        match name.to_ascii_lowercase().as_str() {
            "range" => {
                range = value
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split('-').next()?.parse::<u64>().ok())
            }
            "authorization" => auth = Some(value),
            _ => {}
        }
    }
    let reply = |stream: &mut TcpStream, status: &str, extra: &str| {
        write!(
            stream,
            "HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    if path == "/redirect" {
        return reply(&mut stream, "302 Found", "Location: /file.bin\r\n");
    }
    if path == "/hub/file.bin" {
        // Like huggingface.co's resolve endpoint: a redirect to the CDN carrying the LFS object's
        // sha256 and size (of the true file, whatever the CDN then sends).
        let d = data.lock().unwrap();
        let extra = format!(
            "Location: /file.bin\r\nX-Linked-Etag: \"{}\"\r\nX-Linked-Size: {}\r\nX-Repo-Commit: abc123\r\n",
            sha(&d.0),
            d.0.len()
        );
        return reply(&mut stream, "302 Found", &extra);
    }
    if method == "HEAD" && path == "/file.bin" {
        if let Some(st) = faults.lock().unwrap().status {
            return reply(&mut stream, &format!("{st} Error"), "");
        }
        let n = data.lock().unwrap().0.len();
        return write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n"
        );
    }
    if path != "/file.bin" {
        return reply(&mut stream, "404 Not Found", "");
    }
    let (body, etag, drop_after) = {
        let mut f = faults.lock().unwrap();
        log.lock().unwrap().ranges.push(range);
        if let Some(s) = f.status {
            let text = if s == 404 { "Not Found" } else { "Error" };
            return reply(&mut stream, &format!("{s} {text}"), "");
        }
        if let Some(t) = &f.require_token
            && auth.as_deref() != Some(&format!("Bearer {t}"))
        {
            return reply(&mut stream, "401 Unauthorized", "");
        }
        if f.fail_500 > 0 {
            f.fail_500 -= 1;
            return reply(&mut stream, "500 Internal Server Error", "");
        }
        let d = data.lock().unwrap();
        let mut body = d.0.clone();
        if let Some(i) = f.corrupt {
            body[i] ^= 0x5a;
        }
        (body, d.1.clone(), f.drop_after.take())
    };
    let total = body.len() as u64;
    let start = range.filter(|_| !faults.lock().unwrap().ignore_range);
    let (status, from, extra) = match start {
        Some(s) if s >= total => {
            return reply(
                &mut stream,
                "416 Range Not Satisfiable",
                &format!("Content-Range: bytes */{total}\r\n"),
            );
        }
        Some(s) => (
            "206 Partial Content",
            s as usize,
            format!("Content-Range: bytes {s}-{}/{total}\r\n", total - 1),
        ),
        None => ("200 OK", 0, String::new()),
    };
    let part = &body[from..];
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {etag}\r\nAccept-Ranges: bytes\r\n\
         {extra}Connection: close\r\n\r\n",
        part.len()
    )?;
    let send = drop_after.map_or(part.len(), |n| n.min(part.len()));
    let throttle = faults.lock().unwrap().throttle;
    let active = Active::new(log);
    for (i, chunk) in part[..send].chunks(16 * 1024).enumerate() {
        if let Some(t) = throttle.filter(|_| i > 0) {
            std::thread::sleep(t);
        }
        stream.write_all(chunk)?;
        log.lock().unwrap().body_bytes += chunk.len() as u64;
    }
    // The body is handed to the kernel: this request no longer counts as in flight.
    drop(active);
    stream.flush()?;
    stream.shutdown(Shutdown::Both)
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drift-download-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("model.bin")
}

fn opts<'a>() -> DownloadOptions<'a> {
    DownloadOptions {
        retries: 3,
        backoff: Duration::from_millis(5),
        read_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

fn assert_verified(dest: &Path, server: &Server) {
    let got = std::fs::read(dest).unwrap();
    assert!(got == server.data.lock().unwrap().0, "file content differs");
    assert!(!part_path(dest).exists(), "part left behind");
    assert!(!sidecar_path(dest).exists(), "sidecar left behind");
}

#[test]
fn full_download_is_verified_and_not_fetched_twice() {
    let s = Server::start();
    let dest = tmp("full");
    let reports = Mutex::new(Vec::<Progress>::new());
    let cb = |p: Progress| reports.lock().unwrap().push(p);
    let o = DownloadOptions {
        progress: Some(&cb),
        ..opts()
    };
    let out = download_file(&format!("{}/redirect", s.base), &dest, s.expected(), o).unwrap();
    assert_verified(&dest, &s);
    assert_eq!(out.sha256, s.expected().sha256.unwrap());
    assert_eq!(
        (out.size, out.bytes_fetched, out.requests),
        (SIZE as u64, SIZE as u64, 1)
    );
    assert_eq!(s.ranges(), vec![None]);
    let last = *reports.lock().unwrap().last().unwrap();
    assert_eq!(
        (last.done, last.total, last.eta),
        (SIZE as u64, Some(SIZE as u64), Some(Duration::ZERO))
    );
    assert!(last.rate > 0.0);

    let again = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert!(again.already_present);
    assert_eq!(
        s.ranges().len(),
        1,
        "a verified file must not be fetched again"
    );

    // No expectations at all still works (hash reported, not checked).
    let dest2 = tmp("full-noexp");
    let out = download_file(&s.url(), &dest2, Expected::default(), opts()).unwrap();
    assert_eq!(out.sha256, s.expected().sha256.unwrap());
    assert_verified(&dest2, &s);
}

#[test]
fn dropped_connection_resumes_with_range() {
    let s = Server::start();
    s.set(|f| f.drop_after = Some(100_000));
    let dest = tmp("drop");
    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_verified(&dest, &s);
    assert_eq!(s.ranges(), vec![None, Some(100_000)]);
    // Bytes fetched twice: none (everything received before the drop was kept).
    assert_eq!(out.bytes_fetched, SIZE as u64);
    assert_eq!(s.body_bytes(), SIZE as u64);
    assert_eq!((out.requests, out.restarts), (2, 0));
}

#[test]
fn killed_process_leaves_a_part_that_a_new_call_resumes() {
    let s = Server::start();
    let dest = tmp("killed");
    // First "process": the connection drops and no retry is allowed.
    s.set(|f| f.drop_after = Some(120_000));
    let err = download_file(
        &s.url(),
        &dest,
        s.expected(),
        DownloadOptions {
            retries: 0,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(matches!(err, DownloadError::Network { .. }), "{err}");
    assert!(err.to_string().contains("partial file is kept"), "{err}");
    assert!(!dest.exists());
    assert_eq!(std::fs::metadata(part_path(&dest)).unwrap().len(), 120_000);
    let state: PartState =
        serde_json::from_slice(&std::fs::read(sidecar_path(&dest)).unwrap()).unwrap();
    assert_eq!(
        (state.url.as_str(), state.bytes, state.etag.as_deref()),
        (s.url().as_str(), 120_000, Some("\"v1\""))
    );
    assert_eq!(state.sha256, s.expected().sha256);

    // Second "process": a fresh call resumes from the part.
    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_verified(&dest, &s);
    assert_eq!(out.resumed_from, 120_000);
    assert_eq!(out.bytes_fetched, (SIZE - 120_000) as u64);
    assert_eq!(s.ranges(), vec![None, Some(120_000)]);
}

#[test]
fn a_part_for_another_url_or_hash_is_discarded() {
    let s = Server::start();
    let dest = tmp("stale");
    std::fs::write(part_path(&dest), vec![7u8; 50_000]).unwrap();
    let stale = PartState {
        url: "http://elsewhere/x".into(),
        bytes: 50_000,
        ..Default::default()
    };
    std::fs::write(sidecar_path(&dest), serde_json::to_vec(&stale).unwrap()).unwrap();
    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_eq!(out.resumed_from, 0);
    assert_eq!(s.ranges(), vec![None]);
    assert_verified(&dest, &s);
}

#[test]
fn corrupted_byte_is_a_mismatch_and_nothing_is_kept() {
    let s = Server::start();
    s.set(|f| f.corrupt = Some(200_000));
    let dest = tmp("corrupt");
    let err = download_file(&s.url(), &dest, s.expected(), opts()).unwrap_err();
    assert!(matches!(err, DownloadError::HashMismatch { .. }), "{err}");
    assert!(err.to_string().contains("sha256 mismatch"), "{err}");
    assert!(!dest.exists(), "an unverified file reached dest");
    assert!(
        !part_path(&dest).exists(),
        "the corrupted part must be deleted"
    );
    assert!(!sidecar_path(&dest).exists());
}

#[test]
fn corrupted_byte_in_a_resumed_download_is_caught_too() {
    // The hash of the kept prefix is recomputed on resume, so a bad byte on disk is found.
    let s = Server::start();
    let dest = tmp("corrupt-resume");
    s.set(|f| f.drop_after = Some(100_000));
    download_file(
        &s.url(),
        &dest,
        s.expected(),
        DownloadOptions {
            retries: 0,
            ..opts()
        },
    )
    .unwrap_err();
    let mut bytes = std::fs::read(part_path(&dest)).unwrap();
    bytes[10] ^= 1;
    std::fs::write(part_path(&dest), bytes).unwrap();
    let err = download_file(&s.url(), &dest, s.expected(), opts()).unwrap_err();
    assert!(matches!(err, DownloadError::HashMismatch { .. }), "{err}");
    assert!(!dest.exists() && !part_path(&dest).exists());
}

#[test]
fn server_ignoring_range_restarts_cleanly() {
    let s = Server::start();
    s.set(|f| {
        f.drop_after = Some(100_000);
        f.ignore_range = true;
    });
    let dest = tmp("norange");
    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_verified(&dest, &s);
    assert_eq!(s.ranges(), vec![None, Some(100_000)]);
    assert_eq!(out.restarts, 1);
    assert_eq!(out.bytes_fetched, (100_000 + SIZE) as u64);
}

#[test]
fn changed_etag_restarts() {
    let s = Server::start();
    let dest = tmp("etag");
    s.set(|f| f.drop_after = Some(100_000));
    let old = s.expected();
    download_file(
        &s.url(),
        &dest,
        Expected {
            sha256: None,
            ..old
        },
        DownloadOptions {
            retries: 0,
            ..opts()
        },
    )
    .unwrap_err();
    // The file changes on the server (new revision pushed under the same URL).
    *s.data.lock().unwrap() = (content(2), "\"v2\"".to_string());
    let out = download_file(
        &s.url(),
        &dest,
        Expected {
            sha256: None,
            size: Some(SIZE as u64),
        },
        opts(),
    )
    .unwrap();
    assert_verified(&dest, &s);
    assert_eq!(out.sha256, s.expected().sha256.unwrap());
    assert_eq!(out.restarts, 1);
    assert_eq!(s.ranges(), vec![None, Some(100_000), None]);
}

#[test]
fn not_found_and_unauthorized_have_clear_messages() {
    let s = Server::start();
    s.set(|f| f.status = Some(404));
    let dest = tmp("status");
    let err = download_file(&s.url(), &dest, s.expected(), opts()).unwrap_err();
    assert!(matches!(err, DownloadError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(s.ranges().len(), 1, "404 must not be retried");

    s.set(|f| f.status = Some(403));
    let err = download_file(&s.url(), &dest, s.expected(), opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains("gated model: needs a Hugging Face token"),
        "{err}"
    );

    s.set(|f| {
        f.status = None;
        f.require_token = Some("hf_secret".into());
    });
    let bad = DownloadOptions {
        token: Some("hf_wrong".into()),
        ..opts()
    };
    let err = download_file(&s.url(), &dest, s.expected(), bad).unwrap_err();
    assert!(
        matches!(
            err,
            DownloadError::Unauthorized {
                status: 401,
                had_token: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("gated model: needs a Hugging Face token"),
        "{err}"
    );
    assert!(!dest.exists());

    let good = DownloadOptions {
        token: Some("hf_secret".into()),
        ..opts()
    };
    download_file(&s.url(), &dest, s.expected(), good).unwrap();
    assert_verified(&dest, &s);
}

#[test]
fn server_errors_are_retried_then_reported() {
    let s = Server::start();
    s.set(|f| f.fail_500 = 3);
    let dest = tmp("5xx");
    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_verified(&dest, &s);
    assert_eq!(out.requests, 4);

    let s = Server::start();
    s.set(|f| f.fail_500 = 100);
    let dest = tmp("5xx-give-up");
    let err = download_file(
        &s.url(),
        &dest,
        s.expected(),
        DownloadOptions {
            retries: 2,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, DownloadError::Network { attempts: 3, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("HTTP 500"), "{err}");
}

#[test]
fn cancel_keeps_the_part_for_a_later_resume() {
    let s = Server::start();
    let dest = tmp("cancel");
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    // Cancel as soon as the first bytes arrive.
    let cb = move |p: Progress| {
        if p.done > 0 {
            c.store(true, Ordering::Relaxed);
        }
    };
    let o = DownloadOptions {
        cancel: Some(cancel.clone()),
        progress: Some(&cb),
        ..opts()
    };
    let err = download_file(&s.url(), &dest, s.expected(), o).unwrap_err();
    assert!(matches!(err, DownloadError::Cancelled), "{err}");
    assert!(!dest.exists());
    let kept = std::fs::metadata(part_path(&dest)).unwrap().len();
    assert!(kept > 0 && kept < SIZE as u64, "kept {kept}");
    assert!(sidecar_path(&dest).exists());

    // Cancelled before it starts: no request at all.
    let n = s.ranges().len();
    let o = DownloadOptions {
        cancel: Some(cancel.clone()),
        ..opts()
    };
    assert!(matches!(
        download_file(&s.url(), &dest, s.expected(), o),
        Err(DownloadError::Cancelled)
    ));
    assert_eq!(s.ranges().len(), n);

    let out = download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_eq!(out.resumed_from, kept);
    assert_verified(&dest, &s);
}

#[test]
fn disk_full_is_reported_and_resumable() {
    let s = Server::start();
    let dest = tmp("diskfull");
    let o = DownloadOptions {
        fail_writes_after: Some(50_000),
        ..opts()
    };
    let err = download_file(&s.url(), &dest, s.expected(), o).unwrap_err();
    assert!(matches!(err, DownloadError::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert!(!dest.exists());
    assert!(std::fs::metadata(part_path(&dest)).unwrap().len() <= 50_000);
    download_file(&s.url(), &dest, s.expected(), opts()).unwrap();
    assert_verified(&dest, &s);
}

#[cfg(target_os = "linux")]
#[test]
fn free_space_is_checked_before_starting() {
    let s = Server::start();
    let dest = tmp("space");
    let huge = Expected {
        sha256: None,
        size: Some(1 << 60),
    };
    let err = download_file(&s.url(), &dest, huge, opts()).unwrap_err();
    assert!(
        matches!(
            err,
            DownloadError::DiskFull {
                available: Some(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(s.ranges().is_empty(), "no request before the space check");
    assert!(download::free_space(dest.parent().unwrap()).unwrap() > 0);
}

#[test]
fn hf_url_layout() {
    assert_eq!(
        hf_url("http://127.0.0.1:9/", "org/model", "main", "model.gguf"),
        "http://127.0.0.1:9/org/model/resolve/main/model.gguf"
    );
}

#[test]
fn hub_linked_etag_is_the_expected_hash_when_none_is_known() {
    let s = Server::start();
    let hub_url = format!("{}/hub/file.bin", s.base);
    let remote = probe(&hub_url, &opts()).unwrap();
    assert_eq!(remote.sha256, s.expected().sha256);
    assert_eq!(remote.size, Some(SIZE as u64));
    assert_eq!(remote.commit.as_deref(), Some("abc123"));
    // A plain file answers HEAD with its size and no hash.
    let plain = probe(&s.url(), &opts()).unwrap();
    assert_eq!((plain.sha256, plain.size), (None, Some(SIZE as u64)));
    assert!(s.ranges().is_empty(), "HEAD requests fetch no body");

    // No hash given: the hub's is used, and the good file passes.
    let dest = tmp("linked-ok");
    let out = download_hub_file(&hub_url, &dest, Expected::default(), opts()).unwrap();
    assert!(out.verified);
    assert_verified(&dest, &s);

    // The CDN sends a corrupted byte: rejected against the hub's hash, nothing kept.
    s.set(|f| f.corrupt = Some(123_456));
    let dest = tmp("linked-corrupt");
    let err = download_hub_file(&hub_url, &dest, Expected::default(), opts()).unwrap_err();
    assert!(matches!(err, DownloadError::HashMismatch { .. }), "{err}");
    assert!(!dest.exists() && !part_path(&dest).exists());

    // Without a hub hash the download still works, unverified.
    s.set(|f| f.corrupt = None);
    let dest = tmp("linked-none");
    let out = download_hub_file(&s.url(), &dest, Expected::default(), opts()).unwrap();
    assert!(!out.verified);
    assert_verified(&dest, &s);

    // Errors on the HEAD are the download errors.
    s.set(|f| f.status = Some(404));
    let err = probe(&s.url(), &opts()).unwrap_err();
    assert!(matches!(err, DownloadError::NotFound { .. }), "{err}");
}

fn job(s: &Server, name: &str) -> (JobRequest, std::path::PathBuf) {
    let dest = tmp(name);
    let req = JobRequest {
        label: name.to_string(),
        files: vec![FileRequest {
            url: s.url(),
            dest: dest.clone(),
            expected: s.expected(),
            size_hint: None,
        }],
        token: None,
    };
    (req, dest)
}

fn manager(max: usize) -> DownloadManager {
    DownloadManager::new(ManagerOptions {
        max_concurrent: max,
        retries: 3,
        backoff: Duration::from_millis(5),
        read_timeout: Duration::from_secs(5),
    })
}

const LONG: Duration = Duration::from_secs(60);

/// Waits until the job is done, failed, cancelled or paused.
fn settle(m: &DownloadManager, id: manager::JobId) -> Option<manager::JobStatus> {
    m.wait_for(id, LONG, |st| st.state.is_settled())
}

#[test]
fn manager_runs_downloads_concurrently_up_to_its_limit() {
    let s = Server::start();
    s.set(|f| f.throttle = Some(Duration::from_millis(15)));
    let m = manager(2);
    let jobs: Vec<_> = (0..3)
        .map(|i| {
            let (req, dest) = job(&s, &format!("mgr-limit-{i}"));
            (m.add(req), dest)
        })
        .collect();
    // Right after queueing: two run, one waits.
    let states: Vec<JobState> = jobs
        .iter()
        .map(|(id, _)| m.status(*id).unwrap().state)
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Running).count(),
        2,
        "{states:?}"
    );
    assert_eq!(states[2], JobState::Queued);
    for (id, dest) in &jobs {
        let st = settle(&m, *id).unwrap();
        assert_eq!(st.state, JobState::Done, "{st:?}");
        assert_eq!(
            (st.done, st.total, st.verified, st.files_done),
            (SIZE as u64, SIZE as u64, 1, 1)
        );
        assert_verified(dest, &s);
    }
    let max = s.log.lock().unwrap().max_active;
    assert_eq!(max, 2, "at most two bodies at once, and two did overlap");
}

#[test]
fn manager_pause_keeps_the_part_and_resume_continues_from_it() {
    let s = Server::start();
    s.set(|f| f.throttle = Some(Duration::from_millis(20)));
    let m = manager(1);
    let (req, dest) = job(&s, "mgr-pause");
    let id = m.add(req);
    let st = m.wait_for(id, LONG, |st| st.done >= 50_000).unwrap();
    assert_eq!(st.state, JobState::Running);
    assert!(st.rate > 0.0 && st.eta.is_some(), "{st:?}");
    m.pause(id);
    let st = settle(&m, id).unwrap();
    assert_eq!(st.state, JobState::Paused);
    let kept = std::fs::metadata(part_path(&dest)).unwrap().len();
    assert!(kept >= 50_000 && kept < SIZE as u64, "kept {kept}");
    assert!(!dest.exists());

    m.resume(id);
    let st = settle(&m, id).unwrap();
    assert_eq!(st.state, JobState::Done, "{st:?}");
    assert_verified(&dest, &s);
    // The second request asked for the rest of the file, from the byte the part ended at.
    assert_eq!(s.ranges(), vec![None, Some(kept)]);
}

#[test]
fn manager_cancel_deletes_the_part_and_a_queued_job_never_starts() {
    let s = Server::start();
    s.set(|f| f.throttle = Some(Duration::from_millis(20)));
    let m = manager(1);
    let (req, dest) = job(&s, "mgr-cancel");
    let (queued_req, queued_dest) = job(&s, "mgr-queued");
    let id = m.add(req);
    let queued = m.add(queued_req);
    m.cancel(queued);
    assert_eq!(m.status(queued).unwrap().state, JobState::Cancelled);
    m.wait_for(id, LONG, |st| st.done > 0).unwrap();
    m.cancel(id);
    let st = settle(&m, id).unwrap();
    assert_eq!(st.state, JobState::Cancelled);
    assert!(!dest.exists() && !part_path(&dest).exists() && !sidecar_path(&dest).exists());
    assert!(!queued_dest.exists() && !part_path(&queued_dest).exists());
    assert_eq!(
        s.ranges().len(),
        1,
        "the cancelled queued job made no request"
    );

    // A failure is reported with the download's message and can be retried.
    s.set(|f| {
        f.throttle = None;
        f.status = Some(404);
    });
    let (req, dest) = job(&s, "mgr-fail");
    let id = m.add(req);
    let st = settle(&m, id).unwrap();
    assert!(
        matches!(&st.state, JobState::Failed(msg) if msg.contains("not found")),
        "{st:?}"
    );
    s.set(|f| f.status = None);
    m.resume(id);
    assert_eq!(settle(&m, id).unwrap().state, JobState::Done);
    assert_verified(&dest, &s);
}
