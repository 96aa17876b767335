//! The Models tab on lavapipe: a model placed in the models folder shows up in the library with its
//! format and quantization; Delete asks first and then removes it; the catalog search narrows the
//! list.

use std::path::Path;
use std::time::Duration;

use egui_kittest::kittest::Queryable;

use super::Tab;
use super::test_support::{copy_dir, harness, step_until, temp_root, test_app};
use crate::paths::Paths;

#[test]
fn library_lists_a_model_in_the_models_folder_and_deletes_it_after_confirmation() {
    let root = temp_root("models-tab");
    let model_dir = Paths::under(&root)
        .default_models_dir()
        .join("org/llama-gqa");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/llm/llama-gqa");
    copy_dir(&fixture, &model_dir);

    let mut h = harness(test_app(&root));
    h.run();
    h.get_by_label("Models").click();
    h.run();
    assert_eq!(h.state().tab, Tab::Models);
    step_until(&mut h, Duration::from_secs(60), "the library scan", |h| {
        h.query_by_label("org/llama-gqa").is_some()
    });
    h.get_by_label("safetensors");
    h.get_by_label("Models folder");

    // Delete asks first; Keep keeps.
    h.get_by_label("Delete org/llama-gqa").click();
    h.run();
    h.get_by_label("Keep org/llama-gqa").click();
    h.run();
    assert!(model_dir.exists());
    h.get_by_label("Delete org/llama-gqa").click();
    h.run();
    h.get_by_label("Confirm delete org/llama-gqa").click();
    step_until(
        &mut h,
        Duration::from_secs(60),
        "the rescan after delete",
        |h| h.query_by_label("org/llama-gqa").is_none(),
    );
    assert!(!model_dir.exists(), "the model folder was not deleted");

    // The catalog search narrows the list to matching entries.
    assert!(
        h.query_by_label("Download Stable Diffusion 1.5 (diffusers fp16)")
            .is_some()
    );
    h.get_by_label("Search catalog").click();
    h.run();
    h.get_by_label("Search catalog").type_text("qwen 3b");
    h.run();
    assert!(
        h.query_by_label("Download Qwen2.5 3B Instruct (GGUF Q4_K_M)")
            .is_some()
    );
    assert!(
        h.query_by_label("Download Stable Diffusion 1.5 (diffusers fp16)")
            .is_none()
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `GET url`: (status, body), or `None` when nothing listens.
fn get(url: &str) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut r = agent.get(url).call().ok()?;
    let body = r.body_mut().read_to_string().ok()?;
    Some((r.status().as_u16(), body))
}

#[test]
fn the_local_server_switch_serves_the_library_and_comes_back_after_a_restart() {
    let root = temp_root("models-serve");
    let paths = Paths::under(&root);
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/llm/llama3-rope-tied");
    copy_dir(
        &fixture,
        &paths.default_models_dir().join("org/llama3-rope-tied"),
    );
    // Any free port, so parallel tests never collide.
    let settings = crate::settings::Settings {
        serve_port: Some(0),
        ..Default::default()
    };
    settings.save(&paths).unwrap();

    let mut h = harness(test_app(&root));
    h.run();
    h.get_by_label("Models").click();
    step_until(&mut h, Duration::from_secs(60), "the library scan", |h| {
        h.query_by_label("org/llama3-rope-tied").is_some()
    });
    h.get_by_label("Local server").click();
    h.run();
    h.get_by_label("Serve the library's models (OpenAI API)")
        .click();
    // While it serves, the status bar's spinner keeps repainting: step rather than settle.
    h.run_steps(3);
    let addr = h.state().models.serve_addr().expect("the server runs");
    let (status, body) = get(&format!("http://{addr}/v1/models")).expect("it answers");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"llama3-rope-tied\""), "{body}");
    h.get_by_label_contains("Serving llama3-rope-tied at http://");
    assert!(crate::settings::Settings::load(&paths).serve_enabled);

    // Off: the port closes.
    h.get_by_label("Serve the library's models (OpenAI API)")
        .click();
    h.run_steps(3);
    assert!(h.state().models.serve_addr().is_none());
    assert!(
        get(&format!("http://{addr}/v1/models")).is_none(),
        "still served"
    );
    assert!(!crate::settings::Settings::load(&paths).serve_enabled);

    // On at exit: on again at the next start, once the library is known.
    h.get_by_label("Serve the library's models (OpenAI API)")
        .click();
    h.run_steps(3);
    drop(h);
    let mut h = harness(test_app(&root));
    step_until(
        &mut h,
        Duration::from_secs(60),
        "the server after a restart",
        |h| h.state().models.serve_addr().is_some(),
    );
    let addr = h.state().models.serve_addr().unwrap();
    assert_eq!(
        get(&format!("http://{addr}/v1/models")).map(|r| r.0),
        Some(200)
    );
    drop(h);
    let _ = std::fs::remove_dir_all(&root);
}
