// GGML block decoding, shared by the quantized kernels (matvec_quant.wgsl is compiled with this file
// appended, DEQ_MAIN off), and the dequantize kernel (DEQ_MAIN): out[row, k] = value of w[row, k] as
// f32 or f16 (prefill dequantizes a weight into a reused scratch and runs the f16 matmul on it).
//
// The weight is bound as `w: array<u32>` holding the blocks exactly as in the GGUF file: rows of whole
// blocks, little endian. Blocks are only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q5_0 22 B, Q6_K 210 B),
// so a field at an even byte offset is read from the word(s) holding it and shifted into place (never
// bitcast<vec2<f16>>, which naga miscompiles: f16 fields go through unpack2x16float). With ALIGNED
// (every block starts on a 4-byte boundary) the extra word and the selects drop out.
//
// Every type decodes chunk `c` of a row, elements 32c .. 32c + 32, into a `Chunk`:
//   element 4i + j = q[i][j] * (a0 if 4i + j < 16 else a1) + m
// with q small integers (offsets such as Q4_0's -8 already applied), exact in f32. The integers become
// floats without integer-to-float conversions (quarter rate on NVIDIA): OR-ing n < 2^23 into the bits of
// 2^23 gives the float 2^23 + n exactly, and one subtraction removes 2^23 and the offset together.
//
// Specialisation: one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K; ALIGNED. DEQ_MAIN also: OUT16
// (f16 output, written as packed u32 pairs; needs no shader-f16), OVEC (vector stores).

struct Chunk {
    q: array<vec4<f32>, 8>,
    a0: f32,
    a1: f32,
    m: f32,
}

const MAGIC = 0x4B000000u; // the bits of 2^23

// The four bytes of `u` as floats, minus `off`.
fn bytes_f(u: u32, off: f32) -> vec4<f32> {
    let b = (vec4<u32>(u) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
    return bitcast<vec4<f32>>(b | vec4<u32>(MAGIC)) - vec4<f32>(8388608.0 + off);
}

// Bits e0 .. e0+3 of `qh`, moved to bit 4 of bytes 0..3 (the fifth bit of four 5-bit quants).
fn hbit4(qh: u32, e0: u32) -> u32 {
    return ((((qh >> e0) & 0xFu) * 0x204081u) & 0x01010101u) << 4u;
}

fn sh16(lo: u32, hi: u32, odd: bool) -> u32 {
    return select(lo, (lo >> 16u) | (hi << 16u), odd);
}

// 16 bits at even byte offset b.
fn u16_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 2u) * 8u)) & 0xFFFFu;
}

fn f16_at(b: u32) -> f32 {
    return unpack2x16float(u16_at(b)).x;
}

// 4 bytes at even byte offset b.
fn u32_at(b: u32) -> u32 {
    let i = b >> 2u;
#if ALIGNED
    return w[i];
#else
    let o = (b & 2u) != 0u;
    return sh16(w[i], w[i + select(0u, 1u, o)], o);
#endif
}

// 16 bytes at even byte offset b.
fn words4(b: u32) -> array<u32, 4> {
    let i = b >> 2u;
    let w0 = w[i];
    let w1 = w[i + 1u];
    let w2 = w[i + 2u];
    let w3 = w[i + 3u];
#if ALIGNED
    return array<u32, 4>(w0, w1, w2, w3);
#else
    // The fifth word only holds data when b is not word aligned (else re-read the fourth): every
    // read stays inside the tensor, which the kernels compiled without bounds checks rely on.
    let o = (b & 2u) != 0u;
    let w4 = w[i + select(3u, 4u, o)];
    return array<u32, 4>(sh16(w0, w1, o), sh16(w1, w2, o), sh16(w2, w3, o), sh16(w3, w4, o));
#endif
}

// 32 bytes at even byte offset b.
fn words8(b: u32) -> array<u32, 8> {
    let i = b >> 2u;
    let w0 = w[i];
    let w1 = w[i + 1u];
    let w2 = w[i + 2u];
    let w3 = w[i + 3u];
    let w4 = w[i + 4u];
    let w5 = w[i + 5u];
    let w6 = w[i + 6u];
    let w7 = w[i + 7u];
#if ALIGNED
    return array<u32, 8>(w0, w1, w2, w3, w4, w5, w6, w7);
#else
    let o = (b & 2u) != 0u;
    let w8 = w[i + select(7u, 8u, o)];
    return array<u32, 8>(
        sh16(w0, w1, o), sh16(w1, w2, o), sh16(w2, w3, o), sh16(w3, w4, o),
        sh16(w4, w5, o), sh16(w5, w6, o), sh16(w6, w7, o), sh16(w7, w8, o),
    );
#endif
}

// Sixteen 4-bit quants (low nibbles of q = elements 0..16, high = 16..32), with the fifth bits from
// qh (Q5_*) when `five`.
fn nibbles(q: array<u32, 4>, qh: u32, five: bool, off: f32) -> array<vec4<f32>, 8> {
    let m = 0x0F0F0F0Fu;
    var hl = vec4<u32>(0u);
    var hh = vec4<u32>(0u);
    if five {
        hl = vec4<u32>(hbit4(qh, 0u), hbit4(qh, 4u), hbit4(qh, 8u), hbit4(qh, 12u));
        hh = vec4<u32>(hbit4(qh, 16u), hbit4(qh, 20u), hbit4(qh, 24u), hbit4(qh, 28u));
    }
    return array<vec4<f32>, 8>(
        bytes_f((q[0] & m) | hl.x, off),
        bytes_f((q[1] & m) | hl.y, off),
        bytes_f((q[2] & m) | hl.z, off),
        bytes_f((q[3] & m) | hl.w, off),
        bytes_f(((q[0] >> 4u) & m) | hh.x, off),
        bytes_f(((q[1] >> 4u) & m) | hh.y, off),
        bytes_f(((q[2] >> 4u) & m) | hh.z, off),
        bytes_f(((q[3] >> 4u) & m) | hh.w, off),
    );
}

// 32 quants of a K-quant sub-block: 4 bits of each byte of `lo` from bit `ls`, plus (Q5_K, Q6_K)
// `hbits` bits of each byte of `hi` from bit `hs`, placed above them; minus `off`.
fn kquants(lo: array<u32, 8>, ls: u32, hi: array<u32, 8>, hs: u32, hmask: u32, off: f32) -> array<vec4<f32>, 8> {
    let m = 0x0F0F0F0Fu;
    return array<vec4<f32>, 8>(
        bytes_f(((lo[0] >> ls) & m) | (((hi[0] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[1] >> ls) & m) | (((hi[1] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[2] >> ls) & m) | (((hi[2] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[3] >> ls) & m) | (((hi[3] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[4] >> ls) & m) | (((hi[4] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[5] >> ls) & m) | (((hi[5] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[6] >> ls) & m) | (((hi[6] >> hs) & hmask) << 4u), off),
        bytes_f(((lo[7] >> ls) & m) | (((hi[7] >> hs) & hmask) << 4u), off),
    );
}

// Q4_K / Q5_K: scale and min of sub-block j from the 12 scale bytes (words s0, s1, s2), times d, dmin.
fn kscale(s0: u32, s1: u32, s2: u32, j: u32, dd: vec2<f32>) -> vec2<f32> {
    let sh = 8u * (j & 3u);
    let b0 = (s0 >> sh) & 0xFFu;
    let b1 = (s1 >> sh) & 0xFFu;
    let b2 = (s2 >> sh) & 0xFFu;
    let lo = j < 4u;
    let sc = select((b2 & 0xFu) | ((b0 >> 2u) & 0x30u), b0 & 0x3Fu, lo);
    let mn = select((b2 >> 4u) | ((b1 >> 2u) & 0x30u), b1 & 0x3Fu, lo);
    return vec2<f32>(dd.x * f32(sc), -(dd.y * f32(mn)));
}

// Chunk c (elements 32c .. 32c + 32) of the row whose blocks start at byte `rb` of `w`.
fn chunk(rb: u32, c: u32) -> Chunk {
    var r: Chunk;
    r.m = 0.0;
#if Q8_0
    let o = rb + 34u * c;
    let d = f16_at(o);
    let q = words8(o + 2u);
    let f = 0x80808080u; // i8 -> u8 + 128
    r.q = array<vec4<f32>, 8>(
        bytes_f(q[0] ^ f, 128.0), bytes_f(q[1] ^ f, 128.0), bytes_f(q[2] ^ f, 128.0), bytes_f(q[3] ^ f, 128.0),
        bytes_f(q[4] ^ f, 128.0), bytes_f(q[5] ^ f, 128.0), bytes_f(q[6] ^ f, 128.0), bytes_f(q[7] ^ f, 128.0),
    );
    r.a0 = d;
#endif
#if Q4_0
    let o = rb + 18u * c;
    r.a0 = f16_at(o);
    r.q = nibbles(words4(o + 2u), 0u, false, 8.0);
#endif
#if Q4_1
    let o = rb + 20u * c;
    let dm = unpack2x16float(u32_at(o));
    r.a0 = dm.x;
    r.m = dm.y;
    r.q = nibbles(words4(o + 4u), 0u, false, 0.0);
#endif
#if Q5_0
    let o = rb + 22u * c;
    r.a0 = f16_at(o);
    r.q = nibbles(words4(o + 6u), u32_at(o + 2u), true, 16.0);
#endif
#if Q5_1
    let o = rb + 24u * c;
    let dm = unpack2x16float(u32_at(o));
    r.a0 = dm.x;
    r.m = dm.y;
    r.q = nibbles(words4(o + 8u), u32_at(o + 4u), true, 0.0);
#endif
#if Q4K
    let j = c & 7u;
    let o = rb + 144u * (c >> 3u);
    let hd = words4(o);
    let am = kscale(hd[1], hd[2], hd[3], j, unpack2x16float(hd[0]));
    r.a0 = am.x;
    r.m = am.y;
    let lo = words8(o + 16u + 32u * (j >> 1u));
    r.q = kquants(lo, 4u * (j & 1u), lo, 0u, 0u, 0.0);
#endif
#if Q5K
    let j = c & 7u;
    let o = rb + 176u * (c >> 3u);
    let hd = words4(o);
    let am = kscale(hd[1], hd[2], hd[3], j, unpack2x16float(hd[0]));
    r.a0 = am.x;
    r.m = am.y;
    r.q = kquants(words8(o + 48u + 32u * (j >> 1u)), 4u * (j & 1u), words8(o + 16u), j, 0x01010101u, 0.0);
#endif
#if Q6K
    // Elements 128h + 32s + l: ql[64h + 32(s & 1) + l] nibble s >> 1, qh[32h + l] bits 2s.
    let t = c & 7u;
    let hh = t >> 2u;
    let s = t & 3u;
    let o = rb + 210u * (c >> 3u);
    let d = f16_at(o + 208u);
    let sc = u16_at(o + 192u + 8u * hh + 2u * s); // scales of elements 0..16 and 16..32
    r.a0 = d * f32(extractBits(bitcast<i32>(sc), 0u, 8u));
    r.a1 = d * f32(extractBits(bitcast<i32>(sc), 8u, 8u));
    r.q = kquants(words8(o + 64u * hh + 32u * (s & 1u)), 4u * (s >> 1u), words8(o + 128u + 32u * hh), 2u * s, 0x03030303u, 32.0);
#else
    r.a1 = r.a0;
#endif
    return r;
}

#if DEQ_MAIN
struct Params {
    off_w: u32, off_out: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    chunks: u32,     // rows * K / 32
    nchunks: u32,    // K / 32 (chunks per row)
    wbyte: u32,      // extra byte offset of the first row past word off_w
    row_bytes: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
#if OUT16
#if OVEC
@group(0) @binding(2) var<storage, read_write> out: array<vec4<u32>>; // 8 halves
#else
@group(0) @binding(2) var<storage, read_write> out: array<u32>;       // 2 halves
#endif
#else
#if OVEC
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
#endif
#endif

fn value(r: Chunk, i: u32) -> vec4<f32> {
    return fma(r.q[i], vec4<f32>(select(r.a1, r.a0, i < 4u)), vec4<f32>(r.m));
}

@compute @workgroup_size(64)
fn dequantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = gid.x + gid.y * nwg.x * 64u;
    if g >= p.chunks {
        return;
    }
    let row = g / p.nchunks;
    let r = chunk(p.off_w * 4u + p.wbyte + row * p.row_bytes, g % p.nchunks);
    // Output element e = off_out + 32 g (rows are contiguous, K a multiple of 32).
#if OUT16
#if OVEC
    let o = p.off_out / 8u + 4u * g;
    for (var i = 0u; i < 4u; i++) {
        let a = value(r, 2u * i);
        let b = value(r, 2u * i + 1u);
        out[o + i] = vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
    }
#else
    let o = p.off_out / 2u + 16u * g;
    for (var i = 0u; i < 8u; i++) {
        let a = value(r, i);
        out[o + 2u * i] = pack2x16float(a.xy);
        out[o + 2u * i + 1u] = pack2x16float(a.zw);
    }
#endif
#else
#if OVEC
    let o = p.off_out / 4u + 8u * g;
    for (var i = 0u; i < 8u; i++) {
        out[o + i] = value(r, i);
    }
#else
    let o = p.off_out + 32u * g;
    for (var i = 0u; i < 8u; i++) {
        let a = value(r, i);
        out[o + 4u * i] = a.x;
        out[o + 4u * i + 1u] = a.y;
        out[o + 4u * i + 2u] = a.z;
        out[o + 4u * i + 3u] = a.w;
    }
#endif
#endif
}
#endif
