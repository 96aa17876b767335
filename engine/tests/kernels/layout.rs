use crate::common::run_checks;
use drift_engine::selftest::layout;

#[test]
fn layout_matches_reference() {
    run_checks(layout::checks);
}
