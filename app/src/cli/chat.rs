//! `drift chat`: an interactive terminal chat with streaming; /reset, /system TEXT, /quit.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};

use super::generate::SamplingArgs;

#[derive(clap::Args)]
pub struct ChatArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(options: &GpuOptions, args: &ChatArgs) -> Result<()> {
    let gpu = Gpu::new(options)?;
    let quant = QuantScheme::parse(&args.sampling.quant)?;
    let mut session = open_llm(&gpu, &args.model, args.sampling.context, quant)?;
    let mut system = args.system.clone();
    let mut history: Vec<Message> = Vec::new();
    let opts = args.sampling.options();
    eprintln!(
        "chatting with {} (/reset, /system TEXT, /quit)",
        args.model.display()
    );
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
                session.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ if line.starts_with("/system") => {
                system = Some(line["/system".len()..].trim().to_string()).filter(|s| !s.is_empty());
                history.clear();
                session.reset();
                eprintln!("(system prompt set, conversation cleared)");
                continue;
            }
            "" => continue,
            _ => {}
        }
        history.push(Message::new("user", line));
        let mut msgs: Vec<Message> = system.iter().map(|s| Message::new("system", s)).collect();
        msgs.extend(history.iter().cloned());
        let prompt = session.tokenizer.encode(&session.render(&msgs)?, false)?;
        let cancel = AtomicBool::new(false);
        match session.generate(&gpu, &prompt, &opts, &cancel, &mut |piece| {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }) {
            Ok(g) => {
                println!();
                eprintln!("[{:.1} tok/s]", g.decode_tokens_per_s);
                history.push(Message::new("assistant", &g.text));
            }
            Err(e) => {
                println!();
                eprintln!("error: {e}");
                history.pop();
            }
        }
    }
    Ok(())
}
