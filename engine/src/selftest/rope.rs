//! Checks for the rotary embedding kernel.

use super::softmax::{guard, output_at, outside_untouched, tensor_at};
use super::{Check, Rng, compare, float_dtypes, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::rope::{RopeOptions, RopeStyle, rope};
use crate::memory::Category;
use crate::reference::rope as r;
use crate::tensor::DType;
use rand::Rng as _;

struct Case {
    shape: [usize; 3],
    rotary_dim: usize,
    style: RopeStyle,
    theta: f32,
    factors: bool,
    freq_scale: f32,
    inplace: bool,
    x_off: usize,
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for dtype in float_dtypes(gpu) {
        for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
            for c in [
                // Full rotation, llama-like; partial rotary_dim (passthrough copied); in place with a
                // partial rotary_dim (passthrough untouched); llama3 factors and a large theta; odd
                // head counts around the heads-per-thread chunking; one decode token at an offset.
                Case {
                    shape: [7, 3, 64],
                    rotary_dim: 64,
                    style,
                    theta: 10000.0,
                    factors: false,
                    freq_scale: 1.0,
                    inplace: false,
                    x_off: 0,
                },
                // vec4 slots with a copied tail, and in place with an untouched tail.
                Case {
                    shape: [3, 5, 48],
                    rotary_dim: 24,
                    style,
                    theta: 10000.0,
                    factors: true,
                    freq_scale: 1.0,
                    inplace: false,
                    x_off: 4,
                },
                Case {
                    shape: [4, 3, 32],
                    rotary_dim: 16,
                    style,
                    theta: 10000.0,
                    factors: false,
                    freq_scale: 1.0,
                    inplace: true,
                    x_off: 0,
                },
                Case {
                    shape: [5, 6, 48],
                    rotary_dim: 32,
                    style,
                    theta: 10000.0,
                    factors: false,
                    freq_scale: 1.0,
                    inplace: false,
                    x_off: 3,
                },
                Case {
                    shape: [6, 5, 40],
                    rotary_dim: 20,
                    style,
                    theta: 1e6,
                    factors: false,
                    freq_scale: 0.25,
                    inplace: true,
                    x_off: 1,
                },
                Case {
                    shape: [9, 9, 32],
                    rotary_dim: 32,
                    style,
                    theta: 500000.0,
                    factors: true,
                    freq_scale: 1.0,
                    inplace: false,
                    x_off: 0,
                },
                Case {
                    shape: [1, 2, 6],
                    rotary_dim: 4,
                    style,
                    theta: 10000.0,
                    factors: true,
                    freq_scale: 1.0,
                    inplace: true,
                    x_off: 0,
                },
            ] {
                out.push(check(gpu, rng, &c, dtype)?);
            }
        }
    }
    if gpu.caps.f16 {
        // f16 in, f32 out.
        let c = Case {
            shape: [4, 3, 16],
            rotary_dim: 16,
            style: RopeStyle::HalfSplit,
            theta: 10000.0,
            factors: false,
            freq_scale: 1.0,
            inplace: false,
            x_off: 0,
        };
        out.push(check_mixed(gpu, rng, &c, DType::F16, DType::F32)?);
    }
    Ok(out)
}

fn check(gpu: &Gpu, rng: &mut Rng, c: &Case, dtype: DType) -> Result<Check> {
    check_mixed(gpu, rng, c, dtype, dtype)
}

fn check_mixed(gpu: &Gpu, rng: &mut Rng, c: &Case, tx: DType, to: DType) -> Result<Check> {
    let [tokens, heads, hd] = c.shape;
    let numel = tokens * heads * hd;
    let xv = random(rng, numel, -2.0, 2.0, tx);
    // Large positions (up to 30000 and the edges of 12-bit pieces), small ones and 0.
    let mut pv: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..30001)).collect();
    for (i, p) in [0u32, 1, 30000, 4095, 4096, 32767].into_iter().enumerate() {
        if i + 1 < tokens {
            pv[i + 1] = p;
        }
    }
    let pos_all: Vec<u8> = [7u32, 7]
        .iter()
        .chain(&pv)
        .flat_map(|p| p.to_le_bytes())
        .collect();
    let pos_base = gpu.tensor_from_bytes(
        "pos",
        &[tokens + 2],
        DType::U32,
        crate::tensor::Layout::RowMajor,
        &pos_all,
        Category::Activations,
    )?;
    let pos = pos_base.view(2, &[tokens])?;
    let fv: Vec<f32> = (0..c.rotary_dim / 2)
        .map(|_| rng.random_range(1.0..8.0))
        .collect();
    let (ff, _) = tensor_at(gpu, "factors", &[fv.len()], DType::F32, &fv, 1)?;
    let shape = c.shape.to_vec();
    let o_off = if c.x_off.is_multiple_of(4) { 4 } else { 2 };
    let (x, _) = tensor_at(gpu, "x", &shape, tx, &xv, c.x_off)?;
    let (o, ob) = if c.inplace {
        (x.clone(), None)
    } else {
        // Aligned (vec4 path) when x is, else not.
        let (o, b) = output_at(gpu, "out", &shape, to, o_off)?;
        (o, Some(b))
    };
    let opts = RopeOptions {
        freq_factors: c.factors.then_some(&ff),
        freq_scale: c.freq_scale,
        ..RopeOptions::new(c.theta, c.style, c.rotary_dim)
    };
    let d = rope(gpu, &x, &pos, &o, &opts)?;
    let name = format!(
        "{} {shape:?} rd {} theta {} scale {} x@{}",
        d.name, c.rotary_dim, c.theta, c.freq_scale, c.x_off
    );
    let mut prog = Program::new();
    prog.push(d);
    prog.run(gpu)?;
    let want = r::rope(
        &xv,
        &pv,
        heads,
        hd,
        c.rotary_dim,
        c.theta as f64,
        c.freq_scale as f64,
        c.style == RopeStyle::Interleaved,
        c.factors.then_some(&fv[..]),
    );
    // Angles are good to ~1e-6 rad at any position (a plain f32 angle is off by up to 2e-3 rad at
    // 30000, which this bound rejects), so with |x| <= 2 an output is within ~5e-6 plus its rounding.
    let (atol, rtol) = match to {
        DType::F16 => (6.2e-5, store_rtol(DType::F16)),
        _ => (5e-6, 1e-5),
    };
    let untouched = match &ob {
        Some(b) => outside_untouched(gpu, b, o_off, numel)?,
        None => true,
    };
    Ok(guard(
        compare(name, &gpu.read_f32(&o)?, &want, atol, rtol),
        untouched,
    ))
}
