//! Stable Diffusion weights: diffusers folders (`unet/`, `vae/`, `text_encoder/`, fp32 or the `fp16`
//! variant) and single-file SD 1.x checkpoints with the original CompVis/LDM key names
//! (`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.transformer.*`), seen through
//! one interface that answers diffusers names. Every network is described with diffusers names; a
//! single file is read through a name mapping written from the LDM module layout:
//!
//! UNet (`model.diffusion_model.`), with `n = layers_per_block + 1` entries per level:
//! - `time_embedding.linear_{1,2}` = `time_embed.{0,2}`, `conv_in` = `input_blocks.0.0`,
//!   `conv_norm_out` = `out.0`, `conv_out` = `out.2`;
//! - `down_blocks.i.resnets.j` = `input_blocks.(1 + i n + j).0`, `.attentions.j` = `...1`,
//!   `down_blocks.i.downsamplers.0.conv` = `input_blocks.((i + 1) n).0.op`;
//! - `mid_block.resnets.j` = `middle_block.(2 j)`, `mid_block.attentions.0` = `middle_block.1`;
//! - `up_blocks.i.resnets.j` = `output_blocks.(i n + j).0`, `.attentions.j` = `...1`,
//!   `up_blocks.i.upsamplers.0.conv` = `output_blocks.(i n + n - 1).(2 with attentions, else 1).conv`;
//! - inside a ResNet: `norm1` = `in_layers.0`, `conv1` = `in_layers.2`, `time_emb_proj` =
//!   `emb_layers.1`, `norm2` = `out_layers.0`, `conv2` = `out_layers.3`, `conv_shortcut` =
//!   `skip_connection`; transformer names are the same on both sides.
//!
//! VAE (`first_stage_model.`): `{encoder,decoder}.down_blocks.i.resnets.j` = `down.i.block.j`,
//! `down_blocks.i.downsamplers.0.conv` = `down.i.downsample.conv`, decoder `up_blocks.i` =
//! `up.(levels - 1 - i)` (LDM numbers the decoder levels from the bottom), `mid_block.resnets.{0,1}` =
//! `mid.block_{1,2}`, `mid_block.attentions.0` = `mid.attn_1` with `group_norm` / `to_q` / `to_k` /
//! `to_v` / `to_out.0` = `norm` / `q` / `k` / `v` / `proj_out` (stored as 1x1 convs), `conv_shortcut` =
//! `nin_shortcut`, `conv_norm_out` = `norm_out`; `quant_conv`, `post_quant_conv`, `conv_in`,
//! `conv_out` unchanged. Older diffusers VAEs name the attention `query` / `key` / `value` /
//! `proj_attn`: accepted as fallbacks.
//!
//! CLIP (`cond_stage_model.transformer.`): `text_model.*` unchanged below the prefix (older files lack
//! the `text_model.` level).

use std::path::{Path, PathBuf};

use crate::error::{DriftError, Result};
use crate::formats::safetensors::{RawTensor, SafetensorsSet};
use crate::gpu::{Gpu, encode_f32};
use crate::kernels::conv::conv2d_weight;
use crate::memory::Category;
use crate::models::sd_graph::{WeightDef, WeightKind};
use crate::shape_err;
use crate::tensor::{DType, Layout, Tensor};

/// Which network of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SdPart {
    /// LDM layout facts the UNet mapping needs: layers per block and, per up block, whether it has
    /// attentions.
    Unet {
        layers_per_block: usize,
        up_has_attention: Vec<bool>,
    },
    /// Number of levels (block_out_channels.len()).
    Vae {
        levels: usize,
    },
    TextEncoder,
}

/// The LDM single-file name of a diffusers UNet weight name (`None` when it has no counterpart).
pub fn unet_ldm_name(
    name: &str,
    layers_per_block: usize,
    up_has_attention: &[bool],
) -> Option<String> {
    let n = layers_per_block + 1;
    let p: Vec<&str> = name.split('.').collect();
    let tail = |from: usize| p.get(from..).map(|s| s.join("."));
    let resnet = |rest: &[&str]| -> Option<String> {
        let head = match *rest.first()? {
            "norm1" => "in_layers.0",
            "conv1" => "in_layers.2",
            "time_emb_proj" => "emb_layers.1",
            "norm2" => "out_layers.0",
            "conv2" => "out_layers.3",
            "conv_shortcut" => "skip_connection",
            _ => return None,
        };
        Some(format!("{head}.{}", rest[1..].join(".")))
    };
    let idx = |i: usize| p.get(i).and_then(|s| s.parse::<usize>().ok());
    let body = match *p.first()? {
        "time_embedding" => {
            let l = match *p.get(1)? {
                "linear_1" => "0",
                "linear_2" => "2",
                _ => return None,
            };
            format!("time_embed.{l}.{}", tail(2)?)
        }
        "conv_in" => format!("input_blocks.0.0.{}", tail(1)?),
        "conv_norm_out" => format!("out.0.{}", tail(1)?),
        "conv_out" => format!("out.2.{}", tail(1)?),
        "down_blocks" => {
            let (i, j) = (idx(1)?, idx(3)?);
            match *p.get(2)? {
                "resnets" => format!("input_blocks.{}.0.{}", 1 + i * n + j, resnet(&p[4..])?),
                "attentions" => format!("input_blocks.{}.1.{}", 1 + i * n + j, tail(4)?),
                "downsamplers" => format!("input_blocks.{}.0.op.{}", (i + 1) * n, tail(5)?),
                _ => return None,
            }
        }
        "mid_block" => {
            let j = idx(2)?;
            match *p.get(1)? {
                "resnets" => format!("middle_block.{}.{}", 2 * j, resnet(&p[3..])?),
                "attentions" => format!("middle_block.1.{}", tail(3)?),
                _ => return None,
            }
        }
        "up_blocks" => {
            let (i, j) = (idx(1)?, idx(3)?);
            match *p.get(2)? {
                "resnets" => format!("output_blocks.{}.0.{}", i * n + j, resnet(&p[4..])?),
                "attentions" => format!("output_blocks.{}.1.{}", i * n + j, tail(4)?),
                "upsamplers" => {
                    let at = if *up_has_attention.get(i)? { 2 } else { 1 };
                    format!("output_blocks.{}.{at}.conv.{}", i * n + n - 1, tail(5)?)
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(format!("model.diffusion_model.{body}"))
}

/// The LDM single-file name of a diffusers AutoencoderKL weight name.
pub fn vae_ldm_name(name: &str, levels: usize) -> Option<String> {
    let p: Vec<&str> = name.split('.').collect();
    let resnet = |rest: &[&str]| -> Option<String> {
        let head = match *rest.first()? {
            "conv_shortcut" => "nin_shortcut",
            h @ ("norm1" | "conv1" | "norm2" | "conv2") => h,
            _ => return None,
        };
        Some(format!("{head}.{}", rest[1..].join(".")))
    };
    let idx = |i: usize| p.get(i).and_then(|s| s.parse::<usize>().ok());
    let body = match *p.first()? {
        "quant_conv" | "post_quant_conv" => name.to_string(),
        side @ ("encoder" | "decoder") => {
            let rest = match *p.get(1)? {
                "conv_in" | "conv_out" => p[1..].join("."),
                "conv_norm_out" => format!("norm_out.{}", p.get(2..)?.join(".")),
                "mid_block" => {
                    let j = idx(3)?;
                    match *p.get(2)? {
                        "resnets" => format!("mid.block_{}.{}", j + 1, resnet(&p[4..])?),
                        "attentions" => {
                            let head = match *p.get(4)? {
                                "group_norm" => "norm",
                                "to_q" | "query" => "q",
                                "to_k" | "key" => "k",
                                "to_v" | "value" => "v",
                                "to_out" | "proj_attn" => "proj_out",
                                _ => return None,
                            };
                            format!("mid.attn_1.{head}.{}", p.last()?)
                        }
                        _ => return None,
                    }
                }
                "down_blocks" => {
                    let i = idx(2)?;
                    match *p.get(3)? {
                        "resnets" => format!("down.{i}.block.{}.{}", idx(4)?, resnet(&p[5..])?),
                        "downsamplers" => format!("down.{i}.downsample.conv.{}", p.last()?),
                        _ => return None,
                    }
                }
                "up_blocks" => {
                    let lvl = levels.checked_sub(1 + idx(2)?)?;
                    match *p.get(3)? {
                        "resnets" => format!("up.{lvl}.block.{}.{}", idx(4)?, resnet(&p[5..])?),
                        "upsamplers" => format!("up.{lvl}.upsample.conv.{}", p.last()?),
                        _ => return None,
                    }
                }
                _ => return None,
            };
            format!("{side}.{rest}")
        }
        _ => return None,
    };
    Some(format!("first_stage_model.{body}"))
}

/// Diffusers names of the VAE attention in older files (`query`, `key`, `value`, `proj_attn`).
fn vae_legacy_name(name: &str) -> Option<String> {
    for (new, old) in [
        (".to_q.", ".query."),
        (".to_k.", ".key."),
        (".to_v.", ".value."),
        (".to_out.0.", ".proj_attn."),
    ] {
        if name.contains(".attentions.") && name.contains(new) {
            return Some(name.replace(new, old));
        }
    }
    None
}

enum Naming {
    Diffusers,
    Ldm(SdPart),
}

/// The weights of one network, answered by diffusers name.
pub struct SdWeightSource {
    set: SafetensorsSet,
    naming: Naming,
    pub path: PathBuf,
}

/// The safetensors file(s) of a diffusers component folder: the fp16 variant when `prefer_fp16` (or
/// when it is the only one), else the full-precision file; sharded `*.safetensors.index.json` too.
pub fn diffusers_component_files(dir: &Path, prefer_fp16: bool) -> Result<PathBuf> {
    let stems = ["diffusion_pytorch_model", "model"];
    let mut candidates = Vec::new();
    for stem in stems {
        let full = [
            format!("{stem}.safetensors"),
            format!("{stem}.safetensors.index.json"),
        ];
        let half = [
            format!("{stem}.fp16.safetensors"),
            format!("{stem}.safetensors.index.fp16.json"),
        ];
        let (first, second) = if prefer_fp16 {
            (half, full)
        } else {
            (full, half)
        };
        candidates.extend(first);
        candidates.extend(second);
    }
    candidates
        .iter()
        .map(|c| dir.join(c))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let pickles = ["diffusion_pytorch_model.bin", "pytorch_model.bin"];
            if pickles.iter().any(|p| dir.join(p).is_file()) {
                DriftError::Unsupported(format!(
                    "{} holds only pickle weights (.bin), which can run code when loaded; convert them to \
                     safetensors",
                    dir.display()
                ))
            } else {
                DriftError::Other(format!("no safetensors weights in {}", dir.display()))
            }
        })
}

impl SdWeightSource {
    /// A diffusers component folder (`unet/`, `vae/`, ...).
    pub fn diffusers(dir: &Path, prefer_fp16: bool) -> Result<SdWeightSource> {
        let file = diffusers_component_files(dir, prefer_fp16)?;
        Ok(SdWeightSource {
            set: SafetensorsSet::open(&file)?,
            naming: Naming::Diffusers,
            path: dir.to_path_buf(),
        })
    }

    /// One part of a single-file LDM checkpoint (`.safetensors`; pickles are refused).
    pub fn single_file(path: &Path, part: SdPart) -> Result<SdWeightSource> {
        refuse_pickle(path)?;
        Ok(SdWeightSource {
            set: SafetensorsSet::open(path)?,
            naming: Naming::Ldm(part),
            path: path.to_path_buf(),
        })
    }

    /// Whether a single file has SD 1.x LDM UNet keys.
    pub fn is_ldm_checkpoint(set: &SafetensorsSet) -> bool {
        set.contains("model.diffusion_model.input_blocks.0.0.weight")
    }

    /// The file's name for a diffusers name (the name itself for diffusers folders).
    pub fn file_name(&self, name: &str) -> Option<String> {
        match &self.naming {
            Naming::Diffusers => Some(name.to_string()),
            Naming::Ldm(SdPart::Unet {
                layers_per_block,
                up_has_attention,
            }) => unet_ldm_name(name, *layers_per_block, up_has_attention),
            Naming::Ldm(SdPart::Vae { levels }) => vae_ldm_name(name, *levels),
            Naming::Ldm(SdPart::TextEncoder) => {
                let prefixed = format!("cond_stage_model.transformer.{name}");
                if self.set.contains(&prefixed) {
                    return Some(prefixed);
                }
                name.strip_prefix("text_model.")
                    .map(|n| format!("cond_stage_model.transformer.{n}"))
            }
        }
    }

    /// The tensor with diffusers name `name`.
    pub fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let file_name = self.file_name(name).ok_or_else(|| {
            DriftError::Other(format!(
                "{}: no checkpoint name for {name}",
                self.path.display()
            ))
        })?;
        if self.set.contains(&file_name) {
            return self.set.get(&file_name);
        }
        if let Some(old) = vae_legacy_name(name)
            && self.set.contains(&old)
        {
            return self.set.get(&old);
        }
        Err(DriftError::Other(format!(
            "{}: missing weight {name}{}",
            self.path.display(),
            if file_name != name {
                format!(" ({file_name})")
            } else {
                String::new()
            }
        )))
    }
}

/// Pickle checkpoints can execute code when unpickled: Drift never opens them.
pub fn refuse_pickle(path: &Path) -> Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if matches!(ext.as_str(), "ckpt" | "pt" | "pth" | "bin" | "pkl") {
        return Err(DriftError::Unsupported(format!(
            "{} is a pickle checkpoint: loading one can run arbitrary code, so Drift refuses it. Use the \
             .safetensors version of the model (most are published as one, or convert it once with a trusted \
             tool).",
            path.display()
        )));
    }
    Ok(())
}

/// Uploads the weights a graph names, converted to `dtype` (f32 or f16), in [`WeightDef`] order.
/// Shapes are checked against what the graph expects (a 1x1 conv is accepted for a linear weight).
pub fn upload_weights(
    gpu: &Gpu,
    source: &SdWeightSource,
    defs: &[WeightDef],
    dtype: DType,
) -> Result<Vec<Tensor>> {
    defs.iter()
        .map(|d| {
            let raw = source.get(&d.name)?;
            let n: usize = d.shape.iter().product();
            let squeezed: Vec<usize> = raw.shape.iter().copied().filter(|&s| s != 1).collect();
            let want: Vec<usize> = d.shape.iter().copied().filter(|&s| s != 1).collect();
            let ok =
                raw.shape == d.shape.as_slice() || (d.kind != WeightKind::Conv && squeezed == want);
            if !ok || raw.shape.iter().product::<usize>() != n {
                return Err(shape_err!(
                    "{}: weight {} is {:?}, the model config wants {:?}",
                    source.path.display(),
                    d.name,
                    raw.shape,
                    d.shape
                ));
            }
            let values = raw.to_f32()?;
            let bytes = encode_f32(&values, dtype)?;
            match d.kind {
                WeightKind::Conv => conv2d_weight(gpu, &d.name, &d.shape, dtype, &bytes),
                WeightKind::Linear | WeightKind::Vector => gpu.tensor_from_bytes(
                    &d.name,
                    &d.shape,
                    dtype,
                    Layout::RowMajor,
                    &bytes,
                    Category::Weights,
                ),
            }
        })
        .collect()
}

/// Deterministic random weights for `defs` (benchmarks with real shapes and no files): convs and
/// linears ~ U(-1, 1) / sqrt(fan_in), norm scales 1, biases and shifts small.
pub fn random_weights(
    gpu: &Gpu,
    defs: &[WeightDef],
    dtype: DType,
    seed: u64,
) -> Result<Vec<Tensor>> {
    let mut state = seed | 1;
    let mut next = move || {
        // xorshift64*: plenty for benchmark weights.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    defs.iter()
        .map(|d| {
            let n: usize = d.shape.iter().product();
            let values: Vec<f32> = match d.kind {
                WeightKind::Vector if d.name.ends_with("weight") => vec![1.0; n],
                WeightKind::Vector => (0..n).map(|_| 0.02 * next()).collect(),
                _ => {
                    let scale = 1.0 / ((n / d.shape[0].max(1)) as f32).sqrt();
                    (0..n).map(|_| scale * next()).collect()
                }
            };
            let bytes = encode_f32(&values, dtype)?;
            match d.kind {
                WeightKind::Conv => conv2d_weight(gpu, &d.name, &d.shape, dtype, &bytes),
                _ => gpu.tensor_from_bytes(
                    &d.name,
                    &d.shape,
                    dtype,
                    Layout::RowMajor,
                    &bytes,
                    Category::Weights,
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sd15_unet_names() {
        let up = [false, true, true, true];
        let m = |n: &str| unet_ldm_name(n, 2, &up).unwrap();
        assert_eq!(
            m("conv_in.weight"),
            "model.diffusion_model.input_blocks.0.0.weight"
        );
        assert_eq!(
            m("time_embedding.linear_2.bias"),
            "model.diffusion_model.time_embed.2.bias"
        );
        assert_eq!(
            m("down_blocks.1.resnets.0.conv_shortcut.weight"),
            "model.diffusion_model.input_blocks.4.0.skip_connection.weight"
        );
        assert_eq!(
            m("down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k.weight"),
            "model.diffusion_model.input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight"
        );
        assert_eq!(
            m("down_blocks.2.downsamplers.0.conv.weight"),
            "model.diffusion_model.input_blocks.9.0.op.weight"
        );
        assert_eq!(
            m("mid_block.resnets.1.norm2.bias"),
            "model.diffusion_model.middle_block.2.out_layers.0.bias"
        );
        assert_eq!(
            m("mid_block.attentions.0.proj_in.weight"),
            "model.diffusion_model.middle_block.1.proj_in.weight"
        );
        assert_eq!(
            m("up_blocks.0.upsamplers.0.conv.weight"),
            "model.diffusion_model.output_blocks.2.1.conv.weight"
        );
        assert_eq!(
            m("up_blocks.1.upsamplers.0.conv.weight"),
            "model.diffusion_model.output_blocks.5.2.conv.weight"
        );
        assert_eq!(
            m("up_blocks.3.resnets.2.time_emb_proj.weight"),
            "model.diffusion_model.output_blocks.11.0.emb_layers.1.weight"
        );
        assert_eq!(
            m("conv_norm_out.weight"),
            "model.diffusion_model.out.0.weight"
        );
    }

    #[test]
    fn sd15_vae_names() {
        let m = |n: &str| vae_ldm_name(n, 4).unwrap();
        assert_eq!(
            m("decoder.up_blocks.0.resnets.2.conv1.weight"),
            "first_stage_model.decoder.up.3.block.2.conv1.weight"
        );
        assert_eq!(
            m("decoder.up_blocks.2.upsamplers.0.conv.bias"),
            "first_stage_model.decoder.up.1.upsample.conv.bias"
        );
        assert_eq!(
            m("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"),
            "first_stage_model.encoder.down.1.block.0.nin_shortcut.weight"
        );
        assert_eq!(
            m("decoder.mid_block.attentions.0.to_out.0.weight"),
            "first_stage_model.decoder.mid.attn_1.proj_out.weight"
        );
        assert_eq!(
            m("encoder.mid_block.resnets.1.norm1.bias"),
            "first_stage_model.encoder.mid.block_2.norm1.bias"
        );
        assert_eq!(
            m("post_quant_conv.weight"),
            "first_stage_model.post_quant_conv.weight"
        );
        assert_eq!(
            m("decoder.conv_norm_out.weight"),
            "first_stage_model.decoder.norm_out.weight"
        );
    }
}
