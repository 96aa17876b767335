//! The session's images: thumbnails, one shown large with its parameters, "Use parameters" and "Save as".
//! Each image is drawn from a GPU texture the VAE output was packed into when the UI shares the engine's
//! device (registered with egui-wgpu), else from an egui texture uploaded from the RGB bytes.

use std::path::PathBuf;

use drift_engine::diffusion::display::DisplayTexture;
use drift_engine::diffusion::image::{Parameters, RgbImage, save_png};
use drift_engine::diffusion::schedulers::SchedulerKind;
use eframe::egui;
use eframe::egui_wgpu::RenderState;

/// A texture of ours registered with egui-wgpu's renderer; unregistered when dropped.
pub struct NativeTexture {
    pub id: egui::TextureId,
    pub texture: DisplayTexture,
    render_state: RenderState,
}

impl NativeTexture {
    pub fn register(render_state: &RenderState, texture: DisplayTexture) -> NativeTexture {
        let id = render_state.renderer.write().register_native_texture(
            &render_state.device,
            &texture.view,
            wgpu::FilterMode::Linear,
        );
        NativeTexture {
            id,
            texture,
            render_state: render_state.clone(),
        }
    }
}

impl Drop for NativeTexture {
    fn drop(&mut self) {
        self.render_state.renderer.write().free_texture(&self.id);
    }
}

/// How an image reaches the screen.
pub enum Shown {
    /// Straight from the GPU texture the VAE output was packed into.
    Gpu(Box<NativeTexture>),
    /// Uploaded by egui from the RGB bytes, at first display (into the context that draws it).
    Cpu(Option<egui::TextureHandle>),
}

pub struct GalleryImage {
    pub rgb: RgbImage,
    pub parameters: Parameters,
    pub scheduler: SchedulerKind,
    /// Where it was auto-saved (`None` when saving failed).
    pub path: Option<PathBuf>,
    pub seconds: f64,
    pub shown: Shown,
}

impl GalleryImage {
    pub fn texture_id(&mut self, ctx: &egui::Context) -> egui::TextureId {
        match &mut self.shown {
            Shown::Gpu(t) => t.id,
            Shown::Cpu(Some(h)) => h.id(),
            Shown::Cpu(slot) => slot.insert(cpu_texture(ctx, "sd image", &self.rgb)).id(),
        }
    }
}

/// What the user asked for in the gallery this frame.
pub enum GalleryAction {
    UseParameters(usize),
}

#[derive(Default)]
pub struct Gallery {
    pub images: Vec<GalleryImage>,
    pub selected: Option<usize>,
    /// The outcome of the last "Save as" (shown under the image).
    pub save_message: Option<String>,
}

/// An egui texture from RGB bytes (the fallback display path, and the live preview).
pub fn cpu_texture(ctx: &egui::Context, name: &str, img: &RgbImage) -> egui::TextureHandle {
    ctx.load_texture(
        name,
        egui::ColorImage::from_rgb([img.width, img.height], &img.pixels),
        egui::TextureOptions::LINEAR,
    )
}

/// `size` scaled down (never up) to fit `max`, keeping the aspect ratio.
pub fn fit(size: egui::Vec2, max: egui::Vec2) -> egui::Vec2 {
    if size.x <= 0.0 || size.y <= 0.0 {
        return egui::Vec2::ZERO;
    }
    size * (max.x / size.x).min(max.y / size.y).clamp(0.0, 1.0)
}

impl Gallery {
    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn push(&mut self, image: GalleryImage) {
        self.images.push(image);
        self.selected = Some(self.images.len() - 1);
        self.save_message = None;
    }

    /// The selected image large, with its parameters and actions.
    pub fn large_view(&mut self, ui: &mut egui::Ui) -> Option<GalleryAction> {
        let i = self.selected.filter(|&i| i < self.images.len())?;
        let id = self.images[i].texture_id(ui.ctx());
        let img = &self.images[i];
        let mut action = None;
        ui.horizontal(|ui| {
            if ui.button("Use parameters").clicked() {
                action = Some(GalleryAction::UseParameters(i));
            }
            if ui.button("Save as PNG...").clicked() {
                self.save_message = Some(save_as(img));
            }
            match &img.path {
                Some(p) => ui.weak(format!("saved to {}", p.display())),
                None => ui.weak("not saved"),
            };
        });
        if let Some(m) = &self.save_message {
            ui.label(m);
        }
        let how = match &img.shown {
            Shown::Gpu(t) => format!(
                "drawn from the GPU texture the VAE wrote ({} KiB)",
                t.texture.bytes() / 1024
            ),
            Shown::Cpu(_) => "drawn from an uploaded copy".into(),
        };
        ui.weak(format!(
            "{}x{} · {:.1} s · {how}",
            img.rgb.width, img.rgb.height, img.seconds
        ));
        ui.label(img.parameters.to_a1111());
        let size = egui::vec2(img.rgb.width as f32, img.rgb.height as f32);
        let avail = ui.available_size() - egui::vec2(0.0, 110.0);
        ui.add(
            egui::Image::new((id, fit(size, avail.max(egui::vec2(64.0, 64.0)))))
                .alt_text(format!("Selected image: {}", img.parameters.prompt)),
        );
        action
    }

    /// A strip of thumbnails; clicking one selects it.
    pub fn thumbnails(&mut self, ui: &mut egui::Ui) {
        egui::ScrollArea::horizontal()
            .id_salt("gallery thumbnails")
            .show(ui, |ui| {
                ui.horizontal(|ui| {
                    for (i, img) in self.images.iter_mut().enumerate() {
                        let id = img.texture_id(ui.ctx());
                        let size = egui::vec2(img.rgb.width as f32, img.rgb.height as f32);
                        let r = ui.add(
                            egui::Image::new((id, fit(size, egui::vec2(96.0, 96.0))))
                                .alt_text(format!("Image {}: {}", i + 1, img.parameters.prompt))
                                .sense(egui::Sense::click()),
                        );
                        if self.selected == Some(i) {
                            ui.painter().rect_stroke(
                                r.rect.expand(2.0),
                                2.0,
                                ui.visuals().selection.stroke,
                                egui::StrokeKind::Outside,
                            );
                        }
                        if r.clicked() {
                            self.selected = Some(i);
                            self.save_message = None;
                        }
                    }
                });
            });
    }
}

fn save_as(img: &GalleryImage) -> String {
    let name = img
        .path
        .as_ref()
        .and_then(|p| p.file_name())
        .map_or("image.png".into(), |n| n.to_string_lossy().into_owned());
    let Some(path) = rfd::FileDialog::new()
        .add_filter("PNG image", &["png"])
        .set_file_name(name)
        .save_file()
    else {
        return "not saved (cancelled)".into();
    };
    match save_png(&path, &img.rgb, Some(&img.parameters)) {
        Ok(()) => format!("saved {}", path.display()),
        Err(e) => format!("could not save: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::fit;
    use eframe::egui::vec2;

    #[test]
    fn fit_shrinks_keeping_aspect_and_never_enlarges() {
        assert_eq!(
            fit(vec2(512.0, 256.0), vec2(128.0, 128.0)),
            vec2(128.0, 64.0)
        );
        assert_eq!(
            fit(vec2(256.0, 512.0), vec2(128.0, 128.0)),
            vec2(64.0, 128.0)
        );
        assert_eq!(fit(vec2(16.0, 16.0), vec2(128.0, 128.0)), vec2(16.0, 16.0));
    }
}
