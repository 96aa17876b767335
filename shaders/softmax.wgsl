// Softmax over the last dimension of [rows, n]: out = softmax(scale * x), optionally causal (row r is
// query q = r % q_len, and key j is masked when j > q + q_offset; masked outputs are 0).
// Numerically stable: each thread keeps an online (max, sum of exp) pair over its values, the pairs
// are merged by a max reduction and a sum reduction, then a second pass writes exp(y - max) / sum.
//
// Specialisation:
//   TX, TO   element types of x and out (f32|f16); F16 when either is f16
//   VEC4     x and out are bound as vec4 arrays (n % 4 == 0 and both base offsets % 4 == 0)
//   SGROW    one subgroup per row, RPW rows per workgroup (no barriers at all)
//   SG       subgroup builtins available; without SGROW: one workgroup per row, subgroup reductions
//            merged through workgroup memory. Neither: one workgroup per row, workgroup-memory tree.
//   WG, RPW  workgroup size (a power of two), rows per workgroup (SGROW only)
//   CACHE, PER  hold the row in registers, PER vectors per thread (else stream it twice)
#if F16
enable f16;
#endif

struct Params {
    off_x: u32, off_out: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    rows: u32, n: u32, scale: f32, causal: u32,
    q_len: u32, q_offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if VEC4
@group(0) @binding(1) var<storage, read> x: array<vec4<{{TX}}>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<{{TO}}>>;
alias V = vec4<f32>;
alias VO = vec4<{{TO}}>;
const VW: u32 = 4u;
fn hmax(v: V) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }
fn hsum(v: V) -> f32 { return (v.x + v.y) + (v.z + v.w); }
// Which of the 4 values of vector `v` lie below `limit`.
fn below(v: u32, limit: u32) -> vec4<bool> { return vec4<u32>(v * 4u) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(limit); }
#else
@group(0) @binding(1) var<storage, read> x: array<{{TX}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{TO}}>;
alias V = f32;
alias VO = {{TO}};
const VW: u32 = 1u;
fn hmax(v: V) -> f32 { return v; }
fn hsum(v: V) -> f32 { return v; }
fn below(v: u32, limit: u32) -> bool { return v < limit; }
#endif

const WG: u32 = {{WG}}u;
const PER: u32 = {{PER}}u;
// Stands in for -inf (WGSL has no infinity literal); exp(NEG - m) is 0 for any finite m.
const NEG: f32 = -3.0e38;

#if SGROW
const RPW: u32 = {{RPW}}u;
fn red_max(v: f32) -> f32 { return subgroupMax(v); }
fn red_sum(v: f32) -> f32 { return subgroupAdd(v); }
#else
var<workgroup> red: array<f32, WG>;
var<private> t_lid: u32;
#if SG
var<private> t_lane: u32;
var<private> t_sg: u32;
var<private> t_nsg: u32;
var<private> t_sgsize: u32;
// Subgroup reduction, then each subgroup folds the per-subgroup results (a lane per result, one
// read each when there are at most as many subgroups as lanes) with a second subgroup reduction.
// subgroup_id is used rather than lid / size, so no mapping of invocations to subgroups is assumed.
fn red_max(v: f32) -> f32 {
    let s = subgroupMax(v);
    workgroupBarrier();
    if t_lane == 0u { red[t_sg] = s; }
    workgroupBarrier();
    var t = NEG;
    for (var i = t_lane; i < t_nsg; i += t_sgsize) { t = max(t, red[i]); }
    return subgroupMax(t);
}
fn red_sum(v: f32) -> f32 {
    let s = subgroupAdd(v);
    workgroupBarrier();
    if t_lane == 0u { red[t_sg] = s; }
    workgroupBarrier();
    var t = 0.0;
    for (var i = t_lane; i < t_nsg; i += t_sgsize) { t += red[i]; }
    return subgroupAdd(t);
}
#else
fn red_max(v: f32) -> f32 {
    workgroupBarrier();
    red[t_lid] = v;
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if t_lid < s { red[t_lid] = max(red[t_lid], red[t_lid + s]); }
    }
    workgroupBarrier();
    return red[0];
}
fn red_sum(v: f32) -> f32 {
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

// One row, spread over `lanes` threads; `live` is false for the padding workgroups of a 2-D grid,
// which still take part in the reductions' barriers.
fn softmax_row(row: u32, lane: u32, lanes: u32, live: bool) {
    let n = p.n;
    var valid = n;
    if p.causal != 0u {
        valid = min(n, row % p.q_len + p.q_offset + 1u);
    }
    let nv = n / VW;
    // Vectors that hold at least one unmasked value; the rest are written as zeros without a read.
    let nvv = select(0u, (valid + VW - 1u) / VW, live);
    let xb = p.off_x / VW + row * nv;
    let ob = p.off_out / VW + row * nv;
#if CACHE
    // The row is held in registers (PER vectors per thread, all loads issued up front): one read.
    var buf: array<V, PER>;
    var m = NEG;
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        var y = V(NEG);
        if v < nvv {
            y = select(V(NEG), V(x[xb + v]) * p.scale, below(v, valid));
        }
        buf[i] = y;
        m = max(m, hmax(y));
    }
    let mx = red_max(m);
    var s = 0.0;
    for (var i = 0u; i < PER; i++) {
        // Masked and missing values hold NEG: exp gives 0.
        buf[i] = exp(buf[i] - mx);
        s += hsum(buf[i]);
    }
    let inv = 1.0 / red_sum(s);
    if !live {
        return;
    }
    for (var i = 0u; i < PER; i++) {
        let v = lane + i * lanes;
        if v < nv {
            out[ob + v] = VO(buf[i] * inv);
        }
    }
#else
    // Rows too long for registers: an online (max, sum) pass, then a second read to write.
    var m = NEG;
    var s = 0.0;
    for (var v = lane; v < nvv; v += lanes) {
        let keep = below(v, valid);
        let y = select(V(NEG), V(x[xb + v]) * p.scale, keep);
        let mn = max(m, hmax(y));
        s = s * exp(m - mn) + hsum(select(V(0.0), exp(y - mn), keep));
        m = mn;
    }
    let mx = red_max(m);
    let total = red_sum(s * exp(m - mx));
    if !live {
        return;
    }
    let inv = 1.0 / total;
    for (var v = lane; v < nv; v += lanes) {
        var o = V(0.0);
        if v < nvv {
            o = select(V(0.0), exp(V(x[xb + v]) * p.scale - mx) * inv, below(v, valid));
        }
        out[ob + v] = VO(o);
    }
#endif
}

@compute @workgroup_size(WG)
fn softmax(
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
    // Subgroups take the workgroup's rows in turn, so any subgroup size works.
    for (var r = sg_id; r < RPW; r += n_sg) {
        let row = wg * RPW + r;
        if row < p.rows {
            softmax_row(row, sg_lane, sg_size, true);
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
    softmax_row(wg, lid, WG, wg < p.rows);
#endif
}
