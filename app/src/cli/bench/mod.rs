//! `drift bench kernels [--json]`: GPU time per kernel at realistic sizes, with GB/s and GFLOP/s.

mod kernels;
mod timing;

use anyhow::{Result, bail};
use drift_engine::{Gpu, GpuOptions};
use serde::Serialize;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// What to measure: `kernels`.
    what: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Timed repetitions per case (the median is reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
}

/// One measured figure.
#[derive(Serialize)]
pub struct Measurement {
    pub name: String,
    /// Median GPU time of one dispatch sequence, microseconds.
    pub time_us: f64,
    pub gbps: f64,
    pub tflops: f64,
    pub note: String,
}

pub fn run(options: &GpuOptions, args: &BenchArgs) -> Result<()> {
    if args.what != "kernels" {
        bail!("unknown benchmark '{}': try `drift bench kernels`", args.what);
    }
    let gpu = Gpu::new(options)?;
    if !args.json {
        println!("device: {} ({}), timing: {:?}", gpu.info.name, gpu.info.backend, drift_engine::profiler::Profiler::source(&gpu));
        println!("{:<48} {:>11} {:>10} {:>10}  note", "case", "time (us)", "GB/s", "TFLOP/s");
    }
    let mut results = Vec::new();
    let mut report = |m: Measurement| {
        if !args.json {
            println!("{:<48} {:>11.2} {:>10.1} {:>10.2}  {}", m.name, m.time_us, m.gbps, m.tflops, m.note);
        }
        results.push(m);
    };
    kernels::run_all(&gpu, args.reps, args.filter.as_deref(), &mut report)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "device": gpu.info.name, "backend": gpu.info.backend.to_string(), "results": results,
            }))?
        );
    }
    Ok(())
}
