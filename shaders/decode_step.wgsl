// A whole Llama decode step in one dispatch: every layer's QKV + RoPE, attention, O + residual,
// gate-up + SwiGLU and down + residual, then the final norm and the LM head, as phases separated by
// grid-wide barriers (grid_sync.wgsl, prepended). A small model's token is bound by dispatch
// boundaries (~5 us each on the H200 for ~1 us of bytes); a grid barrier costs ~1 us and its phase
// starts with no launch ramp.
//
// Every workgroup runs every phase (idle ones go straight to the barrier) and takes phase work by
// "team" (one subgroup): team t of T = n_wg * subgroups takes units t, t + T, ...
//
// Bindings: w (f16 weights, 8 per vec4<u32>: per layer qkv, o, gate_up, down at the offsets below, then
// the LM head, then an untied embedding table), fp (f32: per layer attn_norm, ffn_norm, qkv bias; then
// the final norm and the rope turns), kv (f16 cache: [layer][k | v][max_ctx][HKV][D]), gsync (the
// grid's sync words, then the activations one phase hands to the next, f32 bits through atomics, see
// grid_sync.wgsl; each is written by one phase and read by later ones before the next write, barriers
// between, so one copy serves every layer), step (kv_len, pos), ids (the input token at 0), logits
// (f32, written last, read by later dispatches). The step's own K and V rows reach this step's
// attention through gsync; the cache copy is for later steps.
//
// Specialisation: H, I, HQ, HKV, D, ROT (rotary dims), V (vocab), L (layers), INTERLEAVED (rope_dims),
// BIAS, LG, W_LAYER / W_EMBED / F_LAYER (offsets), XS (f32 workgroup vector length).
enable f16;

struct Params {
    off_w: u32, off_f: u32, off_kv: u32, off_s: u32, off_step: u32, off_ids: u32, off_logits: u32, o7: u32,
    max_ctx: u32,
    n_wg: u32,
    eps: f32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> fp: array<f32>;
@group(0) @binding(3) var<storage, read_write> kv: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> gsync: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read> step: array<u32>;
@group(0) @binding(6) var<storage, read> ids: array<u32>;
@group(0) @binding(7) var<storage, read_write> logits: array<f32>;

const H: u32 = {{H}}u;
const I: u32 = {{I}}u;
const HQ: u32 = {{HQ}}u;
const HKV: u32 = {{HKV}}u;
const D: u32 = {{D}}u;
const ROT: u32 = {{ROT}}u;
const V: u32 = {{V}}u;
const L: u32 = {{L}}u;
const XS: u32 = {{XS}}u;
const WG: u32 = 256u;
const G: u32 = HQ / HKV;
const NQKV: u32 = (HQ + 2u * HKV) * D;
// Attention: a head's keys in at most MAXC chunks of at least CK_MIN keys (one unit each); LG lanes
// per key (up to 8) and DPL dims per lane (a multiple of 4).
const MAXC: u32 = 16u;
const CK_MIN: u32 = 64u;
const LG: u32 = {{LG}}u;
const DPL: u32 = D / LG;
const NEG: f32 = -1.0e30;

// Weights, in f16 elements: one layer's block, then the LM head and the embedding table.
const W_QKV: u32 = 0u;
const W_O: u32 = W_QKV + NQKV * H;
const W_GU: u32 = W_O + H * HQ * D;
const W_DOWN: u32 = W_GU + 2u * I * H;
const W_LAYER: u32 = {{W_LAYER}}u;   // W_DOWN + H * I, padded
const W_HEAD: u32 = L * W_LAYER;
const W_EMBED: u32 = {{W_EMBED}}u;   // W_HEAD when tied
// fp, in f32 elements.
const F_ATTN_NORM: u32 = 0u;
const F_FFN_NORM: u32 = H;
const F_BIAS: u32 = 2u * H;
const F_LAYER: u32 = {{F_LAYER}}u;   // 2 H (+ NQKV with BIAS)
const F_NORM: u32 = L * F_LAYER;
const F_TURNS: u32 = F_NORM + H;
// Activations, in words after the sync words.
const A_SYNC: u32 = 4u;
const A_Q: u32 = 0u;
const A_K: u32 = A_Q + HQ * D;
const A_V: u32 = A_K + HKV * D;
const A_PART: u32 = A_V + HKV * D;   // [HQ][MAXC][D + 2]: acc, max, sum
const A_XA: u32 = A_PART + HQ * MAXC * (D + 2u);
const A_ACT: u32 = A_XA + H;
const A_XB: u32 = A_ACT + I;

var<workgroup> xs: array<f32, XS>;
var<workgroup> red: array<f32, 64>;
// Each (head, chunk)'s max and sum, for the merge.
var<workgroup> ml_m: array<f32, HQ * MAXC>;
var<workgroup> ml_s: array<f32, HQ * MAXC>;

fn act_at(o: u32) -> u32 {
    return p.off_s + A_SYNC + o;
}

fn act_store(i: u32, x: f32) {
    atomicStore(&gsync[i], bitcast<u32>(x));
}

fn act_load(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&gsync[i]));
}

// Element e (f16) of the weights.
fn w_elem(e: u32) -> f32 {
    let v = w[(p.off_w + e) >> 3u];
    let word = select(select(v.x, v.y, (e & 7u) >= 2u), select(v.z, v.w, (e & 7u) >= 6u), (e & 7u) >= 4u);
    let h = unpack2x16float(word);
    return select(h.x, h.y, (e & 1u) == 1u);
}

// Element i of layer l's input: the embedding row of the token for layer 0, else the last layer's output.
fn x_in(l: u32, i: u32) -> f32 {
    if l == 0u {
        return w_elem(W_EMBED + ids[p.off_ids] * H + i);
    }
    return act_load(act_at(A_XB + i));
}

// Sum over the workgroup (every invocation gets it). Ends with a barrier: xs is complete too.
fn wg_sum(x: f32, sg_id: u32, sg_lane: u32, n_sg: u32) -> f32 {
    let s = subgroupAdd(x);
    if sg_lane == 0u {
        red[sg_id] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var j = 0u; j < n_sg; j++) {
        t += red[j];
    }
    workgroupBarrier();
    return t;
}

// Eight weights (one vec4<u32> of f16) times xs[c .. c + 8].
fn dot8(v: vec4<u32>, c: u32) -> f32 {
    let a = unpack2x16float(v.x);
    let b = unpack2x16float(v.y);
    let e = unpack2x16float(v.z);
    let f = unpack2x16float(v.w);
    let x0 = vec4<f32>(xs[c], xs[c + 1u], xs[c + 2u], xs[c + 3u]);
    let x1 = vec4<f32>(xs[c + 4u], xs[c + 5u], xs[c + 6u], xs[c + 7u]);
    return dot(vec4<f32>(a, b), x0) + dot(vec4<f32>(e, f), x1);
}

// The team's dot product of weight row `row` (at element `base`, k wide) with xs: every lane gets it.
fn row_dot(base: u32, k: u32, lane: u32, sg_size: u32) -> f32 {
    var acc = 0.0;
    let b8 = (p.off_w + base) >> 3u;
    for (var c = lane; c < k / 8u; c += sg_size) {
        acc += dot8(w[b8 + c], c * 8u);
    }
    return subgroupAdd(acc);
}

// Two rows at once (pairs: rotary pairs, gate and up), sharing the xs loads.
fn row_dot2(b0: u32, b1: u32, k: u32, lane: u32, sg_size: u32) -> vec2<f32> {
    var a0 = 0.0;
    var a1 = 0.0;
    let r0 = (p.off_w + b0) >> 3u;
    let r1 = (p.off_w + b1) >> 3u;
    for (var c = lane; c < k / 8u; c += sg_size) {
        let v0 = w[r0 + c];
        let v1 = w[r1 + c];
        a0 += dot8(v0, c * 8u);
        a1 += dot8(v1, c * 8u);
    }
    return vec2<f32>(subgroupAdd(a0), subgroupAdd(a1));
}

@compute @workgroup_size(256)
fn decode_step(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
) {
    let n_wg = p.n_wg;
    let teams_per_wg = n_sg;
    let team = wid.x * teams_per_wg + sg_id;
    let teams = n_wg * teams_per_wg;
    let kv_len = step[p.off_step];
    let pos = step[p.off_step + 1u];
    let ck = max(CK_MIN, ((kv_len + MAXC - 1u) / MAXC + 7u) & ~7u);
    let n_chunks = (kv_len + ck - 1u) / ck;
    var bar = 0u;

    for (var l = 0u; l < L; l++) {
        let wl = l * W_LAYER;
        let fl = l * F_LAYER;
        // ---- QKV + RoPE: xs = x * attn_norm; unit u = rotary pair u % (D/2) of head block u / (D/2).
        var ss = 0.0;
        for (var i = lid; i < H; i += WG) {
            let x = x_in(l, i);
            ss += x * x;
            xs[i] = x * fp[p.off_f + fl + F_ATTN_NORM + i];
        }
        let r = inverseSqrt(wg_sum(ss, sg_id, sg_lane, teams_per_wg) / f32(H) + p.eps);
        for (var u = team; u < NQKV / 2u; u += teams) {
            let hb = u / (D / 2u);
            let pair = u % (D / 2u);
            let e = rope_dims(pair, ROT);
            let rows = vec2<u32>(hb * D + e.x, hb * D + e.y);
            var y = row_dot2(wl + W_QKV + rows.x * H, wl + W_QKV + rows.y * H, H, sg_lane, sg_size) * r;
#if BIAS
            y += vec2<f32>(fp[p.off_f + fl + F_BIAS + rows.x], fp[p.off_f + fl + F_BIAS + rows.y]);
#endif
            if hb < HQ + HKV && pair < ROT / 2u {
                let cs = cos_sin_at(pos, vec2<f32>(fp[p.off_f + F_TURNS + 2u * pair], fp[p.off_f + F_TURNS + 2u * pair + 1u]));
                y = vec2<f32>(y.x * cs.x - y.y * cs.y, y.y * cs.x + y.x * cs.y);
            }
            if sg_lane == 0u {
                let o = rows - vec2<u32>(HQ * D);
                if hb < HQ {
                    act_store(act_at(A_Q + rows.x), y.x);
                    act_store(act_at(A_Q + rows.y), y.y);
                } else {
                    // k (block HQ..) or v (block HQ + HKV..): the step's row for this step's attention,
                    // and into the cache for later steps.
                    let is_v = hb >= HQ + HKV;
                    let d0 = select(o, o - vec2<u32>(HKV * D), is_v);
                    let a = select(A_K, A_V, is_v);
                    act_store(act_at(a + d0.x), y.x);
                    act_store(act_at(a + d0.y), y.y);
                    let c = p.off_kv / 4u + ((2u * l + select(0u, 1u, is_v)) * p.max_ctx + pos) * (HKV * D / 4u);
                    kv[c + d0.x / 4u][d0.x % 4u] = f16(y.x);
                    kv[c + d0.y / 4u][d0.y % 4u] = f16(y.y);
                }
            }
        }
        bar++;
        grid_barrier(p.off_s, bar, n_wg, lid);

        // ---- Attention: unit (head h, chunk c of ck keys). Lanes in groups of LG take a key each;
        // lane j of a group owns dims j DPL .. + DPL. Partial (acc, max, sum) to A_PART.
        let kgs = sg_size / LG;
        let g = sg_lane / LG;
        let j = sg_lane % LG;
        for (var u = team; u < HQ * n_chunks; u += teams) {
            let h = u / n_chunks;
            let c = u % n_chunks;
            let hk = h / G;
            var q: array<f32, DPL>;
            for (var t = 0u; t < DPL; t++) {
                q[t] = act_load(act_at(A_Q + h * D + j * DPL + t)) * p.scale;
            }
            var m = NEG;
            var sum = 0.0;
            var acc: array<f32, DPL>;
            let k_end = min(kv_len, (c + 1u) * ck);
            let kbase = p.off_kv / 4u + (2u * l * p.max_ctx) * (HKV * D / 4u) + hk * (D / 4u);
            let vbase = kbase + p.max_ctx * (HKV * D / 4u);
            // The whole subgroup steps together (the shuffles need every lane); a group past the
            // chunk's end computes on zeros and keeps its state.
            for (var k0 = c * ck; k0 < k_end; k0 += kgs) {
                let key = k0 + g;
                let live = key < k_end;
                var kr: array<f32, DPL>;
                var vr: array<f32, DPL>;
                if key == pos {
                    for (var t = 0u; t < DPL; t++) {
                        kr[t] = act_load(act_at(A_K + hk * D + j * DPL + t));
                        vr[t] = act_load(act_at(A_V + hk * D + j * DPL + t));
                    }
                } else if live {
                    let ko = kbase + key * (HKV * D / 4u) + j * (DPL / 4u);
                    let vo = vbase + key * (HKV * D / 4u) + j * (DPL / 4u);
                    for (var t = 0u; t < DPL / 4u; t++) {
                        let k4 = vec4<f32>(kv[ko + t]);
                        let v4 = vec4<f32>(kv[vo + t]);
                        kr[4u * t] = k4.x;
                        kr[4u * t + 1u] = k4.y;
                        kr[4u * t + 2u] = k4.z;
                        kr[4u * t + 3u] = k4.w;
                        vr[4u * t] = v4.x;
                        vr[4u * t + 1u] = v4.y;
                        vr[4u * t + 2u] = v4.z;
                        vr[4u * t + 3u] = v4.w;
                    }
                }
                var s = 0.0;
                for (var t = 0u; t < DPL; t++) {
                    s += q[t] * kr[t];
                }
                for (var o = 1u; o < LG; o <<= 1u) {
                    s += subgroupShuffleXor(s, o);
                }
                if live {
                    let m_new = max(m, s);
                    let a = exp(m - m_new);
                    let pk = exp(s - m_new);
                    sum = sum * a + pk;
                    for (var t = 0u; t < DPL; t++) {
                        acc[t] = acc[t] * a + pk * vr[t];
                    }
                    m = m_new;
                }
            }
            // Merge the key groups of the subgroup (lanes LG apart hold the same dims).
            for (var o = LG; o < sg_size; o <<= 1u) {
                let m2 = subgroupShuffleXor(m, o);
                let s2 = subgroupShuffleXor(sum, o);
                let mm = max(m, m2);
                let a = exp(m - mm);
                let b = exp(m2 - mm);
                sum = sum * a + s2 * b;
                for (var t = 0u; t < DPL; t++) {
                    acc[t] = acc[t] * a + subgroupShuffleXor(acc[t], o) * b;
                }
                m = mm;
            }
            if g == 0u {
                let base = act_at(A_PART + (h * MAXC + c) * (D + 2u));
                for (var t = 0u; t < DPL; t++) {
                    act_store(base + j * DPL + t, acc[t]);
                }
                if j == 0u {
                    act_store(base + D, m);
                    act_store(base + D + 1u, sum);
                }
            }
        }
        bar++;
        grid_barrier(p.off_s, bar, n_wg, lid);

        // ---- O + residual: every workgroup merges the heads' chunks into xs, then rows of O.
        for (var t = lid; t < HQ * n_chunks; t += WG) {
            let b = act_at(A_PART + ((t / n_chunks) * MAXC + t % n_chunks) * (D + 2u));
            ml_m[t] = act_load(b + D);
            ml_s[t] = act_load(b + D + 1u);
        }
        workgroupBarrier();
        for (var t = lid; t < HQ * D; t += WG) {
            let h = t / D;
            var mx = NEG;
            for (var c = 0u; c < n_chunks; c++) {
                mx = max(mx, ml_m[h * n_chunks + c]);
            }
            var den = 0.0;
            var o = 0.0;
            for (var c = 0u; c < n_chunks; c++) {
                let wc = exp(ml_m[h * n_chunks + c] - mx);
                den += wc * ml_s[h * n_chunks + c];
                o += wc * act_load(act_at(A_PART + (h * MAXC + c) * (D + 2u) + t % D));
            }
            xs[t] = select(0.0, o / den, den > 0.0);
        }
        workgroupBarrier();
        for (var row = team; row < H; row += teams) {
            let y = row_dot(wl + W_O + row * (HQ * D), HQ * D, sg_lane, sg_size);
            if sg_lane == 0u {
                act_store(act_at(A_XA + row), y + x_in(l, row));
            }
        }
        bar++;
        grid_barrier(p.off_s, bar, n_wg, lid);

        // ---- gate-up + SwiGLU: xs = xa * ffn_norm; unit i = gate row i and up row I + i.
        ss = 0.0;
        for (var i = lid; i < H; i += WG) {
            let x = act_load(act_at(A_XA + i));
            ss += x * x;
            xs[i] = x * fp[p.off_f + fl + F_FFN_NORM + i];
        }
        let r2 = inverseSqrt(wg_sum(ss, sg_id, sg_lane, teams_per_wg) / f32(H) + p.eps);
        for (var i = team; i < I; i += teams) {
            let y = row_dot2(wl + W_GU + i * H, wl + W_GU + (I + i) * H, H, sg_lane, sg_size) * r2;
            if sg_lane == 0u {
                act_store(act_at(A_ACT + i), y.x / (1.0 + exp(-y.x)) * y.y);
            }
        }
        bar++;
        grid_barrier(p.off_s, bar, n_wg, lid);

        // ---- down + residual.
        for (var i = lid; i < I; i += WG) {
            xs[i] = act_load(act_at(A_ACT + i));
        }
        workgroupBarrier();
        for (var row = team; row < H; row += teams) {
            let y = row_dot(wl + W_DOWN + row * I, I, sg_lane, sg_size);
            if sg_lane == 0u {
                act_store(act_at(A_XB + row), y + act_load(act_at(A_XA + row)));
            }
        }
        bar++;
        grid_barrier(p.off_s, bar, n_wg, lid);
    }

    // ---- Final norm and the LM head.
    var ss = 0.0;
    for (var i = lid; i < H; i += WG) {
        let x = act_load(act_at(A_XB + i));
        ss += x * x;
        xs[i] = x * fp[p.off_f + F_NORM + i];
    }
    let r = inverseSqrt(wg_sum(ss, sg_id, sg_lane, teams_per_wg) / f32(H) + p.eps);
    for (var row = team; row < V; row += teams) {
        let y = row_dot(W_HEAD + row * H, H, sg_lane, sg_size);
        if sg_lane == 0u {
            logits[p.off_logits + row] = y * r;
        }
    }
    grid_exit(p.off_s, n_wg, lid);
}
