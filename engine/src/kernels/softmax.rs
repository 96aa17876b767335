//! Softmax over the last dimension (numerically stable, f32 accumulation, optional scale and causal
//! mask), and the row-kernel plumbing shared with the norms: how rows map onto workgroups or
//! subgroups, vec4 eligibility, and the storage access of inputs that share a buffer with an output.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// How a row kernel maps rows onto the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowVariant {
    /// Chosen from the device and the row length (see [`plan_rows`]).
    #[default]
    Auto,
    /// One workgroup per row, reductions through a workgroup-memory tree (portable fallback).
    Workgroup,
    /// One workgroup per row, subgroup reductions merged through workgroup memory.
    WorkgroupSubgroup,
    /// One subgroup per row, several rows per workgroup, no barriers (short rows).
    Subgroup,
}

/// Options of [`softmax`].
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxOptions {
    /// Multiplies x before the softmax (e.g. 1/sqrt(head_dim)).
    pub scale: f32,
    /// Causal mask: `Some((q_len, q_offset))` masks key j of row r when j > r % q_len + q_offset.
    pub causal: Option<(usize, usize)>,
    pub variant: RowVariant,
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        SoftmaxOptions {
            scale: 1.0,
            causal: None,
            variant: RowVariant::Auto,
        }
    }
}

/// A resolved row mapping: the defines it needs and the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPlan {
    pub variant: RowVariant,
    /// Workgroup size.
    pub wg: u32,
    /// Rows per workgroup (1 unless one subgroup per row).
    pub rows_per_wg: u32,
    /// Vectors each thread holds in registers, or 0 when rows are streamed twice instead.
    pub per: u32,
    pub workgroups: [u32; 3],
}

impl RowPlan {
    pub fn name(&self) -> String {
        let v = match self.variant {
            RowVariant::Workgroup => "wg",
            RowVariant::WorkgroupSubgroup => "wgsg",
            RowVariant::Subgroup => "sgrow",
            RowVariant::Auto => "auto",
        };
        if self.per == 0 {
            format!("{v}_stream")
        } else {
            v.to_string()
        }
    }

    /// Preprocessor defines: SG, SGROW, WG, RPW, CACHE, PER.
    pub fn defines(&self) -> Vec<(&'static str, String)> {
        let sg = self.variant != RowVariant::Workgroup;
        vec![
            ("SG", u8::from(sg).to_string()),
            (
                "SGROW",
                u8::from(self.variant == RowVariant::Subgroup).to_string(),
            ),
            ("WG", self.wg.to_string()),
            ("RPW", self.rows_per_wg.to_string()),
            ("CACHE", u8::from(self.per > 0).to_string()),
            ("PER", self.per.max(1).to_string()),
        ]
    }
}

/// Below this many rows a row kernel cannot fill a large GPU (132 SMs on an H200) anyway.
const FEW_ROWS: usize = 128;
/// From this many rows, one subgroup per row gives enough subgroups to fill a large GPU (16 per SM
/// of an H200) and beats a workgroup per row at any row length (measured on the H200: rmsnorm
/// [4096, 8192] f16 93 us against 118 us, softmax [65536, 4096] f16 448 us against 1012 us).
const MANY_ROWS: usize = 2112;
/// Most vectors a thread keeps in registers; longer rows are streamed. Measured on the H200, rows
/// held as 8-10 vectors per thread ran 1.5-2x slower than streamed ones, 1-4 as fast or faster.
const MAX_PER: usize = 4;

/// Picks the row mapping for `rows` rows of `nv` loads each (vec4 or scalar). Auto: without
/// subgroups one workgroup per row with a workgroup-memory tree; with subgroups one subgroup per row
/// when rows are many or short (at most 4 loads per lane of a 32-wide subgroup: QK norms, short
/// softmax rows), else one workgroup per row with subgroup reductions. Rows are held in registers
/// when they fit in [`MAX_PER`] loads per thread (read once), else streamed twice.
pub fn plan_rows(gpu: &Gpu, variant: RowVariant, rows: usize, nv: usize) -> Result<RowPlan> {
    let caps = &gpu.caps;
    let variant = match variant {
        RowVariant::Auto if !caps.subgroup => RowVariant::Workgroup,
        RowVariant::Auto if nv <= 128 || rows >= MANY_ROWS => RowVariant::Subgroup,
        RowVariant::Auto => RowVariant::WorkgroupSubgroup,
        v @ (RowVariant::WorkgroupSubgroup | RowVariant::Subgroup) if !caps.subgroup => {
            return Err(shape_err!(
                "row variant {v:?} needs subgroups, which this device lacks"
            ));
        }
        v => v,
    };
    let max_dim = caps.max_workgroups_per_dimension;
    let cache = |per: usize| if per <= MAX_PER { per as u32 } else { 0 };
    Ok(match variant {
        RowVariant::Subgroup => {
            let wg = 128u32.min(caps.max_invocations_per_workgroup.max(1));
            // Sized for the smallest subgroup the device may pick; larger subgroups loop over rows.
            let min_sg = caps.subgroup_min_size.clamp(4, wg);
            let rpw = (wg / min_sg).max(1);
            RowPlan {
                variant,
                wg,
                rows_per_wg: rpw,
                per: cache(nv.div_ceil(min_sg as usize).max(1)),
                workgroups: grid(rows.div_ceil(rpw as usize) as u32, max_dim),
            }
        }
        _ => {
            // A power of two (for the tree) from 64 to 1024 threads: about 4 loads each when rows
            // are many, one each when too few rows fill the device (decode: latency bound).
            let cap = caps.max_invocations_per_workgroup.clamp(64, 1024);
            let target = if rows < FEW_ROWS { 1 } else { MAX_PER };
            let wg = (nv.div_ceil(target).max(1).next_power_of_two() as u32).clamp(64, cap);
            RowPlan {
                variant,
                wg,
                rows_per_wg: 1,
                per: cache(nv.div_ceil(wg as usize).max(1)),
                workgroups: grid(rows as u32, max_dim),
            }
        }
    })
}

/// Element offset of `t` inside the range it is bound with (what the kernel adds to its indices).
pub fn base_elems(gpu: &Gpu, t: &Tensor) -> Result<u32> {
    Ok(t.binding(gpu.caps.max_storage_binding)?.base_elems)
}

/// Whether every tensor can be bound as a vec4 array: rows of `n` values with `n % 4 == 0` and every
/// base offset a multiple of 4 elements.
pub fn vec4_ok(gpu: &Gpu, n: usize, tensors: &[&Tensor]) -> Result<bool> {
    if !n.is_multiple_of(4) {
        return Ok(false);
    }
    for t in tensors {
        if base_elems(gpu, t)? % 4 != 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Errors unless `t` is f32 or f16.
pub fn float_dtype(what: &str, t: &Tensor) -> Result<()> {
    match t.dtype {
        DType::F32 | DType::F16 => Ok(()),
        d => Err(shape_err!("{what} must be f32 or f16, got {d:?}")),
    }
}

/// Byte ranges of two tensors in one buffer overlap without being the same range.
pub fn partial_overlap(a: &Tensor, b: &Tensor) -> bool {
    if !std::sync::Arc::ptr_eq(&a.storage.buffer, &b.storage.buffer) {
        return false;
    }
    let (a0, a1) = (a.storage.offset, a.storage.offset + a.storage.len);
    let (b0, b1) = (b.storage.offset, b.storage.offset + b.storage.len);
    a0 < b1 && b0 < a1 && (a0, a1) != (b0, b1)
}

/// `out = softmax(scale * x)` over the last dimension; leading dimensions flatten into rows. `x` and
/// `out` have the same shape, f32 or f16 each; `out` may be `x` (in place).
pub fn softmax(gpu: &Gpu, x: &Tensor, out: &Tensor, opts: &SoftmaxOptions) -> Result<Dispatch> {
    float_dtype("softmax input", x)?;
    float_dtype("softmax output", out)?;
    if x.shape != out.shape || x.rank() == 0 {
        return Err(shape_err!(
            "softmax: input {:?} vs output {:?}",
            x.shape,
            out.shape
        ));
    }
    if partial_overlap(x, out) {
        return Err(shape_err!("softmax: output partly overlaps the input"));
    }
    let n = x.dim(-1);
    if n == 0 {
        return Err(shape_err!("softmax over an empty last dimension"));
    }
    let rows = x.numel() / n;
    let (q_len, q_offset) = opts.causal.unwrap_or((1, 0));
    if q_len == 0 {
        return Err(shape_err!("softmax: causal q_len must be at least 1"));
    }
    let vec4 = vec4_ok(gpu, n, &[x, out])?;
    let vw = if vec4 { 4 } else { 1 };
    let plan = plan_rows(gpu, opts.variant, rows, n / vw)?;
    let name = format!(
        "softmax{}_{}_{}{}_{}",
        if opts.causal.is_some() { "_causal" } else { "" },
        x.dtype.wgsl(),
        out.dtype.wgsl(),
        if vec4 { "_v4" } else { "" },
        plan.name()
    );
    let spec = KernelSpec::new(name, shader!("softmax.wgsl"), "softmax")
        .define("TX", x.dtype.wgsl())
        .define("TO", out.dtype.wgsl())
        .define(
            "F16",
            u8::from(x.dtype == DType::F16 || out.dtype == DType::F16),
        )
        .define("VEC4", u8::from(vec4))
        .defines(plan.defines());
    let kernel = gpu.kernel(&spec)?;
    // Values actually read: with a causal mask, row r reads only its unmasked prefix.
    let read: f64 = match opts.causal {
        None => (rows * n) as f64,
        Some(_) => (0..rows)
            .map(|r| n.min(r % q_len + q_offset + 1) as f64)
            .sum(),
    };
    let params = [
        rows as u32,
        n as u32,
        opts.scale.to_bits(),
        u32::from(opts.causal.is_some()),
        q_len as u32,
        q_offset as u32,
    ];
    gpu.dispatch(
        &kernel,
        &params,
        &[x, out],
        plan.workgroups,
        Cost {
            flops: read * 8.0,
            bytes: read * x.elem_bytes() as f64 + (rows * n) as f64 * out.elem_bytes() as f64,
        },
    )
}
