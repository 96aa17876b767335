//! The matvec kernels (decode path): `out[b, n] = sum_k w[n, k] x[b, k] (+ bias[n])` for a few rows
//! `b` of activations (1 in decode, up to [`MAX_BATCH`]), bandwidth-bound on the weight.
//!
//! Each workgroup covers 8 weight rows, one row per team of lanes: a hardware subgroup reducing with
//! `subgroupAdd` where the device has subgroups, else 32 invocations reducing through workgroup
//! memory. The weight streams as 16-byte vector loads when K and the offsets allow it (scalar loads
//! otherwise). Weights bigger than one storage binding are bound shard by shard ([`matvec_shards`]).
//!
//! Decode fusions ([`MatvecOptions`], `shaders/matvec_fuse.wgsl`, shared with the quantized kernels):
//! an RMSNorm of the input (`norm`), SwiGLU of a `[gate | up]` input (`swiglu`) and a residual added to
//! the output (`residual`, which may be `out` itself), so a decoder layer needs no norm, activation or
//! add dispatches between its projections. With one activation row and a prologue, the workgroup
//! stages the prologue'd input in workgroup memory once ([`Stage`]) instead of every row recomputing it.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::qkv_rope::{QkvTargets, RopePairs};
use crate::kernels::softmax::partial_overlap;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, Layout, RowShard, Tensor};
use crate::{shader, shape_err};

/// The float-weight kernel with the shared fused prologues / epilogues appended, as the builder
/// composes it.
pub const MATVEC_SRC: &str = concat!(
    shader!("matvec.wgsl"),
    shader!("matvec_fuse.wgsl"),
    shader!("rope_angle.wgsl")
);

/// Most activation rows one dispatch multiplies.
pub const MAX_BATCH: usize = 8;

/// Rows of `w` per workgroup (fixed in `shaders/matvec.wgsl`).
pub(crate) const ROWS_PER_WORKGROUP: usize = 8;

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
    /// `(g, eps)`: the input is `rmsnorm(x) * g` (g `[K]`, f32 or f16), computed on the fly: the
    /// products use `x * g` and are scaled by `1 / sqrt(mean(x^2) + eps)` of the raw row.
    pub norm: Option<(&'a Tensor, f32)>,
    /// The input is `silu(gate) * up` of `x = [gate | up]` (`x`: `[B, 2K]`). Not with `norm`.
    pub swiglu: bool,
    /// Added to the output: `out = residual + x @ w^T (+ bias)`, `residual` shaped like `out` (f32 or
    /// f16). It may be `out` itself (the residual stream updated in place), not a partial overlap.
    pub residual: Option<&'a Tensor>,
    /// GLU epilogue: `w` stacks gate rows over up rows (`[2N, K]`) and `out[n] = silu(gate_n) * up_n`
    /// (`out`: `[1, N]`). One activation row, weights in one shard (float with N a multiple of 4, or
    /// quantized on the integer-dot-product kernel with 2N in whole workgroups), not with `swiglu` or
    /// `residual`.
    pub glu: bool,
    /// RoPE epilogue: `w` is a stacked QKV projection (`[(hq + 2 hkv) d, K]`) and instead of its
    /// product the kernel stores what [`crate::kernels::qkv_rope::qkv_rope`] makes of it: q rotated
    /// into `out` (`[hq, d]` elements), k rotated and v into the caches' rows at the step's position.
    /// One activation row, weights in one shard (float with rows a multiple of 8, or quantized on the
    /// integer-dot-product kernel with rows in whole workgroups), no bias, SwiGLU, GLU or residual.
    pub rope: Option<QkvTargets<'a>>,
    pub variant: MatvecVariant,
    /// Largest weight shard in bytes (default: the device's storage-binding limit). Tests set it
    /// small to exercise the sharded path.
    pub max_shard_bytes: Option<u64>,
    /// Most workgroup memory in bytes the staged input may take ([`Stage`]; default: what the device
    /// has left beside the kernel's other workgroup memory). Tests set it small to exercise the
    /// partly staged path, 0 to turn staging off.
    pub max_stage_bytes: Option<u32>,
    /// Rows per workgroup of the subgroup kernel (8, 16, 32 or 64; more rows share one staged input).
    /// `None`: the default rule ([`rows_per_workgroup`]). The paired-row epilogues need a whole number
    /// of workgroups.
    pub rows_per_workgroup: Option<usize>,
    /// Staged subgroup kernels: issue each subgroup's first weight loads before staging the input.
    /// `None`: `DRIFT_MATVEC_PREFETCH=1` (off by default).
    pub prefetch: Option<bool>,
    /// Subgroups per row (1, 2 or 4) of plain products of one activation row on subgroups of 32.
    /// `None`: `DRIFT_MATVEC_TEAMS` (default 4).
    pub teams: Option<usize>,
    /// Integer-dot-product kernel, one activation row: x arrives already quantized in this U32
    /// buffer (`shaders/xq_produce.wgsl`'s layout, written by the previous product's `xq_out`), so
    /// no workgroup quantizes it first; `x` is then only checked for its shape. With `norm` the
    /// producer applied the norm's weight and the norm tensor is not read (its eps is). See
    /// [`crate::kernels::quant::matvec_quant`] for the shapes it needs.
    pub xq_in: Option<&'a Tensor>,
    /// Integer-dot-product kernel with the residual or GLU epilogue: also write the output quantized
    /// into this U32 buffer for the next product's `xq_in`, times the gain (the next RMSNorm's
    /// weight) where one is given.
    pub xq_out: Option<(&'a Tensor, Option<&'a Tensor>)>,
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
    let batch = check_io("matvec", x, out, opts, n, k)?;
    if (opts.glu || opts.rope.is_some()) && shards.len() > 1 {
        return Err(shape_err!(
            "matvec: the GLU and RoPE epilogues need all rows in one binding ({} shards)",
            shards.len()
        ));
    }
    let caps = &gpu.caps;
    let (f16, sg) = choose_reduction(gpu, x, out, opts)?;
    let fusion = Fusion::new(gpu, opts, out)?;
    // Eight rows per workgroup: eight subgroups where the size allows, else fewer subgroups looping.
    let wg = if sg {
        (ROWS_PER_WORKGROUP as u32 * caps.subgroup_max_size)
            .clamp(32, 256.min(caps.max_invocations_per_workgroup))
    } else {
        256
    };
    // The workgroup-memory reduction's tree (f32 per invocation and batch row when staged).
    let tree_bytes = if sg { 0 } else { wg * 4 };
    let bx = x.binding(caps.max_storage_binding)?.base_elems as usize;
    let mut ds = Vec::with_capacity(shards.len());
    for sh in shards {
        let w = &sh.tensor;
        let bw = w.binding(caps.max_storage_binding)?.base_elems as usize;
        let wf16 = w.dtype == DType::F16;
        let cw = if wf16 { 8 } else { 4 };
        let vec = k.is_multiple_of(cw) && bw.is_multiple_of(cw) && bx.is_multiple_of(4);
        // Vector loads of f16 weights take x in chunks of two vec4s; the others one vec4 or scalars.
        let planes = if vec && wf16 { 2 } else { 1 };
        let stage = Stage::plan(gpu, opts, batch, k, wg, tree_bytes, planes);
        let name = format!(
            "matvec_{}_{}{}{}{}{}{}",
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
            fusion.suffix(),
            stage.suffix(),
            if sg { "_sg" } else { "_wg" }
        );
        let rows = w.shape[0];
        let pairs = opts.glu || opts.rope.is_some();
        let rpw = match (sg, opts.rows_per_workgroup) {
            (false, _) => ROWS_PER_WORKGROUP,
            (true, None) => rows_per_workgroup(rows, pairs, stage.vec4s > 0),
            (true, Some(r)) if [8, 16, 32, 64].contains(&r) && !(pairs && rows % r != 0) => r,
            (true, Some(r)) if [2, 4].contains(&r) && !pairs && stage.vec4s == 0 => r,
            (true, Some(r)) => {
                return Err(shape_err!(
                    "matvec: {r} rows per workgroup: must be 8, 16, 32 or 64 (2 or 4 without a staged input or paired rows), and divide the {rows} rows of a paired-row epilogue"
                ));
            }
        };
        // Several subgroups per row: plain products (no prologue, no paired rows) of one
        // activation row with vector loads, on subgroups of exactly 32.
        let teams = opts
            .teams
            .filter(|t| [1, 2, 4].contains(t))
            .unwrap_or_else(teams_per_row);
        let teamed = teams > 1
            && sg
            && vec
            && batch == 1
            && !pairs
            && opts.norm.is_none()
            && !opts.swiglu
            && stage.vec4s == 0
            && caps.subgroup_min_size == 32
            && caps.subgroup_max_size == 32
            && (rpw * teams * 32) as u32 <= caps.max_invocations_per_workgroup.min(512);
        // Under 8 rows the workgroup shrinks to one subgroup per row (or per team member).
        let wg = if teamed {
            (rpw * teams * 32) as u32
        } else if sg && rpw < ROWS_PER_WORKGROUP {
            (rpw as u32 * caps.subgroup_max_size).max(32)
        } else {
            wg
        };
        let pf = sg
            && vec
            && stage.vec4s > 0
            && opts
                .prefetch
                .unwrap_or_else(|| prefetch_on(opts.rope.is_some(), opts.glu));
        let name = if pf { format!("{name}_pf") } else { name };
        let spec = KernelSpec::new(name, MATVEC_SRC, "matvec")
            .define("PF", u8::from(pf))
            .define("TX", x.dtype.wgsl())
            .define("TO", out.dtype.wgsl())
            .define("F16", u8::from(f16))
            .define("NB", batch)
            .define("WG", wg)
            .define("WF16", u8::from(wf16))
            .define("VEC", u8::from(vec))
            .define("XV4", u8::from(vec))
            .define("SG", u8::from(sg))
            .defines(fusion.defines.clone())
            .defines(stage.defines());
        // Rows per workgroup other than 8 and subgroups per row are part of the kernel's name.
        let mut suffix = String::new();
        if rpw != ROWS_PER_WORKGROUP {
            suffix += &format!("_r{rpw}");
        }
        if teamed {
            suffix += &format!("_t{teams}");
        }
        let spec = KernelSpec {
            name: format!("{}{suffix}", spec.name),
            ..spec
        }
        .define("RPW", rpw)
        .define("TEAMED", u8::from(teamed))
        .define("TEAMS", teams);
        let kernel = gpu.kernel(&spec)?;
        let groups = rows.div_ceil(rpw) as u32;
        let params = [
            rows as u32,
            k as u32,
            n as u32,
            sh.row_start as u32,
            fusion.eps.to_bits(),
        ]
        .into_iter()
        .chain(fusion.rope_params)
        .collect::<Vec<_>>();
        let mut tensors = vec![w, x, out];
        tensors.extend(&fusion.tensors);
        let cost = matvec_cost(w.byte_len(), batch, rows, k, x, out, opts);
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

/// Whether staged subgroup kernels issue each subgroup's first weight loads before staging the input
/// (`DRIFT_MATVEC_PREFETCH=1`, or a list of the products to do it for: `rope`, `glu`, `norm` (the
/// other staged ones); off until measured on the target GPU).
fn prefetch_on(rope: bool, glu: bool) -> bool {
    let Some(v) = std::env::var("DRIFT_MATVEC_PREFETCH").ok() else {
        return false;
    };
    let kind = if rope {
        "rope"
    } else if glu {
        "glu"
    } else {
        "norm"
    };
    v == "1" || v.split(',').any(|k| k.trim() == kind)
}

/// Rows per workgroup of the subgroup kernel by default (`DRIFT_MATVEC_ROWS=8|16|32|64` overrides it):
/// on the H200 (2026-11-30) 32 gave Llama 3.2 1B decode 919.5 tok/s against 908.9 at 8, 903.5 at 16
/// and 913.9 at 64 (its gate-up + GLU product 429 vs 445 us per token); SmolLM2-135M moved within noise.
const DEFAULT_ROWS: usize = 32;

/// Rows per workgroup of the subgroup kernel for a shard of `rows` rows: [`DEFAULT_ROWS`] (or the
/// override) where the shard still gets enough workgroups ([`MIN_WORKGROUPS`]) and, for the paired-row
/// epilogues, whole workgroups; else fewer, down to 8 (one per subgroup). Plain products (no staged
/// input, no paired rows) that still have too few workgroups go under 8 ([`min_rows`]).
fn rows_per_workgroup(rows: usize, pairs: bool, staged: bool) -> usize {
    let want = std::env::var("DRIFT_MATVEC_ROWS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|r| [8, 16, 32, 64].contains(r))
        .unwrap_or(DEFAULT_ROWS);
    // Fewer workgroups, each sharing its staged input among more rows, measured slower on the H200
    // (2026-11-30: QKV at 16 rows, 1B 963.4 tok/s; at 32, 932.8; against 971-973 at 8).
    let rpw = rows_rule(rows, pairs, want);
    if pairs || staged || rpw > ROWS_PER_WORKGROUP {
        return rpw;
    }
    smaller_rows(rows, min_rows())
}

/// Subgroups per row of the plain products of one activation row (`DRIFT_MATVEC_TEAMS` = 1, 2 or
/// 4; default 4). On the H200 (2026-12-01) Llama 3.2 1B's O and down products (2048 rows, one
/// subgroup each: ~16 warps per SM) ran ~2.3 TB/s; with 2 subgroups per row decode went 980 ->
/// 1028 tok/s, with 4 to 1035.
fn teams_per_row() -> usize {
    std::env::var("DRIFT_MATVEC_TEAMS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|t| [1, 2, 4].contains(t))
        .unwrap_or(DEFAULT_TEAMS)
}

const DEFAULT_TEAMS: usize = 4;

/// Fewest rows per workgroup the plain products may take (`DRIFT_MATVEC_MIN_ROWS` = 2, 4 or 8,
/// default 4). On the H200 (2026-11-30) 4 gave Llama 3.2 1B decode 978.6 tok/s against 971-973 at 8
/// (its O and down products at 512 workgroups instead of 256); SmolLM2-135M 1180.5 against 1175-1184
/// at 8 and 1164.8 at 2.
fn min_rows() -> usize {
    std::env::var("DRIFT_MATVEC_MIN_ROWS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|r| [2, 4, 8].contains(r))
        .unwrap_or(DEFAULT_MIN_ROWS)
}

const DEFAULT_MIN_ROWS: usize = 4;

/// Rows per workgroup under 8 (down to `floor`) while the product has fewer than [`MIN_WORKGROUPS`].
fn smaller_rows(rows: usize, floor: usize) -> usize {
    let mut rpw = ROWS_PER_WORKGROUP;
    while rpw > floor && rows.div_ceil(rpw) < MIN_WORKGROUPS {
        rpw /= 2;
    }
    rpw
}

/// Workgroups a product keeps before it takes more rows per workgroup.
const MIN_WORKGROUPS: usize = 512;

/// [`rows_per_workgroup`]'s rule for a requested `want` rows per workgroup.
fn rows_rule(rows: usize, pairs: bool, want: usize) -> usize {
    let mut rpw = want;
    while rpw > ROWS_PER_WORKGROUP
        && (rows.div_ceil(rpw) < MIN_WORKGROUPS || (pairs && !rows.is_multiple_of(rpw)))
    {
        rpw /= 2;
    }
    rpw
}

/// Checks the activations and fusion options of a matrix-vector product with a weight `[n, k]`: x
/// `[B, k]` or `[k]` (`[B, 2k]` with SwiGLU), out `[B, n]` or `[n]` (row-major f32 or f16,
/// `1 <= B <= MAX_BATCH`), bias `[n]`, norm weight `[k]`, residual shaped like out. Returns B.
pub(crate) fn check_io(
    what: &str,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
    n: usize,
    k: usize,
) -> Result<usize> {
    let xk = if opts.swiglu { 2 * k } else { k };
    let on = if opts.glu { n / 2 } else { n };
    let batch = if x.rank() == 1 { 1 } else { x.shape[0] };
    let x_ok = (x.rank() == 1 || x.rank() == 2) && x.dim(-1) == xk;
    let mut out_ok =
        out.rank() == x.rank() && out.dim(-1) == on && (out.rank() == 1 || out.shape[0] == batch);
    if let Some(to) = &opts.rope {
        if batch != 1
            || !n.is_multiple_of(ROWS_PER_WORKGROUP)
            || opts.bias.is_some()
            || opts.swiglu
            || opts.glu
            || opts.residual.is_some()
        {
            return Err(shape_err!(
                "{what}: the RoPE epilogue takes one activation row, a multiple of 8 weight rows and no bias, SwiGLU, GLU or residual (w [{n}, {k}], x {:?})",
                x.shape
            ));
        }
        // out is q [hq, d] (any leading shape); the targets check it.
        to.check(what, n, out)?;
        out_ok = true;
    }
    if opts.glu
        && (batch != 1
            || !n.is_multiple_of(ROWS_PER_WORKGROUP)
            || opts.swiglu
            || opts.residual.is_some())
    {
        return Err(shape_err!(
            "{what}: the GLU epilogue takes one activation row, 2N weight rows with N a multiple of 4, and no SwiGLU prologue or residual (w [{n}, {k}], x {:?})",
            x.shape
        ));
    }
    if !x_ok || !out_ok || batch == 0 || batch > MAX_BATCH {
        return Err(shape_err!(
            "{what}: w [{n}, {k}], x {:?} and out {:?} do not fit (x [B, {xk}], out [B, {n}], 1 <= B <= {MAX_BATCH})",
            x.shape,
            out.shape
        ));
    }
    let mut acts = vec![(x, "x"), (out, "out")];
    acts.extend(opts.residual.map(|r| (r, "residual")));
    for (t, name) in acts {
        if !matches!(t.dtype, DType::F32 | DType::F16) || t.layout != Layout::RowMajor {
            return Err(shape_err!(
                "{what}: {name} must be row-major f32 or f16, is {:?} {:?}",
                t.dtype,
                t.layout
            ));
        }
    }
    if let Some(b) = opts.bias
        && (b.numel() != n || !matches!(b.dtype, DType::F32 | DType::F16))
    {
        return Err(shape_err!(
            "{what}: bias must be [{n}] f32 or f16, is {:?} {:?}",
            b.shape,
            b.dtype
        ));
    }
    if let Some((g, eps)) = opts.norm {
        if g.numel() != k || !matches!(g.dtype, DType::F32 | DType::F16) {
            return Err(shape_err!(
                "{what}: the norm weight must be [{k}] f32 or f16, is {:?} {:?}",
                g.shape,
                g.dtype
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(shape_err!(
                "{what}: norm eps {eps} is not a finite value >= 0"
            ));
        }
        if opts.swiglu {
            return Err(shape_err!(
                "{what}: norm and swiglu prologues do not combine"
            ));
        }
    }
    if let Some(r) = opts.residual {
        if r.shape != out.shape {
            return Err(shape_err!(
                "{what}: residual {:?} must have the shape of out {:?}",
                r.shape,
                out.shape
            ));
        }
        if partial_overlap(r, out) {
            return Err(shape_err!(
                "{what}: the residual partly overlaps out (it may only be out itself)"
            ));
        }
    }
    Ok(batch)
}

/// The fused prologue / epilogue of a matrix-vector dispatch (`shaders/matvec_fuse.wgsl`): its
/// defines, the optional tensors bound after w, x and out (bias, norm weight, residual; those
/// present, in binding order) and the norm's eps.
pub(crate) struct Fusion<'a> {
    pub defines: Vec<(&'static str, String)>,
    pub tensors: Vec<&'a Tensor>,
    pub eps: f32,
    /// The RoPE epilogue's hq, hkv, d, rot and max_ctx (zeros without it), after eps in the params.
    pub rope_params: [u32; 5],
    suffix: String,
}

impl<'a> Fusion<'a> {
    /// For options already checked by [`check_io`] (`out`: the product's output).
    pub fn new(gpu: &Gpu, opts: &MatvecOptions<'a>, out: &Tensor) -> Result<Fusion<'a>> {
        let mut f = Fusion {
            defines: vec![
                ("BIAS", u8::from(opts.bias.is_some()).to_string()),
                ("NORM", u8::from(opts.norm.is_some()).to_string()),
                ("SWIGLU", u8::from(opts.swiglu).to_string()),
                ("RES", u8::from(opts.residual.is_some()).to_string()),
                ("GLU", u8::from(opts.glu).to_string()),
                ("ROPE", u8::from(opts.rope.is_some()).to_string()),
                (
                    "PAIRS",
                    u8::from(opts.glu || opts.rope.is_some()).to_string(),
                ),
            ],
            tensors: Vec::new(),
            eps: 0.0,
            rope_params: [0; 5],
            suffix: String::new(),
        };
        // Bindings 1..=3 are w, x, out.
        let next = |f: &Fusion| (f.tensors.len() + 4).to_string();
        if let Some(b) = opts.bias {
            f.defines.push(("TB", b.dtype.wgsl().into()));
            f.tensors.push(b);
        }
        if let Some((g, eps)) = opts.norm {
            let base = g.binding(gpu.caps.max_storage_binding)?.base_elems;
            f.defines.extend([
                ("NORM_B", next(&f)),
                ("TG", g.dtype.wgsl().into()),
                ("GV4", u8::from(base.is_multiple_of(4)).to_string()),
            ]);
            f.tensors.push(g);
            f.eps = eps;
            f.suffix += "_norm";
        }
        if opts.swiglu {
            f.suffix += "_swiglu";
        }
        if opts.glu {
            f.suffix += "_glu";
        }
        if let Some(r) = opts.residual {
            f.defines
                .extend([("RES_B", next(&f)), ("TR", r.dtype.wgsl().into())]);
            f.tensors.push(r);
            f.suffix += "_res";
        }
        if let Some(to) = &opts.rope {
            let interleaved = to.pairs == RopePairs::Interleaved;
            f.defines.extend([
                ("KC_B", next(&f)),
                ("TC", to.k_cache.dtype.wgsl().into()),
                ("INTERLEAVED", u8::from(interleaved).to_string()),
            ]);
            f.tensors.push(to.k_cache);
            f.defines.push(("VC_B", next(&f)));
            f.tensors.push(to.v_cache);
            f.defines.push(("STEP_B", next(&f)));
            f.tensors.push(to.step);
            f.defines.push(("TURNS_B", next(&f)));
            f.tensors.push(to.turns);
            f.rope_params = to.params(out);
            f.suffix += if interleaved { "_rope" } else { "_ropehalf" };
        }
        Ok(f)
    }

    /// Kernel name suffix (`_norm`, `_swiglu`, `_res`) for the profiler.
    pub fn suffix(&self) -> &str {
        &self.suffix
    }
}

/// The input row staged in workgroup memory (`shaders/matvec_fuse.wgsl`'s STAGE): with one activation
/// row and a prologue (RMSNorm or SwiGLU), the workgroup applies the prologue once, as f32 (`x * g` and
/// `silu(gate) * up` are not exact in f16), and its rows read it from there instead of each recomputing
/// it from x (and the norm weight) in global memory. The first `4 * vec4s` elements are staged, as many
/// as the device's workgroup memory holds; past them (`tail`) rows compute the prologue as unstaged.
/// The vec4s are laid out in planes of the kernel's chunk (`planes`: vec4s a lane reads per chunk) so
/// that a subgroup's reads are free of bank conflicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stage {
    /// `vec4<f32>`s of workgroup memory (0: not staged).
    pub vec4s: u32,
    /// K is longer than the staged elements.
    pub tail: bool,
    /// Vec4s per chunk a lane reads (1, 2 or 8; divides [`STAGE_STEP`]).
    pub planes: u32,
}

/// Staged vec4s are allocated in steps of this many (256 elements): few specialisations cover every K.
const STAGE_STEP: u32 = 64;

impl Stage {
    /// Not staged: every row computes its prologue.
    pub const OFF: Stage = Stage {
        vec4s: 0,
        tail: false,
        planes: 1,
    };

    /// The staging of a product with these options, `batch` rows of `k`, `wg` invocations per
    /// workgroup, `other_bytes` of workgroup memory the kernel uses besides and lanes reading
    /// `planes` vec4s per chunk.
    pub fn plan(
        gpu: &Gpu,
        opts: &MatvecOptions,
        batch: usize,
        k: usize,
        wg: u32,
        other_bytes: u32,
        planes: u32,
    ) -> Stage {
        if batch != 1 || (opts.norm.is_none() && !opts.swiglu) {
            return Stage::OFF;
        }
        // With the norm, one f32 partial sum of squares per invocation (or subgroup).
        let sums = if opts.norm.is_some() { wg * 4 } else { 0 };
        Stage::fit(
            gpu.caps.max_workgroup_storage,
            opts.max_stage_bytes,
            k,
            other_bytes + sums,
            planes,
        )
    }

    /// As many of `k` elements as `workgroup_bytes` (at most `max_bytes`) hold beside `other_bytes`.
    fn fit(
        workgroup_bytes: u32,
        max_bytes: Option<u32>,
        k: usize,
        other_bytes: u32,
        planes: u32,
    ) -> Stage {
        // 16 bytes for alignment between the variables.
        let left = workgroup_bytes.saturating_sub(other_bytes + 16);
        let left = max_bytes.map_or(left, |m| m.min(left));
        let fit = left / 16 / STAGE_STEP * STAGE_STEP;
        let need = (k.div_ceil(4) as u32).next_multiple_of(STAGE_STEP);
        let vec4s = need.min(fit);
        Stage {
            vec4s,
            tail: vec4s > 0 && 4 * (vec4s as usize) < k,
            planes,
        }
    }

    /// The shader defines (STAGE, XS, XP, STAGE_TAIL).
    pub fn defines(&self) -> Vec<(&'static str, String)> {
        vec![
            ("STAGE", u8::from(self.vec4s > 0).to_string()),
            ("XS", self.vec4s.to_string()),
            ("XP", self.planes.to_string()),
            ("STAGE_TAIL", u8::from(self.tail).to_string()),
        ]
    }

    /// Kernel name suffix for the profiler: `_stage` (all of K staged), `_stagepart` (a tail computed
    /// per row) or nothing.
    pub fn suffix(&self) -> &'static str {
        match (self.vec4s > 0, self.tail) {
            (false, _) => "",
            (true, false) => "_stage",
            (true, true) => "_stagepart",
        }
    }
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
    let f16 = [
        Some(x),
        Some(out),
        opts.bias,
        opts.norm.map(|(g, _)| g),
        opts.residual,
        opts.rope.map(|r| r.k_cache),
    ]
    .into_iter()
    .flatten()
    .any(|t| t.dtype == DType::F16);
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

/// Work of one matrix-vector dispatch: `weight_bytes` of weights read once, x (and the norm weight)
/// read, out written (and the residual read).
pub(crate) fn matvec_cost(
    weight_bytes: u64,
    batch: usize,
    rows: usize,
    k: usize,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Cost {
    let xk = if opts.swiglu { 2 * k } else { k };
    let out_elem = out.elem_bytes() + opts.residual.map_or(0, |r| r.elem_bytes());
    Cost {
        flops: 2.0 * (batch * rows * k) as f64,
        bytes: weight_bytes as f64
            + (batch * xk) as f64 * x.elem_bytes() as f64
            + (batch * rows) as f64 * out_elem as f64
            + opts
                .bias
                .map_or(0.0, |b| (rows as u64 * b.elem_bytes()) as f64)
            + opts
                .norm
                .map_or(0.0, |(g, _)| (k as u64 * g.elem_bytes()) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_fits_workgroup_memory() {
        // H200 (48 KiB): Llama 3 8B's QKV (K 4096, norm sums of 256 invocations) whole, its down
        // projection (K 14336) 12032 elements and a per-row tail.
        let qkv = Stage::fit(48 << 10, None, 4096, 1024, 2);
        assert_eq!((qkv.vec4s, qkv.tail), (1024, false));
        let down = Stage::fit(48 << 10, None, 14336, 0, 8);
        assert_eq!((down.vec4s, down.tail), (3008, true));
        assert!(down.vec4s * 16 + 16 <= 48 << 10);
        // lavapipe (32 KiB): 8192 no longer whole beside the sums; a limit of 0 turns staging off.
        assert!(Stage::fit(32 << 10, None, 8192, 1024, 1).tail);
        assert_eq!(Stage::fit(32 << 10, Some(0), 256, 0, 1), Stage::OFF);
        assert_eq!(Stage::OFF.suffix(), "");
        // Partial vec4s and small K round up to whole steps.
        assert_eq!(Stage::fit(32 << 10, None, 130, 0, 1).vec4s, 64);
    }

    #[test]
    fn rows_per_workgroup_keeps_workgroups_and_pairs_whole() {
        // Llama 3.2 1B's gate-up (32768 rows): 32 rows still make 1024 workgroups.
        assert_eq!(rows_rule(32768, true, 32), 32);
        // Its QKV (3072 rows): 16 rows would leave 192 workgroups, so 8.
        assert_eq!(rows_rule(3072, true, 16), 8);
        // The LM head (128256 rows, no pairs): 64 rows, 2004 workgroups with a partial last one.
        assert_eq!(rows_rule(128256, false, 64), 64);
        // Pairs need whole workgroups: 8200 rows at 16 would split one.
        assert_eq!(rows_rule(8200, true, 16), 8);
        assert_eq!(rows_rule(8200, false, 16), 16);
        assert_eq!(rows_rule(100, false, 8), 8);
        // Plain products of few rows go under 8 rows per workgroup: 576 rows at 2 (288 workgroups).
        assert_eq!(smaller_rows(576, 2), 2);
        assert_eq!(smaller_rows(2048, 2), 4);
        assert_eq!(smaller_rows(2048, 8), 8);
        assert_eq!(smaller_rows(8192, 2), 8);
    }
}
