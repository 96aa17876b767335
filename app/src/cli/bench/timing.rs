//! Timing a dispatch sequence: repeat it in one program, take per-dispatch GPU timestamps, report the
//! median (robust to the first, cold repetition and to clock noise).

use anyhow::Result;
use drift_engine::exec::{Cost, Dispatch};
use drift_engine::profiler::Profiler;
use drift_engine::{Gpu, Program};

use super::Measurement;

/// Median GPU microseconds of one pass through `dispatches` (run `reps` times back to back).
pub fn time_sequence(gpu: &Gpu, dispatches: &[Dispatch], reps: usize) -> Result<f64> {
    let mut program = Program::new();
    for _ in 0..reps.max(1) {
        program.extend(dispatches.iter().cloned());
    }
    // Warm-up: pipelines, caches, and GPU clocks (short bursts on an idle GPU time it unramped).
    let warm = std::time::Instant::now();
    program.run(gpu)?;
    while warm.elapsed() < std::time::Duration::from_millis(300) {
        program.run(gpu)?;
    }
    let profile = program.run_profiled(gpu, &mut Profiler::new())?;
    let n = dispatches.len();
    let mut per_rep: Vec<f64> = profile
        .dispatches
        .chunks(n)
        .map(|c| c.iter().map(|d| d.duration_us).sum())
        .collect();
    per_rep.sort_by(f64::total_cmp);
    Ok(per_rep[per_rep.len() / 2])
}

/// Times `dispatches` and turns their cost into GB/s and TFLOP/s.
pub fn measure(
    gpu: &Gpu,
    name: &str,
    dispatches: &[Dispatch],
    reps: usize,
    note: &str,
) -> Result<Measurement> {
    let us = time_sequence(gpu, dispatches, reps)?;
    let cost = dispatches.iter().fold(Cost::default(), |a, d| Cost {
        flops: a.flops + d.cost.flops,
        bytes: a.bytes + d.cost.bytes,
    });
    Ok(Measurement {
        name: name.to_string(),
        time_us: us,
        gbps: cost.bytes / us / 1e3,
        tflops: cost.flops / us / 1e6,
        note: note.to_string(),
    })
}
