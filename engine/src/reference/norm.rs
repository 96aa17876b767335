//! CPU references for the normalisations, in f64.

/// RMSNorm over rows of `n`: `x / sqrt(mean(x^2) + eps) * w`.
pub fn rmsnorm(x: &[f32], w: &[f32], n: usize, eps: f64) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let rs = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &w)| v as f64 * rs * w as f64)
        })
        .collect()
}

/// LayerNorm over rows of `n` with biased variance; `gamma`/`beta` optional.
pub fn layernorm(
    x: &[f32],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    n: usize,
    eps: f64,
) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let rs = 1.0 / (var + eps).sqrt();
            row.iter().enumerate().map(move |(i, &v)| {
                let g = gamma.map_or(1.0, |g| g[i] as f64);
                let b = beta.map_or(0.0, |b| b[i] as f64);
                (v as f64 - mean) * rs * g + b
            })
        })
        .collect()
}

/// GroupNorm of `x` `[n, c, hw]` (flattened) with `groups` groups, biased variance, per-channel
/// `gamma`/`beta`, then SiLU when `silu`.
#[allow(clippy::too_many_arguments)]
pub fn groupnorm(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f64,
    silu: bool,
) -> Vec<f64> {
    let len = c / groups * hw;
    let mut out = Vec::with_capacity(x.len());
    for (s, seg) in x.chunks(len).enumerate() {
        let mean = seg.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
        let var = seg.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len as f64;
        let rs = 1.0 / (var + eps).sqrt();
        let c0 = (s % groups) * (c / groups);
        for (i, &v) in seg.iter().enumerate() {
            let ch = c0 + i / hw;
            let o = (v as f64 - mean) * rs * gamma[ch] as f64 + beta[ch] as f64;
            out.push(if silu { o / (1.0 + (-o).exp()) } else { o });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_values() {
        let r = super::rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 2, 0.0);
        let s = (12.5f64).sqrt();
        assert!((r[0] - 3.0 / s).abs() < 1e-15 && (r[1] - 8.0 / s).abs() < 1e-15);
        let l = super::layernorm(&[1.0, 3.0], None, Some(&[0.5, 0.5]), 2, 0.0);
        assert!((l[0] + 0.5).abs() < 1e-15 && (l[1] - 1.5).abs() < 1e-15);
        let g = super::groupnorm(
            &[1.0, 3.0, 5.0, 7.0],
            2,
            2,
            1,
            &[1.0, 1.0],
            &[0.0, 0.0],
            0.0,
            false,
        );
        let sd = 5.0f64.sqrt();
        assert!((g[0] + 3.0 / sd).abs() < 1e-15 && (g[3] - 3.0 / sd).abs() < 1e-15);
    }
}
