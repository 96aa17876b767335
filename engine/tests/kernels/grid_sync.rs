use crate::common::run_checks;
use drift_engine::selftest::grid_sync;

#[test]
fn grid_barrier_orders_phases() {
    run_checks(grid_sync::checks);
}
