//! The desktop window. eframe opens the device with Drift's features; the engine adopts that same
//! adapter/device/queue, so the UI and inference share one GPU device.

use std::sync::Arc;

use anyhow::{Result, anyhow};
use drift_engine::Gpu;
use eframe::egui;

pub fn run() -> Result<()> {
    let mut setup = eframe::egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    setup.device_descriptor = Arc::new(|adapter| {
        let mut desc = drift_engine::gpu::device_descriptor(adapter);
        // The UI needs textures for the surface on 4K+ screens too.
        desc.required_limits.max_texture_dimension_2d = desc.required_limits.max_texture_dimension_2d.max(8192).min(adapter.limits().max_texture_dimension_2d);
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
            let gpu = Gpu::adopt(rs.adapter.clone(), rs.device.clone(), rs.queue.clone());
            Ok(Box::new(DriftApp { gpu: Arc::new(gpu) }))
        }),
    )
    .map_err(|e| anyhow!("could not open the window: {e}"))
}

struct DriftApp {
    gpu: Arc<Gpu>,
}

impl eframe::App for DriftApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        egui::CentralPanel::default().show(ui, |ui| {
            ui.heading("Drift");
            let d = self.gpu.describe();
            ui.label(format!("GPU: {} ({}, {})", d.name, d.backend, d.device_type));
            ui.separator();
            ui.label("Features");
            for f in &d.features {
                ui.label(format!("{}  {}", if f.present { "✔" } else { "✖" }, f.name));
            }
            ui.separator();
            let m = self.gpu.memory_report();
            ui.label(format!("Drift GPU memory: {:.1} MiB", m.total_bytes as f64 / 1048576.0));
            for c in &m.categories {
                ui.label(format!("  {}: {:.1} MiB", c.name, c.bytes as f64 / 1048576.0));
            }
        });
    }
}
