//! Rotary position embedding (RoPE), interleaved (GPT-J / GGUF llama) and half-split (NeoX / HF),
//! partial rotary dimensions, llama3 frequency factors, positions read from a GPU tensor so one
//! prebuilt dispatch serves every decode step. Angles are accurate to ~1e-6 rad at any position below
//! 2^24 (see shaders/rope_angle.wgsl for how without f64 on the GPU).

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::softmax::{base_elems, float_dtype, partial_overlap};
use crate::kernels::{KernelSpec, grid};
use crate::memory::Category;
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// (x[2i], x[2i+1]): GPT-J, GGUF llama.
    Interleaved,
    /// (x[i], x[i + rotary_dim/2]): HF Llama, GPT-NeoX.
    HalfSplit,
}

/// Options of [`rope`].
#[derive(Clone, Copy, Debug)]
pub struct RopeOptions<'a> {
    /// Frequency base: pair i turns by theta^(-2i / rotary_dim) radians per position.
    pub theta: f32,
    pub style: RopeStyle,
    /// Leading dimensions of each head that are rotated (even, <= head_dim); the rest pass through.
    pub rotary_dim: usize,
    /// f32 `[rotary_dim / 2]` dividing the inverse frequencies (llama3 rope scaling, GGUF rope_freqs).
    pub freq_factors: Option<&'a Tensor>,
    /// Multiplies positions (linear position interpolation); 1 for none.
    pub freq_scale: f32,
}

impl RopeOptions<'_> {
    pub fn new(theta: f32, style: RopeStyle, rotary_dim: usize) -> RopeOptions<'static> {
        RopeOptions {
            theta,
            style,
            rotary_dim,
            freq_factors: None,
            freq_scale: 1.0,
        }
    }
}

/// Heads each thread rotates with one angle computation (a define of the shader).
const HEADS_PER_THREAD: usize = 4;

/// Positions must stay below this for exact angle reduction (two 12-bit pieces).
pub const MAX_POSITION: u32 = 1 << 24;

/// The rope kernel with the shared accurate-angle helpers appended.
const ROPE_SRC: &str = concat!(shader!("rope.wgsl"), shader!("rope_angle.wgsl"));

/// Each pair's frequency in turns per position, `freq_scale * theta^(-2k/rotary_dim) / 2pi`, as an f32
/// pair (hi, lo) whose sum carries ~48 bits.
pub fn turns_table(theta: f64, rotary_dim: usize, freq_scale: f64) -> Vec<f32> {
    turns_of(
        (0..rotary_dim / 2).map(|k| freq_scale * theta.powf(-2.0 * k as f64 / rotary_dim as f64)),
    )
}

/// Frequencies in radians per position as the (hi, lo) turns pairs `shaders/rope_angle.wgsl` takes.
pub fn turns_of(radians: impl Iterator<Item = f64>) -> Vec<f32> {
    radians
        .flat_map(|f| {
            let g = f / std::f64::consts::TAU;
            let hi = g as f32;
            [hi, (g - hi as f64) as f32]
        })
        .collect()
}

/// Rotates `x` `[tokens, heads, head_dim]` (f32 or f16) by positions `positions` (U32 `[tokens]`, read
/// when the dispatch runs; each below [`MAX_POSITION`]) into `out` (same shape, f32 or f16; may be `x`
/// for in place). Makes the small frequency table once, here.
pub fn rope(
    gpu: &Gpu,
    x: &Tensor,
    positions: &Tensor,
    out: &Tensor,
    opts: &RopeOptions,
) -> Result<Dispatch> {
    float_dtype("rope input", x)?;
    float_dtype("rope output", out)?;
    if x.rank() != 3 || x.shape != out.shape {
        return Err(shape_err!(
            "rope: input {:?} (want [tokens, heads, head_dim]) vs output {:?}",
            x.shape,
            out.shape
        ));
    }
    let (tokens, heads, head_dim) = (x.shape[0], x.shape[1], x.shape[2]);
    let rd = opts.rotary_dim;
    if !head_dim.is_multiple_of(2) || !rd.is_multiple_of(2) || rd == 0 || rd > head_dim {
        return Err(shape_err!(
            "rope: rotary_dim {rd} must be even, non-zero and <= head_dim {head_dim} (even)"
        ));
    }
    if positions.dtype != DType::U32 || positions.numel() != tokens {
        return Err(shape_err!(
            "rope: positions must be U32 [{tokens}], got {:?} {:?}",
            positions.dtype,
            positions.shape
        ));
    }
    if opts.theta.is_nan()
        || opts.theta <= 0.0
        || opts.freq_scale.is_nan()
        || opts.freq_scale <= 0.0
    {
        return Err(shape_err!(
            "rope: theta {} and freq_scale {} must be positive",
            opts.theta,
            opts.freq_scale
        ));
    }
    if partial_overlap(x, out) {
        return Err(shape_err!("rope: output partly overlaps the input"));
    }
    let half_rot = rd / 2;
    if let Some(f) = opts.freq_factors
        && (f.dtype != DType::F32 || f.numel() != half_rot)
    {
        return Err(shape_err!(
            "rope: freq_factors must be f32 [{half_rot}], got {:?} {:?}",
            f.dtype,
            f.shape
        ));
    }
    let inplace = std::sync::Arc::ptr_eq(&x.storage.buffer, &out.storage.buffer)
        && x.storage.offset == out.storage.offset;
    let table = turns_table(opts.theta as f64, rd, opts.freq_scale as f64);
    let tab = gpu.tensor_from_f32(
        "rope turns",
        &[half_rot, 2],
        DType::F32,
        &table,
        Category::Weights,
    )?;
    let interleaved = opts.style == RopeStyle::Interleaved;
    // vec4 slots: one vector of pairs (interleaved) or one from each half (half-split).
    let rot_elems = if interleaved { 4 } else { 8 };
    let vec4 = head_dim.is_multiple_of(4)
        && rd.is_multiple_of(rot_elems)
        && base_elems(gpu, x)?.is_multiple_of(4)
        && base_elems(gpu, out)?.is_multiple_of(4);
    let (rot_slots, slots) = if vec4 {
        (
            rd / rot_elems,
            rd / rot_elems + if inplace { 0 } else { (head_dim - rd) / 4 },
        )
    } else {
        (half_rot, if inplace { half_rot } else { head_dim / 2 })
    };
    let chunks = heads.div_ceil(HEADS_PER_THREAD);
    let name = format!(
        "rope_{}_{}_{}{}{}{}",
        if interleaved {
            "interleaved"
        } else {
            "halfsplit"
        },
        x.dtype.wgsl(),
        out.dtype.wgsl(),
        if vec4 { "_v4" } else { "" },
        if inplace { "_inplace" } else { "" },
        if opts.freq_factors.is_some() {
            "_factors"
        } else {
            ""
        },
    );
    let mut tensors = vec![x, positions, &tab, out];
    let spec = KernelSpec::new(name, ROPE_SRC, "rope")
        .define("TX", x.dtype.wgsl())
        .define("TO", out.dtype.wgsl())
        .define(
            "F16",
            u8::from(x.dtype == DType::F16 || out.dtype == DType::F16),
        )
        .define("INTERLEAVED", u8::from(interleaved))
        .define("INPLACE", u8::from(inplace))
        .define("FACTORS", u8::from(opts.freq_factors.is_some()))
        .define("HPT", HEADS_PER_THREAD)
        .define("VEC4", u8::from(vec4));
    if let Some(f) = opts.freq_factors {
        tensors.push(f);
    }
    let kernel = gpu.kernel(&spec)?;
    let threads = tokens * chunks * slots;
    let moved = tokens * heads * if inplace { rd } else { head_dim };
    gpu.dispatch(
        &kernel,
        &[
            tokens as u32,
            heads as u32,
            head_dim as u32,
            half_rot as u32,
            slots as u32,
            chunks as u32,
            rot_slots as u32,
        ],
        &tensors,
        grid(
            threads.div_ceil(64) as u32,
            gpu.caps.max_workgroups_per_dimension,
        ),
        Cost {
            flops: (tokens * heads * half_rot * 6 + tokens * chunks * half_rot * 40) as f64,
            bytes: moved as f64 * (x.elem_bytes() + out.elem_bytes()) as f64 + tokens as f64 * 4.0,
        },
    )
}
