// 2-D convolution over NCHW tensors as an implicit GEMM:
//   out[n, o, ho, wo] = bias[o] + residual[n, o, ho, wo]
//                     + sum_{c, kh, kw} x[n, c, ho*S - P + kh, wo*S - P + kw] * w[o, c, kh, kw]
// GEMM view: M = N*Ho*Wo output pixels, N = O output channels, K = C*KH*KW (k = (c*KH + kh)*KW + kw).
// A workgroup of 256 threads computes a BM x 64 (pixel x channel) tile. Each K step gathers the
// 16 x BM input patch and the 16 x 64 weight slice into workgroup memory on the fly (no im2col buffer),
// prefetching the next step's values into registers while the current step is multiplied; each thread
// accumulates TM pixels x 4 channels in f32 registers.
// Specialisation:
//   TX, TW, TB  element types of x/out/residual, w, bias (f32|f16); F16 when any of them is f16
//   KH, KW, S, P  kernel size, stride and top/left padding (compile-time: index math becomes mul/shift)
//   TM8         8 pixels per thread (128 x 64 tiles) instead of 4 (64 x 64 tiles)
//   WT          w stored [K, O] (Layout::Transposed) instead of [O, K] (row-major OIHW)
//   WVEC        w read as vec4 (WT, O % 4 == 0, offset aligned)
//   XVEC        x read as vec4 (1x1, stride 1, no padding, H*W % 4 == 0, offset aligned)
//   OVEC        out (and residual) accessed as vec4 (Ho*Wo % 4 == 0, offsets aligned)
//   BIAS, RES   fused bias / residual, bound at B_BIAS / B_RES with base offsets OFF_BIAS / OFF_RES
#if F16
enable f16;
#endif

struct Params {
    offs: array<vec4<u32>, 2>,
    batch: u32, c: u32, h: u32, w: u32,
    o: u32, ho: u32, wo: u32, m: u32,
    k: u32, tiles_n: u32, tiles: u32, hw_out: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
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
#if OVEC
@group(0) @binding(3) var<storage, read_write> out: array<vec4<{{TX}}>>;
#else
@group(0) @binding(3) var<storage, read_write> out: array<{{TX}}>;
#endif
#if BIAS
@group(0) @binding({{B_BIAS}}) var<storage, read> bias: array<{{TB}}>;
#endif
#if RES
#if OVEC
@group(0) @binding({{B_RES}}) var<storage, read> res: array<vec4<{{TX}}>>;
#else
@group(0) @binding({{B_RES}}) var<storage, read> res: array<{{TX}}>;
#endif
#endif

#if TM8
const BM4: u32 = 32u; // vec4 pixel groups per K row of the A tile (BM = 128)
#else
const BM4: u32 = 16u; // BM = 64
#endif
const BK: u32 = 16u;
const KHW: u32 = {{KH}}u * {{KW}}u;
const ROWS_PER_PASS: u32 = 256u / BM4;

// A tile [k][pixel] and B tile [k][channel], 4 pixels / channels per vec4, in f32 whatever the io type.
var<workgroup> ta: array<vec4<f32>, BK * BM4>;
var<workgroup> tb: array<vec4<f32>, BK * 16u>;

#ifnot XVEC
// The input patch value of one pixel (precomputed base offset of its image and top-left input corner)
// for the kernel tap (kh, kw) of channel offset `cof`; zero outside the image (padding) or past M.
fn tap(ok: bool, base: u32, hi0: i32, wi0: i32, cof: u32, kh: u32, kw: u32) -> f32 {
    let hi = hi0 + i32(kh);
    let wi = wi0 + i32(kw);
    if ok && hi >= 0 && hi < i32(p.h) && wi >= 0 && wi < i32(p.w) {
        return f32(x[p.offs[0].x + base + cof + u32(hi) * p.w + u32(wi)]);
    }
    return 0.0;
}
#endif

// Four consecutive pixels' values for reduction index k.
fn load_a(k: u32, ok: vec4<bool>, base: vec4<u32>, hi0: vec4<i32>, wi0: vec4<i32>) -> vec4<f32> {
    if k >= p.k {
        return vec4<f32>(0.0);
    }
#if XVEC
    // 1x1 stride 1: k is the channel and the 4 pixels are contiguous and 16-byte aligned.
    if !ok.x {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(x[(p.offs[0].x + base.x + k * p.h * p.w) / 4u]);
#else
    let c = k / KHW;
    let r = k - c * KHW;
    let kh = r / {{KW}}u;
    let kw = r - kh * {{KW}}u;
    let cof = c * p.h * p.w;
    return vec4<f32>(
        tap(ok.x, base.x, hi0.x, wi0.x, cof, kh, kw),
        tap(ok.y, base.y, hi0.y, wi0.y, cof, kh, kw),
        tap(ok.z, base.z, hi0.z, wi0.z, cof, kh, kw),
        tap(ok.w, base.w, hi0.w, wi0.w, cof, kh, kw),
    );
#endif
}

// Weights w[o .. o+4, k] (zero past O or K).
fn load_b(k: u32, o: u32) -> vec4<f32> {
    if k >= p.k {
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

// Adds bias and residual to the 4 pixels starting at `m` of channel `o` and stores them.
fn store_ch(m: u32, o: u32, acc: vec4<f32>) {
    if o >= p.o || m >= p.m {
        return;
    }
    var v = acc;
#if BIAS
    v += vec4<f32>(f32(bias[{{OFF_BIAS}} + o]));
#endif
    let hw = p.hw_out;
#if OVEC
    // Ho*Wo % 4 == 0, so an aligned group of 4 pixels lies in one image and one vec4.
    let n = m / hw;
    let i = n * p.o * hw + o * hw + (m - n * hw);
#if RES
    v += vec4<f32>(res[({{OFF_RES}} + i) / 4u]);
#endif
    out[(p.offs[0].z + i) / 4u] = vec4<{{TX}}>(v);
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
            out[p.offs[0].z + i] = {{TX}}(r);
        }
    }
#endif
}

// Stores a group of 4 pixels x 4 channels: c<e> holds pixel e's 4 channels.
fn store_group(m: u32, o: u32, c0: vec4<f32>, c1: vec4<f32>, c2: vec4<f32>, c3: vec4<f32>) {
    store_ch(m, o, vec4<f32>(c0.x, c1.x, c2.x, c3.x));
    store_ch(m, o + 1u, vec4<f32>(c0.y, c1.y, c2.y, c3.y));
    store_ch(m, o + 2u, vec4<f32>(c0.z, c1.z, c2.z, c3.z));
    store_ch(m, o + 3u, vec4<f32>(c0.w, c1.w, c2.w, c3.w));
}

@compute @workgroup_size(256)
fn conv2d(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let tile = wid.x + wid.y * nwg.x;
    if tile >= p.tiles {
        return;
    }
    // Channel tiles vary fastest: the workgroups sharing one input patch run together (L2 reuse).
    let n0 = (tile % p.tiles_n) * 64u;
    let m0 = (tile / p.tiles_n) * (BM4 * 4u);

    // Loader roles: this thread gathers pixel group `ga` (4 pixels) for K rows ka, ka + ROWS_PER_PASS..,
    // and the 4 weights of channel group `gb` for one K row `kb`.
    let ga = li % BM4;
    let ka = li / BM4;
#if WT
    let gb = li % 16u;
    let kb = li / 16u;
#else
    let gb = li / 16u; // row-major w: neighbouring threads read neighbouring k
    let kb = li % 16u;
#endif
    let ob = n0 + gb * 4u;

    // Per-pixel constants of the gathered group: image base offset, top-left input corner, in range.
    var ok: vec4<bool>;
    var base: vec4<u32>;
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
        ok[e] = m < p.m;
#if XVEC
        base[e] = n * chw + hw;
#else
        base[e] = n * chw;
#endif
        hi0[e] = i32(ho * {{S}}u) - {{P}};
        wi0[e] = i32(wo * {{S}}u) - {{P}};
    }

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
#if TM8
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
#endif

    // Thread's compute role: pixel group tm (and tm + 16), channel group tn.
    let tm = li % 16u;
    let tn = li / 16u;

    let ktiles = (p.k + BK - 1u) / BK;
    var ra0 = load_a(ka, ok, base, hi0, wi0);
#if TM8
    var ra1 = load_a(ka + ROWS_PER_PASS, ok, base, hi0, wi0);
#endif
    var rb = load_b(kb, ob);
    for (var t = 0u; t < ktiles; t++) {
        ta[ka * BM4 + ga] = ra0;
#if TM8
        ta[(ka + ROWS_PER_PASS) * BM4 + ga] = ra1;
#endif
        tb[kb * 16u + gb] = rb;
        workgroupBarrier();
        // Prefetch the next K step while this one is multiplied.
        let k1 = (t + 1u) * BK;
        if t + 1u < ktiles {
            ra0 = load_a(k1 + ka, ok, base, hi0, wi0);
#if TM8
            ra1 = load_a(k1 + ka + ROWS_PER_PASS, ok, base, hi0, wi0);
#endif
            rb = load_b(k1 + kb, ob);
        }
        for (var kk = 0u; kk < BK; kk++) {
            let b = tb[kk * 16u + tn];
            let a0 = ta[kk * BM4 + tm];
            acc0 = fma(vec4<f32>(a0.x), b, acc0);
            acc1 = fma(vec4<f32>(a0.y), b, acc1);
            acc2 = fma(vec4<f32>(a0.z), b, acc2);
            acc3 = fma(vec4<f32>(a0.w), b, acc3);
#if TM8
            let a1 = ta[kk * BM4 + 16u + tm];
            acc4 = fma(vec4<f32>(a1.x), b, acc4);
            acc5 = fma(vec4<f32>(a1.y), b, acc5);
            acc6 = fma(vec4<f32>(a1.z), b, acc6);
            acc7 = fma(vec4<f32>(a1.w), b, acc7);
#endif
        }
        workgroupBarrier();
    }

    let oc = n0 + tn * 4u;
    store_group(m0 + tm * 4u, oc, acc0, acc1, acc2, acc3);
#if TM8
    store_group(m0 + 64u + tm * 4u, oc, acc4, acc5, acc6, acc7);
#endif
}
