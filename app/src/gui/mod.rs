//! The desktop window. eframe opens the device with Drift's features; the engine adopts that same
//! adapter/device/queue, so the UI and inference share one GPU device.

mod chat;
mod llm_worker;

use std::sync::Arc;

use anyhow::{Result, anyhow};
use drift_engine::Gpu;
use eframe::egui;

pub fn run() -> Result<()> {
    let mut setup = eframe::egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    setup.device_descriptor = Arc::new(|adapter| {
        let mut desc = drift_engine::gpu::device_descriptor(adapter);
        // The UI needs textures for the surface on 4K+ screens too.
        desc.required_limits.max_texture_dimension_2d = desc
            .required_limits
            .max_texture_dimension_2d
            .max(8192)
            .min(adapter.limits().max_texture_dimension_2d);
        desc
    });
    let options = eframe::NativeOptions {
        renderer: eframe::Renderer::Wgpu,
        viewport: egui::ViewportBuilder::default()
            .with_title("Drift")
            .with_inner_size([1100.0, 720.0]),
        wgpu_options: eframe::egui_wgpu::WgpuConfiguration {
            wgpu_setup: setup.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    eframe::run_native(
        "Drift",
        options,
        Box::new(|cc| {
            let rs = cc
                .wgpu_render_state
                .as_ref()
                .ok_or("eframe started without its wgpu renderer")?;
            let gpu = Arc::new(Gpu::adopt(
                rs.adapter.clone(),
                rs.device.clone(),
                rs.queue.clone(),
            ));
            let worker = llm_worker::LlmWorker::spawn(gpu.clone(), cc.egui_ctx.clone());
            Ok(Box::new(DriftApp::new(gpu, worker)))
        }),
    )
    .map_err(|e| anyhow!("could not open the window: {e}"))
}

#[derive(PartialEq)]
enum Tab {
    Chat,
    Device,
}

/// The window: a Chat tab (models run on the LLM worker thread) and a Device tab (features, live GPU
/// memory, the kernel self-test on eframe's own device).
struct DriftApp {
    gpu: Arc<Gpu>,
    tab: Tab,
    chat: chat::ChatPanel,
    worker: llm_worker::LlmWorker,
    selftest: Option<std::sync::mpsc::Receiver<String>>,
    selftest_result: Option<String>,
}

impl DriftApp {
    fn new(gpu: Arc<Gpu>, worker: llm_worker::LlmWorker) -> DriftApp {
        DriftApp {
            gpu,
            tab: Tab::Chat,
            chat: chat::ChatPanel::default(),
            worker,
            selftest: None,
            selftest_result: None,
        }
    }

    fn start_selftest(&mut self, ctx: &egui::Context) {
        let (tx, rx) = std::sync::mpsc::channel();
        let gpu = self.gpu.clone();
        let ctx = ctx.clone();
        std::thread::spawn(move || {
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
        });
        self.selftest = Some(rx);
    }
}

impl eframe::App for DriftApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        if let Some(rx) = &self.selftest
            && let Ok(msg) = rx.try_recv()
        {
            self.selftest_result = Some(msg);
            self.selftest = None;
        }
        self.chat.poll(&self.worker);
        let d = self.gpu.describe();
        egui::Panel::top("tabs").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.heading("Drift");
                ui.selectable_value(&mut self.tab, Tab::Chat, "Chat");
                ui.selectable_value(&mut self.tab, Tab::Device, "Device");
            });
        });
        let m = self.gpu.memory_report();
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label(format!("{} ({})", d.name, d.backend));
                ui.separator();
                ui.label(format!(
                    "GPU memory used by Drift: {:.1} MiB",
                    m.total_bytes as f64 / 1048576.0
                ));
            });
        });
        if self.tab == Tab::Chat {
            egui::CentralPanel::default().show(ui, |ui| self.chat.ui(ui, &self.worker));
            return;
        }
        egui::CentralPanel::default().show(ui, |ui| {
            ui.label(format!(
                "GPU: {} ({}, {})",
                d.name, d.backend, d.device_type
            ));
            ui.separator();
            egui::Grid::new("features").striped(true).show(ui, |ui| {
                for f in &d.features {
                    ui.label(f.name);
                    ui.label(if f.present { "yes" } else { "no" });
                    ui.end_row();
                }
            });
            ui.separator();
            let m = self.gpu.memory_report();
            ui.label(format!(
                "GPU memory used by Drift: {:.1} MiB",
                m.total_bytes as f64 / 1048576.0
            ));
            egui::Grid::new("memory").show(ui, |ui| {
                for c in &m.categories {
                    ui.label(c.name);
                    ui.label(format!(
                        "{:.1} MiB (peak {:.1})",
                        c.bytes as f64 / 1048576.0,
                        c.peak_bytes as f64 / 1048576.0
                    ));
                    ui.end_row();
                }
            });
            ui.separator();
            let running = self.selftest.is_some();
            if ui
                .add_enabled(!running, egui::Button::new("Run kernel self-test"))
                .clicked()
            {
                self.start_selftest(ui.ctx());
            }
            if running {
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("checking every kernel against CPU references...");
                });
            }
            if let Some(r) = &self.selftest_result {
                ui.label(r);
            }
        });
    }
}
