//! Checks for the matmul kernels: odd sizes (edge tiles in every dimension), both B layouts, shared
//! and per-batch B, bias, f32 and f16, operand views at non-zero offsets (scalar and vector paths),
//! a sharded weight, and every variant the device has (tiled 64/128, cooperative matrix).

use super::{Check, Rng, compare, float_dtypes, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matmul::{
    CoopTuning, MatmulOptions, MatmulTile, MatmulVariant, coop_available, matmul, matmul_shards,
};
use crate::memory::Category;
use crate::reference::matmul::{self as r, MatmulShape};
use crate::tensor::{DType, Tensor};

/// One matmul check.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transpose_b: bool,
    pub batched_b: bool,
    pub bias: bool,
    pub dtype: DType,
    pub out_dtype: DType,
    /// Element offsets of `a` and `out` inside larger buffers (views).
    pub a_offset: usize,
    pub out_offset: usize,
    pub variant: MatmulVariant,
    pub tile: MatmulTile,
    /// Split the weight into row shards of at most this many bytes (transposed, shared `b` only).
    pub shard_bytes: Option<u64>,
    /// Build switches of the cooperative kernel.
    pub coop: CoopTuning,
    /// K slices (`MatmulOptions::split_k`: 0 automatic).
    pub split_k: usize,
    /// SwiGLU epilogue (`MatmulOptions::glu`): b's first n / 2 rows are gate, the rest up.
    pub glu: bool,
}

impl Case {
    fn new(batch: usize, m: usize, n: usize, k: usize, transpose_b: bool, dtype: DType) -> Case {
        Case {
            batch,
            m,
            n,
            k,
            transpose_b,
            batched_b: false,
            bias: false,
            dtype,
            out_dtype: dtype,
            a_offset: 0,
            out_offset: 0,
            variant: MatmulVariant::Tiled,
            tile: MatmulTile::Auto,
            shard_bytes: None,
            coop: CoopTuning::default(),
            split_k: 0,
            glu: false,
        }
    }
}

/// Accumulation tolerance for a K-long f32 dot product of values in [-1, 1]: the rounding error of
/// sequential f32 sums grows about like eps K / 15 (standard deviation); this allows ~5 sigma.
pub fn dot_atol(k: usize) -> f64 {
    4e-8 * k as f64 + 1e-6
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for dtype in float_dtypes(gpu) {
        let mut variants = vec![
            (MatmulVariant::Tiled, MatmulTile::T64),
            (MatmulVariant::Tiled, MatmulTile::T128),
        ];
        if dtype == DType::F16 && coop_available(&gpu.caps) {
            variants.push((MatmulVariant::Coop, MatmulTile::Auto));
        }
        let other = if dtype == DType::F32 && gpu.caps.f16 {
            DType::F16
        } else {
            DType::F32
        };
        for (variant, tile) in variants {
            let c = |batch, m, n, k, t| Case {
                variant,
                tile,
                ..Case::new(batch, m, n, k, t, dtype)
            };
            // Each specialisation (scalar / vector access, bias, output dtype, block size) costs
            // lavapipe about a second to compile, so the cases are grouped to share a few of them:
            // all-scalar, all-scalar + bias, all-vector + bias, vector inputs + scalar output of the
            // other dtype + bias. 128x128 blocks run the same code with R = 8 and get a subset.
            let scalar = [
                c(1, 1, 1, 1, false),
                c(2, 9, 17, 23, true),
                Case {
                    batched_b: true,
                    ..c(2, 9, 17, 23, false)
                },
            ];
            let scalar_bias = [
                Case {
                    bias: true,
                    ..c(1, 3, 5, 7, true)
                },
                Case {
                    bias: true,
                    ..c(1, 17, 33, 65, false)
                },
                // Views at odd offsets keep a and out on the scalar path.
                Case {
                    bias: true,
                    a_offset: 3,
                    out_offset: 1,
                    ..c(1, 70, 130, 96, false)
                },
            ];
            let vector_bias = [
                Case {
                    bias: true,
                    ..c(1, 64, 64, 64, true)
                },
                Case {
                    bias: true,
                    ..c(1, 64, 64, 64, false)
                },
                Case {
                    batched_b: true,
                    bias: true,
                    ..c(3, 20, 36, 40, true)
                },
                Case {
                    a_offset: 4,
                    out_offset: 8,
                    bias: true,
                    ..c(1, 33, 36, 48, false)
                },
                Case {
                    shard_bytes: Some(4096),
                    bias: true,
                    ..c(1, 19, 100, 40, true)
                },
            ];
            let mixed = [Case {
                bias: true,
                out_dtype: other,
                ..c(1, 70, 130, 96, true)
            }];
            let mut cases: Vec<Case> = Vec::new();
            match (tile, dtype) {
                (MatmulTile::T128, DType::F32) => cases.extend(scalar.iter().chain(&vector_bias)),
                (MatmulTile::T128, _) => cases.extend(vector_bias),
                _ => cases.extend(
                    scalar
                        .iter()
                        .chain(&scalar_bias)
                        .chain(&vector_bias)
                        .chain(&mixed),
                ),
            }
            for case in cases {
                out.push(check(gpu, rng, &case)?);
            }
        }
        // Cooperative kernel: interior 128 x 128 tiles (stored straight from the accumulators when
        // the output is f32 without bias) next to edge tiles, with each build switch.
        if dtype == DType::F16 && coop_available(&gpu.caps) {
            let base = CoopTuning::default();
            for coop in [
                base,
                CoopTuning {
                    sg8: false,
                    bk64: false,
                    prefetch: true,
                    loop_bounding: true,
                    ..base
                },
                CoopTuning {
                    bk64: false,
                    prefetch: true,
                    ..base
                },
                CoopTuning {
                    trusted: true,
                    ..base
                },
            ] {
                for (t, bias, out_dtype) in [
                    (true, false, DType::F32),
                    (false, false, DType::F32),
                    (true, true, DType::F16),
                ] {
                    let case = Case {
                        variant: MatmulVariant::Coop,
                        bias,
                        out_dtype,
                        coop,
                        ..Case::new(2, 200, 260, 96, t, dtype)
                    };
                    out.push(check(gpu, rng, &case)?);
                }
            }
            // Split K: few 128x128 blocks (automatic: 4 slices), asked-for slices, the summing pass's
            // bias and f16 output, views at vector-aligned offsets, and a K the split must refuse.
            for (split_k, bias, out_dtype, a_offset, out_offset, k) in [
                (0, false, DType::F32, 0, 0, 1024),
                (2, true, DType::F16, 0, 0, 1024),
                (4, true, DType::F32, 8, 4, 1024),
                (0, false, DType::F32, 0, 0, 576),
            ] {
                let case = Case {
                    variant: MatmulVariant::Coop,
                    bias,
                    out_dtype,
                    a_offset,
                    out_offset,
                    split_k,
                    ..Case::new(1, 200, 260, k, true, dtype)
                };
                out.push(check(gpu, rng, &case)?);
            }
            // SwiGLU epilogue: edge rows, one and three column blocks, f16 and f32 output, a view,
            // and the four-subgroup build (16 x 64 staging per subgroup).
            for (m, n, k, out_dtype, a_offset, coop) in [
                (200, 256, 96, DType::F16, 0, base),
                (77, 768, 320, DType::F32, 8, base),
                (
                    130,
                    256,
                    64,
                    DType::F16,
                    0,
                    CoopTuning { sg8: false, ..base },
                ),
            ] {
                let case = Case {
                    variant: MatmulVariant::Coop,
                    out_dtype,
                    a_offset,
                    coop,
                    glu: true,
                    ..Case::new(1, m, n, k, true, dtype)
                };
                out.push(check(gpu, rng, &case)?);
            }
        }
    }
    Ok(out)
}

/// `silu(g) * u` (in f64) for rows of `n` values: gate in the first half, up in the second.
fn swiglu_rows(full: &[f64], n: usize) -> Vec<f64> {
    full.chunks(n)
        .flat_map(|row| {
            let (g, u) = row.split_at(n / 2);
            g.iter().zip(u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        })
        .collect()
}

fn tensor_at(
    gpu: &Gpu,
    label: &str,
    values: &[f32],
    offset: usize,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let t = gpu.tensor_from_f32(label, &[offset + n], dtype, values, Category::Activations)?;
    t.view(offset, shape)
}

pub fn check(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Check> {
    let (batch, m, n, k) = (c.batch, c.m, c.n, c.k);
    let av = random(rng, c.a_offset + batch * m * k, -1.0, 1.0, c.dtype);
    let nb = if c.batched_b { batch } else { 1 };
    let bv = random(rng, nb * n * k, -1.0, 1.0, c.dtype);
    let bias_v = random(rng, n, -1.0, 1.0, c.out_dtype);

    let a = tensor_at(gpu, "a", &av, c.a_offset, &[batch, m, k], c.dtype)?;
    let b_mat = if c.transpose_b { [n, k] } else { [k, n] };
    let b_shape: Vec<usize> = if c.batched_b {
        vec![batch, b_mat[0], b_mat[1]]
    } else {
        b_mat.to_vec()
    };
    let b = gpu.tensor_from_f32("b", &b_shape, c.dtype, &bv, Category::Weights)?;
    let bias = gpu.tensor_from_f32("bias", &[n], c.out_dtype, &bias_v, Category::Weights)?;
    let on = if c.glu { n / 2 } else { n };
    let o_full = gpu.tensor(
        "out",
        &[c.out_offset + batch * m * on],
        c.out_dtype,
        Category::Activations,
    )?;
    gpu.poison(&o_full)?;
    let o = o_full.view(c.out_offset, &[batch, m, on])?;

    let opts = MatmulOptions {
        transpose_b: c.transpose_b,
        bias: c.bias.then_some(&bias),
        variant: c.variant,
        tile: c.tile,
        coop: c.coop,
        split_k: c.split_k,
        glu: c.glu,
    };
    let mut prog = Program::new();
    match c.shard_bytes {
        Some(limit) => prog.extend(matmul_shards(gpu, &a, &b.row_shards(limit)?, &o, &opts)?),
        None => prog.extend(matmul(gpu, &a, &b, &o, &opts)?),
    }
    let dispatches = prog.len();
    prog.run(gpu)?;
    let got = gpu.read_f32(&o)?;
    let shape = MatmulShape {
        batch,
        m,
        n,
        k,
        transpose_b: c.transpose_b,
        batched_b: c.batched_b,
    };
    let mut want = r::matmul(&av[c.a_offset..], &bv, c.bias.then_some(&bias_v[..]), shape);
    // Tensor cores may add products in a different order and with truncation: allow 4x more.
    let mut atol = dot_atol(k)
        * if c.variant == MatmulVariant::Coop {
            4.0
        } else {
            1.0
        };
    if c.glu {
        // silu(gate) * up; an error e in either factor moves the product by at most e (|up| + 1.1).
        let largest = want.iter().fold(0f64, |a, v| a.max(v.abs()));
        atol *= 2.0 * (largest + 1.1);
        want = swiglu_rows(&want, n);
    }
    let mut name = format!(
        "matmul {:?}/{:?} {batch}x{m}x{n}x{k}{}{}{} {:?}->{:?}",
        c.variant,
        c.tile,
        if c.transpose_b { " b^T" } else { "" },
        if c.batched_b { " batched-b" } else { "" },
        if c.bias { " +bias" } else { "" },
        c.dtype,
        c.out_dtype
    );
    if c.a_offset + c.out_offset > 0 {
        name += &format!(" a@{} out@{}", c.a_offset, c.out_offset);
    }
    if c.shard_bytes.is_some() {
        name += &format!(" {dispatches} shards");
    } else if dispatches > 1 {
        name += &format!(" split-K (asked {})", c.split_k);
    }
    if c.coop != CoopTuning::default() {
        name += &format!(" {:?}", c.coop);
    }
    if c.glu {
        name += " swiglu";
    }
    let mut result = compare(name, &got, &want, atol, store_rtol(c.out_dtype));
    // Slices asked for must have been taken (two passes), or the check would pass on the plain path.
    if c.split_k > 1 && dispatches != 2 {
        result.passed = false;
        result.detail = format!("{dispatches} dispatches: the split-K path was not taken");
    }
    Ok(result)
}
