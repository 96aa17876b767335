//! Producer-quantized x ([`crate::kernels::quant_xq`]): a product writes its output for the next one
//! (residual epilogue with the next norm's weight, K split over workgroups or not; GLU epilogue) and
//! the next product reads it (with the RMSNorm or without, K split or not). Each pair runs twice on
//! fresh inputs with the xq buffer and the output poisoned; the consumer's result is compared with
//! the f64 product of its dequantised weight and its prologue'd input, computed from the producer's
//! output as stored, within the tolerance of x's two int8 terms per block and f32 accumulation.
//! The decode attention as a producer: [`super::attention_xq`].

use super::quant::{int8_input_error, random_blocks, upload_weight};
use super::{Check, Rng, compare, random, round_trip_rtol, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::matvec::MatvecOptions;
use crate::kernels::quant::{QuantTuning, matvec_quant_tuned, uses_dp4a};
use crate::kernels::quant_xq::xq_words;
use crate::memory::Category;
use crate::reference::quant as r;
use crate::tensor::{DType, Tensor};

/// One producer -> consumer pair.
struct Pair {
    dtype: DType,
    /// Producer: `[n_p, k_p]`; GLU (gate rows over up rows, out n_p / 2) or residual.
    n_p: usize,
    k_p: usize,
    glu: bool,
    /// Producer tuning (the GLU needs whole blocks of outputs per workgroup: 64 rows).
    tuning_p: QuantTuning,
    /// Consumer: `[n_c, len]` with len the producer's output length; with the RMSNorm or not.
    n_c: usize,
    norm: bool,
    tuning_c: QuantTuning,
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let split = |kw| QuantTuning {
        k_workgroups: kw,
        ..QuantTuning::default()
    };
    let mut pairs = Vec::new();
    for dtype in [DType::Q4_0, DType::Q8_0, DType::Q4_1] {
        pairs.extend([
            // O -> gate-up: residual with the norm's weight, read under the norm.
            Pair {
                dtype,
                n_p: 96,
                k_p: 64,
                glu: false,
                tuning_p: split(1),
                n_c: 64,
                norm: true,
                tuning_c: split(1),
            },
            // down (K split over 3 workgroups: the last one quantizes) -> next QKV.
            Pair {
                dtype,
                n_p: 64,
                k_p: 7 * 32,
                glu: false,
                tuning_p: split(3),
                n_c: 32,
                norm: true,
                tuning_c: split(1),
            },
            // gate-up (GLU over 64-row workgroups) -> down, K split over 2 workgroups.
            Pair {
                dtype,
                n_p: 128,
                k_p: 96,
                glu: true,
                tuning_p: QuantTuning {
                    row_groups: 2,
                    ..split(1)
                },
                n_c: 32,
                norm: false,
                tuning_c: split(2),
            },
        ]);
    }
    let mut out = Vec::new();
    for p in &pairs {
        out.extend(check_pair(gpu, rng, p)?);
    }
    // The decode attention as a producer (for the O product).
    out.extend(super::attention_xq::checks(gpu, rng)?);
    Ok(out)
}

/// A random weight, uploaded, and its dequantised values.
fn weight(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: DType,
    n: usize,
    k: usize,
) -> Result<(Tensor, Vec<f32>)> {
    let bytes = random_blocks(rng, dtype, n * k / 32);
    Ok((
        upload_weight(gpu, dtype, &bytes, 0, n, k)?,
        r::dequantize(dtype, &bytes),
    ))
}

fn check_pair(gpu: &Gpu, rng: &mut Rng, p: &Pair) -> Result<Vec<Check>> {
    let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let len = if p.glu { p.n_p / 2 } else { p.n_p };
    let act = |name: &str, n: usize| gpu.tensor(name, &[1, n], io, Category::Activations);
    let (wp, _) = weight(gpu, rng, p.dtype, p.n_p, p.k_p)?;
    let (wc, deq_c) = weight(gpu, rng, p.dtype, p.n_c, len)?;
    let a = act("a", p.k_p)?;
    let x = act("x", len)?;
    let gain = gpu.tensor("gain", &[len], DType::F32, Category::Weights)?;
    let xq = gpu.tensor("xq", &[xq_words(len)], DType::U32, Category::Activations)?;
    let y = act("y", p.n_c)?;
    let eps = 1e-5f32;
    let norm = p.norm.then_some((&gain, eps));
    let producer = |xq_out| MatvecOptions {
        residual: (!p.glu).then_some(&x),
        glu: p.glu,
        xq_out,
        ..Default::default()
    };
    let consumer = |xq_in| MatvecOptions {
        norm,
        xq_in,
        ..Default::default()
    };
    // The consumer must run the integer-dot-product kernel for the check to mean anything.
    if !uses_dp4a(gpu, &wc, &x, &y, &consumer(None), p.tuning_c)? {
        return Ok(Vec::new());
    }
    let mut prog = Program::new();
    let made = matvec_quant_tuned(
        gpu,
        &wp,
        &a,
        &x,
        &producer(Some((&xq, p.norm.then_some(&gain)))),
        p.tuning_p,
    )?;
    let read = matvec_quant_tuned(gpu, &wc, &x, &y, &consumer(Some(&xq)), p.tuning_c)?;
    let names = made
        .iter()
        .chain(&read)
        .map(|d| d.name.clone())
        .collect::<Vec<_>>()
        .join(" -> ");
    prog.extend(made);
    prog.extend(read);
    let mut checks = Vec::new();
    for run in 0..2 {
        gpu.write_tensor_f32(&a, &random(rng, p.k_p, -1.0, 1.0, io))?;
        gpu.write_tensor_f32(&x, &random(rng, len, -2.0, 2.0, io))?;
        let gv = random(rng, len, 0.5, 1.5, DType::F32);
        gpu.write_tensor_f32(&gain, &gv)?;
        // Poisoned: a word the producer leaves unwritten shows up as NaN.
        gpu.poison(&xq)?;
        gpu.poison(&y)?;
        prog.run(gpu)?;
        // The consumer's input from the producer's output as stored, its prologue in f64.
        let stored = gpu.read_f32(&x)?;
        let xin: Vec<f64> = if p.norm {
            let ms = stored.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / len as f64;
            let rs = 1.0 / (ms + eps as f64).sqrt();
            stored
                .iter()
                .zip(&gv)
                .map(|(&v, &g)| v as f64 * g as f64 * rs)
                .collect()
        } else {
            stored.iter().map(|&v| v as f64).collect()
        };
        let xin32: Vec<f32> = xin.iter().map(|&v| v as f32).collect();
        let want = r::matvec(&deq_c, &xin32, None, 1, p.n_c, len);
        // f32 accumulation, x's two int8 terms per block (as the consumer's own pre-pass has them),
        // and the blocks made from the producer's output before its rounding to `io` (x and, with
        // the norm, its 1 / rms each within the round trip's bound).
        let abs = r::abs_dot_max(&deq_c, &xin32, 1, p.n_c, len);
        let atol = 3e-7 * abs
            + 2.0 * round_trip_rtol(io) * abs
            + int8_input_error(&deq_c, &xin, p.n_c, len)
            + 1e-7;
        checks.push(compare(
            format!(
                "xq {:?} {} [{}x{}] -> [{}x{len}]{} run {run} ({names})",
                p.dtype,
                if p.glu { "glu" } else { "residual" },
                p.n_p,
                p.k_p,
                p.n_c,
                if p.norm { " norm" } else { "" },
            ),
            &gpu.read_f32(&y)?,
            &want,
            atol,
            store_rtol(io).max(1e-5),
        ));
    }
    Ok(checks)
}
