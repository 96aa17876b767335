//! The chat models in the library (models folder, Hugging Face cache, imports) for the model picker.
//! Listing reads every model's header, so it runs on a thread: at start and whenever the list opens.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, channel};

use eframe::egui;

use super::AppContext;
use crate::hub::kind::{ModelKind, human_bytes};
use crate::hub::library;

/// One chat model: what to show and what to load.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatModel {
    pub name: String,
    pub detail: String,
    pub path: PathBuf,
}

#[derive(Default)]
pub struct ChatLibrary {
    pending: Option<Receiver<Vec<ChatModel>>>,
    pub models: Vec<ChatModel>,
}

impl ChatLibrary {
    pub fn refresh(&mut self, app: &AppContext) {
        if self.pending.is_some() {
            return;
        }
        let (tx, rx) = channel();
        let (settings, paths, ctx) = (
            app.settings.clone(),
            app.paths.clone(),
            app.egui_ctx.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("drift-chat-library".into())
            .spawn(move || {
                let found = library::list(&settings, &paths)
                    .into_iter()
                    .filter(|e| e.kind == ModelKind::Llm)
                    .map(|e| ChatModel {
                        detail: format!(
                            "{} · {} · {}",
                            e.format,
                            e.quantization,
                            human_bytes(e.size_bytes)
                        ),
                        name: e.name,
                        path: e.path,
                    })
                    .collect();
                let _ = tx.send(found);
                ctx.request_repaint();
            });
        match spawned {
            Ok(_) => self.pending = Some(rx),
            Err(e) => log::warn!("could not list the library: {e}"),
        }
    }

    pub fn poll(&mut self) {
        if let Some(rx) = &self.pending
            && let Ok(found) = rx.try_recv()
        {
            self.models = found;
            self.pending = None;
        }
    }

    /// The "Library" combo box; picking a model sets `model`. Opening it lists the library again (a
    /// download may have finished meanwhile). Returns whether the user picked one.
    pub fn combo(
        &mut self,
        ui: &mut egui::Ui,
        app: &AppContext,
        model: &mut Option<PathBuf>,
    ) -> bool {
        let selected = model
            .as_ref()
            .and_then(|p| self.models.iter().find(|m| &m.path == p))
            .map_or_else(
                || match self.models.len() {
                    0 => "no chat models yet".to_string(),
                    n => format!("{n} chat models"),
                },
                |m| m.name.clone(),
            );
        let mut picked = false;
        let response = egui::ComboBox::from_label("Library")
            .selected_text(selected)
            .width(200.0)
            .show_ui(ui, |ui| {
                if self.models.is_empty() {
                    ui.weak("Download or import one in the Models tab.");
                }
                for m in &self.models {
                    let chosen = model.as_ref() == Some(&m.path);
                    if ui
                        .selectable_label(chosen, &m.name)
                        .on_hover_text(format!("{}\n{}", m.detail, m.path.display()))
                        .clicked()
                    {
                        *model = Some(m.path.clone());
                        picked = true;
                    }
                }
            });
        if response.response.clicked() {
            self.refresh(app);
        }
        picked
    }
}
