//! CLIP text encoder (transformers' `CLIPTextModel`, Stable Diffusion's `text_encoder/`) on Drift's
//! kernels: token + position embeddings, pre-LN transformer layers (causal self-attention, MLP with
//! quick_gelu or gelu), final layer norm; `last_hidden_state` `[B, L, hidden]`. A clip-skip option
//! returns an earlier layer's hidden state through the final layer norm, as diffusers' `clip_skip`.
//!
//! Weights are f16 on the GPU where the device has shader-f16 (f32 otherwise); the residual stream,
//! layer norm statistics, matmul accumulation and the layer norm / bias parameters stay f32. The
//! dispatches for one batch size are built once into a [`ClipProgram`]; a prompt batch writes its ids
//! and submits once.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{DriftError, Result};
use crate::exec::Program;
use crate::formats::safetensors::SafetensorsSet;
use crate::gpu::Gpu;
use crate::kernels::activation::{UnaryOp, unary};
use crate::kernels::attention::{AttentionOptions, attention};
use crate::kernels::elementwise::{BinaryOp, binary};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{MatmulOptions, matmul};
use crate::kernels::norm::layernorm;
use crate::kernels::softmax::RowVariant;
use crate::memory::Category;
use crate::shape_err;
use crate::tensor::{DType, Layout, Tensor};

/// `config.json` of a CLIP text model (`CLIPTextConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClipTextConfig {
    pub vocab_size: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub max_positions: usize,
    /// `hidden_act`: quick_gelu (SD 1.x, OpenAI CLIP), gelu (exact, SD 2.x / OpenCLIP), gelu_new.
    pub act: UnaryOp,
    pub eps: f32,
}

impl ClipTextConfig {
    /// openai/clip-vit-large-patch14, SD 1.x's text encoder.
    pub fn sd15() -> ClipTextConfig {
        ClipTextConfig {
            vocab_size: 49408,
            hidden: 768,
            intermediate: 3072,
            layers: 12,
            heads: 12,
            max_positions: 77,
            act: UnaryOp::QuickGelu,
            eps: 1e-5,
        }
    }

    pub fn from_json(text: &str) -> Result<ClipTextConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| DriftError::Other(format!("CLIP config.json: {e}")))?;
        Self::from_value(&v)
    }

    /// From a `CLIPTextConfig` JSON object, or a `CLIPConfig` holding one under `text_config`.
    pub fn from_value(v: &Value) -> Result<ClipTextConfig> {
        let v = if v["text_config"].is_object() {
            &v["text_config"]
        } else {
            v
        };
        let d = ClipTextConfig::sd15();
        let num = |k: &str, def: usize| -> Result<usize> {
            match &v[k] {
                Value::Null => Ok(def),
                x => x.as_u64().map(|n| n as usize).ok_or_else(|| {
                    DriftError::Other(format!("CLIP config: {k} is not a number: {x}"))
                }),
            }
        };
        let act = match v["hidden_act"].as_str().unwrap_or("quick_gelu") {
            "quick_gelu" => UnaryOp::QuickGelu,
            "gelu" => UnaryOp::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => UnaryOp::GeluTanh,
            other => {
                return Err(DriftError::Unsupported(format!(
                    "CLIP hidden_act {other:?}"
                )));
            }
        };
        let cfg = ClipTextConfig {
            vocab_size: num("vocab_size", d.vocab_size)?,
            hidden: num("hidden_size", d.hidden)?,
            intermediate: num("intermediate_size", d.intermediate)?,
            layers: num("num_hidden_layers", d.layers)?,
            heads: num("num_attention_heads", d.heads)?,
            max_positions: num("max_position_embeddings", d.max_positions)?,
            act,
            eps: v["layer_norm_eps"].as_f64().unwrap_or(1e-5) as f32,
        };
        if cfg.heads == 0 || cfg.hidden == 0 || !cfg.hidden.is_multiple_of(cfg.heads) {
            return Err(DriftError::Other(format!(
                "CLIP config: hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden, cfg.heads
            )));
        }
        Ok(cfg)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

struct Linear {
    /// `[out, in]` (nn.Linear layout), the model's dtype.
    w: Tensor,
    /// `[out]` f32.
    b: Tensor,
}

struct Norm {
    g: Tensor,
    b: Tensor,
}

struct Layer {
    ln1: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// A loaded text encoder.
pub struct ClipTextModel {
    pub cfg: ClipTextConfig,
    /// Dtype of the matrices and of the activations fed to the matmuls / attention (f16 or f32).
    pub dtype: DType,
    token_embedding: Tensor,
    /// f32, so it adds to the f32 residual stream.
    position_embedding: Tensor,
    layers: Vec<Layer>,
    final_norm: Norm,
}

/// Options of [`ClipTextModel::build`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ClipRunOptions {
    /// diffusers' `clip_skip`: 0 is the last layer; `k` returns `hidden_states[-(k + 1)]` (the output
    /// of layer `N - k`) through the final layer norm. AUTOMATIC1111's "clip skip 2" is `k = 1`.
    pub clip_skip: usize,
    /// Tokens per prompt; `None` is `max_position_embeddings` (77).
    pub seq_len: Option<usize>,
    /// Dtype of the output; `None` is the model's dtype (what the UNet's cross-attention reads).
    pub out_dtype: Option<DType>,
}

/// The encoder for one batch size, ready to run: write ids, submit, read `output`.
pub struct ClipProgram {
    pub program: Program,
    /// U32 `[batch * seq]`.
    pub ids: Tensor,
    /// `[batch, seq, hidden]`.
    pub output: Tensor,
    pub batch: usize,
    pub seq: usize,
}

impl ClipProgram {
    /// Writes one id row per prompt (each exactly `seq` long, e.g. `ClipEncoding::ids`).
    pub fn write_ids<S: AsRef<[u32]>>(&self, gpu: &Gpu, prompts: &[S]) -> Result<()> {
        if prompts.len() != self.batch {
            return Err(shape_err!(
                "CLIP: {} prompts for a program built for {}",
                prompts.len(),
                self.batch
            ));
        }
        let mut all = Vec::with_capacity(self.batch * self.seq);
        for p in prompts {
            let p = p.as_ref();
            if p.len() != self.seq {
                return Err(shape_err!(
                    "CLIP: {} ids for a sequence of {}",
                    p.len(),
                    self.seq
                ));
            }
            all.extend_from_slice(p);
        }
        gpu.write_tensor_bytes(&self.ids, bytemuck::cast_slice(&all))
    }

    /// Encodes a batch of prompts (ids) into `self.output`, waiting for the GPU.
    pub fn run<S: AsRef<[u32]>>(&self, gpu: &Gpu, prompts: &[S]) -> Result<&Tensor> {
        self.write_ids(gpu, prompts)?;
        self.program.run(gpu)?;
        Ok(&self.output)
    }

    /// [`ClipProgram::run`], then the output read back as f32 `[batch * seq * hidden]`.
    pub fn run_f32<S: AsRef<[u32]>>(&self, gpu: &Gpu, prompts: &[S]) -> Result<Vec<f32>> {
        let out = self.run(gpu, prompts)?;
        gpu.read_f32(out)
    }
}

/// f16 where the device has it unless asked otherwise.
fn model_dtype(gpu: &Gpu, dtype: Option<DType>) -> Result<DType> {
    let dtype = dtype.unwrap_or(if gpu.caps.f16 { DType::F16 } else { DType::F32 });
    if !matches!(dtype, DType::F16 | DType::F32) || (dtype == DType::F16 && !gpu.caps.f16) {
        return Err(DriftError::Unsupported(format!(
            "CLIP weights as {dtype:?} on this device"
        )));
    }
    Ok(dtype)
}

/// The weights file of a `text_encoder/` folder: an index, `model.safetensors`, its fp16 variant, or
/// the folder's only `.safetensors` file.
fn weights_path(dir: &Path) -> Result<PathBuf> {
    if dir.is_file() {
        return Ok(dir.to_path_buf());
    }
    for name in [
        "model.safetensors.index.json",
        "model.safetensors",
        "model.fp16.safetensors.index.json",
        "model.fp16.safetensors",
    ] {
        if dir.join(name).is_file() {
            return Ok(dir.join(name));
        }
    }
    Ok(dir.to_path_buf())
}

impl ClipTextModel {
    /// Loads a diffusers `text_encoder/` folder (`config.json` + safetensors with `text_model.*`
    /// names). `dtype`: `None` is f16 where the device has it, else f32.
    pub fn load(gpu: &Gpu, dir: &Path, dtype: Option<DType>) -> Result<ClipTextModel> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| DriftError::Other(format!("{}: {e}", cfg_path.display())))?;
        let cfg = ClipTextConfig::from_json(&text)?;
        let set = SafetensorsSet::open(&weights_path(dir)?)?;
        let prefix = if set.contains("text_model.final_layer_norm.weight") {
            "text_model."
        } else {
            ""
        };
        Self::from_weights(gpu, cfg, &set, prefix, dtype)
    }

    /// From tensors named `{prefix}embeddings.token_embedding.weight`, ... (`prefix` is
    /// `text_model.` in diffusers folders, `cond_stage_model.transformer.text_model.` in SD 1.x
    /// single-file checkpoints).
    pub fn from_weights(
        gpu: &Gpu,
        cfg: ClipTextConfig,
        set: &SafetensorsSet,
        prefix: &str,
        dtype: Option<DType>,
    ) -> Result<ClipTextModel> {
        let dtype = model_dtype(gpu, dtype)?;
        let load = |name: &str, shape: &[usize], dt: DType| -> Result<Tensor> {
            let full = format!("{prefix}{name}");
            let raw = set.get(&full)?;
            if raw.shape != shape {
                return Err(DriftError::Other(format!(
                    "{full} has shape {:?}, the config implies {shape:?}",
                    raw.shape
                )));
            }
            if raw.dtype == dt {
                gpu.tensor_from_bytes(
                    &full,
                    shape,
                    dt,
                    Layout::RowMajor,
                    raw.bytes,
                    Category::Weights,
                )
            } else {
                gpu.tensor_from_f32(&full, shape, dt, &raw.to_f32()?, Category::Weights)
            }
        };
        Self::assemble(cfg, dtype, load)
    }

    /// Random weights of `cfg`'s shapes (benchmarks: `drift bench sd --random-weights`), from `seed`.
    /// Matrices are uniform with variance 1/fan_in, layer norms near identity, so activations stay O(1).
    pub fn random(
        gpu: &Gpu,
        cfg: ClipTextConfig,
        dtype: Option<DType>,
        seed: u64,
    ) -> Result<ClipTextModel> {
        let dtype = model_dtype(gpu, dtype)?;
        let rng = std::cell::RefCell::new(
            <crate::selftest::Rng as rand::SeedableRng>::seed_from_u64(seed),
        );
        let load = |name: &str, shape: &[usize], dt: DType| -> Result<Tensor> {
            let n: usize = shape.iter().product();
            let r = if name.contains("norm") && name.ends_with("weight") {
                (0.9, 1.1)
            } else if name.ends_with("bias") {
                (-0.1, 0.1)
            } else if name.starts_with("embeddings") {
                (-0.5, 0.5)
            } else {
                let a = (3.0 / shape[1] as f32).sqrt();
                (-a, a)
            };
            let v = crate::selftest::random(&mut rng.borrow_mut(), n, r.0, r.1, dt);
            gpu.tensor_from_f32(name, shape, dt, &v, Category::Weights)
        };
        Self::assemble(cfg, dtype, load)
    }

    /// The model from a tensor source `load(name, shape, dtype)` (names without the prefix).
    fn assemble(
        cfg: ClipTextConfig,
        dtype: DType,
        load: impl Fn(&str, &[usize], DType) -> Result<Tensor>,
    ) -> Result<ClipTextModel> {
        let (h, i) = (cfg.hidden, cfg.intermediate);
        let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
            Ok(Linear {
                w: load(&format!("{name}.weight"), &[out, inp], dtype)?,
                b: load(&format!("{name}.bias"), &[out], DType::F32)?,
            })
        };
        let norm = |name: &str| -> Result<Norm> {
            Ok(Norm {
                g: load(&format!("{name}.weight"), &[h], DType::F32)?,
                b: load(&format!("{name}.bias"), &[h], DType::F32)?,
            })
        };
        let layers = (0..cfg.layers)
            .map(|l| {
                let p = |s: &str| format!("encoder.layers.{l}.{s}");
                Ok(Layer {
                    ln1: norm(&p("layer_norm1"))?,
                    q: linear(&p("self_attn.q_proj"), h, h)?,
                    k: linear(&p("self_attn.k_proj"), h, h)?,
                    v: linear(&p("self_attn.v_proj"), h, h)?,
                    o: linear(&p("self_attn.out_proj"), h, h)?,
                    ln2: norm(&p("layer_norm2"))?,
                    fc1: linear(&p("mlp.fc1"), i, h)?,
                    fc2: linear(&p("mlp.fc2"), h, i)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ClipTextModel {
            token_embedding: load(
                "embeddings.token_embedding.weight",
                &[cfg.vocab_size, h],
                dtype,
            )?,
            position_embedding: load(
                "embeddings.position_embedding.weight",
                &[cfg.max_positions, h],
                DType::F32,
            )?,
            final_norm: norm("final_layer_norm")?,
            layers,
            dtype,
            cfg,
        })
    }

    /// Builds the encoder for `batch` prompts (2 for classifier-free guidance): activations are
    /// allocated here, once, and held by the returned program.
    pub fn build(&self, gpu: &Gpu, batch: usize, opts: &ClipRunOptions) -> Result<ClipProgram> {
        let c = &self.cfg;
        let seq = opts.seq_len.unwrap_or(c.max_positions);
        if batch == 0 || seq == 0 || seq > c.max_positions {
            return Err(shape_err!(
                "CLIP: batch {batch} x {seq} tokens (at most {} positions)",
                c.max_positions
            ));
        }
        if opts.clip_skip > c.layers {
            return Err(shape_err!(
                "CLIP: clip_skip {} with {} layers",
                opts.clip_skip,
                c.layers
            ));
        }
        let (h, nh, hd, t) = (c.hidden, c.heads, c.head_dim(), batch * seq);
        let dt = self.dtype;
        let out_dtype = opts.out_dtype.unwrap_or(dt);
        let a = |name: &str, shape: &[usize], d: DType| {
            gpu.tensor(name, shape, d, Category::Activations)
        };
        let ids = a("clip ids", &[t], DType::U32)?;
        let step = a("clip step", &[2], DType::U32)?;
        gpu.write_tensor_bytes(&step, bytemuck::cast_slice(&[seq as u32, 0]))?;
        let x = a("clip x", &[t, h], DType::F32)?;
        let xn = a("clip xn", &[t, h], dt)?;
        let qkv: Vec<Tensor> = ["clip q", "clip k", "clip v"]
            .iter()
            .map(|n| a(n, &[batch, seq, nh, hd], dt))
            .collect::<Result<_>>()?;
        let attn = a("clip attn", &[batch, seq, nh, hd], dt)?;
        let mlp = a("clip mlp", &[t, c.intermediate], dt)?;
        let proj = a("clip proj", &[t, h], DType::F32)?;
        let output = a("clip output", &[batch, seq, h], out_dtype)?;

        let mut p = Program::new();
        let lin = |x: &Tensor, l: &Linear, out: &Tensor| {
            let opts = MatmulOptions {
                transpose_b: true,
                bias: Some(&l.b),
                ..Default::default()
            };
            matmul(gpu, x, &l.w, out, &opts)
        };
        let ln = |x: &Tensor, n: &Norm, out: &Tensor| {
            layernorm(gpu, x, Some(&n.g), Some(&n.b), out, c.eps, RowVariant::Auto)
        };
        let x3 = x.reshape(&[batch, seq, h])?;
        p.extend(embedding(
            gpu,
            &self.token_embedding,
            &ids,
            &x,
            &Default::default(),
        )?);
        let pos = self.position_embedding.view(0, &[seq, h])?;
        p.push(binary(gpu, BinaryOp::Add, &x3, &pos, &x3)?);
        let causal = AttentionOptions::causal();
        for l in &self.layers[..c.layers - opts.clip_skip] {
            p.push(ln(&x, &l.ln1, &xn)?);
            for (w, out) in [&l.q, &l.k, &l.v].into_iter().zip(&qkv) {
                p.extend(lin(&xn, w, &out.reshape(&[t, h])?)?);
            }
            p.extend(attention(
                gpu, &qkv[0], &qkv[1], &qkv[2], &attn, &step, &causal,
            )?);
            p.extend(lin(&attn.reshape(&[t, h])?, &l.o, &proj)?);
            p.push(binary(gpu, BinaryOp::Add, &x, &proj, &x)?);
            p.push(ln(&x, &l.ln2, &xn)?);
            p.extend(lin(&xn, &l.fc1, &mlp)?);
            p.push(unary(gpu, c.act, &mlp, &mlp)?);
            p.extend(lin(&mlp, &l.fc2, &proj)?);
            p.push(binary(gpu, BinaryOp::Add, &x, &proj, &x)?);
        }
        p.push(ln(&x, &self.final_norm, &output.reshape(&[t, h])?)?);
        Ok(ClipProgram {
            program: p,
            ids,
            output,
            batch,
            seq,
        })
    }
}
