use crate::common::run_checks;
use drift_engine::selftest::matmul;

#[test]
fn matmul_matches_reference() {
    run_checks(matmul::checks);
}
