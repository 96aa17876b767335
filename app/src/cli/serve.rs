//! `drift serve`: the OpenAI-compatible local server (see `crate::serve`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use drift_engine::{Gpu, GpuOptions};

use crate::gui::gpu_queue::GpuQueue;
use crate::serve::{Server, ServerConfig};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on; anything other than loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Clients must send 'Authorization: Bearer KEY'.
    #[arg(long)]
    api_key: Option<String>,
    /// A chat model (Hugging Face folder or .gguf file), repeatable; its id is the folder or file name.
    #[arg(long = "model", value_name = "PATH", num_args = 1..)]
    models: Vec<PathBuf>,
    /// A Stable Diffusion 1.x model (diffusers folder or single-file .safetensors).
    #[arg(long, value_name = "PATH")]
    image_model: Option<PathBuf>,
    /// Context length (tokens in the KV cache) for chat models.
    #[arg(long)]
    context: Option<usize>,
    /// Requests handled at once (generations still take turns on the GPU).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Seconds a connection may make no progress (a slow request, a stream nobody reads).
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    /// Largest request body in KiB.
    #[arg(long, default_value_t = 1024)]
    max_body_kib: usize,
}

pub fn run(options: &GpuOptions, args: &ServeArgs) -> Result<()> {
    let config = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        models: args.models.clone(),
        image_model: args.image_model.clone(),
        context: args.context,
        threads: args.threads,
        max_body_bytes: args.max_body_kib.saturating_mul(1024),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        access_log: true,
    };
    // Refuse a bad address, key or model path before the GPU takes its time to open.
    config.validate()?;
    let gpu = Arc::new(Gpu::new(options)?);
    let server = Server::start(config, gpu, GpuQueue::default())?;
    println!("drift serve: listening on http://{}/v1", server.addr());
    std::io::stdout().flush()?;
    server.wait();
    Ok(())
}
