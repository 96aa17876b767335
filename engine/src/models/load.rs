//! Opening an LLM from what a user points at: a Hugging Face folder (or one of its .safetensors files)
//! or a GGUF file.

use std::path::Path;

use crate::error::{DriftError, Result};
use crate::formats::gguf::GgufFile;
use crate::generate::LlmSession;
use crate::gpu::Gpu;
use crate::models::hf::HfFolder;
use crate::models::llama::{LlamaModel, LlamaWeights, QuantScheme};
use crate::tokenize::gguf_tokenizer::from_gguf;

/// Default context when the user gives none: the model's own limit, capped so the KV cache stays small.
pub const DEFAULT_CONTEXT: usize = 4096;

pub fn open_llm(
    gpu: &Gpu,
    path: &Path,
    context: Option<usize>,
    quant: QuantScheme,
) -> Result<LlmSession> {
    let lower = path.to_string_lossy().to_lowercase();
    if [".ckpt", ".pt", ".bin", ".pth", ".pkl"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        return Err(DriftError::Unsupported(format!(
            "{}: pickle checkpoints can run arbitrary code when loaded; use the model's .safetensors files",
            path.display()
        )));
    }
    if lower.ends_with(".gguf") {
        return open_gguf(gpu, path, context, quant);
    }
    let folder = if path.is_file() && lower.ends_with(".safetensors") {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let f = HfFolder::open(folder)?;
    let ctx = context_for(context, f.config.max_positions, f.config.sliding_window);
    let weights = LlamaWeights::load(gpu, &f.config, &f.weights, quant)?;
    let model = LlamaModel::new(gpu, f.config, weights, ctx)?;
    LlmSession::new(gpu, model, f.tokenizer, f.template, f.eos)
}

fn open_gguf(
    gpu: &Gpu,
    path: &Path,
    context: Option<usize>,
    quant: QuantScheme,
) -> Result<LlmSession> {
    if quant != QuantScheme::None {
        return Err(DriftError::Unsupported(
            "--quant applies to safetensors models; a GGUF file keeps its own quantisation".into(),
        ));
    }
    let f = GgufFile::open(path)?;
    let cfg = f.llm_config()?;
    let tok = from_gguf(&f)?;
    let template = tok.template()?;
    let mut eos = cfg.eos.clone();
    if let Some(t) = &template
        && let Some(id) = tok.tokenizer.token_id(&t.eos_token)
    {
        eos.push(id);
    }
    eos.sort();
    eos.dedup();
    let ctx = context_for(context, cfg.max_positions, cfg.sliding_window);
    let weights = LlamaWeights::load_gguf(gpu, &cfg, &f)?;
    let model = LlamaModel::new(gpu, cfg, weights, ctx)?;
    LlmSession::new(gpu, model, tok.tokenizer, template, eos)
}

fn context_for(asked: Option<usize>, max_positions: usize, sliding_window: Option<usize>) -> usize {
    let mut ctx = asked.unwrap_or(DEFAULT_CONTEXT).min(max_positions).max(1);
    if let Some(w) = sliding_window {
        // Within the window, sliding-window attention is plain causal attention.
        ctx = ctx.min(w);
    }
    ctx
}
