//! Fused QKV split + rotary embedding + KV-cache write (one dispatch per layer and step).

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::rope::turns_of;
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

/// The rotary frequencies `theta^(-2i/rot) / factor[i]` for `i < rot/2`, computed in f64, as the
/// (hi, lo) turns-per-position pairs of `shaders/rope_angle.wgsl` (`[rot/2, 2]` f32 on the GPU).
pub fn rope_turns(theta: f64, rot: usize, factors: Option<&[f32]>) -> Vec<f32> {
    turns_of(
        (0..rot / 2).map(|i| {
            theta.powf(-((2 * i) as f64) / rot as f64) / factors.map_or(1.0, |v| v[i] as f64)
        }),
    )
}

/// The QKV split kernel with the shared accurate-angle helpers appended.
const QKV_ROPE_SRC: &str = concat!(shader!("qkv_rope.wgsl"), shader!("rope_angle.wgsl"));

/// Where a QKV split stores its results and how it rotates them: shared by [`qkv_rope`] and the
/// matrix-vector kernels' RoPE epilogue ([`crate::kernels::matvec::MatvecOptions::rope`]).
#[derive(Clone, Copy, Debug)]
pub struct QkvTargets<'a> {
    /// `[max_ctx, hkv, d]` each, one dtype.
    pub k_cache: &'a Tensor,
    pub v_cache: &'a Tensor,
    /// U32 `[2]`: (kv_len, position of token 0)
    pub step: &'a Tensor,
    /// f32 `[rot/2, 2]` from [`rope_turns`]
    pub turns: &'a Tensor,
    pub hq: usize,
    pub hkv: usize,
    pub pairs: RopePairs,
}

/// The shape of a checked QKV split.
pub(crate) struct QkvShape {
    /// Tokens.
    pub t: usize,
    /// Head dim.
    pub d: usize,
    /// Rotary dims.
    pub rot: usize,
    /// Rows of each cache.
    pub max_ctx: usize,
}

impl QkvTargets<'_> {
    /// Rows of each cache for heads of `d`.
    fn max_ctx(&self, d: usize) -> usize {
        self.k_cache.numel() / (self.hkv * d).max(1)
    }

    /// hq, hkv, d, rotary dims and cache rows, as the kernels' params take them (q_out `[.., d]`).
    pub(crate) fn params(&self, q_out: &Tensor) -> [u32; 5] {
        let d = q_out.dim(-1);
        [self.hq, self.hkv, d, self.turns.numel(), self.max_ctx(d)].map(|v| v as u32)
    }

    /// Checks the targets against `qkv_elems` elements of projections and `q_out` (`[T, hq, d]`;
    /// d from its last dim).
    pub(crate) fn check(&self, what: &str, qkv_elems: usize, q_out: &Tensor) -> Result<QkvShape> {
        let d = q_out.dim(-1);
        let heads = self.hq + 2 * self.hkv;
        let t = qkv_elems / (heads * d).max(1);
        let rot = self.turns.numel();
        let max_ctx = self.max_ctx(d);
        if qkv_elems != t * heads * d
            || q_out.numel() != t * self.hq * d
            || self.v_cache.numel() != self.k_cache.numel()
            || self.k_cache.numel() != max_ctx * self.hkv * d
            || rot > d
            || !rot.is_multiple_of(2)
            || !d.is_multiple_of(2)
        {
            return Err(shape_err!(
                "{what}: {qkv_elems} projections, q {:?}, cache {:?}, {rot} rotary dims for {}+2x{} heads of {d}",
                q_out.shape,
                self.k_cache.shape,
                self.hq,
                self.hkv
            ));
        }
        if self.step.dtype != DType::U32
            || self.step.numel() < 2
            || self.turns.dtype != DType::F32
            || self.k_cache.dtype != self.v_cache.dtype
            || !matches!(self.k_cache.dtype, DType::F32 | DType::F16)
        {
            return Err(shape_err!(
                "{what}: step must be u32 [2], turns f32, caches f32 or f16 of one dtype"
            ));
        }
        Ok(QkvShape { t, d, rot, max_ctx })
    }
}

pub struct QkvRope<'a> {
    /// `[T, (hq + 2 hkv) * d]`, or with `slices` > 1 the f32 partial sums `[slices, T, (hq + 2 hkv) * d]`
    /// of a split-K product (`kernels::matmul::matmul_partials`), added here in slice order
    pub qkv: &'a Tensor,
    /// Partial sums in `qkv` (1: a plain projection).
    pub slices: usize,
    /// `[T, hq, d]`
    pub q_out: &'a Tensor,
    pub to: QkvTargets<'a>,
}

pub fn qkv_rope(gpu: &Gpu, a: &QkvRope) -> Result<Dispatch> {
    let slices = a.slices.max(1);
    if slices > 1 && (a.qkv.dtype != DType::F32 || a.qkv.dim(0) != slices) {
        return Err(shape_err!(
            "qkv_rope: {slices} partial sums must be f32 [{slices}, ..], got {:?} {:?}",
            a.qkv.shape,
            a.qkv.dtype
        ));
    }
    let elems = a.qkv.numel() / slices;
    let QkvShape { t, d, rot, max_ctx } = a.to.check("qkv_rope", elems, a.q_out)?;
    let QkvTargets {
        k_cache,
        v_cache,
        step,
        turns,
        hq,
        hkv,
        pairs,
    } = a.to;
    let f16 = [a.qkv, a.q_out, k_cache]
        .iter()
        .any(|x| x.dtype == DType::F16);
    let spec = KernelSpec::new(
        format!(
            "qkv_rope_{}{}",
            k_cache.dtype.wgsl(),
            if slices > 1 { "_parts" } else { "" }
        ),
        QKV_ROPE_SRC,
        "qkv_rope",
    )
    .define("SLICES", u8::from(slices > 1))
    .define("TQ", a.qkv.dtype.wgsl())
    .define("TO", a.q_out.dtype.wgsl())
    .define("TC", k_cache.dtype.wgsl())
    .define("F16", u8::from(f16))
    .define("INTERLEAVED", u8::from(pairs == RopePairs::Interleaved));
    let kernel = gpu.kernel(&spec)?;
    let threads = (t * (hq + 2 * hkv) * d / 2) as u32;
    let io = (a.qkv.numel() * a.qkv.elem_bytes() as usize
        + a.q_out.numel() * a.q_out.elem_bytes() as usize
        + 2 * t * hkv * d * k_cache.elem_bytes() as usize) as f64;
    gpu.dispatch(
        &kernel,
        &[
            t as u32,
            hq as u32,
            hkv as u32,
            d as u32,
            rot as u32,
            max_ctx as u32,
            slices as u32,
            elems as u32,
        ],
        &[a.qkv, a.q_out, k_cache, v_cache, step, turns],
        grid(threads.div_ceil(64), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: threads as f64 * 6.0,
            bytes: io,
        },
    )
}
