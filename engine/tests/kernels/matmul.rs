use crate::common::run_checks;
use drift_engine::kernels::preprocess;
use drift_engine::selftest::matmul;

#[test]
fn matmul_matches_reference() {
    run_checks(matmul::checks);
}

/// Every define combination of a shader: `fixed` as given, each name in `flags` 0 and 1.
fn combos(fixed: &[(&'static str, &str)], flags: &[&'static str]) -> Vec<Vec<(&'static str, String)>> {
    (0..1u32 << flags.len())
        .map(|bits| {
            let mut d: Vec<(&'static str, String)> = fixed.iter().map(|&(k, v)| (k, v.to_string())).collect();
            d.extend(flags.iter().enumerate().map(|(i, &f)| (f, ((bits >> i) & 1).to_string())));
            d
        })
        .collect()
}

/// Preprocesses, validates with every capability (cooperative matrix, f16, subgroups) and writes
/// SPIR-V 1.6 with the bounds-check policies wgpu uses on Vulkan. The writer step matters: some
/// naga bugs only show there (panics on uncached expressions in cooperative loads).
fn to_spirv(name: &str, source: &str, defines: &[(&'static str, String)]) -> Vec<u32> {
    let src = preprocess(source, defines).unwrap_or_else(|e| panic!("{name} {defines:?}: {e}"));
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{name} {defines:?}: {}", e.emit_to_string(&src)));
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let info = validator
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name} {defines:?}: {}", e.emit_to_string(&src)));
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let result = std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &options, None));
    match result {
        Ok(Ok(words)) => words,
        Ok(Err(e)) => panic!("{name} {defines:?}: SPIR-V writer: {e}"),
        Err(_) => panic!("{name} {defines:?}: SPIR-V writer panicked"),
    }
}

/// The cooperative-matrix kernel cannot run on lavapipe: check every specialisation offline (parse,
/// validate, SPIR-V) so it is known to compile before it meets the H200.
#[test]
fn matmul_coop_compiles_to_spirv() {
    let source = drift_engine::shader!("matmul_coop.wgsl");
    let mut n = 0;
    for to in ["f32", "f16"] {
        for tb in ["f32", "f16"] {
            for wg in ["128", "256"] {
                for d in combos(
                    &[("TO", to), ("TB", tb), ("WG", wg)],
                    &["TRANS_B", "BIAS", "VA", "VB", "VO", "DIRECT", "EPI4"],
                ) {
                    // The builder sets DIRECT only for f32 outputs bound as scalars.
                    let on = |f: &str| d.iter().any(|(k, v)| *k == f && v == "1");
                    if on("DIRECT") && (to != "f32" || on("VO")) {
                        continue;
                    }
                    let words = to_spirv("matmul_coop", source, &d);
                    // OpCapability CooperativeMatrixKHR (6022) must be declared.
                    assert!(words.windows(2).any(|w| w == [(2 << 16) | 17, 6022]), "no CooperativeMatrixKHR");
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 2 * 2 * (64 + 32 + 64));
}

/// The portable kernels' specialisations that lavapipe does not select (vector widths, tile sizes,
/// f16 paths on devices without f16, subgroup sizes other than 8) compile too.
#[test]
fn matmul_and_matvec_specialisations_compile() {
    let matmul_src = drift_engine::shader!("matmul.wgsl");
    for (t, to) in [("f32", "f32"), ("f32", "f16"), ("f16", "f16"), ("f16", "f32")] {
        for r in ["4", "8"] {
            for d in combos(
                &[("T", t), ("TO", to), ("TB", "f32"), ("F16", "1"), ("R", r)],
                &["VA", "VB", "VO"],
            ) {
                to_spirv("matmul", matmul_src, &d);
            }
        }
    }
    let matvec_src = drift_engine::shader!("matvec.wgsl");
    for (tx, to) in [("f32", "f32"), ("f16", "f16"), ("f32", "f16")] {
        for (nb, wg) in [("1", "256"), ("8", "256"), ("3", "64")] {
            for d in combos(
                &[("TX", tx), ("TO", to), ("TB", "f16"), ("F16", "1"), ("NB", nb), ("WG", wg)],
                &["WF16", "VEC", "SG", "BIAS"],
            ) {
                to_spirv("matvec", matvec_src, &d);
            }
        }
    }
}

#[test]
#[ignore]
fn scratch_timing() {
    use drift_engine::kernels::matmul::{MatmulTile, MatmulVariant};
    use drift_engine::selftest::matmul::{Case, check};
    use drift_engine::DType;
    let gpu = crate::common::gpu();
    let (mut rng, _) = drift_engine::selftest::rng();
    let base = Case {
        batch: 1, m: 5, n: 7, k: 9, transpose_b: false, batched_b: false, bias: false,
        dtype: DType::F32, out_dtype: DType::F32, a_offset: 0, out_offset: 0,
        variant: MatmulVariant::Tiled, tile: MatmulTile::T64, shard_bytes: None,
    };
    let seq = [
        ("base", base),
        ("base again", base),
        ("k=30", Case { k: 30, ..base }),
        ("m=20", Case { m: 20, ..base }),
        ("n=21", Case { n: 21, ..base }),
        ("trans", Case { transpose_b: true, ..base }),
        ("bias", Case { bias: true, ..base }),
        ("bias again", Case { bias: true, ..base }),
        ("bias n=30", Case { bias: true, n: 30, ..base }),
        ("bias n=300", Case { bias: true, n: 300, ..base }),
        ("batch2", Case { batch: 2, ..base }),
        ("batch2 bb", Case { batch: 2, batched_b: true, ..base }),
        ("m=1", Case { m: 1, ..base }),
        ("k=1", Case { k: 1, ..base }),
    ];
    for (name, c) in seq {
        let t = std::time::Instant::now();
        let r = check(gpu, &mut rng, &c).unwrap();
        println!("{name}: {:?} {}", t.elapsed(), r.passed);
    }
}
