//! Checks for the layout kernels: upsampling, channel concatenation and permutations, scalar and vec4
//! paths, odd sizes, views at non-zero offsets. These are exact copies, so they are compared exactly
//! (tolerance 0), and the elements around each output view must stay poisoned.

use super::{Check, Rng, compare, float_dtypes, random};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::layout::{concat_channels, permute, upsample_nearest2x};
use crate::memory::Category;
use crate::reference::layout as r;
use crate::tensor::{DType, Tensor};

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for dtype in float_dtypes(gpu) {
        for (shape, xo, oo) in [
            (vec![2, 3, 5, 7], 0, 0),
            (vec![1, 2, 4, 8], 0, 0),
            (vec![1, 3, 3, 4], 3, 1),
            (vec![1, 3, 3, 4], 4, 8),
            (vec![2, 1, 9], 0, 0),
        ] {
            out.push(check_upsample(gpu, rng, &shape, [xo, oo], dtype)?);
        }
        for (sa, cb, offs) in [
            (vec![2, 3, 5, 7], 5, [0, 0, 0]),
            (vec![2, 4, 4, 4], 2, [0, 0, 0]),
            (vec![2, 5, 3, 4], 1, [0, 0, 0]),
            (vec![1, 2, 4, 4], 3, [1, 2, 3]),
            (vec![3, 6, 4], 2, [4, 8, 4]),
        ] {
            out.push(check_concat(gpu, rng, &sa, cb, offs, dtype)?);
        }
        for (shape, perm, xo) in [
            (vec![5, 7], vec![1, 0], 0),
            (vec![37, 45], vec![1, 0], 0),
            (vec![2, 3, 5, 7], vec![0, 1, 2, 3], 0),
            (vec![2, 3, 5, 8], vec![0, 1, 2, 3], 0),
            (vec![2, 3, 5, 7], vec![0, 2, 3, 1], 0),
            (vec![2, 5, 7, 3], vec![0, 3, 1, 2], 0),
            (vec![2, 9, 3, 8], vec![0, 2, 1, 3], 0),
            (vec![2, 9, 3, 5], vec![0, 2, 1, 3], 0),
            (vec![2, 9, 3, 8], vec![0, 2, 1, 3], 1),
            (vec![3, 1, 33, 4], vec![3, 2, 1, 0], 0),
            (vec![4, 6, 5], vec![2, 0, 1], 0),
            (vec![3, 34, 5, 33], vec![2, 0, 3, 1], 3),
            (vec![7], vec![0], 2),
        ] {
            out.push(check_permute(gpu, rng, &shape, &perm, xo, dtype)?);
        }
    }
    out.push(check_rejects(gpu)?);
    Ok(out)
}

/// The builders refuse mismatched shapes and dtypes with an error.
pub fn check_rejects(gpu: &Gpu) -> Result<Check> {
    let t = |shape: &[usize]| gpu.tensor("t", shape, DType::F32, Category::Activations);
    let x = t(&[2, 3, 4, 5])?;
    let bad = [
        upsample_nearest2x(gpu, &x, &t(&[2, 3, 8, 9])?).is_err(),
        upsample_nearest2x(gpu, &t(&[5])?, &t(&[10])?).is_err(),
        concat_channels(gpu, &x, &t(&[2, 2, 4, 6])?, &t(&[2, 5, 4, 5])?).is_err(),
        concat_channels(gpu, &x, &t(&[2, 2, 4, 5])?, &t(&[2, 6, 4, 5])?).is_err(),
        permute(gpu, &x, &[0, 1, 1, 3], &t(&[2, 3, 3, 5])?).is_err(),
        permute(gpu, &x, &[0, 2, 1], &t(&[2, 4, 3])?).is_err(),
        permute(gpu, &x, &[0, 2, 1, 3], &t(&[2, 3, 4, 5])?).is_err(),
        permute(
            gpu,
            &x,
            &[0, 2, 1, 3],
            &gpu.tensor("t", &[2, 4, 3, 5], DType::F16, Category::Activations)?,
        )
        .is_err(),
    ];
    let failed: Vec<usize> = bad
        .iter()
        .enumerate()
        .filter(|(_, r)| !**r)
        .map(|(i, _)| i)
        .collect();
    Ok(Check {
        name: "layout ops reject bad shapes and dtypes".into(),
        passed: failed.is_empty(),
        worst_ratio: 0.0,
        max_abs_err: 0.0,
        atol: 0.0,
        rtol: 0.0,
        detail: if failed.is_empty() {
            String::new()
        } else {
            format!("accepted cases {failed:?}")
        },
    })
}

/// A tensor holding `values` `offset` elements into a larger buffer.
fn placed(
    gpu: &Gpu,
    shape: &[usize],
    dtype: DType,
    values: &[f32],
    offset: usize,
) -> Result<Tensor> {
    let mut all = vec![7.0; offset];
    all.extend_from_slice(values);
    let base = gpu.tensor_from_f32(
        "layout input",
        &[all.len()],
        dtype,
        &all,
        Category::Activations,
    )?;
    base.view(offset, shape)
}

/// A poisoned output `offset` elements into a buffer with a few spare elements after it.
struct Guarded {
    base: Tensor,
    view: Tensor,
    offset: usize,
}

impl Guarded {
    fn new(gpu: &Gpu, shape: &[usize], dtype: DType, offset: usize) -> Result<Guarded> {
        let n: usize = shape.iter().product();
        let base = gpu.tensor(
            "layout out",
            &[offset + n + 6],
            dtype,
            Category::Activations,
        )?;
        gpu.poison(&base)?;
        let view = base.view(offset, shape)?;
        Ok(Guarded { base, view, offset })
    }

    /// Compares exactly and checks nothing outside the view was written.
    fn check(&self, gpu: &Gpu, name: String, want: &[f64]) -> Result<Check> {
        let all = gpu.read_f32(&self.base)?;
        let n = self.view.numel();
        let mut c = compare(name, &all[self.offset..self.offset + n], want, 0.0, 0.0);
        let outside = all[..self.offset]
            .iter()
            .chain(&all[self.offset + n..])
            .filter(|v| !v.is_nan())
            .count();
        if outside > 0 {
            c.passed = false;
            c.detail = format!(
                "{outside} elements written outside the output view; {}",
                c.detail
            );
        }
        Ok(c)
    }
}

fn run(gpu: &Gpu, ds: impl IntoIterator<Item = crate::exec::Dispatch>) -> Result<()> {
    let mut prog = Program::new();
    prog.extend(ds);
    prog.run(gpu)
}

pub fn check_upsample(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    [xo, oo]: [usize; 2],
    dtype: DType,
) -> Result<Check> {
    let n: usize = shape.iter().product();
    let rk = shape.len();
    let (h, w) = (shape[rk - 2], shape[rk - 1]);
    let mut oshape = shape.to_vec();
    oshape[rk - 2] *= 2;
    oshape[rk - 1] *= 2;
    let xv = random(rng, n, -4.0, 4.0, dtype);
    let x = placed(gpu, shape, dtype, &xv, xo)?;
    let out = Guarded::new(gpu, &oshape, dtype, oo)?;
    run(gpu, [upsample_nearest2x(gpu, &x, &out.view)?])?;
    let want = r::upsample_nearest2x(&xv, n / (h * w), h, w);
    out.check(
        gpu,
        format!("upsample_nearest2x {shape:?} offs [{xo}, {oo}] {dtype:?}"),
        &want,
    )
}

pub fn check_concat(
    gpu: &Gpu,
    rng: &mut Rng,
    sa: &[usize],
    cb: usize,
    offs: [usize; 3],
    dtype: DType,
) -> Result<Check> {
    let mut sb = sa.to_vec();
    sb[1] = cb;
    let mut so = sa.to_vec();
    so[1] += cb;
    let inner: usize = sa[2..].iter().product();
    let av = random(rng, sa.iter().product(), -4.0, 4.0, dtype);
    let bv = random(rng, sb.iter().product(), -4.0, 4.0, dtype);
    let a = placed(gpu, sa, dtype, &av, offs[0])?;
    let b = placed(gpu, &sb, dtype, &bv, offs[1])?;
    let out = Guarded::new(gpu, &so, dtype, offs[2])?;
    run(gpu, concat_channels(gpu, &a, &b, &out.view)?)?;
    let want = r::concat_channels(&av, &bv, sa[0], sa[1], cb, inner);
    out.check(
        gpu,
        format!("concat_channels {sa:?} + {sb:?} offs {offs:?} {dtype:?}"),
        &want,
    )
}

pub fn check_permute(
    gpu: &Gpu,
    rng: &mut Rng,
    shape: &[usize],
    perm: &[usize],
    xo: usize,
    dtype: DType,
) -> Result<Check> {
    let n: usize = shape.iter().product();
    let oshape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
    let xv = random(rng, n, -4.0, 4.0, dtype);
    let x = placed(gpu, shape, dtype, &xv, xo)?;
    let out = Guarded::new(gpu, &oshape, dtype, 0)?;
    run(gpu, [permute(gpu, &x, perm, &out.view)?])?;
    let want = r::permute(&xv, shape, perm);
    out.check(
        gpu,
        format!("permute {shape:?} by {perm:?} x offset {xo} {dtype:?}"),
        &want,
    )
}
