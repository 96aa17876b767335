//! The window's shell: tabs switch, the status bar names the device.

use egui_kittest::kittest::Queryable;

use super::Tab;
use super::test_support::{harness, temp_root, test_app};

#[test]
fn tabs_switch_and_status_bar_shows_the_device() {
    let root = temp_root("shell");
    let mut h = harness(test_app(&root));
    h.run();
    let name = h.state().app.gpu.describe().name.clone();
    h.get_by_label_contains(&name);
    for (label, tab) in [
        ("Image", Tab::Image),
        ("Models", Tab::Models),
        ("Performance", Tab::Performance),
        ("Chat", Tab::Chat),
    ] {
        h.get_by_label(label).click();
        h.run();
        assert_eq!(h.state().tab, tab, "clicking {label}");
    }
    let _ = std::fs::remove_dir_all(&root);
}
