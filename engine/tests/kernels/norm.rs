use crate::common::run_checks;
use drift_engine::selftest::norm;

#[test]
fn norm_matches_reference() {
    run_checks(norm::checks);
}
