//! Streaming detokenisation: a character that spans several byte-level tokens (emoji, CJK) is held back
//! until complete, so every piece handed to the UI is valid UTF-8 and the pieces concatenate to the full
//! decode. Each step decodes a short window (the previous piece's tokens plus the new ones), not the
//! whole reply, so streaming stays O(1) per token; decoding with the previous tokens as context keeps
//! SentencePiece's leading-space handling right.

use super::TextTokenizer;
use crate::error::Result;

#[derive(Default)]
pub struct TextStream {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Adds a token; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        // An incomplete UTF-8 sequence decodes to U+FFFD at the end: wait for the next token.
        if now.len() <= before.len()
            || now.ends_with('\u{FFFD}')
            || !now.is_char_boundary(before.len())
        {
            return Ok(None);
        }
        let piece = now[before.len()..].to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(Some(piece))
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
