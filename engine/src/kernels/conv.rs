//! 2-D convolution over NCHW tensors (Stable Diffusion's UNet and VAE), as an implicit GEMM: the input
//! patch is gathered into workgroup memory on the fly, no im2col buffer. See `shaders/conv.wgsl`.
//!
//! Weights are `[O, C, KH, KW]`. The kernel streams them along K = C*KH*KW for 64 output channels at a
//! time, so it prefers them stored as the `[K, O]` transpose ([`Layout::Transposed`], vec4 loads
//! along O); [`conv2d_weight_layout`] says which layout to upload, [`conv2d_weight_bytes`] converts
//! OIHW bytes to it and [`conv2d_weight`] does both. Row-major OIHW weights work too, a little slower.
//!
//! On devices with 16x16 f16 cooperative matrices, f16 convolutions with enough channels run on tensor
//! cores instead ([`Conv2dVariant::Coop`], `kernels/conv_coop.rs`), which want row-major OIHW weights:
//! [`conv2d_weight_layout`] picks that layout for exactly those weights.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::conv_coop::{
    self, COOP_CONCURRENT_WORKGROUPS, COOP_K_STEP, COOP_TILE, COOP_WORKGROUP_OVERHEAD_STEPS,
    ConvGeometry, CoopLayout, CoopTarget,
};
use crate::kernels::{KernelSpec, grid};
use crate::memory::Category;
use crate::tensor::{DType, Layout, Tensor};
use crate::{shader, shape_err};

/// Which kernel computes the convolution. The portable ones are named by their output tile per workgroup
/// and per thread, `P<pixels>C<channels per thread>`: every tile is 64 output channels wide; `C4` uses
/// 256 threads, `C8` 128 threads with twice the work each (more reuse of workgroup memory, fewer
/// threads; so far slower on the H200, kept for tuning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conv2dVariant {
    /// Cooperative matrices where the device has them and the convolution is f16 with row-major
    /// weights and enough channels, else a portable tile picked from the problem size (see
    /// [`conv2d_variant`] and [`conv2d_plan`]).
    Auto,
    /// 64 pixels x 64 channels, 4 x 4 per thread.
    P64C4,
    /// 64 pixels x 64 channels, 4 x 8 per thread.
    P64C8,
    /// 128 pixels x 64 channels, 8 x 4 per thread.
    P128C4,
    /// 128 pixels x 64 channels, 8 x 8 per thread.
    P128C8,
    /// Tensor cores: 128 channels x 128 pixels per workgroup of 8 subgroups (32 channels x 64 pixels
    /// each), K steps of 64, no register prefetch; f16 operands (f32 ones are rounded to f16 on load),
    /// f32 accumulation. Needs 16x16 f16 cooperative matrices, subgroups of 32, row-major weights and
    /// 43 KiB of workgroup memory; an error elsewhere.
    Coop,
    /// `Coop` with K steps of 32 and the next step prefetched into registers (27 KiB of workgroup
    /// memory): what `Auto` runs on cooperative-matrix devices with less than `Coop` needs, and the
    /// previous default, kept to compare against.
    CoopBk32,
    /// `CoopBk32` with the block split over 4 subgroups of 64 x 64 (twice the accumulators per
    /// invocation): the first layout, kept to compare against.
    CoopSg4,
    /// The `Coop` kernel with its 16x16 products done by plain f32 FMAs: runs on any f16 device (slowly)
    /// so that its gather, tiling and epilogue are tested where tensor cores are absent. Where the
    /// workgroup memory is short of `Coop`'s (lavapipe's 32 KiB) it runs unpadded and without the f32
    /// staging area (see `shaders/conv_coop.wgsl`, LEAN).
    CoopEmulated,
    /// `CoopBk32`'s build, emulated like `CoopEmulated`.
    CoopEmulatedBk32,
    /// `CoopSg4`'s layout, emulated like `CoopEmulated`.
    CoopEmulatedSg4,
}

impl Conv2dVariant {
    /// The explicit portable variants.
    pub const ALL: [Conv2dVariant; 4] = [
        Conv2dVariant::P64C4,
        Conv2dVariant::P64C8,
        Conv2dVariant::P128C4,
        Conv2dVariant::P128C8,
    ];

    /// Whether this is the cooperative kernel (or its emulation).
    pub fn is_coop(self) -> bool {
        self.coop_layout().is_some()
    }

    /// The build of the cooperative variants, `None` for the portable kernels.
    pub fn coop_layout(self) -> Option<CoopLayout> {
        match self {
            Conv2dVariant::Coop | Conv2dVariant::CoopEmulated => Some(CoopLayout::SG8_BK64),
            Conv2dVariant::CoopBk32 | Conv2dVariant::CoopEmulatedBk32 => Some(CoopLayout::SG8_BK32),
            Conv2dVariant::CoopSg4 | Conv2dVariant::CoopEmulatedSg4 => Some(CoopLayout::SG4_BK32),
            _ => None,
        }
    }

    /// Whether this is an FMA emulation of the cooperative kernel.
    pub fn is_emulated(self) -> bool {
        matches!(
            self,
            Conv2dVariant::CoopEmulated
                | Conv2dVariant::CoopEmulatedBk32
                | Conv2dVariant::CoopEmulatedSg4
        )
    }

    /// Pixels per workgroup tile and channels per thread of the portable variants.
    fn shape(self) -> (usize, usize) {
        match self {
            Conv2dVariant::P64C4
            | Conv2dVariant::Auto
            | Conv2dVariant::Coop
            | Conv2dVariant::CoopBk32
            | Conv2dVariant::CoopSg4
            | Conv2dVariant::CoopEmulated
            | Conv2dVariant::CoopEmulatedBk32
            | Conv2dVariant::CoopEmulatedSg4 => (64, 4),
            Conv2dVariant::P64C8 => (64, 8),
            Conv2dVariant::P128C4 => (128, 4),
            Conv2dVariant::P128C8 => (128, 8),
        }
    }
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
    /// Split the reduction over this many workgroups per output tile (partial sums in an f32 scratch,
    /// then a second dispatch adds them up). `None` picks it from the problem size; `Some(1)` never
    /// splits.
    pub split_k: Option<usize>,
    /// Where split-K partial sums go: an f32 tensor of at least `splits * out.numel()` values that the
    /// caller shares between the convolutions of one program (they run one after the other). `None`
    /// allocates one for this convolution.
    pub split_scratch: Option<&'a Tensor>,
}

impl Default for Conv2dOptions<'_> {
    fn default() -> Self {
        Conv2dOptions {
            stride: 1,
            padding: 0,
            padding_end: None,
            residual: None,
            variant: Conv2dVariant::Auto,
            split_k: None,
            split_scratch: None,
        }
    }
}

/// Workgroups a dispatch should have to keep a large GPU busy (an H200 has 132 SMs, each running
/// several of these workgroups at once).
const TARGET_WORKGROUPS: usize = 4 * 132;

/// The tile variant and number of K splits [`conv2d`] uses for `m` output pixels, `o` output channels
/// and reduction length `k`, given the variant (`Auto` here means a portable tile: resolve it with
/// [`conv2d_variant`] first to get the device's choice) and split.
pub fn conv2d_plan(
    m: usize,
    o: usize,
    k: usize,
    variant: Conv2dVariant,
    split_k: Option<usize>,
) -> (Conv2dVariant, usize) {
    if variant.is_coop() {
        return (variant, coop_splits(m, o, k, split_k));
    }
    let tiles_n = o.div_ceil(64);
    let variant = match variant {
        // Large images (the VAE's): the 128-pixel tile still gives plenty of workgroups and reuses
        // more (22 against 20 TFLOP/s at 512x512 x 128 channels); at SD's 64x64 x 320 it is slower.
        Conv2dVariant::Auto if m.div_ceil(128) * tiles_n >= TARGET_WORKGROUPS => {
            Conv2dVariant::P128C4
        }
        Conv2dVariant::Auto => Conv2dVariant::P64C4,
        v => v,
    };
    let tiles = m.div_ceil(variant.shape().0) * tiles_n;
    // Small images with many channels (SD's 32x32, 16x16 and 8x8 blocks, the stride-2 downsamples)
    // have too few output tiles to fill the GPU: split the long reduction until there are enough
    // workgroups (a power of two, at most 16, at least 256 of K per split). Measured on the H200 (f16,
    // TFLOP/s): 8x8 x 1280 channels 3.4 unsplit, 15.1 with 16 splits; 16x16 x 1280 10.5 -> 17.6 with 4;
    // the stride-2 64x64 x 320 downsample 10 -> 16 with 4 (but 9 with 7 splits).
    let split = split_k
        .unwrap_or_else(|| {
            if tiles >= TARGET_WORKGROUPS {
                1
            } else {
                TARGET_WORKGROUPS
                    .div_ceil(tiles)
                    .next_power_of_two()
                    .min(16)
            }
        })
        .clamp(
            1,
            k.div_ceil(if split_k.is_some() { 16 } else { 256 }).max(1),
        );
    // Whole K steps per split, and no empty split.
    let k_split = k.div_ceil(split).div_ceil(16) * 16;
    (variant, k.div_ceil(k_split))
}

/// K splits of the cooperative kernel (whole 64-deep K steps, in every layout, so that they all split
/// alike). Unless asked, the split count of least predicted time: the grid runs in waves of
/// [`COOP_CONCURRENT_WORKGROUPS`], each as long as one workgroup's K steps plus
/// [`COOP_WORKGROUP_OVERHEAD_STEPS`]; at most 16 splits of at least 512 of K each, ties to fewer.
/// On SD 1.5's UNet (H200, us): 64x64 x 320 2 splits (252 against 269 unsplit), 32x32 x 640 3 (200
/// against 277 with the old rule's 2), 16x16 x 1280 3 (281 against 405 with 4), 8x8 x 1280 13 (82 at
/// 12 against 126 with 16).
fn coop_splits(m: usize, o: usize, k: usize, split_k: Option<usize>) -> usize {
    let tiles = m.div_ceil(COOP_TILE) * o.div_ceil(COOP_TILE);
    let steps = k.div_ceil(COOP_K_STEP).max(1);
    // Splits of `s` wanted -> (splits that cover K in whole steps, steps per split).
    let cover = |s: usize| {
        let per = steps.div_ceil(s.clamp(1, steps));
        (steps.div_ceil(per), per)
    };
    if let Some(s) = split_k {
        return cover(s).0;
    }
    let most = (k / 512).clamp(1, 16);
    let cost = |s: usize| {
        let (splits, per) = cover(s);
        (tiles * splits).div_ceil(COOP_CONCURRENT_WORKGROUPS)
            * (per + COOP_WORKGROUP_OVERHEAD_STEPS)
    };
    let best = (1..=most).fold(1, |best, s| if cost(s) < cost(best) { s } else { best });
    cover(best).0
}

/// The kernel [`conv2d`] runs on this device for activations of `x_dtype` and weights of `w_dtype` in
/// `w_layout`, `o` output channels and reduction length `k` (C*KH*KW): `Auto` becomes
/// [`Conv2dVariant::Coop`] (or [`Conv2dVariant::CoopBk32`] where the workgroup memory is short of
/// `Coop`'s) where that is available and worthwhile (all f16, row-major weights, at least 64 channels
/// and 64 of K), else stays `Auto`; explicit cooperative variants the device or
/// weights cannot run are errors. Callers sizing a shared split-K scratch pass the result to
/// [`conv2d_plan`].
pub fn conv2d_variant(
    gpu: &Gpu,
    x_dtype: DType,
    w_dtype: DType,
    w_layout: Layout,
    o: usize,
    k: usize,
    requested: Conv2dVariant,
) -> Result<Conv2dVariant> {
    conv_coop::resolve_variant(&gpu.caps, x_dtype, w_dtype, w_layout, o, k, requested)
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

/// The layout [`conv2d`] is fastest with on this device for a weight of `shape` (`[O, C, KH, KW]`) and
/// `dtype`: row-major OIHW where the cooperative kernel will run it (f16, a device with cooperative
/// matrices, enough channels; activations are assumed to share the weights' dtype, as in SD), else the
/// `[C*KH*KW, O]` transpose the portable kernels stream fastest.
pub fn conv2d_weight_layout(gpu: &Gpu, shape: &[usize], dtype: DType) -> Layout {
    let (o, k) = match shape {
        [o, c, kh, kw] => (*o, c * kh * kw),
        _ => return Layout::Transposed,
    };
    match conv2d_variant(
        gpu,
        dtype,
        dtype,
        Layout::RowMajor,
        o,
        k,
        Conv2dVariant::Auto,
    ) {
        Ok(v) if v.is_coop() => Layout::RowMajor,
        _ => Layout::Transposed,
    }
}

/// Converts row-major OIHW weight bytes (`shape` = `[O, C, KH, KW]`, f32 or f16) to `layout`
/// (row-major: unchanged; transposed: `[C*KH*KW, O]`).
pub fn conv2d_weight_bytes(
    bytes: &[u8],
    shape: &[usize],
    dtype: DType,
    layout: Layout,
) -> Result<Vec<u8>> {
    if shape.len() != 4 || !matches!(dtype, DType::F32 | DType::F16) {
        return Err(shape_err!(
            "conv2d weight must be [O, C, KH, KW] f32/f16, got {shape:?} {dtype:?}"
        ));
    }
    let eb = dtype.block_bytes();
    let o = shape[0];
    let k = shape[1] * shape[2] * shape[3];
    if bytes.len() != o * k * eb {
        return Err(shape_err!(
            "conv2d weight {shape:?} {dtype:?}: {} bytes given",
            bytes.len()
        ));
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
        other => Err(DriftError::Unsupported(format!(
            "conv2d weights in {other:?} layout"
        ))),
    }
}

/// Uploads OIHW weight bytes in the layout [`conv2d_weight_layout`] prefers.
pub fn conv2d_weight(
    gpu: &Gpu,
    label: &str,
    shape: &[usize],
    dtype: DType,
    oihw: &[u8],
) -> Result<Tensor> {
    let layout = conv2d_weight_layout(gpu, shape, dtype);
    let bytes = conv2d_weight_bytes(oihw, shape, dtype, layout)?;
    gpu.tensor_from_bytes(label, shape, dtype, layout, &bytes, Category::Weights)
}

/// Whether a tensor's first element is 4-element aligned within its binding (vec4 access).
fn vec4_aligned(t: &Tensor) -> bool {
    t.storage.offset.is_multiple_of(4 * t.elem_bytes())
}

fn float(t: &Tensor, what: &str, gpu: &Gpu) -> Result<()> {
    match t.dtype {
        DType::F32 => Ok(()),
        DType::F16 if gpu.caps.f16 => Ok(()),
        DType::F16 => Err(DriftError::Unsupported(format!(
            "conv2d: {what} is f16 but the device has no f16"
        ))),
        d => Err(shape_err!("conv2d: {what} must be f32 or f16, got {d:?}")),
    }
}

/// The base-offset expression of tensor binding `b` (1-based) in the params header.
pub(crate) fn offset_expr(b: usize) -> String {
    format!("p.offs[{}u][{}u]", (b - 1) / 4, (b - 1) % 4)
}

/// `out = conv2d(x, w) + bias + residual`. `x` is `[N, C, H, W]`, `w` `[O, C, KH, KW]` (row-major or
/// [`Layout::Transposed`]), `bias` `[O]`, `out` and the residual `[N, O, Ho, Wo]`. `x`, `out` and the
/// residual share one float dtype; `w` and `bias` may be f16 or f32 independently. Accumulates in f32.
/// One dispatch, or two with split-K (the builder then allocates its f32 scratch once).
pub fn conv2d(
    gpu: &Gpu,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
) -> Result<Vec<Dispatch>> {
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
        return Err(shape_err!(
            "conv2d: x {:?} has {c} channels, w {:?} wants {}",
            x.shape,
            w.shape,
            w.shape[1]
        ));
    }
    let (ho, wo) = conv2d_output_size(
        (h, wd),
        (kh, kw),
        opts.stride,
        opts.padding,
        opts.padding_end,
    )
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
        return Err(shape_err!(
            "conv2d: empty tensor ({:?} by {:?})",
            x.shape,
            w.shape
        ));
    }
    float(x, "x", gpu)?;
    float(w, "w", gpu)?;
    if out.dtype != x.dtype {
        return Err(shape_err!(
            "conv2d: out is {:?} but x is {:?}",
            out.dtype,
            x.dtype
        ));
    }
    for (t, what) in [(x, "x"), (out, "out")] {
        if !matches!(t.layout, Layout::RowMajor | Layout::Nchw) {
            return Err(shape_err!(
                "conv2d: {what} must be NCHW (row-major), got {:?}",
                t.layout
            ));
        }
    }
    let wt = match w.layout {
        Layout::RowMajor => false,
        Layout::Transposed => true,
        other => {
            return Err(shape_err!(
                "conv2d: weights in {other:?} layout (want row-major or transposed)"
            ));
        }
    };
    if let Some(b) = bias {
        float(b, "bias", gpu)?;
        if b.shape != [o] {
            return Err(shape_err!("conv2d: bias is {:?}, want [{o}]", b.shape));
        }
    }
    if let Some(r) = opts.residual
        && (r.shape != out.shape
            || r.dtype != out.dtype
            || !matches!(r.layout, Layout::RowMajor | Layout::Nchw))
    {
        return Err(shape_err!(
            "conv2d: residual {:?} {:?} must match out {:?} {:?}",
            r.shape,
            r.dtype,
            out.shape,
            out.dtype
        ));
    }
    let (s, pad) = (opts.stride, opts.padding);
    let m = n * ho * wo;
    let k = c * kh * kw;
    // Indices are u32, window offsets i32.
    if [x.numel(), w.numel(), out.numel(), m, k]
        .iter()
        .any(|&v| v >= i32::MAX as usize)
    {
        return Err(shape_err!(
            "conv2d: {:?} by {:?} is too large for 32-bit indexing",
            x.shape,
            w.shape
        ));
    }

    let requested = conv2d_variant(gpu, x.dtype, w.dtype, w.layout, o, k, opts.variant)?;
    let total = out.numel();
    let (variant, mut splits) = conv2d_plan(m, o, k, requested, opts.split_k);
    // A shared scratch sized by a caller's own plan may hold fewer splits than this device's plan
    // wants (the cooperative kernel splits differently): use as many as it holds.
    if let (None, Some(shared)) = (opts.split_k, opts.split_scratch)
        && splits > 1
        && shared.numel() < splits * total
    {
        splits = conv2d_plan(m, o, k, variant, Some((shared.numel() / total).max(1))).1;
    }
    let (bm, tn) = variant.shape();
    let k_step = if variant.is_coop() { COOP_K_STEP } else { 16 };
    let k_split = k.div_ceil(splits).div_ceil(k_step) * k_step;
    let tiles_n = o.div_ceil(64);
    let tiles = m.div_ceil(bm) * tiles_n;
    if splits * total >= i32::MAX as usize {
        return Err(shape_err!(
            "conv2d: split-K scratch for {:?} is too large",
            out.shape
        ));
    }
    let split = splits > 1;
    let scratch = if !split {
        None
    } else if let Some(shared) = opts.split_scratch {
        if shared.dtype != DType::F32 || shared.numel() < splits * total {
            return Err(shape_err!(
                "conv2d: the shared split-K scratch holds {} values, {} needed",
                shared.numel(),
                splits * total
            ));
        }
        Some(shared.view(0, &[splits, total])?)
    } else {
        Some(gpu.tensor(
            "conv2d split-K scratch",
            &[splits, total],
            DType::F32,
            Category::Activations,
        )?)
    };

    let xvec =
        kh == 1 && kw == 1 && s == 1 && pad == 0 && (h * wd).is_multiple_of(4) && vec4_aligned(x);
    let wvec = wt && o.is_multiple_of(4) && vec4_aligned(w);
    let ovec =
        (ho * wo).is_multiple_of(4) && vec4_aligned(out) && opts.residual.is_none_or(vec4_aligned);
    let any_f16 = [Some(x), Some(w), bias]
        .iter()
        .flatten()
        .any(|t| t.dtype == DType::F16);
    let tb = bias.map_or("f32", |b| b.dtype.wgsl());
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
        k_split as u32,
        splits as u32,
        total as u32,
        0,
    ];
    let max = gpu.caps.max_workgroups_per_dimension;

    // Bias and residual go to the last dispatch: the conv itself, or the split-K reduction.
    let mut tensors = if let Some(sc) = &scratch {
        vec![sc, out]
    } else {
        vec![x, w, out]
    };
    let mut fused = String::new();
    let (mut b_bias, mut b_res) = (0, 0);
    if let Some(b) = bias {
        tensors.push(b);
        b_bias = tensors.len();
        fused.push_str("_bias");
    }
    if let Some(r) = opts.residual {
        tensors.push(r);
        b_res = tensors.len();
        fused.push_str("_res");
    }
    let common = |spec: KernelSpec, fuse: bool| {
        spec.define("TX", x.dtype.wgsl())
            .define("TW", w.dtype.wgsl())
            .define("TB", tb)
            .define("F16", u8::from(any_f16))
            .define("OVEC", u8::from(ovec))
            .define("BIAS", u8::from(fuse && bias.is_some()))
            .define("RES", u8::from(fuse && opts.residual.is_some()))
            .define("B_BIAS", b_bias)
            .define("B_RES", b_res)
            .define(
                "OFF_BIAS",
                if b_bias > 0 {
                    offset_expr(b_bias)
                } else {
                    "0u".into()
                },
            )
            .define(
                "OFF_RES",
                if b_res > 0 {
                    offset_expr(b_res)
                } else {
                    "0u".into()
                },
            )
    };
    let mut epilogue_bytes = 0.0;
    let mut epilogue_flops = 0.0;
    for t in [bias, opts.residual].into_iter().flatten() {
        epilogue_bytes += t.byte_len() as f64;
        epilogue_flops += total as f64;
    }
    // The split-K reduction: sums the partial results and applies bias and residual.
    let reduce = || -> Result<Dispatch> {
        let rname = format!("conv2d_reduce_{}{fused}", x.dtype.wgsl());
        let rspec = common(
            KernelSpec::new(rname, shader!("conv.wgsl"), "conv2d_reduce"),
            true,
        )
        .define("REDUCE", 1)
        .define("SPLIT", 0);
        gpu.dispatch(
            &gpu.kernel(&rspec)?,
            &params,
            &tensors,
            grid(
                (if ovec { total / 4 } else { total }).div_ceil(256) as u32,
                max,
            ),
            Cost {
                flops: ((splits - 1) * total) as f64 + epilogue_flops,
                bytes: ((splits * total * 4) as f64) + out.byte_len() as f64 + epilogue_bytes,
            },
        )
    };

    if variant.is_coop() {
        let geometry = ConvGeometry {
            n,
            c,
            h,
            w: wd,
            o,
            kh,
            kw,
            ho,
            wo,
            stride: s,
            pad,
            pad_end: opts.padding_end.unwrap_or(pad),
        };
        let target = match &scratch {
            Some(scratch) => CoopTarget::Split {
                scratch,
                splits,
                k_split,
            },
            None => CoopTarget::Out {
                out,
                bias,
                residual: opts.residual,
            },
        };
        let main = conv_coop::dispatch(gpu, &geometry, x, w, target, variant)?;
        return Ok(if split {
            vec![main, reduce()?]
        } else {
            vec![main]
        });
    }

    let name = format!(
        "conv{kh}x{kw}s{s}_{}_w{}_p{bm}c{tn}{}{}",
        x.dtype.wgsl(),
        w.dtype.wgsl(),
        if wt { "_wt" } else { "" },
        if split { "_splitk" } else { fused.as_str() }
    );
    let spec = common(
        KernelSpec::new(name, shader!("conv.wgsl"), "conv2d"),
        !split,
    )
    .define("REDUCE", 0)
    .define("SPLIT", u8::from(split))
    .define("KH", kh)
    .define("KW", kw)
    .define("S", s)
    .define("P", pad)
    .define("TM8", u8::from(bm == 128))
    .define("TN8", u8::from(tn == 8))
    .define("A2", u8::from(bm == 128 || tn == 8))
    .define("A4", u8::from(bm == 128 && tn == 8))
    .define("MASK", u8::from(kh * kw <= 32))
    .define("WT", u8::from(wt))
    .define("WVEC", u8::from(wvec))
    .define("XVEC", u8::from(xvec));
    let kernel = gpu.kernel(&spec)?;
    let mut conv_bytes = (x.byte_len() + w.byte_len()) as f64;
    conv_bytes += if split {
        (splits * total * 4) as f64
    } else {
        out.byte_len() as f64
    };
    let conv_flops = 2.0 * m as f64 * o as f64 * k as f64;
    let conv_tensors = [x, w, scratch.as_ref().unwrap_or(out)];
    if !split {
        let d = gpu.dispatch(
            &kernel,
            &params,
            &tensors,
            grid(tiles as u32, max),
            Cost {
                flops: conv_flops + epilogue_flops,
                bytes: conv_bytes + epilogue_bytes,
            },
        )?;
        return Ok(vec![d]);
    }
    let main = gpu.dispatch(
        &kernel,
        &params,
        &conv_tensors,
        grid((tiles * splits) as u32, max),
        Cost {
            flops: conv_flops,
            bytes: conv_bytes,
        },
    )?;
    Ok(vec![main, reduce()?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes() {
        assert_eq!(
            conv2d_output_size((9, 11), (3, 3), 1, 1, None),
            Some((9, 11))
        );
        assert_eq!(
            conv2d_output_size((16, 16), (3, 3), 2, 1, None),
            Some((8, 8))
        );
        assert_eq!(
            conv2d_output_size((15, 15), (3, 3), 2, 1, None),
            Some((8, 8))
        );
        assert_eq!(
            conv2d_output_size((64, 64), (3, 3), 2, 0, Some(1)),
            Some((32, 32))
        );
        assert_eq!(conv2d_output_size((2, 2), (3, 3), 1, 0, None), None);
    }

    #[test]
    fn plans() {
        use Conv2dVariant::*;
        // SD 1.5 at 512x512, batch 2: 64x64 x 320 fills the GPU; 8x8 x 1280 is split.
        assert_eq!(conv2d_plan(2 * 64 * 64, 320, 2880, Auto, None), (P64C4, 1));
        assert_eq!(conv2d_plan(2 * 8 * 8, 1280, 11520, Auto, None), (P64C4, 16));
        assert_eq!(
            conv2d_plan(2 * 16 * 16, 1280, 11520, Auto, None),
            (P64C4, 4)
        );
        assert_eq!(conv2d_plan(2 * 32 * 32, 320, 2880, Auto, None), (P64C4, 4));
        assert_eq!(conv2d_plan(512 * 512, 128, 1152, Auto, None), (P128C4, 1));
        // Small K: no split below 256 per split unless asked; forced splits are never empty.
        assert_eq!(conv2d_plan(64, 8, 72, Auto, None), (P64C4, 1));
        assert_eq!(conv2d_plan(64, 8, 72, P128C8, Some(3)), (P128C8, 3));
        assert_eq!(conv2d_plan(64, 8, 40, P64C4, Some(5)), (P64C4, 3));
    }

    #[test]
    fn coop_plans() {
        use Conv2dVariant::*;
        // SD 1.5 at 512x512, batch 2: the split counts of least predicted time (measured best on the
        // H200: 2, 3, 3 and 12); the VAE's large maps are never split.
        assert_eq!(conv2d_plan(2 * 64 * 64, 320, 2880, Coop, None), (Coop, 2));
        assert_eq!(conv2d_plan(2 * 32 * 32, 640, 5760, Coop, None), (Coop, 3));
        assert_eq!(conv2d_plan(2 * 16 * 16, 1280, 11520, Coop, None), (Coop, 3));
        assert_eq!(conv2d_plan(2 * 8 * 8, 1280, 11520, Coop, None), (Coop, 13));
        assert_eq!(conv2d_plan(64 * 64, 512, 4608, Coop, None), (Coop, 1));
        assert_eq!(conv2d_plan(256 * 256, 256, 2304, Coop, None), (Coop, 1));
        assert_eq!(conv2d_plan(128 * 128, 512, 4608, Coop, None), (Coop, 1));
        // Forced splits are never empty: K 45 is one step of 64, K 81 two.
        assert_eq!(
            conv2d_plan(64, 70, 45, CoopEmulated, Some(3)),
            (CoopEmulated, 1)
        );
        assert_eq!(
            conv2d_plan(64, 70, 81, CoopEmulatedBk32, Some(3)),
            (CoopEmulatedBk32, 2)
        );
        assert_eq!(conv2d_plan(64, 70, 360, Coop, Some(3)), (Coop, 3));
        // Every layout splits alike (the same 128 x 128 tile, K ranges in whole steps of 64).
        for v in [CoopBk32, CoopSg4] {
            assert_eq!(conv2d_plan(2 * 16 * 16, 1280, 11520, v, None), (v, 3));
            assert_eq!(conv2d_plan(64, 70, 360, v, Some(3)), (v, 3));
        }
    }

    #[test]
    fn weight_transpose() {
        let v: Vec<f32> = (0..2 * 3).map(|i| i as f32).collect();
        let b = conv2d_weight_bytes(
            bytemuck::cast_slice(&v),
            &[2, 3, 1, 1],
            DType::F32,
            Layout::Transposed,
        )
        .unwrap();
        let t: &[f32] = bytemuck::cast_slice(&b);
        assert_eq!(t, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
