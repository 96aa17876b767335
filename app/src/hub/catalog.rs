//! The curated model catalog (`assets/catalog.json`, compiled into the binary).
//!
//! Each entry names a Hugging Face repo, a pinned revision and the files Drift needs from it. A file's
//! `sha256` (and `size`) are what the download must match; a file without a `sha256` is verified
//! against the LFS sha256 the hub reports at download time (`X-Linked-Etag`), and its `size`, when
//! given, only informs the displayed download size and the free-space check. LLM entries carry the
//! shape the memory estimate needs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::kind::{LlmShape, ModelFormat, ModelKind};

/// The catalog shipped with this build.
const BUILTIN: &str = include_str!("../../../assets/catalog.json");

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub version: u32,
    pub models: Vec<CatalogEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// Short stable name for the CLI (`drift models pull qwen2.5-0.5b-instruct-q4_k_m`).
    pub id: String,
    pub name: String,
    /// `org/name` on the hub.
    pub repo: String,
    /// A commit hash (pinned) or a branch.
    pub revision: String,
    pub kind: ModelKind,
    pub format: ModelFormat,
    pub quantization: String,
    pub license: String,
    /// The repo asks users to accept a license: downloads need a token.
    pub gated: bool,
    pub files: Vec<CatalogFile>,
    /// Present for LLMs.
    #[serde(default)]
    pub llm: Option<LlmShape>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogFile {
    /// Path inside the repo (`unet/diffusion_pytorch_model.fp16.safetensors`).
    pub path: String,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub sha256: Option<String>,
}

impl Catalog {
    /// The catalog compiled into this build.
    pub fn builtin() -> Result<Catalog> {
        Catalog::parse(BUILTIN).context("the built-in model catalog")
    }

    /// Parses and validates a catalog document.
    pub fn parse(text: &str) -> Result<Catalog> {
        let catalog: Catalog = serde_json::from_str(text).context("malformed catalog JSON")?;
        catalog.validate()?;
        Ok(catalog)
    }

    fn validate(&self) -> Result<()> {
        if self.version != 1 {
            bail!(
                "catalog version {} (this build reads version 1)",
                self.version
            );
        }
        let mut ids = HashSet::new();
        for e in &self.models {
            let bad = |msg: String| anyhow::anyhow!("catalog entry {:?}: {msg}", e.id);
            if e.id.trim().is_empty() || e.id.contains(char::is_whitespace) {
                return Err(bad("the id must be one word".into()));
            }
            if !ids.insert(e.id.as_str()) {
                return Err(bad("duplicate id".into()));
            }
            if e.repo.split('/').filter(|p| !p.is_empty()).count() != 2 {
                return Err(bad(format!("repo {:?} is not org/name", e.repo)));
            }
            if e.revision.trim().is_empty() {
                return Err(bad("empty revision".into()));
            }
            if e.files.is_empty() {
                return Err(bad("no files".into()));
            }
            let mut paths = HashSet::new();
            for f in &e.files {
                if !is_safe_relative(&f.path) {
                    return Err(bad(format!(
                        "file path {:?} is not a plain relative path",
                        f.path
                    )));
                }
                if !paths.insert(f.path.as_str()) {
                    return Err(bad(format!("file {:?} listed twice", f.path)));
                }
                if f.size == Some(0) {
                    return Err(bad(format!("file {:?} has size 0", f.path)));
                }
                if is_weights(&f.path) && f.size.is_none() {
                    return Err(bad(format!("weights file {:?} needs a size", f.path)));
                }
                if let Some(s) = &f.sha256
                    && (s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    return Err(bad(format!(
                        "file {:?}: sha256 is not 64 hex digits",
                        f.path
                    )));
                }
            }
            if (e.kind == ModelKind::Llm) != e.llm.is_some() {
                return Err(bad(
                    "LLM entries, and only they, carry an `llm` shape".into()
                ));
            }
            if let Some(s) = &e.llm
                && [
                    s.params, s.layers, s.heads, s.kv_heads, s.head_dim, s.hidden, s.vocab,
                ]
                .contains(&0)
            {
                return Err(bad("the llm shape has a zero".into()));
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<&CatalogEntry> {
        self.models.iter().find(|e| e.id.eq_ignore_ascii_case(id))
    }

    /// Entries whose id, name, repo or quantization contain every word of `text` (case-insensitive);
    /// all entries for an empty text.
    pub fn search(&self, text: &str) -> Vec<&CatalogEntry> {
        let words: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
        self.models
            .iter()
            .filter(|e| {
                let hay = format!(
                    "{} {} {} {} {} {}",
                    e.id, e.name, e.repo, e.quantization, e.kind, e.format
                )
                .to_lowercase();
                words.iter().all(|w| hay.contains(w.as_str()))
            })
            .collect()
    }
}

impl CatalogEntry {
    /// Bytes to download (files without a known size count 0: they are small metadata files).
    pub fn download_size(&self) -> u64 {
        self.files.iter().filter_map(|f| f.size).sum()
    }

    /// Bytes of the weights files (what the memory estimate loads).
    pub fn weights_size(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| is_weights(&f.path))
            .filter_map(|f| f.size)
            .sum()
    }

    /// Where the entry's files go: `<models dir>/<org>/<name>/`.
    pub fn local_dir(&self, models_dir: &Path) -> PathBuf {
        repo_dir(models_dir, &self.repo)
    }

    /// What the library will load: the GGUF file, or the folder.
    pub fn local_path(&self, models_dir: &Path) -> PathBuf {
        let dir = self.local_dir(models_dir);
        match self.files.as_slice() {
            [one] if self.format.is_single_file() => dir.join(&one.path),
            _ => dir,
        }
    }

    /// Every file is on disk (a finished download; parts are never at the final name).
    pub fn is_installed(&self, models_dir: &Path) -> bool {
        let dir = self.local_dir(models_dir);
        self.files.iter().all(|f| dir.join(&f.path).is_file())
    }
}

/// `<models dir>/<org>/<name>` for a repo id.
pub fn repo_dir(models_dir: &Path, repo: &str) -> PathBuf {
    repo.split('/')
        .filter(|p| !p.is_empty())
        .fold(models_dir.to_path_buf(), |d, p| d.join(p))
}

/// Model weights (as opposed to configs and tokenizers).
pub fn is_weights(path: &str) -> bool {
    path.ends_with(".gguf") || path.ends_with(".safetensors")
}

/// A repo path that cannot escape the folder it is joined to.
pub fn is_safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_catalog_is_valid() {
        let c = Catalog::builtin().unwrap();
        assert!(c.models.len() >= 12, "{} entries", c.models.len());
        for e in &c.models {
            assert!(!e.files.is_empty(), "{}", e.id);
            assert!(e.download_size() > 0 && e.weights_size() > 0, "{}", e.id);
            for f in &e.files {
                assert!(f.size.is_none_or(|s| s > 0), "{} {}", e.id, f.path);
            }
        }
        // The issue's list, by repo.
        for repo in [
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct",
            "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
            "Qwen/Qwen2.5-3B-Instruct-GGUF",
            "meta-llama/Llama-3.2-1B-Instruct",
            "meta-llama/Llama-3.2-3B-Instruct",
            "stable-diffusion-v1-5/stable-diffusion-v1-5",
        ] {
            assert!(c.models.iter().any(|e| e.repo == repo), "{repo} missing");
        }
        assert!(
            c.models
                .iter()
                .filter(|e| e.gated)
                .all(|e| e.repo.starts_with("meta-llama/"))
        );
    }

    #[test]
    fn search_matches_every_word() {
        let c = Catalog::builtin().unwrap();
        let ids = |q: &str| c.search(q).iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids("qwen 3b"), ["qwen2.5-3b-instruct-q4_k_m"]);
        assert!(ids("SMOLLM2 gguf").len() == 3);
        assert_eq!(ids("").len(), c.models.len());
        assert!(ids("no such model").is_empty());
        assert!(c.get("LLAMA-3.2-1B-INSTRUCT").unwrap().gated);
    }

    #[test]
    fn bad_catalogs_are_rejected_with_a_reason() {
        let entry = |id: &str, files: &str| {
            format!(
                r#"{{"id":"{id}","name":"n","repo":"a/b","revision":"main","kind":"diffusion",
                   "format":"diffusers","quantization":"F16","license":"x","gated":false,
                   "files":{files}}}"#
            )
        };
        let doc = |models: &[String]| format!(r#"{{"version":1,"models":[{}]}}"#, models.join(","));
        let ok = entry("a", r#"[{"path":"unet/w.safetensors","size":5}]"#);
        Catalog::parse(&doc(std::slice::from_ref(&ok))).unwrap();
        let cases = [
            (doc(&[ok.clone(), ok.clone()]), "duplicate id"),
            (doc(&[entry("b", "[]")]), "no files"),
            (
                doc(&[entry("c", r#"[{"path":"w.safetensors"}]"#)]),
                "needs a size",
            ),
            (
                doc(&[entry("d", r#"[{"path":"w.json","size":0}]"#)]),
                "size 0",
            ),
            (
                doc(&[entry("e", r#"[{"path":"../w.gguf","size":1}]"#)]),
                "plain relative",
            ),
            (
                doc(&[entry("f", r#"[{"path":"w.gguf","size":1,"sha256":"abc"}]"#)]),
                "64 hex",
            ),
            ("{\"version\":2,\"models\":[]}".to_string(), "version 2"),
            ("[1,2]".to_string(), "malformed"),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", Catalog::parse(&text).unwrap_err());
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
    }

    #[test]
    fn local_layout_mirrors_the_repo_id() {
        let c = Catalog::builtin().unwrap();
        let root = Path::new("/m");
        let q = c.get("qwen2.5-0.5b-instruct-q4_k_m").unwrap();
        assert_eq!(
            q.local_path(root),
            Path::new("/m/Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")
        );
        let sd = c.get("stable-diffusion-1.5-fp16").unwrap();
        assert_eq!(
            sd.local_path(root),
            Path::new("/m/stable-diffusion-v1-5/stable-diffusion-v1-5")
        );
        assert!(!sd.is_installed(root));
        assert!(is_safe_relative("a/b.c") && !is_safe_relative("a//b") && !is_safe_relative("/a"));
    }
}
