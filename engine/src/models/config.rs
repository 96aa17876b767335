//! LLM hyper-parameters from a Hugging Face `config.json`, as transformers 4.x (`rope_theta`,
//! `rope_scaling`) and 5.x (`rope_parameters`) write them.

use serde_json::Value;

use crate::error::{DriftError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Mistral,
}

/// llama3-style rope frequency scaling (Llama 3.1/3.2).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LlmConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub intermediate: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub max_positions: usize,
    pub tie_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// Mistral's sliding attention window, when active: Drift caps the context to it, which is exact.
    pub sliding_window: Option<usize>,
}

impl LlmConfig {
    pub fn from_json(text: &str) -> Result<LlmConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| bad(format!("config.json is not valid JSON: {e}")))?;
        LlmConfig::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<LlmConfig> {
        let archs: Vec<&str> = v["architectures"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let model_type = v["model_type"].as_str().unwrap_or("");
        let arch = match (archs.first().copied(), model_type) {
            (Some("LlamaForCausalLM"), _) | (None, "llama") => Arch::Llama,
            (Some("Qwen2ForCausalLM"), _) | (None, "qwen2") => Arch::Qwen2,
            (Some("MistralForCausalLM"), _) | (None, "mistral") => Arch::Mistral,
            (Some(other), _) => {
                return Err(DriftError::Unsupported(format!(
                    "model architecture {other} (Drift runs LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)"
                )));
            }
            (None, t) => {
                return Err(bad(format!(
                    "config.json names no architecture (model_type {t:?})"
                )));
            }
        };
        let hidden = req(v, "hidden_size")?;
        let n_heads = req(v, "num_attention_heads")?;
        let n_kv_heads = opt(v, "num_key_value_heads").unwrap_or(n_heads);
        let head_dim = opt(v, "head_dim").unwrap_or(hidden / n_heads.max(1));
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "{n_heads} attention heads cannot share {n_kv_heads} key/value heads"
            )));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(format!("head_dim {head_dim} must be even")));
        }
        // transformers 5 moves rope settings into `rope_parameters`; 4.x has `rope_theta` + `rope_scaling`.
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_theta = rope_params
            .and_then(|p| p["rope_theta"].as_f64())
            .or_else(|| v["rope_theta"].as_f64())
            .unwrap_or(10000.0);
        let scaling = rope_params.or_else(|| v.get("rope_scaling").filter(|s| s.is_object()));
        let rope_scaling = match scaling {
            Some(s) => {
                let kind = s["rope_type"]
                    .as_str()
                    .or_else(|| s["type"].as_str())
                    .unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => Some(Llama3Scaling {
                        factor: s["factor"].as_f64().unwrap_or(8.0),
                        low_freq_factor: s["low_freq_factor"].as_f64().unwrap_or(1.0),
                        high_freq_factor: s["high_freq_factor"].as_f64().unwrap_or(4.0),
                        original_max_position_embeddings: s["original_max_position_embeddings"]
                            .as_f64()
                            .unwrap_or(8192.0),
                    }),
                    other => {
                        return Err(DriftError::Unsupported(format!(
                            "rope scaling type {other:?}"
                        )));
                    }
                }
            }
            None => None,
        };
        let eos = match &v["eos_token_id"] {
            Value::Number(n) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect(),
            _ => Vec::new(),
        };
        Ok(LlmConfig {
            arch,
            hidden,
            intermediate: req(v, "intermediate_size")?,
            n_layers: req(v, "num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: req(v, "vocab_size")?,
            rms_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_positions: opt(v, "max_position_embeddings").unwrap_or(2048),
            tie_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || v["attention_bias"].as_bool().unwrap_or(false),
            bos: v["bos_token_id"].as_u64().map(|x| x as u32),
            eos,
            sliding_window: if v["use_sliding_window"].as_bool() == Some(false) {
                None
            } else {
                opt(v, "sliding_window")
            },
        })
    }

    /// Divisors of the rope inverse frequencies (one per rotary pair) for llama3 scaling, else None.
    pub fn rope_freq_factors(&self) -> Option<Vec<f32>> {
        let s = self.rope_scaling.as_ref()?;
        let d = self.head_dim;
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        Some(
            (0..d / 2)
                .map(|i| {
                    let inv = self.rope_theta.powf(-((2 * i) as f64) / d as f64);
                    let wavelen = 2.0 * std::f64::consts::PI / inv;
                    let scaled = if wavelen < high_wavelen {
                        inv
                    } else if wavelen > low_wavelen {
                        inv / s.factor
                    } else {
                        let smooth = (s.original_max_position_embeddings / wavelen
                            - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * inv / s.factor + smooth * inv
                    };
                    (inv / scaled) as f32
                })
                .collect(),
        )
    }
}

fn req(v: &Value, key: &str) -> Result<usize> {
    opt(v, key).ok_or_else(|| bad(format!("config.json lacks {key}")))
}

fn opt(v: &Value, key: &str) -> Option<usize> {
    v[key].as_u64().map(|x| x as usize)
}

fn bad(msg: String) -> DriftError {
    DriftError::Other(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA32_1B: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":2048,"intermediate_size":8192,
        "num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,
        "rms_norm_eps":1e-05,"rope_theta":500000.0,"max_position_embeddings":131072,"tie_word_embeddings":true,
        "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"},"bos_token_id":128000,
        "eos_token_id":[128001,128008,128009]}"#;

    #[test]
    fn llama32_transformers4() {
        let c = LlmConfig::from_json(LLAMA32_1B).unwrap();
        assert_eq!(
            (c.arch, c.n_kv_heads, c.head_dim, c.eos.len()),
            (Arch::Llama, 8, 64, 3)
        );
        assert!(c.tie_embeddings && !c.qkv_bias);
        let f = c.rope_freq_factors().unwrap();
        assert_eq!(f.len(), 32);
        assert!((f[0] - 1.0).abs() < 1e-6, "high frequencies unscaled");
        assert!(
            (f[31] - 32.0).abs() < 1e-4,
            "low frequencies divided by the factor"
        );
    }

    #[test]
    fn transformers5_rope_parameters() {
        let v5 = LLAMA32_1B.replace(r#""rope_theta":500000.0,"#, "").replace(
            r#""rope_scaling":{"#,
            r#""rope_parameters":{"rope_theta":500000.0,"#,
        );
        let a = LlmConfig::from_json(LLAMA32_1B).unwrap();
        let b = LlmConfig::from_json(&v5).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn qwen2_has_biases_and_unknown_arch_is_named() {
        let q = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":896,"intermediate_size":4864,
            "num_attention_heads":14,"num_hidden_layers":24,"num_key_value_heads":2,"vocab_size":151936,
            "rope_theta":1000000.0,"rope_scaling":null,"eos_token_id":151645}"#;
        let c = LlmConfig::from_json(q).unwrap();
        assert!(c.qkv_bias);
        assert_eq!((c.head_dim, c.eos.clone()), (64, vec![151645]));
        let e = LlmConfig::from_json(r#"{"architectures":["GPTNeoXForCausalLM"]}"#).unwrap_err();
        assert!(e.to_string().contains("GPTNeoXForCausalLM"));
    }
}
