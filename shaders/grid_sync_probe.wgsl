// Probe of grid_barrier (grid_sync.wgsl, prepended): n_sync phases, each reading what another
// workgroup wrote in the phase before. data is [n_sync + 1][n_wg], each row written once:
// data[0][w] = w, data[s][w] = data[s - 1][(w + 1) % n_wg] + 1, so data[s][w] = (w + s) % n_wg + s.

struct Params {
    off_sync: u32, off_data: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    n_wg: u32,
    n_sync: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> gsync: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> data: array<atomic<u32>>;

@compute @workgroup_size(256)
fn grid_sync_probe(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let w = wid.x;
    let d = p.off_data;
    if lid == 0u {
        atomicStore(&data[d + w], w);
    }
    for (var s = 1u; s <= p.n_sync; s++) {
        grid_barrier(p.off_sync, s, p.n_wg, lid);
        if lid == 0u {
            atomicStore(&data[d + s * p.n_wg + w], atomicLoad(&data[d + (s - 1u) * p.n_wg + (w + 1u) % p.n_wg]) + 1u);
        }
    }
    grid_exit(p.off_sync, p.n_wg, lid);
}
