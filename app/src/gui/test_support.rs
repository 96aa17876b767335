//! For the UI tests (egui_kittest on lavapipe): a whole `DriftApp` on its own GPU device, with its
//! settings and data in a fresh temporary folder, driven through a wgpu-rendering harness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drift_engine::{Gpu, GpuOptions};
use eframe::egui;
use egui_kittest::Harness;

use super::{AppContext, DriftApp};
use crate::paths::Paths;

/// A fresh folder for one test's settings and data.
pub fn temp_root(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("drift-ui-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temporary folder");
    d
}

/// Copies the files of a fixture folder (not recursive) into `dst`, creating it.
pub fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).expect("fixture folder");
    for e in std::fs::read_dir(src).expect("fixture folder") {
        let p = e.expect("fixture entry").path();
        std::fs::copy(&p, dst.join(p.file_name().expect("a file name"))).expect("fixture copy");
    }
}

/// The app as the window would build it, with its files under `root`.
pub fn test_app(root: &std::path::Path) -> DriftApp {
    let gpu = Arc::new(Gpu::new(&GpuOptions::from_env()).expect("a GPU adapter (lavapipe in CI)"));
    DriftApp::new(AppContext::new(
        gpu,
        Paths::under(root),
        egui::Context::default(),
    ))
}

/// A harness that renders the whole window with wgpu.
pub fn harness(app: DriftApp) -> Harness<'static, DriftApp> {
    Harness::builder()
        .with_size(egui::vec2(1100.0, 720.0))
        .wgpu()
        .build_ui_state(|ui, app: &mut DriftApp| app.show(ui), app)
}

/// Steps the UI until `done` holds (workers run on their own threads), or panics after `timeout`.
pub fn step_until(
    h: &mut Harness<'static, DriftApp>,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(&mut Harness<'static, DriftApp>) -> bool,
) {
    let t = Instant::now();
    while !done(h) {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
        h.step();
    }
}
