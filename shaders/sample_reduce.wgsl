// The workgroup's best (largest value, then smallest id) of its invocations' (value, id) pairs, shared
// by the top-k kernel (sample.wgsl) and the greedy argmax (sample_argmax.wgsl): appended to both, whose
// host file declares WG.
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Every invocation gets (best id, bits of the best value); the workgroup memory is free again after.
fn reduce_best(lid: u32, v: f32, i: u32) -> vec2<u32> {
    best_v[lid] = v;
    best_i[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s && better(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid]) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(best_i[0], bitcast<u32>(best_v[0]));
    workgroupBarrier();
    return r;
}
