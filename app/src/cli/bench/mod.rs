//! `drift bench kernels [--json]`: GPU time per kernel at realistic sizes, with GB/s and GFLOP/s.

mod dp4a_latency;
mod kernels;
mod llm;
mod llm_sweep;
mod sd;
mod timing;

use anyhow::{Result, bail};
use drift_engine::{Gpu, GpuOptions};
use serde::Serialize;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// What to measure: `kernels`, `llm` or `sd`.
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
    #[command(flatten)]
    llm: llm::LlmBenchArgs,
    #[command(flatten)]
    sd: sd::SdBenchArgs,
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
    let gpu = Gpu::new(options)?;
    if args.what == "llm" {
        let r = llm::run(&gpu, &args.llm)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            println!("{} on {}", r.shape, r.device);
            println!(
                "  weights {:.3} GB, KV cache {:.1} MB",
                r.weight_bytes as f64 / 1e9,
                r.kv_bytes as f64 / 1e6
            );
            println!(
                "  prefill {} tokens: {:.0} tok/s (GPU {:.2} ms)",
                r.prefill_tokens, r.prefill_tokens_per_s, r.prefill_gpu_ms
            );
            println!(
                "  decode {} tokens: {:.1} tok/s, {:.3} ms/token (GPU {:.3} ms), {} dispatches/token, CPU encode {:.0} us/token",
                r.decode_tokens,
                r.decode_tokens_per_s,
                r.decode_ms_per_token,
                r.decode_gpu_ms_per_token,
                r.dispatches_per_token,
                r.cpu_encode_us_per_token
            );
            println!(
                "  floors: GPU {:.3} ms/token with 32 steps in one command buffer, {:.3} with a submit per step, {:.3} with 32 command buffers in one submit; CPU encode + submit {:.0} us/token",
                r.decode_gpu_wall_ms_per_token,
                r.decode_gpu_wall_submits_ms_per_token,
                r.decode_gpu_wall_batched_ms_per_token,
                r.cpu_submit_us_per_token
            );
            let runs: Vec<String> = r
                .decode_runs_tokens_per_s
                .iter()
                .map(|t| format!("{t:.1}"))
                .collect();
            println!(
                "  decode runs (tok/s, median reported): {}",
                runs.join(", ")
            );
            println!(
                "  first generated tokens (greedy; equal across builds computing the same logits): {:?}",
                r.first_tokens
            );
            if r.decode_step_workgroups > 0 {
                println!(
                    "  decode as one dispatch over {} workgroups",
                    r.decode_step_workgroups
                );
            }
            let l = &r.decode_loop_us_per_token;
            println!(
                "  generation loop per token: {:.0} us waiting for encoders, {:.0} us submitting, {:.0} us waiting for the GPU",
                l.encode_wait_us, l.submit_us, l.readback_us
            );
            println!(
                "  {:.1} MB read per token, copy bandwidth {:.0} GB/s: {:.0}% of the bandwidth roofline",
                r.bytes_per_token / 1e6,
                r.copy_gbps,
                100.0 * r.roofline_fraction
            );
            for (k, us) in &r.top_decode_kernels {
                println!("    {k:<40} {us:>9.1} us/token");
            }
            println!("  prefill under the profiler (per-dispatch timestamps):");
            for (k, calls, us) in &r.top_prefill_kernels {
                println!("    {k:<40} {us:>9.1} us in {calls} calls");
            }
        }
        return Ok(());
    }
    if args.what == "sd" {
        let shape = args.llm.shape.as_deref().unwrap_or("sd15");
        let r = sd::run(&gpu, shape, args.llm.random_weights, &args.sd)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            sd::print(&r, args.sd.steps);
        }
        return Ok(());
    }
    if args.what != "kernels" {
        bail!(
            "unknown benchmark '{}': try `drift bench kernels` or `drift bench llm`",
            args.what
        );
    }
    if !args.json {
        println!(
            "device: {} ({}), timing: {:?}",
            gpu.info.name,
            gpu.info.backend,
            drift_engine::profiler::Profiler::source(&gpu)
        );
        println!(
            "{:<48} {:>11} {:>10} {:>10}  note",
            "case", "time (us)", "GB/s", "TFLOP/s"
        );
    }
    let mut results = Vec::new();
    let mut report = |m: Measurement| {
        if !args.json {
            println!(
                "{:<48} {:>11.2} {:>10.1} {:>10.2}  {}",
                m.name, m.time_us, m.gbps, m.tflops, m.note
            );
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
