//! Noise schedulers for Stable Diffusion, built from a diffusers `scheduler/scheduler_config.json`.
//!
//! Each [`SchedulerKind`] reproduces the diffusers class of the same name as a diffusers pipeline
//! uses it (`Class.from_config(model's scheduler config)`): keys the config lacks take that class's
//! default, exactly as diffusers does, so SD 1.5's PNDM-style config (no `timestep_spacing`) gives
//! linspace spacing for Euler and DPM++ but leading spacing for DDIM. The tests compare timesteps,
//! sigmas and step results with diffusers 0.42 (engine/tests/fixtures/make_scheduler_fixtures.py).
//!
//! Precision: the trained schedule (`alphas_cumprod`) is formed as diffusers forms it, in f32
//! (betas and `1 - beta` rounded to f32, the running product accumulated in f64 and rounded to f32,
//! as torch's CPU `cumprod` does); SD checkpoints were trained against those f32 values, and near
//! t = 0 where `1 - alphas_cumprod` is tiny the f32 rounding of `1 - beta` is a 1e-4 relative effect,
//! so it is kept. Everything after that (sigmas, timesteps, the update rules) runs in f64, and the
//! updated latents are rounded to f32 once.
//!
//! Use, text-to-image:
//! ```ignore
//! let mut s = Scheduler::new(SchedulerKind::Euler, &config, 20)?;
//! let mut x: Vec<f32> = noise.latents(n).iter().map(|v| v * s.init_noise_sigma() as f32).collect();
//! for k in 0..s.num_steps() {
//!     let scale = s.scale_model_input(k);          // UNet input is x * scale
//!     let eps = unet(x * scale, s.timesteps()[k]);   // after classifier-free guidance
//!     let z = s.needs_noise(k).then(|| noise.step(k, n));
//!     x = s.step(k, &eps, &x, z.as_deref())?;
//! }
//! ```
//! img2img: `let k0 = s.start_step(strength)`, `x = s.add_noise(k0, &image_latents, &noise)?`, then
//! the same loop from `k0`.

use std::path::Path;

use serde::Deserialize;

use crate::error::{DriftError, Result};

/// The schedulers Drift offers, named as the CLI names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// diffusers `EulerDiscreteScheduler` (Karras sigmas when the config asks for them).
    Euler,
    /// diffusers `EulerAncestralDiscreteScheduler`: fresh noise at every step.
    EulerAncestral,
    /// diffusers `DDIMScheduler` with eta 0 (deterministic).
    Ddim,
    /// diffusers `DPMSolverMultistepScheduler`, dpmsolver++, order 2, midpoint.
    DpmPp2m,
    /// As [`SchedulerKind::DpmPp2m`] with `use_karras_sigmas`.
    DpmPp2mKarras,
    /// diffusers `LCMScheduler` (latent consistency models): fresh noise at every step but the last.
    Lcm,
}

impl SchedulerKind {
    pub const ALL: [SchedulerKind; 6] = [
        SchedulerKind::Euler,
        SchedulerKind::EulerAncestral,
        SchedulerKind::Ddim,
        SchedulerKind::DpmPp2m,
        SchedulerKind::DpmPp2mKarras,
        SchedulerKind::Lcm,
    ];

    /// The CLI name: `euler`, `euler-a`, `ddim`, `dpmpp-2m`, `dpmpp-2m-karras`, `lcm`.
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Euler => "euler",
            SchedulerKind::EulerAncestral => "euler-a",
            SchedulerKind::Ddim => "ddim",
            SchedulerKind::DpmPp2m => "dpmpp-2m",
            SchedulerKind::DpmPp2mKarras => "dpmpp-2m-karras",
            SchedulerKind::Lcm => "lcm",
        }
    }

    /// The sampler name AUTOMATIC1111 writes into its `parameters` text (`Sampler: ...`).
    pub fn a1111_name(self) -> &'static str {
        match self {
            SchedulerKind::Euler => "Euler",
            SchedulerKind::EulerAncestral => "Euler a",
            SchedulerKind::Ddim => "DDIM",
            SchedulerKind::DpmPp2m => "DPM++ 2M",
            SchedulerKind::DpmPp2mKarras => "DPM++ 2M Karras",
            SchedulerKind::Lcm => "LCM",
        }
    }

    /// Parses a CLI name (also accepts `_` for `-` and the A1111 names, case-insensitively).
    pub fn parse(name: &str) -> Result<Self> {
        let n = name.trim().to_ascii_lowercase().replace(['_', ' '], "-");
        let kind = match n.as_str() {
            "euler" => SchedulerKind::Euler,
            "euler-a" | "euler-ancestral" => SchedulerKind::EulerAncestral,
            "ddim" => SchedulerKind::Ddim,
            "dpmpp-2m" | "dpm++-2m" => SchedulerKind::DpmPp2m,
            "dpmpp-2m-karras" | "dpm++-2m-karras" => SchedulerKind::DpmPp2mKarras,
            "lcm" => SchedulerKind::Lcm,
            _ => {
                return Err(DriftError::Unsupported(format!(
                    "scheduler '{name}': expected one of euler, euler-a, ddim, dpmpp-2m, \
                     dpmpp-2m-karras, lcm"
                )));
            }
        };
        Ok(kind)
    }

    fn class(self) -> Class {
        match self {
            SchedulerKind::Euler => Class::Euler,
            SchedulerKind::EulerAncestral => Class::EulerAncestral,
            SchedulerKind::Ddim => Class::Ddim,
            SchedulerKind::DpmPp2m | SchedulerKind::DpmPp2mKarras => Class::Dpm,
            SchedulerKind::Lcm => Class::Lcm,
        }
    }
}

impl std::fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Euler,
    EulerAncestral,
    Ddim,
    Dpm,
    Lcm,
}

/// A diffusers `scheduler_config.json`. Every key is optional: a missing key takes the default of
/// the scheduler class it is given to, as in diffusers' `from_config`. Unknown keys are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    #[serde(rename = "_class_name")]
    pub class_name: Option<String>,
    pub num_train_timesteps: Option<usize>,
    pub beta_start: Option<f64>,
    pub beta_end: Option<f64>,
    /// `linear`, `scaled_linear` or `squaredcos_cap_v2`.
    pub beta_schedule: Option<String>,
    pub trained_betas: Option<Vec<f64>>,
    /// `epsilon`, `v_prediction` or `sample`.
    pub prediction_type: Option<String>,
    /// `leading`, `trailing` or `linspace`.
    pub timestep_spacing: Option<String>,
    pub steps_offset: Option<i64>,
    pub set_alpha_to_one: Option<bool>,
    pub clip_sample: Option<bool>,
    pub clip_sample_range: Option<f64>,
    pub thresholding: Option<bool>,
    pub rescale_betas_zero_snr: Option<bool>,
    pub use_karras_sigmas: Option<bool>,
    pub use_exponential_sigmas: Option<bool>,
    pub use_beta_sigmas: Option<bool>,
    pub use_lu_lambdas: Option<bool>,
    pub sigma_min: Option<f64>,
    pub sigma_max: Option<f64>,
    /// `zero` or `sigma_min`.
    pub final_sigmas_type: Option<String>,
    pub interpolation_type: Option<String>,
    pub timestep_type: Option<String>,
    pub lower_order_final: Option<bool>,
    pub euler_at_final: Option<bool>,
    pub lambda_min_clipped: Option<f64>,
    pub original_inference_steps: Option<usize>,
    pub timestep_scaling: Option<f64>,
}

impl SchedulerConfig {
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|e| DriftError::Other(format!("scheduler_config.json is not valid: {e}")))
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| DriftError::Other(format!("cannot read {}: {e}", path.display())))?;
        Self::from_json(&text)
    }
}

/// What the UNet predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prediction {
    Epsilon,
    VPrediction,
    Sample,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spacing {
    Leading,
    Trailing,
    Linspace,
}

/// A scheduler set up for a number of inference steps. Stateless between steps except for
/// DPM++ 2M, which remembers the previous step's denoised estimate (see [`Scheduler::step`]).
#[derive(Debug, Clone)]
pub struct Scheduler {
    kind: SchedulerKind,
    prediction: Prediction,
    /// The trained schedule, index = training timestep (f32 values, see the module docs).
    alphas_cumprod: Vec<f64>,
    timesteps: Vec<f64>,
    /// Noise level per step plus the final one (`num_steps + 1` entries).
    sigmas: Vec<f64>,
    init_noise_sigma: f64,
    /// DDIM / LCM: alphas_cumprod used past t = 0.
    final_alpha_cumprod: f64,
    /// DDIM / LCM: clamp of the predicted clean sample.
    clip: Option<f64>,
    /// DDIM: the previous timestep is `t - prev_offset` (diffusers: train // steps).
    prev_offset: i64,
    timestep_scaling: f64,
    /// DPM++: take a first-order last step (diffusers' flags of the same names).
    lower_order_final: bool,
    euler_at_final: bool,
    /// DPM++: the step index and x0 estimate of the last step taken.
    history: Option<(usize, Vec<f64>)>,
}

impl Scheduler {
    /// Sets up `kind` for `steps` inference steps from a model's scheduler config.
    pub fn new(kind: SchedulerKind, config: &SchedulerConfig, steps: usize) -> Result<Self> {
        let class = kind.class();
        let unsupported = |what: String| Err(DriftError::Unsupported(format!("scheduler: {what}")));
        if config.thresholding == Some(true) {
            return unsupported("dynamic thresholding (thresholding: true)".into());
        }
        if let Some(t) = &config.interpolation_type
            && t != "linear"
        {
            return unsupported(format!("interpolation_type '{t}'"));
        }
        if let Some(t) = &config.timestep_type
            && t != "discrete"
        {
            return unsupported(format!("timestep_type '{t}'"));
        }
        for (flag, name) in [
            (config.use_exponential_sigmas, "use_exponential_sigmas"),
            (config.use_beta_sigmas, "use_beta_sigmas"),
            (config.use_lu_lambdas, "use_lu_lambdas"),
        ] {
            if flag == Some(true) && matches!(class, Class::Euler | Class::Dpm) {
                return unsupported(name.into());
            }
        }

        let train = config.num_train_timesteps.unwrap_or(1000);
        if train < 2 {
            return Err(DriftError::Other(format!(
                "scheduler: num_train_timesteps {train} must be at least 2"
            )));
        }
        if steps == 0 || steps > train {
            return Err(DriftError::Other(format!(
                "scheduler: {steps} steps; expected 1..={train} (num_train_timesteps)"
            )));
        }
        let lcm = class == Class::Lcm;
        let prediction = match config.prediction_type.as_deref().unwrap_or("epsilon") {
            "epsilon" => Prediction::Epsilon,
            "v_prediction" => Prediction::VPrediction,
            "sample" => Prediction::Sample,
            p => return unsupported(format!("prediction_type '{p}'")),
        };
        let default_spacing = match class {
            Class::Ddim | Class::Lcm => "leading",
            _ => "linspace",
        };
        let spacing = match config
            .timestep_spacing
            .as_deref()
            .unwrap_or(default_spacing)
        {
            "leading" => Spacing::Leading,
            "trailing" => Spacing::Trailing,
            "linspace" => Spacing::Linspace,
            s => return unsupported(format!("timestep_spacing '{s}'")),
        };
        let offset = config.steps_offset.unwrap_or(0);

        // The trained schedule. LCM's class defaults are SD's schedule, the others' DDPM's.
        let (d_start, d_end, d_schedule) = if lcm {
            (0.00085, 0.012, "scaled_linear")
        } else {
            (0.0001, 0.02, "linear")
        };
        let mut betas: Vec<f32> = if let Some(b) = &config.trained_betas {
            if b.len() != train {
                return Err(DriftError::Other(format!(
                    "scheduler: trained_betas has {} values for {train} timesteps",
                    b.len()
                )));
            }
            b.iter().map(|&v| v as f32).collect()
        } else {
            let start = config.beta_start.unwrap_or(d_start);
            let end = config.beta_end.unwrap_or(d_end);
            match config.beta_schedule.as_deref().unwrap_or(d_schedule) {
                "linear" => linspace(start, end, train).map(|v| v as f32).collect(),
                "scaled_linear" => linspace(start.sqrt(), end.sqrt(), train)
                    .map(|v| {
                        let r = v as f32;
                        r * r
                    })
                    .collect(),
                "squaredcos_cap_v2" => cosine_betas(train),
                s => return unsupported(format!("beta_schedule '{s}'")),
            }
        };
        let zsnr = config.rescale_betas_zero_snr.unwrap_or(false);
        if zsnr {
            betas = rescale_zero_terminal_snr(&betas);
        }
        let mut alphas_cumprod = Vec::with_capacity(train);
        let mut acc = 1.0f64;
        for &b in &betas {
            acc *= (1.0f32 - b) as f64;
            alphas_cumprod.push(acc as f32 as f64);
        }
        if zsnr && matches!(class, Class::Euler | Class::EulerAncestral | Class::Dpm) {
            // diffusers keeps the first sigma finite (fp16's smallest subnormal).
            alphas_cumprod[train - 1] = 2f64.powi(-24);
        }
        let final_alpha_cumprod = if config.set_alpha_to_one.unwrap_or(true) {
            1.0
        } else {
            alphas_cumprod[0]
        };
        let full_sigmas: Vec<f64> = alphas_cumprod
            .iter()
            .map(|&a| ((1.0 - a) / a).sqrt())
            .collect();
        let log_sigmas: Vec<f64> = full_sigmas.iter().map(|s| s.ln()).collect();
        let sigma_last = match config.final_sigmas_type.as_deref().unwrap_or("zero") {
            "zero" => 0.0,
            "sigma_min" => full_sigmas[0],
            s => return unsupported(format!("final_sigmas_type '{s}'")),
        };
        let interp = |t: f64| interp(t, &full_sigmas);
        let karras = |lo: f64, hi: f64| {
            let lo = config.sigma_min.unwrap_or(lo);
            let hi = config.sigma_max.unwrap_or(hi);
            karras_sigmas(lo, hi, steps)
        };

        let mut init_noise_sigma = 1.0;
        let mut prev_offset = 0;
        let (timesteps, mut sigmas): (Vec<f64>, Vec<f64>) = match class {
            Class::Euler | Class::EulerAncestral => {
                let timesteps: Vec<f64> = match spacing {
                    Spacing::Linspace => linspace(0.0, (train - 1) as f64, steps).rev().collect(),
                    Spacing::Leading => {
                        let ratio = (train / steps) as i64;
                        (0..steps as i64)
                            .rev()
                            .map(|i| (i * ratio + offset) as f64)
                            .collect()
                    }
                    Spacing::Trailing => trailing(train, train, steps),
                };
                let sigmas: Vec<f64> = timesteps.iter().map(|&t| interp(t)).collect();
                let karras_on = class == Class::Euler && config.use_karras_sigmas == Some(true);
                let (timesteps, mut sigmas) = if karras_on {
                    let s = karras(sigmas[steps - 1], sigmas[0]);
                    (s.iter().map(|&s| sigma_to_t(s, &log_sigmas)).collect(), s)
                } else {
                    (timesteps, sigmas)
                };
                // Euler ancestral always ends at zero.
                sigmas.push(if class == Class::Euler {
                    sigma_last
                } else {
                    0.0
                });
                let max = sigmas.iter().fold(0.0f64, |m, &s| m.max(s));
                init_noise_sigma = match spacing {
                    Spacing::Linspace | Spacing::Trailing => max,
                    Spacing::Leading => (max * max + 1.0).sqrt(),
                };
                (timesteps, sigmas)
            }
            Class::Dpm => {
                let last = match config.lambda_min_clipped {
                    Some(l) if l > f64::NEG_INFINITY => {
                        // searchsorted over lambda(t) in increasing order (t decreasing).
                        let clipped = alphas_cumprod
                            .iter()
                            .rev()
                            .filter(|&&a| 0.5 * (a.ln() - (1.0 - a).ln()) < l)
                            .count();
                        train - clipped
                    }
                    _ => train,
                };
                let timesteps: Vec<f64> = match spacing {
                    Spacing::Linspace => linspace(0.0, (last - 1) as f64, steps + 1)
                        .map(|v| v.round_ties_even())
                        .rev()
                        .take(steps)
                        .collect(),
                    Spacing::Leading => {
                        let ratio = (last / (steps + 1)) as i64;
                        (1..=steps as i64)
                            .rev()
                            .map(|i| (i * ratio + offset) as f64)
                            .collect()
                    }
                    Spacing::Trailing => trailing(train, last, steps),
                };
                if kind == SchedulerKind::DpmPp2mKarras {
                    let s = karras(full_sigmas[0], full_sigmas[train - 1]);
                    let round = config.beta_schedule.as_deref() != Some("squaredcos_cap_v2");
                    let t = s
                        .iter()
                        .map(|&s| {
                            let t = sigma_to_t(s, &log_sigmas);
                            if round {
                                t.round_ties_even()
                            } else {
                                t.trunc()
                            }
                        })
                        .collect();
                    (t, s.into_iter().chain([sigma_last]).collect())
                } else {
                    let s = timesteps
                        .iter()
                        .map(|&t| interp(t))
                        .chain([sigma_last])
                        .collect();
                    (timesteps, s)
                }
            }
            Class::Ddim => {
                let timesteps: Vec<f64> = match spacing {
                    Spacing::Linspace => linspace(0.0, (train - 1) as f64, steps)
                        .map(|v| v.round_ties_even())
                        .rev()
                        .collect(),
                    Spacing::Leading => {
                        let ratio = (train / steps) as i64;
                        (0..steps as i64)
                            .rev()
                            .map(|i| (i * ratio + offset) as f64)
                            .collect()
                    }
                    Spacing::Trailing => trailing(train, train, steps),
                };
                prev_offset = (train / steps) as i64;
                let s = timesteps.iter().map(|&t| interp(t)).chain([0.0]).collect();
                (timesteps, s)
            }
            Class::Lcm => {
                let original = config.original_inference_steps.unwrap_or(50);
                if original == 0 || original > train || steps > original {
                    return Err(DriftError::Other(format!(
                        "LCM: {steps} steps with original_inference_steps {original}; expected \
                         steps <= original_inference_steps <= {train}"
                    )));
                }
                let k = train / original;
                // The distillation schedule k-1, 2k-1, ..., descending, sampled at `steps` points.
                let origin: Vec<i64> = (1..=original as i64)
                    .rev()
                    .map(|i| i * k as i64 - 1)
                    .collect();
                let timesteps: Vec<f64> = (0..steps)
                    .map(|i| {
                        let idx = (i as f64 * (original as f64 / steps as f64)).floor() as usize;
                        origin[idx.min(original - 1)] as f64
                    })
                    .collect();
                let s = timesteps.iter().map(|&t| interp(t)).chain([0.0]).collect();
                (timesteps, s)
            }
        };
        let n = timesteps.len();
        if n != steps {
            return Err(DriftError::Other(format!(
                "scheduler: {steps} steps produced {n} timesteps (num_train_timesteps {train})"
            )));
        }
        for &t in &timesteps {
            let interpolated_only = matches!(class, Class::Euler | Class::EulerAncestral);
            if !(0.0..=(train - 1) as f64).contains(&t) && !interpolated_only {
                return Err(DriftError::Other(format!(
                    "scheduler: timestep {t} outside 0..{train} (steps_offset {offset}?)"
                )));
            }
        }
        sigmas.truncate(n + 1);
        let clip = match class {
            Class::Ddim | Class::Lcm => {
                let default = class == Class::Ddim;
                config
                    .clip_sample
                    .unwrap_or(default)
                    .then(|| config.clip_sample_range.unwrap_or(1.0))
            }
            _ => None,
        };
        Ok(Self {
            kind,
            prediction,
            alphas_cumprod,
            timesteps,
            sigmas,
            init_noise_sigma,
            final_alpha_cumprod,
            clip,
            prev_offset,
            timestep_scaling: config.timestep_scaling.unwrap_or(10.0),
            lower_order_final: config.lower_order_final.unwrap_or(true),
            euler_at_final: config.euler_at_final.unwrap_or(false),
            history: None,
        })
    }

    pub fn kind(&self) -> SchedulerKind {
        self.kind
    }

    pub fn prediction(&self) -> Prediction {
        self.prediction
    }

    pub fn num_steps(&self) -> usize {
        self.timesteps.len()
    }

    /// The UNet's timestep input for each step (fractional for Euler with linspace spacing or
    /// Karras sigmas, whole numbers otherwise).
    pub fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    /// The noise level sigma = sqrt((1 - alpha_bar) / alpha_bar) of each step plus the final level
    /// (`num_steps + 1` values). For DDIM and LCM these are informative only (interpolated at the
    /// timesteps, final 0).
    pub fn sigmas(&self) -> &[f64] {
        &self.sigmas
    }

    /// The trained cumulative alpha product, index = training timestep.
    pub fn alphas_cumprod(&self) -> &[f64] {
        &self.alphas_cumprod
    }

    /// Standard deviation of the initial latents: multiply unit Gaussian noise by this.
    pub fn init_noise_sigma(&self) -> f64 {
        self.init_noise_sigma
    }

    /// The factor the latents are multiplied by before they go into the UNet at `step`:
    /// 1 / sqrt(sigma^2 + 1) for the Euler schedulers, 1 for the others.
    pub fn scale_model_input(&self, step: usize) -> f32 {
        match self.kind.class() {
            Class::Euler | Class::EulerAncestral => {
                let s = self.sigmas[step.min(self.sigmas.len() - 1)];
                (1.0 / (s * s + 1.0).sqrt()) as f32
            }
            _ => 1.0,
        }
    }

    /// Whether [`Scheduler::step`] needs a noise tensor at `step`.
    pub fn needs_noise(&self, step: usize) -> bool {
        match self.kind.class() {
            Class::EulerAncestral => true,
            Class::Lcm => step + 1 < self.num_steps(),
            _ => false,
        }
    }

    /// The first step img2img runs for `strength` in [0, 1] (1 = from pure noise, all steps):
    /// `steps - floor(steps * strength)`, as diffusers' img2img pipeline computes it.
    pub fn start_step(&self, strength: f64) -> usize {
        let n = self.num_steps();
        let strength = if strength.is_nan() {
            1.0
        } else {
            strength.clamp(0.0, 1.0)
        };
        let init = ((n as f64 * strength) as usize).min(n);
        n - init
    }

    /// Noises clean latents `original` to the level of `step` (img2img's starting point):
    /// `x + sigma * noise` for the Euler schedulers, `sqrt(a) x + sqrt(1 - a) noise` otherwise.
    pub fn add_noise(&self, step: usize, original: &[f32], noise: &[f32]) -> Result<Vec<f32>> {
        self.check_step(step)?;
        check_len("noise", noise.len(), original.len())?;
        let (a, b) = match self.kind.class() {
            Class::Euler | Class::EulerAncestral => (1.0, self.sigmas[step]),
            Class::Dpm => {
                let (alpha, sigma) = alpha_sigma(self.sigmas[step]);
                (alpha, sigma)
            }
            Class::Ddim | Class::Lcm => {
                let ac = self.alphas_cumprod[self.timesteps[step] as usize];
                (ac.sqrt(), (1.0 - ac).sqrt())
            }
        };
        Ok(original
            .iter()
            .zip(noise)
            .map(|(&x, &z)| (a * x as f64 + b * z as f64) as f32)
            .collect())
    }

    /// Forgets DPM++'s multistep history (call before reusing the scheduler for a new image;
    /// stepping from step 0 or from a step that does not follow the last one also starts afresh).
    pub fn reset(&mut self) {
        self.history = None;
    }

    /// One denoising step: from the latents `sample` at `step` and the UNet's output for them (after
    /// classifier-free guidance), the latents at `step + 1`. `noise` (unit Gaussian, same length)
    /// is required where [`Scheduler::needs_noise`] says so and ignored elsewhere.
    pub fn step(
        &mut self,
        step: usize,
        model_output: &[f32],
        sample: &[f32],
        noise: Option<&[f32]>,
    ) -> Result<Vec<f32>> {
        self.check_step(step)?;
        check_len("model output", model_output.len(), sample.len())?;
        let noise = if self.needs_noise(step) {
            let z = noise.ok_or_else(|| {
                DriftError::Other(format!("scheduler {}: step {step} needs noise", self.kind))
            })?;
            check_len("noise", z.len(), sample.len())?;
            Some(z)
        } else {
            None
        };
        let n = self.num_steps();
        let pred = self.prediction;
        let out: Vec<f32> = match self.kind.class() {
            Class::Euler | Class::EulerAncestral => {
                let sigma = self.sigmas[step];
                let next = self.sigmas[step + 1];
                // Ancestral: go down to sigma_down deterministically, then add sigma_up of noise.
                let (to, up) = if self.kind.class() == Class::EulerAncestral {
                    let up = (next * next * (sigma * sigma - next * next) / (sigma * sigma)).sqrt();
                    ((next * next - up * up).sqrt(), up)
                } else {
                    (next, 0.0)
                };
                let dt = to - sigma;
                let c_out = -sigma / (sigma * sigma + 1.0).sqrt();
                let c_in = 1.0 / (sigma * sigma + 1.0);
                (0..sample.len())
                    .map(|i| {
                        let x = sample[i] as f64;
                        let m = model_output[i] as f64;
                        let x0 = match pred {
                            Prediction::Epsilon => x - sigma * m,
                            Prediction::VPrediction => m * c_out + x * c_in,
                            Prediction::Sample => m,
                        };
                        let d = (x - x0) / sigma;
                        let mut y = x + d * dt;
                        if let Some(z) = noise {
                            y += z[i] as f64 * up;
                        }
                        y as f32
                    })
                    .collect()
            }
            Class::Ddim => {
                let t = self.timesteps[step] as i64;
                let prev = t - self.prev_offset;
                let a = self.alphas_cumprod[t as usize];
                let a_prev = if prev >= 0 {
                    self.alphas_cumprod[prev as usize]
                } else {
                    self.final_alpha_cumprod
                };
                let (sa, sb) = (a.sqrt(), (1.0 - a).sqrt());
                let (sap, sbp) = (a_prev.sqrt(), (1.0 - a_prev).sqrt());
                let clip = self.clip;
                (0..sample.len())
                    .map(|i| {
                        let x = sample[i] as f64;
                        let m = model_output[i] as f64;
                        let (x0, eps) = match pred {
                            Prediction::Epsilon => ((x - sb * m) / sa, m),
                            Prediction::VPrediction => (sa * x - sb * m, sa * m + sb * x),
                            Prediction::Sample => (m, (x - sa * m) / sb),
                        };
                        // diffusers clamps x0 but keeps the unclamped epsilon.
                        let x0 = clip.map_or(x0, |c| x0.clamp(-c, c));
                        (sap * x0 + sbp * eps) as f32
                    })
                    .collect()
            }
            Class::Lcm => {
                let t = self.timesteps[step];
                let t_prev = if step + 1 < n {
                    self.timesteps[step + 1]
                } else {
                    t
                };
                let a = self.alphas_cumprod[t as usize];
                let a_prev = self.alphas_cumprod[t_prev as usize];
                let (sa, sb) = (a.sqrt(), (1.0 - a).sqrt());
                let (sap, sbp) = (a_prev.sqrt(), (1.0 - a_prev).sqrt());
                // Consistency-model boundary condition with sigma_data = 0.5.
                let st = t * self.timestep_scaling;
                let c_skip = 0.25 / (st * st + 0.25);
                let c_out = st / (st * st + 0.25).sqrt();
                let clip = self.clip;
                (0..sample.len())
                    .map(|i| {
                        let x = sample[i] as f64;
                        let m = model_output[i] as f64;
                        let x0 = match pred {
                            Prediction::Epsilon => (x - sb * m) / sa,
                            Prediction::VPrediction => sa * x - sb * m,
                            Prediction::Sample => m,
                        };
                        let x0 = clip.map_or(x0, |c| x0.clamp(-c, c));
                        let denoised = c_out * x0 + c_skip * x;
                        match noise {
                            Some(z) => (sap * denoised + sbp * z[i] as f64) as f32,
                            None => denoised as f32,
                        }
                    })
                    .collect()
            }
            Class::Dpm => {
                let (alpha_s, sigma_s) = alpha_sigma(self.sigmas[step]);
                let (alpha_t, sigma_t) = alpha_sigma(self.sigmas[step + 1]);
                // The data prediction x0 at this step.
                let x0: Vec<f64> = (0..sample.len())
                    .map(|i| {
                        let x = sample[i] as f64;
                        let m = model_output[i] as f64;
                        match pred {
                            Prediction::Epsilon => (x - sigma_s * m) / alpha_s,
                            Prediction::VPrediction => alpha_s * x - sigma_s * m,
                            Prediction::Sample => m,
                        }
                    })
                    .collect();
                let prev = self
                    .history
                    .take()
                    .filter(|(k, _)| step > 0 && *k + 1 == step);
                let out: Vec<f32> = if sigma_t == 0.0 {
                    // Final step to sigma 0: the update is exactly x0.
                    x0.iter().map(|&v| v as f32).collect()
                } else {
                    let lambda = |alpha: f64, sigma: f64| alpha.ln() - sigma.ln();
                    let lambda_t = lambda(alpha_t, sigma_t);
                    let lambda_s0 = lambda(alpha_s, sigma_s);
                    let h = lambda_t - lambda_s0;
                    let ratio = sigma_t / sigma_s;
                    let coef = alpha_t * ((-h).exp() - 1.0);
                    // diffusers' lower_order_final / euler_at_final: with the final sigma 0 handled
                    // above, these are the cases left for final_sigmas_type sigma_min.
                    let last_first_order = step + 1 == n
                        && (self.euler_at_final || (self.lower_order_final && n < 15));
                    match prev {
                        Some((_, m1)) if !last_first_order => {
                            let (alpha_s1, sigma_s1) = alpha_sigma(self.sigmas[step - 1]);
                            let h0 = lambda_s0 - lambda(alpha_s1, sigma_s1);
                            let r0 = h0 / h;
                            (0..sample.len())
                                .map(|i| {
                                    let d0 = x0[i];
                                    let d1 = (x0[i] - m1[i]) / r0;
                                    (ratio * sample[i] as f64 - coef * d0 - 0.5 * coef * d1) as f32
                                })
                                .collect()
                        }
                        _ => (0..sample.len())
                            .map(|i| (ratio * sample[i] as f64 - coef * x0[i]) as f32)
                            .collect(),
                    }
                };
                self.history = Some((step, x0));
                out
            }
        };
        Ok(out)
    }

    fn check_step(&self, step: usize) -> Result<()> {
        if step >= self.num_steps() {
            return Err(DriftError::Other(format!(
                "scheduler {}: step {step} out of range 0..{}",
                self.kind,
                self.num_steps()
            )));
        }
        Ok(())
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(DriftError::Shape(format!(
            "scheduler: {what} has {got} values, the sample {want}"
        )));
    }
    Ok(())
}

/// VP-SDE scalings of a noise level: alpha = 1 / sqrt(sigma^2 + 1), sigma_t = sigma * alpha.
fn alpha_sigma(sigma: f64) -> (f64, f64) {
    let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
    (alpha, sigma * alpha)
}

/// `n` evenly spaced values from `a` to `b` inclusive (numpy's formula: a + i * step, last = b).
fn linspace(a: f64, b: f64, n: usize) -> impl DoubleEndedIterator<Item = f64> {
    let step = if n > 1 { (b - a) / (n - 1) as f64 } else { 0.0 };
    (0..n).map(move |i| {
        if n > 1 && i == n - 1 {
            b
        } else {
            a + i as f64 * step
        }
    })
}

/// Trailing spacing: round(start - i * train / steps) - 1 for i in 0..steps (numpy's arange).
fn trailing(train: usize, start: usize, steps: usize) -> Vec<f64> {
    let ratio = train as f64 / steps as f64;
    (0..steps)
        .map(|i| (start as f64 - i as f64 * ratio).round_ties_even() - 1.0)
        .collect()
}

/// np.interp of the per-timestep sigma table at a (fractional) timestep, clamped at the ends.
fn interp(t: f64, table: &[f64]) -> f64 {
    let last = table.len() - 1;
    if t <= 0.0 {
        return table[0];
    }
    if t >= last as f64 {
        return table[last];
    }
    let i = t.floor() as usize;
    let w = t - i as f64;
    if w == 0.0 {
        table[i]
    } else {
        table[i] + (table[i + 1] - table[i]) * w
    }
}

/// Karras et al. (2022) noise levels with rho = 7, from `hi` down to `lo`, `n` values.
fn karras_sigmas(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let rho = 7.0;
    let (min_inv, max_inv) = (lo.powf(1.0 / rho), hi.powf(1.0 / rho));
    linspace(0.0, 1.0, n)
        .map(|r| (max_inv + r * (min_inv - max_inv)).powf(rho))
        .collect()
}

/// The fractional training timestep whose sigma is `sigma`: linear interpolation in log sigma
/// between the two neighbouring timesteps (diffusers' `_sigma_to_t`).
fn sigma_to_t(sigma: f64, log_sigmas: &[f64]) -> f64 {
    let log_sigma = sigma.max(1e-10).ln();
    // Last index whose log sigma is <= log_sigma (0 when none), at most len - 2.
    let low = log_sigmas
        .iter()
        .rposition(|&l| log_sigma - l >= 0.0)
        .unwrap_or(0);
    let low = low.min(log_sigmas.len() - 2);
    let (lo, hi) = (log_sigmas[low], log_sigmas[low + 1]);
    let w = ((lo - log_sigma) / (lo - hi)).clamp(0.0, 1.0);
    (1.0 - w) * low as f64 + w * (low + 1) as f64
}

/// Glide's cosine schedule ("squaredcos_cap_v2"), betas capped at 0.999.
fn cosine_betas(n: usize) -> Vec<f32> {
    let f = |t: f64| {
        ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2)
            .cos()
            .powi(2)
    };
    (0..n)
        .map(|i| {
            let (t1, t2) = (i as f64 / n as f64, (i + 1) as f64 / n as f64);
            (1.0 - f(t2) / f(t1)).min(0.999) as f32
        })
        .collect()
}

/// Rescales betas to zero terminal SNR (Lin et al. 2023, algorithm 1), in f32 operation by
/// operation as diffusers does (the result feeds the trained schedule, see the module docs).
fn rescale_zero_terminal_snr(betas: &[f32]) -> Vec<f32> {
    let mut acc = 1.0f64;
    let mut sqrt_ac: Vec<f32> = betas
        .iter()
        .map(|&b| {
            acc *= (1.0f32 - b) as f64;
            (acc as f32).sqrt()
        })
        .collect();
    let (first, last) = (sqrt_ac[0], sqrt_ac[sqrt_ac.len() - 1]);
    let scale = first / (first - last);
    for s in &mut sqrt_ac {
        *s = (*s - last) * scale;
    }
    let ac: Vec<f32> = sqrt_ac.iter().map(|&s| s * s).collect();
    (0..ac.len())
        .map(|i| {
            let alpha = if i == 0 { ac[0] } else { ac[i] / ac[i - 1] };
            1.0 - alpha
        })
        .collect()
}
