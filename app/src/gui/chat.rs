//! The Chat tab: saved conversations on the left, the backend (a local model or a remote server) and
//! the transcript in the middle, the conversation's settings on the right. Replies stream from the LLM
//! worker thread (or a remote server's thread); conversations are saved after every message, every
//! finished reply and every few seconds while a reply streams.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drift_engine::tokenize::chat_template::Message;
use eframe::egui;

use super::chat_library::ChatLibrary;
use super::chat_list::{self, ListAction, ListState};
use super::chat_remote::{self, RemoteModels};
use super::chat_remote_worker::RemoteReplyRequest;
use super::chat_settings::{self, ModelStatus, PickerAction, PickerState};
use super::chat_transcript::{self, TranscriptAction, TranscriptState};
use super::conversations::{
    Backend, ChatMessage, ChatSettings, Conversation, ConversationStore, Role, unix_now,
};
use super::llm_worker::{Command, Event, LlmWorker, ModelSpec, ReplyRequest};
use super::{AppContext, Tab};

/// While a reply streams, it is saved at least this often (a crash loses at most this much).
const SAVE_EVERY: Duration = Duration::from_secs(2);
/// Settings edits are saved once they have been still for this long.
const SETTLE: Duration = Duration::from_secs(1);

/// The reply being written.
pub struct ReplyJob {
    pub conv_id: String,
    /// The worker has the device and the model (before that it waits in the GPU queue or loads), or
    /// the request went to the server.
    pub started: bool,
    /// From a remote server.
    pub remote: bool,
    pub pieces: usize,
    last_save: Instant,
}

pub struct ChatPanel {
    worker: LlmWorker,
    store: ConversationStore,
    pub conversations: Vec<Conversation>,
    /// The id of the conversation on screen.
    pub current: String,
    /// Problems that are not about one reply: skipped files, failed saves.
    pub notices: Vec<String>,
    pub model: ModelStatus,
    pub job: Option<ReplyJob>,
    pub input: String,
    list: ListState,
    transcript: TranscriptState,
    picker: PickerState,
    pub library: ChatLibrary,
    /// The model list of the current conversation's server.
    pub remote_models: RemoteModels,
    /// The current conversation's settings changed at this moment and are not saved yet.
    dirty_since: Option<Instant>,
}

impl ChatPanel {
    pub fn new(app: &AppContext) -> ChatPanel {
        let store = ConversationStore::new(app.paths.conversations_dir());
        let loaded = store.load_all();
        for w in &loaded.warnings {
            log::warn!("{w}");
        }
        let mut panel = ChatPanel {
            worker: LlmWorker::spawn(
                app.gpu.clone(),
                app.gpu_queue.clone(),
                app.perf.clone(),
                app.egui_ctx.clone(),
            ),
            store,
            conversations: loaded.conversations,
            current: String::new(),
            notices: loaded.warnings,
            model: ModelStatus::default(),
            job: None,
            input: String::new(),
            list: ListState::default(),
            transcript: TranscriptState::default(),
            picker: PickerState::default(),
            library: ChatLibrary::default(),
            remote_models: RemoteModels::default(),
            dirty_since: None,
        };
        panel.library.refresh(app);
        match panel.conversations.first() {
            Some(c) => panel.current = c.id.clone(),
            None => panel.new_conversation(app),
        }
        panel.list_models_if_remote(app);
        panel
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.conversations.iter().position(|c| c.id == id)
    }

    fn current_index(&self) -> usize {
        self.index_of(&self.current)
            .expect("the current conversation exists")
    }

    pub fn current_conversation(&self) -> &Conversation {
        &self.conversations[self.current_index()]
    }

    pub fn is_generating(&self) -> bool {
        self.job.is_some()
    }

    /// Saves a conversation that has something in it; a failure becomes a notice (once).
    fn save(&mut self, id: &str) {
        let Some(i) = self.index_of(id) else { return };
        let c = &self.conversations[i];
        if c.is_blank() {
            return;
        }
        if let Err(e) = self.store.save(c) {
            let msg = format!(
                "could not save {}: {e}",
                self.store.path_of(&c.id).display()
            );
            log::warn!("{msg}");
            if !self.notices.contains(&msg) {
                self.notices.push(msg);
            }
        }
    }

    /// Starts a blank conversation with the current one's model and settings (or the last model used).
    fn new_conversation(&mut self, app: &AppContext) {
        if let Some(i) = self.index_of(&self.current)
            && self.conversations[i].is_blank()
        {
            return; // already on a blank one
        }
        let (model, settings, system, backend) = match self.index_of(&self.current) {
            Some(i) => {
                let c = &self.conversations[i];
                (
                    c.model.clone(),
                    c.settings.clone(),
                    c.system_prompt.clone(),
                    c.backend.clone(),
                )
            }
            None => (
                app.settings.last_chat_model.clone(),
                ChatSettings::default(),
                String::new(),
                Backend::default(),
            ),
        };
        let mut c = Conversation::new(self.store.fresh_id(), model, settings);
        c.system_prompt = system;
        c.backend = backend;
        self.current = c.id.clone();
        self.conversations.push(c);
        self.transcript.editing = None;
    }

    /// Applies what the worker sent since the last frame (every frame, whichever tab is visible).
    pub fn poll(&mut self, app: &mut AppContext) {
        self.library.poll();
        self.remote_models.poll();
        self.pick_the_only_remote_model();
        while let Ok(ev) = self.worker.events.try_recv() {
            self.apply(ev, app);
        }
        if let Some(job) = &mut self.job
            && job.last_save.elapsed() >= SAVE_EVERY
        {
            job.last_save = Instant::now();
            let id = job.conv_id.clone();
            self.save(&id);
        }
        if self.dirty_since.is_some_and(|t| t.elapsed() >= SETTLE) {
            self.dirty_since = None;
            let id = self.current.clone();
            self.save(&id);
        } else if self.dirty_since.is_some() {
            app.egui_ctx.request_repaint_after(SETTLE);
        }
        if self.model.loading.is_some() {
            app.activity.push("Chat: loading model".into());
        } else if let Some(job) = &self.job
            && job.remote
        {
            app.activity.push(if job.started {
                format!("Chat: receiving from the server ({} pieces)", job.pieces)
            } else {
                "Chat: waiting for the server".into()
            });
        } else if let Some(job) = &self.job {
            app.activity.push(if job.started {
                format!("Chat: generating ({} tokens)", job.pieces)
            } else {
                "Chat: waiting for the GPU".into()
            });
        }
    }

    fn apply(&mut self, ev: Event, app: &mut AppContext) {
        match ev {
            Event::Loading(spec) => {
                self.model.loading = Some(spec);
                self.model.error = None;
            }
            Event::Loaded { spec, context } => {
                self.model.loading = None;
                if app.settings.last_chat_model.as_ref() != Some(&spec.path) {
                    app.settings.last_chat_model = Some(spec.path.clone());
                    app.save_settings();
                }
                self.model.loaded = Some(spec);
                self.model.context = context;
            }
            Event::LoadFailed(e) => {
                self.model.loading = None;
                self.model.loaded = None; // the old model was freed before loading
                self.model.error = Some(e);
            }
            Event::Started => {
                if let Some(job) = &mut self.job {
                    job.started = true;
                }
            }
            Event::Piece(p) => {
                let Some(job) = &mut self.job else { return };
                job.pieces += 1;
                if let Some(m) = last_reply(&mut self.conversations, &job.conv_id) {
                    m.content.push_str(&p);
                }
            }
            Event::Done { text, stats } => {
                let Some(job) = self.job.take() else { return };
                if let Some(m) = last_reply(&mut self.conversations, &job.conv_id) {
                    m.content = text;
                    m.stats = Some(stats);
                }
                self.finish(&job.conv_id);
            }
            Event::Failed(e) => {
                let Some(job) = self.job.take() else { return };
                if let Some(m) = last_reply(&mut self.conversations, &job.conv_id) {
                    m.error = Some(e);
                }
                self.finish(&job.conv_id);
            }
        }
    }

    fn finish(&mut self, id: &str) {
        if let Some(i) = self.index_of(id) {
            self.conversations[i].updated = unix_now();
        }
        self.save(id);
    }

    /// Sends the current conversation (its messages so far) for a reply, into a new assistant message.
    fn request_reply(&mut self, app: &AppContext) {
        let i = self.current_index();
        let c = &mut self.conversations[i];
        let remote = c.backend.use_remote;
        let missing = if remote {
            (!c.backend.remote.is_complete())
                .then_some("no server or model chosen: fill them in above, then Regenerate")
        } else {
            c.model
                .is_none()
                .then_some("no model chosen: pick one above, then Regenerate")
        };
        if let Some(why) = missing {
            let mut m = ChatMessage::new(Role::Assistant, "");
            m.error = Some(why.into());
            c.messages.push(m);
            return;
        }
        let mut messages = Vec::new();
        if !c.system_prompt.trim().is_empty() {
            messages.push(Message::new("system", c.system_prompt.trim()));
        }
        // Replies that failed or were stopped before any text are not part of the conversation.
        messages.extend(
            c.messages
                .iter()
                .filter(|m| !(m.role == Role::Assistant && m.content.is_empty()))
                .map(|m| Message::new(m.role.as_str(), &m.content)),
        );
        c.messages.push(ChatMessage::new(Role::Assistant, ""));
        c.updated = unix_now();
        self.job = Some(ReplyJob {
            conv_id: c.id.clone(),
            started: false,
            remote,
            pieces: 0,
            last_save: Instant::now(),
        });
        if remote {
            self.worker.reply_remote(RemoteReplyRequest {
                server: c.backend.remote.clone(),
                messages,
                sampling: c.settings.remote_sampling(),
            });
        } else if let Some(path) = c.model.clone() {
            self.worker.send(Command::Reply(ReplyRequest {
                model: ModelSpec {
                    path,
                    context: c.settings.context_length,
                },
                messages,
                options: c.settings.generate_options(fresh_seed()),
                profile: app.settings.profiling,
            }));
        }
        let id = c.id.clone();
        self.save(&id);
    }

    /// Lists the current conversation's server's models when it uses one and they are not listed yet.
    fn list_models_if_remote(&mut self, app: &AppContext) {
        let c = self.current_conversation();
        if c.backend.use_remote {
            let server = c.backend.remote.clone();
            self.remote_models.ensure_for(&app.egui_ctx, &server);
        }
    }

    /// A remote conversation without a model takes the server's only one.
    fn pick_the_only_remote_model(&mut self) {
        let [only] = self.remote_models.models.as_slice() else {
            return;
        };
        let Some(i) = self.index_of(&self.current) else {
            return;
        };
        let backend = &mut self.conversations[i].backend;
        if backend.use_remote && backend.remote.model.trim().is_empty() {
            backend.remote.model = only.clone();
            self.dirty_since = Some(Instant::now());
        }
    }

    fn send_input(&mut self, app: &AppContext) {
        let text = self.input.trim().to_string();
        if text.is_empty() || self.job.is_some() {
            return;
        }
        self.input.clear();
        let i = self.current_index();
        let c = &mut self.conversations[i];
        c.messages.push(ChatMessage::new(Role::User, &text));
        c.retitle();
        self.request_reply(app);
    }

    fn apply_list(&mut self, action: ListAction, app: &AppContext) {
        match action {
            ListAction::New => self.new_conversation(app),
            ListAction::Select(id) => {
                // Leaving a conversation saves its pending settings edits.
                if self.dirty_since.take().is_some() {
                    let cur = self.current.clone();
                    self.save(&cur);
                }
                self.current = id;
                self.transcript.editing = None;
                self.list_models_if_remote(app);
            }
            ListAction::Rename { id, title } => {
                let Some(i) = self.index_of(&id) else { return };
                if title.is_empty() {
                    return;
                }
                let c = &mut self.conversations[i];
                c.title = title;
                c.renamed = true;
                self.save(&id);
            }
            ListAction::Delete(id) => {
                if self.job.as_ref().is_some_and(|j| j.conv_id == id) {
                    return;
                }
                if let Err(e) = self.store.delete(&id) {
                    self.notices.push(format!("could not delete: {e}"));
                    return;
                }
                self.conversations.retain(|c| c.id != id);
                if self.current == id {
                    let newest = self.conversations.iter().max_by_key(|c| c.updated);
                    match newest.map(|c| c.id.clone()) {
                        Some(next) => self.current = next,
                        None => {
                            self.current.clear();
                            self.new_conversation(app);
                        }
                    }
                }
            }
        }
    }

    fn apply_transcript(&mut self, action: TranscriptAction, app: &AppContext) {
        if self.job.is_some() {
            return;
        }
        let i = self.current_index();
        let c = &mut self.conversations[i];
        match action {
            TranscriptAction::Regenerate => {
                if c.messages.last().is_some_and(|m| m.role == Role::Assistant) {
                    c.messages.pop();
                }
            }
            TranscriptAction::Resend { index, text } => {
                if c.messages.get(index).is_none_or(|m| m.role != Role::User) {
                    return;
                }
                c.messages.truncate(index);
                c.messages.push(ChatMessage::new(Role::User, &text));
                c.retitle();
            }
        }
        self.request_reply(app);
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        if let Some(path) = self.picker.picked() {
            let i = self.current_index();
            self.conversations[i].model = Some(path);
            self.dirty_since = Some(Instant::now());
        }
        let busy_id = self.job.as_ref().map(|j| j.conv_id.clone());
        let list_action = egui::Panel::left("chat conversations")
            .resizable(true)
            .default_size(220.0)
            .show(ui, |ui| {
                chat_list::show(
                    ui,
                    &mut self.list,
                    &self.conversations,
                    &self.current,
                    busy_id.as_deref(),
                )
            })
            .inner;
        if let Some(a) = list_action {
            self.apply_list(a, app);
        }

        let i = self.current_index();
        let conv = &mut self.conversations[i];
        let settings_changed = egui::Panel::right("chat settings")
            .resizable(true)
            .default_size(240.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("chat settings scroll")
                    .show(ui, |ui| {
                        chat_settings::settings_ui(
                            ui,
                            &mut conv.system_prompt,
                            &mut conv.settings,
                            conv.backend.use_remote,
                        )
                    })
                    .inner
            })
            .inner;
        let model_before = conv.model.clone();
        let (picker_action, backend_change) = egui::Panel::top("chat model")
            .show(ui, |ui| {
                ui.add_space(4.0);
                let mut change =
                    chat_remote::backend_choice(ui, &mut conv.backend, busy_id.is_some());
                if conv.backend.use_remote {
                    let rows = chat_remote::remote_rows(
                        ui,
                        &mut conv.backend.remote,
                        &mut self.remote_models,
                    );
                    change.edited |= rows.edited;
                    change.list_models |= rows.list_models;
                    ui.add_space(4.0);
                    return (None, change);
                }
                let action = chat_settings::model_row(
                    ui,
                    app,
                    &mut self.picker,
                    &mut self.library,
                    &mut conv.model,
                    &self.model,
                    busy_id.is_some(),
                );
                (action, change)
            })
            .inner;
        if settings_changed || backend_change.edited || conv.model != model_before {
            self.dirty_since = Some(Instant::now());
        }
        if backend_change.list_models
            && conv.backend.use_remote
            && !conv.backend.remote.url.trim().is_empty()
        {
            let server = conv.backend.remote.clone();
            self.remote_models.refresh(&app.egui_ctx, &server);
        }
        if let Some(PickerAction::Load) = picker_action
            && let Some(path) = conv.model.clone()
        {
            self.model.error = None;
            self.worker.send(Command::Load(ModelSpec {
                path,
                context: conv.settings.context_length,
            }));
        }

        let send = egui::Panel::bottom("chat input")
            .show(ui, |ui| self.input_row(ui))
            .inner;
        if send {
            self.send_input(app);
        }

        let action = egui::CentralPanel::default()
            .show(ui, |ui| self.transcript_area(ui, app))
            .inner;
        if let Some(a) = action {
            self.apply_transcript(a, app);
        }
    }

    /// The message box with Send (Enter) or Stop. Returns whether to send.
    fn input_row(&mut self, ui: &mut egui::Ui) -> bool {
        ui.add_space(4.0);
        let mut send = false;
        ui.horizontal(|ui| {
            let id = ui.make_persistent_id("chat message");
            // Enter sends, Shift+Enter is a new line: take the key before the text field sees it.
            let enter = ui.memory(|m| m.has_focus(id))
                && ui.input_mut(|i| i.consume_key(egui::Modifiers::NONE, egui::Key::Enter));
            ui.add(
                egui::TextEdit::multiline(&mut self.input)
                    .id(id)
                    .hint_text("Message (Enter sends, Shift+Enter for a new line)")
                    .desired_rows(2)
                    .desired_width(ui.available_width() - 90.0),
            )
            .accessible_name("Message");
            if self.is_generating() {
                if ui.button("Stop").clicked() {
                    self.worker.stop();
                }
            } else {
                let c = self.current_conversation();
                let has_model = if c.backend.use_remote {
                    c.backend.remote.is_complete()
                } else {
                    c.model.is_some()
                };
                let ready = has_model && !self.input.trim().is_empty();
                let clicked = ui
                    .add_enabled(ready, egui::Button::new("Send"))
                    .on_disabled_hover_text("choose a model and type a message")
                    .clicked();
                send = ready && (clicked || enter);
            }
        });
        ui.add_space(4.0);
        send
    }

    fn transcript_area(
        &mut self,
        ui: &mut egui::Ui,
        app: &mut AppContext,
    ) -> Option<TranscriptAction> {
        for n in &self.notices {
            ui.colored_label(ui.visuals().warn_fg_color, n);
        }
        if !self.notices.is_empty() && ui.small_button("Dismiss").clicked() {
            self.notices.clear();
        }
        let i = self.current_index();
        let conv = &self.conversations[i];
        if conv.messages.is_empty() {
            self.empty_state(ui, app);
            return None;
        }
        let streaming = self.job.as_ref().is_some_and(|j| j.conv_id == conv.id);
        let busy = self.job.is_some();
        egui::ScrollArea::vertical()
            .id_salt("chat transcript")
            .auto_shrink([false, false])
            .stick_to_bottom(true)
            .show(ui, |ui| {
                chat_transcript::show(ui, &mut self.transcript, conv, streaming, busy)
            })
            .inner
    }

    fn empty_state(&self, ui: &mut egui::Ui, app: &mut AppContext) {
        ui.add_space(40.0);
        let backend = &self.current_conversation().backend;
        ui.vertical_centered(|ui| {
            if backend.use_remote {
                let r = &backend.remote;
                if r.is_complete() {
                    ui.label(format!(
                        "Replies come from {} at {}. Send a message to start.",
                        r.model.trim(),
                        r.url.trim()
                    ));
                } else {
                    ui.heading("No server chosen");
                    ui.label(
                        "Enter an OpenAI-compatible server's URL above (vLLM, Ollama, llama.cpp, \
                         LM Studio or drift serve), press Refresh and pick one of its models.",
                    );
                }
            } else if self.model.loaded.is_none() && self.model.loading.is_none() {
                ui.heading("No model loaded");
                ui.label(
                    "Choose a model above (a .gguf file or a Hugging Face folder) and press Load, \
                     or get one in the Models tab.",
                );
                if ui.button("Open the Models tab").clicked() {
                    app.goto = Some(Tab::Models);
                }
            } else {
                ui.label("Send a message to start.");
            }
        });
    }
}

impl Drop for ChatPanel {
    /// Saves what is pending and stops a reply in progress (the app is closing).
    fn drop(&mut self) {
        self.worker.stop();
        if let Some(job) = self.job.take() {
            self.save(&job.conv_id);
        }
        if self.dirty_since.take().is_some() {
            let id = self.current.clone();
            self.save(&id);
        }
    }
}

fn last_reply<'a>(convs: &'a mut [Conversation], id: &str) -> Option<&'a mut ChatMessage> {
    convs
        .iter_mut()
        .find(|c| c.id == id)?
        .messages
        .last_mut()
        .filter(|m| m.role == Role::Assistant)
}

/// A new seed per reply when the conversation has none fixed.
fn fresh_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
