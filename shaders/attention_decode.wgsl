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
// stride of k_s, odd); T; R; G; CAUSAL; KSPLIT (keys of a tile split over lane groups, then summed).
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
// Output phase roles: lane `col` owns vec4 column col of D/4; the NG lane groups split the rows
// (RG groups) and, when there are fewer rows than groups, the keys of each tile (KG groups).
const NG: u32 = NT / DC;
const RG: u32 = min(R, NG);
const KG: u32 = NG / RG;
const RPT: u32 = (R + RG - 1u) / RG;

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

@compute @workgroup_size(128)
fn split(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
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

    for (var t0 = j0; t0 < j1; t0 += T) {
        workgroupBarrier();
        // Fold the previous tile's max into the running max.
        if lid < R {
            m_s[lid] = max(m_s[lid], unordered(atomicLoad(&mx_s[lid])));
            atomicStore(&mx_s[lid], ordered(NEG));
        }
        let n = min(T, j1 - t0);
        for (var e = lid; e < T * DC; e += NT) {
            let kk = e / DC;
            let c = e % DC;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if kk < n {
                let o = ((b * p.lkv + t0 + kk) * p.hkv + hk) * D + c * 4u;
                kx = load_k(p.off1 + o);
                vx = load_v(p.off2 + o);
            }
            k_s[kk * KS + c] = kx;
            v_s[e] = vx;
        }
        workgroupBarrier();

        for (var e = lid; e < R * T; e += NT) {
            let r = e / T;
            let kk = e % T;
            var visible = kk < n;
#if CAUSAL
            visible = visible && t0 + kk <= q_pos0 + r / G;
#endif
            var sc = NEG;
            if visible {
                var d = vec4<f32>(0.0);
                for (var c = 0u; c < DC; c++) {
                    d += q_s[r * DC + c] * k_s[kk * KS + c];
                }
                sc = d.x + d.y + d.z + d.w;
                atomicMax(&mx_s[r], ordered(sc));
            }
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
            for (var i = 0u; i < RPT; i++) {
                let r = rg + RG * i;
                if r < R {
                    let m_old = m_s[r];
                    let alpha = exp(m_old - max(m_old, unordered(atomicLoad(&mx_s[r]))));
                    var a = acc[i] * alpha;
                    var ls = 0.0;
                    for (var kk = kg; kk < T; kk += KG) {
                        let pk = p_s[r * T + kk];
                        a += pk * v_s[kk * DC + col];
                        ls += pk;
                    }
                    acc[i] = a;
                    l[i] = l[i] * alpha + ls;
                }
            }
        }
    }
    workgroupBarrier();
    if lid < R {
        m_s[lid] = max(m_s[lid], unordered(atomicLoad(&mx_s[lid])));
    }
#if KSPLIT
    // KG > 1 only happens with one row per lane (RPT = 1): sum the key groups' partials.
    if o_lane {
        red_s[grp * DC + col] = acc[0];
        redl_s[grp * DC + col] = l[0];
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
        for (var i = 0u; i < RPT; i++) {
            let r = rg + RG * i;
            if r < R {
                let idx = (bh * p.splits + sp) * R + r;
                part_o[idx * DC + col] = acc[i];
                if col == 0u {
                    part_ml[idx] = vec2<f32>(m_s[r], l[i]);
                }
            }
        }
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

// One workgroup per output row (b, position, query head); lane c owns vec4 column c.
@compute @workgroup_size(64)
fn reduce(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups || lid >= DC {
        return;
    }
    let h = g % p.hq;
    let t = g / p.hq;
    let i = t % p.lq;
    let b = t / p.lq;
    let r = i * G + h % G;
    let bh = b * p.hkv + h / G;
    let kv_len = min(step[p.off0], p.lkv);
    let chunk = chunk_len(kv_len);
    let n_active = (kv_len + chunk - 1u) / chunk;
    var m_all = NEG;
    for (var sp = 0u; sp < n_active; sp++) {
        m_all = max(m_all, part_ml[(bh * p.splits + sp) * R + r].x);
    }
    var acc = vec4<f32>(0.0);
    var l = 0.0;
    for (var sp = 0u; sp < n_active; sp++) {
        let idx = (bh * p.splits + sp) * R + r;
        let ml = part_ml[idx];
        let w = exp(ml.x - m_all);
        l += w * ml.y;
        acc += w * part_o[idx * DC + lid];
    }
    let inv = select(0.0, 1.0 / l, l > 0.0);
    store_out4(p.off3 + ((b * p.lq + i) * p.hq + h) * D + lid * 4u, acc * inv);
}
#endif
