//! The Performance tab: Drift's live GPU memory by category against the device's budget, per-kernel GPU
//! timings and a dispatch timeline of the last profiled run (with the profiling toggle and a Chrome
//! trace export), throughput history (tokens/s per reply, seconds per image) and the device's facts.

use std::sync::MutexGuard;

use drift_engine::profiler::TimingSource;
use eframe::egui;
use egui_plot::{Legend, Line, Plot, PlotPoints, Points};

use super::AppContext;
use super::perf_device::{SelfTest, device_ui};
use super::perf_kernels::{KernelRow, SortOrder, kernel_rows, kernel_table, sort_rows, timeline};
use super::perf_log::{PerfLog, ProfiledRun, ReplySpeed};
use super::perf_vram::{DeviceMonitor, SAMPLE_EVERY, Sampler, vram_ui};
use crate::paths::write_atomic;

/// Identifies a profiled run cheaply (label, dispatch count, wall time bits).
type RunKey = (String, usize, u64);

fn run_key(run: &ProfiledRun) -> RunKey {
    (
        run.label.clone(),
        run.profile.dispatches.len(),
        run.profile.wall_us.to_bits(),
    )
}

pub struct PerformancePanel {
    monitor: DeviceMonitor,
    sampler: Sampler,
    order: SortOrder,
    /// The last run's rows, sorted by `order`, recomputed when the run or the order changes.
    rows: Option<(RunKey, SortOrder, Vec<KernelRow>)>,
    selftest: SelfTest,
    export_message: Option<String>,
}

fn lock(app: &AppContext) -> MutexGuard<'_, PerfLog> {
    app.perf.lock().unwrap_or_else(|p| p.into_inner())
}

impl PerformancePanel {
    pub fn new(app: &AppContext) -> PerformancePanel {
        PerformancePanel {
            monitor: DeviceMonitor::spawn(app.gpu.info.name.clone(), app.egui_ctx.clone()),
            sampler: Sampler::new(),
            order: SortOrder::default(),
            rows: None,
            selftest: SelfTest::default(),
            export_message: None,
        }
    }

    /// Samples VRAM (whatever tab is shown, so the plot has no gaps while the window repaints).
    pub fn poll(&mut self, app: &mut AppContext) {
        self.monitor.poll();
        self.selftest.poll();
        let report = app.gpu.memory_report();
        self.sampler.tick(&report, &mut lock(app));
        if self.selftest.running() {
            app.activity.push("Kernel self-test".into());
        }
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        // Keep the live plot moving while this tab is visible.
        ui.ctx().request_repaint_after(SAMPLE_EVERY);
        egui::ScrollArea::vertical().show(ui, |ui| {
            ui.heading("GPU memory");
            let report = app.gpu.memory_report();
            vram_ui(ui, &report, &self.monitor.budget, &lock(app));
            ui.separator();
            self.kernels_ui(ui, app);
            ui.separator();
            ui.heading("Throughput");
            throughput_ui(ui, &lock(app));
            ui.separator();
            egui::CollapsingHeader::new("Device")
                .default_open(true)
                .show(ui, |ui| {
                    device_ui(ui, &app.gpu, &app.gpu_queue, &mut self.selftest)
                });
        });
    }

    fn kernels_ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        ui.heading("Kernel timings");
        ui.horizontal(|ui| {
            if ui
                .checkbox(&mut app.settings.profiling, "Profile runs")
                .changed()
            {
                app.save_settings();
            }
            ui.weak("after each chat reply one decode step, after each image one UNet step, is timed dispatch by dispatch (costs a little time)");
        });
        let run = lock(app).last_run.clone();
        let Some(run) = run else {
            ui.label("No profiled run yet: turn on \"Profile runs\", then chat or make an image.");
            return;
        };
        let p = &run.profile;
        ui.horizontal(|ui| {
            ui.label(format!(
                "Last run: {} · {} dispatches · GPU busy {:.2} ms · wall {:.2} ms · timed by {}",
                run.label,
                p.dispatches.len(),
                p.busy_us() / 1e3,
                p.wall_us / 1e3,
                match p.source {
                    TimingSource::GpuInsidePass => "GPU timestamps around each dispatch",
                    TimingSource::GpuPerPass => "GPU timestamps, one pass per dispatch",
                    TimingSource::Cpu => "the CPU clock (this device has no GPU timestamps)",
                }
            ));
            if ui.button("Export Chrome trace...").clicked() {
                self.export_message = Some(export_trace(&run));
            }
        });
        if let Some(m) = &self.export_message {
            ui.label(m);
        }
        let key = run_key(&run);
        if self
            .rows
            .as_ref()
            .is_none_or(|(k, o, _)| *k != key || *o != self.order)
        {
            let mut rows = kernel_rows(p);
            sort_rows(&mut rows, self.order);
            self.rows = Some((key, self.order, rows));
        }
        if let Some((_, _, rows)) = &self.rows {
            kernel_table(ui, rows, &mut self.order);
        }
        ui.label("Timeline (one bar per dispatch)");
        timeline(ui, p);
    }
}

fn export_trace(run: &ProfiledRun) -> String {
    let Some(path) = rfd::FileDialog::new()
        .add_filter("Chrome trace", &["json"])
        .set_file_name("drift-trace.json")
        .save_file()
    else {
        return "export cancelled".into();
    };
    match write_atomic(&path, run.profile.chrome_trace_json().as_bytes()) {
        Ok(()) => format!(
            "wrote {} (open it in chrome://tracing or ui.perfetto.dev)",
            path.display()
        ),
        Err(e) => format!("could not write {}: {e}", path.display()),
    }
}

/// Tokens/s per chat reply and seconds per image, one point per reply or image.
fn throughput_ui(ui: &mut egui::Ui, perf: &PerfLog) {
    let width = (ui.available_width() / 2.0 - 8.0).max(200.0);
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            let prompt: usize = perf.replies.iter().map(|r| r.prefill_tokens).sum();
            let decoded: usize = perf.replies.iter().map(|r| r.decode_tokens).sum();
            ui.label(format!(
                "Chat replies: {} ({prompt} prompt tokens, {decoded} generated)",
                perf.replies.len()
            ));
            let series = |f: fn(&ReplySpeed) -> f64| -> Vec<[f64; 2]> {
                perf.replies
                    .iter()
                    .enumerate()
                    .map(|(i, r)| [i as f64 + 1.0, f(r)])
                    .collect()
            };
            let decode = series(|r| r.decode_tokens_per_s);
            let prefill = series(|r| r.prefill_tokens_per_s);
            Plot::new("tokens per second")
                .width(width)
                .height(140.0)
                .legend(Legend::default())
                .x_axis_label("reply")
                .y_axis_label("tokens/s")
                .include_y(0.0)
                .allow_scroll(false)
                .show(ui, |plot| {
                    // Lines join the replies; points keep a single reply visible.
                    for (name, pts, color) in [
                        ("decode", decode, egui::Color32::from_rgb(230, 120, 90)),
                        ("prefill", prefill, egui::Color32::from_rgb(90, 150, 230)),
                    ] {
                        plot.line(Line::new(name, PlotPoints::from(pts.clone())).color(color));
                        plot.points(
                            Points::new(name, PlotPoints::from(pts))
                                .color(color)
                                .radius(3.0),
                        );
                    }
                });
        });
        ui.vertical(|ui| {
            ui.label(format!("Images: {}", perf.image_seconds.len()));
            let points: Vec<[f64; 2]> = perf
                .image_seconds
                .iter()
                .enumerate()
                .map(|(i, s)| [i as f64 + 1.0, *s])
                .collect();
            Plot::new("seconds per image")
                .width(width)
                .height(140.0)
                .x_axis_label("image")
                .y_axis_label("seconds")
                .include_y(0.0)
                .allow_scroll(false)
                .show(ui, |plot| {
                    plot.line(Line::new(
                        "seconds per image",
                        PlotPoints::from(points.clone()),
                    ));
                    plot.points(Points::new("images", PlotPoints::from(points)).radius(3.0));
                });
        });
    });
}
