//! Checks for the matvec kernels: K not a multiple of any vector width, N not a multiple of the rows
//! per workgroup, batch 1 and 3, f32 and f16 weights (and activations), bias, views at offsets,
//! sharded weights, subgroup and workgroup-memory reductions; and the fused prologues / epilogues
//! (RMSNorm or SwiGLU of the input, residual add, separate or in place) against the unfused f64
//! reference ([`Fuse`], shared with the quantized checks).

use super::matmul::dot_atol;
use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matvec::{MatvecOptions, MatvecVariant, matvec};
use crate::memory::Category;
use crate::reference::elementwise::silu;
use crate::reference::matmul as r;
use crate::reference::norm::rmsnorm;
use crate::tensor::{DType, Tensor};

/// Where a fused check's residual comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Residual {
    #[default]
    None,
    /// Its own tensor (out poisoned).
    Separate,
    /// `out` itself, holding the residual before the dispatch (the decode residual stream).
    InPlace,
}

/// The fused prologue / epilogue of a check ([`MatvecOptions`]'s `norm`, `swiglu`, `residual`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fuse {
    /// RMSNorm of the input with a norm weight of this dtype, at element `g_offset` of its buffer.
    pub norm: Option<DType>,
    pub g_offset: usize,
    /// x rows are `[gate | up]` (2K) and the input is `silu(gate) * up`.
    pub swiglu: bool,
    pub residual: Residual,
    /// GLU epilogue: the weight's rows are gate over up, out = silu(gate) * up (half the rows).
    pub glu: bool,
}

const NORM_EPS: f32 = 1e-5;

impl Fuse {
    /// RMSNorm of the input with a norm weight of dtype `g`.
    pub fn norm(g: DType) -> Fuse {
        Fuse {
            norm: Some(g),
            ..Fuse::default()
        }
    }

    /// SwiGLU of `[gate | up]` input rows, the output added into the residual stream in place (the
    /// decoder's down product).
    pub fn swiglu_in_place() -> Fuse {
        Fuse {
            swiglu: true,
            residual: Residual::InPlace,
            ..Fuse::default()
        }
    }

    pub fn is_some(&self) -> bool {
        *self != Fuse::default()
    }

    /// Length of an x row for a weight with rows of `k`.
    pub fn x_len(&self, k: usize) -> usize {
        if self.swiglu { 2 * k } else { k }
    }

    /// Label for check names.
    pub fn label(&self) -> String {
        let mut s = String::new();
        if let Some(d) = self.norm {
            s += &format!(" +norm({d:?}@{})", self.g_offset);
        }
        if self.swiglu {
            s += " +swiglu";
        }
        if self.glu {
            s += " +glu";
        }
        match self.residual {
            Residual::None => {}
            Residual::Separate => s += " +residual",
            Residual::InPlace => s += " +residual in place",
        }
        s
    }
}

/// A check's fusion tensors on the GPU and their values. Building it fills `out`: the residual
/// values when the residual is in place, NaN poison otherwise.
pub(crate) struct FuseTensors {
    fuse: Fuse,
    g: Option<Tensor>,
    gv: Vec<f32>,
    resid: Option<Tensor>,
    rv: Vec<f32>,
}

impl FuseTensors {
    pub fn new(
        gpu: &Gpu,
        rng: &mut Rng,
        fuse: Fuse,
        k: usize,
        out: &Tensor,
    ) -> Result<FuseTensors> {
        let mut t = FuseTensors {
            fuse,
            g: None,
            gv: Vec::new(),
            resid: None,
            rv: Vec::new(),
        };
        if let Some(gd) = fuse.norm {
            let full = random(rng, fuse.g_offset + k, 0.5, 1.5, gd);
            let g = gpu.tensor_from_f32("g", &[full.len()], gd, &full, Category::Weights)?;
            t.g = Some(g.view(fuse.g_offset, &[k])?);
            t.gv = full[fuse.g_offset..].to_vec();
        }
        if fuse.residual != Residual::None {
            t.rv = random(rng, out.numel(), -1.0, 1.0, out.dtype);
        }
        match fuse.residual {
            Residual::InPlace => gpu.write_tensor_f32(out, &t.rv)?,
            Residual::Separate => {
                t.resid = Some(gpu.tensor_from_f32(
                    "residual",
                    &out.shape,
                    out.dtype,
                    &t.rv,
                    Category::Activations,
                )?);
                gpu.poison(out)?;
            }
            Residual::None => gpu.poison(out)?,
        }
        Ok(t)
    }

    /// `base` with this check's fusions (`out`: the dispatch's output, the in-place residual).
    pub fn options<'a>(&'a self, out: &'a Tensor, base: MatvecOptions<'a>) -> MatvecOptions<'a> {
        MatvecOptions {
            norm: self.g.as_ref().map(|g| (g, NORM_EPS)),
            swiglu: self.fuse.swiglu,
            glu: self.fuse.glu,
            residual: match self.fuse.residual {
                Residual::None => None,
                Residual::Separate => self.resid.as_ref(),
                Residual::InPlace => Some(out),
            },
            ..base
        }
    }

    /// The input the product sees, `[batch, k]`: SwiGLU of x, its RMSNorm, or x itself.
    pub fn prologue(&self, x: &[f32], k: usize) -> Vec<f64> {
        if self.fuse.swiglu {
            x.chunks(2 * k)
                .flat_map(|row| (0..k).map(|i| silu(row[i] as f64) * row[k + i] as f64))
                .collect()
        } else if self.fuse.norm.is_some() {
            rmsnorm(x, &self.gv, k, NORM_EPS as f64)
        } else {
            x.iter().map(|&v| v as f64).collect()
        }
    }

    /// The unfused f64 reference: `out = residual + prologue(x) @ w^T + bias` with `w` `[n, k]` (as
    /// the kernel sees it), `x` `[batch, x_len(k)]`; and the largest `sum_k |w prologue(x)|` (the
    /// scale of the f32 dot products' rounding error).
    pub fn reference(
        &self,
        w: &[f32],
        x: &[f32],
        bias: Option<&[f32]>,
        batch: usize,
        n: usize,
        k: usize,
    ) -> (Vec<f64>, f64) {
        let xin = self.prologue(x, k);
        let mut out = vec![0.0; batch * n];
        let mut scale = 0.0f64;
        for b in 0..batch {
            for r in 0..n {
                let (mut acc, mut abs) = (0.0, 0.0);
                for i in 0..k {
                    let t = w[r * k + i] as f64 * xin[b * k + i];
                    acc += t;
                    abs += t.abs();
                }
                scale = scale.max(abs);
                out[b * n + r] = acc
                    + bias.map_or(0.0, |v| v[r] as f64)
                    + self.rv.get(b * n + r).map_or(0.0, |&v| v as f64);
            }
        }
        (out, scale)
    }
}

/// Tolerance of a fused output: f32 accumulation, plus the norm's reduced sum of squares and
/// inverseSqrt (a few ulp) or SwiGLU's exp and division (a few ulp per input) relative to the
/// products' magnitude `scale`.
pub(crate) fn fused_atol(scale: f64) -> f64 {
    5e-7 * scale + 1e-6
}

/// The GLU of the products of a `[2N]` row (gate over up): silu(gate) * up, and its tolerance from
/// the products' `atol`: |d(silu(g) u)| <= (|silu'(g)| |u| + |silu(g)|) atol, with |silu'| < 1.1,
/// plus the exp and division (a few ulp of the result).
pub(crate) fn glu_reference(products: &[f64], atol: f64) -> (Vec<f64>, f64) {
    let half = products.len() / 2;
    let (gate, up) = products.split_at(half);
    let mut worst = 0.0f64;
    let out = gate
        .iter()
        .zip(up)
        .map(|(&g, &u)| {
            let s = silu(g);
            worst = worst.max(1.1 * u.abs() + s.abs() + 1.0);
            s * u
        })
        .collect();
    (out, worst * atol + 1e-6)
}

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
    /// [`MatvecOptions::max_stage_bytes`].
    pub max_stage_bytes: Option<u32>,
    /// [`MatvecOptions::rows_per_workgroup`].
    pub rows_per_workgroup: Option<usize>,
    /// [`MatvecOptions::prefetch`].
    pub prefetch: Option<bool>,
    /// [`MatvecOptions::teams`].
    pub teams: Option<usize>,
    pub fuse: Fuse,
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
                max_stage_bytes: None,
                rows_per_workgroup: None,
                prefetch: None,
                teams: None,
                fuse: Fuse::default(),
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
        // The decode fusions, on the decode weight dtype (f16 where the device has it).
        let w_dtype = *wdtypes.last().expect("f32 at least");
        let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        for case in fused_cases(w_dtype, io, variant) {
            out.push(check(gpu, rng, &case)?);
        }
        for case in staged_cases(gpu, w_dtype, io, variant) {
            out.push(check(gpu, rng, &case)?);
        }
        if variant == MatvecVariant::Subgroup {
            for case in row_group_cases(w_dtype, io) {
                out.push(check(gpu, rng, &case)?);
            }
            // The staged cases again with the first weight loads issued before the staging.
            for case in staged_cases(gpu, w_dtype, io, variant)
                .into_iter()
                .chain(row_group_cases(w_dtype, io))
            {
                let case = Case {
                    prefetch: Some(true),
                    ..case
                };
                out.push(check(gpu, rng, &case)?);
            }
        }
    }
    Ok(out)
}

/// More rows per workgroup than subgroups (each subgroup takes several rows after one staged
/// input): the GLU epilogue over 16- and 32-row workgroups, the staged norm with a partial last
/// workgroup, batch rows with scalar loads, the residual in place.
fn row_group_cases(w_dtype: DType, io: DType) -> Vec<Case> {
    let c = |batch, n, k, x_dtype, fuse, rows| Case {
        batch,
        n,
        k,
        w_dtype,
        x_dtype,
        out_dtype: DType::F32,
        bias: false,
        w_offset: 0,
        x_offset: 0,
        variant: MatvecVariant::Subgroup,
        max_shard_bytes: None,
        max_stage_bytes: None,
        rows_per_workgroup: Some(rows),
        prefetch: None,
        teams: None,
        fuse,
    };
    let in_place = Fuse {
        residual: Residual::InPlace,
        ..Fuse::default()
    };
    let glu = Fuse {
        glu: true,
        ..Fuse::norm(DType::F32)
    };
    vec![
        Case {
            out_dtype: io,
            ..c(1, 64, 256, DType::F32, glu, 32)
        },
        Case {
            out_dtype: io,
            ..c(1, 48, 130, DType::F32, glu, 16)
        },
        c(1, 37, 256, DType::F32, Fuse::norm(DType::F32), 16),
        c(1, 75, 256, DType::F32, Fuse::norm(DType::F32), 64),
        c(3, 19, 130, DType::F32, Fuse::norm(DType::F32), 32),
        c(1, 37, 256, io, in_place, 32),
        // Fewer rows than subgroups: the workgroup shrinks to one subgroup per row (plain products).
        c(1, 37, 256, io, in_place, 2),
        c(3, 19, 130, DType::F32, Fuse::default(), 4),
        c(1, 33, 1000, io, Fuse::default(), 2),
        // Two or four subgroups per row (subgroups of 32 only), a partial last workgroup.
        Case {
            teams: Some(2),
            ..c(1, 37, 256, io, in_place, 4)
        },
        Case {
            teams: Some(4),
            ..c(1, 33, 1000, io, Fuse::default(), 2)
        },
        Case {
            teams: Some(2),
            bias: true,
            ..c(1, 75, 2056, DType::F32, in_place, 4)
        },
    ]
}

/// The fused cases as a decoder layer uses them (QKV / gate-up: norm of the f32 residual stream;
/// O: residual in place; down: SwiGLU of the `io` gate-up output and residual in place), plus
/// separate residuals, batch rows, scalar loads (K of no vector width, g and x at odd offsets),
/// bias and row shards.
fn fused_cases(w_dtype: DType, io: DType, variant: MatvecVariant) -> Vec<Case> {
    let c = |batch, n, k, x_dtype, fuse| Case {
        batch,
        n,
        k,
        w_dtype,
        x_dtype,
        out_dtype: DType::F32,
        bias: false,
        w_offset: 0,
        x_offset: 0,
        variant,
        max_shard_bytes: None,
        max_stage_bytes: None,
        rows_per_workgroup: None,
        prefetch: None,
        teams: None,
        fuse,
    };
    let norm = Fuse::norm;
    let in_place = Fuse {
        residual: Residual::InPlace,
        ..Fuse::default()
    };
    let swiglu_res = Fuse::swiglu_in_place();
    vec![
        // QKV: norm into an f32 output.
        c(1, 37, 256, DType::F32, norm(DType::F32)),
        // gate-up: norm into the io dtype, f16 norm weight at an odd offset, bias.
        Case {
            out_dtype: io,
            bias: true,
            ..c(
                1,
                41,
                256,
                DType::F32,
                Fuse {
                    g_offset: 1,
                    ..norm(io)
                },
            )
        },
        // Batch rows with scalar loads (K = 130).
        c(3, 19, 130, DType::F32, norm(DType::F32)),
        // O: residual in place, io input.
        c(1, 37, 256, io, in_place),
        // A separate residual with bias, batch rows.
        Case {
            bias: true,
            ..c(
                3,
                33,
                64,
                DType::F32,
                Fuse {
                    residual: Residual::Separate,
                    ..Fuse::default()
                },
            )
        },
        // gate-up with the GLU epilogue into the io dtype (the decode MLP of float models): norm
        // prologue with bias; K of no vector width; and without a prologue.
        Case {
            out_dtype: io,
            bias: true,
            ..c(
                1,
                48,
                256,
                DType::F32,
                Fuse {
                    glu: true,
                    ..norm(DType::F32)
                },
            )
        },
        Case {
            out_dtype: io,
            ..c(
                1,
                24,
                130,
                io,
                Fuse {
                    glu: true,
                    ..Fuse::default()
                },
            )
        },
        // down: SwiGLU of the io gate-up rows, residual in place; batch rows with scalar loads.
        c(1, 37, 256, io, swiglu_res),
        c(3, 9, 130, io, swiglu_res),
        // Row shards: every shard sees all of K.
        Case {
            max_shard_bytes: Some(4096),
            ..c(
                1,
                45,
                256,
                DType::F32,
                Fuse {
                    residual: Residual::Separate,
                    ..norm(DType::F32)
                },
            )
        },
    ]
}

/// The staged input (one batch row with a prologue; the batch-1 fused cases above stage all of K):
/// K of no vector width (a partial last vec4), K just past what the device's workgroup memory stages
/// (the rest computed per row), a small staging limit (a long per-row tail, and the norm's sum of
/// squares over staged and unstaged elements) and staging turned off (the per-row path at batch 1).
fn staged_cases(gpu: &Gpu, w_dtype: DType, io: DType, variant: MatvecVariant) -> Vec<Case> {
    let c = |n, k, x_dtype, fuse, max_stage_bytes| Case {
        batch: 1,
        n,
        k,
        w_dtype,
        x_dtype,
        out_dtype: DType::F32,
        bias: false,
        w_offset: 0,
        x_offset: 0,
        variant,
        max_shard_bytes: None,
        max_stage_bytes,
        rows_per_workgroup: None,
        prefetch: None,
        teams: None,
        fuse,
    };
    let norm = Fuse::norm(DType::F32);
    let swiglu = Fuse::swiglu_in_place();
    // A K the device cannot stage whole (and a multiple of 8: f16 weights keep their vector loads).
    let past = past_stage_limit(gpu) + 40;
    vec![
        c(19, 130, DType::F32, norm, None),
        c(19, 130, io, swiglu, None),
        c(9, past, DType::F32, norm, None),
        c(9, past, io, swiglu, None),
        c(21, 1000, DType::F32, norm, Some(1024)),
        c(21, 1000, io, swiglu, Some(1024)),
        c(21, 1000, DType::F32, norm, Some(0)),
    ]
}

/// How the dispatches stage the input, for check names: ` staged` (all of K), ` staged+tail` or
/// nothing.
pub(crate) fn staging_label(ds: &[crate::exec::Dispatch]) -> &'static str {
    match ds.first().map(|d| d.name.as_str()) {
        Some(n) if n.contains("_stagepart") => " staged+tail",
        Some(n) if n.contains("_stage") => " staged",
        _ => "",
    }
}

/// More elements than the device can stage (f32 in its workgroup memory).
pub(crate) fn past_stage_limit(gpu: &Gpu) -> usize {
    gpu.caps.max_workgroup_storage as usize / 4
}

pub fn check(gpu: &Gpu, rng: &mut Rng, c: &Case) -> Result<Check> {
    let (batch, n, k) = (c.batch, c.n, c.k);
    let xk = c.fuse.x_len(k);
    let wv = random(rng, c.w_offset + n * k, -1.0, 1.0, c.w_dtype);
    let xv = random(rng, c.x_offset + batch * xk, -1.0, 1.0, c.x_dtype);
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
            rows_per_workgroup: c.rows_per_workgroup,
            prefetch: c.prefetch,
            teams: c.teams,
            ..Default::default()
        },
    );
    let mut prog = Program::new();
    let ds = matvec(gpu, &w, &x, &o, &opts)?;
    let staged = super::matvec::staging_label(&ds);
    let dispatch_names: Vec<String> = ds.iter().map(|d| d.name.clone()).collect();
    prog.extend(ds);
    let dispatches = prog.len();
    prog.run(gpu)?;
    let bias_v = c.bias.then_some(&bv[..]);
    let (want, atol) = if c.fuse.is_some() {
        let (want, scale) =
            fused.reference(&wv[c.w_offset..], &xv[c.x_offset..], bias_v, batch, n, k);
        if c.fuse.glu {
            glu_reference(&want, fused_atol(scale))
        } else {
            (want, fused_atol(scale))
        }
    } else {
        let want = r::matvec(&wv[c.w_offset..], &xv[c.x_offset..], bias_v, batch, n, k);
        (want, dot_atol(k))
    };
    let mut name = format!(
        "matvec {:?} {batch}x[{n}, {k}]{}{} w {:?} x {:?} out {:?}",
        c.variant,
        if c.bias { " +bias" } else { "" },
        c.fuse.label(),
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
    if let Some(m) = c.max_stage_bytes {
        name += &format!(" stage<={m}B");
    }
    if let Some(r) = c.rows_per_workgroup {
        name += &format!(" {r} rows/wg");
    }
    if c.prefetch == Some(true) {
        name += " prefetch";
    }
    name += staged;
    let teamed = c.teams.filter(|&t| t > 1).map(|t| {
        (
            t,
            dispatch_names.iter().any(|d| d.contains(&format!("_t{t}"))),
        )
    });
    if let Some((t, taken)) = teamed {
        name += &format!(
            " {t} subgroups/row{}",
            if taken { "" } else { " (not taken)" }
        );
    }
    let mut check = compare(
        name,
        &gpu.read_f32(&o)?,
        &want,
        atol,
        store_rtol(c.out_dtype),
    );
    // On subgroups of 32 the teams must have been used, or the check would pass on the plain path.
    if let Some((_, false)) = teamed
        && gpu.caps.subgroup_min_size == 32
        && gpu.caps.subgroup_max_size == 32
    {
        check.passed = false;
        check.detail = "the subgroups-per-row path was not taken".into();
    }
    Ok(check)
}
