//! The Models tab on lavapipe: a model placed in the models folder shows up in the library with its
//! format and quantization; Delete asks first and then removes it; the catalog search narrows the
//! list.

use std::path::Path;
use std::time::Duration;

use egui_kittest::kittest::Queryable;

use super::Tab;
use super::test_support::{harness, step_until, temp_root, test_app};
use crate::paths::Paths;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

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
