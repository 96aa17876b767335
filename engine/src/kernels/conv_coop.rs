//! The cooperative-matrix (tensor core) convolution behind [`crate::kernels::conv::conv2d`]'s
//! [`Conv2dVariant::Coop`]: one GEMM of the row-major OIHW weights `[O, C*KH*KW]` by the implicit im2col
//! matrix of all images' output pixels, f16 operands, f32 accumulation. See `shaders/conv_coop.wgsl`.
//!
//! Two layouts of the 128 x 128 block: 8 subgroups of 32 x 64 ([`Conv2dVariant::Coop`], the default:
//! half the accumulator registers per invocation; the matmul with that layout measured 1.35-1.45x faster
//! on the H200) and 4 subgroups of 64 x 64 ([`Conv2dVariant::CoopSg4`], kept to compare).
//! [`Conv2dVariant::CoopEmulated`] and [`Conv2dVariant::CoopEmulatedSg4`] are the same kernels with the
//! 16x16 products done by plain FMAs: they run wherever f16 does and check the gather, tiling and
//! epilogue on devices without tensor cores.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::{Caps, Gpu};
use crate::kernels::conv::Conv2dVariant;
use crate::kernels::matmul::coop_available;
use crate::kernels::{KernelSpec, grid};
use crate::shader;
use crate::tensor::{DType, Layout, Tensor};

/// Output channels and pixels of one workgroup tile.
pub const COOP_TILE: usize = 128;
/// K per step of the kernel; a split's K range is a multiple of it.
pub const COOP_K_STEP: usize = 32;

/// Workgroups below which [`crate::kernels::conv::conv2d_plan`] splits K for the cooperative kernel: one
/// per H200 SM (132). A first guess, not yet measured; `drift bench kernels --filter "conv coop"` has
/// the forced-split cases to tune it.
pub const COOP_TARGET_WORKGROUPS: usize = 132;

/// Workgroup memory of the kernel with `subgroups` subgroups (8 or 4): the weight tile (128 rows of 10
/// vec4<f16>), the input tile (32 rows of 34) and the f32 staging area (16 rows x 64 or 16 columns per
/// subgroup).
pub fn coop_conv_smem(epi4: bool, subgroups: u32) -> u32 {
    let tiles = (128 * 10 + 32 * 34) * 8;
    tiles + subgroups * 16 * if epi4 { 64 } else { 16 } * 4
}

/// Whether the 4-accumulator staging (EPI4) fits `max_workgroup_storage` bytes: only ever with 4
/// subgroups (with 8 it needs 51712 bytes, over the H200's 48 KiB).
fn coop_conv_epi4(max_workgroup_storage: u32, subgroups: u32) -> bool {
    subgroups == 4 && coop_conv_smem(true, subgroups) <= max_workgroup_storage
}

/// Whether a convolution with `o` output channels and reduction length `k` (= C*KH*KW) has enough work
/// for the 128 x 128 tiles: tiny ones (SD's conv_in with 4 channels, conv_out with 3 or 4 outputs) stay
/// on the portable kernel.
pub fn coop_worthwhile(o: usize, k: usize) -> bool {
    o >= 64 && k >= 64
}

/// The variant `requested` resolves to for weights of `w_dtype` in `w_layout` and activations of
/// `x_dtype`: `Auto` becomes [`Conv2dVariant::Coop`] on a device with 16x16 f16 cooperative matrices
/// when everything is f16, the weights are row-major and the shape is worth it, and stays `Auto`
/// (the portable kernels) otherwise. An explicit cooperative variant the device or the weights cannot
/// run is an error.
pub fn resolve_variant(
    caps: &Caps,
    x_dtype: DType,
    w_dtype: DType,
    w_layout: Layout,
    o: usize,
    k: usize,
    requested: Conv2dVariant,
) -> Result<Conv2dVariant> {
    let Some(subgroups) = requested.coop_subgroups() else {
        let coop = requested == Conv2dVariant::Auto
            && coop_available(caps)
            && x_dtype == DType::F16
            && w_dtype == DType::F16
            && w_layout == Layout::RowMajor
            && coop_worthwhile(o, k);
        return Ok(if coop { Conv2dVariant::Coop } else { requested });
    };
    let smem = coop_conv_smem(false, subgroups);
    if !requested.is_emulated() && !coop_available(caps) {
        return Err(DriftError::Unsupported(format!(
            "cooperative-matrix conv2d needs a device with 16x16 f16 cooperative matrices, \
             subgroups of 32 and {smem} bytes of workgroup memory"
        )));
    }
    if smem > caps.max_workgroup_storage || 32 * subgroups > caps.max_invocations_per_workgroup {
        return Err(DriftError::Unsupported(format!(
            "{requested:?} conv2d needs {smem} bytes of workgroup memory and {} invocations per \
             workgroup (the device has {} and {})",
            32 * subgroups,
            caps.max_workgroup_storage,
            caps.max_invocations_per_workgroup
        )));
    }
    if !caps.f16 {
        return Err(DriftError::Unsupported(
            "cooperative-matrix conv2d needs shader-f16".into(),
        ));
    }
    if w_layout != Layout::RowMajor {
        return Err(DriftError::Unsupported(format!(
            "cooperative-matrix conv2d needs row-major OIHW weights, got {w_layout:?} \
             (upload them with conv2d_weight)"
        )));
    }
    Ok(requested)
}

/// Geometry of a checked convolution (see [`crate::kernels::conv::conv2d`]).
#[derive(Clone, Copy, Debug)]
pub struct ConvGeometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub ho: usize,
    pub wo: usize,
    pub stride: usize,
    pub pad: usize,
    pub pad_end: usize,
}

impl ConvGeometry {
    pub fn k(&self) -> usize {
        self.c * self.kh * self.kw
    }

    pub fn pixels(&self) -> usize {
        self.n * self.ho * self.wo
    }
}

/// Whether a tensor's first element is 4-element aligned within its binding (vec4 access).
fn vec4_aligned(t: &Tensor) -> bool {
    t.storage.offset.is_multiple_of(4 * t.elem_bytes())
}

/// Where the main dispatch writes: the output itself (with bias and residual fused) or, with split-K,
/// the f32 scratch `[splits, N*O*Ho*Wo]` that the reduction reads.
pub enum CoopTarget<'a> {
    Out {
        out: &'a Tensor,
        bias: Option<&'a Tensor>,
        residual: Option<&'a Tensor>,
    },
    Split {
        scratch: &'a Tensor,
        splits: usize,
        k_split: usize,
    },
}

/// The cooperative convolution's dispatch. Shapes, dtypes and layouts were checked by `conv2d`, and
/// `variant` (one of the cooperative ones) by [`resolve_variant`].
pub fn dispatch(
    gpu: &Gpu,
    g: &ConvGeometry,
    x: &Tensor,
    w: &Tensor,
    target: CoopTarget,
    variant: Conv2dVariant,
) -> Result<Dispatch> {
    let caps = &gpu.caps;
    let (k, pixels) = (g.k(), g.pixels());
    let hw = g.ho * g.wo;
    let total = g.n * g.o * hw;
    let (out, bias, residual, splits, k_split) = match target {
        CoopTarget::Out {
            out,
            bias,
            residual,
        } => (
            out,
            bias,
            residual,
            1,
            k.div_ceil(COOP_K_STEP) * COOP_K_STEP,
        ),
        CoopTarget::Split {
            scratch,
            splits,
            k_split,
        } => (scratch, None, None, splits, k_split),
    };
    let split = splits > 1;
    let tiles_m = g.o.div_ceil(COOP_TILE);
    let tiles = tiles_m * pixels.div_ceil(COOP_TILE);
    let groups = tiles * splits;
    if groups >= u32::MAX as usize || splits * total >= i32::MAX as usize {
        return Err(crate::shape_err!(
            "conv2d: {groups} workgroups / {} outputs are too many for 32-bit indexing",
            splits * total
        ));
    }

    let xvec = g.kh == 1
        && g.kw == 1
        && g.stride == 1
        && g.pad == 0
        && g.pad_end == 0
        && hw.is_multiple_of(4)
        && vec4_aligned(x);
    let va = k.is_multiple_of(4) && vec4_aligned(w);
    let vo = hw.is_multiple_of(4) && vec4_aligned(out) && residual.is_none_or(vec4_aligned);
    let emulate = variant.is_emulated();
    let subgroups = variant.coop_subgroups().ok_or_else(|| {
        DriftError::Unsupported(format!("{variant:?} is not a cooperative conv2d variant"))
    })?;
    let sg8 = subgroups == 8;
    let epi4 = coop_conv_epi4(caps.max_workgroup_storage, subgroups);

    let mut tensors = vec![x, w, out];
    let mut fused = String::new();
    let (mut b_bias, mut b_res) = (0, 0);
    if let Some(b) = bias {
        tensors.push(b);
        b_bias = tensors.len();
        fused.push_str("_bias");
    }
    if let Some(r) = residual {
        tensors.push(r);
        b_res = tensors.len();
        fused.push_str("_res");
    }
    let offset = |b: usize| {
        if b > 0 {
            super::conv::offset_expr(b)
        } else {
            "0u".into()
        }
    };
    let name = format!(
        "conv{}x{}s{}_coop{}{}_{}_w{}{}",
        g.kh,
        g.kw,
        g.stride,
        if sg8 { "" } else { "_sg4" },
        if emulate { "_emulated" } else { "" },
        x.dtype.wgsl(),
        w.dtype.wgsl(),
        if split { "_splitk" } else { fused.as_str() }
    );
    let mut spec = KernelSpec::new(name, shader!("conv_coop.wgsl"), "conv2d_coop")
        .define("TX", x.dtype.wgsl())
        .define("TW", w.dtype.wgsl())
        .define("TB", bias.map_or("f32", |b| b.dtype.wgsl()))
        .define("KH", g.kh)
        .define("KW", g.kw)
        .define("S", g.stride)
        .define("P", g.pad)
        .define("MASK", u8::from(g.kh * g.kw <= 32))
        .define("XVEC", u8::from(xvec))
        .define("VA", u8::from(va))
        .define("VO", u8::from(vo))
        .define("SG8", u8::from(sg8))
        .define("EPI4", u8::from(epi4))
        .define("SPLIT", u8::from(split))
        .define("BIAS", u8::from(bias.is_some()))
        .define("RES", u8::from(residual.is_some()))
        .define("B_BIAS", b_bias)
        .define("B_RES", b_res)
        .define("OFF_BIAS", offset(b_bias))
        .define("OFF_RES", offset(b_res))
        .define("EMULATE", u8::from(emulate));
    // Loop bounding as measured for matmul_coop's layouts on the H200: kept for 4 subgroups, faster
    // without for 8.
    spec.loop_bounding = !sg8;
    let kernel = gpu.kernel(&spec)?;
    let params = [
        g.c,
        g.h,
        g.w,
        g.o,
        g.wo,
        hw,
        pixels,
        k,
        tiles_m,
        tiles,
        groups,
        k_split,
        total,
        g.c * g.h * g.w,
        0,
        0,
    ]
    .map(|v| v as u32);
    let mut bytes = (x.byte_len() + w.byte_len()) as f64;
    bytes += if split {
        (splits * total * 4) as f64
    } else {
        out.byte_len() as f64
    };
    let mut flops = 2.0 * pixels as f64 * g.o as f64 * k as f64;
    for t in [bias, residual].into_iter().flatten() {
        bytes += t.byte_len() as f64;
        flops += total as f64;
    }
    gpu.dispatch(
        &kernel,
        &params,
        &tensors,
        grid(groups as u32, caps.max_workgroups_per_dimension),
        Cost { flops, bytes },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_fits_the_matmul_budget() {
        // coop_available checks the eight-subgroup matmul's small-staging footprint (28 KiB); this
        // kernel's must not be larger in either layout, or a device could pass that check and still fail
        // to create the pipeline.
        assert_eq!(coop_conv_smem(false, 8), 27136);
        assert_eq!(coop_conv_smem(false, 4), 23040);
        assert_eq!(coop_conv_smem(true, 4), 35328);
        assert!(coop_conv_smem(false, 8) <= 28 * 1024);
        // The H200 has 48 KiB: EPI4 fits with 4 subgroups, not with 8; lavapipe's 32 KiB fits neither
        // EPI4 but both small-staging layouts.
        assert!(coop_conv_epi4(48 * 1024, 4));
        assert!(!coop_conv_epi4(48 * 1024, 8));
        assert_eq!(coop_conv_smem(true, 8), 51712);
        assert!(!coop_conv_epi4(32 * 1024, 4));
    }

    #[test]
    fn worthwhile_shapes() {
        // SD 1.5: conv_in (4 channels, K 36) and conv_out (4 outputs) stay portable.
        assert!(!coop_worthwhile(320, 36));
        assert!(!coop_worthwhile(4, 2880));
        assert!(coop_worthwhile(320, 2880));
        assert!(coop_worthwhile(320, 320)); // 1x1 skip projections
    }
}
