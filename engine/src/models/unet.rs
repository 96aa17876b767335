//! Stable Diffusion 1.x's UNet2DConditionModel on Drift's kernels, driven by diffusers'
//! `unet/config.json`: sinusoidal timestep embedding (computed on the CPU, `[B, C0]`) and its MLP,
//! ResNet blocks (GroupNorm+SiLU, 3x3 conv, time projection, skip 1x1 conv fused as the second conv's
//! residual), Transformer2D blocks (GroupNorm, proj_in as 1x1 conv or linear, self-attention,
//! cross-attention over the text states, GEGLU feed-forward, proj_out with the residual fused),
//! stride-2 downsampling, nearest 2x + conv upsampling and the skip concatenations.
//!
//! The network is recorded as a [`Graph`] for one batch and latent size: [`unet_graph`] alone gives
//! the memory plan (no weights, no GPU); [`Unet::new`] uploads weights and builds the program once.

use serde::Serialize;
use serde_json::Value;

use crate::error::{DriftError, Result};
use crate::gpu::Gpu;
use crate::kernels::activation::UnaryOp;
use crate::models::sd_graph::{BuiltGraph, Graph, MemoryPlan, TId};
use crate::models::sd_weights::{SdPart, SdWeightSource, upload_weights};
use crate::shape_err;
use crate::tensor::{DType, Tensor};

/// The fields of diffusers' UNet2DConditionModel config that SD 1.x/2.x use.
#[derive(Clone, Debug, Serialize)]
pub struct UnetConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    /// Heads per level (diffusers' SD 1.x configs call this `attention_head_dim`).
    pub heads: Vec<usize>,
    pub transformer_layers: Vec<usize>,
    pub cross_attention_dim: usize,
    pub norm_num_groups: usize,
    pub norm_eps: f32,
    pub flip_sin_to_cos: bool,
    pub freq_shift: f32,
    pub use_linear_projection: bool,
    pub sample_size: usize,
}

fn per_level(v: &Value, levels: usize, what: &str) -> Result<Option<Vec<usize>>> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => Ok(Some(vec![n.as_u64().unwrap_or(0) as usize; levels])),
        Value::Array(a) if a.len() == levels => Ok(Some(
            a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect(),
        )),
        _ => Err(DriftError::Other(format!(
            "unet config: {what} must be a number or {levels} numbers"
        ))),
    }
}

impl UnetConfig {
    pub fn from_json(text: &str) -> Result<UnetConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| DriftError::Other(format!("unet config.json: {e}")))?;
        let usizes = |k: &str| -> Result<Vec<usize>> {
            v[k].as_array()
                .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect())
                .ok_or_else(|| DriftError::Other(format!("unet config: {k} missing")))
        };
        let strings = |k: &str| -> Result<Vec<String>> {
            v[k].as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| x.as_str().unwrap_or("").to_string())
                        .collect()
                })
                .ok_or_else(|| DriftError::Other(format!("unet config: {k} missing")))
        };
        let num = |k: &str, d: f64| v[k].as_f64().unwrap_or(d);
        let block_out_channels = usizes("block_out_channels")?;
        let levels = block_out_channels.len();
        // SD 1.x sets `attention_head_dim` to what is really the number of heads; diffusers reads it
        // that way when `num_attention_heads` is absent.
        let heads = per_level(&v["num_attention_heads"], levels, "num_attention_heads")?
            .or(per_level(
                &v["attention_head_dim"],
                levels,
                "attention_head_dim",
            )?)
            .unwrap_or(vec![8; levels]);
        let transformer_layers = per_level(
            &v["transformer_layers_per_block"],
            levels,
            "transformer_layers_per_block",
        )?
        .unwrap_or(vec![1; levels]);
        let cfg = UnetConfig {
            in_channels: num("in_channels", 4.0) as usize,
            out_channels: num("out_channels", 4.0) as usize,
            layers_per_block: v["layers_per_block"].as_u64().unwrap_or(2) as usize,
            down_block_types: strings("down_block_types")?,
            up_block_types: strings("up_block_types")?,
            heads,
            transformer_layers,
            cross_attention_dim: num("cross_attention_dim", 768.0) as usize,
            norm_num_groups: num("norm_num_groups", 32.0) as usize,
            norm_eps: num("norm_eps", 1e-5) as f32,
            flip_sin_to_cos: v["flip_sin_to_cos"].as_bool().unwrap_or(true),
            freq_shift: num("freq_shift", 0.0) as f32,
            use_linear_projection: v["use_linear_projection"].as_bool().unwrap_or(false),
            sample_size: num("sample_size", 64.0) as usize,
            block_out_channels,
        };
        let unsupported = |what: &str| Err(DriftError::Unsupported(format!("unet config: {what}")));
        if cfg.down_block_types.len() != levels || cfg.up_block_types.len() != levels {
            return unsupported(
                "down/up block types must have one entry per block_out_channels level",
            );
        }
        // Each key may be absent/null or one of the listed JSON values.
        for (k, allowed) in [
            ("mid_block_type", &["\"UNetMidBlock2DCrossAttn\""][..]),
            ("time_embedding_type", &["\"positional\""]),
            ("class_embed_type", &[]),
            ("addition_embed_type", &[]),
            ("encoder_hid_dim_type", &[]),
            ("time_cond_proj_dim", &[]),
            ("resnet_time_scale_shift", &["\"default\""]),
            ("only_cross_attention", &["false"]),
            ("dual_cross_attention", &["false"]),
            ("center_input_sample", &["false"]),
            ("act_fn", &["\"silu\""]),
        ] {
            if !v[k].is_null() && !allowed.contains(&v[k].to_string().as_str()) {
                return unsupported(&format!("{k} = {}", v[k]));
            }
        }
        for (k, d) in [
            ("conv_in_kernel", 3.0),
            ("conv_out_kernel", 3.0),
            ("downsample_padding", 1.0),
        ] {
            if num(k, d) != d {
                return unsupported(&format!("{k} = {}", v[k]));
            }
        }
        for t in cfg.down_block_types.iter().chain(&cfg.up_block_types) {
            if !matches!(
                t.as_str(),
                "CrossAttnDownBlock2D" | "DownBlock2D" | "CrossAttnUpBlock2D" | "UpBlock2D"
            ) {
                return unsupported(&format!("block type {t}"));
            }
        }
        Ok(cfg)
    }

    pub fn time_embed_dim(&self) -> usize {
        self.block_out_channels[0] * 4
    }

    pub fn down_cross(&self, i: usize) -> bool {
        self.down_block_types[i].starts_with("CrossAttn")
    }

    pub fn up_cross(&self, i: usize) -> bool {
        self.up_block_types[i].starts_with("CrossAttn")
    }

    /// What a single-file checkpoint's name mapping needs.
    pub fn ldm_part(&self) -> SdPart {
        SdPart::Unet {
            layers_per_block: self.layers_per_block,
            up_has_attention: (0..self.up_block_types.len())
                .map(|i| self.up_cross(i))
                .collect(),
        }
    }
}

/// diffusers' `get_timestep_embedding` for one timestep, `dim` values (f64 math).
pub fn timestep_embedding(t: f32, dim: usize, flip_sin_to_cos: bool, freq_shift: f32) -> Vec<f32> {
    let half = dim / 2;
    let mut out = vec![0f32; dim];
    for i in 0..half {
        let exponent = -(10000f64).ln() * i as f64 / (half as f64 - freq_shift as f64);
        let arg = t as f64 * exponent.exp();
        let (s, c) = (arg.sin() as f32, arg.cos() as f32);
        if flip_sin_to_cos {
            out[i] = c;
            out[half + i] = s;
        } else {
            out[i] = s;
            out[half + i] = c;
        }
    }
    out
}

/// Graph tensors the caller writes and reads.
#[derive(Clone, Copy, Debug)]
pub struct UnetIo {
    /// `[B, in_channels, H, W]`.
    pub latents: TId,
    /// `[B, block_out_channels[0]]`: the sinusoidal timestep embedding.
    pub timestep: TId,
    /// `[B, L, cross_attention_dim]`: text encoder states.
    pub encoder: TId,
    /// `[B, out_channels, H, W]`.
    pub out: TId,
}

struct Builder<'a> {
    g: Graph,
    cfg: &'a UnetConfig,
    temb: TId,
    encoder: TId,
}

impl Builder<'_> {
    fn resnet(&mut self, p: &str, x: TId, out_c: usize) -> Result<TId> {
        let (groups, eps) = (self.cfg.norm_num_groups, self.cfg.norm_eps);
        let in_c = self.g.shape(x)[1];
        let b = self.g.shape(x)[0];
        let h = self
            .g
            .group_norm(&format!("{p}.norm1"), x, groups, eps, true)?;
        let h = self
            .g
            .conv(&format!("{p}.conv1"), h, out_c, 3, 1, 1, None, None)?;
        let t = self
            .g
            .linear(&format!("{p}.time_emb_proj"), self.temb, out_c, true)?;
        let t4 = self.g.view(t, &[b, out_c, 1, 1])?;
        let h = self.g.add(h, t4, true);
        let h = self
            .g
            .group_norm(&format!("{p}.norm2"), h, groups, eps, true)?;
        let skip = if in_c != out_c {
            self.g
                .conv(&format!("{p}.conv_shortcut"), x, out_c, 1, 1, 0, None, None)?
        } else {
            x
        };
        self.g
            .conv(&format!("{p}.conv2"), h, out_c, 3, 1, 1, None, Some(skip))
    }

    fn attention(&mut self, p: &str, x: TId, context: Option<TId>, heads: usize) -> Result<TId> {
        let c = *self.g.shape(x).last().unwrap();
        let q = self.g.linear(&format!("{p}.to_q"), x, c, false)?;
        let ctx = context.unwrap_or(x);
        let k = self.g.linear(&format!("{p}.to_k"), ctx, c, false)?;
        let v = self.g.linear(&format!("{p}.to_v"), ctx, c, false)?;
        let a = self.g.attention(p, q, k, v, heads)?;
        self.g.linear(&format!("{p}.to_out.0"), a, c, true)
    }

    fn transformer(&mut self, p: &str, x: TId, heads: usize, layers: usize) -> Result<TId> {
        let s = self.g.shape(x).to_vec();
        let (c, h, w) = (s[1], s[2], s[3]);
        let n = self.g.group_norm(
            &format!("{p}.norm"),
            x,
            self.cfg.norm_num_groups,
            1e-6,
            false,
        )?;
        let linear = self.cfg.use_linear_projection;
        let mut t = if linear {
            let tok = self.g.nchw_to_tokens(n)?;
            self.g.linear(&format!("{p}.proj_in"), tok, c, true)?
        } else {
            let pi = self
                .g
                .conv(&format!("{p}.proj_in"), n, c, 1, 1, 0, None, None)?;
            self.g.nchw_to_tokens(pi)?
        };
        for l in 0..layers {
            let bp = format!("{p}.transformer_blocks.{l}");
            let n1 = self.g.layer_norm(&format!("{bp}.norm1"), t, 1e-5)?;
            let a1 = self.attention(&format!("{bp}.attn1"), n1, None, heads)?;
            t = self.g.add(a1, t, true);
            let n2 = self.g.layer_norm(&format!("{bp}.norm2"), t, 1e-5)?;
            let a2 = self.attention(&format!("{bp}.attn2"), n2, Some(self.encoder), heads)?;
            t = self.g.add(a2, t, true);
            let n3 = self.g.layer_norm(&format!("{bp}.norm3"), t, 1e-5)?;
            let inner = 4 * c;
            let pr = self
                .g
                .linear(&format!("{bp}.ff.net.0.proj"), n3, 2 * inner, true)?;
            let gg = self.g.geglu(pr)?;
            let f = self.g.linear(&format!("{bp}.ff.net.2"), gg, c, true)?;
            t = self.g.add(f, t, true);
        }
        if linear {
            let o = self.g.linear(&format!("{p}.proj_out"), t, c, true)?;
            let o = self.g.tokens_to_nchw(o, h, w)?;
            Ok(self.g.add(o, x, true))
        } else {
            let o = self.g.tokens_to_nchw(t, h, w)?;
            self.g
                .conv(&format!("{p}.proj_out"), o, c, 1, 1, 0, None, Some(x))
        }
    }
}

/// Records the UNet for `batch` latents of `h` x `w` with `context_len` text tokens.
pub fn unet_graph(
    cfg: &UnetConfig,
    batch: usize,
    h: usize,
    w: usize,
    context_len: usize,
    dtype: DType,
) -> Result<(Graph, UnetIo)> {
    let levels = cfg.block_out_channels.len();
    let down_factor = 1usize << (levels - 1);
    if !h.is_multiple_of(down_factor) || !w.is_multiple_of(down_factor) || h == 0 || w == 0 {
        return Err(shape_err!(
            "unet: latent size {h}x{w} must be a multiple of {down_factor}"
        ));
    }
    let mut g = Graph::new(dtype);
    let c0 = cfg.block_out_channels[0];
    let latents = g.input("latents", &[batch, cfg.in_channels, h, w]);
    let timestep = g.input("timestep embedding", &[batch, c0]);
    let encoder = g.input(
        "encoder states",
        &[batch, context_len, cfg.cross_attention_dim],
    );
    // Time MLP; every ResNet projects silu(temb).
    let ted = cfg.time_embed_dim();
    let t1 = g.linear("time_embedding.linear_1", timestep, ted, true)?;
    let t1 = g.unary(UnaryOp::Silu, t1);
    let t2 = g.linear("time_embedding.linear_2", t1, ted, true)?;
    let temb = g.unary(UnaryOp::Silu, t2);
    let mut b = Builder {
        g,
        cfg,
        temb,
        encoder,
    };
    let mut x = b.g.conv("conv_in", latents, c0, 3, 1, 1, None, None)?;
    let mut skips = vec![x];
    for (i, &oc) in cfg.block_out_channels.iter().enumerate() {
        for j in 0..cfg.layers_per_block {
            x = b.resnet(&format!("down_blocks.{i}.resnets.{j}"), x, oc)?;
            if cfg.down_cross(i) {
                x = b.transformer(
                    &format!("down_blocks.{i}.attentions.{j}"),
                    x,
                    cfg.heads[i],
                    cfg.transformer_layers[i],
                )?;
            }
            skips.push(x);
        }
        if i + 1 < levels {
            x = b.g.conv(
                &format!("down_blocks.{i}.downsamplers.0.conv"),
                x,
                oc,
                3,
                2,
                1,
                None,
                None,
            )?;
            skips.push(x);
        }
    }
    let top = cfg.block_out_channels[levels - 1];
    x = b.resnet("mid_block.resnets.0", x, top)?;
    x = b.transformer(
        "mid_block.attentions.0",
        x,
        cfg.heads[levels - 1],
        cfg.transformer_layers[levels - 1],
    )?;
    x = b.resnet("mid_block.resnets.1", x, top)?;
    for i in 0..levels {
        let lvl = levels - 1 - i;
        let oc = cfg.block_out_channels[lvl];
        for j in 0..=cfg.layers_per_block {
            let skip = skips
                .pop()
                .ok_or_else(|| shape_err!("unet: skip stack underflow"))?;
            let cat = b.g.concat(x, skip);
            x = b.resnet(&format!("up_blocks.{i}.resnets.{j}"), cat, oc)?;
            if cfg.up_cross(i) {
                x = b.transformer(
                    &format!("up_blocks.{i}.attentions.{j}"),
                    x,
                    cfg.heads[lvl],
                    cfg.transformer_layers[lvl],
                )?;
            }
        }
        if i + 1 < levels {
            let up = b.g.upsample(x);
            x = b.g.conv(
                &format!("up_blocks.{i}.upsamplers.0.conv"),
                up,
                oc,
                3,
                1,
                1,
                None,
                None,
            )?;
        }
    }
    let n =
        b.g.group_norm("conv_norm_out", x, cfg.norm_num_groups, cfg.norm_eps, true)?;
    let out =
        b.g.conv("conv_out", n, cfg.out_channels, 3, 1, 1, None, None)?;
    b.g.mark_output(out)?;
    Ok((
        b.g,
        UnetIo {
            latents,
            timestep,
            encoder,
            out,
        },
    ))
}

/// Naive vs planned activation bytes of the UNet (e.g. SD 1.5 at 512x512: batch 2, 64x64 latents, 77
/// tokens, f16), from the graph alone.
pub fn unet_memory_plan(
    cfg: &UnetConfig,
    batch: usize,
    h: usize,
    w: usize,
    context_len: usize,
    dtype: DType,
) -> Result<MemoryPlan> {
    Ok(unet_graph(cfg, batch, h, w, context_len, dtype)?
        .0
        .memory_plan())
}

/// SD 1.5's UNet config (for benchmarks with random weights).
pub fn sd15_config() -> UnetConfig {
    UnetConfig {
        in_channels: 4,
        out_channels: 4,
        block_out_channels: vec![320, 640, 1280, 1280],
        layers_per_block: 2,
        down_block_types: [
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "DownBlock2D",
        ]
        .map(String::from)
        .to_vec(),
        up_block_types: [
            "UpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
        ]
        .map(String::from)
        .to_vec(),
        heads: vec![8; 4],
        transformer_layers: vec![1; 4],
        cross_attention_dim: 768,
        norm_num_groups: 32,
        norm_eps: 1e-5,
        flip_sin_to_cos: true,
        freq_shift: 0.0,
        use_linear_projection: false,
        sample_size: 64,
    }
}

/// A UNet on the GPU for one batch size and latent size.
pub struct Unet {
    pub config: UnetConfig,
    pub graph: Graph,
    pub io: UnetIo,
    pub built: BuiltGraph,
    pub weights: Vec<Tensor>,
}

impl Unet {
    /// Uploads the weights (converted to `dtype`) and builds the program.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        config: UnetConfig,
        source: &SdWeightSource,
        batch: usize,
        h: usize,
        w: usize,
        context_len: usize,
        dtype: DType,
    ) -> Result<Unet> {
        let (graph, io) = unet_graph(&config, batch, h, w, context_len, dtype)?;
        let weights = upload_weights(gpu, source, &graph.weights, dtype)?;
        Self::with_weights(gpu, config, graph, io, weights)
    }

    /// Builds from already uploaded weights (in `graph.weights` order), e.g. random benchmark weights.
    pub fn with_weights(
        gpu: &Gpu,
        config: UnetConfig,
        graph: Graph,
        io: UnetIo,
        weights: Vec<Tensor>,
    ) -> Result<Unet> {
        let built = graph.build(gpu, "unet", &weights)?;
        Ok(Unet {
            config,
            graph,
            io,
            built,
            weights,
        })
    }

    pub fn latents(&self) -> Result<&Tensor> {
        self.built.tensor(self.io.latents)
    }

    pub fn encoder_states(&self) -> Result<&Tensor> {
        self.built.tensor(self.io.encoder)
    }

    pub fn output(&self) -> Result<&Tensor> {
        self.built.tensor(self.io.out)
    }

    /// Writes the sinusoidal embedding of `t` for every batch entry.
    pub fn set_timestep(&self, gpu: &Gpu, t: f32) -> Result<()> {
        let tt = self.built.tensor(self.io.timestep)?;
        let e = timestep_embedding(
            t,
            tt.shape[1],
            self.config.flip_sin_to_cos,
            self.config.freq_shift,
        );
        let all: Vec<f32> = (0..tt.shape[0]).flat_map(|_| e.iter().copied()).collect();
        gpu.write_tensor_f32(tt, &all)
    }

    /// Uploads the text conditioning, once per image: it is the same for every denoising step.
    pub fn set_encoder_states(&self, gpu: &Gpu, encoder: &[f32]) -> Result<()> {
        gpu.write_tensor_f32(self.encoder_states()?, encoder)
    }

    /// One denoising step on `latents` at timestep `t`, with the conditioning last given to
    /// [`Unet::set_encoder_states`]: writes the inputs, runs, reads the noise prediction back.
    pub fn forward(&self, gpu: &Gpu, latents: &[f32], t: f32) -> Result<Vec<f32>> {
        gpu.write_tensor_f32(self.latents()?, latents)?;
        self.set_timestep(gpu, t)?;
        self.built.program.run(gpu)?;
        gpu.read_f32(self.output()?)
    }
}
