// Accurate rotary angles, and which dims a rotary pair takes, shared by the RoPE kernels (appended to
// rope.wgsl, qkv_rope.wgsl and the matrix-vector kernels' RoPE epilogue in matvec_fuse.wgsl).
//
// cos/sin of pos * freq stay accurate to ~1e-6 at any position below 2^24, where a plain f32 angle is
// off by up to half an ulp of 32768 (2e-3 rad) and GPU sin/cos lose accuracy far from 0. The host
// gives each pair's frequency in turns per position as a double-single (hi, lo) computed in f64;
// pos * turns is formed from exact partial products (12-bit pieces split off with bit masks, so no FMA
// or evaluation-order assumption), reduced modulo 1 exactly, and cos/sin are polynomials on
// [-pi/4, pi/4] after an exact quadrant reduction.

// The top 12 significant bits of a (the rest of its significand cleared).
fn top12(a: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(a) & 0xFFFFF000u);
}

// a - round(a): exact, in [-0.5, 0.5].
fn wrap(a: f32) -> f32 {
    return a - round(a);
}

// cos and sin of 2 pi t for t in turns, |t| <= 0.5.
fn cos_sin_turns(t: f32) -> vec2<f32> {
    let k = round(t * 4.0);
    let a = (t - k * 0.25) * 6.283185307179586;   // |a| <= pi/4, t - k/4 is exact
    let a2 = a * a;
    // Taylor to a^9 / a^10: remainders below 2e-9 on [-pi/4, pi/4].
    let s = a * (1.0 + a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 + a2 * (1.0 / 362880.0)))));
    let c = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 + a2 * (1.0 / 40320.0 + a2 * (-1.0 / 3628800.0)))));
    let q = (i32(k) + 4) & 3;
    switch q {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}

// cos and sin of position `ps` times the frequency g = (hi, lo) in turns per position.
fn cos_sin_at(ps: u32, g: vec2<f32>) -> vec2<f32> {
    // ps = p1 * 4096 + p0 with 12-bit p0, p1; g.x = a + b with 12-bit a, b: every partial product
    // below has at most 24 significant bits, so it and its wrap are exact.
    let p0 = f32(ps & 0xFFFu);
    let p1 = f32(ps >> 12u);
    let a = top12(g.x);
    let b = g.x - a;
    var t = wrap(p1 * a * 4096.0);
    t = wrap(t + wrap(p0 * a));
    t = wrap(t + wrap(p1 * b * 4096.0));
    t = wrap(t + wrap(p0 * b));
    t = wrap(t + wrap(f32(ps) * g.y));
    return cos_sin_turns(t);
}

// Dims (within a head) of pair i with `rot` rotary dims: pair i < rot / 2 is (2i, 2i + 1) with
// INTERLEAVED (GGUF llama weights), else (i, i + rot / 2) (Hugging Face checkpoints); pairs past rot / 2
// are the pass-through dims rot.. two at a time.
fn rope_dims(i: u32, rot: u32) -> vec2<u32> {
    let half_rot = rot / 2u;
    if i >= half_rot {
        let j = rot + 2u * (i - half_rot);
        return vec2<u32>(j, j + 1u);
    }
#if INTERLEAVED
    return vec2<u32>(2u * i, 2u * i + 1u);
#else
    return vec2<u32>(i, i + half_rot);
#endif
}
