//! CPU reference for 2-D convolution over NCHW tensors.

/// Geometry of a reference convolution.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    /// Input `[N, C, H, W]`.
    pub x: [usize; 4],
    /// Output channels and kernel size.
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    /// Top/left padding.
    pub pad: usize,
    /// Output height and width.
    pub ho: usize,
    pub wo: usize,
}

/// `out[n, o, ho, wo] = bias[o] + residual[...] + sum x[n, c, ho*s - p + i, wo*s - p + j] w[o, c, i, j]`
/// with row-major OIHW `w`; zero outside the input. Returns `[N, O, Ho, Wo]` in f64.
pub fn conv2d(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    g: ConvShape,
) -> Vec<f64> {
    let [n, c, h, wd] = g.x;
    let mut out = vec![0.0f64; n * g.o * g.ho * g.wo];
    for ni in 0..n {
        for oi in 0..g.o {
            for y in 0..g.ho {
                for xo in 0..g.wo {
                    let mut acc = bias.map_or(0.0, |b| b[oi] as f64);
                    for ci in 0..c {
                        for i in 0..g.kh {
                            let hi = (y * g.stride + i) as isize - g.pad as isize;
                            if hi < 0 || hi >= h as isize {
                                continue;
                            }
                            for j in 0..g.kw {
                                let wi = (xo * g.stride + j) as isize - g.pad as isize;
                                if wi < 0 || wi >= wd as isize {
                                    continue;
                                }
                                let xv =
                                    x[((ni * c + ci) * h + hi as usize) * wd + wi as usize] as f64;
                                let wv = w[((oi * c + ci) * g.kh + i) * g.kw + j] as f64;
                                acc += xv * wv;
                            }
                        }
                    }
                    let idx = ((ni * g.o + oi) * g.ho + y) * g.wo + xo;
                    if let Some(r) = residual {
                        acc += r[idx] as f64;
                    }
                    out[idx] = acc;
                }
            }
        }
    }
    out
}

/// Sum over the reduction of |x w| per output (for tolerances that scale with the magnitudes summed).
pub fn conv2d_abs(x: &[f32], w: &[f32], g: ConvShape) -> Vec<f64> {
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let wa: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    conv2d(&xa, &wa, None, None, g)
}
