//! `drift bench llm --shape NAME --random-weights`: prefill and decode speed at a real model's shape.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Result, bail};
use drift_engine::generate::{DecodeTime, GenerateOptions, LlmSession};
use drift_engine::kernels::copy::copy;
use drift_engine::kernels::sample::argmax;
use drift_engine::models::llama::{LlamaModel, LlamaWeights, QuantScheme};
use drift_engine::models::load::open_llm;
use drift_engine::models::shapes::{RandomWeights, ShapedRandom, llm_shape};
use drift_engine::profiler::Profiler;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::TextTokenizer;
use drift_engine::{Category, DType, Gpu, Program};
use serde::Serialize;

use super::llm_sweep::SweepPoint;
use super::timing::time_sequence;

#[derive(clap::Args)]
pub struct LlmBenchArgs {
    /// llm: smollm2-135m (default), llama-3.2-1b or llama-3.1-8b; sd: sd15 (default).
    #[arg(long)]
    pub shape: Option<String>,
    /// Random weights at the shape's real sizes (no model file is read).
    #[arg(long)]
    pub random_weights: bool,
    /// Measure a real model file (GGUF or a Hugging Face folder) instead of a shape.
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,
    /// Tokens to decode.
    #[arg(long = "gen", default_value_t = 128)]
    pub generate: usize,
    /// Store the weights as q8_0, q4_0 or mixed-8-4 (ML Drift's 8-bit attention, 4-bit feed-forward).
    #[arg(long, default_value = "none")]
    pub quant: String,
    /// After the measurements, the decode floor under each `;`-separated set of `VAR=VALUE`
    /// environment variables (measurement and tuning switches), rebuilding the decode programs
    /// over the same weights.
    #[arg(long)]
    pub sweep: Option<String>,
}

#[derive(Serialize)]
pub struct LlmBench {
    pub shape: String,
    /// The first greedy tokens of the reported run: equal across builds that compute the same logits.
    pub first_tokens: Vec<u32>,
    /// Workgroups of the one-dispatch decode step (0: the multi-dispatch program ran; a grid that
    /// stopped running concurrently fails the generation with an error).
    pub decode_step_workgroups: u32,
    pub quant: String,
    pub device: String,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub prefill_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub prefill_gpu_ms: f64,
    pub decode_tokens: usize,
    pub decode_tokens_per_s: f64,
    /// The three timed generations' decode rates, slowest first (the median is `decode_tokens_per_s`).
    pub decode_runs_tokens_per_s: Vec<f64>,
    pub decode_ms_per_token: f64,
    pub decode_gpu_ms_per_token: f64,
    pub dispatches_per_token: usize,
    pub cpu_encode_us_per_token: f64,
    /// CPU time of encoding and submitting one step (what the submitting thread pays per token when
    /// nothing is encoded ahead).
    pub cpu_submit_us_per_token: f64,
    /// Wall time per step of 32 steps submitted as one command buffer: the GPU's own floor (dispatch
    /// barriers included, no CPU encoding between steps).
    pub decode_gpu_wall_ms_per_token: f64,
    /// The same with each step its own command buffer and submit (all submitted, then one wait).
    pub decode_gpu_wall_submits_ms_per_token: f64,
    /// The same 32 command buffers in one submit call.
    pub decode_gpu_wall_batched_ms_per_token: f64,
    /// The generation loop's time per token by what it waited on.
    pub decode_loop_us_per_token: DecodeTime,
    pub bytes_per_token: f64,
    pub copy_gbps: f64,
    pub roofline_fraction: f64,
    pub top_decode_kernels: Vec<(String, f64)>,
    /// Kernels of the prompt's prefill under the profiler: (name, calls, GPU microseconds).
    pub top_prefill_kernels: Vec<(String, usize, f64)>,
    /// `--sweep`'s points.
    pub sweep: Vec<SweepPoint>,
}

pub fn run(gpu: &Gpu, a: &LlmBenchArgs) -> Result<LlmBench> {
    if a.prompt == 0 || a.generate == 0 {
        bail!("--prompt and --gen must be at least 1");
    }
    let t = Instant::now();
    let quant = QuantScheme::parse(&a.quant)?;
    let ctx = a.prompt + a.generate + 2;
    let (shape, mut s) = match &a.model {
        // A real model file: its own weights and quantisation (GGUF) or `--quant` (safetensors).
        Some(path) => {
            let mut s = open_llm(gpu, path, Some(ctx), quant)?;
            if s.model.max_ctx < ctx {
                bail!(
                    "{} holds {} positions, the benchmark needs {ctx}",
                    path.display(),
                    s.model.max_ctx
                );
            }
            // Generation must run its full length: no EOS.
            s.eos.clear();
            (
                path.file_name()
                    .map_or("model".into(), |f| f.to_string_lossy().into_owned()),
                s,
            )
        }
        None => {
            if !a.random_weights {
                bail!("drift bench llm needs --random-weights (a shape) or --model PATH (a file)");
            }
            let shape = a.shape.clone().unwrap_or_else(|| "smollm2-135m".into());
            let cfg = llm_shape(&shape)?;
            let src = ShapedRandom {
                cfg: &cfg,
                rng: RandomWeights { seed: 1 },
            };
            let w = LlamaWeights::load(gpu, &cfg, &src, quant)?;
            let model = LlamaModel::new(gpu, cfg.clone(), w, ctx)?;
            // A one-token vocabulary tokenizer stands in: the benchmark never detokenises meaningfully.
            let tok = TextTokenizer::from_json(
                r#"{"version":"1.0","model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}}"#,
            )?;
            (shape, LlmSession::new(gpu, model, tok, None, vec![])?)
        }
    };
    let cfg = s.model.cfg.clone();
    let weight_bytes = gpu.memory_report().bytes(Category::Weights);
    let kv_bytes = gpu.memory_report().bytes(Category::KvCache);
    eprintln!(
        "weights: {:.2} GB in {:.1} s",
        weight_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let prompt: Vec<u32> = (0..a.prompt)
        .map(|i| (i * 7919 % cfg.vocab) as u32)
        .collect();

    // Prefill: GPU time of the prefill program, median of 5.
    let m = &s.model;
    m.write_ids(gpu, &prompt)?;
    m.set_step(gpu, prompt.len(), 0)?;
    let (prefill, _) = m.build_prefill(gpu, prompt.len(), false)?;
    let prefill_us = time_sequence(gpu, &prefill.dispatches, 5)?;
    let mut walls = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        prefill.run(gpu)?;
        walls.push(t.elapsed().as_secs_f64());
    }
    walls.sort_by(f64::total_cmp);
    let prefill_wall = walls[2];
    let top_prefill = prefill
        .run_profiled(gpu, &mut Profiler::new())?
        .by_kernel()
        .into_iter()
        .take(8)
        .map(|k| (k.name, k.calls, k.total_us))
        .collect();

    // Decode: real generation loop (greedy, pipelined), after a warm-up.
    let opts = GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens: a.generate,
        stop: vec![],
    };
    let cancel = AtomicBool::new(false);
    // Half a second of warm-up (pipelines, allocations, GPU clocks). On the H200 the first timed
    // generation of a process was still often slow after it, hence the median of three below.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 0.5 {
        s.reset();
        s.generate(
            gpu,
            &prompt[..prompt.len().min(8)],
            &GenerateOptions {
                max_tokens: 32,
                ..opts.clone()
            },
            &cancel,
            &mut |_| {},
        )?;
    }
    // Three timed generations, the median reported: on the H200 the first often ran 30-50% slower
    // than the rest (the GPU slower in the loop than in the floors measured right after).
    let mut runs = Vec::new();
    for _ in 0..3 {
        s.reset();
        runs.push(s.generate(gpu, &prompt, &opts, &cancel, &mut |_| {})?);
    }
    runs.sort_by(|a, b| a.decode_tokens_per_s.total_cmp(&b.decode_tokens_per_s));
    let decode_runs: Vec<f64> = runs.iter().map(|g| g.decode_tokens_per_s).collect();
    let g = runs.swap_remove(1);

    // One decode step under the profiler: GPU time per token and where it goes.
    let step = floor_step(gpu, &s.model, prompt.len())?;
    let profile = step.run_profiled(gpu, &mut Profiler::new())?;
    let decode_gpu_us = profile.busy_us();
    let top = profile
        .by_kernel()
        .into_iter()
        .take(6)
        .map(|k| (k.name, k.total_us))
        .collect();
    let cpu_us = step.cpu_us_per_dispatch(gpu, 20) * step.len() as f64;
    let (gpu_wall_us, gpu_wall_submits_us, gpu_wall_batched_us, cpu_submit_us) =
        decode_floors(gpu, &step)?;
    let per_token = |us: f64| us / g.tokens.len().max(1) as f64;
    let loop_time = DecodeTime {
        encode_wait_us: per_token(g.decode_time.encode_wait_us),
        submit_us: per_token(g.decode_time.submit_us),
        readback_us: per_token(g.decode_time.readback_us),
    };
    let bytes_per_token = step.cost().bytes;

    // Copy bandwidth on this device, for the roofline.
    let n = (64usize << 20).min(gpu.caps.max_storage_binding as usize / 4);
    let x = gpu.tensor("copy a", &[n], DType::F32, Category::Other)?;
    let y = gpu.tensor("copy b", &[n], DType::F32, Category::Other)?;
    let cd = copy(gpu, &x, &y)?;
    let copy_bytes = cd.cost.bytes;
    let copy_gbps = copy_bytes / time_sequence(gpu, &[cd], 10)? / 1e3;
    let roofline_tps = copy_gbps * 1e9 / bytes_per_token;
    let decode_step_workgroups = s.model.decode_step().map_or(0, |step| step.workgroups);
    let sweep = match &a.sweep {
        Some(spec) => super::llm_sweep::sweep(gpu, &mut s, &prompt, a.generate, spec)?,
        None => Vec::new(),
    };
    Ok(LlmBench {
        sweep,
        decode_step_workgroups,
        first_tokens: g.tokens.iter().take(12).copied().collect(),
        shape,
        quant: if a.model.is_some() {
            "file".into()
        } else {
            a.quant.clone()
        },
        device: gpu.info.name.clone(),
        weight_bytes,
        kv_bytes,
        prefill_tokens: prompt.len(),
        prefill_tokens_per_s: prompt.len() as f64 / prefill_wall,
        prefill_gpu_ms: prefill_us / 1e3,
        decode_tokens: g.tokens.len(),
        decode_tokens_per_s: g.decode_tokens_per_s,
        decode_runs_tokens_per_s: decode_runs,
        decode_ms_per_token: 1e3 / g.decode_tokens_per_s,
        decode_gpu_ms_per_token: decode_gpu_us / 1e3,
        dispatches_per_token: step.len(),
        cpu_encode_us_per_token: cpu_us,
        cpu_submit_us_per_token: cpu_submit_us,
        decode_gpu_wall_ms_per_token: gpu_wall_us / 1e3,
        decode_gpu_wall_submits_ms_per_token: gpu_wall_submits_us / 1e3,
        decode_gpu_wall_batched_ms_per_token: gpu_wall_batched_us / 1e3,
        decode_loop_us_per_token: loop_time,
        bytes_per_token,
        copy_gbps,
        roofline_fraction: g.decode_tokens_per_s / roofline_tps,
        top_decode_kernels: top,
        top_prefill_kernels: top_prefill,
    })
}

/// One decode step after a `prompt_len`-token prompt, for the profiler and the floors: the decode
/// program and an argmax that leaves the step state where it is (the model's greedy selection
/// moves it on after each step; repeated up to 32 times in one buffer that would walk past the
/// cache).
pub(super) fn floor_step(gpu: &Gpu, m: &LlamaModel, prompt_len: usize) -> Result<Program> {
    m.set_step(gpu, prompt_len + 1, prompt_len)?;
    let mut step = Program::new();
    step.extend(m.decode_program(prompt_len + 1).dispatches.iter().cloned());
    let ids = m.ids.view(0, &[1])?;
    step.extend(argmax(gpu, &m.logits, &ids, &m.history, &m.step, false)?);
    Ok(step)
}

/// The floors of a decode step: GPU wall time per step with the CPU out of the way (32 steps in one
/// command buffer; 32 pre-encoded command buffers, one submit each, then one wait; the same 32 in one
/// submit), and the CPU
/// time of encoding + submitting one step. Medians of 5, in microseconds.
pub(super) fn decode_floors(gpu: &Gpu, step: &Program) -> Result<(f64, f64, f64, f64)> {
    const REPS: usize = 32;
    let mut many = Program::new();
    for _ in 0..REPS {
        many.extend(step.dispatches.iter().cloned());
    }
    let (mut one, mut each, mut batched, mut cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let cb = many.encode(gpu);
        gpu.wait()?;
        let t = Instant::now();
        gpu.queue.submit([cb]);
        gpu.wait()?;
        one.push(t.elapsed().as_secs_f64() * 1e6 / REPS as f64);
        let cbs: Vec<_> = (0..REPS).map(|_| step.encode(gpu)).collect();
        let t = Instant::now();
        for cb in cbs {
            gpu.queue.submit([cb]);
        }
        gpu.wait()?;
        each.push(t.elapsed().as_secs_f64() * 1e6 / REPS as f64);
        let cbs: Vec<_> = (0..REPS).map(|_| step.encode(gpu)).collect();
        let t = Instant::now();
        gpu.queue.submit(cbs);
        gpu.wait()?;
        batched.push(t.elapsed().as_secs_f64() * 1e6 / REPS as f64);
        let t = Instant::now();
        for _ in 0..8 {
            step.submit(gpu);
        }
        cpu.push(t.elapsed().as_secs_f64() * 1e6 / 8.0);
        gpu.wait()?;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(one), median(each), median(batched), median(cpu)))
}
