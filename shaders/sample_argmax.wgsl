// Greedy token selection over the whole vocabulary in two dispatches: the id of the largest logit (lowest
// id on ties, as torch.argmax).
//   argmax_partial: workgroup w reduces the logits w*WG + lane, stepping by the whole grid, and writes its
//                   (id, value bits) to partial[2w ..].
//   argmax_final:   one workgroup reduces the `parts` pairs and writes the id to out[0] (the next step's
//                   input) and to history[step[0]] (the token's position); with ADVANCE it then moves
//                   the step state one row on, (kv_len, pos0) += 1, so the next decode step needs no
//                   write from the host.
// One workgroup over a 128k vocabulary walks 500 dependent loads per lane (~0.2 ms on an H200); spread over
// the device the first pass is a bandwidth-bound read of the logits.
//
// Specialisation: FINAL (which pass; the passes bind different buffers), ADVANCE.

struct Params {
    off_in: u32, off_out: u32, off_hist: u32, off_step: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    vocab: u32, parts: u32, p2: u32, p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if FINAL
@group(0) @binding(1) var<storage, read> partial: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read_write> history: array<u32>;
#if ADVANCE
@group(0) @binding(4) var<storage, read_write> step: array<u32>;
#else
@group(0) @binding(4) var<storage, read> step: array<u32>;
#endif
#else
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> partial: array<u32>;
#endif

const WG: u32 = 256u; // sample_reduce.wgsl (appended) reduces over it

#ifnot FINAL
@compute @workgroup_size(256)
fn argmax_partial(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    let stride = WG * nwg.x;
    for (var i = wid.x * WG + lid; i < p.vocab; i += stride) {
        let v = logits[p.off_in + i];
        if better(v, i, bv, bi) {
            bv = v;
            bi = i;
        }
    }
    let r = reduce_best(lid, bv, bi);
    if lid == 0u {
        partial[p.off_out + 2u * wid.x] = r.x;
        partial[p.off_out + 2u * wid.x + 1u] = r.y;
    }
}
#endif

#if FINAL
@compute @workgroup_size(256)
fn argmax_final(@builtin(local_invocation_index) lid: u32) {
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var j = lid; j < p.parts; j += WG) {
        let i = partial[p.off_in + 2u * j];
        let v = bitcast<f32>(partial[p.off_in + 2u * j + 1u]);
        if better(v, i, bv, bi) {
            bv = v;
            bi = i;
        }
    }
    let r = reduce_best(lid, bv, bi);
    if lid == 0u {
        out[p.off_out] = r.x;
        let kv_len = step[p.off_step];
        history[p.off_hist + kv_len] = r.x;
#if ADVANCE
        // Only this invocation reads the step state in this dispatch.
        step[p.off_step] = kv_len + 1u;
        step[p.off_step + 1u] += 1u;
#endif
    }
}
#endif
