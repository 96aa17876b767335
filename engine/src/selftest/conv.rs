//! Checks for the conv kernels: the geometries SD uses (3x3 stride 1 and 2, 1x1, padding 0/1, the VAE's
//! asymmetric padding) on odd sizes, both tile variants, both weight layouts, f32/f16 io, fused bias and
//! residual, and views at unaligned offsets (which switch the vec4 paths off). The cooperative-matrix
//! kernel runs its own cases (tiles of 128 channels x 128 pixels) in its three builds (8 subgroups with
//! K steps of 64 or 32, 4 subgroups) on devices that have it, and its FMA emulation runs them in all
//! three on every f16 device (the K-64 one lean where workgroup memory is short).

use super::{Check, Rng, compare, random, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::conv::{
    Conv2dOptions, Conv2dVariant, conv2d, conv2d_output_size, conv2d_plan, conv2d_weight,
    conv2d_weight_bytes,
};
use crate::kernels::conv_coop::CoopLayout;
use crate::kernels::matmul::coop_available;
use crate::memory::Category;
use crate::reference::conv::{self as r, ConvShape};
use crate::tensor::{DType, Layout, Tensor};

/// One convolution to check.
#[derive(Clone, Copy, Debug)]
pub struct ConvCase {
    /// Input `[N, C, H, W]`.
    pub x: [usize; 4],
    pub o: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub pad_end: Option<usize>,
    /// Activation (x, out, residual) and weight/bias dtypes.
    pub xdt: DType,
    pub wdt: DType,
    pub bias: bool,
    pub residual: bool,
    pub layout: Layout,
    /// Element offsets of the x, w, out (and residual) views in their buffers.
    pub offsets: [usize; 3],
    pub variant: Conv2dVariant,
    pub split_k: Option<usize>,
}

impl ConvCase {
    fn new(x: [usize; 4], o: usize, k: usize, stride: usize, pad: usize) -> ConvCase {
        ConvCase {
            x,
            o,
            k,
            stride,
            pad,
            pad_end: None,
            xdt: DType::F32,
            wdt: DType::F32,
            bias: false,
            residual: false,
            layout: Layout::Transposed,
            offsets: [0; 3],
            variant: Conv2dVariant::P64C4,
            split_k: Some(1),
        }
    }
}

/// The checked cases (f16 ones only where the device has f16).
pub fn cases(gpu: &Gpu) -> Vec<ConvCase> {
    let c = ConvCase::new;
    let mut v = vec![
        ConvCase {
            bias: true,
            ..c([2, 5, 9, 11], 7, 3, 1, 1)
        },
        ConvCase {
            residual: true,
            layout: Layout::RowMajor,
            ..c([2, 5, 9, 11], 7, 3, 1, 1)
        },
        ConvCase {
            bias: true,
            residual: true,
            ..c([1, 8, 16, 16], 16, 3, 2, 1)
        },
        ConvCase {
            bias: true,
            ..c([2, 8, 15, 15], 16, 3, 2, 1)
        },
        ConvCase {
            bias: true,
            ..c([2, 13, 8, 8], 6, 1, 1, 0)
        },
        ConvCase {
            residual: true,
            ..c([1, 13, 7, 5], 6, 1, 1, 0)
        },
        ConvCase {
            bias: true,
            ..c([1, 4, 7, 10], 8, 3, 1, 0)
        },
        // Channels not a multiple of the 64-channel tile or the 16-deep K step; two channel tiles.
        ConvCase {
            bias: true,
            residual: true,
            ..c([1, 19, 6, 7], 70, 3, 1, 1)
        },
        // 7x7 (49 taps): the per-tap bounds test instead of the 32-bit tap mask.
        ConvCase {
            bias: true,
            ..c([1, 2, 9, 10], 5, 7, 1, 3)
        },
        // SD's VAE encoder downsample: pad (0, 1), stride 2.
        ConvCase {
            pad_end: Some(1),
            bias: true,
            ..c([1, 6, 8, 8], 8, 3, 2, 0)
        },
        // Every operand at an odd offset: scalar paths.
        ConvCase {
            bias: true,
            residual: true,
            offsets: [3, 2, 1],
            ..c([1, 5, 6, 8], 12, 3, 1, 1)
        },
        ConvCase {
            offsets: [3, 5, 7],
            layout: Layout::RowMajor,
            ..c([1, 6, 4, 4], 8, 1, 1, 0)
        },
        // Aligned non-zero offsets keep the vec4 paths.
        ConvCase {
            bias: true,
            residual: true,
            offsets: [4, 8, 12],
            ..c([1, 40, 4, 4], 8, 1, 1, 0)
        },
    ];
    if gpu.caps.f16 {
        v.extend([
            // f16 weights, f32 activations.
            ConvCase {
                wdt: DType::F16,
                bias: true,
                ..c([2, 5, 9, 11], 12, 3, 1, 1)
            },
            ConvCase {
                wdt: DType::F16,
                residual: true,
                layout: Layout::RowMajor,
                ..c([1, 7, 8, 6], 5, 3, 2, 1)
            },
            // All f16.
            ConvCase {
                xdt: DType::F16,
                wdt: DType::F16,
                bias: true,
                residual: true,
                ..c([2, 6, 10, 10], 20, 3, 1, 1)
            },
            ConvCase {
                xdt: DType::F16,
                wdt: DType::F16,
                bias: true,
                ..c([1, 16, 8, 4], 8, 1, 1, 0)
            },
            ConvCase {
                xdt: DType::F16,
                wdt: DType::F16,
                residual: true,
                offsets: [1, 3, 5],
                ..c([1, 9, 5, 7], 6, 3, 2, 1)
            },
            ConvCase {
                xdt: DType::F16,
                wdt: DType::F32,
                bias: true,
                ..c([1, 3, 9, 9], 4, 3, 1, 1)
            },
        ]);
    }
    // Every tile variant on every case, then split-K (f32 scratch + reduction) on some.
    let mut all: Vec<ConvCase> = v
        .iter()
        .flat_map(|&c| Conv2dVariant::ALL.map(|variant| ConvCase { variant, ..c }))
        .collect();
    for (i, split) in [(0, 2), (2, 3), (7, 5), (8, 3), (10, 2), (12, 3)] {
        all.push(ConvCase {
            split_k: Some(split),
            variant: Conv2dVariant::ALL[i % 4],
            ..v[i]
        });
    }
    if gpu.caps.f16 {
        for (i, split) in [(15, 3), (17, 2), (18, 2)] {
            all.push(ConvCase {
                split_k: Some(split),
                variant: Conv2dVariant::ALL[i % 4],
                ..v[i]
            });
        }
        all.extend(coop_cases(gpu));
    }
    all
}

/// The cooperative kernel's cases, each in every build (8 subgroups of 32 x 64 with K steps of 64 and
/// of 32, 4 subgroups of 64 x 64): its emulation everywhere (f16 devices), the real one where the
/// device has cooperative matrices (and the workgroup memory of the build).
/// Row-major weights; operands are f16-exact (the kernel rounds them to f16).
fn coop_cases(gpu: &Gpu) -> Vec<ConvCase> {
    let c = |x, o, k, stride, pad| ConvCase {
        xdt: DType::F16,
        wdt: DType::F16,
        layout: Layout::RowMajor,
        ..ConvCase::new(x, o, k, stride, pad)
    };
    let v = [
        // 3x3 s1 p1, batch 2: 198 pixels (two pixel tiles, an image boundary inside the first, odd
        // Ho*Wo: scalar stores), 136 channels (two channel tiles), K 45 (not a multiple of 4 or 32).
        ConvCase {
            bias: true,
            ..c([2, 5, 9, 11], 136, 3, 1, 1)
        },
        // SD's downsample (3x3 s2 p1): Ho*Wo 64 (vec4 stores), K 108 (vec4 weights).
        ConvCase {
            bias: true,
            residual: true,
            ..c([1, 12, 16, 16], 70, 3, 2, 1)
        },
        // 1x1, batch 2: vec4 gathers.
        ConvCase {
            bias: true,
            ..c([2, 40, 8, 8], 72, 1, 1, 0)
        },
        // 1x1 with odd Ho*Wo: scalar gathers and stores.
        ConvCase {
            residual: true,
            ..c([1, 33, 5, 7], 65, 1, 1, 0)
        },
        // f32 activations and output (rounded to f16 on load), f32 and f16 weights.
        ConvCase {
            xdt: DType::F32,
            wdt: DType::F32,
            bias: true,
            residual: true,
            ..c([2, 8, 10, 10], 20, 3, 1, 1)
        },
        ConvCase {
            xdt: DType::F32,
            bias: true,
            ..c([1, 16, 12, 12], 130, 3, 1, 1)
        },
        // The VAE encoder's downsample: pad (0, 1), stride 2.
        ConvCase {
            pad_end: Some(1),
            bias: true,
            ..c([1, 6, 8, 8], 64, 3, 2, 0)
        },
        // 7x7 (49 taps): the per-tap bounds test instead of the tap mask.
        ConvCase {
            bias: true,
            ..c([1, 2, 9, 10], 64, 7, 1, 3)
        },
        // Every operand at an odd offset: scalar paths.
        ConvCase {
            bias: true,
            residual: true,
            offsets: [3, 2, 1],
            ..c([1, 5, 6, 8], 12, 3, 1, 1)
        },
        ConvCase {
            offsets: [1, 3, 5],
            ..c([1, 8, 4, 4], 8, 1, 1, 0)
        },
        // Aligned non-zero offsets keep the vec4 paths.
        ConvCase {
            bias: true,
            residual: true,
            offsets: [4, 8, 12],
            ..c([1, 40, 4, 4], 8, 1, 1, 0)
        },
        // K 261 unsplit: 4 whole steps of 64 (8 of 32) and a partial one, odd Ho*Wo.
        ConvCase {
            bias: true,
            residual: true,
            ..c([2, 29, 7, 7], 72, 3, 1, 1)
        },
        // Split-K (K ranges in whole steps of 64): 3 splits of K 360 (128, 128, 104) into a shared
        // scratch, then bias and residual in the reduction; 2 splits of K 81 (64, 17) with f32
        // output; 2 splits of K 108 with vec4 scratch stores.
        ConvCase {
            bias: true,
            residual: true,
            split_k: Some(3),
            ..c([1, 40, 6, 6], 130, 3, 1, 1)
        },
        ConvCase {
            xdt: DType::F32,
            wdt: DType::F32,
            bias: true,
            split_k: Some(2),
            ..c([2, 9, 9, 11], 136, 3, 1, 1)
        },
        ConvCase {
            residual: true,
            split_k: Some(2),
            ..c([1, 12, 16, 16], 70, 3, 2, 1)
        },
    ];
    // Every build: the real ones where the device has cooperative matrices (and, for K steps of 64,
    // 43 KiB of workgroup memory), the emulated ones everywhere (the K-64 one lean where workgroup
    // memory is short of the full build's). Decided here, not by asking the builder, so that a build
    // it wrongly refuses fails instead of going unchecked.
    let coop = coop_available(&gpu.caps);
    let fits = |lean| CoopLayout::SG8_BK64.smem(false, lean) <= gpu.caps.max_workgroup_storage;
    [
        (Conv2dVariant::CoopEmulated, fits(true)),
        (Conv2dVariant::CoopEmulatedBk32, true),
        (Conv2dVariant::CoopEmulatedSg4, true),
        (Conv2dVariant::Coop, coop && fits(false)),
        (Conv2dVariant::CoopBk32, coop),
        (Conv2dVariant::CoopSg4, coop),
    ]
    .into_iter()
    .filter_map(|(variant, runs)| runs.then_some(variant))
    .flat_map(|variant| v.map(|c| ConvCase { variant, ..c }))
    .collect()
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = cases(gpu)
        .into_iter()
        .map(|c| check_conv(gpu, rng, c))
        .collect::<Result<Vec<_>>>()?;
    out.push(check_rejects(gpu)?);
    if gpu.caps.f16 {
        out.push(check_auto_choice(gpu)?);
    }
    Ok(out)
}

/// `Auto` runs SD's f16 convolutions on the cooperative kernel (its eight-subgroup layout, with K steps
/// of 64 where the workgroup memory holds them, else 32) exactly where the device has it (with the
/// weights [`conv2d_weight`] uploads row-major for it), and the tiny ones (4 input or output channels)
/// on the portable kernel everywhere.
pub fn check_auto_choice(gpu: &Gpu) -> Result<Check> {
    let coop = coop_available(&gpu.caps);
    let k64 = CoopLayout::SG8_BK64.smem(false, false) <= gpu.caps.max_workgroup_storage;
    let f16 = DType::F16;
    let mut wrong = Vec::new();
    for (c, o, want_coop) in [(320, 320, coop), (4, 320, false), (320, 4, false)] {
        let x = gpu.tensor("x", &[2, c, 8, 8], f16, Category::Activations)?;
        let out = gpu.tensor("out", &[2, o, 8, 8], f16, Category::Activations)?;
        let bytes = vec![0u8; o * c * 9 * 2];
        let w = conv2d_weight(gpu, "w", &[o, c, 3, 3], f16, &bytes)?;
        let opts = Conv2dOptions {
            padding: 1,
            ..Default::default()
        };
        let ds = conv2d(gpu, &x, &w, None, &out, &opts)?;
        let got_coop = ds.iter().any(|d| d.name.contains("_coop"));
        if ds.iter().any(|d| d.name.contains("_coop_sg4")) {
            wrong.push(format!("C {c} O {o}: the four-subgroup layout"));
        }
        if got_coop && ds.iter().any(|d| d.name.contains("_coop_bk32")) == k64 {
            wrong.push(format!(
                "C {c} O {o}: K steps of {} with {} bytes of workgroup memory",
                if k64 { 32 } else { 64 },
                gpu.caps.max_workgroup_storage
            ));
        }
        let want_layout = if want_coop {
            Layout::RowMajor
        } else {
            Layout::Transposed
        };
        if got_coop != want_coop || w.layout != want_layout {
            wrong.push(format!(
                "C {c} O {o}: coop {got_coop} with {:?} weights, want coop {want_coop} with {want_layout:?}",
                w.layout
            ));
        }
    }
    Ok(Check {
        name: format!("conv2d Auto picks the cooperative kernel where available ({coop})"),
        passed: wrong.is_empty(),
        worst_ratio: 0.0,
        max_abs_err: 0.0,
        atol: 0.0,
        rtol: 0.0,
        detail: wrong.join("; "),
    })
}

/// The builder refuses mismatched shapes, dtypes and layouts with an error (no panic, no dispatch).
pub fn check_rejects(gpu: &Gpu) -> Result<Check> {
    let t = |shape: &[usize], dtype| gpu.tensor("t", shape, dtype, Category::Activations);
    let x = t(&[1, 4, 6, 6], DType::F32)?;
    let w = t(&[8, 4, 3, 3], DType::F32)?;
    let out = t(&[1, 8, 6, 6], DType::F32)?;
    let pad1 = Conv2dOptions {
        padding: 1,
        ..Default::default()
    };
    let mut blocks = w.clone();
    blocks.layout = Layout::Blocks;
    let mut transposed = w.clone();
    transposed.layout = Layout::Transposed;
    let coop = Conv2dOptions {
        variant: Conv2dVariant::Coop,
        ..pad1
    };
    let coop_sg4 = Conv2dOptions {
        variant: Conv2dVariant::CoopSg4,
        ..pad1
    };
    let coop_bk32 = Conv2dOptions {
        variant: Conv2dVariant::CoopBk32,
        ..pad1
    };
    let bad = [
        // Wrong output size for padding 0, wrong channel count, wrong bias, wrong residual, bad layout,
        // u32 input, a kernel larger than the padded input.
        conv2d(gpu, &x, &w, None, &out, &Conv2dOptions::default()).is_err(),
        conv2d(gpu, &x, &t(&[8, 5, 3, 3], DType::F32)?, None, &out, &pad1).is_err(),
        conv2d(gpu, &x, &w, Some(&t(&[7], DType::F32)?), &out, &pad1).is_err(),
        conv2d(
            gpu,
            &x,
            &w,
            None,
            &out,
            &Conv2dOptions {
                residual: Some(&x),
                ..pad1
            },
        )
        .is_err(),
        conv2d(gpu, &x, &blocks, None, &out, &pad1).is_err(),
        conv2d(gpu, &t(&[1, 4, 6, 6], DType::U32)?, &w, None, &out, &pad1).is_err(),
        conv2d(
            gpu,
            &t(&[1, 4, 2, 2], DType::F32)?,
            &w,
            None,
            &t(&[1, 8, 0, 0], DType::F32)?,
            &Conv2dOptions::default(),
        )
        .is_err(),
        // The cooperative kernel with transposed weights (anywhere), or on a device without it.
        conv2d(gpu, &x, &transposed, None, &out, &coop).is_err(),
        conv2d(gpu, &x, &transposed, None, &out, &coop_sg4).is_err(),
        conv2d(gpu, &x, &transposed, None, &out, &coop_bk32).is_err(),
        coop_available(&gpu.caps) || conv2d(gpu, &x, &w, None, &out, &coop).is_err(),
        coop_available(&gpu.caps) || conv2d(gpu, &x, &w, None, &out, &coop_sg4).is_err(),
        coop_available(&gpu.caps) || conv2d(gpu, &x, &w, None, &out, &coop_bk32).is_err(),
    ];
    let ok = conv2d(gpu, &x, &w, None, &out, &pad1).is_ok();
    let failed: Vec<usize> = bad
        .iter()
        .enumerate()
        .filter(|(_, r)| !**r)
        .map(|(i, _)| i)
        .collect();
    Ok(Check {
        name: "conv2d rejects bad shapes, dtypes and layouts".into(),
        passed: failed.is_empty() && ok,
        worst_ratio: 0.0,
        max_abs_err: 0.0,
        atol: 0.0,
        rtol: 0.0,
        detail: if failed.is_empty() && ok {
            String::new()
        } else {
            format!("accepted cases {failed:?}, valid ok: {ok}")
        },
    })
}

fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => bytemuck::cast_slice(values).to_vec(),
    }
}

/// A tensor of `shape` holding `bytes`, placed `offset` elements into a larger buffer of junk.
fn placed(
    gpu: &Gpu,
    shape: &[usize],
    dtype: DType,
    layout: Layout,
    bytes: &[u8],
    offset: usize,
) -> Result<Tensor> {
    let eb = dtype.block_bytes();
    let n: usize = shape.iter().product();
    let mut all = encode(&vec![1e4; offset], dtype);
    all.extend_from_slice(bytes);
    all.resize((offset + n) * eb, 0);
    let base = gpu.tensor_from_bytes(
        "conv operand",
        &[offset + n],
        dtype,
        layout,
        &all,
        Category::Activations,
    )?;
    let mut t = base.view(offset, shape)?;
    t.layout = layout;
    Ok(t)
}

pub fn check_conv(gpu: &Gpu, rng: &mut Rng, c: ConvCase) -> Result<Check> {
    let [n, ch, h, w] = c.x;
    let (ho, wo) = conv2d_output_size((h, w), (c.k, c.k), c.stride, c.pad, c.pad_end)
        .ok_or_else(|| crate::shape_err!("bad test case {c:?}"))?;
    let g = ConvShape {
        x: c.x,
        o: c.o,
        kh: c.k,
        kw: c.k,
        stride: c.stride,
        pad: c.pad,
        ho,
        wo,
    };
    let out_shape = [n, c.o, ho, wo];
    let plan = conv2d_plan(n * ho * wo, c.o, ch * c.k * c.k, c.variant, c.split_k);
    let out_n = n * c.o * ho * wo;
    let kred = ch * c.k * c.k;

    // The cooperative kernel rounds its operands to f16: give it f16-exact values in either dtype.
    let coop = c.variant.is_coop();
    let operand = |d: DType| if coop { DType::F16 } else { d };
    let xv = random(rng, n * ch * h * w, -1.0, 1.0, operand(c.xdt));
    let wv = random(rng, c.o * kred, -1.0, 1.0, operand(c.wdt));
    let bv = random(rng, c.o, -1.0, 1.0, c.wdt);
    let rv = random(rng, out_n, -2.0, 2.0, c.xdt);
    let [xo, wofs, oo] = c.offsets;
    let x = placed(gpu, &c.x, c.xdt, Layout::RowMajor, &encode(&xv, c.xdt), xo)?;
    let wshape = [c.o, ch, c.k, c.k];
    let wbytes = conv2d_weight_bytes(&encode(&wv, c.wdt), &wshape, c.wdt, c.layout)?;
    let wt = placed(gpu, &wshape, c.wdt, c.layout, &wbytes, wofs)?;
    let bias = if c.bias {
        Some(gpu.tensor_from_f32("bias", &[c.o], c.wdt, &bv, Category::Weights)?)
    } else {
        None
    };
    let res = if c.residual {
        Some(placed(
            gpu,
            &out_shape,
            c.xdt,
            Layout::RowMajor,
            &encode(&rv, c.xdt),
            oo + 4,
        )?)
    } else {
        None
    };
    // The output sits `oo` elements into a poisoned buffer: the elements around it must stay untouched.
    let out_base = gpu.tensor("out", &[oo + out_n + 5], c.xdt, Category::Activations)?;
    gpu.poison(&out_base)?;
    let out = out_base.view(oo, &out_shape)?;

    // Forced splits above 2 write their partial sums into a caller-provided (oversized) scratch, as a
    // planned graph does; other splits allocate their own.
    let shared = match c.split_k {
        Some(s) if s > 2 => Some(gpu.tensor(
            "shared split scratch",
            &[s * out.numel() + 7],
            DType::F32,
            Category::Activations,
        )?),
        _ => None,
    };
    let opts = Conv2dOptions {
        stride: c.stride,
        padding: c.pad,
        padding_end: c.pad_end,
        residual: res.as_ref(),
        variant: c.variant,
        split_k: c.split_k,
        split_scratch: shared.as_ref(),
    };
    let mut prog = Program::new();
    prog.extend(conv2d(gpu, &x, &wt, bias.as_ref(), &out, &opts)?);
    prog.run(gpu)?;
    let all = gpu.read_f32(&out_base)?;

    let want = r::conv2d(
        &xv,
        &wv,
        c.bias.then_some(&bv[..]),
        c.residual.then_some(&rv[..]),
        g,
    );
    // f32 accumulation over K terms of |x w| <= 1: rounding grows like sqrt(K) ulps of the partial sums.
    // Tensor cores may add the products in another order and round differently: 4x that for them.
    let atol = if coop { 4e-6 } else { 1e-6 } * (kred as f64).sqrt()
        + if c.xdt == DType::F16 { 1e-5 } else { 0.0 };
    let name = format!(
        "conv2d {}x{} s{} p{}{} x{:?} O{} {:?}/{:?} {:?}{}{} offs{:?} {:?} split {}",
        c.k,
        c.k,
        c.stride,
        c.pad,
        c.pad_end.map_or(String::new(), |e| format!("/{e}")),
        c.x,
        c.o,
        c.xdt,
        c.wdt,
        c.layout,
        if c.bias { " bias" } else { "" },
        if c.residual { " res" } else { "" },
        c.offsets,
        plan.0,
        plan.1
    );
    let mut check = compare(name, &all[oo..oo + out_n], &want, atol, store_rtol(c.xdt));
    let outside = all[..oo]
        .iter()
        .chain(&all[oo + out_n..])
        .filter(|v| !v.is_nan())
        .count();
    if outside > 0 {
        check.passed = false;
        check.detail = format!(
            "{outside} elements written outside the output view; {}",
            check.detail
        );
    }
    Ok(check)
}
