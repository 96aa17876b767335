//! What the Performance tab shows, filled by the workers: the last profiled run (per-dispatch GPU timings),
//! throughput history (tokens/s per reply, seconds per image) and VRAM samples over time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use drift_engine::profiler::Profile;

/// One profiled run: what ran ("decode token", "UNet step") and its timings.
#[derive(Clone)]
pub struct ProfiledRun {
    pub label: String,
    pub profile: Profile,
}

/// Speeds of one chat reply.
#[derive(Clone, Debug)]
pub struct ReplySpeed {
    pub prefill_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens: usize,
    pub decode_tokens_per_s: f64,
}

/// Drift's GPU bytes per memory category at one moment.
#[derive(Clone, Debug)]
pub struct VramSample {
    pub seconds: f64,
    pub total_bytes: u64,
    pub by_category: Vec<(&'static str, u64)>,
}

pub struct PerfLog {
    pub started: Instant,
    pub last_run: Option<ProfiledRun>,
    pub replies: Vec<ReplySpeed>,
    pub image_seconds: Vec<f64>,
    pub vram: VecDeque<VramSample>,
}

/// Shared between the UI and the workers.
pub type SharedPerfLog = Arc<Mutex<PerfLog>>;

/// VRAM samples kept (one per UI sample interval).
const MAX_VRAM_SAMPLES: usize = 3600;

impl Default for PerfLog {
    fn default() -> PerfLog {
        PerfLog {
            started: Instant::now(),
            last_run: None,
            replies: Vec::new(),
            image_seconds: Vec::new(),
            vram: VecDeque::new(),
        }
    }
}

impl PerfLog {
    pub fn push_vram(&mut self, report: &drift_engine::MemoryReport) {
        if self.vram.len() == MAX_VRAM_SAMPLES {
            self.vram.pop_front();
        }
        self.vram.push_back(VramSample {
            seconds: self.started.elapsed().as_secs_f64(),
            total_bytes: report.total_bytes,
            by_category: report
                .categories
                .iter()
                .map(|c| (c.name, c.bytes))
                .collect(),
        });
    }
}
