//! `drift selftest [--json]`: every kernel variant this device selects, against CPU references.

use anyhow::{Result, bail};
use drift_engine::selftest;
use drift_engine::{Gpu, GpuOptions};

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
    /// Run one family of checks only (elementwise, matmul, matvec, softmax, norm, rope, qkv_rope,
    /// attention, conv, embedding, layout, quant, sample, grid_sync).
    #[arg(long, value_name = "FAMILY")]
    only: Option<String>,
}

pub fn run(options: &GpuOptions, args: &SelftestArgs) -> Result<()> {
    if let Some(f) = &args.only
        && !selftest::FAMILIES.contains(&f.as_str())
    {
        bail!(
            "unknown check family '{f}' (one of: {})",
            selftest::FAMILIES.join(", ")
        );
    }
    let gpu = Gpu::new(options)?;
    let (mut rng, seed) = selftest::rng();
    let checks = selftest::run_families(&gpu, &mut rng, args.only.as_deref())?;
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
