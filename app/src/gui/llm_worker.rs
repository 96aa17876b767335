//! The LLM worker thread: owns the loaded model (on the app's shared GPU device) so the UI never blocks.
//! Commands go in over a channel; streamed text and results come back, each followed by a repaint.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

use drift_engine::Gpu;
use drift_engine::generate::{GenerateOptions, Generation, LlmSession};
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::tokenize::chat_template::Message;
use eframe::egui;

pub enum Command {
    Load(PathBuf),
    Generate(Vec<Message>, GenerateOptions),
}

pub enum Event {
    Loaded(String),
    Piece(String),
    Done(Generation),
    Error(String),
}

pub struct LlmWorker {
    commands: Sender<Command>,
    pub events: Receiver<Event>,
    /// Set to stop the generation in progress.
    pub cancel: Arc<AtomicBool>,
}

impl LlmWorker {
    pub fn spawn(gpu: Arc<Gpu>, ctx: egui::Context) -> LlmWorker {
        let (commands, rx) = channel::<Command>();
        let (tx, events) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        std::thread::Builder::new()
            .name("drift-llm".into())
            .spawn(move || {
                let mut session: Option<LlmSession> = None;
                let send = |e: Event| {
                    let _ = tx.send(e);
                    ctx.request_repaint();
                };
                for cmd in rx {
                    match cmd {
                        Command::Load(path) => {
                            session = None; // free the old model's GPU memory first
                            match open_llm(&gpu, &path, None, QuantScheme::None) {
                                Ok(s) => {
                                    session = Some(s);
                                    send(Event::Loaded(path.display().to_string()));
                                }
                                Err(e) => send(Event::Error(format!(
                                    "could not load {}: {e}",
                                    path.display()
                                ))),
                            }
                        }
                        Command::Generate(messages, opts) => {
                            let Some(s) = session.as_mut() else {
                                send(Event::Error("load a model first".into()));
                                continue;
                            };
                            stop.store(false, Ordering::Relaxed);
                            let result = s
                                .render(&messages)
                                .and_then(|text| s.tokenizer.encode(&text, false))
                                .and_then(|prompt| {
                                    s.generate(&gpu, &prompt, &opts, &stop, &mut |piece| {
                                        send(Event::Piece(piece.to_string()));
                                    })
                                });
                            match result {
                                Ok(g) => send(Event::Done(g)),
                                Err(e) => send(Event::Error(e.to_string())),
                            }
                        }
                    }
                }
            })
            .expect("spawning a thread");
        LlmWorker {
            commands,
            events,
            cancel,
        }
    }

    pub fn send(&self, cmd: Command) {
        let _ = self.commands.send(cmd);
    }
}
