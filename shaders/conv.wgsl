// 2-D convolution over NCHW tensors as an implicit GEMM:
//   out[n, o, ho, wo] = bias[o] + residual[n, o, ho, wo]
//                     + sum_{c, kh, kw} x[n, c, ho*S - P + kh, wo*S - P + kw] * w[o, c, kh, kw]
// GEMM view: M = N*Ho*Wo output pixels, N = O output channels, K = C*KH*KW (k = (c*KH + kh)*KW + kw).
// A workgroup computes a BM x 64 (pixel x channel) tile. Each K step gathers the 16 x BM input patch and
// the 16 x 64 weight slice into workgroup memory on the fly (no im2col buffer), double-buffered, while
// the next step's values are already being loaded into registers; each thread accumulates TM pixels x TN
// channels in f32 registers.
// With split-K (SPLIT) each workgroup reduces one K range into an f32 scratch [splits, N, O, Ho, Wo] and
// the `conv2d_reduce` entry point (REDUCE) sums the ranges and applies bias and residual.
// Specialisation:
//   TX, TW, TB  element types of x/out/residual, w, bias (f32|f16); F16 when any of them is f16
//   KH, KW, S, P  kernel size, stride and top/left padding (compile-time: index math becomes mul/shift)
//   TM8         8 pixels per thread (BM = 128) instead of 4 (BM = 64)
//   TN8         8 channels per thread and 128 threads instead of 4 channels and 256 threads
//   A2, A4      each thread loads 2 / 4 vec4 of the A tile per K step (from TM8 and TN8)
//   MASK        KH*KW <= 32: each gathered pixel keeps a bit mask of its in-image kernel taps
//   WT          w stored [K, O] (Layout::Transposed) instead of [O, K] (row-major OIHW)
//   WVEC        w read as vec4 (WT, O % 4 == 0, offset aligned)
//   XVEC        x read as vec4 (1x1, stride 1, no padding, H*W % 4 == 0, offset aligned)
//   OVEC        out (and residual, scratch) accessed as vec4 (Ho*Wo % 4 == 0, offsets aligned)
//   BIAS, RES   fused bias / residual, bound at B_BIAS / B_RES with base offsets OFF_BIAS / OFF_RES
#if F16
enable f16;
#endif

struct Params {
    offs: array<vec4<u32>, 2>,
    batch: u32, c: u32, h: u32, w: u32,
    o: u32, ho: u32, wo: u32, m: u32,
    k: u32, tiles_n: u32, tiles: u32, hw_out: u32,
    // Split-K: K per split (a multiple of 16), number of splits, elements of one split's output.
    k_split: u32, splits: u32, total: u32, pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

#if OVEC
alias VO = vec4<{{TX}}>;
#else
alias VO = {{TX}};
#endif

#ifnot REDUCE
#if XVEC
@group(0) @binding(1) var<storage, read> x: array<vec4<{{TX}}>>;
#else
@group(0) @binding(1) var<storage, read> x: array<{{TX}}>;
#endif
#if WVEC
@group(0) @binding(2) var<storage, read> wt: array<vec4<{{TW}}>>;
#else
@group(0) @binding(2) var<storage, read> wt: array<{{TW}}>;
#endif
// The output, or the f32 split-K scratch.
#if SPLIT
#if OVEC
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
#else
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
#endif
#else
@group(0) @binding(3) var<storage, read_write> out: array<VO>;
#endif
#else
// conv2d_reduce: scratch in, output out.
#if OVEC
@group(0) @binding(1) var<storage, read> scratch: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> scratch: array<f32>;
#endif
@group(0) @binding(2) var<storage, read_write> out: array<VO>;
#endif
#if BIAS
@group(0) @binding({{B_BIAS}}) var<storage, read> bias: array<{{TB}}>;
#endif
#if RES
@group(0) @binding({{B_RES}}) var<storage, read> res: array<VO>;
#endif

#ifnot REDUCE
#if TM8
const BM4: u32 = 32u; // vec4 pixel groups per K row of the A tile (BM = 128)
#else
const BM4: u32 = 16u; // BM = 64
#endif
#if TN8
const NT: u32 = 128u;
#else
const NT: u32 = 256u;
#endif
const BK: u32 = 16u;
const KHW: u32 = {{KH}}u * {{KW}}u;
const A_ROWS: u32 = NT / BM4; // K rows of the A tile one pass of the workgroup loads
// Each thread loads BK / A_ROWS vec4 of A (1, 2 with A2, 4 with A4) and 256 / NT of B per K step.
const TILE_A: u32 = BK * BM4;
const TILE_B: u32 = BK * 16u;

// A tile [k][pixel] and B tile [k][channel], 4 pixels / channels per vec4, in f32 whatever the io type;
// two of each so one barrier per K step suffices.
var<workgroup> ta: array<vec4<f32>, 2u * TILE_A>;
var<workgroup> tb: array<vec4<f32>, 2u * TILE_B>;

// End of this workgroup's K range.
var<private> k_end: u32;

// Four consecutive pixels' input values for reduction index k. `pix` holds per pixel the offset of
// its kernel window's top-left corner (x[n, 0, ho*S - P, wo*S - P], may be negative); with MASK, `mask`
// has bit kh*KW + kw set where that tap lies inside the image (and the pixel exists).
#if XVEC
fn load_a(k: u32, pix: vec4<i32>, mask: vec4<u32>) -> vec4<f32> {
    // 1x1 stride 1: k is the channel and the 4 pixels are contiguous and 16-byte aligned.
    if k >= k_end || mask.x == 0u {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(x[(p.offs[0].x + u32(pix.x) + k * p.h * p.w) / 4u]);
}
#else
fn tap(pix: i32, mask: u32, bit: u32, delta: u32, hi: i32, wi: i32) -> f32 {
#if MASK
    let inside = ((mask >> bit) & 1u) != 0u;
#else
    // Kernels with more than 32 taps: test the tap's input row and column; `mask` says the pixel exists.
    let inside = mask != 0u && hi >= 0 && hi < i32(p.h) && wi >= 0 && wi < i32(p.w);
#endif
    if inside {
        return f32(x[p.offs[0].x + u32(pix + i32(delta))]);
    }
    return 0.0;
}

fn load_a(k: u32, pix: vec4<i32>, mask: vec4<u32>, hi0: vec4<i32>, wi0: vec4<i32>) -> vec4<f32> {
    if k >= k_end {
        return vec4<f32>(0.0);
    }
    let c = k / KHW;
    let r = k - c * KHW;
    let kh = r / {{KW}}u;
    let kw = r - kh * {{KW}}u;
    // Offset of this tap from the window corner, the same for every pixel.
    let delta = c * p.h * p.w + kh * p.w + kw;
    let hi = hi0 + vec4<i32>(i32(kh));
    let wi = wi0 + vec4<i32>(i32(kw));
    return vec4<f32>(
        tap(pix.x, mask.x, r, delta, hi.x, wi.x),
        tap(pix.y, mask.y, r, delta, hi.y, wi.y),
        tap(pix.z, mask.z, r, delta, hi.z, wi.z),
        tap(pix.w, mask.w, r, delta, hi.w, wi.w),
    );
}
#endif

// Weights w[o .. o+4, k] (zero past O or the K range).
fn load_b(k: u32, o: u32) -> vec4<f32> {
    if k >= k_end {
        return vec4<f32>(0.0);
    }
    let wo = p.offs[0].y;
#if WVEC
    if o >= p.o {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(wt[(wo + k * p.o + o) / 4u]);
#else
    var v = vec4<f32>(0.0);
#if WT
    let i = wo + k * p.o + o;
    if o < p.o { v.x = f32(wt[i]); }
    if o + 1u < p.o { v.y = f32(wt[i + 1u]); }
    if o + 2u < p.o { v.z = f32(wt[i + 2u]); }
    if o + 3u < p.o { v.w = f32(wt[i + 3u]); }
#else
    let i = wo + o * p.k + k;
    if o < p.o { v.x = f32(wt[i]); }
    if o + 1u < p.o { v.y = f32(wt[i + p.k]); }
    if o + 2u < p.o { v.z = f32(wt[i + 2u * p.k]); }
    if o + 3u < p.o { v.w = f32(wt[i + 3u * p.k]); }
#endif
    return v;
#endif
}

// Stores 4 pixels starting at `m` of channel `o` (adding bias and residual unless split), or the
// split's partial sums into the scratch.
fn store_ch(m: u32, o: u32, acc: vec4<f32>, split: u32) {
    if o >= p.o || m >= p.m {
        return;
    }
    var v = acc;
#if BIAS
    v += vec4<f32>(f32(bias[{{OFF_BIAS}} + o]));
#endif
    let hw = p.hw_out;
#if SPLIT
    let base = split * p.total;
#else
    let base = p.offs[0].z;
#endif
#if OVEC
    // Ho*Wo % 4 == 0, so an aligned group of 4 pixels lies in one image and one vec4.
    let n = m / hw;
    let i = n * p.o * hw + o * hw + (m - n * hw);
#if RES
    v += vec4<f32>(res[({{OFF_RES}} + i) / 4u]);
#endif
#if SPLIT
    out[(base + i) / 4u] = v;
#else
    out[(base + i) / 4u] = VO(v);
#endif
#else
    for (var e = 0u; e < 4u; e++) {
        let me = m + e;
        if me < p.m {
            let n = me / hw;
            let i = n * p.o * hw + o * hw + (me - n * hw);
            var r = v[e];
#if RES
            r += f32(res[{{OFF_RES}} + i]);
#endif
#if SPLIT
            out[base + i] = r;
#else
            out[base + i] = {{TX}}(r);
#endif
        }
    }
#endif
}

// Stores a group of 4 pixels x 4 channels: column e of `c` holds pixel e's 4 channels.
fn store_group(m: u32, o: u32, c: mat4x4<f32>, split: u32) {
    store_ch(m, o, vec4<f32>(c[0].x, c[1].x, c[2].x, c[3].x), split);
    store_ch(m, o + 1u, vec4<f32>(c[0].y, c[1].y, c[2].y, c[3].y), split);
    store_ch(m, o + 2u, vec4<f32>(c[0].z, c[1].z, c[2].z, c[3].z), split);
    store_ch(m, o + 3u, vec4<f32>(c[0].w, c[1].w, c[2].w, c[3].w), split);
}

// acc += outer(b, a): column e gains a[e] * b.
fn mac(acc: mat4x4<f32>, a: vec4<f32>, b: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(
        fma(vec4<f32>(a.x), b, acc[0]),
        fma(vec4<f32>(a.y), b, acc[1]),
        fma(vec4<f32>(a.z), b, acc[2]),
        fma(vec4<f32>(a.w), b, acc[3]),
    );
}

// The A values of load slot j (K row ka + j * A_ROWS of the step starting at k0).
fn load_a_j(k0: u32, j: u32, ka: u32, pix: vec4<i32>, mask: vec4<u32>, hi0: vec4<i32>, wi0: vec4<i32>) -> vec4<f32> {
#if XVEC
    return load_a(k0 + ka + j * A_ROWS, pix, mask);
#else
    return load_a(k0 + ka + j * A_ROWS, pix, mask, hi0, wi0);
#endif
}

// The B values of load slot j: with WT K row kb + 8j of channel group gb, else K row kb of channel
// group gb + 8j.
fn load_b_j(k0: u32, j: u32, kb: u32, n0: u32, gb: u32) -> vec4<f32> {
#if WT
    return load_b(k0 + kb + j * 8u, n0 + gb * 4u);
#else
    return load_b(k0 + kb, n0 + (gb + j * 8u) * 4u);
#endif
}

#if TN8
@compute @workgroup_size(128)
#else
@compute @workgroup_size(256)
#endif
fn conv2d(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = wid.x + wid.y * nwg.x;
    if id >= p.tiles * p.splits {
        return;
    }
    let split = id / p.tiles;
    let tile = id - split * p.tiles;
    // Channel tiles vary fastest: the workgroups sharing one input patch run together (L2 reuse).
    let n0 = (tile % p.tiles_n) * 64u;
    let m0 = (tile / p.tiles_n) * (BM4 * 4u);
    let k_begin = split * p.k_split;
    let kend = min(k_begin + p.k_split, p.k);
    k_end = kend;

    // Loader roles: this thread gathers pixel group `ga` (4 pixels) for K rows ka + j * A_ROWS, and the
    // 4 weights of channel group `gb` for K row `kb` (see load_b_j for the second slot with TN8).
    let ga = li % BM4;
    let ka = li / BM4;
#if WT
    let gb = li % 16u;
    let kb = li / 16u;
#else
    let gb = li / 16u; // row-major w: neighbouring threads read neighbouring k
    let kb = li % 16u;
#endif

    // Per-pixel constants of the gathered group.
    var pix: vec4<i32>;
    var mask: vec4<u32>;
    var hi0: vec4<i32>;
    var wi0: vec4<i32>;
    let chw = p.c * p.h * p.w;
    for (var e = 0u; e < 4u; e++) {
        let m = m0 + ga * 4u + e;
        let mm = min(m, p.m - 1u);
        let n = mm / p.hw_out;
        let hw = mm - n * p.hw_out;
        let ho = hw / p.wo;
        let wo = hw - ho * p.wo;
        let h0 = i32(ho * {{S}}u) - {{P}};
        let w0 = i32(wo * {{S}}u) - {{P}};
        hi0[e] = h0;
        wi0[e] = w0;
#if XVEC
        pix[e] = i32(n * chw + hw);
        mask[e] = u32(m < p.m);
#else
        pix[e] = i32(n * chw) + h0 * i32(p.w) + w0;
#if MASK
        var bits = 0u;
        for (var r = 0u; r < KHW; r++) {
            let hi = h0 + i32(r / {{KW}}u);
            let wi = w0 + i32(r % {{KW}}u);
            if hi >= 0 && hi < i32(p.h) && wi >= 0 && wi < i32(p.w) {
                bits |= 1u << r;
            }
        }
        mask[e] = select(0u, bits, m < p.m);
#else
        mask[e] = u32(m < p.m);
#endif
#endif
    }

    // Accumulators: 4x4 blocks (column e = pixel e's 4 channels) for pixel groups tm, tm + 16 and
    // channel groups tn, tn + 8. Plain variables, no private arrays: dynamically indexed private arrays
    // end up in local memory.
    var c00 = mat4x4<f32>();
#if TM8
    var c10 = mat4x4<f32>();
#endif
#if TN8
    var c01 = mat4x4<f32>();
#if TM8
    var c11 = mat4x4<f32>();
#endif
#endif

    // Thread's compute role: pixel groups tm (+ 16), channel groups tn (+ 8 with TN8).
    let tm = li % 16u;
    let tn = li / 16u;

    let ktiles = (kend - k_begin + BK - 1u) / BK;
    // Registers holding the next K step: A rows ka + j * A_ROWS, B rows/groups as in load_b_j.
    var ra0 = load_a_j(k_begin, 0u, ka, pix, mask, hi0, wi0);
#if A2
    var ra1 = load_a_j(k_begin, 1u, ka, pix, mask, hi0, wi0);
#endif
#if A4
    var ra2 = load_a_j(k_begin, 2u, ka, pix, mask, hi0, wi0);
    var ra3 = load_a_j(k_begin, 3u, ka, pix, mask, hi0, wi0);
#endif
    var rb0 = load_b_j(k_begin, 0u, kb, n0, gb);
#if TN8
    var rb1 = load_b_j(k_begin, 1u, kb, n0, gb);
#endif
    for (var t = 0u; t < ktiles; t++) {
        let bufa = (t & 1u) * TILE_A + ka * BM4 + ga;
        let bufb = (t & 1u) * TILE_B;
        ta[bufa] = ra0;
#if A2
        ta[bufa + A_ROWS * BM4] = ra1;
#endif
#if A4
        ta[bufa + 2u * A_ROWS * BM4] = ra2;
        ta[bufa + 3u * A_ROWS * BM4] = ra3;
#endif
#if WT
        tb[bufb + kb * 16u + gb] = rb0;
#if TN8
        tb[bufb + (kb + 8u) * 16u + gb] = rb1;
#endif
#else
        tb[bufb + kb * 16u + gb] = rb0;
#if TN8
        tb[bufb + kb * 16u + gb + 8u] = rb1;
#endif
#endif
        workgroupBarrier();
        // Prefetch the next K step while this one is multiplied.
        if t + 1u < ktiles {
            let k1 = k_begin + (t + 1u) * BK;
            ra0 = load_a_j(k1, 0u, ka, pix, mask, hi0, wi0);
#if A2
            ra1 = load_a_j(k1, 1u, ka, pix, mask, hi0, wi0);
#endif
#if A4
            ra2 = load_a_j(k1, 2u, ka, pix, mask, hi0, wi0);
            ra3 = load_a_j(k1, 3u, ka, pix, mask, hi0, wi0);
#endif
            rb0 = load_b_j(k1, 0u, kb, n0, gb);
#if TN8
            rb1 = load_b_j(k1, 1u, kb, n0, gb);
#endif
        }
        let ra = (t & 1u) * TILE_A + tm;
        let rb = (t & 1u) * TILE_B + tn;
        for (var kk = 0u; kk < BK; kk++) {
            let b0 = tb[rb + kk * 16u];
            let a0 = ta[ra + kk * BM4];
            c00 = mac(c00, a0, b0);
#if TM8
            let a1 = ta[ra + kk * BM4 + 16u];
            c10 = mac(c10, a1, b0);
#endif
#if TN8
            let b1 = tb[rb + kk * 16u + 8u];
            c01 = mac(c01, a0, b1);
#if TM8
            c11 = mac(c11, a1, b1);
#endif
#endif
        }
    }

    let mt = m0 + tm * 4u;
    let oc = n0 + tn * 4u;
    store_group(mt, oc, c00, split);
#if TM8
    store_group(mt + 64u, oc, c10, split);
#endif
#if TN8
    store_group(mt, oc + 32u, c01, split);
#if TM8
    store_group(mt + 64u, oc + 32u, c11, split);
#endif
#endif
}
#endif

#if REDUCE
// out = sum over splits of the scratch + bias + residual; one thread per output element (vec4 with OVEC).
@compute @workgroup_size(256)
fn conv2d_reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
#if OVEC
    let i = (gid.x + gid.y * nwg.x * 256u) * 4u;
    if i >= p.total {
        return;
    }
    var v = vec4<f32>(0.0);
    for (var s = 0u; s < p.splits; s++) {
        v += scratch[(p.offs[0].x + s * p.total + i) / 4u];
    }
#else
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.total {
        return;
    }
    var v = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        v += scratch[p.offs[0].x + s * p.total + i];
    }
#endif
#if BIAS
    let o = (i / p.hw_out) % p.o;
    v += f32(bias[{{OFF_BIAS}} + o]);
#endif
#if OVEC
#if RES
    v += vec4<f32>(res[({{OFF_RES}} + i) / 4u]);
#endif
    out[(p.offs[0].y + i) / 4u] = VO(v);
#else
#if RES
    v += f32(res[{{OFF_RES}} + i]);
#endif
    out[p.offs[0].y + i] = VO(v);
#endif
}
#endif
