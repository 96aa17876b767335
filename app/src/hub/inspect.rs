//! What a model on disk is: kind, format, quantization, size, and the shape the memory estimate needs.
//! GGUF files are read through the engine's parser; safetensors files only by their JSON header
//! (the weights are never read).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use drift_engine::formats::gguf::GgufFile;
use serde_json::Value;

use super::kind::{LlmShape, ModelFormat, ModelKind};

/// One model as found on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct Inspected {
    pub kind: ModelKind,
    pub format: ModelFormat,
    /// `Q4_K_M`, `BF16`, `F16`... (`unknown` when nothing says).
    pub quantization: String,
    /// Everything on disk (a folder: every file in it).
    pub size_bytes: u64,
    /// Bytes of weights the engine would load (the memory estimate's first term).
    pub weights_bytes: u64,
    pub shape: Option<LlmShape>,
}

/// Inspects a `.gguf` file, a transformers folder or a diffusers folder.
pub fn inspect(path: &Path) -> Result<Inspected> {
    if path.is_file() {
        if has_ext(path, "gguf") {
            return inspect_gguf(path);
        }
        if has_ext(path, "safetensors") {
            return inspect_checkpoint(path);
        }
        bail!(
            "{} is not a GGUF file or a .safetensors checkpoint (Drift loads those and model folders)",
            path.display()
        );
    }
    if !path.is_dir() {
        bail!("{} does not exist", path.display());
    }
    if path.join("model_index.json").is_file() {
        return inspect_diffusers(path);
    }
    if path.join("config.json").is_file() {
        return inspect_transformers(path);
    }
    bail!(
        "{} is not a model folder (no config.json or model_index.json)",
        path.display()
    )
}

fn has_ext(path: &Path, ext: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// llama.cpp's `general.file_type` (enum `llama_ftype`) names.
fn ftype_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        _ => return None,
    })
}

/// The name with the most bytes (ties: the first in name order, so the answer is stable).
fn dominant(bytes_by_name: &HashMap<String, u64>) -> Option<String> {
    let mut v: Vec<_> = bytes_by_name.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.first().map(|(n, _)| (*n).clone())
}

fn inspect_gguf(path: &Path) -> Result<Inspected> {
    let g = GgufFile::open(path).map_err(|e| anyhow!("{e}"))?;
    let mut by_type: HashMap<String, u64> = HashMap::new();
    let mut params = 0u64;
    let mut weights = 0u64;
    for t in g.tensors() {
        let n = t.n_bytes.unwrap_or(0);
        *by_type.entry(t.ggml_type.to_string()).or_default() += n;
        params += t.numel() as u64;
        weights += n;
    }
    let quantization = g
        .get_u64("general.file_type")
        .and_then(ftype_name)
        .map(str::to_string)
        .or_else(|| dominant(&by_type))
        .unwrap_or_else(|| "unknown".into());
    let shape = g.architecture().ok().and_then(|arch| {
        let int = |k: &str| {
            let v = g.metadata(&format!("{arch}.{k}"))?;
            v.as_u64().or_else(|| {
                // Per-layer arrays (some architectures): the largest value bounds the memory.
                v.as_array()?
                    .to_i64_vec()?
                    .into_iter()
                    .max()
                    .map(|x| x.max(0) as u64)
            })
        };
        let layers = int("block_count")?;
        let heads = int("attention.head_count")?;
        let hidden = int("embedding_length")?;
        let vocab = int("vocab_size")
            .or_else(|| g.get_array("tokenizer.ggml.tokens").map(|a| a.len() as u64))?;
        Some(LlmShape {
            params,
            layers,
            heads,
            kv_heads: int("attention.head_count_kv").unwrap_or(heads),
            head_dim: int("attention.key_length").unwrap_or(hidden / heads.max(1)),
            hidden,
            intermediate: int("feed_forward_length").unwrap_or(0),
            vocab,
            max_context: int("context_length").unwrap_or(0),
        })
    });
    Ok(Inspected {
        kind: ModelKind::Llm,
        format: ModelFormat::Gguf,
        quantization,
        size_bytes: g.file_len(),
        weights_bytes: weights,
        shape,
    })
}

/// Per-dtype byte counts and the element count of one safetensors file, from its header alone.
#[derive(Default)]
struct HeaderStats {
    bytes_by_dtype: HashMap<String, u64>,
    params: u64,
    bytes: u64,
    /// Some tensor has an LDM UNet name (`model.diffusion_model.*`): a single-file SD checkpoint.
    ldm_unet: bool,
}

impl HeaderStats {
    fn add(&mut self, other: HeaderStats) {
        for (k, v) in other.bytes_by_dtype {
            *self.bytes_by_dtype.entry(k).or_default() += v;
        }
        self.params += other.params;
        self.bytes += other.bytes;
        self.ldm_unet |= other.ldm_unet;
    }
}

/// Reads the JSON header of a safetensors file (8-byte little-endian length, then JSON).
fn safetensors_header(path: &Path) -> Result<HeaderStats> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let file_len = f.metadata()?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .with_context(|| format!("{}: too short for a safetensors file", path.display()))?;
    let n = u64::from_le_bytes(len);
    // Headers are kilobytes to a few megabytes; anything past the file or 100 MB is corrupt.
    if n > file_len.saturating_sub(8) || n > 100 << 20 {
        bail!("{}: bad safetensors header length {n}", path.display());
    }
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json)?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&json)
        .with_context(|| format!("{}: safetensors header is not JSON", path.display()))?;
    let mut stats = HeaderStats::default();
    for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let bad = || anyhow!("{}: tensor {name} has a malformed entry", path.display());
        let dtype = t["dtype"].as_str().ok_or_else(bad)?;
        let offs = t["data_offsets"].as_array().ok_or_else(bad)?;
        let (a, b) = match offs.as_slice() {
            [a, b] => (a.as_u64().ok_or_else(bad)?, b.as_u64().ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        let numel = t["shape"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|d| d.as_u64().ok_or_else(bad))
            .product::<Result<u64>>()?;
        let bytes = b.checked_sub(a).ok_or_else(bad)?;
        *stats.bytes_by_dtype.entry(dtype.to_string()).or_default() += bytes;
        stats.ldm_unet |= name.starts_with("model.diffusion_model.");
        stats.params += numel;
        stats.bytes += bytes;
    }
    Ok(stats)
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| has_ext(p, "safetensors") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

fn inspect_transformers(dir: &Path) -> Result<Inspected> {
    let files = safetensors_files(dir)?;
    if files.is_empty() {
        bail!(
            "{}: no .safetensors weights (an unfinished download, or pickle-only weights)",
            dir.display()
        );
    }
    let mut stats = HeaderStats::default();
    for f in &files {
        stats.add(safetensors_header(f)?);
    }
    let cfg_path = dir.join("config.json");
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("reading {}", cfg_path.display()))?,
    )
    .with_context(|| format!("{}: not JSON", cfg_path.display()))?;
    // Multimodal configs nest the language model's settings.
    let text_cfg = cfg.get("text_config").unwrap_or(&cfg);
    let int = |k: &str| text_cfg.get(k).and_then(Value::as_u64);
    let shape = (|| {
        let heads = int("num_attention_heads")?;
        let hidden = int("hidden_size")?;
        Some(LlmShape {
            params: stats.params,
            layers: int("num_hidden_layers")?,
            heads,
            kv_heads: int("num_key_value_heads").unwrap_or(heads),
            head_dim: int("head_dim").unwrap_or(hidden / heads.max(1)),
            hidden,
            intermediate: int("intermediate_size").unwrap_or(0),
            vocab: int("vocab_size")?,
            max_context: int("max_position_embeddings").unwrap_or(0),
        })
    })();
    Ok(Inspected {
        kind: ModelKind::Llm,
        format: ModelFormat::Safetensors,
        quantization: dominant(&stats.bytes_by_dtype).unwrap_or_else(|| "unknown".into()),
        size_bytes: dir_size(dir),
        weights_bytes: stats.bytes,
        shape,
    })
}

fn inspect_diffusers(dir: &Path) -> Result<Inspected> {
    let mut stats = HeaderStats::default();
    // The weights the engine loads: per component, the fp16 variant when there is one.
    for component in ["text_encoder", "unet", "vae"] {
        let d = dir.join(component);
        if !d.is_dir() {
            bail!(
                "{}: the diffusers folder has no {component}/",
                dir.display()
            );
        }
        let files = safetensors_files(&d)?;
        let fp16: Vec<_> = files
            .iter()
            .filter(|p| p.to_string_lossy().ends_with(".fp16.safetensors"))
            .cloned()
            .collect();
        let chosen = if fp16.is_empty() { files } else { fp16 };
        if chosen.is_empty() {
            bail!("{}: no .safetensors weights", d.display());
        }
        for f in &chosen {
            stats.add(safetensors_header(f)?);
        }
    }
    Ok(Inspected {
        kind: ModelKind::Diffusion,
        format: ModelFormat::Diffusers,
        quantization: dominant(&stats.bytes_by_dtype).unwrap_or_else(|| "unknown".into()),
        size_bytes: dir_size(dir),
        weights_bytes: stats.bytes,
        shape: None,
    })
}

/// A single-file Stable Diffusion checkpoint (LDM key names); the engine decides at load whether it
/// is an SD 1.x one it can run.
fn inspect_checkpoint(path: &Path) -> Result<Inspected> {
    let stats = safetensors_header(path)?;
    if !stats.ldm_unet {
        bail!(
            "{}: not a Stable Diffusion checkpoint (no model.diffusion_model.* tensors); a language \
             model's .safetensors belong in a folder with its config.json and tokenizer",
            path.display()
        );
    }
    Ok(Inspected {
        kind: ModelKind::Diffusion,
        format: ModelFormat::Checkpoint,
        quantization: dominant(&stats.bytes_by_dtype).unwrap_or_else(|| "unknown".into()),
        size_bytes: std::fs::metadata(path)?.len(),
        weights_bytes: stats.bytes,
        shape: None,
    })
}

/// Bytes of every file under `dir`, following symlinks (the Hugging Face cache links snapshot
/// files to blobs); partial downloads included, since they take disk space too.
pub fn dir_size(dir: &Path) -> u64 {
    fn walk(dir: &Path, depth: u32) -> u64 {
        if depth > 8 {
            return 0;
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        rd.flatten()
            .map(|e| {
                let p = e.path();
                match std::fs::metadata(&p) {
                    Ok(m) if m.is_dir() => walk(&p, depth + 1),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                }
            })
            .sum()
    }
    walk(dir, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures")
    }

    /// A safetensors file written here byte by byte, so the header reader is checked against an
    /// independent encoding.
    fn write_safetensors(path: &Path, tensors: &[(&str, &str, &[u64], usize)]) {
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        for (name, dtype, shape, bytes) in tensors {
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let json = serde_json::to_vec(&header).unwrap();
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.resize(out.len() + offset, 0);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn transformers_folder_reports_dtype_params_and_shape() {
        let dir = fixtures().join("llm/qwen2-bias");
        let got = inspect(&dir).unwrap();
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(
            (got.kind, got.format),
            (ModelKind::Llm, ModelFormat::Safetensors)
        );
        let s = got.shape.unwrap();
        assert_eq!(s.layers, cfg["num_hidden_layers"].as_u64().unwrap());
        assert_eq!(s.hidden, cfg["hidden_size"].as_u64().unwrap());
        assert_eq!(s.vocab, cfg["vocab_size"].as_u64().unwrap());
        assert!(got.weights_bytes > 0 && got.weights_bytes < got.size_bytes);
        assert!(
            ["F32", "F16", "BF16"].contains(&got.quantization.as_str()),
            "{}",
            got.quantization
        );
        assert_eq!(got.size_bytes, dir_size(&dir));
    }

    #[test]
    fn single_file_checkpoints_are_diffusion_models_and_other_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("drift-inspect-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ckpt = dir.join("dreamy.safetensors");
        write_safetensors(
            &ckpt,
            &[
                (
                    "model.diffusion_model.input_blocks.0.0.weight",
                    "F16",
                    &[4, 4],
                    32,
                ),
                ("first_stage_model.decoder.conv_in.weight", "F32", &[2], 8),
            ],
        );
        let got = inspect(&ckpt).unwrap();
        assert_eq!(
            (got.kind, got.format, got.quantization.as_str()),
            (ModelKind::Diffusion, ModelFormat::Checkpoint, "F16")
        );
        assert_eq!(
            (got.weights_bytes, got.size_bytes),
            (40, std::fs::metadata(&ckpt).unwrap().len())
        );
        let other = dir.join("model.safetensors");
        write_safetensors(
            &other,
            &[("model.layers.0.mlp.up_proj.weight", "BF16", &[2, 2], 8)],
        );
        let err = format!("{:#}", inspect(&other).unwrap_err());
        assert!(err.contains("not a Stable Diffusion checkpoint"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn safetensors_header_counts_bytes_and_elements() {
        let dir = std::env::temp_dir().join(format!("drift-inspect-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("model.safetensors");
        write_safetensors(
            &f,
            &[
                ("a", "BF16", &[4, 8], 64),
                ("b", "F32", &[3], 12),
                ("c", "BF16", &[2, 2], 8),
            ],
        );
        let s = safetensors_header(&f).unwrap();
        assert_eq!((s.params, s.bytes), (32 + 3 + 4, 84));
        assert_eq!(dominant(&s.bytes_by_dtype).as_deref(), Some("BF16"));
        // A config without the LLM keys still lists, without a shape.
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let got = inspect(&dir).unwrap();
        assert_eq!((got.quantization.as_str(), got.shape), ("BF16", None));
        // Corrupt header: a clear error, no panic.
        std::fs::write(&f, [0xff; 16]).unwrap();
        let err = format!("{:#}", inspect(&dir).unwrap_err());
        assert!(err.contains("header length"), "{err}");
        std::fs::remove_file(&f).unwrap();
        let err = format!("{:#}", inspect(&dir).unwrap_err());
        assert!(err.contains("no .safetensors"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn gguf_file_type_and_shape_come_from_the_header() {
        let all = fixtures().join("gguf/all_types.gguf");
        let got = inspect(&all).unwrap();
        assert_eq!(got.format, ModelFormat::Gguf);
        assert_eq!(got.size_bytes, std::fs::metadata(&all).unwrap().len());
        // SmolLM2 135M Q4_1, when present: llama.cpp file_type 3, 134,515,008 parameters (counted
        // independently with the gguf Python package), 30 layers, 9 heads, 3 KV heads.
        if let Some(p) = std::env::var_os("DRIFT_SMOLLM2_GGUF") {
            let got = inspect(Path::new(&p)).unwrap();
            assert_eq!(got.quantization, "Q4_1");
            let s = got.shape.unwrap();
            assert_eq!(
                (s.params, s.layers, s.heads, s.kv_heads, s.head_dim),
                (134_515_008, 30, 9, 3, 64)
            );
            assert_eq!((s.hidden, s.vocab), (576, 49152));
            assert!(got.weights_bytes > 90_000_000 && got.weights_bytes < got.size_bytes);
        }
        assert_eq!(ftype_name(15), Some("Q4_K_M"));
        assert_eq!(ftype_name(32), Some("BF16"));
        assert_eq!(ftype_name(4), None);
    }

    #[test]
    fn diffusers_folder_prefers_fp16_weights() {
        let dir = std::env::temp_dir().join(format!("drift-inspect-sd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for c in ["text_encoder", "unet", "vae"] {
            std::fs::create_dir_all(dir.join(c)).unwrap();
            write_safetensors(
                &dir.join(c).join("model.fp16.safetensors"),
                &[("w", "F16", &[10], 20)],
            );
            write_safetensors(
                &dir.join(c).join("model.safetensors"),
                &[("w", "F32", &[10], 40)],
            );
        }
        std::fs::write(dir.join("model_index.json"), "{}").unwrap();
        let got = inspect(&dir).unwrap();
        assert_eq!(
            (got.kind, got.format),
            (ModelKind::Diffusion, ModelFormat::Diffusers)
        );
        assert_eq!((got.quantization.as_str(), got.weights_bytes), ("F16", 60));
        std::fs::remove_dir_all(dir.join("vae")).unwrap();
        assert!(format!("{:#}", inspect(&dir).unwrap_err()).contains("no vae/"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_paths_are_refused_clearly() {
        let err = format!("{:#}", inspect(Path::new("/nonexistent/x")).unwrap_err());
        assert!(err.contains("does not exist"), "{err}");
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert!(format!("{:#}", inspect(&readme).unwrap_err()).contains("not a GGUF"));
        assert!(format!("{:#}", inspect(&fixtures()).unwrap_err()).contains("not a model folder"));
    }
}
