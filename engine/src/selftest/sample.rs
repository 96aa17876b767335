//! Checks for greedy token selection (argmax over the vocabulary, written to the next step's input id and
//! to the history at the step's position). The reference is a scan written here.

use super::{Check, Rng, u32s};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::sample::argmax;
use crate::memory::Category;
use crate::tensor::DType;
use rand::Rng as _;

/// The first index of the largest value (torch.argmax).
fn reference(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    // One workgroup's worth, ragged sizes, and sizes that use every first-pass workgroup (256 x 1024).
    for (vocab, ties) in [
        (1usize, false),
        (255, false),
        (1000, true),
        (49_152, false),
        (128_256, true),
        (300_001, false),
    ] {
        // Values from a small set so ties across workgroups are common when asked for; otherwise
        // continuous. The winner is planted at a random place (late ids too).
        let mut logits: Vec<f32> = (0..vocab)
            .map(|_| {
                if ties {
                    rng.random_range(0..8) as f32
                } else {
                    rng.random_range(-30.0..30.0)
                }
            })
            .collect();
        if !ties {
            let at = rng.random_range(0..vocab);
            logits[at] = 31.0;
        }
        let want = reference(&logits);
        let l = gpu.tensor_from_f32("logits", &[1, vocab], DType::F32, &logits, Category::Other)?;
        let ids = gpu.tensor("ids", &[3], DType::U32, Category::Other)?;
        let history = gpu.tensor("history", &[9], DType::U32, Category::Other)?;
        let pos = rng.random_range(0..9u32);
        let step = gpu.tensor_from_bytes(
            "step",
            &[2],
            DType::U32,
            crate::tensor::Layout::RowMajor,
            bytemuck::cast_slice(&[pos, 0u32]),
            Category::Other,
        )?;
        gpu.poison(&ids)?;
        gpu.poison(&history)?;
        let mut p = Program::new();
        // Every other case also advances the step state.
        let advance = ties;
        p.extend(argmax(
            gpu,
            &l,
            &ids.view(0, &[1])?,
            &history,
            &step,
            advance,
        )?);
        p.run(gpu)?;
        let got_ids = u32s(&gpu.read_bytes(&ids)?);
        let got_hist = u32s(&gpu.read_bytes(&history)?);
        let got_step = u32s(&gpu.read_bytes(&step)?);
        let want_step = if advance { [pos + 1, 1] } else { [pos, 0] };
        // The id, at both places, and nothing else written.
        let untouched = got_ids[1..].iter().all(|&v| v == u32::MAX)
            && got_hist
                .iter()
                .enumerate()
                .all(|(i, &v)| i == pos as usize || v == u32::MAX);
        let passed = got_ids[0] == want
            && got_hist[pos as usize] == want
            && untouched
            && got_step == want_step;
        out.push(Check {
            name: format!(
                "argmax vocab {vocab}{}",
                if ties {
                    " (ties, advancing the step)"
                } else {
                    ""
                }
            ),
            passed,
            worst_ratio: if passed { 0.0 } else { f64::INFINITY },
            max_abs_err: 0.0,
            atol: 0.0,
            rtol: 0.0,
            detail: if passed {
                String::new()
            } else {
                format!(
                    "want id {want}, got ids {:?}, history {:?} (position {pos})",
                    got_ids, got_hist
                )
            },
        });
    }
    Ok(out)
}
