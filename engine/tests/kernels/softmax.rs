use crate::common::run_checks;
use drift_engine::selftest::softmax;

#[test]
fn softmax_matches_reference() {
    run_checks(softmax::checks);
}
