//! `drift bench kernels [--json]`

use anyhow::Result;
use drift_engine::GpuOptions;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// What to measure: `kernels`.
    what: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(_options: &GpuOptions, args: &BenchArgs) -> Result<()> {
    anyhow::bail!("unknown benchmark '{}' (json: {})", args.what, args.json)
}
