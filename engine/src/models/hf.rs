//! A Hugging Face model folder: config.json, safetensors (single or sharded), tokenizer.json, the chat
//! template (tokenizer_config.json's `chat_template`, or `chat_template.jinja` / `chat_template.json` as
//! newer transformers write it), and generation_config.json's EOS ids.

use std::path::{Path, PathBuf};

use crate::error::{DriftError, Result};
use crate::formats::safetensors::SafetensorsSet;
use crate::models::config::LlmConfig;
use crate::models::llama::WeightSource;
use crate::tokenize::TextTokenizer;
use crate::tokenize::chat_template::ChatTemplate;

pub struct HfFolder {
    pub dir: PathBuf,
    pub config: LlmConfig,
    pub weights: SafetensorsSet,
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    /// Every id that ends generation: config, generation_config and the template's EOS token.
    pub eos: Vec<u32>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| DriftError::Other(format!("{}: {e}", path.display())))
}

fn json(path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(&read(path)?)
        .map_err(|e| DriftError::Other(format!("{}: invalid JSON: {e}", path.display())))
}

impl HfFolder {
    pub fn open(dir: &Path) -> Result<HfFolder> {
        if !dir.join("config.json").is_file() {
            return Err(DriftError::Other(format!(
                "{} is not a Hugging Face model folder (no config.json)",
                dir.display()
            )));
        }
        let config = LlmConfig::from_json(&read(&dir.join("config.json"))?)?;
        let weights = SafetensorsSet::open(dir)?;
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let tok_cfg = if dir.join("tokenizer_config.json").is_file() {
            json(&dir.join("tokenizer_config.json"))?
        } else {
            serde_json::Value::Null
        };
        let mut tcfg = tok_cfg.clone();
        if tcfg.get("chat_template").is_none() {
            if dir.join("chat_template.jinja").is_file() {
                tcfg["chat_template"] = read(&dir.join("chat_template.jinja"))?.into();
            } else if dir.join("chat_template.json").is_file() {
                tcfg["chat_template"] =
                    json(&dir.join("chat_template.json"))?["chat_template"].clone();
            }
        }
        let template = if tcfg.is_object() {
            ChatTemplate::from_tokenizer_config(&tcfg)?
        } else {
            None
        };
        let mut eos = config.eos.clone();
        if dir.join("generation_config.json").is_file() {
            match &json(&dir.join("generation_config.json"))?["eos_token_id"] {
                serde_json::Value::Number(n) => eos.extend(n.as_u64().map(|x| x as u32)),
                serde_json::Value::Array(a) => {
                    eos.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
        if let Some(t) = &template
            && let Some(id) = tokenizer.token_id(&t.eos_token)
        {
            eos.push(id);
        }
        eos.sort();
        eos.dedup();
        Ok(HfFolder {
            dir: dir.to_path_buf(),
            config,
            weights,
            tokenizer,
            template,
            eos,
        })
    }
}

impl WeightSource for SafetensorsSet {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let t = SafetensorsSet::get(self, name)?;
        Ok((t.shape.to_vec(), t.to_f32()?))
    }

    fn has(&self, name: &str) -> bool {
        self.contains(name)
    }
}
