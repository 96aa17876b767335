//! "Will it fit?": the GPU memory a model needs (weights + KV cache at a context length +
//! activations) against the device's memory, as fits / tight / won't fit.
//!
//! The terms follow what the engine allocates: weights as stored (GGUF blocks are uploaded as they
//! are), an f16 K and V cache of `layers x context x kv_heads x head_dim` each, and the prefill
//! activations of `Activations::new` in `engine/src/models/llama.rs` for a prompt of up to
//! [`PREFILL_TOKENS`] tokens plus the f16 dequantisation scratch and the logits. It is an estimate:
//! drivers and the window take some memory too, which is why "tight" starts below 100 %.

use std::process::Command;

use super::kind::LlmShape;

/// Prompt length the activation term assumes (longer prompts need proportionally more).
pub const PREFILL_TOKENS: u64 = 1024;
/// Context length the library and catalog show estimates for.
pub const DEFAULT_CONTEXT: u64 = 4096;
/// Up to this share of device memory the model "fits"; above it and up to 100 % it is "tight".
const COMFORTABLE_SHARE: f64 = 0.85;

/// Bytes needed, by term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    pub weights: u64,
    pub kv_cache: u64,
    pub activations: u64,
}

impl MemoryNeed {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations
    }
}

/// An LLM of `shape` whose weights take `weights_bytes`, at `context` tokens.
pub fn llm_need(weights_bytes: u64, shape: &LlmShape, context: u64) -> MemoryNeed {
    let context = if shape.max_context > 0 {
        context.min(shape.max_context)
    } else {
        context
    };
    // K and V, f16.
    let kv_cache = 2 * shape.layers * context * shape.kv_heads * shape.head_dim * 2;
    let t = PREFILL_TOKENS.min(context.max(1));
    let (h, i, hq, hkv, d) = (
        shape.hidden,
        shape.intermediate,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
    );
    // Per token: x, o, down f32 (12h); xn f16 (2h); qkv f32; q, attn f16; gate_up and act f16.
    let per_token = 14 * h + 4 * (hq + 2 * hkv) * d + 4 * hq * d + 6 * i;
    // The largest stacked linear (gate_up: 2i x h) dequantised to f16 for the prefill matmul.
    let scratch = 2 * (2 * i * h).max(hq * d * h);
    let logits = 4 * shape.vocab;
    MemoryNeed {
        weights: weights_bytes,
        kv_cache,
        activations: t * per_token + scratch + logits,
    }
}

/// A Stable Diffusion pipeline whose weights take `weights_bytes`, making `width` x `height` images.
/// Activations: the VAE decoder's full-resolution 128-channel f16 maps (a few live at once) plus the
/// UNet's and text encoder's intermediates, taken as a tenth of the weights.
pub fn diffusion_need(weights_bytes: u64, width: u64, height: u64) -> MemoryNeed {
    MemoryNeed {
        weights: weights_bytes,
        kv_cache: 0,
        activations: 4 * width * height * 128 * 2 + weights_bytes / 10,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Fits,
    Tight,
    TooBig,
    /// The device's memory is not known.
    Unknown,
}

impl Fit {
    pub fn label(self) -> &'static str {
        match self {
            Fit::Fits => "fits",
            Fit::Tight => "tight",
            Fit::TooBig => "won't fit",
            Fit::Unknown => "unknown",
        }
    }
}

pub fn fit(need: u64, device_bytes: Option<u64>) -> Fit {
    match device_bytes {
        None | Some(0) => Fit::Unknown,
        Some(d) if need as f64 <= d as f64 * COMFORTABLE_SHARE => Fit::Fits,
        Some(d) if need <= d => Fit::Tight,
        Some(_) => Fit::TooBig,
    }
}

/// The device's memory and where the figure came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub bytes: Option<u64>,
    pub source: String,
}

impl DeviceMemory {
    /// wgpu does not report total VRAM: NVIDIA GPUs are asked through `nvidia-smi`; a CPU adapter
    /// (lavapipe, llvmpipe) allocates from system RAM, so that is its memory. Otherwise unknown.
    /// `device_type` is wgpu's `DeviceType` as `{:?}` prints it (`"Cpu"`, `"DiscreteGpu"`...).
    pub fn detect(device_type: Option<&str>) -> DeviceMemory {
        if let Some(bytes) = nvidia_smi_total() {
            return DeviceMemory {
                bytes: Some(bytes),
                source: "nvidia-smi".into(),
            };
        }
        if device_type == Some("Cpu")
            && let Some(bytes) = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| parse_meminfo_total(&t))
        {
            return DeviceMemory {
                bytes: Some(bytes),
                source: "system RAM (CPU device)".into(),
            };
        }
        DeviceMemory {
            bytes: None,
            source: "no nvidia-smi".into(),
        }
    }
}

fn nvidia_smi_total() -> Option<u64> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout))
}

/// `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits` prints MiB, one GPU a line;
/// Drift uses the first GPU.
pub fn parse_nvidia_smi(text: &str) -> Option<u64> {
    let mib: u64 = text.lines().next()?.trim().parse().ok()?;
    (mib > 0).then_some(mib * 1024 * 1024)
}

/// `MemTotal:  16318480 kB` -> bytes.
fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN_05B: LlmShape = LlmShape {
        params: 494_032_768,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        hidden: 896,
        intermediate: 4864,
        vocab: 151_936,
        max_context: 32768,
    };

    #[test]
    fn kv_cache_matches_the_hand_computed_figure() {
        // Qwen2.5 0.5B at 4096 tokens: 2 (K, V) x 24 layers x 4096 x 2 heads x 64 x 2 bytes = 48 MiB.
        let n = llm_need(491_400_032, &QWEN_05B, 4096);
        assert_eq!(n.kv_cache, 48 * 1024 * 1024);
        assert_eq!(n.weights, 491_400_032);
        // Activations: 1024 prompt tokens x per-token bytes + scratch + logits, by hand.
        let per_token = 14 * 896 + 4 * (14 + 4) * 64 + 4 * 14 * 64 + 6 * 4864;
        let expected = 1024 * per_token + 2 * 2 * 4864 * 896 + 4 * 151_936;
        assert_eq!(n.activations, expected);
        // The context is capped at what the model supports.
        assert_eq!(
            llm_need(0, &QWEN_05B, 1 << 30).kv_cache,
            48 * 1024 * 1024 * 8
        );
    }

    #[test]
    fn verdicts_follow_the_thresholds() {
        let gib = 1u64 << 30;
        assert_eq!(fit(4 * gib, Some(8 * gib)), Fit::Fits);
        assert_eq!(fit(7 * gib, Some(8 * gib)), Fit::Tight);
        assert_eq!(fit(8 * gib, Some(8 * gib)), Fit::Tight);
        assert_eq!(fit(9 * gib, Some(8 * gib)), Fit::TooBig);
        assert_eq!(fit(1, None), Fit::Unknown);
        assert_eq!(Fit::TooBig.label(), "won't fit");
    }

    #[test]
    fn device_memory_parsers() {
        assert_eq!(
            parse_nvidia_smi("143771\n143771\n"),
            Some(143_771 * 1024 * 1024)
        );
        assert_eq!(parse_nvidia_smi("[N/A]\n"), None);
        assert_eq!(parse_nvidia_smi(""), None);
        assert_eq!(
            parse_meminfo_total("MemTotal:       16318480 kB\nMemFree: 1 kB\n"),
            Some(16_318_480 * 1024)
        );
        // Whatever this machine has, detection answers without panicking, and a CPU device on
        // Linux reports system RAM when there is no nvidia-smi.
        let d = DeviceMemory::detect(Some("Cpu"));
        if cfg!(target_os = "linux") {
            assert!(d.bytes.is_some(), "{d:?}");
        }
    }

    #[test]
    fn diffusion_need_grows_with_resolution() {
        let a = diffusion_need(2_132_605_510, 512, 512);
        let b = diffusion_need(2_132_605_510, 1024, 1024);
        assert_eq!(a.activations, 4 * 512 * 512 * 256 + 213_260_551);
        assert!(b.total() > a.total());
    }
}
