//! `drift bench sd --shape sd15 --random-weights`: Stable Diffusion 1.5 at 512x512 with random weights:
//! text encoder, one UNet step (batch 2 for CFG), VAE decode, the 20-step total, and the activation memory
//! plan (naive one-buffer-per-tensor vs the greedy-by-size arena).

use anyhow::{Result, bail};
use drift_engine::models::clip::{ClipRunOptions, ClipTextConfig, ClipTextModel};
use drift_engine::models::sd_graph::MemoryPlan;
use drift_engine::models::sd_weights::random_weights;
use drift_engine::models::unet::{Unet, sd15_config, unet_graph, unet_memory_plan};
use drift_engine::models::vae::{VaeConfig, VaeNet, decoder_memory_plan};
use drift_engine::profiler::Profiler;
use drift_engine::{DType, Gpu, Program};
use serde::Serialize;

use super::timing::time_sequence;

#[derive(clap::Args)]
pub struct SdBenchArgs {
    /// Only the memory plan (no weights, no GPU work).
    #[arg(long)]
    pub plan_only: bool,
    /// Scheduler steps for the total.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
}

#[derive(Serialize)]
pub struct SdBench {
    pub unet_plan: MemoryPlan,
    pub vae_plan: MemoryPlan,
    pub text_encoder_ms: Option<f64>,
    pub unet_step_ms: Option<f64>,
    pub vae_decode_ms: Option<f64>,
    pub total_ms: Option<f64>,
    /// The denoising loop as the pipeline runs it (per step: latents uploaded, UNet run, noise
    /// prediction read back), wall clock, plus the text encoder and VAE GPU times.
    pub total_wall_ms: Option<f64>,
    pub peak_vram_bytes: Option<u64>,
    /// Where a UNet step and the VAE decode spend GPU time: (kernel, calls, microseconds), from one
    /// profiled run each (per-dispatch timestamps).
    pub unet_top_kernels: Vec<(String, usize, f64)>,
    pub vae_top_kernels: Vec<(String, usize, f64)>,
}

fn top_kernels(gpu: &Gpu, p: &Program, n: usize) -> Result<Vec<(String, usize, f64)>> {
    Ok(p.run_profiled(gpu, &mut Profiler::new())?
        .by_kernel()
        .into_iter()
        .take(n)
        .map(|k| (k.name, k.calls, k.total_us))
        .collect())
}

pub fn run(gpu: &Gpu, shape: &str, random_weights_flag: bool, a: &SdBenchArgs) -> Result<SdBench> {
    if shape != "sd15" {
        bail!("unknown shape {shape}: sd15");
    }
    let dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let cfg = sd15_config();
    let vae_cfg = VaeConfig::sd15();
    let unet_plan = unet_memory_plan(&cfg, 2, 64, 64, 77, dtype)?;
    let vae_plan = decoder_memory_plan(&vae_cfg, 1, 64, 64, dtype)?;
    let mut r = SdBench {
        unet_plan,
        vae_plan,
        text_encoder_ms: None,
        unet_step_ms: None,
        vae_decode_ms: None,
        total_ms: None,
        total_wall_ms: None,
        peak_vram_bytes: None,
        unet_top_kernels: vec![],
        vae_top_kernels: vec![],
    };
    if a.plan_only {
        return Ok(r);
    }
    if !random_weights_flag {
        bail!("drift bench sd needs --random-weights (it measures the SD 1.5 shapes, not a file)");
    }
    let clip = ClipTextModel::random(gpu, ClipTextConfig::sd15(), Some(dtype), 1)?;
    let text = clip.build(
        gpu,
        2,
        &ClipRunOptions {
            clip_skip: 0,
            seq_len: None,
            out_dtype: None,
        },
    )?;
    let text_us = time_sequence(gpu, &text.program.dispatches, 5)?;
    let (graph, io) = unet_graph(&cfg, 2, 64, 64, 77, dtype)?;
    let weights = random_weights(gpu, &graph.weights, dtype, 2)?;
    let unet = Unet::with_weights(gpu, cfg, graph, io, weights)?;
    unet.set_timestep(gpu, 500.0)?;
    let unet_us = time_sequence(gpu, &unet.built.program.dispatches, 3)?;
    let vae = VaeNet::decoder_random(gpu, &vae_cfg, (1, 64, 64), dtype, 3)?;
    let vae_us = time_sequence(gpu, &vae.built.program.dispatches, 3)?;
    r.text_encoder_ms = Some(text_us / 1e3);
    r.unet_step_ms = Some(unet_us / 1e3);
    r.vae_decode_ms = Some(vae_us / 1e3);
    r.total_ms = Some((text_us + a.steps as f64 * unet_us + vae_us) / 1e3);
    let latents = vec![0.0f32; unet.latents()?.numel()];
    unet.forward(gpu, &latents, 999.0)?; // warm-up
    let t = std::time::Instant::now();
    for i in 0..a.steps {
        unet.forward(gpu, &latents, 999.0 - 50.0 * i as f32)?;
    }
    let loop_us = t.elapsed().as_secs_f64() * 1e6;
    r.total_wall_ms = Some((text_us + loop_us + vae_us) / 1e3);
    r.peak_vram_bytes = Some(gpu.memory_report().peak_total_bytes);
    r.unet_top_kernels = top_kernels(gpu, &unet.built.program, 12)?;
    r.vae_top_kernels = top_kernels(gpu, &vae.built.program, 6)?;
    Ok(r)
}

pub fn print(r: &SdBench, steps: usize) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("SD 1.5, 512x512");
    for (name, p) in [
        ("UNet (batch 2)", &r.unet_plan),
        ("VAE decoder", &r.vae_plan),
    ] {
        println!(
            "  {name}: {} ops, activations naive {:.1} MiB -> planned {:.1} MiB (+ {:.1} MiB conv split-K scratch, {:.1} MiB inputs/outputs)",
            p.ops,
            mib(p.naive_bytes),
            mib(p.planned_bytes),
            mib(p.conv_scratch_bytes),
            mib(p.io_bytes)
        );
    }
    if let (Some(t), Some(u), Some(v), Some(total)) = (
        r.text_encoder_ms,
        r.unet_step_ms,
        r.vae_decode_ms,
        r.total_ms,
    ) {
        println!(
            "  text encoder {t:.2} ms, UNet step {u:.2} ms, VAE decode {v:.2} ms; {steps} steps: {total:.0} ms"
        );
        if let Some(w) = r.total_wall_ms {
            println!(
                "  with the denoising loop as the pipeline runs it (upload, run, read back per step, wall clock): {w:.0} ms"
            );
        }
    }
    if let Some(p) = r.peak_vram_bytes {
        println!("  peak GPU memory {:.0} MiB", mib(p));
    }
    for (what, top) in [
        ("UNet step", &r.unet_top_kernels),
        ("VAE decode", &r.vae_top_kernels),
    ] {
        if !top.is_empty() {
            println!("  {what} under the profiler (per-dispatch timestamps):");
        }
        for (k, calls, us) in top {
            println!("    {k:<44} {:>8.2} ms in {calls} calls", us / 1e3);
        }
    }
}
