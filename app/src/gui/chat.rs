//! The Chat panel: load a model (Hugging Face folder or GGUF), talk to it with streaming replies, stop a
//! reply, see prefill/decode speed under each answer. Inference runs on the LLM worker thread.

use drift_engine::generate::GenerateOptions;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use eframe::egui;

use super::AppContext;
use super::llm_worker::{Command, Event, LlmWorker};

pub struct ChatPanel {
    worker: LlmWorker,
    model_path: String,
    loaded: Option<String>,
    loading: bool,
    system: String,
    input: String,
    messages: Vec<(Message, Option<String>)>,
    generating: bool,
    error: Option<String>,
    sampling: SamplingParams,
    max_tokens: usize,
}

impl ChatPanel {
    pub fn new(app: &AppContext) -> ChatPanel {
        ChatPanel {
            worker: LlmWorker::spawn(app.gpu.clone(), app.egui_ctx.clone()),
            model_path: String::new(),
            loaded: None,
            loading: false,
            system: String::new(),
            input: String::new(),
            messages: Vec::new(),
            generating: false,
            error: None,
            sampling: SamplingParams::default(),
            max_tokens: 512,
        }
    }
}

impl ChatPanel {
    /// Applies what the worker sent since the last frame.
    pub fn poll(&mut self, _app: &mut AppContext) {
        while let Ok(ev) = self.worker.events.try_recv() {
            match ev {
                Event::Loaded(name) => {
                    self.loaded = Some(name);
                    self.loading = false;
                    self.messages.clear();
                }
                Event::Piece(p) => {
                    if let Some((m, _)) = self.messages.last_mut() {
                        m.content.push_str(&p);
                    }
                }
                Event::Done(g) => {
                    self.generating = false;
                    if let Some((m, stats)) = self.messages.last_mut() {
                        m.content = g.text.clone();
                        *stats = Some(format!(
                            "{} tokens · prefill {:.0} tok/s · decode {:.1} tok/s · {:?}",
                            g.tokens.len(),
                            g.prefill_tokens_per_s,
                            g.decode_tokens_per_s,
                            g.stop_reason
                        ));
                    }
                }
                Event::Error(e) => {
                    self.error = Some(e);
                    self.loading = false;
                    if self.generating {
                        self.generating = false;
                        // Keep what was streamed; drop an empty reply.
                        if self
                            .messages
                            .last()
                            .is_some_and(|(m, _)| m.role == "assistant" && m.content.is_empty())
                        {
                            self.messages.pop();
                        }
                    }
                }
            }
        }
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, _app: &mut AppContext) {
        ui.horizontal(|ui| {
            let label = ui.label("Model");
            ui.add(
                egui::TextEdit::singleline(&mut self.model_path)
                    .hint_text("a Hugging Face folder or a .gguf file")
                    .desired_width(420.0),
            )
            .labelled_by(label.id);
            let can_load = !self.loading && !self.generating && !self.model_path.trim().is_empty();
            if ui
                .add_enabled(can_load, egui::Button::new("Load"))
                .clicked()
            {
                self.loading = true;
                self.error = None;
                self.worker
                    .send(Command::Load(self.model_path.trim().into()));
            }
            if self.loading {
                ui.spinner();
            }
            match &self.loaded {
                Some(name) => ui.label(format!("loaded: {name}")),
                None => ui.weak("No model loaded yet: enter its path and press Load."),
            };
        });
        ui.horizontal(|ui| {
            let label = ui.label("System prompt");
            ui.add(egui::TextEdit::singleline(&mut self.system).desired_width(420.0))
                .labelled_by(label.id);
            ui.label("Temperature");
            ui.add(
                egui::DragValue::new(&mut self.sampling.temperature)
                    .range(0.0..=2.0)
                    .speed(0.05),
            );
            ui.label("Top-p");
            ui.add(
                egui::DragValue::new(&mut self.sampling.top_p)
                    .range(0.0..=1.0)
                    .speed(0.01),
            );
            ui.label("Max tokens");
            ui.add(egui::DragValue::new(&mut self.max_tokens).range(1..=8192));
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::LIGHT_RED, e);
        }
        ui.separator();
        let input_height = 70.0;
        egui::ScrollArea::vertical()
            .auto_shrink([false, false])
            .stick_to_bottom(true)
            .max_height(ui.available_height() - input_height)
            .show(ui, |ui| {
                for (m, stats) in &self.messages {
                    ui.label(egui::RichText::new(&m.role).strong());
                    ui.label(&m.content);
                    if let Some(s) = stats {
                        ui.weak(s);
                    }
                    ui.add_space(6.0);
                }
            });
        ui.separator();
        ui.horizontal(|ui| {
            let edit = ui.add(
                egui::TextEdit::multiline(&mut self.input)
                    .hint_text("Message")
                    .desired_rows(2)
                    .desired_width(ui.available_width() - 140.0),
            );
            let enter = edit.has_focus()
                && ui.input(|i| i.key_pressed(egui::Key::Enter) && !i.modifiers.shift);
            if self.generating {
                if ui.button("Stop").clicked() {
                    self.worker
                        .cancel
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            } else {
                let ready = self.loaded.is_some() && !self.input.trim().is_empty();
                if ui.add_enabled(ready, egui::Button::new("Send")).clicked() || (enter && ready) {
                    self.send();
                }
            }
        });
    }

    fn send(&mut self) {
        let text = self.input.trim().to_string();
        self.input.clear();
        self.error = None;
        self.messages.push((Message::new("user", &text), None));
        let mut convo: Vec<Message> = Vec::new();
        if !self.system.trim().is_empty() {
            convo.push(Message::new("system", self.system.trim()));
        }
        convo.extend(self.messages.iter().map(|(m, _)| m.clone()));
        self.messages.push((Message::new("assistant", ""), None));
        self.generating = true;
        let opts = GenerateOptions {
            sampling: self.sampling.clone(),
            max_tokens: self.max_tokens,
            stop: vec![],
        };
        self.worker.send(Command::Generate(convo, opts));
    }
}
