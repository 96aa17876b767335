use crate::common::run_checks;
use drift_engine::selftest::attention;

#[test]
fn attention_matches_reference() {
    run_checks(attention::checks);
}
