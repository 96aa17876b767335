//! CPU references for the matmul (prefill) and matvec (decode) kernels, in f64.

/// The shape of a (batched) matrix product `out[b] = a[b] @ op(b[b]) + bias`.
#[derive(Clone, Copy, Debug)]
pub struct MatmulShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `b` is `[N, K]` (the nn.Linear weight layout) instead of `[K, N]`.
    pub transpose_b: bool,
    /// `b` has one matrix per batch entry; otherwise one matrix shared by the whole batch.
    pub batched_b: bool,
}

/// `a`: `[batch, M, K]`; `b`: `[(batch,) K, N]` or `[(batch,) N, K]`; `bias`: `[N]`. Returns
/// `[batch, M, N]`.
pub fn matmul(a: &[f32], b: &[f32], bias: Option<&[f32]>, s: MatmulShape) -> Vec<f64> {
    let MatmulShape { batch, m, n, k, .. } = s;
    let mut out = vec![0.0; batch * m * n];
    for bt in 0..batch {
        let a0 = bt * m * k;
        let b0 = if s.batched_b { bt * k * n } else { 0 };
        for i in 0..m {
            for j in 0..n {
                let mut acc = bias.map_or(0.0, |v| v[j] as f64);
                for kk in 0..k {
                    let bv = if s.transpose_b {
                        b[b0 + j * k + kk]
                    } else {
                        b[b0 + kk * n + j]
                    };
                    acc += a[a0 + i * k + kk] as f64 * bv as f64;
                }
                out[(bt * m + i) * n + j] = acc;
            }
        }
    }
    out
}

/// `out[b, r] = sum_k w[r, k] * x[b, k] + bias[r]` with `w`: `[N, K]`, `x`: `[batch, K]`.
pub fn matvec(
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    batch: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * n];
    for b in 0..batch {
        for r in 0..n {
            let mut acc = bias.map_or(0.0, |v| v[r] as f64);
            for kk in 0..k {
                acc += w[r * k + kk] as f64 * x[b * k + kk] as f64;
            }
            out[b * n + r] = acc;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_products_by_hand() {
        // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
        let s = MatmulShape {
            batch: 1,
            m: 2,
            n: 2,
            k: 2,
            transpose_b: false,
            batched_b: false,
        };
        let a = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(
            matmul(&a, &[5.0, 6.0, 7.0, 8.0], None, s),
            vec![19.0, 22.0, 43.0, 50.0]
        );
        let t = MatmulShape {
            transpose_b: true,
            ..s
        };
        let bias = [1.0, -1.0];
        assert_eq!(
            matmul(&a, &[5.0, 7.0, 6.0, 8.0], Some(&bias), t),
            vec![20.0, 21.0, 44.0, 49.0]
        );
        assert_eq!(
            matvec(&a, &[1.0, -1.0], Some(&bias), 1, 2, 2),
            vec![0.0, -2.0]
        );
    }
}
