//! The one-dispatch decode step ([`crate::kernels::decode_step`]) for a loaded Llama-family model:
//! which models it serves, packing their weights and KV cache into the kernel's layouts (the model's
//! own tensors become views of the packed buffers, so nothing is held twice), and the check that the
//! device runs the whole grid concurrently.
//!
//! The step serves models of up to [`DEFAULT_MAX_WEIGHT_BYTES`] of weights unless asked for any
//! (`DRIFT_DECODE_STEP=1`); `DRIFT_DECODE_STEP=0` keeps the multi-dispatch decode program for every
//! model. `DRIFT_DECODE_STEP_WG=N` sets the
//! grid (default [`DEFAULT_WORKGROUPS`]) and `DRIFT_DECODE_STEP_WHOLE=N` the KV length up to which a
//! head's attention is one workgroup's (default [`DEFAULT_WHOLE_MAX`]). A grid that stops running
//! concurrently after calibration fails the reply with an error and drops the step
//! ([`crate::models::llama::LlamaModel::decode_step_timed_out`]).

use std::sync::Arc;

use crate::error::{DriftError, Result};
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::decode_step::{StepShape, StepTensors, decode_step};
use crate::kernels::grid_sync::{SYNC_WORDS, take_timeout};
use crate::kernels::qkv_rope::RopePairs;
use crate::memory::Category;
use crate::models::config::LlmConfig;
use crate::models::llama_weights::{Linear, LlamaWeights};
use crate::tensor::{DType, Tensor};

/// Workgroups of the step's grid unless `DRIFT_DECODE_STEP_WG` says otherwise: one per SM of the H200
/// (132), where the grid barrier was measured (BENCHMARKS.md).
pub const DEFAULT_WORKGROUPS: u32 = 132;

/// KV length up to which a head's attention runs in one workgroup unless `DRIFT_DECODE_STEP_WHOLE`
/// says otherwise. On the H200 (SmolLM2-135M shape, BENCHMARKS.md): one workgroup per head 0.592 ms
/// per token against 0.646 chunked at 64 keys of context, 0.714 against 0.701 at 640.
pub const DEFAULT_WHOLE_MAX: u32 = 384;

/// Weights up to which a model takes the step by default. On the H200 (2026-12-01, `drift bench llm
/// --random-weights`) the step took SmolLM2-135M (270 MB of f16 weights) from 0.772 to 0.646 ms per
/// token but Llama 3.2 1B (2.47 GB, weights in two bindings) from 0.951 to 1.206 ms: small models
/// are bound by dispatch boundaries, which the step removes, large ones by their products' bandwidth,
/// where the step's plain row products are slower than the tuned matrix-vector kernels. Between the
/// two the gain falls about linearly with the bytes and crosses zero near 1 GB.
pub const DEFAULT_MAX_WEIGHT_BYTES: u64 = 1 << 30;

/// How the step is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOptions {
    /// Workgroups of the grid (all must run concurrently).
    pub workgroups: u32,
    /// See [`StepShape::whole_max`].
    pub whole_max: u32,
    /// The layer from which the weights take a second binding; `None`: only where one binding cannot
    /// hold them (from the most layers the first holds).
    pub weight_split: Option<usize>,
    /// Models with more bytes of packed weights keep the multi-dispatch program (`None`: any size).
    pub max_weight_bytes: Option<u64>,
}

/// The step the environment asks for: `None` when `DRIFT_DECODE_STEP=0`; for models of any size
/// when it is 1, else up to [`DEFAULT_MAX_WEIGHT_BYTES`].
pub fn requested() -> Option<StepOptions> {
    let switch = std::env::var("DRIFT_DECODE_STEP");
    if matches!(switch.as_deref(), Ok("0")) {
        return None;
    }
    let any_size = matches!(switch.as_deref(), Ok("1"));
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Some(StepOptions {
        workgroups: env("DRIFT_DECODE_STEP_WG", DEFAULT_WORKGROUPS).max(1),
        whole_max: env("DRIFT_DECODE_STEP_WHOLE", DEFAULT_WHOLE_MAX),
        weight_split: None,
        max_weight_bytes: (!any_size).then_some(DEFAULT_MAX_WEIGHT_BYTES),
    })
}

/// The packed buffers and the step program.
pub struct DecodeStep {
    pub program: Program,
    pub workgroups: u32,
    sync: Tensor,
}

impl DecodeStep {
    /// Whether a grid barrier gave up since the last call (the step's results are then wrong).
    pub fn timed_out(&self, gpu: &Gpu) -> Result<bool> {
        take_timeout(gpu, &self.sync)
    }
}

/// The kernel's shape for this model, where the kernel serves it: f16 weights in one part each, the
/// device's f16 and subgroups of at least 8, and the packed buffers within one binding each (the
/// weights within two).
pub fn step_shape(
    gpu: &Gpu,
    cfg: &LlmConfig,
    w: &LlamaWeights,
    max_ctx: usize,
    opts: &StepOptions,
) -> Option<StepShape> {
    let c = &gpu.caps;
    let plain = |l: &Linear| matches!(&l.parts[..], [p] if p.dtype == DType::F16);
    let layers_ok = w.layers.iter().all(|l| {
        plain(&l.qkv)
            && plain(&l.wo)
            && plain(&l.gate_up)
            && plain(&l.down)
            && l.wo.bias.is_none()
            && l.gate_up.bias.is_none()
            && l.down.bias.is_none()
            && l.qkv.bias.as_ref().is_none_or(|b| b.dtype == DType::F32)
    });
    let bias = w.layers.iter().any(|l| l.qkv.bias.is_some());
    let mut shape = StepShape {
        hidden: cfg.hidden,
        inter: cfg.intermediate,
        hq: cfg.n_heads,
        hkv: cfg.n_kv_heads,
        d: cfg.head_dim,
        rot: 2 * w.rope_turns.dim(0),
        vocab: cfg.vocab,
        layers: cfg.n_layers,
        interleaved: w.pairs == RopePairs::Interleaved,
        bias,
        tied: same_tensor(&w.embed, &w.lm_head.parts[0]),
        max_ctx,
        whole_max: opts.whole_max,
        w_split: 0,
    };
    let binding = c.max_storage_binding.min(c.max_buffer_size);
    shape.w_split = shape.weight_split(binding, opts.weight_split)?;
    let fits = |elems: usize, bytes: u64| (elems as u64) * bytes <= c.max_storage_binding;
    let ok = c.f16
        && c.subgroup
        && c.subgroup_min_size >= 8
        && c.max_storage_buffers_per_stage >= if shape.two_weight_bindings() { 8 } else { 7 }
        && layers_ok
        && (!bias || w.layers.iter().all(|l| l.qkv.bias.is_some()))
        && plain(&w.lm_head)
        && w.lm_head.bias.is_none()
        && w.embed.dtype == DType::F16
        && shape.supported()
        && opts
            .max_weight_bytes
            .is_none_or(|max| 2 * shape.w_len() as u64 <= max)
        && shape.shared_bytes() <= c.max_workgroup_storage as usize
        && fits(shape.kv_len(), 2)
        && fits(shape.scratch_words(), 4)
        && fits(shape.f_len(), 4);
    ok.then_some(shape)
}

fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    Arc::ptr_eq(&a.storage.buffer, &b.storage.buffer)
        && a.storage.offset == b.storage.offset
        && a.shape == b.shape
}

/// Copies `src` into `dst` (same byte length) on the GPU queue.
fn copy_into(enc: &mut wgpu::CommandEncoder, src: &Tensor, dst: &Tensor) -> Result<()> {
    if src.byte_len() != dst.byte_len() || !src.byte_len().is_multiple_of(4) {
        return Err(DriftError::Other(format!(
            "decode step packing: {:?} ({} bytes) into {:?} ({} bytes)",
            src.shape,
            src.byte_len(),
            dst.shape,
            dst.byte_len()
        )));
    }
    enc.copy_buffer_to_buffer(
        &src.storage.buffer.buffer,
        src.storage.offset,
        &dst.storage.buffer.buffer,
        dst.storage.offset,
        src.byte_len(),
    );
    Ok(())
}

/// Packs the weights into the kernel's layout (the model's tensors become views of it), makes the KV
/// cache (one view pair per layer pushed to `kv`, which must be empty) and builds the step over `n_wg`
/// workgroups. `step`, `ids` (the input id at 0) and `logits` are the model's. On an error the weights
/// are unchanged and `kv` stays empty.
#[allow(clippy::too_many_arguments)]
pub fn build(
    gpu: &Gpu,
    cfg: &LlmConfig,
    shape: &StepShape,
    w: &mut LlamaWeights,
    kv: &mut Vec<(Tensor, Tensor)>,
    step: &Tensor,
    ids: &Tensor,
    logits: &Tensor,
    n_wg: u32,
) -> Result<DecodeStep> {
    let s = shape;
    let wt = gpu.tensor(
        "decode step weights",
        &[s.w_split],
        DType::F16,
        Category::Weights,
    )?;
    let wt2 = if s.two_weight_bindings() {
        Some(gpu.tensor(
            "decode step weights (second binding)",
            &[s.w_len() - s.w_split],
            DType::F16,
            Category::Weights,
        )?)
    } else {
        None
    };
    // The view of the packed weights at f16 element `at` (a weight lies in one of the two).
    let wview = |at: usize, shape: &[usize]| match &wt2 {
        Some(w2) if at >= s.w_split => w2.view(at - s.w_split, shape),
        _ => wt.view(at, shape),
    };
    let ft = gpu.tensor(
        "decode step params",
        &[s.f_len()],
        DType::F32,
        Category::Weights,
    )?;
    let kvt = gpu.tensor("kv cache", &[s.kv_len()], DType::F16, Category::KvCache)?;
    let scratch = gpu.arrival_scratch("decode step activations", s.scratch_words())?;
    let mut enc = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("decode step packing"),
        });
    // Weights: each copied into place, then replaced by the view of its copy.
    let mut moves: Vec<(Tensor, Tensor)> = Vec::new();
    let parts = s.w_parts();
    for (l, lw) in w.layers.iter().enumerate() {
        let base = l * s.w_layer();
        for (lin, at) in [
            (&lw.qkv, parts[0]),
            (&lw.wo, parts[1]),
            (&lw.gate_up, parts[2]),
            (&lw.down, parts[3]),
        ] {
            let src = &lin.parts[0];
            moves.push((src.clone(), wview(base + at, &src.shape)?));
        }
    }
    let head = &w.lm_head.parts[0];
    moves.push((head.clone(), wview(s.w_head(), &head.shape)?));
    if !s.tied {
        moves.push((w.embed.clone(), wview(s.w_embed(), &w.embed.shape)?));
    }
    for (src, dst) in &moves {
        copy_into(&mut enc, src, dst)?;
    }
    // f32 parameters: copied (small; the model keeps its own).
    for (l, lw) in w.layers.iter().enumerate() {
        let base = l * s.f_layer();
        copy_into(&mut enc, &lw.attn_norm, &ft.view(base, &[s.hidden])?)?;
        copy_into(
            &mut enc,
            &lw.ffn_norm,
            &ft.view(base + s.hidden, &[s.hidden])?,
        )?;
        if let Some(b) = &lw.qkv.bias {
            copy_into(&mut enc, b, &ft.view(base + 2 * s.hidden, &[s.nqkv()])?)?;
        }
    }
    copy_into(&mut enc, &w.norm, &ft.view(s.f_norm(), &[s.hidden])?)?;
    copy_into(&mut enc, &w.rope_turns, &ft.view(s.f_turns(), &[s.rot])?)?;
    gpu.queue.submit([enc.finish()]);
    gpu.wait()?;
    // The model's tensors now point into the packed buffers (the old buffers go with the last clone).
    let mut views = moves.into_iter().map(|(_, v)| v);
    for lw in w.layers.iter_mut() {
        for lin in [&mut lw.qkv, &mut lw.wo, &mut lw.gate_up, &mut lw.down] {
            lin.parts[0] = views.next().expect("one view per weight");
        }
    }
    w.lm_head.parts[0] = views.next().expect("the head's view");
    w.embed = if s.tied {
        w.lm_head.parts[0].clone()
    } else {
        views.next().expect("the embedding's view")
    };
    let cache = [1, s.max_ctx, s.hkv, s.d];
    for l in 0..s.layers {
        kv.push((
            kvt.view(2 * l * s.kv_plane(), &cache)?,
            kvt.view((2 * l + 1) * s.kv_plane(), &cache)?,
        ));
    }
    let tensors = StepTensors {
        w: &wt,
        w2: wt2.as_ref(),
        f: &ft,
        kv: &kvt,
        scratch: &scratch,
        step,
        ids,
        logits,
    };
    let eps = cfg.rms_eps as f32;
    let scale = 1.0 / (s.d as f32).sqrt();
    let mut program = Program::new();
    program.push(decode_step(gpu, s, &tensors, n_wg, eps, scale)?);
    Ok(DecodeStep {
        program,
        workgroups: n_wg,
        sync: scratch.view(0, &[SYNC_WORDS])?,
    })
}

/// Runs the step once (token 0 at position 0: the prefill overwrites what it leaves in the cache) and
/// keeps it only when the whole grid ran concurrently; `Ok(None)` when it did not (the multi-dispatch
/// program serves then).
pub fn calibrated(
    gpu: &Gpu,
    s: DecodeStep,
    step: &Tensor,
    ids: &Tensor,
) -> Result<Option<DecodeStep>> {
    gpu.write_tensor_bytes(step, bytemuck::cast_slice(&[1u32, 0]))?;
    gpu.write_tensor_bytes(&ids.view(0, &[1])?, bytemuck::cast_slice(&[0u32]))?;
    s.program.run(gpu)?;
    if s.timed_out(gpu)? {
        log::info!(
            "one-dispatch decode step: {} workgroups do not run concurrently here; using the multi-dispatch program",
            s.workgroups
        );
        return Ok(None);
    }
    Ok(Some(s))
}
