//! The LLM worker thread: owns the loaded model (on the app's shared GPU device) so the UI never blocks.
//! Commands go in over a channel; streamed text and results come back, each followed by a repaint.
//! Every load and every reply holds the app's GPU queue, so chat and image jobs take turns on the device.
//! Replies from a remote server run on a thread of their own (no GPU, no queue) and send the same events.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

use drift_engine::Gpu;
use drift_engine::generate::{GenerateOptions, Generation, LlmSession, StopReason};
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::profiler::Profiler;
use drift_engine::tokenize::chat_template::Message;
use eframe::egui;

use super::chat_remote_worker::{self, RemoteReplyRequest};
use super::conversations::ReplyStats;
use super::gpu_queue::GpuQueue;
use super::perf_log::{ProfiledRun, ReplySpeed, SharedPerfLog};

/// Which model, opened with which context length: a different spec means a reload.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub path: PathBuf,
    pub context: usize,
}

pub struct ReplyRequest {
    /// Loaded first when it is not the model in memory.
    pub model: ModelSpec,
    pub messages: Vec<Message>,
    pub options: GenerateOptions,
    /// Profile one decode step after the reply (Performance tab).
    pub profile: bool,
}

pub enum Command {
    Load(ModelSpec),
    Reply(ReplyRequest),
}

pub enum Event {
    /// The worker has the GPU and is loading this model.
    Loading(ModelSpec),
    /// `context`: the KV cache length it got (the spec's, capped by the model's own limit).
    Loaded {
        spec: ModelSpec,
        context: usize,
    },
    LoadFailed(String),
    /// The worker has the GPU and the model (or sent the request to the server): the reply starts.
    Started,
    /// Streamed text of one decoded token (tokens that end inside a UTF-8 character send nothing), or
    /// one chunk from a server.
    Piece(String),
    /// The whole reply (stopped ones too) with its counts and speeds.
    Done {
        text: String,
        stats: ReplyStats,
    },
    /// Why the reply failed; the pieces sent before are what there is of it.
    Failed(String),
}

pub struct LlmWorker {
    /// `None` once dropped (the thread then ends).
    commands: Option<Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The latest remote reply's thread.
    remote: Option<std::thread::JoinHandle<()>>,
    /// The events' sending side, for remote replies.
    events_tx: Sender<Event>,
    ctx: egui::Context,
    pub events: Receiver<Event>,
    /// Set to stop the reply in progress (or one still waiting for the GPU).
    pub cancel: Arc<AtomicBool>,
}

/// What the worker thread holds.
struct WorkerState {
    gpu: Arc<Gpu>,
    queue: GpuQueue,
    perf: SharedPerfLog,
    cancel: Arc<AtomicBool>,
    events: Sender<Event>,
    ctx: egui::Context,
    session: Option<(ModelSpec, LlmSession)>,
    profiler: Profiler,
}

impl LlmWorker {
    pub fn spawn(
        gpu: Arc<Gpu>,
        queue: GpuQueue,
        perf: SharedPerfLog,
        ctx: egui::Context,
    ) -> LlmWorker {
        let (commands, rx) = channel::<Command>();
        let (tx, events) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let mut state = WorkerState {
            gpu,
            queue,
            perf,
            cancel: cancel.clone(),
            events: tx.clone(),
            ctx: ctx.clone(),
            session: None,
            profiler: Profiler::new(),
        };
        let thread = std::thread::Builder::new()
            .name("drift-llm".into())
            .spawn(move || {
                // Ends when the panel (the command sender) is dropped.
                for cmd in rx {
                    state.run(cmd);
                }
            })
            .expect("spawning a thread");
        LlmWorker {
            commands: Some(commands),
            thread: Some(thread),
            remote: None,
            events_tx: tx,
            ctx,
            events,
            cancel,
        }
    }

    /// Streams a reply from a remote server on a thread of its own; Stop works as for local replies.
    pub fn reply_remote(&mut self, req: RemoteReplyRequest) {
        // Only one reply runs at a time (the panel sends the next after Done/Failed).
        if let Some(t) = self.remote.take() {
            let _ = t.join();
        }
        self.cancel.store(false, Ordering::SeqCst);
        let (events, ctx, cancel) = (
            self.events_tx.clone(),
            self.ctx.clone(),
            self.cancel.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("drift-remote-reply".into())
            .spawn(move || chat_remote_worker::reply(req, &events, &ctx, &cancel));
        match spawned {
            Ok(t) => self.remote = Some(t),
            Err(e) => {
                let _ = self
                    .events_tx
                    .send(Event::Failed(format!("could not start the request: {e}")));
            }
        }
    }

    pub fn send(&self, cmd: Command) {
        if let Command::Reply(_) = cmd {
            self.cancel.store(false, Ordering::SeqCst);
        }
        if let Some(c) = &self.commands {
            let _ = c.send(cmd);
        }
    }

    pub fn stop(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for LlmWorker {
    /// Stops a reply in progress and waits for the thread, so the model's GPU memory is released
    /// before the device goes away (a load in progress finishes first).
    fn drop(&mut self) {
        self.stop();
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.remote.take() {
            let _ = t.join();
        }
    }
}

impl WorkerState {
    fn send(&self, e: Event) {
        let _ = self.events.send(e);
        self.ctx.request_repaint();
    }

    fn run(&mut self, cmd: Command) {
        let queue = self.queue.clone();
        let _device = queue.acquire();
        match cmd {
            Command::Load(spec) => {
                let _ = self.ensure_loaded(&spec);
            }
            Command::Reply(req) => self.reply(req),
        }
    }

    /// Loads `spec` unless it is the model in memory; sends the outcome (and returns the reason of a
    /// failure).
    fn ensure_loaded(&mut self, spec: &ModelSpec) -> Result<(), String> {
        if self.session.as_ref().is_some_and(|(s, _)| s == spec) {
            return Ok(());
        }
        self.send(Event::Loading(spec.clone()));
        self.session = None; // free the old model's GPU memory first
        match open_llm(&self.gpu, &spec.path, Some(spec.context), QuantScheme::None) {
            Ok(s) => {
                let context = s.model.max_ctx;
                self.session = Some((spec.clone(), s));
                self.send(Event::Loaded {
                    spec: spec.clone(),
                    context,
                });
                Ok(())
            }
            Err(e) => {
                let why = format!("could not load {}: {e}", spec.path.display());
                self.send(Event::LoadFailed(why.clone()));
                Err(why)
            }
        }
    }

    fn reply(&mut self, req: ReplyRequest) {
        if let Err(why) = self.ensure_loaded(&req.model) {
            self.send(Event::Failed(why));
            return;
        }
        let (_, s) = self.session.as_mut().expect("loaded above");
        if self.cancel.load(Ordering::SeqCst) {
            // Stopped while waiting for the device or the model.
            self.send(Event::Done {
                text: String::new(),
                stats: ReplyStats {
                    prefill_tokens: 0,
                    prefill_tokens_per_s: 0.0,
                    decode_tokens: 0,
                    decode_tokens_per_s: 0.0,
                    stop_reason: stop_reason_name(StopReason::Cancelled),
                },
            });
            return;
        }
        let _ = self.events.send(Event::Started);
        let (events, ctx, gpu) = (&self.events, &self.ctx, &self.gpu);
        let result = s.render(&req.messages).and_then(|text| {
            let prompt = s.tokenizer.encode(&text, false)?;
            // The prefix shared with the KV cache is not run again.
            let reused = s
                .cached
                .iter()
                .zip(&prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.len().saturating_sub(1));
            let g = s.generate(gpu, &prompt, &req.options, &self.cancel, &mut |piece| {
                let _ = events.send(Event::Piece(piece.to_string()));
                ctx.request_repaint();
            })?;
            Ok((g, prompt.len() - reused))
        });
        match result {
            Ok((generation, prefill_tokens)) => {
                self.log_speed(&generation, prefill_tokens);
                if req.profile {
                    self.profile_decode();
                }
                self.send(Event::Done {
                    stats: ReplyStats {
                        prefill_tokens,
                        prefill_tokens_per_s: generation.prefill_tokens_per_s,
                        decode_tokens: generation.tokens.len(),
                        decode_tokens_per_s: generation.decode_tokens_per_s,
                        stop_reason: stop_reason_name(generation.stop_reason),
                    },
                    text: generation.text,
                });
            }
            Err(e) => self.send(Event::Failed(e.to_string())),
        }
    }

    fn log_speed(&self, g: &Generation, prefill_tokens: usize) {
        let speed = ReplySpeed {
            prefill_tokens,
            prefill_tokens_per_s: g.prefill_tokens_per_s,
            decode_tokens: g.tokens.len(),
            decode_tokens_per_s: g.decode_tokens_per_s,
        };
        self.perf
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replies
            .push(speed);
    }

    /// One decode step with per-dispatch timings, for the Performance tab. A failure here only loses
    /// the profile, never the reply.
    fn profile_decode(&mut self) {
        let Some((_, s)) = self.session.as_mut() else {
            return;
        };
        match s.profile_decode_step(&self.gpu, &mut self.profiler) {
            Ok(profile) => {
                self.perf.lock().unwrap_or_else(|p| p.into_inner()).last_run = Some(ProfiledRun {
                    label: "decode token".into(),
                    profile,
                })
            }
            Err(e) => log::warn!("profiling a decode step failed: {e}"),
        }
    }
}

/// The engine's stop reason as saved with a reply ("eos", "max_tokens", …).
fn stop_reason_name(r: StopReason) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{r:?}"))
}
