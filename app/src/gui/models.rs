//! The Models tab (being built).

use eframe::egui;

use super::AppContext;

pub struct ModelsPanel {}

impl ModelsPanel {
    pub fn new(_app: &AppContext) -> ModelsPanel {
        ModelsPanel {}
    }

    pub fn poll(&mut self, _app: &mut AppContext) {}

    pub fn ui(&mut self, ui: &mut egui::Ui, _app: &mut AppContext) {
        ui.label("Models");
    }
}
