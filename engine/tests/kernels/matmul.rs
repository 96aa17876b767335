use crate::common::run_checks;
use crate::spirv::{assert_workgroup_sizes_on_16, combos, to_spirv};
use drift_engine::selftest::matmul;

#[test]
fn matmul_matches_reference() {
    run_checks(matmul::checks);
}

/// The cooperative-matrix kernel cannot run on lavapipe: check every specialisation offline (parse,
/// validate, SPIR-V) so it is known to compile before it meets the H200.
#[test]
fn matmul_coop_compiles_to_spirv() {
    let source = drift_engine::shader!("matmul_coop.wgsl");
    let mut n = 0;
    for to in ["f32", "f16"] {
        for tb in ["f32", "f16"] {
            for d in combos(
                &[("TO", to), ("TB", tb)],
                &[
                    "TRANS_B", "BIAS", "VA", "VB", "VO", "DIRECT", "EPI4", "SG8", "BK64",
                ],
            ) {
                // The builder sets DIRECT only for f32 outputs bound as scalars, EPI4 never with
                // eight subgroups, BK64 only with them, and ST8 from those two.
                let on = |f: &str| d.iter().any(|(k, v)| *k == f && v == "1");
                if on("DIRECT") && (to != "f32" || on("VO"))
                    || on("EPI4") && on("SG8")
                    || on("BK64") && !on("SG8")
                {
                    continue;
                }
                let mut d = d.clone();
                d.push(("ST8", u8::from(!on("SG8") || on("BK64")).to_string()));
                let words = to_spirv("matmul_coop", source, &d);
                assert_workgroup_sizes_on_16("matmul_coop", source, &d);
                // OpCapability CooperativeMatrixKHR (6022) must be declared.
                assert!(
                    words.windows(2).any(|w| w == [(2 << 16) | 17, 6022]),
                    "no CooperativeMatrixKHR"
                );
                n += 1;
            }
        }
    }
    assert_eq!(n, 4 * (64 + 32 + 64));
    // The SwiGLU epilogue (transposed weight, no bias, never DIRECT) with each subgroup layout.
    for to in ["f32", "f16"] {
        for d in combos(
            &[("TO", to), ("TB", to)],
            &["VA", "VB", "VO", "SG8", "BK64"],
        ) {
            let on = |f: &str| d.iter().any(|(k, v)| *k == f && v == "1");
            if on("BK64") && !on("SG8") {
                continue;
            }
            let mut d = d.clone();
            d.extend(
                [
                    ("TRANS_B", "1"),
                    ("GLU", "1"),
                    ("BIAS", "0"),
                    ("DIRECT", "0"),
                    ("EPI4", if on("SG8") { "0" } else { "1" }),
                    ("ST8", if !on("SG8") || on("BK64") { "1" } else { "0" }),
                ]
                .map(|(k, v)| (k, v.to_string())),
            );
            to_spirv("matmul_coop swiglu", source, &d);
        }
    }
    // The bench-only A/B switches, on one configuration each way.
    for (nopad, nopre) in [("1", "0"), ("0", "1"), ("1", "1")] {
        for (trans, sg8, bk64) in [
            ("0", "0", "0"),
            ("1", "0", "0"),
            ("0", "1", "0"),
            ("1", "1", "1"),
            ("0", "1", "1"),
        ] {
            let d: Vec<(&'static str, String)> = [
                ("TO", "f16"),
                ("TB", "f16"),
                ("TRANS_B", trans),
                ("BIAS", "1"),
                ("VA", "1"),
                ("VB", "1"),
                ("VO", "1"),
                ("DIRECT", "0"),
                ("EPI4", if sg8 == "1" { "0" } else { "1" }),
                ("SG8", sg8),
                ("BK64", bk64),
                ("ST8", if sg8 == "0" || bk64 == "1" { "1" } else { "0" }),
                ("NOPAD", nopad),
                ("NOPREFETCH", nopre),
            ]
            .iter()
            .map(|&(k, v)| (k, v.to_string()))
            .collect();
            to_spirv("matmul_coop", source, &d);
        }
    }
}

/// The portable kernels' specialisations that lavapipe does not select (vector widths, tile sizes,
/// f16 paths on devices without f16, subgroup sizes other than 8) compile too.
#[test]
fn matmul_and_matvec_specialisations_compile() {
    let matmul_src = drift_engine::shader!("matmul.wgsl");
    for (t, to) in [
        ("f32", "f32"),
        ("f32", "f16"),
        ("f16", "f16"),
        ("f16", "f32"),
    ] {
        for (r, r8) in [("4", "0"), ("8", "1")] {
            for d in combos(
                &[
                    ("T", t),
                    ("TO", to),
                    ("TB", "f32"),
                    ("F16", "1"),
                    ("R", r),
                    ("R8", r8),
                ],
                &["BIAS", "VA", "VB", "VO"],
            ) {
                to_spirv("matmul", matmul_src, &d);
            }
        }
    }
    // matvec.wgsl (with matvec_fuse.wgsl appended): matvec::matvec_specialisations_compile.
}

/// Fills a tensor with pseudo-random values in [-1, 1): a 4 MiB block of an LCG, encoded once and
/// written repeatedly (the bench needs large tensors fast, not statistical quality; not zeros, which
/// some GPUs compress).
pub fn fill(gpu: &drift_engine::Gpu, t: &drift_engine::Tensor, seed: u64) {
    let per = ((4usize << 20) / t.elem_bytes() as usize).min(t.numel());
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..per)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let bytes = drift_engine::gpu::encode_f32(&v, t.dtype).unwrap();
    let mut e = 0;
    while e < t.numel() {
        let n = per.min(t.numel() - e);
        let view = t.view(e, &[n]).unwrap();
        gpu.write_tensor_bytes(&view, &bytes[..n * t.elem_bytes() as usize])
            .unwrap();
        e += n;
    }
}

/// Median GPU time per dispatch (timestamps) over a few runs of `dispatches`, in microseconds, after
/// half a second of warm-up (GPUs idle at low clocks; short bursts would be timed before the ramp).
pub fn time_us(gpu: &drift_engine::Gpu, dispatches: Vec<drift_engine::Dispatch>) -> f64 {
    let mut prog = drift_engine::Program::new();
    prog.extend(dispatches);
    let warm = std::time::Instant::now();
    while warm.elapsed().as_secs_f64() < 0.5 {
        prog.run(gpu).unwrap();
    }
    let mut profiler = drift_engine::profiler::Profiler::new();
    let mut times = Vec::new();
    for _ in 0..3 {
        let p = profiler.run(gpu, &prog).unwrap();
        times.extend(p.dispatches.iter().map(|d| d.duration_us));
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// GEMM throughput at model sizes (run on the target GPU: `--ignored --nocapture`).
#[test]
#[ignore]
fn bench_matmul() {
    use drift_engine::kernels::matmul::{
        MatmulOptions, MatmulTile, MatmulVariant, matmul, matmul_flops,
    };
    use drift_engine::{Category, DType};
    let gpu = crate::common::gpu();
    println!("caps: {:?}", gpu.caps);
    let coop = drift_engine::kernels::matmul::coop_available(&gpu.caps);
    let mut cases = vec![
        (
            4096,
            4096,
            4096,
            DType::F32,
            false,
            MatmulVariant::Tiled,
            MatmulTile::T128,
        ),
        (
            4096,
            4096,
            4096,
            DType::F32,
            true,
            MatmulVariant::Tiled,
            MatmulTile::T128,
        ),
        (
            4096,
            4096,
            4096,
            DType::F16,
            true,
            MatmulVariant::Tiled,
            MatmulTile::T128,
        ),
        (
            512,
            4096,
            4096,
            DType::F32,
            true,
            MatmulVariant::Tiled,
            MatmulTile::Auto,
        ),
        (
            512,
            4096,
            4096,
            DType::F32,
            true,
            MatmulVariant::Tiled,
            MatmulTile::T128,
        ),
        (
            77,
            3072,
            768,
            DType::F32,
            true,
            MatmulVariant::Tiled,
            MatmulTile::Auto,
        ),
    ];
    if coop {
        cases.extend([
            (
                4096,
                4096,
                4096,
                DType::F16,
                false,
                MatmulVariant::Coop,
                MatmulTile::Auto,
            ),
            (
                4096,
                4096,
                4096,
                DType::F16,
                true,
                MatmulVariant::Coop,
                MatmulTile::Auto,
            ),
            (
                8192,
                8192,
                8192,
                DType::F16,
                true,
                MatmulVariant::Coop,
                MatmulTile::Auto,
            ),
            (
                512,
                4096,
                4096,
                DType::F16,
                true,
                MatmulVariant::Coop,
                MatmulTile::Auto,
            ),
            (
                4095,
                4097,
                4096,
                DType::F16,
                true,
                MatmulVariant::Coop,
                MatmulTile::Auto,
            ),
        ]);
    }
    // On a CPU device (lavapipe) only smoke-test the bench at 1/16 of the sizes.
    let s = if gpu.info.device_type == wgpu::DeviceType::Cpu {
        16
    } else {
        1
    };
    for (m, n, k, dtype, trans, variant, tile) in cases {
        let (m, n, k): (usize, usize, usize) = (m, n, k);
        let (m, n, k) = (m.div_ceil(s), n.div_ceil(s), k.div_ceil(s));
        let a = gpu
            .tensor("a", &[m, k], dtype, Category::Activations)
            .unwrap();
        let b = gpu
            .tensor(
                "b",
                &if trans { [n, k] } else { [k, n] },
                dtype,
                Category::Weights,
            )
            .unwrap();
        let o = gpu
            .tensor("o", &[m, n], dtype, Category::Activations)
            .unwrap();
        fill(gpu, &a, 1);
        fill(gpu, &b, 2);
        let opts = MatmulOptions {
            transpose_b: trans,
            variant,
            tile,
            ..Default::default()
        };
        let ds: Vec<_> = (0..5)
            .flat_map(|_| matmul(gpu, &a, &b, &o, &opts).unwrap())
            .collect();
        let name = ds[0].name.clone();
        let us = time_us(gpu, ds);
        println!(
            "BENCH matmul {m}x{n}x{k} {dtype:?}{} {variant:?}/{tile:?} [{name}]: {us:.1} us, {:.1} TFLOP/s",
            if trans { " b^T" } else { "" },
            matmul_flops(1, m, n, k) / us / 1e6
        );
    }
    if coop && s == 1 {
        // A/B: the cooperative kernel without the workgroup-memory row padding.
        use drift_engine::exec::Cost;
        use drift_engine::kernels::{KernelSpec, grid};
        let n = 4096usize;
        let a = gpu
            .tensor("a", &[n, n], DType::F16, Category::Activations)
            .unwrap();
        let b = gpu
            .tensor("b", &[n, n], DType::F16, Category::Weights)
            .unwrap();
        let o = gpu
            .tensor("o", &[n, n], DType::F16, Category::Activations)
            .unwrap();
        fill(gpu, &a, 1);
        fill(gpu, &b, 2);
        for (nopad, nopre) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let spec = KernelSpec::new(
                format!("coop_nopad{nopad}_nopre{nopre}"),
                drift_engine::shader!("matmul_coop.wgsl"),
                "matmul_coop",
            )
            .defines(vec![
                ("TO", "f16".into()),
                ("TB", "f16".into()),
                ("F16", "1".into()),
                ("VA", "1".into()),
                ("VB", "1".into()),
                ("BIAS", "0".into()),
                ("TRANS_B", "1".into()),
                ("VO", "1".into()),
                ("DIRECT", "0".into()),
                ("EPI4", "1".into()),
                ("NOPAD", nopad.to_string()),
                ("NOPREFETCH", nopre.to_string()),
            ]);
            let kernel = gpu.kernel(&spec).unwrap();
            let t = (n / 128) as u32;
            let nn = n as u32;
            let params = [nn, nn, nn, t, t, t * t, nn * nn, 0, nn * nn, nn, 0, nn, 1];
            let ds: Vec<_> = (0..5)
                .map(|_| {
                    let cost = Cost {
                        flops: 0.0,
                        bytes: 0.0,
                    };
                    gpu.dispatch(&kernel, &params, &[&a, &b, &o], grid(t * t, 65535), cost)
                        .unwrap()
                })
                .collect();
            let us = time_us(gpu, ds);
            println!(
                "BENCH coop nopad={nopad} noprefetch={nopre} 4096^3 b^T: {us:.1} us, {:.1} TFLOP/s",
                matmul_flops(1, n, n, n) / us / 1e6
            );
        }
    }
}
