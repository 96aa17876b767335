//! Token selection on the GPU: argmax for greedy decoding (the id stays on the GPU as the next step's
//! input), and a top-k candidate list with repetition penalty for sampling.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::KernelSpec;
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// The top-k kernel with the shared workgroup reduction appended.
const TOPK_SRC: &str = concat!(shader!("sample.wgsl"), shader!("sample_reduce.wgsl"));

fn check(logits: &Tensor, step: &Tensor, history: &Tensor) -> Result<()> {
    if logits.dtype != DType::F32 || step.dtype != DType::U32 || history.dtype != DType::U32 {
        return Err(shape_err!(
            "sampling kernels take f32 logits and u32 step/history tensors"
        ));
    }
    Ok(())
}

/// `ids[0] = history[step[0]] = argmax(logits)` (lowest id on ties), as two dispatches
/// (`shaders/sample_argmax.wgsl`): workgroups over the whole device reduce slices of the vocabulary into a
/// small scratch of (id, value) pairs, then one workgroup reduces those. With `advance`, the second
/// then adds one to both words of `step` (kv_len, pos0): the state of the next one-row decode step.
pub fn argmax(
    gpu: &Gpu,
    logits: &Tensor,
    ids: &Tensor,
    history: &Tensor,
    step: &Tensor,
    advance: bool,
) -> Result<Vec<Dispatch>> {
    check(logits, step, history)?;
    let v = logits.numel();
    if v == 0 || v > u32::MAX as usize / 2 {
        return Err(shape_err!("argmax over {v} logits"));
    }
    // Four logits per lane per workgroup at most 256 workgroups: the loads of a lane are independent.
    let parts = v.div_ceil(ARGMAX_WG * 4).clamp(1, 256);
    let partial = gpu.tensor(
        "argmax partials",
        &[2 * parts],
        DType::U32,
        crate::Category::Activations,
    )?;
    let src = concat!(shader!("sample_argmax.wgsl"), shader!("sample_reduce.wgsl"));
    let first =
        gpu.kernel(&KernelSpec::new("argmax_partial", src, "argmax_partial").define("FINAL", 0))?;
    let name = if advance {
        "argmax_final_advance"
    } else {
        "argmax_final"
    };
    let last = gpu.kernel(
        &KernelSpec::new(name, src, "argmax_final")
            .define("FINAL", 1)
            .define("ADVANCE", u8::from(advance)),
    )?;
    let (v, parts) = (v as u32, parts as u32);
    Ok(vec![
        gpu.dispatch(
            &first,
            &[v, parts],
            &[logits, &partial],
            [parts, 1, 1],
            Cost {
                flops: v as f64,
                bytes: v as f64 * 4.0,
            },
        )?,
        gpu.dispatch(
            &last,
            &[v, parts],
            &[&partial, ids, history, step],
            [1, 1, 1],
            Cost {
                flops: parts as f64,
                bytes: parts as f64 * 8.0,
            },
        )?,
    ])
}

/// Threads per workgroup of both argmax passes (fixed in the shader).
const ARGMAX_WG: usize = 256;

/// Settings of the candidate kernel (host-side sampling finishes the job).
#[derive(Clone, Copy, Debug)]
pub struct TopkOptions {
    pub k: usize,
    pub repeat_penalty: f32,
    pub repeat_window: usize,
    pub temperature: f32,
}

/// Writes `cand` (U32 `[2k + 2]`): k (id, f32 bits of the penalised logit) pairs, largest first, then
/// the max logit and `sum(exp((l - max) / T))` over the vocabulary. Modifies `logits` (scratch).
pub fn topk(
    gpu: &Gpu,
    logits: &Tensor,
    history: &Tensor,
    step: &Tensor,
    cand: &Tensor,
    o: &TopkOptions,
) -> Result<Dispatch> {
    check(logits, step, history)?;
    let v = logits.numel();
    if o.k == 0 || o.k > v || cand.numel() < 2 * o.k + 2 || cand.dtype != DType::U32 {
        return Err(shape_err!(
            "topk: k = {} over {v} logits into {:?}",
            o.k,
            cand.shape
        ));
    }
    let kernel = gpu.kernel(&KernelSpec::new("topk", TOPK_SRC, "topk"))?;
    let inv_temp = 1.0 / o.temperature.max(1e-6);
    gpu.dispatch(
        &kernel,
        &[
            v as u32,
            o.k as u32,
            o.repeat_window as u32,
            o.repeat_penalty.to_bits(),
            inv_temp.to_bits(),
        ],
        &[logits, cand, history, step],
        [1, 1, 1],
        Cost {
            flops: (v * (o.k + 2)) as f64,
            bytes: (v * (o.k + 2) * 4) as f64,
        },
    )
}
