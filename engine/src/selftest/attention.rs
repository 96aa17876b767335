//! Checks for the attention kernels: causal and not, grouped-query heads, cross-attention, decode
//! steps served by one prebuilt dispatch (kv_len and q_pos0 changed between runs), prefill after a
//! cache prefix, head dims 32..160, f16 K/V under f32 q/out and all-f16, views at offsets (vector and
//! scalar loads), every variant and both row-max reductions. K/V rows past kv_len are NaN, so a read
//! of one shows up in the output.
//!
//! The cooperative-matrix variant (`Auto`'s prefill wherever the device has it) runs [`coop_cases`]
//! on devices that have it; [`coop_emulated_checks`] runs the same cases through the emulated kernel
//! on any f16 device, which is how the coop algorithm is tested on lavapipe (on NVIDIA the emulated
//! build takes minutes to compile, so it runs there only with `DRIFT_SELFTEST_COOP_ATTENTION=1`).
//! `DRIFT_SELFTEST_COOP_ATTENTION=only` / `only_real` runs the cooperative cases alone (with / without
//! the emulated control), `stages` / `stages_real` the stage probes instead (`attention_stages`).

use super::attention_stages::{DIMS as STAGE_DIMS, coop_stage_checks};
use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::attention::{AttentionOptions, AttentionVariant, PrefillTile, attention};
use crate::kernels::attention_coop::CoopTile;
use crate::kernels::matmul::coop_available;
use crate::memory::Category;
use crate::reference::attention::{self as r, Dims};
use crate::tensor::{DType, Tensor};

/// One attention configuration; run for one or more (kv_len, q_pos0) steps.
#[derive(Clone, Debug)]
pub struct Case {
    pub batch: usize,
    pub q_len: usize,
    /// K/V rows allocated (the cache's capacity).
    pub kv_max: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub scale: Option<f32>,
    pub q_dtype: DType,
    pub kv_dtype: DType,
    pub out_dtype: DType,
    pub variant: AttentionVariant,
    pub subgroups: Option<bool>,
    pub splits: Option<usize>,
    pub tile: Option<PrefillTile>,
    pub coop_tile: Option<CoopTile>,
    /// [`AttentionOptions::row_threads`].
    pub row_threads: Option<usize>,
    /// [`AttentionOptions::row_chunks`].
    pub row_chunks: Option<usize>,
    /// Element offsets of q, k/v and out inside larger buffers (views).
    pub q_offset: usize,
    pub kv_offset: usize,
    pub out_offset: usize,
    /// (kv_len, q_pos0) per run of the same prebuilt dispatches.
    pub steps: Vec<(usize, usize)>,
}

impl Case {
    fn new(b: usize, lq: usize, lkv: usize, hq: usize, hkv: usize, d: usize, causal: bool) -> Case {
        Case {
            batch: b,
            q_len: lq,
            kv_max: lkv,
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
            causal,
            scale: None,
            q_dtype: DType::F32,
            kv_dtype: DType::F32,
            out_dtype: DType::F32,
            variant: AttentionVariant::Auto,
            subgroups: None,
            splits: None,
            tile: None,
            coop_tile: None,
            row_threads: None,
            row_chunks: None,
            q_offset: 0,
            kv_offset: 0,
            out_offset: 0,
            steps: vec![(lkv, 0)],
        }
    }

    fn dtypes(self, q: DType, kv: DType, out: DType) -> Case {
        Case {
            q_dtype: q,
            kv_dtype: kv,
            out_dtype: out,
            ..self
        }
    }

    fn variant(self, variant: AttentionVariant) -> Case {
        Case { variant, ..self }
    }

    fn steps(self, steps: &[(usize, usize)]) -> Case {
        Case {
            steps: steps.to_vec(),
            ..self
        }
    }
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    use AttentionVariant::{Decode, Prefill};
    let f16 = gpu.caps.f16;
    let (f, h) = (DType::F32, DType::F16);
    let mut cases = vec![
        // Grouped-query causal self-attention, 17 rows: odd against every tile size.
        Case::new(1, 17, 17, 4, 2, 32, true),
        Case::new(1, 17, 17, 4, 2, 32, true).variant(Decode),
        // Non-causal, 3 heads, D = 40 (scalar output columns), batch 2.
        Case::new(2, 33, 33, 3, 3, 40, false),
        // Stable Diffusion cross-attention: 77 text tokens.
        Case::new(2, 19, 77, 2, 2, 40, false),
        Case::new(2, 19, 77, 2, 2, 40, false).variant(Decode),
        // Decode: one dispatch sequence, kv_len growing; K/V capacity 1024, NaN past kv_len.
        Case::new(1, 1, 1024, 8, 2, 64, true).steps(&[
            (1, 0),
            (5, 4),
            (300, 299),
            (1000, 999),
            (0, 0),
        ]),
        // Few splits: each split walks many tiles.
        Case {
            splits: Some(3),
            ..Case::new(1, 1, 1024, 8, 2, 64, true).steps(&[(1000, 999), (33, 32)])
        },
        Case::new(1, 1, 1024, 8, 2, 64, true)
            .variant(Prefill)
            .steps(&[(300, 299), (2, 1), (0, 0)]),
        // Prefill continuing after a 20-token cache prefix (both variants).
        Case::new(1, 7, 40, 4, 2, 64, true).steps(&[(27, 20)]),
        Case::new(1, 7, 40, 4, 2, 64, true)
            .variant(Prefill)
            .steps(&[(27, 20)]),
        // Larger head dims; a steep softmax (scale 1) to stress the running-max rescaling.
        Case::new(1, 9, 20, 2, 1, 128, true).steps(&[(20, 11)]),
        Case {
            scale: Some(1.0),
            ..Case::new(1, 9, 20, 2, 1, 128, true)
                .variant(Decode)
                .steps(&[(20, 11)])
        },
        Case::new(1, 12, 12, 2, 2, 80, false),
        Case::new(1, 12, 12, 2, 2, 80, false).variant(Prefill),
        Case::new(1, 5, 9, 1, 1, 160, false),
        Case::new(1, 5, 9, 1, 1, 160, false).variant(Prefill),
        Case::new(1, 1, 50, 4, 4, 96, true).steps(&[(50, 49)]),
        Case::new(1, 3, 50, 4, 4, 96, true)
            .variant(Prefill)
            .steps(&[(50, 47)]),
        // Views: a q offset that keeps vec4 loads, K/V and out offsets that force scalar ones.
        Case {
            q_offset: 4,
            kv_offset: 3,
            out_offset: 6,
            ..Case::new(1, 10, 21, 4, 1, 32, true).steps(&[(21, 11)])
        },
        Case {
            q_offset: 8,
            kv_offset: 12,
            out_offset: 4,
            ..Case::new(1, 1, 64, 4, 1, 32, true)
                .variant(Decode)
                .steps(&[(40, 39)])
        },
    ];
    // Tile shapes other devices pick (where this one's workgroup memory allows).
    for (ny, tk) in [(8, 2), (16, 4), (4, 1)] {
        let tile = PrefillTile { ny, tk };
        if tile.shared_bytes(40, false) <= gpu.caps.max_workgroup_storage as usize {
            cases.push(Case {
                tile: Some(tile),
                ..Case::new(1, 21, 45, 4, 2, 40, true).steps(&[(45, 24)])
            });
        }
    }
    if gpu.caps.subgroup {
        // The workgroup-memory reduction on a device that would pick subgroups.
        cases.push(Case {
            subgroups: Some(false),
            ..Case::new(1, 17, 17, 4, 2, 32, true)
        });
        cases.push(Case {
            subgroups: Some(false),
            ..Case::new(2, 19, 77, 2, 2, 40, false)
        });
        cases.push(Case {
            subgroups: Some(false),
            ..Case::new(1, 1, 1024, 8, 2, 64, true).steps(&[(300, 299)])
        });
    }
    if f16 {
        cases.extend([
            Case::new(1, 17, 17, 4, 2, 32, true).dtypes(f, h, f),
            Case::new(1, 1, 1024, 8, 2, 64, true)
                .dtypes(f, h, f)
                .steps(&[(5, 4), (1000, 999)]),
            Case::new(2, 33, 33, 3, 3, 40, false).dtypes(h, h, h),
            Case::new(1, 1, 1024, 8, 2, 64, true)
                .dtypes(h, h, h)
                .steps(&[(300, 299)]),
            Case {
                kv_offset: 3,
                out_offset: 2,
                ..Case::new(1, 7, 40, 4, 2, 64, true)
                    .dtypes(h, h, h)
                    .variant(Prefill)
                    .steps(&[(27, 20)])
            },
        ]);
    }
    cases.extend(row_cases(gpu));
    let coop_env = std::env::var("DRIFT_SELFTEST_COOP_ATTENTION").unwrap_or_default();
    if coop_env == "stages" || coop_env == "stages_real" {
        // The stage probes alone: the real kernel's, then (unless `stages_real`: NVIDIA's compiler
        // takes minutes over the emulated build) the emulated control's.
        let mut out = Vec::new();
        if coop_available(&gpu.caps) {
            out.extend(coop_stage_checks(
                gpu,
                rng,
                AttentionVariant::Coop,
                &STAGE_DIMS,
            )?);
        }
        if gpu.caps.f16 && coop_env == "stages" {
            out.extend(coop_stage_checks(
                gpu,
                rng,
                AttentionVariant::CoopEmulated,
                &STAGE_DIMS,
            )?);
        }
        return Ok(out);
    }
    if coop_env == "only" || coop_env == "only_real" {
        // The cooperative cases alone (bisection runs on the target GPU).
        cases.clear();
    }
    // The real kernel where the device has it, and (only when asked) the emulated one as its control.
    if coop_available(&gpu.caps) {
        cases.extend(coop_cases(AttentionVariant::Coop));
    }
    if (coop_env == "1" || coop_env == "only") && gpu.caps.f16 {
        cases.extend(coop_cases(AttentionVariant::CoopEmulated));
    }
    let verbose = coop_env == "only" || coop_env == "only_real";
    let mut out = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let started = std::time::Instant::now();
        if verbose {
            eprintln!("case {i}: {case:?}");
        }
        let checks = check(gpu, rng, case);
        if verbose {
            // Printed as they come: a hung case still leaves the earlier results.
            eprintln!("case {i}: {:.2} s", started.elapsed().as_secs_f64());
            match &checks {
                Ok(checks) => checks.iter().for_each(|c| eprintln!("{c}")),
                Err(e) => eprintln!("case {i}: error: {e}"),
            }
        }
        out.extend(checks?);
    }
    Ok(out)
}

/// The one-pass decode variant (one workgroup per query row), at the head dims this device runs it
/// with: decode steps of one prebuilt dispatch (NaN K/V past kv_len), key counts that leave subgroups
/// idle or with partial tiles, several query rows (causal limits per row), a steep softmax, grouped
/// heads as the LLMs have them, views, and f16.
fn row_cases(gpu: &Gpu) -> Vec<Case> {
    use AttentionVariant::DecodeRow;
    let (f, h) = (DType::F32, DType::F16);
    let mut cases = vec![
        Case::new(1, 1, 1024, 8, 2, 64, true)
            .variant(DecodeRow)
            .steps(&[(1, 0), (5, 4), (300, 299), (1000, 999), (0, 0)]),
        Case::new(1, 17, 17, 4, 2, 32, true).variant(DecodeRow),
        Case::new(2, 3, 77, 2, 2, 32, false).variant(DecodeRow),
        Case {
            scale: Some(1.0),
            ..Case::new(1, 9, 20, 2, 1, 128, true)
                .variant(DecodeRow)
                .steps(&[(20, 11)])
        },
        Case::new(1, 2, 300, 4, 2, 256, true)
            .variant(DecodeRow)
            .steps(&[(300, 298), (37, 35)]),
        Case::new(1, 1, 700, 9, 3, 64, true)
            .variant(DecodeRow)
            .steps(&[(640, 639), (33, 32)]),
        Case {
            q_offset: 8,
            kv_offset: 12,
            out_offset: 4,
            ..Case::new(1, 1, 64, 4, 1, 32, true)
                .variant(DecodeRow)
                .steps(&[(40, 39)])
        },
        Case {
            q_offset: 2,
            kv_offset: 3,
            out_offset: 6,
            ..Case::new(1, 1, 64, 4, 1, 32, true)
                .variant(DecodeRow)
                .steps(&[(63, 62)])
        },
    ];
    if gpu.caps.f16 {
        cases.extend([
            Case::new(1, 1, 700, 32, 8, 128, true)
                .dtypes(h, h, h)
                .variant(DecodeRow)
                .steps(&[(640, 639), (129, 128)]),
            Case::new(1, 1, 1024, 8, 2, 64, true)
                .dtypes(f, h, f)
                .variant(DecodeRow)
                .steps(&[(5, 4), (1000, 999)]),
        ]);
    }
    cases.retain(|c| crate::kernels::attention_row::row_available(&gpu.caps, c.head_dim));
    // Again with each row's tiles dealt over several workgroups (3: uneven shares and some with no
    // tile at short lengths; 16 at the long ones), run over several steps so the arrival counts
    // must come back to zero between dispatches.
    let chunked: Vec<Case> = cases
        .iter()
        .map(|c| Case {
            row_chunks: Some(if c.kv_max >= 640 { 16 } else { 3 }),
            ..c.clone()
        })
        .collect();
    cases.extend(chunked);
    // Again with one subgroup per lane of a subgroup (S x S invocations): the shares then meet in
    // subgroup reductions on any device (lavapipe's default 512 invocations are 64 subgroups of 8).
    let s = gpu.caps.subgroup_max_size as usize;
    let square = (s * s).min(gpu.caps.max_invocations_per_workgroup as usize);
    let again: Vec<Case> = cases
        .iter()
        .map(|c| Case {
            row_threads: Some(square),
            ..c.clone()
        })
        .collect();
    cases.extend(again);
    cases
}

/// [`coop_cases`] through the emulated cooperative kernel (any device with f16).
pub fn coop_emulated_checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if gpu.caps.f16 {
        for case in &coop_cases(AttentionVariant::CoopEmulated) {
            out.extend(check(gpu, rng, case)?);
        }
    }
    Ok(out)
}

/// Awkward shapes for the cooperative kernel (f16 q/k/v): rows not a multiple of the 64-row tile,
/// kv_len below the cache's rows, causal prefill after a prefix, GQA 4:1, head dims 32..256 (padded
/// to 16 in the kernel), batch 2, f32 and f16 outputs, scalar-loaded views, small tiles, a steep
/// softmax whose running max moves by more than the lazy-rescale threshold, an empty cache.
pub fn coop_cases(variant: AttentionVariant) -> Vec<Case> {
    let (f, h) = (DType::F32, DType::F16);
    let c = |b, lq, lkv, hq, hkv, d, causal| {
        Case::new(b, lq, lkv, hq, hkv, d, causal)
            .dtypes(h, h, h)
            .variant(variant)
    };
    let mut cases = vec![
        // GQA 4:1, 68 rows per KV head, D = 40 (SD's head dim, padded to 48).
        c(1, 17, 17, 4, 1, 40, true),
        // Batch 2, kv_len 40 of 45 rows, f32 output.
        c(2, 33, 45, 2, 2, 64, false)
            .dtypes(h, h, f)
            .steps(&[(40, 0)]),
        // Causal prefill after a 29-token prefix, GQA 4:1, D = 80; then an empty cache.
        c(1, 21, 60, 8, 2, 80, true).steps(&[(50, 29), (0, 0)]),
        // Several query and key tiles, D = 128.
        c(1, 70, 70, 2, 2, 128, true),
        // Scale 4: scores spread over tens, so rows' maxima jump between key tiles (rescales).
        Case {
            scale: Some(4.0),
            ..c(1, 40, 200, 2, 1, 64, true).steps(&[(200, 160)])
        },
        Case {
            scale: Some(4.0),
            ..c(2, 19, 150, 2, 2, 40, false).dtypes(h, h, f)
        },
        // Stable Diffusion cross-attention (77 text tokens), f32 output.
        c(2, 19, 77, 2, 2, 40, false).dtypes(h, h, f),
        // Large head dims (the smallest tiles).
        c(1, 5, 9, 1, 1, 160, false),
        c(1, 5, 9, 1, 1, 256, true).steps(&[(9, 4)]),
        // Views: q, K/V and out offsets that force scalar loads and stores.
        Case {
            q_offset: 2,
            kv_offset: 3,
            out_offset: 6,
            ..c(1, 10, 21, 4, 1, 32, true).steps(&[(21, 11)])
        },
        // Forced small tiles: 2 subgroups x 16 keys, 1 subgroup x 32 keys.
        Case {
            coop_tile: Some(CoopTile {
                subgroups: 2,
                keys: 16,
            }),
            ..c(1, 21, 60, 8, 2, 80, true).steps(&[(50, 29)])
        },
        Case {
            coop_tile: Some(CoopTile {
                subgroups: 1,
                keys: 32,
            }),
            ..c(2, 33, 45, 2, 2, 40, false).steps(&[(45, 0)])
        },
        // 8 subgroups (128 query rows), 16 keys: 3 query tiles (one partial) of 300 rows, 10 key
        // tiles (D = 32 fits lavapipe's 32 KiB emulated).
        Case {
            coop_tile: Some(CoopTile {
                subgroups: 8,
                keys: 16,
            }),
            ..c(1, 150, 150, 2, 1, 32, false)
        },
    ];
    if variant == AttentionVariant::Coop {
        // SD's D = 40 on the 8-subgroup tile (33 KiB: real devices only).
        cases.push(Case {
            coop_tile: Some(CoopTile {
                subgroups: 8,
                keys: 16,
            }),
            ..c(2, 70, 90, 2, 2, 40, false)
        });
    }
    cases
}

/// A fresh buffer and a `shape` view `offset` elements into it.
fn view(
    gpu: &Gpu,
    label: &str,
    shape: &[usize],
    offset: usize,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let n: usize = shape.iter().product();
    let full = gpu.tensor(label, &[offset + n], dtype, Category::Activations)?;
    let view = full.view(offset, shape)?;
    Ok((full, view))
}

/// Writes `values` into the view at `offset` of `full`, NaN before it (views may start at offsets
/// a queue write cannot, so the whole buffer is written).
fn write_at(gpu: &Gpu, full: &Tensor, offset: usize, values: &[f32]) -> Result<()> {
    let mut all = vec![f32::NAN; offset];
    all.extend_from_slice(values);
    gpu.write_tensor_f32(full, &all)
}

/// Builds the dispatches once and runs them for every step of the case, one check per step.
pub fn check(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Vec<Check>> {
    let d = c.head_dim;
    let q_shape = [c.batch, c.q_len, c.q_heads, d];
    let kv_shape = [c.batch, c.kv_max, c.kv_heads, d];
    let (q_full, q) = view(gpu, "q", &q_shape, c.q_offset, c.q_dtype)?;
    let (k_full, k) = view(gpu, "k", &kv_shape, c.kv_offset, c.kv_dtype)?;
    let (v_full, v) = view(gpu, "v", &kv_shape, c.kv_offset, c.kv_dtype)?;
    let (o_full, o) = view(gpu, "out", &q_shape, c.out_offset, c.out_dtype)?;
    let step = gpu.tensor("step", &[2], DType::U32, Category::Activations)?;
    let opts = AttentionOptions {
        scale: c.scale,
        causal: c.causal,
        variant: c.variant,
        subgroups: c.subgroups,
        splits: c.splits,
        prefill_tile: c.tile,
        coop_tile: c.coop_tile,
        coop_debug: None,
        row_threads: c.row_threads,
        row_chunks: c.row_chunks,
    };
    let mut prog = Program::new();
    prog.extend(attention(gpu, &q, &k, &v, &o, &step, &opts)?);
    let kernel = prog
        .dispatches
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let scale = c.scale.unwrap_or(1.0 / (d as f32).sqrt()) as f64;
    let dims = Dims {
        batch: c.batch,
        q_len: c.q_len,
        kv_max: c.kv_max,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: d,
    };
    let row = c.kv_heads * d;
    let mut checks = Vec::new();
    for &(kv_len, q_pos0) in &c.steps {
        // Fresh inputs each step; K/V rows at and past kv_len are NaN.
        let qv = random(rng, q.numel(), -3.0, 3.0, c.q_dtype);
        let mut kv = [
            random(rng, k.numel(), -1.0, 1.0, c.kv_dtype),
            random(rng, v.numel(), -1.0, 1.0, c.kv_dtype),
        ];
        for x in &mut kv {
            for (i, val) in x.iter_mut().enumerate() {
                if (i / row) % c.kv_max >= kv_len {
                    *val = f32::NAN;
                }
            }
        }
        write_at(gpu, &q_full, c.q_offset, &qv)?;
        write_at(gpu, &k_full, c.kv_offset, &kv[0])?;
        write_at(gpu, &v_full, c.kv_offset, &kv[1])?;
        gpu.write_tensor_bytes(&step, bytemuck::cast_slice(&[kv_len as u32, q_pos0 as u32]))?;
        gpu.poison(&o_full)?;
        prog.run(gpu)?;
        let want = r::attention(&qv, &kv[0], &kv[1], dims, kv_len, q_pos0, scale, c.causal);
        // Outputs are convex combinations of v in [-1, 1]: f32 errors come from the f32 scores
        // (D-long dot products) and exp; f16 outputs are bounded by their rounding.
        let coop = matches!(prog.dispatches[0].name.split('_').nth(1), Some("coop"));
        let atol = match c.out_dtype {
            // The coop kernels round the probabilities to f16 (relative 2^-11) before P V: the
            // output, a convex combination of v in [-1, 1], moves by at most about 2 * 2^-11.
            _ if coop => 1e-3,
            DType::F16 => 2e-4,
            _ => 2e-6 + 2e-7 * (d as f64).sqrt() * scale.max(0.125) * 8.0,
        };
        let got = gpu.read_f32(&o)?;
        checks.push(compare(
            format!(
                "{kernel} B{} Lq{} Lkv{}/{} H{}/{} D{d} pos{q_pos0}{}{}{}{}{}",
                c.batch,
                c.q_len,
                kv_len,
                c.kv_max,
                c.q_heads,
                c.kv_heads,
                if c.causal { " causal" } else { "" },
                c.splits.map(|s| format!(" splits{s}")).unwrap_or_default(),
                if c.subgroups == Some(false) {
                    " wg-reduce"
                } else {
                    ""
                },
                c.tile
                    .map(|t| format!(" tile{}x{}", t.ny, t.tk))
                    .or(c
                        .coop_tile
                        .map(|t| format!(" tile{}x{}", t.query_rows(), t.keys)))
                    .unwrap_or_default(),
                if c.q_offset + c.kv_offset + c.out_offset > 0 {
                    format!(" views@{}/{}/{}", c.q_offset, c.kv_offset, c.out_offset)
                } else {
                    String::new()
                }
            ),
            &got,
            &want,
            atol,
            store_rtol(c.out_dtype).max(1e-5),
        ));
    }
    Ok(checks)
}
