//! The real model end to end: SmolLM2-135M-Instruct Q4_1 (GGUF, 98 MB, fetched by .ci/run, never
//! committed) answers "What is the capital of France?" as transformers does, with its top-10 logits at
//! the last prompt position close to transformers' (computed from the dequantised GGUF).

#[path = "support/smollm2.rs"]
mod smollm2;

use std::sync::atomic::AtomicBool;

use drift_engine::generate::GenerateOptions;
use drift_engine::models::llama::QuantScheme;
use drift_engine::models::load::open_llm;
use drift_engine::sampling::SamplingParams;
use drift_engine::tokenize::chat_template::Message;
use drift_engine::{Gpu, GpuOptions};
use serde_json::Value;

fn reference() -> Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2/reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn smollm2_answers_paris_like_transformers() {
    let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
    let r = reference();
    let mut s = open_llm(&gpu, &smollm2::smollm2_path(), Some(256), QuantScheme::None).unwrap();
    // The chat template and tokenizer from the GGUF give transformers' prompt ids.
    let text = s
        .render(&[Message::new("user", "What is the capital of France?")])
        .unwrap();
    assert_eq!(text, r["prompt"].as_str().unwrap());
    let prompt = s.tokenizer.encode(&text, false).unwrap();
    assert_eq!(prompt, ids(&r["prompt_ids"]));

    // Logits at the last prompt position: the same top-10 ids, values within 0.35 (the fixture's logits
    // span ~10 units between ranks 1 and 10; prefill dequantises Q4_1 to f16 and runs f16 activations).
    let logits = s.prompt_logits(&gpu, &prompt).unwrap();
    let vocab = logits.len() / prompt.len();
    let last = &logits[(prompt.len() - 1) * vocab..];
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let want_ids = ids(&r["top10_ids"]);
    let want_vals: Vec<f64> = r["top10_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (i, (&id, &v)) in want_ids.iter().zip(&want_vals).enumerate() {
        let got = last[id as usize] as f64;
        assert!(
            (got - v).abs() < 0.35,
            "rank {i} token {id}: {got} vs transformers {v}"
        );
    }
    assert_eq!(order[0] as u32, want_ids[0], "top-1 token");
    let top5: Vec<u32> = order[..5].iter().map(|&i| i as u32).collect();
    assert_eq!(top5, want_ids[..5].to_vec(), "top-5 order");

    // Greedy: the first 16 tokens identical to transformers, and the answer names Paris.
    let opts = GenerateOptions {
        sampling: SamplingParams::greedy(),
        max_tokens: 16,
        stop: vec![],
    };
    let g = s
        .generate(&gpu, &prompt, &opts, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    let want = ids(&r["greedy16"]);
    let n = want
        .iter()
        .position(|t| s.eos.contains(t))
        .unwrap_or(want.len());
    assert_eq!(g.tokens, want[..n].to_vec(), "greedy tokens: {:?}", g.text);
    assert!(g.text.contains("Paris"), "{}", g.text);

    // Those decode steps ran the Q4_1 products on the integer-dot-product kernel with the paired-row
    // epilogues where the device has subgroups: QKV + RoPE and gate-up + GLU in every layer.
    if gpu.caps.subgroup {
        let names: Vec<&str> = s
            .model
            .decode_program(prompt.len() + 1)
            .dispatches
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        let count = |what: &str| names.iter().filter(|n| n.contains(what)).count();
        let layers = s.model.cfg.n_layers;
        assert_eq!(count("_rope_sg_dp4a"), layers, "{names:?}");
        assert_eq!(count("_glu_sg_dp4a"), layers, "{names:?}");
        assert_eq!(count("qkv_rope"), 0, "{names:?}");
    }
}
