// Normalisations over the last dimension of [rows, n], f32 accumulation:
//   rmsnorm      out = x / sqrt(mean(x^2) + eps) * w
//   add_rmsnorm  sum = x + res (stored as TS), out = rmsnorm(sum) * w, in one pass over the row
//   layernorm    out = (x - mean) / sqrt(var + eps) * gamma + beta (gamma, beta optional); the mean is
//                reduced first (relative to the row's first value) and the variance from centred
//                values (no E[x^2] - E[x]^2 cancellation)
// Short rows are held in registers and read once (CACHE); long ones are re-read after each
// reduction (from L1/L2 at LLM widths).
//
// Specialisation:
//   KIND_RMS, KIND_ADD, KIND_LN   which of the three
//   SLICES   (KIND_ADD) res is the f32 partial sums of a split-K product, added in slice order
//   VX, VR, VW_, VB, VS, VO  element types (f32|f16, vec4 with VEC4) of x, res, weight/gamma, beta,
//            sum, out; F16 if any is f16; TW, TB: gamma and beta scalar types for GroupNorm
//   GAMMA, BETA              layernorm's optional affine parameters are bound
//   VEC4     every tensor bound as vec4 arrays (n % 4 == 0 and all base offsets % 4 == 0)
//   SGROW, SG, WG, RPW, CACHE, PER   row mapping, as in softmax.wgsl
//   ROWNORM                  the three row norms above (entry `norm`)
//
// GroupNorm over x [N, C, H*W] with G groups: group (n, g) is one contiguous segment of
// L = C/G * H*W values, which can be millions (SD's VAE), so it is two passes over several
// workgroups per segment:
//   GN_STATS   (entry gn_stats) workgroup (segment, chunk) folds its chunk into (count, mean, M2)
//              with Welford/Chan updates (no cancellation however large the segment) -> partials
//   GN_APPLY   (entry gn_apply) workgroup (segment, block) merges the segment's partials, then
//              writes (x - mean) * rstd * gamma[c] + beta[c], with SiLU when SILU
//   VEC4 here needs H*W % 4 == 0 (a vector never straddles channels).
#if F16
enable f16;
#endif

#if VEC4
alias V = vec4<f32>;
const VW: u32 = 4u;
fn vdot(a: V, b: V) -> f32 { return dot(a, b); }
fn hsum(v: V) -> f32 { return (v.x + v.y) + (v.z + v.w); }
#else
alias V = f32;
const VW: u32 = 1u;
fn vdot(a: V, b: V) -> f32 { return a * b; }
fn hsum(v: V) -> f32 { return v; }
#endif

#if ROWNORM
struct Params {
    off_a: u32, off_b: u32, off_c: u32, off_d: u32, off_e: u32, o5: u32, o6: u32, o7: u32,
    rows: u32, n: u32, eps: f32,
    slices: u32, sstride: u32, // SLICES: res holds `slices` partial sums, sstride (in V) apart
}

@group(0) @binding(0) var<uniform> p: Params;

// Bindings, in the order the builders pass the tensors; VX, VR, VW_, VB, VS, VO are the element
// types, vec4<T> or T.
#if KIND_RMS
@group(0) @binding(1) var<storage, read> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read> w: array<{{VW_}}>;
@group(0) @binding(3) var<storage, read_write> out: array<{{VO}}>;
#endif
#if KIND_ADD
@group(0) @binding(1) var<storage, read> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read> res: array<{{VR}}>;
@group(0) @binding(3) var<storage, read> w: array<{{VW_}}>;
@group(0) @binding(4) var<storage, read_write> sum: array<{{VS}}>;
@group(0) @binding(5) var<storage, read_write> out: array<{{VO}}>;
#endif
#if KIND_LN
@group(0) @binding(1) var<storage, read> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{VO}}>;
#if GAMMA
@group(0) @binding(3) var<storage, read> w: array<{{VW_}}>;
#endif
#if BETA
@group(0) @binding({{BETA_BINDING}}) var<storage, read> b: array<{{VB}}>;
#endif
#endif

const WG: u32 = {{WG}}u;
const PER: u32 = {{PER}}u;

// Sums of pairs (LayerNorm's second pass reduces two sums at once); red_sum is its first half.
#if SGROW
const RPW: u32 = {{RPW}}u;
fn red_sum2(v: vec2<f32>) -> vec2<f32> { return subgroupAdd(v); }
#else
var<workgroup> red: array<vec2<f32>, WG>;
var<private> t_lid: u32;
#if SG
var<private> t_lane: u32;
var<private> t_sg: u32;
var<private> t_nsg: u32;
var<private> t_sgsize: u32;
// Subgroup sums folded through workgroup memory by subgroup_id (no invocation mapping assumed).
fn red_sum2(v: vec2<f32>) -> vec2<f32> {
    let s = subgroupAdd(v);
    workgroupBarrier();
    if t_lane == 0u { red[t_sg] = s; }
    workgroupBarrier();
    // Each subgroup folds the per-subgroup sums: a lane per sum, then a second subgroup sum.
    var t = vec2<f32>(0.0);
    for (var i = t_lane; i < t_nsg; i += t_sgsize) { t += red[i]; }
    return subgroupAdd(t);
}
#else
fn red_sum2(v: vec2<f32>) -> vec2<f32> {
    workgroupBarrier();
    red[t_lid] = v;
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if t_lid < s { red[t_lid] += red[t_lid + s]; }
    }
    workgroupBarrier();
    return red[0];
}
#endif
#endif
fn red_sum(v: f32) -> f32 { return red_sum2(vec2<f32>(v, 0.0)).x; }

#if KIND_ADD
#if SLICES
fn res_at(i: u32) -> V {
    var s = V(res[i]);
    for (var j = 1u; j < p.slices; j++) {
        s += V(res[i + j * p.sstride]);
    }
    return s;
}
#else
fn res_at(i: u32) -> V {
    return V(res[i]);
}
#endif
#endif

// One row over `lanes` threads; `live` is false for the padding workgroups of a 2-D grid, which still
// take part in the reductions' barriers. With CACHE the row is held in registers (PER vectors per
// thread, loads issued up front) and read once; otherwise it is streamed again after each reduction.
fn norm_row(row: u32, lane: u32, lanes: u32, live: bool) {
    let nv = select(0u, p.n / VW, live);
    let inv_n = 1.0 / f32(p.n);
    let rb = row * (p.n / VW);
#if CACHE
    var buf: array<V, PER>;
#endif
#if KIND_RMS
    let xb = p.off_a / VW + rb;
    let ob = p.off_c / VW + rb;
    var ss = 0.0;
#if CACHE
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        buf[i] = V(0.0);
        if v < nv {
            buf[i] = V(x[xb + v]);
        }
        ss += vdot(buf[i], buf[i]);
    }
    let rs = inverseSqrt(red_sum(ss) * inv_n + p.eps);
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        if v < nv {
            out[ob + v] = {{VO}}(buf[i] * rs * V(w[p.off_b / VW + v]));
        }
    }
#else
    for (var v = lane; v < nv; v += lanes) {
        let a = V(x[xb + v]);
        ss += vdot(a, a);
    }
    let rs = inverseSqrt(red_sum(ss) * inv_n + p.eps);
    for (var v = lane; v < nv; v += lanes) {
        out[ob + v] = {{VO}}(V(x[xb + v]) * rs * V(w[p.off_b / VW + v]));
    }
#endif
#endif
#if KIND_ADD
    let xb = p.off_a / VW + rb;
    let rsb = p.off_b / VW + rb;
    let sb = p.off_d / VW + rb;
    let ob = p.off_e / VW + rb;
    var ss = 0.0;
    // The norm is of the sum as stored, so it matches a separate add then rmsnorm.
#if CACHE
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        buf[i] = V(0.0);
        if v < nv {
            let s = {{VS}}(V(x[xb + v]) + res_at(rsb + v));
            sum[sb + v] = s;
            buf[i] = V(s);
        }
        ss += vdot(buf[i], buf[i]);
    }
    let rs = inverseSqrt(red_sum(ss) * inv_n + p.eps);
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        if v < nv {
            out[ob + v] = {{VO}}(buf[i] * rs * V(w[p.off_c / VW + v]));
        }
    }
#else
    for (var v = lane; v < nv; v += lanes) {
        let s = {{VS}}(V(x[xb + v]) + res_at(rsb + v));
        sum[sb + v] = s;
        let a = V(s);
        ss += vdot(a, a);
    }
    let rs = inverseSqrt(red_sum(ss) * inv_n + p.eps);
    for (var v = lane; v < nv; v += lanes) {
        // Each thread re-reads only what it wrote itself above.
        out[ob + v] = {{VO}}(V(sum[sb + v]) * rs * V(w[p.off_c / VW + v]));
    }
#endif
#endif
#if KIND_LN
    let xb = p.off_a / VW + rb;
    let ob = p.off_b / VW + rb;
    // Sums are of x - k, k the row's first value: a large common offset (activations with a big DC
    // component) then costs no precision, and the mean is kept as k + dm, never rounded as one f32.
    var k = 0.0;
    if live {
#if VEC4
        k = f32(x[xb].x);
#else
        k = f32(x[xb]);
#endif
    }
    var s1 = 0.0;
#if CACHE
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        buf[i] = V(0.0);
        if v < nv {
            buf[i] = V(x[xb + v]) - k;
        }
        s1 += hsum(buf[i]);
    }
#else
    for (var v = lane; v < nv; v += lanes) {
        s1 += hsum(V(x[xb + v]) - k);
    }
#endif
    let dm = red_sum(s1) * inv_n;
    // Centred sums, plus the sum of the centred values: its mean corrects dm for the rounding of
    // the first pass (the corrected two-pass algorithm).
    var s2 = vec2<f32>(0.0);
#if CACHE
    for (var i = 0u; i < PER; i++) {
        if lane + i * lanes < nv {
            let d = buf[i] - dm;
            s2 += vec2<f32>(hsum(d), vdot(d, d));
        }
    }
#else
    for (var v = lane; v < nv; v += lanes) {
        let d = (V(x[xb + v]) - k) - dm;
        s2 += vec2<f32>(hsum(d), vdot(d, d));
    }
#endif
    let t2 = red_sum2(s2) * inv_n;
    let rs = inverseSqrt(max(t2.y - t2.x * t2.x, 0.0) + p.eps);
    let dm2 = dm + t2.x;
#if CACHE
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        if v >= nv {
            break;
        }
        var o = (buf[i] - dm2) * rs;
#else
    for (var v = lane; v < nv; v += lanes) {
        var o = ((V(x[xb + v]) - k) - dm2) * rs;
#endif
#if GAMMA
        o *= V(w[p.off_c / VW + v]);
#endif
#if BETA
        o += V(b[p.off_{{BETA_OFF}} / VW + v]);
#endif
        out[ob + v] = {{VO}}(o);
    }
#endif
}

@compute @workgroup_size(WG)
fn norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SG
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
#endif
) {
    let wg = wid.x + wid.y * nwg.x;
#if SGROW
    for (var r = sg_id; r < RPW; r += n_sg) {
        let row = wg * RPW + r;
        if row < p.rows {
            norm_row(row, sg_lane, sg_size, true);
        }
    }
#else
    t_lid = lid;
#if SG
    t_lane = sg_lane;
    t_sg = sg_id;
    t_nsg = n_sg;
    t_sgsize = sg_size;
#endif
    norm_row(wg, lid, WG, wg < p.rows);
#endif
}
#endif

#if GN_STATS
struct Params {
    off_x: u32, off_part: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    seg_v: u32,    // vectors per segment
    chunks: u32,   // workgroups per segment
    chunk_v: u32,  // vectors per workgroup
    n_seg: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read_write> part: array<vec4<f32>>;
#endif

#if GN_APPLY
struct Params {
    off_x: u32, off_part: u32, off_g: u32, off_b: u32, off_out: u32, o5: u32, o6: u32, o7: u32,
    seg_v: u32,
    chunks: u32,   // partials per segment (at most WG)
    blocks: u32,   // apply workgroups per segment
    block_v: u32,  // vectors per apply workgroup
    n_seg: u32,
    groups: u32,
    cpg: u32,      // channels per group
    hw_v: u32,     // vectors per channel
    eps: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<{{VX}}>;
@group(0) @binding(2) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> gm: array<{{TW}}>;
@group(0) @binding(4) var<storage, read> bt: array<{{TB}}>;
@group(0) @binding(5) var<storage, read_write> out: array<{{VO}}>;
#endif

#ifnot ROWNORM
const WG: u32 = {{WG}}u;
// (count, mean, M2) of two disjoint sets merged (Chan et al.).
fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    if n == 0.0 {
        return vec3<f32>(0.0);
    }
    let d = b.y - a.y;
    let f = b.x / n;
    return vec3<f32>(n, a.y + d * f, a.z + b.z + d * d * a.x * f);
}
var<workgroup> stat: array<vec3<f32>, WG>;
fn merge_all(lid: u32, v: vec3<f32>) -> vec3<f32> {
    stat[lid] = v;
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if lid < s { stat[lid] = merge(stat[lid], stat[lid + s]); }
    }
    workgroupBarrier();
    return stat[0];
}
#endif

#if GN_STATS
@compute @workgroup_size(WG)
fn gn_stats(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let wg = wid.x + wid.y * nwg.x;
    let live = wg < p.n_seg * p.chunks;
    let seg = wg / p.chunks;
    let start = (wg % p.chunks) * p.chunk_v;
    let end = select(0u, min(p.seg_v, start + p.chunk_v), live);
    let base = p.off_x / VW + seg * p.seg_v;
    var st = vec3<f32>(0.0);
    var v = start + lid;
    // Four loads in flight per step; their 4 * VW values are folded in as one batch (its own mean
    // and M2, then one Chan merge: one division per batch).
    for (; v + 3u * WG < end; v += 4u * WG) {
        let a0 = V(x[base + v]);
        let a1 = V(x[base + v + WG]);
        let a2 = V(x[base + v + 2u * WG]);
        let a3 = V(x[base + v + 3u * WG]);
        let bm = (hsum(a0) + hsum(a1) + hsum(a2) + hsum(a3)) * (0.25 / f32(VW));
        let d0 = a0 - bm;
        let d1 = a1 - bm;
        let d2 = a2 - bm;
        let d3 = a3 - bm;
        let q = (vdot(d0, d0) + vdot(d1, d1)) + (vdot(d2, d2) + vdot(d3, d3));
        st = merge(st, vec3<f32>(4.0 * f32(VW), bm, q));
    }
    for (; v < end; v += WG) {
        let a = V(x[base + v]);
        let bm = hsum(a) / f32(VW);
        let d = a - bm;
        st = merge(st, vec3<f32>(f32(VW), bm, vdot(d, d)));
    }
    let t = merge_all(lid, st);
    if lid == 0u && live {
        part[p.off_part / 4u + wg] = vec4<f32>(t, 0.0);
    }
}
#endif

#if GN_APPLY
fn gn_out(a: V, c: u32, mean: f32, rs: f32) -> V {
    var o = (a - mean) * (rs * f32(gm[p.off_g + c])) + f32(bt[p.off_b + c]);
#if SILU
    o = o / (1.0 + exp(-o));
#endif
    return o;
}

@compute @workgroup_size(WG)
fn gn_apply(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let wg = wid.x + wid.y * nwg.x;
    let live = wg < p.n_seg * p.blocks;
    let seg = wg / p.blocks;
    var st = vec3<f32>(0.0);
    if live && lid < p.chunks {
        st = part[p.off_part / 4u + seg * p.chunks + lid].xyz;
    }
    let t = merge_all(lid, st);
    // Biased variance, as torch.nn.GroupNorm.
    let mean = t.y;
    let rs = inverseSqrt(max(t.z, 0.0) / t.x + p.eps);
    let start = (wg % p.blocks) * p.block_v;
    let end = select(0u, min(p.seg_v, start + p.block_v), live);
    let base = p.off_x / VW + seg * p.seg_v;
    let obase = p.off_out / VW + seg * p.seg_v;
    let c0 = (seg % p.groups) * p.cpg;
    // Four loads issued before any store (an apply workgroup covers exactly 4 vectors per thread).
    var v = start + lid;
    for (; v + 3u * WG < end; v += 4u * WG) {
        let a = array<V, 4>(
            V(x[base + v]),
            V(x[base + v + WG]),
            V(x[base + v + 2u * WG]),
            V(x[base + v + 3u * WG]),
        );
        for (var k = 0u; k < 4u; k++) {
            let e = v + k * WG;
            out[obase + e] = {{VO}}(gn_out(a[k], c0 + e / p.hw_v, mean, rs));
        }
    }
    for (; v < end; v += WG) {
        out[obase + v] = {{VO}}(gn_out(V(x[base + v]), c0 + v / p.hw_v, mean, rs));
    }
}
#endif
