//! GGML block quantisation on the CPU: dequantisation of every block type Drift keeps on the GPU
//! (bit-identical to gguf-py's numpy code: same f32 operations in the same order), the Q8_0 and Q4_0
//! quantisers used by `--quant` on load (bit-identical to gguf-py's `quantize`), and an f64 matvec
//! reference for the quantised kernels.
//!
//! Block layouts (little endian, `d`/`m`/`dmin` are f16):
//! - Q8_0 (34 B / 32): d, 32 x i8; value q d.
//! - Q4_0 (18 B / 32): d, 16 bytes of nibbles (low nibbles elements 0..16, high 16..32); (q - 8) d.
//! - Q4_1 (20 B / 32): d, m, nibbles; q d + m.
//! - Q5_0 (22 B / 32): d, qh (u32, bit i = bit 4 of element i), nibbles; (q - 16) d.
//! - Q5_1 (24 B / 32): d, m, qh, nibbles; q d + m.
//! - Q4_K (144 B / 256): d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes
//!   of nibbles (bytes 32g..32g+32: low nibbles sub-block 2g, high 2g+1); (d sc) q - dmin mn.
//! - Q5_K (176 B / 256): as Q4_K plus qh (32 bytes: bit j of byte l = bit 4 of element l of
//!   sub-block j) before the nibbles.
//! - Q6_K (210 B / 256): ql (128 B), qh (64 B), 16 i8 scales (one per 16 elements), d;
//!   element 128h + 32s + l: low 4 bits from ql[64h + 32(s%2) + l] (nibble s/2), high 2 bits from
//!   qh[32h + l] (bits 2s..2s+2); (d scale) (q - 32).

use half::f16;

use crate::error::{DriftError, Result};
use crate::tensor::DType;

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block's 12 scale bytes.
pub fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30),
            (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30),
        )
    }
}

/// Dequantises one block of `dtype` into `out` (`dtype.block_elems()` values).
fn dequantize_block(dtype: DType, b: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => {
            let d = h(b, 0);
            for (i, o) in out.iter_mut().enumerate() {
                *o = b[2 + i] as i8 as f32 * d;
            }
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            let d = h(b, 0);
            let (m, qh, qs) = match dtype {
                DType::Q4_0 => (0.0, 0, 2),
                DType::Q4_1 => (h(b, 2), 0, 4),
                DType::Q5_0 => (0.0, u32::from_le_bytes([b[2], b[3], b[4], b[5]]), 6),
                _ => (h(b, 2), u32::from_le_bytes([b[4], b[5], b[6], b[7]]), 8),
            };
            for (i, o) in out.iter_mut().enumerate() {
                let nib = (b[qs + i % 16] >> (4 * (i / 16))) & 15;
                let q = nib as i32 | (((qh >> i) & 1) << 4) as i32;
                *o = match dtype {
                    DType::Q4_0 => d * (q - 8) as f32,
                    DType::Q5_0 => d * (q - 16) as f32,
                    _ => d * q as f32 + m,
                };
            }
        }
        DType::Q4K | DType::Q5K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if dtype == DType::Q5K {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for j in 0..8 {
                let (sc, mn) = k_scale_min(scales, j);
                let a = d * sc as f32;
                let dm = dmin * mn as f32;
                for l in 0..32 {
                    let mut q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                    if dtype == DType::Q5K {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    out[32 * j + l] = a * q as f32 - dm;
                }
            }
        }
        DType::Q6K => {
            let d = h(b, 208);
            for (e, o) in out.iter_mut().enumerate() {
                let (hh, s, l) = (e / 128, (e % 128) / 32, e % 32);
                let lo = (b[64 * hh + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                let hi = (b[128 + 32 * hh + l] >> (2 * s)) & 3;
                let q = (lo | (hi << 4)) as i32 - 32;
                let scale = b[192 + e / 16] as i8 as f32;
                *o = d * scale * q as f32;
            }
        }
        DType::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => out[0] = h(b, 0),
        DType::BF16 => out[0] = half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::U32 => out[0] = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
    }
}

/// Dequantises GGML data of `dtype` (whole blocks; a trailing partial block is ignored) to f32.
/// Plain types (f32, f16, bf16) are decoded too.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let blocks = bytes.len() / bb;
    let mut out = vec![0.0f32; blocks * be];
    for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        dequantize_block(dtype, b, o);
    }
    out
}

/// The index of the first element of largest magnitude (numpy's `abs(x).argmax()`).
fn argmax_abs(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if v.abs() > x[best].abs() {
            best = i;
        }
    }
    best
}

/// Splits `values` into blocks of 32, zero-padding a trailing partial block (callers pass whole blocks:
/// a row of K values quantises to K / 32 blocks).
fn blocks32(values: &[f32]) -> impl Iterator<Item = [f32; 32]> + '_ {
    values.chunks(32).map(|c| {
        let mut b = [0.0f32; 32];
        b[..c.len()].copy_from_slice(c);
        b
    })
}

/// Q8_0 blocks of `values`, bit-identical to gguf-py (and ggml's reference quantiser):
/// d = max|x| / 127, q = round-half-away(x / d).
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len().div_ceil(32) * 34);
    for x in blocks32(values) {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        for v in x {
            // numpy's np_roundf: floor(|v|) + floor(2 frac), with the sign of v.
            let n = v * id;
            let a = n.abs();
            let f = a.floor();
            let r = f + (2.0 * (a - f)).floor();
            let q = if n < 0.0 { -r } else { r };
            out.push(q as i8 as u8);
        }
    }
    out
}

/// Q4_0 blocks of `values`, bit-identical to gguf-py: d = -(the value of largest magnitude) / 8,
/// q = min(15, trunc(x / d + 8.5)).
pub fn quantize_q4_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len().div_ceil(32) * 18);
    for x in blocks32(values) {
        let max = x[argmax_abs(&x)];
        let d = max / -8.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5).trunc() as u8).min(15);
        for i in 0..16 {
            out.push(q(x[i]) | (q(x[i + 16]) << 4));
        }
    }
    out
}

/// Quantises `values` to `dtype` (Q8_0 or Q4_0; the types Drift quantises to on load).
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    if !values.len().is_multiple_of(32) {
        return Err(DriftError::Shape(format!(
            "{} values are not a whole number of 32-value blocks",
            values.len()
        )));
    }
    let f: fn(&[f32]) -> Vec<u8> = match dtype {
        DType::Q8_0 => quantize_q8_0,
        DType::Q4_0 => quantize_q4_0,
        other => return Err(DriftError::Unsupported(format!("quantising to {other:?}"))),
    };
    // Blocks are independent: large tensors (an 8B model's on load) are split over the CPU's cores.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = values.len().div_ceil(threads).div_ceil(32) * 32;
    if threads == 1 || values.len() < (1 << 20) {
        return Ok(f(values));
    }
    let parts: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = values.chunks(per).map(|c| s.spawn(move || f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("quantizer thread"))
            .collect()
    });
    Ok(parts.concat())
}

/// `out[b, n] = sum_k w[n, k] x[b, k] (+ bias[n])` in f64, for dequantised weights `w` ([N, K]).
pub fn matvec(
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    batch: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0.0f64; batch * n];
    for b in 0..batch {
        for r in 0..n {
            let dot: f64 = (0..k)
                .map(|i| w[r * k + i] as f64 * x[b * k + i] as f64)
                .sum();
            out[b * n + r] = dot + bias.map_or(0.0, |v| v[r] as f64);
        }
    }
    out
}

/// The largest `sum_k |w[n, k] x[b, k]|` over outputs: the scale of an f32 dot product's rounding error.
pub fn abs_dot_max(w: &[f32], x: &[f32], batch: usize, n: usize, k: usize) -> f64 {
    let mut m = 0.0f64;
    for b in 0..batch {
        for r in 0..n {
            let s: f64 = (0..k)
                .map(|i| (w[r * k + i] as f64 * x[b * k + i] as f64).abs())
                .sum();
            m = m.max(s);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threaded_quantization_equals_one_pass() {
        // Over the threading threshold, with a length that splits unevenly over the threads.
        let n: usize = (1 << 21) + 32 * 7;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1013) as f32 / 500.0 - 1.0)
            .collect();
        assert_eq!(quantize(DType::Q4_0, &x).unwrap(), quantize_q4_0(&x));
        assert_eq!(quantize(DType::Q8_0, &x).unwrap(), quantize_q8_0(&x));
    }

    #[test]
    fn round_trips_are_close() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        // Q8_0: half a step of max/127 (plus the f16 scale's rounding); Q4_0: steps of max/8, and the
        // side opposite the largest magnitude clips at 7 steps, a whole step short.
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (dtype, tol) in [
            (DType::Q8_0, amax / 127.0 * 0.6),
            (DType::Q4_0, amax / 8.0 * 1.01),
        ] {
            let q = quantize(dtype, &x).unwrap();
            assert_eq!(q.len() as u64, dtype.bytes_for(256).unwrap());
            let y = dequantize(dtype, &q);
            let err = x
                .iter()
                .zip(&y)
                .fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(err < tol, "{dtype:?} round trip error {err}");
        }
        assert!(quantize(DType::Q4_1, &x).is_err());
        assert!(quantize(DType::Q8_0, &x[..33]).is_err());
    }

    #[test]
    fn zero_block_and_signs() {
        let q = quantize_q4_0(&[0.0; 32]);
        assert_eq!(dequantize(DType::Q4_0, &q), vec![0.0; 32]);
        let mut x = [0.5f32; 32];
        x[3] = -4.0;
        let y = dequantize(DType::Q4_0, &quantize_q4_0(&x));
        assert_eq!(y[3], -4.0);
        // Q8_0 keeps the largest magnitude to the f16 rounding of its scale.
        let y = dequantize(DType::Q8_0, &quantize_q8_0(&x));
        assert!((y[3] + 4.0).abs() < 4.0 / 1024.0, "{}", y[3]);
    }
}
