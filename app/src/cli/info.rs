//! `drift info [--json]`

use anyhow::Result;
use drift_engine::{Gpu, GpuOptions};

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(options: &GpuOptions, args: &InfoArgs) -> Result<()> {
    let gpu = Gpu::new(options)?;
    let d = gpu.describe();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    println!("adapter:      {}", d.name);
    println!("backend:      {}", d.backend);
    println!("driver:       {} {}", d.driver, d.driver_info);
    println!("device type:  {}", d.device_type);
    println!("features:");
    for f in &d.features {
        println!("  {:<34} {}", f.name, if f.present { "yes" } else { "no" });
    }
    let c = &d.caps;
    println!("kernel paths:");
    println!("  f16 storage/arithmetic            {}", yes(c.f16));
    println!(
        "  subgroup reductions               {}",
        if c.subgroup {
            format!(
                "yes (size {}..{})",
                c.subgroup_min_size, c.subgroup_max_size
            )
        } else {
            "no".into()
        }
    );
    println!(
        "  cooperative matrix 16x16 f16/f32  {}",
        yes(c.coop_16x16_f16_f32)
    );
    println!(
        "  GPU timestamps                    {}",
        if c.timestamps_inside_passes {
            "inside passes"
        } else if c.timestamps {
            "per pass"
        } else {
            "no (CPU timing)"
        }
    );
    println!("limits:");
    println!(
        "  max buffer size                   {}",
        mib(c.max_buffer_size)
    );
    println!(
        "  max storage binding               {}",
        mib(c.max_storage_binding)
    );
    println!(
        "  storage buffers per stage         {}",
        c.max_storage_buffers_per_stage
    );
    println!(
        "  workgroup memory                  {} KiB",
        c.max_workgroup_storage / 1024
    );
    println!(
        "  invocations per workgroup         {}",
        c.max_invocations_per_workgroup
    );
    println!(
        "  workgroups per dimension          {}",
        c.max_workgroups_per_dimension
    );
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
}
