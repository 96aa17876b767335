//! `drift generate`: one completion, streamed to stdout (or one JSON object with `--json`), from the
//! local engine or, with `--remote URL`, from an OpenAI-compatible server.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, anyhow, bail};
use drift_engine::generate::GenerateOptions;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};

use crate::remote::{Prompt, RemoteClient, Sampling, StreamedReply};

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

    /// What a remote server is sent: the OpenAI API's sampling fields (top-k, min-p and the repetition
    /// penalty are not part of it).
    pub fn remote(&self) -> Sampling {
        Sampling {
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
            max_tokens: Some(self.max_tokens),
            seed: Some(self.seed),
            stop: self.stop.clone(),
        }
    }
}

/// `--remote`: an OpenAI-compatible server (vLLM, Ollama, llama.cpp's server, LM Studio, `drift serve`)
/// instead of the local engine.
#[derive(clap::Args, Clone)]
pub struct RemoteArgs {
    /// Use the OpenAI-compatible server at this base URL (with or without /v1) instead of the local
    /// engine; --model is then one of the server's model names. Sent: temperature, top-p, max tokens,
    /// seed and stop strings.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// The server's API key (default: the DRIFT_API_KEY environment variable).
    #[arg(long, value_name = "KEY", requires = "remote")]
    pub api_key: Option<String>,
    /// List the server's models and exit.
    #[arg(long, requires = "remote")]
    pub list_models: bool,
}

impl RemoteArgs {
    /// The client for `--remote`, or `None` for the local engine.
    pub fn client(&self) -> Result<Option<RemoteClient>> {
        let Some(url) = &self.remote else {
            return Ok(None);
        };
        let key = self
            .api_key
            .clone()
            .or_else(|| std::env::var("DRIFT_API_KEY").ok());
        Ok(Some(RemoteClient::new(url, key.as_deref())?))
    }
}

/// Prints the server's model ids, one a line.
pub fn print_models(client: &RemoteClient) -> Result<()> {
    for m in client.list_models()? {
        println!("{}", m.id);
    }
    Ok(())
}

/// `--model` as given, else the server's only model.
pub fn remote_model(client: &RemoteClient, model: Option<&str>) -> Result<String> {
    if let Some(m) = model {
        return Ok(m.to_string());
    }
    let models = client.list_models()?;
    match models.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => bail!("the server at {} lists no models", client.base()),
        many => bail!(
            "the server at {} serves {} models; choose one with --model: {}",
            client.base(),
            many.len(),
            many.iter()
                .map(|m| m.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// "[12 prompt tokens, 30 generated; prefill 240.0 tok/s, decode 41.2 tok/s; stop: stop]" for a
/// remote reply (speeds as seen from here).
pub fn remote_summary(reply: &StreamedReply) -> String {
    let s = reply.speeds();
    format!(
        "[{} prompt tokens, {} generated; prefill {:.1} tok/s, decode {:.1} tok/s; stop: {}]",
        s.prompt_tokens,
        s.completion_tokens,
        s.prompt_tokens_per_s,
        s.completion_tokens_per_s,
        reply.finish.name()
    )
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file; with
    /// --remote, the server's model name (optional when it serves only one).
    #[arg(long, required_unless_present = "remote")]
    model: Option<String>,
    #[arg(long, required_unless_present = "list_models")]
    prompt: Option<String>,
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
    #[command(flatten)]
    remote: RemoteArgs,
}

impl GenerateArgs {
    fn messages(&self, prompt: &str) -> Vec<Message> {
        let mut msgs = Vec::new();
        if let Some(s) = &self.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", prompt));
        msgs
    }
}

pub fn run(options: &GpuOptions, args: &GenerateArgs) -> Result<()> {
    if let Some(client) = args.remote.client()? {
        return run_remote(&client, args);
    }
    let (Some(model), Some(prompt)) = (&args.model, &args.prompt) else {
        bail!("--model and --prompt are needed");
    };
    let gpu = Gpu::new(options)?;
    let quant = QuantScheme::parse(&args.sampling.quant)?;
    let mut session = open_llm(&gpu, &PathBuf::from(model), args.sampling.context, quant)?;
    let text = if args.raw {
        prompt.clone()
    } else {
        session.render(&args.messages(prompt))?
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

/// The completion from a server: the chat endpoint (the server applies the model's template), or the
/// completions endpoint for `--raw`. A reply cut short keeps the text printed so far (and in the JSON).
fn run_remote(client: &RemoteClient, args: &GenerateArgs) -> Result<()> {
    if args.remote.list_models {
        return print_models(client);
    }
    let prompt = args
        .prompt
        .as_deref()
        .ok_or_else(|| anyhow!("--prompt is needed"))?;
    let model = remote_model(client, args.model.as_deref())?;
    let messages = args.messages(prompt);
    let request = if args.raw {
        Prompt::Raw(prompt)
    } else {
        Prompt::Chat(&messages)
    };
    let json = args.json;
    let mut partial = String::new();
    let result = client.stream(
        &model,
        request,
        &args.sampling.remote(),
        &AtomicBool::new(false),
        &mut |piece| {
            partial.push_str(piece);
            if !json {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
        },
    );
    match result {
        Ok(reply) if json => {
            let s = reply.speeds();
            let out = serde_json::json!({
                "text": reply.text,
                "model": model,
                "server": client.base(),
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "prefill_tokens_per_s": s.prompt_tokens_per_s,
                "decode_tokens_per_s": s.completion_tokens_per_s,
                "stop_reason": reply.finish.name(),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Ok(reply) => {
            println!();
            eprintln!("{}", remote_summary(&reply));
        }
        Err(e) => {
            if json {
                let out = serde_json::json!({"text": partial, "model": model, "error": e.message});
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else if !partial.is_empty() {
                println!();
            }
            return Err(e.into());
        }
    }
    Ok(())
}
