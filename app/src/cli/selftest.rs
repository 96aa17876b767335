//! `drift selftest [--json]`: every kernel variant this device selects, against CPU references.

use anyhow::{Result, bail};
use drift_engine::selftest;
use drift_engine::{Gpu, GpuOptions};

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(options: &GpuOptions, args: &SelftestArgs) -> Result<()> {
    let gpu = Gpu::new(options)?;
    let (mut rng, seed) = selftest::rng();
    let checks = selftest::run_all(&gpu, &mut rng)?;
    let failed = checks.iter().filter(|c| !c.passed).count();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "device": gpu.info.name, "seed": seed, "checks": checks, "failed": failed,
            }))?
        );
    } else {
        println!(
            "device: {} ({}), seed {seed}",
            gpu.info.name, gpu.info.backend
        );
        for c in &checks {
            println!("{c}");
        }
        println!("{} checks, {failed} failed", checks.len());
    }
    if failed > 0 {
        bail!(
            "{failed} of {} checks failed (replay with DRIFT_TEST_SEED={seed})",
            checks.len()
        );
    }
    Ok(())
}
