//! Stable Diffusion's AutoencoderKL (diffusers `vae/config.json`) on Drift's kernels: the decoder
//! (post_quant_conv, conv_in, mid block with a single-head attention, up blocks of ResNets with
//! nearest 2x + conv upsampling, GroupNorm+SiLU, conv_out) and the encoder for img2img (conv_in, down
//! blocks with stride-2 convs padded (0, 1), mid block, conv_out to the posterior moments,
//! quant_conv). Latents are scaled by the config's `scaling_factor` (0.18215 for SD 1.x) by the
//! caller: [`VaeConfig::scaling_factor`].
//!
//! The mid-block attention has one head as wide as the top level (512 in SD), over the flash kernel's
//! head limit: its scores go through matmul + softmax (`[B, HW, HW]`, 32 MiB in f16 at 512x512).

use serde::Serialize;
use serde_json::Value;

use crate::error::{DriftError, Result};
use crate::gpu::Gpu;
use crate::models::sd_graph::{BuiltGraph, Graph, MemoryPlan, TId};
use crate::models::sd_weights::{SdPart, SdWeightSource, upload_weights};
use crate::shape_err;
use crate::tensor::{DType, Tensor};

#[derive(Clone, Debug, Serialize)]
pub struct VaeConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub latent_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub norm_num_groups: usize,
    pub scaling_factor: f32,
    pub mid_block_add_attention: bool,
}

impl VaeConfig {
    pub fn from_json(text: &str) -> Result<VaeConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| DriftError::Other(format!("vae config.json: {e}")))?;
        let num = |k: &str, d: f64| v[k].as_f64().unwrap_or(d);
        let block_out_channels: Vec<usize> = v["block_out_channels"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect())
            .ok_or_else(|| DriftError::Other("vae config: block_out_channels missing".into()))?;
        for k in ["down_block_types", "up_block_types"] {
            let ok = v[k].as_array().is_some_and(|a| {
                a.len() == block_out_channels.len()
                    && a.iter().all(|t| {
                        matches!(t.as_str(), Some("DownEncoderBlock2D" | "UpDecoderBlock2D"))
                    })
            });
            if !ok {
                return Err(DriftError::Unsupported(format!(
                    "vae config: {k} = {}",
                    v[k]
                )));
            }
        }
        if !v["shift_factor"].is_null() && v["shift_factor"].as_f64() != Some(0.0) {
            return Err(DriftError::Unsupported(
                "vae config: shift_factor (not an SD 1.x VAE)".into(),
            ));
        }
        Ok(VaeConfig {
            in_channels: num("in_channels", 3.0) as usize,
            out_channels: num("out_channels", 3.0) as usize,
            latent_channels: num("latent_channels", 4.0) as usize,
            layers_per_block: num("layers_per_block", 2.0) as usize,
            norm_num_groups: num("norm_num_groups", 32.0) as usize,
            scaling_factor: num("scaling_factor", 0.18215) as f32,
            mid_block_add_attention: v["mid_block_add_attention"].as_bool().unwrap_or(true),
            block_out_channels,
        })
    }

    /// SD 1.x's VAE.
    pub fn sd15() -> VaeConfig {
        VaeConfig {
            in_channels: 3,
            out_channels: 3,
            latent_channels: 4,
            block_out_channels: vec![128, 256, 512, 512],
            layers_per_block: 2,
            norm_num_groups: 32,
            scaling_factor: 0.18215,
            mid_block_add_attention: true,
        }
    }

    pub fn ldm_part(&self) -> SdPart {
        SdPart::Vae {
            levels: self.block_out_channels.len(),
        }
    }

    /// Pixels per latent along each side.
    pub fn downscale(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }
}

const EPS: f32 = 1e-6;

fn resnet(g: &mut Graph, groups: usize, p: &str, x: TId, out_c: usize) -> Result<TId> {
    let in_c = g.shape(x)[1];
    let h = g.group_norm(&format!("{p}.norm1"), x, groups, EPS, true)?;
    let h = g.conv(&format!("{p}.conv1"), h, out_c, 3, 1, 1, None, None)?;
    let h = g.group_norm(&format!("{p}.norm2"), h, groups, EPS, true)?;
    let skip = if in_c != out_c {
        g.conv(&format!("{p}.conv_shortcut"), x, out_c, 1, 1, 0, None, None)?
    } else {
        x
    };
    g.conv(&format!("{p}.conv2"), h, out_c, 3, 1, 1, None, Some(skip))
}

fn attention(g: &mut Graph, groups: usize, p: &str, x: TId) -> Result<TId> {
    let s = g.shape(x).to_vec();
    let (c, h, w) = (s[1], s[2], s[3]);
    let n = g.group_norm(&format!("{p}.group_norm"), x, groups, EPS, false)?;
    let t = g.nchw_to_tokens(n)?;
    let q = g.linear(&format!("{p}.to_q"), t, c, true)?;
    let k = g.linear(&format!("{p}.to_k"), t, c, true)?;
    let v = g.linear(&format!("{p}.to_v"), t, c, true)?;
    let a = g.attention(p, q, k, v, 1)?;
    let o = g.linear(&format!("{p}.to_out.0"), a, c, true)?;
    let o = g.tokens_to_nchw(o, h, w)?;
    Ok(g.add(o, x, true))
}

fn mid(g: &mut Graph, cfg: &VaeConfig, side: &str, x: TId) -> Result<TId> {
    let (groups, top) = (cfg.norm_num_groups, *cfg.block_out_channels.last().unwrap());
    let mut x = resnet(g, groups, &format!("{side}.mid_block.resnets.0"), x, top)?;
    if cfg.mid_block_add_attention {
        x = attention(g, groups, &format!("{side}.mid_block.attentions.0"), x)?;
    }
    resnet(g, groups, &format!("{side}.mid_block.resnets.1"), x, top)
}

/// The decoder graph: input `[B, latent_channels, h, w]` (already divided by the scaling factor),
/// output `[B, out_channels, h * downscale, w * downscale]` in about [-1, 1].
pub fn decoder_graph(
    cfg: &VaeConfig,
    batch: usize,
    h: usize,
    w: usize,
    dtype: DType,
) -> Result<(Graph, TId, TId)> {
    let mut g = Graph::new(dtype);
    let groups = cfg.norm_num_groups;
    let levels = cfg.block_out_channels.len();
    let z = g.input("latents", &[batch, cfg.latent_channels, h, w]);
    let x = g.conv(
        "post_quant_conv",
        z,
        cfg.latent_channels,
        1,
        1,
        0,
        None,
        None,
    )?;
    let top = cfg.block_out_channels[levels - 1];
    let mut x = g.conv("decoder.conv_in", x, top, 3, 1, 1, None, None)?;
    x = mid(&mut g, cfg, "decoder", x)?;
    for i in 0..levels {
        let oc = cfg.block_out_channels[levels - 1 - i];
        for j in 0..=cfg.layers_per_block {
            x = resnet(
                &mut g,
                groups,
                &format!("decoder.up_blocks.{i}.resnets.{j}"),
                x,
                oc,
            )?;
        }
        if i + 1 < levels {
            let u = g.upsample(x);
            x = g.conv(
                &format!("decoder.up_blocks.{i}.upsamplers.0.conv"),
                u,
                oc,
                3,
                1,
                1,
                None,
                None,
            )?;
        }
    }
    let n = g.group_norm("decoder.conv_norm_out", x, groups, EPS, true)?;
    let out = g.conv("decoder.conv_out", n, cfg.out_channels, 3, 1, 1, None, None)?;
    g.mark_output(out)?;
    Ok((g, z, out))
}

/// The encoder graph: input `[B, in_channels, H, W]` in [-1, 1], output the posterior moments
/// `[B, 2 latent_channels, H / downscale, W / downscale]` (mean, then log-variance).
pub fn encoder_graph(
    cfg: &VaeConfig,
    batch: usize,
    h: usize,
    w: usize,
    dtype: DType,
) -> Result<(Graph, TId, TId)> {
    let mut g = Graph::new(dtype);
    let groups = cfg.norm_num_groups;
    let levels = cfg.block_out_channels.len();
    let img = g.input("image", &[batch, cfg.in_channels, h, w]);
    let mut x = g.conv(
        "encoder.conv_in",
        img,
        cfg.block_out_channels[0],
        3,
        1,
        1,
        None,
        None,
    )?;
    for (i, &oc) in cfg.block_out_channels.iter().enumerate() {
        for j in 0..cfg.layers_per_block {
            x = resnet(
                &mut g,
                groups,
                &format!("encoder.down_blocks.{i}.resnets.{j}"),
                x,
                oc,
            )?;
        }
        if i + 1 < levels {
            // diffusers pads (0, 1, 0, 1) and convolves without padding.
            x = g.conv(
                &format!("encoder.down_blocks.{i}.downsamplers.0.conv"),
                x,
                oc,
                3,
                2,
                0,
                Some(1),
                None,
            )?;
        }
    }
    x = mid(&mut g, cfg, "encoder", x)?;
    let n = g.group_norm("encoder.conv_norm_out", x, groups, EPS, true)?;
    let m = g.conv(
        "encoder.conv_out",
        n,
        2 * cfg.latent_channels,
        3,
        1,
        1,
        None,
        None,
    )?;
    let out = g.conv(
        "quant_conv",
        m,
        2 * cfg.latent_channels,
        1,
        1,
        0,
        None,
        None,
    )?;
    g.mark_output(out)?;
    Ok((g, img, out))
}

/// Naive vs planned activation bytes of the decoder for `batch` images of `h` x `w` latents.
pub fn decoder_memory_plan(
    cfg: &VaeConfig,
    batch: usize,
    h: usize,
    w: usize,
    dtype: DType,
) -> Result<MemoryPlan> {
    Ok(decoder_graph(cfg, batch, h, w, dtype)?.0.memory_plan())
}

/// One VAE network (decoder or encoder) on the GPU for one batch and size.
pub struct VaeNet {
    pub graph: Graph,
    pub input: TId,
    pub output: TId,
    pub built: BuiltGraph,
    pub weights: Vec<Tensor>,
}

impl VaeNet {
    fn new(
        gpu: &Gpu,
        graph: Graph,
        input: TId,
        output: TId,
        source: &SdWeightSource,
        label: &str,
    ) -> Result<VaeNet> {
        let weights = upload_weights(gpu, source, &graph.weights, graph.dtype)?;
        Self::with_weights(gpu, graph, input, output, weights, label)
    }

    /// The decoder with random weights (benchmarks at real shapes without a file).
    pub fn decoder_random(
        gpu: &Gpu,
        cfg: &VaeConfig,
        (batch, h, w): (usize, usize, usize),
        dtype: DType,
        seed: u64,
    ) -> Result<VaeNet> {
        let (g, i, o) = decoder_graph(cfg, batch, h, w, dtype)?;
        let weights = crate::models::sd_weights::random_weights(gpu, &g.weights, dtype, seed)?;
        Self::with_weights(gpu, g, i, o, weights, "vae decoder")
    }

    fn with_weights(
        gpu: &Gpu,
        graph: Graph,
        input: TId,
        output: TId,
        weights: Vec<Tensor>,
        label: &str,
    ) -> Result<VaeNet> {
        let built = graph.build(gpu, label, &weights)?;
        Ok(VaeNet {
            graph,
            input,
            output,
            built,
            weights,
        })
    }

    /// The decoder for `batch` latents of `h` x `w`.
    pub fn decoder(
        gpu: &Gpu,
        cfg: &VaeConfig,
        source: &SdWeightSource,
        batch: usize,
        h: usize,
        w: usize,
        dtype: DType,
    ) -> Result<VaeNet> {
        let (g, i, o) = decoder_graph(cfg, batch, h, w, dtype)?;
        VaeNet::new(gpu, g, i, o, source, "vae decoder")
    }

    /// The encoder for `batch` images of `h` x `w` pixels (multiples of the downscale factor).
    pub fn encoder(
        gpu: &Gpu,
        cfg: &VaeConfig,
        source: &SdWeightSource,
        batch: usize,
        h: usize,
        w: usize,
        dtype: DType,
    ) -> Result<VaeNet> {
        if !h.is_multiple_of(cfg.downscale()) || !w.is_multiple_of(cfg.downscale()) {
            return Err(shape_err!(
                "vae encoder: {h}x{w} is not a multiple of {}",
                cfg.downscale()
            ));
        }
        let (g, i, o) = encoder_graph(cfg, batch, h, w, dtype)?;
        VaeNet::new(gpu, g, i, o, source, "vae encoder")
    }

    pub fn input(&self) -> Result<&Tensor> {
        self.built.tensor(self.input)
    }

    pub fn output(&self) -> Result<&Tensor> {
        self.built.tensor(self.output)
    }

    /// Writes `input`, runs, reads the output.
    pub fn run(&self, gpu: &Gpu, input: &[f32]) -> Result<Vec<f32>> {
        gpu.write_tensor_f32(self.input()?, input)?;
        self.built.program.run(gpu)?;
        gpu.read_f32(self.output()?)
    }
}

/// The posterior mean (the first half of each batch entry's moments).
pub fn moments_mean(moments: &[f32], batch: usize) -> Vec<f32> {
    let per = moments.len() / batch.max(1);
    moments
        .chunks(per.max(1))
        .flat_map(|c| c[..per / 2].iter().copied())
        .collect()
}
