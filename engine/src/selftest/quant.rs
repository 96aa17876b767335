//! Checks for the quantized-weight kernels, per block type: GPU dequantization (exact: every decoded
//! value is a product that f32 holds exactly, plus at most one rounding, as in the reference) and
//! matrix-vector products (f32 accumulation against the f64 product of the dequantized weights), on
//! random valid blocks, with poisoned outputs, odd N, K of several blocks, batch 1, 3 and 8, bias,
//! views at offsets (weights starting mid-word), row shards, both reductions and f16 activations; and
//! the fused decode prologues / epilogues (RMSNorm, SwiGLU, residual) on Q8_0, Q4_0, Q4_K and Q6_K, the
//! GLU epilogue on the integer-dot-product kernel's types (its RoPE epilogue: [`super::qkv_rope`]).
//! The CPU dequantization itself is checked against gguf-py's in the tests (fixtures), and
//! [`fixture_checks`] runs the GPU kernels on those fixtures.

use rand::Rng as _;

use super::matvec::{Fuse, FuseTensors, Residual, fused_atol, glu_reference};
use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matvec::{MatvecOptions, MatvecVariant};
use crate::kernels::quant::{QUANT_TYPES, QuantTuning, dequantize, matvec_quant_tuned, uses_dp4a};
use crate::memory::Category;
use crate::reference::quant as r;
use crate::tensor::{DType, Layout};

/// Random valid blocks of `dtype`: random quant bytes, finite model-like f16 scales.
pub fn random_blocks(rng: &mut Rng, dtype: DType, blocks: usize) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let mut out: Vec<u8> = (0..blocks * bb).map(|_| rng.random()).collect();
    let mut f16_at = |b: &mut [u8], at: usize, lo: f32, hi: f32, signed: bool| {
        let mut v = rng.random_range(lo..hi);
        if signed && rng.random::<bool>() {
            v = -v;
        }
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
    };
    for b in out.chunks_exact_mut(bb) {
        match dtype {
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 => f16_at(b, 0, 0.002, 0.05, true),
            DType::Q4_1 | DType::Q5_1 => {
                f16_at(b, 0, 0.002, 0.05, false);
                f16_at(b, 2, 0.0, 0.5, true);
            }
            DType::Q4K | DType::Q5K => {
                f16_at(b, 0, 0.0005, 0.01, false);
                f16_at(b, 2, 0.0005, 0.02, false);
            }
            DType::Q6K => f16_at(b, 208, 0.0002, 0.004, true),
            _ => {}
        }
    }
    out
}

/// One matvec check.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub dtype: DType,
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    pub x_dtype: DType,
    pub out_dtype: DType,
    /// The weight is rows `w_rows_before..` of a larger one (a view that may start mid-word).
    pub w_rows_before: usize,
    /// Element offset of `x` in a larger buffer (not a multiple of 4 forces scalar loads).
    pub x_offset: usize,
    pub variant: MatvecVariant,
    pub max_shard_bytes: Option<u64>,
    /// [`MatvecOptions::max_stage_bytes`].
    pub max_stage_bytes: Option<u32>,
    pub tuning: QuantTuning,
    pub fuse: Fuse,
}

impl Case {
    pub fn new(dtype: DType, batch: usize, n: usize, k: usize, variant: MatvecVariant) -> Case {
        Case {
            dtype,
            batch,
            n,
            k,
            bias: false,
            x_dtype: DType::F32,
            out_dtype: DType::F32,
            w_rows_before: 0,
            x_offset: 0,
            variant,
            max_shard_bytes: None,
            max_stage_bytes: None,
            tuning: QuantTuning::default(),
            fuse: Fuse::default(),
        }
    }
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let sg = if gpu.caps.subgroup {
        MatvecVariant::Subgroup
    } else {
        MatvecVariant::Workgroup
    };
    for dtype in QUANT_TYPES {
        let be = dtype.block_elems();
        // Batch rows, reductions and f16 activations are the same code for every type: all their
        // combinations run on one 32-element type and one K-quant (with mins), every decoder on fewer
        // (lavapipe compiles each specialisation in ~0.1-1 s).
        let full = matches!(dtype, DType::Q4_0 | DType::Q4K);
        // Several blocks (and, for 32-element blocks, a count that is no multiple of the lanes).
        let k = if be == 32 { 7 * 32 } else { 2 * 256 };
        let odd_k = if be == 32 { 3 * 32 } else { 256 };
        let c1 = Case::new(dtype, 1, 37, k, sg);
        let c3 = Case {
            batch: 3,
            bias: true,
            x_offset: 3,
            ..Case::new(dtype, 3, 37, k, MatvecVariant::Workgroup)
        };
        out.push(check_matvec(gpu, rng, &c1)?);
        out.push(check_matvec(gpu, rng, &c3)?);
        // The types the integer-dot-product kernel takes: the float-decoding kernel at batch 1 too.
        if matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0) {
            let float = QuantTuning {
                dp4a: false,
                ..QuantTuning::default()
            };
            out.push(check_matvec(
                gpu,
                rng,
                &Case {
                    tuning: float,
                    ..c1
                },
            )?);
        }
        if full && gpu.caps.subgroup {
            out.push(check_matvec(
                gpu,
                rng,
                &Case {
                    variant: MatvecVariant::Workgroup,
                    ..c1
                },
            )?);
            out.push(check_matvec(gpu, rng, &Case { variant: sg, ..c3 })?);
        }
        // Rows of an odd number of 2-byte-aligned blocks start mid-word every other row; small shards.
        out.push(check_matvec(
            gpu,
            rng,
            &Case {
                w_rows_before: 1,
                max_shard_bytes: Some(4 * dtype.bytes_for(odd_k)? + 256),
                tuning: QuantTuning {
                    rows_per_team: if dtype.block_elems() == 32 { 4 } else { 1 },
                    chunks_per_step: 1,
                    trusted: dtype != DType::Q4_0,
                    dp4a: true,
                    row_groups: 1,
                    prefetch: false,
                    k_teams: 0,
                    x_vec4: false,
                    k_workgroups: 1,
                },
                ..Case::new(dtype, 1, 23, odd_k, MatvecVariant::Auto)
            },
        )?);
        // What a GPU runs by default (CPU devices default to one chunk in flight), with K long enough
        // that lanes of a 32-wide (or 8-wide) team run whole steps of U chunks and a remainder.
        let u = if be == 32 { 4 } else { 2 };
        let long_k = if be == 32 {
            (u * 32 + 13) * 32
        } else {
            9 * 256
        };
        if full || matches!(dtype, DType::Q8_0 | DType::Q5K) {
            out.push(check_matvec(
                gpu,
                rng,
                &Case {
                    tuning: QuantTuning {
                        chunks_per_step: u as u32,
                        ..QuantTuning::default()
                    },
                    ..Case::new(dtype, 1, 5, long_k, MatvecVariant::Auto)
                },
            )?);
        }
        if full {
            out.push(check_matvec(
                gpu,
                rng,
                &Case {
                    bias: true,
                    tuning: QuantTuning {
                        rows_per_team: 2,
                        chunks_per_step: 2,
                        ..QuantTuning::default()
                    },
                    ..Case::new(
                        dtype,
                        8,
                        9,
                        if be == 32 { 37 * 32 } else { 5 * 256 },
                        MatvecVariant::Auto,
                    )
                },
            )?);
        }
        if gpu.caps.f16 && (full || dtype == DType::Q6K) {
            out.push(check_matvec(
                gpu,
                rng,
                &Case {
                    bias: true,
                    x_dtype: DType::F16,
                    out_dtype: DType::F16,
                    x_offset: 4,
                    ..Case::new(dtype, 2, 19, k, MatvecVariant::Auto)
                },
            )?);
        }
        if matches!(dtype, DType::Q8_0 | DType::Q4_0 | DType::Q4K | DType::Q6K) {
            for c in fused_cases(gpu, dtype, k, sg, full) {
                out.push(check_matvec(gpu, rng, &c)?);
            }
        }
        if matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0) && gpu.caps.subgroup {
            out.push(check_matvec(gpu, rng, &glu_case(gpu, dtype, k))?);
            if dtype == DType::Q4_0 {
                // Llama 3 8B's gate-up (28672 rows in 64-row workgroups) at its real size.
                out.push(check_matvec(
                    gpu,
                    rng,
                    &Case {
                        n: 28672,
                        ..glu_case(gpu, dtype, 4096)
                    },
                )?);
                // Its O with the residual in place (4096 rows, K split over 2 workgroups).
                let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
                out.push(check_matvec(
                    gpu,
                    rng,
                    &Case {
                        x_dtype: io,
                        fuse: Fuse {
                            residual: Residual::InPlace,
                            ..Fuse::default()
                        },
                        ..Case::new(dtype, 1, 4096, 4096, MatvecVariant::Auto)
                    },
                )?);
            }
            for c in dp4a_tuning_cases(gpu, dtype) {
                out.push(check_matvec(gpu, rng, &c)?);
            }
        }
        if matches!(dtype, DType::Q4_0 | DType::Q4K) {
            for c in staged_cases(gpu, dtype, sg) {
                out.push(check_matvec(gpu, rng, &c)?);
            }
        }
        out.push(check_dequantize(gpu, rng, dtype, 5, k, 0, DType::F32, 4)?);
        out.push(check_dequantize(
            gpu,
            rng,
            dtype,
            3,
            odd_k,
            1,
            DType::F16,
            2,
        )?);
        if full {
            out.push(check_dequantize(gpu, rng, dtype, 3, k, 0, DType::F16, 8)?);
        }
    }
    Ok(out)
}

/// The decode fusions on one block type (see [`super::matvec`]'s fused cases): the norm prologue
/// (QKV, gate-up), the residual in place (O), SwiGLU with the residual in place (down), at batch 1
/// with the default reduction and at batch 3 with the workgroup one and scalar x loads; with `more`,
/// an f16 norm weight at an odd offset with bias, a separate residual and row shards.
fn fused_cases(gpu: &Gpu, dtype: DType, k: usize, sg: MatvecVariant, more: bool) -> Vec<Case> {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let fuse = |norm, swiglu, residual| Fuse {
        norm,
        g_offset: 0,
        swiglu,
        residual,
        glu: false,
    };
    let c = |batch, variant, fuse| Case {
        fuse,
        ..Case::new(dtype, batch, 37, k, variant)
    };
    let wg = MatvecVariant::Workgroup;
    let mut cases = vec![
        c(1, sg, fuse(Some(DType::F32), false, Residual::None)),
        Case {
            x_dtype: io,
            ..c(1, sg, fuse(None, false, Residual::InPlace))
        },
        Case {
            x_dtype: io,
            ..c(1, sg, fuse(None, true, Residual::InPlace))
        },
        Case {
            x_offset: 3,
            ..c(3, wg, fuse(Some(DType::F32), false, Residual::None))
        },
        Case {
            x_dtype: io,
            x_offset: 3,
            ..c(3, wg, fuse(None, true, Residual::InPlace))
        },
    ];
    if more {
        cases.push(Case {
            bias: true,
            out_dtype: io,
            max_shard_bytes: Some(8 * dtype.bytes_for(k).unwrap_or(0) + 256),
            ..c(
                2,
                MatvecVariant::Auto,
                Fuse {
                    g_offset: 1,
                    ..fuse(Some(io), false, Residual::Separate)
                },
            )
        });
    }
    cases
}

/// The GLU epilogue on the integer-dot-product kernel (gate rows over up rows, 2 x 32 rows: whole
/// workgroups): with the norm prologue and bias (Q4_0, Q8_0), and without a prologue on io input (Q4_1).
fn glu_case(gpu: &Gpu, dtype: DType, k: usize) -> Case {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let norm = dtype != DType::Q4_1;
    let prologue = if norm {
        Fuse::norm(DType::F32)
    } else {
        Fuse::default()
    };
    Case {
        fuse: Fuse {
            glu: true,
            ..prologue
        },
        bias: norm,
        x_dtype: if norm { DType::F32 } else { io },
        out_dtype: io,
        ..Case::new(dtype, 1, 64, k, MatvecVariant::Auto)
    }
}

/// The integer-dot-product kernel's loop shapes: 2 and 4 blocks per row in flight, the first step's
/// loads issued before the pre-pass (prefetch), with K leaving a partial last step (and lanes past the
/// row's blocks), several row groups per team over a partial last workgroup, rows starting mid-word,
/// a norm prologue and the GLU epilogue (also over 64-row workgroups); rows split over several teams;
/// x's words in vec4 planes.
fn dp4a_tuning_cases(gpu: &Gpu, dtype: DType) -> Vec<Case> {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let tune = |r, rg, bu, pf| QuantTuning {
        rows_per_team: r,
        row_groups: rg,
        chunks_per_step: bu,
        prefetch: pf,
        k_teams: 1,
        ..QuantTuning::default()
    };
    let split = |r, kt, bu, pf| QuantTuning {
        k_teams: kt,
        ..tune(r, 1, bu, pf)
    };
    // K split over `kw` workgroups on top of a tuning.
    let kws = |kw, t: QuantTuning| QuantTuning {
        k_workgroups: kw,
        ..t
    };
    // 4 * 32 + 13 blocks: whole steps of 4 x 32 lanes and a remainder; 5 blocks: most lanes idle.
    let long_k = (4 * 32 + 13) * 32;
    let mut cases = vec![
        Case {
            tuning: tune(2, 2, 4, true),
            ..Case::new(dtype, 1, 71, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: tune(4, 1, 2, true),
            fuse: Fuse::norm(DType::F32),
            x_dtype: io,
            out_dtype: io,
            ..Case::new(dtype, 1, 37, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: tune(1, 4, 4, false),
            w_rows_before: 1,
            ..Case::new(dtype, 1, 45, 5 * 32, MatvecVariant::Auto)
        },
        Case {
            tuning: tune(1, 2, 1, true),
            w_rows_before: 1,
            ..Case::new(dtype, 1, 45, 5 * 32, MatvecVariant::Auto)
        },
        // Rows split over 2, 4 or 8 teams (slices of the blocks met in workgroup memory): a partial
        // last workgroup, one row per workgroup with empty slices, the norm prologue, prefetch with two
        // blocks in flight, and the GLU pairing over 16-row workgroups.
        Case {
            tuning: split(2, 2, 1, false),
            ..Case::new(dtype, 1, 71, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: split(1, 8, 1, false),
            w_rows_before: 1,
            ..Case::new(dtype, 1, 45, 5 * 32, MatvecVariant::Auto)
        },
        Case {
            tuning: split(4, 4, 1, false),
            fuse: Fuse::norm(DType::F32),
            x_dtype: io,
            out_dtype: io,
            ..Case::new(dtype, 1, 37, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: split(2, 4, 2, true),
            ..Case::new(dtype, 1, 29, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: split(4, 2, 1, false),
            ..glu_case(gpu, dtype, 7 * 32)
        },
        // x's words as 4 vec4 planes: plain, with the norm prologue and rows over several teams, GLU.
        Case {
            tuning: QuantTuning {
                x_vec4: true,
                ..tune(2, 2, 1, false)
            },
            ..Case::new(dtype, 1, 71, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: QuantTuning {
                x_vec4: true,
                ..split(4, 2, 2, true)
            },
            fuse: Fuse::norm(DType::F32),
            x_dtype: io,
            out_dtype: io,
            w_rows_before: 1,
            ..Case::new(dtype, 1, 37, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: QuantTuning {
                x_vec4: true,
                ..tune(4, 1, 1, false)
            },
            ..glu_case(gpu, dtype, 7 * 32)
        },
        // K split over workgroups (the last to finish adds the slices): uneven slices and a partial
        // last row set, the residual added in place (f16), empty slices (16 workgroups over 5 blocks),
        // with teams splitting each slice, two blocks in flight and prefetch, bias, the SwiGLU
        // prologue, the norm prologue (the slices' sums of squares meet too) and the GLU pairing
        // (run by the last workgroup).
        Case {
            tuning: kws(3, tune(4, 1, 1, false)),
            ..Case::new(dtype, 1, 71, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(4, tune(4, 1, 1, false)),
            fuse: Fuse {
                residual: Residual::InPlace,
                ..Fuse::default()
            },
            x_dtype: io,
            out_dtype: io,
            ..Case::new(dtype, 1, 37, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(16, tune(1, 2, 1, false)),
            w_rows_before: 1,
            ..Case::new(dtype, 1, 45, 5 * 32, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(2, split(2, 2, 2, true)),
            bias: true,
            ..Case::new(dtype, 1, 29, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(4, tune(4, 1, 1, false)),
            fuse: Fuse::swiglu_in_place(),
            x_dtype: io,
            out_dtype: io,
            ..Case::new(dtype, 1, 37, 7 * 32, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(4, tune(4, 1, 1, false)),
            fuse: Fuse::norm(DType::F32),
            x_dtype: io,
            out_dtype: io,
            ..Case::new(dtype, 1, 37, long_k, MatvecVariant::Auto)
        },
        Case {
            tuning: kws(3, tune(4, 2, 1, false)),
            out_dtype: DType::F32,
            ..glu_case(gpu, dtype, long_k)
        },
        // The default's 64-row workgroups of wide products (4 rows x 2 groups) under the GLU pairing.
        Case {
            tuning: tune(4, 2, 1, false),
            ..glu_case(gpu, dtype, 7 * 32)
        },
        // f32 out: silu(gate) * up over this K can pass f16's range.
        Case {
            tuning: tune(2, 2, 4, true),
            out_dtype: DType::F32,
            ..glu_case(gpu, dtype, long_k)
        },
    ];
    // Rows of whole groups of 8 blocks, where Q4_0's nibbles load as vectors (W4): at the weight's
    // start and one row in (288-byte rows keep the view on a 16-byte boundary), K split over
    // workgroups with the norm prologue, several blocks in flight with prefetch.
    let vec_k = 16 * 32;
    if dtype == DType::Q4_0 {
        cases.extend([
            Case::new(dtype, 1, 37, vec_k, MatvecVariant::Auto),
            Case {
                tuning: kws(2, tune(4, 1, 1, false)),
                fuse: Fuse::norm(DType::F32),
                x_dtype: io,
                out_dtype: io,
                w_rows_before: 1,
                ..Case::new(dtype, 1, 37, 3 * vec_k, MatvecVariant::Auto)
            },
            Case {
                tuning: tune(2, 2, 4, true),
                w_rows_before: 3,
                ..Case::new(dtype, 1, 71, 2 * vec_k, MatvecVariant::Auto)
            },
        ]);
    }
    cases
}

/// The staged input of the float-decoding kernel (one batch row with a prologue; Q4_0 with the
/// integer-dot-product kernel off): K past what the device's workgroup memory stages (the rest
/// computed per row), a 1 KiB staging limit (a long per-row tail) with both reductions, and staging
/// off.
fn staged_cases(gpu: &Gpu, dtype: DType, sg: MatvecVariant) -> Vec<Case> {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let be = dtype.block_elems();
    let past = (super::matvec::past_stage_limit(gpu) + 1).next_multiple_of(be);
    let norm = Fuse::norm(DType::F32);
    let swiglu = Fuse::swiglu_in_place();
    let c = |k, variant, x_dtype, fuse, max_stage_bytes| Case {
        x_dtype,
        fuse,
        max_stage_bytes,
        tuning: QuantTuning {
            dp4a: false,
            ..QuantTuning::default()
        },
        ..Case::new(dtype, 1, 9, k, variant)
    };
    let wg = MatvecVariant::Workgroup;
    vec![
        c(past, sg, DType::F32, norm, None),
        c(past, sg, io, swiglu, None),
        c(4 * be.max(256), sg, DType::F32, norm, Some(1024)),
        c(4 * be.max(256), wg, io, swiglu, Some(1024)),
        c(4 * be.max(256), wg, DType::F32, norm, Some(1024)),
        c(4 * be.max(256), sg, DType::F32, norm, Some(0)),
    ]
}

/// Uploads `bytes` (`[rows_before + n, k]` blocks) and returns the view of the last `n` rows.
pub(crate) fn upload_weight(
    gpu: &Gpu,
    dtype: DType,
    bytes: &[u8],
    rows_before: usize,
    n: usize,
    k: usize,
) -> Result<crate::tensor::Tensor> {
    let full = gpu.tensor_from_bytes(
        "w",
        &[rows_before + n, k],
        dtype,
        Layout::Blocks,
        bytes,
        Category::Weights,
    )?;
    full.rows(rows_before, rows_before + n)
}

/// A matvec on the weight `bytes` (`[rows_before + n, k]` blocks of `c.dtype`; the case uses the last
/// `n` rows), compared with the f64 product of `deq` (the dequantized last `n` rows).
fn run_matvec(
    gpu: &Gpu,
    rng: &mut Rng,
    c: &Case,
    bytes: &[u8],
    deq: &[f32],
    label: &str,
) -> Result<Check> {
    let (batch, n, k) = (c.batch, c.n, c.k);
    let xk = c.fuse.x_len(k);
    let w = upload_weight(gpu, c.dtype, bytes, c.w_rows_before, n, k)?;
    let xv = random(rng, c.x_offset + batch * xk, -1.0, 1.0, c.x_dtype);
    let bv = random(rng, n, -1.0, 1.0, c.out_dtype);
    let x_full = gpu.tensor_from_f32(
        "x",
        &[c.x_offset + batch * xk],
        c.x_dtype,
        &xv,
        Category::Activations,
    )?;
    let x = x_full.view(c.x_offset, &[batch, xk])?;
    let bias = gpu.tensor_from_f32("bias", &[n], c.out_dtype, &bv, Category::Weights)?;
    let on = if c.fuse.glu { n / 2 } else { n };
    let o = gpu.tensor("out", &[batch, on], c.out_dtype, Category::Activations)?;
    let fused = FuseTensors::new(gpu, rng, c.fuse, k, &o)?;
    let opts = fused.options(
        &o,
        MatvecOptions {
            bias: c.bias.then_some(&bias),
            variant: c.variant,
            max_shard_bytes: c.max_shard_bytes,
            max_stage_bytes: c.max_stage_bytes,
            ..Default::default()
        },
    );
    let dp4a = uses_dp4a(gpu, &w, &x, &o, &opts, c.tuning)?;
    let mut prog = Program::new();
    let ds = matvec_quant_tuned(gpu, &w, &x, &o, &opts, c.tuning)?;
    let staged = super::matvec::staging_label(&ds);
    // K split over workgroups, as the kernel names it ("_kw4"): the label names what ran.
    let kw = ds
        .iter()
        .find_map(|d| d.name.split("_kw").nth(1).map(|n| format!(" kw{n}")))
        .unwrap_or_default();
    prog.extend(ds);
    let dispatches = prog.len();
    prog.run(gpu)?;
    if !kw.is_empty() && c.fuse.residual != Residual::InPlace {
        // Again into a poisoned output: the arrival counts must be back at zero for the last
        // workgroup of each row set to write it.
        gpu.poison(&o)?;
        prog.run(gpu)?;
    }
    let xs = &xv[c.x_offset..];
    let bias_v = c.bias.then_some(&bv[..]);
    // f32 accumulation: rounding error relative to sum |w x|.
    let (want, mut atol) = if c.fuse.is_some() {
        let (want, scale) = fused.reference(deq, xs, bias_v, batch, n, k);
        (want, fused_atol(scale))
    } else {
        let scale = r::abs_dot_max(deq, xs, batch, n, k);
        (r::matvec(deq, xs, bias_v, batch, n, k), 3e-7 * scale + 1e-7)
    };
    if dp4a {
        atol += int8_input_error(deq, &fused.prologue(xs, k), n, k);
    }
    let (want, atol) = if c.fuse.glu {
        glu_reference(&want, atol)
    } else {
        (want, atol)
    };
    let mut name = format!(
        "matvec {:?} {label}{:?} {batch}x[{n}, {k}]{}{} x {:?} out {:?} r{}u{}{}",
        c.dtype,
        c.variant,
        if c.bias { " +bias" } else { "" },
        c.fuse.label(),
        c.x_dtype,
        c.out_dtype,
        c.tuning.rows_per_team,
        c.tuning.chunks_per_step,
        if c.tuning.trusted { "" } else { " checked" },
    );
    if dp4a {
        name += &format!(
            " dp4a rg{}{}{}",
            c.tuning.row_groups,
            if c.tuning.prefetch { " pf" } else { "" },
            if c.tuning.k_teams > 1 {
                format!(" kt{}", c.tuning.k_teams)
            } else {
                String::new()
            }
        );
        if c.tuning.x_vec4 {
            name += " xq4";
        }
        name += &kw;
    }
    if c.w_rows_before + c.x_offset > 0 {
        name += &format!(" w@row{} x@{}", c.w_rows_before, c.x_offset);
    }
    if c.max_shard_bytes.is_some() {
        name += &format!(" {dispatches} shards");
    }
    if let Some(m) = c.max_stage_bytes {
        name += &format!(" stage<={m}B");
    }
    name += staged;
    Ok(compare(
        name,
        &gpu.read_f32(&o)?,
        &want,
        atol,
        store_rtol(c.out_dtype),
    ))
}

/// The largest error the integer-dot-product kernel's rounding of the input can cause in one output:
/// x = d (qh + ql / 254) with d = max |block| / 127 is off by at most d / 508 = max |block| / 64516, so
/// output row r moves by at most the sum over blocks of that times sum |w[r, k]| over the block. One
/// batch row (the kernel takes no more).
pub(crate) fn int8_input_error(w: &[f32], xin: &[f64], n: usize, k: usize) -> f64 {
    let steps: Vec<f64> = xin[..k]
        .chunks(32)
        .map(|b| b.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 64516.0)
        .collect();
    (0..n)
        .map(|r| {
            w[r * k..(r + 1) * k]
                .chunks(32)
                .zip(&steps)
                .map(|(wb, s)| s * wb.iter().map(|v| v.abs() as f64).sum::<f64>())
                .sum::<f64>()
        })
        .fold(0.0, f64::max)
}

pub fn check_matvec(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Check> {
    let rows = c.w_rows_before + c.n;
    let bytes = random_blocks(rng, c.dtype, rows * c.k / c.dtype.block_elems());
    let deq = r::dequantize(c.dtype, &bytes);
    run_matvec(gpu, rng, c, &bytes, &deq[c.w_rows_before * c.k..], "")
}

/// Dequantizes rows `rows_before..rows_before + n` of a random weight into an `out_dtype` view at
/// element `out_offset` of a larger buffer.
#[allow(clippy::too_many_arguments)]
pub fn check_dequantize(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: DType,
    n: usize,
    k: usize,
    rows_before: usize,
    out_dtype: DType,
    out_offset: usize,
) -> Result<Check> {
    let bytes = random_blocks(rng, dtype, (rows_before + n) * k / dtype.block_elems());
    let deq = r::dequantize(dtype, &bytes);
    let want: Vec<f64> = deq[rows_before * k..].iter().map(|&v| v as f64).collect();
    run_dequantize(
        gpu,
        dtype,
        &bytes,
        rows_before,
        n,
        k,
        out_dtype,
        out_offset,
        &want,
        "",
    )
}

#[allow(clippy::too_many_arguments)]
fn run_dequantize(
    gpu: &Gpu,
    dtype: DType,
    bytes: &[u8],
    rows_before: usize,
    n: usize,
    k: usize,
    out_dtype: DType,
    out_offset: usize,
    want: &[f64],
    label: &str,
) -> Result<Check> {
    let w = upload_weight(gpu, dtype, bytes, rows_before, n, k)?;
    let full = gpu.tensor(
        "deq",
        &[out_offset + n * k + 3],
        out_dtype,
        Category::Activations,
    )?;
    let o = full.view(out_offset, &[n, k])?;
    gpu.poison(&full)?;
    let mut prog = Program::new();
    prog.push(dequantize(gpu, &w, &o)?);
    prog.run(gpu)?;
    let got = gpu.read_f32(&full)?;
    // The values must land exactly in the view: everything around it stays poisoned.
    let outside_ok = got[..out_offset]
        .iter()
        .chain(&got[out_offset + n * k..])
        .all(|v| v.is_nan());
    let rtol = if out_dtype == DType::F16 { 1e-3 } else { 0.0 };
    let mut c = compare(
        format!(
            "dequantize {dtype:?} {label}[{n}, {k}] w@row{rows_before} -> {out_dtype:?}@{out_offset}"
        ),
        &got[out_offset..out_offset + n * k],
        want,
        if out_dtype == DType::F16 { 1e-7 } else { 0.0 },
        rtol,
    );
    if !outside_ok {
        c.passed = false;
        c.detail += " wrote outside its view";
    }
    Ok(c)
}

/// A weight whose reference dequantization came from gguf-py (tests/fixtures/quant).
#[derive(Clone, Debug)]
pub struct Fixture {
    pub name: String,
    pub dtype: DType,
    pub n: usize,
    pub k: usize,
    pub bytes: Vec<u8>,
    /// gguf-py's dequantization, `[n, k]`.
    pub values: Vec<f32>,
}

/// The GPU kernels on a fixture: dequantization to f32 (exact) and f16, and matvecs (batch 1 with the
/// subgroup reduction, batch 3 with the workgroup one) against the f64 product of gguf-py's values.
pub fn fixture_checks(gpu: &Gpu, rng: &mut Rng, f: &Fixture) -> Result<Vec<Check>> {
    let label = format!("{} ", f.name);
    let want: Vec<f64> = f.values.iter().map(|&v| v as f64).collect();
    let mut out = vec![
        run_dequantize(
            gpu,
            f.dtype,
            &f.bytes,
            0,
            f.n,
            f.k,
            DType::F32,
            0,
            &want,
            &label,
        )?,
        run_dequantize(
            gpu,
            f.dtype,
            &f.bytes,
            0,
            f.n,
            f.k,
            DType::F16,
            0,
            &want,
            &label,
        )?,
    ];
    // The configurations of `checks` (their kernels are compiled already): both reductions.
    let sg = if gpu.caps.subgroup {
        MatvecVariant::Subgroup
    } else {
        MatvecVariant::Workgroup
    };
    let c = Case::new(f.dtype, 1, f.n, f.k, sg);
    out.push(run_matvec(gpu, rng, &c, &f.bytes, &f.values, &label)?);
    let c = Case {
        batch: 3,
        bias: true,
        x_offset: 3,
        variant: MatvecVariant::Workgroup,
        ..c
    };
    out.push(run_matvec(gpu, rng, &c, &f.bytes, &f.values, &label)?);
    Ok(out)
}
