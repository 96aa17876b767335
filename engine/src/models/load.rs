//! Opening an LLM from what a user points at: a Hugging Face folder (or a GGUF file, see `gguf`).

use std::path::Path;

use crate::error::{DriftError, Result};
use crate::generate::LlmSession;
use crate::gpu::Gpu;
use crate::kernels::qkv_rope::RopePairs;
use crate::models::hf::HfFolder;
use crate::models::llama::{LlamaModel, LlamaWeights};

/// Default context when the user gives none: the model's own limit, capped so the KV cache stays small.
pub const DEFAULT_CONTEXT: usize = 4096;

pub fn open_llm(gpu: &Gpu, path: &Path, context: Option<usize>) -> Result<LlmSession> {
    let lower = path.to_string_lossy().to_lowercase();
    if lower.ends_with(".ckpt") || lower.ends_with(".pt") || lower.ends_with(".bin") || lower.ends_with(".pth") {
        return Err(DriftError::Unsupported(format!(
            "{}: pickle checkpoints can run arbitrary code when loaded; use the model's .safetensors files",
            path.display()
        )));
    }
    let folder = if path.is_file() && lower.ends_with(".safetensors") { path.parent().unwrap_or(path) } else { path };
    let f = HfFolder::open(folder)?;
    let mut ctx = context.unwrap_or(DEFAULT_CONTEXT).min(f.config.max_positions).max(1);
    if let Some(w) = f.config.sliding_window {
        // Within the window, sliding-window attention is plain causal attention.
        ctx = ctx.min(w);
    }
    let weights = LlamaWeights::load(gpu, &f.config, &f.weights, RopePairs::HalfSplit)?;
    let model = LlamaModel::new(gpu, f.config, weights, ctx)?;
    LlmSession::new(gpu, model, f.tokenizer, f.template, f.eos)
}
