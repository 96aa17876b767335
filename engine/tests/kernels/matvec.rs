use crate::common::run_checks;
use drift_engine::selftest::matvec;

#[test]
fn matvec_matches_reference() {
    run_checks(matvec::checks);
}
