use crate::common::run_checks;
use drift_engine::selftest::qkv_rope;

#[test]
fn qkv_split_and_rope_epilogue_match_reference() {
    run_checks(qkv_rope::checks);
}

/// What the RoPE epilogue cannot take is an error, not a panic or a silent misread.
#[test]
fn rope_epilogue_refuses_what_it_cannot_take() {
    use drift_engine::kernels::matvec::{MatvecOptions, matvec};
    use drift_engine::kernels::qkv_rope::{QkvTargets, RopePairs};
    use drift_engine::kernels::quant::{QuantTuning, matvec_quant_tuned};
    use drift_engine::{Category, DType, Layout};
    let gpu = crate::common::gpu();
    let t = |shape: &[usize], dtype| {
        gpu.tensor("t", shape, dtype, Category::Activations)
            .unwrap()
    };
    let f32t = |shape: &[usize]| t(shape, DType::F32);
    // 2 q heads + 2 x 1 kv heads of 8: 32 projection rows.
    let (k_cache, v_cache, turns) = (f32t(&[4, 1, 8]), f32t(&[4, 1, 8]), f32t(&[4, 2]));
    let step = t(&[2], DType::U32);
    let to = QkvTargets {
        k_cache: &k_cache,
        v_cache: &v_cache,
        step: &step,
        turns: &turns,
        hq: 2,
        hkv: 1,
        pairs: RopePairs::HalfSplit,
    };
    let rope = MatvecOptions {
        rope: Some(to),
        ..Default::default()
    };
    let (w, x, q) = (f32t(&[32, 64]), f32t(&[1, 64]), f32t(&[1, 2, 8]));
    let bias = f32t(&[32]);
    let cases = [
        (
            f32t(&[32, 64]),
            f32t(&[2, 64]),
            f32t(&[2, 2, 8]),
            rope,
            "one activation row",
        ),
        (
            f32t(&[32, 64]),
            x.clone(),
            q.clone(),
            MatvecOptions {
                bias: Some(&bias),
                ..rope
            },
            "no bias",
        ),
        (
            f32t(&[32, 64]),
            x.clone(),
            f32t(&[1, 3, 8]),
            rope,
            "heads of 8",
        ),
    ];
    for (w, x, q, opts, want) in cases {
        let e = matvec(gpu, &w, &x, &q, &opts).err();
        let e = e.unwrap_or_else(|| panic!("{want}: built")).to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    // Heads of 4: 1 + 2 x 1 heads are 12 rows, not whole 8-row workgroups.
    let (k4, v4, turns4) = (f32t(&[4, 1, 4]), f32t(&[4, 1, 4]), f32t(&[2, 2]));
    let small = MatvecOptions {
        rope: Some(QkvTargets {
            k_cache: &k4,
            v_cache: &v4,
            turns: &turns4,
            hq: 1,
            ..to
        }),
        ..rope
    };
    let e = matvec(gpu, &f32t(&[12, 64]), &x, &f32t(&[1, 1, 4]), &small).err();
    assert!(e.is_some_and(|e| e.to_string().contains("multiple of 8")));
    // Quantized weights need the integer-dot-product kernel.
    let blocks = vec![0u8; 32 * 2 * 18];
    let wq = gpu
        .tensor_from_bytes(
            "w",
            &[32, 64],
            DType::Q4_0,
            Layout::Blocks,
            &blocks,
            Category::Weights,
        )
        .unwrap();
    let float_kernel = QuantTuning {
        dp4a: false,
        ..QuantTuning::default()
    };
    let e = matvec_quant_tuned(gpu, &wq, &x, &q, &rope, float_kernel)
        .unwrap_err()
        .to_string();
    assert!(e.contains("integer-dot-product"), "{e}");
    // The valid shape builds.
    matvec(gpu, &w, &x, &q, &rope).unwrap();
}
