//! Checks for the QKV split (`qkv_rope`) and the matrix-vector kernels' RoPE epilogue that replaces it
//! in decode: q rotated into its own tensor, k rotated and v copied into the KV-cache rows of the
//! step's positions, against an f64 reference (exact angles). Both pairing styles, partial rotary dims,
//! llama3 frequency factors, grouped KV heads, positions past the 12-bit pieces of the angle reduction
//! and at 30000, f32 and f16 caches, caches and q sharing buffers with other tensors (as in an arena);
//! the epilogue on float weights and on quantized ones (the integer-dot-product kernel).
//! Every cache row but the step's must stay as poisoned, and nothing outside q may be written.

use super::matvec::{Fuse, FuseTensors, fused_atol};
use super::quant::{int8_input_error, random_blocks, upload_weight};
use super::softmax::guard;
use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matvec::{MatvecOptions, MatvecVariant};
use crate::kernels::qkv_rope::{QkvRope, QkvTargets, RopePairs, qkv_rope, rope_turns};
use crate::kernels::quant::{matvec_quant, uses_dp4a};
use crate::memory::Category;
use crate::reference::quant::dequantize;
use crate::tensor::{DType, Layout, Tensor};
use rand::Rng as _;

/// One split: `heads` as (q, kv), head dim `d` with `rot` rotary dims, T tokens from position `pos0`
/// in a cache of `max_ctx` rows.
#[derive(Clone, Copy, Debug)]
struct Split {
    hq: usize,
    hkv: usize,
    d: usize,
    rot: usize,
    pairs: RopePairs,
    theta: f64,
    factors: bool,
    pos0: usize,
    max_ctx: usize,
    /// q and cache dtype.
    io: DType,
    /// k and v cache views of one buffer (else a buffer each).
    shared_cache: bool,
}

impl Split {
    fn heads(&self) -> usize {
        self.hq + 2 * self.hkv
    }

    /// Rows of the stacked projection.
    fn rows(&self) -> usize {
        self.heads() * self.d
    }

    fn label(&self) -> String {
        format!(
            "{}+2x{} heads of {} (rot {}, {:?}{}) at {} of {} {:?}{}",
            self.hq,
            self.hkv,
            self.d,
            self.rot,
            self.pairs,
            if self.factors { ", factors" } else { "" },
            self.pos0,
            self.max_ctx,
            self.io,
            if self.shared_cache {
                ", k and v in one buffer"
            } else {
                ""
            }
        )
    }
}

/// A split's GPU targets: poisoned caches, the step state and the frequency table; plus the f64
/// frequencies.
struct Targets {
    cache: Tensor,
    k: Tensor,
    v: Tensor,
    step: Tensor,
    turns: Tensor,
    freqs: Vec<f64>,
}

impl Targets {
    fn new(gpu: &Gpu, rng: &mut Rng, s: &Split, tokens: usize) -> Result<Targets> {
        let rows = s.max_ctx * s.hkv * s.d;
        // One buffer with room for both caches and a gap (the shared layout), or the k cache alone.
        let len = if s.shared_cache { 2 * rows + 8 } else { rows };
        let cache = gpu.tensor("kv cache", &[len], s.io, Category::Activations)?;
        gpu.poison(&cache)?;
        let shape = [s.max_ctx, s.hkv, s.d];
        let (k, v) = if s.shared_cache {
            (cache.view(3, &shape)?, cache.view(rows + 8, &shape)?)
        } else {
            let v = gpu.tensor("v cache", &shape, s.io, Category::Activations)?;
            gpu.poison(&v)?;
            (cache.view(0, &shape)?, v)
        };
        let step_words = [9u32, 9, (s.pos0 + tokens) as u32, s.pos0 as u32];
        let step_all = gpu.tensor_from_bytes(
            "step",
            &[4],
            DType::U32,
            Layout::RowMajor,
            bytemuck::cast_slice(&step_words),
            Category::Activations,
        )?;
        let factors: Vec<f32> = (0..s.rot / 2).map(|_| rng.random_range(1.0..8.0)).collect();
        let factors = s.factors.then_some(&factors[..]);
        let freqs = (0..s.rot / 2)
            .map(|i| {
                s.theta.powf(-((2 * i) as f64) / s.rot as f64)
                    / factors.map_or(1.0, |f| f[i] as f64)
            })
            .collect();
        let table = rope_turns(s.theta, s.rot, factors);
        Ok(Targets {
            cache,
            k,
            v,
            step: step_all.view(2, &[2])?,
            turns: gpu.tensor_from_f32(
                "rope turns",
                &[s.rot / 2, 2],
                DType::F32,
                &table,
                Category::Weights,
            )?,
            freqs,
        })
    }

    fn qkv_targets(&self, s: &Split) -> QkvTargets<'_> {
        QkvTargets {
            k_cache: &self.k,
            v_cache: &self.v,
            step: &self.step,
            turns: &self.turns,
            hq: s.hq,
            hkv: s.hkv,
            pairs: s.pairs,
        }
    }

    /// Compares q (`[T, hq, d]` from `q`) and the caches' rows pos0.. with the split of `want`
    /// (`[T, rows]` projections, f64) and checks that every other cache row still holds poison.
    fn compare(
        &self,
        gpu: &Gpu,
        name: String,
        s: &Split,
        q: &Tensor,
        want: &[f64],
        atol: f64,
    ) -> Result<Check> {
        let tokens = want.len() / s.rows();
        let split = reference_split(s, &self.freqs, want);
        let mut got = gpu.read_f32(q)?;
        let k_all = gpu.read_f32(&self.k)?;
        let v_all = gpu.read_f32(&self.v)?;
        let row = s.hkv * s.d;
        let first = s.pos0 * row;
        let last = (s.pos0 + tokens) * row;
        got.extend_from_slice(&k_all[first..last]);
        got.extend_from_slice(&v_all[first..last]);
        // Poison everywhere else: other cache rows, and the gaps of the shared buffer.
        let written = |i: usize| (first..last).contains(&i);
        let mut untouched = k_all
            .iter()
            .chain(&v_all)
            .enumerate()
            .all(|(i, v)| written(i % k_all.len()) || v.is_nan());
        if s.shared_cache {
            let all = gpu.read_f32(&self.cache)?;
            let (k0, v0) = (3, s.max_ctx * row + 8);
            untouched &= all.iter().enumerate().all(|(i, v)| {
                (k0 + first..k0 + last).contains(&i)
                    || (v0 + first..v0 + last).contains(&i)
                    || v.is_nan()
            });
        }
        Ok(guard(
            compare(name, &got, &split, atol, store_rtol(s.io)),
            untouched,
        ))
    }
}

/// The f64 split of `[T, (hq + 2 hkv) d]` projections at positions pos0..: q `[T, hq, d]`, then the
/// k rows, then the v rows (`[T, hkv, d]` each), q and k rotated with exact angles.
fn reference_split(s: &Split, freqs: &[f64], proj: &[f64]) -> Vec<f64> {
    let tokens = proj.len() / s.rows();
    let mut rotated = proj.to_vec();
    for t in 0..tokens {
        let pos = (s.pos0 + t) as f64;
        for h in 0..s.hq + s.hkv {
            let base = t * s.rows() + h * s.d;
            for (i, f) in freqs.iter().enumerate() {
                let (e0, e1) = match s.pairs {
                    RopePairs::Interleaved => (2 * i, 2 * i + 1),
                    RopePairs::HalfSplit => (i, i + s.rot / 2),
                };
                let (sin, cos) = (pos * f).sin_cos();
                let (a, b) = (proj[base + e0], proj[base + e1]);
                rotated[base + e0] = a * cos - b * sin;
                rotated[base + e1] = a * sin + b * cos;
            }
        }
    }
    let part = |h0: usize, h1: usize| {
        (0..tokens)
            .flat_map(|t| rotated[t * s.rows() + h0 * s.d..t * s.rows() + h1 * s.d].to_vec())
            .collect::<Vec<_>>()
    };
    let mut out = part(0, s.hq);
    out.extend(part(s.hq, s.hq + s.hkv));
    out.extend(part(s.hq + s.hkv, s.heads()));
    out
}

/// The largest |(a, b)| over rotary pairs of `proj` (what an angle error scales).
fn largest_pair(proj: &[f64]) -> f64 {
    proj.chunks(2)
        .map(|p| p.iter().map(|v| v * v).sum::<f64>().sqrt())
        .fold(0.0, f64::max)
}

/// Angle error of the kernels' cos/sin (rope_angle.wgsl: ~1e-6 at any position below 2^24), with
/// margin.
const ANGLE_ERR: f64 = 2e-6;

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let base = Split {
        hq: 4,
        hkv: 2,
        d: 16,
        rot: 16,
        pairs: RopePairs::HalfSplit,
        theta: 10000.0,
        factors: false,
        pos0: 5,
        max_ctx: 8,
        io,
        shared_cache: true,
    };
    // Partial rotary dims, interleaved, llama3 factors, one kv head, position 30000 (f32 caches).
    let far = Split {
        hq: 3,
        hkv: 1,
        d: 24,
        rot: 12,
        pairs: RopePairs::Interleaved,
        theta: 500000.0,
        factors: true,
        pos0: 30000,
        max_ctx: 30002,
        io: DType::F32,
        shared_cache: false,
    };
    // Heads of 8 (a workgroup's 4 pairs span a head), position 0, positions across 4096.
    let small = Split {
        hq: 2,
        hkv: 2,
        d: 8,
        rot: 8,
        pos0: 0,
        ..base
    };
    let across = Split {
        pos0: 4094,
        max_ctx: 4100,
        shared_cache: false,
        ..base
    };
    let mut out = Vec::new();
    for (s, tokens, slices) in [
        (base, 3, 1),
        (far, 1, 1),
        (across, 4, 1),
        (base, 3, 4),
        (across, 2, 2),
    ] {
        out.push(check_split(gpu, rng, &s, tokens, slices)?);
    }
    // The decode QKV product: RMSNorm prologue, f16 weights where the device has them; K of no vector
    // width (scalar loads) without a prologue; x and q in one buffer (f32 q).
    let mut products = vec![
        (base, 64, io, true),
        (far, 130, DType::F32, false),
        (small, 256, io, true),
        (across, 64, io, false),
    ];
    let mut variants = vec![MatvecVariant::Workgroup];
    if gpu.caps.subgroup {
        variants.push(MatvecVariant::Subgroup);
    }
    for variant in variants {
        for &(s, k, w_dtype, norm) in &products {
            out.push(check_epilogue(
                gpu,
                rng,
                &s,
                k,
                w_dtype,
                norm,
                variant,
                (None, None),
            )?);
        }
    }
    if gpu.caps.subgroup {
        // Float weights over 16- and 32-row workgroups (several rows per subgroup), and with the
        // first weight loads issued before the staging.
        for (s, k, rows, prefetch) in [
            (base, 64, 32, false),
            (small, 256, 16, false),
            (small, 256, 8, true),
            (base, 64, 32, true),
        ] {
            out.push(check_epilogue(
                gpu,
                rng,
                &s,
                k,
                io,
                true,
                MatvecVariant::Subgroup,
                (Some(rows), Some(prefetch)),
            )?);
        }
    }
    if gpu.caps.subgroup {
        // Quantized weights on the integer-dot-product kernel (rows in whole 32-row workgroups).
        let interleaved = Split {
            pairs: RopePairs::Interleaved,
            rot: 8,
            factors: true,
            ..across
        };
        // Llama 3 8B's QKV (6144 rows): 16-row workgroups (see `quant::rows_per_team`).
        let llama8b = Split {
            hq: 32,
            hkv: 8,
            d: 128,
            rot: 128,
            theta: 500000.0,
            factors: true,
            pos0: 100,
            max_ctx: 104,
            shared_cache: false,
            ..base
        };
        products = vec![
            (base, 64, DType::Q4_0, true),
            (interleaved, 96, DType::Q8_0, true),
            (base, 64, DType::Q4_1, false),
            (llama8b, 4096, DType::Q4_0, true),
        ];
        for &(s, k, w_dtype, norm) in &products {
            out.push(check_epilogue(
                gpu,
                rng,
                &s,
                k,
                w_dtype,
                norm,
                MatvecVariant::Auto,
                (None, None),
            )?);
        }
    }
    Ok(out)
}

/// The split kernel over `tokens` tokens of random f32 projections, given as `slices` partial sums
/// (a split-K product's) when more than 1.
fn check_split(gpu: &Gpu, rng: &mut Rng, s: &Split, tokens: usize, slices: usize) -> Result<Check> {
    let n = tokens * s.rows();
    let proj = random(rng, slices * n, -2.0, 2.0, DType::F32);
    let shape = if slices > 1 {
        vec![slices, tokens, s.rows()]
    } else {
        vec![tokens, s.rows()]
    };
    let qkv = gpu.tensor_from_f32("qkv", &shape, DType::F32, &proj, Category::Activations)?;
    let q = gpu.tensor("q", &[tokens, s.hq, s.d], s.io, Category::Activations)?;
    gpu.poison(&q)?;
    let tg = Targets::new(gpu, rng, s, tokens)?;
    let d = qkv_rope(
        gpu,
        &QkvRope {
            qkv: &qkv,
            slices,
            q_out: &q,
            to: tg.qkv_targets(s),
        },
    )?;
    let name = format!("{} {} x{tokens} in {slices} slices", d.name, s.label());
    let mut prog = Program::new();
    prog.push(d);
    prog.run(gpu)?;
    // The slices summed in f64; the kernel's f32 sum of `slices` terms errs by at most
    // (slices - 1) f32 roundings of the running sum (|sum| <= 2 slices), allowed for below.
    let want: Vec<f64> = (0..n)
        .map(|i| (0..slices).map(|j| proj[j * n + i] as f64).sum())
        .collect();
    let sum_err = (slices - 1) as f64 * 2.0 * slices as f64 * f32::EPSILON as f64;
    let atol = ANGLE_ERR * largest_pair(&want) + 1e-7 + sum_err;
    tg.compare(gpu, name, s, &q, &want, atol)
}

/// The RoPE epilogue of a `[rows, k]` product (with an RMSNorm prologue when `norm`).
#[allow(clippy::too_many_arguments)]
fn check_epilogue(
    gpu: &Gpu,
    rng: &mut Rng,
    s: &Split,
    k: usize,
    w_dtype: DType,
    norm: bool,
    variant: MatvecVariant,
    (rows_per_workgroup, prefetch): (Option<usize>, Option<bool>),
) -> Result<Check> {
    let n = s.rows();
    let (w, wv) = if w_dtype.is_quantized() {
        let bytes = random_blocks(rng, w_dtype, n * k / w_dtype.block_elems());
        let w = upload_weight(gpu, w_dtype, &bytes, 0, n, k)?;
        (w, dequantize(w_dtype, &bytes))
    } else {
        let wv = random(rng, n * k, -1.0, 1.0, w_dtype);
        let w = gpu.tensor_from_f32("w", &[n, k], w_dtype, &wv, Category::Weights)?;
        (w, wv)
    };
    let xv = random(rng, k, -1.0, 1.0, DType::F32);
    // x and q in one poisoned buffer, q after x and a gap, as in the decode arena (with f32 q; an f16
    // q shares its buffer with nothing).
    let q_off = k + 4;
    let act = gpu.tensor(
        "x and q",
        &[q_off + s.hq * s.d + 4],
        s.io,
        Category::Activations,
    )?;
    gpu.poison(&act)?;
    let x = if s.io == DType::F32 {
        gpu.write_tensor_f32(&act.view(0, &[k])?, &xv)?;
        act.view(0, &[1, k])?
    } else {
        gpu.tensor_from_f32("x", &[1, k], DType::F32, &xv, Category::Activations)?
    };
    let q = act.view(q_off, &[1, s.hq, s.d])?;
    let fuse = if norm {
        Fuse::norm(DType::F32)
    } else {
        Fuse::default()
    };
    let fused = FuseTensors::new(gpu, rng, fuse, k, &q)?;
    let tg = Targets::new(gpu, rng, s, 1)?;
    let opts = MatvecOptions {
        rope: Some(tg.qkv_targets(s)),
        ..fused.options(
            &q,
            MatvecOptions {
                variant,
                rows_per_workgroup,
                prefetch,
                ..Default::default()
            },
        )
    };
    let dp4a = w_dtype.is_quantized() && uses_dp4a(gpu, &w, &x, &q, &opts, Default::default())?;
    let ds = matvec_quant(gpu, &w, &x, &q, &opts)?;
    let name = format!(
        "{} [{n}, {k}] w {w_dtype:?}{} {}",
        ds[0].name,
        fuse.label(),
        s.label()
    );
    let mut prog = Program::new();
    prog.extend(ds);
    prog.run(gpu)?;
    let (want, scale) = fused.reference(&wv, &xv, None, 1, n, k);
    // A rotation mixes two products (each within fused_atol, plus the int8 rounding of x on the
    // integer-dot-product kernel): |err| <= sqrt(2) of it, plus the angle error times the pair's length.
    let mut product_atol = fused_atol(scale);
    if dp4a {
        product_atol += int8_input_error(&wv, &fused.prologue(&xv, k), n, k);
    }
    let atol = 1.5 * product_atol + ANGLE_ERR * largest_pair(&want);
    let c = tg.compare(gpu, name, s, &q, &want, atol)?;
    // Nothing but q written in the activation buffer (x, when there, is never written).
    let all = gpu.read_f32(&act)?;
    let mut outside = (k..q_off).chain(q_off + s.hq * s.d..all.len());
    Ok(guard(c, outside.all(|i| all[i].is_nan())))
}
