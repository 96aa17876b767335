//! The kernel cases: each at a size a real model runs it at.

use anyhow::Result;
use drift_engine::kernels::activation::{UnaryOp, unary};
use drift_engine::kernels::attention::{AttentionOptions, AttentionVariant, attention};
use drift_engine::kernels::attention_coop::{CoopTile, TILES, WIDE_TILES};
use drift_engine::kernels::attention_row;
use drift_engine::kernels::conv::{Conv2dOptions, Conv2dVariant, conv2d, conv2d_weight};
use drift_engine::kernels::copy::copy;
use drift_engine::kernels::elementwise::{BinaryOp, binary};
use drift_engine::kernels::grid_sync::{Probe, take_timeout};
use drift_engine::kernels::matmul::{
    CoopTuning, MatmulOptions, MatmulVariant, coop_available, matmul,
};
use drift_engine::kernels::matvec::{MatvecOptions, matvec};
use drift_engine::kernels::norm::{GroupNormOptions, groupnorm, rmsnorm};
use drift_engine::kernels::quant::{QuantTuning, matvec_quant, matvec_quant_tuned};
use drift_engine::kernels::softmax::{RowVariant, SoftmaxOptions, softmax};
use drift_engine::{Category, DType, Dispatch, Gpu, Layout, Program};

use super::Measurement;
use super::timing::{measure, time_sequence};

/// Copy-bandwidth ceiling measured on the H200 (shared/notes/wgpu-on-h200.md), for the "% of copy" notes.
const H200_COPY_GBPS: f64 = 4100.0;

pub fn run_all(
    gpu: &Gpu,
    reps: usize,
    filter: Option<&str>,
    report: &mut dyn FnMut(Measurement),
) -> Result<()> {
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let act =
        |shape: &[usize], dtype: DType| gpu.tensor("bench", shape, dtype, Category::Activations);
    // A bandwidth-bound case: timed, noted with its share of the copy ceiling.
    let bandwidth = |name: &str, dispatches: &[Dispatch]| -> Result<Measurement> {
        let m = measure(gpu, name, dispatches, reps, "")?;
        let note = format!("{:.0}% of 4.1 TB/s copy", 100.0 * m.gbps / H200_COPY_GBPS);
        Ok(Measurement { note, ..m })
    };

    // Bandwidth baseline: 256 MiB copy.
    if wanted("copy") {
        let n = (64usize << 20).min(gpu.caps.max_storage_binding as usize / 4);
        let (a, b) = (act(&[n], DType::F32)?, act(&[n], DType::F32)?);
        report(bandwidth(
            &format!("copy {} MiB (vec4)", n >> 18),
            &[copy(gpu, &a, &b)?],
        )?);
    }
    if wanted("add") {
        let n = 16 << 20;
        let (a, b, o) = (
            act(&[n], DType::F16)?,
            act(&[n], DType::F16)?,
            act(&[n], DType::F16)?,
        );
        report(bandwidth(
            "add f16 16M",
            &[binary(gpu, BinaryOp::Add, &a, &b, &o)?],
        )?);
    }
    if wanted("silu") {
        let n = 16 << 20;
        let (a, o) = (act(&[n], DType::F16)?, act(&[n], DType::F16)?);
        report(bandwidth(
            "silu f16 16M",
            &[unary(gpu, UnaryOp::Silu, &a, &o)?],
        )?);
    }
    // Decode: f16 matrix-vector at LLM sizes, against copy bandwidth.
    for (n, k) in [
        (4096usize, 4096usize),
        (8192, 8192),
        (14336, 4096),
        (4096, 14336),
    ] {
        let name = format!("matvec f16 {n}x{k}");
        if !wanted(&name) || !gpu.caps.f16 {
            continue;
        }
        let w = gpu.tensor("w", &[n, k], DType::F16, Category::Weights)?;
        let (x, o) = (act(&[1, k], DType::F32)?, act(&[1, n], DType::F32)?);
        report(bandwidth(
            &name,
            &matvec(gpu, &w, &x, &o, &MatvecOptions::default())?,
        )?);
    }
    // Decode with quantized weights (blocks dequantized in registers): bytes are the blocks read.
    for (dtype, n, k) in [
        (DType::Q4_0, 4096usize, 14336usize),
        (DType::Q4_0, 14336, 4096),
        (DType::Q8_0, 4096, 14336),
        (DType::Q8_0, 14336, 4096),
        // The types of the GGUF files people download most (Q4_K_M mixes Q4_K and Q6_K).
        (DType::Q4K, 14336, 4096),
        (DType::Q6K, 14336, 4096),
        (DType::Q5_0, 14336, 4096),
        (DType::Q4_1, 14336, 4096),
    ] {
        let name = format!("matvec {dtype:?} {n}x{k}").to_lowercase();
        if !wanted(&name) {
            continue;
        }
        let w = gpu.tensor("w", &[n, k], dtype, Category::Weights)?;
        // x and out in the decode path's dtype (f16 where the device has it).
        let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        let (x, o) = (act(&[1, k], io)?, act(&[1, n], io)?);
        report(bandwidth(
            &name,
            &matvec_quant(gpu, &w, &x, &o, &MatvecOptions::default())?,
        )?);
    }
    // Tuning sweep of the quantized matvec (only when the filter asks for "sweep", not "dp4asweep").
    if filter.is_some_and(|f| f.replace("dp4asweep", "").contains("sweep")) {
        for dtype in [DType::Q4_0, DType::Q8_0] {
            let (n, k) = (14336usize, 4096usize);
            let w = gpu.tensor("w", &[n, k], dtype, Category::Weights)?;
            for xdt in [DType::F32, DType::F16] {
                let (x, o) = (act(&[1, k], xdt)?, act(&[1, n], xdt)?);
                for (r, u, trusted) in [
                    (1, 4, false),
                    (2, 1, true),
                    (2, 2, true),
                    (4, 1, true),
                    (4, 2, true),
                    (4, 4, true),
                ] {
                    let tuning = QuantTuning {
                        rows_per_team: r,
                        chunks_per_step: u,
                        trusted,
                        dp4a: false,
                        row_groups: 0,
                        prefetch: false,
                        k_teams: 0,
                        x_vec4: false,
                        k_workgroups: 1,
                    };
                    let name = format!(
                        "sweep {dtype:?} {n}x{k} x {xdt:?} r{r} u{u} t{}",
                        u8::from(trusted)
                    );
                    report(bandwidth(
                        &name,
                        &matvec_quant_tuned(gpu, &w, &x, &o, &MatvecOptions::default(), tuning)?,
                    )?);
                }
            }
        }
    }
    // The integer-dot-product kernel's rows per team, row groups per workgroup, blocks in flight and
    // prefetch ("dp4asweep"). Four weight copies in turn (132 MiB and more, over the H200's 50 MiB of
    // L2), as in a model, where each weight is read once per token; the figure is per product.
    if filter.is_some_and(|f| f.contains("dp4asweep")) {
        const COPIES: usize = 4;
        for (dtype, n, k) in [
            (DType::Q4_0, 14336usize, 4096usize),
            (DType::Q4_0, 4096, 14336),
            (DType::Q4_0, 4096, 4096),
            (DType::Q8_0, 14336, 4096),
            // The 8B's QKV (192 workgroups of 32 rows on 132 SMs) and gate-up.
            (DType::Q4_0, 6144, 4096),
            (DType::Q4_0, 28672, 4096),
        ] {
            let ws = (0..COPIES)
                .map(|_| gpu.tensor("w", &[n, k], dtype, Category::Weights))
                .collect::<drift_engine::Result<Vec<_>>>()?;
            let io = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
            let (x, o) = (act(&[1, k], io)?, act(&[1, n], io)?);
            // (rows per team, row groups, blocks in flight, prefetch, teams per row, x as vec4
            // planes, workgroups per row set)
            for (r, rg, u, pf, kt, xq4, kw) in [
                (4, 1, 1, false, 1, false, 1),
                (2, 1, 1, false, 1, false, 1),
                (2, 2, 1, false, 1, false, 1),
                (4, 1, 1, false, 2, false, 1),
                (4, 2, 1, false, 1, false, 1),
                (4, 1, 1, false, 1, false, 2),
                (4, 1, 1, false, 1, false, 4),
                (4, 1, 1, false, 1, false, 8),
                (4, 1, 1, false, 2, false, 4),
                (2, 1, 1, false, 1, false, 4),
                (4, 1, 2, false, 1, false, 4),
                (4, 2, 1, false, 1, false, 4),
            ] {
                let tuning = QuantTuning {
                    rows_per_team: r,
                    row_groups: rg,
                    chunks_per_step: u,
                    prefetch: pf,
                    k_teams: kt,
                    x_vec4: xq4,
                    k_workgroups: kw,
                    ..QuantTuning::default()
                };
                let name = format!(
                    "dp4asweep {dtype:?} {n}x{k} r{r} rg{rg} u{u} pf{} kt{kt}{} kw{kw}",
                    u8::from(pf),
                    if xq4 { " xq4" } else { "" }
                );
                let ds = super::dp4a_latency::over_copies(gpu, &ws, &x, &o, tuning)?;
                let m = bandwidth(&name, &ds)?;
                report(Measurement {
                    time_us: m.time_us / COPIES as f64,
                    ..m
                });
            }
        }
    }
    // Prefill / diffusion: f16 GEMM with and without cooperative matrices.
    for (size, variant) in [
        (4096usize, MatmulVariant::Tiled),
        (4096, MatmulVariant::Coop),
        (2048, MatmulVariant::Tiled),
        (2048, MatmulVariant::Coop),
    ] {
        let name = format!("matmul f16 {size}^3 {variant:?}").to_lowercase();
        let dt = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
        if !wanted(&name) || (variant == MatmulVariant::Coop && !gpu.caps.coop_16x16_f16_f32) {
            continue;
        }
        let (a, b, o) = (
            act(&[size, size], dt)?,
            act(&[size, size], dt)?,
            act(&[size, size], DType::F32)?,
        );
        let opts = MatmulOptions {
            transpose_b: true,
            variant,
            ..Default::default()
        };
        let r = if size >= 4096 { reps.min(5) } else { reps };
        report(measure(
            gpu,
            &name,
            &matmul(gpu, &a, &b, &o, &opts)?,
            r,
            "A @ B^T, f32 accumulate",
        )?);
    }
    // Tuning sweep of the cooperative matmul (only when the filter asks for "coopsweep"): the build
    // switches of `CoopTuning` at the square size and at llama-3.2-1b's 512-token prefill shapes.
    if filter.is_some_and(|f| f.contains("coopsweep")) && coop_available(&gpu.caps) {
        // Each entry: (label, eight subgroups, K step 64, register prefetch, loop bounding, pad).
        let tunings = [
            ("default", CoopTuning::default()),
            (
                "sg4 bk32 prefetch lb (until 2026-11-30)",
                tuning(false, false, true, true, true),
            ),
            (
                "sg8 bk32 prefetch lb",
                tuning(true, false, true, true, true),
            ),
            ("sg8 bk32 prefetch", tuning(true, false, true, false, true)),
            ("sg8 bk64 prefetch lb", tuning(true, true, true, true, true)),
            ("sg8 bk64 lb", tuning(true, true, false, true, true)),
            ("sg8 bk64", tuning(true, true, false, false, true)),
            ("sg8 bk64 no-pad", tuning(true, true, false, false, false)),
            (
                "sg8 bk64 trusted",
                CoopTuning {
                    trusted: true,
                    ..tuning(true, true, false, false, true)
                },
            ),
        ];
        for (m, n, k, trans) in [
            (4096usize, 4096usize, 4096usize, true),
            (4096, 4096, 4096, false),
            (512, 16384, 2048, true),
            (512, 2048, 8192, true),
            (512, 2048, 2048, true),
        ] {
            let a = act(&[m, k], DType::F16)?;
            let b = act(&if trans { [n, k] } else { [k, n] }, DType::F16)?;
            let o = act(&[m, n], DType::F32)?;
            for (label, coop) in tunings {
                let opts = MatmulOptions {
                    transpose_b: trans,
                    variant: MatmulVariant::Coop,
                    coop,
                    ..Default::default()
                };
                let name = format!(
                    "coopsweep {m}x{n}x{k} {} {label}",
                    if trans { "nt" } else { "nn" }
                );
                report(measure(
                    gpu,
                    &name,
                    &matmul(gpu, &a, &b, &o, &opts)?,
                    reps.min(10),
                    "",
                )?);
            }
        }
    }
    // Attention: LLM prefill (causal, 32 heads of 128, GQA 4:1) at 512 and 4096 tokens; SD 1.5 self-attention
    // at 512x512 (4096 tokens, 8 heads of 40; 1024 of 80; 256 of 160; batch 2); decode over a 4096-token
    // cache. Auto picks the cooperative-matrix kernel where it can; the "... prefill" twins force the
    // f32-FMA prefill kernel for comparison (the note names the kernel that ran).
    let step = gpu.tensor("step", &[2], DType::U32, Category::Activations)?;
    let dt = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    #[rustfmt::skip]
    let attention_cases = [
        // (name, [B, Lq, Lkv, Hq, Hkv, D], causal, variant)
        ("attention prefill 512 tok (32x128, gqa 4)", [1, 512, 512, 32, 8, 128], true, AttentionVariant::Auto),
        ("attention prefill 512 tok (32x128, gqa 4) prefill", [1, 512, 512, 32, 8, 128], true, AttentionVariant::Prefill),
        ("attention prefill 4096 tok (32x128, gqa 4)", [1, 4096, 4096, 32, 8, 128], true, AttentionVariant::Auto),
        ("attention prefill 4096 tok (32x128, gqa 4) prefill", [1, 4096, 4096, 32, 8, 128], true, AttentionVariant::Prefill),
        ("attention sd15 4096 tok (2x8x40)", [2, 4096, 4096, 8, 8, 40], false, AttentionVariant::Auto),
        ("attention sd15 4096 tok (2x8x40) prefill", [2, 4096, 4096, 8, 8, 40], false, AttentionVariant::Prefill),
        ("attention sd15 1024 tok (2x8x80)", [2, 1024, 1024, 8, 8, 80], false, AttentionVariant::Auto),
        ("attention sd15 1024 tok (2x8x80) prefill", [2, 1024, 1024, 8, 8, 80], false, AttentionVariant::Prefill),
        ("attention sd15 256 tok (2x8x160)", [2, 256, 256, 8, 8, 160], false, AttentionVariant::Auto),
        ("attention sd15 256 tok (2x8x160) prefill", [2, 256, 256, 8, 8, 160], false, AttentionVariant::Prefill),
        ("attention decode over 4096 (32x128, gqa 4)", [1, 1, 4096, 32, 8, 128], true, AttentionVariant::Auto),
    ];
    for (name, [b, lq, lkv, hq, hkv, d], causal, variant) in attention_cases {
        if !wanted(name) {
            continue;
        }
        gpu.write_tensor_bytes(
            &step,
            bytemuck_pair(lkv as u32, (lkv - lq) as u32).as_slice(),
        )?;
        let q = act(&[b, lq, hq, d], dt)?;
        let k = act(&[b, lkv, hkv, d], dt)?;
        let v = act(&[b, lkv, hkv, d], dt)?;
        let o = act(&[b, lq, hq, d], dt)?;
        let opts = AttentionOptions {
            causal,
            variant,
            ..Default::default()
        };
        let dispatches = attention(gpu, &q, &k, &v, &o, &step, &opts)?;
        let note = dispatches[0].name.clone();
        report(measure(gpu, name, &dispatches, reps.min(5), &note)?);
    }
    // Tile sweep of the cooperative attention at SD's shapes (only when the filter asks for
    // "attncoopsweep"); tiles that do not fit the device are skipped.
    if filter.is_some_and(|f| f.contains("attncoopsweep")) && coop_available(&gpu.caps) {
        for (lq, d) in [(4096, 40), (1024, 80), (256, 160)] {
            let q = act(&[2, lq, 8, d], DType::F16)?;
            let k = act(&[2, lq, 8, d], DType::F16)?;
            let o = act(&[2, lq, 8, d], DType::F16)?;
            gpu.write_tensor_bytes(&step, bytemuck_pair(lq as u32, 0).as_slice())?;
            for &(subgroups, keys) in TILES.iter().chain(&WIDE_TILES) {
                let opts = AttentionOptions {
                    variant: AttentionVariant::Coop,
                    coop_tile: Some(CoopTile { subgroups, keys }),
                    ..Default::default()
                };
                let Ok(dispatches) = attention(gpu, &q, &k, &k, &o, &step, &opts) else {
                    continue;
                };
                let name = format!(
                    "attncoopsweep sd {lq} tok d{d} tile {}x{keys}",
                    16 * subgroups
                );
                let note = dispatches[0].name.clone();
                report(measure(gpu, &name, &dispatches, reps.min(5), &note)?);
            }
        }
    }
    // Decode attention of the benchmark LLMs, split-sequence against one-pass, by KV length: where
    // decode programs should switch from one to the other (`attention_row::ROW_MAX_KV`).
    for (model, hq, hkv, d) in [("135m", 9, 3, 64), ("1b", 32, 8, 64), ("8b", 32, 8, 128)] {
        for kv in [256usize, 512, 1024, 2048, 4096] {
            for (label, variant, row_chunks) in [
                ("split", AttentionVariant::Decode, None),
                ("row", AttentionVariant::DecodeRow, Some(1)),
                ("row ch4", AttentionVariant::DecodeRow, Some(4)),
                ("row ch8", AttentionVariant::DecodeRow, Some(8)),
                ("row ch16", AttentionVariant::DecodeRow, Some(16)),
            ] {
                let name = format!("attndecode {model} kv {kv} {label}");
                if !wanted(&name)
                    || (variant == AttentionVariant::DecodeRow
                        && !attention_row::row_available(&gpu.caps, d))
                {
                    continue;
                }
                gpu.write_tensor_bytes(&step, bytemuck_pair(kv as u32, kv as u32 - 1).as_slice())?;
                let q = act(&[1, 1, hq, d], dt)?;
                let k = act(&[1, kv, hkv, d], dt)?;
                let v = act(&[1, kv, hkv, d], dt)?;
                let o = act(&[1, 1, hq, d], dt)?;
                let opts = AttentionOptions {
                    causal: true,
                    variant,
                    row_chunks,
                    ..Default::default()
                };
                let dispatches = attention(gpu, &q, &k, &v, &o, &step, &opts)?;
                report(measure(gpu, &name, &dispatches, reps.min(20), "")?);
            }
        }
    }
    super::dp4a_latency::latency_cases(gpu, reps, filter, report)?;
    // Stable Diffusion 1.5 building blocks at 512x512, batch 2 (CFG).
    conv_cases(gpu, reps, filter, report)?;
    if wanted("groupnorm") {
        let x = act(&[2, 320, 64, 64], dt)?;
        let o = act(&[2, 320, 64, 64], dt)?;
        let g = act(&[320], DType::F32)?;
        let opts = GroupNormOptions {
            groups: 32,
            eps: 1e-5,
            silu: true,
            chunks: None,
        };
        report(measure(
            gpu,
            "groupnorm+silu 2x320x64x64",
            &groupnorm(gpu, &x, &g, &g, &o, &opts)?,
            reps,
            "",
        )?);
    }
    if wanted("rmsnorm") {
        let (x, o) = (act(&[512, 4096], DType::F32)?, act(&[512, 4096], dt)?);
        let g = act(&[4096], DType::F32)?;
        report(bandwidth(
            "rmsnorm 512x4096",
            &[rmsnorm(gpu, &x, &g, &o, 1e-5, RowVariant::Auto)?],
        )?);
    }
    if wanted("softmax") {
        let (x, o) = (
            act(&[8 * 512, 512], DType::F32)?,
            act(&[8 * 512, 512], DType::F32)?,
        );
        let opts = SoftmaxOptions {
            causal: Some((512, 0)),
            ..Default::default()
        };
        report(bandwidth(
            "softmax causal 8x512x512",
            &[softmax(gpu, &x, &o, &opts)?],
        )?);
    }
    if wanted("dispatch") {
        report(dispatch_overhead(gpu)?);
    }
    if wanted("gridsync") {
        grid_sync_cases(gpu, report)?;
    }
    Ok(())
}

/// Cost of one grid-wide barrier inside a dispatch (`kernels::grid_sync`), by grid size: the
/// difference between the probe through 1000 barriers and through none, per barrier. A grid that
/// timed out (not run concurrently) is reported as such.
fn grid_sync_cases(gpu: &Gpu, report: &mut dyn FnMut(Measurement)) -> Result<()> {
    const N: u32 = 1000;
    for n_wg in [1u32, 16, 33, 66, 132, 264, 528, 1056] {
        let none = Probe::new(gpu, n_wg, 0)?;
        let many = Probe::new(gpu, n_wg, N)?;
        let t0 = time_sequence(gpu, std::slice::from_ref(&none.dispatch), 5)?;
        let t1 = time_sequence(gpu, std::slice::from_ref(&many.dispatch), 5)?;
        let timed_out = take_timeout(gpu, &many.sync)?;
        report(Measurement {
            name: format!("gridsync {n_wg} workgroups"),
            time_us: (t1 - t0) / N as f64,
            gbps: 0.0,
            tflops: 0.0,
            note: if timed_out {
                "TIMED OUT: not run concurrently".into()
            } else {
                format!("us per barrier ({t1:.1} us for {N}, {t0:.1} for none)")
            },
        });
    }
    Ok(())
}

/// One convolution [`conv_cases`] times: input `[N, C, H, W]`, `o` output channels, a `ks` x `ks`
/// kernel (stride 1, same padding), the variant and K splits asked for.
struct ConvCase {
    name: String,
    x: [usize; 4],
    o: usize,
    ks: usize,
    variant: Conv2dVariant,
    split_k: Option<usize>,
}

/// SD 1.5's convolutions: the UNet's 3x3 at 64x64 x 320 (batch 2) and the VAE decoder's at 128x128 x 512,
/// with the kernel this device picks (`conv2d 3x3 2x320x64x64 -> 320`), the portable one (`... portable`)
/// and, where the device has it, the cooperative one in its eight-subgroup layout with K steps of 64
/// (`... coop`), the same with K steps of 32 and a register prefetch (`... coop-bk32`) and its
/// four-subgroup one (`... coop-sg4`). The filter "convcoopsweep" adds the cooperative kernel at SD's
/// other map sizes with forced K splits (to tune its split rule).
fn conv_cases(
    gpu: &Gpu,
    reps: usize,
    filter: Option<&str>,
    report: &mut dyn FnMut(Measurement),
) -> Result<()> {
    let dt = if gpu.caps.f16 { DType::F16 } else { DType::F32 };
    let coop = coop_available(&gpu.caps) && dt == DType::F16;
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let mut cases: Vec<ConvCase> = Vec::new();
    let mut add = |name: String, x, o, ks, variant, split_k| {
        cases.push(ConvCase {
            name,
            x,
            o,
            ks,
            variant,
            split_k,
        })
    };
    for (x, label) in [
        ([2, 320, 64, 64], "2x320x64x64"),
        ([1, 512, 128, 128], "1x512x128x128"),
    ] {
        let name = format!("conv2d 3x3 {label} -> {}", x[1]);
        let o = x[1];
        add(name.clone(), x, o, 3, Conv2dVariant::Auto, None);
        add(
            format!("{name} portable"),
            x,
            o,
            3,
            Conv2dVariant::P64C4,
            None,
        );
        if coop {
            add(format!("{name} coop"), x, o, 3, Conv2dVariant::Coop, None);
            add(
                format!("{name} coop-bk32"),
                x,
                o,
                3,
                Conv2dVariant::CoopBk32,
                None,
            );
            add(
                format!("{name} coop-sg4"),
                x,
                o,
                3,
                Conv2dVariant::CoopSg4,
                None,
            );
        }
    }
    // The same products as 1x1 convolutions over a materialized im2col matrix (C*9 channels): what
    // the 3x3 kernel would reach with a contiguous operand instead of its gather.
    if coop && filter.is_some_and(|f| f.contains("convim2col")) {
        for (n, c, hw) in [(2, 320, 64), (2, 640, 32), (2, 1280, 16), (1, 512, 128)] {
            let x = [n, 9 * c, hw, hw];
            let name = format!("convim2col 1x1 {n}x{}x{hw}x{hw} -> {c}", 9 * c);
            add(name, x, c, 1, Conv2dVariant::Auto, None);
        }
    }
    if coop && filter.is_some_and(|f| f.contains("convcoopsweep")) {
        let sweep: [([usize; 4], &[usize]); 7] = [
            ([2, 320, 64, 64], &[1, 2, 3, 4]),
            ([2, 640, 32, 32], &[1, 2, 3, 4, 6]),
            ([2, 1280, 16, 16], &[2, 3, 4, 6, 8]),
            ([2, 1280, 8, 8], &[4, 8, 12, 16]),
            // The VAE decoder's.
            ([1, 512, 64, 64], &[1, 2]),
            ([1, 256, 256, 256], &[1, 2]),
            ([1, 128, 512, 512], &[1, 2]),
        ];
        for (x, splits) in sweep {
            for &split in splits {
                let name = format!(
                    "convcoopsweep 3x3 {}x{}x{}x{} split {split}",
                    x[0], x[1], x[2], x[3]
                );
                add(name, x, x[1], 3, Conv2dVariant::Coop, Some(split));
            }
        }
    }
    for ConvCase {
        name,
        x,
        o,
        ks,
        variant,
        split_k,
    } in cases
    {
        if !wanted(&name) {
            continue;
        }
        let xt = gpu.tensor("bench", &x, dt, Category::Activations)?;
        let out = gpu.tensor("bench", &[x[0], o, x[2], x[3]], dt, Category::Activations)?;
        let shape = [o, x[1], ks, ks];
        let mut w = conv2d_weight(
            gpu,
            "w",
            &shape,
            dt,
            &vec![0u8; o * x[1] * ks * ks * dt_bytes(dt)],
        )?;
        // The portable kernel streams transposed weights fastest, the cooperative one needs row-major
        // (the weights are zeros: the same bytes in either layout).
        w.layout = match variant {
            v if v.is_coop() => Layout::RowMajor,
            Conv2dVariant::Auto => w.layout,
            _ => Layout::Transposed,
        };
        let opts = Conv2dOptions {
            stride: 1,
            padding: ks / 2,
            variant,
            split_k,
            ..Default::default()
        };
        report(measure(
            gpu,
            &name,
            &conv2d(gpu, &xt, &w, None, &out, &opts)?,
            reps.min(5),
            "",
        )?);
    }
    Ok(())
}

/// What a decode step pays per dispatch: 150 small dependent dispatches (a 1B model's step) encoded and
/// submitted as one program.
fn dispatch_overhead(gpu: &Gpu) -> Result<Measurement> {
    let x = gpu.tensor("x", &[4096], DType::F32, Category::Activations)?;
    let y = gpu.tensor("y", &[4096], DType::F32, Category::Activations)?;
    let mut p = Program::new();
    for i in 0..150 {
        let (a, b) = if i % 2 == 0 { (&x, &y) } else { (&y, &x) };
        p.push(unary(gpu, UnaryOp::Scale(1.0), a, b)?);
    }
    p.run(gpu)?;
    let cpu_us = p.cpu_us_per_dispatch(gpu, 50);
    let mut walls = Vec::new();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        p.run(gpu)?;
        walls.push(t.elapsed().as_secs_f64() * 1e6);
    }
    walls.sort_by(f64::total_cmp);
    let wall = walls[walls.len() / 2];
    Ok(Measurement {
        name: "150 dependent dispatches (submit+wait)".into(),
        time_us: wall,
        gbps: 0.0,
        tflops: 0.0,
        note: format!(
            "CPU encode {cpu_us:.2} us/dispatch; wall {:.2} us/dispatch",
            wall / 150.0
        ),
    })
}

fn bytemuck_pair(a: u32, b: u32) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

fn dt_bytes(dt: DType) -> usize {
    if dt == DType::F16 { 2 } else { 4 }
}

fn tuning(sg8: bool, bk64: bool, prefetch: bool, loop_bounding: bool, pad: bool) -> CoopTuning {
    CoopTuning {
        trusted: false,
        loop_bounding,
        pad,
        prefetch,
        sg8,
        bk64,
    }
}
