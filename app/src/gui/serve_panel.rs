//! The window's switch for the OpenAI-compatible server (`drift serve` inside the app): it serves the
//! library's chat models and its first image model on 127.0.0.1, sharing the app's GPU device and job
//! queue, so requests from other programs take turns with the window's own chat and image jobs.
//! Its state is saved in the settings; a server that was on at exit starts again with the app.

use eframe::egui;

use super::AppContext;
use crate::hub::kind::ModelKind;
use crate::hub::library::LibraryEntry;
use crate::serve::{Server, ServerConfig};

const DEFAULT_PORT: u16 = 8080;

#[derive(Default)]
pub struct ServePanel {
    server: Option<Server>,
    /// What the running server offers (chat model ids and the image model's), for the status line.
    serving: Vec<String>,
    error: Option<String>,
    key_input: String,
}

impl ServePanel {
    pub fn new(app: &AppContext) -> ServePanel {
        ServePanel {
            key_input: app.settings.serve_api_key.clone().unwrap_or_default(),
            ..ServePanel::default()
        }
    }

    /// The server's address while it runs.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(Server::addr)
    }

    /// Starts the server when the settings say it should run and it does not yet (called once the
    /// library is known, at start-up too).
    pub fn sync(&mut self, app: &AppContext, library: &[LibraryEntry]) {
        if app.settings.serve_enabled && self.server.is_none() && self.error.is_none() {
            self.start(app, library);
        }
    }

    fn start(&mut self, app: &AppContext, library: &[LibraryEntry]) {
        let models: Vec<_> = library
            .iter()
            .filter(|e| e.kind == ModelKind::Llm)
            .map(|e| e.path.clone())
            .collect();
        let image_model = library
            .iter()
            .find(|e| e.kind == ModelKind::Diffusion)
            .map(|e| e.path.clone());
        if models.is_empty() && image_model.is_none() {
            self.error = Some("nothing to serve yet: the library has no models".into());
            return;
        }
        let config = ServerConfig {
            port: app.settings.serve_port.unwrap_or(DEFAULT_PORT),
            api_key: app.settings.serve_api_key.clone(),
            models,
            image_model,
            ..ServerConfig::default()
        };
        let names: Vec<String> = config
            .models
            .iter()
            .chain(&config.image_model)
            .map(|p| crate::serve::model_id(p))
            .collect();
        match Server::start(config, app.gpu.clone(), app.gpu_queue.clone()) {
            Ok(s) => {
                self.server = Some(s);
                self.serving = names;
                self.error = None;
            }
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }

    fn stop(&mut self) {
        // Dropping the server stops its threads (a generation in flight finishes first).
        self.server = None;
        self.serving.clear();
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext, library: &[LibraryEntry]) {
        let mut on = self.server.is_some();
        let port = app.settings.serve_port.unwrap_or(DEFAULT_PORT);
        ui.horizontal(|ui| {
            if ui
                .checkbox(&mut on, "Serve the library's models (OpenAI API)")
                .changed()
            {
                app.settings.serve_enabled = on;
                app.save_settings();
                self.error = None;
                if on {
                    self.start(app, library);
                } else {
                    self.stop();
                }
            }
            let label = ui.label("Port");
            let mut p = port;
            let edit = ui
                .add_enabled(
                    self.server.is_none(),
                    egui::DragValue::new(&mut p).range(0..=65535),
                )
                .labelled_by(label.id)
                .on_hover_text("0 picks any free port");
            if edit.changed() {
                app.settings.serve_port = Some(p);
                app.save_settings();
            }
            let label = ui.label("API key");
            let key = ui
                .add_enabled(
                    self.server.is_none(),
                    egui::TextEdit::singleline(&mut self.key_input)
                        .password(true)
                        .hint_text("optional")
                        .desired_width(160.0),
                )
                .labelled_by(label.id);
            if key.lost_focus() {
                let k = self.key_input.trim();
                app.settings.serve_api_key = (!k.is_empty()).then(|| k.to_string());
                app.save_settings();
            }
        });
        if let Some(addr) = self.addr() {
            ui.label(format!(
                "Serving {} at http://{addr}/v1{}",
                self.serving.join(", "),
                if app.settings.serve_api_key.is_some() {
                    " (clients send the key as Authorization: Bearer KEY)"
                } else {
                    ""
                }
            ));
            ui.weak(
                "Only this computer can connect (127.0.0.1). The server keeps its own copy of a model \
                 it loads; requests take turns with the window's chat and image jobs.",
            );
            app.activity
                .push(format!("Serving on port {}", addr.port()));
        } else if let Some(e) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
    }
}
