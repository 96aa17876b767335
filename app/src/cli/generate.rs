//! `drift generate`: one completion, streamed to stdout (or one JSON object with `--json`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use drift_engine::generate::GenerateOptions;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};

#[derive(clap::Args, Clone)]
pub struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_window: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Context length (tokens held in the KV cache).
    #[arg(long)]
    pub context: Option<usize>,
    /// Quantise a safetensors model's weights on load: q8_0, q4_0 or mixed-8-4.
    #[arg(long, default_value = "none")]
    pub quant: String,
}

impl SamplingArgs {
    pub fn options(&self) -> GenerateOptions {
        GenerateOptions {
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_window: self.repeat_window,
                seed: self.seed,
            },
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
        }
    }
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long)]
    system: Option<String>,
    /// Use the prompt as is, without the model's chat template.
    #[arg(long)]
    raw: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(options: &GpuOptions, args: &GenerateArgs) -> Result<()> {
    let gpu = Gpu::new(options)?;
    let quant = QuantScheme::parse(&args.sampling.quant)?;
    let mut session = open_llm(&gpu, &args.model, args.sampling.context, quant)?;
    let text = if args.raw {
        args.prompt.clone()
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &args.prompt));
        session.render(&msgs)?
    };
    // Chat templates carry their own BOS; raw prompts get the tokenizer's special-token handling.
    let prompt = session.tokenizer.encode(&text, args.raw)?;
    let cancel = AtomicBool::new(false);
    let json = args.json;
    let g = session.generate(
        &gpu,
        &prompt,
        &args.sampling.options(),
        &cancel,
        &mut |piece| {
            if !json {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
        },
    )?;
    if json {
        println!("{}", serde_json::to_string_pretty(&g)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated; prefill {:.1} tok/s, decode {:.1} tok/s; stop: {:?}]",
            g.prompt_tokens,
            g.tokens.len(),
            g.prefill_tokens_per_s,
            g.decode_tokens_per_s,
            g.stop_reason
        );
    }
    Ok(())
}
