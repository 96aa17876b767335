// Token selection on the GPU, so a decode step reads back a token id (greedy, sample_argmax.wgsl) or a
// short candidate list (sampling), never the logits.
//   topk:   repetition penalty over the last `window` tokens of history, then the k largest logits as
//           (id, value) pairs, plus max and sum(exp((l - max) * inv_temp)) over the whole vocabulary so
//           the host can turn candidate logits into exact probabilities.

struct Params {
    off_logits: u32, off_out: u32, off_hist: u32, off_step: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    vocab: u32, k: u32, window: u32, penalty: f32,
    inv_temp: f32, p0: u32, p1: u32, p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
// The candidates [k * 2 + 2] (ids and value bits interleaved, then max and sum).
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read_write> history: array<u32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;

const WG: u32 = 256u; // sample_reduce.wgsl (appended) reduces over it
var<workgroup> acc: array<f32, WG>;

// Workgroup argmax over logits, skipping ids already taken (value -inf marks them).
fn reduce_argmax(lid: u32) -> vec2<u32> {
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < p.vocab; i += WG) {
        let v = logits[p.off_logits + i];
        if better(v, i, bv, bi) {
            bv = v;
            bi = i;
        }
    }
    return reduce_best(lid, bv, bi);
}

@compute @workgroup_size(256)
fn topk(@builtin(local_invocation_index) lid: u32) {
    let kv_len = step[p.off_step];
    // Repetition penalty (as transformers): divide positive logits, multiply negative ones, once per
    // distinct token in the window. Thread 0 alone, so a token repeated in the window is penalised once.
    if lid == 0u && p.penalty != 1.0 {
        let start = select(0u, kv_len - p.window, kv_len > p.window);
        for (var j = start; j < kv_len; j++) {
            let id = history[p.off_hist + j];
            var seen = false;
            for (var q = start; q < j; q++) {
                if history[p.off_hist + q] == id {
                    seen = true;
                    break;
                }
            }
            if !seen && id < p.vocab {
                let v = logits[p.off_logits + id];
                logits[p.off_logits + id] = select(v * p.penalty, v / p.penalty, v > 0.0);
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    // Normaliser over the whole vocabulary at the sampling temperature.
    let top = reduce_argmax(lid);
    let vmax = bitcast<f32>(top.y);
    var s = 0.0;
    for (var i = lid; i < p.vocab; i += WG) {
        s += exp((logits[p.off_logits + i] - vmax) * p.inv_temp);
    }
    acc[lid] = s;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w >>= 1u) {
        if lid < w {
            acc[lid] += acc[lid + w];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        out[p.off_out + 2u * p.k] = bitcast<u32>(vmax);
        out[p.off_out + 2u * p.k + 1u] = bitcast<u32>(acc[0]);
    }
    // k rounds of argmax; each winner is recorded, then knocked out with -inf (logits are scratch).
    for (var r = 0u; r < p.k; r++) {
        let b = reduce_argmax(lid);
        if lid == 0u {
            out[p.off_out + 2u * r] = b.x;
            out[p.off_out + 2u * r + 1u] = b.y;
            if b.x < p.vocab {
                logits[p.off_logits + b.x] = -3.4e38;
            }
        }
        storageBarrier();
        workgroupBarrier();
    }
}
