//! CPU reference for the attention kernels: per query head, `softmax(q k^T * scale + mask) v` in f64.

/// Shapes and per-step values of one attention call (the same meaning as the kernels' arguments).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub batch: usize,
    pub q_len: usize,
    /// Rows in the K/V tensors (the cache's capacity); only the first `kv_len` are read.
    pub kv_max: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `q` is `[B, Lq, Hq, D]`, `k` and `v` are `[B, kv_max, Hkv, D]`; returns `[B, Lq, Hq, D]`.
/// Key `j` is visible to query row `i` iff `j < kv_len` and, when `causal`, `j <= q_pos0 + i`.
/// Query head `h` reads KV head `h / (Hq / Hkv)`. A row that sees no key gives zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: Dims,
    kv_len: usize,
    q_pos0: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let Dims {
        batch,
        q_len,
        kv_max,
        q_heads,
        kv_heads,
        head_dim: d,
    } = dims;
    let group = q_heads / kv_heads;
    let kv_len = kv_len.min(kv_max);
    let mut out = vec![0.0f64; batch * q_len * q_heads * d];
    let mut scores = vec![0.0f64; kv_len];
    for b in 0..batch {
        for i in 0..q_len {
            for h in 0..q_heads {
                let hk = h / group;
                let qrow = &q[((b * q_len + i) * q_heads + h) * d..][..d];
                let visible = if causal {
                    kv_len.min(q_pos0 + i + 1)
                } else {
                    kv_len
                };
                if visible == 0 {
                    continue;
                }
                let kv_row = |j: usize| ((b * kv_max + j) * kv_heads + hk) * d;
                let mut max = f64::NEG_INFINITY;
                for (j, s) in scores[..visible].iter_mut().enumerate() {
                    let krow = &k[kv_row(j)..][..d];
                    let dot: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&x, &y)| x as f64 * y as f64)
                        .sum();
                    *s = dot * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0;
                for s in &mut scores[..visible] {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let o = &mut out[((b * q_len + i) * q_heads + h) * d..][..d];
                for (j, &p) in scores[..visible].iter().enumerate() {
                    let vrow = &v[kv_row(j)..][..d];
                    for (acc, &x) in o.iter_mut().zip(vrow) {
                        *acc += p / sum * x as f64;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_key_returns_its_value_and_equal_scores_average() {
        let dims = Dims {
            batch: 1,
            q_len: 2,
            kv_max: 3,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 2,
        };
        let q = [1.0, 0.0, 1.0, 0.0];
        let k = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let v = [2.0, 4.0, 6.0, 8.0, f32::NAN, f32::NAN];
        // Causal from position 0: row 0 sees key 0 only, row 1 sees keys 0 and 1 with equal scores.
        let o = attention(&q, &k, &v, dims, 2, 0, 1.0, true);
        assert_eq!(o, vec![2.0, 4.0, 4.0, 6.0]);
        // kv_len 0: nothing visible, zeros.
        assert_eq!(attention(&q, &k, &v, dims, 0, 0, 1.0, false), vec![0.0; 4]);
    }
}
