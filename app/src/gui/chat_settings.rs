//! The chat's controls: the model picker (a path, a file/folder dialog, Load) and the per-conversation
//! settings (system prompt, sampling, max tokens, seed, context length). Every field is labelled for
//! screen readers (and the UI tests).

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, channel};

use eframe::egui;

use super::AppContext;
use super::chat_library::ChatLibrary;
use super::conversations::ChatSettings;
use super::llm_worker::ModelSpec;

/// What the model row shows about the worker's model.
#[derive(Default)]
pub struct ModelStatus {
    pub loaded: Option<ModelSpec>,
    pub loading: Option<ModelSpec>,
    /// The loaded model's KV cache length in tokens.
    pub context: usize,
    /// Why the last load failed.
    pub error: Option<String>,
}

/// A file dialog runs on its own thread (it blocks until the user picks); its answer arrives here.
#[derive(Default)]
pub struct PickerState {
    browsing: Option<Receiver<Option<PathBuf>>>,
}

impl PickerState {
    /// The path the user picked in the dialog, once it closes.
    pub fn picked(&mut self) -> Option<PathBuf> {
        let rx = self.browsing.as_ref()?;
        match rx.try_recv() {
            Ok(picked) => {
                self.browsing = None;
                picked
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                self.browsing = None;
                None
            }
        }
    }

    fn browse(&mut self, ctx: &egui::Context, folder: bool) {
        let (tx, rx) = channel();
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("drift-file-dialog".into())
            .spawn(move || {
                let dialog = rfd::FileDialog::new().set_title("Choose a chat model");
                let picked = if folder {
                    dialog.pick_folder()
                } else {
                    dialog
                        .add_filter("GGUF model", &["gguf"])
                        .add_filter("safetensors", &["safetensors"])
                        .pick_file()
                };
                let _ = tx.send(picked);
                ctx.request_repaint();
            });
        if spawned.is_ok() {
            self.browsing = Some(rx);
        }
    }
}

pub enum PickerAction {
    Load,
}

/// The model row: path, Browse (file or folder), Load; then the library's chat models and what is
/// loaded.
pub fn model_row(
    ui: &mut egui::Ui,
    app: &AppContext,
    state: &mut PickerState,
    library: &mut ChatLibrary,
    model: &mut Option<PathBuf>,
    status: &ModelStatus,
    busy: bool,
) -> Option<PickerAction> {
    let mut action = None;
    ui.horizontal(|ui| {
        let label = ui.label("Model");
        let mut text = model
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let edit = ui
            .add(
                egui::TextEdit::singleline(&mut text)
                    .hint_text("a .gguf file or a Hugging Face folder")
                    .desired_width((ui.available_width() - 330.0).max(160.0)),
            )
            .labelled_by(label.id);
        if edit.changed() {
            let t = text.trim();
            *model = (!t.is_empty()).then(|| PathBuf::from(t));
        }
        let idle = state.browsing.is_none();
        if ui
            .add_enabled(idle, egui::Button::new("Browse file…"))
            .clicked()
        {
            state.browse(ui.ctx(), false);
        }
        if ui
            .add_enabled(idle, egui::Button::new("Browse folder…"))
            .clicked()
        {
            state.browse(ui.ctx(), true);
        }
        let can_load = model.is_some() && status.loading.is_none() && !busy;
        if ui
            .add_enabled(can_load, egui::Button::new("Load"))
            .clicked()
        {
            action = Some(PickerAction::Load);
        }
    });
    ui.horizontal(|ui| {
        library.combo(ui, app, model);
        ui.separator();
        if let Some(spec) = &status.loading {
            ui.spinner();
            ui.label(format!("loading {}", model_name(&spec.path)));
        } else if let Some(spec) = &status.loaded {
            ui.add(
                egui::Label::new(format!(
                    "loaded: {} (context {} tokens)",
                    model_name(&spec.path),
                    status.context
                ))
                .truncate(),
            );
        } else {
            ui.weak("no model loaded");
        }
    });
    if let Some(e) = &status.error {
        ui.colored_label(ui.visuals().error_fg_color, e);
    }
    action
}

/// A short name for a model path: the file or folder name.
pub fn model_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// The settings column. Returns whether anything changed (the conversation is then saved). `remote`:
/// replies come from a server, which takes only the OpenAI API's fields (the rest is hidden).
pub fn settings_ui(
    ui: &mut egui::Ui,
    system_prompt: &mut String,
    s: &mut ChatSettings,
    remote: bool,
) -> bool {
    let mut changed = false;
    ui.add_space(4.0);
    let label = ui.label("System prompt");
    changed |= ui
        .add(
            egui::TextEdit::multiline(system_prompt)
                .hint_text("optional instructions for the model")
                .desired_rows(3)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id)
        .changed();
    ui.separator();
    egui::Grid::new("chat sampling")
        .num_columns(2)
        .spacing([8.0, 6.0])
        .show(ui, |ui| {
            changed |= drag_row(
                ui,
                "Temperature",
                egui::DragValue::new(&mut s.temperature)
                    .range(0.0..=2.0)
                    .speed(0.01),
                "0 = always the most likely token",
            );
            changed |= drag_row(
                ui,
                "Top-p",
                egui::DragValue::new(&mut s.top_p)
                    .range(0.0..=1.0)
                    .speed(0.01),
                "1 = off",
            );
            if remote {
                changed |= max_tokens_row(ui, &mut s.max_tokens);
                changed |= seed_row(ui, &mut s.seed);
                return;
            }
            changed |= drag_row(
                ui,
                "Top-k",
                egui::DragValue::new(&mut s.top_k).range(0..=64),
                "0 = off (at most 64 candidates)",
            );
            changed |= drag_row(
                ui,
                "Min-p",
                egui::DragValue::new(&mut s.min_p)
                    .range(0.0..=1.0)
                    .speed(0.01),
                "0 = off",
            );
            changed |= drag_row(
                ui,
                "Repeat penalty",
                egui::DragValue::new(&mut s.repeat_penalty)
                    .range(1.0..=2.0)
                    .speed(0.01),
                "1 = off",
            );
            changed |= max_tokens_row(ui, &mut s.max_tokens);
            changed |= drag_row(
                ui,
                "Context length",
                egui::DragValue::new(&mut s.context_length)
                    .range(64..=131072)
                    .speed(32.0),
                "tokens the model keeps (capped by the model; a change reloads it)",
            );
            changed |= seed_row(ui, &mut s.seed);
        });
    if remote {
        ui.weak(
            "A server takes temperature, top-p, max tokens and seed; top-k, min-p, the repeat \
             penalty and the context length are the server's own.",
        );
    }
    changed
}

fn max_tokens_row(ui: &mut egui::Ui, max_tokens: &mut usize) -> bool {
    drag_row(
        ui,
        "Max tokens",
        egui::DragValue::new(max_tokens)
            .range(1..=131072)
            .speed(4.0),
        "longest reply",
    )
}

fn drag_row(ui: &mut egui::Ui, name: &str, drag: egui::DragValue<'_>, hint: &str) -> bool {
    let label = ui.label(name).on_hover_text(hint);
    let changed = ui.add(drag).labelled_by(label.id).changed();
    ui.end_row();
    changed
}

/// "Fixed seed" reproduces a reply; unticked, every reply draws a new seed.
fn seed_row(ui: &mut egui::Ui, seed: &mut Option<u64>) -> bool {
    let mut fixed = seed.is_some();
    let mut changed = ui.checkbox(&mut fixed, "Fixed seed").changed();
    if changed {
        *seed = fixed.then_some(0);
    }
    if let Some(value) = seed {
        changed |= ui
            .add(egui::DragValue::new(value))
            .on_hover_text("the same seed and settings give the same reply")
            .accessible_name("Seed")
            .changed();
    }
    ui.end_row();
    changed
}
