// Fused prologues and epilogues of the matrix-vector kernels, appended to matvec.wgsl and
// matvec_quant.wgsl (and usable by any kernel that reduces one output row per team of lanes covering
// all of K), so decode needs no separate norm, activation or residual-add dispatches.
//
// The host kernel provides: `p` (Params: `offs`, the 8 base offsets of bindings 1..8, then at least
// `k`, `ldo`, `row0`, `eps`), binding 2 `xs` (the activations: vec4<TX> elements with XV4, else TX),
// binding 3 `out` (TO), `NB` (batch rows), and with STAGE `WG` (workgroup size) and `SG` (subgroup
// builtins passed to stage_x). The optional tensors follow out in this order, each bound only when its
// define is on: BIAS (`bias`, TB, binding 4), NORM (`norm_w`, TG, binding NORM_B, vec4 elements with
// GV4), RES (`resid`, TR, binding RES_B), ROPE (`k_cache`, `v_cache` of TC, `step`, `turns` at KC_B,
// VC_B, STEP_B, TURNS_B; `p` then also has hq, hkv, hd, rot, max_ctx).
//
// Input prologue, x_in4 / x_in1 (the matvec's input at elements e.. of batch row b):
//   plain   x[b, e]
//   NORM    x[b, e] * g[e]; the squares of x are summed per lane as they are loaded (sq) and reduced
//           with the dot products (Red is then (dot, sum x^2)), so write_out can scale the dot by
//           1 / sqrt(mean(x^2) + eps): RMSNorm folded into the product (needs the team's lanes to cover
//           all of K, which they do).
//   SWIGLU  silu(x[b, e]) * x[b, K + e]: x rows are [gate | up], 2K long.
// STAGE (one batch row, with NORM or SWIGLU): the prologue runs once per workgroup instead of once per
//   output row. stage_x, called by every invocation before the row loop, writes the prologue'd input
//   (f32: x * g or silu(gate) * up are not exact in f16) for elements 0 .. 4 XS to workgroup memory
//   and, with NORM, reduces the sum of x^2 over all of K (rs then multiplies in write_out, the rows'
//   reductions carry the dot product only); x_in4 / x_in1 then read the staged values. With
//   STAGE_TAIL K is longer than the staged part and elements from 4 XS on are computed per row as
//   without STAGE (the host picks XS from the device's workgroup memory, a multiple of XP).
// Output epilogue, write_out: out[b, row] = dot (* rs with NORM) (+ bias[row]) (+ resid[b, row]);
// or a paired-row epilogue (below), where each workgroup's rows pair up and pair_finish stores what
// the pairs make: GLU, silu(gate) * up; ROPE, q and k rotated, q / k / v stored in the attention
// layouts.
// With RES, resid may be out itself (the residual stream updated in place): each output value is
// read and written only by the invocation that owns it.

fn tensor_base(binding: u32) -> u32 {
    let i = binding - 1u;
    return p.offs[i / 4u][i % 4u];
}

#if SWIGLU
const X_ROW = 2u; // x row length in units of K
#else
const X_ROW = 1u;
#endif

// Raw activations x[b, e .. e + 4].
fn x_raw4(b: u32, e: u32) -> vec4<f32> {
    let i = tensor_base(2u) + b * X_ROW * p.k + e;
#if XV4
    return vec4<f32>(xs[i / 4u]);
#else
    return vec4<f32>(f32(xs[i]), f32(xs[i + 1u]), f32(xs[i + 2u]), f32(xs[i + 3u]));
#endif
}

fn x_raw1(b: u32, e: u32) -> f32 {
    let i = tensor_base(2u) + b * X_ROW * p.k + e;
#if XV4
    return f32(xs[i / 4u][i % 4u]);
#else
    return f32(xs[i]);
#endif
}

#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<{{TB}}>;
#endif

#if NORM
const NORM_B = {{NORM_B}}u;
#if GV4
@group(0) @binding({{NORM_B}}) var<storage, read> norm_w: array<vec4<{{TG}}>>;
#else
@group(0) @binding({{NORM_B}}) var<storage, read> norm_w: array<{{TG}}>;
#endif
#ifnot STAGE
// This lane's sums of x^2 per batch row for the current output row.
var<private> sq: array<vec4<f32>, NB>;
#endif

fn g4(e: u32) -> vec4<f32> {
    let i = tensor_base(NORM_B) + e;
#if GV4
    return vec4<f32>(norm_w[i / 4u]);
#else
    return vec4<f32>(f32(norm_w[i]), f32(norm_w[i + 1u]), f32(norm_w[i + 2u]), f32(norm_w[i + 3u]));
#endif
}

fn g1(e: u32) -> f32 {
    let i = tensor_base(NORM_B) + e;
#if GV4
    return f32(norm_w[i / 4u][i % 4u]);
#else
    return f32(norm_w[i]);
#endif
}
#endif

#if RES
const RES_B = {{RES_B}}u;
@group(0) @binding({{RES_B}}) var<storage, read> resid: array<{{TR}}>;
#endif

// Call before a team starts on a new output row.
fn fuse_begin_row() {
#if NORM
#ifnot STAGE
    sq = array<vec4<f32>, NB>();
#endif
#endif
}

// The prologue'd input at x[b, e .. e + 4] (e a multiple of 4), without counting squares.
fn x_pro4(b: u32, e: u32) -> vec4<f32> {
#if SWIGLU
    let gate = x_raw4(b, e);
    let up = x_raw4(b, p.k + e);
    return gate / (1.0 + exp(-gate)) * up;
#else
#if NORM
    return x_raw4(b, e) * g4(e);
#else
    return x_raw4(b, e);
#endif
#endif
}

fn x_pro1(b: u32, e: u32) -> f32 {
#if SWIGLU
    let gate = x_raw1(b, e);
    return gate / (1.0 + exp(-gate)) * x_raw1(b, p.k + e);
#else
#if NORM
    return x_raw1(b, e) * g1(e);
#else
    return x_raw1(b, e);
#endif
#endif
}

#if STAGE
const XS = {{XS}}u;
const XP = {{XP}}u;
// The prologue'd input row, elements 0 .. 4 XS (zeros past K), as vec4s in XP planes (stage_at).
var<workgroup> x_stage: array<vec4<f32>, XS>;

// Where vec4 v (elements 4v ..) is staged: plane v % XP, slot v / XP. With XP the vec4s a lane reads
// per chunk (lanes take adjacent chunks), a subgroup's reads of one vec4 of its chunks hit adjacent
// words, free of bank conflicts.
fn stage_at(v: u32) -> u32 {
    return (v % XP) * (XS / XP) + v / XP;
}
#if NORM
// Partial sums of x^2 (per subgroup with SG, per invocation otherwise) and, after stage_x, 1 / rms.
var<workgroup> stage_sq: array<f32, WG>;
var<private> stage_rs: f32;
#endif

// Raw x[0, e .. e + 4] with zeros past K.
fn x_raw4z(e: u32) -> vec4<f32> {
    if e + 4u <= p.k {
        return x_raw4(0u, e);
    }
    var v = vec4<f32>(0.0);
    for (var i = 0u; e + i < p.k; i++) {
        v[i] = x_raw1(0u, e + i);
    }
    return v;
}

#if NORM
// The norm weight at e .. e + 4 with zeros past K.
fn g4z(e: u32) -> vec4<f32> {
    if e + 4u <= p.k {
        return g4(e);
    }
    var v = vec4<f32>(0.0);
    for (var i = 0u; e + i < p.k; i++) {
        v[i] = g1(e + i);
    }
    return v;
}
#else
// The prologue'd x[0, e .. e + 4] with zeros past K.
fn x_pro4z(e: u32) -> vec4<f32> {
    if e + 4u <= p.k {
        return x_pro4(0u, e);
    }
    var v = vec4<f32>(0.0);
    for (var i = 0u; e + i < p.k; i++) {
        v[i] = x_pro1(0u, e + i);
    }
    return v;
}
#endif

// Stages the prologue'd input row (and with NORM computes stage_rs). Every invocation of the workgroup
// calls it, in uniform control flow, before any row is reduced.
#if SG
fn stage_x(lid: u32, sg: u32, nsg: u32, lane: u32) {
#else
fn stage_x(lid: u32) {
#endif
    let n4 = (p.k + 3u) / 4u;
#if NORM
    // Every element's square counts, staged or not.
    var s = 0.0;
    for (var v = lid; v < max(n4, XS); v += WG) {
        let raw = x_raw4z(4u * v);
        s = fma(raw.x, raw.x, fma(raw.y, raw.y, fma(raw.z, raw.z, fma(raw.w, raw.w, s))));
        if v < XS {
            x_stage[stage_at(v)] = raw * g4z(4u * v);
        }
    }
#if SG
    let part = subgroupAdd(s);
    if lane == 0u {
        stage_sq[sg] = part;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < nsg; i++) {
        total += stage_sq[i];
    }
#else
    stage_sq[lid] = s;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h /= 2u) {
        if lid < h {
            stage_sq[lid] += stage_sq[lid + h];
        }
        workgroupBarrier();
    }
    let total = stage_sq[0];
#endif
    stage_rs = inverseSqrt(total / f32(p.k) + p.eps);
#else
    for (var v = lid; v < XS; v += WG) {
        x_stage[stage_at(v)] = x_pro4z(4u * v);
    }
    workgroupBarrier();
#endif
}
#endif

// The input at x[b, e .. e + 4] (e a multiple of 4), counting its squares once per call (without
// STAGE).
fn x_in4(b: u32, e: u32) -> vec4<f32> {
#if STAGE
#if STAGE_TAIL
    if e >= 4u * XS {
        return x_pro4(b, e);
    }
#endif
    return x_stage[stage_at(e / 4u)];
#else
#if NORM
    let v = x_raw4(b, e);
    sq[b] = fma(v, v, sq[b]);
    return v * g4(e);
#else
    return x_pro4(b, e);
#endif
#endif
}

// The input at x[b, e], counting its square once per call (without STAGE).
fn x_in1(b: u32, e: u32) -> f32 {
#if STAGE
#if STAGE_TAIL
    if e >= 4u * XS {
        return x_pro1(b, e);
    }
#endif
    return x_stage[stage_at(e / 4u)][e % 4u];
#else
#if NORM
    let v = x_raw1(b, e);
    sq[b].x = fma(v, v, sq[b].x);
    return v * g1(e);
#else
    return x_pro1(b, e);
#endif
#endif
}

// What a team reduces per (row, batch row): the dot product, and with NORM (unstaged) the sum of x^2.
#if NORM
#if STAGE
alias Red = f32;
fn red_pack(dot_sum: f32, b: u32) -> Red {
    return dot_sum;
}
#else
alias Red = vec2<f32>;
fn red_pack(dot_sum: f32, b: u32) -> Red {
    let s = sq[b];
    return vec2<f32>(dot_sum, (s.x + s.y) + (s.z + s.w));
}
#endif
#else
alias Red = f32;
fn red_pack(dot_sum: f32, b: u32) -> Red {
    return dot_sum;
}
#endif

// The product's value at (row, b) from the team's reduced sums, before the residual.
fn out_value(row: u32, b: u32, r: Red) -> f32 {
#if NORM
#if STAGE
    var v = r * stage_rs;
#else
    var v = r.x * inverseSqrt(r.y / f32(p.k) + p.eps);
#endif
#else
    var v = r;
#endif
#if BIAS
    v += f32(bias[tensor_base(4u) + p.row0 + row]);
#endif
    return v;
}

// out[b, row0 + row] from the team's reduced sums; returns the value as stored.
fn write_out(row: u32, b: u32, r: Red) -> f32 {
    var v = out_value(row, b, r);
    let o = b * p.ldo + p.row0 + row;
#if RES
    v += f32(resid[tensor_base(RES_B) + o]);
#endif
    let stored = {{TO}}(v);
    out[tensor_base(3u) + o] = stored;
    return f32(stored);
}

#if PAIRS
// The paired-row epilogues (GLU, ROPE below) keep each of the workgroup's RPW row values in workgroup
// memory (pair_keep, from the team that reduced the row); pair_finish combines the pairs.
var<workgroup> pair_s: array<f32, RPW>;

fn pair_keep(rr: u32, row: u32, r: Red) {
    pair_s[rr] = out_value(row, 0u, r);
}
#endif

#if GLU
// GLU epilogue (one batch row, one weight shard): w stacks gate rows [0, N) over up rows [N, 2N) and
// out[j] = silu(gate_j) * up_j, so the down projection reads the activation directly (no SwiGLU
// prologue to stage). The host kernel's workgroup of RPW rows covers RPW / 2 pairs: its rows
// rr < RPW / 2 are gate rows j0 + rr, the others the up rows N + j0 + rr - RPW / 2, with
// j0 = first / 2 (first: the workgroup's first row as the kernel counts them, RPW per workgroup).
// Each row's value goes through workgroup memory; pair_finish (in uniform control flow, after every
// row) multiplies the pairs.
// The weight row of the workgroup's row rr.
fn pair_row(first: u32, rr: u32) -> u32 {
    let half = RPW / 2u;
    let j = first / 2u + rr % half;
    return select(j, p.rows / 2u + j, rr >= half);
}

fn pair_finish(first: u32, lid: u32) {
    workgroupBarrier();
    let half = RPW / 2u;
    if lid < half {
        let gate = pair_s[lid];
        let up = pair_s[lid + half];
        let a = {{TO}}(gate / (1.0 + exp(-gate)) * up);
        out[tensor_base(3u) + first / 2u + lid] = a;
#if XQO
        xq_keep(lid, first / 2u + lid, f32(a));
#endif
    }
#if XQO
    xq_finish(first / 2u, lid);
#endif
}
#endif

#if ROPE
// RoPE epilogue (one batch row, one weight shard): w is the stacked QKV projection, rows
// [(hq + 2 hkv) hd] (q heads, k heads, v heads), and instead of the product the kernel writes what
// qkv_rope.wgsl would make of it: q rotated into out ([hq, hd]), k rotated and v copied into this
// step's rows of the KV cache ([max_ctx, hkv, hd] each; the token's position is step[1]). Rotary pairs
// are counted head by head, hd / 2 per head, their dims from rope_dims (rope_angle.wgsl). A workgroup of
// RPW rows covers RPW / 2 pairs, first / 2 onwards: its rows rr < RPW / 2 are the pairs' first dims,
// the others their second. Each row's value goes through workgroup memory; pair_finish (in uniform
// control flow, after every row) rotates the pairs and stores them. Angles: rope_angle.wgsl
// (appended), frequencies as (hi, lo) turns per position in `turns`.
@group(0) @binding({{KC_B}}) var<storage, read_write> k_cache: array<{{TC}}>;
@group(0) @binding({{VC_B}}) var<storage, read_write> v_cache: array<{{TC}}>;
@group(0) @binding({{STEP_B}}) var<storage, read> step: array<u32>;
@group(0) @binding({{TURNS_B}}) var<storage, read> turns: array<vec2<f32>>;
const KC_B = {{KC_B}}u;
const VC_B = {{VC_B}}u;
const STEP_B = {{STEP_B}}u;
const TURNS_B = {{TURNS_B}}u;
// The weight row of the workgroup's row rr.
fn pair_row(first: u32, rr: u32) -> u32 {
    let half = RPW / 2u;
    let pr = first / 2u + rr % half;
    let e = rope_dims(pr % (p.hd / 2u), p.rot);
    return (pr / (p.hd / 2u)) * p.hd + select(e.x, e.y, rr >= half);
}

fn pair_finish(first: u32, lid: u32) {
    workgroupBarrier();
    let half = RPW / 2u;
    let pr = first / 2u + lid;
    let h = pr / (p.hd / 2u);
    let i = pr % (p.hd / 2u);
    let pos = step[tensor_base(STEP_B) + 1u];
    // The host checks lengths; never write outside the cache.
    if lid >= half || h >= p.hq + 2u * p.hkv || pos >= p.max_ctx {
        return;
    }
    let e = rope_dims(i, p.rot);
    var a = pair_s[lid];
    var b = pair_s[lid + half];
    if h < p.hq + p.hkv && i < p.rot / 2u {
        let cs = cos_sin_at(pos, turns[tensor_base(TURNS_B) / 2u + i]);
        let ra = a * cs.x - b * cs.y;
        b = a * cs.y + b * cs.x;
        a = ra;
    }
    if h < p.hq {
        let dst = tensor_base(3u) + h * p.hd;
        out[dst + e.x] = {{TO}}(a);
        out[dst + e.y] = {{TO}}(b);
    } else if h < p.hq + p.hkv {
        let dst = tensor_base(KC_B) + (pos * p.hkv + h - p.hq) * p.hd;
        k_cache[dst + e.x] = {{TC}}(a);
        k_cache[dst + e.y] = {{TC}}(b);
    } else {
        let dst = tensor_base(VC_B) + (pos * p.hkv + h - p.hq - p.hkv) * p.hd;
        v_cache[dst + e.x] = {{TC}}(a);
        v_cache[dst + e.y] = {{TC}}(b);
    }
}
#endif
