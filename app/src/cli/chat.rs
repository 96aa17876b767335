//! `drift chat`: an interactive terminal chat with streaming; /reset, /system TEXT, /quit. The replies
//! come from the local engine or, with `--remote URL`, from an OpenAI-compatible server.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, anyhow};
use drift_engine::generate::LlmSession;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};

use super::generate::{RemoteArgs, SamplingArgs, print_models, remote_model, remote_summary};
use crate::remote::{Prompt, RemoteClient};

#[derive(clap::Args)]
pub struct ChatArgs {
    /// A Hugging Face model folder or a .gguf file; with --remote, the server's model name (optional
    /// when it serves only one).
    #[arg(long, required_unless_present = "remote")]
    model: Option<String>,
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// The local engine's device and loaded model.
struct LocalChat {
    gpu: Gpu,
    session: LlmSession,
}

/// Where replies come from.
enum Backend {
    // Boxed: the device and session are kilobytes, the remote variant a few pointers.
    Local(Box<LocalChat>),
    Remote { client: RemoteClient, model: String },
}

/// A reply that failed: why, and the text that arrived before.
struct Failed {
    error: anyhow::Error,
    partial: String,
}

impl Backend {
    fn open(options: &GpuOptions, args: &ChatArgs) -> Result<Option<(Backend, String)>> {
        if let Some(client) = args.remote.client()? {
            if args.remote.list_models {
                print_models(&client)?;
                return Ok(None);
            }
            let model = remote_model(&client, args.model.as_deref())?;
            let name = format!("{model} at {}", client.base());
            return Ok(Some((Backend::Remote { client, model }, name)));
        }
        let model = args
            .model
            .as_deref()
            .ok_or_else(|| anyhow!("--model is needed"))?;
        let gpu = Gpu::new(options)?;
        let quant = QuantScheme::parse(&args.sampling.quant)?;
        let session = open_llm(&gpu, &PathBuf::from(model), args.sampling.context, quant)?;
        Ok(Some((
            Backend::Local(Box::new(LocalChat { gpu, session })),
            model.to_string(),
        )))
    }

    /// Forgets the conversation (the local KV cache; a server keeps nothing between requests).
    fn reset(&mut self) {
        if let Backend::Local(local) = self {
            local.session.reset();
        }
    }

    /// Streams a reply to stdout; returns its text and a speed summary.
    fn reply(
        &mut self,
        msgs: &[Message],
        sampling: &SamplingArgs,
    ) -> Result<(String, String), Failed> {
        let cancel = AtomicBool::new(false);
        let mut shown = String::new();
        let mut print = |piece: &str| {
            shown.push_str(piece);
            print!("{piece}");
            let _ = std::io::stdout().flush();
        };
        let result = match self {
            Backend::Local(local) => local
                .session
                .render(msgs)
                .and_then(|text| local.session.tokenizer.encode(&text, false))
                .and_then(|prompt| {
                    let LocalChat { gpu, session } = &mut **local;
                    session.generate(gpu, &prompt, &sampling.options(), &cancel, &mut print)
                })
                .map(|g| (g.text, format!("[{:.1} tok/s]", g.decode_tokens_per_s)))
                .map_err(anyhow::Error::from),
            Backend::Remote { client, model } => client
                .stream(
                    model,
                    Prompt::Chat(msgs),
                    &sampling.remote(),
                    &cancel,
                    &mut print,
                )
                .map(|r| {
                    let summary = remote_summary(&r);
                    (r.text, summary)
                })
                .map_err(anyhow::Error::from),
        };
        result.map_err(|error| Failed {
            error,
            partial: shown,
        })
    }
}

pub fn run(options: &GpuOptions, args: &ChatArgs) -> Result<()> {
    let Some((mut backend, name)) = Backend::open(options, args)? else {
        return Ok(());
    };
    let mut system = args.system.clone();
    let mut history: Vec<Message> = Vec::new();
    eprintln!("chatting with {name} (/reset, /system TEXT, /quit)");
    let stdin = std::io::stdin();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line {
            "/quit" | "/exit" => break,
            "/reset" => {
                history.clear();
                backend.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ if line.starts_with("/system") => {
                system = Some(line["/system".len()..].trim().to_string()).filter(|s| !s.is_empty());
                history.clear();
                backend.reset();
                eprintln!("(system prompt set, conversation cleared)");
                continue;
            }
            "" => continue,
            _ => {}
        }
        history.push(Message::new("user", line));
        let mut msgs: Vec<Message> = system.iter().map(|s| Message::new("system", s)).collect();
        msgs.extend(history.iter().cloned());
        match backend.reply(&msgs, &args.sampling) {
            Ok((text, summary)) => {
                println!();
                eprintln!("{summary}");
                history.push(Message::new("assistant", &text));
            }
            Err(Failed { error, partial }) => {
                println!();
                eprintln!("error: {error}");
                // What was shown stays part of the conversation; a reply with no text is dropped
                // together with its question.
                if partial.is_empty() {
                    history.pop();
                } else {
                    history.push(Message::new("assistant", &partial));
                }
            }
        }
    }
    Ok(())
}
