//! Drift's inference engine: a GPU runtime on wgpu after ML Drift (arXiv 2505.00232).
//!
//! The pieces, bottom to top:
//! - [`gpu`]: the device context (standalone or adopted from a host such as eframe) and its capabilities.
//! - [`memory`]: tracked GPU buffers, live accounting per category, and the greedy-by-size arena planner.
//! - [`tensor`]: logical tensors (shape, dtype, layout) over physical storage (buffer, offset, length).
//! - [`kernels`]: WGSL kernels specialised per device and cached; each kernel family builds [`exec::Dispatch`]es.
//! - [`exec`]: prebuilt dispatch sequences encoded into one pass and submitted once per step.
//! - [`profiler`]: GPU timestamps per dispatch, aggregated per kernel, exportable as a Chrome trace.
//! - [`selftest`]: every kernel checked against a CPU reference; used by the tests and by `drift selftest`.

pub mod diffusion;
pub mod encode_ahead;
pub mod error;
pub mod exec;
pub mod formats;
pub mod generate;
pub mod gpu;
pub mod kernels;
pub mod memory;
pub mod models;
pub mod profiler;
pub mod reference;
pub mod sampling;
pub mod selftest;
pub mod tensor;
pub mod tokenize;

pub use error::{DriftError, Result};
pub use exec::{Dispatch, Program};
pub use gpu::{Caps, Gpu, GpuOptions};
pub use memory::{Category, MemoryReport};
pub use tensor::{DType, Layout, Tensor};
