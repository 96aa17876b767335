//! The conversation list beside the chat: New, search by title or content, select, rename, delete
//! (after a confirmation). It only reports what the user asked for; the chat panel applies it.

use eframe::egui;

use super::conversations::Conversation;

#[derive(Default)]
pub struct ListState {
    pub search: String,
    /// The conversation being renamed and the title typed so far.
    pub renaming: Option<(String, String)>,
    /// The conversation waiting for "Delete" to be confirmed.
    pub confirm_delete: Option<String>,
}

pub enum ListAction {
    New,
    Select(String),
    Rename { id: String, title: String },
    Delete(String),
}

/// `busy`: the conversation a reply is being written into (it cannot be deleted meanwhile).
pub fn show(
    ui: &mut egui::Ui,
    state: &mut ListState,
    conversations: &[Conversation],
    current: &str,
    busy: Option<&str>,
) -> Option<ListAction> {
    let mut action = None;
    ui.add_space(4.0);
    if ui.button("New conversation").clicked() {
        action = Some(ListAction::New);
    }
    let label = ui.label("Search");
    ui.add(
        egui::TextEdit::singleline(&mut state.search)
            .hint_text("title or text")
            .desired_width(f32::INFINITY),
    )
    .labelled_by(label.id);
    ui.separator();

    let mut shown: Vec<&Conversation> = conversations
        .iter()
        .filter(|c| c.matches(&state.search))
        .collect();
    shown.sort_by(|a, b| b.updated.cmp(&a.updated).then(b.id.cmp(&a.id)));
    if shown.is_empty() {
        ui.weak("No conversation matches.");
    }
    egui::ScrollArea::vertical()
        .id_salt("conversation list")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            for c in shown {
                let selected = c.id == current;
                if selected && let Some(a) = current_row(ui, state, c, busy) {
                    action = Some(a);
                    continue;
                }
                if !selected
                    && ui
                        .add(egui::Button::selectable(false, c.title.as_str()).truncate())
                        .clicked()
                {
                    action = Some(ListAction::Select(c.id.clone()));
                }
            }
        });
    action
}

/// The selected conversation: its title, then Rename / Delete, or the rename field, or the
/// confirmation.
fn current_row(
    ui: &mut egui::Ui,
    state: &mut ListState,
    c: &Conversation,
    busy: Option<&str>,
) -> Option<ListAction> {
    if let Some((id, title)) = &mut state.renaming
        && *id == c.id
    {
        let edit = ui
            .add(egui::TextEdit::singleline(title).hint_text("New title"))
            .accessible_name("New title");
        let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        let mut save = enter;
        let mut cancel = false;
        ui.horizontal(|ui| {
            save |= ui.button("Save title").clicked();
            cancel = ui.button("Cancel rename").clicked();
        });
        let action = save.then(|| ListAction::Rename {
            id: id.clone(),
            title: title.trim().to_string(),
        });
        if save || cancel {
            state.renaming = None;
        }
        return action;
    }
    let _ = ui.add(egui::Button::selectable(true, c.title.as_str()).truncate());
    if state.confirm_delete.as_deref() == Some(c.id.as_str()) {
        ui.label(format!("Delete “{}”? This cannot be undone.", c.title));
        let mut action = None;
        ui.horizontal(|ui| {
            if ui.button("Yes, delete").clicked() {
                action = Some(ListAction::Delete(c.id.clone()));
                state.confirm_delete = None;
            }
            if ui.button("Keep it").clicked() {
                state.confirm_delete = None;
            }
        });
        return action;
    }
    ui.horizontal(|ui| {
        if ui.small_button("Rename").clicked() {
            state.renaming = Some((c.id.clone(), c.title.clone()));
            state.confirm_delete = None;
        }
        let deletable = busy != Some(c.id.as_str());
        if ui
            .add_enabled(deletable, egui::Button::new("Delete").small())
            .on_disabled_hover_text("a reply is being written into it: stop it first")
            .clicked()
        {
            state.confirm_delete = Some(c.id.clone());
        }
    });
    None
}
