//! CPU reference for softmax over the last dimension, in f64.

/// Softmax of `scale * x` over rows of `n` values; with `causal = Some((q_len, q_offset))`, row r is
/// query r % q_len and key j > q + q_offset is masked (its output is 0).
pub fn softmax(x: &[f32], n: usize, scale: f64, causal: Option<(usize, usize)>) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for (r, (row, o)) in x.chunks(n).zip(out.chunks_mut(n)).enumerate() {
        let valid = causal.map_or(n, |(q_len, off)| n.min(r % q_len + off + 1));
        let y: Vec<f64> = row[..valid].iter().map(|&v| v as f64 * scale).collect();
        let m = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = y.iter().map(|&v| (v - m).exp()).sum();
        for (o, &v) in o.iter_mut().zip(&y) {
            *o = (v - m).exp() / sum;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_sum_to_one_and_mask_is_zero() {
        let x = [1.0, 2.0, 3.0, 1000.0, 1000.0, 0.0];
        let s = super::softmax(&x, 3, 1.0, None);
        assert!((s[..3].iter().sum::<f64>() - 1.0).abs() < 1e-15);
        assert!((s[3] - 0.5).abs() < 1e-15 && s[5] < 1e-300);
        let c = super::softmax(&x, 3, 1.0, Some((2, 0)));
        assert_eq!(&c[..3], &[1.0, 0.0, 0.0]);
        assert!((c[3] - 0.5).abs() < 1e-15 && c[5] == 0.0);
    }
}
