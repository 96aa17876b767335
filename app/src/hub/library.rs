//! The local library: models in the models folder (from Settings), models already in the Hugging Face
//! hub cache, and loose files the user imported (recorded in `imported_models.json` in the data
//! dir). The Chat and Image tabs pick from [`list`]; the CLI and the Models tab delete and import.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::estimate::{self, MemoryNeed};
use super::inspect::{Inspected, inspect};
use super::kind::{LlmShape, ModelFormat, ModelKind};
use crate::paths::{Paths, write_atomic};
use crate::settings::Settings;

/// Where a library entry was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    ModelsFolder,
    HfCache,
    Imported,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::ModelsFolder => "models folder",
            Source::HfCache => "Hugging Face cache",
            Source::Imported => "imported",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LibraryEntry {
    /// Stable name for `drift models rm ID`: the path under the models folder, `hf:org/name[/file]`
    /// for the hub cache, `imported:file` for imports.
    pub id: String,
    /// What to show.
    pub name: String,
    pub source: Source,
    /// What to load: a `.gguf` file or a model folder.
    pub path: PathBuf,
    pub kind: ModelKind,
    pub format: ModelFormat,
    pub quantization: String,
    pub size_bytes: u64,
    pub weights_bytes: u64,
    pub shape: Option<LlmShape>,
}

impl LibraryEntry {
    fn new(id: String, name: String, source: Source, path: PathBuf, i: Inspected) -> LibraryEntry {
        LibraryEntry {
            id,
            name,
            source,
            path,
            kind: i.kind,
            format: i.format,
            quantization: i.quantization,
            size_bytes: i.size_bytes,
            weights_bytes: i.weights_bytes,
            shape: i.shape,
        }
    }

    /// Memory needed at `context` tokens (LLMs) or for 512x512 images (diffusion); None for an LLM
    /// whose shape could not be read.
    pub fn need(&self, context: u64) -> Option<MemoryNeed> {
        match self.kind {
            ModelKind::Llm => Some(estimate::llm_need(
                self.weights_bytes,
                self.shape.as_ref()?,
                context,
            )),
            ModelKind::Diffusion => Some(estimate::diffusion_need(self.weights_bytes, 512, 512)),
        }
    }
}

/// The three places the library looks.
#[derive(Clone, Debug)]
pub struct Roots {
    pub models_dir: PathBuf,
    /// The Hugging Face hub cache (`models--org--name/snapshots/<rev>/...`); None: not looked at.
    pub hf_cache: Option<PathBuf>,
    /// The JSON list of imported paths.
    pub imports_file: PathBuf,
}

impl Roots {
    pub fn new(settings: &Settings, paths: &Paths) -> Roots {
        Roots {
            models_dir: settings.models_dir(paths),
            hf_cache: hf_hub_cache(),
            imports_file: paths.data_dir.join("imported_models.json"),
        }
    }
}

/// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (huggingface_hub's rules).
pub fn hf_hub_cache() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("HF_HUB_CACHE")
        .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| {
            directories::BaseDirs::new().map(|b| b.home_dir().join(".cache/huggingface/hub"))
        })
}

/// Every model in the library (settings' models folder, the hub cache, imports), sorted by id.
pub fn list(settings: &Settings, paths: &Paths) -> Vec<LibraryEntry> {
    list_roots(&Roots::new(settings, paths))
}

/// [`list`] over explicit roots. Files that are not valid models are skipped (and logged).
pub fn list_roots(roots: &Roots) -> Vec<LibraryEntry> {
    let mut out = Vec::new();
    scan_models_dir(&roots.models_dir, &mut out);
    if let Some(cache) = &roots.hf_cache {
        scan_hf_cache(cache, &mut out);
    }
    for (id, path) in imported_ids(roots) {
        if out.iter().any(|e| e.path == path) {
            continue;
        }
        match inspect(&path) {
            Ok(i) => {
                let name = file_name(&path);
                out.push(LibraryEntry::new(id, name, Source::Imported, path, i));
            }
            Err(e) => log::warn!("imported model {}: {e:#}", path.display()),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// A folder the engine loads as one model.
fn is_model_folder(dir: &Path) -> bool {
    dir.join("model_index.json").is_file()
        || (dir.join("config.json").is_file()
            && std::fs::read_dir(dir).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            }))
}

/// Model folders and `.gguf` files under `dir` (a model folder is not searched further).
fn find_models(dir: &Path, depth: u32, found: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    if depth > 0 && is_model_folder(dir) {
        found.push(dir.to_path_buf());
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut items: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    items.sort();
    for p in items {
        if file_name(&p).starts_with('.') {
            continue;
        }
        if p.is_dir() {
            find_models(&p, depth + 1, found);
        } else if p.extension().is_some_and(|x| {
            x.eq_ignore_ascii_case("gguf") || x.eq_ignore_ascii_case("safetensors")
        }) && p.is_file()
        {
            // Loose .safetensors files are Stable Diffusion checkpoints (an LLM's live in a folder
            // with its config); anything else fails inspection and is skipped with a log line.
            found.push(p);
        }
    }
}

fn relative_id(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn scan_models_dir(root: &Path, out: &mut Vec<LibraryEntry>) {
    let mut found = Vec::new();
    find_models(root, 0, &mut found);
    for p in found {
        match inspect(&p) {
            Ok(i) => {
                let id = relative_id(root, &p);
                out.push(LibraryEntry::new(
                    id.clone(),
                    id,
                    Source::ModelsFolder,
                    p,
                    i,
                ));
            }
            Err(e) => log::info!("models folder: skipping {}: {e:#}", p.display()),
        }
    }
}

/// The snapshot `refs/main` points at, else the most recently written one.
fn current_snapshot(repo_dir: &Path) -> Option<PathBuf> {
    let snaps = repo_dir.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs/main")) {
        let s = snaps.join(rev.trim());
        if s.is_dir() {
            return Some(s);
        }
    }
    std::fs::read_dir(&snaps)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

fn scan_hf_cache(cache: &Path, out: &mut Vec<LibraryEntry>) {
    let Ok(rd) = std::fs::read_dir(cache) else {
        return;
    };
    let mut repos: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    repos.sort();
    for repo_dir in repos {
        let dir_name = file_name(&repo_dir);
        let Some(repo) = dir_name
            .strip_prefix("models--")
            .map(|r| r.replace("--", "/"))
        else {
            continue;
        };
        let Some(snap) = current_snapshot(&repo_dir) else {
            continue;
        };
        // Depth 1: the snapshot itself may be the model folder.
        let mut found = Vec::new();
        find_models(&snap, 1, &mut found);
        for p in found {
            match inspect(&p) {
                Ok(i) => {
                    let rel = relative_id(&snap, &p);
                    let id = if rel.is_empty() {
                        format!("hf:{repo}")
                    } else {
                        format!("hf:{repo}/{rel}")
                    };
                    let name = id.trim_start_matches("hf:").to_string();
                    out.push(LibraryEntry::new(id, name, Source::HfCache, p, i));
                }
                Err(e) => log::info!("hub cache: skipping {}: {e:#}", p.display()),
            }
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Imports {
    models: Vec<PathBuf>,
}

fn read_imports(file: &Path) -> Imports {
    match std::fs::read(file) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            log::warn!("{}: {e}; ignoring it", file.display());
            Imports::default()
        }),
        Err(_) => Imports::default(),
    }
}

/// `imported:<file name>` ids (a repeated name gets `-2`, `-3`... in import order).
fn imported_ids(roots: &Roots) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for p in read_imports(&roots.imports_file).models {
        let base = format!("imported:{}", file_name(&p));
        let mut id = base.clone();
        let mut n = 2;
        while out.iter().any(|(i, _)| *i == id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        out.push((id, p));
    }
    out
}

/// Adds a GGUF file or model folder to the library where it is (nothing is copied).
pub fn import(roots: &Roots, path: &Path) -> Result<LibraryEntry> {
    let path = std::fs::canonicalize(path)
        .with_context(|| format!("{} does not exist", path.display()))?;
    inspect(&path)?;
    let mut imports = read_imports(&roots.imports_file);
    if !imports.models.contains(&path) {
        imports.models.push(path.clone());
        let json = serde_json::to_vec_pretty(&imports)?;
        write_atomic(&roots.imports_file, &json)
            .with_context(|| format!("writing {}", roots.imports_file.display()))?;
    }
    list_roots(roots)
        .into_iter()
        .find(|e| e.path == path)
        .ok_or_else(|| anyhow!("{} was imported but is not listed", path.display()))
}

/// The entry with this id; else the one entry whose id or name contains it (case-insensitive).
pub fn find<'a>(entries: &'a [LibraryEntry], id: &str) -> Result<&'a LibraryEntry> {
    if let Some(e) = entries.iter().find(|e| e.id == id) {
        return Ok(e);
    }
    let needle = id.to_lowercase();
    let hits: Vec<_> = entries
        .iter()
        .filter(|e| e.id.to_lowercase().contains(&needle))
        .collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => bail!("no model {id:?} in the library (see `drift models list`)"),
        many => bail!(
            "{id:?} matches {} models: {}",
            many.len(),
            many.iter()
                .map(|e| e.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Deletes a model: its files (models folder), its repo from the hub cache, or, for an import,
/// only the record (the user's file stays where it is). Returns what was done, for the user.
pub fn remove(roots: &Roots, entry: &LibraryEntry) -> Result<String> {
    match entry.source {
        Source::ModelsFolder => {
            let root = std::fs::canonicalize(&roots.models_dir)?;
            let path = std::fs::canonicalize(&entry.path)?;
            if !path.starts_with(&root) || path == root {
                bail!("{} is not inside the models folder", path.display());
            }
            remove_path(&path)?;
            // Leftovers of an interrupted download of the same file.
            for suffix in [".part", ".part.json"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(p));
            }
            prune_empty_parents(&path, &root);
            Ok(format!("deleted {}", path.display()))
        }
        Source::HfCache => {
            let cache = roots
                .hf_cache
                .as_deref()
                .ok_or_else(|| anyhow!("no Hugging Face cache configured"))?;
            // .../models--org--name/snapshots/<rev>[/file.gguf]
            let repo_dir = entry
                .path
                .ancestors()
                .find(|a| a.parent() == Some(cache))
                .ok_or_else(|| anyhow!("{} is not in the hub cache", entry.path.display()))?
                .to_path_buf();
            if entry.format.is_single_file() {
                // One file of the repo: its blob and the snapshot link to it.
                if let Ok(blob) = std::fs::canonicalize(&entry.path)
                    && blob.starts_with(&repo_dir)
                {
                    std::fs::remove_file(&blob)
                        .with_context(|| format!("deleting {}", blob.display()))?;
                }
                std::fs::remove_file(&entry.path)
                    .with_context(|| format!("deleting {}", entry.path.display()))?;
                Ok(format!(
                    "deleted {} from the Hugging Face cache",
                    entry.path.display()
                ))
            } else {
                std::fs::remove_dir_all(&repo_dir)
                    .with_context(|| format!("deleting {}", repo_dir.display()))?;
                Ok(format!(
                    "deleted {} from the Hugging Face cache",
                    repo_dir.display()
                ))
            }
        }
        Source::Imported => {
            let mut imports = read_imports(&roots.imports_file);
            imports.models.retain(|p| *p != entry.path);
            write_atomic(&roots.imports_file, &serde_json::to_vec_pretty(&imports)?)?;
            Ok(format!(
                "removed {} from the library (the file itself was left in place)",
                entry.path.display()
            ))
        }
    }
}

fn remove_path(p: &Path) -> Result<()> {
    if p.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
    .with_context(|| format!("deleting {}", p.display()))
}

/// Removes now-empty folders between `p` and `root` (an emptied `org/` after its last model).
fn prune_empty_parents(p: &Path, root: &Path) {
    for dir in p.ancestors().skip(1) {
        if dir == root || !dir.starts_with(root) || std::fs::remove_dir(dir).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures")
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    fn roots(name: &str) -> (PathBuf, Roots) {
        let base =
            std::env::temp_dir().join(format!("drift-library-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let r = Roots {
            models_dir: base.join("models"),
            hf_cache: Some(base.join("hf/hub")),
            imports_file: base.join("data/imported_models.json"),
        };
        (base, r)
    }

    #[cfg(unix)]
    #[test]
    fn models_folder_hub_cache_and_imports_are_listed_and_removed() {
        let (base, r) = roots("all");
        // Models folder: a transformers folder in org/name, a GGUF in a repo folder, a partial
        // download (ignored).
        copy_dir(
            &fixtures().join("llm/llama-gqa"),
            &r.models_dir.join("org/llama-gqa"),
        );
        let gguf_dir = r.models_dir.join("org/ggufs");
        std::fs::create_dir_all(&gguf_dir).unwrap();
        std::fs::copy(
            fixtures().join("gguf/all_types.gguf"),
            gguf_dir.join("m.gguf"),
        )
        .unwrap();
        std::fs::write(gguf_dir.join("n.gguf.part"), b"partial").unwrap();
        // Hub cache: snapshot files are links to blobs, refs/main names the snapshot.
        let repo = r.hf_cache.as_ref().unwrap().join("models--Org--Tiny");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            let blob = repo.join("blobs").join(format!("blob-{f}"));
            std::fs::copy(fixtures().join("llm/qwen2-bias").join(f), &blob).unwrap();
            std::os::unix::fs::symlink(&blob, snap.join(f)).unwrap();
        }
        // An import from elsewhere.
        let loose = base.join("elsewhere");
        std::fs::create_dir_all(&loose).unwrap();
        std::fs::copy(
            fixtures().join("gguf/all_types.gguf"),
            loose.join("loose.gguf"),
        )
        .unwrap();
        let imported = import(&r, &loose.join("loose.gguf")).unwrap();
        assert_eq!(
            (imported.id.as_str(), imported.source),
            ("imported:loose.gguf", Source::Imported)
        );
        // Importing twice keeps one record; a non-model is refused.
        import(&r, &loose.join("loose.gguf")).unwrap();
        assert!(import(&r, &r.imports_file).is_err());

        let all = list_roots(&r);
        let ids: Vec<&str> = all.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "hf:Org/Tiny",
                "imported:loose.gguf",
                "org/ggufs/m.gguf",
                "org/llama-gqa"
            ]
        );
        let folder = find(&all, "llama-gqa").unwrap();
        assert_eq!(
            (folder.kind, folder.format),
            (ModelKind::Llm, ModelFormat::Safetensors)
        );
        assert_eq!(
            folder.size_bytes,
            super::super::inspect::dir_size(&folder.path)
        );
        let hf = find(&all, "hf:Org/Tiny").unwrap();
        // Sizes follow the links to the blobs.
        let blobs: u64 = ["config.json", "model.safetensors", "tokenizer.json"]
            .iter()
            .map(|f| {
                std::fs::metadata(fixtures().join("llm/qwen2-bias").join(f))
                    .unwrap()
                    .len()
            })
            .sum();
        assert_eq!(hf.size_bytes, blobs);
        assert!(hf.need(4096).unwrap().total() > hf.weights_bytes);
        assert!(find(&all, "gguf").is_err(), "ambiguous");
        assert!(
            find(&all, "nope")
                .unwrap_err()
                .to_string()
                .contains("no model")
        );

        // Removal, one source at a time.
        remove(&r, find(&all, "org/ggufs/m.gguf").unwrap()).unwrap();
        assert!(!gguf_dir.join("m.gguf").exists());
        remove(&r, folder).unwrap();
        assert!(!r.models_dir.join("org/llama-gqa").exists());
        let msg = remove(&r, find(&all, "imported:loose.gguf").unwrap()).unwrap();
        assert!(msg.contains("left in place") && loose.join("loose.gguf").exists());
        remove(&r, hf).unwrap();
        assert!(!repo.exists());
        let left: Vec<String> = list_roots(&r).into_iter().map(|e| e.id).collect();
        assert!(left.is_empty(), "{left:?}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn removal_refuses_paths_outside_the_models_folder() {
        let (base, r) = roots("outside");
        std::fs::create_dir_all(&r.models_dir).unwrap();
        let outside = base.join("x.gguf");
        std::fs::copy(fixtures().join("gguf/all_types.gguf"), &outside).unwrap();
        let mut e = import(&r, &outside).unwrap();
        e.source = Source::ModelsFolder;
        assert!(
            remove(&r, &e)
                .unwrap_err()
                .to_string()
                .contains("not inside")
        );
        assert!(outside.exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
