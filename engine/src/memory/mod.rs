//! GPU memory: tracked buffers, live accounting per category, and the arena planner.

mod accounting;
mod buffer;
pub mod planner;

pub use accounting::{Category, MemoryReport, MemoryTracker};
pub use buffer::GpuBuffer;
pub use planner::{ArenaPlan, Lifetime, plan_greedy_by_size};
