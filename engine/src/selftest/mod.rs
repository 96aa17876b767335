//! Correctness checks for every kernel: fresh random inputs, output buffers poisoned before each run, GPU
//! results compared with the f64 CPU references under stated tolerances. The tests assert on these, and
//! `drift selftest` runs them on any device (so the NVIDIA-only variants are checked on the H200 too).

pub mod attention;
pub mod attention_stages;
pub mod attention_xq;
pub mod conv;
pub mod elementwise;
pub mod embedding;
pub mod grid_sync;
pub mod layout;
pub mod matmul;
pub mod matvec;
pub mod norm;
pub mod qkv_rope;
pub mod quant;
pub mod quant_xq;
pub mod rope;
pub mod sample;
pub mod softmax;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use serde::Serialize;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::tensor::DType;

pub type Rng = StdRng;

/// The outcome of one comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    /// Largest |got - want| / (atol + rtol |want|): <= 1 passes.
    pub worst_ratio: f64,
    pub max_abs_err: f64,
    pub atol: f64,
    pub rtol: f64,
    pub detail: String,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: max |err| {:.3e} (atol {:.1e}, rtol {:.1e}, worst {:.2} of tolerance){}",
            if self.passed { "ok  " } else { "FAIL" },
            self.name,
            self.max_abs_err,
            self.atol,
            self.rtol,
            self.worst_ratio,
            if self.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", self.detail)
            }
        )
    }
}

/// Compares `got` with `want`: every value finite and within `atol + rtol * |want|`.
pub fn compare(name: impl Into<String>, got: &[f32], want: &[f64], atol: f64, rtol: f64) -> Check {
    let name = name.into();
    let mut worst = 0.0f64;
    let mut max_abs = 0.0f64;
    let mut detail = String::new();
    if got.len() != want.len() {
        detail = format!("length {} vs {}", got.len(), want.len());
        worst = f64::INFINITY;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let ratio = if g.is_finite() {
            err / (atol + rtol * w.abs())
        } else {
            f64::INFINITY
        };
        if ratio > worst {
            worst = ratio;
            if ratio > 1.0 {
                detail = format!("index {i}: got {g}, want {w}");
            }
        }
        if err.is_finite() {
            max_abs = max_abs.max(err);
        }
    }
    Check {
        passed: worst <= 1.0,
        name,
        worst_ratio: worst,
        max_abs_err: max_abs,
        atol,
        rtol,
        detail,
    }
}

/// Little-endian u32 words of a read-back buffer.
pub(crate) fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A seeded RNG: `DRIFT_TEST_SEED` when set (to replay a failure), else fresh from the clock.
pub fn rng() -> (Rng, u64) {
    let seed = std::env::var("DRIFT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    (Rng::seed_from_u64(seed), seed)
}

/// `n` uniform values in `[lo, hi)`, rounded to what `dtype` can hold so the reference sees the exact
/// inputs the GPU sees.
pub fn random(rng: &mut Rng, n: usize, lo: f32, hi: f32, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| round_to(rng.random_range(lo..hi), dtype))
        .collect()
}

/// `v` rounded to `dtype` (f16 and bf16 lose precision; f32 unchanged).
pub fn round_to(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The float dtypes this device runs kernels in: f32 always, f16 where the device has it.
pub fn float_dtypes(gpu: &Gpu) -> Vec<DType> {
    if gpu.caps.f16 {
        vec![DType::F32, DType::F16]
    } else {
        vec![DType::F32]
    }
}

/// Output tolerance of a kernel that accumulates in f32 and stores `dtype` (relative, per value).
pub fn store_rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-3,
        _ => 1e-5,
    }
}

/// How far (relative) a value a kernel rounds to `dtype` and also uses in f32 may be from its
/// rounded copy: a driver may skip the round trip f32 -> f16 -> f32 of a value it stores as f16 (the
/// H200's does), so the use sees the value up to half an f16 ulp off what was stored.
pub fn round_trip_rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / 2048.0,
        _ => 0.0,
    }
}

/// Every family's checks.
pub fn run_all(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    run_families(gpu, rng, None)
}

/// The names of the check families, in the order [`run_all`] runs them.
pub const FAMILIES: [&str; 15] = [
    "elementwise",
    "matmul",
    "matvec",
    "softmax",
    "norm",
    "rope",
    "qkv_rope",
    "attention",
    "conv",
    "embedding",
    "layout",
    "quant",
    "quant_xq",
    "sample",
    "grid_sync",
];

/// The checks of one family (`only`, a name from [`FAMILIES`]) or of all.
pub fn run_families(gpu: &Gpu, rng: &mut Rng, only: Option<&str>) -> Result<Vec<Check>> {
    type Family = fn(&Gpu, &mut Rng) -> Result<Vec<Check>>;
    let families: [Family; 15] = [
        elementwise::checks,
        matmul::checks,
        matvec::checks,
        softmax::checks,
        norm::checks,
        rope::checks,
        qkv_rope::checks,
        attention::checks,
        conv::checks,
        embedding::checks,
        layout::checks,
        quant::checks,
        quant_xq::checks,
        sample::checks,
        grid_sync::checks,
    ];
    let mut all = Vec::new();
    for (name, family) in FAMILIES.iter().zip(families) {
        if only.is_none_or(|o| o == *name) {
            all.extend(family(gpu, rng)?);
        }
    }
    Ok(all)
}
