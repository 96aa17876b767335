//! The chat's remote replies and model lists, run on their own threads: a remote server needs no GPU,
//! so these never wait in the app's GPU queue.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;

use drift_engine::tokenize::chat_template::Message;
use eframe::egui;

use super::conversations::{RemoteServer, ReplyStats};
use super::llm_worker::Event;
use crate::remote::{Finish, Prompt, RemoteClient, Sampling, StreamedReply};

pub struct RemoteReplyRequest {
    pub server: RemoteServer,
    pub messages: Vec<Message>,
    pub sampling: Sampling,
}

fn client(server: &RemoteServer) -> Result<RemoteClient, String> {
    RemoteClient::new(&server.url, Some(&server.api_key)).map_err(|e| e.message)
}

/// Streams one reply into `events` (Started, Piece…, then Done or Failed), stopping when `cancel` is set.
pub fn reply(
    req: RemoteReplyRequest,
    events: &Sender<Event>,
    ctx: &egui::Context,
    cancel: &AtomicBool,
) {
    let send = |e: Event| {
        let _ = events.send(e);
        ctx.request_repaint();
    };
    let client = match client(&req.server) {
        Ok(c) => c,
        Err(e) => return send(Event::Failed(e)),
    };
    send(Event::Started);
    let result = client.stream(
        req.server.model.trim(),
        Prompt::Chat(&req.messages),
        &req.sampling,
        cancel,
        &mut |piece| send(Event::Piece(piece.to_string())),
    );
    send(match result {
        Ok(reply) => Event::Done {
            stats: stats(&reply),
            text: reply.text,
        },
        Err(e) => Event::Failed(e.message),
    });
}

/// The server's model ids (blocking: call it on a thread).
pub fn list_models(server: &RemoteServer) -> Result<Vec<String>, String> {
    let models = client(server)?.list_models().map_err(|e| e.message)?;
    Ok(models.into_iter().map(|m| m.id).collect())
}

/// A remote reply's counts and speeds in the terms local replies use (speeds as seen from here:
/// the prompt's includes the network and the server's queue).
fn stats(reply: &StreamedReply) -> ReplyStats {
    let s = reply.speeds();
    let stop_reason = match &reply.finish {
        Finish::Cancelled => "cancelled",
        Finish::Server(why) => match why.as_str() {
            "stop" => "eos",
            "length" => "max_tokens",
            other => other,
        },
    };
    ReplyStats {
        prefill_tokens: s.prompt_tokens,
        prefill_tokens_per_s: s.prompt_tokens_per_s,
        decode_tokens: s.completion_tokens,
        decode_tokens_per_s: s.completion_tokens_per_s,
        stop_reason: stop_reason.to_string(),
    }
}
