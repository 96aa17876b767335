//! Stage probes of the cooperative flash attention (how its H200 fault was found, see
//! `kernels::attention`): one query tile against one key tile, the kernel stopped after its scores,
//! its probabilities or its P V and that stage written out (`CoopDebug::dump`), each compared with
//! the CPU. The first stage that fails is where the fault is. The emulated build runs them on any f16
//! device (how the probes themselves are tested); `DRIFT_SELFTEST_COOP_ATTENTION=stages drift
//! selftest --only attention` runs the real one and the emulated control on a device with
//! cooperative matrices (`stages_real` the real one alone; `DRIFT_COOP_STAGE_DUMP=DIR` writes the
//! inputs and outputs for offline fitting).

use half::f16;

use super::{Check, Rng, compare, random};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::attention::{AttentionOptions, AttentionVariant, attention};
use crate::kernels::attention_coop::{CoopDebug, CoopStage, coop_tile};
use crate::memory::Category;
use crate::tensor::DType;

/// Head dims the self-test probes: SD's 40 (zero-padded to 48 in the kernel) and unpadded ones.
pub const DIMS: [usize; 3] = [40, 64, 128];

/// The stage checks of `variant` (`Coop` or `CoopEmulated`) for each head dim of `dims`.
pub fn coop_stage_checks(
    gpu: &Gpu,
    rng: &mut Rng,
    variant: AttentionVariant,
    dims: &[usize],
) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for &d in dims {
        out.extend(probe(gpu, rng, variant, d)?);
    }
    Ok(out)
}

fn probe(gpu: &Gpu, rng: &mut Rng, variant: AttentionVariant, d: usize) -> Result<Vec<Check>> {
    // A tile that fits with or without subgroup exchanges: one workgroup, one key tile.
    let Some(tile) = coop_tile(&gpu.caps, d, false) else {
        return Ok(Vec::new());
    };
    let (rows, keys) = (tile.query_rows(), tile.keys);
    let h = DType::F16;
    let qv = random(rng, rows * d, -1.0, 1.0, h);
    let kv = random(rng, keys * d, -1.0, 1.0, h);
    let vv = random(rng, keys * d, -1.0, 1.0, h);
    let t = |name: &str, n: usize, v: &[f32]| {
        gpu.tensor_from_f32(name, &[1, n, 1, d], h, v, Category::Activations)
    };
    let (q, k, v) = (t("q", rows, &qv)?, t("k", keys, &kv)?, t("v", keys, &vv)?);
    let o = gpu.tensor("out", &[1, rows, 1, d], DType::F32, Category::Activations)?;
    let step = gpu.tensor("step", &[2], DType::U32, Category::Activations)?;
    gpu.write_tensor_bytes(&step, bytemuck::cast_slice(&[keys as u32, 0u32]))?;
    let scale = 1.0 / (d as f64).sqrt();

    // CPU stages: raw scores, f16 probabilities against the tile's row max, their P V.
    let s: Vec<f64> = (0..rows * keys)
        .map(|e| {
            let (i, j) = (e / keys, e % keys);
            (0..d)
                .map(|c| qv[i * d + c] as f64 * kv[j * d + c] as f64)
                .sum()
        })
        .collect();
    let p: Vec<f64> = (0..rows * keys)
        .map(|e| {
            let i = e / keys;
            let m = s[i * keys..(i + 1) * keys]
                .iter()
                .fold(f64::MIN, |a, &x| a.max(x * scale));
            f16::from_f64((s[e] * scale - m).exp()).to_f64()
        })
        .collect();
    let pv: Vec<f64> = (0..rows * d)
        .map(|e| {
            let (i, c) = (e / d, e % d);
            (0..keys)
                .map(|j| p[i * keys + j] * vv[j * d + c] as f64)
                .sum()
        })
        .collect();
    // Scores and probabilities fill the first min(keys, d) columns of each output row.
    let cols = keys.min(d);
    let first = |x: &[f64], width: usize| -> Vec<f64> {
        (0..rows * cols)
            .map(|e| x[(e / cols) * width + e % cols])
            .collect()
    };
    let mut checks = Vec::new();
    for (stage, want, atol) in [
        // f32 sums of d products of values in [-1, 1].
        (CoopStage::Scores, first(&s, keys), 1e-4 * d as f64),
        // exp of a score off by the above, rounded to f16 (2^-11 relative).
        (
            CoopStage::Probabilities,
            first(&p, keys),
            1e-3 + 1e-4 * d as f64 * scale,
        ),
        // keys of such probabilities times v in [-1, 1].
        (
            CoopStage::ProbabilitiesTimesV,
            pv.clone(),
            2e-3 * (keys as f64).sqrt(),
        ),
    ] {
        let opts = AttentionOptions {
            variant,
            coop_tile: Some(tile),
            coop_debug: Some(CoopDebug {
                dump: Some(stage),
                ..CoopDebug::from_env()
            }),
            ..AttentionOptions::default()
        };
        let started = std::time::Instant::now();
        let mut prog = Program::new();
        prog.extend(attention(gpu, &q, &k, &v, &o, &step, &opts)?);
        gpu.poison(&o)?;
        prog.run(gpu)?;
        let all = gpu.read_f32(&o)?;
        let got: Vec<f32> = if stage == CoopStage::ProbabilitiesTimesV {
            all
        } else {
            (0..rows * cols)
                .map(|e| all[(e / cols) * d + e % cols])
                .collect()
        };
        let check = compare(
            format!(
                "{} stage {stage:?} D{d} tile {rows}x{keys}",
                prog.dispatches[0].name
            ),
            &got,
            &want,
            atol,
            2e-3,
        );
        if let Ok(dir) = std::env::var("DRIFT_COOP_STAGE_DUMP") {
            // (Bisection off the device) inputs and this stage's raw output as little-endian f32.
            let tag = format!("{dir}/d{d}_{stage:?}");
            for (name, x) in [("q", &qv), ("k", &kv), ("v", &vv), ("got", &got)] {
                let bytes: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
                if let Err(e) = std::fs::write(format!("{tag}_{name}.f32"), bytes) {
                    eprintln!("DRIFT_COOP_STAGE_DUMP: {e}");
                }
            }
        }
        // Printed as they come: a probe that hangs the device still leaves the earlier results.
        eprintln!("{check} ({:.1} s)", started.elapsed().as_secs_f64());
        checks.push(check);
    }
    Ok(checks)
}
