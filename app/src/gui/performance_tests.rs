//! The Performance tab: Drift's weight bytes appear once a model is loaded on the app's device; with
//! "Profile runs" on, an image job leaves a profiled UNet step whose kernels are listed and sortable.

use drift_engine::Category;
use drift_engine::diffusion::pipeline::SdPipeline;
use egui_kittest::kittest::Queryable;

use super::image_tests::{IMAGE_TIMEOUT, TINY_SIZE, set_up_tiny_run, tiny_sd_pipeline};
use super::perf_vram::fmt_bytes;
use super::test_support::{harness, step_until, temp_root, test_app};
use crate::settings::Settings;

#[test]
fn weights_show_after_a_load_and_kernel_rows_after_a_profiled_run() {
    let root = temp_root("performance-tab");
    let model = tiny_sd_pipeline(&root.join("tiny-sd"));
    let mut h = harness(test_app(&root));
    h.run();
    h.get_by_label("Performance").click();
    h.run();
    h.get_by_label_contains("No profiled run yet");
    h.get_by_label_contains("Device memory");

    // Load the tiny pipeline straight onto the app's device: its weights appear in the table.
    let gpu = h.state().app.gpu.clone();
    assert_eq!(gpu.memory_report().bytes(Category::Weights), 0);
    let pipe = SdPipeline::open(&gpu, &model, TINY_SIZE, TINY_SIZE).unwrap();
    let weights = gpu.memory_report().bytes(Category::Weights);
    assert!(weights > 0);
    let shown = fmt_bytes(weights);
    assert!(
        h.query_all_by_label(&shown).next().is_none(),
        "{shown} shown before the load"
    );
    h.run();
    assert!(
        h.query_all_by_label(&shown).next().is_some(),
        "the weights row shows {shown}"
    );
    // The sampler logged it for the plot.
    std::thread::sleep(super::perf_vram::SAMPLE_EVERY);
    h.run();
    let sampled = h
        .state()
        .app
        .perf
        .lock()
        .unwrap()
        .vram
        .back()
        .map(|s| s.by_category[0]);
    assert_eq!(sampled, Some(("weights", weights)));
    drop(pipe);

    // Profiling on (and saved), then an image: the worker profiles one UNet step.
    h.get_by_label("Profile runs").click();
    h.run();
    assert!(h.state().app.settings.profiling);
    assert!(Settings::load(&h.state().app.paths).profiling, "saved");
    h.get_by_label("Image").click();
    h.run();
    set_up_tiny_run(&mut h, &model, 3);
    h.run();
    h.get_by_label("Generate").click();
    step_until(&mut h, IMAGE_TIMEOUT, "a profiled run", |h| {
        !h.state().image.busy() && h.state().app.perf.lock().unwrap().last_run.is_some()
    });
    assert_eq!(h.state().image.error, None);
    let run = h.state().app.perf.lock().unwrap().last_run.clone().unwrap();
    assert!(run.label.starts_with("UNet step"), "{}", run.label);
    let kernels = run.profile.by_kernel();
    assert!(!kernels.is_empty());
    h.get_by_label("Performance").click();
    h.run(); // the table and timeline drawn, every widget named
    h.get_by_label_contains("Last run: UNet step");
    for k in kernels.iter().take(3) {
        assert!(
            h.query_all_by_label(&k.name).next().is_some(),
            "a row for kernel {}",
            k.name
        );
    }
    // Sorting by a header: the clicked column gets the arrow, a second click flips it.
    h.get_by_label("Calls").click();
    h.run();
    h.get_by_label("Calls v").click();
    h.run();
    h.get_by_label("Calls ^");
    // Throughput history: the image's seconds.
    h.get_by_label("Images: 1");
    let _ = std::fs::remove_dir_all(&root);
}
