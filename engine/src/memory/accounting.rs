//! Bytes allocated per category and their peaks, updated lock-free as buffers come and go.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What a GPU allocation is for; the app's performance view shows one bar per category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Category {
    Weights,
    KvCache,
    Activations,
    Staging,
    Other,
}

impl Category {
    pub const ALL: [Category; 5] = [
        Category::Weights,
        Category::KvCache,
        Category::Activations,
        Category::Staging,
        Category::Other,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "kv cache",
            Category::Activations => "activations",
            Category::Staging => "staging/readback",
            Category::Other => "other",
        }
    }
}

/// Live counters. Shared by every [`super::GpuBuffer`] of one device.
#[derive(Debug, Default)]
pub struct MemoryTracker {
    current: [AtomicU64; 5],
    peak: [AtomicU64; 5],
    total_peak: AtomicU64,
    buffers: AtomicU64,
}

impl MemoryTracker {
    pub(crate) fn add(&self, category: Category, bytes: u64) {
        let i = category.index();
        let now = self.current[i].fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak[i].fetch_max(now, Ordering::Relaxed);
        self.total_peak.fetch_max(self.total(), Ordering::Relaxed);
        self.buffers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, category: Category, bytes: u64) {
        self.current[category.index()].fetch_sub(bytes, Ordering::Relaxed);
        self.buffers.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn total(&self) -> u64 {
        self.current.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn report(&self) -> MemoryReport {
        let categories = Category::ALL
            .iter()
            .map(|&c| CategoryUsage {
                category: c,
                name: c.name(),
                bytes: self.current[c.index()].load(Ordering::Relaxed),
                peak_bytes: self.peak[c.index()].load(Ordering::Relaxed),
            })
            .collect();
        MemoryReport {
            categories,
            total_bytes: self.total(),
            peak_total_bytes: self.total_peak.load(Ordering::Relaxed),
            live_buffers: self.buffers.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CategoryUsage {
    pub category: Category,
    pub name: &'static str,
    pub bytes: u64,
    pub peak_bytes: u64,
}

/// A snapshot the app polls for its live VRAM view.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    pub categories: Vec<CategoryUsage>,
    pub total_bytes: u64,
    pub peak_total_bytes: u64,
    pub live_buffers: u64,
}

impl MemoryReport {
    pub fn bytes(&self, category: Category) -> u64 {
        self.categories
            .iter()
            .find(|c| c.category == category)
            .map_or(0, |c| c.bytes)
    }
}
