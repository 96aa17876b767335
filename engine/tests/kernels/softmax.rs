use crate::common::run_checks;
use drift_engine::selftest::softmax;

#[test]
fn softmax_matches_reference() {
    run_checks(softmax::checks);
}

/// Kernel timings on the device (run on the H200 with `--ignored --nocapture`).
#[test]
#[ignore]
fn softmax_bench() {
    use crate::common::gpu;
    use crate::norm::{bench, t};
    use drift_engine::DType;
    use drift_engine::kernels::softmax::{RowVariant, SoftmaxOptions, softmax};
    let g = gpu();
    let mut variants = vec![RowVariant::Auto, RowVariant::Workgroup];
    if g.caps.subgroup {
        variants.extend([RowVariant::WorkgroupSubgroup, RowVariant::Subgroup]);
    }
    for (rows, n, dt, causal) in [
        (1, 128256, DType::F32, None),
        (32 * 512, 512, DType::F32, Some((512, 0))),
        (16 * 4096, 4096, DType::F16, None),
        (16 * 4096, 77, DType::F16, None),
        (32, 4096, DType::F32, Some((1, 4095))),
    ] {
        let (x, o) = (t(g, &[rows, n], dt), t(g, &[rows, n], dt));
        for &variant in &variants {
            let opts = SoftmaxOptions {
                scale: 0.125,
                causal,
                variant,
            };
            bench(
                &format!("softmax [{rows}, {n}] {dt:?} causal {causal:?} {variant:?}"),
                10,
                || Ok(vec![softmax(g, &x, &o, &opts)?]),
            );
        }
    }
}
