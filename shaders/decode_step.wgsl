// A whole Llama decode step in one dispatch: every layer's QKV + RoPE, attention, O + residual,
// gate-up + SwiGLU and down + residual, then the final norm and the LM head, as phases separated by
// grid-wide barriers (grid_sync.wgsl, appended). A small model's token is bound by dispatch
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
// (f32, written last, read by later dispatches), and (W2) w2, the weights past what one binding holds.
// The step's own K and V rows reach this step's attention through gsync; the cache copy is for later
// steps.
//
// Specialisation: H, I, HQ, HKV, D, ROT (rotary dims), V (vocab), L (layers), INTERLEAVED (rope_dims),
// BIAS, LG, W_LAYER / W_EMBED / F_LAYER (offsets), XS (f32 workgroup vector length), W2 / W_SPLIT8 (a
// second weight binding, w2, from vec4 W_SPLIT8 on).
enable f16;

struct Params {
    off_w: u32, off_f: u32, off_kv: u32, off_s: u32, off_step: u32, off_ids: u32, off_logits: u32, off_w2: u32,
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
#if W2
// The weights from f16 element W_SPLIT8 * 8 on (later layers, the LM head, the embedding table), where
// one binding cannot hold them all.
@group(0) @binding(8) var<storage, read> w2: array<vec4<u32>>;
#endif

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
const MAXC: u32 = 64u;
// KV lengths up to which a head's attention is one workgroup's (no partials, no merge phase).
const WHOLE_MAX: u32 = {{WHOLE_MAX}}u;
const CK_MIN: u32 = 16u;
const LG: u32 = {{LG}}u;
const DPL: u32 = D / LG;
const DPV: u32 = DPL / 4u;
const NEG: f32 = -1.0e30;
// Measurement switch (DRIFT_DECODE_STEP_SKIP): phases whose work is skipped (barriers kept), bit 0
// QKV, 1 attention, 2 merge + O, 3 gate-up, 4 down, 5 LM head. 0 in every real build.
const SKIP: u32 = {{SKIP}}u;

// Weights, in f16 elements: one layer's block, then the LM head and the embedding table.
const W_QKV: u32 = 0u;
const W_O: u32 = W_QKV + NQKV * H;
const W_GU: u32 = W_O + H * HQ * D;
const W_DOWN: u32 = W_GU + 2u * I * H;
const W_LAYER: u32 = {{W_LAYER}}u;   // W_DOWN + H * I, padded
const W_HEAD: u32 = L * W_LAYER;
const W_EMBED: u32 = {{W_EMBED}}u;   // W_HEAD when tied
const W_SPLIT8: u32 = {{W_SPLIT8}}u; // first vec4 of w2 (W2), a layer boundary
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
const A_ATT: u32 = A_PART + HQ * MAXC * (D + 2u);   // [HQ][D]: the merged attention output
const A_XA: u32 = A_ATT + HQ * D;
const A_ACT: u32 = A_XA + H;
const A_XB: u32 = A_ACT + I;

// The phase's input vector (f32), read by the row products 8 at a time.
var<workgroup> xs: array<vec4<f32>, XS / 4u>;
var<workgroup> red: array<f32, 64>;
// The subgroups' attention states (acc, max, sum) of one head, for the workgroup's merge.
var<workgroup> hm: array<f32, (WG / 8u) * (D + 2u)>;

fn act_at(o: u32) -> u32 {
    return p.off_s + A_SYNC + o;
}

fn act_store(i: u32, x: f32) {
    atomicStore(&gsync[i], bitcast<u32>(x));
}

fn act_load(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&gsync[i]));
}

// Weights' vec4 q (f16 elements 8q .. 8q + 7), from whichever binding holds it (a row never spans
// both).
fn wv(q: u32) -> vec4<u32> {
#if W2
    if q >= W_SPLIT8 {
        return w2[(p.off_w2 >> 3u) + q - W_SPLIT8];
    }
#endif
    return w[(p.off_w >> 3u) + q];
}

// Element e (f16) of the weights.
fn w_elem(e: u32) -> f32 {
    let v = wv(e >> 3u);
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

// Eight weights (one vec4<u32> of f16) times xs elements 8c .. 8c + 7.
fn dot8(v: vec4<u32>, c: u32) -> f32 {
    let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
    let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
    return dot(a, xs[2u * c]) + dot(b, xs[2u * c + 1u]);
}

// The row products issue four 16-byte loads per lane before using any (the phases are latency
// chains, not bandwidth: one memory round trip per four loads). Indices past the row are clamped to
// its last chunk and their products dropped.

// Two rows' first four chunks per lane, loaded ahead (before a grid barrier's wait) and finished
// after it: the phases' weights do not depend on the phase before, so their memory round trip
// overlaps the barrier.
struct Rows2 {
    u0: vec4<u32>,
    u1: vec4<u32>,
    u2: vec4<u32>,
    u3: vec4<u32>,
    v0: vec4<u32>,
    v1: vec4<u32>,
    v2: vec4<u32>,
    v3: vec4<u32>,
}

// Chunks c0 + {0, 1, 2, 3} S (clamped to the row) of the rows at elements b.x, b.y.
fn rows_load(b: vec2<u32>, c0: u32, n: u32, sg_size: u32) -> Rows2 {
    let r = b >> vec2<u32>(3u);
    let c = min(vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u) * sg_size, vec4<u32>(n - 1u));
    return Rows2(wv(r.x + c.x), wv(r.x + c.y), wv(r.x + c.z), wv(r.x + c.w), wv(r.y + c.x), wv(r.y + c.y), wv(r.y + c.z), wv(r.y + c.w));
}

fn rows_dot(x: Rows2, c0: u32, n: u32, sg_size: u32) -> vec2<f32> {
    let c = min(vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u) * sg_size, vec4<u32>(n - 1u));
    var a = select(vec2<f32>(0.0), vec2<f32>(dot8(x.u0, c.x), dot8(x.v0, c.x)), c0 < n);
    a += select(vec2<f32>(0.0), vec2<f32>(dot8(x.u1, c.y), dot8(x.v1, c.y)), c0 + sg_size < n);
    a += select(vec2<f32>(0.0), vec2<f32>(dot8(x.u2, c.z), dot8(x.v2, c.z)), c0 + 2u * sg_size < n);
    a += select(vec2<f32>(0.0), vec2<f32>(dot8(x.u3, c.w), dot8(x.v3, c.w)), c0 + 3u * sg_size < n);
    return a;
}

// The two rows' products with xs (k wide), the first chunks from `pre`.
fn rows_finish(pre: Rows2, b: vec2<u32>, k: u32, lane: u32, sg_size: u32) -> vec2<f32> {
    let n = k / 8u;
    var a = rows_dot(pre, lane, n, sg_size);
    for (var c0 = lane + 4u * sg_size; c0 < n; c0 += 4u * sg_size) {
        a += rows_dot(rows_load(b, c0, n, sg_size), c0, n, sg_size);
    }
    return vec2<f32>(subgroupAdd(a.x), subgroupAdd(a.y));
}

// The same with the first eight chunks per lane from `pre` and `pre2` (rows_load at lane + 4 S).
fn rows_finish2(pre: Rows2, pre2: Rows2, b: vec2<u32>, k: u32, lane: u32, sg_size: u32) -> vec2<f32> {
    let n = k / 8u;
    var a = rows_dot(pre, lane, n, sg_size) + rows_dot(pre2, lane + 4u * sg_size, n, sg_size);
    for (var c0 = lane + 8u * sg_size; c0 < n; c0 += 4u * sg_size) {
        a += rows_dot(rows_load(b, c0, n, sg_size), c0, n, sg_size);
    }
    return vec2<f32>(subgroupAdd(a.x), subgroupAdd(a.y));
}

// The rows of each phase's unit: a rotary pair of QKV rows; an O row (twice); gate and up rows of
// one unit; a down row (twice).
fn qkv_rows(l: u32, u: u32) -> vec2<u32> {
    let hb = u / (D / 2u);
    let e = rope_dims(u % (D / 2u), ROT);
    return vec2<u32>(l * W_LAYER + W_QKV) + (vec2<u32>(hb * D) + e) * H;
}

fn o_rows(l: u32, row: u32) -> vec2<u32> {
    return vec2<u32>(l * W_LAYER + W_O + row * (HQ * D));
}

fn gu_rows(l: u32, i: u32) -> vec2<u32> {
    return vec2<u32>(l * W_LAYER + W_GU) + vec2<u32>(i, I + i) * H;
}

fn down_rows(l: u32, row: u32) -> vec2<u32> {
    return vec2<u32>(l * W_LAYER + W_DOWN + row * I);
}

// Four rows at once (LM head rows): 16 loads in flight per lane.
fn row_dot4(bases: vec4<u32>, k: u32, lane: u32, sg_size: u32) -> vec4<f32> {
    let n = k / 8u;
    let r = bases >> vec4<u32>(3u);
    var a = vec4<f32>(0.0);
    for (var c0 = lane; c0 < n; c0 += 4u * sg_size) {
        let c = min(vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u) * sg_size, vec4<u32>(n - 1u));
        let v00 = wv(r.x + c.x);
        let v01 = wv(r.y + c.x);
        let v02 = wv(r.z + c.x);
        let v03 = wv(r.w + c.x);
        let v10 = wv(r.x + c.y);
        let v11 = wv(r.y + c.y);
        let v12 = wv(r.z + c.y);
        let v13 = wv(r.w + c.y);
        let v20 = wv(r.x + c.z);
        let v21 = wv(r.y + c.z);
        let v22 = wv(r.z + c.z);
        let v23 = wv(r.w + c.z);
        let v30 = wv(r.x + c.w);
        let v31 = wv(r.y + c.w);
        let v32 = wv(r.z + c.w);
        let v33 = wv(r.w + c.w);
        if c0 + 0u * sg_size < n {
            a += vec4<f32>(dot8(v00, c.x), dot8(v01, c.x), dot8(v02, c.x), dot8(v03, c.x));
        }
        if c0 + 1u * sg_size < n {
            a += vec4<f32>(dot8(v10, c.y), dot8(v11, c.y), dot8(v12, c.y), dot8(v13, c.y));
        }
        if c0 + 2u * sg_size < n {
            a += vec4<f32>(dot8(v20, c.z), dot8(v21, c.z), dot8(v22, c.z), dot8(v23, c.z));
        }
        if c0 + 3u * sg_size < n {
            a += vec4<f32>(dot8(v30, c.w), dot8(v31, c.w), dot8(v32, c.w), dot8(v33, c.w));
        }
    }
    return vec4<f32>(subgroupAdd(a.x), subgroupAdd(a.y), subgroupAdd(a.z), subgroupAdd(a.w));
}

// Four activations (scratch words o + i, i < n) at once; past n: zeros.
fn act_load4(o: u32, i: vec4<u32>, n: u32) -> vec4<f32> {
    let j = min(i, vec4<u32>(n - 1u));
    let x = vec4<f32>(act_load(o + j.x), act_load(o + j.y), act_load(o + j.z), act_load(o + j.w));
    return select(vec4<f32>(0.0), x, i < vec4<u32>(n));
}

// Four consecutive activations, scratch words o + 4q ..
fn act_vec4(o: u32, q: u32) -> vec4<f32> {
    let b = o + 4u * q;
    return vec4<f32>(act_load(b), act_load(b + 1u), act_load(b + 2u), act_load(b + 3u));
}

// Elements 4q .. 4q + 3 of layer l's input: the token's embedding row for layer 0, else the last
// layer's output.
fn x_in_vec4(l: u32, q: u32) -> vec4<f32> {
    if l == 0u {
        let e = W_EMBED + ids[p.off_ids] * H + 4u * q;
        return vec4<f32>(w_elem(e), w_elem(e + 1u), w_elem(e + 2u), w_elem(e + 3u));
    }
    return act_vec4(act_at(A_XB), q);
}

// xs = the n activations at scratch words o.. (each invocation writes whole vec4s: a write of one
// component can be a read-modify-write of the vector), two vec4s per invocation per round.
fn load_xs(o: u32, n: u32, lid: u32) {
    for (var q0 = lid; q0 < n / 4u; q0 += 2u * WG) {
        let q1 = min(q0 + WG, n / 4u - 1u);
        let a = act_vec4(o, q0);
        let b = act_vec4(o, q1);
        xs[q0] = a;
        if q0 + WG < n / 4u {
            xs[q1] = b;
        }
    }
    workgroupBarrier();
}

// xs = x * g for the H values of x (g at fp[g]); returns 1 / sqrt(mean(x^2) + eps). `x` is layer l's
// input (src 0), xa (1) or the last layer's output (2).
fn load_normed(src: u32, l: u32, g: u32, lid: u32, sg_id: u32, sg_lane: u32, n_sg: u32) -> f32 {
    var ss = 0.0;
    for (var q = lid; q < H / 4u; q += WG) {
        var x: vec4<f32>;
        if src == 0u {
            x = x_in_vec4(l, q);
        } else {
            x = act_vec4(act_at(select(A_XB, A_XA, src == 1u)), q);
        }
        ss += dot(x, x);
        let f = p.off_f + g + 4u * q;
        xs[q] = x * vec4<f32>(fp[f], fp[f + 1u], fp[f + 2u], fp[f + 3u]);
    }
    return inverseSqrt(wg_sum(ss, sg_id, sg_lane, n_sg) / f32(H) + p.eps);
}

// A lane's running merge of attention chunks (8 dims of one head): max, sum, accumulators.
struct Merge {
    m: f32,
    sum: f32,
    o0: vec4<f32>,
    o1: vec4<f32>,
}

// `s` with chunk (max mc, sum sc, accumulators a0, a1) merged in.
fn merged(s: Merge, mc: f32, sc: f32, a0: vec4<f32>, a1: vec4<f32>) -> Merge {
    let mm = max(s.m, mc);
    let f = exp(s.m - mm);
    let fc = exp(mc - mm);
    return Merge(mm, s.sum * f + sc * fc, s.o0 * f + a0 * fc, s.o1 * f + a1 * fc);
}

// One subgroup's online softmax for head h over the cached keys key0 + g + r stride (r = 0, 1, ...)
// below kend (group g of LG lanes takes a key, lane j its dims j DPL ..), four keys per group per
// round with every load issued first, plus the step's own key (pos, from this dispatch's QKV phase)
// where `own`; the groups merged by shuffles, so lanes j < LG hold the subgroup's state. The whole
// subgroup steps together (the shuffles need every lane); a group past the end computes on a clamped
// key and keeps its state.
struct AttnState {
    m: f32,
    sum: f32,
    acc: array<vec4<f32>, DPV>,
}

// The first round's cached K/V of a unit (generated fields k{round}_{vec4}, v..): they do not depend on
// this dispatch's results, so they are loaded before the QKV phase's barrier completes (attn_first)
// and their round trip overlaps it.
struct AttnFirst {
{{ATTN_FIRST_FIELDS}}
}

// The cache vec4 of this lane's first dims of key 0 of head h's KV head in layer l (K; V is max_ctx
// rows further).
fn attn_kbase(h: u32, l: u32, sg_lane: u32) -> u32 {
    return p.off_kv / 4u + (2u * l * p.max_ctx) * (HKV * D / 4u) + (h / G) * (D / 4u) + (sg_lane % LG) * DPV;
}

fn attn_first(h: u32, key0: u32, kend: u32, stride: u32, l: u32, sg_lane: u32) -> AttnFirst {
    let g = sg_lane / LG;
    let kbase = attn_kbase(h, l, sg_lane);
    let vbase = kbase + p.max_ctx * (HKV * D / 4u);
    let k0 = key0;
{{ATTN_LOADS}}
    return AttnFirst({{ATTN_FIRST_ARGS}});
}

fn attend(f: AttnFirst, h: u32, key0: u32, kend: u32, stride: u32, own: bool, l: u32, sg_lane: u32, sg_size: u32) -> AttnState {
    let g = sg_lane / LG;
    let j = sg_lane % LG;
    let hk = h / G;
    // Generated (every private value a named variable, nothing indexed): the rounds' loads
    // (ATTN_LOADS) and updates (ATTN_COMPUTE), q0.. (this lane's dims of q, scaled) and a0..
    // (accumulators), the own key, the group merge. The first round's cache loads come in `f`.
    let kbase = attn_kbase(h, l, sg_lane);
    let vbase = kbase + p.max_ctx * (HKV * D / 4u);
    var m = NEG;
    var sum = 0.0;
    let k0 = key0;
{{ATTN_FIRST_UNPACK}}
{{ATTN_Q}}
    {
{{ATTN_COMPUTE}}
    }
    for (var k0 = key0 + 4u * stride; k0 < kend; k0 += 4u * stride) {
{{ATTN_LOADS}}
{{ATTN_COMPUTE}}
    }
    if own {
        let i = vec4<u32>(hk * D + j * DPL) + vec4<u32>(0u, 1u, 2u, 3u);
{{ATTN_OWN}}
    }
    for (var o = LG; o < sg_size; o <<= 1u) {
        let m2 = subgroupShuffleXor(m, o);
        let s2 = subgroupShuffleXor(sum, o);
        let mm = max(m, m2);
        let al = exp(m - mm);
        let be = exp(m2 - mm);
        sum = sum * al + s2 * be;
{{ATTN_MERGE}}
        m = mm;
    }
    var st: AttnState;
    st.m = m;
    st.sum = sum;
{{ATTN_OUT}}
    return st;
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
    let ck = max(CK_MIN, ((kv_len + MAXC - 1u) / MAXC + 15u) & ~15u);
    let n_chunks = (kv_len + ck - 1u) / ck;
    let whole = kv_len <= WHOLE_MAX;
    let kgs = sg_size / LG;
    var bar = 0u;
    // Each team's first unit of the next matrix phase, loaded ahead.
    var pre: Rows2;
    // The second unit of gate-up (or the down row's next chunks), loaded ahead too.
    var pre2: Rows2;
    if team < NQKV / 2u {
        pre = rows_load(qkv_rows(0u, team), sg_lane, H / 8u, sg_size);
    }

    for (var l = 0u; l < L; l++) {
        let wl = l * W_LAYER;
        let fl = l * F_LAYER;
        // ---- QKV + RoPE: xs = x * attn_norm; unit u = rotary pair u % (D/2) of head block u / (D/2).
        let r = load_normed(0u, l, fl + F_ATTN_NORM, lid, sg_id, sg_lane, teams_per_wg);
        for (var u = team; u < NQKV / 2u && (SKIP & 1u) == 0u; u += teams) {
            let hb = u / (D / 2u);
            let pair = u % (D / 2u);
            let e = rope_dims(pair, ROT);
            let rows = vec2<u32>(hb * D + e.x, hb * D + e.y);
            let b = qkv_rows(l, u);
            if u != team {
                pre = rows_load(b, sg_lane, H / 8u, sg_size);
            }
            var y = rows_finish(pre, b, H, sg_lane, sg_size) * r;
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
                    // k (block HQ..) or v (block HQ + HKV..): the step's row, for this step's attention
                    // and (by the next phase) the cache.
                    let is_v = hb >= HQ + HKV;
                    let d0 = select(o, o - vec2<u32>(HKV * D), is_v);
                    let a = select(A_K, A_V, is_v);
                    act_store(act_at(a + d0.x), y.x);
                    act_store(act_at(a + d0.y), y.y);
                }
            }
        }
        bar++;
        grid_arrive(p.off_s, lid);
        // This team's first attention unit's first round of cached keys (the units as below).
        var af: AttnFirst;
        if whole {
            if wid.x < HQ {
                af = attn_first(wid.x, sg_id * kgs, pos, n_sg * kgs, l, sg_lane);
            }
        } else if team < HQ * n_chunks {
            let h = team / n_chunks;
            let c = team % n_chunks;
            af = attn_first(h, c * ck, min(min(kv_len, (c + 1u) * ck), pos), kgs, l, sg_lane);
        }
        grid_wait(p.off_s, bar, n_wg, lid);

        // The step's K and V rows into the cache for later steps, whole vec4s by one invocation each
        // (the QKV units' rows share vec4s).
        let gt = wid.x * WG + lid;
        if gt < 2u * HKV * D / 4u {
            let is_v = gt >= HKV * D / 4u;
            let q = gt % (HKV * D / 4u);
            let row = p.off_kv / 4u + ((2u * l + select(0u, 1u, is_v)) * p.max_ctx + pos) * (HKV * D / 4u);
            kv[row + q] = vec4<f16>(act_vec4(act_at(select(A_K, A_V, is_v)), q));
        }

        // ---- Attention. Up to WHOLE_MAX keys (whole = true): a workgroup per head, its subgroups'
        // groups dealing the keys, merged in workgroup memory, straight to A_ATT. Past that: unit
        // (head h, chunk c of ck keys) per team, partials to A_PART, merged by the next phase.
        if whole {
            for (var h = wid.x; h < HQ && (SKIP & 2u) == 0u; h += n_wg) {
                var f = af;
                if h != wid.x {
                    f = attn_first(h, sg_id * kgs, pos, n_sg * kgs, l, sg_lane);
                }
                let st = attend(f, h, sg_id * kgs, pos, n_sg * kgs, sg_id == 0u, l, sg_lane, sg_size);
                if sg_lane < LG {
                    for (var t = 0u; t < DPV; t++) {
                        for (var e = 0u; e < 4u; e++) {
                            hm[sg_id * (D + 2u) + sg_lane * DPL + 4u * t + e] = st.acc[t][e];
                        }
                    }
                    if sg_lane == 0u {
                        hm[sg_id * (D + 2u) + D] = st.m;
                        hm[sg_id * (D + 2u) + D + 1u] = st.sum;
                    }
                }
                workgroupBarrier();
                for (var dd = lid; dd < D; dd += WG) {
                    var mx = NEG;
                    for (var k = 0u; k < n_sg; k++) {
                        mx = max(mx, hm[k * (D + 2u) + D]);
                    }
                    var den = 0.0;
                    var o = 0.0;
                    for (var k = 0u; k < n_sg; k++) {
                        let f = exp(hm[k * (D + 2u) + D] - mx);
                        den += f * hm[k * (D + 2u) + D + 1u];
                        o += f * hm[k * (D + 2u) + dd];
                    }
                    act_store(act_at(A_ATT + h * D + dd), select(0.0, o / den, den > 0.0));
                }
                workgroupBarrier();
            }
        } else {
            for (var u = team; u < HQ * n_chunks && (SKIP & 2u) == 0u; u += teams) {
                let h = u / n_chunks;
                let c = u % n_chunks;
                let k_end = min(kv_len, (c + 1u) * ck);
                var f = af;
                if u != team {
                    f = attn_first(h, c * ck, min(k_end, pos), kgs, l, sg_lane);
                }
                let st = attend(f, h, c * ck, min(k_end, pos), kgs, k_end == kv_len, l, sg_lane, sg_size);
                if sg_lane < LG {
                    let base = act_at(A_PART + (h * MAXC + c) * (D + 2u));
                    for (var t = 0u; t < DPV; t++) {
                        for (var e = 0u; e < 4u; e++) {
                            act_store(base + sg_lane * DPL + 4u * t + e, st.acc[t][e]);
                        }
                    }
                    if sg_lane == 0u {
                        act_store(base + D, st.m);
                        act_store(base + D + 1u, st.sum);
                    }
                }
            }
            bar++;
            grid_barrier(p.off_s, bar, n_wg, lid);
        }

        // ---- Merge: unit (head h, dims 8 db .. + 8); lane c takes chunks c, c + S, ... (online), then
        // the subgroup combines its lanes. Out: the head's normalised output to A_ATT.
        for (var u = team; u < HQ * (D / 8u) && !whole && (SKIP & 2u) == 0u; u += teams) {
            let h = u / (D / 8u);
            let db = u % (D / 8u);
            var st = Merge(NEG, 0.0, vec4<f32>(0.0), vec4<f32>(0.0));
            // Two chunks per lane per round, all loads first.
            for (var c = sg_lane; c < n_chunks; c += 2u * sg_size) {
                let b = act_at(A_PART + (h * MAXC + c) * (D + 2u));
                let b2 = act_at(A_PART + (h * MAXC + min(c + sg_size, n_chunks - 1u)) * (D + 2u));
                let d = 8u * db;
                let mc = act_load(b + D);
                let sc = act_load(b + D + 1u);
                let a0 = act_vec4(b + d, 0u);
                let a1 = act_vec4(b + d, 1u);
                let mc2 = act_load(b2 + D);
                let sc2 = act_load(b2 + D + 1u);
                let a20 = act_vec4(b2 + d, 0u);
                let a21 = act_vec4(b2 + d, 1u);
                st = merged(st, mc, sc, a0, a1);
                if c + sg_size < n_chunks {
                    st = merged(st, mc2, sc2, a20, a21);
                }
            }
            let mx = subgroupMax(st.m);
            let f = exp(st.m - mx);
            let den = subgroupAdd(st.sum * f);
            let o0 = subgroupAdd(st.o0 * f);
            let o1 = subgroupAdd(st.o1 * f);
            if sg_lane == 0u {
                let inv = select(0.0, 1.0 / den, den > 0.0);
                let at = act_at(A_ATT + h * D + 8u * db);
                for (var e = 0u; e < 4u; e++) {
                    act_store(at + e, o0[e] * inv);
                    act_store(at + 4u + e, o1[e] * inv);
                }
            }
        }
        bar++;
        grid_arrive(p.off_s, lid);
        if team < H {
            pre = rows_load(o_rows(l, team), sg_lane, HQ * D / 8u, sg_size);
        }
        grid_wait(p.off_s, bar, n_wg, lid);

        // ---- O + residual.
        load_xs(act_at(A_ATT), HQ * D, lid);
        for (var row = team; row < H && (SKIP & 4u) == 0u; row += teams) {
            let res = x_in(l, row);
            if row != team {
                pre = rows_load(o_rows(l, row), sg_lane, HQ * D / 8u, sg_size);
            }
            let y = rows_finish(pre, o_rows(l, row), HQ * D, sg_lane, sg_size).x;
            if sg_lane == 0u {
                act_store(act_at(A_XA + row), y + res);
            }
        }
        bar++;
        grid_arrive(p.off_s, lid);
        if team < I {
            pre = rows_load(gu_rows(l, team), sg_lane, H / 8u, sg_size);
        }
        if team + teams < I {
            pre2 = rows_load(gu_rows(l, team + teams), sg_lane, H / 8u, sg_size);
        }
        grid_wait(p.off_s, bar, n_wg, lid);

        // ---- gate-up + SwiGLU: xs = xa * ffn_norm; unit i = gate row i and up row I + i.
        let r2 = load_normed(1u, l, fl + F_FFN_NORM, lid, sg_id, sg_lane, teams_per_wg);
        for (var i = team; i < I && (SKIP & 8u) == 0u; i += teams) {
            var x = pre;
            if i == team + teams {
                x = pre2;
            } else if i != team {
                x = rows_load(gu_rows(l, i), sg_lane, H / 8u, sg_size);
            }
            let y = rows_finish(x, gu_rows(l, i), H, sg_lane, sg_size) * r2;
            if sg_lane == 0u {
                act_store(act_at(A_ACT + i), y.x / (1.0 + exp(-y.x)) * y.y);
            }
        }
        bar++;
        grid_arrive(p.off_s, lid);
        if team < H {
            pre = rows_load(down_rows(l, team), sg_lane, I / 8u, sg_size);
            pre2 = rows_load(down_rows(l, team), sg_lane + 4u * sg_size, I / 8u, sg_size);
        }
        grid_wait(p.off_s, bar, n_wg, lid);

        // ---- down + residual.
        load_xs(act_at(A_ACT), I, lid);
        for (var row = team; row < H && (SKIP & 16u) == 0u; row += teams) {
            let res = act_load(act_at(A_XA + row));
            if row != team {
                pre = rows_load(down_rows(l, row), sg_lane, I / 8u, sg_size);
                pre2 = rows_load(down_rows(l, row), sg_lane + 4u * sg_size, I / 8u, sg_size);
            }
            let y = rows_finish2(pre, pre2, down_rows(l, row), I, sg_lane, sg_size).x;
            if sg_lane == 0u {
                act_store(act_at(A_XB + row), y + res);
            }
        }
        bar++;
        grid_arrive(p.off_s, lid);
        if l + 1u < L && team < NQKV / 2u {
            pre = rows_load(qkv_rows(l + 1u, team), sg_lane, H / 8u, sg_size);
        }
        grid_wait(p.off_s, bar, n_wg, lid);
    }

    // ---- Final norm and the LM head.
    let r = load_normed(2u, 0u, F_NORM, lid, sg_id, sg_lane, teams_per_wg);
    for (var row = team; row < V && (SKIP & 32u) == 0u; row += 4u * teams) {
        let rows = min(vec4<u32>(row) + vec4<u32>(0u, 1u, 2u, 3u) * teams, vec4<u32>(V - 1u));
        let y = row_dot4(W_HEAD + rows * H, H, sg_lane, sg_size) * r;
        if sg_lane == 0u {
            for (var t = 0u; t < 4u; t++) {
                logits[p.off_logits + rows[t]] = y[t];
            }
        }
    }
    grid_exit(p.off_s, n_wg, lid);
}
