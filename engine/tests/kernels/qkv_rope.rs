use crate::common::run_checks;
use drift_engine::selftest::qkv_rope;

#[test]
fn qkv_split_and_rope_epilogue_match_reference() {
    run_checks(qkv_rope::checks);
}
