//! Decode attention that also writes its output quantized for the next product (the one-pass
//! variant's XQA, [`crate::kernels::attention::attention_quantizing`]): per case, on fresh random
//! inputs with every output poisoned, its output must equal the plain kernel's bit for bit, and each
//! 32-element block it wrote must give back that output within the two int8 terms' bound
//! (max |v| / 64516 of the block; plus half an f16 ulp for f16 outputs, which a driver may
//! quantize unrounded), with its sums of values and squares against f64 sums.

use super::{Check, Rng, compare, random, round_trip_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::attention::{
    AttentionOptions, AttentionVariant, attention, attention_quantizing,
};
use crate::kernels::attention_row::row_available;
use crate::kernels::quant_xq::xq_words;
use crate::memory::Category;
use crate::tensor::{DType, Tensor};

/// (q heads, kv heads, head dim, workgroups per row, cache rows, keys visible).
const CASES: [(usize, usize, usize, usize, usize, usize); 3] = [
    (8, 2, 128, 4, 48, 37),
    (4, 4, 64, 2, 24, 19),
    (2, 1, 32, 3, 16, 16),
];

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let s = gpu.caps.subgroup_max_size as usize;
    if !gpu.caps.subgroup || !s.is_multiple_of(8) {
        return Ok(Vec::new());
    }
    let mut checks = Vec::new();
    let dtypes: &[DType] = if gpu.caps.f16 {
        &[DType::F16, DType::F32]
    } else {
        &[DType::F32]
    };
    for &(hq, hkv, d, ch, kv_max, kv_len) in &CASES {
        if !row_available(&gpu.caps, d) {
            continue;
        }
        for &io in dtypes {
            checks.extend(check_case(gpu, rng, hq, hkv, d, ch, kv_max, kv_len, io)?);
        }
    }
    Ok(checks)
}

#[allow(clippy::too_many_arguments)]
fn check_case(
    gpu: &Gpu,
    rng: &mut Rng,
    hq: usize,
    hkv: usize,
    d: usize,
    ch: usize,
    kv_max: usize,
    kv_len: usize,
    io: DType,
) -> Result<Vec<Check>> {
    let t = |name: &str, shape: &[usize], dt: DType| -> Result<Tensor> {
        gpu.tensor(name, shape, dt, Category::Activations)
    };
    let q = t("q", &[1, 1, hq, d], io)?;
    let k = t("k", &[1, kv_max, hkv, d], io)?;
    let v = t("v", &[1, kv_max, hkv, d], io)?;
    let plain_out = t("out", &[1, 1, hq, d], io)?;
    let out = t("out xq", &[1, 1, hq, d], io)?;
    let xq = t("xq", &[xq_words(hq * d)], DType::U32)?;
    let step = t("step", &[2], DType::U32)?;
    let opts = AttentionOptions {
        variant: AttentionVariant::DecodeRow,
        row_chunks: Some(ch),
        ..AttentionOptions::causal()
    };
    let mut plain = Program::new();
    plain.extend(attention(gpu, &q, &k, &v, &plain_out, &step, &opts)?);
    let mut quantizing = Program::new();
    quantizing.extend(attention_quantizing(
        gpu, &q, &k, &v, &out, &step, &opts, &xq,
    )?);
    let name = format!(
        "{} H{hq}/{hkv} D{d} keys {kv_len}/{kv_max}",
        quantizing.dispatches[0].name
    );
    let row = hkv * d;
    let mut checks = Vec::new();
    for run in 0..2 {
        let qv = random(rng, q.numel(), -3.0, 3.0, io);
        let mut kv = [
            random(rng, k.numel(), -1.0, 1.0, io),
            random(rng, v.numel(), -1.0, 1.0, io),
        ];
        // Rows past the visible keys are NaN: a read of one shows in the output.
        for x in &mut kv {
            for (i, val) in x.iter_mut().enumerate() {
                if i / row >= kv_len {
                    *val = f32::NAN;
                }
            }
        }
        gpu.write_tensor_f32(&q, &qv)?;
        gpu.write_tensor_f32(&k, &kv[0])?;
        gpu.write_tensor_f32(&v, &kv[1])?;
        gpu.write_tensor_bytes(
            &step,
            bytemuck::cast_slice(&[kv_len as u32, kv_len as u32 - 1]),
        )?;
        for p in [&plain_out, &out, &xq] {
            gpu.poison(p)?;
        }
        plain.run(gpu)?;
        quantizing.run(gpu)?;
        let want = gpu.read_f32(&plain_out)?;
        let got = gpu.read_f32(&out)?;
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        checks.push(compare(
            format!("{name} run {run}: output as the plain kernel's"),
            &got,
            &want64,
            0.0,
            0.0,
        ));
        let words: Vec<u32> = bytemuck::cast_slice(&gpu.read_bytes(&xq)?).to_vec();
        checks.extend(block_checks(&name, run, &words, &want, round_trip_rtol(io)));
    }
    Ok(checks)
}

/// The blocks of `words` against the output `v` they quantize: values (in units of the block's
/// max |v|, where the two int8 terms are within 1 / 64516 and f32 rounding adds ~1e-6), sums and
/// sums of squares; each also within `rt` (relative) of `v`, the bound of the driver quantizing the
/// output before its rounding to the stored dtype.
fn block_checks(name: &str, run: usize, words: &[u32], v: &[f32], rt: f64) -> Vec<Check> {
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let (mut sums, mut sums_want) = (Vec::new(), Vec::new());
    let (mut squares, mut squares_want) = (Vec::new(), Vec::new());
    let mut scale = 0.0f64;
    for (b, block) in v.chunks(32).enumerate() {
        let w = &words[20 * b..20 * b + 20];
        let m = block.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
        let unit = if m > 0.0 { m } else { 1.0 };
        let dx = f32::from_bits(w[16]) as f64;
        for (i, &x) in block.iter().enumerate() {
            let byte = |word: u32| ((word >> (8 * (i % 4))) & 0xFF) as u8 as i8 as f64;
            let qh = byte(w[i / 4]);
            let ql = byte(w[8 + i / 4]);
            got.push((dx * (qh + ql / 254.0) / unit) as f32);
            want.push(x as f64 / unit);
        }
        sums.push(f32::from_bits(w[17]));
        sums_want.push(block.iter().map(|&x| x as f64).sum::<f64>());
        squares.push(f32::from_bits(w[18]));
        squares_want.push(block.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>());
        scale = scale.max(block.iter().map(|&x| (x as f64).abs()).sum::<f64>());
    }
    vec![
        compare(
            format!("{name} run {run}: blocks give the output back"),
            &got,
            &want,
            1.01 / 64516.0 + 1e-6 + rt,
            0.0,
        ),
        compare(
            format!("{name} run {run}: blocks' sums"),
            &sums,
            &sums_want,
            (1e-6 + rt) * scale,
            1e-6,
        ),
        compare(
            format!("{name} run {run}: blocks' sums of squares"),
            &squares,
            &squares_want,
            1e-6 * scale * scale / 32.0,
            1e-6 + 2.0 * rt,
        ),
    ]
}
