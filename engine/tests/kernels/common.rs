use std::sync::OnceLock;

use drift_engine::selftest::{self, Check, Rng};
use drift_engine::{Gpu, GpuOptions, Result};

/// One device for the whole test binary.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let gpu = Gpu::new(&GpuOptions::from_env()).expect("a Vulkan device (lavapipe in CI)");
        eprintln!("device: {} ({:?})", gpu.info.name, gpu.info.backend);
        gpu
    })
}

/// Runs `f` with a fresh seeded RNG and asserts every check passed, printing the seed to replay.
pub fn run_checks(f: impl FnOnce(&Gpu, &mut Rng) -> Result<Vec<Check>>) {
    let (mut rng, seed) = selftest::rng();
    let checks =
        f(gpu(), &mut rng).unwrap_or_else(|e| panic!("error (DRIFT_TEST_SEED={seed}): {e}"));
    assert!(!checks.is_empty(), "no checks ran");
    for c in &checks {
        println!("{c}");
    }
    let failed: Vec<_> = checks.iter().filter(|c| !c.passed).collect();
    assert!(
        failed.is_empty(),
        "{} of {} checks failed (replay with DRIFT_TEST_SEED={seed}): {}",
        failed.len(),
        checks.len(),
        failed
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
