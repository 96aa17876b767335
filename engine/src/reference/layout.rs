//! CPU references for the layout ops: nearest upsampling, channel concatenation, permutation.

/// Nearest-neighbour 2x upsampling of `[N, C, H, W]` (given as `nc = N*C`, `h`, `w`).
pub fn upsample_nearest2x(x: &[f32], nc: usize, h: usize, w: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(nc * 4 * h * w);
    for i in 0..nc {
        for y in 0..2 * h {
            for xo in 0..2 * w {
                out.push(x[(i * h + y / 2) * w + xo / 2] as f64);
            }
        }
    }
    out
}

/// Concatenation of `[N, Ca, ...]` and `[N, Cb, ...]` along dimension 1; `inner` is the product of the
/// dimensions after the channels.
pub fn concat_channels(
    a: &[f32],
    b: &[f32],
    n: usize,
    ca: usize,
    cb: usize,
    inner: usize,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * (ca + cb) * inner);
    for i in 0..n {
        out.extend(
            a[i * ca * inner..(i + 1) * ca * inner]
                .iter()
                .map(|&v| v as f64),
        );
        out.extend(
            b[i * cb * inner..(i + 1) * cb * inner]
                .iter()
                .map(|&v| v as f64),
        );
    }
    out
}

/// `out[i_0, .., i_r] = x[j]` with `j[perm[d]] = i_d`: output dimension `d` is input dimension `perm[d]`.
pub fn permute(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f64> {
    let rank = shape.len();
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mut in_strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        in_strides[d] = in_strides[d + 1] * shape[d + 1];
    }
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; rank];
    (0..n)
        .map(|i| {
            let mut r = i;
            for d in (0..rank).rev() {
                idx[d] = r % out_shape[d];
                r /= out_shape[d];
            }
            let j: usize = (0..rank).map(|d| idx[d] * in_strides[perm[d]]).sum();
            x[j] as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases() {
        assert_eq!(
            upsample_nearest2x(&[1.0, 2.0], 1, 1, 2),
            vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
        );
        assert_eq!(
            concat_channels(&[1.0, 2.0], &[3.0], 1, 2, 1, 1),
            vec![1.0, 2.0, 3.0]
        );
        // [2, 3] transposed.
        let x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(
            permute(&x, &[2, 3], &[1, 0]),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }
}
