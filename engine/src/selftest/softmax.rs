//! Checks for the softmax kernels, and test helpers shared by this family's checks (tensors placed
//! at an element offset inside a larger buffer, as the arena hands them out).

use super::{Check, Rng, compare, float_dtypes, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::softmax::{RowVariant, SoftmaxOptions, softmax};
use crate::memory::Category;
use crate::reference::softmax as r;
use crate::tensor::{DType, Tensor};

/// Row variants this device can run.
pub(crate) fn row_variants(gpu: &Gpu) -> Vec<RowVariant> {
    if gpu.caps.subgroup {
        vec![
            RowVariant::Workgroup,
            RowVariant::WorkgroupSubgroup,
            RowVariant::Subgroup,
        ]
    } else {
        vec![RowVariant::Workgroup]
    }
}

/// A tensor holding `values` that starts `off` elements into a larger buffer whose other bytes are
/// NaN; also returns the whole buffer.
pub(crate) fn tensor_at(
    gpu: &Gpu,
    label: &str,
    shape: &[usize],
    dtype: DType,
    values: &[f32],
    off: usize,
) -> Result<(Tensor, Tensor)> {
    let mut all = vec![f32::NAN; off + values.len() + 5];
    all[off..off + values.len()].copy_from_slice(values);
    let base = gpu.tensor_from_f32(label, &[all.len()], dtype, &all, Category::Activations)?;
    Ok((base.view(off, shape)?, base))
}

/// A poisoned output of `shape` starting `off` elements into a larger poisoned buffer; also returns
/// the whole buffer.
pub(crate) fn output_at(
    gpu: &Gpu,
    label: &str,
    shape: &[usize],
    dtype: DType,
    off: usize,
) -> Result<(Tensor, Tensor)> {
    let n: usize = shape.iter().product();
    let base = gpu.tensor(label, &[off + n + 5], dtype, Category::Activations)?;
    gpu.poison(&base)?;
    Ok((base.view(off, shape)?, base))
}

/// Whether the values of `base` outside `[off, off + n)` are still NaN (nothing written outside the
/// view).
pub(crate) fn outside_untouched(gpu: &Gpu, base: &Tensor, off: usize, n: usize) -> Result<bool> {
    let all = gpu.read_f32(base)?;
    Ok(all
        .iter()
        .enumerate()
        .all(|(i, v)| (off..off + n).contains(&i) || v.is_nan()))
}

/// Fails `c` when something was written outside the output view.
pub(crate) fn guard(mut c: Check, untouched: bool) -> Check {
    if !untouched {
        c.passed = false;
        c.detail = format!("wrote outside the output view; {}", c.detail);
    }
    c
}

/// Where the output goes in a check.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Out {
    /// Its own buffer, `off` elements in.
    Own(usize),
    /// The same tensor as the input (in place).
    InPlace,
    /// Another range of the input's buffer (as in an arena), after the input.
    SameBuffer,
}

struct Case {
    shape: Vec<usize>,
    tx: DType,
    to: DType,
    variant: RowVariant,
    scale: f32,
    causal: Option<(usize, usize)>,
    x_off: usize,
    out: Out,
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut cases = Vec::new();
    let rows = [1, 5, 33];
    let ns = [1, 3, 31, 64, 257, 1000];
    for dtype in float_dtypes(gpu) {
        for variant in row_variants(gpu) {
            for (i, &n) in ns.iter().enumerate() {
                cases.push(Case {
                    shape: vec![rows[i % 3], n],
                    tx: dtype,
                    to: dtype,
                    variant,
                    scale: 1.0,
                    causal: None,
                    x_off: 0,
                    out: Out::Own(0),
                });
            }
            // Causal, q_offset 0 and > 0, heads as a leading dimension; a scale that would overflow
            // exp without the max subtraction; views at offsets (vec4-aligned and not).
            for (shape, causal, x_off, out) in [
                (vec![2, 5, 40], (5, 0), 4, Out::Own(8)),
                (vec![3, 7, 257], (7, 9), 3, Out::Own(1)),
                (vec![33, 64], (11, 53), 0, Out::InPlace),
                (vec![4, 1], (4, 0), 0, Out::SameBuffer),
            ] {
                cases.push(Case {
                    shape,
                    tx: dtype,
                    to: dtype,
                    variant,
                    scale: 3.0,
                    causal: Some(causal),
                    x_off,
                    out,
                });
            }
        }
    }
    if gpu.caps.f16 {
        // Mixed precision: f16 scores in, f32 probabilities out, and back.
        for (tx, to, n) in [(DType::F16, DType::F32, 1000), (DType::F32, DType::F16, 68)] {
            cases.push(Case {
                shape: vec![5, n],
                tx,
                to,
                variant: RowVariant::Auto,
                scale: 0.125,
                causal: None,
                x_off: 0,
                out: Out::Own(0),
            });
        }
    }
    // Rows too long to hold in registers (streamed twice), causal and not, vec4 and scalar.
    for (shape, causal, variant) in [
        (vec![2, 70001], None, RowVariant::Auto),
        (vec![2, 65600], Some((2, 65000)), RowVariant::Workgroup),
    ] {
        cases.push(Case {
            shape,
            tx: DType::F32,
            to: DType::F32,
            variant,
            scale: 1.0,
            causal,
            x_off: 0,
            out: Out::Own(0),
        });
    }
    cases.push(Case {
        shape: vec![3, 2, 100],
        tx: DType::F32,
        to: DType::F32,
        variant: RowVariant::Auto,
        scale: 1.0,
        causal: None,
        x_off: 0,
        out: Out::SameBuffer,
    });
    cases.iter().map(|c| check(gpu, rng, c)).collect()
}

fn check(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Check> {
    let numel: usize = c.shape.iter().product();
    let n = *c.shape.last().unwrap_or(&1);
    // |scale * x| up to 60: exp would overflow f32 past ~88 without the max subtraction.
    let lim = 20.0;
    let xv = random(rng, numel, -lim, lim, c.tx);
    let (x, xbase) = match c.out {
        Out::SameBuffer => {
            let mut all = xv.clone();
            all.extend(std::iter::repeat_n(f32::NAN, numel + 3));
            let base = gpu.tensor_from_f32("x", &[all.len()], c.tx, &all, Category::Activations)?;
            (base.view(0, &c.shape)?, base)
        }
        _ => tensor_at(gpu, "x", &c.shape, c.tx, &xv, c.x_off)?,
    };
    let (o, obase, o_off) = match c.out {
        Out::Own(off) => {
            let (o, b) = output_at(gpu, "out", &c.shape, c.to, off)?;
            (o, b, off)
        }
        Out::InPlace => (x.clone(), xbase.clone(), c.x_off),
        Out::SameBuffer => {
            let o = xbase.view(numel + 3, &c.shape)?;
            (o, xbase.clone(), numel + 3)
        }
    };
    let opts = SoftmaxOptions {
        scale: c.scale,
        causal: c.causal,
        variant: c.variant,
    };
    let mut prog = Program::new();
    let d = softmax(gpu, &x, &o, &opts)?;
    let kname = d.name.clone();
    prog.push(d);
    prog.run(gpu)?;
    let want = r::softmax(&xv, n, c.scale as f64, c.causal);
    let got = gpu.read_f32(&o)?;
    // f32: exp and the f32 rounding of scale * x (|y| <= 60, half an ulp is 2e-6 relative in exp);
    // f16 stores may flush subnormals, so atol is f16's smallest normal.
    let (atol, rtol) = match c.to {
        DType::F16 => (6.2e-5, store_rtol(DType::F16)),
        _ => (1e-7, 1e-5),
    };
    let untouched = match c.out {
        Out::Own(_) => outside_untouched(gpu, &obase, o_off, numel)?,
        _ => true,
    };
    Ok(guard(
        compare(
            format!(
                "{kname} {:?} scale {} causal {:?} x@{} out {:?}",
                c.shape, c.scale, c.causal, c.x_off, c.out
            ),
            &got,
            &want,
            atol,
            rtol,
        ),
        untouched,
    ))
}
