//! Llama-family decoder (Llama 2/3, SmolLM, TinyLlama, Qwen2 with q/k/v biases, Mistral) on Drift's
//! kernels, with ML Drift's stage-aware execution: prefill runs the prompt through matrix-matrix kernels
//! and tiled causal attention; decode runs matrix-vector kernels and split-sequence attention over the
//! KV cache. Both share the weights. The decode step is a prebuilt [`Program`]: a step writes 8 bytes of
//! step state and submits it once.
//!
//! Fusions: Q, K and V are one projection (weights stacked at load), split into the cache layout with
//! RoPE applied on the way; gate and up are one projection followed by SwiGLU; the residual add is fused
//! into the next RMSNorm; the sampled token id stays on the GPU as the next step's input.

use crate::error::{DriftError, Result};
use crate::exec::{Dispatch, Program};
use crate::gpu::Gpu;
use crate::kernels::activation::swiglu;
use crate::kernels::attention::{AttentionOptions, attention};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{MatmulOptions, matmul};
use crate::kernels::matvec::{MatvecOptions, matvec};
use crate::kernels::norm::{add_rmsnorm, rmsnorm};
use crate::kernels::qkv_rope::{QkvRope, RopePairs, inv_freq, qkv_rope};
use crate::kernels::sample::argmax;
use crate::kernels::softmax::RowVariant;
use crate::memory::Category;
use crate::models::config::LlmConfig;
use crate::tensor::{DType, Tensor};

/// Rows at or below which a projection uses the matrix-vector kernels (decode, tiny prefills).
const MATVEC_MAX_ROWS: usize = 8;

pub struct LayerWeights {
    pub attn_norm: Tensor,
    /// `[(hq + 2 hkv) d, hidden]`: q, k and v projections stacked.
    pub wqkv: Tensor,
    pub bqkv: Option<Tensor>,
    pub wo: Tensor,
    pub ffn_norm: Tensor,
    /// `[2 intermediate, hidden]`: gate and up stacked.
    pub w_gate_up: Tensor,
    pub w_down: Tensor,
}

pub struct LlamaWeights {
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor,
    /// The LM head, or the embedding again when tied.
    pub lm_head: Tensor,
    /// f32 `[rot/2]` rope inverse frequencies (llama3 scaling folded in).
    pub inv_freq: Tensor,
    pub pairs: RopePairs,
    /// The dtype of the big matrices (f16 when the device has it).
    pub dtype: DType,
}

/// A source of weights by Hugging Face tensor name, as f32 values (the loader converts to the GPU
/// dtype tensor by tensor, so RAM holds one tensor at a time).
pub trait WeightSource {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    fn has(&self, name: &str) -> bool;
}

impl LlamaWeights {
    pub fn load(gpu: &Gpu, cfg: &LlmConfig, src: &dyn WeightSource, pairs: RopePairs) -> Result<LlamaWeights> {
        let dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        let (hq, hkv, d, h) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden);
        let get = |name: &str, want: &[usize]| -> Result<Vec<f32>> {
            let (shape, v) = src.get(name)?;
            if shape != want {
                return Err(DriftError::Other(format!("{name} has shape {shape:?}, config implies {want:?}")));
            }
            Ok(v)
        };
        let up = |name: &str, shape: &[usize], v: &[f32], dt: DType| {
            gpu.tensor_from_f32(name, shape, dt, v, Category::Weights)
        };
        let embed_v = get("model.embed_tokens.weight", &[cfg.vocab, h])?;
        let embed = up("embed", &[cfg.vocab, h], &embed_v, dtype)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let p = format!("model.layers.{l}.");
            let mut qkv = get(&format!("{p}self_attn.q_proj.weight"), &[hq * d, h])?;
            qkv.extend(get(&format!("{p}self_attn.k_proj.weight"), &[hkv * d, h])?);
            qkv.extend(get(&format!("{p}self_attn.v_proj.weight"), &[hkv * d, h])?);
            let bqkv = if cfg.qkv_bias {
                let mut b = get(&format!("{p}self_attn.q_proj.bias"), &[hq * d])?;
                b.extend(get(&format!("{p}self_attn.k_proj.bias"), &[hkv * d])?);
                b.extend(get(&format!("{p}self_attn.v_proj.bias"), &[hkv * d])?);
                Some(up("bqkv", &[(hq + 2 * hkv) * d], &b, DType::F32)?)
            } else {
                None
            };
            let mut gu = get(&format!("{p}mlp.gate_proj.weight"), &[cfg.intermediate, h])?;
            gu.extend(get(&format!("{p}mlp.up_proj.weight"), &[cfg.intermediate, h])?);
            layers.push(LayerWeights {
                attn_norm: up("attn_norm", &[h], &get(&format!("{p}input_layernorm.weight"), &[h])?, DType::F32)?,
                wqkv: up("wqkv", &[(hq + 2 * hkv) * d, h], &qkv, dtype)?,
                bqkv,
                wo: up("wo", &[h, hq * d], &get(&format!("{p}self_attn.o_proj.weight"), &[h, hq * d])?, dtype)?,
                ffn_norm: up(
                    "ffn_norm",
                    &[h],
                    &get(&format!("{p}post_attention_layernorm.weight"), &[h])?,
                    DType::F32,
                )?,
                w_gate_up: up("w_gate_up", &[2 * cfg.intermediate, h], &gu, dtype)?,
                w_down: up(
                    "w_down",
                    &[h, cfg.intermediate],
                    &get(&format!("{p}mlp.down_proj.weight"), &[h, cfg.intermediate])?,
                    dtype,
                )?,
            });
        }
        let norm = up("norm", &[h], &get("model.norm.weight", &[h])?, DType::F32)?;
        let lm_head = if !cfg.tie_embeddings && src.has("lm_head.weight") {
            up("lm_head", &[cfg.vocab, h], &get("lm_head.weight", &[cfg.vocab, h])?, dtype)?
        } else {
            embed.clone()
        };
        let freqs = inv_freq(cfg.rope_theta, d, cfg.rope_freq_factors().as_deref());
        Ok(LlamaWeights {
            inv_freq: up("inv_freq", &[d / 2], &freqs, DType::F32)?,
            embed,
            layers,
            norm,
            lm_head,
            pairs,
            dtype,
        })
    }
}

/// Activations of one stage (T rows).
struct Activations {
    x: Tensor,
    xn: Tensor,
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    o: Tensor,
    gu: Tensor,
    act: Tensor,
    down: Tensor,
}

impl Activations {
    fn new(gpu: &Gpu, cfg: &LlmConfig, t: usize, io: DType) -> Result<Activations> {
        let (hq, hkv, d, h, i) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden, cfg.intermediate);
        let a = |name: &str, shape: &[usize], dt: DType| gpu.tensor(name, shape, dt, Category::Activations);
        Ok(Activations {
            x: a("x", &[t, h], DType::F32)?,
            xn: a("xn", &[t, h], io)?,
            qkv: a("qkv", &[t, (hq + 2 * hkv) * d], DType::F32)?,
            q: a("q", &[1, t, hq, d], io)?,
            attn: a("attn", &[1, t, hq, d], io)?,
            o: a("o", &[t, h], DType::F32)?,
            gu: a("gu", &[t, 2 * i], io)?,
            act: a("act", &[t, i], io)?,
            down: a("down", &[t, h], DType::F32)?,
        })
    }
}

/// A loaded model with its KV cache and the prebuilt decode step.
pub struct LlamaModel {
    pub cfg: LlmConfig,
    pub w: LlamaWeights,
    pub max_ctx: usize,
    kv: Vec<(Tensor, Tensor)>,
    /// U32 `[2]`: (kv_len, position of the first row of this step).
    pub step: Tensor,
    /// U32 `[max_ctx]`: token ids; the decode input is the id at the current position.
    pub ids: Tensor,
    /// U32 `[max_ctx + 1]`: every token of the sequence (prompt and generated), for repetition penalty.
    pub history: Tensor,
    pub logits: Tensor,
    decode_acts: Activations,
    decode: Option<Program>,
}

impl LlamaModel {
    pub fn new(gpu: &Gpu, cfg: LlmConfig, w: LlamaWeights, max_ctx: usize) -> Result<LlamaModel> {
        let kv_dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        let kv = (0..cfg.n_layers)
            .map(|_| {
                let shape = [1, max_ctx, cfg.n_kv_heads, cfg.head_dim];
                Ok((
                    gpu.tensor("k cache", &shape, kv_dtype, Category::KvCache)?,
                    gpu.tensor("v cache", &shape, kv_dtype, Category::KvCache)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let u32s = |name: &str, n: usize| gpu.tensor(name, &[n], DType::U32, Category::Activations);
        let mut m = LlamaModel {
            step: u32s("step", 2)?,
            ids: u32s("ids", max_ctx + 1)?,
            history: u32s("history", max_ctx + 1)?,
            logits: gpu.tensor("logits", &[1, cfg.vocab], DType::F32, Category::Activations)?,
            decode_acts: Activations::new(gpu, &cfg, 1, DType::F32)?,
            decode: None,
            kv,
            max_ctx,
            cfg,
            w,
        };
        m.decode = Some(m.build_decode(gpu)?);
        Ok(m)
    }

    /// `out = x @ w^T (+ b)`: matrix-vector kernels for a few rows, matrix-matrix otherwise.
    fn linear(gpu: &Gpu, x: &Tensor, w: &Tensor, b: Option<&Tensor>, out: &Tensor) -> Result<Vec<Dispatch>> {
        if x.dim(0) <= MATVEC_MAX_ROWS {
            matvec(gpu, w, x, out, &MatvecOptions { bias: b, ..Default::default() })
        } else {
            matmul(gpu, x, w, out, &MatmulOptions { transpose_b: true, bias: b, ..Default::default() })
        }
    }

    /// The layer stack for `t` rows whose token ids start at `ids` element `first_id`, ending with
    /// `xn` holding the final-normed hidden states.
    fn layers(&self, gpu: &Gpu, a: &Activations, ids: &Tensor, t: usize) -> Result<Vec<Dispatch>> {
        let c = &self.cfg;
        let eps = c.rms_eps as f32;
        let mut d = embedding(gpu, &self.w.embed, ids, &a.x, &Default::default())?;
        d.push(rmsnorm(gpu, &a.x, &self.w.layers[0].attn_norm, &a.xn, eps, RowVariant::Auto)?);
        let q4 = a.q.clone();
        for (l, lw) in self.w.layers.iter().enumerate() {
            let (k, v) = &self.kv[l];
            d.extend(Self::linear(gpu, &a.xn, &lw.wqkv, lw.bqkv.as_ref(), &a.qkv)?);
            d.push(qkv_rope(
                gpu,
                &QkvRope {
                    qkv: &a.qkv,
                    q_out: &q4,
                    k_cache: k,
                    v_cache: v,
                    step: &self.step,
                    inv_freq: &self.w.inv_freq,
                    hq: c.n_heads,
                    hkv: c.n_kv_heads,
                    pairs: self.w.pairs,
                },
            )?);
            d.extend(attention(
                gpu,
                &q4,
                k,
                v,
                &a.attn,
                &self.step,
                &AttentionOptions {
                    causal: true,
                    ..Default::default()
                },
            )?);
            let attn2 = a.attn.reshape(&[t, c.n_heads * c.head_dim])?;
            d.extend(Self::linear(gpu, &attn2, &lw.wo, None, &a.o)?);
            d.push(add_rmsnorm(gpu, &a.x, &a.o, &lw.ffn_norm, &a.x, &a.xn, eps, RowVariant::Auto)?);
            d.extend(Self::linear(gpu, &a.xn, &lw.w_gate_up, None, &a.gu)?);
            d.push(swiglu(gpu, &a.gu, &a.act)?);
            d.extend(Self::linear(gpu, &a.act, &lw.w_down, None, &a.down)?);
            let next = self.w.layers.get(l + 1).map_or(&self.w.norm, |n| &n.attn_norm);
            d.push(add_rmsnorm(gpu, &a.x, &a.down, next, &a.x, &a.xn, eps, RowVariant::Auto)?);
        }
        Ok(d)
    }

    /// One decode step: the token at `ids[pos]` in, logits and the greedy id (`ids[pos + 1]`) out.
    fn build_decode(&self, gpu: &Gpu) -> Result<Program> {
        let a = &self.decode_acts;
        let mut p = Program::new();
        // The input id is read through the step-independent view ids[0..1]; `run_decode` copies the id
        // into place (the argmax writes it there directly when greedy).
        let ids = self.ids.view(0, &[1])?;
        p.extend(self.layers(gpu, a, &ids, 1)?);
        p.extend(Self::linear(gpu, &a.xn, &self.w.lm_head, None, &self.logits)?);
        Ok(p)
    }

    pub fn decode_program(&self) -> &Program {
        self.decode.as_ref().expect("built in new")
    }

    pub fn argmax_dispatch(&self, gpu: &Gpu) -> Result<Dispatch> {
        let ids = self.ids.view(0, &[1])?;
        argmax(gpu, &self.logits, &ids, &self.history, &self.step)
    }

    /// Writes the ids of the next prefill (`ids[0..n]`).
    pub fn write_ids(&self, gpu: &Gpu, ids: &[u32]) -> Result<()> {
        gpu.write_tensor_bytes(&self.ids, bytemuck::cast_slice(ids))
    }

    /// Writes the step state: `kv_len` rows valid after this step, first row at `pos0`.
    pub fn set_step(&self, gpu: &Gpu, kv_len: usize, pos0: usize) -> Result<()> {
        gpu.write_tensor_bytes(&self.step, bytemuck::cast_slice(&[kv_len as u32, pos0 as u32]))
    }

    /// Builds the prefill program for `t` tokens (already written at `ids[0..t]`) starting at `pos0`.
    /// With `all_logits`, logits of every row go to the returned tensor `[t, vocab]`; otherwise only the
    /// last row's, into `self.logits`.
    /// The program holds its activation buffers (dispatches keep what they bind alive).
    pub fn build_prefill(&self, gpu: &Gpu, t: usize, all_logits: bool) -> Result<(Program, Option<Tensor>)> {
        let io = self.w.dtype;
        let a = Activations::new(gpu, &self.cfg, t, io)?;
        let ids = self.ids.view(0, &[t])?;
        let mut p = Program::new();
        p.extend(self.layers(gpu, &a, &ids, t)?);
        let logits = if all_logits {
            let l = gpu.tensor("prefill logits", &[t, self.cfg.vocab], DType::F32, Category::Activations)?;
            p.extend(Self::linear(gpu, &a.xn, &self.w.lm_head, None, &l)?);
            Some(l)
        } else {
            let last = a.xn.rows(t - 1, t)?;
            p.extend(Self::linear(gpu, &last, &self.w.lm_head, None, &self.logits)?);
            None
        };
        Ok((p, logits))
    }

    pub fn check_length(&self, total: usize) -> Result<()> {
        if total > self.max_ctx {
            return Err(DriftError::Other(format!(
                "the conversation needs {total} tokens but the context holds {}; start a new chat or raise the context length",
                self.max_ctx
            )));
        }
        Ok(())
    }
}
