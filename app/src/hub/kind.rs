//! What a model is (kind) and how its files are stored (format), shared by the catalog and the library.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// A chat / text model.
    Llm,
    /// An image model (Stable Diffusion).
    Diffusion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// One llama.cpp GGUF file.
    Gguf,
    /// A Hugging Face transformers folder (`config.json`, tokenizer, `*.safetensors`).
    Safetensors,
    /// A diffusers pipeline folder (`model_index.json` and one folder per component).
    Diffusers,
    /// One Stable Diffusion `.safetensors` checkpoint with the original (CompVis/LDM) key names.
    Checkpoint,
}

impl ModelFormat {
    /// Stored as one file (not a folder).
    pub fn is_single_file(self) -> bool {
        matches!(self, ModelFormat::Gguf | ModelFormat::Checkpoint)
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelKind::Llm => "llm",
            ModelKind::Diffusion => "diffusion",
        })
    }
}

impl fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::Safetensors => "safetensors",
            ModelFormat::Diffusers => "diffusers",
            ModelFormat::Checkpoint => "checkpoint",
        })
    }
}

/// The inputs of the memory estimate for a decoder-only LLM (see `estimate.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmShape {
    /// Parameter count.
    pub params: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub vocab: u64,
    /// The longest context the model was trained for.
    pub max_context: u64,
}

/// `1.23 GB` style sizes (decimal units, as Hugging Face shows them).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_the_hub() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(491_400_032), "491.40 MB");
        assert_eq!(human_bytes(2_104_932_768), "2.10 GB");
    }
}
