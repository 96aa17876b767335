//! The transcript: user messages as typed, replies rendered as Markdown (code blocks included) while
//! they stream, token counts and speeds under each reply, errors inline; Copy on every message, Edit on
//! user messages (resend from there), Regenerate on the last reply.

use eframe::egui;
use egui_commonmark::{CommonMarkCache, CommonMarkViewer};

use super::conversations::{ChatMessage, Conversation, ReplyStats, Role};

#[derive(Default)]
pub struct TranscriptState {
    pub markdown: CommonMarkCache,
    /// The user message being edited (its index) and the text so far.
    pub editing: Option<(usize, String)>,
}

pub enum TranscriptAction {
    /// Replace the last reply with a new one.
    Regenerate,
    /// Replace message `index` (a user message) and everything after it, then reply.
    Resend { index: usize, text: String },
}

/// `streaming`: a reply is being written into this conversation's last message. `busy`: any reply
/// is (nothing can be resent meanwhile).
pub fn show(
    ui: &mut egui::Ui,
    state: &mut TranscriptState,
    conv: &Conversation,
    streaming: bool,
    busy: bool,
) -> Option<TranscriptAction> {
    let mut action = None;
    let last = conv.messages.len().saturating_sub(1);
    for (i, m) in conv.messages.iter().enumerate() {
        ui.push_id(i, |ui| {
            let live = streaming && i == last;
            let a = match m.role {
                Role::User => user_message(ui, state, i, m, busy),
                Role::Assistant => reply(ui, state, m, live, i == last && !busy),
            };
            if a.is_some() {
                action = a;
            }
        });
        ui.add_space(10.0);
    }
    action
}

fn user_message(
    ui: &mut egui::Ui,
    state: &mut TranscriptState,
    index: usize,
    m: &ChatMessage,
    busy: bool,
) -> Option<TranscriptAction> {
    let mut action = None;
    if let Some((i, text)) = &mut state.editing
        && *i == index
    {
        ui.label(egui::RichText::new("You (editing)").strong());
        ui.add(
            egui::TextEdit::multiline(text)
                .hint_text("Edited message")
                .desired_rows(2)
                .desired_width(f32::INFINITY),
        )
        .accessible_name("Edited message");
        let mut cancel = false;
        ui.horizontal(|ui| {
            let ok = !busy && !text.trim().is_empty();
            if ui
                .add_enabled(ok, egui::Button::new("Send edited"))
                .on_hover_text("replaces this message and everything after it")
                .clicked()
            {
                action = Some(TranscriptAction::Resend {
                    index,
                    text: text.trim().to_string(),
                });
            }
            cancel = ui.button("Cancel edit").clicked();
        });
        if action.is_some() || cancel {
            state.editing = None;
        }
        return action;
    }
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new("You").strong());
        if ui.small_button("Copy").clicked() {
            ui.ctx().copy_text(m.content.clone());
        }
        if ui
            .add_enabled(!busy, egui::Button::new("Edit").small())
            .clicked()
        {
            state.editing = Some((index, m.content.clone()));
        }
    });
    ui.add(egui::Label::new(&m.content).selectable(true));
    action
}

fn reply(
    ui: &mut egui::Ui,
    state: &mut TranscriptState,
    m: &ChatMessage,
    live: bool,
    can_regenerate: bool,
) -> Option<TranscriptAction> {
    let mut action = None;
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new("Assistant").strong());
        if live {
            ui.spinner();
        }
        if !live && ui.small_button("Copy").clicked() {
            ui.ctx().copy_text(m.content.clone());
        }
        if can_regenerate && ui.small_button("Regenerate").clicked() {
            action = Some(TranscriptAction::Regenerate);
        }
    });
    if !m.content.is_empty() {
        CommonMarkViewer::new().show(ui, &mut state.markdown, &m.content);
    } else if live {
        ui.weak("…");
    }
    if let Some(s) = &m.stats {
        ui.weak(stats_line(s));
    }
    if let Some(e) = &m.error {
        ui.colored_label(ui.visuals().error_fg_color, format!("Error: {e}"));
    }
    action
}

/// "42 tokens · prefill 18 tokens at 350 tok/s · decode 21.3 tok/s · end of text"; without the
/// prefill part when the prompt's size is unknown (a server that reports no usage).
pub fn stats_line(s: &ReplyStats) -> String {
    let why = match s.stop_reason.as_str() {
        "eos" => "end of text",
        "max_tokens" => "token limit",
        "cancelled" => "stopped",
        "context_full" => "context full",
        "stop_string" => "stop string",
        other => other,
    };
    if s.prefill_tokens == 0 {
        return format!(
            "{} tokens · decode {:.1} tok/s · {why}",
            s.decode_tokens, s.decode_tokens_per_s
        );
    }
    format!(
        "{} tokens · prefill {} tokens at {:.0} tok/s · decode {:.1} tok/s · {why}",
        s.decode_tokens, s.prefill_tokens, s.prefill_tokens_per_s, s.decode_tokens_per_s
    )
}
