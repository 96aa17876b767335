//! Text generation on a loaded LLM: prefill, then decode steps until EOS, a stop string, the token
//! limit or a cancel. Greedy decoding stays on the GPU (the argmax writes the next input id and moves
//! the step state on) and keeps several steps in flight so CPU work (readback, detokenising,
//! streaming) overlaps the GPU; sampling reads back a short candidate list per token. Decode steps'
//! command buffers are encoded ahead on worker threads ([`crate::encode_ahead`]), so the submitting
//! thread only submits them (writing the step state for the first greedy step and every sampled one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::encode_ahead::{EncodeAhead, EncodeFn, encode_threads};
use crate::error::{DriftError, Result};
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::sample::{TopkOptions, topk};
use crate::memory::Category;
use crate::models::llama::LlamaModel;
use crate::profiler::{Profile, Profiler};
use crate::sampling::{Candidates, Sampler, SamplingParams};
use crate::tensor::{DType, Tensor};
use crate::tokenize::TextTokenizer;
use crate::tokenize::chat_template::{ChatTemplate, Message};
use crate::tokenize::stream::TextStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    MaxTokens,
    StopString,
    Cancelled,
    ContextFull,
}

#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub stop_reason: StopReason,
    /// Where the decode loop's wall time went (summed over the steps).
    pub decode_time: DecodeTime,
}

/// The decode loop's wall time by what the submitting thread did, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct DecodeTime {
    /// Waiting for an encoded command buffer (the encoders behind).
    pub encode_wait_us: f64,
    /// Writing the step state and submitting.
    pub submit_us: f64,
    /// Waiting for a step's token (the GPU behind) and reading it back.
    pub readback_us: f64,
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
}

/// A model ready to talk: weights, KV cache, tokenizer, template. Keeps its KV cache between calls so
/// a chat only prefills what is new.
pub struct LlmSession {
    pub model: LlamaModel,
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    pub eos: Vec<u32>,
    /// The token ids now in the KV cache.
    pub cached: Vec<u32>,
    /// One readback buffer per decode step in flight ([`pipeline_depth`]).
    readback: Vec<std::sync::Arc<crate::memory::GpuBuffer>>,
    /// The submission that fills each readback slot.
    inflight: std::cell::RefCell<Vec<Option<wgpu::SubmissionIndex>>>,
    cand: Tensor,
}

impl LlmSession {
    pub fn new(
        gpu: &Gpu,
        model: LlamaModel,
        tokenizer: TextTokenizer,
        template: Option<ChatTemplate>,
        eos: Vec<u32>,
    ) -> Result<LlmSession> {
        let rb = || {
            gpu.create_buffer(
                "token readback",
                8 * crate::sampling::MAX_CANDIDATES as u64 + 16,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                Category::Staging,
            )
        };
        let depth = pipeline_depth();
        Ok(LlmSession {
            cand: gpu.tensor(
                "candidates",
                &[2 * crate::sampling::MAX_CANDIDATES + 2],
                DType::U32,
                Category::Activations,
            )?,
            readback: (0..depth).map(|_| rb()).collect::<Result<_>>()?,
            inflight: std::cell::RefCell::new(vec![None; depth]),
            model,
            tokenizer,
            template,
            eos,
            cached: Vec::new(),
        })
    }

    /// The prompt text for a conversation: the model's chat template, or the last message's raw text.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        match &self.template {
            Some(t) => t.render(messages, true),
            None => Ok(messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    pub fn reset(&mut self) {
        self.cached.clear();
    }

    /// Generates a continuation of `prompt` (token ids of the whole conversation so far). The longest
    /// prefix already in the KV cache is reused; only the rest is prefilled.
    pub fn generate(
        &mut self,
        gpu: &Gpu,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(DriftError::Other("the prompt is empty".into()));
        }
        let m = &self.model;
        m.check_length(prompt.len() + 1)?;
        // Reuse the cached prefix (keep at least one token to prefill so there are logits).
        let mut keep = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        keep = keep.min(prompt.len() - 1);
        let new = &prompt[keep..];
        let t0 = Instant::now();
        gpu.write_tensor_bytes(&m.ids, bytemuck::cast_slice(new))?;
        let hist = m.history.view(0, &[prompt.len()])?;
        gpu.write_tensor_bytes(&hist, bytemuck::cast_slice(prompt))?;
        m.set_step(gpu, prompt.len(), keep)?;
        let (mut prefill, _) = m.build_prefill(gpu, new.len(), false)?;
        let mut sampler = Sampler::new(opts.sampling.clone());
        let greedy = opts.sampling.is_plain_greedy();
        let k = opts.sampling.candidates(m.cfg.vocab);
        self.push_select(gpu, &mut prefill, greedy, k, &opts.sampling)?;
        self.submit_step(gpu, &prefill, 0);
        let first = self.read_token(gpu, 0, greedy, k, &mut sampler)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        self.cached = prompt.to_vec();

        let mut tokens = Vec::new();
        let mut stream = TextStream::new();
        let mut text = String::new();
        let mut stop = StopReason::MaxTokens;
        let t1 = Instant::now();
        // Decode steps are submitted at positions cached.len(), +1, +2, ...: step i fills readback
        // slot (first_pos + i) % slots, and its command buffer is encoded ahead (see encode_ahead).
        // The step at position `pos` leaves pos + 1 KV rows, which picks its program (short contexts
        // run the one-pass attention, long ones the split one).
        let first_pos = self.cached.len();
        let mut select = Program::new();
        self.push_select(gpu, &mut select, greedy, k, &opts.sampling)?;
        let step_program = |kv_len: usize| {
            let mut p = Program::new();
            p.extend(m.decode_program(kv_len).dispatches.iter().cloned());
            p.extend(select.dispatches.iter().cloned());
            p
        };
        let short = step_program(1);
        // The split-attention program, where the model has one for longer caches.
        let long = m
            .decode_switch_kv()
            .map(|at| (at, step_program(usize::MAX)));
        let slots = self.readback.len();
        let copies: Vec<ResultCopy> = (0..slots).map(|s| self.result_copy(s)).collect();
        let device = gpu.device.clone();
        let encode: std::sync::Arc<EncodeFn> = std::sync::Arc::new(move |i| {
            let p = match &long {
                Some((at, long)) if first_pos + i + 1 > *at => long,
                _ => &short,
            };
            encode_step(&device, p, &copies[(first_pos + i) % slots])
        });
        let mut ahead = EncodeAhead::start(encode_threads(), encode)?;
        let mut time = DecodeTime::default();
        let mut next = Some(first);
        // Greedy keeps `slots` steps in flight: a step's input id is the previous step's argmax, already
        // on the GPU, so the GPU never waits for the CPU to read a token back (or to wake up).
        let depth = if greedy { slots } else { 1 };
        // The position of the next step to submit; every position below it has its KV rows.
        let mut next_submit = first_pos;
        while let Some(tok) = next.take() {
            let pos = self.cached.len();
            if self.eos.contains(&tok) {
                stop = StopReason::Eos;
                break;
            }
            tokens.push(tok);
            self.cached.push(tok);
            if let Some(piece) = stream.push(&self.tokenizer, tok)? {
                let emitted = text.len();
                text.push_str(&piece);
                if let Some(cut) = opts.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                    // Stream only what precedes the stop string.
                    text.truncate(cut);
                    if cut > emitted {
                        on_text(&text[emitted..]);
                    }
                    stop = StopReason::StopString;
                    break;
                }
                on_text(&piece);
            }
            if tokens.len() >= opts.max_tokens {
                break;
            }
            if cancel.load(Ordering::Relaxed) {
                stop = StopReason::Cancelled;
                break;
            }
            if pos + 1 > m.max_ctx {
                stop = StopReason::ContextFull;
                break;
            }
            // Decode the token at `pos`: kv_len pos + 1.
            if !greedy {
                gpu.write_tensor_bytes(&m.ids.view(0, &[1])?, bytemuck::bytes_of(&tok))?;
                gpu.write_tensor_bytes(&m.history.view(pos, &[1])?, bytemuck::bytes_of(&tok))?;
            }
            // The step at `pos` (unless already queued) and, greedy, the ones after it, up to the
            // last that could be needed: its token must be under the limit and its row in the context.
            while next_submit < pos + depth {
                let s = next_submit;
                let needed = s == pos || (s - first_pos + 1 < opts.max_tokens && s < m.max_ctx);
                if !needed {
                    break;
                }
                let t = Instant::now();
                let cb = ahead.next_buffer()?;
                let t_cb = Instant::now();
                // Greedy steps after the first find the step state moved on by the argmax (ADVANCE).
                if !greedy || s == first_pos {
                    m.set_step(gpu, s + 1, s)?;
                }
                self.submit_buffer(gpu, cb, s % slots);
                time.encode_wait_us += (t_cb - t).as_secs_f64() * 1e6;
                time.submit_us += t_cb.elapsed().as_secs_f64() * 1e6;
                next_submit += 1;
            }
            let t = Instant::now();
            next = Some(self.read_token(gpu, pos % slots, greedy, k, &mut sampler)?);
            time.readback_us += t.elapsed().as_secs_f64() * 1e6;
        }
        drop(ahead);
        let unread = self.inflight.borrow().iter().any(Option::is_some);
        if unread {
            // Drain the speculative steps; their tokens are discarded.
            gpu.wait()?;
            self.inflight.borrow_mut().fill(None);
        }
        let kv_rows = next_submit;
        // Only tokens with KV rows may be reused by the next call.
        self.cached.truncate(kv_rows);
        let decode_s = t1.elapsed().as_secs_f64();
        Ok(Generation {
            text,
            tokens: tokens.clone(),
            prompt_tokens: prompt.len(),
            prefill_tokens_per_s: new.len() as f64 / prefill_s,
            decode_tokens_per_s: if tokens.len() > 1 {
                (tokens.len() - 1) as f64 / decode_s
            } else {
                0.0
            },
            stop_reason: stop,
            decode_time: time,
        })
    }

    /// Appends token selection to a program: argmax for plain greedy, else the candidate kernel.
    fn push_select(
        &self,
        gpu: &Gpu,
        p: &mut Program,
        greedy: bool,
        k: usize,
        s: &SamplingParams,
    ) -> Result<()> {
        let m = &self.model;
        if greedy {
            p.extend(m.greedy_dispatches().iter().cloned());
        } else {
            p.push(topk(
                gpu,
                &m.logits,
                &m.history,
                &m.step,
                &self.cand,
                &TopkOptions {
                    k,
                    repeat_penalty: s.repeat_penalty,
                    repeat_window: s.repeat_window,
                    temperature: s.temperature.max(1e-3),
                },
            )?);
        }
        Ok(())
    }

    fn submit_step(&self, gpu: &Gpu, p: &Program, slot: usize) {
        let cb = encode_step(&gpu.device, p, &self.result_copy(slot));
        self.submit_buffer(gpu, cb, slot);
    }

    fn submit_buffer(&self, gpu: &Gpu, cb: wgpu::CommandBuffer, slot: usize) {
        self.inflight.borrow_mut()[slot] = Some(gpu.queue.submit([cb]));
    }

    /// What a step copies into readback slot `slot`: the id the argmax wrote (greedy) and the candidate
    /// list (sampling).
    fn result_copy(&self, slot: usize) -> ResultCopy {
        ResultCopy {
            id: self.model.ids.storage.clone(),
            candidates: self.cand.storage.clone(),
            readback: self.readback[slot].clone(),
        }
    }

    fn read_token(
        &self,
        gpu: &Gpu,
        slot: usize,
        greedy: bool,
        k: usize,
        sampler: &mut Sampler,
    ) -> Result<u32> {
        let buf = &self.readback[slot].buffer;
        let (tx, rx) = std::sync::mpsc::channel();
        buf.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        // Wait for this slot's submission only: a step queued after it keeps the GPU busy meanwhile.
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: self.inflight.borrow_mut()[slot].take(),
                timeout: None,
            })
            .map_err(|e| DriftError::Gpu(e.to_string()))?;
        gpu.take_error()?;
        rx.recv()
            .map_err(|e| DriftError::Gpu(e.to_string()))?
            .map_err(|e| DriftError::Gpu(format!("token readback: {e}")))?;
        let words: Vec<u32> = {
            let view = buf
                .get_mapped_range(..)
                .map_err(|e| DriftError::Gpu(format!("{e:?}")))?;
            bytemuck::cast_slice(&view).to_vec()
        };
        buf.unmap();
        if greedy {
            Ok(words[0])
        } else {
            Ok(sampler.pick(&Candidates::from_words(&words[2..], k)))
        }
    }

    /// Runs one decode step (and the greedy argmax) under `profiler`: per-dispatch GPU timings of one
    /// token. The step runs at the position after the cached tokens, whose KV row nothing reuses, so the
    /// session's state is unchanged (at a full cache the last row is given up instead).
    pub fn profile_decode_step(&mut self, gpu: &Gpu, profiler: &mut Profiler) -> Result<Profile> {
        let m = &self.model;
        let pos = self.cached.len().min(m.max_ctx.saturating_sub(1));
        self.cached.truncate(pos);
        let input = self.cached.last().copied().unwrap_or(0);
        gpu.write_tensor_bytes(&m.ids.view(0, &[1])?, bytemuck::bytes_of(&input))?;
        m.set_step(gpu, pos + 1, pos)?;
        let mut step = Program::new();
        step.extend(m.decode_program(pos + 1).dispatches.iter().cloned());
        step.extend(m.greedy_dispatches().iter().cloned());
        step.run_profiled(gpu, profiler)
    }

    /// Runs the prompt once and returns the logits of every position (fidelity tests).
    pub fn prompt_logits(&mut self, gpu: &Gpu, prompt: &[u32]) -> Result<Vec<f32>> {
        let m = &self.model;
        m.check_length(prompt.len())?;
        gpu.write_tensor_bytes(&m.ids, bytemuck::cast_slice(prompt))?;
        m.set_step(gpu, prompt.len(), 0)?;
        let (p, logits) = m.build_prefill(gpu, prompt.len(), true)?;
        p.run(gpu)?;
        self.cached.clear();
        gpu.read_f32(&logits.expect("asked for all logits"))
    }
}

/// Greedy decode steps kept in flight: `DRIFT_PIPELINE_DEPTH` (at least 1), default 4. Two hide the
/// readback; more also hide a late wake-up of the submitting thread (measured on the H200, where the
/// 135M model's loop ran at half the GPU's speed in some processes with two).
fn pipeline_depth() -> usize {
    std::env::var("DRIFT_PIPELINE_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4usize)
        .max(1)
}

/// The copies that end a step: its result into a readback slot.
struct ResultCopy {
    id: crate::tensor::Storage,
    candidates: crate::tensor::Storage,
    readback: std::sync::Arc<crate::memory::GpuBuffer>,
}

/// One step's command buffer: the program in one compute pass, then the result copies.
fn encode_step(device: &wgpu::Device, p: &Program, copy: &ResultCopy) -> wgpu::CommandBuffer {
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        p.encode_into(&mut pass);
    }
    let dst = &copy.readback.buffer;
    let (id, cand) = (&copy.id, &copy.candidates);
    enc.copy_buffer_to_buffer(&id.buffer.buffer, id.offset, dst, 0, 4);
    enc.copy_buffer_to_buffer(&cand.buffer.buffer, cand.offset, dst, 8, cand.len);
    enc.finish()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::gpu::GpuOptions;
    use crate::models::llama::QuantScheme;
    use crate::models::load::open_llm;

    fn fixture_session(gpu: &Gpu) -> LlmSession {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/llama3-rope-tied");
        open_llm(gpu, &dir, Some(64), QuantScheme::None).unwrap()
    }

    fn greedy(max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop: vec![],
        }
    }

    /// Generation that crosses the one-pass attention's KV limit (the encoder switches programs mid
    /// reply) gives the split attention's tokens, as does the one-pass attention throughout.
    #[test]
    fn switching_decode_attention_mid_reply_keeps_the_tokens() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let cancel = AtomicBool::new(false);
        let text = "The capital of France is";
        let run = |row_max: Option<usize>| {
            let mut s = fixture_session(&gpu);
            if let Some(n) = row_max {
                s.model.set_row_attention_max_kv(&gpu, n).unwrap();
            }
            let prompt = s.tokenizer.encode(text, false).unwrap();
            let g = s
                .generate(&gpu, &prompt, &greedy(8), &cancel, &mut |_| {})
                .unwrap();
            (g.tokens, prompt.len(), s.model.row_attention_max_kv())
        };
        let (split, prompt_len, off) = run(Some(0));
        assert_eq!(off, 0);
        let (one_pass, _, limit) = run(None);
        if limit == 0 {
            eprintln!("no one-pass decode attention on this device: nothing to switch");
            return;
        }
        assert_eq!(one_pass, split, "one-pass attention throughout");
        // Decode step i leaves prompt_len + 1 + i rows: the first three run one-pass, the rest split.
        let (switching, _, _) = run(Some(prompt_len + 3));
        assert_eq!(switching, split, "switching after three steps");
    }

    /// A reply cut short (token limit, stop) leaves its last token without a KV row: the next turn must
    /// prefill it rather than reuse the unwritten row, and give what a fresh session gives. Profiling a
    /// decode step in between must not disturb the cache either.
    #[test]
    fn a_continued_conversation_matches_a_fresh_one() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let mut s = fixture_session(&gpu);
        let cancel = AtomicBool::new(false);
        let prompt = s
            .tokenizer
            .encode("The capital of France is", false)
            .unwrap();
        for max_tokens in [1, 5] {
            s.reset();
            let first = s
                .generate(&gpu, &prompt, &greedy(max_tokens), &cancel, &mut |_| {})
                .unwrap();
            assert_eq!(first.tokens.len(), max_tokens);
            assert!(s.cached.len() < prompt.len() + max_tokens);
            let profile = s.profile_decode_step(&gpu, &mut Profiler::new()).unwrap();
            assert!(profile.dispatches.len() > 4, "one token's dispatches");
            assert!(profile.dispatches.iter().any(|d| d.name.contains("argmax")));
            let mut longer = prompt.clone();
            longer.extend(&first.tokens);
            longer.extend(&prompt[1..3]);
            let continued = s
                .generate(&gpu, &longer, &greedy(6), &cancel, &mut |_| {})
                .unwrap();
            let mut fresh = fixture_session(&gpu);
            let reference = fresh
                .generate(&gpu, &longer, &greedy(6), &cancel, &mut |_| {})
                .unwrap();
            assert_eq!(
                continued.tokens, reference.tokens,
                "after a {max_tokens}-token reply"
            );
        }
    }
}
