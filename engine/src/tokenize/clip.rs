//! Stable Diffusion's CLIP tokenizer (openai/clip-vit-large-patch14's byte-level BPE) as a
//! `tokenizers::Tokenizer`, built the way transformers' `CLIPTokenizer` builds it: NFC, runs of
//! whitespace to one space, lowercase; CLIP's split regex then the byte-level alphabet; BPE whose word
//! ends carry `</w>`. Prompts become exactly 77 ids: start token, at most 75 tokens, end token, padding.
//!
//! Two sources: OpenAI's `bpe_simple_vocab_16e6.txt.gz` (shipped by open_clip_torch; SD 1.x special
//! tokens, padded with `<|endoftext|>`), or a diffusers `tokenizer/` folder (`vocab.json` +
//! `merges.txt`, special tokens from `special_tokens_map.json` / `tokenizer_config.json`; SD 2.x pads
//! with `!`). Like transformers, the special tokens (pad included) are recognised in the raw text.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Lowercase, NFC, Replace, Sequence as NormSeq};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSeq;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{DriftError, Result};

/// Sequence length of SD's text encoder (`model_max_length`).
pub const CLIP_MAX_LEN: usize = 77;
pub const CLIP_BOS: &str = "<|startoftext|>";
pub const CLIP_EOS: &str = "<|endoftext|>";

/// CLIP's pre-tokenizer pattern (transformers' `CLIPTokenizer`): special tokens, contractions, letter
/// runs, single digits, runs of other non-space characters.
const CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// Merges OpenAI's tokenizer takes from `bpe_simple_vocab_16e6.txt` (49152 tokens - 256 bytes - 2 specials).
const OPENAI_MERGES: usize = 49152 - 256 - 2;

fn err(msg: impl Into<String>) -> DriftError {
    DriftError::Other(msg.into())
}

/// One prompt as model input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClipEncoding {
    /// Exactly `max_len` ids: start, tokens, end, padding.
    pub ids: Vec<u32>,
    /// Ids before padding (start and end included).
    pub len: usize,
    /// The text of the tokens dropped to fit, when the prompt was too long.
    pub truncated: Option<String>,
}

impl ClipEncoding {
    /// The message to show when the prompt was truncated (diffusers logs the same).
    pub fn warning(&self, max_len: usize) -> Option<String> {
        self.truncated.as_ref().map(|t| {
            format!(
                "the following part of the prompt was truncated because CLIP can only handle sequences \
                 up to {max_len} tokens: {t}"
            )
        })
    }
}

/// The tokenizer plus the ids that frame a prompt.
pub struct ClipTokenizer {
    pub inner: tokenizers::Tokenizer,
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub max_len: usize,
}

impl ClipTokenizer {
    /// From OpenAI's `bpe_simple_vocab_16e6.txt.gz` (gzip or already unpacked), with SD 1.x's
    /// special tokens and padding (`<|endoftext|>`, id 49407).
    pub fn from_bpe_file(path: &Path) -> Result<ClipTokenizer> {
        let raw = std::fs::read(path).map_err(|e| err(format!("{}: {e}", path.display())))?;
        let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
            gunzip(&raw).map_err(|e| err(format!("{}: {e}", path.display())))?
        } else {
            raw
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| err(format!("{}: the vocabulary is not UTF-8", path.display())))?;
        Self::from_bpe_text(&text)
    }

    /// From the text of `bpe_simple_vocab_16e6.txt`: a header line, then one merge per line. The
    /// vocabulary is built as OpenAI's `SimpleTokenizer` builds it: the 256 byte symbols, the same with
    /// `</w>`, one token per merge (the first 48894), then `<|startoftext|>` and `<|endoftext|>`.
    pub fn from_bpe_text(text: &str) -> Result<ClipTokenizer> {
        let merges = parse_merges(text.lines().skip(1).take(OPENAI_MERGES))?;
        if merges.is_empty() {
            return Err(err("the CLIP vocabulary file holds no merges"));
        }
        let units = byte_symbols();
        let mut vocab: Vec<String> = units.iter().map(|c| c.to_string()).collect();
        vocab.extend(units.iter().map(|c| format!("{c}</w>")));
        vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        vocab.push(CLIP_BOS.into());
        vocab.push(CLIP_EOS.into());
        let map: HashMap<String, u32> = vocab
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, i as u32))
            .collect();
        Self::from_vocab_merges(map, merges, &Specials::sd1(), CLIP_MAX_LEN)
    }

    /// From a diffusers/transformers `tokenizer/` folder: `vocab.json` and `merges.txt`, the special
    /// tokens and `model_max_length` from `special_tokens_map.json` / `tokenizer_config.json` when
    /// present (SD 1.x defaults otherwise).
    pub fn from_folder(dir: &Path) -> Result<ClipTokenizer> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read_to_string(&p).map_err(|e| err(format!("{}: {e}", p.display())))
        };
        let vocab: HashMap<String, u32> = serde_json::from_str(&read("vocab.json")?)
            .map_err(|e| err(format!("{}/vocab.json: {e}", dir.display())))?;
        let merges_text = read("merges.txt")?;
        let merges = parse_merges(merges_text.lines().filter(|l| !l.starts_with("#version")))?;
        let mut specials = Specials::sd1();
        let mut max_len = CLIP_MAX_LEN;
        for name in ["special_tokens_map.json", "tokenizer_config.json"] {
            let p = dir.join(name);
            if !p.is_file() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&read(name)?)
                .map_err(|e| err(format!("{}: {e}", p.display())))?;
            for (key, slot) in [
                ("bos_token", &mut specials.bos),
                ("eos_token", &mut specials.eos),
                ("unk_token", &mut specials.unk),
                ("pad_token", &mut specials.pad),
            ] {
                // A plain string or an AddedToken object {"content": ...}.
                let s = v[key].as_str().or_else(|| v[key]["content"].as_str());
                if let Some(s) = s {
                    *slot = s.to_string();
                }
            }
            // Huge sentinel values mean "no limit" in transformers; CLIP's is its position count.
            if let Some(n) = v["model_max_length"].as_u64()
                && (3..=4096).contains(&n)
            {
                max_len = n as usize;
            }
        }
        Self::from_vocab_merges(vocab, merges, &specials, max_len)
    }

    /// From a vocabulary and merges already in memory.
    pub fn from_vocab_merges(
        vocab: HashMap<String, u32>,
        merges: Vec<(String, String)>,
        specials: &Specials,
        max_len: usize,
    ) -> Result<ClipTokenizer> {
        let id = |t: &str| {
            vocab
                .get(t)
                .copied()
                .ok_or_else(|| err(format!("the CLIP vocabulary has no token {t:?}")))
        };
        let (bos, eos, pad) = (id(&specials.bos)?, id(&specials.eos)?, id(&specials.pad)?);
        id(&specials.unk)?;
        if max_len < 2 {
            return Err(err(format!(
                "CLIP max length {max_len} leaves no room for tokens"
            )));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix("</w>".into())
            .unk_token(specials.unk.clone())
            .fuse_unk(false)
            .build()
            .map_err(|e| err(format!("building the CLIP BPE: {e}")))?;
        let mut tok = tokenizers::Tokenizer::new(bpe);
        let tk = |e: tokenizers::Error| err(format!("building the CLIP tokenizer: {e}"));
        let ws = Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::Regex(r"\s+".into()),
            " ",
        )
        .map_err(tk)?;
        tok.with_normalizer(Some(NormSeq::new(vec![
            NFC.into(),
            ws.into(),
            Lowercase.into(),
        ])))
        .map_err(tk)?;
        let split = Split::new(
            SplitPattern::Regex(CLIP_PATTERN.into()),
            SplitDelimiterBehavior::Removed,
            true,
        )
        .map_err(tk)?;
        // transformers' ByteLevel keeps its default GPT-2 regex on top of CLIP's split.
        tok.with_pre_tokenizer(Some(PreSeq::new(vec![
            split.into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        tok.with_decoder(Some(ByteLevel::default()));
        tok.with_post_processor(Some(
            RobertaProcessing::new((specials.eos.clone(), eos), (specials.bos.clone(), bos))
                .trim_offsets(false)
                .add_prefix_space(false),
        ));
        let mut names = vec![&specials.bos, &specials.eos, &specials.unk, &specials.pad];
        names.dedup();
        let added: Vec<AddedToken> = names
            .iter()
            .map(|s| AddedToken::from(s.as_str(), true))
            .collect();
        tok.add_special_tokens(added).map_err(tk)?;
        Ok(ClipTokenizer {
            inner: tok,
            bos,
            eos,
            pad,
            max_len,
        })
    }

    /// Token ids of `text` without start/end tokens, padding or truncation.
    pub fn tokens(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(|e| err(format!("tokenizing failed: {e}")))?
            .get_ids()
            .to_vec())
    }

    /// `max_len` ids for `text`: start, up to `max_len - 2` tokens, end, then padding; what did not
    /// fit is reported in [`ClipEncoding::truncated`].
    pub fn encode(&self, text: &str) -> Result<ClipEncoding> {
        let mut toks = self.tokens(text)?;
        let room = self.max_len - 2;
        let truncated = if toks.len() > room {
            let dropped = self.decode(&toks[room..])?;
            toks.truncate(room);
            Some(dropped)
        } else {
            None
        };
        let mut ids = Vec::with_capacity(self.max_len);
        ids.push(self.bos);
        ids.extend(toks);
        ids.push(self.eos);
        let len = ids.len();
        ids.resize(self.max_len, self.pad);
        Ok(ClipEncoding {
            ids,
            len,
            truncated,
        })
    }

    /// [`ClipTokenizer::encode`] for each prompt (a CFG batch: prompt and negative prompt).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<ClipEncoding>> {
        texts.iter().map(|t| self.encode(t)).collect()
    }

    /// Text of `ids` (special tokens skipped), words separated as transformers does (`</w>` -> space).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let s = self
            .inner
            .decode(ids, true)
            .map_err(|e| err(format!("detokenizing failed: {e}")))?;
        Ok(s.replace("</w>", " ").trim().to_string())
    }
}

/// Special token strings.
#[derive(Clone, Debug)]
pub struct Specials {
    pub bos: String,
    pub eos: String,
    pub unk: String,
    pub pad: String,
}

impl Specials {
    /// openai/clip-vit-large-patch14 (SD 1.x): everything but the start token is `<|endoftext|>`.
    pub fn sd1() -> Specials {
        Specials {
            bos: CLIP_BOS.into(),
            eos: CLIP_EOS.into(),
            unk: CLIP_EOS.into(),
            pad: CLIP_EOS.into(),
        }
    }
}

fn parse_merges<'a>(lines: impl Iterator<Item = &'a str>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                out.push((a.to_string(), b.to_string()))
            }
            _ => return Err(err(format!("merge {} is not two symbols: {line:?}", i + 1))),
        }
    }
    Ok(out)
}

/// The byte-level alphabet in GPT-2/CLIP order (`bytes_to_unicode().values()`): printable bytes map to
/// themselves first, then the rest to U+0100 onwards.
fn byte_symbols() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut out: Vec<char> = (0..256u32)
        .filter(|&b| printable(b))
        .filter_map(char::from_u32)
        .collect();
    out.extend(
        (0..256u32)
            .filter(|&b| !printable(b))
            .enumerate()
            .filter_map(|(n, _)| char::from_u32(256 + n as u32)),
    );
    out
}

/// Decompresses a gzip file (every member; the CLIP vocabulary ships gzipped).
pub fn gunzip(data: &[u8]) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_end(&mut out)
        .map_err(|e| format!("not a valid gzip file: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_order() {
        let s = byte_symbols();
        assert_eq!(s.len(), 256);
        assert_eq!(s[0], '!');
        assert_eq!(s[188], '\u{100}');
        let mut sorted = s.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        let alphabet = ByteLevel::alphabet();
        assert!(s.iter().all(|c| alphabet.contains(c)));
    }

    #[test]
    fn gzip_round_trip_and_corruption() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"#version: 0.2\nh i</w>\n").unwrap();
        let mut gz = enc.finish().unwrap();
        assert_eq!(gunzip(&gz).unwrap(), b"#version: 0.2\nh i</w>\n");
        let n = gz.len();
        gz[n - 6] ^= 0xff; // the CRC
        assert!(gunzip(&gz).is_err());
    }
}
