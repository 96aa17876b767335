//! Llama-family decoder (Llama 2/3, SmolLM, TinyLlama, Qwen2 with q/k/v biases, Mistral) on Drift's
//! kernels, with ML Drift's stage-aware execution: prefill runs the prompt through matrix-matrix kernels
//! and tiled causal attention; decode runs matrix-vector kernels and attention over the KV cache. Both
//! share the weights. The decode step is a prebuilt [`Program`]: a step writes 8 bytes of step state and
//! submits it once. There are two: with one-pass attention (one workgroup per query row, one dispatch)
//! while the cache holds at most [`crate::kernels::attention_row::ROW_MAX_KV`] rows, and with
//! split-sequence attention plus a merge past that; [`LlamaModel::decode_program`] picks by KV length.
//!
//! Fusions: Q, K and V are one projection (weights stacked at load), split into the cache layout with
//! RoPE applied on the way; gate and up are one projection followed by SwiGLU; the residual add is fused
//! into the next RMSNorm; the sampled token id stays on the GPU as the next step's input.
//!
//! Decode (and prefills of at most [`MATVEC_MAX_ROWS`] rows) fuses further into the matrix-vector
//! kernels, 7 dispatches per layer: the QKV, gate-up and LM-head products normalise the f32 residual
//! stream on the fly (RMSNorm prologue), the down product applies SwiGLU to the gate-up rows (SwiGLU
//! prologue), and the O and down products add into the residual stream in place (residual epilogue).
//! At one row (decode) with float weights, or quantized ones on the integer-dot-product kernel, two
//! paired-row epilogues go further: the gate-up product writes silu(gate) * up itself (GLU; the down
//! product then has no prologue) and the QKV product does the split, the rotation and the KV-cache
//! write (RoPE): 6 dispatches per layer, 5 with the one-pass attention.
//! `DRIFT_DECODE_FUSION=0` (read when a model is built) keeps the unfused program, for A/B timing.

use crate::error::{DriftError, Result};
use crate::exec::{Dispatch, Program};
use crate::gpu::Gpu;
use crate::kernels::activation::swiglu;
use crate::kernels::attention::{
    AttentionOptions, AttentionVariant, attention, attention_quantizing,
};
use crate::kernels::attention_row::{long_row_chunks, row_available, row_max_kv};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{MatmulOptions, glu_available, matmul, matmul_partials};
use crate::kernels::matvec::MatvecOptions;
use crate::kernels::norm::{add_rmsnorm, add_rmsnorm_partials, rmsnorm};
use crate::kernels::qkv_rope::{QkvRope, QkvTargets, qkv_rope};
use crate::kernels::quant::{dequantize, matvec_quant, paired_epilogue_fits};
use crate::kernels::quant_xq::xq_words;
use crate::kernels::sample::argmax;
use crate::kernels::softmax::RowVariant;
use crate::memory::Category;
use crate::models::config::LlmConfig;
use crate::models::llama_step::{self, DecodeStep, StepOptions};
use crate::tensor::{DType, Tensor};

/// Rows at or below which a projection uses the matrix-vector kernels (decode, tiny prefills).
const MATVEC_MAX_ROWS: usize = 8;

pub use crate::models::llama_weights::{
    LayerWeights, Linear, LlamaWeights, QuantScheme, WeightSource,
};

/// Whether decode fuses norms, SwiGLU and residual adds into the matrix-vector products:
/// `DRIFT_DECODE_FUSION=0` / `=1` decides; fused by default. Measured on the H200 (BENCHMARKS.md
/// 2026-11-30, GPU clocks warmed): llama-3.2-1b 749 -> 784 tok/s, smollm2-135m 744 -> 905 tok/s (an
/// earlier reading of 430 for the 135M model was the GPU still at idle clocks).
fn decode_fusion_default() -> bool {
    !matches!(std::env::var("DRIFT_DECODE_FUSION").as_deref(), Ok("0"))
}

/// Activations of one stage (T rows). The fused matrix-vector stage has no separate normed input,
/// SwiGLU output, O or down outputs (those add into `x`).
struct Activations {
    x: Tensor,
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    gu: Tensor,
    unfused: Option<Unfused>,
    /// Fused decode: x (the residual stream) and the GLU activation quantized by their producers
    /// for the next product ([`crate::kernels::quant_xq`]).
    xq: Option<(Tensor, Tensor)>,
    /// Fused decode: the attention's output quantized by its merge for the O product.
    xq_attn: Option<Tensor>,
}

/// The intermediates only the unfused stage has.
struct Unfused {
    xn: Tensor,
    o: Tensor,
    act: Tensor,
    down: Tensor,
}

/// The fused prologue / epilogue of one projection (see [`MatvecOptions`]).
#[derive(Clone, Copy, Default)]
struct Fuse<'a> {
    norm: Option<(&'a Tensor, f32)>,
    swiglu: bool,
    residual: Option<&'a Tensor>,
    glu: bool,
    rope: Option<QkvTargets<'a>>,
    xq_in: Option<&'a Tensor>,
    xq_out: Option<(&'a Tensor, Option<&'a Tensor>)>,
}

impl<'a> Fuse<'a> {
    fn is_some(&self) -> bool {
        self.norm.is_some()
            || self.swiglu
            || self.residual.is_some()
            || self.glu
            || self.rope.is_some()
    }

    /// The matvec options of one weight part: its bias and its slice of the residual.
    fn options(&self, bias: Option<&'a Tensor>, residual: Option<&'a Tensor>) -> MatvecOptions<'a> {
        MatvecOptions {
            bias,
            norm: self.norm,
            swiglu: self.swiglu,
            residual,
            glu: self.glu,
            rope: self.rope,
            xq_in: self.xq_in,
            xq_out: self.xq_out,
            ..Default::default()
        }
    }
}

impl Activations {
    fn new(gpu: &Gpu, cfg: &LlmConfig, t: usize, io: DType, fused: bool) -> Result<Activations> {
        let (hq, hkv, d, h, i) = (
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            cfg.hidden,
            cfg.intermediate,
        );
        let a = |name: &str, shape: &[usize], dt: DType| {
            gpu.tensor(name, shape, dt, Category::Activations)
        };
        let unfused = if fused {
            None
        } else {
            Some(Unfused {
                xn: a("xn", &[t, h], io)?,
                o: a("o", &[t, h], DType::F32)?,
                act: a("act", &[t, i], io)?,
                down: a("down", &[t, h], DType::F32)?,
            })
        };
        Ok(Activations {
            x: a("x", &[t, h], DType::F32)?,
            qkv: a("qkv", &[t, (hq + 2 * hkv) * d], DType::F32)?,
            q: a("q", &[1, t, hq, d], io)?,
            attn: a("attn", &[1, t, hq, d], io)?,
            gu: a("gu", &[t, 2 * i], io)?,
            unfused,
            xq: if fused && t == 1 {
                Some((
                    a("xq x", &[xq_words(h)], DType::U32)?,
                    a("xq act", &[xq_words(i)], DType::U32)?,
                ))
            } else {
                None
            },
            xq_attn: if fused && t == 1 {
                Some(a("xq attn", &[xq_words(hq * d)], DType::U32)?)
            } else {
                None
            },
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
    /// The decode step with one-pass attention (`AttentionVariant::DecodeRow`) while the KV length is at
    /// most `row_max_kv`, or with split attention for every length where that variant is off.
    decode: Option<Program>,
    /// The decode step with each row's keys dealt over several workgroups (`row_chunks`), for KV
    /// lengths past `row_max_kv` (none when the cache is no longer than that, or the one-pass variant
    /// is off).
    decode_long: Option<Program>,
    /// KV length up to which `decode` serves (0: the one-pass variant is off on this device).
    row_max_kv: usize,
    /// Fused matrix-vector stages (see the module docs); from `DRIFT_DECODE_FUSION` at load.
    fusion: bool,
    /// Whether the decode attention quantizes its output for the O product (where x is quantized
    /// by its producers and the attention can); `None`: on unless `DRIFT_DP4A_XQ_ATTN=0` when the
    /// programs are built (8B Q4_0 on the H200: 2.210 -> 2.195 ms per token, BENCHMARKS.md
    /// sixteenth session).
    attention_xq: Option<bool>,
    /// The whole decode step as one dispatch (`models::llama_step`), where it serves this model and
    /// device; preferred over `decode` / `decode_long`.
    decode_step: Option<DecodeStep>,
    /// Greedy selection after a step (argmax into the next input id), built once like `decode`.
    greedy: Vec<Dispatch>,
    /// f16 scratch for prefill: quantised weights are dequantised here just before their matmul.
    scratch: Option<Tensor>,
}

impl LlamaModel {
    pub fn new(gpu: &Gpu, cfg: LlmConfig, w: LlamaWeights, max_ctx: usize) -> Result<LlamaModel> {
        // A CPU device runs workgroups a few at a time, never a whole grid: no step there unless a
        // caller asks for one ([`LlamaModel::with_decode_step`]).
        let step =
            llama_step::requested().filter(|_| gpu.info.device_type != wgpu::DeviceType::Cpu);
        LlamaModel::with_decode_step(gpu, cfg, w, max_ctx, step)
    }

    /// [`LlamaModel::new`] with the one-dispatch decode step built as `step` where it serves the model
    /// and the device runs its grid concurrently (`None`: never).
    pub fn with_decode_step(
        gpu: &Gpu,
        cfg: LlmConfig,
        mut w: LlamaWeights,
        max_ctx: usize,
        step_opts: Option<StepOptions>,
    ) -> Result<LlamaModel> {
        let u32s = |name: &str, n: usize| gpu.tensor(name, &[n], DType::U32, Category::Activations);
        let step = u32s("step", 2)?;
        let ids = u32s("ids", max_ctx + 1)?;
        let logits = gpu.tensor("logits", &[1, cfg.vocab], DType::F32, Category::Activations)?;
        // The one-dispatch decode step where it serves this model (it also lays out the KV cache).
        let mut kv = Vec::new();
        let mut decode_step = None;
        if let Some(opts) = step_opts
            && let Some(shape) = llama_step::step_shape(gpu, &cfg, &w, max_ctx, &opts)
        {
            let built = llama_step::build(
                gpu,
                &cfg,
                &shape,
                &mut w,
                &mut kv,
                &step,
                &ids.view(0, &[1])?,
                &logits,
                opts.workgroups,
            )
            .and_then(|s| llama_step::calibrated(gpu, s, &step, &ids));
            match built {
                Ok(s) => decode_step = s,
                Err(e) => log::warn!("one-dispatch decode step unavailable: {e}"),
            }
        }
        if kv.is_empty() {
            let kv_dtype = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
            kv = (0..cfg.n_layers)
                .map(|_| {
                    let shape = [1, max_ctx, cfg.n_kv_heads, cfg.head_dim];
                    Ok((
                        gpu.tensor("k cache", &shape, kv_dtype, Category::KvCache)?,
                        gpu.tensor("v cache", &shape, kv_dtype, Category::KvCache)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
        }
        let needs_scratch = |l: &Linear| !l.is_float() || l.parts.len() > 1;
        let scratch_elems = w
            .layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.wo, &l.gate_up, &l.down])
            .filter(|l| needs_scratch(l))
            .map(|l| l.n * l.k)
            .max();
        let scratch = scratch_elems
            .map(|n| gpu.tensor("dequant scratch", &[n], w.dtype, Category::Activations))
            .transpose()?;
        let fusion = decode_fusion_default();
        let decode_fused = fusion && fusable(&w, 1);
        let mut m = LlamaModel {
            step,
            ids,
            history: u32s("history", max_ctx + 1)?,
            logits,
            decode_step,
            // Decode activations in the weights' dtype (f16 on most GPUs): the matrix-vector kernels read x
            // once per row group, so its width costs as much bandwidth as the blocks themselves.
            decode_acts: Activations::new(gpu, &cfg, 1, w.dtype, decode_fused)?,
            decode: None,
            decode_long: None,
            row_max_kv: 0,
            fusion,
            attention_xq: None,
            greedy: Vec::new(),
            scratch,
            kv,
            max_ctx,
            cfg,
            w,
        };
        m.apply_row_attention_max_kv(gpu, row_max_kv())?;
        let ids = m.ids.view(0, &[1])?;
        m.greedy = argmax(gpu, &m.logits, &ids, &m.history, &m.step, true)?;
        Ok(m)
    }

    /// Whether the stage of `t` rows runs fused (see the module docs).
    fn fused(&self, t: usize) -> bool {
        self.fusion && fusable(&self.w, t)
    }

    /// Whether this model's decode program is the fused one.
    pub fn decode_fused(&self) -> bool {
        self.fused(1)
    }

    /// Rebuilds the decode program fused or not (comparisons; `DRIFT_DECODE_FUSION` sets it at load).
    /// Comparisons are of the multi-dispatch programs: the one-dispatch step is dropped.
    pub fn set_decode_fusion(&mut self, gpu: &Gpu, on: bool) -> Result<()> {
        self.decode_step = None;
        self.fusion = on;
        self.decode_acts = Activations::new(gpu, &self.cfg, 1, self.w.dtype, self.fused(1))?;
        self.build_decode_programs(gpu)
    }

    /// Rebuilds the decode programs with the attention quantizing its output for the O product or
    /// not (comparisons; `DRIFT_DP4A_XQ_ATTN` when never set). The one-dispatch step is kept.
    pub fn set_attention_xq(&mut self, gpu: &Gpu, on: bool) -> Result<()> {
        self.attention_xq = Some(on);
        self.build_decode_programs(gpu)
    }

    fn attention_xq_wanted(&self) -> bool {
        self.attention_xq
            .unwrap_or_else(|| std::env::var_os("DRIFT_DP4A_XQ_ATTN").is_none_or(|v| v != "0"))
    }

    /// Rebuilds the decode programs as they are (the one-dispatch step kept), their kernels
    /// specialised anew: for timing sweeps of the switches kernels read from the environment when
    /// they are built.
    pub fn rebuild_decode_programs(&mut self, gpu: &Gpu) -> Result<()> {
        self.build_decode_programs(gpu)
    }

    /// Rebuilds the decode programs with the one-pass attention up to KV length `n` (0: never; where
    /// the device cannot run it, never either). `DRIFT_ATTENTION_ROW_MAX` sets it at load. A comparison
    /// of the multi-dispatch programs: the one-dispatch step is dropped.
    pub fn set_row_attention_max_kv(&mut self, gpu: &Gpu, n: usize) -> Result<()> {
        self.decode_step = None;
        self.apply_row_attention_max_kv(gpu, n)
    }

    fn apply_row_attention_max_kv(&mut self, gpu: &Gpu, n: usize) -> Result<()> {
        self.row_max_kv = if row_available(&gpu.caps, self.cfg.head_dim) {
            n
        } else {
            0
        };
        self.build_decode_programs(gpu)
    }

    /// The decode step for one-pass attention while it serves this cache, and the one with each
    /// row's keys dealt over several workgroups past it (split-sequence attention where the one-pass
    /// variant is off).
    fn build_decode_programs(&mut self, gpu: &Gpu) -> Result<()> {
        let row = self.row_max_kv > 0;
        let variant = if row {
            AttentionVariant::DecodeRow
        } else {
            AttentionVariant::Auto
        };
        self.decode = Some(self.build_decode(
            gpu,
            AttentionOptions {
                variant,
                ..Default::default()
            },
        )?);
        self.decode_long = if row && self.max_ctx > self.row_max_kv {
            Some(self.build_decode(
                gpu,
                AttentionOptions {
                    variant,
                    row_chunks: Some(long_row_chunks(self.max_ctx)),
                    ..Default::default()
                },
            )?)
        } else {
            None
        };
        Ok(())
    }

    /// Where layer `l`'s QKV split stores q, k and v, and its rotary embedding.
    fn qkv_targets(&self, l: usize) -> QkvTargets<'_> {
        let (k, v) = &self.kv[l];
        QkvTargets {
            k_cache: k,
            v_cache: v,
            step: &self.step,
            turns: &self.w.rope_turns,
            hq: self.cfg.n_heads,
            hkv: self.cfg.n_kv_heads,
            pairs: self.w.pairs,
        }
    }

    /// `out = x @ w^T (+ b)`: matrix-vector kernels (dequantising in registers) for a few rows;
    /// matrix-matrix otherwise, through the f16 scratch when the weight is quantised or in parts.
    fn linear(&self, gpu: &Gpu, x: &Tensor, w: &Linear, out: &Tensor) -> Result<Vec<Dispatch>> {
        self.linear_fused(gpu, x, w, out, Fuse::default())
    }

    /// [`LlamaModel::linear`] with a fused prologue / epilogue, which only the matrix-vector path has.
    fn linear_fused(
        &self,
        gpu: &Gpu,
        x: &Tensor,
        w: &Linear,
        out: &Tensor,
        fuse: Fuse,
    ) -> Result<Vec<Dispatch>> {
        let rows = x.dim(0);
        let b = w.bias.as_ref();
        if matvec_rows(w, rows) {
            if let [part] = &w.parts[..] {
                return matvec_quant(gpu, part, x, out, &fuse.options(b, fuse.residual));
            }
            if fuse.xq_in.is_some() || fuse.xq_out.is_some() {
                return Err(DriftError::Unsupported(
                    "producer-quantized x over several weight parts".into(),
                ));
            }
            // One row: each part writes its slice of the output row.
            let mut d = Vec::new();
            let mut off = 0;
            for part in &w.parts {
                let n = part.shape[0];
                let bias = b.map(|b| b.view(off, &[n])).transpose()?;
                let res = fuse.residual.map(|r| r.view(off, &[1, n])).transpose()?;
                let o = out.view(off, &[1, n])?;
                d.extend(matvec_quant(
                    gpu,
                    part,
                    x,
                    &o,
                    &fuse.options(bias.as_ref(), res.as_ref()),
                )?);
                off += n;
            }
            return Ok(d);
        }
        // The matrix-matrix path has one epilogue: SwiGLU (where `glu_matmul` allows it).
        let besides_glu = Fuse { glu: false, ..fuse };
        if besides_glu.is_some() {
            return Err(DriftError::Other(format!(
                "a fused projection of {rows} rows over {} weight parts has no matrix-vector path",
                w.parts.len()
            )));
        }
        let opts = MatmulOptions {
            transpose_b: true,
            bias: b,
            glu: fuse.glu,
            ..Default::default()
        };
        let mut d = Vec::new();
        let weight = self.matmul_weight(gpu, x, w, &mut d)?;
        d.extend(matmul(gpu, x, &weight, out, &opts)?);
        Ok(d)
    }

    /// The float weight `[n, k]` that a matrix-matrix product of `w` multiplies by: its one part when
    /// that is float of x's dtype, else a dequantised copy (its dispatches pushed onto `d`).
    fn matmul_weight(
        &self,
        gpu: &Gpu,
        x: &Tensor,
        w: &Linear,
        d: &mut Vec<Dispatch>,
    ) -> Result<Tensor> {
        if let ([part], true) = (&w.parts[..], w.is_float())
            && part.dtype == x.dtype
        {
            return Ok(part.clone());
        }
        // The shared scratch fits every layer weight; a bigger one (a quantised LM head when every
        // position's logits are wanted) gets its own, kept alive by the dispatches that bind it.
        let scratch = match &self.scratch {
            Some(s) if s.numel() >= w.n * w.k => s.clone(),
            _ => gpu.tensor(
                "dequant scratch (large)",
                &[w.n * w.k],
                self.w.dtype,
                Category::Activations,
            )?,
        };
        let mut off = 0;
        for part in &w.parts {
            let n = part.shape[0];
            let dst = scratch.view(off * w.k, &[n, w.k])?;
            for shard in part.row_shards(gpu.caps.max_storage_binding)? {
                let r = shard.tensor.shape[0];
                d.push(dequantize(
                    gpu,
                    &shard.tensor,
                    &dst.rows(shard.row_start, shard.row_start + r)?,
                )?);
            }
            off += n;
        }
        scratch.view(0, &[w.n, w.k])
    }

    /// `x @ w^T` for a consumer that can add split-K partial sums itself: where the matmul splits K
    /// (`matmul_partials`; no bias), the dispatches and the f32 partials `[slices, rows, n]`; else
    /// the plain product into `out` and `None`. `DRIFT_SPLITK_FOLD=0` keeps the summing pass, for
    /// A/B timing.
    fn linear_or_partials(
        &self,
        gpu: &Gpu,
        x: &Tensor,
        w: &Linear,
        out: &Tensor,
    ) -> Result<(Vec<Dispatch>, Option<Tensor>)> {
        let fold = !matches!(std::env::var("DRIFT_SPLITK_FOLD").as_deref(), Ok("0"));
        if !fold || w.bias.is_some() || matvec_rows(w, x.dim(0)) {
            return Ok((self.linear(gpu, x, w, out)?, None));
        }
        let opts = MatmulOptions {
            transpose_b: true,
            ..Default::default()
        };
        let mut d = Vec::new();
        let weight = self.matmul_weight(gpu, x, w, &mut d)?;
        match matmul_partials(gpu, x, &weight, &opts)? {
            Some((p, part)) => {
                d.push(p);
                Ok((d, Some(part)))
            }
            None => {
                d.extend(matmul(gpu, x, &weight, out, &opts)?);
                Ok((d, None))
            }
        }
    }

    /// The layer stack for `t` rows whose token ids start at `ids` element `first_id`: ends with the
    /// final-normed hidden states in `xn` (unfused), or the raw residual stream in `x` (fused; the LM
    /// head normalises it, see [`LlamaModel::head`]).
    fn layers(
        &self,
        gpu: &Gpu,
        a: &Activations,
        ids: &Tensor,
        t: usize,
        attention_opts: AttentionOptions,
        xq: bool,
    ) -> Result<Vec<Dispatch>> {
        let c = &self.cfg;
        let eps = c.rms_eps as f32;
        let mut d = embedding(gpu, &self.w.embed, ids, &a.x, &Default::default())?;
        if let Some(u) = &a.unfused {
            d.push(rmsnorm(
                gpu,
                &a.x,
                &self.w.layers[0].attn_norm,
                &u.xn,
                eps,
                RowVariant::Auto,
            )?);
        }
        // x quantized by its producers (fused decode): the residual stream after O (unless
        // `DRIFT_DP4A_XQ=noo`) and after down, the GLU activation.
        let xq = a.xq.as_ref().filter(|_| xq && a.unfused.is_none());
        let o_makes_xq =
            xq.is_some() && std::env::var_os("DRIFT_DP4A_XQ").is_none_or(|v| v != "noo");
        // `DRIFT_DP4A_XQ=consumers` (timing only, wrong results): the consumers read x's blocks,
        // nobody writes them.
        let produce = std::env::var_os("DRIFT_DP4A_XQ").is_none_or(|v| v != "consumers");
        for (l, lw) in self.w.layers.iter().enumerate() {
            let (k, v) = &self.kv[l];
            let norm = Fuse {
                norm: Some((&lw.attn_norm, eps)),
                xq_in: xq.filter(|_| l > 0).map(|(x, _)| x),
                ..Default::default()
            };
            // q, k and v straight from the QKV product into the attention layouts, or through qkv.
            let epilogue = a.unfused.is_none() && rope_epilogue(gpu, &lw.qkv, t);
            // The QKV product's split-K partial sums, where qkv_rope adds them itself.
            let mut qkv_parts = None;
            match &a.unfused {
                Some(u) => {
                    let (ds, parts) = self.linear_or_partials(gpu, &u.xn, &lw.qkv, &a.qkv)?;
                    d.extend(ds);
                    qkv_parts = parts;
                }
                None if epilogue => {
                    let rope = Fuse {
                        rope: Some(self.qkv_targets(l)),
                        ..norm
                    };
                    d.extend(self.linear_fused(gpu, &a.x, &lw.qkv, &a.q, rope)?);
                }
                None => d.extend(self.linear_fused(gpu, &a.x, &lw.qkv, &a.qkv, norm)?),
            }
            if !epilogue {
                d.push(qkv_rope(
                    gpu,
                    &QkvRope {
                        qkv: qkv_parts.as_ref().unwrap_or(&a.qkv),
                        slices: qkv_parts.as_ref().map_or(1, |p| p.dim(0)),
                        q_out: &a.q,
                        to: self.qkv_targets(l),
                    },
                )?);
            }
            let attn_opts = AttentionOptions {
                causal: true,
                ..attention_opts
            };
            // With x quantized by its producers the attention's merge may quantize its output for
            // O too (where the variant and shapes allow; else O quantizes it itself).
            let attn_xq = match (xq, &a.xq_attn) {
                (Some(_), Some(buf)) if self.attention_xq_wanted() => {
                    match attention_quantizing(
                        gpu, &a.q, k, v, &a.attn, &self.step, &attn_opts, buf,
                    ) {
                        Ok(ds) => {
                            d.extend(ds);
                            Some(buf)
                        }
                        Err(DriftError::Unsupported(why)) => {
                            log::debug!("O quantizes its own input: {why}");
                            None
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => None,
            };
            if attn_xq.is_none() {
                d.extend(attention(gpu, &a.q, k, v, &a.attn, &self.step, &attn_opts)?);
            }
            let attn2 = a.attn.reshape(&[t, c.n_heads * c.head_dim])?;
            let Some(u) = &a.unfused else {
                // x += O(attn); gu = gate_up(rmsnorm(x)); x += down(swiglu(gu)).
                let residual = Fuse {
                    residual: Some(&a.x),
                    ..Default::default()
                };
                let o_xq = xq.filter(|_| o_makes_xq);
                let o = Fuse {
                    xq_in: attn_xq,
                    xq_out: o_xq
                        .filter(|_| produce)
                        .map(|(x, _)| (x, Some(&lw.ffn_norm))),
                    ..residual
                };
                d.extend(self.linear_fused(gpu, &attn2, &lw.wo, &a.x, o)?);
                let norm = Fuse {
                    norm: Some((&lw.ffn_norm, eps)),
                    ..Default::default()
                };
                if glu_epilogue(gpu, &lw.gate_up, t) {
                    // act = silu(gate) * up straight out of the gate-up product (into gu's first
                    // half), so the down product has no prologue to stage.
                    let act = a.gu.view(0, &[t, c.intermediate])?;
                    let glu = Fuse {
                        glu: true,
                        xq_in: o_xq.map(|(x, _)| x),
                        xq_out: xq.filter(|_| produce).map(|(_, act)| (act, None)),
                        ..norm
                    };
                    d.extend(self.linear_fused(gpu, &a.x, &lw.gate_up, &act, glu)?);
                    // The next layer's QKV (the LM head after the last) reads x quantized under
                    // its norm's weight.
                    let next_norm = self
                        .w
                        .layers
                        .get(l + 1)
                        .map_or(&self.w.norm, |n| &n.attn_norm);
                    let down = Fuse {
                        xq_in: xq.map(|(_, act)| act),
                        xq_out: xq.filter(|_| produce).map(|(x, _)| (x, Some(next_norm))),
                        ..residual
                    };
                    d.extend(self.linear_fused(gpu, &act, &lw.down, &a.x, down)?);
                    continue;
                }
                if xq.is_some() {
                    return Err(DriftError::Unsupported(
                        "producer-quantized x without the GLU epilogue".into(),
                    ));
                }
                d.extend(self.linear_fused(gpu, &a.x, &lw.gate_up, &a.gu, norm)?);
                let swiglu = Fuse {
                    swiglu: true,
                    ..residual
                };
                d.extend(self.linear_fused(gpu, &a.gu, &lw.down, &a.x, swiglu)?);
                continue;
            };
            let (ds, o_parts) = self.linear_or_partials(gpu, &attn2, &lw.wo, &u.o)?;
            d.extend(ds);
            d.push(add_residual_norm(
                gpu,
                &a.x,
                (&u.o, o_parts.as_ref()),
                &lw.ffn_norm,
                &u.xn,
                eps,
            )?);
            if glu_matmul(gpu, &u.xn, &lw.gate_up) {
                let glu = Fuse {
                    glu: true,
                    ..Default::default()
                };
                d.extend(self.linear_fused(gpu, &u.xn, &lw.gate_up, &u.act, glu)?);
            } else {
                d.extend(self.linear(gpu, &u.xn, &lw.gate_up, &a.gu)?);
                d.push(swiglu(gpu, &a.gu, &u.act)?);
            }
            let (ds, down_parts) = self.linear_or_partials(gpu, &u.act, &lw.down, &u.down)?;
            d.extend(ds);
            let next = self
                .w
                .layers
                .get(l + 1)
                .map_or(&self.w.norm, |n| &n.attn_norm);
            d.push(add_residual_norm(
                gpu,
                &a.x,
                (&u.down, down_parts.as_ref()),
                next,
                &u.xn,
                eps,
            )?);
        }
        Ok(d)
    }

    /// Logits of rows `rows` of the stage into `out`: the LM head on the final-normed states, or (fused)
    /// on the residual stream with the final norm as its prologue.
    fn head(
        &self,
        gpu: &Gpu,
        a: &Activations,
        rows: std::ops::Range<usize>,
        out: &Tensor,
    ) -> Result<Vec<Dispatch>> {
        self.head_fused(gpu, a, rows, out, None)
    }

    /// [`Self::head`], reading x quantized by the last down product from `xq_in` where given.
    fn head_fused(
        &self,
        gpu: &Gpu,
        a: &Activations,
        rows: std::ops::Range<usize>,
        out: &Tensor,
        xq_in: Option<&Tensor>,
    ) -> Result<Vec<Dispatch>> {
        match &a.unfused {
            Some(u) => self.linear(gpu, &u.xn.rows(rows.start, rows.end)?, &self.w.lm_head, out),
            None => self.linear_fused(
                gpu,
                &a.x.rows(rows.start, rows.end)?,
                &self.w.lm_head,
                out,
                Fuse {
                    norm: Some((&self.w.norm, self.cfg.rms_eps as f32)),
                    xq_in,
                    ..Default::default()
                },
            ),
        }
    }

    /// One decode step: the token at `ids[pos]` in, logits and the greedy id (`ids[pos + 1]`) out.
    fn build_decode(&self, gpu: &Gpu, attention_opts: AttentionOptions) -> Result<Program> {
        let a = &self.decode_acts;
        let mut p = Program::new();
        // The input id is read through the step-independent view ids[0..1]; `run_decode` copies the id
        // into place (the argmax writes it there directly when greedy).
        let ids = self.ids.view(0, &[1])?;
        // x quantized by its producers where every product of the layers can take it (integer-dot-
        // product weights in one part each); else, or with `DRIFT_DP4A_XQ=0`, each product
        // quantizes its own input.
        let xq_wanted = std::env::var_os("DRIFT_DP4A_XQ").is_none_or(|v| v != "0");
        let (layers, xq) = match self.layers(gpu, a, &ids, 1, attention_opts, xq_wanted) {
            Ok(d) => (d, xq_wanted),
            Err(e) if xq_wanted => {
                log::debug!("decode without producer-quantized x: {e}");
                (self.layers(gpu, a, &ids, 1, attention_opts, false)?, false)
            }
            Err(e) => return Err(e),
        };
        p.extend(layers);
        // The last down product leaves x quantized under the final norm's weight for the LM head
        // where it can take it (else it quantizes its own input).
        let head_xq = a.xq.as_ref().filter(|_| xq).map(|(x, _)| x);
        let head = match self.head_fused(gpu, a, 0..1, &self.logits, head_xq) {
            Err(e) if head_xq.is_some() => {
                log::debug!("LM head without producer-quantized x: {e}");
                self.head(gpu, a, 0..1, &self.logits)?
            }
            r => r?,
        };
        p.extend(head);
        Ok(p)
    }

    /// The decode step for a step that leaves `kv_len` rows in the cache.
    pub fn decode_program(&self, kv_len: usize) -> &Program {
        if let Some(s) = &self.decode_step {
            return &s.program;
        }
        match &self.decode_long {
            Some(long) if kv_len > self.row_max_kv => long,
            _ => self.decode.as_ref().expect("built in new"),
        }
    }

    /// The one-dispatch decode step, where this model runs it.
    pub fn decode_step(&self) -> Option<&DecodeStep> {
        self.decode_step.as_ref()
    }

    /// Whether a grid barrier of the one-dispatch step gave up since the last call (its results are
    /// then wrong); if so the step is dropped and the multi-dispatch program serves from now on.
    pub fn decode_step_timed_out(&mut self, gpu: &Gpu) -> Result<bool> {
        let timed_out = match &self.decode_step {
            Some(s) => s.timed_out(gpu)?,
            None => false,
        };
        if timed_out {
            log::warn!(
                "one-dispatch decode step: a grid barrier timed out; using the multi-dispatch program"
            );
            self.decode_step = None;
        }
        Ok(timed_out)
    }

    /// KV length up to which decode runs the one-pass attention (0: never).
    pub fn row_attention_max_kv(&self) -> usize {
        self.row_max_kv
    }

    /// The KV length past which [`Self::decode_program`] gives the chunked-attention program, where
    /// this cache is long enough to get there.
    pub fn decode_switch_kv(&self) -> Option<usize> {
        self.decode_long.as_ref().map(|_| self.row_max_kv)
    }

    /// The greedy selection dispatches (argmax of the logits into the next step's input id).
    pub fn greedy_dispatches(&self) -> &[Dispatch] {
        &self.greedy
    }

    /// Writes the ids of the next prefill (`ids[0..n]`).
    pub fn write_ids(&self, gpu: &Gpu, ids: &[u32]) -> Result<()> {
        gpu.write_tensor_bytes(&self.ids, bytemuck::cast_slice(ids))
    }

    /// Writes the step state: `kv_len` rows valid after this step, first row at `pos0`.
    pub fn set_step(&self, gpu: &Gpu, kv_len: usize, pos0: usize) -> Result<()> {
        gpu.write_tensor_bytes(
            &self.step,
            bytemuck::cast_slice(&[kv_len as u32, pos0 as u32]),
        )
    }

    /// Builds the prefill program for `t` tokens (already written at `ids[0..t]`) starting at `pos0`.
    /// With `all_logits`, logits of every row go to the returned tensor `[t, vocab]`; otherwise only the
    /// last row's, into `self.logits`.
    /// The program holds its activation buffers (dispatches keep what they bind alive).
    pub fn build_prefill(
        &self,
        gpu: &Gpu,
        t: usize,
        all_logits: bool,
    ) -> Result<(Program, Option<Tensor>)> {
        let io = self.w.dtype;
        let a = Activations::new(gpu, &self.cfg, t, io, self.fused(t))?;
        let ids = self.ids.view(0, &[t])?;
        let mut p = Program::new();
        p.extend(self.layers(gpu, &a, &ids, t, AttentionOptions::default(), false)?);
        let logits = if all_logits {
            let l = gpu.tensor(
                "prefill logits",
                &[t, self.cfg.vocab],
                DType::F32,
                Category::Activations,
            )?;
            p.extend(self.head(gpu, &a, 0..t, &l)?);
            Some(l)
        } else {
            p.extend(self.head(gpu, &a, t - 1..t, &self.logits)?);
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

/// Whether the gate-up product of a `t`-row fused stage ends in the GLU epilogue (one row, one weight
/// part that [`paired_epilogue_fits`]; `DRIFT_GLU=0` keeps the SwiGLU prologue of the down product, for
/// A/B timing).
fn glu_epilogue(gpu: &Gpu, w: &Linear, t: usize) -> bool {
    let on = !matches!(std::env::var("DRIFT_GLU").as_deref(), Ok("0"));
    on && t == 1 && matches!(&w.parts[..], [part] if paired_epilogue_fits(gpu, part))
}

/// `x += residual; xn = rmsnorm(x) * weight`, the residual given as a product's output or, where the
/// product was split along K, as its partial sums (`(out, Some(partials))`).
fn add_residual_norm(
    gpu: &Gpu,
    x: &Tensor,
    residual: (&Tensor, Option<&Tensor>),
    weight: &Tensor,
    xn: &Tensor,
    eps: f32,
) -> Result<Dispatch> {
    match residual {
        (_, Some(parts)) => {
            add_rmsnorm_partials(gpu, x, parts, weight, x, xn, eps, RowVariant::Auto)
        }
        (out, None) => add_rmsnorm(gpu, x, out, weight, x, xn, eps, RowVariant::Auto),
    }
}

/// Whether the gate-up product of the matrix-matrix stage ends in the SwiGLU epilogue of the
/// cooperative matmul (no bias, the weight or its dequantised copy in one binding; `DRIFT_MATMUL_GLU=0` keeps
/// the separate SwiGLU dispatch, for A/B timing).
fn glu_matmul(gpu: &Gpu, x: &Tensor, w: &Linear) -> bool {
    let on = !matches!(std::env::var("DRIFT_MATMUL_GLU").as_deref(), Ok("0"));
    on && w.bias.is_none() && glu_available(gpu, x.dtype, w.n, w.k)
}

/// Whether the QKV product of a `t`-row fused stage ends in the RoPE epilogue, storing q, k and v in
/// the attention layouts itself (one row, no bias, one weight part that [`paired_epilogue_fits`];
/// `DRIFT_ROPE_EPILOGUE=0` keeps the separate split dispatch, for A/B timing).
fn rope_epilogue(gpu: &Gpu, w: &Linear, t: usize) -> bool {
    let on = !matches!(std::env::var("DRIFT_ROPE_EPILOGUE").as_deref(), Ok("0"));
    on && t == 1
        && w.bias.is_none()
        && matches!(&w.parts[..], [part] if paired_epilogue_fits(gpu, part))
}

/// Whether every projection of a `t`-row stage runs as matrix-vector products (what the fused stage
/// needs).
fn fusable(w: &LlamaWeights, t: usize) -> bool {
    w.layers
        .iter()
        .flat_map(|l| [&l.qkv, &l.wo, &l.gate_up, &l.down])
        .chain([&w.lm_head])
        .all(|l| matvec_rows(l, t))
}

/// Whether a product of `rows` rows with `w` uses the matrix-vector kernels.
fn matvec_rows(w: &Linear, rows: usize) -> bool {
    rows <= MATVEC_MAX_ROWS && (w.parts.len() == 1 || rows == 1)
}
