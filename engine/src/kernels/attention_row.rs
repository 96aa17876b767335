//! The one-pass decode variant of [`crate::kernels::attention`] (`shaders/attention_decode_row.wgsl`):
//! one workgroup per query row walks the whole KV sequence, so a decode step's attention is one
//! dispatch with no partial rows to merge. Its subgroups split the keys among themselves and meet in
//! workgroup memory; the shader's header has the lane layout.
//!
//! Past a thousand keys or so one workgroup (one SM) per row is too little: with `chunks` > 1 a
//! row's key tiles are dealt over several workgroups and the last of them to finish merges their
//! shares, still in one dispatch. Decode programs run up to [`ROW_MAX_KV`] keys with one workgroup
//! per row (4 at head dims of 128 and more, see `chunks_wanted`) and past it with
//! [`long_row_chunks`].

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::{Caps, Gpu};
use crate::kernels::attention::{Dims, dtype_tag, flag, io_defines, unrolled, vec4_ok};
use crate::kernels::quant_xq::check_buffer;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::Tensor;
use crate::{shader, shape_err};

/// The kernel with the bindings it shares with the prefill kernel appended.
const SOURCE: &str = concat!(
    shader!("attention_decode_row.wgsl"),
    shader!("attention_io.wgsl")
);

/// Largest KV length for which decode programs use one workgroup per row (default;
/// `DRIFT_ATTENTION_ROW_MAX` overrides it, 0 switches the variant off, chunked or not). On the H200
/// (`drift bench kernels --filter attndecode`, 2026-12-01, us per dispatch): at 512 keys one
/// workgroup per row took 10.7 / 11.1 / 14.9 us for SmolLM2-135M / Llama 3.2 1B / Llama 3.1 8B
/// shapes against 12.8 / 13.2 / 14.6 with 4 chunks (the merge's round trip costs ~2 us); at 1024
/// 12.7 / 12.7 / 19.5 against 13.1 / 13.0 / 15.0; at 2048 16.2 / 16.5 / 27.8 against 13.0 / 14.1 /
/// 17.4, and the split + merge variant 24.0 / 27.9 / 36.5.
pub const ROW_MAX_KV: usize = 1024;

/// Workgroups per row for decode programs whose cache reaches `max_ctx` keys, used past
/// [`ROW_MAX_KV`]: 4 up to 8192 keys, then one more per 2048, at most 16. At 4096 keys (H200,
/// 2026-12-01) 4 chunks took 15.2 / 16.8 / 23.5 us (135M / 1B / 8B shapes), 16 took 17.9 / 28.4 /
/// 37.2, the split + merge variant 31.7 / 31.5 / 44.5 and one workgroup per row 23.2 / 23.6 / 43.2.
pub fn long_row_chunks(max_ctx: usize) -> usize {
    max_ctx.div_ceil(2048).clamp(4, 16)
}

/// KV length up to which decode uses the one-pass variant: [`ROW_MAX_KV`] or the override.
pub fn row_max_kv() -> usize {
    match std::env::var("DRIFT_ATTENTION_ROW_MAX") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("warning: DRIFT_ATTENTION_ROW_MAX={v:?} is not a number; using {ROW_MAX_KV}");
            ROW_MAX_KV
        }),
        Err(_) => ROW_MAX_KV,
    }
}

/// Invocations per workgroup the variant aims for (8 subgroups of 32) at head dims over 64, and twice
/// that at 64 and below, where a lane holds fewer registers per key (`DRIFT_ATTENTION_ROW_THREADS` =
/// 64..1024, a power of two, overrides both). On the H200 (2026-11-30): 512 gave Llama 3.2 1B decode 927.5 tok/s
/// against 922.0 at 256 and SmolLM2-135M 1100.3 against 1080.4; Llama 3.1 8B (D = 128) 340.8 against
/// 344.0; 1024 was slower on all three in the kernel benchmark.
const THREADS: u32 = 256;

fn threads_wanted(d: usize) -> u32 {
    std::env::var("DRIFT_ATTENTION_ROW_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|t| [64, 128, 256, 512, 1024].contains(t))
        .unwrap_or(if d <= 64 { 2 * THREADS } else { THREADS })
}

/// Workgroups per query row (`CH`): the row's key tiles are dealt over them and the last to finish
/// merges their shares (see the shader). Default for head dim `d`: 4 at 128 and above, whose keys
/// cost a workgroup twice the bytes and shuffles, else 1 (the whole row in one workgroup);
/// `DRIFT_ATTENTION_ROW_CHUNKS` = 1..=64 overrides it. On the H200 (2026-12-01) the 8B Q4_0 model
/// (D = 128, 640 keys) decoded at 370.9 tok/s with 4 against 362.7 with 1; at D = 64 the kernel
/// alone was slower with 4 (512 keys: 12.8 against 10.7 us for SmolLM2-135M shapes, 13.2 against
/// 11.1 for Llama 3.2 1B) and the 135M model with 8 (1,114.9 against 1,248.0 tok/s).
const MAX_CHUNKS: usize = 64;

fn chunks_wanted(d: usize) -> usize {
    std::env::var("DRIFT_ATTENTION_ROW_CHUNKS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|c| (1..=MAX_CHUNKS).contains(c))
        .unwrap_or(if d >= 128 { 4 } else { 1 })
}

/// Whether the subgroups' shares are merged by subgroup reductions where the subgroups are few enough
/// (at most one per lane), rather than by a serial loop of D / 4 lanes over them
/// (`DRIFT_ATTENTION_ROW_SGMERGE=0` keeps the loop, for A/B runs).
fn sg_merge_wanted() -> bool {
    std::env::var_os("DRIFT_ATTENTION_ROW_SGMERGE").is_none_or(|v| v != "0")
}

/// Lane layout for head dim `d` on subgroups of `s` lanes: `lg` lanes share a key (each `cv` vec4
/// columns), `s / lg` key groups per subgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLanes {
    pub s: usize,
    pub lg: usize,
    pub cv: usize,
}

impl RowLanes {
    /// The layout, or why this device / head dim cannot run the variant.
    pub fn new(caps: &Caps, d: usize) -> std::result::Result<RowLanes, String> {
        if !caps.subgroup {
            return Err("needs subgroups".into());
        }
        let s = caps.subgroup_max_size as usize;
        if caps.subgroup_min_size as usize != s || !s.is_power_of_two() || s < 4 {
            return Err(format!(
                "needs one fixed power-of-two subgroup size (device: {}..{})",
                caps.subgroup_min_size, caps.subgroup_max_size
            ));
        }
        if (caps.max_invocations_per_workgroup as usize) < s {
            return Err("needs a subgroup's worth of invocations per workgroup".into());
        }
        let dc = d / 4;
        let lg = dc.min(s);
        if !d.is_multiple_of(4) || !dc.is_multiple_of(lg) || !s.is_multiple_of(lg) {
            return Err(format!(
                "head dim {d}: its {dc} vec4 columns and {s}-lane subgroups must divide one another"
            ));
        }
        Ok(RowLanes { s, lg, cv: dc / lg })
    }

    fn threads(&self, caps: &Caps, d: usize, requested: Option<usize>) -> usize {
        let wanted = requested.unwrap_or_else(|| threads_wanted(d) as usize);
        let max = (caps.max_invocations_per_workgroup as usize)
            .min(wanted)
            .max(self.s);
        max / self.s * self.s
    }
}

/// Whether this device runs the variant at head dim `d`.
pub fn row_available(caps: &Caps, d: usize) -> bool {
    RowLanes::new(caps, d).is_ok()
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_row(
    gpu: &Gpu,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    step: &Tensor,
    dims: &Dims,
    scale: f32,
    causal: bool,
    threads: Option<usize>,
    chunks: Option<usize>,
    xq_out: Option<&Tensor>,
) -> Result<Dispatch> {
    let d = dims.d;
    let ch = chunks.unwrap_or_else(|| chunks_wanted(d));
    if !(1..=MAX_CHUNKS).contains(&ch) {
        return Err(shape_err!(
            "attention: one-pass decode takes 1..={MAX_CHUNKS} workgroups per row, not {ch}"
        ));
    }
    let lanes = RowLanes::new(&gpu.caps, d)
        .map_err(|why| DriftError::Unsupported(format!("attention: one-pass decode {why}")))?;
    let nt = lanes.threads(&gpu.caps, d, threads);
    if let Some(x) = xq_out {
        // The last workgroup of a row quantizes it: whole 32-element blocks per head, 8 lanes each.
        if ch < 2 || !d.is_multiple_of(32) || !lanes.s.is_multiple_of(8) || dims.b * dims.lq != 1 {
            return Err(DriftError::Unsupported(format!(
                "attention: x quantized for the next product needs one query row, head dims of whole                  32-element blocks, subgroups of a multiple of 8 and 2+ workgroups per row (here                  {} rows, D = {d}, subgroups of {}, {ch} per row)",
                dims.b * dims.lq,
                lanes.s
            )));
        }
        check_buffer(x, dims.hq * d)?;
    }
    let sg_merge = nt / lanes.s <= lanes.s && sg_merge_wanted();
    let tag = dtype_tag(q, k, out);
    let spec = KernelSpec::new(
        format!(
            "attention_decode_row_d{d}_{tag}{}_t{nt}{}{}",
            if causal { "_causal" } else { "" },
            if sg_merge { "" } else { "_wm" },
            if ch > 1 {
                format!("_ch{ch}")
            } else {
                String::new()
            },
        ) + if xq_out.is_some() { "_xqo" } else { "" },
        SOURCE,
        "main",
    )
    .defines(io_defines(q, k, v, out))
    .define("OV", flag(vec4_ok(out)))
    .define("D", d)
    .define("S", lanes.s)
    .define("NT", nt)
    .define("LG", lanes.lg)
    .define("CAUSAL", flag(causal))
    .define("SGMERGE", flag(sg_merge))
    .define("CH", ch)
    .define("CHUNKS", flag(ch > 1))
    .define("SKIP", flag(skip_wanted()))
    .define("XQA", flag(xq_out.is_some()))
    .defines(row_bodies(&lanes));
    let kernel = gpu.kernel(&spec)?;
    let rows = dims.b * dims.lq * dims.hq;
    let params = [
        dims.lq as u32,
        dims.lkv as u32,
        dims.hq as u32,
        dims.hkv as u32,
        rows as u32,
        scale.to_bits(),
    ];
    let flops = 4.0 * (dims.b * dims.hq * d) as f64 * dims.visible_pairs(causal);
    // With chunks: the rows' arrival counts (zero, as the kernel leaves them) and their shares.
    let scratch;
    let mut tensors = vec![q, k, v, step, out];
    if ch > 1 {
        let words = rows + rows * ch * (d + 2);
        scratch = gpu.arrival_scratch("attention row shares", words)?;
        tensors.push(&scratch);
    }
    tensors.extend(xq_out);
    gpu.dispatch(
        &kernel,
        &params,
        &tensors,
        grid((rows * ch) as u32, gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops,
            bytes: (q.byte_len() + k.byte_len() + v.byte_len() + out.byte_len()) as f64,
        },
    )
}

/// The generated blocks of the shader (see its header): every private name indexed by a constant. A
/// tile's V loads go out with its K loads (one memory round trip per tile): issuing them after the
/// scores was slower at every KV length on the H200 (BENCHMARKS.md, 2026-11-30 fifth session).
fn row_bodies(l: &RowLanes) -> Vec<(&'static str, String)> {
    let (lg, cv) = (l.lg, l.cv);
    // Key i of the lane's group, its vec4 column set cc.
    let k_at = |i: usize, cc: usize| {
        format!(
            "load_k(kb + min(g0 + {i}u, last) * stride + {}u)",
            4 * lg * cc
        )
    };
    let v_at = |i: usize, cc: usize| {
        format!(
            "load_v(vb + min(g0 + {i}u, last) * stride + {}u)",
            4 * lg * cc
        )
    };
    let qregs = unrolled(cv, |cc| {
        format!("let qc{cc} = load_q(qb + {}u) * p.scale;", 4 * lg * cc)
    });
    let acc_decl = unrolled(cv, |cc| format!("var acc{cc} = vec4<f32>(0.0);"));
    let loads = unrolled(lg, |i| {
        (0..cv)
            .map(|cc| {
                format!(
                    "let kr{i}_{cc} = {}; let vr{i}_{cc} = {};",
                    k_at(i, cc),
                    v_at(i, cc)
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    });
    // Partial dots, then the reduce-scatter: at distance o a lane keeps the half of its values whose
    // index has bit o equal to its own lane's, adding the partner's copy of that half.
    let mut score = unrolled(lg, |i| {
        let dots: Vec<String> = (0..cv)
            .map(|cc| format!("dot(qc{cc}, kr{i}_{cc})"))
            .collect();
        format!("var v{i} = {};", dots.join(" + "))
    });
    let mut o = lg / 2;
    while o >= 1 {
        let body: String = (0..o)
            .map(|i| {
                format!(
                    " {{ let keep = select(v{i}, v{j}, hi); let send = select(v{j}, v{i}, hi); \
                     v{i} = keep + subgroupShuffleXor(send, {o}u); }}",
                    j = i + o
                )
            })
            .collect();
        score.push_str(&format!("\n        {{ let hi = (c & {o}u) != 0u;{body} }}"));
        o /= 2;
    }
    let mut pv = unrolled(cv, |cc| format!("acc{cc} *= alpha;"));
    pv.push('\n');
    pv.push_str(&unrolled(lg, |i| {
        let acc: String = (0..cv)
            .map(|cc| format!(" acc{cc} += pu * vr{i}_{cc};"))
            .collect();
        format!("{{ let pu = subgroupShuffle(pj, kg * LG + {i}u);{acc} }}")
    }));
    let acc_store = unrolled(cv, |cc| {
        format!("acc_s[(sg * KGL + kg) * DC + c + {}u] = acc{cc};", lg * cc)
    });
    vec![
        ("QREGS", qregs),
        ("ACC_DECL", acc_decl),
        ("LOADS", loads),
        ("SCORE", score),
        ("PV", pv),
        ("ACC_STORE", acc_store),
    ]
}

/// `DRIFT_ATTENTION_SKIP=1`: a measurement build (wrong results) whose decode attention returns at
/// once, so a model's floor without it gives the attention's cost in place.
fn skip_wanted() -> bool {
    std::env::var_os("DRIFT_ATTENTION_SKIP").is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_programs_deal_keys_over_more_workgroups_as_the_cache_grows() {
        assert_eq!(long_row_chunks(2048), 4);
        assert_eq!(long_row_chunks(8192), 4);
        assert_eq!(long_row_chunks(16384), 8);
        assert_eq!(long_row_chunks(32768), 16);
        assert_eq!(long_row_chunks(131072), 16);
    }
}
