//! Checks for the elementwise and activation kernels.

use super::{Check, Rng, compare, float_dtypes, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::activation::{UnaryOp, unary};
use crate::kernels::elementwise::{BinaryOp, binary, broadcast_shape};
use crate::memory::Category;
use crate::reference::elementwise as r;
use crate::tensor::DType;

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = vec![check_copy(gpu, rng)?];
    for dtype in float_dtypes(gpu) {
        for (sa, sb) in [
            (vec![7, 33], vec![7, 33]),
            (vec![5, 3, 17], vec![17]),
            (vec![2, 1, 9], vec![4, 1]),
            (vec![1], vec![3, 257]),
            (vec![2, 3, 5, 7], vec![3, 1, 1]),
        ] {
            for op in [BinaryOp::Add, BinaryOp::Mul] {
                out.push(check_binary(gpu, rng, op, &sa, &sb, dtype)?);
            }
        }
        for op in [
            UnaryOp::Scale(-0.37),
            UnaryOp::Silu,
            UnaryOp::GeluTanh,
            UnaryOp::GeluErf,
            UnaryOp::QuickGelu,
        ] {
            out.push(check_unary(gpu, rng, op, 1237, dtype)?);
        }
    }
    Ok(out)
}

pub fn check_binary(
    gpu: &Gpu,
    rng: &mut Rng,
    op: BinaryOp,
    sa: &[usize],
    sb: &[usize],
    dtype: DType,
) -> Result<Check> {
    let so = broadcast_shape(sa, sb)?;
    let av = random(rng, sa.iter().product(), -2.0, 2.0, dtype);
    let bv = random(rng, sb.iter().product(), -2.0, 2.0, dtype);
    let a = gpu.tensor_from_f32("a", sa, dtype, &av, Category::Activations)?;
    let b = gpu.tensor_from_f32("b", sb, dtype, &bv, Category::Activations)?;
    let o = gpu.tensor("out", &so, dtype, Category::Activations)?;
    gpu.poison(&o)?;
    let mut prog = Program::new();
    prog.push(binary(gpu, op, &a, &b, &o)?);
    prog.run(gpu)?;
    let want = match op {
        BinaryOp::Add => r::binary(&av, sa, &bv, sb, &so, |x, y| x + y),
        BinaryOp::Mul => r::binary(&av, sa, &bv, sb, &so, |x, y| x * y),
    };
    Ok(compare(
        format!("{op:?} {sa:?}x{sb:?} {dtype:?}"),
        &gpu.read_f32(&o)?,
        &want,
        1e-6,
        store_rtol(dtype),
    ))
}

pub fn check_unary(gpu: &Gpu, rng: &mut Rng, op: UnaryOp, n: usize, dtype: DType) -> Result<Check> {
    let mut xv = random(rng, n, -6.0, 6.0, dtype);
    // Include the extremes where naive formulas overflow.
    xv[0] = -30.0;
    xv[1] = 30.0;
    let x = gpu.tensor_from_f32("x", &[n], dtype, &xv, Category::Activations)?;
    let o = gpu.tensor("out", &[n], dtype, Category::Activations)?;
    gpu.poison(&o)?;
    let mut prog = Program::new();
    prog.push(unary(gpu, op, &x, &o)?);
    prog.run(gpu)?;
    let f: fn(f64) -> f64 = match op {
        UnaryOp::Scale(_) => |x| x * (-0.37f32) as f64,
        UnaryOp::Silu => r::silu,
        UnaryOp::GeluTanh => r::gelu_tanh,
        UnaryOp::GeluErf => r::gelu_erf,
        UnaryOp::QuickGelu => r::quick_gelu,
    };
    let want: Vec<f64> = xv.iter().map(|&v| f(v as f64)).collect();
    // f32 transcendental functions on GPUs are good to a few ulp; erf's approximation to 1.5e-7.
    Ok(compare(
        format!("{} [{n}] {dtype:?}", op.name()),
        &gpu.read_f32(&o)?,
        &want,
        2e-6,
        store_rtol(dtype).max(2e-6),
    ))
}

/// The bulk copy, between views at 16-byte aligned but not binding-aligned offsets.
pub fn check_copy(gpu: &Gpu, rng: &mut Rng) -> Result<Check> {
    let n = 4 * 1031;
    let vals = random(rng, 2 * n + 8, -1.0, 1.0, DType::F32);
    let all = gpu.tensor_from_f32(
        "copy",
        &[2 * n + 8],
        DType::F32,
        &vals,
        Category::Activations,
    )?;
    let src = all.view(4, &[n])?;
    let dst = all.view(n + 8, &[n])?;
    gpu.poison(&dst)?;
    let mut prog = Program::new();
    prog.push(crate::kernels::copy::copy(gpu, &src, &dst)?);
    prog.run(gpu)?;
    let got = gpu.read_f32(&dst)?;
    let want: Vec<f64> = vals[4..4 + n].iter().map(|&v| v as f64).collect();
    Ok(compare(format!("copy [{n}] f32"), &got, &want, 0.0, 0.0))
}
