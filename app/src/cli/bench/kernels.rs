//! The kernel cases: each at a size a real model runs it at.

use anyhow::Result;
use drift_engine::kernels::activation::{UnaryOp, unary};
use drift_engine::kernels::copy::copy;
use drift_engine::kernels::elementwise::{BinaryOp, binary};
use drift_engine::{Category, DType, Gpu, Program};

use super::Measurement;
use super::timing::measure;

/// Copy-bandwidth ceiling measured on the H200 (shared/notes/wgpu-on-h200.md), for the "% of copy" notes.
const H200_COPY_GBPS: f64 = 4100.0;

pub fn run_all(gpu: &Gpu, reps: usize, filter: Option<&str>, report: &mut dyn FnMut(Measurement)) -> Result<()> {
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let act = |shape: &[usize], dtype: DType| gpu.tensor("bench", shape, dtype, Category::Activations);
    let pct = |m: &Measurement| format!("{:.0}% of 4.1 TB/s copy", 100.0 * m.gbps / H200_COPY_GBPS);

    // Bandwidth baseline: 256 MiB copy.
    if wanted("copy") {
        let n = (64usize << 20).min(gpu.caps.max_storage_binding as usize / 4);
        let (a, b) = (act(&[n], DType::F32)?, act(&[n], DType::F32)?);
        let m = measure(gpu, &format!("copy {} MiB (vec4)", n >> 18), &[copy(gpu, &a, &b)?], reps, "")?;
        let note = pct(&m);
        report(Measurement { note, ..m });
    }
    if wanted("add") {
        let n = 16 << 20;
        let (a, b, o) = (act(&[n], DType::F16)?, act(&[n], DType::F16)?, act(&[n], DType::F16)?);
        let m = measure(gpu, "add f16 16M", &[binary(gpu, BinaryOp::Add, &a, &b, &o)?], reps, "")?;
        let note = pct(&m);
        report(Measurement { note, ..m });
    }
    if wanted("silu") {
        let n = 16 << 20;
        let (a, o) = (act(&[n], DType::F16)?, act(&[n], DType::F16)?);
        let m = measure(gpu, "silu f16 16M", &[unary(gpu, UnaryOp::Silu, &a, &o)?], reps, "")?;
        let note = pct(&m);
        report(Measurement { note, ..m });
    }
    if wanted("dispatch") {
        report(dispatch_overhead(gpu)?);
    }
    Ok(())
}

/// What a decode step pays per dispatch: 150 small dependent dispatches (a 1B model's step) encoded and
/// submitted as one program.
fn dispatch_overhead(gpu: &Gpu) -> Result<Measurement> {
    let x = gpu.tensor("x", &[4096], DType::F32, Category::Activations)?;
    let y = gpu.tensor("y", &[4096], DType::F32, Category::Activations)?;
    let mut p = Program::new();
    for i in 0..150 {
        let (a, b) = if i % 2 == 0 { (&x, &y) } else { (&y, &x) };
        p.push(unary(gpu, UnaryOp::Scale(1.0), a, b)?);
    }
    p.run(gpu)?;
    let cpu_us = p.cpu_us_per_dispatch(gpu, 50);
    let mut walls = Vec::new();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        p.run(gpu)?;
        walls.push(t.elapsed().as_secs_f64() * 1e6);
    }
    walls.sort_by(f64::total_cmp);
    let wall = walls[walls.len() / 2];
    Ok(Measurement {
        name: "150 dependent dispatches (submit+wait)".into(),
        time_us: wall,
        gbps: 0.0,
        tflops: 0.0,
        note: format!("CPU encode {cpu_us:.2} us/dispatch; wall {:.2} us/dispatch", wall / 150.0),
    })
}
