//! The device facts in the Performance tab: adapter, backend, driver, the features Drift uses, the limits
//! it relies on, and the kernel self-test (every kernel this device selects against CPU references) run
//! on the app's own device, as a GPU job in the queue.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};

use drift_engine::Gpu;
use eframe::egui;

use super::gpu_queue::GpuQueue;
use super::perf_vram::fmt_bytes;

#[derive(Default)]
pub struct SelfTest {
    running: Option<Receiver<String>>,
    pub result: Option<String>,
}

impl SelfTest {
    pub fn start(&mut self, gpu: Arc<Gpu>, queue: GpuQueue, ctx: egui::Context) {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("drift-selftest".into())
            .spawn(move || {
                let _turn = queue.acquire();
                let (mut rng, seed) = drift_engine::selftest::rng();
                let msg = match drift_engine::selftest::run_all(&gpu, &mut rng) {
                    Ok(checks) => {
                        let failed: Vec<_> = checks.iter().filter(|c| !c.passed).collect();
                        let mut m = format!(
                            "{} checks, {} failed (seed {seed})",
                            checks.len(),
                            failed.len()
                        );
                        for c in failed.iter().take(5) {
                            m.push_str(&format!("\n{c}"));
                        }
                        m
                    }
                    Err(e) => format!("self-test error: {e}"),
                };
                let _ = tx.send(msg);
                ctx.request_repaint();
            })
            .expect("spawning a thread");
        self.running = Some(rx);
        self.result = None;
    }

    pub fn poll(&mut self) {
        if let Some(rx) = &self.running
            && let Ok(msg) = rx.try_recv()
        {
            self.result = Some(msg);
            self.running = None;
        }
    }

    pub fn running(&self) -> bool {
        self.running.is_some()
    }
}

pub fn device_ui(ui: &mut egui::Ui, gpu: &Arc<Gpu>, queue: &GpuQueue, selftest: &mut SelfTest) {
    let d = gpu.describe();
    ui.label(format!(
        "{} ({}, {}) · driver {} {}",
        d.name, d.backend, d.device_type, d.driver, d.driver_info
    ));
    egui::Grid::new("device features")
        .striped(true)
        .show(ui, |ui| {
            for f in &d.features {
                ui.label(f.name);
                ui.label(if f.present { "yes" } else { "no" });
                ui.end_row();
            }
            let c = &d.caps;
            ui.label("f16 kernels");
            ui.label(if c.f16 { "yes" } else { "no" });
            ui.end_row();
            ui.label("subgroup sizes");
            ui.label(if c.subgroup {
                format!("{}..{}", c.subgroup_min_size, c.subgroup_max_size)
            } else {
                "none".into()
            });
            ui.end_row();
            ui.label("largest buffer");
            ui.label(fmt_bytes(c.max_buffer_size));
            ui.end_row();
            ui.label("largest storage binding");
            ui.label(fmt_bytes(c.max_storage_binding));
            ui.end_row();
            ui.label("workgroup memory");
            ui.label(fmt_bytes(c.max_workgroup_storage as u64));
            ui.end_row();
        });
    ui.horizontal(|ui| {
        let running = selftest.running();
        if ui
            .add_enabled(!running, egui::Button::new("Run kernel self-test"))
            .clicked()
        {
            selftest.start(gpu.clone(), queue.clone(), ui.ctx().clone());
        }
        if running {
            ui.spinner();
            ui.label("checking every kernel against CPU references...");
        }
    });
    if let Some(r) = &selftest.result {
        ui.label(r);
    }
}
