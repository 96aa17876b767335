// Matrix-vector products for decode, bandwidth-bound on the weight:
//   out[b, row0 + r] = sum_k w[r, k] * x[b, k] (+ bias[row0 + r]),   b < NB (1..8), f32 accumulation.
// w is one row shard [rows, K] of a weight (row-major); out rows start at row0 of an [NB, ldo] output.
// A workgroup covers RPW = 8 rows; each row is reduced by one team of lanes that stride along K:
// with SG the team is a hardware subgroup (any size; rows rr = subgroup_id, += num_subgroups) and the
// partial sums meet in subgroupAdd, otherwise the team is 32 invocations and they meet in a
// workgroup-memory tree. W is read once, 16 bytes per lane and load (8 f16 as vec4<u32> unpacked
// with unpack2x16float, or 4 f32), four loads in flight per lane.
//
// Specialisation: TX (x scalar), TO (output scalar), TB (bias scalar), F16, NB, WG (workgroup size),
// WF16 (f16 weight), VEC (K and the w / x offsets allow the vector loads), SG, BIAS.
#if F16
enable f16;
#endif

struct Params {
    off_w: u32, off_x: u32, off_out: u32, off_bias: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    rows: u32, k: u32, ldo: u32, row0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if WF16
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>; // 8 halves
#else
@group(0) @binding(1) var<storage, read> w: array<u32>;       // 2 halves
#endif
#else
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> w: array<f32>;
#endif
#endif
#if VEC
@group(0) @binding(2) var<storage, read> xs: array<vec4<{{TX}}>>;
#else
@group(0) @binding(2) var<storage, read> xs: array<{{TX}}>;
#endif
@group(0) @binding(3) var<storage, read_write> out: array<{{TO}}>;
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<{{TB}}>;
#endif

const NB = {{NB}}u;
const WG = {{WG}}u;
const RPW = 8u;
#ifnot SG
const TS = 32u; // team size of the workgroup-memory variant
var<workgroup> red: array<f32, NB * WG>;
#endif

#if VEC
#if WF16
const CW = 8u; // elements per W load
fn wload(i: u32) -> vec4<u32> {
    return w[i];
}
// acc += w chunk (8 elements at k = 8 c) * x[b, 8 c .. 8 c + 8]
fn fma_chunk(wv: vec4<u32>, xb: u32, c: u32, acc: vec4<f32>) -> vec4<f32> {
    let x0 = vec4<f32>(xs[xb + 2u * c]);
    let x1 = vec4<f32>(xs[xb + 2u * c + 1u]);
    let w0 = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
    let w1 = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));
    return fma(w0, x0, fma(w1, x1, acc));
}
#else
const CW = 4u;
fn wload(i: u32) -> vec4<f32> {
    return w[i];
}
fn fma_chunk(wv: vec4<f32>, xb: u32, c: u32, acc: vec4<f32>) -> vec4<f32> {
    return fma(wv, vec4<f32>(xs[xb + c]), acc);
}
#endif
#else
#if WF16
fn wval(e: u32) -> f32 {
    return unpack2x16float(w[e / 2u])[e % 2u];
}
#else
fn wval(e: u32) -> f32 {
    return w[e];
}
#endif
#endif

// Partial sums of one lane over its share of row `row` (lanes `lane`, stride `ts`).
fn partial(row: u32, lane: u32, ts: u32) -> array<vec4<f32>, NB> {
    var acc: array<vec4<f32>, NB>;
#if VEC
    let wrow = (p.off_w + row * p.k) / CW;
    let nc = p.k / CW;
    var c = lane;
    for (; c + 3u * ts < nc; c += 4u * ts) {
        let w0 = wload(wrow + c);
        let w1 = wload(wrow + c + ts);
        let w2 = wload(wrow + c + 2u * ts);
        let w3 = wload(wrow + c + 3u * ts);
        for (var b = 0u; b < NB; b++) {
            let xb = (p.off_x + b * p.k) / 4u;
            var a = fma_chunk(w0, xb, c, acc[b]);
            a = fma_chunk(w1, xb, c + ts, a);
            a = fma_chunk(w2, xb, c + 2u * ts, a);
            acc[b] = fma_chunk(w3, xb, c + 3u * ts, a);
        }
    }
    for (; c < nc; c += ts) {
        let w0 = wload(wrow + c);
        for (var b = 0u; b < NB; b++) {
            acc[b] = fma_chunk(w0, (p.off_x + b * p.k) / 4u, c, acc[b]);
        }
    }
#else
    let wrow = p.off_w + row * p.k;
    var e = lane;
    for (; e + 3u * ts < p.k; e += 4u * ts) {
        let w0 = vec4<f32>(wval(wrow + e), wval(wrow + e + ts), wval(wrow + e + 2u * ts), wval(wrow + e + 3u * ts));
        for (var b = 0u; b < NB; b++) {
            let xb = p.off_x + b * p.k + e;
            let x0 = vec4<f32>(f32(xs[xb]), f32(xs[xb + ts]), f32(xs[xb + 2u * ts]), f32(xs[xb + 3u * ts]));
            acc[b] = fma(w0, x0, acc[b]);
        }
    }
    for (; e < p.k; e += ts) {
        let w0 = wval(wrow + e);
        for (var b = 0u; b < NB; b++) {
            acc[b].x = fma(w0, f32(xs[p.off_x + b * p.k + e]), acc[b].x);
        }
    }
#endif
    return acc;
}

fn write(row: u32, b: u32, s: f32) {
    var v = s;
#if BIAS
    v += f32(bias[p.off_bias + p.row0 + row]);
#endif
    out[p.off_out + b * p.ldo + p.row0 + row] = {{TO}}(v);
}

@compute @workgroup_size(WG)
fn matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SG
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
#endif
) {
    let first = (wid.x + wid.y * nwg.x) * RPW;
#if SG
    // Whole subgroups take whole rows, so every subgroup op below runs in subgroup-uniform flow.
    for (var rr = sg; rr < RPW; rr += nsg) {
        let row = first + rr;
        if row >= p.rows {
            break;
        }
        let acc = partial(row, lane, sgs);
        for (var b = 0u; b < NB; b++) {
            let s = subgroupAdd(dot(acc[b], vec4<f32>(1.0)));
            if lane == 0u {
                write(row, b, s);
            }
        }
    }
#else
    let team = lid / TS;
    let lane = lid % TS;
    let row = first + team;
    var acc: array<vec4<f32>, NB>;
    if row < p.rows {
        acc = partial(row, lane, TS);
    }
    for (var b = 0u; b < NB; b++) {
        red[b * WG + lid] = dot(acc[b], vec4<f32>(1.0));
    }
    workgroupBarrier();
    for (var s = TS / 2u; s > 0u; s /= 2u) {
        if lane < s {
            for (var b = 0u; b < NB; b++) {
                red[b * WG + lid] += red[b * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if lane == 0u && row < p.rows {
        for (var b = 0u; b < NB; b++) {
            write(row, b, red[b * WG + lid]);
        }
    }
#endif
}
