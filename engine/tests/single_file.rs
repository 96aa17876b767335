//! Single-file SD 1.x checkpoints (LDM key names) against diffusers, from the fixture of
//! tests/fixtures/make_single_file_fixtures.py: a tiny random SD 1.x pipeline with SD 1.x's silent
//! conventions (8 UNet heads, 32 norm groups, CLIP heads of 64, quick_gelu), the full CLIP
//! vocabulary, UNet fp16 / VAE fp32 / CLIP bf16, EMA and schedule keys to ignore. diffusers'
//! `from_single_file` made the reference image from the same file (f64). The same weights laid out
//! as a diffusers folder (with the script's own name table, not Drift's mapping) must give the
//! same image through the folder path. Also: the configs read from the shapes, pickle refusal,
//! truncated files, other model families, and where the CLIP vocabulary is looked for.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline};
use drift_engine::diffusion::schedulers::SchedulerKind;
use drift_engine::diffusion::single_file::{SdCheckpoint, find_clip_vocab, scheduler_config};
use drift_engine::error::DriftError;
use drift_engine::formats::safetensors::SafetensorsSet;
use drift_engine::models::clip::ClipTextConfig;
use drift_engine::models::unet::UnetConfig;
use drift_engine::models::vae::VaeConfig;
use drift_engine::tokenize::clip::{ClipTokenizer, gunzip};
use drift_engine::{DType, Gpu, GpuOptions};
use safetensors::tensor::TensorView;
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/single_file")
}

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions::from_env()).expect("a Vulkan device"))
}

fn reference() -> &'static Value {
    static R: OnceLock<Value> = OnceLock::new();
    R.get_or_init(|| {
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap())
            .unwrap()
    })
}

/// A temporary folder of one test, removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("drift-single-file-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The checkpoint, unpacked from the committed gzip.
    fn checkpoint(&self) -> PathBuf {
        let p = self.join("sd1_tiny.safetensors");
        if !p.is_file() {
            let gz = std::fs::read(fixtures().join("sd1_tiny.safetensors.gz")).unwrap();
            std::fs::write(&p, gunzip(&gz).unwrap()).unwrap();
        }
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// OpenAI's CLIP vocabulary, found as the pipeline finds it (DRIFT_CLIP_VOCAB or the Drift cache).
fn vocab() -> PathBuf {
    find_clip_vocab(|k| std::env::var_os(k)).unwrap_or_else(|e| {
        panic!("{e}\n(.ci/run fetches it and sets DRIFT_CLIP_VOCAB)");
    })
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        other => panic!("unexpected dtype {other:?}"),
    }
}

/// Writes `tensors` (name, dtype, shape, bytes) as one safetensors file.
fn write_safetensors(path: &Path, tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                TensorView::new(st_dtype(*d), s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The checkpoint's weights as a diffusers folder: each component's tensors renamed by the fixture
/// script's table (diffusers name -> LDM name), the script's configs, SD 1.5's scheduler, and a
/// tokenizer folder holding the real CLIP vocabulary.
fn diffusers_folder(scratch: &Scratch) -> PathBuf {
    let r = reference();
    let dir = scratch.join("folder");
    let set = SafetensorsSet::open(&scratch.checkpoint()).unwrap();
    for (component, file) in [
        ("unet", "diffusion_pytorch_model.safetensors"),
        ("vae", "diffusion_pytorch_model.safetensors"),
        ("text_encoder", "model.safetensors"),
    ] {
        let d = dir.join(component);
        std::fs::create_dir_all(&d).unwrap();
        let mut tensors = Vec::new();
        for (name, ldm) in r["names"][component].as_object().unwrap() {
            let t = set.get(ldm.as_str().unwrap()).unwrap();
            let mut shape = t.shape.to_vec();
            if component == "vae" && name.contains(".attentions.") && shape.len() == 4 {
                shape.truncate(2); // LDM stores the VAE attention projections as 1x1 convs
            }
            tensors.push((name.clone(), t.dtype, shape, t.bytes.to_vec()));
        }
        write_safetensors(&d.join(file), tensors);
        std::fs::write(d.join("config.json"), r["configs"][component].to_string()).unwrap();
    }
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(
        dir.join("scheduler/scheduler_config.json"),
        r["configs"]["scheduler"].to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("model_index.json"),
        r["configs"]["model_index"].to_string(),
    )
    .unwrap();
    let tok = ClipTokenizer::from_bpe_file(&vocab()).unwrap();
    std::fs::create_dir_all(dir.join("tokenizer")).unwrap();
    tokenizers::Model::save(tok.inner.get_model(), &dir.join("tokenizer"), None).unwrap();
    dir
}

fn psnr(got: &[u8], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mse: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 / 255.0 - w as f64).powi(2))
        .sum::<f64>()
        / want.len() as f64;
    10.0 * (1.0 / mse.max(1e-12)).log10()
}

fn generate(pipe: &mut SdPipeline, latents: &[f32]) -> Vec<u8> {
    let r = reference();
    let req = ImageRequest {
        prompt: r["prompt"].as_str().unwrap().into(),
        negative: r["negative"].as_str().unwrap().into(),
        steps: r["steps"].as_u64().unwrap() as usize,
        cfg: r["cfg"].as_f64().unwrap() as f32,
        seed: 0,
        scheduler: SchedulerKind::parse(r["scheduler"].as_str().unwrap()).unwrap(),
        init: None,
        latents: Some(latents.to_vec()),
    };
    let out = pipe.generate(gpu(), &req, &mut |_, _, _| true).unwrap();
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    out.image.pixels
}

#[test]
fn single_file_matches_diffusers_and_the_folder_path() {
    let t0 = std::time::Instant::now();
    let r = reference();
    let size = r["size"].as_u64().unwrap() as usize;
    let refs = SafetensorsSet::open(&fixtures().join("reference.safetensors")).unwrap();
    let latents = refs.get("latents").unwrap().to_f32().unwrap();
    let want = refs.get("image").unwrap().to_f32().unwrap();

    let scratch = Scratch::new("pipeline");
    let mut file_pipe = SdPipeline::open(gpu(), &scratch.checkpoint(), size, size).unwrap();
    assert_eq!(file_pipe.name, "sd1_tiny");
    let from_file = generate(&mut file_pipe, &latents);
    let db = psnr(&from_file, &want);
    println!("single file vs diffusers from_single_file: PSNR {db:.1} dB");
    assert!(db > 35.0, "single file: PSNR {db:.1} dB against diffusers");
    drop(file_pipe);

    let mut folder_pipe = SdPipeline::open(gpu(), &diffusers_folder(&scratch), size, size).unwrap();
    let from_folder = generate(&mut folder_pipe, &latents);
    let as_f32: Vec<f32> = from_folder.iter().map(|&v| v as f32 / 255.0).collect();
    let db_folder = psnr(&from_file, &as_f32);
    println!(
        "single file vs the same weights as a diffusers folder: PSNR {db_folder:.1} dB ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        db_folder > 35.0,
        "single file vs folder: PSNR {db_folder:.1} dB"
    );
    assert!(psnr(&from_folder, &want) > 35.0);
}

/// A config as JSON without `sample_size` (the default image size, which no shape shows).
fn without_sample_size(v: Value) -> Value {
    let mut v = v;
    v.as_object_mut().unwrap().remove("sample_size");
    v
}

#[test]
fn configs_read_from_the_shapes_equal_the_diffusers_configs() {
    let r = reference();
    let scratch = Scratch::new("configs");
    let (ckpt, _) = SdCheckpoint::open(&scratch.checkpoint()).unwrap();
    let unet = UnetConfig::from_json(&r["configs"]["unet"].to_string()).unwrap();
    assert_eq!(
        without_sample_size(serde_json::to_value(&ckpt.unet).unwrap()),
        without_sample_size(serde_json::to_value(&unet).unwrap())
    );
    let vae = VaeConfig::from_json(&r["configs"]["vae"].to_string()).unwrap();
    assert_eq!(
        serde_json::to_value(&ckpt.vae).unwrap(),
        serde_json::to_value(&vae).unwrap()
    );
    let clip = ClipTextConfig::from_value(&r["configs"]["text_encoder"]).unwrap();
    assert_eq!(ckpt.clip, clip);
    assert_eq!(ckpt.clip_prefix, "cond_stage_model.transformer.text_model.");
    assert_eq!(ckpt.scheduler.prediction_type.as_deref(), Some("epsilon"));
    assert_eq!(
        ckpt.scheduler.beta_schedule.as_deref(),
        Some("scaled_linear")
    );
}

type Stored = (String, DType, Vec<usize>, Vec<u8>);

#[test]
fn sd15_shapes_give_sd15_configs() {
    let gz = std::fs::read(fixtures().join("sd15_layout.json.gz")).unwrap();
    let layout: Value = serde_json::from_slice(&gunzip(&gz).unwrap()).unwrap();
    let shapes: HashMap<String, Vec<usize>> =
        serde_json::from_value(layout["shapes"].clone()).unwrap();
    let ckpt =
        SdCheckpoint::from_shapes(Path::new("v1-5-pruned-emaonly.safetensors"), &shapes).unwrap();
    let configs = &layout["configs"];
    let unet = UnetConfig::from_json(&configs["unet"].to_string()).unwrap();
    assert_eq!(
        serde_json::to_value(&ckpt.unet).unwrap(),
        serde_json::to_value(&unet).unwrap()
    );
    assert_eq!(ckpt.unet.block_out_channels, [320, 640, 1280, 1280]);
    let vae = VaeConfig::from_json(&configs["vae"].to_string()).unwrap();
    assert_eq!(
        serde_json::to_value(&ckpt.vae).unwrap(),
        serde_json::to_value(&vae).unwrap()
    );
    assert_eq!(ckpt.vae.block_out_channels, [128, 256, 512, 512]);
    assert_eq!(ckpt.clip, ClipTextConfig::sd15());
    assert_eq!(
        ckpt.clip,
        ClipTextConfig::from_value(&configs["text_encoder"]).unwrap()
    );
}

/// Copies the checkpoint's float tensors through `edit` (`None` drops the tensor).
fn rewrite(scratch: &Scratch, name: &str, edit: impl Fn(Stored) -> Option<Stored>) -> PathBuf {
    let set = SafetensorsSet::open(&scratch.checkpoint()).unwrap();
    let tensors = set
        .names()
        .filter_map(|n| set.get(n).ok())
        .filter_map(|t| {
            edit((
                t.name.to_string(),
                t.dtype,
                t.shape.to_vec(),
                t.bytes.to_vec(),
            ))
        })
        .collect();
    let p = scratch.join(name);
    write_safetensors(&p, tensors);
    p
}

#[test]
fn old_clip_key_names_without_text_model_are_read() {
    let scratch = Scratch::new("old_clip");
    let p = rewrite(&scratch, "old_clip_names.safetensors", |(n, d, s, b)| {
        let n = n.replace(
            "cond_stage_model.transformer.text_model.",
            "cond_stage_model.transformer.",
        );
        Some((n, d, s, b))
    });
    let (old, _) = SdCheckpoint::open(&p).unwrap();
    let (new, _) = SdCheckpoint::open(&scratch.checkpoint()).unwrap();
    assert_eq!(old.clip_prefix, "cond_stage_model.transformer.");
    assert_eq!(old.clip, new.clip);
}

#[test]
fn pickle_checkpoints_are_refused_with_the_reason() {
    let scratch = Scratch::new("pickle");
    for ext in ["ckpt", "pt", "pth", "bin"] {
        let p = scratch.join(&format!("model.{ext}"));
        std::fs::write(&p, b"PK\x03\x04 not really a zip").unwrap();
        let e = SdPipeline::open(gpu(), &p, 64, 64).err().expect("refused");
        let msg = e.to_string();
        assert!(matches!(e, DriftError::Unsupported(_)), "{msg}");
        assert!(
            msg.contains("pickle")
                && msg.contains("run arbitrary code")
                && msg.contains(".safetensors"),
            "{msg}"
        );
    }
}

#[test]
fn truncated_checkpoints_give_an_error_not_a_panic() {
    let scratch = Scratch::new("truncated");
    let full = std::fs::read(scratch.checkpoint()).unwrap();
    for keep in [0, 5, 100, full.len() / 2, full.len() - 1] {
        let p = scratch.join(&format!("truncated_{keep}.safetensors"));
        std::fs::write(&p, &full[..keep]).unwrap();
        let e = SdPipeline::open(gpu(), &p, 16, 16)
            .err()
            .unwrap_or_else(|| panic!("a file cut at {keep} bytes opened"));
        println!("cut at {keep}: {e}");
        assert!(
            e.to_string().contains(&*p.to_string_lossy()),
            "cut at {keep}: {e}"
        );
    }
}

/// A tensor name and shape.
type Spec = (&'static str, &'static [usize]);

/// A file holding just `tensors` (zeros, f32).
fn file_with(scratch: &Scratch, name: &str, tensors: &[Spec]) -> PathBuf {
    let p = scratch.join(name);
    write_safetensors(
        &p,
        tensors
            .iter()
            .map(|(n, s)| {
                let bytes = vec![0u8; 4 * s.iter().product::<usize>()];
                (n.to_string(), DType::F32, s.to_vec(), bytes)
            })
            .collect(),
    );
    p
}

#[test]
fn other_model_families_are_refused_as_not_sd1() {
    let scratch = Scratch::new("families");
    let unet_in: Spec = (
        "model.diffusion_model.input_blocks.0.0.weight",
        &[8, 4, 3, 3],
    );
    let cases: Vec<(&str, Vec<Spec>, &str)> = vec![
        (
            "sd2.safetensors",
            vec![
                unet_in,
                ("cond_stage_model.model.token_embedding.weight", &[10, 64]),
            ],
            "Stable Diffusion 2.x",
        ),
        (
            "sd2_v.safetensors",
            vec![
                unet_in,
                (
                    "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
                    &[8, 1024],
                ),
            ],
            "Stable Diffusion 2.x",
        ),
        (
            "sdxl.safetensors",
            vec![
                unet_in,
                (
                    "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
                    &[8],
                ),
            ],
            "SDXL",
        ),
        (
            "flux.safetensors",
            vec![("double_blocks.0.img_attn.norm.key_norm.scale", &[8])],
            "FLUX",
        ),
        (
            "unet_only.safetensors",
            vec![("conv_in.weight", &[8, 4, 3, 3])],
            "diffusers pipeline folder",
        ),
    ];
    for (name, tensors, says) in cases {
        let e = SdCheckpoint::open(&file_with(&scratch, name, &tensors))
            .err()
            .unwrap_or_else(|| panic!("{name} was accepted"));
        let msg = e.to_string();
        assert!(
            msg.contains("not SD 1.x") && msg.contains(says),
            "{name}: {msg}"
        );
    }
    // SD 1.x layouts Drift cannot run as text-to-image say why: an inpainting UNet (9 input
    // channels), a file without its VAE.
    let p = rewrite(&scratch, "inpainting.safetensors", |(n, d, s, b)| {
        if n == "model.diffusion_model.input_blocks.0.0.weight" {
            let shape = vec![s[0], 9, s[2], s[3]];
            let bytes = vec![0u8; 2 * shape.iter().product::<usize>()];
            return Some((n, DType::F16, shape, bytes));
        }
        Some((n, d, s, b))
    });
    let e = SdCheckpoint::open(&p).err().unwrap();
    assert!(e.to_string().contains("inpainting"), "{e}");
    let p = rewrite(&scratch, "no_vae.safetensors", |t| {
        (!t.0.starts_with("first_stage_model.")).then_some(t)
    });
    let e = SdCheckpoint::open(&p).err().unwrap();
    assert!(e.to_string().contains("no VAE"), "{e}");
}

#[test]
fn a_yaml_next_to_the_file_selects_v_prediction() {
    let scratch = Scratch::new("vpred");
    let p = scratch.join("vpred.safetensors");
    assert_eq!(
        scheduler_config(&p).unwrap().prediction_type.as_deref(),
        Some("epsilon")
    );
    std::fs::write(
        p.with_extension("yaml"),
        "model:\n  params:\n    parameterization: \"v\"\n    linear_start: 0.00085\n",
    )
    .unwrap();
    assert_eq!(
        scheduler_config(&p).unwrap().prediction_type.as_deref(),
        Some("v_prediction")
    );
}

#[test]
fn a_missing_clip_vocabulary_says_where_to_get_it() {
    let scratch = Scratch::new("vocab");
    let home = scratch.join("empty_home");
    let env: HashMap<&str, OsString> = [("HOME", home.clone().into_os_string())].into();
    let e = find_clip_vocab(|k| env.get(k).cloned()).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("DRIFT_CLIP_VOCAB")
            && msg.contains("open_clip_torch")
            && msg.contains(".cache/drift/clip"),
        "{msg}"
    );
    // The cache folder is where the file is looked for.
    let clip = home.join(".cache/drift/clip");
    std::fs::create_dir_all(&clip).unwrap();
    std::fs::write(clip.join("bpe_simple_vocab_16e6.txt.gz"), b"x").unwrap();
    assert_eq!(
        find_clip_vocab(|k| env.get(k).cloned()).unwrap(),
        clip.join("bpe_simple_vocab_16e6.txt.gz")
    );
    let bad: HashMap<&str, OsString> =
        [("DRIFT_CLIP_VOCAB", "/nonexistent/vocab.gz".into())].into();
    assert!(find_clip_vocab(|k| bad.get(k).cloned()).is_err());
}
