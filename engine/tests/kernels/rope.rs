use crate::common::run_checks;
use drift_engine::selftest::rope;

#[test]
fn rope_matches_reference() {
    run_checks(rope::checks);
}

/// Kernel timings on the device (run on the H200 with `--ignored --nocapture`).
#[test]
#[ignore]
fn rope_bench() {
    use crate::common::gpu;
    use crate::norm::{bench, t, t_rand};
    use drift_engine::DType;
    use drift_engine::kernels::rope::{RopeOptions, RopeStyle, rope};
    let g = gpu();
    for (tokens, heads, hd, dt, inplace) in [
        (1, 32, 128, DType::F32, true),
        (512, 32, 128, DType::F32, true),
        (512, 8, 128, DType::F16, false),
        (4096, 32, 128, DType::F16, true),
    ] {
        let x = t(g, &[tokens, heads, hd], dt);
        let o = if inplace {
            x.clone()
        } else {
            t(g, &[tokens, heads, hd], dt)
        };
        let pos = t_rand(g, &[tokens], DType::U32, 32768);
        for style in [RopeStyle::HalfSplit, RopeStyle::Interleaved] {
            let opts = RopeOptions::new(500000.0, style, hd);
            bench(
                &format!("rope [{tokens}, {heads}, {hd}] {dt:?} {style:?} in place {inplace}"),
                20,
                || Ok(vec![rope(g, &x, &pos, &o, &opts)?]),
            );
        }
    }
}
