//! GGUF, llama.cpp's model format (versions 2 and 3, little-endian), read memory-mapped.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata key/value
//! pairs, the tensor infos (name, dims in ggml order, ggml type, offset into the data section),
//! padding to `general.alignment` (default 32), then the tensor data. Every length, count and
//! offset is checked against the bytes actually present before anything is allocated or sliced, so
//! a truncated or hostile file gives a [`DriftError`] naming the problem, never a panic, an
//! overflow or a huge allocation (a count is refused when the remaining bytes could not hold that
//! many of the smallest element).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{DriftError, Result};
use crate::kernels::qkv_rope::RopePairs;
use crate::models::config::{Arch, LlmConfig};
use crate::tensor::DType;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested metadata arrays deeper than this are refused (recursion guard).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: one element type, stored unboxed so large arrays (vocabularies) stay compact.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

// GGUF value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STR: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Smallest encoding of one element of value type `t` (a string is at least its u64 length, an
/// array at least its u32 type and u64 count); None for unknown types.
fn min_size(t: u32) -> Option<usize> {
    Some(match t {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STR => 8,
        T_ARRAY => 12,
        _ => return None,
    })
}

impl GgufValue {
    /// The GGUF type name: `u8`, `i32`, `f32`, `bool`, `str`, `[u32]`, `[[str]]`...
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::U8(_) => "u8".into(),
            GgufValue::I8(_) => "i8".into(),
            GgufValue::U16(_) => "u16".into(),
            GgufValue::I16(_) => "i16".into(),
            GgufValue::U32(_) => "u32".into(),
            GgufValue::I32(_) => "i32".into(),
            GgufValue::F32(_) => "f32".into(),
            GgufValue::Bool(_) => "bool".into(),
            GgufValue::Str(_) => "str".into(),
            GgufValue::Array(a) => a.type_name(),
            GgufValue::U64(_) => "u64".into(),
            GgufValue::I64(_) => "i64".into(),
            GgufValue::F64(_) => "f64".into(),
        }
    }

    /// Integers (of any width) that are >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(x) => Some(x as u64),
            GgufValue::U16(x) => Some(x as u64),
            GgufValue::U32(x) => Some(x as u64),
            GgufValue::U64(x) => Some(x),
            GgufValue::I8(x) => u64::try_from(x).ok(),
            GgufValue::I16(x) => u64::try_from(x).ok(),
            GgufValue::I32(x) => u64::try_from(x).ok(),
            GgufValue::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// Integers (of any width) that fit an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(x) => Some(x as i64),
            GgufValue::I16(x) => Some(x as i64),
            GgufValue::I32(x) => Some(x as i64),
            GgufValue::I64(x) => Some(x),
            _ => self.as_u64().and_then(|x| i64::try_from(x).ok()),
        }
    }

    /// Floats, and integers converted.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(x) => Some(x as f64),
            GgufValue::F64(x) => Some(x),
            _ => self
                .as_i64()
                .map(|x| x as f64)
                .or_else(|| self.as_u64().map(|x| x as f64)),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for GgufValue {
    /// Scalars as written; arrays as their type and length (vocabularies are long).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(x) => write!(f, "{x}"),
            GgufValue::I8(x) => write!(f, "{x}"),
            GgufValue::U16(x) => write!(f, "{x}"),
            GgufValue::I16(x) => write!(f, "{x}"),
            GgufValue::U32(x) => write!(f, "{x}"),
            GgufValue::I32(x) => write!(f, "{x}"),
            GgufValue::F32(x) => write!(f, "{x}"),
            GgufValue::Bool(x) => write!(f, "{x}"),
            GgufValue::Str(s) => write!(f, "{s:?}"),
            GgufValue::Array(a) => write!(f, "{} of {}", a.type_name(), a.len()),
            GgufValue::U64(x) => write!(f, "{x}"),
            GgufValue::I64(x) => write!(f, "{x}"),
            GgufValue::F64(x) => write!(f, "{x}"),
        }
    }
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::Str(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `[u8]`, `[str]`, `[[i32]]` (an empty nested array shows as `[[]]`)...
    pub fn type_name(&self) -> String {
        let inner = match self {
            GgufArray::U8(_) => "u8".into(),
            GgufArray::I8(_) => "i8".into(),
            GgufArray::U16(_) => "u16".into(),
            GgufArray::I16(_) => "i16".into(),
            GgufArray::U32(_) => "u32".into(),
            GgufArray::I32(_) => "i32".into(),
            GgufArray::F32(_) => "f32".into(),
            GgufArray::Bool(_) => "bool".into(),
            GgufArray::Str(_) => "str".into(),
            GgufArray::Array(v) => v
                .first()
                .map(|a| a.type_name())
                .unwrap_or_else(|| "[]".into()),
            GgufArray::U64(_) => "u64".into(),
            GgufArray::I64(_) => "i64".into(),
            GgufArray::F64(_) => "f64".into(),
        };
        format!("[{inner}]")
    }

    pub fn as_strs(&self) -> Option<&[String]> {
        match self {
            GgufArray::Str(v) => Some(v),
            _ => None,
        }
    }

    /// Integer arrays of any width as i64 (None for other element types or values beyond i64).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            GgufArray::U8(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I8(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::U16(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I16(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::U32(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I32(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I64(v) => v.clone(),
            GgufArray::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).ok())
                .collect::<Option<_>>()?,
            _ => return None,
        })
    }

    /// Numeric arrays as f64.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        match self {
            GgufArray::F32(v) => Some(v.iter().map(|&x| x as f64).collect()),
            GgufArray::F64(v) => Some(v.clone()),
            _ => self
                .to_i64_vec()
                .map(|v| v.into_iter().map(|x| x as f64).collect()),
        }
    }
}

/// A ggml tensor type id, known or not: files may carry types newer than this reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// (id, name, values per block, bytes per block) for every ggml type llama.cpp defines.
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|e| e.0 == self.0)
    }

    /// llama.cpp's name (`Q4_K`), None for ids this reader does not know.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// (values per block, bytes per block), None for unknown ids.
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|e| (e.2, e.3))
    }

    /// The engine's dtype for the types Drift computes with.
    pub fn dtype(self) -> Option<DType> {
        Some(match self.0 {
            0 => DType::F32,
            1 => DType::F16,
            30 => DType::BF16,
            8 => DType::Q8_0,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            12 => DType::Q4K,
            13 => DType::Q5K,
            14 => DType::Q6K,
            _ => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown ggml type {}", self.0),
        }
    }
}

/// One tensor's description. Data is reached through [`GgufFile::tensor_bytes`].
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Row-major shape: ggml's `ne` reversed, so the last dimension is the contiguous one.
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section, as stored in the file.
    pub offset: u64,
    /// Byte length of the data; None when the type is unknown to this reader.
    pub n_bytes: Option<u64>,
    /// Absolute byte offset of the data in the file.
    pub file_offset: u64,
}

impl GgufTensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// ggml's dimension order (`ne[0]` contiguous).
    pub fn ne(&self) -> Vec<usize> {
        self.shape.iter().rev().copied().collect()
    }

    /// The engine dtype; a clear error for types Drift does not run (K-quants other than
    /// Q4_K/Q5_K/Q6_K, i-quants, integer tensors...) or does not know.
    pub fn dtype(&self) -> Result<DType> {
        self.ggml_type.dtype().ok_or_else(|| {
            DriftError::Unsupported(format!(
                "tensor {} is stored as {}, which Drift does not run (it runs F32, F16, BF16, \
                 Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); re-quantize the model to \
                 one of those",
                self.name, self.ggml_type
            ))
        })
    }
}

enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An open GGUF file: parsed metadata and tensor infos over the mapped bytes.
pub struct GgufFile {
    name: String,
    data: Backing,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// Bounds-checked little-endian reader over the header part of the file.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    name: &'a str,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: String) -> DriftError {
        DriftError::Other(format!("{}: invalid GGUF file: {msg}", self.name))
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "{what} at byte {} needs {n} bytes but the file ends after {} (truncated?)",
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of elements that take at least `min_size` bytes each, refused when the rest of the
    /// file could not hold them (this bounds every allocation by the file size).
    fn count(&self, n: u64, min_size: usize, what: &str) -> Result<usize> {
        let fits = (self.remaining() / min_size.max(1)) as u64;
        if n > fits {
            return Err(self.err(format!(
                "{what} claims {n} entries but only {} bytes remain after byte {}",
                self.remaining(),
                self.pos
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        let len = self.count(len, 1, &format!("{what} (a string)"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.err(format!("{what} at byte {at} is not valid UTF-8")))
    }

    fn value(&mut self, t: u32, depth: usize, what: &str) -> Result<GgufValue> {
        Ok(match t {
            T_U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            T_I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            T_U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            T_I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            T_U32 => GgufValue::U32(self.u32(what)?),
            T_I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            T_F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            T_BOOL => GgufValue::Bool(self.array::<1>(what)?[0] != 0),
            T_STR => GgufValue::Str(self.string(what)?),
            T_ARRAY => GgufValue::Array(self.array_value(depth, what)?),
            T_U64 => GgufValue::U64(self.u64(what)?),
            T_I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            T_F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.err(format!("{what} has unknown value type {other}"))),
        })
    }

    fn array_value(&mut self, depth: usize, what: &str) -> Result<GgufArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format!(
                "{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        let t = self.u32(what)?;
        let min = min_size(t)
            .ok_or_else(|| self.err(format!("{what} is an array of unknown type {t}")))?;
        let n = self.u64(what)?;
        let n = self.count(n, min, what)?;
        // Fixed-size elements: one bounds check for the whole run, then decode.
        macro_rules! fixed {
            ($variant:ident, $ty:ty) => {{
                const W: usize = std::mem::size_of::<$ty>();
                let raw = self.take(n * W, what)?;
                GgufArray::$variant(
                    raw.chunks_exact(W)
                        .map(|c| <$ty>::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                )
            }};
        }
        Ok(match t {
            T_U8 => GgufArray::U8(self.take(n, what)?.to_vec()),
            T_I8 => GgufArray::I8(self.take(n, what)?.iter().map(|&b| b as i8).collect()),
            T_BOOL => GgufArray::Bool(self.take(n, what)?.iter().map(|&b| b != 0).collect()),
            T_U16 => fixed!(U16, u16),
            T_I16 => fixed!(I16, i16),
            T_U32 => fixed!(U32, u32),
            T_I32 => fixed!(I32, i32),
            T_F32 => fixed!(F32, f32),
            T_U64 => fixed!(U64, u64),
            T_I64 => fixed!(I64, i64),
            T_F64 => fixed!(F64, f64),
            T_STR => GgufArray::Str((0..n).map(|_| self.string(what)).collect::<Result<_>>()?),
            _ => GgufArray::Array(
                (0..n)
                    .map(|_| self.array_value(depth + 1, what))
                    .collect::<Result<_>>()?,
            ),
        })
    }
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |e: std::io::Error| DriftError::Other(format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let data = if len == 0 {
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; a file truncated underneath us is the one hazard, as in
            // every mmap-based loader. Every offset is validated against the length we mapped.
            Backing::Map(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        GgufFile::parse(path.display().to_string(), data)
    }

    /// Parses a GGUF image held in memory (tests, downloads in progress); `name` labels errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile> {
        GgufFile::parse(name.to_string(), Backing::Owned(bytes))
    }

    fn parse(name: String, data: Backing) -> Result<GgufFile> {
        let buf = data.bytes();
        let mut c = Cursor {
            buf,
            pos: 0,
            name: &name,
        };
        let magic = c.take(4, "the magic number").map_err(|_| {
            DriftError::Other(format!(
                "{name}: not a GGUF file (only {} bytes long)",
                buf.len()
            ))
        })?;
        if magic != GGUF_MAGIC {
            return Err(DriftError::Other(format!(
                "{name}: not a GGUF file (starts with {magic:02x?}, expected \"GGUF\")"
            )));
        }
        let version = c.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(DriftError::Unsupported(format!(
                    "{name}: GGUF version 1 (2023) is not supported; re-convert the model with a \
                     current llama.cpp"
                )));
            }
            v if v & 0xffff == 0 && v != 0 => {
                return Err(DriftError::Unsupported(format!(
                    "{name}: big-endian GGUF files are not supported (version field {v:#x})"
                )));
            }
            v => {
                return Err(DriftError::Unsupported(format!(
                    "{name}: unknown GGUF version {v} (Drift reads 2 and 3)"
                )));
            }
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        // The smallest key/value is an empty key (8), a type (4) and a one-byte value.
        let n_kv = c.count(n_kv, 13, "the metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv.min(1 << 16));
        let mut meta_index = HashMap::with_capacity(n_kv.min(1 << 16));
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            let t = c.u32(&format!("the type of metadata {key}"))?;
            let value = c.value(t, 0, &format!("metadata {key}"))?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.err(format!("metadata key {key} appears twice")));
            }
            metadata.push((key, value));
        }

        // The smallest tensor info: empty name (8), n_dims (4), type (4), offset (8).
        let n_tensors = c.count(n_tensors, 24, "the tensor count")?;
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        let mut tensor_index = HashMap::with_capacity(n_tensors.min(1 << 16));
        for i in 0..n_tensors {
            let tname = c.string(&format!("the name of tensor #{i}"))?;
            let n_dims = c.u32(&format!("the rank of tensor {tname}"))? as usize;
            if n_dims > MAX_DIMS {
                return Err(c.err(format!(
                    "tensor {tname} has {n_dims} dimensions (ggml allows {MAX_DIMS})"
                )));
            }
            let mut ne = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                ne.push(c.u64(&format!("the dimensions of tensor {tname}"))?);
            }
            let ggml_type = GgmlType(c.u32(&format!("the type of tensor {tname}"))?);
            let offset = c.u64(&format!("the offset of tensor {tname}"))?;
            if tensor_index.insert(tname.clone(), raw.len()).is_some() {
                return Err(c.err(format!("tensor {tname} appears twice")));
            }
            raw.push((tname, ne, ggml_type, offset));
        }
        let header_end = c.pos as u64;

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 30 => a,
                _ => {
                    return Err(DriftError::Other(format!(
                        "{name}: invalid GGUF file: general.alignment is {v} ({}); it must be a \
                         power of two",
                        v.type_name()
                    )));
                }
            },
        };
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;

        let mut tensors = Vec::with_capacity(raw.len());
        for (tname, ne, ggml_type, offset) in raw {
            let bad = |msg: String| {
                DriftError::Other(format!("{name}: invalid GGUF file: tensor {tname} {msg}"))
            };
            let mut numel: u64 = 1;
            for &d in &ne {
                if d > i64::MAX as u64 {
                    return Err(bad(format!("has a negative dimension ({})", d as i64)));
                }
                numel = numel
                    .checked_mul(d)
                    .filter(|&n| n <= i64::MAX as u64)
                    .ok_or_else(|| bad(format!("has dimensions {ne:?} whose product overflows")))?;
            }
            if offset % alignment != 0 {
                return Err(bad(format!(
                    "starts at data offset {offset}, not a multiple of the alignment {alignment}"
                )));
            }
            let n_bytes = match ggml_type.block() {
                Some((block_elems, block_bytes)) => {
                    let row = ne.first().copied().unwrap_or(1);
                    if row % block_elems != 0 {
                        return Err(bad(format!(
                            "has rows of {row} values, not a whole number of {ggml_type} blocks \
                             of {block_elems}"
                        )));
                    }
                    Some(
                        (numel / block_elems)
                            .checked_mul(block_bytes)
                            .ok_or_else(|| {
                                bad(format!("has dimensions {ne:?} whose byte size overflows"))
                            })?,
                    )
                }
                None => None,
            };
            let start = data_offset
                .checked_add(offset)
                .filter(|&s| s <= file_len)
                .ok_or_else(|| {
                    bad(format!(
                        "starts at byte {data_offset} + {offset}, past the end of the file \
                         ({file_len} bytes; truncated download?)"
                    ))
                })?;
            if let Some(n) = n_bytes
                && n > file_len - start
            {
                return Err(bad(format!(
                    "needs {n} bytes at byte {start} but the file has {file_len} (truncated \
                     download?)"
                )));
            }
            let shape = ne
                .iter()
                .rev()
                .map(|&d| {
                    usize::try_from(d)
                        .map_err(|_| bad(format!("dimension {d} is too large for this machine")))
                })
                .collect::<Result<Vec<_>>>()?;
            tensors.push(GgufTensorInfo {
                name: tname,
                shape,
                ggml_type,
                offset,
                n_bytes,
                file_offset: start,
            });
        }

        Ok(GgufFile {
            name,
            data,
            version,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The path (or name) the file was opened from.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Length of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.data.bytes().len() as u64
    }

    /// All metadata in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Non-negative integers of any width that fit a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|x| u32::try_from(x).ok())
    }

    /// Non-negative integers of any width.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata(key)?.as_u64()
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.metadata(key)?.as_i64()
    }

    /// Floats (and integers) as f32.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get_f64(key).map(|x| x as f32)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.metadata(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.metadata(key)?.as_bool()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.metadata(key)?.as_array()
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        self.get_array(key)?.as_strs()
    }

    /// `general.architecture` (`llama`, `qwen2`...).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture").ok_or_else(|| {
            DriftError::Other(format!(
                "{}: GGUF metadata lacks general.architecture",
                self.name
            ))
        })
    }

    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }

    /// The raw bytes of a tensor (ggml layout: blocks along rows for quantized types), borrowed
    /// from the map.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor(name).ok_or_else(|| {
            DriftError::Other(format!(
                "{}: the GGUF file has no tensor named {name}",
                self.name
            ))
        })?;
        self.info_bytes(info)
    }

    /// The raw bytes of a tensor from its info.
    pub fn info_bytes(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        let n = info.n_bytes.ok_or_else(|| {
            DriftError::Unsupported(format!(
                "{}: tensor {} has {}, whose size this version of Drift does not know",
                self.name, info.name, info.ggml_type
            ))
        })?;
        // Checked against the file length at parse time; `get` also refuses an info from another
        // file.
        usize::try_from(info.file_offset)
            .ok()
            .and_then(|start| {
                self.data
                    .bytes()
                    .get(start..start.checked_add(usize::try_from(n).ok()?)?)
            })
            .ok_or_else(|| {
                DriftError::Other(format!(
                    "{}: tensor {} lies outside this file",
                    self.name, info.name
                ))
            })
    }

    /// A tensor's engine dtype, row-major shape and bytes.
    pub fn tensor_data(&self, name: &str) -> Result<(DType, &[usize], &[u8])> {
        let info = self.tensor(name).ok_or_else(|| {
            DriftError::Other(format!(
                "{}: the GGUF file has no tensor named {name}",
                self.name
            ))
        })?;
        Ok((info.dtype()?, &info.shape, self.info_bytes(info)?))
    }

    /// A plain (F32, F16, BF16) tensor's values as f32, with its row-major shape: norms, biases,
    /// rope factors. Block-quantized tensors are refused.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (dtype, shape, bytes) = self.tensor_data(name)?;
        if dtype.is_quantized() {
            return Err(DriftError::Unsupported(format!(
                "{}: tensor {name} is {dtype:?}; tensor_f32 decodes F32, F16 and BF16 only",
                self.name
            )));
        }
        Ok((shape.to_vec(), crate::gpu::decode_f32(bytes, dtype)?))
    }

    /// Which rotary pairing the q/k weights expect: llama.cpp's converter permutes the rows of
    /// `attn_q`/`attn_k` of `llama` models so rope rotates adjacent pairs; `qwen2` keeps Hugging
    /// Face's half-split layout.
    pub fn rope_pairs(&self) -> Result<RopePairs> {
        Ok(match self.architecture()? {
            "qwen2" => RopePairs::HalfSplit,
            _ => RopePairs::Interleaved,
        })
    }

    /// Per-pair rope frequency divisors from the `rope_freqs.weight` tensor that llama.cpp's
    /// converter writes for Llama 3.1/3.2 (llama3 rope scaling is stored this way, not as
    /// metadata), if present.
    pub fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>> {
        if !self.has_tensor("rope_freqs.weight") {
            return Ok(None);
        }
        Ok(Some(self.tensor_f32("rope_freqs.weight")?.1))
    }

    /// Every token id that ends generation: `eos_token_id`, plus `eot_token_id` and `eom_token_id`.
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut eos = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = self.get_u32(key)
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        eos
    }

    /// The LLM hyper-parameters of a `llama` (Llama, SmolLM2, Mistral) or `qwen2` (Qwen2, Qwen2.5)
    /// file.
    ///
    /// Llama 3.1/3.2 rope scaling is not in the metadata: see [`GgufFile::rope_freq_factors`].
    pub fn llm_config(&self) -> Result<LlmConfig> {
        let arch_name = self.architecture()?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(DriftError::Unsupported(format!(
                    "{}: GGUF architecture {other:?} (Drift runs llama and qwen2)",
                    self.name
                )));
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let bad = |msg: String| DriftError::Other(format!("{}: {msg}", self.name));
        let int = |k: &str| -> Result<Option<usize>> {
            let k = key(k);
            match self.metadata(&k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|x| usize::try_from(x).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        bad(format!(
                            "GGUF metadata {k} is {v} ({}), expected a count",
                            v.type_name()
                        ))
                    }),
            }
        };
        let need = |k: &str| -> Result<usize> {
            int(k)?.ok_or_else(|| bad(format!("GGUF metadata lacks {}", key(k))))
        };
        let float = |k: &str| -> Result<Option<f64>> {
            let k = key(k);
            match self.metadata(&k) {
                None => Ok(None),
                Some(GgufValue::F32(x)) => Ok(Some(f32_decimal(*x))),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    bad(format!(
                        "GGUF metadata {k} is {v} ({}), expected a number",
                        v.type_name()
                    ))
                }),
            }
        };

        let hidden = need("embedding_length")?;
        let n_heads = need("attention.head_count")?;
        // Some converters write head_count_kv per layer; Drift needs it uniform.
        let kv_key = key("attention.head_count_kv");
        let n_kv_heads = match self.metadata(&kv_key) {
            Some(GgufValue::Array(a)) => {
                let v = a.to_i64_vec().unwrap_or_default();
                match v.first() {
                    Some(&first) if first > 0 && v.iter().all(|&x| x == first) => first as usize,
                    _ => {
                        return Err(DriftError::Unsupported(format!(
                            "{}: {kv_key} differs between layers",
                            self.name
                        )));
                    }
                }
            }
            _ => int("attention.head_count_kv")?.unwrap_or(n_heads),
        };
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "{n_heads} attention heads cannot share {n_kv_heads} key/value heads"
            )));
        }
        let head_dim = int("attention.key_length")?.unwrap_or(hidden / n_heads);
        if let Some(v) = int("attention.value_length")?
            && v != head_dim
        {
            return Err(DriftError::Unsupported(format!(
                "{}: key length {head_dim} differs from value length {v}",
                self.name
            )));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(format!(
                "head_dim {head_dim} must be even and non-zero"
            )));
        }
        if let Some(rot) = int("rope.dimension_count")?
            && rot != head_dim
        {
            return Err(DriftError::Unsupported(format!(
                "{}: rope rotates {rot} of {head_dim} head dimensions (partial rotary)",
                self.name
            )));
        }
        match self.get_str(&key("rope.scaling.type")) {
            None | Some("none") => {}
            Some("linear") if float("rope.scaling.factor")?.unwrap_or(1.0) == 1.0 => {}
            Some(other) => {
                return Err(DriftError::Unsupported(format!(
                    "{}: rope scaling type {other:?}",
                    self.name
                )));
            }
        }
        let rms_eps = float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
            bad(format!(
                "GGUF metadata lacks {}",
                key("attention.layer_norm_rms_epsilon")
            ))
        })?;

        let vocab = match self.get_array("tokenizer.ggml.tokens") {
            Some(a) => a.len(),
            None => match int("vocab_size")? {
                Some(v) => v,
                None => self
                    .tensor("token_embd.weight")
                    .and_then(|t| t.shape.first().copied())
                    .ok_or_else(|| {
                        bad("GGUF file has neither a token list nor token_embd.weight".into())
                    })?,
            },
        };
        if let Some(t) = self.tensor("token_embd.weight")
            && t.shape.len() == 2
            && t.shape != [vocab, hidden]
        {
            return Err(bad(format!(
                "token_embd.weight is {:?} but the vocabulary has {vocab} tokens of width {hidden}",
                t.shape
            )));
        }

        Ok(LlmConfig {
            arch,
            hidden,
            intermediate: need("feed_forward_length")?,
            n_layers: need("block_count")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            rms_eps,
            rope_theta: float("rope.freq_base")?.unwrap_or(10000.0),
            rope_scaling: None,
            max_positions: int("context_length")?.unwrap_or(2048),
            tie_embeddings: !self.has_tensor("output.weight"),
            qkv_bias: self.has_tensor("blk.0.attn_q.bias"),
            bos: self.get_u32("tokenizer.ggml.bos_token_id"),
            eos: self.eos_ids(),
            sliding_window: None,
        })
    }
}

/// The GGUF name of a Hugging Face llama/qwen2 tensor name
/// (`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`), or None for names
/// llama.cpp's converter does not produce.
pub fn gguf_tensor_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    matches!(suffix, "weight" | "bias").then(|| format!("blk.{layer}.{short}.{suffix}"))
}

/// An f32 hyper-parameter as the decimal it was written from (1e-5 stored as f32 reads back as
/// 9.99999974e-6; its shortest round-trip decimal is 1e-5 again).
fn f32_decimal(x: f32) -> f64 {
    format!("{x}").parse().unwrap_or(x as f64)
}
