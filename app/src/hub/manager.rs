//! Several downloads at once: a queue with at most N running, pause / resume / cancel, progress per
//! download. A job is one model: its files are fetched one after the other with
//! [`download_hub_file`] (resumable, verified). Each running job has its own thread. Pausing stops
//! it and keeps the `.part` files, so resuming continues with a Range request; cancelling deletes
//! the parts.
//!
//! Like `download.rs`, this file uses only std, external crates and `super::download`, so the
//! loopback-HTTP test can include both with `#[path]`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::download::{
    DownloadError, DownloadOptions, Expected, Progress, download_hub_file, part_path, sidecar_path,
};

pub type JobId = u64;

/// One file of a job.
#[derive(Clone, Debug)]
pub struct FileRequest {
    pub url: String,
    pub dest: PathBuf,
    pub expected: Expected,
    /// Size to show before the server says (catalog figure); not checked.
    pub size_hint: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct JobRequest {
    pub label: String,
    pub files: Vec<FileRequest>,
    /// Bearer token; None falls back to `HF_TOKEN`.
    pub token: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Paused,
    Done,
    Failed(String),
    Cancelled,
}

impl JobState {
    /// Nothing will happen to the job unless the user acts.
    pub fn is_settled(&self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

/// A job as the UI shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobStatus {
    pub id: JobId,
    pub label: String,
    pub state: JobState,
    /// Bytes on disk over all files.
    pub done: u64,
    /// Sum of the sizes known so far (the server's, else the hint).
    pub total: u64,
    /// Bytes per second of the running file.
    pub rate: f64,
    pub eta: Option<Duration>,
    /// Files finished, of `files`.
    pub files_done: usize,
    pub files: usize,
    /// Finished files whose sha256 was checked.
    pub verified: usize,
}

#[derive(Clone, Debug)]
pub struct ManagerOptions {
    pub max_concurrent: usize,
    pub retries: u32,
    pub backoff: Duration,
    pub read_timeout: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            max_concurrent: 2,
            retries: 5,
            backoff: Duration::from_millis(500),
            read_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StopKind {
    Pause,
    Cancel,
}

struct Job {
    id: JobId,
    req: Arc<JobRequest>,
    state: JobState,
    stop: Arc<AtomicBool>,
    stop_kind: Option<StopKind>,
    file_done: Vec<u64>,
    file_total: Vec<Option<u64>>,
    completed: Vec<bool>,
    rate: f64,
    verified: usize,
}

impl Job {
    fn status(&self) -> JobStatus {
        let done: u64 = self.file_done.iter().sum();
        let total: u64 = self
            .file_total
            .iter()
            .zip(&self.req.files)
            .map(|(t, f)| t.or(f.size_hint).unwrap_or(0))
            .sum();
        let running = self.state == JobState::Running;
        let eta = (running && self.rate > 0.0 && total >= done)
            .then(|| Duration::from_secs_f64((total - done) as f64 / self.rate));
        JobStatus {
            id: self.id,
            label: self.req.label.clone(),
            state: self.state.clone(),
            done,
            total: total.max(done),
            rate: if running { self.rate } else { 0.0 },
            eta,
            files_done: self.completed.iter().filter(|c| **c).count(),
            files: self.req.files.len(),
            verified: self.verified,
        }
    }
}

struct Inner {
    next_id: JobId,
    jobs: Vec<Job>,
}

struct Shared {
    opts: ManagerOptions,
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking download thread must not take the whole manager down with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Cheap to clone; every clone drives the same queue.
#[derive(Clone)]
pub struct DownloadManager {
    shared: Arc<Shared>,
}

impl DownloadManager {
    pub fn new(opts: ManagerOptions) -> DownloadManager {
        DownloadManager {
            shared: Arc::new(Shared {
                opts: ManagerOptions {
                    max_concurrent: opts.max_concurrent.max(1),
                    ..opts
                },
                inner: Mutex::new(Inner {
                    next_id: 1,
                    jobs: Vec::new(),
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// Queues a job; it starts as soon as fewer than the limit are running.
    pub fn add(&self, req: JobRequest) -> JobId {
        let mut g = self.shared.lock();
        let id = g.next_id;
        g.next_id += 1;
        let n = req.files.len();
        g.jobs.push(Job {
            id,
            req: Arc::new(req),
            state: JobState::Queued,
            stop: Arc::new(AtomicBool::new(false)),
            stop_kind: None,
            file_done: vec![0; n],
            file_total: vec![None; n],
            completed: vec![false; n],
            rate: 0.0,
            verified: 0,
        });
        drop(g);
        pump(&self.shared);
        id
    }

    /// Stops a job, keeping what it downloaded for [`resume`](Self::resume).
    pub fn pause(&self, id: JobId) {
        self.stop(id, StopKind::Pause);
    }

    /// Stops a job and deletes its partial files.
    pub fn cancel(&self, id: JobId) {
        self.stop(id, StopKind::Cancel);
    }

    fn stop(&self, id: JobId, kind: StopKind) {
        let mut g = self.shared.lock();
        let Some(job) = g.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        match (&job.state, kind) {
            (JobState::Running, _) => {
                job.stop_kind = Some(kind);
                job.stop.store(true, Ordering::Relaxed);
            }
            (JobState::Queued, StopKind::Pause) => job.state = JobState::Paused,
            (JobState::Queued | JobState::Paused | JobState::Failed(_), StopKind::Cancel) => {
                job.state = JobState::Cancelled;
                delete_parts(&job.req);
            }
            _ => {}
        }
        drop(g);
        self.shared.changed.notify_all();
    }

    /// Queues a paused (or failed) job again; it continues from its `.part` files.
    pub fn resume(&self, id: JobId) {
        let mut g = self.shared.lock();
        if let Some(job) = g.jobs.iter_mut().find(|j| j.id == id)
            && matches!(job.state, JobState::Paused | JobState::Failed(_))
        {
            job.state = JobState::Queued;
        }
        drop(g);
        pump(&self.shared);
    }

    /// Forgets settled jobs (finished, failed, cancelled) from the list.
    pub fn clear_settled(&self) {
        self.shared.lock().jobs.retain(|j| {
            !matches!(
                j.state,
                JobState::Done | JobState::Failed(_) | JobState::Cancelled
            )
        });
    }

    pub fn statuses(&self) -> Vec<JobStatus> {
        self.shared.lock().jobs.iter().map(Job::status).collect()
    }

    pub fn status(&self, id: JobId) -> Option<JobStatus> {
        self.shared
            .lock()
            .jobs
            .iter()
            .find(|j| j.id == id)
            .map(Job::status)
    }

    /// Blocks until `pred` holds for the job (or it is gone), or `timeout` passes; the last status.
    pub fn wait_for(
        &self,
        id: JobId,
        timeout: Duration,
        pred: impl Fn(&JobStatus) -> bool,
    ) -> Option<JobStatus> {
        let until = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            let s = g.jobs.iter().find(|j| j.id == id).map(Job::status);
            let now = Instant::now();
            match &s {
                Some(st) if !pred(st) && now < until => {}
                _ => return s,
            }
            g = self
                .shared
                .changed
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn delete_parts(req: &JobRequest) {
    for f in &req.files {
        let _ = std::fs::remove_file(part_path(&f.dest));
        let _ = std::fs::remove_file(sidecar_path(&f.dest));
    }
}

/// Starts queued jobs while fewer than the limit run.
fn pump(shared: &Arc<Shared>) {
    let mut g = shared.lock();
    let mut running = g
        .jobs
        .iter()
        .filter(|j| j.state == JobState::Running)
        .count();
    for job in g.jobs.iter_mut() {
        if running >= shared.opts.max_concurrent {
            break;
        }
        if job.state != JobState::Queued {
            continue;
        }
        job.state = JobState::Running;
        job.stop.store(false, Ordering::Relaxed);
        job.stop_kind = None;
        running += 1;
        let (shared2, id, req, stop) = (shared.clone(), job.id, job.req.clone(), job.stop.clone());
        std::thread::spawn(move || run_job(&shared2, id, &req, stop));
    }
    drop(g);
    shared.changed.notify_all();
}

fn run_job(shared: &Arc<Shared>, id: JobId, req: &JobRequest, stop: Arc<AtomicBool>) {
    let with_job = |f: &mut dyn FnMut(&mut Job)| {
        if let Some(j) = shared.lock().jobs.iter_mut().find(|j| j.id == id) {
            f(j);
        }
        shared.changed.notify_all();
    };
    let mut outcome = JobState::Done;
    for (i, file) in req.files.iter().enumerate() {
        let mut skip = false;
        with_job(&mut |j| skip = j.completed[i]);
        if skip {
            continue;
        }
        let report = |p: Progress| {
            with_job(&mut |j| {
                j.file_done[i] = p.done;
                j.file_total[i] = p.total.or(j.file_total[i]);
                j.rate = p.rate;
            })
        };
        let opts = DownloadOptions {
            token: req.token.clone(),
            retries: shared.opts.retries,
            backoff: shared.opts.backoff,
            cancel: Some(stop.clone()),
            progress: Some(&report),
            read_timeout: shared.opts.read_timeout,
            ..Default::default()
        };
        match download_hub_file(&file.url, &file.dest, file.expected.clone(), opts) {
            Ok(out) => with_job(&mut |j| {
                j.completed[i] = true;
                j.file_done[i] = out.size;
                j.file_total[i] = Some(out.size);
                j.verified += usize::from(out.verified);
            }),
            Err(DownloadError::Cancelled) => {
                outcome = JobState::Paused;
                break;
            }
            Err(e) => {
                outcome = JobState::Failed(e.to_string());
                break;
            }
        }
    }
    {
        let mut g = shared.lock();
        if let Some(j) = g.jobs.iter_mut().find(|j| j.id == id) {
            j.state = match (outcome, j.stop_kind) {
                (JobState::Done, _) => JobState::Done,
                (_, Some(StopKind::Cancel)) => {
                    delete_parts(&j.req);
                    JobState::Cancelled
                }
                (other, _) => other,
            };
            j.rate = 0.0;
        }
    }
    pump(shared);
}
