//! Text to token ids and back: Hugging Face `tokenizer.json` through the `tokenizers` crate, chat
//! templates through minijinja, and streaming detokenisation that only yields whole UTF-8 characters.

pub mod chat_template;
pub mod clip;
pub mod gguf_tokenizer;
pub mod stream;

use std::path::Path;

use crate::error::{DriftError, Result};

/// A tokenizer plus the special tokens generation needs.
pub struct TextTokenizer {
    pub inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<TextTokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            DriftError::Other(format!("{}: cannot load tokenizer: {e}", path.display()))
        })?;
        Ok(TextTokenizer { inner })
    }

    pub fn from_json(json: &str) -> Result<TextTokenizer> {
        let inner = json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| DriftError::Other(format!("cannot load tokenizer: {e}")))?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) are recognised; the
    /// tokenizer's own BOS/EOS post-processing is applied only with `add_special`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, add_special)
            .map_err(|e| DriftError::Other(format!("tokenizing failed: {e}")))?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DriftError::Other(format!("detokenizing failed: {e}")))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
