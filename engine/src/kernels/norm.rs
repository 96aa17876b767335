//! Normalisations: RMSNorm, fused residual add + RMSNorm, LayerNorm (over the last dimension, one
//! workgroup or one subgroup per row, see [`RowVariant`]) and GroupNorm with an optional fused SiLU
//! (two passes over several workgroups per group: partial statistics, then merge and apply).
//! Weights may be f32 or f16 independently of the activations.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::softmax::{
    RowPlan, RowVariant, float_dtype, partial_overlap, plan_rows, vec4_ok,
};
use crate::kernels::{KernelSpec, grid};
use crate::memory::Category;
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// The WGSL array element for `dtype`, as a vec4 or a scalar.
fn vt(dtype: DType, vec4: bool) -> String {
    if vec4 {
        format!("vec4<{}>", dtype.wgsl())
    } else {
        dtype.wgsl().to_string()
    }
}

fn any_f16(ts: &[&Tensor]) -> &'static str {
    if ts.iter().any(|t| t.dtype == DType::F16) {
        "1"
    } else {
        "0"
    }
}

/// Rows and row length of `x`, checking `others` have its shape.
fn rows_of(what: &str, x: &Tensor, others: &[&Tensor]) -> Result<(usize, usize)> {
    float_dtype(what, x)?;
    if x.rank() == 0 || x.dim(-1) == 0 {
        return Err(shape_err!(
            "{what}: input {:?} has no last dimension to normalise",
            x.shape
        ));
    }
    for o in others {
        float_dtype(what, o)?;
        if o.shape != x.shape {
            return Err(shape_err!("{what}: input {:?} vs {:?}", x.shape, o.shape));
        }
        if partial_overlap(x, o) {
            return Err(shape_err!("{what}: an output partly overlaps the input"));
        }
    }
    let n = x.dim(-1);
    Ok((x.numel() / n, n))
}

fn check_weight(what: &str, w: &Tensor, n: usize) -> Result<()> {
    float_dtype(what, w)?;
    if w.numel() != n {
        return Err(shape_err!("{what}: {:?} for rows of {n}", w.shape));
    }
    Ok(())
}

fn row_spec(kind: &str, plan: &RowPlan, vec4: bool, names: &[&Tensor]) -> KernelSpec {
    let dts: Vec<&str> = names.iter().map(|t| t.dtype.wgsl()).collect();
    let name = format!(
        "{kind}_{}{}_{}",
        dts.join("_"),
        if vec4 { "_v4" } else { "" },
        plan.name()
    );
    KernelSpec::new(name, shader!("norm.wgsl"), "norm")
        .define("ROWNORM", 1)
        .define("F16", any_f16(names))
        .define("VEC4", u8::from(vec4))
        .defines(plan.defines())
}

/// `out = x / sqrt(mean(x^2) + eps) * weight` over the last dimension; `weight` has that many values.
/// `out` may be `x`.
pub fn rmsnorm(
    gpu: &Gpu,
    x: &Tensor,
    weight: &Tensor,
    out: &Tensor,
    eps: f32,
    variant: RowVariant,
) -> Result<Dispatch> {
    let (rows, n) = rows_of("rmsnorm", x, &[out])?;
    check_weight("rmsnorm weight", weight, n)?;
    let vec4 = vec4_ok(gpu, n, &[x, weight, out])?;
    let plan = plan_rows(gpu, variant, rows, n / if vec4 { 4 } else { 1 })?;
    let spec = row_spec("rmsnorm", &plan, vec4, &[x, weight, out])
        .define("KIND_RMS", 1)
        .define("VX", vt(x.dtype, vec4))
        .define("VW_", vt(weight.dtype, vec4))
        .define("VO", vt(out.dtype, vec4));
    let kernel = gpu.kernel(&spec)?;
    let numel = (rows * n) as f64;
    gpu.dispatch(
        &kernel,
        &[rows as u32, n as u32, eps.to_bits(), 1, 0],
        &[x, weight, out],
        plan.workgroups,
        Cost {
            flops: numel * 4.0,
            bytes: numel * (x.elem_bytes() + out.elem_bytes()) as f64
                + (n as u64 * weight.elem_bytes()) as f64,
        },
    )
}

/// The residual stream step: `sum_out = x + residual` and `norm_out = rmsnorm(sum_out) * weight` in one
/// pass. The norm is taken of the sum as stored in `sum_out`'s dtype, exactly as a separate add then
/// [`rmsnorm`] would. `sum_out` may be `x` or `residual` (in place).
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm(
    gpu: &Gpu,
    x: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    sum_out: &Tensor,
    norm_out: &Tensor,
    eps: f32,
    variant: RowVariant,
) -> Result<Dispatch> {
    add_rmsnorm_slices(gpu, x, residual, 1, weight, sum_out, norm_out, eps, variant)
}

/// [`add_rmsnorm`] with the residual given as the f32 partial sums `[slices, ..x's shape]` of a split-K
/// product (`kernels::matmul::matmul_partials`), added in slice order: the split's summing pass
/// folded into this one. `sum_out` may be `x`.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm_partials(
    gpu: &Gpu,
    x: &Tensor,
    partials: &Tensor,
    weight: &Tensor,
    sum_out: &Tensor,
    norm_out: &Tensor,
    eps: f32,
    variant: RowVariant,
) -> Result<Dispatch> {
    let slices = partials.dim(0);
    if partials.rank() != x.rank() + 1
        || partials.shape[1..] != x.shape[..]
        || partials.dtype != DType::F32
        || slices == 0
    {
        return Err(shape_err!(
            "add_rmsnorm: partials {:?} {:?} are not f32 slices of {:?}",
            partials.shape,
            partials.dtype,
            x.shape
        ));
    }
    add_rmsnorm_slices(
        gpu, x, partials, slices, weight, sum_out, norm_out, eps, variant,
    )
}

/// Whether `a` and `b` share any byte of one buffer.
fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    std::sync::Arc::ptr_eq(&a.storage.buffer, &b.storage.buffer)
        && a.storage.offset < b.storage.offset + b.storage.len
        && b.storage.offset < a.storage.offset + a.storage.len
}

/// `residual` holds `slices` residuals of x's shape back to back (the first is checked as x's
/// companion; the binding covers them all).
#[allow(clippy::too_many_arguments)]
fn add_rmsnorm_slices(
    gpu: &Gpu,
    x: &Tensor,
    residual: &Tensor,
    slices: usize,
    weight: &Tensor,
    sum_out: &Tensor,
    norm_out: &Tensor,
    eps: f32,
    variant: RowVariant,
) -> Result<Dispatch> {
    let first = if residual.rank() != x.rank() {
        residual.view(0, &x.shape)?
    } else {
        residual.clone()
    };
    let (rows, n) = rows_of("add_rmsnorm", x, &[&first, sum_out, norm_out])?;
    for out in [sum_out, norm_out] {
        if partial_overlap(residual, out) || slices > 1 && overlaps(residual, out) {
            return Err(shape_err!(
                "add_rmsnorm: an output partly overlaps the residual"
            ));
        }
    }
    if std::sync::Arc::ptr_eq(&sum_out.storage.buffer, &norm_out.storage.buffer)
        && sum_out.storage.offset == norm_out.storage.offset
    {
        return Err(shape_err!(
            "add_rmsnorm: sum_out and norm_out must be different tensors"
        ));
    }
    check_weight("add_rmsnorm weight", weight, n)?;
    let vec4 = vec4_ok(gpu, n, &[x, residual, weight, sum_out, norm_out])?;
    let plan = plan_rows(gpu, variant, rows, n / if vec4 { 4 } else { 1 })?;
    let kind = if slices > 1 {
        "add_rmsnorm_parts"
    } else {
        "add_rmsnorm"
    };
    let spec = row_spec(kind, &plan, vec4, &[x, residual, weight, sum_out, norm_out])
        .define("KIND_ADD", 1)
        .define("SLICES", u8::from(slices > 1))
        .define("VX", vt(x.dtype, vec4))
        .define("VR", vt(residual.dtype, vec4))
        .define("VW_", vt(weight.dtype, vec4))
        .define("VS", vt(sum_out.dtype, vec4))
        .define("VO", vt(norm_out.dtype, vec4));
    let kernel = gpu.kernel(&spec)?;
    let numel = (rows * n) as f64;
    let eb = x.elem_bytes()
        + slices as u64 * residual.elem_bytes()
        + sum_out.elem_bytes()
        + norm_out.elem_bytes();
    // The slice stride in the kernel's element units (vec4 or scalar).
    let stride = rows * n / if vec4 { 4 } else { 1 };
    gpu.dispatch(
        &kernel,
        &[
            rows as u32,
            n as u32,
            eps.to_bits(),
            slices as u32,
            stride as u32,
        ],
        &[x, residual, weight, sum_out, norm_out],
        plan.workgroups,
        Cost {
            flops: numel * (4.0 + slices as f64),
            bytes: numel * eb as f64 + (n as u64 * weight.elem_bytes()) as f64,
        },
    )
}

/// `out = (x - mean) / sqrt(var + eps) * gamma + beta` over the last dimension (biased variance);
/// `gamma` and `beta` are optional (non-affine LayerNorm). `out` may be `x`.
pub fn layernorm(
    gpu: &Gpu,
    x: &Tensor,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
    out: &Tensor,
    eps: f32,
    variant: RowVariant,
) -> Result<Dispatch> {
    let (rows, n) = rows_of("layernorm", x, &[out])?;
    let mut tensors = vec![x, out];
    if let Some(g) = gamma {
        check_weight("layernorm gamma", g, n)?;
        tensors.push(g);
    }
    if let Some(b) = beta {
        check_weight("layernorm beta", b, n)?;
        tensors.push(b);
    }
    let vec4 = vec4_ok(gpu, n, &tensors)?;
    let plan = plan_rows(gpu, variant, rows, n / if vec4 { 4 } else { 1 })?;
    let mut spec = row_spec("layernorm", &plan, vec4, &tensors)
        .define("KIND_LN", 1)
        .define("VX", vt(x.dtype, vec4))
        .define("VO", vt(out.dtype, vec4))
        .define("GAMMA", u8::from(gamma.is_some()))
        .define("BETA", u8::from(beta.is_some()));
    if let Some(g) = gamma {
        spec = spec.define("VW_", vt(g.dtype, vec4));
    }
    if let Some(b) = beta {
        let (binding, off) = if gamma.is_some() {
            ("4", "d")
        } else {
            ("3", "c")
        };
        spec = spec
            .define("VB", vt(b.dtype, vec4))
            .define("BETA_BINDING", binding)
            .define("BETA_OFF", off);
    }
    let kernel = gpu.kernel(&spec)?;
    let numel = (rows * n) as f64;
    let wbytes: u64 = tensors[2..].iter().map(|t| n as u64 * t.elem_bytes()).sum();
    gpu.dispatch(
        &kernel,
        &[rows as u32, n as u32, eps.to_bits(), 1, 0],
        &tensors,
        plan.workgroups,
        Cost {
            flops: numel * 7.0,
            bytes: numel * (x.elem_bytes() + out.elem_bytes()) as f64 + wbytes as f64,
        },
    )
}

/// Options of [`groupnorm`].
#[derive(Clone, Copy, Debug)]
pub struct GroupNormOptions {
    pub groups: usize,
    pub eps: f32,
    /// Applies SiLU to the normalised output (SD's GroupNorm(32) + SiLU).
    pub silu: bool,
    /// Workgroups that share one group's statistics pass (at most 256); `None` picks enough to fill
    /// the device. Tests set it to exercise the merge on small inputs.
    pub chunks: Option<usize>,
}

impl GroupNormOptions {
    pub fn new(groups: usize, eps: f32, silu: bool) -> GroupNormOptions {
        GroupNormOptions {
            groups,
            eps,
            silu,
            chunks: None,
        }
    }
}

const GN_WG: usize = 256;
/// Vectors each thread of the apply pass writes.
const GN_APPLY_PER_THREAD: usize = 4;
/// Statistics workgroups to aim for in all (several per SM of a large GPU).
const GN_TARGET_WGS: usize = 1056;

/// GroupNorm of `x` `[N, C, spatial...]` (NCHW) into `out` (same shape; may be `x`), `gamma` and
/// `beta` `[C]`, biased variance per (n, group) over C/groups channels x spatial. Two dispatches:
/// `gn_stats` (each group split over several workgroups, Welford partials in a scratch buffer made
/// here once) and `gn_apply` (merges the partials, normalises, applies gamma/beta and SiLU).
pub fn groupnorm(
    gpu: &Gpu,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    out: &Tensor,
    opts: &GroupNormOptions,
) -> Result<Vec<Dispatch>> {
    float_dtype("groupnorm input", x)?;
    float_dtype("groupnorm output", out)?;
    if x.rank() < 2 || x.shape != out.shape {
        return Err(shape_err!(
            "groupnorm: input {:?} (want [N, C, ...]) vs output {:?}",
            x.shape,
            out.shape
        ));
    }
    if partial_overlap(x, out) {
        return Err(shape_err!("groupnorm: output partly overlaps the input"));
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let hw: usize = x.shape[2..].iter().product();
    let g = opts.groups;
    if g == 0 || c % g != 0 || hw == 0 {
        return Err(shape_err!(
            "groupnorm: {c} channels do not split into {g} groups (input {:?})",
            x.shape
        ));
    }
    check_weight("groupnorm gamma", gamma, c)?;
    check_weight("groupnorm beta", beta, c)?;
    let vec4 = hw.is_multiple_of(4) && vec4_ok(gpu, 4, &[x, out])?;
    let vw = if vec4 { 4 } else { 1 };
    let cpg = c / g;
    let seg_v = cpg * hw / vw;
    let n_seg = n * g;
    let chunks = match opts.chunks {
        Some(s) => s.clamp(1, GN_WG),
        None => GN_TARGET_WGS
            .div_ceil(n_seg)
            .min(seg_v.div_ceil(GN_WG * 4))
            .clamp(1, GN_WG),
    };
    let chunk_v = seg_v.div_ceil(chunks);
    let chunks = seg_v.div_ceil(chunk_v);
    let block_v = GN_WG * GN_APPLY_PER_THREAD;
    let blocks = seg_v.div_ceil(block_v);
    let max_dim = gpu.caps.max_workgroups_per_dimension;
    let part = gpu.tensor(
        "groupnorm partials",
        &[n_seg * chunks * 4],
        DType::F32,
        Category::Activations,
    )?;
    let common = |kind: &'static str, name: String| {
        KernelSpec::new(name, shader!("norm.wgsl"), kind)
            .define(
                if kind == "gn_stats" {
                    "GN_STATS"
                } else {
                    "GN_APPLY"
                },
                1,
            )
            .define("F16", any_f16(&[x, gamma, beta, out]))
            .define("VEC4", u8::from(vec4))
            .define("WG", GN_WG)
            .define("VX", vt(x.dtype, vec4))
    };
    let v4 = if vec4 { "_v4" } else { "" };
    let stats = gpu.kernel(&common(
        "gn_stats",
        format!("groupnorm_stats_{}{v4}", x.dtype.wgsl()),
    ))?;
    let apply = gpu.kernel(
        &common(
            "gn_apply",
            format!(
                "groupnorm{}_{}_{}_{}{v4}",
                if opts.silu { "_silu" } else { "" },
                x.dtype.wgsl(),
                gamma.dtype.wgsl(),
                out.dtype.wgsl()
            ),
        )
        .define("TW", gamma.dtype.wgsl())
        .define("TB", beta.dtype.wgsl())
        .define("VO", vt(out.dtype, vec4))
        .define("SILU", u8::from(opts.silu)),
    )?;
    let numel = x.numel() as f64;
    let part_bytes = (n_seg * chunks * 16) as f64;
    let d1 = gpu.dispatch(
        &stats,
        &[seg_v as u32, chunks as u32, chunk_v as u32, n_seg as u32],
        &[x, &part],
        grid((n_seg * chunks) as u32, max_dim),
        Cost {
            flops: numel * 4.0,
            bytes: numel * x.elem_bytes() as f64 + part_bytes,
        },
    )?;
    let d2 = gpu.dispatch(
        &apply,
        &[
            seg_v as u32,
            chunks as u32,
            blocks as u32,
            block_v as u32,
            n_seg as u32,
            g as u32,
            cpg as u32,
            (hw / vw) as u32,
            opts.eps.to_bits(),
        ],
        &[x, &part, gamma, beta, out],
        grid((n_seg * blocks) as u32, max_dim),
        Cost {
            flops: numel * if opts.silu { 8.0 } else { 3.0 },
            bytes: numel * (x.elem_bytes() + out.elem_bytes()) as f64
                + (n_seg * blocks) as f64 * part_bytes / n_seg as f64
                + (c as u64 * (gamma.elem_bytes() + beta.elem_bytes())) as f64,
        },
    )?;
    Ok(vec![d1, d2])
}
