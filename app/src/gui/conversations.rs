//! Saved conversations: one JSON file per conversation in the data dir's `conversations/`, written
//! atomically, read back at start. A file that does not parse is skipped with a warning and never
//! overwritten (new conversations get fresh file names).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use drift_engine::generate::GenerateOptions;
use drift_engine::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

use crate::paths::write_atomic;
use crate::remote::Sampling;

/// What the user sets per conversation. `seed: None` draws a fresh seed for every reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatSettings {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub max_tokens: usize,
    pub seed: Option<u64>,
    /// KV cache length the model is opened with (capped by the model's own limit).
    pub context_length: usize,
}

impl Default for ChatSettings {
    fn default() -> ChatSettings {
        let s = SamplingParams::default();
        ChatSettings {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            max_tokens: 1024,
            seed: None,
            context_length: drift_engine::models::load::DEFAULT_CONTEXT,
        }
    }
}

impl ChatSettings {
    /// The engine's options for one reply; `fresh_seed` is used when no seed is fixed.
    pub fn generate_options(&self, fresh_seed: u64) -> GenerateOptions {
        GenerateOptions {
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                seed: self.seed.unwrap_or(fresh_seed),
                ..SamplingParams::default()
            },
            max_tokens: self.max_tokens.max(1),
            stop: vec![],
        }
    }

    /// The OpenAI API's fields for a remote server; without a fixed seed the server picks one.
    pub fn remote_sampling(&self) -> Sampling {
        Sampling {
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
            max_tokens: Some(self.max_tokens.max(1)),
            seed: self.seed,
            stop: vec![],
        }
    }
}

/// Where a conversation's replies come from. Old files without it load as local.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Backend {
    /// Replies come from `remote` instead of the local engine (the server stays filled in when the
    /// user switches back to local).
    pub use_remote: bool,
    pub remote: RemoteServer,
}

/// An OpenAI-compatible server and one of its models. The API key is written to the conversation's
/// file only when `remember_key` is set; otherwise it lives in memory until the app closes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "StoredServer", into = "StoredServer")]
pub struct RemoteServer {
    pub url: String,
    pub model: String,
    pub api_key: String,
    pub remember_key: bool,
}

impl RemoteServer {
    /// Enough to send a request.
    pub fn is_complete(&self) -> bool {
        !self.url.trim().is_empty() && !self.model.trim().is_empty()
    }
}

/// `RemoteServer` as it is written to disk.
#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
struct StoredServer {
    url: String,
    model: String,
    remember_key: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<String>,
}

impl From<RemoteServer> for StoredServer {
    fn from(r: RemoteServer) -> StoredServer {
        StoredServer {
            api_key: (r.remember_key && !r.api_key.is_empty()).then_some(r.api_key),
            url: r.url,
            model: r.model,
            remember_key: r.remember_key,
        }
    }
}

impl From<StoredServer> for RemoteServer {
    fn from(s: StoredServer) -> RemoteServer {
        RemoteServer {
            url: s.url,
            model: s.model,
            api_key: s.api_key.unwrap_or_default(),
            remember_key: s.remember_key,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Token counts and speeds under one reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplyStats {
    /// Prompt tokens actually run (the rest came from the KV cache).
    pub prefill_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens: usize,
    pub decode_tokens_per_s: f64,
    /// Why it ended: "eos", "max_tokens", "cancelled", ...
    pub stop_reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ReplyStats>,
    /// Why this reply failed, shown under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: &str) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
            stats: None,
            error: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// The file name without `.json`; not stored inside the file.
    #[serde(skip)]
    pub id: String,
    pub title: String,
    /// The user named it (otherwise the title follows the first message).
    #[serde(default)]
    pub renamed: bool,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub updated: u64,
    #[serde(default)]
    pub model: Option<PathBuf>,
    #[serde(default)]
    pub system_prompt: String,
    #[serde(default)]
    pub settings: ChatSettings,
    #[serde(default)]
    pub backend: Backend,
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
}

pub const UNTITLED: &str = "Untitled";

impl Conversation {
    /// A blank conversation (not on disk until it is saved).
    pub fn new(id: String, model: Option<PathBuf>, settings: ChatSettings) -> Conversation {
        let now = unix_now();
        Conversation {
            id,
            title: UNTITLED.into(),
            renamed: false,
            created: now,
            updated: now,
            model,
            system_prompt: String::new(),
            settings,
            backend: Backend::default(),
            messages: Vec::new(),
        }
    }

    /// Nothing worth a file yet.
    pub fn is_blank(&self) -> bool {
        self.messages.is_empty() && !self.renamed
    }

    /// Names an unrenamed conversation after its first user message.
    pub fn retitle(&mut self) {
        if self.renamed {
            return;
        }
        if let Some(first) = self.messages.iter().find(|m| m.role == Role::User) {
            self.title = short_title(&first.content);
        }
    }

    /// Case-insensitive match on the title or any message.
    pub fn matches(&self, query: &str) -> bool {
        let q = query.trim().to_lowercase();
        q.is_empty()
            || self.title.to_lowercase().contains(&q)
            || self
                .messages
                .iter()
                .any(|m| m.content.to_lowercase().contains(&q))
    }
}

fn short_title(text: &str) -> String {
    const MAX_CHARS: usize = 48;
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let line = line.trim();
    if line.is_empty() {
        return UNTITLED.into();
    }
    let mut t: String = line.chars().take(MAX_CHARS).collect();
    if line.chars().count() > MAX_CHARS {
        t.push('…');
    }
    t
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What `load_all` found: the readable conversations (newest first) and a warning per skipped file.
pub struct Loaded {
    pub conversations: Vec<Conversation>,
    pub warnings: Vec<String>,
}

/// The conversations folder.
#[derive(Clone, Debug)]
pub struct ConversationStore {
    dir: PathBuf,
}

impl ConversationStore {
    pub fn new(dir: PathBuf) -> ConversationStore {
        ConversationStore { dir }
    }

    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// A file name no conversation (readable or not) uses yet.
    pub fn fresh_id(&self) -> String {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        (0u32..)
            .map(|n| format!("chat-{millis}-{n}"))
            .find(|id| !self.path_of(id).exists())
            .expect("an unused name")
    }

    /// Every `*.json` in the folder; unreadable or malformed files become warnings. A missing folder is
    /// simply no conversations.
    pub fn load_all(&self) -> Loaded {
        let mut conversations = Vec::new();
        let mut warnings = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Loaded {
                    conversations,
                    warnings,
                };
            }
            Err(e) => {
                warnings.push(format!("could not read {}: {e}", self.dir.display()));
                return Loaded {
                    conversations,
                    warnings,
                };
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(id) = conversation_id(&path) else {
                continue;
            };
            match read_conversation(&path) {
                Ok(mut c) => {
                    c.id = id;
                    conversations.push(c);
                }
                Err(e) => {
                    warnings.push(format!("skipped {} (left untouched): {e}", path.display()))
                }
            }
        }
        conversations.sort_by(|a, b| b.updated.cmp(&a.updated).then(b.id.cmp(&a.id)));
        Loaded {
            conversations,
            warnings,
        }
    }

    pub fn save(&self, c: &Conversation) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(c).map_err(std::io::Error::other)?;
        write_atomic(&self.path_of(&c.id), &json)
    }

    /// Removes a conversation's file; one that was never saved is fine.
    pub fn delete(&self, id: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path_of(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// `chat-….json` → `chat-…`; hidden files (atomic-write temporaries) and other files → None.
fn conversation_id(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if name.starts_with('.') || !path.is_file() {
        return None;
    }
    name.strip_suffix(".json").map(str::to_string)
}

fn read_conversation(path: &Path) -> Result<Conversation, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_store(name: &str) -> (PathBuf, ConversationStore) {
        let dir = std::env::temp_dir().join(format!("drift-convs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = ConversationStore::new(dir.join("conversations"));
        (dir, store)
    }

    fn sample(store: &ConversationStore, first: &str) -> Conversation {
        let mut c = Conversation::new(
            store.fresh_id(),
            Some("/models/a.gguf".into()),
            ChatSettings {
                temperature: 0.3,
                seed: Some(9),
                context_length: 512,
                ..ChatSettings::default()
            },
        );
        c.system_prompt = "Be brief.".into();
        c.messages.push(ChatMessage::new(Role::User, first));
        let mut reply = ChatMessage::new(Role::Assistant, "```rust\nfn main() {}\n```");
        reply.stats = Some(ReplyStats {
            prefill_tokens: 12,
            prefill_tokens_per_s: 340.5,
            decode_tokens: 7,
            decode_tokens_per_s: 21.25,
            stop_reason: "eos".into(),
        });
        c.messages.push(reply);
        c.retitle();
        c
    }

    #[test]
    fn save_load_rename_delete_and_search() {
        let (root, store) = temp_store("crud");
        assert!(store.load_all().conversations.is_empty(), "missing folder");
        let a = sample(&store, "How do I write a main function in Rust?");
        store.save(&a).unwrap();
        let mut b = sample(&store, "Tell me about GPUs");
        assert_ne!(a.id, b.id);
        b.updated = a.updated + 10;
        store.save(&b).unwrap();

        let loaded = store.load_all();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        assert_eq!(
            loaded.conversations,
            vec![b.clone(), a.clone()],
            "newest first"
        );
        assert_eq!(a.title, "How do I write a main function in Rust?");

        // Rename: the title sticks even when messages change.
        let mut renamed = loaded.conversations[1].clone();
        renamed.title = "Rust basics".into();
        renamed.renamed = true;
        renamed
            .messages
            .push(ChatMessage::new(Role::User, "another question"));
        renamed.retitle();
        store.save(&renamed).unwrap();
        let again = store.load_all().conversations;
        let r = again.iter().find(|c| c.id == a.id).unwrap();
        assert_eq!(r.title, "Rust basics");
        assert_eq!(r.messages.len(), 3);

        // Search: title and content, case-insensitive.
        assert!(r.matches("rust BASICS"));
        assert!(r.matches("FN MAIN"));
        assert!(!r.matches("gpus"));
        assert!(again.iter().find(|c| c.id == b.id).unwrap().matches("gpus"));
        assert!(r.matches("  "));

        store.delete(&a.id).unwrap();
        store.delete(&a.id).unwrap(); // already gone: fine
        let left = store.load_all().conversations;
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, b.id);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_corrupt_file_is_skipped_with_a_warning_and_never_overwritten() {
        let (root, store) = temp_store("corrupt");
        let good = sample(&store, "hello");
        store.save(&good).unwrap();
        let bad = store.path_of("chat-1-0");
        std::fs::write(&bad, b"{\"title\": \"half a fi").unwrap();
        let wrong_shape = store.path_of("chat-2-0");
        std::fs::write(&wrong_shape, b"[1, 2, 3]").unwrap();
        // Temporaries of an interrupted atomic write and unrelated files are not conversations.
        std::fs::write(store.path_of(".chat-3-0.json.77"), b"junk").unwrap();
        std::fs::write(root.join("conversations/notes.txt"), b"junk").unwrap();

        let loaded = store.load_all();
        assert_eq!(loaded.conversations, vec![good]);
        assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
        assert!(loaded.warnings.iter().any(|w| w.contains("chat-1-0.json")));
        assert!(loaded.warnings.iter().any(|w| w.contains("chat-2-0.json")));

        // New ids never collide with the unreadable files, so they are never overwritten.
        let fresh = store.fresh_id();
        assert!(!store.path_of(&fresh).exists());
        assert_eq!(std::fs::read(&bad).unwrap(), b"{\"title\": \"half a fi");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn older_files_with_missing_fields_still_load() {
        let (root, store) = temp_store("compat");
        std::fs::create_dir_all(root.join("conversations")).unwrap();
        std::fs::write(
            store.path_of("chat-5-0"),
            br#"{"title": "old", "messages": [{"role": "user", "content": "hi"}], "future": 1}"#,
        )
        .unwrap();
        let c = store.load_all().conversations;
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].id, "chat-5-0");
        assert_eq!(c[0].settings, ChatSettings::default());
        assert_eq!(c[0].backend, Backend::default(), "no backend: local");
        assert!(!c[0].backend.use_remote);
        assert_eq!(c[0].messages[0].role, Role::User);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_remote_backend_is_saved_and_its_key_only_when_remembered() {
        let (root, store) = temp_store("remote");
        let mut c = sample(&store, "hello server");
        c.backend = Backend {
            use_remote: true,
            remote: RemoteServer {
                url: "http://gpu-box:8000/v1".into(),
                model: "Qwen/Qwen2.5-72B-Instruct".into(),
                api_key: "sk-session-only".into(),
                remember_key: false,
            },
        };
        store.save(&c).unwrap();
        let text = std::fs::read_to_string(store.path_of(&c.id)).unwrap();
        assert!(!text.contains("sk-session-only"), "{text}");
        assert!(text.contains("gpu-box:8000"));
        let loaded = store.load_all().conversations.remove(0);
        assert!(loaded.backend.use_remote);
        assert_eq!(loaded.backend.remote.model, "Qwen/Qwen2.5-72B-Instruct");
        assert_eq!(loaded.backend.remote.api_key, "", "not remembered");

        c.backend.remote.remember_key = true;
        store.save(&c).unwrap();
        assert!(
            std::fs::read_to_string(store.path_of(&c.id))
                .unwrap()
                .contains("sk-session-only")
        );
        let loaded = store.load_all().conversations.remove(0);
        assert_eq!(loaded.backend, c.backend);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn titles_come_from_the_first_line_and_are_shortened() {
        assert_eq!(short_title("\n  Hello there \nsecond"), "Hello there");
        assert_eq!(short_title("   "), UNTITLED);
        let long = "x".repeat(60);
        assert_eq!(short_title(&long), format!("{}…", "x".repeat(48)));
    }
}
