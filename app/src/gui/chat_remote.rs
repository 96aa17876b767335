//! The chat's backend row: Local (the engine on this machine) or Remote (an OpenAI-compatible server:
//! its URL, an API key that is remembered only when the user asks, and a model from the server's
//! `/v1/models` list, fetched on a thread with Refresh).

use std::sync::mpsc::{Receiver, TryRecvError, channel};

use eframe::egui;

use super::chat_remote_worker;
use super::conversations::{Backend, RemoteServer};

/// The model list of one server, fetched in the background.
#[derive(Default)]
pub struct RemoteModels {
    /// The models of `listed_for`'s server.
    pub models: Vec<String>,
    /// The URL and key the list (or the error) is for.
    listed_for: Option<(String, String)>,
    pub error: Option<String>,
    fetching: Option<Receiver<Result<Vec<String>, String>>>,
}

impl RemoteModels {
    pub fn is_fetching(&self) -> bool {
        self.fetching.is_some()
    }

    /// Asks the server for its models (a new request replaces one in flight).
    pub fn refresh(&mut self, ctx: &egui::Context, server: &RemoteServer) {
        let (tx, rx) = channel();
        let ctx = ctx.clone();
        let server = server.clone();
        self.listed_for = Some((server.url.clone(), server.api_key.clone()));
        self.error = None;
        let spawned = std::thread::Builder::new()
            .name("drift-remote-models".into())
            .spawn(move || {
                let _ = tx.send(chat_remote_worker::list_models(&server));
                ctx.request_repaint();
            });
        match spawned {
            Ok(_) => self.fetching = Some(rx),
            Err(e) => self.error = Some(format!("could not list the models: {e}")),
        }
    }

    /// Fetches the list unless it is already for this server (or being fetched for it).
    pub fn ensure_for(&mut self, ctx: &egui::Context, server: &RemoteServer) {
        let wanted = (server.url.clone(), server.api_key.clone());
        if !server.url.trim().is_empty() && self.listed_for.as_ref() != Some(&wanted) {
            self.refresh(ctx, server);
        }
    }

    /// Takes a finished fetch's answer.
    pub fn poll(&mut self) {
        let Some(rx) = &self.fetching else { return };
        match rx.try_recv() {
            Ok(Ok(models)) => {
                self.models = models;
                self.error = None;
                self.fetching = None;
            }
            Ok(Err(e)) => {
                self.models.clear();
                self.error = Some(e);
                self.fetching = None;
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.fetching = None,
        }
    }
}

/// What changed in the backend row.
#[derive(Default)]
pub struct BackendChange {
    /// Anything the conversation saves.
    pub edited: bool,
    /// The user switched to Remote or pressed Refresh: (re)load the server's models.
    pub list_models: bool,
}

/// "Backend: (•) Local ( ) Remote server". `busy`: a reply is being written (no switching meanwhile).
pub fn backend_choice(ui: &mut egui::Ui, backend: &mut Backend, busy: bool) -> BackendChange {
    let mut change = BackendChange::default();
    ui.horizontal(|ui| {
        ui.label("Backend");
        ui.add_enabled_ui(!busy, |ui| {
            if ui
                .radio_value(&mut backend.use_remote, false, "Local")
                .changed()
            {
                change.edited = true;
            }
            if ui
                .radio_value(&mut backend.use_remote, true, "Remote server")
                .on_hover_text(
                    "any OpenAI-compatible server: vLLM, Ollama, llama.cpp, LM Studio, drift serve",
                )
                .changed()
            {
                change.edited = true;
                change.list_models = true;
            }
        });
    });
    change
}

/// The server's URL, the API key with "Remember key", and the model with the server's list.
pub fn remote_rows(
    ui: &mut egui::Ui,
    server: &mut RemoteServer,
    models: &mut RemoteModels,
) -> BackendChange {
    let mut change = BackendChange::default();
    ui.horizontal(|ui| {
        let label = ui.label("Server URL");
        change.edited |= ui
            .add(
                egui::TextEdit::singleline(&mut server.url)
                    .hint_text("http://127.0.0.1:8080/v1")
                    .desired_width(260.0),
            )
            .labelled_by(label.id)
            .changed();
        let label = ui.label("API key");
        change.edited |= ui
            .add(
                egui::TextEdit::singleline(&mut server.api_key)
                    .password(true)
                    .hint_text("none")
                    .desired_width(140.0),
            )
            .labelled_by(label.id)
            .changed();
        change.edited |= ui
            .checkbox(&mut server.remember_key, "Remember key")
            .on_hover_text("save the key in this conversation's file (as plain text)")
            .changed();
        ui.weak(if server.remember_key {
            "saved with the conversation"
        } else {
            "kept only until Drift closes"
        });
    });
    ui.horizontal(|ui| {
        let label = ui.label("Remote model");
        change.edited |= ui
            .add(
                egui::TextEdit::singleline(&mut server.model)
                    .hint_text("a model the server serves")
                    .desired_width(260.0),
            )
            .labelled_by(label.id)
            .changed();
        let picked = egui::ComboBox::from_label("Server models")
            .selected_text(if models.models.is_empty() {
                "none listed"
            } else {
                "pick one"
            })
            .show_ui(ui, |ui| {
                let mut picked = None;
                for m in &models.models {
                    if ui.selectable_label(*m == server.model, m).clicked() {
                        picked = Some(m.clone());
                    }
                }
                if models.models.is_empty() {
                    ui.weak("none listed: Refresh");
                }
                picked
            });
        if let Some(Some(m)) = picked.inner {
            server.model = m;
            change.edited = true;
        }
        let can_list = !server.url.trim().is_empty() && !models.is_fetching();
        if ui
            .add_enabled(can_list, egui::Button::new("Refresh"))
            .on_hover_text("ask the server for its models (GET /v1/models)")
            .clicked()
        {
            change.list_models = true;
        }
        if models.is_fetching() {
            ui.spinner();
            ui.weak("listing models…");
        } else if models.error.is_none() && !models.models.is_empty() {
            let n = models.models.len();
            ui.weak(format!(
                "{n} model{} on the server",
                if n == 1 { "" } else { "s" }
            ));
        }
    });
    if let Some(e) = &models.error {
        ui.colored_label(ui.visuals().error_fg_color, e);
    }
    change
}
