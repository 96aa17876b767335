//! The models a server offers, by id, and the ones it has loaded. Models load on first use, on the
//! shared GPU, while the caller holds the GPU queue: one chat model is resident at a time (asking for
//! another unloads it first) plus the image model, kept at the image size it was last opened for.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::UNIX_EPOCH;

use anyhow::{Result, bail};
use drift_engine::Gpu;
use drift_engine::diffusion::pipeline::SdPipeline;
use drift_engine::generate::LlmSession;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use serde_json::{Value, json};

use super::api_error::ApiError;

#[derive(Clone, Debug)]
pub struct ModelEntry {
    pub id: String,
    pub path: PathBuf,
    /// The file's modification time (seconds since 1970), OpenAI's `created`.
    pub created: u64,
}

impl ModelEntry {
    fn new(path: &Path) -> Result<ModelEntry> {
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("model {}: {e}", path.display()))?;
        Ok(ModelEntry {
            id: model_id(path),
            path: path.to_path_buf(),
            created: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
        })
    }

    fn to_json(&self, kind: &str) -> Value {
        json!({"id": self.id, "object": "model", "created": self.created, "owned_by": "drift", "drift_kind": kind})
    }
}

/// A model's id: a folder's name, a file's name without its extension (a `.safetensors` file inside a
/// Hugging Face folder stands for the folder).
pub fn model_id(path: &Path) -> String {
    let is_folder_weight = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
        && path
            .parent()
            .is_some_and(|p| p.join("config.json").is_file());
    let named = if is_folder_weight {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let name = if named.is_dir() {
        named.file_name()
    } else {
        named.file_stem()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| named.display().to_string())
}

/// What is loaded right now. Only touched while holding the GPU queue.
#[derive(Default)]
pub struct Loaded {
    llm: Option<(String, LlmSession)>,
    image: Option<SdPipeline>,
}

pub struct ModelRegistry {
    llms: Vec<ModelEntry>,
    image: Option<ModelEntry>,
    context: Option<usize>,
    loaded: Mutex<Loaded>,
}

impl ModelRegistry {
    /// Checks that every path exists and that ids are unique; loads nothing.
    pub fn new(
        llms: &[PathBuf],
        image: Option<&Path>,
        context: Option<usize>,
    ) -> Result<ModelRegistry> {
        let llms = llms
            .iter()
            .map(|p| ModelEntry::new(p))
            .collect::<Result<Vec<_>>>()?;
        let image = image.map(ModelEntry::new).transpose()?;
        let mut ids: Vec<&str> = llms.iter().chain(&image).map(|m| m.id.as_str()).collect();
        ids.sort();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            bail!(
                "two models have the id '{}' (ids are file or folder names); rename one",
                w[0]
            );
        }
        Ok(ModelRegistry {
            llms,
            image,
            context,
            loaded: Mutex::default(),
        })
    }

    /// `GET /v1/models`.
    pub fn list_json(&self) -> Value {
        let data: Vec<Value> = self
            .llms
            .iter()
            .map(|m| m.to_json("llm"))
            .chain(self.image.iter().map(|m| m.to_json("image")))
            .collect();
        json!({"object": "list", "data": data})
    }

    /// `GET /v1/models/{id}`.
    pub fn model_json(&self, id: &str) -> Option<Value> {
        self.llms
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.to_json("llm"))
            .or_else(|| {
                self.image
                    .iter()
                    .find(|m| m.id == id)
                    .map(|m| m.to_json("image"))
            })
    }

    fn ids(&self) -> Vec<&str> {
        self.llms.iter().map(|m| m.id.as_str()).collect()
    }

    pub fn llm(&self, id: &str) -> Result<&ModelEntry, ApiError> {
        self.llms.iter().find(|m| m.id == id).ok_or_else(|| {
            if self.image.as_ref().is_some_and(|m| m.id == id) {
                ApiError::bad_param(
                    "model",
                    format!("'{id}' is an image model; use /v1/images/generations"),
                )
                .with_code("model_not_found")
            } else {
                ApiError::unknown_model(id, &self.ids())
            }
        })
    }

    /// The image model; `requested` (the request's optional `model`) must name it.
    pub fn image(&self, requested: Option<&str>) -> Result<&ModelEntry, ApiError> {
        let Some(entry) = &self.image else {
            return Err(ApiError::bad_param(
                "model",
                "This server has no image model; start it with --image-model PATH",
            )
            .with_code("model_not_found"));
        };
        match requested {
            Some(id) if id != entry.id => Err(ApiError::unknown_model(id, &[entry.id.as_str()])),
            _ => Ok(entry),
        }
    }

    /// Call with the GPU queue held.
    pub fn loaded(&self) -> MutexGuard<'_, Loaded> {
        // A handler that panicked mid-generation may have left the session's cache inconsistent.
        self.loaded.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            *guard = Loaded::default();
            guard
        })
    }

    pub fn context(&self) -> Option<usize> {
        self.context
    }
}

impl Loaded {
    /// The session for `entry`, loading it (and unloading another chat model) when needed.
    pub fn llm(
        &mut self,
        gpu: &Gpu,
        entry: &ModelEntry,
        context: Option<usize>,
    ) -> Result<&mut LlmSession, ApiError> {
        if self.llm.as_ref().is_none_or(|(id, _)| *id != entry.id) {
            // Free the old model's memory before the new one allocates.
            self.llm = None;
            let session = open_llm(gpu, &entry.path, context, QuantScheme::None).map_err(|e| {
                ApiError::server(format!("could not load the model '{}': {e}", entry.id))
            })?;
            self.llm = Some((entry.id.clone(), session));
        }
        Ok(&mut self.llm.as_mut().expect("loaded just above").1)
    }

    /// The image pipeline for `entry` at `width` x `height`, (re)opened when the size changes.
    pub fn image(
        &mut self,
        gpu: &Gpu,
        entry: &ModelEntry,
        width: usize,
        height: usize,
    ) -> Result<&mut SdPipeline, ApiError> {
        if self
            .image
            .as_ref()
            .is_none_or(|p| (p.width, p.height) != (width, height))
        {
            self.image = None;
            let pipe = SdPipeline::open(gpu, &entry.path, width, height).map_err(|e| {
                ApiError::server(format!("could not load the model '{}': {e}", entry.id))
            })?;
            self.image = Some(pipe);
        }
        Ok(self.image.as_mut().expect("loaded just above"))
    }

    /// Drops the chat model's KV cache reuse after a failure mid-generation.
    pub fn forget_llm(&mut self) {
        self.llm = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_folder_names_and_file_stems() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
        assert_eq!(model_id(&root.join("llm/qwen2-bias")), "qwen2-bias");
        assert_eq!(
            model_id(&root.join("llm/qwen2-bias/model.safetensors")),
            "qwen2-bias"
        );
        assert_eq!(
            model_id(Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct.Q4_1"
        );
        let dup = [root.join("llm/qwen2-bias"), root.join("llm/qwen2-bias")];
        let e = ModelRegistry::new(&dup, None, None).err().unwrap();
        assert!(e.to_string().contains("qwen2-bias"), "{e}");
        let missing = ModelRegistry::new(&[root.join("llm/nope")], None, None)
            .err()
            .unwrap();
        assert!(missing.to_string().contains("nope"), "{missing}");
    }
}
