// Matrix-vector products for decode, bandwidth-bound on the weight:
//   out[b, row0 + r] = sum_k w[r, k] * x[b, k] (+ bias[row0 + r]),   b < NB (1..8), f32 accumulation,
// with the fused prologues / epilogues of matvec_fuse.wgsl (appended: RMSNorm or SwiGLU of the input,
// residual add of the output; x_in4 / x_in1 give the input, write_out stores).
// w is one row shard [rows, K] of a weight (row-major); out rows start at row0 of an [NB, ldo] output.
// A workgroup covers RPW rows (8, or with SG 8 x 2^n: each subgroup then takes several rows in turn,
// sharing the workgroup's staged input); each row is reduced by one team of lanes that stride along K:
// with SG the team is a hardware subgroup (any size; rows rr = subgroup_id, += num_subgroups) and the
// partial sums meet in subgroupAdd, otherwise the team is 32 invocations and they meet in a
// workgroup-memory tree. W is read once, 16 bytes per lane and load (8 f16 as vec4<u32> unpacked
// with unpack2x16float, or 4 f32), four loads in flight per lane.
//
// wgpu compiles every WGSL loop with an iteration guard (naga's loop bounding), which keeps drivers
// from unrolling it; so the NB accumulators are named struct fields, never a loop-indexed private
// array (that would live in slow local memory), and `if NB > b` tests fold away at compile time.
//
// With one activation row and a prologue, matvec_fuse.wgsl's STAGE has the workgroup apply the prologue
// once into workgroup memory (stage_x) before the rows read it.
//
// Specialisation: TX (x scalar), TO (output scalar), F16, NB, WG (workgroup size), RPW, TEAMED with TEAMS
// (subgroups per row, see the entry point), WF16 (f16 weight),
// VEC (K and the w / x offsets allow the vector loads; XV4 is set with it), SG, PF (with SG, VEC and
// STAGE: each subgroup's first row's first loads issued before the staging), and matvec_fuse.wgsl's
// BIAS, NORM, SWIGLU, RES (with their types and bindings), the paired-row epilogues (PAIRS with GLU or
// ROPE) and STAGE, XS, STAGE_TAIL.
#if F16
enable f16;
#endif

struct Params {
    offs: array<vec4<u32>, 2>, // base element offsets of bindings 1..8 (tensor_base)
    rows: u32, k: u32, ldo: u32, row0: u32,
    eps: f32,                  // NORM
    hq: u32, hkv: u32, hd: u32, rot: u32, max_ctx: u32, // ROPE
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

const NB = {{NB}}u;
const WG = {{WG}}u;
const RPW = {{RPW}}u;
#ifnot SG
const TS = 32u; // team size of the workgroup-memory variant
var<workgroup> red: array<Red, NB * WG>;
#endif
#if TEAMED
const TEAMS = {{TEAMS}}u;
var<workgroup> team_red: array<f32, WG / 32u>; // one sum per subgroup (subgroups of 32 only)
#endif

// Per-lane partial sums of the current row, one vec4 per activation row b (fields a0..a7, b < NB).
struct Acc {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
}
var<private> acc: Acc;

#if VEC
#if WF16
const CW = 8u; // elements per W load
alias WT = vec4<u32>;
fn wload(i: u32) -> vec4<u32> {
    return w[i];
}
// a + w chunk c (8 elements at k = 8 c) * x row b at the same k.
fn fma_chunk(wv: vec4<u32>, b: u32, c: u32, a: vec4<f32>) -> vec4<f32> {
    let x0 = x_in4(b, 8u * c);
    let x1 = x_in4(b, 8u * c + 4u);
    let w0 = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
    let w1 = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));
    return fma(w0, x0, fma(w1, x1, a));
}
#else
const CW = 4u;
alias WT = vec4<f32>;
fn wload(i: u32) -> vec4<f32> {
    return w[i];
}
fn fma_chunk(wv: vec4<f32>, b: u32, c: u32, a: vec4<f32>) -> vec4<f32> {
    return fma(wv, x_in4(b, 4u * c), a);
}
#endif
#if WF16
fn add_chunk(wv: vec4<u32>, c: u32) {
#else
fn add_chunk(wv: vec4<f32>, c: u32) {
#endif
    acc.a0 = fma_chunk(wv, 0u, c, acc.a0);
    if NB > 1u {
        acc.a1 = fma_chunk(wv, 1u, c, acc.a1);
    }
    if NB > 2u {
        acc.a2 = fma_chunk(wv, 2u, c, acc.a2);
    }
    if NB > 3u {
        acc.a3 = fma_chunk(wv, 3u, c, acc.a3);
    }
    if NB > 4u {
        acc.a4 = fma_chunk(wv, 4u, c, acc.a4);
    }
    if NB > 5u {
        acc.a5 = fma_chunk(wv, 5u, c, acc.a5);
    }
    if NB > 6u {
        acc.a6 = fma_chunk(wv, 6u, c, acc.a6);
    }
    if NB > 7u {
        acc.a7 = fma_chunk(wv, 7u, c, acc.a7);
    }
}
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
fn xval(b: u32, e: u32) -> f32 {
    return x_in1(b, e);
}
// acc += w (the weights at e, e + ts, e + 2 ts, e + 3 ts) * x at the same positions.
fn x4(b: u32, e: u32, ts: u32) -> vec4<f32> {
    return vec4<f32>(xval(b, e), xval(b, e + ts), xval(b, e + 2u * ts), xval(b, e + 3u * ts));
}
fn add4(wv: vec4<f32>, e: u32, ts: u32) {
    acc.a0 = fma(wv, x4(0u, e, ts), acc.a0);
    if NB > 1u {
        acc.a1 = fma(wv, x4(1u, e, ts), acc.a1);
    }
    if NB > 2u {
        acc.a2 = fma(wv, x4(2u, e, ts), acc.a2);
    }
    if NB > 3u {
        acc.a3 = fma(wv, x4(3u, e, ts), acc.a3);
    }
    if NB > 4u {
        acc.a4 = fma(wv, x4(4u, e, ts), acc.a4);
    }
    if NB > 5u {
        acc.a5 = fma(wv, x4(5u, e, ts), acc.a5);
    }
    if NB > 6u {
        acc.a6 = fma(wv, x4(6u, e, ts), acc.a6);
    }
    if NB > 7u {
        acc.a7 = fma(wv, x4(7u, e, ts), acc.a7);
    }
}
fn add1(wv: f32, e: u32) {
    acc.a0.x = fma(wv, xval(0u, e), acc.a0.x);
    if NB > 1u {
        acc.a1.x = fma(wv, xval(1u, e), acc.a1.x);
    }
    if NB > 2u {
        acc.a2.x = fma(wv, xval(2u, e), acc.a2.x);
    }
    if NB > 3u {
        acc.a3.x = fma(wv, xval(3u, e), acc.a3.x);
    }
    if NB > 4u {
        acc.a4.x = fma(wv, xval(4u, e), acc.a4.x);
    }
    if NB > 5u {
        acc.a5.x = fma(wv, xval(5u, e), acc.a5.x);
    }
    if NB > 6u {
        acc.a6.x = fma(wv, xval(6u, e), acc.a6.x);
    }
    if NB > 7u {
        acc.a7.x = fma(wv, xval(7u, e), acc.a7.x);
    }
}
#endif

#if VEC
// Adds chunks c, c + ts, ... of the weight row starting at chunk `wrow` (nc chunks), four loads in
// flight.
fn partial_from(wrow: u32, nc: u32, c0: u32, ts: u32) {
    var c = c0;
    for (; c + 3u * ts < nc; c += 4u * ts) {
        let w0 = wload(wrow + c);
        let w1 = wload(wrow + c + ts);
        let w2 = wload(wrow + c + 2u * ts);
        let w3 = wload(wrow + c + 3u * ts);
        add_chunk(w0, c);
        add_chunk(w1, c + ts);
        add_chunk(w2, c + 2u * ts);
        add_chunk(w3, c + 3u * ts);
    }
    for (; c < nc; c += ts) {
        add_chunk(wload(wrow + c), c);
    }
}
#endif

#if PF
// The first four chunks of a subgroup's first row, loaded before the input is staged so that their
// memory latency overlaps the staging (chunks past the row re-read its last one and go unused).
struct Pre {
    w0: WT, w1: WT, w2: WT, w3: WT,
}

fn prefetch(row: u32, lane: u32, ts: u32) -> Pre {
    let wrow = (tensor_base(1u) + row * p.k) / CW;
    let last = p.k / CW - 1u;
    return Pre(
        wload(wrow + min(lane, last)), wload(wrow + min(lane + ts, last)),
        wload(wrow + min(lane + 2u * ts, last)), wload(wrow + min(lane + 3u * ts, last)),
    );
}

// partial() of a row whose first four chunks are `pre`.
fn partial_pre(row: u32, lane: u32, ts: u32, pre: Pre) {
    acc = Acc();
    fuse_begin_row();
    let wrow = (tensor_base(1u) + row * p.k) / CW;
    let nc = p.k / CW;
    if lane < nc {
        add_chunk(pre.w0, lane);
    }
    if lane + ts < nc {
        add_chunk(pre.w1, lane + ts);
    }
    if lane + 2u * ts < nc {
        add_chunk(pre.w2, lane + 2u * ts);
    }
    if lane + 3u * ts < nc {
        add_chunk(pre.w3, lane + 3u * ts);
    }
    partial_from(wrow, nc, lane + 4u * ts, ts);
}
#endif

// acc = this lane's partial sums of row `row` (lanes `lane`, stride `ts`), four loads in flight.
fn partial(row: u32, lane: u32, ts: u32) {
    acc = Acc();
    fuse_begin_row();
#if VEC
    partial_from((tensor_base(1u) + row * p.k) / CW, p.k / CW, lane, ts);
#else
    let wrow = tensor_base(1u) + row * p.k;
    var e = lane;
    for (; e + 3u * ts < p.k; e += 4u * ts) {
        add4(vec4<f32>(wval(wrow + e), wval(wrow + e + ts), wval(wrow + e + 2u * ts), wval(wrow + e + 3u * ts)), e, ts);
    }
    for (; e < p.k; e += ts) {
        add1(wval(wrow + e), e);
    }
#endif
}

fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

#if SG
fn reduce_write(row: u32, lane: u32, b: u32, v: vec4<f32>) {
    let s = subgroupAdd(red_pack(hsum(v), b));
    if lane == 0u {
        write_out(row, b, s);
    }
}
#endif

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
#if PF
    // The subgroup's first row (rr = sg below), clamped into the weight.
#if PAIRS
    let pf_row = pair_row(first, sg);
#else
    let pf_row = min(first + sg, p.rows - 1u);
#endif
    let pre = prefetch(pf_row, lane, sgs);
#endif
#if STAGE
#if SG
    stage_x(lid, sg, nsg, lane);
#else
    stage_x(lid);
#endif
#endif
#if TEAMED
    // TEAMS subgroups per row (plain products of one activation row): subgroup j of a team takes the
    // j-th of every TEAMS runs of 32 chunks, so more warps keep weight loads in flight; the teams'
    // sums meet in workgroup memory. Rows are subgroup-uniform, the barrier workgroup-uniform.
    let rr = sg / TEAMS;
    let row = first + rr;
    if row < p.rows {
        partial(row, (sg % TEAMS) * sgs + lane, sgs * TEAMS);
    }
    let team_sum = subgroupAdd(hsum(acc.a0));
    if lane == 0u {
        team_red[sg] = team_sum;
    }
    workgroupBarrier();
    if sg % TEAMS == 0u && lane == 0u && row < p.rows {
        var t = team_red[sg];
        for (var j = 1u; j < TEAMS; j++) {
            t += team_red[sg + j];
        }
        write_out(row, 0u, t);
    }
#else
#if SG
    // Whole subgroups take whole rows, so every subgroup op below runs in subgroup-uniform flow.
    for (var rr = sg; rr < RPW; rr += nsg) {
        let row = first + rr;
        if row >= p.rows {
            break;
        }
#if PAIRS
        let wrow = pair_row(first, rr);
#if PF
        if rr == sg {
            partial_pre(wrow, lane, sgs, pre);
        } else {
            partial(wrow, lane, sgs);
        }
#else
        partial(wrow, lane, sgs);
#endif
        let s = subgroupAdd(red_pack(hsum(acc.a0), 0u));
        if lane == 0u {
            pair_keep(rr, wrow, s);
        }
#else
#if PF
        if rr == sg {
            partial_pre(row, lane, sgs, pre);
        } else {
            partial(row, lane, sgs);
        }
#else
        partial(row, lane, sgs);
#endif
        reduce_write(row, lane, 0u, acc.a0);
        if NB > 1u {
            reduce_write(row, lane, 1u, acc.a1);
        }
        if NB > 2u {
            reduce_write(row, lane, 2u, acc.a2);
        }
        if NB > 3u {
            reduce_write(row, lane, 3u, acc.a3);
        }
        if NB > 4u {
            reduce_write(row, lane, 4u, acc.a4);
        }
        if NB > 5u {
            reduce_write(row, lane, 5u, acc.a5);
        }
        if NB > 6u {
            reduce_write(row, lane, 6u, acc.a6);
        }
        if NB > 7u {
            reduce_write(row, lane, 7u, acc.a7);
        }
#endif
    }
#else
    let team = lid / TS;
    let lane = lid % TS;
    let row = first + team;
#if PAIRS
    let wrow = pair_row(first, team);
#else
    let wrow = row;
#endif
    if row < p.rows {
        partial(wrow, lane, TS);
    }
    red[lid] = red_pack(hsum(acc.a0), 0u);
    if NB > 1u {
        red[WG + lid] = red_pack(hsum(acc.a1), 1u);
    }
    if NB > 2u {
        red[2u * WG + lid] = red_pack(hsum(acc.a2), 2u);
    }
    if NB > 3u {
        red[3u * WG + lid] = red_pack(hsum(acc.a3), 3u);
    }
    if NB > 4u {
        red[4u * WG + lid] = red_pack(hsum(acc.a4), 4u);
    }
    if NB > 5u {
        red[5u * WG + lid] = red_pack(hsum(acc.a5), 5u);
    }
    if NB > 6u {
        red[6u * WG + lid] = red_pack(hsum(acc.a6), 6u);
    }
    if NB > 7u {
        red[7u * WG + lid] = red_pack(hsum(acc.a7), 7u);
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
#if PAIRS
        pair_keep(team, wrow, red[lid]);
#else
        for (var b = 0u; b < NB; b++) {
            write_out(row, b, red[b * WG + lid]);
        }
#endif
    }
#endif
#endif
#if PAIRS
    pair_finish(first, lid);
#endif
}
