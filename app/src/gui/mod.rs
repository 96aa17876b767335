//! The desktop window. eframe opens the device with Drift's features; the engine adopts that same
//! adapter/device/queue, so the UI and inference share one GPU device.

mod chat;
mod chat_library;
mod chat_list;
mod chat_remote;
#[cfg(test)]
mod chat_remote_tests;
mod chat_remote_worker;
mod chat_settings;
#[cfg(test)]
mod chat_tests;
mod chat_transcript;
mod conversations;
mod gallery;
pub(crate) mod gpu_queue;
mod image;
mod image_form;
#[cfg(test)]
mod image_tests;
mod llm_worker;
mod models;
#[cfg(test)]
mod models_tests;
mod perf_device;
mod perf_kernels;
mod perf_log;
mod perf_vram;
mod performance;
#[cfg(test)]
mod performance_tests;
mod sd_worker;
mod serve_panel;
#[cfg(test)]
mod shell_tests;
#[cfg(test)]
mod test_support;

use std::sync::Arc;

use anyhow::{Result, anyhow};
use drift_engine::Gpu;
use eframe::egui;

use crate::paths::Paths;
use crate::settings::Settings;

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
    // The app id names drift.desktop, where Wayland compositors find the icon; X11 and Windows take it from here.
    let mut viewport = egui::ViewportBuilder::default()
        .with_title("Drift")
        .with_app_id("drift")
        .with_inner_size([1100.0, 720.0]);
    match eframe::icon_data::from_png_bytes(include_bytes!("../../../assets/icons/drift-256.png")) {
        Ok(icon) => viewport = viewport.with_icon(icon),
        Err(e) => log::warn!("the window icon could not be decoded: {e}"),
    }
    let options = eframe::NativeOptions {
        renderer: eframe::Renderer::Wgpu,
        viewport,
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
            let mut app = AppContext::new(gpu, Paths::from_env(), cc.egui_ctx.clone());
            app.render_state = Some(rs.clone());
            Ok(Box::new(DriftApp::new(app)))
        }),
    )
    .map_err(|e| anyhow!("could not open the window: {e}"))
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Tab {
    Chat,
    Image,
    Models,
    Performance,
}

/// What every panel may use: the shared GPU device, where files live, settings, the queue that runs GPU
/// jobs one at a time, the performance log the workers fill, and a one-line "what is running" status.
pub struct AppContext {
    pub gpu: Arc<Gpu>,
    pub paths: Paths,
    pub settings: Settings,
    pub gpu_queue: gpu_queue::GpuQueue,
    pub perf: perf_log::SharedPerfLog,
    pub egui_ctx: egui::Context,
    /// Set by panels each frame when they have work in flight (shown in the status bar).
    pub activity: Vec<String>,
    /// A panel may ask to switch tabs (e.g. an empty state pointing to Models).
    pub goto: Option<Tab>,
    /// eframe's renderer when it draws with `gpu`'s device: images go to the screen as GPU textures.
    pub render_state: Option<eframe::egui_wgpu::RenderState>,
}

impl AppContext {
    pub fn new(gpu: Arc<Gpu>, paths: Paths, egui_ctx: egui::Context) -> AppContext {
        let settings = Settings::load(&paths);
        AppContext {
            gpu,
            paths,
            settings,
            gpu_queue: gpu_queue::GpuQueue::default(),
            perf: Default::default(),
            egui_ctx,
            activity: Vec::new(),
            goto: None,
            render_state: None,
        }
    }

    pub fn save_settings(&self) {
        if let Err(e) = self.settings.save(&self.paths) {
            log::warn!("could not save settings: {e}");
        }
    }
}

/// The window: Chat, Image, Models and Performance tabs over one shared GPU device, a status bar.
pub struct DriftApp {
    pub app: AppContext,
    pub tab: Tab,
    pub chat: chat::ChatPanel,
    pub image: image::ImagePanel,
    pub models: models::ModelsPanel,
    pub performance: performance::PerformancePanel,
}

impl DriftApp {
    pub fn new(app: AppContext) -> DriftApp {
        DriftApp {
            chat: chat::ChatPanel::new(&app),
            image: image::ImagePanel::new(&app),
            models: models::ModelsPanel::new(&app),
            performance: performance::PerformancePanel::new(&app),
            app,
            tab: Tab::Chat,
        }
    }

    /// One frame of the whole window (eframe calls it; tests call it through egui_kittest).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.app.activity.clear();
        // Workers' results are applied every frame, whichever tab is visible.
        self.chat.poll(&mut self.app);
        self.image.poll(&mut self.app);
        self.models.poll(&mut self.app);
        self.performance.poll(&mut self.app);
        egui::Panel::top("tabs").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.heading("Drift");
                for (tab, name) in [
                    (Tab::Chat, "Chat"),
                    (Tab::Image, "Image"),
                    (Tab::Models, "Models"),
                    (Tab::Performance, "Performance"),
                ] {
                    ui.selectable_value(&mut self.tab, tab, name);
                }
            });
        });
        let d = self.app.gpu.describe();
        let m = self.app.gpu.memory_report();
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label(format!("{} ({})", d.name, d.backend));
                ui.separator();
                ui.label(format!(
                    "VRAM used by Drift: {:.1} MiB",
                    m.total_bytes as f64 / 1048576.0
                ));
                ui.separator();
                if self.app.activity.is_empty() {
                    ui.label("idle");
                } else {
                    ui.spinner();
                    ui.label(self.app.activity.join(" · "));
                }
            });
        });
        egui::CentralPanel::default().show(ui, |ui| match self.tab {
            Tab::Chat => self.chat.ui(ui, &mut self.app),
            Tab::Image => self.image.ui(ui, &mut self.app),
            Tab::Models => self.models.ui(ui, &mut self.app),
            Tab::Performance => self.performance.ui(ui, &mut self.app),
        });
        if let Some(tab) = self.app.goto.take() {
            self.tab = tab;
        }
    }
}

impl eframe::App for DriftApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}
