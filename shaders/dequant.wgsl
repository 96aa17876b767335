// GGML block decoding, shared by the quantized kernels (matvec_quant.wgsl is compiled with this file
// appended, DEQ_MAIN off), and the dequantize kernel (DEQ_MAIN): out[row, k] = value of w[row, k] as
// f32 or f16 (prefill dequantizes a weight into a reused scratch and runs the f16 matmul on it).
//
// The weight is bound as `w: array<u32>` (W4: `w4: array<vec4<u32>>`) holding the blocks as in the
// GGUF file, rows of whole blocks, little endian; Q4_0 rows hold the same bytes split into scales and
// nibbles (see its loader). Blocks are only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q5_0 22 B, Q6_K 210 B),
// so a chunk's bytes are loaded as the words spanning them (`load`: one load per word, the fewest
// possible) and the fields are shifted out of those registers (`decode`): a field at an even offset
// is either a whole word or the halves of two neighbours, chosen by whether the block starts mid-word
// (`odd`). f16 fields go through unpack2x16float (never bitcast<vec2<f16>>, which naga miscompiles).
// With ALIGNED (every block starts on a word; Q4_0: every row's scales and nibbles) odd is the
// constant false and the selects fold away.
// Loading and decoding are separate so a lane keeps several chunks in flight as raw words (5 to 23
// registers each) rather than as decoded floats.
//
// `decode` turns chunk `c` of a row, elements 32c .. 32c + 32, into a `Chunk`:
//   element 4i + j = q[i][j] * (a0 if 4i + j < 16 else a1) + m
// with q small integers (offsets such as Q4_0's -8 already applied), exact in f32. The integers become
// floats without integer-to-float conversions (quarter rate on NVIDIA): OR-ing n < 2^23 into the bits of
// 2^23 gives the float 2^23 + n exactly, and one subtraction removes 2^23 and the offset together.
//
// Every word a kernel reads lies inside the weight's binding (the last word of a span is re-read
// instead of over-read where the block starts on a word), so these kernels run without bounds checks.
//
// Specialisation: one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K; ALIGNED; W4 (Q4_0). DEQ_MAIN also: OUT16
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

fn sh16(lo: u32, hi: u32) -> u32 {
    return (lo >> 16u) | (hi << 16u);
}

// The 4 bytes of a field at block offset r, from the words a = span[r / 4] and b = span[r / 4 + 1]:
// at0 where r % 4 == 0, at2 where r % 4 == 2.
fn at0(a: u32, b: u32, odd: bool) -> u32 {
    return select(a, sh16(a, b), odd);
}

fn at2(a: u32, b: u32, odd: bool) -> u32 {
    return select(sh16(a, b), b, odd);
}

// The f16 at block offset 0, from span[0].
fn half0(a: u32, odd: bool) -> f32 {
    return unpack2x16float(select(a, a >> 16u, odd)).x;
}

fn is_odd(o: u32) -> bool {
#if ALIGNED
    return false;
#else
    return (o & 2u) != 0u;
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
// the `hmask` bits of each byte of `hi` from bit `hs`, placed above them; minus `off`.
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

#ifnot W4
// Nine words from word i: 32 bytes at an even offset in words i .. i + 8, the last one only
// needed (and read) when `odd`.
fn span9(i: u32, odd: bool) -> array<u32, 9> {
    return array<u32, 9>(
        w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u],
        w[i + select(7u, 8u, odd)],
    );
}

#endif

// The 32 bytes at offset 0 of a 9-word span, aligned.
fn align8(a: array<u32, 9>, odd: bool) -> array<u32, 8> {
    return array<u32, 8>(
        at0(a[0], a[1], odd), at0(a[1], a[2], odd), at0(a[2], a[3], odd), at0(a[3], a[4], odd),
        at0(a[4], a[5], odd), at0(a[5], a[6], odd), at0(a[6], a[7], odd), at0(a[7], a[8], odd),
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

// Q4_K / Q5_K super-block header: d, dmin and the scale words, from its 5-word span.
fn kheader(h: array<u32, 5>, odd: bool) -> array<u32, 4> {
    return array<u32, 4>(at0(h[0], h[1], odd), at0(h[1], h[2], odd), at0(h[2], h[3], odd), at0(h[3], h[4], odd));
}

#ifnot W4
fn span5h(i: u32, odd: bool) -> array<u32, 5> {
    return array<u32, 5>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + select(3u, 4u, odd)]);
}
#endif

#if Q8_0
// d (f16), 32 x i8.
struct Raw { a: array<u32, 9>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 34u * c;
    let i = o >> 2u;
    // 34 bytes from a 2-aligned offset always span 9 words.
    return Raw(array<u32, 9>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u], w[i + 8u]), is_odd(o));
}

fn decode(r: Raw, c: u32) -> Chunk {
    let o = r.odd;
    let a = r.a;
    let f = 0x80808080u; // i8 -> u8 + 128
    var ch: Chunk;
    ch.q = array<vec4<f32>, 8>(
        bytes_f(at2(a[0], a[1], o) ^ f, 128.0), bytes_f(at2(a[1], a[2], o) ^ f, 128.0),
        bytes_f(at2(a[2], a[3], o) ^ f, 128.0), bytes_f(at2(a[3], a[4], o) ^ f, 128.0),
        bytes_f(at2(a[4], a[5], o) ^ f, 128.0), bytes_f(at2(a[5], a[6], o) ^ f, 128.0),
        bytes_f(at2(a[6], a[7], o) ^ f, 128.0), bytes_f(at2(a[7], a[8], o) ^ f, 128.0),
    );
    ch.a0 = half0(a[0], o);
    ch.a1 = ch.a0;
    ch.m = 0.0;
    return ch;
}
#endif

#if Q4_0
// d, 16 bytes of nibbles.
struct Raw { a: array<u32, 5>, odd: bool }

// Q4_0 rows are split at upload (kernels/quant_rows.rs): a row's p.nchunks f16 scales, then its
// 16-byte groups of nibbles, so a lane loads a block's nibbles as one aligned vector (W4: the weight
// bound as vec4 words, rows of whole 16-byte groups) and a team's loads are contiguous. The block comes
// back as the registers of a GGUF block that starts mid-word (`odd`): the scale in the high half of
// a[0], the nibbles in a[1..5].
fn load(rb: u32, c: u32) -> Raw {
    let so = rb + 2u * c;
    let no = rb + 2u * p.nchunks + 16u * c;
#if W4
    let sw = w4[so >> 4u][(so >> 2u) & 3u];
    let n = w4[no >> 4u];
#else
    let sw = w[so >> 2u];
    let i = no >> 2u;
    let n0 = vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
    // Nibbles that start mid-word (rows of an odd number of blocks) span a fifth word.
    let mid = is_odd(no);
    let e = w[i + select(3u, 4u, mid)];
    let n = select(n0, vec4<u32>(sh16(n0.x, n0.y), sh16(n0.y, n0.z), sh16(n0.z, n0.w), sh16(n0.w, e)), mid);
#endif
    let s = select(sw << 16u, sw, (so & 2u) != 0u);
    return Raw(array<u32, 5>(s, n.x, n.y, n.z, n.w), true);
}

fn decode(r: Raw, c: u32) -> Chunk {
    let o = r.odd;
    let a = r.a;
    var ch: Chunk;
    let q = array<u32, 4>(at2(a[0], a[1], o), at2(a[1], a[2], o), at2(a[2], a[3], o), at2(a[3], a[4], o));
    ch.q = nibbles(q, 0u, false, 8.0);
    ch.a0 = half0(a[0], o);
    ch.a1 = ch.a0;
    ch.m = 0.0;
    return ch;
}
#endif

#if Q4_1
// d, m, 16 bytes of nibbles.
struct Raw { a: array<u32, 6>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 20u * c;
    let i = o >> 2u;
    let odd = is_odd(o);
    return Raw(array<u32, 6>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + select(4u, 5u, odd)]), odd);
}

fn decode(r: Raw, c: u32) -> Chunk {
    let o = r.odd;
    let a = r.a;
    var ch: Chunk;
    let q = array<u32, 4>(at0(a[1], a[2], o), at0(a[2], a[3], o), at0(a[3], a[4], o), at0(a[4], a[5], o));
    ch.q = nibbles(q, 0u, false, 0.0);
    let dm = unpack2x16float(at0(a[0], a[1], o));
    ch.a0 = dm.x;
    ch.a1 = dm.x;
    ch.m = dm.y;
    return ch;
}
#endif

#if Q5_0
// d, qh (u32), 16 bytes of nibbles.
struct Raw { a: array<u32, 6>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 22u * c;
    let i = o >> 2u;
    // 22 bytes from a 2-aligned offset always span 6 words.
    return Raw(array<u32, 6>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u]), is_odd(o));
}

fn decode(r: Raw, c: u32) -> Chunk {
    let o = r.odd;
    let a = r.a;
    var ch: Chunk;
    let q = array<u32, 4>(at2(a[1], a[2], o), at2(a[2], a[3], o), at2(a[3], a[4], o), at2(a[4], a[5], o));
    ch.q = nibbles(q, at2(a[0], a[1], o), true, 16.0);
    ch.a0 = half0(a[0], o);
    ch.a1 = ch.a0;
    ch.m = 0.0;
    return ch;
}
#endif

#if Q5_1
// d, m, qh (u32), 16 bytes of nibbles.
struct Raw { a: array<u32, 7>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 24u * c;
    let i = o >> 2u;
    let odd = is_odd(o);
    return Raw(array<u32, 7>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u], w[i + select(5u, 6u, odd)]), odd);
}

fn decode(r: Raw, c: u32) -> Chunk {
    let o = r.odd;
    let a = r.a;
    var ch: Chunk;
    let q = array<u32, 4>(at0(a[2], a[3], o), at0(a[3], a[4], o), at0(a[4], a[5], o), at0(a[5], a[6], o));
    ch.q = nibbles(q, at0(a[1], a[2], o), true, 0.0);
    let dm = unpack2x16float(at0(a[0], a[1], o));
    ch.a0 = dm.x;
    ch.a1 = dm.x;
    ch.m = dm.y;
    return ch;
}
#endif

#if Q4K
// Super-block of 8 sub-blocks: d, dmin, 12 scale bytes, 128 bytes of nibbles. Chunk c is sub-block
// j = c % 8 of super-block c / 8: nibbles j % 2 of bytes 16 + 32 (j / 2) ...
struct Raw { h: array<u32, 5>, q: array<u32, 9>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 144u * (c >> 3u);
    let i = o >> 2u;
    let odd = is_odd(o);
    return Raw(span5h(i, odd), span9(i + 4u + 8u * ((c & 7u) >> 1u), odd), odd);
}

fn decode(r: Raw, c: u32) -> Chunk {
    let j = c & 7u;
    let hd = kheader(r.h, r.odd);
    let am = kscale(hd[1], hd[2], hd[3], j, unpack2x16float(hd[0]));
    let lo = align8(r.q, r.odd);
    var ch: Chunk;
    ch.q = kquants(lo, 4u * (j & 1u), lo, 0u, 0u, 0.0);
    ch.a0 = am.x;
    ch.a1 = am.x;
    ch.m = am.y;
    return ch;
}
#endif

#if Q5K
// As Q4_K with 32 bytes of fifth bits (bit j of byte l: element l of sub-block j) before the nibbles.
struct Raw { h: array<u32, 5>, qh: array<u32, 9>, q: array<u32, 9>, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let o = rb + 176u * (c >> 3u);
    let i = o >> 2u;
    let odd = is_odd(o);
    return Raw(span5h(i, odd), span9(i + 4u, odd), span9(i + 12u + 8u * ((c & 7u) >> 1u), odd), odd);
}

fn decode(r: Raw, c: u32) -> Chunk {
    let j = c & 7u;
    let hd = kheader(r.h, r.odd);
    let am = kscale(hd[1], hd[2], hd[3], j, unpack2x16float(hd[0]));
    var ch: Chunk;
    ch.q = kquants(align8(r.q, r.odd), 4u * (j & 1u), align8(r.qh, r.odd), j, 0x01010101u, 0.0);
    ch.a0 = am.x;
    ch.a1 = am.x;
    ch.m = am.y;
    return ch;
}
#endif

#if Q6K
// ql (128 B), qh (64 B), 16 i8 scales, d. Chunk c is t = c % 8 = 4 hh + s of super-block c / 8:
// elements 128 hh + 32 s + l take nibble s / 2 of ql[64 hh + 32 (s % 2) + l] and bits 2s of
// qh[32 hh + l], scales 8 hh + 2 s (l < 16) and + 1.
struct Raw { ql: array<u32, 9>, qh: array<u32, 9>, sc: u32, d: u32, odd: bool }

fn load(rb: u32, c: u32) -> Raw {
    let t = c & 7u;
    let hh = t >> 2u;
    let s = t & 3u;
    let o = rb + 210u * (c >> 3u);
    let i = o >> 2u;
    let odd = is_odd(o);
    return Raw(
        span9(i + 16u * hh + 8u * (s & 1u), odd),
        span9(i + 32u + 8u * hh, odd),
        w[(o + 192u + 8u * hh + 2u * s) >> 2u],
        w[(o + 208u) >> 2u],
        odd,
    );
}

fn decode(r: Raw, c: u32) -> Chunk {
    let t = c & 7u;
    let s = t & 3u;
    // The two scale bytes sit in the upper half of their word when exactly one of the block and the
    // pair starts mid-word.
    let sc = r.sc >> (16u * (u32(r.odd) ^ (s & 1u)));
    let d = unpack2x16float(select(r.d, r.d >> 16u, r.odd)).x;
    var ch: Chunk;
    ch.q = kquants(align8(r.ql, r.odd), 4u * (s >> 1u), align8(r.qh, r.odd), 2u * s, 0x03030303u, 32.0);
    ch.a0 = d * f32(extractBits(bitcast<i32>(sc), 0u, 8u));
    ch.a1 = d * f32(extractBits(bitcast<i32>(sc), 8u, 8u));
    ch.m = 0.0;
    return ch;
}
#endif

// Chunk c (elements 32c .. 32c + 32) of the row whose blocks start at byte `rb` of `w`.
fn chunk(rb: u32, c: u32) -> Chunk {
    return decode(load(rb, c), c);
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
