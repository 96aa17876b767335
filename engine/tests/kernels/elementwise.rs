use crate::common::run_checks;
use drift_engine::selftest::elementwise;

#[test]
fn elementwise_and_activations_match_reference() {
    run_checks(elementwise::checks);
}
