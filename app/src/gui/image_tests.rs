//! The Image tab end to end on a tiny Stable Diffusion pipeline assembled from the engine's fixtures
//! (random weights, 16x16 images): the empty state, a prompt typed into the form, Generate, the image in
//! the gallery, its PNG with A1111 parameters in the images folder, "Use parameters"; and with a
//! renderer sharing the engine's device, the image drawn from the texture the VAE output was packed into.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drift_engine::Gpu;
use drift_engine::diffusion::display::read_rgba8;
use drift_engine::diffusion::image::{load_png, read_parameters};
use drift_engine::diffusion::pipeline::{ImageRequest, SdPipeline};
use drift_engine::diffusion::schedulers::SchedulerKind;
use eframe::egui;
use eframe::egui_wgpu;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

use super::gallery::Shown;
use super::test_support::{copy_dir, harness, step_until, temp_root, test_app};
use super::{AppContext, DriftApp, Tab};
use crate::paths::Paths;
use crate::settings::Settings;

/// The tiny pipeline makes an image in well under a second on lavapipe; loading compiles its kernels.
pub const IMAGE_TIMEOUT: Duration = Duration::from_secs(90);
/// The fixture pipeline's native size (UNet sample size 8 x VAE downscale 2).
pub const TINY_SIZE: usize = 16;

/// A diffusers folder at `d` from the engine's test fixtures (as engine/tests/pipeline.rs assembles
/// it): CLIP tokenizer and text encoder, UNet, VAE, SD 1.5's scheduler config.
pub fn tiny_sd_pipeline(d: &Path) -> PathBuf {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(f.join("pipeline/reference.json")).expect("reference.json"),
    )
    .expect("reference.json parses");
    copy_dir(&f.join("clip/tokenizer"), &d.join("tokenizer"));
    copy_dir(&f.join("clip/text_encoder_gelu"), &d.join("text_encoder"));
    copy_dir(&f.join("sd/unet_a"), &d.join("unet"));
    copy_dir(&f.join("sd/vae"), &d.join("vae"));
    std::fs::create_dir_all(d.join("scheduler")).expect("scheduler folder");
    std::fs::write(
        d.join("scheduler/scheduler_config.json"),
        reference["scheduler_config"].to_string(),
    )
    .expect("scheduler config");
    std::fs::write(
        d.join("model_index.json"),
        reference["model_index"].to_string(),
    )
    .expect("model index");
    d.to_path_buf()
}

/// Points the Image tab at `model` with a short, small, seeded run (the size and steps through the
/// state: the fixture's 16x16 is not a preset).
pub fn set_up_tiny_run(h: &mut Harness<'static, DriftApp>, model: &Path, seed: u64) {
    let panel = &mut h.state_mut().image;
    panel.model_path = model.display().to_string();
    panel.form.width = TINY_SIZE;
    panel.form.height = TINY_SIZE;
    panel.form.steps = 4;
    panel.form.seed = seed;
    panel.form.scheduler = SchedulerKind::EulerAncestral;
}

fn type_into(h: &mut Harness<'static, DriftApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.run();
    h.get_by_label(label).type_text(text);
    h.run();
}

#[test]
fn tiny_pipeline_makes_an_image_in_the_gallery_and_saves_it_with_parameters() {
    let root = temp_root("image-tab");
    // In the models folder, where the library finds it.
    let model = tiny_sd_pipeline(&Paths::under(&root).default_models_dir().join("tiny-sd"));
    let mut h = harness(test_app(&root));
    h.run();
    h.get_by_label("Image").click();
    h.run();

    // No model yet: the empty state points to the Models tab.
    h.get_by_label("Open the Models tab").click();
    h.run();
    assert_eq!(h.state().tab, Tab::Models);
    h.get_by_label("Image").click();
    h.run();

    // The library lists it; picking it fills the model path.
    step_until(&mut h, IMAGE_TIMEOUT, "the library listing", |h| {
        !h.state().image.library_models().is_empty()
    });
    assert!(
        h.state()
            .image
            .library_models()
            .contains(&("tiny-sd".to_string(), model.clone())),
        "{:?}",
        h.state().image.library_models()
    );
    h.get_by_label("Library").click();
    h.run();
    h.get_by_label("tiny-sd").click();
    h.run();
    assert_eq!(h.state().image.model_path, model.display().to_string());
    // A path typed into the box works the same way.
    h.state_mut().image.model_path.clear();
    h.run();
    type_into(&mut h, "Model", &model.display().to_string());
    type_into(&mut h, "Prompt", "a photo of a cat");
    type_into(&mut h, "Negative prompt", "blurry");
    assert_eq!(h.state().image.model_path, model.display().to_string());
    assert_eq!(h.state().image.form.prompt, "a photo of a cat");
    set_up_tiny_run(&mut h, &model, 7);
    h.run();

    h.get_by_label("Generate").click();
    h.step();
    assert!(h.state().image.busy(), "Generate starts a job");
    step_until(&mut h, IMAGE_TIMEOUT, "an image in the gallery", |h| {
        h.state().image.gallery.len() == 1 && !h.state().image.busy()
    });
    assert_eq!(h.state().image.error, None);
    h.run(); // the gallery drawn (and every widget checked for an accessible name)
    h.get_by_label("Image 1: a photo of a cat");
    h.get_by_label("Selected image: a photo of a cat");

    let app = &h.state().app;
    let img = &h.state().image.gallery.images[0];
    assert!(
        matches!(img.shown, Shown::Cpu(Some(_))),
        "without a shared renderer the image is uploaded from its bytes"
    );
    assert_eq!((img.rgb.width, img.rgb.height), (TINY_SIZE, TINY_SIZE));
    let path = img.path.clone().expect("auto-saved");
    assert!(
        path.starts_with(app.paths.images_dir()),
        "{}",
        path.display()
    );
    let text = read_parameters(&path).unwrap().expect("a parameters chunk");
    assert!(
        text.starts_with("a photo of a cat\nNegative prompt: blurry\nSteps: 4, Sampler: Euler a, CFG scale: 7.5, Seed: 7, Size: 16x16"),
        "{text}"
    );
    let png = load_png(&path).unwrap();
    assert_eq!(
        png.pixels, img.rgb.pixels,
        "the saved PNG is the shown image"
    );
    assert_eq!(
        Settings::load(&app.paths).last_image_model.as_deref(),
        Some(model.as_path()),
        "the model is remembered"
    );
    assert_eq!(
        app.perf.lock().unwrap().image_seconds.len(),
        1,
        "seconds per image are logged"
    );

    // The engine alone, same request: the same pixels (the UI path adds nothing and loses nothing).
    let gpu = app.gpu.clone();
    let mut pipe = SdPipeline::open(&gpu, &model, TINY_SIZE, TINY_SIZE).unwrap();
    let direct = pipe
        .generate(
            &gpu,
            &ImageRequest {
                prompt: "a photo of a cat".into(),
                negative: "blurry".into(),
                steps: 4,
                cfg: 7.5,
                seed: 7,
                scheduler: SchedulerKind::EulerAncestral,
                init: None,
                latents: None,
            },
            &mut |_, _, _| true,
        )
        .unwrap();
    assert_eq!(direct.image.pixels, png.pixels);
    drop(pipe);

    // "Use parameters" puts the image's settings back into the form.
    h.state_mut().image.form.prompt = "something else".into();
    h.state_mut().image.form.seed = 99;
    h.run();
    h.get_by_label("Use parameters").click();
    h.run();
    let f = &h.state().image.form;
    assert_eq!(
        (f.prompt.as_str(), f.negative.as_str()),
        ("a photo of a cat", "blurry")
    );
    assert_eq!((f.seed, f.steps, f.width), (7, 4, TINY_SIZE));

    // A batch of two continues the seeds; a bad model path is an error in the UI, not a crash.
    h.state_mut().image.form.batch = 2;
    h.get_by_label("Generate").click();
    step_until(&mut h, IMAGE_TIMEOUT, "two more images", |h| {
        h.state().image.gallery.len() == 3 && !h.state().image.busy()
    });
    let seeds: Vec<u64> = h.state().image.gallery.images[1..]
        .iter()
        .map(|i| i.parameters.seed)
        .collect();
    assert_eq!(seeds, [7, 8]);
    h.state_mut().image.model_path = root.join("missing").display().to_string();
    h.run();
    h.get_by_label("Generate").click();
    step_until(&mut h, IMAGE_TIMEOUT, "the error", |h| {
        h.state().image.error.is_some() && !h.state().image.busy()
    });
    let e = h.state().image.error.clone().unwrap();
    assert!(e.contains("missing"), "{e}");
    h.run();
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn cancel_stops_a_batch_between_steps() {
    let root = temp_root("image-cancel");
    let model = tiny_sd_pipeline(&root.join("tiny-sd"));
    let mut h = harness(test_app(&root));
    h.run();
    h.get_by_label("Image").click();
    h.run();
    set_up_tiny_run(&mut h, &model, 1);
    h.state_mut().image.form.steps = 50;
    h.state_mut().image.form.batch = 16;
    h.run();
    h.get_by_label("Generate").click();
    step_until(&mut h, IMAGE_TIMEOUT, "the first steps", |h| {
        h.state().app.activity.iter().any(|a| a.contains("step"))
    });
    h.check_accessibility(); // the progress view (Cancel, preview) too
    h.get_by_label("Cancel").click();
    step_until(&mut h, IMAGE_TIMEOUT, "the job to stop", |h| {
        !h.state().image.busy()
    });
    assert!(
        h.state().image.gallery.len() < 16,
        "cancel stops the batch ({} images)",
        h.state().image.gallery.len()
    );
    assert_eq!(h.state().image.error, None, "cancelling is not an error");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn with_a_renderer_on_the_engine_device_images_are_drawn_from_the_vae_texture() {
    let root = temp_root("image-gpu");
    let model = tiny_sd_pipeline(&root.join("tiny-sd"));
    // A renderer and the engine on one device, as `gui::run` sets them up with eframe.
    let mut setup = egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    setup.device_descriptor = Arc::new(drift_engine::gpu::device_descriptor);
    let rs = egui_kittest::wgpu::create_render_state(
        egui_wgpu::WgpuSetup::CreateNew(setup),
        egui_wgpu::RendererOptions::PREDICTABLE,
    );
    let gpu = Arc::new(Gpu::adopt(
        rs.adapter.clone(),
        rs.device.clone(),
        rs.queue.clone(),
    ));
    let mut app = AppContext::new(gpu.clone(), Paths::under(&root), egui::Context::default());
    app.render_state = Some(rs.clone());
    let mut h = Harness::builder()
        .with_size(egui::vec2(1100.0, 720.0))
        .renderer(egui_kittest::wgpu::WgpuTestRenderer::from_render_state(rs))
        .build_ui_state(|ui, app: &mut DriftApp| app.show(ui), DriftApp::new(app));
    h.run();
    h.get_by_label("Image").click();
    h.run();
    set_up_tiny_run(&mut h, &model, 11);
    h.state_mut().image.form.prompt = "a red square".into();
    h.run();
    h.get_by_label("Generate").click();
    step_until(&mut h, IMAGE_TIMEOUT, "an image in the gallery", |h| {
        h.state().image.gallery.len() == 1 && !h.state().image.busy()
    });
    h.run();
    let img = &h.state().image.gallery.images[0];
    let Shown::Gpu(native) = &img.shown else {
        panic!("with the engine's device the image is drawn from its GPU texture");
    };
    // The texture holds the image's pixels (rounding ties may differ by one, see display.rs).
    let rgba = read_rgba8(&gpu, &native.texture).unwrap();
    let max_diff = rgba
        .chunks(4)
        .zip(img.rgb.pixels.chunks(3))
        .flat_map(|(t, c)| t[..3].iter().zip(c).map(|(a, b)| a.abs_diff(*b)))
        .max();
    assert!(
        max_diff.is_some_and(|d| d <= 1),
        "texture vs image: {max_diff:?}"
    );
    let pixels = img.rgb.pixels.clone();
    let (lo, hi) = (pixels.iter().min(), pixels.iter().max());
    assert!(
        lo.zip(hi).is_some_and(|(lo, hi)| hi - lo > 64),
        "a flat image would make the screen comparison meaningless"
    );

    // And the frame shows it: the large view draws the 16x16 image 1:1, so the screenshot's pixels
    // under the image widget are the texture's (the renderer filters predictably, without dithering).
    let rect = h.get_by_label("Selected image: a red square").rect();
    let shot = h.render().expect("a rendered frame");
    let ppp = h.ctx.pixels_per_point();
    assert_eq!(ppp, 1.0);
    let (x0, y0) = (rect.min.x.round() as u32, rect.min.y.round() as u32);
    assert_eq!((rect.width(), rect.height()), (16.0, 16.0));
    let mut worst = 0u8;
    for y in 0..TINY_SIZE as u32 {
        for x in 0..TINY_SIZE as u32 {
            let px = shot.get_pixel(x0 + x, y0 + y).0;
            let i = 3 * (y as usize * TINY_SIZE + x as usize);
            for c in 0..3 {
                worst = worst.max(px[c].abs_diff(pixels[i + c]));
            }
        }
    }
    assert!(worst <= 2, "screen vs image: off by up to {worst}");
    let _ = std::fs::remove_dir_all(&root);
}
