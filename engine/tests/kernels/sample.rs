use crate::common::run_checks;
use drift_engine::selftest::sample;

#[test]
fn argmax_matches_reference() {
    run_checks(sample::checks);
}
