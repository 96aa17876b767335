//! The Performance tab (being built).

use eframe::egui;

use super::AppContext;

pub struct PerformancePanel {}

impl PerformancePanel {
    pub fn new(_app: &AppContext) -> PerformancePanel {
        PerformancePanel {}
    }

    pub fn poll(&mut self, _app: &mut AppContext) {}

    pub fn ui(&mut self, ui: &mut egui::Ui, _app: &mut AppContext) {
        ui.label("Performance");
    }
}
