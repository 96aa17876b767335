//! Checks for the normalisation kernels.

use super::softmax::{Out, guard, output_at, outside_untouched, row_variants, tensor_at};
use super::{Check, Rng, compare, float_dtypes, random, round_to, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::norm::{
    GroupNormOptions, add_rmsnorm, add_rmsnorm_partials, groupnorm, layernorm, rmsnorm,
};
use crate::kernels::softmax::RowVariant;
use crate::reference::norm as r;
use crate::tensor::{DType, Tensor};

const EPS: f32 = 1e-5;

/// Tolerances of a normalised output stored as `dtype`: f32 accumulation over rows of up to a few
/// thousand values keeps the scale within a few 1e-7 relative; f16 stores may flush subnormals.
fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (6.2e-5, store_rtol(DType::F16)),
        _ => (1e-6, 1e-5),
    }
}

/// The weight dtype paired with activations of `dtype` in case `i`: alternately the same and f32.
fn weight_dtype(dtype: DType, i: usize) -> DType {
    if i.is_multiple_of(2) {
        dtype
    } else {
        DType::F32
    }
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let rows = [1, 5, 33];
    let ns = [1, 3, 31, 64, 257, 1000];
    for dtype in float_dtypes(gpu) {
        for variant in row_variants(gpu) {
            for (i, &n) in ns.iter().enumerate() {
                let shape = [rows[i % 3], n];
                out.push(check_rms(
                    gpu,
                    rng,
                    &shape,
                    dtype,
                    weight_dtype(dtype, i),
                    variant,
                    0,
                    Out::Own(0),
                )?);
            }
            out.push(check_rms(
                gpu,
                rng,
                &[3, 2, 64],
                dtype,
                dtype,
                variant,
                4,
                Out::Own(8),
            )?);
            out.push(check_rms(
                gpu,
                rng,
                &[7, 31],
                dtype,
                DType::F32,
                variant,
                3,
                Out::InPlace,
            )?);
            for (i, (shape, x_off, inplace)) in [
                (vec![5, 31], 0, false),
                (vec![2, 3, 64], 4, true),
                (vec![33, 1000], 0, false),
                (vec![1, 4], 0, false),
            ]
            .into_iter()
            .enumerate()
            {
                let wt = weight_dtype(dtype, i);
                out.extend(check_add(
                    gpu,
                    rng,
                    &shape,
                    [dtype, dtype, wt, dtype, dtype],
                    variant,
                    x_off,
                    inplace,
                    1,
                )?);
            }
            // The residual as the f32 partial sums of a split-K product (the prefill's O and down).
            for (shape, slices, inplace) in [(vec![5, 64], 4, true), (vec![3, 1000], 2, false)] {
                out.extend(check_add(
                    gpu,
                    rng,
                    &shape,
                    [dtype, DType::F32, DType::F32, dtype, dtype],
                    variant,
                    0,
                    inplace,
                    slices,
                )?);
            }
            for (i, &n) in [3, 64, 257, 1000].iter().enumerate() {
                let shape = [rows[i % 3], n];
                let affine = [(true, true), (false, false), (true, false), (false, true)][i];
                out.push(check_ln(
                    gpu,
                    rng,
                    &shape,
                    dtype,
                    weight_dtype(dtype, i),
                    affine,
                    0.0,
                    variant,
                    0,
                    Out::Own(0),
                )?);
            }
            out.push(check_ln(
                gpu,
                rng,
                &[4, 68],
                dtype,
                dtype,
                (true, true),
                0.0,
                variant,
                4,
                Out::InPlace,
            )?);
            out.push(check_ln(
                gpu,
                rng,
                &[3, 37],
                dtype,
                dtype,
                (true, true),
                0.0,
                variant,
                1,
                Out::SameBuffer,
            )?);
        }
    }
    // A large common offset: LayerNorm's shifted sums keep full precision.
    for variant in row_variants(gpu) {
        out.push(check_ln(
            gpu,
            rng,
            &[5, 1000],
            DType::F32,
            DType::F32,
            (true, true),
            1000.0,
            variant,
            0,
            Out::Own(0),
        )?);
    }
    // Rows too long to hold in registers (streamed twice): vec4 and scalar.
    let (f32_, wg) = (DType::F32, RowVariant::Workgroup);
    out.push(check_rms(
        gpu,
        rng,
        &[1, 66001],
        f32_,
        f32_,
        RowVariant::Auto,
        0,
        Out::Own(0),
    )?);
    out.push(check_rms(
        gpu,
        rng,
        &[2, 65600],
        f32_,
        f32_,
        wg,
        0,
        Out::Own(0),
    )?);
    let dts = [f32_; 5];
    out.extend(check_add(
        gpu,
        rng,
        &[1, 70003],
        dts,
        RowVariant::Auto,
        0,
        false,
        1,
    )?);
    let affine = (true, true);
    let shape = [2, 65600];
    out.push(check_ln(
        gpu,
        rng,
        &shape,
        f32_,
        f32_,
        affine,
        3.0,
        wg,
        0,
        Out::Own(0),
    )?);
    if gpu.caps.f16 {
        // Mixed: f16 stream, f32 residual and sum, f16 normalised output.
        let dts = [DType::F16, DType::F32, DType::F16, DType::F32, DType::F16];
        out.extend(check_add(
            gpu,
            rng,
            &[5, 257],
            dts,
            RowVariant::Auto,
            0,
            false,
            1,
        )?);
        out.push(check_rms(
            gpu,
            rng,
            &[5, 100],
            DType::F32,
            DType::F16,
            RowVariant::Auto,
            0,
            Out::Own(0),
        )?);
    }
    for dtype in float_dtypes(gpu) {
        let wt = DType::F32;
        for silu in [false, true] {
            // The brief's shapes (odd spatial sizes: scalar path), the merge of several partials,
            // a vec4 case at a view offset, in place, and one larger group with the automatic split.
            out.push(check_gn(
                gpu,
                rng,
                &[2, 64, 9, 9],
                32,
                dtype,
                wt,
                silu,
                None,
                0,
                Out::Own(0),
            )?);
            out.push(check_gn(
                gpu,
                rng,
                &[2, 96, 17, 5],
                32,
                dtype,
                dtype,
                silu,
                Some(3),
                0,
                Out::Own(0),
            )?);
            out.push(check_gn(
                gpu,
                rng,
                &[1, 32, 6, 6],
                8,
                dtype,
                wt,
                silu,
                Some(5),
                4,
                Out::Own(4),
            )?);
            out.push(check_gn(
                gpu,
                rng,
                &[2, 16, 4, 3],
                4,
                dtype,
                dtype,
                silu,
                Some(2),
                0,
                Out::InPlace,
            )?);
        }
        out.push(check_gn(
            gpu,
            rng,
            &[1, 64, 64, 64],
            32,
            dtype,
            wt,
            true,
            None,
            0,
            Out::Own(0),
        )?);
        // Large enough for the 4-load steps on the scalar (odd spatial size) path.
        let shape = [1, 32, 33, 33];
        out.push(check_gn(
            gpu,
            rng,
            &shape,
            8,
            dtype,
            wt,
            false,
            Some(2),
            1,
            Out::Own(0),
        )?);
    }
    Ok(out)
}

/// (x, out, the output's buffer and offset when it has its own buffer).
type Placed = (Tensor, Tensor, Option<(Tensor, usize)>);

/// Input at offset `x_off` and the output placed as `out` says; returns (x, out, out buffer, out
/// offset).
fn place(
    gpu: &Gpu,
    shape: &[usize],
    xv: &[f32],
    tx: DType,
    to: DType,
    x_off: usize,
    out: Out,
) -> Result<Placed> {
    let numel = xv.len();
    Ok(match out {
        Out::Own(off) => {
            let (x, _) = tensor_at(gpu, "x", shape, tx, xv, x_off)?;
            let (o, ob) = output_at(gpu, "out", shape, to, off)?;
            (x, o, Some((ob, off)))
        }
        Out::InPlace => {
            let (x, _) = tensor_at(gpu, "x", shape, tx, xv, x_off)?;
            (x.clone(), x, None)
        }
        Out::SameBuffer => {
            let mut all = xv.to_vec();
            all.extend(std::iter::repeat_n(f32::NAN, 2 * numel + 5));
            let (base, _) = tensor_at(gpu, "x", &[all.len()], tx, &all, x_off)?;
            (base.view(0, shape)?, base.view(numel + 3, shape)?, None)
        }
    })
}

fn finish(gpu: &Gpu, c: Check, guard_out: Option<(Tensor, usize)>, numel: usize) -> Result<Check> {
    let untouched = match guard_out {
        Some((b, off)) => outside_untouched(gpu, &b, off, numel)?,
        None => true,
    };
    Ok(guard(c, untouched))
}

#[allow(clippy::too_many_arguments)]
fn check_rms(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    dtype: DType,
    wt: DType,
    variant: RowVariant,
    x_off: usize,
    out: Out,
) -> Result<Check> {
    let n = *shape.last().unwrap_or(&1);
    let numel: usize = shape.iter().product();
    let xv = random(rng, numel, -2.0, 2.0, dtype);
    let wv = random(rng, n, -2.0, 2.0, wt);
    let (x, o, ob) = place(gpu, shape, &xv, dtype, dtype, x_off, out)?;
    let (w, _) = tensor_at(gpu, "w", &[n], wt, &wv, 1)?;
    let d = rmsnorm(gpu, &x, &w, &o, EPS, variant)?;
    let name = format!("{} {shape:?} x@{x_off} out {out:?}", d.name);
    let mut prog = Program::new();
    prog.push(d);
    prog.run(gpu)?;
    let want = r::rmsnorm(&xv, &wv, n, EPS as f64);
    let (atol, rtol) = tol(dtype);
    finish(
        gpu,
        compare(name, &gpu.read_f32(&o)?, &want, atol, rtol),
        ob,
        numel,
    )
}

/// `dts`: x, residual, weight, sum, out. With `inplace` the sum is written over x. With `slices` > 1
/// the residual is that many f32 partial sums (`add_rmsnorm_partials`).
#[allow(clippy::too_many_arguments)]
fn check_add(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    dts: [DType; 5],
    variant: RowVariant,
    x_off: usize,
    inplace: bool,
    slices: usize,
) -> Result<Vec<Check>> {
    let [tx, tr, tw, ts, to] = dts;
    let n = *shape.last().unwrap_or(&1);
    let numel: usize = shape.iter().product();
    let xv = random(rng, numel, -2.0, 2.0, tx);
    let rv = random(rng, slices * numel, -2.0, 2.0, tr);
    let wv = random(rng, n, -2.0, 2.0, tw);
    let (x, _) = tensor_at(gpu, "x", shape, tx, &xv, x_off)?;
    let res_shape: Vec<usize> = if slices > 1 {
        [&[slices], shape].concat()
    } else {
        shape.to_vec()
    };
    let (res, _) = tensor_at(gpu, "res", &res_shape, tr, &rv, 0)?;
    let (w, _) = tensor_at(gpu, "w", &[n], tw, &wv, 0)?;
    let (s, sb) = if inplace {
        if ts != tx {
            return Err(crate::shape_err!(
                "in-place add_rmsnorm check needs the sum in x's dtype"
            ));
        }
        (x.clone(), None)
    } else {
        let (s, b) = output_at(gpu, "sum", shape, ts, 5)?;
        (s, Some((b, 5)))
    };
    let (o, ob) = output_at(gpu, "norm", shape, to, 3)?;
    let d = if slices > 1 {
        add_rmsnorm_partials(gpu, &x, &res, &w, &s, &o, EPS, variant)?
    } else {
        add_rmsnorm(gpu, &x, &res, &w, &s, &o, EPS, variant)?
    };
    let name = format!(
        "{} {shape:?} x@{x_off}{}{}",
        d.name,
        if inplace { " sum in place" } else { "" },
        if slices > 1 {
            format!(" residual in {slices} slices")
        } else {
            String::new()
        }
    );
    let mut prog = Program::new();
    prog.push(d);
    prog.run(gpu)?;
    // The sum is rounded to f32 by the GPU's add, then to the sum's dtype. Partial sums are added in
    // f64 here; the kernel's f32 additions of them (|terms| <= 2) err by up to `slices` roundings of
    // values up to 2 (slices + 1), allowed for in the tolerances.
    let sum: Vec<f32> = (0..numel)
        .map(|i| {
            let r: f64 = (0..slices).map(|j| rv[j * numel + i] as f64).sum();
            round_to((xv[i] as f64 + r) as f32, ts)
        })
        .collect();
    let want_sum: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
    let want = r::rmsnorm(&sum, &wv, n, EPS as f64);
    let sum_err = if slices > 1 {
        slices as f64 * 2.0 * (slices + 1) as f64 * f32::EPSILON as f64
    } else {
        0.0
    };
    let (satol, srtol) = tol(ts);
    let (atol, rtol) = tol(to);
    // The norm scales the sum by at most max|w| / rms: about 2 / 1 for these values.
    let (satol, atol) = (satol + sum_err, atol + 4.0 * sum_err);
    Ok(vec![
        finish(
            gpu,
            compare(
                format!("{name} sum"),
                &gpu.read_f32(&s)?,
                &want_sum,
                satol,
                srtol,
            ),
            sb,
            numel,
        )?,
        finish(
            gpu,
            compare(
                format!("{name} norm"),
                &gpu.read_f32(&o)?,
                &want,
                atol,
                rtol,
            ),
            Some((ob, 3)),
            numel,
        )?,
    ])
}

#[allow(clippy::too_many_arguments)]
fn check_ln(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    dtype: DType,
    wt: DType,
    (has_g, has_b): (bool, bool),
    offset: f32,
    variant: RowVariant,
    x_off: usize,
    out: Out,
) -> Result<Check> {
    let n = *shape.last().unwrap_or(&1);
    let numel: usize = shape.iter().product();
    let xv = random(rng, numel, offset - 2.0, offset + 2.0, dtype);
    let gv = random(rng, n, -2.0, 2.0, wt);
    let bv = random(rng, n, -1.0, 1.0, wt);
    let (x, o, ob) = place(gpu, shape, &xv, dtype, dtype, x_off, out)?;
    let (g, _) = tensor_at(gpu, "gamma", &[n], wt, &gv, 0)?;
    let (b, _) = tensor_at(gpu, "beta", &[n], wt, &bv, 2)?;
    let d = layernorm(
        gpu,
        &x,
        has_g.then_some(&g),
        has_b.then_some(&b),
        &o,
        EPS,
        variant,
    )?;
    let name = format!(
        "{} {shape:?} gamma {has_g} beta {has_b} offset {offset} x@{x_off} out {out:?}",
        d.name
    );
    let mut prog = Program::new();
    prog.push(d);
    prog.run(gpu)?;
    let want = r::layernorm(
        &xv,
        has_g.then_some(&gv[..]),
        has_b.then_some(&bv[..]),
        n,
        EPS as f64,
    );
    let (atol, rtol) = tol(dtype);
    finish(
        gpu,
        compare(name, &gpu.read_f32(&o)?, &want, atol, rtol),
        ob,
        numel,
    )
}

#[allow(clippy::too_many_arguments)]
fn check_gn(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    groups: usize,
    dtype: DType,
    wt: DType,
    silu: bool,
    chunks: Option<usize>,
    x_off: usize,
    out: Out,
) -> Result<Check> {
    let c = shape[1];
    let hw: usize = shape[2..].iter().product();
    let numel: usize = shape.iter().product();
    // A common offset of 3 so the mean matters.
    let xv = random(rng, numel, 1.0, 5.0, dtype);
    let gv = random(rng, c, -2.0, 2.0, wt);
    let bv = random(rng, c, -1.0, 1.0, wt);
    let (x, o, ob) = place(gpu, shape, &xv, dtype, dtype, x_off, out)?;
    let (g, _) = tensor_at(gpu, "gamma", &[c], wt, &gv, 0)?;
    let (b, _) = tensor_at(gpu, "beta", &[c], wt, &bv, 1)?;
    let opts = GroupNormOptions {
        chunks,
        ..GroupNormOptions::new(groups, EPS, silu)
    };
    let ds = groupnorm(gpu, &x, &g, &b, &o, &opts)?;
    let name = format!(
        "{} {shape:?} groups {groups} chunks {chunks:?} x@{x_off} out {out:?}",
        ds[1].name
    );
    let mut prog = Program::new();
    prog.extend(ds);
    prog.run(gpu)?;
    let want = r::groupnorm(&xv, c, hw, groups, &gv, &bv, EPS as f64, silu);
    let (atol, rtol) = tol(dtype);
    // f32: the mean is one f32 (values near 3, half an ulp is 1.2e-7) and x - mean is normalised by
    // a standard deviation of ~1.15, so 4e-7 absolute on top of the relative error.
    finish(
        gpu,
        compare(name, &gpu.read_f32(&o)?, &want, atol.max(4e-7), rtol),
        ob,
        numel,
    )
}
