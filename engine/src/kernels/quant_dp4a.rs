//! The integer-dot-product variant of the quantized matrix-vector kernel
//! (`shaders/matvec_quant_dp4a.wgsl`): for Q4_0, Q4_1 and Q8_0 weights and one activation row, the
//! workgroup turns x into int8 blocks (two terms, ~15 bits) in workgroup memory once and multiplies
//! with `dot4I8Packed`
//! (one instruction per four products where the device has integer dot products, which wgpu enables on
//! Vulkan 1.3). [`crate::kernels::quant::matvec_quant`] picks it where [`eligible`] says so; it takes
//! the same parameters and bindings as the float-decoding kernel.

use crate::gpu::Gpu;
use crate::kernels::KernelSpec;
use crate::kernels::matvec::MatvecOptions;
use crate::kernels::quant::QuantTuning;
use crate::tensor::DType;

/// Invocations per workgroup, fixed in the shader.
const WG: u32 = 256;

/// Blocks of x the kernel's workgroup memory is sized for: K / 32 rounded up to a multiple of 64, so
/// few specialisations cover every model width.
fn max_blocks(k: usize) -> u32 {
    (k / 32).next_multiple_of(64) as u32
}

/// Workgroup memory: 64 bytes of int8 (two terms) and 8 bytes of scale and sum per block, one f32 per
/// invocation.
fn smem_bytes(k: usize) -> u32 {
    max_blocks(k) * 72 + WG * 4
}

/// Whether the integer-dot-product kernel can take this product: Q4_0 / Q4_1 / Q8_0 weights, one
/// activation row, subgroup reductions (`sg`), and x's blocks fitting workgroup memory.
pub(crate) fn eligible(gpu: &Gpu, dtype: DType, batch: usize, k: usize, sg: bool) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
        && batch == 1
        && sg
        && k.is_multiple_of(32)
        && gpu.caps.max_invocations_per_workgroup >= WG
        && smem_bytes(k) <= gpu.caps.max_workgroup_storage
}

/// The kernel's source: the parameters and bindings it shares with `matvec_quant.wgsl`, the dp4a kernel,
/// the block loaders and the fused prologues / epilogues.
pub const SOURCE: &str = concat!(
    crate::shader!("matvec_quant_io.wgsl"),
    crate::shader!("matvec_quant_dp4a.wgsl"),
    crate::shader!("dequant.wgsl"),
    crate::shader!("matvec_fuse.wgsl"),
    crate::shader!("rope_angle.wgsl"),
    crate::shader!("xq_produce.wgsl"),
);

/// Row groups per workgroup for `row_groups` = 0 (automatic), for a product of `rows` rows: the
/// workgroup's pre-pass (x read, transformed and rounded once) is shared by 8 teams x R rows x this
/// many. Sharing it wider pays only while the grid still fills a large GPU: measured on the H200 in the
/// fused 8B Q4_0 model (BENCHMARKS.md, 2026-11-30 fourth session), 2 groups made the gate-up product
/// (28672 rows, 448 workgroups; 1128 vs 1297 us per token under the profiler) faster but the 4096-row
/// products (64 workgroups; 2240 vs 1648 us) slower.
pub(crate) fn row_groups(requested: u32, rows: usize) -> u32 {
    match requested {
        // Whole 64-row workgroups (8 teams x up to 4 rows x 2), as the paired-row epilogues need.
        0 if rows >= 16384 && rows.is_multiple_of(64) => 2,
        0 => 1,
        r => r,
    }
}

/// The specialisation-independent part of the spec for a product of `rows` rows of width `k` (the
/// caller adds the block type, alignment, dtypes, rows per team, x vector access and the fusion
/// defines).
pub(crate) fn spec(
    name: String,
    k: usize,
    rows: usize,
    tuning: &QuantTuning,
    kw: u32,
    xq_in: bool,
    smem_limit: u32,
) -> KernelSpec {
    let kt = k_teams(tuning.k_teams);
    let name = if kw > 1 {
        format!("{name}_kw{kw}")
    } else {
        name
    };
    // A workgroup quantizes its slice of x: K / kw elements (rounded up to whole blocks).
    let slice = (k / 32).div_ceil(kw as usize) * 32;
    let dbg = measurement_build(rows, k);
    let maxb = workgroup_blocks(slice, rows, k, xq_in, smem_limit);
    KernelSpec::new(name, SOURCE, "matvec")
        .define("MAXB", maxb)
        .define("KW", kw)
        .define("KWS", u8::from(kw > 1))
        .define("RG", row_groups(tuning.row_groups, rows))
        .define("BU", blocks_in_flight(tuning.chunks_per_step, rows))
        .define("PF", u8::from(tuning.prefetch || latency_override(rows).1))
        .define("KT", kt)
        .define("KSPLIT", u8::from(kt > 1))
        .define("XQ4", u8::from(tuning.x_vec4))
        .define("DBG", dbg)
}

/// Blocks of x every product's workgroup memory is sized for by default, unless its pre-pass needs
/// more (see [`workgroup_blocks`]): 120 percent of a 4096-wide row's 128.
const DEFAULT_BLOCKS: u32 = 153;

/// Blocks of x the workgroup memory is sized for, for `slice` elements per workgroup of a product of
/// `rows` x `k` (`limit`: the device's workgroup memory in bytes). The pre-pass needs
/// [`max_blocks`]; a product reading producer-quantized x needs none, but the allocation sets how
/// many workgroups share an SM, and that sets the product's speed, not monotonically. On the H200 the
/// 8B Q4_0 token's floor was 2.54 ms with 1 block, 2.32 with the pre-pass's (10-17 KiB), 2.19-2.21
/// with 110-130 percent of it (QKV and gate-up gain, down and O flat), 2.61 from 135 percent, and
/// 2.14 with O (64 blocks per workgroup) at 240 percent, the others' 153 blocks (BENCHMARKS.md,
/// 2026-12-02 sixteenth session): so every product allocates [`DEFAULT_BLOCKS`] (~11 KiB), more
/// only where its pre-pass needs more. `DRIFT_DP4A_SMEM` (timing runs) overrides it: `PCT` of the
/// pre-pass's for every product or `ROWSxK=PCT,...` for some (below 100 only where x is
/// producer-quantized).
fn workgroup_blocks(slice: usize, rows: usize, k: usize, xq_in: bool, limit: u32) -> u32 {
    let full = max_blocks(slice);
    let want = std::env::var("DRIFT_DP4A_SMEM")
        .ok()
        .and_then(|v| smem_percent(&v, rows, k))
        .map_or(DEFAULT_BLOCKS, |pct| full * pct / 100);
    fit_blocks(want, full, xq_in, limit)
}

/// `want` blocks within `limit` bytes of workgroup memory, at least 1, and never fewer than the
/// pre-pass's `full` where it runs (`xq_in` false).
fn fit_blocks(want: u32, full: u32, xq_in: bool, limit: u32) -> u32 {
    // Room for the kernel's other workgroup arrays (partial sums, paired rows).
    let cap = limit.saturating_sub(WG * 4 + 4096) / 72;
    if xq_in {
        want.min(cap).max(1)
    } else {
        want.min(cap).max(full)
    }
}

/// The percent a `DRIFT_DP4A_SMEM` value (`PCT`, or `ROWSxK=PCT,...`) gives a product of `rows` x
/// `k`, if any.
fn smem_percent(v: &str, rows: usize, k: usize) -> Option<u32> {
    let shape = format!("{rows}x{k}");
    v.split(',')
        .find_map(|item| match item.trim().split_once('=') {
            Some((s, pct)) if s.trim() == shape => pct.trim().parse().ok(),
            Some(_) => None,
            None => item.trim().parse().ok(),
        })
}

/// Workgroups sharing each row set, for `requested` = 0 (automatic) or the number asked for, on a
/// product of `rows` rows of width `k`. Automatic: 2 for products of few row sets and rows of at
/// least 4096 (the O and down projections of an 8B model: 4096 rows are 128 workgroups of 32, each
/// quantizing all of x first), else 1. On the H200 (`--filter dp4asweep`, 2026-12-01) 4096x14336
/// Q4_0 took 25.6 us with 1, 21.7 with 2, 22.9 with 4; 4096x4096 13.5 / 13.7 / 13.6 and 14336x4096
/// 21.6 / 26.4 / 31.1; in the 8B Q4_0 model splitting O as well as down gave 371.2 tok/s against
/// 362.7 for down alone.
/// Not with the RoPE epilogue, whose bindings (weight, input, output, norm, both caches, step,
/// frequencies) leave no room for the scratch.
pub(crate) fn k_workgroups(requested: u32, rows: usize, k: usize, opts: &MatvecOptions) -> u32 {
    if opts.rope.is_some() {
        return 1;
    }
    match requested {
        0 if o_unsplit() && k < O2_MAX_K => 1,
        0 if k >= 4096 && rows <= 8192 => 2,
        0 => 1,
        n => n,
    }
}

/// Products of rows shorter than [`O2_MAX_K`] are not split over workgroups, and those of 120-263
/// workgroups of 4 rows per team take 2 (the 8B's O: 4096 x 4096 ran 11.3 us standalone that way
/// against ~13.7 split over 2 workgroups; its down keeps its split). The 8B Q4_0 model on the H200
/// (2026-12-02, same machine): 401.1 tok/s against 395.6 split (floor 2.498 against 2.533 ms).
/// `DRIFT_DP4A_O2=0` restores the split (A/B runs).
pub(crate) fn o_unsplit() -> bool {
    std::env::var_os("DRIFT_DP4A_O2").is_none_or(|v| v != "0")
}

/// Row length below which `DRIFT_DP4A_O2` applies.
pub(crate) const O2_MAX_K: usize = 8192;

/// Teams sharing a row group for `k_teams` (0 = 1).
pub(crate) fn k_teams(requested: u32) -> u32 {
    requested.max(1)
}

/// Blocks per row a lane keeps in flight: 1 for `chunks_per_step` = 0 (automatic), else 1, 2 or 4.
/// More than one, and the prefetch option ([`crate::kernels::quant::QuantTuning::prefetch`]), made the
/// fused 8B Q4_0 model slower on the H200 (319.0 tok/s with 1 block; 254.4 with 2; 287.4 with 1 and
/// prefetch; BENCHMARKS.md 2026-11-30 fourth session), so they are tuning options
/// (`--filter dp4asweep`, `DRIFT_DP4A_TUNE`).
pub(crate) fn blocks_in_flight(requested: u32, rows: usize) -> u32 {
    match requested {
        0 => latency_override(rows).0,
        u => u.min(4),
    }
}

/// `DRIFT_DP4A_DBG=1|2|3|4`: a measurement build with wrong results (see the shader's DBG): x's
/// low term dropped, the arithmetic replaced by an xor of the loaded words, the weight loads by
/// words made from the indices, or x's pre-pass by loads of blocks from global memory, so `--filter dp4alat` splits a product's time between its loads and
/// its arithmetic. 0 (unset) is the real kernel.
/// `DRIFT_DP4A_DBG_SHAPES=ROWSxK,...` limits it to products of those shapes (e.g. `6144x4096` for
/// the 8B's QKV, `128256x4096` for its LM head).
fn measurement_build(rows: usize, k: usize) -> u32 {
    let build = std::env::var("DRIFT_DP4A_DBG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|d| *d <= 5)
        .unwrap_or(0);
    match std::env::var("DRIFT_DP4A_DBG_SHAPES") {
        Ok(list) if !list.split(',').any(|s| s.trim() == format!("{rows}x{k}")) => 0,
        _ => build,
    }
}

/// `DRIFT_DP4A_LAT=BU,PF` (A/B runs): blocks in flight and the prefetch for products of fewer than
/// 16384 rows (an 8B's QKV, O and down, whose time is a chain of memory round trips rather than
/// bandwidth), where the tuning leaves them automatic. Unset: (1, false).
fn latency_override(rows: usize) -> (u32, bool) {
    let Ok(v) = std::env::var("DRIFT_DP4A_LAT") else {
        return (1, false);
    };
    let f: Vec<u32> = v.split(',').filter_map(|t| t.trim().parse().ok()).collect();
    match f[..] {
        [bu, pf] if rows < 16384 && [1, 2, 4].contains(&bu) && pf <= 1 => (bu, pf == 1),
        _ => (1, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroup_memory_covers_the_common_widths() {
        // Llama 3 8B's down projection (K = 14336) fits the 48 KiB of the H200 (not lavapipe's 32).
        assert_eq!(max_blocks(14336), 448);
        assert!(smem_bytes(14336) <= 48 * 1024);
        assert!(smem_bytes(8192) <= 32 * 1024);
        assert_eq!(max_blocks(576), 64);
        assert_eq!(max_blocks(4096), 128);
    }

    #[test]
    fn workgroup_memory_scales_only_where_x_arrives_quantized() {
        assert_eq!(smem_percent("50", 28672, 4096), Some(50));
        assert_eq!(
            smem_percent("6144x4096=75,28672x4096=25", 28672, 4096),
            Some(25)
        );
        assert_eq!(smem_percent("6144x4096=75", 28672, 4096), None);
        let h200 = 48 * 1024;
        assert_eq!(fit_blocks(128, 128, true, h200), 128);
        assert_eq!(fit_blocks(64, 128, true, h200), 64);
        assert_eq!(fit_blocks(0, 128, true, h200), 1);
        // The pre-pass keeps what it needs; padding stops at the device's workgroup memory.
        assert_eq!(fit_blocks(64, 128, false, h200), 128);
        assert_eq!(fit_blocks(192, 128, false, h200), 192);
        assert_eq!(fit_blocks(896, 224, false, h200), 611);
        // By default every product the same, the pre-pass's more where it needs more.
        assert_eq!(
            fit_blocks(DEFAULT_BLOCKS, max_blocks(2048), true, h200),
            153
        );
        assert_eq!(
            fit_blocks(DEFAULT_BLOCKS, max_blocks(7168), false, h200),
            256
        );
        assert_eq!(
            fit_blocks(DEFAULT_BLOCKS, max_blocks(7168), true, h200),
            153
        );
    }

    #[test]
    fn k_split_over_workgroups_for_long_rows_of_few_row_sets() {
        let plain = MatvecOptions::default();
        assert_eq!(k_workgroups(0, 4096, 14336, &plain), 2); // Llama 3 8B down
        assert_eq!(k_workgroups(0, 4096, 4096, &plain), 1); // its O: unsplit, 2 rows per team
        assert_eq!(k_workgroups(0, 2048, 2048, &plain), 1); // Llama 3.2 1B's O
        assert_eq!(k_workgroups(0, 28672, 4096, &plain), 1); // its gate-up
        assert_eq!(k_workgroups(0, 128256, 4096, &plain), 1); // its LM head
        assert_eq!(k_workgroups(4, 4096, 4096, &plain), 4); // asked for
    }

    #[test]
    fn two_row_groups_only_for_wide_products_of_whole_workgroups() {
        assert_eq!(row_groups(0, 28672), 2); // Llama 3 8B gate-up
        assert_eq!(row_groups(0, 16384), 2);
        assert_eq!(row_groups(0, 6144), 1); // its QKV
        assert_eq!(row_groups(0, 4096), 1);
        assert_eq!(row_groups(0, 16384 + 32), 1); // not whole 64-row workgroups
        assert_eq!(row_groups(3, 4096), 3); // asked for
    }
}
