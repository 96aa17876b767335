//! Where Drift keeps things: settings in the platform's config dir, conversations, images and models in its
//! data dir (XDG on Linux). `DRIFT_HOME` puts both under one folder (tests, portable installs).

use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Paths {
    pub config_dir: PathBuf,
    pub data_dir: PathBuf,
}

impl Paths {
    pub fn from_env() -> Paths {
        if let Some(home) = std::env::var_os("DRIFT_HOME") {
            return Paths::under(Path::new(&home));
        }
        match directories::ProjectDirs::from("", "", "drift") {
            Some(d) => Paths {
                config_dir: d.config_dir().to_path_buf(),
                data_dir: d.data_dir().to_path_buf(),
            },
            None => Paths::under(&std::env::temp_dir().join("drift")),
        }
    }

    /// Everything under one folder: `config/` and `data/`.
    pub fn under(root: &Path) -> Paths {
        Paths {
            config_dir: root.join("config"),
            data_dir: root.join("data"),
        }
    }

    pub fn settings_file(&self) -> PathBuf {
        self.config_dir.join("settings.json")
    }

    pub fn conversations_dir(&self) -> PathBuf {
        self.data_dir.join("conversations")
    }

    pub fn images_dir(&self) -> PathBuf {
        self.data_dir.join("images")
    }

    /// The default models folder (settings may point elsewhere).
    pub fn default_models_dir(&self) -> PathBuf {
        self.data_dir.join("models")
    }
}

/// Writes a file so that a reader (or a crash) sees either the old content or the new, never a mix:
/// a temporary file in the same folder, flushed to disk, then renamed over the target.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("drift-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let f = dir.join("a/b.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.join("a")).unwrap().collect();
        assert_eq!(names.len(), 1, "temporary files left behind");
        // A folder where the file should go: an error, and the folder untouched.
        std::fs::create_dir_all(dir.join("c/d.json")).unwrap();
        assert!(write_atomic(&dir.join("c/d.json"), b"x").is_err());
        assert!(dir.join("c/d.json").is_dir());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
