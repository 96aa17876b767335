//! Stable Diffusion 1.x text-to-image and img2img on the engine: CLIP text encoder (batch 2 for
//! classifier-free guidance), the UNet run once per scheduler step, the VAE decoder, all on one device.
//! Loads diffusers folders (model_index.json with text_encoder/, tokenizer/, unet/, vae/, scheduler/)
//! and single-file SD 1.x checkpoints (`.safetensors` with LDM key names, see [`single_file`]).
//!
//! [`single_file`]: crate::diffusion::single_file

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::diffusion::image::{Parameters, RgbImage, from_rgb, latent_preview, to_rgb};
use crate::diffusion::noise::Noise;
use crate::diffusion::schedulers::{Scheduler, SchedulerConfig, SchedulerKind};
use crate::diffusion::single_file::{SdCheckpoint, clip_vocab_path};
use crate::error::{DriftError, Result};
use crate::gpu::Gpu;
use crate::models::clip::{ClipProgram, ClipRunOptions, ClipTextModel};
use crate::models::sd_weights::{SdWeightSource, refuse_pickle};
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

/// What a pipeline is built from, wherever it came from (a diffusers folder or a single file).
struct Parts {
    name: String,
    tokenizer: ClipTokenizer,
    clip_model: ClipTextModel,
    unet_cfg: UnetConfig,
    unet_source: SdWeightSource,
    vae_cfg: VaeConfig,
    vae_source: SdWeightSource,
    scheduler_config: SchedulerConfig,
}

/// A diffusers folder: model_index.json with text_encoder/, tokenizer/, unet/, vae/, scheduler/.
fn folder_parts(gpu: &Gpu, dir: &Path, dtype: DType) -> Result<Parts> {
    if !dir.join("model_index.json").is_file() {
        return Err(DriftError::Other(format!(
            "{} is not a diffusers pipeline folder (no model_index.json)",
            dir.display()
        )));
    }
    Ok(Parts {
        name: dir
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned()),
        tokenizer: ClipTokenizer::from_folder(&dir.join("tokenizer"))?,
        clip_model: ClipTextModel::load(gpu, &dir.join("text_encoder"), Some(dtype))?,
        unet_cfg: UnetConfig::from_json(&read(&dir.join("unet/config.json"))?)?,
        unet_source: SdWeightSource::diffusers(&dir.join("unet"), true)?,
        vae_cfg: VaeConfig::from_json(&read(&dir.join("vae/config.json"))?)?,
        vae_source: SdWeightSource::diffusers(&dir.join("vae"), true)?,
        scheduler_config: SchedulerConfig::load(dir.join("scheduler/scheduler_config.json"))?,
    })
}

/// A single-file SD 1.x checkpoint (LDM key names); configs from its shapes, the tokenizer from
/// CLIP's vocabulary file (see [`clip_vocab_path`]).
fn single_file_parts(gpu: &Gpu, path: &Path, dtype: DType) -> Result<Parts> {
    let (ckpt, set) = SdCheckpoint::open(path)?;
    let tokenizer = ClipTokenizer::from_bpe_file(&clip_vocab_path()?)?;
    let needed = tokenizer.bos.max(tokenizer.eos).max(tokenizer.pad) as usize + 1;
    if ckpt.clip.vocab_size < needed {
        return Err(DriftError::Other(format!(
            "{}: the text encoder has {} token embeddings; SD 1.x's CLIP tokenizer needs {needed}",
            path.display(),
            ckpt.clip.vocab_size
        )));
    }
    let clip_model =
        ClipTextModel::from_weights(gpu, ckpt.clip.clone(), &set, &ckpt.clip_prefix, Some(dtype))?;
    Ok(Parts {
        name: path
            .file_stem()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned()),
        tokenizer,
        clip_model,
        unet_source: SdWeightSource::single_file(path, ckpt.unet.ldm_part())?,
        vae_source: SdWeightSource::single_file(path, ckpt.vae.ldm_part())?,
        unet_cfg: ckpt.unet,
        vae_cfg: ckpt.vae,
        scheduler_config: ckpt.scheduler,
    })
}

impl SdPipeline {
    /// Opens a Stable Diffusion 1.x model for images of `width` x `height` (multiples of the VAE's
    /// downscale, 8 for SD 1.x): a diffusers folder, or a single-file `.safetensors` checkpoint with
    /// the original LDM key names. Pickle checkpoints (`.ckpt`, `.pt`, `.bin`, `.pth`) are refused.
    pub fn open(gpu: &Gpu, path: &Path, width: usize, height: usize) -> Result<SdPipeline> {
        if width == 0 || height == 0 {
            return Err(DriftError::Other(format!("image size {width}x{height}")));
        }
        refuse_pickle(path)?;
        let dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        let parts = if path.is_dir() {
            folder_parts(gpu, path, dtype)?
        } else if path.is_file() {
            single_file_parts(gpu, path, dtype)?
        } else {
            return Err(DriftError::Other(format!(
                "{} does not exist",
                path.display()
            )));
        };
        Self::from_parts(gpu, parts, width, height, dtype)
    }

    fn from_parts(
        gpu: &Gpu,
        parts: Parts,
        width: usize,
        height: usize,
        dtype: DType,
    ) -> Result<SdPipeline> {
        let f = parts.vae_cfg.downscale();
        if !width.is_multiple_of(f) || !height.is_multiple_of(f) {
            return Err(DriftError::Other(format!(
                "image size {width}x{height} must be a multiple of {f}"
            )));
        }
        let clip = parts.clip_model.build(
            gpu,
            2,
            &ClipRunOptions {
                clip_skip: 0,
                seq_len: None,
                out_dtype: Some(DType::F32),
            },
        )?;
        let ctx_len = parts.clip_model.cfg.max_positions;
        let unet = Unet::new(
            gpu,
            parts.unet_cfg,
            &parts.unet_source,
            2,
            height / f,
            width / f,
            ctx_len,
            dtype,
        )?;
        let decoder = VaeNet::decoder(
            gpu,
            &parts.vae_cfg,
            &parts.vae_source,
            1,
            height / f,
            width / f,
            dtype,
        )?;
        Ok(SdPipeline {
            name: parts.name,
            width,
            height,
            tokenizer: parts.tokenizer,
            clip,
            _clip_model: parts.clip_model,
            unet,
            vae_cfg: parts.vae_cfg,
            vae_source: parts.vae_source,
            decoder,
            encoder: None,
            scheduler_config: parts.scheduler_config,
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
        self.unet.set_encoder_states(gpu, &enc)?;
        let t1 = Instant::now();
        let mut unet_in = vec![0.0f32; 2 * n];
        for step in start..req.steps {
            let scale = sched.scale_model_input(step);
            for (i, v) in latents.iter().enumerate() {
                unet_in[i] = v * scale;
                unet_in[n + i] = v * scale;
            }
            let t = sched.timesteps()[step] as f32;
            let eps = self.unet.forward(gpu, &unet_in, t)?;
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

/// For the app: the last image as a GPU texture for display, and GPU timings of one UNet step.
impl SdPipeline {
    /// The image the VAE decoded last (by [`SdPipeline::generate`]), packed on the GPU into an RGBA8
    /// texture for display without a CPU round trip.
    pub fn decoded_texture(&self, gpu: &Gpu) -> Result<crate::diffusion::display::DisplayTexture> {
        crate::diffusion::display::pack_rgba8(gpu, self.decoder.output()?, self.width, self.height)
    }

    /// Per-dispatch GPU timings of one UNet evaluation (batch 2 for CFG) on the inputs of the last step
    /// run; call it between images (the next image writes fresh inputs).
    pub fn profile_unet_step(&mut self, gpu: &Gpu) -> Result<crate::profiler::Profile> {
        crate::profiler::Profiler::new().run(gpu, &self.unet.built.program)
    }
}
