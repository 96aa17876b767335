//! CPU reference for rotary position embedding, in f64 (exact angles at any position).

/// Rotary embedding of `x` `[tokens, heads, head_dim]` at `pos`: pair k < rotary_dim / 2 is rotated by
/// `pos * freq_scale * theta^(-2k / rotary_dim) / factors[k]`; interleaved pairs are (2k, 2k+1),
/// half-split pairs (k, k + rotary_dim / 2); dimensions past rotary_dim pass through.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    pos: &[u32],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f64,
    freq_scale: f64,
    interleaved: bool,
    factors: Option<&[f32]>,
) -> Vec<f64> {
    let half = rotary_dim / 2;
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let row = (t * heads + h) * head_dim;
            for k in 0..half {
                let f = factors.map_or(1.0, |f| f[k] as f64);
                let a = p as f64 * freq_scale * theta.powf(-2.0 * k as f64 / rotary_dim as f64) / f;
                let (s, c) = a.sin_cos();
                let (i0, i1) = if interleaved {
                    (2 * k, 2 * k + 1)
                } else {
                    (k, k + half)
                };
                let (u, v) = (x[row + i0] as f64, x[row + i1] as f64);
                out[row + i0] = u * c - v * s;
                out[row + i1] = u * s + v * c;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn quarter_turn() {
        // theta^0 = 1 rad per position for pair 0: pi/2 turns (1, 0) into (0, 1).
        let p = (std::f64::consts::FRAC_PI_2 * 1e6).round() as u32;
        let r = super::rope(&[1.0, 0.0, 7.0], &[p], 1, 3, 2, 10000.0, 1e-6, true, None);
        assert!(r[0].abs() < 1e-6 && (r[1] - 1.0).abs() < 1e-6 && r[2] == 7.0);
    }
}
