//! The Image tab (being built).

use eframe::egui;

use super::AppContext;

pub struct ImagePanel {}

impl ImagePanel {
    pub fn new(_app: &AppContext) -> ImagePanel {
        ImagePanel {}
    }

    pub fn poll(&mut self, _app: &mut AppContext) {}

    pub fn ui(&mut self, ui: &mut egui::Ui, _app: &mut AppContext) {
        ui.label("Image");
    }
}
