use crate::common::run_checks;
use drift_engine::selftest::conv;

#[test]
fn conv_matches_reference() {
    run_checks(conv::checks);
}
