//! Flash-style attention (online softmax, never the full score matrix): causal or not, grouped-query
//! heads, over a preallocated KV cache whose valid length and query position come from a small GPU
//! `step` tensor, so one prebuilt dispatch sequence serves every prefill and decode step.
//!
//! Variants:
//! - prefill (`shaders/attention.wgsl`): one workgroup per tile of query rows of one (batch, KV head)
//!   (the query heads sharing a KV head are tiled together), K/V tiles staged once per query tile in
//!   workgroup memory, tiles beyond the causal limit skipped; the 8-lane row-max reductions use
//!   subgroup shuffles where the device has subgroups, workgroup memory otherwise;
//! - decode (`shaders/attention_decode.wgsl`): few query rows; the KV sequence is split over
//!   workgroups (flash-decoding) which write partial (max, sum, accumulator) rows to a scratch the
//!   builder allocates once, and a second small dispatch merges them;
//! - one-pass decode (`shaders/attention_decode_row.wgsl`, built in [`super::attention_row`]): one
//!   workgroup per query row over the whole sequence, one dispatch; faster up to a few thousand keys
//!   (decode programs switch to the split variant past [`super::attention_row::ROW_MAX_KV`]).
//!
//! - coop (`shaders/attention_coop.wgsl`, built in [`super::attention_coop`]): the prefill on
//!   cooperative matrices (tensor cores) for f16 q/k/v; `CoopEmulated` runs the same kernel with the
//!   matrix operations as plain loops (tests, lavapipe). `Auto` takes it for prefill wherever the
//!   device has cooperative matrices and q/k are f16 (`DRIFT_ATTENTION_COOP=0` turns that off). Its
//!   tiles must start on 16 bytes (see the shader): before that fix (2026-12-02) every matrix load
//!   read 4 elements early on the H200 and the outputs were wrong.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::attention_coop::{self, CoopTile};
use crate::kernels::attention_row;
use crate::kernels::{KernelSpec, grid};
use crate::memory::Category;
use crate::tensor::{DType, Layout, Tensor};
use crate::{shader, shape_err};

/// The prefill kernel with the shared bindings appended.
const PREFILL_SRC: &str = concat!(shader!("attention.wgsl"), shader!("attention_io.wgsl"));

/// Largest head dimension the kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// Largest `Lq * Hq / Hkv` (query rows per KV head) the decode variant takes.
pub const MAX_DECODE_ROWS: usize = 64;

/// `Auto` picks decode when a KV head has at most this many query rows (`Lq * Hq / Hkv`).
const AUTO_DECODE_ROWS: usize = 16;

/// Workgroups the decode split aims for (a few per SM on a large GPU).
const DECODE_TARGET_GROUPS: usize = 512;

/// Most splits of the KV sequence in the decode variant (bounds the reduce's work and the scratch).
const MAX_SPLITS: usize = 256;

/// Which kernel runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionVariant {
    /// Decode when each KV head has few query rows (`Lq * Hq / Hkv <= 16`), else coop where the
    /// device has cooperative matrices and q/k/v are f16, else prefill.
    #[default]
    Auto,
    /// Query tiles per workgroup, K/V tiles in workgroup memory.
    Prefill,
    /// KV sequence split over workgroups, then a merge dispatch.
    Decode,
    /// One workgroup per query row over the whole KV sequence, one dispatch (short contexts; needs
    /// one fixed subgroup size, see [`super::attention_row`]). Decode programs choose it by KV length.
    DecodeRow,
    /// Prefill on cooperative matrices (f16 q/k/v, a device with 16x16 f16 cooperative matrices
    /// and subgroups of 32; an error elsewhere). `Auto` takes it for prefill where it can run.
    Coop,
    /// The coop kernel with its matrix operations emulated by plain loops: any device with f16; for
    /// testing the coop algorithm where cooperative matrices are missing (slow).
    CoopEmulated,
}

/// Options of [`attention`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionOptions {
    /// Score scale; `None` is `1 / sqrt(D)`.
    pub scale: Option<f32>,
    /// Key `j` is visible to query row `i` iff `j <= q_pos0 + i` (and always `j < kv_len`).
    pub causal: bool,
    pub variant: AttentionVariant,
    /// Subgroup reductions in the prefill kernel: `None` where the device has suitable subgroups,
    /// `Some(false)` forces the workgroup-memory path, `Some(true)` fails where unsupported.
    pub subgroups: Option<bool>,
    /// Decode: number of KV splits (default: enough workgroups to fill a large GPU).
    pub splits: Option<usize>,
    /// Prefill: tile shape (default: the largest that fits the device, see [`prefill_tile`]); for
    /// tuning and tests.
    pub prefill_tile: Option<PrefillTile>,
    /// Coop variants: tile shape (default: the largest that fits, see
    /// [`attention_coop::coop_tile`]); for tuning and tests.
    pub coop_tile: Option<CoopTile>,
    /// Coop variants: bisection switches (default: `DRIFT_COOP_ATTENTION_DEBUG`); for the stage
    /// probes.
    pub coop_debug: Option<attention_coop::CoopDebug>,
    /// One-pass decode variant: invocations per workgroup (default: see
    /// [`attention_row`]'s `threads_wanted`); for tuning and tests.
    pub row_threads: Option<usize>,
    /// One-pass decode variant: workgroups per query row (default: see [`attention_row`]'s
    /// `chunks_wanted`); for tuning and tests.
    pub row_chunks: Option<usize>,
}

impl AttentionOptions {
    /// Causal self-attention with the default scale.
    pub fn causal() -> AttentionOptions {
        AttentionOptions {
            causal: true,
            ..Default::default()
        }
    }
}

/// Shapes of one call, checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub b: usize,
    pub lq: usize,
    pub lkv: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Query heads per KV head.
    pub g: usize,
}

impl Dims {
    /// Query rows per (batch, KV head).
    pub fn rows(&self) -> usize {
        self.lq * self.g
    }

    /// K/V rows one (batch, KV head) streams at a full step when each tile of `tile_rows` query rows
    /// reads the keys up to its causal limit once: the bytes [`Cost`] reports.
    pub fn kv_rows_streamed(&self, tile_rows: usize, causal: bool) -> f64 {
        let rows = self.rows();
        (0..rows.div_ceil(tile_rows))
            .map(|t| {
                if !causal {
                    return self.lkv as f64;
                }
                let pos0 = self.lkv.saturating_sub(self.lq);
                let last = ((t + 1) * tile_rows).min(rows) - 1;
                (pos0 + last / self.g + 1).min(self.lkv) as f64
            })
            .sum()
    }

    /// (query, key) pairs one head visits at a full step (kv_len = Lkv, the last query row at the
    /// last key when causal): the work [`Cost`] reports.
    pub fn visible_pairs(&self, causal: bool) -> f64 {
        if !causal {
            return (self.lq * self.lkv) as f64;
        }
        let pos0 = self.lkv.saturating_sub(self.lq);
        (0..self.lq)
            .map(|i| (pos0 + i + 1).min(self.lkv) as f64)
            .sum()
    }
}

/// `out = softmax(q k^T * scale + mask) v` per query head.
///
/// - `q`: `[B, Lq, Hq, D]`, `out`: `[B, Lq, Hq, D]` (each f32 or f16);
/// - `k`, `v`: `[B, Lkv, Hkv, D]`, one dtype (f32 or f16), `Hq` a multiple of `Hkv` (query head `h`
///   reads KV head `h / (Hq / Hkv)`), `D` a multiple of 8 up to [`MAX_HEAD_DIM`];
/// - `step`: u32 `[2]` = (kv_len, q_pos0), read by the GPU at run time: only K/V rows `< kv_len`
///   (clamped to `Lkv`) are read, and query row `i` is at absolute position `q_pos0 + i`.
///
/// All tensors row-major. Returns one dispatch (prefill, one-pass decode) or two (split decode: split,
/// merge).
pub fn attention(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    opts: &AttentionOptions,
) -> Result<Vec<Dispatch>> {
    attention_into(gpu, q, k, v, out, step, opts, None)
}

/// [`attention`] of one decode row by the one-pass variant ([`AttentionVariant::DecodeRow`], several
/// workgroups per row) that also writes its output quantized into `xq_out` for the next product
/// (the integer-dot-product kernel's x, see [`crate::kernels::quant_xq`]); `Unsupported` where the
/// variant or the shapes cannot.
#[allow(clippy::too_many_arguments)]
pub fn attention_quantizing(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    opts: &AttentionOptions,
    xq_out: &Tensor,
) -> Result<Vec<Dispatch>> {
    attention_into(gpu, q, k, v, out, step, opts, Some(xq_out))
}

#[allow(clippy::too_many_arguments)]
fn attention_into(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    opts: &AttentionOptions,
    xq_out: Option<&Tensor>,
) -> Result<Vec<Dispatch>> {
    let dims = check(gpu, q, k, v, out, step)?;
    let scale = opts.scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
    if xq_out.is_some() && resolve_variant(&dims, opts) != AttentionVariant::DecodeRow {
        return Err(DriftError::Unsupported(
            "attention: x quantized for the next product needs the one-pass decode variant".into(),
        ));
    }
    let coop = |emulated| {
        attention_coop::coop(
            gpu,
            q,
            k,
            v,
            out,
            step,
            &dims,
            scale,
            opts.causal,
            emulated,
            opts.coop_tile,
            opts.coop_debug
                .unwrap_or_else(attention_coop::CoopDebug::from_env),
        )
        .map(|d| vec![d])
    };
    let mut variant = resolve_variant(&dims, opts);
    // Auto's prefill cases take the cooperative kernel where it can run; `DRIFT_ATTENTION_COOP=0`
    // keeps them on the plain prefill kernel (A/B timing, bisection).
    if opts.variant == AttentionVariant::Auto
        && variant == AttentionVariant::Prefill
        && std::env::var_os("DRIFT_ATTENTION_COOP").is_none_or(|v| v != "0")
        && attention_coop::coop_usable(&gpu.caps, q, k, dims.d)
    {
        variant = AttentionVariant::Coop;
    }
    match variant {
        AttentionVariant::Decode => decode(gpu, q, k, v, out, step, &dims, scale, opts),
        AttentionVariant::DecodeRow => Ok(vec![attention_row::decode_row(
            gpu,
            q,
            k,
            v,
            out,
            step,
            &dims,
            scale,
            opts.causal,
            opts.row_threads,
            opts.row_chunks,
            xq_out,
        )?]),
        AttentionVariant::Coop => coop(false),
        AttentionVariant::CoopEmulated => coop(true),
        _ => Ok(vec![prefill(gpu, q, k, v, out, step, &dims, scale, opts)?]),
    }
}

fn resolve_variant(dims: &Dims, opts: &AttentionOptions) -> AttentionVariant {
    match opts.variant {
        AttentionVariant::Auto if dims.rows() <= AUTO_DECODE_ROWS => AttentionVariant::Decode,
        AttentionVariant::Auto => AttentionVariant::Prefill,
        v => v,
    }
}

fn check(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
) -> Result<Dims> {
    if q.rank() != 4 || k.rank() != 4 {
        return Err(shape_err!(
            "attention: q must be [B, Lq, Hq, D] and k [B, Lkv, Hkv, D], got {:?} and {:?}",
            q.shape,
            k.shape
        ));
    }
    let (b, lq, hq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (lkv, hkv) = (k.shape[1], k.shape[2]);
    if k.shape[0] != b || k.shape[3] != d || v.shape != k.shape || out.shape != q.shape {
        return Err(shape_err!(
            "attention: q {:?}, k {:?}, v {:?}, out {:?} do not fit (k = v = [B, Lkv, Hkv, D], out = q)",
            q.shape,
            k.shape,
            v.shape,
            out.shape
        ));
    }
    if b == 0 || lq == 0 || lkv == 0 || hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(shape_err!(
            "attention: empty shape or query heads {hq} not a multiple of KV heads {hkv}"
        ));
    }
    if !d.is_multiple_of(8) || d > MAX_HEAD_DIM {
        return Err(shape_err!(
            "attention: head dim {d} must be a multiple of 8 and at most {MAX_HEAD_DIM}"
        ));
    }
    for (t, what) in [(q, "q"), (k, "k"), (v, "v"), (out, "out")] {
        if !matches!(t.dtype, DType::F32 | DType::F16) || t.layout != Layout::RowMajor {
            return Err(shape_err!(
                "attention: {what} must be row-major f32 or f16, is {:?} {:?}",
                t.dtype,
                t.layout
            ));
        }
    }
    if v.dtype != k.dtype {
        return Err(shape_err!(
            "attention: k and v must share a dtype ({:?} vs {:?})",
            k.dtype,
            v.dtype
        ));
    }
    if step.dtype != DType::U32 || step.numel() < 2 {
        return Err(shape_err!(
            "attention: step must be u32 [2] = (kv_len, q_pos0), is {:?} {:?}",
            step.dtype,
            step.shape
        ));
    }
    let f16 = [q, k, out].iter().any(|t| t.dtype == DType::F16);
    if f16 && !gpu.caps.f16 {
        return Err(DriftError::Unsupported(
            "f16 attention on a device without shader-f16".into(),
        ));
    }
    if (b * lkv * hkv * d).max(b * lq * hq * d) >= u32::MAX as usize {
        return Err(shape_err!("attention: tensors over 2^32 elements"));
    }
    Ok(Dims {
        b,
        lq,
        lkv,
        hq,
        hkv,
        d,
        g: hq / hkv,
    })
}

/// Whether a tensor can be read as vec4 (its base element offset in the binding is a multiple of 4;
/// every tensor is a whole number of D-rows, D a multiple of 8).
pub(crate) fn vec4_ok(t: &Tensor) -> bool {
    (t.storage.offset / t.elem_bytes()).is_multiple_of(4)
}

pub(crate) fn flag(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

/// Specialisation shared by both variants: element types and vector bindings.
pub(crate) fn io_defines(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
) -> Vec<(&'static str, String)> {
    let f16 = [q, k, out].iter().any(|t| t.dtype == DType::F16);
    vec![
        ("QT", q.dtype.wgsl().into()),
        ("KT", k.dtype.wgsl().into()),
        ("OT", out.dtype.wgsl().into()),
        ("F16", flag(f16).into()),
        ("QV", flag(vec4_ok(q)).into()),
        ("KV", flag(vec4_ok(k) && vec4_ok(v)).into()),
    ]
}

pub(crate) fn dtype_tag(q: &Tensor, k: &Tensor, out: &Tensor) -> String {
    let t = |d: DType| if d == DType::F16 { "h" } else { "f" };
    format!("{}{}{}", t(q.dtype), t(k.dtype), t(out.dtype))
}

/// Padded row stride (in vec4) of a workgroup-memory tile of D-rows: odd, so lanes reading the same
/// column of consecutive rows hit different banks.
fn padded_stride(d: usize) -> usize {
    (d / 4) | 1
}

/// Prefill tile shape: `ny` row groups of 4 query rows, `tk` keys per lane (8 lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillTile {
    pub ny: usize,
    pub tk: usize,
}

impl PrefillTile {
    pub fn query_rows(&self) -> usize {
        4 * self.ny
    }

    pub fn keys(&self) -> usize {
        8 * self.tk
    }

    pub fn threads(&self) -> usize {
        8 * self.ny
    }

    /// Workgroup memory the kernel declares (mirrors `shaders/attention.wgsl`).
    pub fn shared_bytes(&self, d: usize, subgroups: bool) -> usize {
        let qs = padded_stride(d);
        let vec4s = self.query_rows() * qs
            + self.keys() * qs
            + self.keys() * d / 4
            + self.keys() * (self.ny + 1)
            + if subgroups { 0 } else { self.threads() };
        vec4s * 16
    }
}

/// The preferred prefill tile that fits the device's workgroup memory for head dim `d`.
pub fn prefill_tile(gpu: &Gpu, d: usize, subgroups: bool) -> Result<PrefillTile> {
    let limit = gpu.caps.max_workgroup_storage as usize;
    let threads = gpu.caps.max_invocations_per_workgroup as usize;
    // Preference order (measured on an H200, BENCHMARKS.md 2026-11-30 seventh session): many query
    // rows per tile first (K/V reuse), then few keys per lane: registers bound the kernel. 2 keys
    // per lane for heads up to 64 wide (Llama 3.2 1B prefill: 4 keys 2265, 2 keys 1869, 1 key 1975 us
    // per 16 layers), 1 past that (SD 1.5's 80-wide: 2.91 ms with 2 keys, 2.61 with 1).
    let first_tk = if d <= 64 { 2 } else { 1 };
    [
        (16, first_tk),
        (16, 2),
        (16, 1),
        (8, 2),
        (8, 1),
        (4, 2),
        (4, 1),
        (2, 1),
        (1, 1),
    ]
    .map(|(ny, tk)| PrefillTile { ny, tk })
    .into_iter()
    .find(|t| t.shared_bytes(d, subgroups) <= limit && t.threads() <= threads)
    .ok_or_else(|| {
        DriftError::Unsupported(format!(
            "attention: head dim {d} needs more workgroup memory than the device's {limit} bytes"
        ))
    })
}

/// `DRIFT_ATTENTION_PREFILL_TILE=NY,TK`: the prefill tile where it fits and none was asked for (A/B
/// timing on the target GPU).
fn env_prefill_tile() -> Option<PrefillTile> {
    let (ny, tk) = env_pair("DRIFT_ATTENTION_PREFILL_TILE")?;
    Some(PrefillTile { ny, tk })
}

/// A tile override `A,B` from the environment variable `name` (None when unset or malformed).
pub(crate) fn env_pair(name: &str) -> Option<(usize, usize)> {
    let v = std::env::var(name).ok()?;
    let (a, b) = v.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Whether the prefill kernel can use subgroup shuffles with `threads` invocations per workgroup:
/// each 8-lane row group must sit in one subgroup, and subgroups must be full.
fn subgroups_usable(gpu: &Gpu, threads: usize) -> bool {
    let c = &gpu.caps;
    c.subgroup
        && c.subgroup_min_size >= 8
        && c.subgroup_max_size.is_power_of_two()
        && c.subgroup_max_size as usize <= threads
}

#[allow(clippy::too_many_arguments)]
fn prefill(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    dims: &Dims,
    scale: f32,
    opts: &AttentionOptions,
) -> Result<Dispatch> {
    let heads = dims.b * dims.hkv;
    let rows = dims.rows();
    // The tile decides the workgroup size, which decides whether subgroups are usable.
    let sg_wanted = opts.subgroups != Some(false);
    let mut tile = prefill_tile(gpu, dims.d, sg_wanted)?;
    let sg = sg_wanted && subgroups_usable(gpu, tile.threads());
    if opts.subgroups == Some(true) && !sg {
        return Err(DriftError::Unsupported(format!(
            "attention: subgroup reductions need subgroups of 8..={} lanes (device: {}, {}..={})",
            tile.threads(),
            gpu.caps.subgroup,
            gpu.caps.subgroup_min_size,
            gpu.caps.subgroup_max_size
        )));
    }
    if sg_wanted && !sg {
        // The workgroup-memory reduction needs a little more memory: the tile may shrink.
        tile = prefill_tile(gpu, dims.d, false)?;
    }
    let fits = |t: &PrefillTile| {
        [1, 2, 4, 8, 16, 32].contains(&t.ny)
            && (1..=8).contains(&t.tk)
            && t.threads() <= gpu.caps.max_invocations_per_workgroup as usize
            && t.shared_bytes(dims.d, sg) <= gpu.caps.max_workgroup_storage as usize
            && (!sg || subgroups_usable(gpu, t.threads()))
    };
    if let Some(t) = opts.prefill_tile {
        if !fits(&t) {
            return Err(DriftError::Unsupported(format!(
                "attention: prefill tile {t:?} does not fit this device for head dim {}",
                dims.d
            )));
        }
        tile = t;
    } else if let Some(t) = env_prefill_tile().filter(fits) {
        tile = t;
    }
    let d = dims.d;
    let vw4 = d.is_multiple_of(32);
    let tiles = rows.div_ceil(tile.query_rows());
    let groups = heads * tiles;
    let name = format!(
        "attention_prefill_d{d}_{}{}{}",
        dtype_tag(q, k, out),
        if opts.causal { "_causal" } else { "" },
        if sg { "_sg" } else { "" }
    );
    let spec = KernelSpec::new(name, PREFILL_SRC, "prefill")
        .defines(io_defines(q, k, v, out))
        .define("OV", flag(vw4 && vec4_ok(out)))
        .define("D", d)
        .define("QS", padded_stride(d))
        .define("NY", tile.ny)
        .define("TK", tile.tk)
        .define("NT", tile.threads())
        .define("VW4", flag(vw4))
        .define("G", dims.g)
        .define("CAUSAL", flag(opts.causal))
        .define("SG", flag(sg))
        .defines(prefill_bodies(&tile, d));
    let kernel = gpu.kernel(&spec)?;
    let params = [
        rows as u32,
        dims.lq as u32,
        dims.lkv as u32,
        dims.hq as u32,
        dims.hkv as u32,
        tiles as u32,
        groups as u32,
        scale.to_bits(),
    ];
    // K/V bytes: each query tile streams the keys up to its causal limit once.
    let kv_rows = dims.kv_rows_streamed(tile.query_rows(), opts.causal);
    let cost = Cost {
        flops: 4.0 * (dims.b * dims.hq * d) as f64 * dims.visible_pairs(opts.causal),
        bytes: (q.byte_len() + out.byte_len()) as f64
            + heads as f64 * kv_rows * (2 * d) as f64 * k.elem_bytes() as f64,
    };
    gpu.dispatch(
        &kernel,
        &params,
        &[q, k, v, step, out],
        grid(groups as u32, gpu.caps.max_workgroups_per_dimension),
        cost,
    )
}

/// Decode tile: keys staged per step of the split kernel (largest that fits workgroup memory).
fn decode_keys(gpu: &Gpu, d: usize, rows: usize, ksplit: bool) -> Result<usize> {
    let limit = gpu.caps.max_workgroup_storage as usize;
    let bytes = |t: usize| {
        16 * (rows * d / 4 + t * padded_stride(d) + t * d / 4)
            + 4 * (rows * t + 2 * rows)
            + if ksplit { 128 * 20 } else { 0 }
    };
    [32, 16, 8]
        .into_iter()
        .find(|&t| bytes(t) <= limit)
        .ok_or_else(|| {
            DriftError::Unsupported(format!(
                "attention: decode with {rows} rows of head dim {d} needs more workgroup memory than {limit} bytes"
            ))
        })
}

#[allow(clippy::too_many_arguments)]
fn decode(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    dims: &Dims,
    scale: f32,
    opts: &AttentionOptions,
) -> Result<Vec<Dispatch>> {
    let d = dims.d;
    let rows = dims.rows();
    if rows > MAX_DECODE_ROWS {
        return Err(shape_err!(
            "attention: the decode variant takes at most {MAX_DECODE_ROWS} query rows per KV head \
             (Lq * Hq / Hkv = {rows}); use prefill"
        ));
    }
    if gpu.caps.max_invocations_per_workgroup < 128 {
        return Err(DriftError::Unsupported(
            "attention: decode needs 128 invocations per workgroup".into(),
        ));
    }
    let ksplit = DecodeLanes::new(d, rows).kg > 1;
    let t = decode_keys(gpu, d, rows, ksplit)?;
    // Subgroup pre-reduction of each row's tile max: subgroups must tile the tile's keys.
    let c = &gpu.caps;
    let sg_ok = c.subgroup
        && c.subgroup_max_size.is_power_of_two()
        && (c.subgroup_max_size as usize) <= t
        && t.is_multiple_of(c.subgroup_max_size as usize);
    if opts.subgroups == Some(true) && !sg_ok {
        return Err(DriftError::Unsupported(format!(
            "attention: decode subgroup reductions need subgroups of at most {t} lanes"
        )));
    }
    let sg = sg_ok && opts.subgroups != Some(false);
    let heads = dims.b * dims.hkv;
    let splits = opts
        .splits
        .unwrap_or_else(|| DECODE_TARGET_GROUPS.div_ceil(heads))
        .clamp(1, MAX_SPLITS)
        .min(dims.lkv.div_ceil(t));
    let part_rows = heads * splits * rows;
    let part_o = gpu.tensor(
        "attention partial acc",
        &[part_rows, d],
        DType::F32,
        Category::Activations,
    )?;
    let part_ml = gpu.tensor(
        "attention partial max/sum",
        &[part_rows, 2],
        DType::F32,
        Category::Activations,
    )?;

    let tag = dtype_tag(q, k, out);
    let common = |spec: KernelSpec| {
        spec.defines(io_defines(q, k, v, out))
            .define("D", d)
            .define("T", t)
            .define("R", rows)
            .define("G", dims.g)
            .define("CAUSAL", flag(opts.causal))
    };
    let split_spec = common(KernelSpec::new(
        format!(
            "attention_decode_d{d}_r{rows}_{tag}{}{}",
            if opts.causal { "_causal" } else { "" },
            if sg { "_sg" } else { "" }
        ),
        shader!("attention_decode.wgsl"),
        "split",
    ))
    .define("REDUCE", "0")
    .define("OV", "0")
    .define("KS", padded_stride(d))
    .define("KSPLIT", flag(ksplit))
    .define("SG", flag(sg))
    .defines(decode_bodies(d, t, rows));
    let reduce_spec = common(KernelSpec::new(
        format!("attention_decode_merge_d{d}_{tag}"),
        shader!("attention_decode.wgsl"),
        "reduce",
    ))
    .define("REDUCE", "1")
    .define("OV", flag(vec4_ok(out)))
    .define("MAX_SPLITS", MAX_SPLITS);
    let split_kernel = gpu.kernel(&split_spec)?;
    let reduce_kernel = gpu.kernel(&reduce_spec)?;

    let groups = heads * splits;
    let params = |groups: usize| {
        [
            dims.lq as u32,
            dims.lkv as u32,
            dims.hq as u32,
            dims.hkv as u32,
            splits as u32,
            groups as u32,
            scale.to_bits(),
        ]
    };
    let part_bytes = (part_o.byte_len() + part_ml.byte_len()) as f64;
    let flops = 4.0 * (dims.b * dims.hq * d) as f64 * dims.visible_pairs(opts.causal);
    let max = gpu.caps.max_workgroups_per_dimension;
    let split_dispatch = gpu.dispatch(
        &split_kernel,
        &params(groups),
        &[q, k, v, step, &part_o, &part_ml],
        grid(groups as u32, max),
        Cost {
            flops,
            bytes: q.byte_len() as f64 + (k.byte_len() + v.byte_len()) as f64 + part_bytes,
        },
    )?;
    let out_rows = dims.b * dims.lq * dims.hq;
    let reduce_dispatch = gpu.dispatch(
        &reduce_kernel,
        &params(out_rows),
        &[step, &part_o, &part_ml, out],
        grid(out_rows as u32, max),
        Cost {
            flops: (out_rows * splits * (d + 4)) as f64 * 2.0,
            bytes: part_bytes + out.byte_len() as f64,
        },
    )?;
    Ok(vec![split_dispatch, reduce_dispatch])
}

/// `n` generated statements, one per line, indented for the shader (the attention kernels' generated
/// blocks).
pub(crate) fn unrolled(n: usize, f: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|i| format!("            {}\n", f(i)))
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// The unrolled blocks of `shaders/attention.wgsl` (see its header): every private-array index in
/// them is a constant.
fn prefill_bodies(tile: &PrefillTile, d: usize) -> Vec<(&'static str, String)> {
    let (nt, tk) = (tile.threads(), tile.tk);
    let vw4 = d.is_multiple_of(32);
    let elems = tile.keys() * d / 4;
    let loads = elems.div_ceil(nt);
    // Guard the last load step when the tile is not a whole number of steps.
    let guarded = |i: usize, body: String| {
        if (i + 1) * nt <= elems {
            format!("{{ let e = lid + {}u; {body} }}", i * nt)
        } else {
            format!(
                "{{ let e = lid + {}u; if e < BKV * DC {{ {body} }} }}",
                i * nt
            )
        }
    };
    // Loads are unconditional (a key past the end reads the last valid row, then is zeroed) so that
    // all of them are in flight together; a branch around each would serialise their latencies.
    let prefetch = unrolled(loads, |i| {
        guarded(
            i,
            format!(
                "let key = k0n + e / DC; let o = kv_base + min(key, kv_len - 1u) * p.hkv * D + (e % DC) * 4u; \
                 kr[{i}] = select(vec4<f32>(0.0), load_k(p.off_k + o), key < kv_len); \
                 vr[{i}] = select(vec4<f32>(0.0), load_v(p.off_v + o), key < kv_len);"
            ),
        )
    });
    let stage = unrolled(loads, |i| {
        let v = if vw4 {
            format!("v_s[e] = vr[{i}];")
        } else {
            format!(
                "v_s[4u * e] = vr[{i}].x; v_s[4u * e + 1u] = vr[{i}].y; \
                 v_s[4u * e + 2u] = vr[{i}].z; v_s[4u * e + 3u] = vr[{i}].w;"
            )
        };
        guarded(i, format!("k_s[(e / DC) * QS + e % DC] = kr[{i}]; {v}"))
    });
    // Fully unrolled over the head dim and the keys: the q_t / k_s offsets are literals.
    let (ny, qs, dc) = (tile.ny, padded_stride(d), d / 4);
    let s_body = unrolled(dc, |d4| {
        let q: String = (0..4)
            .map(|i| format!("let q{i} = q_t[{}u + ty]; ", (4 * d4 + i) * ny))
            .collect();
        let k: String = (0..tk)
            .map(|j| {
                format!(
                    "let k{j} = k_s[ko + {}u]; s[{j}] = s[{j}] + q0 * k{j}.x + q1 * k{j}.y + q2 * k{j}.z + q3 * k{j}.w; ",
                    8 * j * qs + d4
                )
            })
            .collect();
        format!("{{ {q}{k}}}")
    });
    let mask_body = unrolled(tk, |j| {
        format!(
            "s[{j}] = select(vec4<f32>(NEG), s[{j}], vec4<u32>(k0 + tx + {}u) < lim); mx = max(mx, s[{j}]);",
            8 * j
        )
    });
    let p_body = unrolled(tk, |j| {
        format!(
            "{{ let pj = select(vec4<f32>(0.0), exp(s[{j}] - m_new), s[{j}] > vec4<f32>(NEG_HALF)); \
             sum += pj; p_s[(tx + {}u) * PS + ty] = pj; }}",
            8 * j
        )
    });
    // Accumulators: VW4: acc[4c + a] = row a, vec4 column tx + 8c; else acc[c] = rows, column tx + 8c.
    let (nacc, rescale, o_body, store);
    if vw4 {
        let nc = d / 32;
        nacc = 4 * nc;
        rescale = unrolled(nacc, |i| format!("acc[{i}] *= alpha[{}];", i % 4));
        o_body = unrolled(tile.keys(), |kk| {
            let cols: String = (0..nc)
                .map(|c| {
                    let i = 4 * c;
                    format!(
                        " let v{c} = v_s[{}u + tx]; acc[{i}] += pp.x * v{c}; acc[{}] += pp.y * v{c}; \
                         acc[{}] += pp.z * v{c}; acc[{}] += pp.w * v{c};",
                        kk * dc + 8 * c,
                        i + 1,
                        i + 2,
                        i + 3
                    )
                })
                .collect();
            format!("{{ let pp = p_s[{}u + ty];{cols} }}", kk * (ny + 1))
        });
        store = unrolled(4, |a| {
            let cols: String = (0..nc)
                .map(|c| {
                    format!(
                        " store_out4(o_row[{a}] + (tx + {}u) * 4u, acc[{}] * inv[{a}]);",
                        8 * c,
                        4 * c + a
                    )
                })
                .collect();
            format!("if rows[{a}] < p.rows {{{cols} }}")
        });
    } else {
        nacc = d / 8;
        rescale = unrolled(nacc, |c| format!("acc[{c}] *= alpha;"));
        o_body = unrolled(tile.keys(), |kk| {
            let cols: String = (0..nacc)
                .map(|c| format!(" acc[{c}] += pp * v_s[{}u + tx];", kk * d + 8 * c))
                .collect();
            format!("{{ let pp = p_s[{}u + ty];{cols} }}", kk * (ny + 1))
        });
        store = unrolled(4, |a| {
            let cols: String = (0..nacc)
                .map(|c| {
                    format!(
                        " store_out1(o_row[{a}] + tx + {}u, acc[{c}][{a}] * inv[{a}]);",
                        8 * c
                    )
                })
                .collect();
            format!("if rows[{a}] < p.rows {{{cols} }}")
        });
    }
    vec![
        ("LOADS", loads.to_string()),
        ("NACC", nacc.to_string()),
        ("PREFETCH", prefetch),
        ("STAGE", stage),
        ("S_BODY", s_body),
        ("MASK_BODY", mask_body),
        ("P_BODY", p_body),
        ("RESCALE", rescale),
        ("O_BODY", o_body),
        ("STORE", store),
    ]
}

/// Lane layout of the decode split kernel's output phase (mirrors `shaders/attention_decode.wgsl`):
/// NG groups of D/4 lanes split into RG row groups of RPT rows and KG key groups.
struct DecodeLanes {
    rg: usize,
    kg: usize,
    rpt: usize,
}

impl DecodeLanes {
    fn new(d: usize, rows: usize) -> DecodeLanes {
        let ng = 128 / (d / 4);
        let rg = rows.min(ng);
        DecodeLanes {
            rg,
            kg: ng / rg,
            rpt: rows.div_ceil(rg),
        }
    }
}

/// The unrolled blocks of `shaders/attention_decode.wgsl`'s split kernel.
fn decode_bodies(d: usize, t: usize, rows: usize) -> Vec<(&'static str, String)> {
    let dc = d / 4;
    let lanes = DecodeLanes::new(d, rows);
    let elems = t * dc;
    let loads = elems.div_ceil(128);
    let guarded = |i: usize, body: String| {
        if (i + 1) * 128 <= elems {
            format!("{{ let e = lid + {}u; {body} }}", i * 128)
        } else {
            format!(
                "{{ let e = lid + {}u; if e < T * DC {{ {body} }} }}",
                i * 128
            )
        }
    };
    let prefetch = unrolled(loads, |i| {
        guarded(
            i,
            format!(
                "let key = t0n + e / DC; let o = kv_base + min(key, j1 - 1u) * p.hkv * D + (e % DC) * 4u; \
                 kr[{i}] = select(vec4<f32>(0.0), load_k(p.off1 + o), key < j1); \
                 vr[{i}] = select(vec4<f32>(0.0), load_v(p.off2 + o), key < j1);"
            ),
        )
    });
    let stage = unrolled(loads, |i| {
        guarded(
            i,
            format!("k_s[(e / DC) * KS + e % DC] = kr[{i}]; v_s[e] = vr[{i}];"),
        )
    });
    // Four independent accumulators so the D/4 steps of a dot product overlap.
    let dot = unrolled(dc, |c| {
        format!("d{} += q_s[qo + {c}u] * k_s[ko + {c}u];", c % 4)
    });
    // Rows past R exist only when R is not a multiple of RG.
    let row_guard = |i: usize, body: String| {
        if rows.is_multiple_of(lanes.rg) {
            format!("{{ let r = rg + {}u; {body} }}", lanes.rg * i)
        } else {
            format!(
                "{{ let r = rg + {}u; if r < R {{ {body} }} }}",
                lanes.rg * i
            )
        }
    };
    let alpha = unrolled(lanes.rpt, |i| {
        row_guard(
            i,
            format!(
                "let m_old = m_s[r]; let al = exp(m_old - max(m_old, unordered(atomicLoad(&mx_s[r])))); \
                 acc[{i}] *= al; l[{i}] *= al;"
            ),
        )
    });
    // Keys kg + KG u of the tile, fully unrolled; V loaded once for all of the lane's rows.
    let o_body = unrolled(t.div_ceil(lanes.kg), |u| {
        let rows_code: String = (0..lanes.rpt)
            .map(|i| {
                row_guard(
                    i,
                    format!("let pk = p_s[r * T + kk]; acc[{i}] += pk * vv; l[{i}] += pk;"),
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        let body = format!("let vv = v_s[kk * DC + col]; {rows_code}");
        if (u + 1) * lanes.kg <= t || t.is_multiple_of(lanes.kg) {
            format!("{{ let kk = kg + {}u; {body} }}", lanes.kg * u)
        } else {
            format!(
                "{{ let kk = kg + {}u; if kk < T {{ {body} }} }}",
                lanes.kg * u
            )
        }
    });
    let write = unrolled(lanes.rpt, |i| {
        format!(
            "{{ let r = rg + {}u; if r < R {{ let idx = (bh * p.splits + sp) * R + r; \
             part_o[idx * DC + col] = acc[{i}]; if col == 0u {{ part_ml[idx] = vec2<f32>(m_s[r], l[{i}]); }} }} }}",
            lanes.rg * i
        )
    });
    vec![
        ("LOADS", loads.to_string()),
        ("RG", lanes.rg.to_string()),
        ("KG", lanes.kg.to_string()),
        ("RPT", lanes.rpt.to_string()),
        ("PREFETCH", prefetch),
        ("STAGE", stage),
        ("DOT_BODY", dot),
        ("ALPHA_BODY", alpha),
        ("O_BODY", o_body),
        ("WRITE_BODY", write),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_of_tiles() {
        // D = 40 with the largest tile fits lavapipe's 32 KiB; D = 128 needs a smaller one.
        let t = PrefillTile { ny: 16, tk: 4 };
        assert!(t.shared_bytes(40, false) <= 32768);
        assert!(t.shared_bytes(128, true) > 49152);
        assert_eq!(padded_stride(64), 17);
        assert_eq!(padded_stride(40), 11);
    }

    #[test]
    fn visible_pairs() {
        let d = Dims {
            b: 1,
            lq: 3,
            lkv: 5,
            hq: 1,
            hkv: 1,
            d: 8,
            g: 1,
        };
        // Rows at positions 2, 3, 4 see 3, 4, 5 keys.
        assert_eq!(d.visible_pairs(true), 12.0);
        assert_eq!(d.visible_pairs(false), 15.0);
    }
}
