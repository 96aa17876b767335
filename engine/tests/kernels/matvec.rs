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

/// Experimental matvec variants for the target GPU (bench only): where the time goes.
const PROBE: &str = r#"
struct Params {
    off_w: u32, off_x: u32, off_out: u32, off_bias: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    rows: u32, k: u32, ldo: u32, row0: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn fma_chunk(wv: vec4<u32>, c: u32, acc: vec4<f32>) -> vec4<f32> {
#if NOX
    let x0 = vec4<f32>(1.0) + xs[0] * 0.0;
    let x1 = x0;
#else
    let x0 = xs[p.off_x / 4u + 2u * c];
    let x1 = xs[p.off_x / 4u + 2u * c + 1u];
#endif
    let w0 = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
    let w1 = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));
    return fma(w0, x0, fma(w1, x1, acc));
}

@compute @workgroup_size(256)
fn lean(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let row = (wid.x + wid.y * nwg.x) * 8u + sg;
    if row >= p.rows {
        return;
    }
    let wrow = (p.off_w + row * p.k) / 8u;
    let nc = p.k / 8u;
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var c = lane;
    for (; c + 32u < nc; c += 64u) {
        let w0 = w[wrow + c];
        let w1 = w[wrow + c + 32u];
        s0 = fma_chunk(w0, c, s0);
        s1 = fma_chunk(w1, c + 32u, s1);
    }
    if c < nc {
        s0 = fma_chunk(w[wrow + c], c, s0);
    }
    let t = subgroupAdd(dot(s0 + s1, vec4<f32>(1.0)));
    if lane == 0u {
        out[p.off_out + row] = t;
    }
}
"#;

#[test]
#[ignore]
fn bench_matvec_probe() {
    use crate::matmul::{fill, time_us};
    use drift_engine::exec::Cost;
    use drift_engine::kernels::{KernelSpec, grid};
    use drift_engine::{Category, DType};
    let gpu = crate::common::gpu();
    if !gpu.caps.subgroup || gpu.info.device_type == wgpu::DeviceType::Cpu {
        return;
    }
    for (n, k) in [(4096usize, 4096usize), (8192, 8192)] {
        let copies = (512usize << 20).div_ceil(n * k * 2).clamp(2, 16);
        let ws: Vec<_> = (0..copies)
            .map(|i| {
                let w = gpu
                    .tensor("w", &[n, k], DType::F16, Category::Weights)
                    .unwrap();
                fill(gpu, &w, i as u64);
                w
            })
            .collect();
        let x = gpu
            .tensor("x", &[1, k], DType::F32, Category::Activations)
            .unwrap();
        fill(gpu, &x, 99);
        let o = gpu
            .tensor("o", &[1, n], DType::F32, Category::Activations)
            .unwrap();
        for nox in [false, true] {
            let spec = KernelSpec::new(format!("probe_lean_nox{nox}"), PROBE, "lean")
                .define("NOX", u8::from(nox));
            let kernel = gpu.kernel(&spec).unwrap();
            let bytes = (n * k * 2) as f64;
            let ds: Vec<_> = ws
                .iter()
                .map(|w| {
                    let params = [n as u32, k as u32, n as u32, 0];
                    let cost = Cost { flops: 0.0, bytes };
                    let groups = grid(n.div_ceil(8) as u32, 65535);
                    gpu.dispatch(&kernel, &params, &[w, &x, &o], groups, cost)
                        .unwrap()
                })
                .collect();
            let us = time_us(gpu, ds);
            println!(
                "BENCH probe lean nox={nox} [{n}, {k}]: {us:.1} us, {:.0} GB/s",
                bytes / us / 1e3
            );
        }
        // The same weights through one dispatch each with no rotation (L2-resident when it fits).
        let ds: Vec<_> = (0..8)
            .flat_map(|_| {
                drift_engine::kernels::matvec::matvec(gpu, &ws[0], &x, &o, &Default::default())
                    .unwrap()
            })
            .collect();
        let us = time_us(gpu, ds);
        println!(
            "BENCH matvec same-weight [{n}, {k}]: {us:.1} us, {:.0} GB/s",
            (n * k * 2) as f64 / us / 1e3
        );
    }
}
