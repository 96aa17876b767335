use crate::common::run_checks;
use drift_engine::Tensor;
use drift_engine::selftest::matvec;

#[test]
fn matvec_matches_reference() {
    run_checks(matvec::checks);
}

/// Decode matrix-vector bandwidth at model sizes (run on the target GPU: `--ignored --nocapture`).
/// The weights rotate over enough copies to exceed the L2 cache.
#[test]
#[ignore]
fn bench_matvec() {
    use crate::matmul::{fill, time_us};
    use drift_engine::kernels::matvec::{MatvecOptions, MatvecVariant, matvec};
    use drift_engine::{Category, DType};
    let gpu = crate::common::gpu();
    let mut variants = vec![MatvecVariant::Workgroup];
    if gpu.caps.subgroup {
        variants.insert(0, MatvecVariant::Subgroup);
    }
    for (n, k, batch, wd) in [
        (4096, 4096, 1, DType::F16),
        (8192, 8192, 1, DType::F16),
        (14336, 4096, 1, DType::F16),
        (4096, 14336, 1, DType::F16),
        (128256, 4096, 1, DType::F16),
        (4096, 4096, 4, DType::F16),
        (4096, 4096, 1, DType::F32),
    ] {
        // On a CPU device (lavapipe) only smoke-test the bench at 1/16 of the sizes.
        let s = if gpu.info.device_type == wgpu::DeviceType::Cpu {
            16
        } else {
            1
        };
        let (n, k) = (n / s, k / s);
        let bytes = n * k * if wd == DType::F16 { 2 } else { 4 };
        let copies = (512usize << 20).div_ceil(bytes).clamp(2, 16);
        let ws: Vec<_> = (0..copies)
            .map(|i| {
                let w = gpu.tensor("w", &[n, k], wd, Category::Weights).unwrap();
                fill(gpu, &w, i as u64);
                w
            })
            .collect();
        let x = gpu
            .tensor("x", &[batch, k], DType::F32, Category::Activations)
            .unwrap();
        fill(gpu, &x, 99);
        let o = gpu
            .tensor("o", &[batch, n], DType::F32, Category::Activations)
            .unwrap();
        for &variant in &variants {
            let opts = MatvecOptions {
                variant,
                ..Default::default()
            };
            let ds: Vec<_> = ws
                .iter()
                .flat_map(|w| matvec(gpu, w, &x, &o, &opts).unwrap())
                .collect();
            let name = ds[0].name.clone();
            let gb = ds[0].cost.bytes / 1e9;
            let us = time_us(gpu, ds);
            println!(
                "BENCH matvec {batch}x[{n}, {k}] {wd:?} {variant:?} [{name}]: {us:.1} us, {:.0} GB/s",
                gb / us * 1e6
            );
        }
    }
}

/// The fusion options' shape errors are errors, not panics or silent misreads.
#[test]
fn matvec_fusion_options_are_checked() {
    use drift_engine::kernels::matvec::{MatvecOptions, matvec};
    use drift_engine::kernels::quant::matvec_quant;
    use drift_engine::{Category, DType};
    let gpu = crate::common::gpu();
    let t = |shape: &[usize]| {
        gpu.tensor("t", shape, DType::F32, Category::Activations)
            .unwrap()
    };
    let (w, x, out) = (t(&[16, 32]), t(&[1, 32]), t(&[1, 16]));
    let (g, g_short, gu) = (t(&[32]), t(&[31]), t(&[1, 64]));
    let (res_bad, big) = (t(&[1, 15]), t(&[40]));
    let partial = big.view(4, &[1, 16]).unwrap();
    let out_in_big = big.view(0, &[1, 16]).unwrap();
    let cases: Vec<(&Tensor, &Tensor, MatvecOptions, &str)> = vec![
        (
            &x,
            &out,
            MatvecOptions {
                norm: Some((&g_short, 1e-5)),
                ..Default::default()
            },
            "norm weight",
        ),
        (
            &x,
            &out,
            MatvecOptions {
                norm: Some((&g, f32::NAN)),
                ..Default::default()
            },
            "eps",
        ),
        (
            &gu,
            &out,
            MatvecOptions {
                norm: Some((&g, 1e-5)),
                swiglu: true,
                ..Default::default()
            },
            "do not combine",
        ),
        (
            &x,
            &out,
            MatvecOptions {
                swiglu: true,
                ..Default::default()
            },
            "do not fit",
        ),
        (
            &x,
            &out,
            MatvecOptions {
                residual: Some(&res_bad),
                ..Default::default()
            },
            "shape of out",
        ),
        (
            &x,
            &out_in_big,
            MatvecOptions {
                residual: Some(&partial),
                ..Default::default()
            },
            "partly overlaps",
        ),
    ];
    for (x, out, opts, want) in cases {
        for e in [
            matvec(gpu, &w, x, out, &opts).unwrap_err(),
            matvec_quant(gpu, &w, x, out, &opts).unwrap_err(),
        ] {
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
    }
    // The valid combinations build.
    matvec(
        gpu,
        &w,
        &gu,
        &out,
        &MatvecOptions {
            swiglu: true,
            residual: Some(&out),
            ..Default::default()
        },
    )
    .unwrap();
    matvec(
        gpu,
        &w,
        &x,
        &out,
        &MatvecOptions {
            norm: Some((&g, 1e-5)),
            residual: Some(&out),
            ..Default::default()
        },
    )
    .unwrap();
}

/// The fused prologue / epilogue defines both compile tests share (norm weight of type `tg`, bias f16,
/// residual f32, bindings 5 and 6).
fn fusion_defines(norm: &str, swiglu: &str, tg: &str) -> [(&'static str, String); 8] {
    [
        ("TB", "f16".to_string()),
        ("TG", tg.into()),
        ("TR", "f32".into()),
        ("NORM_B", "5".into()),
        ("RES_B", "6".into()),
        ("NORM", norm.into()),
        ("SWIGLU", swiglu.into()),
        ("F16", "1".into()),
    ]
}

/// Every specialisation of the matrix-vector kernels with their fused prologues / epilogues (f16 paths,
/// subgroup sizes and combinations lavapipe's checks do not reach) parses, validates and writes SPIR-V.
#[test]
fn matvec_specialisations_compile() {
    use crate::spirv::{combos, paired_defines, to_spirv};
    // The sources exactly as the builders compose them.
    let src = drift_engine::kernels::matvec::MATVEC_SRC;
    let quant_src = drift_engine::kernels::quant::MATVEC_SRC;
    // The prologue: none, RMSNorm or SwiGLU (exclusive).
    let prologues = [("0", "0"), ("1", "0"), ("0", "1")];
    let fixed = |d: &mut Vec<(&'static str, String)>, norm: &str, swiglu: &str| {
        d.extend(fusion_defines(norm, swiglu, "f32"));
    };
    for (tx, to) in [
        ("f32", "f32"),
        ("f16", "f16"),
        ("f16", "f32"),
        ("f32", "f16"),
    ] {
        for (nb, wg) in [("1", "256"), ("8", "256"), ("3", "64")] {
            for (norm, swiglu) in prologues {
                for mut d in combos(
                    &[("TX", tx), ("TO", to), ("NB", nb), ("WG", wg), ("RPW", "8")],
                    &["WF16", "VEC", "SG", "BIAS", "RES", "GV4"],
                ) {
                    let vec = d.iter().find(|(k, _)| *k == "VEC").unwrap().1.clone();
                    d.push(("XV4", vec));
                    fixed(&mut d, norm, swiglu);
                    to_spirv("matvec", src, &d);
                }
            }
        }
    }
    // Several subgroups per row: plain products of one activation row, vector loads, subgroups.
    for (tx, to) in [("f16", "f32"), ("f32", "f32")] {
        for (rpw, teams) in [("4", "2"), ("2", "4"), ("8", "2")] {
            for mut d in combos(
                &[
                    ("TX", tx),
                    ("TO", to),
                    ("NB", "1"),
                    ("WG", "256"),
                    ("RPW", rpw),
                    ("VEC", "1"),
                    ("XV4", "1"),
                    ("SG", "1"),
                    ("TEAMED", "1"),
                    ("TEAMS", teams),
                ],
                &["WF16", "BIAS", "RES"],
            ) {
                fixed(&mut d, "0", "0");
                to_spirv("matvec teams", src, &d);
            }
        }
    }
    // The paired-row epilogues (one batch row, after the norm prologue, staged or not): GLU with bias,
    // RoPE into f16 caches with both pairings.
    for glu in [true, false] {
        for mut d in combos(
            &[
                ("TX", "f32"),
                ("TO", "f16"),
                ("NB", "1"),
                ("WG", "256"),
                ("RPW", "32"),
                ("F16", "1"),
                ("GV4", "1"),
                ("SWIGLU", "0"),
                ("RES", "0"),
                ("XS", "64"),
                ("STAGE_TAIL", "0"),
            ],
            &["WF16", "VEC", "SG", "INTERLEAVED", "STAGE"],
        ) {
            let pf = ["VEC", "SG", "STAGE"]
                .iter()
                .all(|k| d.contains(&(*k, "1".to_string())));
            d.push(("PF", u8::from(pf).to_string()));
            let on = |k: &str| d.contains(&(k, "1".to_string()));
            let xp = if on("VEC") && on("WF16") { "2" } else { "1" };
            let vec = if on("VEC") { "1" } else { "0" };
            d.extend([("XP", xp.to_string()), ("XV4", vec.to_string())]);
            d.extend(paired_defines(glu));
            to_spirv("matvec paired", src, &d);
        }
    }
    for ty in ["Q4_0", "Q6K"] {
        for (nb, r) in [("1", "2"), ("3", "1")] {
            for (norm, swiglu) in prologues {
                for mut d in combos(
                    &[
                        (ty, "1"),
                        ("ALIGNED", "1"),
                        ("TX", "f16"),
                        ("TO", "f32"),
                        ("NB", nb),
                        ("R", r),
                        ("U", "2"),
                        ("UREM", "1"),
                        ("WG", "256"),
                        ("MIN", "0"),
                    ],
                    &["SG", "XV4", "BIAS", "RES", "GV4"],
                ) {
                    fixed(&mut d, norm, swiglu);
                    to_spirv("matvec_quant", quant_src, &d);
                }
            }
        }
    }
}

/// Every staged specialisation (one batch row with RMSNorm or SwiGLU, all of K staged or a tail
/// computed per row, both reductions) of both kernels parses, validates and writes SPIR-V; the
/// subgroup ones with other subgroup sizes than lavapipe's among them.
#[test]
fn matvec_staged_specialisations_compile() {
    use crate::spirv::{combos, to_spirv};
    // The sources exactly as the builders compose them.
    let src = drift_engine::kernels::matvec::MATVEC_SRC;
    let quant_src = drift_engine::kernels::quant::MATVEC_SRC;
    let fixed =
        |d: &mut Vec<(&'static str, String)>, norm: &str, swiglu: &str, xs: &str, xp: &str| {
            d.extend(fusion_defines(norm, swiglu, "f16"));
            d.extend([
                ("NB", "1".to_string()),
                ("STAGE", "1".into()),
                ("XS", xs.into()),
                ("XP", xp.into()),
            ]);
        };
    for (norm, swiglu) in [("1", "0"), ("0", "1")] {
        for (tx, xs) in [("f32", "64"), ("f16", "3072")] {
            for mut d in combos(
                &[("TX", tx), ("TO", "f32"), ("WG", "256"), ("RPW", "16")],
                &["WF16", "VEC", "SG", "BIAS", "RES", "STAGE_TAIL"],
            ) {
                // The prefetch needs vector loads and subgroups.
                let pf = d.contains(&("VEC", "1".into())) && d.contains(&("SG", "1".into()));
                d.push(("PF", u8::from(pf).to_string()));
                let vec = d.iter().find(|(k, _)| *k == "VEC").unwrap().1.clone();
                d.push(("XV4", vec));
                let xp = if d.contains(&("VEC", "1".into())) && d.contains(&("WF16", "1".into())) {
                    "2"
                } else {
                    "1"
                };
                fixed(&mut d, norm, swiglu, xs, xp);
                to_spirv("matvec staged", src, &d);
            }
            for ty in ["Q4_0", "Q4K"] {
                for mut d in combos(
                    &[
                        (ty, "1"),
                        ("ALIGNED", "1"),
                        ("TX", tx),
                        ("TO", "f16"),
                        ("R", "2"),
                        ("U", "2"),
                        ("UREM", "1"),
                        ("WG", "256"),
                        ("MIN", if ty == "Q4K" { "1" } else { "0" }),
                    ],
                    &["SG", "XV4", "GV4", "STAGE_TAIL"],
                ) {
                    fixed(&mut d, norm, swiglu, xs, "8");
                    to_spirv("matvec_quant staged", quant_src, &d);
                }
            }
        }
    }
}
