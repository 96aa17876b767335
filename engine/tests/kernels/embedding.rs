use crate::common::run_checks;
use drift_engine::selftest::embedding;

#[test]
fn embedding_matches_reference() {
    run_checks(embedding::checks);
}
