//! CLIP tokenizer and text encoder against transformers (fixtures from
//! tests/fixtures/make_clip_fixtures.py): token ids of tricky prompts with the real vocabulary
//! (`bpe_simple_vocab_16e6.txt.gz`) and with a small diffusers tokenizer folder; last_hidden_state and
//! clip-skip outputs of tiny random CLIPTextModels on the f32 and f16 paths.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use drift_engine::formats::safetensors::SafetensorsSet;
use drift_engine::models::clip::{ClipRunOptions, ClipTextConfig, ClipTextModel};
use drift_engine::tokenize::clip::{CLIP_MAX_LEN, ClipTokenizer};
use drift_engine::{DType, Gpu, GpuOptions};
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

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clip")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// OpenAI's vocabulary: `$DRIFT_CLIP_VOCAB`, else ~/.cache/drift/clip/bpe_simple_vocab_16e6.txt.gz
/// (where .ci/run puts it). Panics with instructions when absent.
fn vocab_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DRIFT_CLIP_VOCAB") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let p = home.join(".cache/drift/clip/bpe_simple_vocab_16e6.txt.gz");
    assert!(
        p.is_file(),
        "the CLIP vocabulary is missing: set DRIFT_CLIP_VOCAB or run\n  \
         pip download --no-deps open_clip_torch -d /tmp/oc && mkdir -p ~/.cache/drift/clip && \
         unzip -p /tmp/oc/open_clip_torch-*.whl open_clip/bpe_simple_vocab_16e6.txt.gz \
         > ~/.cache/drift/clip/bpe_simple_vocab_16e6.txt.gz"
    );
    p
}

fn real_tokenizer() -> &'static ClipTokenizer {
    static TOK: OnceLock<ClipTokenizer> = OnceLock::new();
    TOK.get_or_init(|| ClipTokenizer::from_bpe_file(&vocab_path()).unwrap())
}

fn check_prompts(tok: &ClipTokenizer, reference: &Value) {
    assert_eq!(tok.pad as u64, reference["pad_id"].as_u64().unwrap());
    let mut failures = Vec::new();
    for p in reference["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["ids"]);
        let enc = tok.encode(text).unwrap();
        assert_eq!(enc.ids.len(), CLIP_MAX_LEN);
        if enc.ids != want {
            failures.push(format!("{text:?}\n  got  {:?}\n  want {want:?}", enc.ids));
        }
        let truncated = p["truncated"].as_bool().unwrap();
        assert_eq!(
            enc.truncated.is_some(),
            truncated,
            "{text:?}: truncation flag"
        );
        assert_eq!(enc.warning(tok.max_len).is_some(), truncated);
        let full = p["untruncated_len"].as_u64().unwrap() as usize;
        assert_eq!(
            tok.tokens(text).unwrap().len() + 2,
            full,
            "{text:?}: untruncated length"
        );
        assert_eq!(enc.len, full.min(CLIP_MAX_LEN), "{text:?}: unpadded length");
    }
    assert!(
        failures.is_empty(),
        "{} prompts differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_matches_transformers_with_the_real_vocabulary() {
    let tok = real_tokenizer();
    assert_eq!((tok.bos, tok.eos, tok.pad), (49406, 49407, 49407));
    assert_eq!(tok.inner.get_vocab_size(true), 49408);
    check_prompts(tok, &json(&fixtures().join("tokenizer_reference.json")));
}

#[test]
fn tokenizer_truncation_warning_names_the_dropped_words() {
    let tok = real_tokenizer();
    let text = format!("{} zebra giraffe", ["cat"; 74].join(" "));
    let enc = tok.encode(&text).unwrap();
    assert_eq!(enc.ids[76], tok.eos);
    assert_eq!(enc.truncated.as_deref(), Some("giraffe"));
    let w = enc.warning(77).unwrap();
    assert!(w.contains("77 tokens") && w.ends_with("giraffe"), "{w}");
    assert_eq!(tok.decode(&enc.ids[1..4]).unwrap(), "cat cat cat");
    let batch = tok.encode_batch(&["a cat", ""]).unwrap();
    assert_eq!(batch[1].ids[..3], [tok.bos, tok.eos, tok.pad]);
}

#[test]
fn tokenizer_folder_matches_transformers() {
    let dir = fixtures().join("tokenizer");
    let tok = ClipTokenizer::from_folder(&dir).unwrap();
    assert_eq!((tok.bos, tok.eos, tok.pad, tok.max_len), (998, 999, 0, 77));
    check_prompts(&tok, &json(&dir.join("reference.json")));
}

#[test]
fn tokenizer_errors_are_clear() {
    let e = ClipTokenizer::from_folder(Path::new("/nonexistent/tokenizer"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("vocab.json"), "{e}");
    let e = ClipTokenizer::from_bpe_text("header only\n").err().unwrap();
    assert!(e.to_string().contains("no merges"), "{e}");
    let dir = std::env::temp_dir().join(format!("drift-clip-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("vocab.gz"),
        [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 7, 7, 7],
    )
    .unwrap();
    let e = ClipTokenizer::from_bpe_file(&dir.join("vocab.gz"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("vocab.gz"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Max |got - want| over max |want| (one scale for the whole tensor: hidden states after a layer norm
/// are O(1) everywhere, so this is a relative error that small entries cannot inflate).
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, &w| m.max((w as f64).abs()));
    let err = got.iter().zip(want).fold(0f64, |m, (&g, &w)| {
        // NaN (a poisoned element left unwritten) must fail.
        if g.is_nan() {
            f64::INFINITY
        } else {
            m.max((g as f64 - w as f64).abs())
        }
    });
    err / scale
}

/// Runs the fixture model `name` on `gpu` with weights in `dtype` against every stored reference.
fn check_model(gpu: &Gpu, name: &str, dtype: Option<DType>, out_dtype: Option<DType>, tol: f64) {
    let dir = fixtures().join(name);
    let model = ClipTextModel::load(gpu, &dir, dtype).unwrap();
    let reference = json(&dir.join("reference.json"));
    let prompts: Vec<Vec<u32>> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let refs = SafetensorsSet::open(&dir.join("reference.safetensors")).unwrap();
    for (key, skip) in [
        ("last_hidden_state", 0),
        ("clip_skip_1", 1),
        ("clip_skip_2", 2),
    ] {
        let want = refs.get(key).unwrap();
        assert_eq!(want.shape, [2, 77, model.cfg.hidden]);
        let opts = ClipRunOptions {
            clip_skip: skip,
            out_dtype,
            ..Default::default()
        };
        let prog = model.build(gpu, 2, &opts).unwrap();
        gpu.poison(&prog.output).unwrap();
        let got = prog.run_f32(gpu, &prompts).unwrap();
        let err = rel_err(&got, &want.to_f32().unwrap());
        println!(
            "{name} {:?} -> {:?} {key}: max error / max |ref| = {err:.2e} (tolerance {tol:.0e})",
            model.dtype, prog.output.dtype
        );
        assert!(
            err <= tol,
            "{name} {:?} {key}: relative error {err:.3e} over {tol:.0e}",
            model.dtype
        );
        // A second batch through the same program (CFG reuse): swapped prompts give swapped rows.
        if skip == 0 {
            let swapped = [prompts[1].clone(), prompts[0].clone()];
            let again = prog.run_f32(gpu, &swapped).unwrap();
            let n = got.len() / 2;
            assert_eq!(again[..n], got[n..]);
            assert_eq!(again[n..], got[..n]);
        }
    }
}

#[test]
fn text_encoder_matches_transformers_f32() {
    check_model(gpu_f32(), "text_encoder", None, None, 1e-5);
    check_model(gpu_f32(), "text_encoder_gelu", None, None, 1e-5);
}

#[test]
fn text_encoder_matches_transformers_f16() {
    let gpu = gpu();
    if !gpu.caps.f16 {
        eprintln!("no shader-f16 on this device: f16 path not tested");
        return;
    }
    // f16 weights (the first fixture is stored f16, exactly), f16 matmul inputs, attention and MLP
    // activations; f32 residual stream and statistics.
    check_model(gpu, "text_encoder", None, Some(DType::F32), 3e-3);
    check_model(gpu, "text_encoder", None, None, 3e-3);
    check_model(gpu, "text_encoder_gelu", None, Some(DType::F32), 3e-3);
    // f32 weights on an f16-capable device.
    check_model(
        gpu,
        "text_encoder_gelu",
        Some(DType::F32),
        Some(DType::F32),
        1e-4,
    );
}

#[test]
fn tokenizer_folder_and_text_encoder_end_to_end() {
    let tok = ClipTokenizer::from_folder(&fixtures().join("tokenizer")).unwrap();
    for name in ["text_encoder", "text_encoder_gelu"] {
        let r = json(&fixtures().join(name).join("reference.json"));
        for (p, want) in r["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .zip(r["ids"].as_array().unwrap())
        {
            assert_eq!(tok.encode(p.as_str().unwrap()).unwrap().ids, ids(want));
        }
    }
}

#[test]
fn text_encoder_config_and_errors() {
    let cfg = ClipTextConfig::from_json(
        &std::fs::read_to_string(fixtures().join("text_encoder/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            cfg.hidden,
            cfg.layers,
            cfg.heads,
            cfg.intermediate,
            cfg.vocab_size
        ),
        (64, 3, 4, 100, 1000)
    );
    assert!(ClipTextConfig::from_json(r#"{"hidden_act": "relu"}"#).is_err());
    assert_eq!(
        ClipTextConfig::from_json("{}").unwrap(),
        ClipTextConfig::sd15()
    );
    let gpu = gpu_f32();
    let model = ClipTextModel::load(gpu, &fixtures().join("text_encoder"), None).unwrap();
    assert_eq!(model.dtype, DType::F32);
    assert!(
        model
            .build(
                gpu,
                2,
                &ClipRunOptions {
                    clip_skip: 4,
                    ..Default::default()
                }
            )
            .is_err()
    );
    assert!(
        model
            .build(
                gpu,
                1,
                &ClipRunOptions {
                    seq_len: Some(78),
                    ..Default::default()
                }
            )
            .is_err()
    );
    let prog = model.build(gpu, 2, &ClipRunOptions::default()).unwrap();
    let e = prog.run(gpu, &[vec![0u32; 77]]).err().unwrap();
    assert!(e.to_string().contains("1 prompts"), "{e}");
    let e = prog
        .run(gpu, &[vec![0u32; 77], vec![0u32; 76]])
        .err()
        .unwrap();
    assert!(e.to_string().contains("76 ids"), "{e}");
    // A config that does not match the weights.
    let dir = std::env::temp_dir().join(format!("drift-clip-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixtures().join("text_encoder/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"hidden_size": 32, "num_attention_heads": 4, "vocab_size": 1000}"#,
    )
    .unwrap();
    let e = ClipTextModel::load(gpu, &dir, None).err().unwrap();
    assert!(e.to_string().contains("config implies"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn random_weights_run_and_stay_finite() {
    let gpu = gpu();
    let cfg = ClipTextConfig {
        vocab_size: 300,
        hidden: 48,
        intermediate: 72,
        layers: 2,
        heads: 3,
        ..ClipTextConfig::sd15()
    };
    let model = ClipTextModel::random(gpu, cfg, None, 7).unwrap();
    let prog = model.build(gpu, 2, &ClipRunOptions::default()).unwrap();
    assert!(prog.program.cost().flops > 0.0);
    let ids: Vec<Vec<u32>> = (0..2)
        .map(|b| (0..77).map(|i| (i * 7 + b) % 300).collect())
        .collect();
    let out = prog.run_f32(gpu, &ids).unwrap();
    assert!(out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v.abs() > 0.1));
    // Same seed, same weights; and the two prompts differ.
    let again = ClipTextModel::random(gpu, model.cfg.clone(), None, 7).unwrap();
    assert_eq!(
        again
            .build(gpu, 2, &ClipRunOptions::default())
            .unwrap()
            .run_f32(gpu, &ids)
            .unwrap(),
        out
    );
    assert_ne!(out[..out.len() / 2], out[out.len() / 2..]);
}
