use crate::common::run_checks;
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
