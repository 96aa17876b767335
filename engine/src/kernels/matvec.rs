//! The matvec kernels (decode path): `out[b, n] = sum_k w[n, k] x[b, k] (+ bias[n])` for a few rows
//! `b` of activations (1 in decode, up to [`MAX_BATCH`]), bandwidth-bound on the weight.
//!
//! Each workgroup covers 8 weight rows, one row per team of lanes: a hardware subgroup reducing with
//! `subgroupAdd` where the device has subgroups, else 32 invocations reducing through workgroup
//! memory. The weight streams as 16-byte vector loads when K and the offsets allow it (scalar loads
//! otherwise). Weights bigger than one storage binding are bound shard by shard ([`matvec_shards`]).

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, Layout, RowShard, Tensor};
use crate::{shader, shape_err};

/// Most activation rows one dispatch multiplies.
pub const MAX_BATCH: usize = 8;

/// Rows of `w` per workgroup (fixed in `shaders/matvec.wgsl`).
const ROWS_PER_WORKGROUP: usize = 8;

/// How the per-row partial sums are combined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatvecVariant {
    /// Subgroup reduction where the device has subgroups, else workgroup memory.
    #[default]
    Auto,
    /// One subgroup per row, `subgroupAdd`; an error where the device lacks subgroups.
    Subgroup,
    /// 32 invocations per row and a tree in workgroup memory (portable).
    Workgroup,
}

/// Options of [`matvec`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MatvecOptions<'a> {
    /// `[N]` (f32 or f16) added to every output row.
    pub bias: Option<&'a Tensor>,
    pub variant: MatvecVariant,
    /// Largest weight shard in bytes (default: the device's storage-binding limit). Tests set it
    /// small to exercise the sharded path.
    pub max_shard_bytes: Option<u64>,
}

/// `out = x @ w^T + bias` with `w`: `[N, K]` (f32 or f16, row-major), `x`: `[B, K]` or `[K]`,
/// `out`: `[B, N]` or `[N]` (x and out f32 or f16), `B <= MAX_BATCH`. A weight over the binding
/// limit (or `opts.max_shard_bytes`) is split into row shards, one dispatch each.
pub fn matvec(
    gpu: &Gpu,
    w: &Tensor,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Result<Vec<Dispatch>> {
    if w.rank() != 2 {
        return Err(shape_err!("matvec: w must be [N, K], is {:?}", w.shape));
    }
    let limit = opts
        .max_shard_bytes
        .unwrap_or(gpu.caps.max_storage_binding)
        .min(gpu.caps.max_storage_binding);
    let shards = if w.binding(limit).is_ok() {
        vec![RowShard {
            row_start: 0,
            tensor: w.clone(),
        }]
    } else {
        w.row_shards(limit)?
    };
    matvec_shards(gpu, &shards, x, out, opts)
}

/// [`matvec`] over a weight given as row shards (as [`Gpu::weight_rows`] or [`Tensor::row_shards`]
/// make them): one dispatch per shard, each writing its rows of `out`.
pub fn matvec_shards(
    gpu: &Gpu,
    shards: &[RowShard],
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Result<Vec<Dispatch>> {
    let Some(first) = shards.first() else {
        return Err(shape_err!("matvec: no weight shards"));
    };
    let k = first.tensor.shape.get(1).copied().unwrap_or(0);
    let mut n = 0;
    for sh in shards {
        let t = &sh.tensor;
        if t.rank() != 2 || t.shape[1] != k || sh.row_start != n || t.dtype != first.tensor.dtype {
            return Err(shape_err!(
                "matvec: shards must tile one [N, {k}] weight in order; got rows from {} of {:?} {:?}",
                sh.row_start,
                t.shape,
                t.dtype
            ));
        }
        if !matches!(t.dtype, DType::F32 | DType::F16) || t.layout != Layout::RowMajor {
            return Err(shape_err!(
                "matvec: w must be row-major f32 or f16, is {:?} {:?}",
                t.dtype,
                t.layout
            ));
        }
        n += t.shape[0];
    }
    let batch = check_io("matvec", x, out, opts.bias, n, k)?;
    let caps = &gpu.caps;
    let (f16, sg) = choose_reduction(gpu, x, out, opts)?;
    // Eight rows per workgroup: eight subgroups where the size allows, else fewer subgroups looping.
    let wg = if sg {
        (ROWS_PER_WORKGROUP as u32 * caps.subgroup_max_size)
            .clamp(32, 256.min(caps.max_invocations_per_workgroup))
    } else {
        256
    };
    let bx = x.binding(caps.max_storage_binding)?.base_elems as usize;
    let mut ds = Vec::with_capacity(shards.len());
    for sh in shards {
        let w = &sh.tensor;
        let bw = w.binding(caps.max_storage_binding)?.base_elems as usize;
        let wf16 = w.dtype == DType::F16;
        let cw = if wf16 { 8 } else { 4 };
        let vec = k.is_multiple_of(cw) && bw.is_multiple_of(cw) && bx.is_multiple_of(4);
        let name = format!(
            "matvec_{}_{}{}{}{}",
            w.dtype.wgsl(),
            x.dtype.wgsl(),
            if out.dtype == x.dtype {
                String::new()
            } else {
                format!("_{}", out.dtype.wgsl())
            },
            if batch > 1 {
                format!("_b{batch}")
            } else {
                String::new()
            },
            if sg { "_sg" } else { "_wg" }
        );
        let spec = KernelSpec::new(name, shader!("matvec.wgsl"), "matvec")
            .define("TX", x.dtype.wgsl())
            .define("TO", out.dtype.wgsl())
            .define("TB", opts.bias.map_or("f32", |b| b.dtype.wgsl()))
            .define("F16", u8::from(f16))
            .define("NB", batch)
            .define("WG", wg)
            .define("WF16", u8::from(wf16))
            .define("VEC", u8::from(vec))
            .define("SG", u8::from(sg))
            .define("BIAS", u8::from(opts.bias.is_some()));
        let kernel = gpu.kernel(&spec)?;
        let rows = w.shape[0];
        let groups = rows.div_ceil(ROWS_PER_WORKGROUP) as u32;
        let params = [rows as u32, k as u32, n as u32, sh.row_start as u32];
        let mut tensors = vec![w, x, out];
        tensors.extend(opts.bias);
        let cost = matvec_cost(w.byte_len(), batch, rows, k, x, out, opts.bias);
        ds.push(gpu.dispatch(
            &kernel,
            &params,
            &tensors,
            grid(groups, caps.max_workgroups_per_dimension),
            cost,
        )?);
    }
    Ok(ds)
}

/// Checks the activations of a matrix-vector product with a weight `[n, k]`: x `[B, k]` or `[k]`, out
/// `[B, n]` or `[n]` (row-major f32 or f16, `1 <= B <= MAX_BATCH`), bias `[n]`. Returns B.
pub(crate) fn check_io(
    what: &str,
    x: &Tensor,
    out: &Tensor,
    bias: Option<&Tensor>,
    n: usize,
    k: usize,
) -> Result<usize> {
    let batch = if x.rank() == 1 { 1 } else { x.shape[0] };
    let x_ok = (x.rank() == 1 || x.rank() == 2) && x.dim(-1) == k;
    let out_ok =
        out.rank() == x.rank() && out.dim(-1) == n && (out.rank() == 1 || out.shape[0] == batch);
    if !x_ok || !out_ok || batch == 0 || batch > MAX_BATCH {
        return Err(shape_err!(
            "{what}: w [{n}, {k}], x {:?} and out {:?} do not fit (x [B, {k}], out [B, {n}], 1 <= B <= {MAX_BATCH})",
            x.shape,
            out.shape
        ));
    }
    for (t, name) in [(x, "x"), (out, "out")] {
        if !matches!(t.dtype, DType::F32 | DType::F16) || t.layout != Layout::RowMajor {
            return Err(shape_err!(
                "{what}: {name} must be row-major f32 or f16, is {:?} {:?}",
                t.dtype,
                t.layout
            ));
        }
    }
    if let Some(b) = bias
        && (b.numel() != n || !matches!(b.dtype, DType::F32 | DType::F16))
    {
        return Err(shape_err!(
            "{what}: bias must be [{n}] f32 or f16, is {:?} {:?}",
            b.shape,
            b.dtype
        ));
    }
    Ok(batch)
}

/// Whether any activation is f16 (an error where the device has none) and whether rows reduce with
/// subgroup operations (`opts.variant`, or the device's subgroup support for `Auto`).
pub(crate) fn choose_reduction(
    gpu: &Gpu,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Result<(bool, bool)> {
    let caps = &gpu.caps;
    let f16 = x.dtype == DType::F16
        || out.dtype == DType::F16
        || opts.bias.is_some_and(|b| b.dtype == DType::F16);
    if f16 && !caps.f16 {
        return Err(DriftError::Unsupported(
            "f16 activations on a device without shader-f16".into(),
        ));
    }
    let sg = match opts.variant {
        MatvecVariant::Auto => caps.subgroup,
        MatvecVariant::Workgroup => false,
        MatvecVariant::Subgroup if caps.subgroup => true,
        MatvecVariant::Subgroup => {
            return Err(DriftError::Unsupported(
                "subgroup matvec on a device without subgroups".into(),
            ));
        }
    };
    Ok((f16, sg))
}

/// Work of one matrix-vector dispatch: `weight_bytes` of weights read once, x read, out written.
pub(crate) fn matvec_cost(
    weight_bytes: u64,
    batch: usize,
    rows: usize,
    k: usize,
    x: &Tensor,
    out: &Tensor,
    bias: Option<&Tensor>,
) -> Cost {
    Cost {
        flops: 2.0 * (batch * rows * k) as f64,
        bytes: weight_bytes as f64
            + (batch * k) as f64 * x.elem_bytes() as f64
            + (batch * rows) as f64 * out.elem_bytes() as f64
            + bias.map_or(0.0, |b| (rows as u64 * b.elem_bytes()) as f64),
    }
}
