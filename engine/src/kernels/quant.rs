//! GGML block-quantized weights on the GPU (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
//!
//! Weights stay in GPU memory as in the GGUF file (rows of whole blocks, [`Layout::Blocks`]; a loader
//! uploads the file's bytes, and only Q4_0 rows are reordered on the way, see
//! [`crate::kernels::quant_rows`]). Kernels read them as u32 words and decode 32-element chunks in
//! registers (`shaders/dequant.wgsl`):
//! - [`matvec_quant`]: decode matrix-vector products, `out = x @ w^T (+ bias)` for up to
//!   [`MAX_BATCH`] activation rows, with the options (bias, fused norm / SwiGLU / residual, subgroup or
//!   workgroup-memory reduction, shard size) of [`crate::kernels::matvec`]; weights over a storage
//!   binding go shard by shard;
//! - [`dequantize`]: a whole weight (or a row view of it) to f16 or f32, for prefill through a reused
//!   scratch buffer.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::matvec::{
    Fusion, MatvecOptions, ROWS_PER_WORKGROUP, Stage, check_io, choose_reduction, matvec,
    matvec_cost,
};
use crate::kernels::quant_xq::XqPlan;
use crate::kernels::{KernelSpec, TUNED_SMS, grid, quant_dp4a};
use crate::tensor::{DType, Layout, RowShard, Storage, Tensor};
use crate::{shader, shape_err};

pub use crate::kernels::matvec::MAX_BATCH;

/// The decode kernel: `matvec_quant_io.wgsl`'s parameters and bindings, then `matvec_quant.wgsl`, which
/// uses `dequant.wgsl`'s decoders and `matvec_fuse.wgsl`'s prologues / epilogues.
pub const MATVEC_SRC: &str = concat!(
    shader!("matvec_quant_io.wgsl"),
    shader!("matvec_quant.wgsl"),
    shader!("dequant.wgsl"),
    shader!("matvec_fuse.wgsl")
);
const DEQUANT_SRC: &str = shader!("dequant.wgsl");

/// Teams (row groups) per workgroup, fixed in `shaders/matvec_quant.wgsl`.
const TEAMS: usize = 8;

/// Largest weight binding: the kernels address its bytes with u32 (Vulkan bindings are below 4 GiB
/// anyway).
const MAX_SHARD_BYTES: u64 = (1 << 32) - 4;

/// The block types these kernels read.
pub const QUANT_TYPES: [DType; 8] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

/// Whether [`matvec_quant`] and [`dequantize`] take weights of `dtype`.
pub fn is_supported(dtype: DType) -> bool {
    QUANT_TYPES.contains(&dtype)
}

fn type_define(dtype: DType) -> &'static str {
    match dtype {
        DType::Q8_0 => "Q8_0",
        DType::Q4_0 => "Q4_0",
        DType::Q4_1 => "Q4_1",
        DType::Q5_0 => "Q5_0",
        DType::Q5_1 => "Q5_1",
        DType::Q4K => "Q4K",
        DType::Q5K => "Q5K",
        DType::Q6K => "Q6K",
        _ => "NONE",
    }
}

/// Whether the type's values carry a min (`q d + m`): the kernel then adds `m * sum(x)` per chunk.
fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K)
}

/// How many chunks and rows a matvec lane keeps in flight (tuning; [`QuantTuning::default`] is what
/// [`matvec_quant`] uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantTuning {
    /// Weight rows per team (1, 2 or 4, or 0 for the default: 2 on the float-decoding kernel, 4 on the
    /// integer-dot-product one): a lane's rows share its x loads, which cost more than the blocks
    /// themselves (on the H200 a Q4_0 14336x4096 matvec took 69 us with 1 row, 46 us with 2; the 8B
    /// Q4_0 model decodes at 301.9 tok/s with 4 rows on dp4a, 287.4 with 2).
    pub rows_per_team: u32,
    /// 32-element chunks per row a lane loads (as raw words) before decoding any: 1, 2 or 4, or 0 for
    /// the default (4 for the 32-element block types, 2 for the K-quants, whose chunks take 14 to 23
    /// words of registers; 1 on CPU devices). The integer-dot-product kernel takes 1, 2 or 4 and
    /// defaults to 1 (see [`quant_dp4a::blocks_in_flight`]).
    pub chunks_per_step: u32,
    /// Compile without runtime bounds checks ([`KernelSpec::trusted`]): every index the kernels form
    /// is in range for the shapes the builders validate (the decoders never read past a field's last
    /// word, partial rows and chunks are clamped).
    pub trusted: bool,
    /// Use the integer-dot-product kernel where it applies ([`crate::kernels::quant_dp4a`]: Q4_0,
    /// Q4_1, Q8_0, one activation row). On by default; `DRIFT_DP4A=0` turns the default off (A/B runs).
    pub dp4a: bool,
    /// Integer-dot-product kernel: row groups per workgroup (0 = automatic, see
    /// [`quant_dp4a::row_groups`]).
    pub row_groups: u32,
    /// Integer-dot-product kernel: issue the first weight loads before the input's pre-pass, so
    /// their latency overlaps it.
    pub prefetch: bool,
    /// Integer-dot-product kernel: teams (subgroups) that share a row group, each taking 1 / k_teams
    /// of the row's blocks (1, 2, 4 or 8; 0 = 1): a workgroup then covers k_teams times fewer rows, so
    /// products of few rows run more workgroups.
    pub k_teams: u32,
    /// Integer-dot-product kernel: x's int8 words in workgroup memory as 4 vec4 planes (4 vector loads
    /// per block) instead of 16 word planes. Off by default until measured; `DRIFT_DP4A_XQ4=1` turns
    /// the default on (A/B runs).
    pub x_vec4: bool,
    /// Integer-dot-product kernel: workgroups sharing each row set, each taking 1 / k_workgroups of
    /// the row's blocks (and quantizing only that slice of x), the last to finish adding the slices
    /// (1..=16; 0 = automatic, see [`quant_dp4a::k_workgroups`]; never with the RoPE epilogue).
    pub k_workgroups: u32,
}

impl Default for QuantTuning {
    fn default() -> Self {
        QuantTuning {
            rows_per_team: 0,
            chunks_per_step: 0,
            // Bounds checks made these kernels 2.5-4x slower on the H200 (Q4_0 14336x4096: 179 us checked,
            // 69 us unchecked); the self-test covers the unchecked build on every device it runs on.
            trusted: true,
            dp4a: std::env::var_os("DRIFT_DP4A").is_none_or(|v| v != "0"),
            row_groups: 0,
            prefetch: false,
            k_teams: 0,
            x_vec4: std::env::var_os("DRIFT_DP4A_XQ4").is_some_and(|v| v == "1"),
            k_workgroups: k_workgroups_from_env(),
        }
        .with_env_override()
    }
}

/// `DRIFT_DP4A_KW=N` (1..=16) forces the integer-dot-product kernel's workgroups per row set (A/B
/// runs); unset, or a value out of range (reported), leaves the automatic choice (0).
fn k_workgroups_from_env() -> u32 {
    let Ok(v) = std::env::var("DRIFT_DP4A_KW") else {
        return 0;
    };
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=16).contains(&n) => n,
        _ => {
            log::warn!("DRIFT_DP4A_KW={v:?} ignored: expected 1 to 16");
            0
        }
    }
}

impl QuantTuning {
    /// `DRIFT_DP4A_TUNE=R,RG,BU,PF[,KT]` (rows per team, row groups, blocks in flight, prefetch 0/1,
    /// teams per row group) replaces the integer-dot-product kernel's defaults: for A/B runs of whole
    /// models with one binary.
    fn with_env_override(self) -> Self {
        match std::env::var("DRIFT_DP4A_TUNE") {
            Ok(v) => self.with_override(&v),
            Err(_) => self,
        }
    }

    /// This tuning with `R,RG,BU,PF[,KT]` applied; a malformed value is reported and ignored.
    fn with_override(self, v: &str) -> Self {
        let f: Vec<u32> = v.split(',').filter_map(|t| t.trim().parse().ok()).collect();
        let whole = f.len() == v.split(',').count();
        match f[..] {
            [r, rg, bu, pf, ..] if whole && f.len() <= 5 && pf <= 1 => QuantTuning {
                rows_per_team: r,
                row_groups: rg,
                chunks_per_step: bu,
                prefetch: pf == 1,
                k_teams: f.get(4).copied().unwrap_or(self.k_teams),
                ..self
            },
            _ => {
                log::warn!(
                    "DRIFT_DP4A_TUNE={v:?} ignored: expected R,RG,BU,PF[,KT] such as 4,0,1,0"
                );
                self
            }
        }
    }
}

/// Whether every chunk the loaders read starts on a word (`ALIGNED` in `dequant.wgsl`): the view
/// starts on one, rows are whole words, and so are blocks (Q4_0: rows of an even number of blocks,
/// whose split scales and nibbles then start on words too).
fn words_aligned(dtype: DType, wbyte: u32, row_bytes: u64) -> bool {
    wbyte == 0
        && row_bytes.is_multiple_of(4)
        && (dtype == DType::Q4_0 || dtype.block_bytes().is_multiple_of(4))
}

/// A quantized tensor (or row view) as the kernels bind it: a u32 view from the word holding its first
/// byte, and that byte's offset in the word (0 or 2: blocks are an even number of bytes, so a view at a
/// row boundary may start mid-word, which [`Tensor::binding`] cannot bind as the block dtype).
fn word_view(t: &Tensor) -> Result<(Tensor, u32)> {
    let off = t.storage.offset;
    if !off.is_multiple_of(2) {
        return Err(shape_err!("quantized tensor at odd byte offset {off}"));
    }
    let start = off / 4 * 4;
    let len = ((off - start + t.storage.len).div_ceil(4) * 4).min(t.storage.buffer.size() - start);
    let view = Tensor {
        shape: vec![(len / 4) as usize],
        dtype: DType::U32,
        layout: Layout::RowMajor,
        storage: Storage {
            buffer: t.storage.buffer.clone(),
            offset: start,
            len,
        },
    };
    Ok((view, (off - start) as u32))
}

/// Checks a quantized weight: a supported type, block layout, `[rows, K]` (or more leading dimensions)
/// with K a whole number of blocks. Returns (rows, K).
fn check_weight(what: &str, w: &Tensor) -> Result<(usize, usize)> {
    if !is_supported(w.dtype) {
        return Err(DriftError::Unsupported(format!(
            "{what}: weights of type {:?}",
            w.dtype
        )));
    }
    if !matches!(w.layout, Layout::Blocks | Layout::RowMajor) || w.rank() == 0 {
        return Err(shape_err!(
            "{what}: w must be GGML blocks in rows, is {:?} {:?}",
            w.shape,
            w.layout
        ));
    }
    let k = w.dim(-1);
    if k == 0 || !k.is_multiple_of(w.dtype.block_elems()) {
        return Err(shape_err!(
            "{what}: rows of {k} values are not whole {:?} blocks of {}",
            w.dtype,
            w.dtype.block_elems()
        ));
    }
    Ok((w.numel() / k, k))
}

/// `out = x @ w^T + bias` with `w`: `[N, K]` GGML blocks (any of [`QUANT_TYPES`]; f32 and f16 weights
/// go to [`crate::kernels::matvec::matvec`]), `x`: `[B, K]` or `[K]`, `out`: `[B, N]` or `[N]` (x, out
/// and bias f32 or f16), `B <= MAX_BATCH`. A weight over the binding limit (or
/// `opts.max_shard_bytes`) is split into row shards, one dispatch each.
pub fn matvec_quant(
    gpu: &Gpu,
    w: &Tensor,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Result<Vec<Dispatch>> {
    matvec_quant_tuned(gpu, w, x, out, opts, QuantTuning::default())
}

/// [`matvec_quant`] with explicit [`QuantTuning`] (benchmarks).
pub fn matvec_quant_tuned(
    gpu: &Gpu,
    w: &Tensor,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
    tuning: QuantTuning,
) -> Result<Vec<Dispatch>> {
    if !w.dtype.is_quantized() {
        if opts.xq_in.is_some() || opts.xq_out.is_some() {
            return Err(DriftError::Unsupported(
                "producer-quantized x needs quantized weights (the integer-dot-product kernel)"
                    .into(),
            ));
        }
        return matvec(gpu, w, x, out, opts);
    }
    if w.rank() != 2 {
        return Err(shape_err!(
            "matvec_quant: w must be [N, K], is {:?}",
            w.shape
        ));
    }
    // A residual product that writes x for the next one keeps whole 32-row blocks per workgroup:
    // 4 rows per team, K split over 2 workgroups where the unsplit 2-row layout would apply (the 8B's
    // O: 13.1 us standalone against 11.5 for 2 rows unsplit, but its gate-up then skips the pre-pass).
    let mut tuning = tuning;
    // A GLU product that writes x: 64-row workgroups (32 outputs, one block) where the rows allow.
    if opts.xq_out.is_some() && opts.glu && tuning.row_groups == 0 && w.shape[0].is_multiple_of(64)
    {
        tuning.row_groups = 2;
    }
    if opts.xq_out.is_some() && opts.residual.is_some() && tuning.rows_per_team == 0 {
        tuning.rows_per_team = 4;
        let (rows, k) = (w.shape[0], w.shape[1]);
        if tuning.k_workgroups == 0
            && quant_dp4a::o_unsplit()
            && (4096..quant_dp4a::O2_MAX_K).contains(&k)
            && rows <= 8192
        {
            tuning.k_workgroups = 2;
        }
    }
    // Kernels form byte offsets in u32.
    let limit = opts
        .max_shard_bytes
        .unwrap_or(gpu.caps.max_storage_binding)
        .min(gpu.caps.max_storage_binding)
        .min(MAX_SHARD_BYTES);
    let shards = if word_view(w)?.0.binding(limit).is_ok() {
        vec![RowShard {
            row_start: 0,
            tensor: w.clone(),
        }]
    } else {
        w.row_shards(limit)?
    };
    matvec_quant_shards_tuned(gpu, &shards, x, out, opts, tuning)
}

/// Whether a one-row product with `w` (`[rows, K]`, float or quantized) can end in a paired-row
/// epilogue ([`MatvecOptions::glu`] / [`MatvecOptions::rope`]) with the default tuning: float weights in
/// one binding with whole 8-row workgroups; quantized ones on the integer-dot-product kernel, in one
/// shard of whole workgroups.
pub fn paired_epilogue_fits(gpu: &Gpu, w: &Tensor) -> bool {
    let [rows, k] = w.shape[..] else {
        return false;
    };
    let limit = gpu.caps.max_storage_binding;
    if !w.dtype.is_quantized() {
        return rows.is_multiple_of(ROWS_PER_WORKGROUP) && w.binding(limit).is_ok();
    }
    let t = QuantTuning::default();
    t.dp4a
        && quant_dp4a::eligible(gpu, w.dtype, 1, k, gpu.caps.subgroup)
        && rows.is_multiple_of(rows_per_workgroup(&t, true, rows, k))
        && word_view(w).is_ok_and(|(v, _)| v.binding(limit.min(MAX_SHARD_BYTES)).is_ok())
}

/// Row groups per workgroup: the integer-dot-product kernel's (see [`quant_dp4a::row_groups`]), else 1.
fn row_groups(tuning: &QuantTuning, dp4a: bool, rows: usize) -> u32 {
    if dp4a {
        quant_dp4a::row_groups(tuning.row_groups, rows)
    } else {
        1
    }
}

/// Weight rows per team for a product of `rows` rows: the tuning's, or the kernel's default for 0.
/// The integer-dot-product kernel takes 4, or 2 where 4 would leave a grid of one to two workgroups
/// per SM of the H200 (132), whose busiest SMs then do twice the average work: the 8B's QKV (6144
/// rows, 192 workgroups of 32) ran 17.1 us with 4 rows and 14.4 with 2 (`drift bench kernels
/// --filter dp4asweep`, 2026-12-02).
fn rows_per_team(tuning: &QuantTuning, dp4a: bool, rows: usize, k: usize) -> u32 {
    match tuning.rows_per_team {
        0 if dp4a => {
            let groups = rows.div_ceil(TEAMS * 4 * row_groups(tuning, true, rows) as usize);
            // From 120 workgroups (the 8B's O: 128) where K is not split over workgroups, see
            // [`quant_dp4a::o_unsplit`] (`DRIFT_DP4A_O2=0`: from 133, as before it).
            let from = if quant_dp4a::o_unsplit() && k < quant_dp4a::O2_MAX_K {
                TUNED_SMS - 12
            } else {
                TUNED_SMS + 1
            };
            if (from..2 * TUNED_SMS).contains(&groups) {
                2
            } else {
                4
            }
        }
        0 => 2,
        r => r,
    }
}

/// Teams sharing a row group: the integer-dot-product kernel's (see [`quant_dp4a::k_teams`]), else 1.
fn k_teams(tuning: &QuantTuning, dp4a: bool) -> u32 {
    if dp4a {
        quant_dp4a::k_teams(tuning.k_teams)
    } else {
        1
    }
}

/// Weight rows a workgroup covers for a product with `rows` rows in all: TEAMS teams of the tuning's
/// rows, times the row groups, over the teams that share a row group.
fn rows_per_workgroup(tuning: &QuantTuning, dp4a: bool, rows: usize, k: usize) -> usize {
    TEAMS * rows_per_team(tuning, dp4a, rows, k) as usize * row_groups(tuning, dp4a, rows) as usize
        / k_teams(tuning, dp4a) as usize
}

/// Whether [`matvec_quant_tuned`] runs the integer-dot-product kernel for these arguments (x then
/// enters the products rounded to 8 bits per 32-element block: the self-test's tolerance needs it).
pub fn uses_dp4a(
    gpu: &Gpu,
    w: &Tensor,
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
    tuning: QuantTuning,
) -> Result<bool> {
    let (_, sg) = choose_reduction(gpu, x, out, opts)?;
    let k = w.shape.get(1).copied().unwrap_or(0);
    let batch = if out.rank() == 1 { 1 } else { out.shape[0] };
    Ok(tuning.dp4a && quant_dp4a::eligible(gpu, w.dtype, batch, k, sg))
}

/// [`matvec_quant`] over a weight given as row shards (as [`Gpu::weight_rows`] or
/// [`Tensor::row_shards`] make them): one dispatch per shard, each writing its rows of `out`.
pub fn matvec_quant_shards(
    gpu: &Gpu,
    shards: &[RowShard],
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
) -> Result<Vec<Dispatch>> {
    matvec_quant_shards_tuned(gpu, shards, x, out, opts, QuantTuning::default())
}

/// [`matvec_quant_shards`] with explicit [`QuantTuning`].
pub fn matvec_quant_shards_tuned(
    gpu: &Gpu,
    shards: &[RowShard],
    x: &Tensor,
    out: &Tensor,
    opts: &MatvecOptions,
    tuning: QuantTuning,
) -> Result<Vec<Dispatch>> {
    let Some(first) = shards.first() else {
        return Err(shape_err!("matvec_quant: no weight shards"));
    };
    let dtype = first.tensor.dtype;
    if !dtype.is_quantized() {
        return crate::kernels::matvec::matvec_shards(gpu, shards, x, out, opts);
    }
    let k = first.tensor.shape.get(1).copied().unwrap_or(0);
    let mut n = 0;
    for sh in shards {
        let t = &sh.tensor;
        if t.rank() != 2
            || t.shape[0] == 0
            || t.shape[1] != k
            || sh.row_start != n
            || t.dtype != dtype
        {
            return Err(shape_err!(
                "matvec_quant: shards must tile one [N, {k}] {dtype:?} weight in order; got rows from {} of {:?} {:?}",
                sh.row_start,
                t.shape,
                t.dtype
            ));
        }
        check_weight("matvec_quant", t)?;
        n += t.shape[0];
    }
    if n == 0 {
        return Err(shape_err!("matvec_quant: w has no rows"));
    }
    let batch = check_io("matvec_quant", x, out, opts, n, k)?;
    if ![0, 1, 2, 4].contains(&tuning.rows_per_team)
        || ![0, 1, 2, 4].contains(&tuning.chunks_per_step)
        || ![0, 1, 2, 4, 8].contains(&tuning.k_teams)
        || tuning.k_workgroups > 16
    {
        return Err(shape_err!(
            "matvec_quant: tuning {tuning:?} out of range (rows 0, 1, 2 or 4, chunks 0, 1, 2 or 4, k teams 0, 1, 2, 4 or 8, k workgroups 0..=16)"
        ));
    }
    // Chunks in flight hide memory latency on GPUs; a CPU device (lavapipe) gains nothing from them
    // but compile time.
    let u = match tuning.chunks_per_step {
        0 if gpu.info.device_type == wgpu::DeviceType::Cpu => 1,
        0 if dtype.block_elems() == 32 => 4,
        0 => 2,
        u => u,
    };
    let caps = &gpu.caps;
    let (f16, sg) = choose_reduction(gpu, x, out, opts)?;
    // With x quantized by its producer the norm's weight is already applied: only its eps is used.
    let fusion = if opts.xq_in.is_some() {
        let mut f = Fusion::new(
            gpu,
            &MatvecOptions {
                norm: None,
                ..*opts
            },
            out,
        )?;
        f.eps = opts.norm.map_or(0.0, |(_, eps)| eps);
        f
    } else {
        Fusion::new(gpu, opts, out)?
    };
    // TEAMS subgroups where the size allows, else fewer subgroups looping over the teams.
    let wg = if sg {
        (TEAMS as u32 * caps.subgroup_max_size)
            .clamp(32, 256.min(caps.max_invocations_per_workgroup))
    } else {
        TEAMS as u32 * 32
    };
    let dp4a = tuning.dp4a && quant_dp4a::eligible(gpu, dtype, batch, k, sg);
    // Row groups per workgroup (the float kernel has one).
    let r = rows_per_team(&tuning, dp4a, n, k) as usize;
    // The paired-row epilogues pair up a workgroup's rows: the integer-dot-product kernel's, in one
    // shard of whole workgroups.
    let rows_per_group = rows_per_workgroup(&tuning, dp4a, n, k);
    if (opts.glu || opts.rope.is_some())
        && (!dp4a || shards.len() > 1 || !n.is_multiple_of(rows_per_group))
    {
        return Err(shape_err!(
            "matvec_quant: the GLU and RoPE epilogues on quantized weights need the integer-dot-product kernel, one shard and a multiple of {rows_per_group} rows (w [{n}, {k}] {dtype:?}, {} shards)",
            shards.len()
        ));
    }
    let xq = if opts.xq_in.is_some() || opts.xq_out.is_some() {
        Some(XqPlan::new(
            opts,
            dp4a,
            batch,
            shards.len(),
            n,
            k,
            rows_per_group,
            k_teams(&tuning, dp4a),
            quant_dp4a::k_workgroups(tuning.k_workgroups, n, k, opts),
        )?)
    } else {
        None
    };
    // The workgroup-memory reduction's tree (f32 per invocation and row when staged: one batch row).
    let tree_bytes = if sg { 0 } else { wg * 4 * r as u32 };
    // Lanes read x in chunks of 32 elements: 8 vec4s.
    let stage = Stage::plan(gpu, opts, batch, k, wg, tree_bytes, 8);
    let bx = x.binding(caps.max_storage_binding)?.base_elems;
    let xvec = bx.is_multiple_of(4);
    let row_bytes = dtype.bytes_for(k)?;
    let mut ds = Vec::with_capacity(shards.len());
    for sh in shards {
        let (wv, wbyte) = word_view(&sh.tensor)?;
        if wv.storage.len > MAX_SHARD_BYTES {
            return Err(shape_err!(
                "matvec_quant: a {}-byte weight shard is over {MAX_SHARD_BYTES} bytes",
                wv.storage.len
            ));
        }
        let aligned = words_aligned(dtype, wbyte, row_bytes);
        // Q4_0 nibbles as vec4 loads (dp4a): rows of whole 16-byte groups from a 16-byte boundary.
        let w4 = dp4a
            && dtype == DType::Q4_0
            && (k / 32).is_multiple_of(8)
            && wbyte == 0
            && wv
                .binding(caps.max_storage_binding)?
                .base_elems
                .is_multiple_of(4);
        let name = format!(
            "matvec_{}_{}{}{}{}",
            type_define(dtype).to_lowercase(),
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
        );
        let red = if sg { "_sg" } else { "_wg" };
        // The dp4a kernel stages its own (int8) input; with K split over workgroups its scratch
        // (arrival counts and partial sums) is bound after the fusion tensors.
        let kw = if dp4a {
            quant_dp4a::k_workgroups(tuning.k_workgroups, sh.tensor.shape[0], k, opts)
        } else {
            1
        };
        let mut fusion_tensors = fusion.tensors.clone();
        let mut xq_defines = Vec::new();
        if let Some(plan) = &xq {
            let sg32 = caps.subgroup_min_size == 32 && caps.subgroup_max_size == 32;
            xq_defines = plan.defines(opts, 4 + fusion_tensors.len(), sg32 && sg, kw);
            fusion_tensors.extend(plan.tensors(opts));
        }
        let spec = if dp4a {
            quant_dp4a::spec(
                format!("{name}{red}_dp4a{}", xq.as_ref().map_or("", XqPlan::suffix)),
                k,
                n,
                &tuning,
                kw,
                opts.xq_in.is_some(),
                caps.max_workgroup_storage,
            )
            .define("SCR_B", 4 + fusion_tensors.len())
            .defines(xq_defines)
        } else {
            KernelSpec::new(
                format!("{name}{}{red}", stage.suffix()),
                MATVEC_SRC,
                "matvec",
            )
            .defines(stage.defines())
        };
        let spec = spec
            .define(type_define(dtype), 1)
            .define("ALIGNED", u8::from(aligned))
            .define("W4", u8::from(w4))
            .define(
                "TX",
                if opts.xq_in.is_some() {
                    "u32"
                } else {
                    x.dtype.wgsl()
                },
            )
            .define("TO", out.dtype.wgsl())
            .define("F16", u8::from(f16))
            .define("NB", batch)
            .define("R", r)
            .define("U", u)
            .define("UREM", u8::from(u > 1))
            .define("WG", wg)
            .define("XV4", u8::from(xvec || opts.xq_in.is_some()))
            .define("SG", u8::from(sg))
            .define("MIN", u8::from(has_min(dtype)))
            .defines(fusion.defines.clone());
        let spec = if tuning.trusted { spec.trusted() } else { spec };
        let kernel = gpu.kernel(&spec)?;
        let rows = sh.tensor.shape[0];
        let groups = rows.div_ceil(rows_per_group) as u32;
        let params = [
            rows as u32,
            k as u32,
            n as u32,
            sh.row_start as u32,
            wbyte,
            row_bytes as u32,
            (k / 32) as u32,
            fusion.eps.to_bits(),
        ]
        .into_iter()
        .chain(fusion.rope_params)
        .collect::<Vec<_>>();
        let mut tensors = vec![&wv, opts.xq_in.unwrap_or(x), out];
        tensors.extend(&fusion_tensors);
        let scratch;
        if kw > 1 {
            // Zero counts (the kernel leaves them zero), the partial sums and the slices' sums of
            // squares (norm prologue).
            let words = groups as usize * (1 + kw as usize) + rows * kw as usize;
            scratch = gpu.arrival_scratch("matvec split-K partials", words)?;
            tensors.push(&scratch);
        }
        let cost = matvec_cost(sh.tensor.storage.len, batch, rows, k, x, out, opts);
        ds.push(gpu.dispatch(
            &kernel,
            &params,
            &tensors,
            grid(groups * kw, caps.max_workgroups_per_dimension),
            cost,
        )?);
    }
    Ok(ds)
}

/// Dequantizes `w` (any of [`QUANT_TYPES`], `[.., K]`, or a row view of one) into `out` (f16 or f32,
/// same number of values, last dimension K, row-major). f16 output needs no shader-f16 (values are
/// packed in pairs), but an f16 `out` view must start at an even element. The weight must fit one
/// storage binding: dequantize a larger one by row views.
pub fn dequantize(gpu: &Gpu, w: &Tensor, out: &Tensor) -> Result<Dispatch> {
    let (rows, k) = check_weight("dequantize", w)?;
    if out.numel() != w.numel() || out.rank() == 0 || out.dim(-1) != k {
        return Err(shape_err!(
            "dequantize: w {:?} into out {:?}",
            w.shape,
            out.shape
        ));
    }
    if !matches!(out.dtype, DType::F32 | DType::F16) || out.layout != Layout::RowMajor {
        return Err(shape_err!(
            "dequantize: out must be row-major f32 or f16, is {:?} {:?}",
            out.dtype,
            out.layout
        ));
    }
    let caps = &gpu.caps;
    let (wv, wbyte) = word_view(w)?;
    if wv.storage.len > MAX_SHARD_BYTES {
        return Err(shape_err!(
            "dequantize: {} bytes of weight in one dispatch (at most {MAX_SHARD_BYTES}): use row views",
            wv.storage.len
        ));
    }
    let bo = out.binding(caps.max_storage_binding)?.base_elems;
    let out16 = out.dtype == DType::F16;
    if out16 && !bo.is_multiple_of(2) {
        return Err(shape_err!(
            "dequantize: an f16 output view must start at an even element"
        ));
    }
    let ovec = bo.is_multiple_of(if out16 { 8 } else { 4 });
    let row_bytes = w.dtype.bytes_for(k)?;
    let aligned = words_aligned(w.dtype, wbyte, row_bytes);
    let name = format!(
        "dequantize_{}_{}",
        type_define(w.dtype).to_lowercase(),
        out.dtype.wgsl()
    );
    let spec = KernelSpec::new(name, DEQUANT_SRC, "dequantize")
        .define(type_define(w.dtype), 1)
        .define("ALIGNED", u8::from(aligned))
        .define("DEQ_MAIN", 1)
        .define("OUT16", u8::from(out16))
        .define("OVEC", u8::from(ovec))
        .trusted();
    let kernel = gpu.kernel(&spec)?;
    let chunks = (rows * k / 32) as u32;
    let params = [chunks, (k / 32) as u32, wbyte, row_bytes as u32];
    gpu.dispatch(
        &kernel,
        &params,
        &[&wv, out],
        grid(chunks.div_ceil(64), caps.max_workgroups_per_dimension),
        Cost {
            flops: 2.0 * w.numel() as f64,
            bytes: w.storage.len as f64 + out.numel() as f64 * out.elem_bytes() as f64,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp4a_tune_override_takes_four_or_five_fields_or_nothing() {
        let base = QuantTuning {
            dp4a: true,
            ..QuantTuning::default()
        };
        let t = base.with_override("2, 1,4,1");
        assert_eq!(
            (t.rows_per_team, t.row_groups, t.chunks_per_step, t.prefetch),
            (2, 1, 4, true)
        );
        assert_eq!(base.with_override("4,0,1,0,8").k_teams, 8);
        for bad in ["", "4,1,1", "4,1,1,0,2,1", "4,x,1,0", "4,1,1,2", "4,1,1,0,"] {
            let t = base.with_override(bad);
            assert_eq!(
                (t.rows_per_team, t.row_groups, t.chunks_per_step, t.prefetch),
                (
                    base.rows_per_team,
                    base.row_groups,
                    base.chunks_per_step,
                    base.prefetch
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dp4a_rows_per_team_balance_the_grid() {
        let t = QuantTuning::default();
        // Llama 3 8B Q4_0: QKV (6144 rows) would be 192 workgroups of 32: 2 rows per team instead.
        assert_eq!(rows_per_team(&t, true, 6144, 4096), 2);
        assert_eq!(rows_per_workgroup(&t, true, 6144, 4096), 16);
        // O (128 workgroups of 32, K unsplit): 2; down (128, split over K), gate-up (448 of 64),
        // LM head: 4.
        assert_eq!(rows_per_team(&t, true, 4096, 4096), 2);
        assert_eq!(rows_per_team(&t, true, 4096, 14336), 4);
        assert_eq!(rows_per_team(&t, true, 28672, 4096), 4);
        assert_eq!(rows_per_team(&t, true, 128256, 4096), 4);
        // Asked for, and the float kernel's default.
        let one = QuantTuning {
            rows_per_team: 1,
            ..t
        };
        assert_eq!(rows_per_team(&one, true, 6144, 4096), 1);
        assert_eq!(rows_per_team(&t, false, 6144, 4096), 2);
    }

    #[test]
    fn sources_preprocess_for_every_type() {
        for dtype in QUANT_TYPES {
            for aligned in [0, 1] {
                let defs = vec![
                    (type_define(dtype), "1".to_string()),
                    ("ALIGNED", aligned.to_string()),
                ];
                let mut d = defs.clone();
                d.extend([
                    ("DEQ_MAIN", "1".into()),
                    ("OUT16", "1".into()),
                    ("OVEC", "0".into()),
                ]);
                crate::kernels::preprocess(DEQUANT_SRC, &d).unwrap();
            }
        }
        assert!(MATVEC_SRC.contains("fn chunk("));
    }
}
