use crate::common::run_checks;
use drift_engine::selftest::rope;

#[test]
fn rope_matches_reference() {
    run_checks(rope::checks);
}
