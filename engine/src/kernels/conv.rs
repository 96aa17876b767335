//! 2-D convolution over NCHW tensors (Stable Diffusion's UNet and VAE), as an implicit GEMM: the input
//! patch is gathered into workgroup memory on the fly, no im2col buffer. See `shaders/conv.wgsl`.
//!
//! Weights are `[O, C, KH, KW]`. The kernel streams them along K = C*KH*KW for 64 output channels at a
//! time, so it prefers them stored as the `[K, O]` transpose ([`Layout::Transposed`], vec4 loads
//! along O); [`conv2d_weight_layout`] says which layout to upload, [`conv2d_weight_bytes`] converts
//! OIHW bytes to it and [`conv2d_weight`] does both. Row-major OIHW weights work too, a little slower.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::grid;
use crate::memory::Category;
use crate::tensor::{DType, Layout, Tensor};
use crate::{shader, shape_err};

/// Output tile per workgroup (pixels x channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conv2dVariant {
    /// [`Conv2dVariant::Tile128`] when that still gives enough workgroups to fill a large GPU, else
    /// [`Conv2dVariant::Tile64`].
    Auto,
    /// 64 pixels x 64 channels per workgroup, 4 x 4 per thread.
    Tile64,
    /// 128 pixels x 64 channels per workgroup, 8 x 4 per thread (more reuse, half the workgroups).
    Tile128,
}

/// Geometry and fusions of [`conv2d`].
#[derive(Clone, Copy, Debug)]
pub struct Conv2dOptions<'a> {
    pub stride: usize,
    /// Zero padding on the top and left (and bottom and right unless `padding_end` says otherwise).
    pub padding: usize,
    /// Bottom/right padding when it differs from the top/left (SD's VAE encoder downsamples with
    /// padding (0, 1)).
    pub padding_end: Option<usize>,
    /// Added to the output (same shape and dtype as it): the skip connection of a ResNet block.
    pub residual: Option<&'a Tensor>,
    pub variant: Conv2dVariant,
}

impl Default for Conv2dOptions<'_> {
    fn default() -> Self {
        Conv2dOptions {
            stride: 1,
            padding: 0,
            padding_end: None,
            residual: None,
            variant: Conv2dVariant::Auto,
        }
    }
}

/// Output height and width of a convolution (`None` when the kernel does not fit the padded input).
pub fn conv2d_output_size(
    (h, w): (usize, usize),
    (kh, kw): (usize, usize),
    stride: usize,
    padding: usize,
    padding_end: Option<usize>,
) -> Option<(usize, usize)> {
    let pe = padding_end.unwrap_or(padding);
    let (hp, wp) = (h + padding + pe, w + padding + pe);
    if stride == 0 || hp < kh || wp < kw {
        return None;
    }
    Some(((hp - kh) / stride + 1, (wp - kw) / stride + 1))
}

/// The weight layout [`conv2d`] is fastest with on this device: `[O, C, KH, KW]` stored as its
/// `[C*KH*KW, O]` transpose.
pub fn conv2d_weight_layout(_gpu: &Gpu) -> Layout {
    Layout::Transposed
}

/// Converts row-major OIHW weight bytes (`shape` = `[O, C, KH, KW]`, f32 or f16) to `layout`
/// (row-major: unchanged; transposed: `[C*KH*KW, O]`).
pub fn conv2d_weight_bytes(bytes: &[u8], shape: &[usize], dtype: DType, layout: Layout) -> Result<Vec<u8>> {
    if shape.len() != 4 || !matches!(dtype, DType::F32 | DType::F16) {
        return Err(shape_err!("conv2d weight must be [O, C, KH, KW] f32/f16, got {shape:?} {dtype:?}"));
    }
    let eb = dtype.block_bytes();
    let o = shape[0];
    let k = shape[1] * shape[2] * shape[3];
    if bytes.len() != o * k * eb {
        return Err(shape_err!("conv2d weight {shape:?} {dtype:?}: {} bytes given", bytes.len()));
    }
    match layout {
        Layout::RowMajor => Ok(bytes.to_vec()),
        Layout::Transposed => {
            let mut t = vec![0u8; bytes.len()];
            for oi in 0..o {
                for ki in 0..k {
                    let s = (oi * k + ki) * eb;
                    let d = (ki * o + oi) * eb;
                    t[d..d + eb].copy_from_slice(&bytes[s..s + eb]);
                }
            }
            Ok(t)
        }
        other => Err(DriftError::Unsupported(format!("conv2d weights in {other:?} layout"))),
    }
}

/// Uploads OIHW weight bytes in the layout [`conv2d_weight_layout`] prefers.
pub fn conv2d_weight(gpu: &Gpu, label: &str, shape: &[usize], dtype: DType, oihw: &[u8]) -> Result<Tensor> {
    let layout = conv2d_weight_layout(gpu);
    let bytes = conv2d_weight_bytes(oihw, shape, dtype, layout)?;
    gpu.tensor_from_bytes(label, shape, dtype, layout, &bytes, Category::Weights)
}

/// Whether a tensor's first element is 4-element aligned within its binding (vec4 access).
fn vec4_aligned(t: &Tensor) -> bool {
    t.storage.offset % (4 * t.elem_bytes()) == 0
}

fn float(t: &Tensor, what: &str, gpu: &Gpu) -> Result<()> {
    match t.dtype {
        DType::F32 => Ok(()),
        DType::F16 if gpu.caps.f16 => Ok(()),
        DType::F16 => Err(DriftError::Unsupported(format!("conv2d: {what} is f16 but the device has no f16"))),
        d => Err(shape_err!("conv2d: {what} must be f32 or f16, got {d:?}")),
    }
}

/// The base-offset expression of tensor binding `b` (1-based) in the params header.
fn offset_expr(b: usize) -> String {
    format!("p.offs[{}u][{}u]", (b - 1) / 4, (b - 1) % 4)
}

/// `out = conv2d(x, w) + bias + residual`. `x` is `[N, C, H, W]`, `w` `[O, C, KH, KW]` (row-major or
/// [`Layout::Transposed`]), `bias` `[O]`, `out` and the residual `[N, O, Ho, Wo]`. `x`, `out` and the
/// residual share one float dtype; `w` and `bias` may be f16 or f32 independently. Accumulates in f32.
pub fn conv2d(
    gpu: &Gpu,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
) -> Result<Dispatch> {
    if x.rank() != 4 || w.rank() != 4 || out.rank() != 4 {
        return Err(shape_err!(
            "conv2d wants x [N, C, H, W], w [O, C, KH, KW], out [N, O, Ho, Wo]; got {:?}, {:?}, {:?}",
            x.shape,
            w.shape,
            out.shape
        ));
    }
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (o, kh, kw) = (w.shape[0], w.shape[2], w.shape[3]);
    if w.shape[1] != c {
        return Err(shape_err!("conv2d: x {:?} has {c} channels, w {:?} wants {}", x.shape, w.shape, w.shape[1]));
    }
    let (ho, wo) = conv2d_output_size((h, wd), (kh, kw), opts.stride, opts.padding, opts.padding_end)
        .ok_or_else(|| {
            shape_err!(
                "conv2d: kernel {kh}x{kw} stride {} padding {} does not fit input {:?}",
                opts.stride,
                opts.padding,
                x.shape
            )
        })?;
    if out.shape != [n, o, ho, wo] {
        return Err(shape_err!(
            "conv2d of {:?} by {:?} (stride {}, padding {}) gives {:?}, output is {:?}",
            x.shape,
            w.shape,
            opts.stride,
            opts.padding,
            [n, o, ho, wo],
            out.shape
        ));
    }
    if n * ho * wo == 0 || o == 0 || c == 0 {
        return Err(shape_err!("conv2d: empty tensor ({:?} by {:?})", x.shape, w.shape));
    }
    float(x, "x", gpu)?;
    float(w, "w", gpu)?;
    if out.dtype != x.dtype {
        return Err(shape_err!("conv2d: out is {:?} but x is {:?}", out.dtype, x.dtype));
    }
    for (t, what) in [(x, "x"), (out, "out")] {
        if !matches!(t.layout, Layout::RowMajor | Layout::Nchw) {
            return Err(shape_err!("conv2d: {what} must be NCHW (row-major), got {:?}", t.layout));
        }
    }
    let wt = match w.layout {
        Layout::RowMajor => false,
        Layout::Transposed => true,
        other => return Err(shape_err!("conv2d: weights in {other:?} layout (want row-major or transposed)")),
    };
    if let Some(b) = bias {
        float(b, "bias", gpu)?;
        if b.shape != [o] {
            return Err(shape_err!("conv2d: bias is {:?}, want [{o}]", b.shape));
        }
    }
    if let Some(r) = opts.residual {
        if r.shape != out.shape || r.dtype != out.dtype || !matches!(r.layout, Layout::RowMajor | Layout::Nchw) {
            return Err(shape_err!(
                "conv2d: residual {:?} {:?} must match out {:?} {:?}",
                r.shape,
                r.dtype,
                out.shape,
                out.dtype
            ));
        }
    }
    let (s, pad) = (opts.stride, opts.padding);
    let m = n * ho * wo;
    let k = c * kh * kw;
    if [x.numel(), w.numel(), out.numel(), m, k].iter().any(|&v| v >= u32::MAX as usize / 2) {
        return Err(shape_err!("conv2d: {:?} by {:?} is too large for 32-bit indexing", x.shape, w.shape));
    }

    let tiles_n = o.div_ceil(64);
    let tile128 = match opts.variant {
        Conv2dVariant::Tile64 => false,
        Conv2dVariant::Tile128 => true,
        // Half the workgroups with 128-pixel tiles: only when that still leaves several per SM of a big GPU.
        Conv2dVariant::Auto => m.div_ceil(128) * tiles_n >= 1024,
    };
    let bm = if tile128 { 128 } else { 64 };
    let tiles = m.div_ceil(bm) * tiles_n;

    let xvec = kh == 1 && kw == 1 && s == 1 && pad == 0 && (h * wd) % 4 == 0 && vec4_aligned(x);
    let wvec = wt && o % 4 == 0 && vec4_aligned(w);
    let ovec = (ho * wo) % 4 == 0 && vec4_aligned(out) && opts.residual.is_none_or(vec4_aligned);
    let any_f16 = [Some(x), Some(w), bias].iter().flatten().any(|t| t.dtype == DType::F16);
    let tb = bias.map_or("f32", |b| b.dtype.wgsl());

    let mut tensors = vec![x, w, out];
    let mut spec_name = format!(
        "conv{kh}x{kw}s{s}_{}_w{}{}{}",
        x.dtype.wgsl(),
        w.dtype.wgsl(),
        if tile128 { "_t128" } else { "_t64" },
        if wt { "_wt" } else { "" }
    );
    let mut b_bias = 0;
    let mut b_res = 0;
    if let Some(b) = bias {
        tensors.push(b);
        b_bias = tensors.len();
        spec_name.push_str("_bias");
    }
    if let Some(r) = opts.residual {
        tensors.push(r);
        b_res = tensors.len();
        spec_name.push_str("_res");
    }
    let spec = crate::kernels::KernelSpec::new(spec_name, shader!("conv.wgsl"), "conv2d")
        .define("TX", x.dtype.wgsl())
        .define("TW", w.dtype.wgsl())
        .define("TB", tb)
        .define("F16", u8::from(any_f16))
        .define("KH", kh)
        .define("KW", kw)
        .define("S", s)
        .define("P", pad)
        .define("TM8", u8::from(tile128))
        .define("WT", u8::from(wt))
        .define("WVEC", u8::from(wvec))
        .define("XVEC", u8::from(xvec))
        .define("OVEC", u8::from(ovec))
        .define("BIAS", u8::from(bias.is_some()))
        .define("RES", u8::from(opts.residual.is_some()))
        .define("B_BIAS", b_bias)
        .define("B_RES", b_res)
        .define("OFF_BIAS", if b_bias > 0 { offset_expr(b_bias) } else { "0u".into() })
        .define("OFF_RES", if b_res > 0 { offset_expr(b_res) } else { "0u".into() });
    let kernel = gpu.kernel(&spec)?;
    let params = [
        n as u32,
        c as u32,
        h as u32,
        wd as u32,
        o as u32,
        ho as u32,
        wo as u32,
        m as u32,
        k as u32,
        tiles_n as u32,
        tiles as u32,
        (ho * wo) as u32,
    ];
    let mut bytes = (x.byte_len() + w.byte_len() + out.byte_len()) as f64;
    let mut flops = 2.0 * m as f64 * o as f64 * k as f64;
    if let Some(b) = bias {
        bytes += b.byte_len() as f64;
        flops += out.numel() as f64;
    }
    if let Some(r) = opts.residual {
        bytes += r.byte_len() as f64;
        flops += out.numel() as f64;
    }
    gpu.dispatch(
        &kernel,
        &params,
        &tensors,
        grid(tiles as u32, gpu.caps.max_workgroups_per_dimension),
        Cost { flops, bytes },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes() {
        assert_eq!(conv2d_output_size((9, 11), (3, 3), 1, 1, None), Some((9, 11)));
        assert_eq!(conv2d_output_size((16, 16), (3, 3), 2, 1, None), Some((8, 8)));
        assert_eq!(conv2d_output_size((15, 15), (3, 3), 2, 1, None), Some((8, 8)));
        assert_eq!(conv2d_output_size((64, 64), (3, 3), 2, 0, Some(1)), Some((32, 32)));
        assert_eq!(conv2d_output_size((2, 2), (3, 3), 1, 0, None), None);
    }

    #[test]
    fn weight_transpose() {
        let v: Vec<f32> = (0..2 * 3).map(|i| i as f32).collect();
        let b = conv2d_weight_bytes(bytemuck::cast_slice(&v), &[2, 3, 1, 1], DType::F32, Layout::Transposed).unwrap();
        let t: &[f32] = bytemuck::cast_slice(&b);
        assert_eq!(t, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
