//! Single-file Stable Diffusion 1.x checkpoints (`.safetensors` with the original CompVis/LDM key
//! names, as community models are shared): which family a file is, and the diffusers configs its
//! tensor shapes imply.
//!
//! A single file carries weights only. Like diffusers' `from_single_file` (which takes SD 1.5's
//! configs and overrides what the weights show), shapes give every size they can: UNet channels per
//! level, layers per block, which levels have attention, transformer depth, cross-attention dim,
//! in/out channels, conv or linear `proj_in`; VAE channels per level, levels, layers per block,
//! latent channels; CLIP vocabulary, hidden size, MLP width, layers, positions. SD 1.x conventions
//! fill in what shapes cannot show: 8 UNet heads per level, 32 norm groups, CLIP heads = hidden / 64
//! with quick_gelu and layer-norm eps 1e-5, VAE scaling 0.18215, and SD 1.5's scheduler
//! (scaled_linear 0.00085..0.012 over 1000 steps, epsilon prediction unless a `NAME.yaml` next to
//! the file says `parameterization: "v"`, the AUTOMATIC1111 convention).
//!
//! Keys the pipeline never reads are ignored: `model_ema.*` (diffusers also takes the non-EMA
//! weights), the DDPM buffers (`betas`, `alphas_cumprod`, ...), CLIP `position_ids`. The CLIP
//! weights sit under `cond_stage_model.transformer.text_model.` or, in old files,
//! `cond_stage_model.transformer.`. SD 2.x (OpenCLIP text encoder, 1024-wide cross-attention), SDXL,
//! inpainting (9 UNet input channels) and other families are refused with a message saying so.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::diffusion::schedulers::SchedulerConfig;
use crate::error::{DriftError, Result};
use crate::formats::safetensors::SafetensorsSet;
use crate::models::clip::ClipTextConfig;
use crate::models::sd_weights::refuse_pickle;
use crate::models::unet::UnetConfig;
use crate::models::vae::VaeConfig;

const UNET: &str = "model.diffusion_model.";
const VAE: &str = "first_stage_model.";
const CLIP_PREFIXES: [&str; 2] = [
    "cond_stage_model.transformer.text_model.",
    "cond_stage_model.transformer.",
];

/// SD 1.5's `scheduler/scheduler_config.json` (what diffusers' `from_single_file` uses for SD 1.x).
const SD1_SCHEDULER: &str = r#"{"_class_name": "PNDMScheduler", "num_train_timesteps": 1000,
    "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "trained_betas": null,
    "set_alpha_to_one": false, "skip_prk_steps": true, "steps_offset": 1, "clip_sample": false,
    "prediction_type": "epsilon"}"#;

/// File name of OpenAI's CLIP BPE vocabulary (shipped in the open_clip_torch wheel).
pub const CLIP_VOCAB_FILE: &str = "bpe_simple_vocab_16e6.txt.gz";

/// What a single-file SD 1.x checkpoint holds, as diffusers configs.
#[derive(Clone, Debug)]
pub struct SdCheckpoint {
    pub path: PathBuf,
    pub unet: UnetConfig,
    pub vae: VaeConfig,
    pub clip: ClipTextConfig,
    /// Prefix of the CLIP tensors (`embeddings.token_embedding.weight` follows it).
    pub clip_prefix: String,
    pub scheduler: SchedulerConfig,
}

fn not_sd1(path: &Path, what: &str) -> DriftError {
    DriftError::Unsupported(format!(
        "{}: {what}, not SD 1.x; Drift runs Stable Diffusion 1.x checkpoints",
        path.display()
    ))
}

fn malformed(path: &Path, what: &str) -> DriftError {
    DriftError::Other(format!(
        "{}: not a complete SD 1.x checkpoint: {what}",
        path.display()
    ))
}

/// The checkpoint's tensor shapes by name, with the questions shape inference asks.
struct Keys<'a> {
    shapes: &'a HashMap<String, Vec<usize>>,
    path: &'a Path,
}

impl Keys<'_> {
    fn has(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.shapes.get(name).cloned()
    }

    fn need(&self, name: &str) -> Result<Vec<usize>> {
        self.shape(name)
            .ok_or_else(|| malformed(self.path, &format!("tensor {name} is missing")))
    }

    /// Dimension `dim` of tensor `name`, which must have `rank` dimensions.
    fn dim(&self, name: &str, rank: usize, dim: usize) -> Result<usize> {
        let s = self.need(name)?;
        if s.len() != rank {
            return Err(malformed(
                self.path,
                &format!("{name} has shape {s:?}, {rank} dimensions expected"),
            ));
        }
        Ok(s[dim])
    }

    /// One more than the largest `k` among names `{prefix}{k}.*` (0 when there are none).
    fn count(&self, prefix: &str) -> usize {
        self.shapes
            .keys()
            .filter_map(|n| n.strip_prefix(prefix))
            .filter_map(|rest| rest.split('.').next()?.parse::<usize>().ok())
            .map(|k| k + 1)
            .max()
            .unwrap_or(0)
    }

    fn any_prefix(&self, prefix: &str) -> bool {
        self.shapes.keys().any(|n| n.starts_with(prefix))
    }
}

impl SdCheckpoint {
    /// Opens a single-file checkpoint (pickles refused) and reads its configs from the shapes.
    pub fn open(path: &Path) -> Result<(SdCheckpoint, SafetensorsSet)> {
        refuse_pickle(path)?;
        // A header that promises more than the file holds is, in practice, a cut-off download.
        let set = SafetensorsSet::open(path).map_err(|e| match e {
            DriftError::Other(m)
                if m.contains("not a valid safetensors") || m.contains("outside the file") =>
            {
                DriftError::Other(format!("{m} (an incomplete download?)"))
            }
            e => e,
        })?;
        let ckpt = Self::inspect(path, &set)?;
        Ok((ckpt, set))
    }

    /// The configs of the checkpoint `set` (opened from `path`).
    pub fn inspect(path: &Path, set: &SafetensorsSet) -> Result<SdCheckpoint> {
        // Non-float tensors (CLIP's int64 position ids) keep an empty shape: nothing asks for them.
        let shapes = set
            .names()
            .map(|n| {
                let shape = set.get(n).map(|t| t.shape.to_vec()).unwrap_or_default();
                (n.to_string(), shape)
            })
            .collect();
        Self::from_shapes(path, &shapes)
    }

    /// The configs implied by a checkpoint's tensor shapes (name -> shape); `path` names it in
    /// messages and locates a `.yaml` beside it.
    pub fn from_shapes(path: &Path, shapes: &HashMap<String, Vec<usize>>) -> Result<SdCheckpoint> {
        let k = Keys { shapes, path };
        check_family(&k)?;
        let unet = unet_config(&k)?;
        let vae = vae_config(&k)?;
        let (clip, clip_prefix) = clip_config(&k)?;
        if unet.cross_attention_dim == 1024 {
            return Err(not_sd1(
                path,
                "a Stable Diffusion 2.x checkpoint (1024-wide cross-attention)",
            ));
        }
        if unet.cross_attention_dim != clip.hidden {
            return Err(malformed(
                path,
                &format!(
                    "the UNet attends to {}-wide text states but the text encoder makes {}",
                    unet.cross_attention_dim, clip.hidden
                ),
            ));
        }
        if unet.in_channels != vae.latent_channels || unet.out_channels != vae.latent_channels {
            return Err(DriftError::Unsupported(format!(
                "{}: the UNet takes {} channels and the VAE makes {} latent channels (an inpainting or \
                 instruct-pix2pix checkpoint?); Drift runs text-to-image SD 1.x checkpoints",
                path.display(),
                unet.in_channels,
                vae.latent_channels
            )));
        }
        Ok(SdCheckpoint {
            path: path.to_path_buf(),
            scheduler: scheduler_config(path)?,
            unet,
            vae,
            clip,
            clip_prefix,
        })
    }
}

/// Refuses what is recognisably another model family (diffusers' key probes).
fn check_family(k: &Keys) -> Result<()> {
    if k.any_prefix("conditioner.embedders.") {
        return Err(not_sd1(k.path, "an SDXL checkpoint"));
    }
    if k.any_prefix("cond_stage_model.model.") {
        return Err(not_sd1(
            k.path,
            "a Stable Diffusion 2.x checkpoint (OpenCLIP text encoder, usually v-prediction)",
        ));
    }
    let to_k = format!("{UNET}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight");
    if k.shape(&to_k).and_then(|s| s.last().copied()) == Some(1024) {
        return Err(not_sd1(
            k.path,
            "a Stable Diffusion 2.x checkpoint (1024-wide cross-attention)",
        ));
    }
    if !k.has(&format!("{UNET}input_blocks.0.0.weight")) {
        let what = if k.any_prefix(&format!("{UNET}joint_blocks.")) || k.any_prefix("joint_blocks.")
        {
            "a Stable Diffusion 3 checkpoint"
        } else if k.any_prefix(&format!("{UNET}double_blocks.")) || k.any_prefix("double_blocks.") {
            "a FLUX checkpoint"
        } else if k.has("conv_in.weight") {
            "a single diffusers component (UNet or VAE), not a whole checkpoint: point Drift at the \
             diffusers pipeline folder"
        } else {
            "no Stable Diffusion UNet (model.diffusion_model.input_blocks.*)"
        };
        return Err(not_sd1(k.path, what));
    }
    if k.any_prefix(&format!("{UNET}label_emb.")) {
        return Err(not_sd1(
            k.path,
            "a class-conditioned UNet (upscaler or unCLIP)",
        ));
    }
    Ok(())
}

/// The UNet's diffusers config. LDM numbers `input_blocks` 0 (conv_in), then per level
/// `layers_per_block` ResNet(+attention) blocks and, except at the last level, a downsampler: the
/// first downsampler's index is `n = layers_per_block + 1`; `output_blocks` hold `n` per level.
fn unet_config(k: &Keys) -> Result<UnetConfig> {
    let p = |s: &str| format!("{UNET}{s}");
    let c0 = k.dim(&p("input_blocks.0.0.weight"), 4, 0)?;
    let in_channels = k.dim(&p("input_blocks.0.0.weight"), 4, 1)?;
    let out_channels = k.dim(&p("out.2.weight"), 4, 0)?;
    if k.need(&p("time_embed.0.weight"))? != [4 * c0, c0] {
        return Err(DriftError::Unsupported(format!(
            "{}: the UNet's time embedding is not SD 1.x's ({c0} -> {})",
            k.path.display(),
            4 * c0
        )));
    }
    let inputs = k.count(&p("input_blocks."));
    let n = (1..inputs)
        .find(|i| k.has(&p(&format!("input_blocks.{i}.0.op.weight"))))
        .unwrap_or(inputs);
    let levels = inputs / n.max(1);
    if n < 2 || inputs != levels * n || k.count(&p("output_blocks.")) != inputs {
        return Err(malformed(
            k.path,
            &format!(
                "{inputs} input blocks and {} output blocks do not form a UNet",
                k.count(&p("output_blocks."))
            ),
        ));
    }
    let mut channels = Vec::new();
    let (mut down, mut up, mut depth) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..levels {
        let first = 1 + i * n;
        channels.push(k.dim(
            &p(&format!("input_blocks.{first}.0.out_layers.3.weight")),
            4,
            0,
        )?);
        let attn = k.has(&p(&format!("input_blocks.{first}.1.proj_in.weight")));
        down.push(if attn {
            "CrossAttnDownBlock2D"
        } else {
            "DownBlock2D"
        });
        let up_attn = k.has(&p(&format!("output_blocks.{}.1.proj_in.weight", i * n)));
        up.push(if up_attn {
            "CrossAttnUpBlock2D"
        } else {
            "UpBlock2D"
        });
        depth.push(if attn {
            k.count(&p(&format!("input_blocks.{first}.1.transformer_blocks.")))
        } else if i + 1 == levels {
            k.count(&p("middle_block.1.transformer_blocks."))
        } else {
            1
        });
    }
    let mid = p("middle_block.1.");
    let cross_attention_dim = k.dim(
        &format!("{mid}transformer_blocks.0.attn2.to_k.weight"),
        2,
        1,
    )?;
    let linear = k.need(&format!("{mid}proj_in.weight"))?.len() == 2;
    let cfg = json!({
        "in_channels": in_channels,
        "out_channels": out_channels,
        "block_out_channels": channels,
        "layers_per_block": n - 1,
        "down_block_types": down,
        "up_block_types": up,
        "attention_head_dim": 8,
        "transformer_layers_per_block": depth,
        "cross_attention_dim": cross_attention_dim,
        "norm_num_groups": 32,
        "norm_eps": 1e-5,
        "flip_sin_to_cos": true,
        "freq_shift": 0,
        "use_linear_projection": linear,
    });
    UnetConfig::from_json(&cfg.to_string())
}

/// The VAE's diffusers config. LDM numbers the decoder's `up` levels from the bottom, so `up.i`
/// has `block_out_channels[i]`; each holds `layers_per_block + 1` ResNets.
fn vae_config(k: &Keys) -> Result<VaeConfig> {
    let p = |s: &str| format!("{VAE}{s}");
    if !k.any_prefix(VAE) {
        return Err(malformed(k.path, "it holds no VAE (first_stage_model.*)"));
    }
    let levels = k.count(&p("decoder.up."));
    if levels == 0 {
        return Err(malformed(k.path, "the VAE has no decoder levels"));
    }
    let per_level = k.count(&p("decoder.up.0.block."));
    if per_level < 2 {
        return Err(malformed(
            k.path,
            "the VAE decoder has fewer than 2 blocks per level",
        ));
    }
    let channels = (0..levels)
        .map(|i| k.dim(&p(&format!("decoder.up.{i}.block.0.conv2.weight")), 4, 0))
        .collect::<Result<Vec<_>>>()?;
    // The encoder, when present, must agree (level i of both has block_out_channels[i]).
    for (i, &c) in channels.iter().enumerate() {
        if let Some(s) = k.shape(&p(&format!("encoder.down.{i}.block.0.conv2.weight")))
            && s.first() != Some(&c)
        {
            return Err(malformed(
                k.path,
                &format!("VAE encoder level {i} has {s:?}, the decoder {c} channels"),
            ));
        }
    }
    let latent = k.dim(&p("post_quant_conv.weight"), 4, 0)?;
    let in_channels = k
        .shape(&p("encoder.conv_in.weight"))
        .and_then(|s| s.get(1).copied())
        .unwrap_or(3);
    let cfg = json!({
        "in_channels": in_channels,
        "out_channels": k.dim(&p("decoder.conv_out.weight"), 4, 0)?,
        "latent_channels": latent,
        "block_out_channels": channels,
        "layers_per_block": per_level - 1,
        "down_block_types": vec!["DownEncoderBlock2D"; levels],
        "up_block_types": vec!["UpDecoderBlock2D"; levels],
        "norm_num_groups": 32,
        "scaling_factor": 0.18215,
        "mid_block_add_attention": k.has(&p("decoder.mid.attn_1.q.weight")),
    });
    VaeConfig::from_json(&cfg.to_string())
}

/// CLIP ViT-L/14's text config from the shapes, and the prefix its tensors sit under.
fn clip_config(k: &Keys) -> Result<(ClipTextConfig, String)> {
    let prefix = CLIP_PREFIXES
        .iter()
        .find(|p| k.has(&format!("{p}embeddings.token_embedding.weight")))
        .ok_or_else(|| {
            malformed(
                k.path,
                "it holds no CLIP text encoder (cond_stage_model.transformer.text_model.*)",
            )
        })?;
    let p = |s: &str| format!("{prefix}{s}");
    let vocab = k.dim(&p("embeddings.token_embedding.weight"), 2, 0)?;
    let hidden = k.dim(&p("embeddings.token_embedding.weight"), 2, 1)?;
    let positions = k.dim(&p("embeddings.position_embedding.weight"), 2, 0)?;
    if hidden == 0 || !hidden.is_multiple_of(64) {
        return Err(malformed(
            k.path,
            &format!("the text encoder is {hidden} wide, not a multiple of CLIP's 64-wide heads"),
        ));
    }
    let cfg: Value = json!({
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": k.dim(&p("encoder.layers.0.mlp.fc1.weight"), 2, 0)?,
        "num_hidden_layers": k.count(&p("encoder.layers.")),
        "num_attention_heads": hidden / 64,
        "max_position_embeddings": positions,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    });
    Ok((ClipTextConfig::from_value(&cfg)?, prefix.to_string()))
}

/// SD 1.5's scheduler; v-prediction when `NAME.yaml` next to the checkpoint says
/// `parameterization: "v"` (how AUTOMATIC1111 marks v-prediction SD 1.x finetunes).
pub fn scheduler_config(path: &Path) -> Result<SchedulerConfig> {
    let mut cfg = SchedulerConfig::from_json(SD1_SCHEDULER)?;
    let yaml = path.with_extension("yaml");
    if let Ok(text) = std::fs::read_to_string(&yaml) {
        let v_pred = text.lines().any(|l| {
            l.trim()
                .strip_prefix("parameterization:")
                .is_some_and(|v| v.trim().trim_matches(['"', '\'']) == "v")
        });
        if v_pred {
            cfg.prediction_type = Some("v_prediction".into());
        }
    }
    Ok(cfg)
}

/// Where OpenAI's CLIP vocabulary is (a single file carries no tokenizer): `$DRIFT_CLIP_VOCAB`, else
/// `$DRIFT_CACHE/clip/`, else `~/.cache/drift/clip/`. The error says how to get it.
pub fn clip_vocab_path() -> Result<PathBuf> {
    find_clip_vocab(|name| std::env::var_os(name))
}

/// [`clip_vocab_path`] with the environment given by `var` (a variable's value by name).
pub fn find_clip_vocab(var: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf> {
    if let Some(p) = var("DRIFT_CLIP_VOCAB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(DriftError::Other(format!(
                "DRIFT_CLIP_VOCAB is {}, which is not a file",
                p.display()
            )))
        };
    }
    let cache = var("DRIFT_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            var("HOME")
                .or_else(|| var("USERPROFILE"))
                .map(|h| PathBuf::from(h).join(".cache/drift"))
        })
        .unwrap_or_else(|| PathBuf::from(".cache/drift"));
    let p = cache.join("clip").join(CLIP_VOCAB_FILE);
    if p.is_file() {
        return Ok(p);
    }
    Err(DriftError::Other(format!(
        "a single-file checkpoint carries no tokenizer, and CLIP's vocabulary {CLIP_VOCAB_FILE} is not \
         at {} (nor is DRIFT_CLIP_VOCAB set). Get it from the open_clip_torch wheel (MIT): \
         `pip download --no-deps open_clip_torch -d /tmp/oc` and unzip open_clip/{CLIP_VOCAB_FILE} from \
         it into {}",
        p.display(),
        cache.join("clip").display()
    )))
}
