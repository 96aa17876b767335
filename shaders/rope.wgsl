// Rotary position embedding of x [tokens, heads, head_dim] at positions pos [tokens] (u32, read on
// the GPU so one prebuilt dispatch serves every decode step). Pair k < rotary_dim / 2 is rotated by
// pos * inv_freq[k]; dimensions past rotary_dim are copied (nothing to do in place).
//   interleaved (GPT-J, GGUF llama): pair (x[2k], x[2k+1]);  half-split (NeoX, HF): (x[k], x[k + rd/2])
//
// Angles: the host gives each pair's frequency in turns per position as a double-single (hi, lo)
// computed in f64 and rope_angle.wgsl (appended) turns it into cos/sin accurate to ~1e-6 at any
// position below 2^24; factors divide it here first (ds_div).
//
// Specialisation:
//   TX, TO         f32|f16 element types of x and out; F16 when either is f16
//   INTERLEAVED    pairing style
//   INPLACE        out is x: only rotated pairs are touched
//   FACTORS        freq_factors bound (llama3 scaling: inv_freq[k] / factors[k])
//   HPT            heads per thread (the angle is computed once for them)
//   VEC4           x and out bound as vec4 arrays; a slot is one vec4 (2 pairs, interleaved) or one
//                  vec4 from each half (4 pairs, half-split); else a slot is one pair of scalars
#if F16
enable f16;
#endif

struct Params {
    off_x: u32, off_pos: u32, off_tab: u32, off_out: u32, off_ff: u32, o5: u32, o6: u32, o7: u32,
    tokens: u32, heads: u32, head_dim: u32, half_rot: u32,
    pairs: u32,    // slots per (token, head chunk): rotated ones first, then copied ones
    chunks: u32,   // head chunks of HPT
    rot_slots: u32,  // VEC4: slots that rotate (rotary_dim / 4 interleaved, / 8 half-split)
}

@group(0) @binding(0) var<uniform> p: Params;
#if VEC4
@group(0) @binding(1) var<storage, read> x: array<vec4<{{TX}}>>;
#else
@group(0) @binding(1) var<storage, read> x: array<{{TX}}>;
#endif
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read> tab: array<vec2<f32>>;
#if VEC4
@group(0) @binding(4) var<storage, read_write> out: array<vec4<{{TO}}>>;
#else
@group(0) @binding(4) var<storage, read_write> out: array<{{TO}}>;
#endif
#if FACTORS
@group(0) @binding(5) var<storage, read> ff: array<f32>;
#endif

const HPT: u32 = {{HPT}}u;

// (hi + lo) / f as a double-single (q, c). q * f is split into exact 12x12-bit products so the
// residual hi - q * f is exact up to the last, tiny, subtraction.
fn ds_div(hi: f32, lo: f32, f: f32) -> vec2<f32> {
    let q = hi / f;
    let qh = top12(q);
    let ql = q - qh;
    let fh = top12(f);
    let fl = f - fh;
    let r = (((hi - qh * fh) - qh * fl) - ql * fh) - ql * fl;
    return vec2<f32>(q, (r + lo) / f);
}

// cos and sin of position `ps` times pair k's frequency.
fn angle(ps: u32, k: u32) -> vec2<f32> {
    var g = tab[p.off_tab / 2u + k];
#if FACTORS
    g = ds_div(g.x, g.y, ff[p.off_ff + k]);
#endif
    return cos_sin_at(ps, g);
}

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= p.tokens * p.chunks * p.pairs {
        return;
    }
    let k = i % p.pairs;
    let rest = i / p.pairs;
    let chunk = rest % p.chunks;
    let token = rest / p.chunks;
    let h0 = chunk * HPT;
    let h1 = min(h0 + HPT, p.heads);
#if VEC4
    let hd = p.head_dim / 4u;
    let row0 = token * p.heads * hd;
    let xo = p.off_x / 4u;
    let oo = p.off_out / 4u;
    if k < p.rot_slots {
        let ps = pos[p.off_pos + token];
#if INTERLEAVED
        // Vector k holds pairs 2k and 2k + 1: (x0, x1) and (x2, x3).
        let c0 = angle(ps, 2u * k);
        let c1 = angle(ps, 2u * k + 1u);
        let cv = vec4<f32>(c0.x, c0.x, c1.x, c1.x);
        let sv = vec4<f32>(-c0.y, c0.y, -c1.y, c1.y);
        for (var h = h0; h < h1; h++) {
            let e = row0 + h * hd + k;
            let a = vec4<f32>(x[xo + e]);
            out[oo + e] = vec4<{{TO}}>(a * cv + a.yxwz * sv);
        }
#else
        // Pairs 4k..4k+3: vector k of the first half with vector k of the second.
        let c0 = angle(ps, 4u * k);
        let c1 = angle(ps, 4u * k + 1u);
        let c2 = angle(ps, 4u * k + 2u);
        let c3 = angle(ps, 4u * k + 3u);
        let cv = vec4<f32>(c0.x, c1.x, c2.x, c3.x);
        let sv = vec4<f32>(c0.y, c1.y, c2.y, c3.y);
        let half_v = p.half_rot / 4u;
        for (var h = h0; h < h1; h++) {
            let e = row0 + h * hd + k;
            let a = vec4<f32>(x[xo + e]);
            let b = vec4<f32>(x[xo + e + half_v]);
            out[oo + e] = vec4<{{TO}}>(a * cv - b * sv);
            out[oo + e + half_v] = vec4<{{TO}}>(a * sv + b * cv);
        }
#endif
    } else {
        // Past rotary_dim: copied vector by vector.
        let d = p.half_rot / 2u + (k - p.rot_slots);
        for (var h = h0; h < h1; h++) {
            let e = row0 + h * hd + d;
            out[oo + e] = vec4<{{TO}}>(x[xo + e]);
        }
    }
#else
    let row0 = (token * p.heads) * p.head_dim;
    if k < p.half_rot {
#if INTERLEAVED
        let i0 = 2u * k;
        let i1 = 2u * k + 1u;
#else
        let i0 = k;
        let i1 = k + p.half_rot;
#endif
        let cs = angle(pos[p.off_pos + token], k);
        for (var h = h0; h < h1; h++) {
            let e = row0 + h * p.head_dim;
            let a = f32(x[p.off_x + e + i0]);
            let b = f32(x[p.off_x + e + i1]);
            out[p.off_out + e + i0] = {{TO}}(a * cs.x - b * cs.y);
            out[p.off_out + e + i1] = {{TO}}(a * cs.y + b * cs.x);
        }
    } else {
        // Past rotary_dim: pair slot k covers dimensions 2k and 2k + 1 in both styles.
        for (var h = h0; h < h1; h++) {
            let e = row0 + h * p.head_dim + 2u * k;
            out[p.off_out + e] = {{TO}}(x[p.off_x + e]);
            out[p.off_out + e + 1u] = {{TO}}(x[p.off_x + e + 1u]);
        }
    }
#endif
}
