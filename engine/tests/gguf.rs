//! The GGUF reader and the GGUF tokenizer.
//!
//! - Hostile input: every truncation of a valid file, absurd counts, lengths, dimensions and
//!   offsets, unknown versions and types, deep nesting, random corruption: always an error, never a
//!   panic, an overflow or a huge allocation.
//! - Fixtures made by tests/fixtures/make_gguf_fixtures.py with the `gguf` Python package: every
//!   metadata type and several tensor types read back exactly; tiny tokenizers (byte-level BPE with
//!   the qwen2, llama-bpe, smollm and gpt2 pre-tokenizers, SentencePiece) giving the token ids
//!   transformers gives.
//! - The real SmolLM2-135M-Instruct Q4_1 file (not in the repository; see [`smollm2_path`]):
//!   config, tensors, token ids and chat template against transformers.

use std::path::{Path, PathBuf};

use drift_engine::DType;
use drift_engine::formats::gguf::{GgmlType, GgufArray, GgufFile, GgufValue, gguf_tensor_name};
use drift_engine::kernels::qkv_rope::RopePairs;
use drift_engine::models::config::Arch;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::tokenize::gguf_tokenizer::{self, PreSplit};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn json(name: &str) -> Value {
    let path = fixture_dir().join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture_dir().join(name)).unwrap()
}

// ---------------------------------------------------------------------------------------------
// A minimal GGUF writer for hand-made (and deliberately broken) files.

const GGUF_STR: u32 = 8;
const GGUF_ARRAY: u32 = 9;

#[derive(Default, Clone)]
struct Writer {
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    ti: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
    alignment: usize,
}

fn str_bytes(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

impl Writer {
    fn new() -> Writer {
        Writer {
            version: 3,
            alignment: 32,
            ..Default::default()
        }
    }

    /// A key/value with the value's type id and its raw encoding.
    fn kv_raw(mut self, key: &[u8], ty: u32, value: &[u8]) -> Writer {
        self.kv.extend(str_bytes(key));
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    fn kv_u32(self, key: &str, v: u32) -> Writer {
        self.kv_raw(key.as_bytes(), 4, &v.to_le_bytes())
    }

    fn kv_str(self, key: &str, v: &str) -> Writer {
        self.kv_raw(key.as_bytes(), GGUF_STR, &str_bytes(v.as_bytes()))
    }

    fn kv_str_array(self, key: &str, items: &[&str]) -> Writer {
        let mut v = GGUF_STR.to_le_bytes().to_vec();
        v.extend((items.len() as u64).to_le_bytes());
        for s in items {
            v.extend(str_bytes(s.as_bytes()));
        }
        self.kv_raw(key.as_bytes(), GGUF_ARRAY, &v)
    }

    fn kv_i32_array(self, key: &str, items: &[i32]) -> Writer {
        let mut v = 5u32.to_le_bytes().to_vec();
        v.extend((items.len() as u64).to_le_bytes());
        for x in items {
            v.extend(x.to_le_bytes());
        }
        self.kv_raw(key.as_bytes(), GGUF_ARRAY, &v)
    }

    /// A tensor info with raw fields; `data` is appended to the data section at `offset` as given.
    fn tensor_raw(mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Writer {
        self.ti.extend(str_bytes(name.as_bytes()));
        self.ti.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            self.ti.extend(d.to_le_bytes());
        }
        self.ti.extend(ty.to_le_bytes());
        self.ti.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// An F32 tensor with its data placed at the next aligned offset.
    fn tensor_f32(mut self, name: &str, ne: &[u64], values: &[f32]) -> Writer {
        let pad = self.data.len().next_multiple_of(self.alignment) - self.data.len();
        self.data.extend(std::iter::repeat_n(0u8, pad));
        let offset = self.data.len() as u64;
        for v in values {
            self.data.extend(v.to_le_bytes());
        }
        self.tensor_raw(name, ne, 0, offset)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        out.extend_from_slice(&self.ti);
        let pad = out.len().next_multiple_of(self.alignment) - out.len();
        out.extend(std::iter::repeat_n(0u8, pad));
        out.extend_from_slice(&self.data);
        out
    }

    fn parse(&self) -> drift_engine::Result<GgufFile> {
        GgufFile::from_bytes("test.gguf", self.bytes())
    }
}

fn small_valid() -> Writer {
    Writer::new()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .tensor_f32("a", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor_f32("b", &[5], &[7.0, 8.0, 9.0, 10.0, 11.0])
}

fn expect_err(r: drift_engine::Result<GgufFile>, needle: &str) -> String {
    match r {
        Ok(_) => panic!("expected an error containing {needle:?}, the file parsed"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(needle),
                "error {msg:?} does not mention {needle:?}"
            );
            msg
        }
    }
}

#[test]
fn writer_output_is_valid() {
    let f = small_valid().parse().unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count"), Some(2));
    let a = f.tensor("a").unwrap();
    assert_eq!(
        (a.shape.clone(), a.dtype().unwrap()),
        (vec![2, 3], DType::F32)
    );
    let bytes = f.tensor_bytes("b").unwrap();
    let vals: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, [7.0, 8.0, 9.0, 10.0, 11.0]);
    assert_eq!(f.tensor("b").unwrap().offset, 32);
    assert_eq!(
        f.tensor_f32("a").unwrap(),
        (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    );
    assert_eq!(f.rope_freq_factors().unwrap(), None);
    let g = small_valid()
        .tensor_f32("rope_freqs.weight", &[2], &[1.0, 8.0])
        .parse()
        .unwrap();
    assert_eq!(g.rope_freq_factors().unwrap(), Some(vec![1.0, 8.0]));
    // An info from another file is refused, not sliced out of bounds.
    let far = g.tensor("rope_freqs.weight").unwrap().clone();
    let short = Writer::new().parse().unwrap();
    assert!(short.info_bytes(&far).is_err());
    let e = f.tensor_bytes("missing").unwrap_err().to_string();
    assert!(e.contains("no tensor named missing"), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    for (name, bytes) in [
        ("writer", small_valid().bytes()),
        ("all_types.gguf", fixture_bytes("all_types.gguf")),
        ("tok_spm.gguf", fixture_bytes("tok_spm.gguf")),
    ] {
        let full = GgufFile::from_bytes(name, bytes.clone()).unwrap();
        // Past the end of the last tensor's data only padding follows: cutting that is harmless.
        let needed = full
            .tensors()
            .iter()
            .map(|t| t.file_offset + t.n_bytes.unwrap())
            .max()
            .unwrap_or(full.data_offset())
            .max(full.data_offset().min(bytes.len() as u64)) as usize;
        // Every cut inside the header, and a stride through the data.
        let cuts: Vec<usize> = (0..full.data_offset() as usize)
            .chain((full.data_offset() as usize..needed).step_by(97))
            .collect();
        for &n in &cuts {
            match GgufFile::from_bytes(name, bytes[..n].to_vec()) {
                Ok(_) => panic!("{name} cut to {n} of {} bytes parsed", bytes.len()),
                Err(e) => {
                    let m = e.to_string();
                    assert!(
                        m.contains("truncated")
                            || m.contains("not a GGUF file")
                            || m.contains("remain"),
                        "{name} cut to {n}: unclear error {m:?}"
                    );
                }
            }
        }
        GgufFile::from_bytes(name, bytes[..needed].to_vec()).unwrap();
        println!("{name}: {} truncations all refused", cuts.len());
    }
}

#[test]
fn bad_headers_are_errors() {
    expect_err(GgufFile::from_bytes("empty", Vec::new()), "not a GGUF file");
    expect_err(
        GgufFile::from_bytes("gguf", b"GGU".to_vec()),
        "not a GGUF file",
    );
    let mut b = small_valid().bytes();
    b[..4].copy_from_slice(b"GGML");
    expect_err(GgufFile::from_bytes("magic", b), "not a GGUF file");
    for (v, needle) in [
        (1u32, "version 1"),
        (4, "unknown GGUF version 4"),
        (0, "unknown GGUF version 0"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut w = small_valid();
        w.version = v;
        expect_err(w.parse(), needle);
    }
    // Version 2 has the same layout as 3.
    let mut w = small_valid();
    w.version = 2;
    assert_eq!(w.parse().unwrap().version(), 2);
}

#[test]
fn absurd_counts_and_lengths_are_errors() {
    // Tensor and metadata counts far beyond what the file could hold: refused before allocating.
    for count in [u64::MAX, 1 << 40, 1 << 20] {
        let mut b = small_valid().bytes();
        b[8..16].copy_from_slice(&count.to_le_bytes());
        expect_err(GgufFile::from_bytes("tensors", b), "tensor count claims");
        let mut b = small_valid().bytes();
        b[16..24].copy_from_slice(&count.to_le_bytes());
        expect_err(GgufFile::from_bytes("kvs", b), "metadata count claims");
        // The first key's string length.
        let mut b = small_valid().bytes();
        b[24..32].copy_from_slice(&count.to_le_bytes());
        expect_err(GgufFile::from_bytes("key", b), "claims");
    }
    // A string value claiming more bytes than remain.
    let mut v = (1u64 << 50).to_le_bytes().to_vec();
    v.extend(b"abc");
    expect_err(Writer::new().kv_raw(b"k", GGUF_STR, &v).parse(), "claims");
    // Arrays claiming 2^62 elements of each type (u64: 2^65 bytes would overflow a naive size).
    for ty in [0u32, 4, 10, 8, 9] {
        let mut v = ty.to_le_bytes().to_vec();
        v.extend((1u64 << 62).to_le_bytes());
        v.extend([0u8; 64]);
        expect_err(
            Writer::new().kv_raw(b"arr", GGUF_ARRAY, &v).parse(),
            "claims",
        );
    }
    // Unknown value types, top-level and inside an array.
    expect_err(
        Writer::new().kv_raw(b"k", 13, &[0; 8]).parse(),
        "unknown value type 13",
    );
    let mut v = 99u32.to_le_bytes().to_vec();
    v.extend(1u64.to_le_bytes());
    expect_err(
        Writer::new().kv_raw(b"k", GGUF_ARRAY, &v).parse(),
        "array of unknown type 99",
    );
    // Nesting deep enough to overflow a naive recursive reader's stack.
    let mut v = Vec::new();
    for _ in 0..100_000 {
        v.extend(GGUF_ARRAY.to_le_bytes());
        v.extend(1u64.to_le_bytes());
    }
    v.extend(0u32.to_le_bytes());
    v.extend(0u64.to_le_bytes());
    expect_err(
        Writer::new().kv_raw(b"deep", GGUF_ARRAY, &v).parse(),
        "nests arrays deeper",
    );
    // Invalid UTF-8, duplicate keys and tensors.
    expect_err(
        Writer::new().kv_raw(b"k\xff", 4, &[0; 4]).parse(),
        "not valid UTF-8",
    );
    expect_err(
        small_valid().kv_u32("llama.block_count", 3).parse(),
        "appears twice",
    );
    expect_err(
        small_valid().tensor_raw("a", &[1], 0, 0).parse(),
        "tensor a appears twice",
    );
}

#[test]
fn bad_tensor_infos_are_errors() {
    let base = || Writer::new().kv_str("general.architecture", "llama");
    // Offsets past the end, overflowing, or unaligned.
    expect_err(
        base().tensor_raw("t", &[4], 0, 1 << 20).parse(),
        "past the end of the file",
    );
    expect_err(
        base().tensor_raw("t", &[4], 0, u64::MAX - 31).parse(),
        "past the end of the file",
    );
    expect_err(
        small_valid().tensor_raw("t", &[4], 0, 32 * 1000).parse(),
        "past the end",
    );
    expect_err(
        small_valid().tensor_raw("t", &[4], 0, 8).parse(),
        "not a multiple of the alignment",
    );
    // A tensor that starts inside the file but runs past its end.
    expect_err(
        small_valid().tensor_raw("t", &[1000], 0, 0).parse(),
        "truncated download",
    );
    // Dimensions: too many, negative, overflowing products, overflowing byte sizes.
    expect_err(
        base().tensor_raw("t", &[1; 5], 0, 0).parse(),
        "5 dimensions",
    );
    let mut w = base();
    w.ti.extend(str_bytes(b"t"));
    w.ti.extend(u32::MAX.to_le_bytes());
    w.n_tensors += 1;
    expect_err(w.parse(), "dimensions");
    expect_err(
        base().tensor_raw("t", &[1 << 63], 0, 0).parse(),
        "negative dimension",
    );
    expect_err(
        base().tensor_raw("t", &[1 << 32, 1 << 32], 0, 0).parse(),
        "overflows",
    );
    expect_err(
        base().tensor_raw("t", &[1 << 31, 1 << 31, 4], 0, 0).parse(),
        "overflows",
    );
    expect_err(
        base().tensor_raw("t", &[1 << 62], 0, 0).parse(),
        "overflows",
    );
    // Block types need whole blocks per row.
    expect_err(
        base().tensor_raw("t", &[33, 2], 2, 0).parse(),
        "not a whole number of Q4_0 blocks",
    );
    // Alignment must be a power of two (and an integer).
    for (ty, val) in [
        (4u32, 0u32.to_le_bytes().to_vec()),
        (4, 48u32.to_le_bytes().to_vec()),
        (8, str_bytes(b"32")),
    ] {
        expect_err(
            small_valid().kv_raw(b"general.alignment", ty, &val).parse(),
            "general.alignment",
        );
    }
}

#[test]
fn unknown_tensor_types_fail_only_when_used() {
    let f = small_valid()
        .tensor_raw("future", &[8], 1234, 0)
        .parse()
        .unwrap();
    let t = f.tensor("future").unwrap();
    assert_eq!((t.ggml_type, t.n_bytes), (GgmlType(1234), None));
    let e = f.tensor_bytes("future").unwrap_err().to_string();
    assert!(e.contains("unknown ggml type 1234"), "{e}");
    let e = t.dtype().unwrap_err().to_string();
    assert!(
        e.contains("unknown ggml type 1234") && e.contains("future"),
        "{e}"
    );
    // The known tensors still work.
    assert_eq!(f.tensor_bytes("a").unwrap().len(), 24);
}

#[test]
fn random_corruption_never_panics() {
    // Flip bytes in the header of a real fixture: every outcome must be Ok or Err, never a panic.
    let bytes = fixture_bytes("all_types.gguf");
    let header = GgufFile::from_bytes("x", bytes.clone())
        .unwrap()
        .data_offset() as usize;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header;
            b[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xff,
                _ => 0,
            };
        }
        match GgufFile::from_bytes("corrupt", b) {
            Ok(f) => {
                ok += 1;
                for t in f.tensors() {
                    let _ = f.info_bytes(t);
                }
            }
            Err(_) => err += 1,
        }
    }
    println!("random corruption: {ok} parsed, {err} refused");
    assert!(err > 0);
}

// ---------------------------------------------------------------------------------------------
// The `gguf` package's own file: every metadata type and several tensor types.

fn expected_value(ty: &str, v: &Value) -> GgufValue {
    fn arr(ty: &str, v: &Value) -> GgufArray {
        let items = v.as_array().unwrap();
        let inner = &ty[1..ty.len() - 1];
        match inner {
            "u8" => GgufArray::U8(items.iter().map(|x| x.as_u64().unwrap() as u8).collect()),
            "i8" => GgufArray::I8(items.iter().map(|x| x.as_i64().unwrap() as i8).collect()),
            "u16" => GgufArray::U16(items.iter().map(|x| x.as_u64().unwrap() as u16).collect()),
            "i16" => GgufArray::I16(items.iter().map(|x| x.as_i64().unwrap() as i16).collect()),
            "u32" => GgufArray::U32(items.iter().map(|x| x.as_u64().unwrap() as u32).collect()),
            "i32" => GgufArray::I32(items.iter().map(|x| x.as_i64().unwrap() as i32).collect()),
            "f32" => GgufArray::F32(items.iter().map(|x| x.as_f64().unwrap() as f32).collect()),
            "bool" => GgufArray::Bool(items.iter().map(|x| x.as_bool().unwrap()).collect()),
            "str" => GgufArray::Str(
                items
                    .iter()
                    .map(|x| x.as_str().unwrap().to_string())
                    .collect(),
            ),
            "u64" => GgufArray::U64(items.iter().map(|x| x.as_u64().unwrap()).collect()),
            "i64" => GgufArray::I64(items.iter().map(|x| x.as_i64().unwrap()).collect()),
            "f64" => GgufArray::F64(items.iter().map(|x| x.as_f64().unwrap()).collect()),
            nested => GgufArray::Array(items.iter().map(|x| arr(nested, x)).collect()),
        }
    }
    match ty {
        "u8" => GgufValue::U8(v.as_u64().unwrap() as u8),
        "i8" => GgufValue::I8(v.as_i64().unwrap() as i8),
        "u16" => GgufValue::U16(v.as_u64().unwrap() as u16),
        "i16" => GgufValue::I16(v.as_i64().unwrap() as i16),
        "u32" => GgufValue::U32(v.as_u64().unwrap() as u32),
        "i32" => GgufValue::I32(v.as_i64().unwrap() as i32),
        "f32" => GgufValue::F32(v.as_f64().unwrap() as f32),
        "bool" => GgufValue::Bool(v.as_bool().unwrap()),
        "str" => GgufValue::Str(v.as_str().unwrap().to_string()),
        "u64" => GgufValue::U64(v.as_u64().unwrap()),
        "i64" => GgufValue::I64(v.as_i64().unwrap()),
        "f64" => GgufValue::F64(v.as_f64().unwrap()),
        t if t.starts_with('[') => GgufValue::Array(arr(t, v)),
        t => panic!("fixture type {t}"),
    }
}

fn check_all_types(f: &GgufFile, version: u32) {
    let r = json("all_types.json");
    assert_eq!(f.version(), version);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset(), r["data_offset"].as_u64().unwrap());
    let meta = r["metadata"].as_object().unwrap();
    assert_eq!(f.metadata_entries().count(), meta.len());
    for (key, want) in meta {
        let ty = want["type"].as_str().unwrap();
        let got = f
            .metadata(key)
            .unwrap_or_else(|| panic!("metadata {key} missing"));
        assert_eq!(got, &expected_value(ty, &want["value"]), "{key}");
        assert_eq!(got.type_name(), ty, "{key}");
    }
    // Typed helpers and their conversions.
    assert_eq!(f.get_u32("test.u8"), Some(200));
    assert_eq!(f.get_u32("test.u64"), None, "u64 beyond u32");
    assert_eq!(f.get_u64("test.u64"), Some((1 << 63) + 5));
    assert_eq!(f.get_i64("test.i8"), Some(-100));
    assert_eq!(f.get_u64("test.i8"), None, "negative");
    assert_eq!(f.get_f32("test.f32"), Some(1.2345));
    assert_eq!(f.get_f64("test.f64"), Some(0.1));
    assert_eq!(f.get_bool("test.bool_true"), Some(true));
    assert_eq!(f.get_str("test.string"), Some("héllo wörld ✓ 東京"));
    assert_eq!(f.get_str("test.u8"), None, "wrong type");
    assert_eq!(
        f.get_str_array("arr.str").unwrap(),
        ["a", "", "日本", "with space"]
    );
    assert_eq!(
        f.get_array("arr.nested_i32").unwrap().type_name(),
        "[[i32]]"
    );
    assert_eq!(f.architecture().unwrap(), "test");

    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(f.tensors().len(), tensors.len());
    for (got, want) in f.tensors().iter().zip(tensors) {
        let name = want["name"].as_str().unwrap();
        assert_eq!(got.name, name);
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(got.shape, shape, "{name}");
        assert_eq!(
            got.ggml_type.to_string(),
            want["type"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(got.file_offset, want["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(got.n_bytes, want["n_bytes"].as_u64(), "{name}");
        assert_eq!(got.file_offset % 64, 0, "{name} aligned");
        let hex: String = f
            .tensor_bytes(name)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, want["hex"].as_str().unwrap(), "{name} bytes");
        let expect = match want["type"].as_str().unwrap() {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            "Q8_0" => Some(DType::Q8_0),
            "Q4_0" => Some(DType::Q4_0),
            "Q4_1" => Some(DType::Q4_1),
            "Q5_0" => Some(DType::Q5_0),
            "Q5_1" => Some(DType::Q5_1),
            "Q4_K" => Some(DType::Q4K),
            "Q5_K" => Some(DType::Q5K),
            "Q6_K" => Some(DType::Q6K),
            _ => None,
        };
        match (got.dtype(), expect) {
            (Ok(d), Some(e)) => {
                assert_eq!(d, e, "{name}");
                assert_eq!(
                    d.bytes_for(got.numel()).unwrap(),
                    got.n_bytes.unwrap(),
                    "{name} size"
                );
            }
            (Err(err), None) => {
                let m = err.to_string();
                assert!(
                    m.contains(name) && m.contains(want["type"].as_str().unwrap()),
                    "{m}"
                );
            }
            (got, want) => panic!("{name}: dtype {got:?}, expected {want:?}"),
        }
    }
    // F32 and F16 values decode to what numpy wrote.
    let (shape, m) = f.tensor_f32("f32.matrix").unwrap();
    assert_eq!((shape, m.len()), (vec![3, 5], 15));
    assert_eq!(f.tensor_f32("f16.vector").unwrap().1.len(), 7);
    let e = f.tensor_f32("q8_0.rows").unwrap_err().to_string();
    assert!(e.contains("F32, F16 and BF16 only"), "{e}");
}

#[test]
fn all_types_fixture_reads_back_exactly() {
    let f = GgufFile::open(&fixture_dir().join("all_types.gguf")).unwrap();
    check_all_types(&f, 3);
    // The same file labelled version 2 (identical layout) reads the same.
    let mut b = fixture_bytes("all_types.gguf");
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    check_all_types(&GgufFile::from_bytes("v2", b).unwrap(), 2);
}

#[test]
fn open_reports_missing_files() {
    let e = GgufFile::open(Path::new("/nonexistent/model.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Tokenizers against transformers' GGUF loader.

fn check_tokenizer(f: &GgufFile, r: &Value, label: &str) {
    let t = gguf_tokenizer::from_gguf(f).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut n = 0;
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = t.tokenizer.encode(text, false).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{label}: ids of {text:?}");
        let got = t.tokenizer.encode(text, true).unwrap();
        assert_eq!(
            got,
            ids(&case["ids_add_special"]),
            "{label}: ids with BOS/EOS of {text:?}"
        );
        let decoded = t.tokenizer.decode(&ids(&case["ids"])).unwrap();
        assert_eq!(
            decoded,
            case["decoded"].as_str().unwrap(),
            "{label}: decode of {text:?}"
        );
        n += 1;
    }
    assert_eq!(
        t.bos_token,
        r["bos_token"].as_str().unwrap_or(""),
        "{label}: bos"
    );
    assert_eq!(
        t.eos_token,
        r["eos_token"].as_str().unwrap_or(""),
        "{label}: eos"
    );
    let template = t.template().unwrap().expect("a chat template");
    for chat in r["chats"].as_array().unwrap() {
        let msgs: Vec<Message> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        assert_eq!(
            template.render(&msgs, true).unwrap(),
            chat["text"].as_str().unwrap(),
            "{label}: chat"
        );
    }
    println!("{label}: {n} strings tokenized as transformers does");
}

fn check_config(f: &GgufFile, r: &Value, label: &str) {
    let c = f.llm_config().unwrap();
    let want = &r["config"];
    let u = |k: &str| want[k].as_u64().unwrap() as usize;
    assert_eq!(c.hidden, u("hidden_size"), "{label}");
    assert_eq!(c.intermediate, u("intermediate_size"), "{label}");
    assert_eq!(c.n_layers, u("num_hidden_layers"), "{label}");
    assert_eq!(c.n_heads, u("num_attention_heads"), "{label}");
    assert_eq!(c.n_kv_heads, u("num_key_value_heads"), "{label}");
    // transformers' GGUF config ignores attention.key_length (and Qwen2Config has no head_dim).
    let head_dim = f
        .get_u32(&format!(
            "{}.attention.key_length",
            f.architecture().unwrap()
        ))
        .map(|x| x as usize)
        .or(want["head_dim"].as_u64().map(|x| x as usize))
        .unwrap_or(u("hidden_size") / u("num_attention_heads"));
    assert_eq!(c.head_dim, head_dim, "{label}");
    assert_eq!(c.max_positions, u("max_position_embeddings"), "{label}");
    assert_eq!(c.vocab, u("vocab_size"), "{label}");
    assert_eq!(
        c.rope_theta,
        want["rope_theta"].as_f64().unwrap(),
        "{label}"
    );
    // transformers keeps the f32's exact value; Drift reads back the decimal it was written from.
    let eps = want["rms_norm_eps"].as_f64().unwrap();
    assert_eq!(c.rms_eps as f32, eps as f32, "{label}");
    assert_eq!(
        c.bos,
        want["bos_token_id"].as_u64().map(|x| x as u32),
        "{label}"
    );
    assert_eq!(
        c.eos[0] as u64,
        want["eos_token_id"].as_u64().unwrap(),
        "{label}"
    );
    assert_eq!(
        c.tie_embeddings,
        r["tied"].as_bool().unwrap_or(true),
        "{label}: tied"
    );
    assert_eq!(
        c.qkv_bias,
        r["qkv_bias"].as_bool().unwrap_or(false),
        "{label}: qkv bias"
    );
    let arch = match want["model_type"].as_str().unwrap() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        other => panic!("{other}"),
    };
    assert_eq!(c.arch, arch);
    let pairs = if arch == Arch::Qwen2 {
        RopePairs::HalfSplit
    } else {
        RopePairs::Interleaved
    };
    assert_eq!(f.rope_pairs().unwrap(), pairs);
}

fn tok_fixture(name: &str) {
    let f = GgufFile::open(&fixture_dir().join(format!("tok_{name}.gguf"))).unwrap();
    let r = json(&format!("tok_{name}.json"));
    check_tokenizer(&f, &r, name);
    check_config(&f, &r, name);
}

#[test]
fn tokenizer_qwen2() {
    tok_fixture("qwen2");
    let f = GgufFile::open(&fixture_dir().join("tok_qwen2.gguf")).unwrap();
    let t = gguf_tokenizer::from_gguf(&f).unwrap();
    assert_eq!(
        (t.model.as_str(), t.pre.as_deref(), t.add_bos),
        ("gpt2", Some("qwen2"), false)
    );
    assert_eq!(PreSplit::from_name(t.pre.as_deref()), PreSplit::Qwen2);
}

#[test]
fn tokenizer_llama3() {
    tok_fixture("llama3");
    let f = GgufFile::open(&fixture_dir().join("tok_llama3.gguf")).unwrap();
    let t = gguf_tokenizer::from_gguf(&f).unwrap();
    assert!(t.add_bos);
    assert_eq!(PreSplit::from_name(t.pre.as_deref()), PreSplit::Llama3);
    // eos, then eot.
    let c = f.llm_config().unwrap();
    assert_eq!(
        c.eos,
        vec![
            t.eos_id.unwrap(),
            t.tokenizer.token_id("<|eot_id|>").unwrap()
        ]
    );
}

#[test]
fn tokenizer_smollm() {
    tok_fixture("smollm");
}

#[test]
fn tokenizer_gpt2_default() {
    tok_fixture("gpt2");
    let f = GgufFile::open(&fixture_dir().join("tok_gpt2.gguf")).unwrap();
    assert_eq!(gguf_tokenizer::from_gguf(&f).unwrap().pre, None);
}

#[test]
fn tokenizer_sentencepiece() {
    tok_fixture("spm");
    let f = GgufFile::open(&fixture_dir().join("tok_spm.gguf")).unwrap();
    let t = gguf_tokenizer::from_gguf(&f).unwrap();
    assert_eq!(
        (t.model.as_str(), t.bos_token.as_str(), t.eos_token.as_str()),
        ("llama", "<s>", "</s>")
    );
    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    let ids = t.tokenizer.encode("🦀", false).unwrap();
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| t.tokenizer.inner.id_to_token(i).unwrap())
        .collect();
    assert!(pieces.contains(&"<0xF0>".to_string()), "{pieces:?}");
    assert_eq!(t.tokenizer.decode(&ids).unwrap(), "🦀");
    // key_length sets head_dim independently of hidden / heads.
    assert_eq!(f.llm_config().unwrap().head_dim, 8);
}

#[test]
fn config_errors_are_clear() {
    let base = || {
        Writer::new()
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.embedding_length", 64)
            .kv_u32("llama.feed_forward_length", 128)
            .kv_u32("llama.block_count", 2)
            .kv_u32("llama.vocab_size", 100)
    };
    let with_eps = |w: Writer| {
        w.kv_raw(
            b"llama.attention.layer_norm_rms_epsilon",
            6,
            &1e-5f32.to_le_bytes(),
        )
    };
    let e = with_eps(base())
        .parse()
        .unwrap()
        .llm_config()
        .unwrap_err()
        .to_string();
    assert!(e.contains("lacks llama.attention.head_count"), "{e}");
    let e = with_eps(
        base()
            .kv_u32("llama.attention.head_count", 4)
            .kv_u32("llama.attention.head_count_kv", 3),
    )
    .parse()
    .unwrap()
    .llm_config()
    .unwrap_err()
    .to_string();
    assert!(e.contains("cannot share"), "{e}");
    let e = with_eps(base().kv_str("llama.attention.head_count", "four"))
        .parse()
        .unwrap()
        .llm_config()
        .unwrap_err();
    assert!(e.to_string().contains("expected a count"), "{e}");
    let e = Writer::new()
        .kv_str("general.architecture", "gptneox")
        .parse()
        .unwrap()
        .llm_config()
        .unwrap_err();
    assert!(e.to_string().contains("gptneox"), "{e}");
    // A minimal valid llama: defaults for kv heads, theta, context; no tensors means tied
    // embeddings.
    let c = with_eps(base().kv_u32("llama.attention.head_count", 4))
        .parse()
        .unwrap()
        .llm_config()
        .unwrap();
    assert_eq!(
        (c.n_kv_heads, c.head_dim, c.rope_theta, c.max_positions),
        (4, 16, 10000.0, 2048)
    );
    assert_eq!(
        c.rms_eps, 1e-5,
        "the f32 1e-5 reads back as the decimal 1e-5"
    );
    assert!(c.tie_embeddings && !c.qkv_bias && c.bos.is_none() && c.eos.is_empty());
    assert_eq!(c.vocab, 100, "vocab_size when there is no token list");
}

// ---------------------------------------------------------------------------------------------
// The real SmolLM2-135M-Instruct Q4_1.

#[path = "support/smollm2.rs"]
mod smollm2;
use smollm2::smollm2_path;

#[test]
fn smollm2_config_and_tensors() {
    let f = GgufFile::open(&smollm2_path()).unwrap();
    let r = json("smollm2_reference.json");
    assert_eq!(f.version(), 3);
    assert_eq!(f.data_offset(), r["data_offset"].as_u64().unwrap());
    assert_eq!(f.architecture().unwrap(), "llama");
    check_config(&f, &r, "smollm2");
    let c = f.llm_config().unwrap();
    assert_eq!(
        (c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim),
        (576, 30, 9, 3, 64)
    );
    assert_eq!(
        (c.rms_eps, c.rope_theta, c.eos.clone()),
        (1e-5, 100000.0, vec![2])
    );
    assert!(c.rope_scaling.is_none() && f.rope_freq_factors().unwrap().is_none());

    assert_eq!(f.tensors().len() as u64, r["n_tensors"].as_u64().unwrap());
    for want in r["tensors"].as_array().unwrap() {
        let name = want["name"].as_str().unwrap();
        let t = f
            .tensor(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"));
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.shape, shape, "{name}");
        assert_eq!(
            t.ggml_type.to_string(),
            want["type"].as_str().unwrap(),
            "{name}"
        );
    }
    let mut counts = std::collections::BTreeMap::new();
    let mut total = 0u64;
    for t in f.tensors() {
        *counts.entry(t.ggml_type.to_string()).or_insert(0u64) += 1;
        let d = t.dtype().unwrap();
        let bytes = f.tensor_bytes(&t.name).unwrap();
        assert_eq!(
            bytes.len() as u64,
            d.bytes_for(t.numel()).unwrap(),
            "{}",
            t.name
        );
        total += bytes.len() as u64;
    }
    let want: std::collections::BTreeMap<String, u64> = r["types"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(counts, want);
    assert!(total <= f.file_len() - f.data_offset());
    // Every Hugging Face name the Llama loader asks for maps onto a tensor of the file.
    let mut hf = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
    ];
    for l in 0..c.n_layers {
        for m in [
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            hf.push(format!("model.layers.{l}.{m}.weight"));
        }
    }
    for name in &hf {
        let g = gguf_tensor_name(name).unwrap_or_else(|| panic!("{name} has no GGUF name"));
        assert!(f.has_tensor(&g), "{name} -> {g} missing");
    }
    assert_eq!(
        hf.len(),
        f.tensors().len(),
        "every tensor is one the loader asks for"
    );
    assert!(!f.has_tensor("output.weight"), "tied embeddings");
    assert_eq!(
        gguf_tensor_name("lm_head.weight").as_deref(),
        Some("output.weight")
    );
    assert_eq!(
        gguf_tensor_name("model.layers.7.self_attn.k_proj.bias").as_deref(),
        Some("blk.7.attn_k.bias")
    );
    assert_eq!(gguf_tensor_name("model.layers.x.mlp.up_proj.weight"), None);
    assert_eq!(gguf_tensor_name("model.layers.0.mlp.up_proj.scales"), None);
    let (dtype, shape, _) = f.tensor_data("token_embd.weight").unwrap();
    assert_eq!((dtype, shape), (DType::Q8_0, &[49152usize, 576][..]));
    assert_eq!(
        f.tensor("blk.0.ffn_down.weight").unwrap().dtype().unwrap(),
        DType::Q4_1
    );
    println!(
        "smollm2: {} tensors, {total} bytes of weights, types {counts:?}",
        f.tensors().len()
    );
}

#[test]
fn smollm2_tokenizer_matches_transformers() {
    let f = GgufFile::open(&smollm2_path()).unwrap();
    let r = json("smollm2_reference.json");
    let t0 = std::time::Instant::now();
    let t = gguf_tokenizer::from_gguf(&f).unwrap();
    println!(
        "smollm2 tokenizer built in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(
        (t.model.as_str(), t.pre.as_deref()),
        ("gpt2", Some("smollm"))
    );
    assert_eq!((t.bos_id, t.eos_id, t.add_bos), (Some(1), Some(2), false));
    assert_eq!(t.tokenizer.token_id("<|im_start|>"), Some(1));
    check_tokenizer(&f, &r, "smollm2");
}

#[test]
fn pre_tokenizer_digit_splits() {
    use tokenizers::PreTokenizer;
    // The tiny fixtures cannot show every split difference (their vocabularies may lack multi-digit
    // tokens), so check the pieces directly.
    let pieces = |name: &str, text: &str| -> Vec<String> {
        let f = GgufFile::open(&fixture_dir().join(format!("tok_{name}.gguf"))).unwrap();
        let t = gguf_tokenizer::from_gguf(&f).unwrap();
        let mut s = tokenizers::PreTokenizedString::from(text);
        t.tokenizer
            .inner
            .get_pre_tokenizer()
            .unwrap()
            .pre_tokenize(&mut s)
            .unwrap();
        s.get_splits(
            tokenizers::OffsetReferential::Original,
            tokenizers::OffsetType::Char,
        )
        .into_iter()
        .map(|(p, _, _)| p.to_string())
        .collect()
    };
    assert_eq!(
        pieces("smollm", "a 12345"),
        ["a", "Ġ", "1", "2", "3", "4", "5"]
    );
    assert_eq!(pieces("gpt2", "a 12345"), ["a", "Ġ12345"]);
    assert_eq!(pieces("llama3", "a 12345"), ["a", "Ġ", "123", "45"]);
    assert_eq!(
        pieces("qwen2", "a 12345"),
        ["a", "Ġ", "1", "2", "3", "4", "5"]
    );
    assert_eq!(pieces("llama3", "x\n\n  y"), ["x", "ĊĊ", "Ġ", "Ġy"]);
}

#[test]
fn broken_tokenizer_metadata_is_an_error() {
    let toks = ["<unk>", "<s>", "a", "b", "ab"];
    let spm = || {
        Writer::new()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_str_array("tokenizer.ggml.tokens", &toks)
    };
    let build = |w: Writer| gguf_tokenizer::from_gguf(&w.parse().unwrap()).map(|_| ());
    build(spm()).unwrap();
    let e = build(spm().kv_i32_array("tokenizer.ggml.token_type", &[1, 1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("token_type is not 5 integers"), "{e}");
    let e = build(spm().kv_u32("tokenizer.ggml.bos_token_id", 99))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a token id"), "{e}");
    // -1 (as i32 or wrapped u32) means "none".
    let t = gguf_tokenizer::from_gguf(
        &spm()
            .kv_u32("tokenizer.ggml.bos_token_id", u32::MAX)
            .parse()
            .unwrap(),
    )
    .unwrap();
    assert_eq!((t.bos_id, t.add_bos), (None, false));
    let e = build(
        Writer::new()
            .kv_str("tokenizer.ggml.model", "gpt2")
            .kv_str_array("tokenizer.ggml.tokens", &toks),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("lacks tokenizer.ggml.merges"), "{e}");
    let e = build(
        Writer::new()
            .kv_str("tokenizer.ggml.model", "t5")
            .kv_str_array("tokenizer.ggml.tokens", &toks),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"t5\""), "{e}");
    let e = build(Writer::new().kv_str("general.architecture", "llama"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no tokenizer"), "{e}");
    // Merges naming non-tokens are skipped, not fatal; a huge token does not stall merge recovery.
    let gpt2 = Writer::new()
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "ab"])
        .kv_str_array("tokenizer.ggml.merges", &["a b", "x y", "nospace"]);
    let t = gguf_tokenizer::from_gguf(&gpt2.parse().unwrap()).unwrap();
    assert_eq!(t.tokenizer.encode("abab", false).unwrap(), [2, 2]);
    let huge = "ab".repeat(200_000);
    let t0 = std::time::Instant::now();
    build(
        Writer::new()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_str_array("tokenizer.ggml.tokens", &["a", "b", &huge]),
    )
    .unwrap();
    assert!(t0.elapsed().as_secs_f64() < 5.0);
}
