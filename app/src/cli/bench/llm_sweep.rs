//! `drift bench llm ... --sweep "VAR=V VAR2=W;VAR=X"`: the decode step's floor under each set of
//! environment variables, in one process. The kernels read their measurement and tuning switches
//! (`DRIFT_DP4A_*`, `DRIFT_ATTENTION_*`) when the decode programs are built, so each set rebuilds
//! them over the weights already loaded: on the H200 a sweep point costs a few seconds where a new
//! process costs ~45 s of an 8B model's random weights.

use std::ffi::OsString;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use drift_engine::Gpu;
use drift_engine::generate::{GenerateOptions, LlmSession};
use drift_engine::sampling::SamplingParams;
use serde::Serialize;

use super::llm::{decode_floors, floor_step};

#[derive(Serialize)]
pub struct SweepPoint {
    /// The variables as given (`VAR=V ...`).
    pub config: String,
    /// GPU wall time per step, 32 steps in one command buffer (the bench's first floor).
    pub floor_ms_per_token: f64,
    /// One greedy generation of the bench's length after the rebuild.
    pub decode_tokens_per_s: f64,
    pub first_tokens: Vec<u32>,
}

/// The `VAR=VALUE` pairs of one sweep point (separated by spaces; values may hold `,` and `=`).
fn parse_point(point: &str) -> Result<Vec<(String, String)>> {
    point
        .split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--sweep: {kv:?} is not VAR=VALUE"),
        })
        .collect()
}

/// Sets `vars`, returning what they were.
fn set_vars(vars: &[(String, String)]) -> Vec<(String, Option<OsString>)> {
    vars.iter()
        .map(|(k, v)| {
            let old = std::env::var_os(k);
            // SAFETY: the benchmark's only other threads are wgpu's and the driver's, which do not
            // read these variables; Drift reads them on this thread while building programs.
            unsafe { std::env::set_var(k, v) };
            (k.clone(), old)
        })
        .collect()
}

fn restore_vars(saved: Vec<(String, Option<OsString>)>) {
    for (k, old) in saved.into_iter().rev() {
        // SAFETY: as in `set_vars`.
        unsafe {
            match old {
                Some(v) => std::env::set_var(&k, v),
                None => std::env::remove_var(&k),
            }
        }
    }
}

/// Every point of `spec` (`;`-separated), then the programs rebuilt as the environment was.
pub fn sweep(
    gpu: &Gpu,
    s: &mut LlmSession,
    prompt: &[u32],
    generate: usize,
    spec: &str,
) -> Result<Vec<SweepPoint>> {
    let points: Vec<(String, Vec<(String, String)>)> = spec
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| Ok((p.to_string(), parse_point(p)?)))
        .collect::<Result<_>>()?;
    let mut out = Vec::new();
    for (config, vars) in points {
        let saved = set_vars(&vars);
        let r = measure(gpu, s, prompt, generate);
        restore_vars(saved);
        let (floor_ms, tps, first) = r?;
        eprintln!(
            "  sweep [{config}]: floor {floor_ms:.3} ms/token ({:.1} tok/s), generation {tps:.1} tok/s, first tokens {first:?}",
            1e3 / floor_ms
        );
        out.push(SweepPoint {
            config,
            floor_ms_per_token: floor_ms,
            decode_tokens_per_s: tps,
            first_tokens: first,
        });
    }
    s.model.rebuild_decode_programs(gpu)?;
    Ok(out)
}

fn measure(
    gpu: &Gpu,
    s: &mut LlmSession,
    prompt: &[u32],
    generate: usize,
) -> Result<(f64, f64, Vec<u32>)> {
    s.model.rebuild_decode_programs(gpu)?;
    let opts = GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens: generate,
        stop: vec![],
    };
    s.reset();
    let g = s.generate(gpu, prompt, &opts, &AtomicBool::new(false), &mut |_| {})?;
    let step = floor_step(gpu, &s.model, prompt.len())?;
    let (floor_us, ..) = decode_floors(gpu, &step)?;
    Ok((
        floor_us / 1e3,
        g.decode_tokens_per_s,
        g.tokens.iter().take(12).copied().collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_pairs_of_variable_and_value() {
        let p = parse_point(
            "DRIFT_DP4A_SMEM=6144x4096=50,28672x4096=75  DRIFT_DP4A_DBG=5 DRIFT_DP4A_DBG_SHAPES=6144x4096,4096x4096",
        )
        .unwrap();
        assert_eq!(
            p,
            [
                (
                    "DRIFT_DP4A_SMEM".into(),
                    "6144x4096=50,28672x4096=75".into()
                ),
                ("DRIFT_DP4A_DBG".into(), "5".into()),
                ("DRIFT_DP4A_DBG_SHAPES".into(), "6144x4096,4096x4096".into()),
            ]
        );
        assert!(parse_point("DRIFT_DP4A_SMEM").is_err());
        assert!(parse_point("=5").is_err());
    }
}
