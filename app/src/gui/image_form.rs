//! The Image tab's settings form: prompt, negative prompt, steps, CFG scale, seed (with a random
//! button), size presets, scheduler, batch count and img2img (picture and strength). Every widget is
//! tied to its label (screen readers and tests find it by name).

use drift_engine::diffusion::schedulers::SchedulerKind;
use eframe::egui;

/// The settings of one generation, as the form edits them.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageForm {
    pub prompt: String,
    pub negative: String,
    pub steps: usize,
    pub cfg: f32,
    pub seed: u64,
    pub width: usize,
    pub height: usize,
    pub scheduler: SchedulerKind,
    /// img2img: the starting picture (empty = text-to-image) and how much of it to repaint.
    pub init_image: String,
    pub strength: f32,
    pub batch: usize,
}

impl Default for ImageForm {
    fn default() -> ImageForm {
        ImageForm {
            prompt: String::new(),
            negative: String::new(),
            steps: 20,
            cfg: 7.5,
            seed: 0,
            width: 512,
            height: 512,
            scheduler: SchedulerKind::EulerAncestral,
            init_image: String::new(),
            strength: 0.75,
            batch: 1,
        }
    }
}

/// Width x height presets (SD 1.x is trained at 512; multiples of 64 keep every UNet level even).
const SIZE_PRESETS: [(usize, usize); 6] = [
    (512, 512),
    (512, 768),
    (768, 512),
    (768, 768),
    (384, 384),
    (256, 256),
];

/// A label and a widget tied to it (so screen readers and tests find the widget by the label's text).
fn labelled(ui: &mut egui::Ui, text: &str, widget: impl egui::Widget) -> egui::Response {
    ui.horizontal(|ui| {
        let label = ui.label(text);
        ui.add(widget).labelled_by(label.id)
    })
    .inner
}

pub fn form_ui(ui: &mut egui::Ui, f: &mut ImageForm) {
    let label = ui.label("Prompt");
    ui.add(
        egui::TextEdit::multiline(&mut f.prompt)
            .desired_rows(3)
            .desired_width(f32::INFINITY),
    )
    .labelled_by(label.id);
    let label = ui.label("Negative prompt");
    ui.add(
        egui::TextEdit::multiline(&mut f.negative)
            .desired_rows(2)
            .desired_width(f32::INFINITY),
    )
    .labelled_by(label.id);
    labelled(
        ui,
        "Steps",
        egui::DragValue::new(&mut f.steps).range(1..=150),
    );
    labelled(
        ui,
        "CFG scale",
        egui::DragValue::new(&mut f.cfg)
            .range(0.0..=30.0)
            .speed(0.1),
    );
    ui.horizontal(|ui| {
        let label = ui.label("Seed");
        ui.add(egui::DragValue::new(&mut f.seed))
            .labelled_by(label.id);
        if ui.button("Random seed").clicked() {
            f.seed = random_seed();
        }
    });
    egui::ComboBox::from_label("Size preset")
        .selected_text(format!("{} x {}", f.width, f.height))
        .show_ui(ui, |ui| {
            for (w, h) in SIZE_PRESETS {
                let r = ui.selectable_label((f.width, f.height) == (w, h), format!("{w} x {h}"));
                if r.clicked() {
                    (f.width, f.height) = (w, h);
                }
            }
        });
    ui.horizontal(|ui| {
        let label = ui.label("Width");
        ui.add(egui::DragValue::new(&mut f.width).range(8..=4096).speed(8))
            .labelled_by(label.id);
        let label = ui.label("Height");
        ui.add(egui::DragValue::new(&mut f.height).range(8..=4096).speed(8))
            .labelled_by(label.id);
    });
    egui::ComboBox::from_label("Scheduler")
        .selected_text(f.scheduler.a1111_name())
        .show_ui(ui, |ui| {
            for k in SchedulerKind::ALL {
                ui.selectable_value(&mut f.scheduler, k, k.a1111_name());
            }
        });
    labelled(
        ui,
        "Batch count",
        egui::DragValue::new(&mut f.batch).range(1..=16),
    );
    ui.separator();
    let label = ui.label("img2img: start from an image");
    ui.horizontal(|ui| {
        ui.add(
            egui::TextEdit::singleline(&mut f.init_image)
                .hint_text("no image: text-to-image")
                .desired_width(180.0),
        )
        .labelled_by(label.id);
        if ui.button("Pick image...").clicked()
            && let Some(p) = rfd::FileDialog::new()
                .add_filter("PNG image", &["png"])
                .pick_file()
        {
            f.init_image = p.display().to_string();
        }
        if !f.init_image.is_empty() && ui.button("Clear").clicked() {
            f.init_image.clear();
        }
    });
    if !f.init_image.trim().is_empty() {
        labelled(
            ui,
            "Strength",
            egui::Slider::new(&mut f.strength, 0.0..=1.0),
        );
    }
}

/// A random seed: the clock hashed by std's randomly keyed hasher (no RNG crate needed).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    // A1111 and most tools show seeds as 32-bit numbers.
    h.finish() & 0xffff_ffff
}
