use crate::common::{gpu, run_checks};
use drift_engine::exec::{Dispatch, Program};
use drift_engine::kernels::norm::{GroupNormOptions, add_rmsnorm, groupnorm, layernorm, rmsnorm};
use drift_engine::kernels::softmax::RowVariant;
use drift_engine::profiler::Profiler;
use drift_engine::selftest::norm;
use drift_engine::{Category, DType, Gpu, Result, Tensor};

#[test]
fn norm_matches_reference() {
    run_checks(norm::checks);
}

/// A tensor of pseudo-random values for timing (never zeros, which can time faster than real data):
/// floats in [-2, 2), u32 below `u32_below` (ids, positions).
pub fn t_rand(gpu: &Gpu, shape: &[usize], dtype: DType, u32_below: u32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut state = 0x9E3779B97F4A7C15u64 ^ n as u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as u32
    };
    if dtype == DType::U32 {
        let v: Vec<u8> = (0..n)
            .flat_map(|_| (next() % u32_below).to_le_bytes())
            .collect();
        return gpu
            .tensor_from_bytes(
                "bench",
                shape,
                dtype,
                drift_engine::Layout::RowMajor,
                &v,
                Category::Activations,
            )
            .expect("bench tensor");
    }
    let v: Vec<f32> = (0..n)
        .map(|_| next() as f32 / (1u32 << 22) as f32 - 2.0)
        .collect();
    gpu.tensor_from_f32("bench", shape, dtype, &v, Category::Activations)
        .expect("bench tensor")
}

/// A random float tensor for timing.
pub fn t(gpu: &Gpu, shape: &[usize], dtype: DType) -> Tensor {
    t_rand(gpu, shape, dtype, 1)
}

/// Times `make`'s dispatches built `reps` times into one program, after 250 ms of it as warm-up: the
/// median GPU time per kernel
/// from timestamps, and the wall time of the whole program per repetition (which includes the
/// barrier between dependent dispatches), with GB/s from the builders' byte counts.
pub fn bench(label: &str, reps: usize, make: impl Fn() -> Result<Vec<Dispatch>>) {
    let gpu = gpu();
    let mut prog = Program::new();
    for _ in 0..reps {
        prog.extend(make().unwrap_or_else(|e| panic!("{label}: {e}")));
    }
    let per = prog.len() / reps;
    let mut profiler = Profiler::new();
    // Sustained work first: short bursts leave the GPU at idle clocks and time several times slower.
    let warm = std::time::Instant::now();
    while warm.elapsed().as_millis() < 250 {
        prog.run(gpu).expect("warm-up");
    }
    let profile = prog.run_profiled(gpu, &mut profiler).expect("profile");
    let mut walls: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            prog.run(gpu).expect("run");
            t.elapsed().as_secs_f64() * 1e6 / reps as f64
        })
        .collect();
    walls.sort_by(f64::total_cmp);
    let bytes: f64 = prog.dispatches[..per].iter().map(|d| d.cost.bytes).sum();
    let mut line = format!(
        "{label:<56} wall {:7.1} us {:5.0} GB/s",
        walls[2],
        bytes / walls[2] / 1e3
    );
    for k in 0..per {
        let mut us: Vec<f64> = profile
            .dispatches
            .iter()
            .skip(k)
            .step_by(per)
            .map(|d| d.duration_us)
            .collect();
        us.sort_by(f64::total_cmp);
        let med = us[us.len() / 2];
        let d = &prog.dispatches[k];
        line += &format!(
            " | {} {:.1} us {:.0} GB/s",
            d.name,
            med,
            d.cost.bytes / med / 1e3
        );
    }
    println!("{line}");
}

/// A plain elementwise kernel of the same traffic, for calibration.
#[test]
#[ignore]
fn norm_bench_calibrate() {
    use drift_engine::kernels::activation::{UnaryOp, unary};
    let g = gpu();
    for (shape, dt) in [
        (vec![1, 4096], DType::F32),
        (vec![512, 4096], DType::F16),
        (vec![4096, 8192], DType::F16),
        (vec![4096, 8192], DType::F32),
    ] {
        let (x, o) = (t(g, &shape, dt), t(g, &shape, dt));
        bench(&format!("calibrate: scale {shape:?} {dt:?}"), 20, || {
            Ok(vec![unary(g, UnaryOp::Scale(0.5), &x, &o)?])
        });
    }
}

/// Kernel timings on the device (run on the H200 with `--ignored --nocapture`).
#[test]
#[ignore]
fn norm_bench() {
    let g = gpu();
    let eps = 1e-5;
    let mut variants = vec![RowVariant::Auto, RowVariant::Workgroup];
    if g.caps.subgroup {
        variants.extend([RowVariant::WorkgroupSubgroup, RowVariant::Subgroup]);
    }
    for (rows, n, dt) in [
        (1, 4096, DType::F32),
        (512, 4096, DType::F32),
        (512, 4096, DType::F16),
        (32768, 128, DType::F16),
        (4096, 8192, DType::F16),
    ] {
        let (x, w, o) = (t(g, &[rows, n], dt), t(g, &[n], dt), t(g, &[rows, n], dt));
        for &v in &variants {
            bench(&format!("rmsnorm [{rows}, {n}] {dt:?} {v:?}"), 20, || {
                Ok(vec![rmsnorm(g, &x, &w, &o, eps, v)?])
            });
        }
        let r = t(g, &[rows, n], dt);
        bench(
            &format!("add_rmsnorm [{rows}, {n}] {dt:?} auto, sum in place"),
            20,
            || {
                Ok(vec![add_rmsnorm(
                    g,
                    &x,
                    &r,
                    &w,
                    &x,
                    &o,
                    eps,
                    RowVariant::Auto,
                )?])
            },
        );
    }
    for (rows, n, dt) in [
        (8192, 320, DType::F16),
        (154, 768, DType::F32),
        (8192, 1280, DType::F16),
    ] {
        let (x, w, o) = (t(g, &[rows, n], dt), t(g, &[n], dt), t(g, &[rows, n], dt));
        for &v in &variants {
            bench(&format!("layernorm [{rows}, {n}] {dt:?} {v:?}"), 20, || {
                Ok(vec![layernorm(g, &x, Some(&w), Some(&w), &o, eps, v)?])
            });
        }
    }
    for (shape, dt) in [
        ([2, 320, 64, 64], DType::F16),
        ([2, 1280, 8, 8], DType::F16),
        ([1, 128, 512, 512], DType::F16),
        ([1, 512, 128, 128], DType::F32),
    ] {
        let (x, o) = (t(g, &shape, dt), t(g, &shape, dt));
        let gb = t(g, &[shape[1]], DType::F32);
        bench(&format!("groupnorm+silu {shape:?} {dt:?}"), 10, || {
            groupnorm(g, &x, &gb, &gb, &o, &GroupNormOptions::new(32, eps, true))
        });
    }
}
