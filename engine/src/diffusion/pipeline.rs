//! Stable Diffusion 1.x text-to-image and img2img on the engine: CLIP text encoder (batch 2 for
//! classifier-free guidance), the UNet run once per scheduler step, the VAE decoder, all on one device.
//! Loads diffusers folders (model_index.json with text_encoder/, tokenizer/, unet/, vae/, scheduler/).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::diffusion::image::{Parameters, RgbImage, from_rgb, latent_preview, to_rgb};
use crate::diffusion::noise::Noise;
use crate::diffusion::schedulers::{Scheduler, SchedulerConfig, SchedulerKind};
use crate::error::{DriftError, Result};
use crate::gpu::Gpu;
use crate::models::clip::{ClipProgram, ClipRunOptions, ClipTextModel};
use crate::models::sd_weights::SdWeightSource;
use crate::models::unet::{Unet, UnetConfig};
use crate::models::vae::{VaeConfig, VaeNet, moments_mean};
use crate::tensor::DType;
use crate::tokenize::clip::ClipTokenizer;

/// One image request.
#[derive(Clone, Debug)]
pub struct ImageRequest {
    pub prompt: String,
    pub negative: String,
    pub steps: usize,
    pub cfg: f32,
    pub seed: u64,
    pub scheduler: SchedulerKind,
    /// img2img: the starting image (the pipeline's size) and how much of it to repaint (0..=1).
    pub init: Option<(RgbImage, f32)>,
    /// Initial noise `[4, h/8, w/8]` instead of Drift's seeded noise (to reproduce across tools).
    pub latents: Option<Vec<f32>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StageTimes {
    pub text_encoder_ms: f64,
    pub unet_ms_per_step: f64,
    pub vae_decode_ms: f64,
    pub total_ms: f64,
}

pub struct ImageResult {
    pub image: RgbImage,
    pub parameters: Parameters,
    pub times: StageTimes,
    pub warnings: Vec<String>,
}

pub struct SdPipeline {
    pub name: String,
    pub width: usize,
    pub height: usize,
    tokenizer: ClipTokenizer,
    clip: ClipProgram,
    _clip_model: ClipTextModel,
    unet: Unet,
    vae_cfg: VaeConfig,
    vae_source: SdWeightSource,
    decoder: VaeNet,
    encoder: Option<VaeNet>,
    scheduler_config: SchedulerConfig,
    dtype: DType,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))
}

impl SdPipeline {
    /// Opens a diffusers folder for images of `width` x `height` (multiples of the VAE's downscale, 8
    /// for SD 1.x).
    pub fn open(gpu: &Gpu, dir: &Path, width: usize, height: usize) -> Result<SdPipeline> {
        if !dir.join("model_index.json").is_file() {
            return Err(DriftError::Other(format!(
                "{} is not a diffusers pipeline folder (no model_index.json)",
                dir.display()
            )));
        }
        if width == 0 || height == 0 {
            return Err(DriftError::Other(format!("image size {width}x{height}")));
        }
        let dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        let tokenizer = ClipTokenizer::from_folder(&dir.join("tokenizer"))?;
        let clip_model = ClipTextModel::load(gpu, &dir.join("text_encoder"), Some(dtype))?;
        let clip = clip_model.build(
            gpu,
            2,
            &ClipRunOptions {
                clip_skip: 0,
                seq_len: None,
                out_dtype: Some(DType::F32),
            },
        )?;
        let vae_cfg = VaeConfig::from_json(&read(&dir.join("vae/config.json"))?)?;
        let vae_source = SdWeightSource::diffusers(&dir.join("vae"), true)?;
        let f = vae_cfg.downscale();
        if !width.is_multiple_of(f) || !height.is_multiple_of(f) {
            return Err(DriftError::Other(format!(
                "image size {width}x{height} must be a multiple of {f}"
            )));
        }
        let unet_cfg = UnetConfig::from_json(&read(&dir.join("unet/config.json"))?)?;
        let unet_src = SdWeightSource::diffusers(&dir.join("unet"), true)?;
        let ctx_len = clip_model.cfg.max_positions;
        let unet = Unet::new(
            gpu,
            unet_cfg,
            &unet_src,
            2,
            height / f,
            width / f,
            ctx_len,
            dtype,
        )?;
        let decoder = VaeNet::decoder(gpu, &vae_cfg, &vae_source, 1, height / f, width / f, dtype)?;
        let scheduler_config = SchedulerConfig::load(dir.join("scheduler/scheduler_config.json"))?;
        Ok(SdPipeline {
            name: dir
                .file_name()
                .map_or("model".into(), |n| n.to_string_lossy().into_owned()),
            width,
            height,
            tokenizer,
            clip,
            _clip_model: clip_model,
            unet,
            vae_cfg,
            vae_source,
            decoder,
            encoder: None,
            scheduler_config,
            dtype,
        })
    }

    fn latent_dims(&self) -> (usize, usize, usize) {
        let f = self.vae_cfg.downscale();
        (
            self.vae_cfg.latent_channels,
            self.height / f,
            self.width / f,
        )
    }

    /// Generates one image. `progress(step, steps, preview)` is called after every step; returning
    /// false cancels (an error saying so is returned).
    pub fn generate(
        &mut self,
        gpu: &Gpu,
        req: &ImageRequest,
        progress: &mut dyn FnMut(usize, usize, &RgbImage) -> bool,
    ) -> Result<ImageResult> {
        let t0 = Instant::now();
        let mut warnings = Vec::new();
        let (c, h, w) = self.latent_dims();
        let n = c * h * w;
        // Text: [negative, prompt] as diffusers batches them (unconditional first).
        let neg = self.tokenizer.encode(&req.negative)?;
        let pos = self.tokenizer.encode(&req.prompt)?;
        for e in [&pos, &neg] {
            warnings.extend(e.warning(77));
        }
        let enc = self.clip.run_f32(gpu, &[&neg.ids, &pos.ids])?;
        let text_ms = t0.elapsed().as_secs_f64() * 1e3;

        let mut sched = Scheduler::new(req.scheduler, &self.scheduler_config, req.steps)?;
        let noise = Noise::new(req.seed);
        let initial = match &req.latents {
            Some(l) if l.len() == n => l.clone(),
            Some(l) => {
                return Err(DriftError::Other(format!(
                    "--latents holds {} values, {n} expected",
                    l.len()
                )));
            }
            None => noise.latents(n),
        };
        let (mut latents, start) = match &req.init {
            Some((img, strength)) => {
                if img.width != self.width || img.height != self.height {
                    return Err(DriftError::Other(format!(
                        "the init image is {}x{}, the pipeline makes {}x{}",
                        img.width, img.height, self.width, self.height
                    )));
                }
                if self.encoder.is_none() {
                    self.encoder = Some(VaeNet::encoder(
                        gpu,
                        &self.vae_cfg,
                        &self.vae_source,
                        1,
                        self.height,
                        self.width,
                        self.dtype,
                    )?);
                }
                let moments = self
                    .encoder
                    .as_ref()
                    .expect("built above")
                    .run(gpu, &from_rgb(img))?;
                let clean: Vec<f32> = moments_mean(&moments, 1)
                    .iter()
                    .map(|v| v * self.vae_cfg.scaling_factor)
                    .collect();
                let start = sched.start_step(*strength as f64);
                (sched.add_noise(start, &clean, &initial)?, start)
            }
            None => {
                let s = sched.init_noise_sigma() as f32;
                (initial.iter().map(|v| v * s).collect(), 0)
            }
        };
        let t1 = Instant::now();
        let mut unet_in = vec![0.0f32; 2 * n];
        for step in start..req.steps {
            let scale = sched.scale_model_input(step);
            for (i, v) in latents.iter().enumerate() {
                unet_in[i] = v * scale;
                unet_in[n + i] = v * scale;
            }
            let t = sched.timesteps()[step] as f32;
            let eps = self.unet.forward(gpu, &unet_in, t, &enc)?;
            let guided: Vec<f32> = (0..n)
                .map(|i| eps[i] + req.cfg * (eps[n + i] - eps[i]))
                .collect();
            let step_noise = sched.needs_noise(step).then(|| noise.step(step, n));
            latents = sched.step(step, &guided, &latents, step_noise.as_deref())?;
            if !progress(step + 1, req.steps, &latent_preview(&latents, w, h)) {
                return Err(DriftError::Other("cancelled".into()));
            }
        }
        let steps_run = (req.steps - start).max(1);
        let unet_ms = t1.elapsed().as_secs_f64() * 1e3 / steps_run as f64;
        let t2 = Instant::now();
        let z: Vec<f32> = latents
            .iter()
            .map(|v| v / self.vae_cfg.scaling_factor)
            .collect();
        let rgb = self.decoder.run(gpu, &z)?;
        let image = to_rgb(&rgb, self.width, self.height)?;
        let vae_ms = t2.elapsed().as_secs_f64() * 1e3;
        Ok(ImageResult {
            image,
            parameters: Parameters {
                prompt: req.prompt.clone(),
                negative: req.negative.clone(),
                steps: req.steps,
                sampler: req.scheduler.a1111_name().into(),
                cfg: req.cfg,
                seed: req.seed,
                width: self.width,
                height: self.height,
                model: self.name.clone(),
            },
            times: StageTimes {
                text_encoder_ms: text_ms,
                unet_ms_per_step: unet_ms,
                vae_decode_ms: vae_ms,
                total_ms: t0.elapsed().as_secs_f64() * 1e3,
            },
            warnings,
        })
    }
}
