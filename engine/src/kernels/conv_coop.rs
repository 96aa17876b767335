//! The cooperative-matrix (tensor core) convolution behind [`crate::kernels::conv::conv2d`]'s
//! [`Conv2dVariant::Coop`]: one GEMM of the row-major OIHW weights `[O, C*KH*KW]` by the implicit im2col
//! matrix of all images' output pixels, f16 operands, f32 accumulation. See `shaders/conv_coop.wgsl`.
//!
//! Three builds of the 128 x 128 block ([`CoopLayout`]): 8 subgroups of 32 x 64 with K steps of 64 and no
//! register prefetch ([`Conv2dVariant::Coop`], the default where the device has the 43 KiB of
//! workgroup memory: the matmul with that build measured 1.3-1.4x faster than with K steps of 32 and
//! a prefetch on the H200), the same with K steps of 32 and a register prefetch
//! ([`Conv2dVariant::CoopBk32`]: the default elsewhere and the comparison) and 4 subgroups of 64 x 64
//! ([`Conv2dVariant::CoopSg4`], kept to compare). The `CoopEmulated*` variants are the same kernels
//! with the 16x16 products done by plain FMAs: they run wherever f16 does and check the gather, tiling
//! and epilogue on devices without tensor cores.

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
/// A split's K range is a multiple of this: the deepest K step of the kernel's builds, so that every
/// build splits alike.
pub const COOP_K_STEP: usize = 64;

/// Cooperative workgroups the H200 runs side by side: one per SM (132). Measured (2026-12-02, `drift
/// bench kernels --filter convcoopsweep`): a second workgroup on an SM adds no throughput, so a grid
/// of 160 takes as long as one of 264 (16x16 x 1280: 4 splits 405 us, 3 splits 281 us).
pub const COOP_CONCURRENT_WORKGROUPS: usize = crate::kernels::TUNED_SMS;

/// What a workgroup pays besides its K steps (the pixel setup, the staged epilogue, the partial
/// sums' share of the summing pass), in K steps of 64: fitted to the same sweep (1.5 at 16x16 x 1280,
/// 5.9 at 32x32 x 640).
pub const COOP_WORKGROUP_OVERHEAD_STEPS: usize = 4;

/// One build of the cooperative kernel: subgroups of 32 per 128 x 128 block (8 or 4), K per step (64
/// only with 8 subgroups) and whether the next step is prefetched into registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopLayout {
    pub subgroups: u32,
    pub bk: u32,
    pub prefetch: bool,
}

impl CoopLayout {
    pub const SG8_BK64: CoopLayout = CoopLayout {
        subgroups: 8,
        bk: 64,
        prefetch: false,
    };
    pub const SG8_BK32: CoopLayout = CoopLayout {
        subgroups: 8,
        bk: 32,
        prefetch: true,
    };
    pub const SG4_BK32: CoopLayout = CoopLayout {
        subgroups: 4,
        bk: 32,
        prefetch: true,
    };

    /// Workgroup memory: the weight tile (128 rows of `bk / 4 + 2` vec4<f16>), the input tile (`bk` rows
    /// of 34) and the f32 staging area (16 rows x 64 (`epi4`) or 16 columns per subgroup). `lean` (the
    /// emulation only): unpadded rows (`bk / 4` and 32) and no staging area.
    pub fn smem(self, epi4: bool, lean: bool) -> u32 {
        let (pk, pn) = if lean {
            (self.bk / 4, 32)
        } else {
            (self.bk / 4 + 2, 34)
        };
        let tiles = (128 * pk + self.bk * pn) * 8;
        let staging = if lean {
            0
        } else {
            self.subgroups * 16 * if epi4 { 64 } else { 16 } * 4
        };
        tiles + staging
    }

    /// Whether the 4-accumulator staging (EPI4) fits `max_workgroup_storage` bytes: only ever with 4
    /// subgroups (with 8 it needs 51712 bytes at K steps of 32, over the H200's 48 KiB).
    fn epi4(self, max_workgroup_storage: u32) -> bool {
        self.subgroups == 4 && self.smem(true, false) <= max_workgroup_storage
    }

    /// The workgroup memory this build needs on a device with `max_workgroup_storage` bytes, and
    /// whether it is the lean emulation: the full build where it fits, else (emulated only) the lean
    /// one.
    fn footprint(self, emulated: bool, max_workgroup_storage: u32) -> (u32, bool) {
        let full = self.smem(self.epi4(max_workgroup_storage), false);
        if emulated && full > max_workgroup_storage {
            (self.smem(false, true), true)
        } else {
            (full, false)
        }
    }
}

/// Whether a convolution with `o` output channels and reduction length `k` (= C*KH*KW) has enough work
/// for the 128 x 128 tiles: tiny ones (SD's conv_in with 4 channels, conv_out with 3 or 4 outputs) stay
/// on the portable kernel.
pub fn coop_worthwhile(o: usize, k: usize) -> bool {
    o >= 64 && k >= 64
}

/// The variant `requested` resolves to for weights of `w_dtype` in `w_layout` and activations of
/// `x_dtype`: `Auto` becomes [`Conv2dVariant::Coop`] on a device with 16x16 f16 cooperative matrices
/// (or [`Conv2dVariant::CoopBk32`] where the workgroup memory is short of `Coop`'s) when everything is
/// f16, the weights are row-major and the shape is worth it, and stays `Auto` (the portable kernels)
/// otherwise. An explicit cooperative variant the device or the weights cannot run is an error.
pub fn resolve_variant(
    caps: &Caps,
    x_dtype: DType,
    w_dtype: DType,
    w_layout: Layout,
    o: usize,
    k: usize,
    requested: Conv2dVariant,
) -> Result<Conv2dVariant> {
    let Some(layout) = requested.coop_layout() else {
        let coop = requested == Conv2dVariant::Auto
            && coop_available(caps)
            && x_dtype == DType::F16
            && w_dtype == DType::F16
            && w_layout == Layout::RowMajor
            && coop_worthwhile(o, k);
        if !coop {
            return Ok(requested);
        }
        // coop_available guarantees the K-32 build's memory, not the K-64 one's.
        let (smem, _) = CoopLayout::SG8_BK64.footprint(false, caps.max_workgroup_storage);
        return Ok(if smem <= caps.max_workgroup_storage {
            Conv2dVariant::Coop
        } else {
            Conv2dVariant::CoopBk32
        });
    };
    let (smem, _) = layout.footprint(requested.is_emulated(), caps.max_workgroup_storage);
    let invocations = 32 * layout.subgroups;
    if !requested.is_emulated() && !coop_available(caps) {
        return Err(DriftError::Unsupported(format!(
            "cooperative-matrix conv2d needs a device with 16x16 f16 cooperative matrices, \
             subgroups of 32 and {smem} bytes of workgroup memory"
        )));
    }
    if smem > caps.max_workgroup_storage || invocations > caps.max_invocations_per_workgroup {
        return Err(DriftError::Unsupported(format!(
            "{requested:?} conv2d needs {smem} bytes of workgroup memory and {invocations} \
             invocations per workgroup (the device has {} and {})",
            caps.max_workgroup_storage, caps.max_invocations_per_workgroup
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
    let layout = variant.coop_layout().ok_or_else(|| {
        DriftError::Unsupported(format!("{variant:?} is not a cooperative conv2d variant"))
    })?;
    let sg8 = layout.subgroups == 8;
    let bk64 = layout.bk == 64;
    let (_, lean) = layout.footprint(emulate, caps.max_workgroup_storage);
    let epi4 = !lean && layout.epi4(caps.max_workgroup_storage);

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
        "conv{}x{}s{}_coop{}{}{}_{}_w{}{}",
        g.kh,
        g.kw,
        g.stride,
        match (sg8, bk64) {
            (true, true) => "",
            (true, false) => "_bk32",
            (false, _) => "_sg4",
        },
        if emulate { "_emulated" } else { "" },
        if lean { "_lean" } else { "" },
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
        .define("BK64", u8::from(bk64))
        .define("ST8", u8::from(!sg8 || bk64))
        .define("NOPREFETCH", u8::from(!layout.prefetch))
        .define("LEAN", u8::from(lean))
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
    fn smem_of_each_build() {
        let (bk64, bk32, sg4) = (
            CoopLayout::SG8_BK64,
            CoopLayout::SG8_BK32,
            CoopLayout::SG4_BK32,
        );
        // coop_available checks the eight-subgroup matmul's small-staging footprint at K steps of 32
        // (28 KiB); the K-32 builds of this kernel must not need more, or a device could pass that
        // check and still fail to create the pipeline Auto falls back to.
        assert_eq!(bk32.smem(false, false), 27136);
        assert_eq!(sg4.smem(false, false), 23040);
        assert_eq!(sg4.smem(true, false), 35328);
        assert!(bk32.smem(false, false) <= 28 * 1024);
        // K steps of 64: 18 KiB of weights, 17 KiB of inputs, 8 KiB of staging: within the H200's
        // 48 KiB, over lavapipe's 32 KiB, where the lean emulation fills it exactly.
        assert_eq!(bk64.smem(false, false), 44032);
        assert_eq!(bk64.footprint(false, 48 * 1024), (44032, false));
        assert_eq!(bk64.footprint(true, 48 * 1024), (44032, false));
        assert_eq!(bk64.footprint(true, 32 * 1024), (32768, true));
        assert_eq!(bk32.footprint(true, 32 * 1024), (27136, false));
        // EPI4 fits with 4 subgroups on the H200, never with 8, and on lavapipe not at all.
        assert!(sg4.epi4(48 * 1024));
        assert!(!bk32.epi4(48 * 1024));
        assert!(!bk64.epi4(64 * 1024));
        assert_eq!(bk32.smem(true, false), 51712);
        assert!(!sg4.epi4(32 * 1024));
    }

    #[test]
    fn auto_picks_k64_where_it_fits() {
        // An H200-like device with `max_workgroup_storage` bytes of workgroup memory.
        let caps = Caps::h200_like;
        let f16 = DType::F16;
        let auto = |c: &Caps| {
            resolve_variant(
                c,
                f16,
                f16,
                Layout::RowMajor,
                320,
                2880,
                Conv2dVariant::Auto,
            )
        };
        assert_eq!(auto(&caps(48 * 1024)).unwrap(), Conv2dVariant::Coop);
        assert_eq!(auto(&caps(40 * 1024)).unwrap(), Conv2dVariant::CoopBk32);
        // Explicitly asked for, the K-64 build needs its memory; its emulation makes do with 32 KiB.
        let explicit = |c: &Caps, v| resolve_variant(c, f16, f16, Layout::RowMajor, 320, 2880, v);
        assert!(explicit(&caps(40 * 1024), Conv2dVariant::Coop).is_err());
        assert!(explicit(&caps(32 * 1024), Conv2dVariant::CoopEmulated).is_ok());
        assert!(explicit(&caps(16 * 1024), Conv2dVariant::CoopEmulated).is_err());
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
