// Flash attention, prefill variant: softmax(q k^T * scale + mask) v without materialising scores.
//
// q [B, Lq, Hq, D], k and v [B, Lkv, Hkv, D] (a KV cache; only the first kv_len rows are read),
// out [B, Lq, Hq, D], step (u32) = (kv_len, q_pos0). Query head h reads KV head h / G.
//
// For one (batch, KV head) the G query heads that share it are flattened into Lq * G query rows
// (row r = position r / G, head hk * G + r % G), so each K/V tile staged in workgroup memory serves
// every head of the group. A workgroup owns BQ = 4 * NY rows and walks the keys in tiles of
// BKV = 8 * TK with an online softmax (running max m, running sum l, rescaled accumulator).
// Thread roles: ty = row group (4 rows, kept as the 4 components of vec4 registers), tx = lane 0..7.
//   scores: lane tx computes keys tx + 8j (j < TK) for its 4 rows; the row max is reduced over the
//           8 lanes (subgroup shuffles when SG, else workgroup memory);
//   output: lane tx accumulates columns tx + 8c (vec4 columns when VW4, scalar otherwise) of the
//           same 4 rows, so m, l and the rescale factor stay in registers.
// The next K/V tile is loaded into registers while the current one is used (one tile in flight).
// Causality: tiles past the last visible key of the tile's last row are never visited.
//
// The host generates the hot loops fully unrolled (the blocks listed below: S_BODY runs over the
// head dim, O_BODY over the tile's keys), so register arrays are only indexed by constants and
// shared-memory offsets are literals. A dynamic index into a private array puts it in local memory,
// and naga's loop bounding (a counter injected into every loop) keeps drivers from unrolling.
//
// Specialisation: QT, KT, OT element types (f32|f16); F16; QV, KV, OV: binding read as vec4 (base
// offset a multiple of 4 elements); D; QS (padded vec4 row stride of k_s, odd to spread banks);
// NY, TK; NT = 8 * NY; LOADS (K/V vec4 loads per thread per tile); VW4; NACC (accumulators); G;
// CAUSAL; SG; generated blocks PREFETCH, STAGE, S_BODY, MASK_BODY, P_BODY, RESCALE, O_BODY, STORE.
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
// q, k, v, step and out (bindings 1-5) and their loaders: attention_io.wgsl, appended.
#ifnot OV
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
const G: u32 = {{G}}u;
const LOADS: u32 = {{LOADS}}u;
const NACC: u32 = {{NACC}}u;
const PS: u32 = NY + 1u; // padded row stride of p_s (vec4): odd, so the lanes' stores spread banks
// Masked scores. Finite so that no inf - inf can appear; real scores are far smaller.
const NEG: f32 = -1.0e30;
const NEG_HALF: f32 = -5.0e29;

var<workgroup> q_t: array<vec4<f32>, D * NY>;    // scaled q: [dim][row group] -> its 4 rows
var<workgroup> k_s: array<vec4<f32>, BKV * QS>;  // K tile, rows padded to QS
#if VW4
var<workgroup> v_s: array<vec4<f32>, BKV * DC>;  // V tile
#else
var<workgroup> v_s: array<f32, BKV * D>;
#endif
var<workgroup> p_s: array<vec4<f32>, BKV * PS>;  // probabilities [key][row group] -> 4 rows
#ifnot SG
var<workgroup> red_s: array<vec4<f32>, NT>;      // per-lane row maxima / sums for the 8-lane reduction
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
    // First query element of the group's heads at position 0; row r is at position r / G, head r % G.
    let q_base = (b * p.lq * p.hq + hk * G) * D;
    let kv_base = (b * p.lkv * p.hkv + hk) * D;

    // Keys each of my 4 rows may see (0 for padding rows), and the keys the whole tile needs.
    let rows = vec4<u32>(r0 + ty * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
    var lim = select(vec4<u32>(0u), vec4<u32>(kv_len), rows < vec4<u32>(p.rows));
    var kv_end = kv_len;
#if CAUSAL
    lim = min(lim, vec4<u32>(q_pos0 + 1u) + rows / G);
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
        let t = (4u * c) * NY + rr / 4u;
        let a = rr % 4u;
        q_t[t][a] = x.x;
        q_t[t + NY][a] = x.y;
        q_t[t + 2u * NY][a] = x.z;
        q_t[t + 3u * NY][a] = x.w;
    }

    var m = vec4<f32>(NEG);
    var l = vec4<f32>(0.0);
    var acc: array<vec4<f32>, NACC>;
    var kr: array<vec4<f32>, LOADS>;
    var vr: array<vec4<f32>, LOADS>;
    var k0n = 0u;
    if kv_end > 0u {
{{PREFETCH}}
    }
    for (var k0 = 0u; k0 < kv_end; k0 += BKV) {
        workgroupBarrier();
{{STAGE}}
        workgroupBarrier();
        k0n = k0 + BKV;
        if k0n < kv_end {
{{PREFETCH}}
        }

        // Scores of my 4 rows (vec4 components) for keys tx + 8j.
        var s: array<vec4<f32>, TK>;
        let ko = tx * QS;
{{S_BODY}}
        var mx = vec4<f32>(NEG);
{{MASK_BODY}}
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
        let m_new = max(m, mx);
        let alpha = exp(m - m_new);
        m = m_new;
        var sum = vec4<f32>(0.0);
{{P_BODY}}
        l = l * alpha + sum;
        workgroupBarrier();

        // acc = acc * alpha + p v over the tile.
{{RESCALE}}
{{O_BODY}}
    }

    // Each lane summed only its own keys: total the row sums over the 8 lanes.
#if SG
    l += subgroupShuffleXor(l, 1u);
    l += subgroupShuffleXor(l, 2u);
    l += subgroupShuffleXor(l, 4u);
#else
    workgroupBarrier();
    red_s[role] = l;
    workgroupBarrier();
    l = vec4<f32>(0.0);
    for (var t = 0u; t < 8u; t++) {
        l += red_s[ty * 8u + t];
    }
#endif
    // A row that saw no key (kv_len = 0) gives zeros.
    let inv = select(vec4<f32>(0.0), 1.0 / l, l > vec4<f32>(0.0));
    let o_row = p.off_out + q_base + ((rows / G) * p.hq + rows % G) * D;
{{STORE}}
}
