//! Real model shapes for benchmarks with random weights (no file needed).

use crate::error::{DriftError, Result};
use crate::models::config::LlmConfig;
use crate::models::llama::WeightSource;

/// The configs of the models Drift's speed goals name.
pub fn llm_shape(name: &str) -> Result<LlmConfig> {
    let json = match name {
        "smollm2-135m" => {
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
            "num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,"rms_norm_eps":1e-5,"rope_theta":100000,
            "max_position_embeddings":8192,"tie_word_embeddings":true}"#
        }
        "llama-3.2-1b" => {
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,
            "num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,"rms_norm_eps":1e-5,
            "rope_theta":500000,"max_position_embeddings":131072,"tie_word_embeddings":true,
            "rope_scaling":{"rope_type":"llama3","factor":32,"low_freq_factor":1,"high_freq_factor":4,
            "original_max_position_embeddings":8192}}"#
        }
        "llama-3.1-8b" => {
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
            "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"rms_norm_eps":1e-5,
            "rope_theta":500000,"max_position_embeddings":131072,"tie_word_embeddings":false,
            "rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,
            "original_max_position_embeddings":8192}}"#
        }
        other => {
            return Err(DriftError::Other(format!(
                "unknown shape {other}: smollm2-135m, llama-3.2-1b or llama-3.1-8b"
            )));
        }
    };
    LlmConfig::from_json(json)
}

/// Uniform random weights (std ~0.02, norms ~1) for every tensor a config implies; fast xorshift so an
/// 8B model fills in seconds.
pub struct RandomWeights {
    pub seed: u64,
}

impl RandomWeights {
    /// Values for a tensor of `shape`; norm weights hover around 1. Generated in chunks of 2^20 with
    /// their own streams, over the CPU's cores (an 8B model is 8G values).
    pub fn values(&self, name: &str, n: usize) -> Vec<f32> {
        const CHUNK: usize = 1 << 20;
        let seed = self.seed
            ^ name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100000001b3)
            });
        let norm = name.contains("norm");
        let fill = |i: usize, out: &mut [f32]| {
            // A nonzero, chunk-dependent xorshift state.
            let mut s = (seed ^ (i as u64).wrapping_mul(0x9E3779B97F4A7C15)) | 1;
            for v in out {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // [-0.5, 0.5)
                *v = if norm { 1.0 + 0.1 * u } else { 0.07 * u };
            }
        };
        let mut out = vec![0.0f32; n];
        // Each thread takes `per` whole chunks, numbered as if they were filled in one pass.
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per = n.div_ceil(CHUNK).div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for (t, part) in out.chunks_mut(per * CHUNK).enumerate() {
                s.spawn(move || {
                    for (j, c) in part.chunks_mut(CHUNK).enumerate() {
                        fill(t * per + j, c);
                    }
                });
            }
        });
        out
    }
}

/// Random weights shaped by a config.
pub struct ShapedRandom<'a> {
    pub cfg: &'a LlmConfig,
    pub rng: RandomWeights,
}

impl WeightSource for ShapedRandom<'_> {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let c = self.cfg;
        let (h, d) = (c.hidden, c.head_dim);
        let key = name.rsplit('.').nth(1).unwrap_or(name);
        let shape = match (key, name.ends_with(".bias")) {
            ("embed_tokens", _) | ("lm_head", _) => vec![c.vocab, h],
            ("q_proj", false) => vec![c.n_heads * d, h],
            ("k_proj", false) | ("v_proj", false) => vec![c.n_kv_heads * d, h],
            ("q_proj", true) => vec![c.n_heads * d],
            ("k_proj", true) | ("v_proj", true) => vec![c.n_kv_heads * d],
            ("o_proj", _) => vec![h, c.n_heads * d],
            ("gate_proj", _) | ("up_proj", _) => vec![c.intermediate, h],
            ("down_proj", _) => vec![h, c.intermediate],
            _ => vec![h], // norms
        };
        let n = shape.iter().product();
        Ok((shape, self.rng.values(name, n)))
    }

    fn has(&self, name: &str) -> bool {
        name != "lm_head.weight" || !self.cfg.tie_embeddings
    }
}
