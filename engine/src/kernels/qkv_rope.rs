//! Fused QKV split + rotary embedding + KV-cache write (one dispatch per layer and step).

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// Which dims rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// (x[2i], x[2i+1]): GGUF llama weights (permuted by the converter).
    Interleaved,
    /// (x[i], x[i + rot/2]): Hugging Face checkpoints, GGUF qwen2/neox.
    HalfSplit,
}

/// Inverse frequencies `theta^(-2i/rot) / factor[i]` for `i < rot/2`, in f64 then rounded to f32.
pub fn inv_freq(theta: f64, rot: usize, factors: Option<&[f32]>) -> Vec<f32> {
    (0..rot / 2)
        .map(|i| {
            let f = theta.powf(-((2 * i) as f64) / rot as f64);
            (f / factors.map_or(1.0, |v| v[i] as f64)) as f32
        })
        .collect()
}

pub struct QkvRope<'a> {
    /// `[T, (hq + 2 hkv) * d]`
    pub qkv: &'a Tensor,
    /// `[T, hq, d]`
    pub q_out: &'a Tensor,
    /// `[max_ctx, hkv, d]` each
    pub k_cache: &'a Tensor,
    pub v_cache: &'a Tensor,
    /// U32 `[2]`: (kv_len, position of token 0)
    pub step: &'a Tensor,
    /// f32 `[rot/2]` from [`inv_freq`]
    pub inv_freq: &'a Tensor,
    pub hq: usize,
    pub hkv: usize,
    pub pairs: RopePairs,
}

pub fn qkv_rope(gpu: &Gpu, a: &QkvRope) -> Result<Dispatch> {
    let d = a.q_out.dim(-1);
    let t = a.qkv.numel() / ((a.hq + 2 * a.hkv) * d).max(1);
    let rot = 2 * a.inv_freq.numel();
    let max_ctx = a.k_cache.numel() / (a.hkv * d).max(1);
    if a.qkv.numel() != t * (a.hq + 2 * a.hkv) * d
        || a.q_out.numel() != t * a.hq * d
        || a.v_cache.numel() != a.k_cache.numel()
        || a.k_cache.numel() != max_ctx * a.hkv * d
        || rot > d
        || !d.is_multiple_of(2)
    {
        return Err(shape_err!(
            "qkv_rope: qkv {:?}, q {:?}, cache {:?}, {} rotary dims for {}+2x{} heads of {d}",
            a.qkv.shape,
            a.q_out.shape,
            a.k_cache.shape,
            rot,
            a.hq,
            a.hkv
        ));
    }
    if a.step.dtype != DType::U32
        || a.inv_freq.dtype != DType::F32
        || a.k_cache.dtype != a.v_cache.dtype
    {
        return Err(shape_err!(
            "qkv_rope: step must be u32, inv_freq f32, caches of one dtype"
        ));
    }
    let f16 = [a.qkv, a.q_out, a.k_cache]
        .iter()
        .any(|x| x.dtype == DType::F16);
    let spec = KernelSpec::new(
        format!("qkv_rope_{}", a.k_cache.dtype.wgsl()),
        shader!("qkv_rope.wgsl"),
        "qkv_rope",
    )
    .define("TQ", a.qkv.dtype.wgsl())
    .define("TO", a.q_out.dtype.wgsl())
    .define("TC", a.k_cache.dtype.wgsl())
    .define("F16", u8::from(f16))
    .define("INTERLEAVED", u8::from(a.pairs == RopePairs::Interleaved));
    let kernel = gpu.kernel(&spec)?;
    let threads = (t * (a.hq + 2 * a.hkv) * d / 2) as u32;
    let io = (a.qkv.numel() * a.qkv.elem_bytes() as usize
        + a.q_out.numel() * a.q_out.elem_bytes() as usize
        + 2 * t * a.hkv * d * a.k_cache.elem_bytes() as usize) as f64;
    gpu.dispatch(
        &kernel,
        &[
            t as u32,
            a.hq as u32,
            a.hkv as u32,
            d as u32,
            rot as u32,
            max_ctx as u32,
        ],
        &[a.qkv, a.q_out, a.k_cache, a.v_cache, a.step, a.inv_freq],
        grid(threads.div_ceil(64), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: threads as f64 * 6.0,
            bytes: io,
        },
    )
}
