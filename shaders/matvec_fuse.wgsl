// Fused prologues and epilogues of the matrix-vector kernels, appended to matvec.wgsl and
// matvec_quant.wgsl (and usable by any kernel that reduces one output row per team of lanes covering
// all of K), so decode needs no separate norm, activation or residual-add dispatches.
//
// The host kernel provides: `p` (Params: `offs`, the 8 base offsets of bindings 1..8, then at least
// `k`, `ldo`, `row0`, `eps`), binding 2 `xs` (the activations: vec4<TX> elements with XV4, else TX),
// binding 3 `out` (TO), `NB` (batch rows). The optional tensors follow out in this order, each bound
// only when its define is on: BIAS (`bias`, TB, binding 4), NORM (`norm_w`, TG, binding NORM_B, vec4
// elements with GV4), RES (`resid`, TR, binding RES_B).
//
// Input prologue, x_in4 / x_in1 (the matvec's input at elements e.. of batch row b):
//   plain   x[b, e]
//   NORM    x[b, e] * g[e]; the squares of x are summed per lane as they are loaded (sq) and reduced
//           with the dot products (Red is then (dot, sum x^2)), so write_out can scale the dot by
//           1 / sqrt(mean(x^2) + eps): RMSNorm folded into the product (needs the team's lanes to cover
//           all of K, which they do).
//   SWIGLU  silu(x[b, e]) * x[b, K + e]: x rows are [gate | up], 2K long.
// Output epilogue, write_out: out[b, row] = dot (* rs with NORM) (+ bias[row]) (+ resid[b, row]).
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
// This lane's sums of x^2 per batch row for the current output row.
var<private> sq: array<vec4<f32>, NB>;

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
    sq = array<vec4<f32>, NB>();
#endif
}

// The input at x[b, e .. e + 4] (e a multiple of 4), counting its squares once per call.
fn x_in4(b: u32, e: u32) -> vec4<f32> {
#if SWIGLU
    let gate = x_raw4(b, e);
    let up = x_raw4(b, p.k + e);
    return gate / (1.0 + exp(-gate)) * up;
#else
    let v = x_raw4(b, e);
#if NORM
    sq[b] = fma(v, v, sq[b]);
    return v * g4(e);
#else
    return v;
#endif
#endif
}

// The input at x[b, e], counting its square once per call.
fn x_in1(b: u32, e: u32) -> f32 {
#if SWIGLU
    let gate = x_raw1(b, e);
    return gate / (1.0 + exp(-gate)) * x_raw1(b, p.k + e);
#else
    let v = x_raw1(b, e);
#if NORM
    sq[b].x = fma(v, v, sq[b].x);
    return v * g1(e);
#else
    return v;
#endif
#endif
}

// What a team reduces per (row, batch row): the dot product, and with NORM the sum of x^2.
#if NORM
alias Red = vec2<f32>;
fn red_pack(dot_sum: f32, b: u32) -> Red {
    let s = sq[b];
    return vec2<f32>(dot_sum, (s.x + s.y) + (s.z + s.w));
}
#else
alias Red = f32;
fn red_pack(dot_sum: f32, b: u32) -> Red {
    return dot_sum;
}
#endif

// out[b, row0 + row] from the team's reduced sums.
fn write_out(row: u32, b: u32, r: Red) {
#if NORM
    var v = r.x * inverseSqrt(r.y / f32(p.k) + p.eps);
#else
    var v = r;
#endif
#if BIAS
    v += f32(bias[tensor_base(4u) + p.row0 + row]);
#endif
    let o = b * p.ldo + p.row0 + row;
#if RES
    v += f32(resid[tensor_base(RES_B) + o]);
#endif
    out[tensor_base(3u) + o] = {{TO}}(v);
}
