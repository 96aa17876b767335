// Flash attention, prefill variant: softmax(q k^T * scale + mask) v without materialising scores.
//
// q [B, Lq, Hq, D], k and v [B, Lkv, Hkv, D] (a KV cache; only the first kv_len rows are read),
// out [B, Lq, Hq, D], step (u32) = (kv_len, q_pos0). Query head h reads KV head h / G.
//
// For one (batch, KV head) the G query heads that share it are flattened into Lq * G query rows
// (row r = position r / G, head hk * G + r % G), so each K/V tile staged in workgroup memory serves
// every head of the group. A workgroup owns BQ = 4 * NY rows and walks the keys in tiles of
// BKV = 8 * TK with an online softmax (running max m, running sum l, rescaled accumulator).
// Thread roles: ty = row group (4 rows), tx = lane 0..7 of the row group.
//   scores: lane tx computes keys tx + 8j (j < TK) for its 4 rows; the row max is reduced over the
//           8 lanes (subgroup shuffles when SG, else workgroup memory);
//   output: lane tx accumulates columns tx + 8c (vec4 columns when VW4, scalar otherwise) of the
//           same 4 rows, so m, l and the rescale factor stay in registers.
// Causality: tiles past the last visible key of the tile's last row are never visited.
//
// Specialisation: QT, KT, OT element types (f32|f16); F16; QV, KV, OV: binding read as vec4 (base
// offset a multiple of 4 elements); D; QS (padded vec4 row stride of q_s/k_s, odd to spread banks);
// NY, TK; NT = 8 * NY; VW4; NC (output columns per lane); G; CAUSAL; SG.
#if F16
enable f16;
#endif

struct Params {
    off_q: u32, off_k: u32, off_v: u32, off_step: u32, off_out: u32, o5: u32, o6: u32, o7: u32,
    rows: u32,   // Lq * G query rows per (batch, KV head)
    lq: u32,
    lkv: u32,    // rows of the K/V tensors: kv_len is clamped to it
    hq: u32,
    hkv: u32,
    tiles: u32,  // query tiles per (batch, KV head)
    groups: u32, // B * Hkv * tiles workgroups (the grid may be padded past it)
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if QV
@group(0) @binding(1) var<storage, read> q: array<vec4<{{QT}}>>;
fn load_q(e: u32) -> vec4<f32> {
    return vec4<f32>(q[e >> 2u]);
}
#else
@group(0) @binding(1) var<storage, read> q: array<{{QT}}>;
fn load_q(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(q[e]), f32(q[e + 1u]), f32(q[e + 2u]), f32(q[e + 3u]));
}
#endif
#if KV
@group(0) @binding(2) var<storage, read> k: array<vec4<{{KT}}>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<{{KT}}>>;
fn load_k(e: u32) -> vec4<f32> {
    return vec4<f32>(k[e >> 2u]);
}
fn load_v(e: u32) -> vec4<f32> {
    return vec4<f32>(v[e >> 2u]);
}
#else
@group(0) @binding(2) var<storage, read> k: array<{{KT}}>;
@group(0) @binding(3) var<storage, read> v: array<{{KT}}>;
fn load_k(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(k[e]), f32(k[e + 1u]), f32(k[e + 2u]), f32(k[e + 3u]));
}
fn load_v(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(v[e]), f32(v[e + 1u]), f32(v[e + 2u]), f32(v[e + 3u]));
}
#endif
@group(0) @binding(4) var<storage, read> step: array<u32>;
#if OV
@group(0) @binding(5) var<storage, read_write> out: array<vec4<{{OT}}>>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e >> 2u] = vec4<{{OT}}>(x);
}
#else
@group(0) @binding(5) var<storage, read_write> out: array<{{OT}}>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e] = {{OT}}(x.x);
    out[e + 1u] = {{OT}}(x.y);
    out[e + 2u] = {{OT}}(x.z);
    out[e + 3u] = {{OT}}(x.w);
}
fn store_out1(e: u32, x: f32) {
    out[e] = {{OT}}(x);
}
#endif

const NY: u32 = {{NY}}u;
const TK: u32 = {{TK}}u;
const NT: u32 = {{NT}}u;
const BQ: u32 = 4u * NY;
const BKV: u32 = 8u * TK;
const D: u32 = {{D}}u;
const DC: u32 = D / 4u;
const QS: u32 = {{QS}}u;
const NC: u32 = {{NC}}u;
const G: u32 = {{G}}u;
const PS: u32 = NY + 1u; // padded row stride of p_s (vec4): odd, so the lanes' stores spread banks
// Masked scores. Finite so that no inf - inf can appear; real scores are far smaller.
const NEG: f32 = -1.0e30;
const NEG_HALF: f32 = -5.0e29;

var<workgroup> q_s: array<vec4<f32>, BQ * QS>;  // q tile (scaled), rows padded to QS
var<workgroup> k_s: array<vec4<f32>, BKV * QS>; // K tile, rows padded to QS
#if VW4
var<workgroup> v_s: array<vec4<f32>, BKV * DC>; // V tile
#else
var<workgroup> v_s: array<f32, BKV * D>;
#endif
var<workgroup> p_s: array<vec4<f32>, BKV * PS>; // probabilities [key][row group] x 4 rows
#ifnot SG
var<workgroup> red_s: array<vec4<f32>, NT>;     // per-lane row maxima / sums for the 8-lane reduction
#endif

@compute @workgroup_size({{NT}})
fn prefill(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
#if SG
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
#endif
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
    let tile = g % p.tiles;
    let bh = g / p.tiles;
    let hk = bh % p.hkv;
    let b = bh / p.hkv;
#if SG
    // Roles follow subgroup lanes so that a row group's 8 lanes are 8 aligned lanes of one subgroup.
    let role = sg_id * sg_size + sg_lane;
#else
    let role = lid;
#endif
    let tx = role & 7u;
    let ty = role >> 3u;

    let kv_len = min(step[p.off_step], p.lkv);
    let q_pos0 = step[p.off_step + 1u];
    let r0 = tile * BQ;
    // First query element of row r (flattened over positions and the group's heads).
    let q_base = (b * p.lq * p.hq + hk * G) * D;

    // Keys each of my rows may see, and the keys the whole tile needs.
    var lim: array<u32, 4>;
    for (var a = 0u; a < 4u; a++) {
        let r = r0 + ty * 4u + a;
        lim[a] = select(0u, kv_len, r < p.rows);
#if CAUSAL
        lim[a] = min(lim[a], q_pos0 + r / G + 1u);
#endif
    }
    var kv_end = kv_len;
#if CAUSAL
    kv_end = min(kv_len, q_pos0 + (min(r0 + BQ, p.rows) - 1u) / G + 1u);
#endif

    for (var e = lid; e < BQ * DC; e += NT) {
        let rr = e / DC;
        let c = e % DC;
        let r = r0 + rr;
        var x = vec4<f32>(0.0);
        if r < p.rows {
            x = load_q(p.off_q + q_base + ((r / G) * p.hq + r % G) * D + c * 4u) * p.scale;
        }
        q_s[rr * QS + c] = x;
    }

    var m = array<f32, 4>(NEG, NEG, NEG, NEG);
    var l = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
#if VW4
    var acc: array<vec4<f32>, 4 * NC>;
#else
    var acc: array<f32, 4 * NC>;
#endif
    for (var k0 = 0u; k0 < kv_end; k0 += BKV) {
        workgroupBarrier();
        // Stage the K and V tiles (rows past kv_len are zero: they may hold anything, even NaN).
        for (var e = lid; e < BKV * DC; e += NT) {
            let kk = e / DC;
            let c = e % DC;
            let key = k0 + kk;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if key < kv_len {
                let o = ((b * p.lkv + key) * p.hkv + hk) * D + c * 4u;
                kx = load_k(p.off_k + o);
                vx = load_v(p.off_v + o);
            }
            k_s[kk * QS + c] = kx;
#if VW4
            v_s[kk * DC + c] = vx;
#else
            let vo = kk * D + c * 4u;
            v_s[vo] = vx.x;
            v_s[vo + 1u] = vx.y;
            v_s[vo + 2u] = vx.z;
            v_s[vo + 3u] = vx.w;
#endif
        }
        workgroupBarrier();

        // Scores for my 4 rows x TK keys.
        var s: array<f32, 4 * TK>;
        for (var d4 = 0u; d4 < DC; d4++) {
            let q0 = q_s[(ty * 4u) * QS + d4];
            let q1 = q_s[(ty * 4u + 1u) * QS + d4];
            let q2 = q_s[(ty * 4u + 2u) * QS + d4];
            let q3 = q_s[(ty * 4u + 3u) * QS + d4];
            for (var j = 0u; j < TK; j++) {
                let kv = k_s[(tx + 8u * j) * QS + d4];
                s[j] = s[j] + q0.x * kv.x + q0.y * kv.y + q0.z * kv.z + q0.w * kv.w;
                s[TK + j] = s[TK + j] + q1.x * kv.x + q1.y * kv.y + q1.z * kv.z + q1.w * kv.w;
                s[2u * TK + j] = s[2u * TK + j] + q2.x * kv.x + q2.y * kv.y + q2.z * kv.z + q2.w * kv.w;
                s[3u * TK + j] = s[3u * TK + j] + q3.x * kv.x + q3.y * kv.y + q3.z * kv.z + q3.w * kv.w;
            }
        }
        var mx = vec4<f32>(NEG);
        for (var a = 0u; a < 4u; a++) {
            for (var j = 0u; j < TK; j++) {
                if k0 + tx + 8u * j < lim[a] {
                    mx[a] = max(mx[a], s[a * TK + j]);
                } else {
                    s[a * TK + j] = NEG;
                }
            }
        }
#if SG
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        mx = max(mx, subgroupShuffleXor(mx, 2u));
        mx = max(mx, subgroupShuffleXor(mx, 4u));
#else
        red_s[role] = mx;
        workgroupBarrier();
        for (var t = 0u; t < 8u; t++) {
            mx = max(mx, red_s[ty * 8u + t]);
        }
#endif
        var alpha: array<f32, 4>;
        var pr: array<vec4<f32>, TK>;
        for (var a = 0u; a < 4u; a++) {
            let m_new = max(m[a], mx[a]);
            alpha[a] = exp(m[a] - m_new);
            m[a] = m_new;
            var sum = 0.0;
            for (var j = 0u; j < TK; j++) {
                let sc = s[a * TK + j];
                let pj = select(0.0, exp(sc - m_new), sc > NEG_HALF);
                pr[j][a] = pj;
                sum += pj;
            }
            l[a] = l[a] * alpha[a] + sum;
        }
        for (var j = 0u; j < TK; j++) {
            p_s[(tx + 8u * j) * PS + ty] = pr[j];
        }
        workgroupBarrier();

        // acc = acc * alpha + p v over the tile.
        for (var a = 0u; a < 4u; a++) {
            for (var c = 0u; c < NC; c++) {
                acc[a * NC + c] *= alpha[a];
            }
        }
        for (var kk = 0u; kk < BKV; kk++) {
            let pp = p_s[kk * PS + ty];
            for (var c = 0u; c < NC; c++) {
#if VW4
                let vv = v_s[kk * DC + tx + 8u * c];
#else
                let vv = v_s[kk * D + tx + 8u * c];
#endif
                acc[c] += pp.x * vv;
                acc[NC + c] += pp.y * vv;
                acc[2u * NC + c] += pp.z * vv;
                acc[3u * NC + c] += pp.w * vv;
            }
        }
    }

    // Each lane summed only its own keys: total the row sums over the 8 lanes.
    var lv = vec4<f32>(l[0], l[1], l[2], l[3]);
#if SG
    lv += subgroupShuffleXor(lv, 1u);
    lv += subgroupShuffleXor(lv, 2u);
    lv += subgroupShuffleXor(lv, 4u);
#else
    workgroupBarrier();
    red_s[role] = lv;
    workgroupBarrier();
    lv = vec4<f32>(0.0);
    for (var t = 0u; t < 8u; t++) {
        lv += red_s[ty * 8u + t];
    }
#endif
    for (var a = 0u; a < 4u; a++) {
        let r = r0 + ty * 4u + a;
        if r < p.rows {
            // A row that saw no key (kv_len = 0) gives zeros.
            let inv = select(0.0, 1.0 / lv[a], lv[a] > 0.0);
            let o = p.off_out + q_base + ((r / G) * p.hq + r % G) * D;
            for (var c = 0u; c < NC; c++) {
#if VW4
                store_out4(o + (tx + 8u * c) * 4u, acc[a * NC + c] * inv);
#else
                store_out1(o + tx + 8u * c, acc[a * NC + c] * inv);
#endif
            }
        }
    }
}
