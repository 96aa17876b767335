// Matrix-vector products on GGML block-quantized weights (decode), bandwidth-bound on the weight:
//   out[b, row0 + r] = sum_k w[r, k] * x[b, k] (+ bias[row0 + r]),   b < NB (1..8), f32 accumulation,
// w one row shard [rows, K] of a weight, kept in its GGUF block layout and dequantized in registers
// (dequant.wgsl, appended to this file, decodes 32-element chunks; see there for the layout), with the
// fused prologues / epilogues of matvec_fuse.wgsl (appended after it: RMSNorm or SwiGLU of the input,
// residual add of the output).
//
// A workgroup covers TEAMS = 8 teams of R rows. A team's lanes stride along K one 32-element chunk at a
// time (adjacent lanes read adjacent blocks, so a team streams its rows contiguously) and keeps U chunks
// per row in flight as raw words (all loads of a step are issued before any decoding); each lane's R
// rows share its x loads. Per chunk the sums of q * x (in f32) are scaled once by the block scale (and
// the block min times sum x is added for the types with mins), so a weight element costs a byte
// extract, one OR, one subtraction and one FMA per batch row. With SG the team is a
// hardware subgroup (any size: teams g = subgroup_id, += num_subgroups) reducing with subgroupAdd,
// otherwise 32 invocations reducing through a workgroup-memory tree.
//
// With one activation row and a prologue, matvec_fuse.wgsl's STAGE has the workgroup apply the prologue
// once into workgroup memory (stage_x) before the teams read it.
//
// Specialisation: the block type (dequant.wgsl), ALIGNED, TX / TO (x, out scalar types), F16, NB, R, U,
// UREM (U > 1), WG (workgroup size), XV4 (x offset allows vec4 loads), SG, MIN (type has mins), and
// matvec_fuse.wgsl's BIAS, NORM, SWIGLU, RES (with their types and bindings) and STAGE, XS, STAGE_TAIL.
// Params and the bindings are in matvec_quant_io.wgsl (prepended).

const NB = {{NB}}u;
const R = {{R}}u;
const U = {{U}}u;
const WG = {{WG}}u;
const TEAMS = 8u;
const NACC = NB * R;
#ifnot SG
const TS = 32u; // team size of the workgroup-memory variant
var<workgroup> red: array<Red, NACC * WG>;
#endif

// The input at x[b, 4v .. 4v + 4] (matvec_fuse.wgsl's prologue).
fn xv(b: u32, v: u32) -> vec4<f32> {
    return x_in4(b, 4u * v);
}

// The chunk's dot product with x (per vector lane; summed at the end).
fn dot_chunk(r: Chunk, x: array<vec4<f32>, 8>, xsum: vec4<f32>) -> vec4<f32> {
    var s0 = r.q[0] * x[0];
    s0 = fma(r.q[1], x[1], s0);
    s0 = fma(r.q[2], x[2], s0);
    s0 = fma(r.q[3], x[3], s0);
    var s1 = r.q[4] * x[4];
    s1 = fma(r.q[5], x[5], s1);
    s1 = fma(r.q[6], x[6], s1);
    s1 = fma(r.q[7], x[7], s1);
    var t = fma(vec4<f32>(r.a0), s0, vec4<f32>(r.a1) * s1);
#if MIN
    t = fma(vec4<f32>(r.m), xsum, t);
#endif
    return t;
}

// acc += chunk c of the lane's R rows (raw words `raw`) times x[b, 32c ..] for every batch row b.
fn accumulate(acc: ptr<function, array<vec4<f32>, NACC>>, raw: array<Raw, R>, c: u32) {
    var ch: array<Chunk, R>;
    for (var r = 0u; r < R; r++) {
        ch[r] = decode(raw[r], c);
    }
    for (var b = 0u; b < NB; b++) {
        var x: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            x[i] = xv(b, 8u * c + i);
        }
        var xsum = vec4<f32>(0.0);
#if MIN
        xsum = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
#endif
        for (var r = 0u; r < R; r++) {
            (*acc)[r * NB + b] += dot_chunk(ch[r], x, xsum);
        }
    }
}

// One lane's partial sums for rows first .. first + R (rows past the end repeat the last row; their
// sums are dropped), accumulator i = row i / NB, batch row i % NB.
fn team(first: u32, lane: u32, ts: u32) -> array<vec4<f32>, NACC> {
    var acc: array<vec4<f32>, NACC>;
    fuse_begin_row();
    var rb: array<u32, R>;
    for (var r = 0u; r < R; r++) {
        rb[r] = tensor_base(1u) * 4u + p.wbyte + min(first + r, p.rows - 1u) * p.row_bytes;
    }
    var c0 = lane;
    // Whole steps: every load of the step is issued (as raw words) before any decoding, and the body
    // has no branches, so the compiler is free to schedule the x loads early too.
    for (; c0 + (U - 1u) * ts < p.nchunks; c0 += U * ts) {
        var raw: array<array<Raw, R>, U>;
        for (var u = 0u; u < U; u++) {
            for (var r = 0u; r < R; r++) {
                raw[u][r] = load(rb[r], c0 + u * ts);
            }
        }
        for (var u = 0u; u < U; u++) {
            accumulate(&acc, raw[u], c0 + u * ts);
        }
    }
#if UREM
    // The lane's last chunks, fewer than U.
    for (; c0 < p.nchunks; c0 += ts) {
        var raw: array<Raw, R>;
        for (var r = 0u; r < R; r++) {
            raw[r] = load(rb[r], c0);
        }
        accumulate(&acc, raw, c0);
    }
#endif
    return acc;
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
    let wg_first = (wid.x + wid.y * nwg.x) * TEAMS * R;
#if STAGE
#if SG
    stage_x(lid, sg, nsg, lane);
#else
    stage_x(lid);
#endif
#endif
#if SG
    // Whole subgroups take whole teams, so the subgroup ops below run in subgroup-uniform flow.
    for (var g = sg; g < TEAMS; g += nsg) {
        let first = wg_first + g * R;
        if first >= p.rows {
            break;
        }
        let acc = team(first, lane, sgs);
        for (var i = 0u; i < NACC; i++) {
            let s = subgroupAdd(red_pack(dot(acc[i], vec4<f32>(1.0)), i % NB));
            let row = first + i / NB;
            if lane == 0u && row < p.rows {
                write_out(row, i % NB, s);
            }
        }
    }
#else
    let tm = lid / TS;
    let lane = lid % TS;
    let first = wg_first + tm * R;
    var acc: array<vec4<f32>, NACC>;
    if first < p.rows {
        acc = team(first, lane, TS);
    }
    for (var i = 0u; i < NACC; i++) {
        red[i * WG + lid] = red_pack(dot(acc[i], vec4<f32>(1.0)), i % NB);
    }
    workgroupBarrier();
    for (var s = TS / 2u; s > 0u; s /= 2u) {
        if lane < s {
            for (var i = 0u; i < NACC; i++) {
                red[i * WG + lid] += red[i * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if lane == 0u {
        for (var i = 0u; i < NACC; i++) {
            let row = first + i / NB;
            if row < p.rows {
                write_out(row, i % NB, red[i * WG + lid]);
            }
        }
    }
#endif
}
