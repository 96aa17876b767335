//! GPU jobs from different panels (a chat reply, an image) run one at a time on the shared device: each
//! worker holds the queue's lock for the length of one job. Waiting jobs are visible to the UI.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone, Default)]
pub struct GpuQueue {
    lock: Arc<Mutex<()>>,
    waiting: Arc<AtomicUsize>,
}

impl GpuQueue {
    /// Blocks (on a worker thread, never the UI) until no other job runs.
    pub fn acquire(&self) -> MutexGuard<'_, ()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // A worker that panicked while holding the lock left no GPU state that the next job depends on.
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Jobs waiting for the device right now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}
