//! Checks of the grid-wide barrier (`kernels::grid_sync`): after every barrier each workgroup reads
//! what another one wrote before it, and the counts are reset for the next dispatch. A grid the device
//! does not run concurrently must end with the timeout flag raised, not hang; a grid it does run must
//! give every value exactly.

use super::{Check, Rng, u32s};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::grid_sync::{Probe, take_timeout};

/// Runs the probe (poisoned output) and compares; `Ok(None)` when the grid timed out.
fn run_probe(gpu: &Gpu, probe: &Probe) -> Result<Option<Vec<u32>>> {
    gpu.poison(&probe.data)?;
    let mut p = Program::new();
    p.push(probe.dispatch.clone());
    p.run(gpu)?;
    if std::env::var_os("DRIFT_GRID_DEBUG").is_some() {
        eprintln!("sync after run: {:?}", u32s(&gpu.read_bytes(&probe.sync)?));
    }
    if take_timeout(gpu, &probe.sync)? {
        return Ok(None);
    }
    Ok(Some(u32s(&gpu.read_bytes(&probe.data)?)))
}

pub fn checks(gpu: &Gpu, _rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    // One workgroup always runs concurrently with itself; the wider grids only where the device runs
    // them so (a timeout there is a capability this device lacks, reported, not a wrong result).
    for n_wg in [1u32, 2, 4, 132, 264] {
        for n_sync in [0u32, 1, 9] {
            let probe = Probe::new(gpu, n_wg, n_sync)?;
            let want = probe.expected();
            let name = format!("grid_sync {n_wg} workgroups x {n_sync} barriers");
            // Twice: the second run also checks that the first left the counts at zero.
            for run in 0..2 {
                let check = match run_probe(gpu, &probe)? {
                    Some(got) => {
                        let wrong = got.iter().zip(&want).position(|(g, w)| g != w);
                        Check {
                            name: format!("{name} (run {run})"),
                            passed: wrong.is_none() && got.len() == want.len(),
                            worst_ratio: if wrong.is_none() { 0.0 } else { f64::INFINITY },
                            max_abs_err: 0.0,
                            atol: 0.0,
                            rtol: 0.0,
                            detail: wrong
                                .map(|i| format!("index {i}: got {}, want {}", got[i], want[i]))
                                .unwrap_or_default(),
                        }
                    }
                    None => Check {
                        name: format!("{name} (run {run})"),
                        passed: n_wg > 1,
                        worst_ratio: 0.0,
                        max_abs_err: 0.0,
                        atol: 0.0,
                        rtol: 0.0,
                        detail: "timed out: the grid did not run concurrently".into(),
                    },
                };
                out.push(check);
            }
        }
    }
    Ok(out)
}
