//! Memory-mapped safetensors: one file, a sharded set with `model.safetensors.index.json`, or every
//! `*.safetensors` in a folder. Tensors are byte slices of the maps: nothing is copied until upload.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{DriftError, Result};
use crate::tensor::DType;

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// A set of safetensors files seen as one name -> tensor map.
pub struct SafetensorsSet {
    maps: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
}

/// A borrowed tensor: dtype, shape and the raw little-endian bytes.
pub struct RawTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl SafetensorsSet {
    /// Opens `path`: a `.safetensors` file, an `.index.json`, or a folder holding either.
    pub fn open(path: &Path) -> Result<SafetensorsSet> {
        let files = resolve_files(path)?;
        let mut set = SafetensorsSet {
            maps: Vec::new(),
            entries: HashMap::new(),
        };
        for f in files {
            set.add_file(&f)?;
        }
        Ok(set)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
        // SAFETY: the map is read-only; a file truncated underneath us is the one hazard, as in every
        // mmap-based loader, and the header offsets are validated against the length we mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io(path, e))?;
        let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            DriftError::Other(format!(
                "{}: not a valid safetensors file: {e}",
                path.display()
            ))
        })?;
        let data_start = 8 + header_len;
        let index = self.maps.len();
        for (name, info) in meta.tensors() {
            let (a, b) = info.data_offsets;
            let (start, end) = (data_start + a, data_start + b);
            if a > b || end > map.len() {
                return Err(DriftError::Other(format!(
                    "{}: tensor {name} lies outside the file (truncated download?)",
                    path.display()
                )));
            }
            self.entries.insert(
                name,
                Entry {
                    file: index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                },
            );
        }
        self.maps.push((path.to_path_buf(), map));
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let (key, e) = self.entries.get_key_value(name).ok_or_else(|| {
            DriftError::Other(format!("the model files have no tensor named {name}"))
        })?;
        let dtype = match e.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                return Err(DriftError::Unsupported(format!(
                    "tensor {name} has dtype {other:?}"
                )));
            }
        };
        let bytes = &self.maps[e.file].1[e.start..e.end];
        let n: usize = e.shape.iter().product();
        if bytes.len() as u64 != dtype.bytes_for(n)? {
            return Err(DriftError::Other(format!(
                "tensor {name}: {} bytes for shape {:?}",
                bytes.len(),
                e.shape
            )));
        }
        Ok(RawTensor {
            name: key,
            dtype,
            shape: &e.shape,
            bytes,
        })
    }
}

impl RawTensor<'_> {
    /// Values as f32 (for conversion and CPU-side processing).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        crate::gpu::decode_f32(self.bytes, self.dtype)
    }
}

fn resolve_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        if path.to_string_lossy().ends_with(".index.json") {
            return index_files(path);
        }
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        return Err(DriftError::Other(format!(
            "{} does not exist",
            path.display()
        )));
    }
    let index = path.join("model.safetensors.index.json");
    if index.is_file() {
        return index_files(&index);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| io(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DriftError::Other(format!(
            "no .safetensors files in {}",
            path.display()
        )));
    }
    Ok(files)
}

fn index_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| io(index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| DriftError::Other(format!("{}: invalid JSON: {e}", index.display())))?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| DriftError::Other(format!("{} has no weight_map", index.display())))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = map
        .values()
        .filter_map(|f| f.as_str())
        .map(|f| dir.join(f))
        .collect();
    files.sort();
    files.dedup();
    for f in &files {
        if !f.is_file() {
            return Err(DriftError::Other(format!(
                "shard {} named by the index is missing (incomplete download?)",
                f.display()
            )));
        }
    }
    Ok(files)
}

fn io(path: &Path, e: std::io::Error) -> DriftError {
    DriftError::Other(format!("{}: {e}", path.display()))
}
