//! Checks for the matvec kernels: K not a multiple of any vector width, N not a multiple of the rows
//! per workgroup, batch 1 and 3, f32 and f16 weights (and activations), bias, views at offsets,
//! sharded weights, subgroup and workgroup-memory reductions.

use super::matmul::dot_atol;
use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matvec::{MatvecOptions, MatvecVariant, matvec};
use crate::memory::Category;
use crate::reference::matmul as r;
use crate::tensor::DType;

/// One matvec check.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub n: usize,
    pub k: usize,
    pub w_dtype: DType,
    pub x_dtype: DType,
    pub out_dtype: DType,
    pub bias: bool,
    /// Element offsets of `w` and `x` inside larger buffers (views).
    pub w_offset: usize,
    pub x_offset: usize,
    pub variant: MatvecVariant,
    pub max_shard_bytes: Option<u64>,
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let mut variants = vec![MatvecVariant::Workgroup];
    if gpu.caps.subgroup {
        variants.push(MatvecVariant::Subgroup);
    }
    let mut wdtypes = vec![DType::F32];
    if gpu.caps.f16 {
        wdtypes.push(DType::F16);
    }
    for variant in variants {
        for &w_dtype in &wdtypes {
            let c = |batch, n, k| Case {
                batch,
                n,
                k,
                w_dtype,
                x_dtype: DType::F32,
                out_dtype: DType::F32,
                bias: false,
                w_offset: 0,
                x_offset: 0,
                variant,
                max_shard_bytes: None,
            };
            // Cases share specialisations (batch size, scalar / vector loads, bias), each of which
            // costs lavapipe a fraction of a second to compile: batch-1 scalar loads always come
            // with a bias, batch-1 vector loads without, batch-3 vector loads with.
            let mut cases = vec![
                Case {
                    bias: true,
                    ..c(1, 7, 1)
                },
                c(3, 64, 3),
                Case {
                    bias: true,
                    ..c(1, 1, 4)
                },
                Case {
                    bias: true,
                    ..c(1, 257, 130)
                },
                Case {
                    bias: true,
                    ..c(3, 64, 1000)
                },
                c(1, 257, 256),
                Case {
                    bias: true,
                    ..c(3, 7, 1000)
                },
                // Eight activation rows (the most): with f32 weights only, the batch code is shared and
                // the f16 specialisation of it is the slowest to compile on lavapipe.
                c(if w_dtype == DType::F32 { 8 } else { 3 }, 9, 40),
                // Views: an odd weight offset forces scalar loads; multiples of 8 keep vector loads.
                Case {
                    w_offset: 1,
                    x_offset: 2,
                    bias: true,
                    ..c(1, 64, 256)
                },
                Case {
                    w_offset: 8,
                    x_offset: 4,
                    bias: true,
                    ..c(3, 33, 64)
                },
                // Row shards: 1000 halves/floats per row, shards of a few rows each.
                Case {
                    max_shard_bytes: Some(16384),
                    bias: true,
                    ..c(3, 57, 1000)
                },
                Case {
                    max_shard_bytes: Some(2048),
                    bias: true,
                    ..c(1, 31, 130)
                },
            ];
            if gpu.caps.f16 {
                cases.push(Case {
                    x_dtype: DType::F16,
                    out_dtype: DType::F16,
                    bias: true,
                    ..c(1, 129, 520)
                });
                cases.push(Case {
                    out_dtype: DType::F16,
                    ..c(3, 64, 3)
                });
            }
            for case in cases {
                out.push(check(gpu, rng, &case)?);
            }
        }
    }
    Ok(out)
}

pub fn check(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Check> {
    let (batch, n, k) = (c.batch, c.n, c.k);
    let wv = random(rng, c.w_offset + n * k, -1.0, 1.0, c.w_dtype);
    let xv = random(rng, c.x_offset + batch * k, -1.0, 1.0, c.x_dtype);
    let bv = random(rng, n, -1.0, 1.0, c.out_dtype);
    let w_full = gpu.tensor_from_f32(
        "w",
        &[c.w_offset + n * k],
        c.w_dtype,
        &wv,
        Category::Weights,
    )?;
    let w = w_full.view(c.w_offset, &[n, k])?;
    let x_full = gpu.tensor_from_f32(
        "x",
        &[c.x_offset + batch * k],
        c.x_dtype,
        &xv,
        Category::Activations,
    )?;
    let x = x_full.view(c.x_offset, &[batch, k])?;
    let bias = gpu.tensor_from_f32("bias", &[n], c.out_dtype, &bv, Category::Weights)?;
    let o = gpu.tensor("out", &[batch, n], c.out_dtype, Category::Activations)?;
    gpu.poison(&o)?;
    let opts = MatvecOptions {
        bias: c.bias.then_some(&bias),
        variant: c.variant,
        max_shard_bytes: c.max_shard_bytes,
    };
    let mut prog = Program::new();
    prog.extend(matvec(gpu, &w, &x, &o, &opts)?);
    let dispatches = prog.len();
    prog.run(gpu)?;
    let want = r::matvec(
        &wv[c.w_offset..],
        &xv[c.x_offset..],
        c.bias.then_some(&bv[..]),
        batch,
        n,
        k,
    );
    let mut name = format!(
        "matvec {:?} {batch}x[{n}, {k}]{} w {:?} x {:?} out {:?}",
        c.variant,
        if c.bias { " +bias" } else { "" },
        c.w_dtype,
        c.x_dtype,
        c.out_dtype
    );
    if c.w_offset + c.x_offset > 0 {
        name += &format!(" w@{} x@{}", c.w_offset, c.x_offset);
    }
    if c.max_shard_bytes.is_some() {
        name += &format!(" {dispatches} shards");
    }
    Ok(compare(
        name,
        &gpu.read_f32(&o)?,
        &want,
        dot_atol(k),
        store_rtol(c.out_dtype),
    ))
}
