//! Text generation on a loaded LLM: prefill, then decode steps until EOS, a stop string, the token
//! limit or a cancel. Greedy decoding stays on the GPU (the argmax writes the next input id and moves
//! the step state on), runs several steps per command buffer (their ids read back together) and keeps
//! several buffers in flight so CPU work (readback, detokenising, streaming) overlaps the GPU; sampling
//! reads back a short candidate list per token. Decode command buffers are encoded ahead on worker
//! threads ([`crate::encode_ahead`]), so the submitting thread only submits them (writing the step
//! state for the first greedy step and every sampled one).

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
    /// Decode steps per command buffer this generation ran (1 when sampling).
    pub decode_batch: usize,
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
    /// Greedy decode steps per command buffer ([`decode_batch`] at creation).
    pub decode_batch: usize,
    /// Whether a GPU too slow for batching to pay streams one step per buffer ([`batch_for`]); off
    /// where `DRIFT_DECODE_BATCH` is set.
    pub adaptive_batch: bool,
    /// Milliseconds per decode step of the last greedy generation.
    step_ms: Option<f64>,
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
            decode_batch: decode_batch(),
            adaptive_batch: std::env::var_os("DRIFT_DECODE_BATCH").is_none(),
            step_ms: None,
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
        // The prefill's argmax writes the first token at history[prompt.len()].
        let tokens = if greedy {
            TokenCopy::History {
                from: prompt.len(),
                n: 1,
            }
        } else {
            TokenCopy::Candidates
        };
        let cb = encode_steps(&gpu.device, &[&prefill], &self.result_copy(0), tokens);
        self.submit_buffer(gpu, cb, 0);
        // Decode steps run at positions first_pos, +1, ...: the step at `pos` leaves pos + 1 KV rows,
        // which picks its program (short contexts run the one-pass attention, long ones the chunked
        // one), and produces the token after it. Greedy runs `batch` steps per command buffer (one
        // compute pass, their tokens copied out of the history at its end); batch `b` fills readback
        // slot b % slots, and its command buffer is encoded ahead (see encode_ahead), the first ones
        // while the prefill runs. The last step that can be needed produces token number max_tokens,
        // and none may write a row past the context.
        let first_pos = prompt.len();
        let batch = match (greedy, self.adaptive_batch) {
            (false, _) => 1,
            (true, true) => batch_for(self.decode_batch, self.step_ms),
            (true, false) => self.decode_batch.clamp(1, MAX_BATCH),
        };
        let end = (first_pos + opts.max_tokens.saturating_sub(1)).min(m.max_ctx);
        let steps_of = move |b: usize| {
            let s = first_pos + b * batch;
            s..(s + batch).min(end).max(s)
        };
        let mut select = Program::new();
        self.push_select(gpu, &mut select, greedy, k, &opts.sampling)?;
        let step_program = |kv_len: usize| {
            let mut p = Program::new();
            p.extend(m.decode_program(kv_len).dispatches.iter().cloned());
            p.extend(select.dispatches.iter().cloned());
            p
        };
        let short = step_program(1);
        // The chunked-attention program, where the model has one for longer caches.
        let long = m
            .decode_switch_kv()
            .map(|at| (at, step_program(usize::MAX)));
        let slots = self.readback.len();
        let copies: Vec<ResultCopy> = (0..slots).map(|s| self.result_copy(s)).collect();
        let device = gpu.device.clone();
        let encode: std::sync::Arc<EncodeFn> = std::sync::Arc::new(move |b| {
            let steps = steps_of(b);
            let programs: Vec<&Program> = steps
                .clone()
                .map(|s| match &long {
                    Some((at, long)) if s + 1 > *at => long,
                    _ => &short,
                })
                .collect();
            let tokens = if greedy {
                TokenCopy::History {
                    from: steps.start + 1,
                    n: steps.len(),
                }
            } else {
                TokenCopy::Candidates
            };
            encode_steps(&device, &programs, &copies[b % slots], tokens)
        });
        let mut ahead = EncodeAhead::start(encode_threads(), encode)?;
        let first = self.read_tokens(gpu, 0, 1, greedy, k, &mut sampler)?[0];
        let prefill_s = t0.elapsed().as_secs_f64();
        self.cached = prompt.to_vec();

        let mut tokens = Vec::new();
        let mut stream = TextStream::new();
        let mut text = String::new();
        let mut stop = StopReason::MaxTokens;
        let t1 = Instant::now();
        let mut time = DecodeTime::default();
        let mut next = Some(first);
        // Greedy keeps several batches in flight: a step's input id is the previous step's argmax,
        // already on the GPU, so the GPU never waits for the CPU to read a token back (or to wake up).
        let in_flight = if greedy {
            (slots / batch).clamp(2.min(slots), slots)
        } else {
            1
        };
        let mut submitted = 0usize;
        let mut read = 0usize;
        let mut pending = std::collections::VecDeque::new();
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
            // Decode the token at `pos` (here pos < end): kv_len pos + 1.
            if !greedy {
                gpu.write_tensor_bytes(&m.ids.view(0, &[1])?, bytemuck::bytes_of(&tok))?;
                gpu.write_tensor_bytes(&m.history.view(pos, &[1])?, bytemuck::bytes_of(&tok))?;
            }
            // The batch holding `pos` (unless already queued) and, greedy, the ones after it that
            // have steps.
            let holding = (pos - first_pos) / batch;
            while submitted < holding + in_flight {
                let steps = steps_of(submitted);
                if steps.is_empty() {
                    break;
                }
                let t = Instant::now();
                let cb = ahead.next_buffer()?;
                let t_cb = Instant::now();
                // Greedy batches after the first find the step state moved on by the argmax (ADVANCE).
                if !greedy || submitted == 0 {
                    m.set_step(gpu, steps.start + 1, steps.start)?;
                }
                self.submit_buffer(gpu, cb, submitted % slots);
                time.encode_wait_us += (t_cb - t).as_secs_f64() * 1e6;
                time.submit_us += t_cb.elapsed().as_secs_f64() * 1e6;
                submitted += 1;
            }
            if pending.is_empty() {
                let t = Instant::now();
                let n = steps_of(read).len();
                pending.extend(self.read_tokens(gpu, read % slots, n, greedy, k, &mut sampler)?);
                read += 1;
                time.readback_us += t.elapsed().as_secs_f64() * 1e6;
            }
            next = pending.pop_front();
        }
        drop(ahead);
        let unread = self.inflight.borrow().iter().any(Option::is_some);
        if unread {
            // Drain the speculative steps; their tokens are discarded.
            gpu.wait()?;
            self.inflight.borrow_mut().fill(None);
        }
        // Every position below the last submitted step's has its KV rows; only those tokens may be
        // reused by the next call.
        let kv_rows = submitted
            .checked_sub(1)
            .map_or(first_pos, |b| steps_of(b).end);
        self.cached.truncate(kv_rows);
        let decode_s = t1.elapsed().as_secs_f64();
        if greedy && tokens.len() > 1 {
            self.step_ms = Some(decode_s * 1e3 / (tokens.len() - 1) as f64);
        }
        // A one-dispatch step whose grid stopped running concurrently computed garbage: say so, and
        // decode with the multi-dispatch program from now on (one 16-byte read per reply).
        if self.model.decode_step_timed_out(gpu)? {
            self.cached.clear();
            return Err(DriftError::Other(
                "the GPU stopped running the one-dispatch decode step's workgroups together, so this reply \
                 is wrong; the next ones use the multi-dispatch decode (DRIFT_DECODE_STEP=0 makes that the \
                 default)"
                    .into(),
            ));
        }
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
            decode_batch: batch,
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

    fn submit_buffer(&self, gpu: &Gpu, cb: wgpu::CommandBuffer, slot: usize) {
        self.inflight.borrow_mut()[slot] = Some(gpu.queue.submit([cb]));
    }

    /// What a step copies into readback slot `slot`: the ids the argmax wrote (greedy) or the candidate
    /// list (sampling).
    fn result_copy(&self, slot: usize) -> ResultCopy {
        ResultCopy {
            history: self.model.history.storage.clone(),
            candidates: self.cand.storage.clone(),
            readback: self.readback[slot].clone(),
        }
    }

    /// The tokens of the steps that filled readback slot `slot`: `n` argmax ids (greedy) or one token
    /// picked from the candidate list.
    fn read_tokens(
        &self,
        gpu: &Gpu,
        slot: usize,
        n: usize,
        greedy: bool,
        k: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<u32>> {
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
            Ok(words[..n].to_vec())
        } else {
            Ok(vec![sampler.pick(&Candidates::from_words(&words[2..], k))])
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

/// Greedy decode steps per command buffer: `DRIFT_DECODE_BATCH` (1 to 64, which also turns off
/// [`batch_for`]'s choice by step time), default 4 (the least [`batch_for`] uses). The steps of
/// a batch share one compute pass and one token copy. On the H200 (2026-11-30) 4 gave Llama 3.2 1B
/// 963.9 tok/s against 933.5 at 1 and 962.6 at 8, SmolLM2-135M 1161.6 against 1119.4 (8: 1152.7):
/// each command buffer costs the GPU ~30-80 us beyond its dispatches. Tokens then stream in groups of
/// four (~4 ms apart), and a reply that ends mid-batch runs at most a few steps past its end.
fn decode_batch() -> usize {
    std::env::var("DRIFT_DECODE_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_BATCH)
        .clamp(1, MAX_BATCH)
}

const DEFAULT_BATCH: usize = 4;

/// The most steps one command buffer may hold: their ids must fit a readback slot.
const MAX_BATCH: usize = 64;

/// Steps per command buffer for a session configured with `configured` whose last greedy generation
/// took `step_ms` per step: batching saves ~50-80 us of GPU time per buffer, under 1% once a step takes
/// [`SLOW_STEP_MS`], while tokens would then stream in visible bursts; such GPUs get one step per buffer.
/// Fast steps batch up to a burst of [`BURST_MS`] (at most [`MAX_ADAPTIVE_BATCH`] steps): tokens then
/// still arrive once per 60 Hz frame, and a reply overruns its end by at most that much GPU time. On
/// the H200 (2026-12-01, SmolLM2-135M's one-dispatch step at 0.66 ms) 4 steps per buffer gave 1,476.9
/// tok/s, 8 gave 1,491.5 and 16 gave 1,498.2.
fn batch_for(configured: usize, step_ms: Option<f64>) -> usize {
    match step_ms {
        Some(ms) if ms > SLOW_STEP_MS => 1,
        Some(ms) if ms > 0.0 => ((BURST_MS / ms) as usize)
            .min(MAX_ADAPTIVE_BATCH)
            .max(configured)
            .clamp(1, MAX_BATCH),
        _ => configured.clamp(1, MAX_BATCH),
    }
}

/// GPU time one command buffer of greedy steps may hold where steps are fast ([`batch_for`]).
const BURST_MS: f64 = 16.0;

/// The most steps [`batch_for`] puts in one command buffer on its own.
const MAX_ADAPTIVE_BATCH: usize = 32;

const SLOW_STEP_MS: f64 = 8.0;

/// Where a step's results are copied from: the history (the buffers it ends with) and the candidate
/// list, into a readback slot.
struct ResultCopy {
    history: crate::tensor::Storage,
    candidates: crate::tensor::Storage,
    readback: std::sync::Arc<crate::memory::GpuBuffer>,
}

/// What a command buffer copies out at its end.
#[derive(Clone, Copy)]
enum TokenCopy {
    /// `history[from..from + n]`: the ids `n` greedy steps wrote, to words 0..n.
    History { from: usize, n: usize },
    /// The candidate list of one sampled step, to words 2...
    Candidates,
}

/// One command buffer: the programs in one compute pass, then their results into a readback slot.
/// An empty list (a batch past the last step, encoded ahead but never submitted) copies nothing.
fn encode_steps(
    device: &wgpu::Device,
    programs: &[&Program],
    copy: &ResultCopy,
    tokens: TokenCopy,
) -> wgpu::CommandBuffer {
    let mut enc = device.create_command_encoder(&Default::default());
    if programs.is_empty() {
        return enc.finish();
    }
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for p in programs {
            p.encode_into(&mut pass);
        }
    }
    let dst = &copy.readback.buffer;
    match tokens {
        TokenCopy::History { from, n } => {
            let h = &copy.history;
            debug_assert!(n <= MAX_BATCH && (from + n) as u64 * 4 <= h.len);
            enc.copy_buffer_to_buffer(
                &h.buffer.buffer,
                h.offset + from as u64 * 4,
                dst,
                0,
                n as u64 * 4,
            );
        }
        TokenCopy::Candidates => {
            let c = &copy.candidates;
            enc.copy_buffer_to_buffer(&c.buffer.buffer, c.offset, dst, 8, c.len);
        }
    }
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

    /// The fixture tests' prompt, tokenized.
    fn france(s: &LlmSession) -> Vec<u32> {
        s.tokenizer
            .encode("The capital of France is", false)
            .unwrap()
    }

    fn greedy(max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop: vec![],
        }
    }

    /// Generation that crosses the one-pass attention's KV limit (the encoder switches to the chunked
    /// program mid reply, also inside a batch of steps) gives the split attention's tokens, as does
    /// the one-pass attention throughout.
    #[test]
    fn switching_decode_attention_mid_reply_keeps_the_tokens() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let cancel = AtomicBool::new(false);
        let text = "The capital of France is";
        let run = |row_max: Option<usize>, batch: usize| {
            let mut s = fixture_session(&gpu);
            s.decode_batch = batch;
            s.adaptive_batch = false;
            if let Some(n) = row_max {
                s.model.set_row_attention_max_kv(&gpu, n).unwrap();
            }
            let prompt = s.tokenizer.encode(text, false).unwrap();
            let g = s
                .generate(&gpu, &prompt, &greedy(8), &cancel, &mut |_| {})
                .unwrap();
            (g.tokens, prompt.len(), s.model.row_attention_max_kv())
        };
        let (split, prompt_len, off) = run(Some(0), 1);
        assert_eq!(off, 0);
        let (one_pass, _, limit) = run(None, 1);
        if limit == 0 {
            eprintln!("no one-pass decode attention on this device: nothing to switch");
            return;
        }
        assert_eq!(one_pass, split, "one-pass attention throughout");
        // Decode step i leaves prompt_len + 1 + i rows: the first three run one-pass, the rest chunked.
        for batch in [1, 2] {
            let (switching, _, _) = run(Some(prompt_len + 3), batch);
            assert_eq!(
                switching, split,
                "switching after three steps, batch {batch}"
            );
        }
    }

    /// Greedy steps batched into one command buffer give the tokens of one step per buffer: replies
    /// that end mid-batch, on the token limit or the full context, and a batch larger than the
    /// pipeline's readback slots.
    #[test]
    fn batched_decode_steps_give_the_same_tokens() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let cancel = AtomicBool::new(false);
        let mut s = fixture_session(&gpu);
        let prompt = france(&s);
        let mut run = |batch: usize, max_tokens: usize| {
            s.reset();
            s.decode_batch = batch;
            s.adaptive_batch = false;
            let g = s
                .generate(&gpu, &prompt, &greedy(max_tokens), &cancel, &mut |_| {})
                .unwrap();
            (g.tokens, g.stop_reason, s.cached.len())
        };
        // 64 tokens of context: the long reply stops when the context is full.
        for max_tokens in [2, 11, 200] {
            let (reference, stop, cached) = run(1, max_tokens);
            if max_tokens == 200 {
                assert_eq!(stop, StopReason::ContextFull);
            }
            for batch in [2, 3, 8] {
                let (tokens, batch_stop, batch_cached) = run(batch, max_tokens);
                assert_eq!(tokens, reference, "batch {batch}, {max_tokens} tokens");
                assert_eq!(batch_stop, stop);
                // The rows the reusable prefix claims were written (here: every step up to the end).
                assert_eq!(batch_cached, cached, "batch {batch}, {max_tokens} tokens");
            }
        }
    }

    /// A GPU whose last generation took over 8 ms per step streams one step per buffer (no bursts);
    /// fast ones batch 16 ms of steps (4 to 32 of them); the first generation and an explicit setting
    /// batch as configured.
    #[test]
    fn steps_per_buffer_follow_the_step_time() {
        assert_eq!(batch_for(4, None), 4);
        assert_eq!(batch_for(4, Some(1.0)), 16);
        assert_eq!(batch_for(4, Some(0.66)), 24);
        assert_eq!(batch_for(4, Some(0.1)), 32);
        assert_eq!(batch_for(4, Some(2.6)), 6);
        assert_eq!(batch_for(4, Some(5.0)), 4);
        assert_eq!(batch_for(4, Some(20.0)), 1);
        assert_eq!(batch_for(500, Some(1.0)), MAX_BATCH);
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let cancel = AtomicBool::new(false);
        let mut s = fixture_session(&gpu);
        let prompt = france(&s);
        s.decode_batch = 4;
        let run = |s: &mut LlmSession, adaptive: bool, step_ms: Option<f64>| {
            s.reset();
            s.adaptive_batch = adaptive;
            s.step_ms = step_ms;
            let g = s
                .generate(&gpu, &prompt, &greedy(6), &cancel, &mut |_| {})
                .unwrap();
            assert!(
                s.step_ms.is_some_and(|ms| ms > 0.0),
                "the step time is kept"
            );
            (g.tokens, g.decode_batch)
        };
        let (first, batch) = run(&mut s, true, None);
        assert_eq!(batch, 4);
        assert_eq!(run(&mut s, true, Some(20.0)), (first.clone(), 1));
        assert_eq!(run(&mut s, true, Some(0.5)), (first.clone(), 32));
        assert_eq!(run(&mut s, true, Some(5.0)), (first.clone(), 4));
        assert_eq!(run(&mut s, false, Some(20.0)), (first, 4));
    }

    /// A reply cut short (token limit, stop) leaves its last token without a KV row: the next turn must
    /// prefill it rather than reuse the unwritten row, and give what a fresh session gives. Profiling a
    /// decode step in between must not disturb the cache either.
    #[test]
    fn a_continued_conversation_matches_a_fresh_one() {
        let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
        let mut s = fixture_session(&gpu);
        let cancel = AtomicBool::new(false);
        let prompt = france(&s);
        for (max_tokens, batch) in [(1, 1), (5, 1), (5, 3), (6, 4)] {
            s.reset();
            s.decode_batch = batch;
            s.adaptive_batch = false;
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
                "after a {max_tokens}-token reply, batch {batch}"
            );
        }
    }
}
