//! `drift image`: text-to-image (and img2img) with a Stable Diffusion 1.x model: a diffusers folder
//! or a single-file `.safetensors` checkpoint (pickle `.ckpt`/`.pt`/`.bin`/`.pth` files are refused).

use std::path::PathBuf;

use anyhow::{Context, Result};
use drift_engine::diffusion::image::{load_png, save_png};
use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline};
use drift_engine::diffusion::schedulers::SchedulerKind;
use drift_engine::formats::safetensors::SafetensorsSet;
use drift_engine::{Gpu, GpuOptions};

#[derive(clap::Args)]
pub struct ImageArgs {
    /// A diffusers folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/, scheduler/) or a
    /// single-file SD 1.x checkpoint (.safetensors with the original LDM key names; its tokenizer
    /// comes from CLIP's bpe_simple_vocab_16e6.txt.gz: $DRIFT_CLIP_VOCAB or ~/.cache/drift/clip/).
    /// Pickle checkpoints (.ckpt, .pt, .bin, .pth) are refused: they can run code when loaded.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value = "")]
    negative: String,
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 7.5)]
    cfg: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 512)]
    width: usize,
    #[arg(long, default_value_t = 512)]
    height: usize,
    /// euler, euler-a, ddim, dpmpp-2m, dpmpp-2m-karras, lcm
    #[arg(long, default_value = "euler-a")]
    scheduler: String,
    /// img2img: start from this PNG (the output's size).
    #[arg(long)]
    init: Option<PathBuf>,
    /// img2img: how much of the init image to repaint (0..=1).
    #[arg(long, default_value_t = 0.75)]
    strength: f32,
    /// Initial noise from a safetensors file (tensor `latents`, [4, h/8, w/8]) instead of the seed.
    #[arg(long)]
    latents: Option<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Print one JSON object (timings per stage, output path) instead of progress.
    #[arg(long)]
    json: bool,
}

pub fn run(options: &GpuOptions, a: &ImageArgs) -> Result<()> {
    let gpu = Gpu::new(options)?;
    let scheduler = SchedulerKind::parse(&a.scheduler)?;
    if !(0.0..=1.0).contains(&a.strength) {
        anyhow::bail!("--strength must be between 0 and 1");
    }
    let mut pipe = SdPipeline::open(&gpu, &a.model, a.width, a.height)?;
    let init = a
        .init
        .as_deref()
        .map(load_png)
        .transpose()?
        .map(|img| (img, a.strength));
    let latents = match &a.latents {
        Some(p) => Some(
            SafetensorsSet::open(p)?
                .get("latents")
                .context("--latents file")?
                .to_f32()?,
        ),
        None => None,
    };
    let req = ImageRequest {
        prompt: a.prompt.clone(),
        negative: a.negative.clone(),
        steps: a.steps,
        cfg: a.cfg,
        seed: a.seed,
        scheduler,
        init,
        latents,
    };
    let json = a.json;
    let r = pipe.generate(&gpu, &req, &mut |step, total, _| {
        if !json {
            eprint!("\rstep {step}/{total}");
        }
        true
    })?;
    if !json {
        eprintln!();
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    save_png(&a.out, &r.image, Some(&r.parameters))?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "out": a.out, "times": r.times, "parameters": r.parameters.to_a1111(), "warnings": r.warnings,
            }))?
        );
    } else {
        println!(
            "{} ({}x{}): text {:.0} ms, UNet {:.1} ms/step, VAE {:.0} ms, total {:.0} ms",
            a.out.display(),
            a.width,
            a.height,
            r.times.text_encoder_ms,
            r.times.unet_ms_per_step,
            r.times.vae_decode_ms,
            r.times.total_ms
        );
    }
    Ok(())
}
