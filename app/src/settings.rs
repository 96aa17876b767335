//! User settings, persisted as JSON in the config dir. Unknown or missing fields fall back to defaults so
//! an older or newer settings file never stops the app from starting.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::paths::{Paths, write_atomic};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    /// Where downloaded models go; `None` = the data dir's `models/`.
    pub models_dir: Option<PathBuf>,
    /// Hugging Face token for gated models (`HF_TOKEN` wins when set).
    pub hf_token: Option<String>,
    /// Collect per-kernel GPU timings while models run (costs a little speed).
    pub profiling: bool,
    /// The chat model loaded last, offered again at start.
    pub last_chat_model: Option<PathBuf>,
    /// The image model loaded last.
    pub last_image_model: Option<PathBuf>,
    /// The window's OpenAI-compatible server (Models tab): on at start-up when it was on at exit.
    pub serve_enabled: bool,
    /// Its port on 127.0.0.1 (`None`: 8080; 0: any free port).
    pub serve_port: Option<u16>,
    /// Clients must send `Authorization: Bearer KEY` when set.
    pub serve_api_key: Option<String>,
}

impl Settings {
    /// Reads the settings; a missing file gives the defaults, an unreadable one too (with a warning).
    pub fn load(paths: &Paths) -> Settings {
        let file = paths.settings_file();
        match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                log::warn!("{}: {e}; using default settings", file.display());
                Settings::default()
            }),
            Err(_) => Settings::default(),
        }
    }

    pub fn save(&self, paths: &Paths) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        write_atomic(&paths.settings_file(), &json)
    }

    pub fn models_dir(&self, paths: &Paths) -> PathBuf {
        self.models_dir
            .clone()
            .unwrap_or_else(|| paths.default_models_dir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_survive_garbage() {
        let root = std::env::temp_dir().join(format!("drift-settings-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let paths = Paths::under(&root);
        assert_eq!(Settings::load(&paths), Settings::default());
        let s = Settings {
            profiling: true,
            models_dir: Some("/models".into()),
            ..Settings::default()
        };
        s.save(&paths).unwrap();
        assert_eq!(Settings::load(&paths), s);
        std::fs::write(paths.settings_file(), b"{not json").unwrap();
        assert_eq!(Settings::load(&paths), Settings::default());
        std::fs::write(
            paths.settings_file(),
            br#"{"profiling": true, "future_field": 3}"#,
        )
        .unwrap();
        assert!(Settings::load(&paths).profiling);
        let _ = std::fs::remove_dir_all(&root);
    }
}
