//! Helpers shared by the integration tests that run the real `drift` binary. Each test file uses a
//! subset of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `drift ARGS`: (success, stdout, stderr).
pub fn drift(args: &[&str]) -> (bool, String, String) {
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
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("drift-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// The tiny single-file SD 1.x checkpoint (engine/tests/fixtures/single_file, committed gzipped),
/// unpacked into `dir` as `NAME.safetensors`.
pub fn unpack_checkpoint(dir: &Path, name: &str) -> PathBuf {
    let gz = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/single_file/sd1_tiny.safetensors.gz");
    let bytes = drift_engine::tokenize::clip::gunzip(&std::fs::read(gz).unwrap()).unwrap();
    let p = dir.join(format!("{name}.safetensors"));
    std::fs::write(&p, bytes).unwrap();
    p
}
