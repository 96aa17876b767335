// Splits a fused QKV projection into the attention layouts, applying rotary embeddings on the way
// (ML Drift's "RoPE while splitting into the cache layout"): one read of qkv, q rotated into q_out,
// k rotated and v copied into the KV cache rows of this step. Token t sits at position step[1] + t.
// Specialisation: TQ (qkv element type), TO (q_out), TC (cache), F16, INTERLEAVED (pairs (2i, 2i+1) as
// GGUF llama weights expect; else pairs (i, i + rot/2) as Hugging Face checkpoints expect), SLICES
// (qkv is `slices` f32 partial sums of a split-K product, `elems` apart, added in slice order).
// Angles come from rope_angle.wgsl (appended): each pair's frequency in turns per position, (hi, lo).
#if F16
enable f16;
#endif

struct Params {
    off_qkv: u32, off_q: u32, off_k: u32, off_v: u32, off_step: u32, off_tab: u32, o6: u32, o7: u32,
    tokens: u32, hq: u32, hkv: u32, d: u32,
    rot: u32,       // rotary dims (<= d, even); dims past it pass through
    max_ctx: u32,   // rows in the cache
    slices: u32, elems: u32, // SLICES
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<{{TQ}}>;
@group(0) @binding(2) var<storage, read_write> q_out: array<{{TO}}>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<{{TC}}>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<{{TC}}>;
@group(0) @binding(5) var<storage, read> step: array<u32>;
@group(0) @binding(6) var<storage, read> tab: array<vec2<f32>>; // [rot/2] turns, scaling folded in

fn qv(i: u32) -> f32 {
#if SLICES
    var s = f32(qkv[i]);
    for (var j = 1u; j < p.slices; j++) {
        s += f32(qkv[i + j * p.elems]);
    }
    return s;
#else
    return f32(qkv[i]);
#endif
}

// One invocation per (token, head, pair of dims).
@compute @workgroup_size(64)
fn qkv_rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = p.d / 2u;
    let heads = p.hq + 2u * p.hkv;
    let idx = gid.x + gid.y * nwg.x * 64u;
    if idx >= p.tokens * heads * half {
        return;
    }
    let i = idx % half;
    let h = (idx / half) % heads;
    let t = idx / (half * heads);
    let pos = step[p.off_step + 1u] + t;
    if pos >= p.max_ctx {
        return; // the host checks lengths; never write outside the cache
    }
    let src = p.off_qkv + t * heads * p.d + h * p.d;
    // Pairs past rot/2 copy the pass-through dims (rope_dims, rope_angle.wgsl).
    let e = rope_dims(i, p.rot);
    var c = 1.0;
    var s = 0.0;
    if i < p.rot / 2u {
        let cs = cos_sin_at(pos, tab[p.off_tab / 2u + i]);
        c = cs.x;
        s = cs.y;
    }
    if h >= p.hq + p.hkv {
        // v: plain copy into the cache.
        let dst = p.off_v + (pos * p.hkv + (h - p.hq - p.hkv)) * p.d;
        v_cache[dst + e.x] = {{TC}}(qv(src + e.x));
        v_cache[dst + e.y] = {{TC}}(qv(src + e.y));
        return;
    }
    let x1 = qv(src + e.x);
    let x2 = qv(src + e.y);
    let r1 = x1 * c - x2 * s;
    let r2 = x2 * c + x1 * s;
    if h < p.hq {
        let dst = p.off_q + (t * p.hq + h) * p.d;
        q_out[dst + e.x] = {{TO}}(r1);
        q_out[dst + e.y] = {{TO}}(r2);
    } else {
        let dst = p.off_k + (pos * p.hkv + (h - p.hq)) * p.d;
        k_cache[dst + e.x] = {{TC}}(r1);
        k_cache[dst + e.y] = {{TC}}(r2);
    }
}
