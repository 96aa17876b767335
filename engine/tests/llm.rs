//! Fidelity of the LLM path against transformers (f64 references from
//! tests/fixtures/make_llm_fixtures.py): logits at every prompt position, 32 greedy tokens, chat
//! templates and tokenisation, for a Llama with GQA (f32 weights), a Qwen2 with q/k/v biases (bf16) and
//! a Llama with llama3 rope scaling and tied embeddings (f16).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

use drift_engine::generate::{GenerateOptions, LlmSession, StopReason};
use drift_engine::models::config::LlmConfig;
use drift_engine::models::hf::HfFolder;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::llama::{LlamaModel, LlamaWeights};
use drift_engine::models::llama_step::StepOptions;
use drift_engine::models::shapes::{RandomWeights, ShapedRandom};
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};
use serde_json::Value;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions::from_env()).expect("a Vulkan device"))
}

/// The same device with f16 switched off: the f32 kernels and weights.
fn gpu_f32() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let o = GpuOptions {
            disable: Some("f16".into()),
            ..GpuOptions::from_env()
        };
        Gpu::new(&o).expect("a Vulkan device")
    })
}

fn fixture(name: &str) -> (HfFolder, Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm")
        .join(name);
    let folder = HfFolder::open(&dir).unwrap();
    let reference =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    (folder, reference)
}

fn session(gpu: &Gpu, name: &str) -> (LlmSession, Value) {
    session_ctx(gpu, name, 64)
}

fn session_ctx(gpu: &Gpu, name: &str, ctx: usize) -> (LlmSession, Value) {
    let (f, r) = fixture(name);
    let w = LlamaWeights::load(gpu, &f.config, &f.weights, QuantScheme::None).unwrap();
    let model = LlamaModel::new(gpu, f.config.clone(), w, ctx).unwrap();
    (
        LlmSession::new(gpu, model, f.tokenizer, f.template, f.eos).unwrap(),
        r,
    )
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(name: &str) {
    check_model_on(gpu_f32(), name);
    if gpu().caps.f16 {
        check_model_on(gpu(), name);
    }
}

fn check_model_on(gpu: &Gpu, name: &str) {
    let (mut s, r) = session(gpu, name);
    let prompt = ids(&r["prompt_ids"]);
    // Logits at every prompt position; the fixtures' logits have a standard deviation of ~12 (max ~50).
    // f32 path: 5e-4 absolute + 1e-4 relative (f32 accumulation over hidden sizes of 64-160).
    // f16 path: weights, activations and the KV cache rounded to f16 (and f32 fixture weights rounded
    // on upload): 0.25 absolute (2% of the spread) + 1% relative.
    let got = s.prompt_logits(gpu, &prompt).unwrap();
    let want: Vec<f64> = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    let (atol, rtol) = if gpu.caps.f16 {
        (0.25, 1e-2)
    } else {
        (5e-4, 1e-4)
    };
    let c = drift_engine::selftest::compare(
        format!("{name} logits (f16: {})", gpu.caps.f16),
        &got,
        &want,
        atol,
        rtol,
    );
    println!("{c}");
    assert!(c.passed, "{c}");
    // 32 greedy tokens identical to transformers.
    let opts = GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens: 32,
        stop: vec![],
    };
    let mut out = Vec::new();
    let g = s
        .generate(gpu, &prompt, &opts, &AtomicBool::new(false), &mut |t| {
            out.push(t.to_string())
        })
        .unwrap();
    let want_greedy = ids(&r["greedy"]);
    // EOS may stop the reference continuation early in ours: compare the common prefix, which must be
    // the whole reference unless an EOS id appears in it.
    let n = want_greedy
        .iter()
        .position(|t| s.eos.contains(t))
        .unwrap_or(want_greedy.len());
    assert_eq!(
        &g.tokens[..n.min(g.tokens.len())],
        &want_greedy[..n],
        "{name}: greedy tokens"
    );
    assert!(
        g.tokens.len() >= n,
        "{name}: stopped early ({:?})",
        g.stop_reason
    );
    assert_eq!(
        out.concat(),
        g.text,
        "{name}: streamed pieces concatenate to the text"
    );
    // Chat templates and tokenisation identical to transformers.
    for chat in r["chat"].as_array().unwrap() {
        let msgs: Vec<Message> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let text = s
            .template
            .as_ref()
            .unwrap()
            .render(&msgs, chat["add_generation_prompt"].as_bool().unwrap())
            .unwrap();
        assert_eq!(
            text,
            chat["text"].as_str().unwrap(),
            "{name}: chat template"
        );
    }
    for t in r["tokenize"].as_array().unwrap() {
        assert_eq!(
            s.tokenizer
                .encode(t["text"].as_str().unwrap(), false)
                .unwrap(),
            ids(&t["ids"]),
            "{name}: tokens of {}",
            t["text"]
        );
    }
}

#[test]
fn llama_gqa_matches_transformers() {
    check_model("llama-gqa");
}

#[test]
fn qwen2_with_biases_matches_transformers() {
    check_model("qwen2-bias");
}

#[test]
fn llama3_rope_scaling_tied_matches_transformers() {
    check_model("llama3-rope-tied");
}

#[test]
fn chat_session_reuses_the_cache_and_limits_hold() {
    let gpu = gpu();
    let (mut s, r) = session(gpu, "llama-gqa");
    let prompt = ids(&r["prompt_ids"]);
    let opts = GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens: 5,
        stop: vec![],
    };
    let cancel = AtomicBool::new(false);
    let a = s
        .generate(gpu, &prompt, &opts, &cancel, &mut |_| {})
        .unwrap();
    assert_eq!(a.stop_reason, StopReason::MaxTokens);
    // Continuing the same sequence reuses the cache and gives the same tokens as one long run.
    let mut longer = prompt.clone();
    longer.extend(&a.tokens);
    let b = s
        .generate(gpu, &longer, &opts, &cancel, &mut |_| {})
        .unwrap();
    let want = ids(&r["greedy"]);
    assert_eq!(
        [a.tokens.clone(), b.tokens.clone()].concat(),
        want[..10].to_vec()
    );
    // A prompt over the context is an error, not an out-of-bounds access.
    let too_long = vec![1u32; 65];
    let e = s
        .generate(gpu, &too_long, &opts, &cancel, &mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("context"), "{e}");
    // Cancel stops after the first token.
    let cancelled = AtomicBool::new(true);
    let c = s
        .generate(gpu, &prompt, &opts, &cancelled, &mut |_| {})
        .unwrap();
    assert_eq!((c.stop_reason, c.tokens.len()), (StopReason::Cancelled, 1));
    // Seeded sampling is reproducible.
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.0,
        repeat_penalty: 1.1,
        repeat_window: 16,
        seed: 42,
    };
    let sopts = GenerateOptions {
        sampling,
        max_tokens: 8,
        stop: vec![],
    };
    let x = s
        .generate(gpu, &prompt, &sopts, &cancel, &mut |_| {})
        .unwrap();
    let y = s
        .generate(gpu, &prompt, &sopts, &cancel, &mut |_| {})
        .unwrap();
    assert_eq!(x.tokens, y.tokens);
}

/// Greedy decode keeps several steps in flight ahead of the token it reads: at the end of the context
/// and at the token limit none of them may write past the cache or change a token, and a conversation
/// continued after a stop reuses only rows that hold its tokens.
#[test]
fn pipelined_decode_stops_cleanly_at_the_context_and_the_limit() {
    let gpu = gpu();
    let (_, r) = fixture("llama-gqa");
    let prompt = ids(&r["prompt_ids"]);
    let want = ids(&r["greedy"]);
    let cancel = AtomicBool::new(false);
    let greedy = |max_tokens| GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens,
        stop: vec![],
    };
    // Room for 7 generated tokens: the 7th has no row, so generation ends there.
    let ctx = prompt.len() + 6;
    let (mut s, _) = session_ctx(gpu, "llama-gqa", ctx);
    let full = s
        .generate(gpu, &prompt, &greedy(32), &cancel, &mut |_| {})
        .unwrap();
    assert_eq!(full.stop_reason, StopReason::ContextFull);
    assert_eq!(full.tokens, want[..7].to_vec());
    assert!(s.cached.len() <= ctx);
    // Limits of 1..=4 tokens (under, at and past the pipeline's depth) each give the reference's
    // prefix, and the conversation continued from each matches the reference's continuation.
    let (mut s, _) = session(gpu, "llama-gqa");
    for n in 1..=4 {
        s.reset();
        let a = s
            .generate(gpu, &prompt, &greedy(n), &cancel, &mut |_| {})
            .unwrap();
        assert_eq!(a.tokens, want[..n].to_vec(), "limit {n}");
        let mut longer = prompt.clone();
        longer.extend(&a.tokens);
        let b = s
            .generate(gpu, &longer, &greedy(3), &cancel, &mut |_| {})
            .unwrap();
        assert_eq!(b.tokens, want[n..n + 3].to_vec(), "continued after {n}");
    }
}

/// A copy of a fixture folder in a fresh temp dir.
fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm")
        .join(name);
    let dst = std::env::temp_dir().join(format!("drift-{tag}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

#[test]
fn sharded_safetensors_with_an_index_load_like_one_file() {
    use drift_engine::models::load::open_llm;
    let gpu = gpu_f32();
    let dir = copy_fixture("llama-gqa", "sharded");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (i, part) in [a, b].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for n in part.iter() {
            map.insert(n.clone(), file.clone().into());
        }
    }
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let (_, r) = fixture("llama-gqa");
    let prompt = ids(&r["prompt_ids"]);
    let mut sharded = open_llm(gpu, &dir, Some(32), QuantScheme::None).unwrap();
    let (mut single, _) = session(gpu, "llama-gqa");
    assert_eq!(
        sharded.prompt_logits(gpu, &prompt).unwrap(),
        single.prompt_logits(gpu, &prompt).unwrap()
    );

    // A missing shard and a truncated shard are clear errors.
    std::fs::copy(
        dir.join("model-00002-of-00002.safetensors"),
        dir.join("keep"),
    )
    .unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let e = open_llm(gpu, &dir, Some(32), QuantScheme::None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing"), "{e}");
    let full = std::fs::read(dir.join("keep")).unwrap();
    std::fs::write(
        dir.join("model-00002-of-00002.safetensors"),
        &full[..full.len() - 100],
    )
    .unwrap();
    let e = open_llm(gpu, &dir, Some(32), QuantScheme::None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("truncated") || e.contains("valid"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_architectures_and_pickles_are_refused_clearly() {
    use drift_engine::models::load::open_llm;
    let gpu = gpu_f32();
    let dir = copy_fixture("llama-gqa", "arch");
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("LlamaForCausalLM", "FalconForCausalLM");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = open_llm(gpu, &dir, None, QuantScheme::None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("FalconForCausalLM"), "{e}");
    let e = open_llm(gpu, &dir.join("pytorch_model.bin"), None, QuantScheme::None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("pickle"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decode with the one-pass attention (one workgroup per query row) gives the split attention's
/// logits, one dispatch fewer per layer; the model switches to the chunked one-pass program (each
/// row's keys over several workgroups, still one dispatch) once the KV length passes the limit.
#[test]
fn one_pass_decode_attention_matches_split() {
    for gpu in [gpu_f32(), gpu()] {
        let (f, r) = fixture("llama-gqa");
        if !drift_engine::kernels::attention_row::row_available(&gpu.caps, f.config.head_dim) {
            continue;
        }
        let w = LlamaWeights::load(gpu, &f.config, &f.weights, QuantScheme::None).unwrap();
        let mut m = LlamaModel::new(gpu, f.config.clone(), w, 64).unwrap();
        let prompt = ids(&r["prompt_ids"]);
        let t = prompt.len();
        m.write_ids(gpu, &prompt).unwrap();
        m.set_step(gpu, t, 0).unwrap();
        m.build_prefill(gpu, t, false).unwrap().0.run(gpu).unwrap();
        let rows = |m: &LlamaModel, kv_len: usize, what: &str| {
            m.decode_program(kv_len)
                .dispatches
                .iter()
                .filter(|d| d.name.contains(what))
                .count()
        };
        let mut step = |row_max: usize| {
            m.set_row_attention_max_kv(gpu, row_max).unwrap();
            m.write_ids(gpu, &[prompt[1]]).unwrap();
            m.set_step(gpu, t + 1, t).unwrap();
            m.decode_program(t + 1).run(gpu).unwrap();
            let n = m.cfg.n_layers;
            let (row, merge) = (
                rows(&m, t + 1, "attention_decode_row"),
                rows(&m, t + 1, "attention_decode_merge"),
            );
            let chunked = rows(&m, t + 1, "attention_decode_row") == rows(&m, t + 1, "_ch");
            (
                gpu.read_f32(&m.logits).unwrap(),
                row == n && merge == 0,
                row == 0 && merge == n,
                chunked,
            )
        };
        let (split, _, split_ok, _) = step(0);
        assert!(split_ok, "the split program: a merge per layer");
        let (one_pass, row_ok, _, one_chunked) = step(t + 1);
        assert!(row_ok && !one_chunked, "the one-pass program: no merge");
        // Past the limit the same model serves the chunked one-pass program.
        let (past, past_row, _, past_chunked) = step(t);
        assert!(
            past_row && past_chunked,
            "past the one-pass limit: the chunked program"
        );
        // All sum the same products in different orders (f32 accumulation): ~1e-6 relative.
        let want: Vec<f64> = split.iter().map(|&v| v as f64).collect();
        for (what, got) in [("one-pass", &one_pass), ("chunked one-pass", &past)] {
            let c = drift_engine::selftest::compare(
                format!("{what} vs split decode attention (f16: {})", gpu.caps.f16),
                got,
                &want,
                if gpu.caps.f16 { 2e-2 } else { 1e-4 },
                if gpu.caps.f16 { 2e-3 } else { 1e-5 },
            );
            assert!(c.passed, "{c}");
        }
    }
}

/// The fused decode step (norms, SwiGLU and residual adds inside the matrix-vector products, the QKV
/// split and RoPE in the QKV product's epilogue) gives the unfused step's logits, with 4 dispatches
/// fewer per layer (and no first norm).
#[test]
fn fused_decode_matches_unfused() {
    for gpu in [gpu_f32(), gpu()] {
        let (f, r) = fixture("llama-gqa");
        let w = LlamaWeights::load(gpu, &f.config, &f.weights, QuantScheme::None).unwrap();
        let mut m = LlamaModel::new(gpu, f.config.clone(), w, 64).unwrap();
        let prompt = ids(&r["prompt_ids"]);
        let t = prompt.len();
        // Fill the KV cache with the prompt, then decode one more token at position t.
        m.write_ids(gpu, &prompt).unwrap();
        m.set_step(gpu, t, 0).unwrap();
        m.build_prefill(gpu, t, false).unwrap().0.run(gpu).unwrap();
        let step = |m: &mut LlamaModel, fused: bool| {
            m.set_decode_fusion(gpu, fused).unwrap();
            assert_eq!(m.decode_fused(), fused);
            m.write_ids(gpu, &[prompt[1]]).unwrap();
            m.set_step(gpu, t + 1, t).unwrap();
            m.decode_program(t + 1).run(gpu).unwrap();
            (
                gpu.read_f32(&m.logits).unwrap(),
                m.decode_program(t + 1).len(),
            )
        };
        let (fused, n_fused) = step(&mut m, true);
        // Float weights: the gate-up product ends in the GLU epilogue and the QKV product in the RoPE
        // epilogue, once per layer each.
        let count = |m: &LlamaModel, what: &str| {
            m.decode_program(t + 1)
                .dispatches
                .iter()
                .filter(|d| d.name.contains(what))
                .count()
        };
        assert_eq!(count(&m, "_glu"), m.cfg.n_layers, "GLU epilogues");
        assert_eq!(count(&m, "_rope"), m.cfg.n_layers, "RoPE epilogues");
        assert_eq!(count(&m, "qkv_rope"), 0, "split dispatches");
        let (unfused, n_unfused) = step(&mut m, false);
        assert_eq!(n_unfused - n_fused, 4 * m.cfg.n_layers + 1, "dispatches");
        // f32: only rounding differs (the product of the normed input vs the normed product), ~1e-6
        // relative. f16: the unfused step rounds the normed input and the gate-up output to f16, the
        // fused one keeps them in f32 (rounding only the GLU's output): ~1e-3 relative per value.
        let (atol, rtol) = if gpu.caps.f16 {
            (0.05, 5e-3)
        } else {
            (2e-4, 1e-5)
        };
        assert_close(
            format!("fused vs unfused decode logits (f16: {})", gpu.caps.f16),
            &fused,
            &unfused,
            atol,
            rtol,
        );
    }
}

/// `got` against `want` (f32 results, compared in f64) within `atol` + `rtol` |want|; prints the
/// comparison.
fn assert_close(name: impl Into<String>, got: &[f32], want: &[f32], atol: f64, rtol: f64) {
    let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    let c = drift_engine::selftest::compare(name, got, &want, atol, rtol);
    println!("{c}");
    assert!(c.passed, "{c}");
}

/// Fills the KV cache with `prompt` (prefill).
fn prefill_prompt(gpu: &Gpu, m: &LlamaModel, prompt: &[u32]) {
    let t = prompt.len();
    m.write_ids(gpu, prompt).unwrap();
    m.set_step(gpu, t, 0).unwrap();
    m.build_prefill(gpu, t, false).unwrap().0.run(gpu).unwrap();
}

/// One decode step of token `id` at position `t` (the logits poisoned first): the logits and the
/// names of the program's kernels.
fn decode_at(gpu: &Gpu, m: &LlamaModel, id: u32, t: usize) -> (Vec<f32>, Vec<String>) {
    m.write_ids(gpu, &[id]).unwrap();
    m.set_step(gpu, t + 1, t).unwrap();
    gpu.poison(&m.logits).unwrap();
    let p = m.decode_program(t + 1);
    p.run(gpu).unwrap();
    let names = p.dispatches.iter().map(|d| d.name.clone()).collect();
    (gpu.read_f32(&m.logits).unwrap(), names)
}

/// Kernel names: `_dp4a_xq` reads x's blocks (`_dp4a_xq_xqo` also writes them).
fn reads_xq(name: &str) -> bool {
    name.contains("_dp4a_xq") && !name.contains("_dp4a_xqo")
}

fn count(names: &[String], pick: impl Fn(&str) -> bool) -> usize {
    names.iter().filter(|n| pick(n)).count()
}

/// Quantized weights: the fused decode step reads x quantized by its producers (O, gate-up and
/// down write it; QKV past the first layer, gate-up, down and the LM head read it with no pre-pass)
/// and gives the unfused step's logits, where every product quantizes its own input.
#[test]
fn quantized_fused_decode_reads_producer_quantized_x() {
    let gpu = gpu();
    for scheme in [QuantScheme::Q4_0, QuantScheme::Q8_0] {
        let (f, r) = fixture("llama-gqa");
        let w = LlamaWeights::load(gpu, &f.config, &f.weights, scheme).unwrap();
        let mut m = LlamaModel::new(gpu, f.config.clone(), w, 64).unwrap();
        let prompt = ids(&r["prompt_ids"]);
        let t = prompt.len();
        prefill_prompt(gpu, &m, &prompt);
        m.set_decode_fusion(gpu, true).unwrap();
        let (fused, names) = decode_at(gpu, &m, prompt[1], t);
        let layers = m.cfg.n_layers;
        // Readers: QKV of layers 1.., gate-up and down of every layer, the LM head.
        assert_eq!(count(&names, reads_xq), 3 * layers, "{scheme:?} readers");
        // Writers: O, gate-up and down of every layer.
        assert_eq!(
            count(&names, |n| n.contains("_xqo")),
            3 * layers,
            "{scheme:?} writers"
        );
        m.set_decode_fusion(gpu, false).unwrap();
        let (unfused, names) = decode_at(gpu, &m, prompt[1], t);
        assert_eq!(
            count(&names, |n| n.contains("_xq")),
            0,
            "{scheme:?} unfused"
        );
        // Both quantize x to two int8 terms per block of 32 (~15 bits) and accumulate in f32; the
        // unfused step also rounds the normed input and the GLU output to f16 (~1e-3 relative).
        let (atol, rtol) = if gpu.caps.f16 {
            (0.05, 5e-3)
        } else {
            (2e-3, 1e-4)
        };
        assert_close(
            format!("{scheme:?} fused (producer-quantized x) vs unfused decode logits"),
            &fused,
            &unfused,
            atol,
            rtol,
        );
    }
}

/// The decode attention quantizing its output for the O product (`set_attention_xq`): at head dim
/// 128 (4 workgroups per attention row) every layer's attention writes x's blocks and its O reads
/// them, and the logits are those of O quantizing the same output itself.
#[test]
fn attention_quantized_x_feeds_the_o_product() {
    let gpu = gpu();
    let cfg = LlmConfig::from_json(
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":512,
        "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":128,
        "vocab_size":320,"rms_norm_eps":1e-5,"rope_theta":10000,"max_position_embeddings":256,
        "tie_word_embeddings":false}"#,
    )
    .unwrap();
    let src = ShapedRandom {
        cfg: &cfg,
        rng: RandomWeights { seed: 7 },
    };
    let w = LlamaWeights::load(gpu, &cfg, &src, QuantScheme::Q4_0).unwrap();
    let mut m = LlamaModel::new(gpu, cfg.clone(), w, 64).unwrap();
    assert!(m.decode_fused(), "the fused decode runs on this device");
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 % 320) as u32).collect();
    let t = prompt.len();
    prefill_prompt(gpu, &m, &prompt);
    m.set_attention_xq(gpu, true).unwrap();
    let (on, names_on) = decode_at(gpu, &m, prompt[1], t);
    m.set_attention_xq(gpu, false).unwrap();
    let (off, names_off) = decode_at(gpu, &m, prompt[1], t);
    let attention_writes = |n: &str| n.starts_with("attention_decode_row") && n.ends_with("_xqo");
    let layers = cfg.n_layers;
    assert_eq!(count(&names_on, attention_writes), layers, "{names_on:?}");
    assert_eq!(count(&names_off, attention_writes), 0, "{names_off:?}");
    // O reads x's blocks as well as QKV past the first layer, gate-up, down and the LM head.
    assert_eq!(count(&names_on, reads_xq), 4 * layers);
    assert_eq!(count(&names_off, reads_xq), 3 * layers);
    // The same int8 terms either way (same scale, same rounding); only the blocks' f32 sums are
    // added in another order: ~1e-7 relative.
    let want: Vec<f64> = off.iter().map(|&v| v as f64).collect();
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0);
    let c = drift_engine::selftest::compare(
        "logits, O reading the attention's quantized output vs quantizing it itself",
        &on,
        &want,
        1e-4 * scale,
        1e-4,
    );
    println!("{c}");
    assert!(c.passed, "{c}");
}

/// The one-dispatch decode step (grid barriers between the phases) against the multi-dispatch
/// program, on grids of one, two and 132 workgroups (one always runs; wider grids where the device
/// runs them concurrently, as a GPU does and lavapipe at times; where it does not, the model falls
/// back and the test says so): the same greedy tokens over
/// a whole generation, and the same logits after the prompt, for every fixture (GQA, q/k/v biases,
/// llama3 rope scaling with tied embeddings).
#[test]
fn one_dispatch_decode_step_matches_the_program() {
    let gpu = gpu();
    if !gpu.caps.f16 {
        return;
    }
    for name in ["llama-gqa", "qwen2-bias", "llama3-rope-tied"] {
        let (_, r) = fixture(name);
        let prompt = ids(&r["prompt_ids"]);
        let run = |step: Option<StepOptions>| {
            let (f, _) = fixture(name);
            let w = LlamaWeights::load(gpu, &f.config, &f.weights, QuantScheme::None).unwrap();
            let m = LlamaModel::with_decode_step(gpu, f.config.clone(), w, 64, step).unwrap();
            let on = m.decode_step().is_some();
            let mut s = LlmSession::new(gpu, m, f.tokenizer, None, vec![]).unwrap();
            let opts = GenerateOptions {
                sampling: SamplingParams::greedy(),
                max_tokens: 24,
                stop: vec![],
            };
            // A grid barrier that gave up (the grid did not stay concurrent) makes the reply an
            // error that says so; its tokens are not compared.
            match s.generate(gpu, &prompt, &opts, &AtomicBool::new(false), &mut |_| {}) {
                Ok(g) => (g.tokens, on, false),
                Err(e) => {
                    assert!(
                        on && e.to_string().contains("stopped running"),
                        "{name}: {e}"
                    );
                    assert!(
                        s.model.decode_step().is_none(),
                        "{name}: the step is dropped"
                    );
                    (Vec::new(), on, true)
                }
            }
        };
        let (want, on, _) = run(None);
        assert!(!on, "{name}: the step is off when not asked for");
        // Attention in one workgroup per head (the fixtures' contexts) and dealt over many teams;
        // the weights in one binding, or from layer 1 on (with the LM head and embedding table) in a
        // second.
        for (n_wg, whole_max, weight_split) in [
            (1u32, 1024u32, None),
            (1, 0, None),
            (2, 1024, None),
            (2, 0, None),
            (132, 1024, None),
            (132, 0, None),
            (1, 0, Some(1)),
            (2, 0, Some(1)),
            (132, 0, Some(1)),
        ] {
            let (got, on, timed_out) = run(Some(StepOptions {
                workgroups: n_wg,
                whole_max,
                weight_split,
                max_weight_bytes: None,
            }));
            if !on || timed_out {
                assert!(n_wg > 1, "{name}: one workgroup always runs the step");
                eprintln!("{name}: {n_wg} workgroups did not run concurrently here: skipped");
                continue;
            }
            assert_eq!(
                got, want,
                "{name}: greedy tokens with {n_wg} workgroups (whole up to {whole_max}, second weight binding from layer {weight_split:?})"
            );
        }
    }
}

/// The step on a model narrower than a subgroup's loads (hidden 32: 4 chunks of 8 for 8 lanes, so some
/// lanes of every row product are idle; intermediate 40: 5 chunks), random weights, logits of several
/// decode steps against the multi-dispatch program's. Idle lanes adding a clamped chunk again once made
/// the step wrong on subgroups of 32 while the 64-wide fixtures passed on lavapipe's subgroups of 8.
#[test]
fn one_dispatch_decode_step_on_rows_narrower_than_a_subgroup() {
    use drift_engine::models::config::LlmConfig;
    use drift_engine::models::shapes::{RandomWeights, ShapedRandom};
    let gpu = gpu();
    if !gpu.caps.f16 {
        return;
    }
    let cfg = LlmConfig::from_json(
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":32,"intermediate_size":40,"num_hidden_layers":2,
        "num_attention_heads":2,"num_key_value_heads":1,"vocab_size":96,"rms_norm_eps":1e-5,"rope_theta":10000,
        "max_position_embeddings":64,"tie_word_embeddings":false}"#,
    )
    .unwrap();
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 % 96) as u32).collect();
    let next = [5u32, 61, 17, 90];
    let logits = |step: Option<StepOptions>| {
        let src = ShapedRandom {
            cfg: &cfg,
            rng: RandomWeights { seed: 7 },
        };
        let w = LlamaWeights::load(gpu, &cfg, &src, QuantScheme::None).unwrap();
        let m = LlamaModel::with_decode_step(gpu, cfg.clone(), w, 32, step).unwrap();
        let t = prompt.len();
        m.write_ids(gpu, &prompt).unwrap();
        m.set_step(gpu, t, 0).unwrap();
        m.build_prefill(gpu, t, false).unwrap().0.run(gpu).unwrap();
        let mut out = Vec::new();
        for (i, &id) in next.iter().enumerate() {
            m.write_ids(gpu, &[id]).unwrap();
            m.set_step(gpu, t + i + 1, t + i).unwrap();
            gpu.poison(&m.logits).unwrap();
            m.decode_program(t + i + 1).run(gpu).unwrap();
            out.push(gpu.read_f32(&m.logits).unwrap());
        }
        (out, m.decode_step().is_some())
    };
    let (want, off) = logits(None);
    assert!(!off);
    for (whole_max, weight_split) in [(1024u32, None), (0, None), (0, Some(1))] {
        let (got, on) = logits(Some(StepOptions {
            workgroups: 1,
            whole_max,
            weight_split,
            max_weight_bytes: None,
        }));
        assert!(on, "one workgroup always runs the step");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // The program rounds q, the attention output and the SwiGLU output to f16, the step keeps
            // them in f32: seen 1e-4 of the logits' largest magnitude; allowed 2e-3.
            let spread = w.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
            assert_close(
                format!("step {i} logits, whole up to {whole_max}"),
                g,
                w,
                2e-3 * spread,
                2e-3,
            );
        }
    }
    // A model over the size limit keeps the multi-dispatch program.
    let (_, on) = logits(Some(StepOptions {
        workgroups: 1,
        whole_max: 0,
        weight_split: None,
        max_weight_bytes: Some(1024),
    }));
    assert!(!on, "no step for weights over the limit");
}
