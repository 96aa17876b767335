//! `drift`: the desktop app when run with no subcommand, a CLI otherwise.

mod cli;
mod gui;
mod hub;
mod paths;
mod remote;
mod serve;
mod settings;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "drift",
    version,
    about = "Local generative AI on the GPU you already own"
)]
struct Args {
    /// GPU backend for CLI commands (vulkan, metal, dx12, gl); default: the best available.
    #[arg(long, global = true)]
    backend: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Show the GPU adapter, the features Drift uses and the limits it relies on.
    Info(cli::info::InfoArgs),
    /// Check every kernel variant this device selects against CPU references.
    Selftest(cli::selftest::SelftestArgs),
    /// Measure speed.
    Bench(cli::bench::BenchArgs),
    /// Generate one completion.
    Generate(cli::generate::GenerateArgs),
    /// Chat in the terminal.
    Chat(cli::chat::ChatArgs),
    /// Make an image with Stable Diffusion.
    Image(cli::image::ImageArgs),
    /// Find, download, list and delete models.
    Models(cli::models::ModelsArgs),
    /// Serve the models over an OpenAI-compatible HTTP API.
    Serve(cli::serve::ServeArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    let options = drift_engine::GpuOptions {
        backends: args.backend.as_deref().map(wgpu::Backends::from_comma_list),
        ..drift_engine::GpuOptions::from_env()
    };
    let result = match args.command {
        None => gui::run(),
        Some(Command::Info(a)) => cli::info::run(&options, &a),
        Some(Command::Selftest(a)) => cli::selftest::run(&options, &a),
        Some(Command::Bench(a)) => cli::bench::run(&options, &a),
        Some(Command::Generate(a)) => cli::generate::run(&options, &a),
        Some(Command::Chat(a)) => cli::chat::run(&options, &a),
        Some(Command::Image(a)) => cli::image::run(&options, &a),
        Some(Command::Models(a)) => cli::models::run(&a),
        Some(Command::Serve(a)) => cli::serve::run(&options, &a),
    };
    if let Err(e) = result {
        eprintln!("drift: {e:#}");
        std::process::exit(1);
    }
}
