//! Diffusion sampling on the CPU: the noise schedulers of Stable Diffusion pipelines and Drift's own
//! seeded Gaussian noise.
//!
//! - [`schedulers`]: Euler, Euler ancestral, DDIM, DPM++ 2M (with or without Karras sigmas) and LCM,
//!   built from a diffusers `scheduler/scheduler_config.json` and checked against diffusers.
//! - [`noise`]: the documented counter-based generator (Philox4x32-10 + Box-Muller) for the initial
//!   latents and the per-step noise, reproducible on every platform.
//!
//! Latents are small (4 x 64 x 64 = 16k floats at 512x512), so the scheduler arithmetic runs on the
//! CPU in f64 between UNet evaluations.

pub mod display;
pub mod image;
pub mod noise;
pub mod pipeline;
pub mod schedulers;
pub mod single_file;
