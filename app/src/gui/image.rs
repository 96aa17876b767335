//! The Image tab: a Stable Diffusion model (diffusers folder or .safetensors file), prompt and settings on
//! the left; progress with a live preview, the selected image and the session's gallery on the right.
//! Images are made on the SD worker thread.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, channel};

use drift_engine::diffusion::image::RgbImage;
use eframe::egui;

use super::gallery::{
    Gallery, GalleryAction, GalleryImage, NativeTexture, Shown, cpu_texture, fit,
};
use super::image_form::{ImageForm, form_ui};
use super::sd_worker::{Event, FinishedImage, ImageJob, SdWorker, WorkerContext};
use super::{AppContext, Tab};
use crate::hub::kind::ModelKind;
use crate::hub::library;

/// The image models in the library (models folder, Hugging Face cache, imports): (name, path), listed on
/// a thread because it reads every model's header.
#[derive(Default)]
struct LibraryModels {
    pending: Option<Receiver<Vec<(String, PathBuf)>>>,
    entries: Vec<(String, PathBuf)>,
}

impl LibraryModels {
    fn refresh(&mut self, app: &AppContext) {
        let (tx, rx) = channel();
        let (settings, paths, ctx) = (
            app.settings.clone(),
            app.paths.clone(),
            app.egui_ctx.clone(),
        );
        std::thread::Builder::new()
            .name("drift-image-library".into())
            .spawn(move || {
                let found = library::list(&settings, &paths)
                    .into_iter()
                    .filter(|e| e.kind == ModelKind::Diffusion)
                    .map(|e| (e.name, e.path))
                    .collect();
                let _ = tx.send(found);
                ctx.request_repaint();
            })
            .expect("spawning a thread");
        self.pending = Some(rx);
    }

    fn poll(&mut self) {
        if let Some(rx) = &self.pending
            && let Ok(found) = rx.try_recv()
        {
            self.entries = found;
            self.pending = None;
        }
    }
}

/// Where a running job is.
struct Progress {
    loading: bool,
    image: usize,
    images: usize,
    step: usize,
    steps: usize,
}

pub struct ImagePanel {
    worker: SdWorker,
    library: LibraryModels,
    pub model_path: String,
    pub form: ImageForm,
    progress: Option<Progress>,
    /// The latest step's preview, uploaded when the tab draws (`None` in the slot: not yet).
    preview: Option<(RgbImage, Option<egui::TextureHandle>)>,
    pub gallery: Gallery,
    pub error: Option<String>,
    warnings: Vec<String>,
}

impl ImagePanel {
    pub fn new(app: &AppContext) -> ImagePanel {
        let worker = SdWorker::spawn(WorkerContext {
            gpu: app.gpu.clone(),
            queue: app.gpu_queue.clone(),
            perf: app.perf.clone(),
            images_dir: app.paths.images_dir(),
            egui_ctx: app.egui_ctx.clone(),
        });
        let mut library = LibraryModels::default();
        library.refresh(app);
        ImagePanel {
            worker,
            library,
            model_path: app
                .settings
                .last_image_model
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            form: ImageForm::default(),
            progress: None,
            preview: None,
            gallery: Gallery::default(),
            error: None,
            warnings: Vec::new(),
        }
    }

    /// The image models the library listed: (name, path).
    #[cfg(test)]
    pub fn library_models(&self) -> &[(String, PathBuf)] {
        &self.library.entries
    }

    pub fn busy(&self) -> bool {
        self.progress.is_some()
    }

    /// Applies what the worker sent since the last frame.
    pub fn poll(&mut self, app: &mut AppContext) {
        self.library.poll();
        while let Ok(ev) = self.worker.events.try_recv() {
            match ev {
                Event::Loading => {
                    if let Some(p) = &mut self.progress {
                        p.loading = true;
                    }
                }
                Event::Started { image, images } => {
                    self.progress = Some(Progress {
                        loading: false,
                        image,
                        images,
                        step: 0,
                        steps: self.form.steps,
                    });
                }
                Event::Step {
                    step,
                    steps,
                    preview,
                } => {
                    if let Some(p) = &mut self.progress {
                        (p.step, p.steps) = (step, steps);
                    }
                    self.preview = Some((preview, None));
                }
                Event::Image(done) => self.add_image(app, *done),
                Event::Error(e) => self.error = Some(e),
                Event::Done => {
                    self.progress = None;
                    self.preview = None;
                }
            }
        }
        if let Some(p) = &self.progress {
            app.activity.push(if p.loading {
                "Image: loading the model".into()
            } else if p.step == 0 {
                format!("Image {}/{}: starting", p.image, p.images)
            } else {
                format!("Image: step {}/{}", p.step, p.steps)
            });
        }
    }

    fn add_image(&mut self, app: &AppContext, done: FinishedImage) {
        let shown = match (done.texture, &app.render_state) {
            (Some(tex), Some(rs)) => Shown::Gpu(Box::new(NativeTexture::register(rs, tex))),
            _ => Shown::Cpu(None),
        };
        self.warnings = done.warnings;
        let path = match done.saved {
            Ok(p) => Some(p),
            Err(e) => {
                self.error = Some(format!("could not save the image: {e}"));
                None
            }
        };
        self.gallery.push(GalleryImage {
            rgb: done.rgb,
            parameters: done.parameters,
            scheduler: done.scheduler,
            path,
            seconds: done.times.total_ms / 1e3,
            shown,
        });
    }

    fn start(&mut self, app: &mut AppContext) {
        let model = PathBuf::from(self.model_path.trim());
        if app.settings.last_image_model.as_ref() != Some(&model) {
            app.settings.last_image_model = Some(model.clone());
            app.save_settings();
        }
        let f = &self.form;
        let init = (!f.init_image.trim().is_empty())
            .then(|| (PathBuf::from(f.init_image.trim()), f.strength));
        // Draw with the engine's texture only when the renderer uses the engine's device.
        let gpu_texture = app
            .render_state
            .as_ref()
            .is_some_and(|rs| rs.device == app.gpu.device);
        self.worker.send(ImageJob {
            model,
            width: f.width,
            height: f.height,
            prompt: f.prompt.clone(),
            negative: f.negative.clone(),
            steps: f.steps,
            cfg: f.cfg,
            seed: f.seed,
            scheduler: f.scheduler,
            init,
            batch: f.batch,
            profile: app.settings.profiling,
            gpu_texture,
        });
        self.error = None;
        self.warnings.clear();
        self.progress = Some(Progress {
            loading: false,
            image: 1,
            images: f.batch,
            step: 0,
            steps: f.steps,
        });
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        egui::Panel::left("image settings")
            .resizable(true)
            .default_size(340.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| self.settings_ui(ui, app));
            });
        egui::CentralPanel::default().show(ui, |ui| self.output_ui(ui, app));
    }

    fn settings_ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        let busy = self.busy();
        let label = ui.label("Model");
        ui.add(
            egui::TextEdit::singleline(&mut self.model_path)
                .hint_text("a diffusers folder or a .safetensors file")
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);
        ui.horizontal(|ui| {
            egui::ComboBox::from_label("Library")
                .selected_text(match self.library.entries.len() {
                    0 => "no image models".to_string(),
                    n => format!("{n} image models"),
                })
                .show_ui(ui, |ui| {
                    for (name, path) in &self.library.entries {
                        if ui.selectable_label(false, name).clicked() {
                            self.model_path = path.display().to_string();
                        }
                    }
                });
            if self.library.pending.is_some() {
                ui.spinner();
            } else if ui.button("Refresh").clicked() {
                self.library.refresh(app);
            }
        });
        ui.horizontal(|ui| {
            if ui.button("Folder...").clicked()
                && let Some(p) = rfd::FileDialog::new().pick_folder()
            {
                self.model_path = p.display().to_string();
            }
            if ui.button("File...").clicked()
                && let Some(p) = rfd::FileDialog::new()
                    .add_filter("safetensors", &["safetensors"])
                    .pick_file()
            {
                self.model_path = p.display().to_string();
            }
        });
        ui.separator();
        form_ui(ui, &mut self.form);
        ui.separator();
        ui.horizontal(|ui| {
            if busy {
                if ui.button("Cancel").clicked() {
                    self.worker
                        .cancel
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            } else {
                let ready = !self.model_path.trim().is_empty();
                if ui
                    .add_enabled(ready, egui::Button::new("Generate"))
                    .clicked()
                {
                    self.start(app);
                }
            }
        });
    }

    fn output_ui(&mut self, ui: &mut egui::Ui, app: &mut AppContext) {
        if let Some(e) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        for w in &self.warnings {
            ui.colored_label(ui.visuals().warn_fg_color, w);
        }
        if self.model_path.trim().is_empty() && self.gallery.len() == 0 {
            ui.add_space(24.0);
            ui.heading("No image model yet");
            ui.label(
                "Download a Stable Diffusion 1.x model in the Models tab, or choose a diffusers \
                 folder or a single .safetensors file on the left.",
            );
            if ui.button("Open the Models tab").clicked() {
                app.goto = Some(Tab::Models);
            }
            return;
        }
        if let Some(p) = &self.progress {
            let (text, frac) = if p.loading {
                ("loading the model...".to_string(), 0.0)
            } else if p.step == 0 && app.gpu_queue.waiting() > 0 {
                (
                    "waiting for the GPU (another job is running)".to_string(),
                    0.0,
                )
            } else {
                (
                    format!(
                        "image {}/{} · step {}/{}",
                        p.image, p.images, p.step, p.steps
                    ),
                    p.step as f32 / p.steps.max(1) as f32,
                )
            };
            ui.add(egui::ProgressBar::new(frac).text(text));
            if let Some((img, slot)) = &mut self.preview {
                let t = slot.get_or_insert_with(|| cpu_texture(ui.ctx(), "sd preview", img));
                // The latent preview is 8x smaller than the image: show it at the image's size.
                let size = egui::vec2(self.form.width as f32, self.form.height as f32);
                let avail = ui.available_size() - egui::vec2(0.0, 120.0);
                ui.add(
                    egui::Image::new((t.id(), fit(size, avail.max(egui::vec2(64.0, 64.0)))))
                        .alt_text("Live preview"),
                );
            }
        } else if let Some(GalleryAction::UseParameters(i)) = self.gallery.large_view(ui) {
            let img = &self.gallery.images[i];
            let p = &img.parameters;
            self.form = ImageForm {
                prompt: p.prompt.clone(),
                negative: p.negative.clone(),
                steps: p.steps,
                cfg: p.cfg,
                seed: p.seed,
                width: p.width,
                height: p.height,
                scheduler: img.scheduler,
                batch: 1,
                ..self.form.clone()
            };
        }
        if self.gallery.len() > 0 {
            ui.separator();
            self.gallery.thumbnails(ui);
        } else if self.progress.is_none() {
            ui.weak("Write a prompt and press Generate: the images of this session collect here.");
        }
    }
}
