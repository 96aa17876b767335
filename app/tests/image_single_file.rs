//! `drift image` with a single-file SD 1.x checkpoint (engine/tests/fixtures/single_file, unpacked
//! from its gzip) and with pickle checkpoints, as a user runs it. The CLIP vocabulary comes from
//! `DRIFT_CLIP_VOCAB` or ~/.cache/drift/clip/ (.ci/run provides it).

use std::path::{Path, PathBuf};
use std::process::Command;

fn drift(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_drift"))
        .args(args)
        .output()
        .expect("drift runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A temporary folder, removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    let d = std::env::temp_dir().join(format!("drift-cli-single-file-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn unpack_checkpoint(dir: &Path) -> PathBuf {
    let gz = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/single_file/sd1_tiny.safetensors.gz");
    let bytes = drift_engine::tokenize::clip::gunzip(&std::fs::read(gz).unwrap()).unwrap();
    let p = dir.join("sd1_tiny.safetensors");
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn image_from_a_single_file_checkpoint_and_pickles_refused() {
    let scratch = scratch();
    let dir = &scratch.0;
    let model = unpack_checkpoint(dir);
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
