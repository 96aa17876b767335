//! A `tokenizers::Tokenizer` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! - `gpt2`: byte-level BPE from the token list and merges. The split before byte-level encoding is
//!   chosen by `tokenizer.ggml.pre`, with the regexes of the models' own `tokenizer.json` (the ones
//!   llama.cpp re-implements): smollm/starcoder split digits one by one then apply GPT-2's regex;
//!   qwen2 and llama3 have their own; gpt2 and unknown names use GPT-2's.
//! - `llama`: SentencePiece BPE (tokens, scores, token types), as transformers rebuilds it: merges
//!   recovered from the scores, `▁` for spaces prepended to the start of the text, byte fallback to
//!   the `<0xNN>` tokens.
//!
//! Control (type 3) and user-defined (type 4) tokens are matched whole in the text
//! (`<|im_start|>`); control tokens are special (`decode` can skip them). BOS/EOS are added by the
//! post-processor as `tokenizer.ggml.add_bos_token`/`add_eos_token` say, when encoding with
//! `add_special`.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::error::{DriftError, Result};
use crate::formats::gguf::GgufFile;
use crate::tokenize::TextTokenizer;
use crate::tokenize::chat_template::ChatTemplate;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
pub const TOKEN_NORMAL: i64 = 1;
pub const TOKEN_UNKNOWN: i64 = 2;
pub const TOKEN_CONTROL: i64 = 3;
pub const TOKEN_USER_DEFINED: i64 = 4;
pub const TOKEN_UNUSED: i64 = 5;
pub const TOKEN_BYTE: i64 = 6;

// GPT-2's split is the one built into `ByteLevel(use_regex = true)`.
/// Llama 3 (tiktoken cl100k style): up to three digits per piece.
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// Qwen2: like Llama 3 but single digits.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// Mistral's tekken.
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// GPT-4o / Llama 4 (o200k style).
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// How a byte-level vocabulary splits text before BPE, from `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreSplit {
    /// GPT-2's regex (gpt2, mpt, olmo, jais, unknown names).
    Gpt2,
    /// Each digit alone, then GPT-2's regex (smollm, starcoder, refact, codeshell, command-r,
    /// exaone).
    Gpt2Digits,
    Llama3,
    Qwen2,
    Tekken,
    Gpt4o,
}

impl PreSplit {
    /// The split for a `tokenizer.ggml.pre` name (missing or unknown: GPT-2's, as llama.cpp and
    /// transformers fall back to).
    pub fn from_name(pre: Option<&str>) -> PreSplit {
        match pre.unwrap_or("default") {
            "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone"
            | "minerva-7b" => PreSplit::Gpt2Digits,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => PreSplit::Llama3,
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" | "megrez" => PreSplit::Qwen2,
            "tekken" => PreSplit::Tekken,
            "gpt-4o" | "llama4" | "minimax-m2" => PreSplit::Gpt4o,
            _ => PreSplit::Gpt2,
        }
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let byte_level = |use_regex| ByteLevel::new(false, true, use_regex).into();
        let regex = |re: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(re.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| DriftError::Other(format!("pre-tokenizer regex does not compile: {e}")))?;
            Ok(PreSequence::new(vec![split.into(), byte_level(false)]).into())
        };
        match self {
            PreSplit::Gpt2 => Ok(byte_level(true)),
            PreSplit::Gpt2Digits => {
                Ok(PreSequence::new(vec![Digits::new(true).into(), byte_level(true)]).into())
            }
            PreSplit::Llama3 => regex(LLAMA3_SPLIT),
            PreSplit::Qwen2 => regex(QWEN2_SPLIT),
            PreSplit::Tekken => regex(TEKKEN_SPLIT),
            PreSplit::Gpt4o => regex(GPT4O_SPLIT),
        }
    }
}

/// What a GGUF file says about its tokenizer.
pub struct GgufTokenizer {
    pub tokenizer: TextTokenizer,
    /// `tokenizer.ggml.model` (`gpt2`, `llama`).
    pub model: String,
    /// `tokenizer.ggml.pre`, if any.
    pub pre: Option<String>,
    /// `tokenizer.chat_template`, if any.
    pub chat_template: Option<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// The BOS/EOS token strings (for chat templates that write `{{ bos_token }}`); empty when
    /// absent.
    pub bos_token: String,
    pub eos_token: String,
    /// Whether encoding with `add_special` prepends BOS / appends EOS.
    pub add_bos: bool,
    pub add_eos: bool,
}

impl GgufTokenizer {
    /// The chat template with its BOS/EOS strings, or None when the file has none.
    pub fn template(&self) -> Result<Option<ChatTemplate>> {
        self.chat_template
            .as_deref()
            .map(|t| ChatTemplate::new(t, &self.bos_token, &self.eos_token))
            .transpose()
    }
}

fn bad(file: &GgufFile, msg: String) -> DriftError {
    DriftError::Other(format!("{}: {msg}", file.name()))
}

/// Builds the tokenizer a GGUF file describes.
pub fn from_gguf(file: &GgufFile) -> Result<GgufTokenizer> {
    let model = file
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| {
            bad(
                file,
                "GGUF metadata has no tokenizer (tokenizer.ggml.model)".into(),
            )
        })?
        .to_string();
    let tokens = file.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| {
        bad(
            file,
            "GGUF metadata lacks tokenizer.ggml.tokens (a string array)".into(),
        )
    })?;
    if tokens.is_empty() || tokens.len() > u32::MAX as usize {
        return Err(bad(
            file,
            format!("the token list has {} entries", tokens.len()),
        ));
    }
    let types = match file.get_array("tokenizer.ggml.token_type") {
        None => vec![TOKEN_NORMAL; tokens.len()],
        Some(a) => a
            .to_i64_vec()
            .filter(|v| v.len() == tokens.len())
            .ok_or_else(|| {
                bad(
                    file,
                    format!("tokenizer.ggml.token_type is not {} integers", tokens.len()),
                )
            })?,
    };
    let id = |key: &str| -> Result<Option<u32>> {
        match file.metadata(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(i) if (i as usize) < tokens.len() => Ok(Some(i as u32)),
                // llama.cpp writes -1 (as an i32 or a wrapped u32) for "none".
                _ if v.as_i64() == Some(-1) || v.as_u64() == Some(u32::MAX as u64) => Ok(None),
                _ => Err(bad(
                    file,
                    format!(
                        "{key} = {v} is not a token id (vocabulary of {})",
                        tokens.len()
                    ),
                )),
            },
        }
    };
    let bos_id = id("tokenizer.ggml.bos_token_id")?;
    let eos_id = id("tokenizer.ggml.eos_token_id")?;
    let unk_id = id("tokenizer.ggml.unknown_token_id")?;
    let pad_id = id("tokenizer.ggml.padding_token_id")?;
    let pre = file.get_str("tokenizer.ggml.pre").map(String::from);
    // Control tokens, and the tokens named bos/eos/unk/pad, are special; user-defined ones are
    // plain added tokens. All are matched whole in the text, verbatim (no normalisation).
    let named: Vec<u32> = [bos_id, eos_id, unk_id, pad_id]
        .into_iter()
        .flatten()
        .collect();
    let is_special = |i: usize| types[i] == TOKEN_CONTROL || named.contains(&(i as u32));

    let (mut inner, default_add_bos) = match model.as_str() {
        "gpt2" => {
            let split = PreSplit::from_name(pre.as_deref());
            let verbatim = |i: usize| is_special(i) || types[i] == TOKEN_USER_DEFINED;
            (
                byte_level_bpe(file, tokens, verbatim, split)?,
                split == PreSplit::Llama3,
            )
        }
        "llama" => {
            let prefix = file
                .get_bool("tokenizer.ggml.add_space_prefix")
                .unwrap_or(true);
            (sentencepiece_bpe(file, tokens, unk_id, prefix)?, true)
        }
        other => {
            return Err(DriftError::Unsupported(format!(
                "{}: tokenizer model {other:?} (Drift reads gpt2 byte-level BPE and llama \
                 SentencePiece)",
                file.name()
            )));
        }
    };

    let mut special = Vec::new();
    let mut user = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        if tok.is_empty() {
            continue;
        }
        if is_special(i) {
            special.push(AddedToken::from(tok.clone(), true).normalized(false));
        } else if types[i] == TOKEN_USER_DEFINED {
            user.push(AddedToken::from(tok.clone(), false).normalized(false));
        }
    }
    inner
        .add_special_tokens(special)
        .map_err(|e| bad(file, format!("cannot add special tokens: {e}")))?;
    inner
        .add_tokens(user)
        .map_err(|e| bad(file, format!("cannot add user-defined tokens: {e}")))?;

    let add_bos = file
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(default_add_bos)
        && bos_id.is_some();
    let add_eos = file
        .get_bool("tokenizer.ggml.add_eos_token")
        .unwrap_or(false)
        && eos_id.is_some();
    if add_bos || add_eos {
        let mut single = Vec::new();
        let mut specials = Vec::new();
        if let (true, Some(b)) = (add_bos, bos_id) {
            single.push("bos");
            specials.push(
                SpecialToken::new("bos".into(), vec![b], vec![tokens[b as usize].clone()]).unwrap(),
            );
        }
        single.push("$A");
        if let (true, Some(e)) = (add_eos, eos_id) {
            single.push("eos");
            specials.push(
                SpecialToken::new("eos".into(), vec![e], vec![tokens[e as usize].clone()]).unwrap(),
            );
        }
        let mut pair = single.clone();
        pair.extend(single.iter().map(|p| if *p == "$A" { "$B:1" } else { p }));
        let template = TemplateProcessing::builder()
            .try_single(single.join(" "))
            .and_then(|b| b.try_pair(pair.join(" ")))
            .map_err(|e| bad(file, format!("cannot build the BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| bad(file, format!("cannot build the BOS/EOS template: {e}")))?;
        inner.with_post_processor(Some(template));
    }

    let text = |id: Option<u32>| id.map(|i| tokens[i as usize].clone()).unwrap_or_default();
    Ok(GgufTokenizer {
        tokenizer: TextTokenizer { inner },
        model,
        pre,
        chat_template: file.get_str("tokenizer.chat_template").map(String::from),
        bos_id,
        eos_id,
        bos_token: text(bos_id),
        eos_token: text(eos_id),
        add_bos,
        add_eos,
    })
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the rest shift to U+0100...
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in map.iter_mut().enumerate() {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        *slot = if printable {
            char::from(b as u8)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below the surrogates")
        };
    }
    map
}

fn byte_level_bpe(
    file: &GgufFile,
    tokens: &[String],
    verbatim: impl Fn(usize) -> bool,
    split: PreSplit,
) -> Result<Tokenizer> {
    let chars = byte_chars();
    let alphabet: std::collections::HashSet<char> = chars.iter().copied().collect();
    // Vocabulary entries are spelled in the byte alphabet; a normal token that is not (a
    // converter's slip) is respelled from its UTF-8 bytes. Control and user-defined tokens stay
    // verbatim: they are matched in the raw text before BPE and their ids must be found under their
    // own spelling.
    let mut vocab = Vocab::default();
    for (i, tok) in tokens.iter().enumerate() {
        let key = if verbatim(i) || tok.chars().all(|c| alphabet.contains(&c)) {
            tok.clone()
        } else {
            tok.bytes().map(|b| chars[b as usize]).collect()
        };
        vocab.insert(key, i as u32);
    }
    let merges_in = file.get_str_array("tokenizer.ggml.merges").ok_or_else(|| {
        bad(
            file,
            "GGUF gpt2 tokenizer lacks tokenizer.ggml.merges".into(),
        )
    })?;
    let mut merges = Vec::with_capacity(merges_in.len());
    let mut skipped = 0usize;
    for m in merges_in {
        // A merge whose parts or result are not tokens would make the BPE builder fail: skip it.
        match m.split_once(' ') {
            Some((a, b))
                if vocab.contains_key(a)
                    && vocab.contains_key(b)
                    && vocab.contains_key(&format!("{a}{b}")) =>
            {
                merges.push((a.to_string(), b.to_string()));
            }
            _ => skipped += 1,
        }
    }
    if skipped > 0 {
        log::warn!(
            "{}: skipped {skipped} merges that do not name tokens",
            file.name()
        );
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        // Llama 3 emits a pre-token that is itself in the vocabulary without merging (its
        // tokenizer.json says ignore_merges, and llama.cpp does the same).
        .ignore_merges(split == PreSplit::Llama3)
        .build()
        .map_err(|e| bad(file, format!("cannot build the BPE model: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(split.pre_tokenizer()?));
    tok.with_decoder(Some(DecoderWrapper::from(ByteLevel::default())));
    Ok(tok)
}

fn sentencepiece_bpe(
    file: &GgufFile,
    tokens: &[String],
    unk_id: Option<u32>,
    space_prefix: bool,
) -> Result<Tokenizer> {
    let scores: Vec<f64> = match file.get_array("tokenizer.ggml.scores") {
        Some(a) => a
            .to_f64_vec()
            .filter(|v| v.len() == tokens.len())
            .ok_or_else(|| {
                bad(
                    file,
                    format!("tokenizer.ggml.scores is not {} numbers", tokens.len()),
                )
            })?,
        // Without scores, earlier tokens win (the order SentencePiece learned them in).
        None => (0..tokens.len()).map(|i| -(i as f64)).collect(),
    };
    let mut vocab = Vocab::default();
    for (i, tok) in tokens.iter().enumerate() {
        vocab.insert(tok.clone(), i as u32);
    }
    let merges = merges_from_scores(tokens, &scores, &vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk_id {
        builder = builder.unk_token(tokens[u as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| bad(file, format!("cannot build the SentencePiece model: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    let scheme = if space_prefix {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    tok.with_pre_tokenizer(Some(PreTokenizerWrapper::from(Metaspace::new(
        '▁', scheme, false,
    ))));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ")
            .map_err(|e| bad(file, e.to_string()))?
            .into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderWrapper::from(DecoderSequence::new(decoders))));
    Ok(tok)
}

/// Longest token [`merges_from_scores`] cuts into merges.
const MAX_MERGE_TOKEN_BYTES: usize = 1024;

/// SentencePiece keeps no merge list: every way to cut a token into two tokens is a merge, ranked
/// by the score of the token it makes (higher first), ties broken as transformers breaks them
/// (longer left part, then longer right part, then vocabulary order), so ids match its GGUF loader.
fn merges_from_scores(tokens: &[String], scores: &[f64], vocab: &Vocab) -> Vec<(String, String)> {
    // Later duplicates of a token string override the score but keep the first position, as a
    // Python dict built from the list does.
    let mut score_of: HashMap<&str, (usize, f64)> = HashMap::with_capacity(tokens.len());
    for (i, (t, &s)) in tokens.iter().zip(scores).enumerate() {
        score_of
            .entry(t.as_str())
            .and_modify(|e| e.1 = s)
            .or_insert((i, s));
    }
    let mut order: Vec<(&str, usize, f64)> =
        score_of.iter().map(|(t, &(i, s))| (*t, i, s)).collect();
    order.sort_by_key(|e| e.1);
    let mut merges: Vec<(usize, usize, f64, u32, u32, usize)> = Vec::new();
    let mut cand: Vec<(u32, u32, usize)> = Vec::new();
    for &(tok, _, score) in &order {
        cand.clear();
        // Every cut of a token is a lookup of its halves: quadratic in its length. Real pieces are
        // short; a hostile multi-megabyte token just gets no merges.
        if tok.len() > MAX_MERGE_TOKEN_BYTES {
            continue;
        }
        for (cut, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(cut);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                cand.push((li, ri, cut));
            }
        }
        cand.sort_by_key(|&(li, ri, _)| (li, ri));
        for &(li, ri, cut) in &cand {
            let (l, r) = tok.split_at(cut);
            merges.push((l.chars().count(), r.chars().count(), score, li, ri, cut));
        }
    }
    // Stable sort, descending on (score, left length, right length): Python's sorted(reverse=True).
    let mut idx: Vec<usize> = (0..merges.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (&merges[a], &merges[b]);
        y.2.total_cmp(&x.2).then(y.0.cmp(&x.0)).then(y.1.cmp(&x.1))
    });
    let names: HashMap<u32, &str> = vocab.iter().map(|(k, &v)| (v, k.as_str())).collect();
    idx.into_iter()
        .map(|i| {
            let m = &merges[i];
            (names[&m.3].to_string(), names[&m.4].to_string())
        })
        .collect()
}
