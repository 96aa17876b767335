//! Sampling settings and the host half of sampling: the GPU returns the top candidates with their
//! penalised logits and the full-vocabulary normaliser; this file applies top-k, min-p and top-p to them
//! and draws with Drift's documented RNG (rand's StdRng, ChaCha12, seeded by the user's seed).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What the user sets. `temperature == 0` means greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 disables (the GPU still returns at most [`MAX_CANDIDATES`]).
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    pub repeat_window: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_window: 64,
            seed: 0,
        }
    }
}

/// Candidates the GPU hands back when sampling; top-p mass beyond them is dropped (it is negligible
/// for any real distribution at 64 candidates with min-p or top-p < 1).
pub const MAX_CANDIDATES: usize = 64;

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Greedy without penalty runs entirely on the GPU (argmax).
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0 && self.repeat_penalty == 1.0
    }

    /// How many candidates the GPU should return.
    pub fn candidates(&self, vocab: usize) -> usize {
        let k = if self.temperature <= 0.0 {
            1
        } else if self.top_k == 0 {
            MAX_CANDIDATES
        } else {
            self.top_k.min(MAX_CANDIDATES)
        };
        k.min(vocab).max(1)
    }
}

/// The GPU's candidate list: ids with penalised logits (largest first), the max logit and
/// `sum(exp((l - max) / T))` over the whole vocabulary.
pub struct Candidates {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub max: f32,
    pub sum: f32,
}

impl Candidates {
    /// Decodes the kernel's `[2k + 2]` u32 output.
    pub fn from_words(words: &[u32], k: usize) -> Candidates {
        Candidates {
            ids: (0..k).map(|i| words[2 * i]).collect(),
            logits: (0..k).map(|i| f32::from_bits(words[2 * i + 1])).collect(),
            max: f32::from_bits(words[2 * k]),
            sum: f32::from_bits(words[2 * k + 1]),
        }
    }
}

/// The sampler: owns the RNG so a seed reproduces a whole generation.
pub struct Sampler {
    pub params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
        }
    }

    /// Picks a token from the candidates.
    pub fn pick(&mut self, c: &Candidates) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || c.ids.len() == 1 {
            return c.ids[0];
        }
        let inv_t = 1.0 / p.temperature as f64;
        // Exact probabilities over the whole vocabulary.
        let probs: Vec<f64> = c
            .logits
            .iter()
            .map(|&l| ((l - c.max) as f64 * inv_t).exp() / c.sum.max(f32::MIN_POSITIVE) as f64)
            .collect();
        let mut keep = probs.len();
        if p.top_k > 0 {
            keep = keep.min(p.top_k);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut n = 0;
            for &q in &probs[..keep] {
                cum += q;
                n += 1;
                if cum >= p.top_p as f64 {
                    break;
                }
            }
            keep = n.max(1);
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, &q) in probs[..keep].iter().enumerate() {
            if r < q {
                return c.ids[i];
            }
            r -= q;
        }
        c.ids[keep - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let max = logits[0];
        Candidates {
            ids: (0..logits.len() as u32).collect(),
            logits: logits.to_vec(),
            max,
            sum: logits.iter().map(|&l| (l - max).exp()).sum(),
        }
    }

    #[test]
    fn greedy_takes_the_first() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.pick(&cands(&[3.0, 2.0, 1.0])), 0);
    }

    #[test]
    fn top_k_one_and_min_p_restrict_the_choice() {
        let c = cands(&[5.0, 4.9, 0.0, -1.0]);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        assert!((0..50).all(|_| s.pick(&c) == 0));
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        let picks: Vec<u32> = (0..200).map(|_| s.pick(&c)).collect();
        assert!(picks.iter().all(|&p| p < 2) && picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let c = cands(&[1.0, 0.0]);
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let mut s = Sampler::new(params.clone());
        let n = 20000;
        let zeros = (0..n).filter(|_| s.pick(&c) == 0).count() as f64 / n as f64;
        let want = 1.0f64.exp() / (1.0f64.exp() + 1.0);
        assert!((zeros - want).abs() < 0.02, "{zeros} vs {want}");
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..32).map(|_| s.pick(&c)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..32).map(|_| s.pick(&c)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn top_p_cuts_the_tail() {
        let c = cands(&[2.0, 1.0, -5.0, -6.0]);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        assert!((0..100).all(|_| s.pick(&c) == 0));
    }
}
