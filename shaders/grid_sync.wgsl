// Grid-wide barriers inside one dispatch, for kernels that run several dependent phases without a
// dispatch boundary between them (a decode step as one dispatch: the boundary, not the bytes, is what a
// small model's token costs). Every workgroup of the grid must be resident at once, which only the host
// can promise (a grid no larger than the device runs concurrently); a barrier that waits too long
// (SPIN_MAX polls) marks the grid timed out instead of hanging the GPU, and every later barrier of the
// dispatch then passes at once, so a wrong grid gives a wrong result and the flag, never a hang.
//
// The includer binds `gsync: array<atomic<u32>>`; from word `base`: [0] arrivals (bit 31: timed
// out), [1] exits, [2] sticky timeout flag for the host. Arrivals count up through the dispatch
// (barrier i waits for i * n_wg); the last workgroup to exit sets both counts back to zero for the
// next dispatch.
//
// Memory: storageBarrier() is a device-scope release/acquire in naga's SPIR-V, but drivers differ in
// what plain loads and stores it orders across workgroups (llvmpipe moves plain stores past it), so
// everything one workgroup hands to another inside the dispatch goes through atomic loads and stores,
// at addresses written once per dispatch.

const SPIN_MAX: u32 = 1048576u;
const TIMED_OUT: u32 = 0x80000000u;

// Waits until all `n_wg` workgroups have arrived at barrier number `i` (1, 2, ...).
fn grid_barrier(base: u32, i: u32, n_wg: u32, lid: u32) {
    grid_arrive(base, lid);
    grid_wait(base, i, n_wg, lid);
}

// The barrier in two halves: what a workgroup does between them (loads that do not depend on the
// other workgroups' results, say) overlaps the wait.
fn grid_arrive(base: u32, lid: u32) {
    storageBarrier();
    if lid == 0u {
        atomicAdd(&gsync[base], 1u);
    }
}

fn grid_wait(base: u32, i: u32, n_wg: u32, lid: u32) {
    if lid == 0u {
        let want = i * n_wg;
        var seen = atomicLoad(&gsync[base]);
        // Bounded, in nested loops: some drivers cut a long loop short by themselves (llvmpipe after
        // 65535 iterations), so whether the others came is read from the count, not the loop's end.
        for (var outer = 0u; outer < SPIN_MAX / 1024u && seen < want; outer++) {
            for (var spins = 0u; spins < 1024u && seen < want; spins++) {
                seen = atomicLoad(&gsync[base]);
            }
        }
        if seen < want {
            atomicOr(&gsync[base], TIMED_OUT);
            atomicStore(&gsync[base + 2u], 1u);
        }
    }
    storageBarrier();
}

// Called once by every workgroup after its last barrier: the last one out resets the counts.
fn grid_exit(base: u32, n_wg: u32, lid: u32) {
    if lid == 0u {
        if atomicAdd(&gsync[base + 1u], 1u) == n_wg - 1u {
            atomicStore(&gsync[base], 0u);
            atomicStore(&gsync[base + 1u], 0u);
        }
    }
}
