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

/// An uninitialised (zeroed) tensor for timing.
pub fn t(gpu: &Gpu, shape: &[usize], dtype: DType) -> Tensor {
    gpu.tensor("bench", shape, dtype, Category::Activations)
        .expect("bench tensor")
}

/// Times `make`'s dispatches (built `reps` times into one program, profiled with GPU timestamps)
/// and prints the median time per kernel with its GB/s from the builders' byte counts.
pub fn bench(label: &str, reps: usize, make: impl Fn() -> Result<Vec<Dispatch>>) {
    let gpu = gpu();
    let mut prog = Program::new();
    for _ in 0..reps {
        prog.extend(make().unwrap_or_else(|e| panic!("{label}: {e}")));
    }
    let per = prog.len() / reps;
    let mut profiler = Profiler::new();
    prog.run_profiled(gpu, &mut profiler).expect("warm-up");
    let profile = prog.run_profiled(gpu, &mut profiler).expect("profile");
    let mut line = format!("{label:<48}");
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

/// Kernel timings on the device (run on the H200 with `--ignored --nocapture`).
#[test]
#[ignore]
fn norm_bench() {
    let g = gpu();
    let eps = 1e-5;
    let mut variants = vec![RowVariant::Workgroup];
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
