use crate::common::{gpu, run_checks};
use crate::spirv::to_spirv;
use drift_engine::kernels::attention::{self as kernel, AttentionOptions, AttentionVariant};
use drift_engine::kernels::attention_coop::{CoopConfig, CoopTile};
use drift_engine::profiler::Profiler;
use drift_engine::selftest::attention;
use drift_engine::{Category, DType, Program};

#[test]
fn attention_matches_reference() {
    run_checks(attention::checks);
}

/// The cooperative-matrix algorithm (tiling, masks, lazy online softmax, GQA, padding, edges) with
/// its matrix operations emulated: runs on lavapipe.
#[test]
fn attention_coop_emulated_matches_reference() {
    run_checks(attention::coop_emulated_checks);
}

/// The stage probes (scores, probabilities, P V of one tile) through the emulated kernel: they must
/// pass where the algorithm is right, so on the H200 the first failing stage locates the fault. One
/// head dim (zero-padded in the kernel; lavapipe compiles each emulated build for a minute).
#[test]
fn attention_coop_stage_probes_pass_emulated() {
    run_checks(|gpu, rng| {
        drift_engine::selftest::attention_stages::coop_stage_checks(
            gpu,
            rng,
            AttentionVariant::CoopEmulated,
            &[40],
        )
    });
}

/// Explicit coop where it cannot run is a clear error, not a fallback.
#[test]
fn attention_coop_refuses_what_it_cannot_run() {
    let gpu = gpu();
    let t = |shape: &[usize], dt| gpu.tensor("t", shape, dt, Category::Activations).unwrap();
    let step = t(&[2], DType::U32);
    let run = |dt, variant| {
        let (q, k) = (t(&[1, 64, 2, 64], dt), t(&[1, 64, 2, 64], dt));
        let opts = AttentionOptions {
            variant,
            ..Default::default()
        };
        kernel::attention(gpu, &q, &k, &k, &q, &step, &opts).map(|_| ())
    };
    let err = run(DType::F32, AttentionVariant::CoopEmulated).unwrap_err();
    assert!(err.to_string().contains("needs f16 q, k and v"), "{err}");
    if !drift_engine::kernels::matmul::coop_available(&gpu.caps) {
        let err = run(DType::F16, AttentionVariant::Coop).unwrap_err();
        assert!(err.to_string().contains("cooperative matrices"), "{err}");
    }
}

/// The cooperative-matrix kernel cannot run on lavapipe: check every specialisation offline (parse,
/// validate, SPIR-V), with real and emulated matrices, so it is known to compile before it meets
/// the H200. Shapes: the tiles the H200 picks for D = 40, 64, 80, 128, 160, 256, smaller ones and
/// 8-subgroup ones.
#[test]
fn attention_coop_compiles_to_spirv() {
    let source = drift_engine::shader!("attention_coop.wgsl");
    let shapes = [
        (40, 4, 64, 1),
        (64, 4, 64, 4),
        (80, 4, 32, 1),
        (128, 4, 32, 4),
        (160, 4, 16, 1),
        (256, 2, 16, 2),
        (40, 1, 16, 3),
        (40, 8, 16, 1),
        (80, 8, 16, 2),
    ];
    let mut n = 0;
    for (d, subgroups, keys, g) in shapes {
        for bits in 0..1u32 << 7 {
            let on = |i: u32| (bits >> i) & 1 == 1;
            let config = CoopConfig {
                d,
                tile: CoopTile { subgroups, keys },
                g,
                causal: on(0),
                coop: on(1),
                subgroups: on(2),
                vec_q: on(3),
                vec_kv: on(4),
                vec_out: on(5),
                out_f16: on(6),
                debug: Default::default(),
            };
            // Real matrices always run with subgroups of 32.
            if config.coop && !config.subgroups {
                continue;
            }
            let words = to_spirv("attention_coop", source, &config.defines());
            // OpCapability CooperativeMatrixKHR (6022) exactly when the matrices are real.
            let declared = words.windows(2).any(|w| w == [(2 << 16) | 17, 6022]);
            assert_eq!(declared, config.coop, "{config:?}");
            n += 1;
        }
    }
    assert_eq!(n, 9 * 96);
}

/// GPU time of the attention kernels at model sizes (not a correctness test; run on a real GPU with
/// `cargo test --release --test kernels attention_timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn attention_timing() {
    let gpu = gpu();
    println!("caps: {:?}", gpu.caps);
    let (f, h) = (DType::F32, DType::F16);
    use AttentionVariant::{Auto, Prefill};
    // (name, [B, Lq, Lkv, Hq, Hkv, D], causal, q/out dtype, kv dtype, variant)
    #[rustfmt::skip]
    let cases = [
        ("SD self 4096 D40", [2, 4096, 4096, 8, 8, 40], false, h, h, Auto),
        ("SD cross 4096x77 D40", [2, 4096, 77, 8, 8, 40], false, h, h, Auto),
        ("SD self 1024 D80", [2, 1024, 1024, 8, 8, 80], false, h, h, Auto),
        ("SD self 256 D160", [2, 256, 256, 8, 8, 160], false, h, h, Auto),
        ("LLM prefill 512 D64", [1, 512, 512, 32, 8, 64], true, f, h, Auto),
        ("LLM prefill 512 D128", [1, 512, 512, 32, 8, 128], true, f, h, Auto),
        ("LLM prefill 4096 D128", [1, 4096, 4096, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 512 D128", [1, 1, 512, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 4096 D128", [1, 1, 4096, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 32768 D128", [1, 1, 32768, 32, 8, 128], true, f, h, Auto),
        ("LLM decode 4096 D64", [1, 1, 4096, 32, 8, 64], true, f, h, Auto),
        ("LLM decode 4096 D128 (prefill)", [1, 1, 4096, 32, 8, 128], true, f, h, Prefill),
        ("MHA decode 4096 D128", [1, 1, 4096, 32, 32, 128], true, f, h, Auto),
    ];
    let filter = std::env::var("DRIFT_ATTN_FILTER").ok();
    let splits: Option<usize> = std::env::var("DRIFT_ATTN_SPLITS")
        .ok()
        .and_then(|s| s.parse().ok());
    // DRIFT_ATTN_TILE=ny,tk
    let prefill_tile = std::env::var("DRIFT_ATTN_TILE").ok().map(|s| {
        let v: Vec<usize> = s.split(',').map(|x| x.parse().unwrap()).collect();
        kernel::PrefillTile { ny: v[0], tk: v[1] }
    });
    for (name, [b, lq, lkv, hq, hkv, d], causal, qt, kvt, variant) in cases {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let act = |shape: &[usize], dt| gpu.tensor(name, shape, dt, Category::Activations).unwrap();
        let q = act(&[b, lq, hq, d], qt);
        let k = act(&[b, lkv, hkv, d], kvt);
        let v = act(&[b, lkv, hkv, d], kvt);
        let o = act(&[b, lq, hq, d], qt);
        for t in [&q, &k, &v] {
            gpu.write_tensor_bytes(t, &vec![0x20; t.byte_len() as usize])
                .unwrap();
        }
        let step = act(&[2], DType::U32);
        let pos0 = if causal { lkv - lq } else { 0 };
        gpu.write_tensor_bytes(&step, bytemuck::cast_slice(&[lkv as u32, pos0 as u32]))
            .unwrap();
        let opts = AttentionOptions {
            causal,
            variant,
            splits,
            prefill_tile,
            ..Default::default()
        };
        let ds = match kernel::attention(gpu, &q, &k, &v, &o, &step, &opts) {
            Ok(ds) => ds,
            Err(e) => {
                println!("{name:34} skipped: {e}");
                continue;
            }
        };
        let reps = 20;
        let mut prog = Program::new();
        for _ in 0..reps {
            prog.extend(ds.iter().cloned());
        }
        prog.run(gpu).unwrap();
        let profile = prog.run_profiled(gpu, &mut Profiler::new()).unwrap();
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let per_kernel: Vec<f64> = (0..ds.len())
            .map(|i| {
                median(
                    profile
                        .dispatches
                        .iter()
                        .skip(i)
                        .step_by(ds.len())
                        .map(|d| d.duration_us)
                        .collect(),
                )
            })
            .collect();
        let us: f64 = per_kernel.iter().sum();
        let flops: f64 = ds.iter().map(|d| d.cost.flops).sum();
        let bytes: f64 = ds.iter().map(|d| d.cost.bytes).sum();
        let kernels: Vec<_> = ds
            .iter()
            .zip(&per_kernel)
            .map(|(d, t)| format!("{} {:?} {t:.1} us", d.name, d.workgroups))
            .collect();
        println!(
            "{name:34} {us:9.1} us {:7.2} TFLOP/s {:7.0} GB/s  [{}]",
            flops / us / 1e6,
            bytes / us / 1e3,
            kernels.join(", ")
        );
    }
}

/// The tiles the cooperative loads read must start on 16 bytes: NVIDIA's matrix loads drop the low
/// address bits, and on the H200 a tile 8 bytes off was read 4 elements early (BENCHMARKS.md,
/// 2026-12-02). `@align` is not emitted for workgroup memory, so the struct's own alignment (the
/// largest of its members' types, as naga's layouter computes it) must be 16, and so must every
/// member's offset.
#[test]
fn attention_coop_tiles_start_on_16_bytes() {
    let source = drift_engine::shader!("attention_coop.wgsl");
    for (d, subgroups, keys) in [
        (40, 4, 16),
        (40, 4, 64),
        (64, 4, 64),
        (80, 4, 16),
        (128, 4, 32),
        (40, 8, 16),
    ] {
        let config = CoopConfig {
            d,
            tile: CoopTile { subgroups, keys },
            g: 1,
            causal: false,
            coop: true,
            subgroups: true,
            vec_q: true,
            vec_kv: true,
            vec_out: true,
            out_f16: true,
            debug: Default::default(),
        };
        let src = drift_engine::kernels::preprocess(source, &config.defines()).unwrap();
        let module = naga::front::wgsl::parse_str(&src).unwrap();
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let tiles = module
            .global_variables
            .iter()
            .find(|(_, g)| g.name.as_deref() == Some("tiles"))
            .expect("a `tiles` workgroup variable")
            .1;
        assert_eq!(tiles.space, naga::AddressSpace::WorkGroup);
        let naga::TypeInner::Struct { members, .. } = &module.types[tiles.ty].inner else {
            panic!("`tiles` is not a struct");
        };
        // An alignment rounds 1 up to itself.
        let align = layouter[tiles.ty].alignment.round_up(1);
        assert!(
            align >= 16,
            "D{d} {subgroups}x{keys}: tiles aligned to {align} bytes, not 16"
        );
        for m in members {
            assert_eq!(
                m.offset % 16,
                0,
                "D{d}: member {:?} at {}",
                m.name,
                m.offset
            );
        }
    }
}
