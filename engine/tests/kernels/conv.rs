use crate::common::{gpu, run_checks};
use crate::spirv::{assert_workgroup_sizes_on_16, combos, to_spirv};
use drift_engine::kernels::conv::{
    Conv2dOptions, Conv2dVariant, conv2d, conv2d_output_size, conv2d_plan,
};
use drift_engine::kernels::layout::{concat_channels, permute, upsample_nearest2x};
use drift_engine::{Category, DType, Dispatch, Layout, Program, Result};

#[test]
fn conv_matches_reference() {
    run_checks(drift_engine::selftest::conv::checks);
}

/// The cooperative-matrix convolution cannot run on lavapipe (only its emulation can): check every
/// specialisation the builder can select offline (parse, validate, SPIR-V) so it is known to compile
/// before it meets the H200.
#[test]
fn conv_coop_compiles_to_spirv() {
    let source = drift_engine::shader!("conv_coop.wgsl");
    let mut n = 0;
    // (KH, KW, S, P, MASK): SD's 3x3 stride 1 and 2, 1x1, and a 7x7 with the per-tap bounds test.
    for (kh, kw, s, p, mask) in [
        ("3", "3", "1", "1", "1"),
        ("3", "3", "2", "1", "1"),
        ("1", "1", "1", "0", "1"),
        ("7", "7", "1", "3", "0"),
    ] {
        for (tx, tw, tb) in [
            ("f16", "f16", "f16"),
            ("f32", "f32", "f32"),
            ("f16", "f32", "f32"),
            ("f32", "f16", "f16"),
        ] {
            let fixed = [
                ("TX", tx),
                ("TW", tw),
                ("TB", tb),
                ("KH", kh),
                ("KW", kw),
                ("S", s),
                ("P", p),
                ("MASK", mask),
                ("B_BIAS", "4"),
                ("B_RES", "5"),
                ("OFF_BIAS", "p.offs[0][3]"),
                ("OFF_RES", "p.offs[1][0]"),
            ];
            // The builds the builder selects (SG8, BK64, ST8, NOPREFETCH, EPI4): K steps of 64
            // without prefetch (the default), K steps of 32 with prefetch in both layouts, and 4
            // subgroups with 4 staged accumulators (devices with 35 KiB).
            let builds = [
                ["1", "1", "1", "1", "0"],
                ["1", "0", "0", "0", "0"],
                ["0", "0", "1", "0", "0"],
                ["0", "0", "1", "0", "1"],
            ];
            for build in builds {
                // The cooperative build, its emulation and (no staged accumulators) its lean
                // emulation.
                let emulations: &[[&str; 2]] = if build[4] == "1" {
                    &[["0", "0"], ["1", "0"]]
                } else {
                    &[["0", "0"], ["1", "0"], ["1", "1"]]
                };
                for &[emulate, lean] in emulations {
                    let mut fixed = fixed.to_vec();
                    fixed.extend(
                        ["SG8", "BK64", "ST8", "NOPREFETCH", "EPI4"]
                            .into_iter()
                            .zip(build),
                    );
                    fixed.extend([("EMULATE", emulate), ("LEAN", lean)]);
                    for d in combos(&fixed, &["XVEC", "VA", "VO", "SPLIT", "BIAS", "RES"]) {
                        let on = |f: &str| d.iter().any(|(k, v)| *k == f && v == "1");
                        // The builder fuses bias and residual only without split-K and reads x as
                        // vec4 only for 1x1 convolutions.
                        if (on("SPLIT") && (on("BIAS") || on("RES"))) || (on("XVEC") && kh != "1") {
                            continue;
                        }
                        let words = to_spirv("conv_coop", source, &d);
                        if emulate == "0" {
                            assert_workgroup_sizes_on_16("conv_coop", source, &d);
                        }
                        // OpCapability CooperativeMatrixKHR (6022) exactly when not emulated.
                        let coop = words.windows(2).any(|w| w == [(2 << 16) | 17, 6022]);
                        assert_eq!(coop, emulate == "0", "{d:?}");
                        n += 1;
                    }
                }
            }
        }
    }
    // Per shape and dtypes: 5 fusion/split combinations x VA, VO (4) x 11 builds (4 cooperative, 4
    // emulated, 3 lean) = 220, twice that for 1x1 (XVEC).
    assert_eq!(n, 4 * (3 * 220 + 440));
}

/// Best wall time per copy of `reps` copies of one dispatch sequence in one submit, after a warm-up
/// (the best of 5, so clock ramp-up after pipeline compiles does not count).
fn time_us(build: &dyn Fn() -> Result<Vec<Dispatch>>, reps: usize) -> Result<f64> {
    let g = gpu();
    let mut prog = Program::new();
    for _ in 0..reps {
        prog.extend(build()?);
    }
    prog.run(g)?;
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            prog.run(g)
                .map(|_| t.elapsed().as_secs_f64() * 1e6 / reps as f64)
        })
        .collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[0])
}

/// SD 1.5 UNet/VAE convolutions: `cargo test --release --test kernels conv_bench -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark for a real GPU"]
fn conv_bench() {
    let g = gpu();
    let shapes: [([usize; 4], usize, usize, usize); 9] = [
        ([2, 320, 64, 64], 320, 3, 1),
        ([2, 640, 64, 64], 320, 3, 1),
        ([2, 320, 64, 64], 320, 1, 1),
        ([2, 320, 64, 64], 320, 3, 2),
        ([2, 640, 32, 32], 640, 3, 1),
        ([2, 1280, 16, 16], 1280, 3, 1),
        ([2, 1280, 8, 8], 1280, 3, 1),
        ([1, 512, 64, 64], 512, 3, 1),
        ([1, 128, 512, 512], 128, 3, 1),
    ];
    // Sweep variants and splits in f16 (the product's dtype), then Auto in both dtypes.
    for (x, o, k, s) in shapes {
        for dtype in [DType::F16, DType::F32] {
            let pad = k / 2;
            let (ho, wo) = conv2d_output_size((x[2], x[3]), (k, k), s, pad, None).unwrap();
            let xt = g.tensor("x", &x, dtype, Category::Activations).unwrap();
            let mut wt = g
                .tensor("w", &[o, x[1], k, k], dtype, Category::Weights)
                .unwrap();
            wt.layout = Layout::Transposed;
            let b = g.tensor("b", &[o], dtype, Category::Weights).unwrap();
            let out = g
                .tensor("out", &[x[0], o, ho, wo], dtype, Category::Activations)
                .unwrap();
            let flops = 2.0 * (x[0] * ho * wo * o * x[1] * k * k) as f64;
            let tf = |us: f64| flops / us * 1e-6;
            let run = |variant, split_k| {
                let opts = Conv2dOptions {
                    stride: s,
                    padding: pad,
                    variant,
                    split_k,
                    ..Default::default()
                };
                time_us(&|| conv2d(g, &xt, &wt, Some(&b), &out, &opts), 10).unwrap()
            };
            let sweep: &[Conv2dVariant] = if dtype == DType::F16 {
                &Conv2dVariant::ALL
            } else {
                &[]
            };
            for &variant in sweep {
                let mut line = format!("  {variant:?}:");
                for split in [1, 4, 16] {
                    line.push_str(&format!(
                        " split {split} {:.1};",
                        tf(run(variant, Some(split)))
                    ));
                }
                println!("{line}");
            }
            let m = x[0] * ho * wo;
            let plan = conv2d_plan(m, o, x[1] * k * k, Conv2dVariant::Auto, None);
            let us = run(Conv2dVariant::Auto, None);
            println!(
                "conv {k}x{k} s{s} x{x:?} O{o} {dtype:?}: auto {plan:?} {us:.1} us {:.1} TFLOP/s",
                tf(us)
            );
        }
    }
    // Layout ops (bandwidth: bytes read + written).
    for dtype in [DType::F32, DType::F16] {
        let eb = if dtype == DType::F16 { 2.0 } else { 4.0 };
        let t = |s: &[usize]| g.tensor("t", s, dtype, Category::Activations).unwrap();
        let (x, o) = (t(&[2, 640, 64, 64]), t(&[2, 640, 128, 128]));
        let us = time_us(&|| Ok(vec![upsample_nearest2x(g, &x, &o)?]), 10).unwrap();
        println!(
            "upsample {:?} {dtype:?}: {us:.1} us {:.0} GB/s",
            x.shape,
            5.0 * x.numel() as f64 * eb / us * 1e-3
        );
        let (a, b, o) = (
            t(&[2, 640, 64, 64]),
            t(&[2, 320, 64, 64]),
            t(&[2, 960, 64, 64]),
        );
        let us = time_us(&|| Ok(vec![concat_channels(g, &a, &b, &o)?.remove(0)]), 10).unwrap();
        println!(
            "concat part a {:?} {dtype:?}: {us:.1} us {:.0} GB/s",
            a.shape,
            2.0 * a.numel() as f64 * eb / us * 1e-3
        );
        for (shape, perm) in [
            (vec![2, 320, 64, 64], vec![0, 2, 3, 1]),
            (vec![2, 4096, 320], vec![0, 2, 1]),
            (vec![2, 4096, 8, 40], vec![0, 2, 1, 3]),
            (vec![4096, 4096], vec![1, 0]),
        ] {
            let x = t(&shape);
            let o = t(&perm.iter().map(|&d| shape[d]).collect::<Vec<_>>());
            let us = time_us(&|| Ok(vec![permute(g, &x, &perm, &o)?]), 10).unwrap();
            println!(
                "permute {shape:?} by {perm:?} {dtype:?}: {us:.1} us {:.0} GB/s",
                2.0 * x.numel() as f64 * eb / us * 1e-3
            );
        }
    }
}
