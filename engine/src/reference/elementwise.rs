//! Elementwise references: broadcasting binary ops and activations.

/// Broadcast binary op over row-major `a` (`sa`) and `b` (`sb`) into `out_shape`.
pub fn binary(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    out_shape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let n: usize = out_shape.iter().product();
    let index = |shape: &[usize], idx: &[usize]| {
        let off = out_shape.len() - shape.len();
        shape.iter().enumerate().fold(0usize, |acc, (d, &s)| {
            acc * s + if s == 1 { 0 } else { idx[off + d] }
        })
    };
    let mut idx = vec![0usize; out_shape.len()];
    (0..n)
        .map(|i| {
            let mut r = i;
            for d in (0..out_shape.len()).rev() {
                idx[d] = r % out_shape[d];
                r /= out_shape[d];
            }
            f(a[index(sa, &idx)] as f64, b[index(sb, &idx)] as f64)
        })
        .collect()
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

pub fn quick_gelu(x: f64) -> f64 {
    x / (1.0 + (-1.702 * x).exp())
}

/// erf to ~1e-15 by its Taylor series (small |x|) or the continued fraction of erfc (large |x|).
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let r = if z < 3.0 {
        // erf(z) = 2/sqrt(pi) * sum_n (-1)^n z^(2n+1) / (n! (2n+1))
        let mut term = z;
        let mut sum = z;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + 1/2/(z + 1/(z + 3/2/(z + ...))))
        let mut f = z;
        for k in (1..60).rev() {
            f = z + (k as f64 / 2.0) / f;
        }
        1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / f
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.5, 0.9999992569016276),
            (-1.0, -0.8427007929497149),
        ] {
            assert!((super::erf(x) - want).abs() < 1e-13, "erf({x})");
        }
    }
}
