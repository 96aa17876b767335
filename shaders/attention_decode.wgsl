// Flash attention, decode variant (flash-decoding): few query rows, long KV sequence.
//
// Same tensors and step as attention.wgsl. For one (batch, KV head) the R = Lq * G query rows of the
// group (row r = position r / G, head hk * G + r % G) are all handled together, and the kv sequence is
// split into `splits` chunks, one workgroup each, so long contexts fill the GPU. The chunk length is
// worked out from the run-time kv_len (ceil(kv_len / splits) rounded up to a tile), so one prebuilt
// dispatch serves every step; splits past kv_len exit at once.
//   entry `split`:  online softmax over the chunk in tiles of T keys staged in workgroup memory,
//                   writing the unnormalised partial (acc[D], max m, sum l) of each row;
//   entry `reduce`: one workgroup per output row merges the partials of the active splits.
// Specialisation: QT, KT, OT (f32|f16); F16; QV, KV, OV (vec4 bindings); D; KS (padded vec4 row
// stride of k_s, odd); T; R; G; CAUSAL; KSPLIT (keys of a tile split over lane groups, then summed);
// SG (subgroupMax before the per-row atomic max); LOADS, RG, KG, RPT and the generated blocks.
#if F16
enable f16;
#endif

struct Params {
    off0: u32, off1: u32, off2: u32, off3: u32, off4: u32, off5: u32, o6: u32, o7: u32,
    lq: u32,
    lkv: u32,
    hq: u32,
    hkv: u32,
    splits: u32,
    groups: u32, // workgroups that have work (the grid may be padded past it)
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;

const D: u32 = {{D}}u;
const DC: u32 = D / 4u;
const T: u32 = {{T}}u;
const R: u32 = {{R}}u;
const G: u32 = {{G}}u;
const NEG: f32 = -1.0e30;
const NEG_HALF: f32 = -5.0e29;

// Keys per split for this kv_len: a whole number of tiles.
fn chunk_len(kv_len: u32) -> u32 {
    let per = max((kv_len + p.splits - 1u) / p.splits, 1u);
    return (per + T - 1u) / T * T;
}

#ifnot REDUCE
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
@group(0) @binding(5) var<storage, read_write> part_o: array<vec4<f32>>; // [B*Hkv, splits, R, D/4]
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>; // [B*Hkv, splits, R]

const NT: u32 = 128u;
const KS: u32 = {{KS}}u;
const LOADS: u32 = {{LOADS}}u;
// Output phase roles: lane `col` owns vec4 column col of D/4; the NG lane groups split the rows
// (RG groups, RPT rows each) and, when there are fewer rows than groups, the keys of each tile
// (KG groups, summed at the end).
const NG: u32 = NT / DC;
const RG: u32 = {{RG}}u;
const KG: u32 = {{KG}}u;
const RPT: u32 = {{RPT}}u;

var<workgroup> q_s: array<vec4<f32>, R * DC>;  // scaled q rows
var<workgroup> k_s: array<vec4<f32>, T * KS>;
var<workgroup> v_s: array<vec4<f32>, T * DC>;
var<workgroup> p_s: array<f32, R * T>;         // scores, then probabilities
var<workgroup> m_s: array<f32, R>;             // running max before the current tile
var<workgroup> mx_s: array<atomic<u32>, R>;    // max of the current tile, as ordered bits
#if KSPLIT
var<workgroup> red_s: array<vec4<f32>, NT>;
var<workgroup> redl_s: array<f32, NT>;
#endif

// f32 <-> u32 with the same order, for atomicMax.
fn ordered(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    return select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u);
}

fn unordered(u: u32) -> f32 {
    return bitcast<f32>(select(~u, u & 0x7fffffffu, (u & 0x80000000u) != 0u));
}

// Register arrays are only indexed by constants: the host generates the unrolled
// statements (a dynamic index would put the array in local memory, and naga's loop bounding keeps
// drivers from unrolling loops). The next tile's K/V is loaded into registers while the current one
// is used.
@compute @workgroup_size(128)
fn split(
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
#if SG
    let role = sg_id * sg_size + sg_lane;
#else
    let role = lid;
#endif
    let sp = g % p.splits;
    let bh = g / p.splits;
    let hk = bh % p.hkv;
    let b = bh / p.hkv;
    let kv_len = min(step[p.off3], p.lkv);
    let q_pos0 = step[p.off3 + 1u];
    let chunk = chunk_len(kv_len);
    let j0 = sp * chunk;
    if j0 >= kv_len {
        return; // an empty split: the reduce does not read it
    }
    var j1 = min(j0 + chunk, kv_len);
#if CAUSAL
    // No row sees past position q_pos0 + Lq - 1.
    j1 = min(j1, q_pos0 + p.lq);
#endif

    let q_base = (b * p.lq * p.hq + hk * G) * D;
    let kv_base = (b * p.lkv * p.hkv + hk) * D;
    for (var e = lid; e < R * DC; e += NT) {
        let r = e / DC;
        let c = e % DC;
        q_s[e] = load_q(p.off0 + q_base + ((r / G) * p.hq + r % G) * D + c * 4u) * p.scale;
    }
    if lid < R {
        m_s[lid] = NEG;
        atomicStore(&mx_s[lid], ordered(NEG));
    }

    let col = lid % DC;
    let grp = lid / DC;
    let rg = grp % RG;
    let kg = grp / RG;
    let o_lane = grp < RG * KG;
    var acc: array<vec4<f32>, RPT>;
    var l: array<f32, RPT>;
    var kr: array<vec4<f32>, LOADS>;
    var vr: array<vec4<f32>, LOADS>;
    var t0n = j0;
{{PREFETCH}}
    for (var t0 = j0; t0 < j1; t0 += T) {
        workgroupBarrier();
        // Fold the previous tile's max into the running max.
        if lid < R {
            m_s[lid] = max(m_s[lid], unordered(atomicLoad(&mx_s[lid])));
            atomicStore(&mx_s[lid], ordered(NEG));
        }
{{STAGE}}
        workgroupBarrier();
        t0n = t0 + T;
        if t0n < j1 {
{{PREFETCH}}
        }

        let n = min(T, j1 - t0);
        for (var e = role; e < R * T; e += NT) {
            let r = e / T;
            let kk = e % T;
            var visible = kk < n;
#if CAUSAL
            visible = visible && t0 + kk <= q_pos0 + r / G;
#endif
            var sc = NEG;
            if visible {
                let qo = r * DC;
                let ko = kk * KS;
                var d0 = vec4<f32>(0.0);
                var d1 = vec4<f32>(0.0);
                var d2 = vec4<f32>(0.0);
                var d3 = vec4<f32>(0.0);
{{DOT_BODY}}
                let d = (d0 + d1) + (d2 + d3);
                sc = d.x + d.y + d.z + d.w;
#ifnot SG
                atomicMax(&mx_s[r], ordered(sc));
#endif
            }
#if SG
            // One atomic per subgroup: its lanes hold consecutive keys of one row.
            let m_sg = subgroupMax(sc);
            if sg_lane == 0u && m_sg > NEG_HALF {
                atomicMax(&mx_s[r], ordered(m_sg));
            }
#endif
            p_s[e] = sc;
        }
        workgroupBarrier();

        for (var e = lid; e < R * T; e += NT) {
            let r = e / T;
            let m_new = max(m_s[r], unordered(atomicLoad(&mx_s[r])));
            let sc = p_s[e];
            p_s[e] = select(0.0, exp(sc - m_new), sc > NEG_HALF);
        }
        workgroupBarrier();

        if o_lane {
{{ALPHA_BODY}}
{{O_BODY}}
        }
    }
    workgroupBarrier();
    if lid < R {
        m_s[lid] = max(m_s[lid], unordered(atomicLoad(&mx_s[lid])));
    }
#if KSPLIT
    // KG > 1 only happens with one row per lane (RPT = 1): sum the key groups' partials.
    if o_lane {
        red_s[lid] = acc[0];
        redl_s[lid] = l[0];
    }
    workgroupBarrier();
    if o_lane && kg == 0u {
        for (var k2 = 1u; k2 < KG; k2++) {
            acc[0] += red_s[(rg + RG * k2) * DC + col];
            l[0] += redl_s[(rg + RG * k2) * DC + col];
        }
    }
#else
    workgroupBarrier();
#endif
    if o_lane && kg == 0u {
{{WRITE_BODY}}
    }
}
#else

@group(0) @binding(1) var<storage, read> step: array<u32>;
@group(0) @binding(2) var<storage, read> part_o: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> part_ml: array<vec2<f32>>;
#if OV
@group(0) @binding(4) var<storage, read_write> out: array<vec4<{{OT}}>>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e >> 2u] = vec4<{{OT}}>(x);
}
#else
@group(0) @binding(4) var<storage, read_write> out: array<{{OT}}>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e] = {{OT}}(x.x);
    out[e + 1u] = {{OT}}(x.y);
    out[e + 2u] = {{OT}}(x.z);
    out[e + 3u] = {{OT}}(x.w);
}
#endif

const MAX_SPLITS: u32 = {{MAX_SPLITS}}u;
var<workgroup> red_m: array<f32, 64>;
var<workgroup> w_s: array<f32, MAX_SPLITS>;

// Tree reduction of red_m over the 64 lanes (max or sum); every lane gets the result.
fn reduce64(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var w = 32u; w > 0u; w >>= 1u) {
        if lid < w {
            let o = red_m[lid + w];
            red_m[lid] = select(red_m[lid] + o, max(red_m[lid], o), is_max);
        }
        workgroupBarrier();
    }
    let r = red_m[0];
    workgroupBarrier();
    return r;
}

// One workgroup per output row (b, position, query head): the lanes share out the splits for the
// max and the weights, then lane c < D/4 sums vec4 column c over the splits, four loads in flight.
@compute @workgroup_size(64)
fn reduce(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
    let h = g % p.hq;
    let t = g / p.hq;
    let i = t % p.lq;
    let b = t / p.lq;
    let r = i * G + h % G;
    let base = (b * p.hkv + h / G) * p.splits;
    let kv_len = min(step[p.off0], p.lkv);
    let chunk = chunk_len(kv_len);
    let n_active = (kv_len + chunk - 1u) / chunk;

    var m_loc = NEG;
    for (var sp = lid; sp < n_active; sp += 64u) {
        m_loc = max(m_loc, part_ml[(base + sp) * R + r].x);
    }
    red_m[lid] = m_loc;
    let m_all = reduce64(lid, true);
    var l_loc = 0.0;
    for (var sp = lid; sp < n_active; sp += 64u) {
        let ml = part_ml[(base + sp) * R + r];
        let w = exp(ml.x - m_all);
        w_s[sp] = w;
        l_loc += w * ml.y;
    }
    red_m[lid] = l_loc;
    let l = reduce64(lid, false); // its barriers also publish w_s
    if lid >= DC {
        return;
    }
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    let last = n_active - 1u;
    for (var s0 = 0u; s0 < n_active; s0 += 4u) {
        // Past the last split: re-read it (in range) with weight 0.
        let s1 = min(s0 + 1u, last);
        let s2 = min(s0 + 2u, last);
        let s3 = min(s0 + 3u, last);
        a0 += w_s[s0] * part_o[((base + s0) * R + r) * DC + lid];
        a1 += select(0.0, w_s[s1], s0 + 1u <= last) * part_o[((base + s1) * R + r) * DC + lid];
        a2 += select(0.0, w_s[s2], s0 + 2u <= last) * part_o[((base + s2) * R + r) * DC + lid];
        a3 += select(0.0, w_s[s3], s0 + 3u <= last) * part_o[((base + s3) * R + r) * DC + lid];
    }
    let inv = select(0.0, 1.0 / l, l > 0.0);
    store_out4(p.off3 + ((b * p.lq + i) * p.hq + h) * D + lid * 4u, ((a0 + a1) + (a2 + a3)) * inv);
}
#endif
