//! The whole Stable Diffusion pipeline against diffusers: a tiny random pipeline assembled from the
//! fixtures (CLIP tokenizer and text encoder, UNet, VAE, SD 1.5's scheduler config), 4 steps with CFG
//! from stored initial latents, for every deterministic scheduler (Euler ancestral and LCM draw noise
//! each step; tests/schedulers.rs checks their math with given noise). Images must agree with
//! diffusers' (f64) at PSNR > 35 dB; the schedulers' images differ from each other by ~25 dB, so a wrong
//! scheduler or a broken stage fails.

use std::path::{Path, PathBuf};

use drift_engine::diffusion::image::{load_png, read_parameters, save_png};
use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline};
use drift_engine::diffusion::schedulers::SchedulerKind;
use drift_engine::formats::safetensors::SafetensorsSet;
use drift_engine::{Gpu, GpuOptions};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// The diffusers folder the reference was made from.
fn assemble(reference: &serde_json::Value) -> PathBuf {
    let d = std::env::temp_dir().join(format!("drift-sd-pipeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let f = fixtures();
    copy_dir(&f.join("clip/tokenizer"), &d.join("tokenizer"));
    copy_dir(&f.join("clip/text_encoder_gelu"), &d.join("text_encoder"));
    copy_dir(&f.join("sd/unet_a"), &d.join("unet"));
    copy_dir(&f.join("sd/vae"), &d.join("vae"));
    std::fs::create_dir_all(d.join("scheduler")).unwrap();
    std::fs::write(
        d.join("scheduler/scheduler_config.json"),
        reference["scheduler_config"].to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("model_index.json"),
        reference["model_index"].to_string(),
    )
    .unwrap();
    d
}

fn psnr(got: &[u8], want: &[f32]) -> f64 {
    let mse: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 / 255.0 - w as f64).powi(2))
        .sum::<f64>()
        / want.len() as f64;
    10.0 * (1.0 / mse.max(1e-12)).log10()
}

#[test]
fn tiny_pipeline_matches_diffusers_for_every_scheduler() {
    let gpu = Gpu::new(&GpuOptions::from_env()).unwrap();
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("pipeline/reference.json")).unwrap(),
    )
    .unwrap();
    let tensors = SafetensorsSet::open(&fixtures().join("pipeline/reference.safetensors")).unwrap();
    let dir = assemble(&reference);
    let size = reference["size"].as_u64().unwrap() as usize;
    let mut pipe = SdPipeline::open(&gpu, &dir, size, size).unwrap();
    let latents = tensors.get("latents").unwrap().to_f32().unwrap();
    for kind in [
        SchedulerKind::Euler,
        SchedulerKind::Ddim,
        SchedulerKind::DpmPp2m,
        SchedulerKind::DpmPp2mKarras,
    ] {
        let req = ImageRequest {
            prompt: reference["prompt"].as_str().unwrap().into(),
            negative: reference["negative"].as_str().unwrap().into(),
            steps: 4,
            cfg: 7.5,
            seed: 0,
            scheduler: kind,
            init: None,
            latents: Some(latents.clone()),
        };
        let mut previews = 0;
        let r = pipe
            .generate(&gpu, &req, &mut |_, _, p| {
                previews += 1;
                assert_eq!((p.width, p.height), (size / 2, size / 2));
                true
            })
            .unwrap();
        assert_eq!(previews, 4);
        let want = tensors.get(kind.name()).unwrap().to_f32().unwrap();
        let db = psnr(&r.image.pixels, &want);
        println!("{}: PSNR {db:.1} dB", kind.name());
        assert!(
            db > 35.0,
            "{}: PSNR {db:.1} dB against diffusers",
            kind.name()
        );
    }

    // Cancel from the progress callback stops the run with an error.
    let req = ImageRequest {
        prompt: "x".into(),
        negative: String::new(),
        steps: 4,
        cfg: 7.5,
        seed: 3,
        scheduler: SchedulerKind::EulerAncestral,
        init: None,
        latents: None,
    };
    let e = pipe
        .generate(&gpu, &req, &mut |step, _, _| step < 2)
        .err()
        .unwrap();
    assert!(e.to_string().contains("cancelled"));

    // Seeded runs reproduce; the PNG carries the parameters; img2img from it keeps the image close.
    let a = pipe.generate(&gpu, &req, &mut |_, _, _| true).unwrap();
    let b = pipe.generate(&gpu, &req, &mut |_, _, _| true).unwrap();
    assert_eq!(a.image.pixels, b.image.pixels);
    let png = dir.join("out.png");
    save_png(&png, &a.image, Some(&a.parameters)).unwrap();
    assert!(
        read_parameters(&png)
            .unwrap()
            .unwrap()
            .contains("Sampler: Euler a, CFG scale: 7.5, Seed: 3")
    );
    // img2img against diffusers: the Euler image repainted at strength 0.5 (posterior mean, given noise).
    let init = load_png(&png).unwrap();
    let init_px: Vec<u8> = tensors
        .get("img2img_init")
        .unwrap()
        .to_f32()
        .unwrap()
        .iter()
        .map(|v| (v * 255.0).round() as u8)
        .collect();
    let init = drift_engine::diffusion::image::RgbImage {
        pixels: init_px,
        ..init
    };
    let i2i = ImageRequest {
        prompt: reference["prompt"].as_str().unwrap().into(),
        negative: reference["negative"].as_str().unwrap().into(),
        scheduler: SchedulerKind::Euler,
        init: Some((init, 0.5)),
        latents: Some(latents.clone()),
        ..req
    };
    let c = pipe.generate(&gpu, &i2i, &mut |_, _, _| true).unwrap();
    let db = psnr(
        &c.image.pixels,
        &tensors.get("img2img_euler").unwrap().to_f32().unwrap(),
    );
    println!("img2img euler: PSNR {db:.1} dB");
    assert!(db > 35.0, "img2img: PSNR {db:.1} dB against diffusers");
    let _ = std::fs::remove_dir_all(&dir);
}
