//! Pieces shared by OpenAI's response shapes: ids, timestamps, finish reasons, usage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use drift_engine::generate::StopReason;
use serde_json::{Value, json};

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A unique response id such as `chatcmpl-18c0f3a9b2e4d1f0-3`.
pub fn response_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}-{nanos:x}-{}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// OpenAI's `finish_reason`: `stop` (end of turn or a stop sequence) or `length` (token or context
/// limit).
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::Eos | StopReason::StopString | StopReason::Cancelled => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}
