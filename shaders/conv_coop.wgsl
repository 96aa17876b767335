// 2-D convolution over NCHW tensors on cooperative matrices (tensor cores): f16 operands, f32 accumulation.
//   out[n, o, ho, wo] = bias[o] + residual[n, o, ho, wo]
//                     + sum_{c, kh, kw} w[o, c, kh, kw] * x[n, c, ho*S - P + kh, wo*S - P + kw]
// GEMM view: rows are the O output channels (the weights, [O, K] row-major OIHW), columns the N*Ho*Wo
// output pixels of every image (the im2col matrix [K, N*Ho*Wo], never stored: gathered on the fly),
// K = C*KH*KW with k = (c*KH + kh)*KW + kw. Numbering the pixels of all images together keeps the small
// feature maps (8x8, 16x16) from leaving most of a 128-pixel tile empty.
//
// A workgroup computes 128 channels x 128 pixels. With 4 subgroups (128 invocations) subgroup q owns the
// 64 x 64 quadrant (q / 2, q % 2) as 4 x 4 accumulators of 16 x 16; with SG8, 8 subgroups (256
// invocations) each own 32 channels x 64 pixels (rows (q / 2) * 32, columns (q % 2) * 64) as 2 x 4
// accumulators: half the accumulator registers per invocation. Per K step of BK (32; BK64: 64) the
// weight tile (128 x BK, rows of K) and the gathered input tile (BK x 128, rows of pixels) are staged in
// workgroup memory as vec4<f16>, rows padded so that 16-row matrix loads spread over the banks. Each
// invocation stages 4 (ST8: 8) vec4 of each operand per step. Unless NOPREFETCH, the next step's values
// are fetched into registers while this one is multiplied; with NOPREFETCH they are loaded and stored
// after the barrier that ends the step (fewer live registers: what limits these kernels on the H200).
// Values outside the image (padding), past O, past the last pixel or past the K range are zeros. The
// results leave through an f32 staging area so every store is guarded and gets its bias, residual and
// conversion per element.
// With split-K (SPLIT) each workgroup reduces one K range into an f32 scratch [splits, N, O, Ho, Wo]; the
// `conv2d_reduce` entry point of conv.wgsl then adds the ranges, the bias and the residual.
//
// Rules this kernel keeps (shared with matmul_coop.wgsl):
// - control flow around cooperative operations and barriers depends only on the workgroup id and
//   uniforms (the tile, the K range), never on the invocation;
// - offsets are computed in `let`s before each coopLoad/coopStore (naga's SPIR-V writer panics on
//   inline index expressions there);
// - nothing private is indexed by a loop counter (it would live in local memory): the staging
//   registers are a struct of named fields and the 16 (SG8: 8) accumulators named variables;
// - 128 (SG8: 256) invocations are exactly 4 (8) subgroups: the host selects this kernel only with
//   subgroups of 32.
// EMULATE replaces the cooperative matrices by plain f32 FMAs over the same staged tiles (each invocation
// owns 8 of each 16 x 16 accumulator's values), so the gather, the tiling and the epilogue of every
// layout run and are checked on devices without tensor cores; it needs no subgroups. LEAN (with
// EMULATE only) drops the row padding and the staging area (the emulated accumulators go straight to
// `emit`) so that the BK64 tiles fit in 32 KiB of workgroup memory (lavapipe's): the staging loads, the
// K loop and the K-range ends of BK64 are then still checked there, its f32 staging area is not (it
// is the same as BK32's, which is).
//
// Specialisation:
//   TX, TW, TB  element types of x/out/residual, w, bias (f32|f16); operands are rounded to f16 on load
//   KH, KW, S, P  kernel size, stride and top/left padding
//   MASK        KH*KW <= 32: each gathered pixel keeps a bit mask of its in-image kernel taps
//   XVEC        x read as vec4 (1x1, stride 1, no padding, H*W % 4 == 0, offset aligned)
//   VA          w read as vec4 (K % 4 == 0, offset aligned)
//   VO          out, residual and scratch accessed as vec4 (Ho*Wo % 4 == 0, offsets aligned)
//   SG8         8 subgroups of 32 x 64 instead of 4 of 64 x 64 (see above)
//   BK64        K steps of 64 instead of 32 (with SG8 only): twice the work per global round trip and
//               per barrier pair
//   ST8         8 staged vec4 per operand and invocation instead of 4 (set by the host: not SG8, or BK64)
//   NOPREFETCH  no register prefetch of the next K step (see above)
//   EPI4        stage 4 accumulators per subgroup at a time (16 KiB) instead of 1 (4 KiB; SG8: 8 KiB);
//               never with SG8 (32 KiB: over 48 KiB of workgroup memory with the 18.5 KiB of tiles)
//   SPLIT       write f32 partial sums of this workgroup's K range into the scratch
//   BIAS, RES   fused bias / residual at bindings B_BIAS / B_RES, base offsets OFF_BIAS / OFF_RES
//   EMULATE, LEAN  see above
enable f16;
#ifnot EMULATE
enable wgpu_cooperative_matrix;
#endif

struct Params {
    offs: array<vec4<u32>, 2>,
    c: u32, h: u32, w: u32, o: u32,
    wo: u32, hw_out: u32, pixels: u32, k: u32,
    // Channel tiles, tiles per split, workgroups in all, K per split (a multiple of 64).
    tiles_m: u32, tiles: u32, groups: u32, k_split: u32,
    // Elements of one split's output, elements of one input image.
    total: u32, chw: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if XVEC
@group(0) @binding(1) var<storage, read> xin: array<vec4<{{TX}}>>;
#else
@group(0) @binding(1) var<storage, read> xin: array<{{TX}}>;
#endif
#if VA
@group(0) @binding(2) var<storage, read> wgt: array<vec4<{{TW}}>>;
#else
@group(0) @binding(2) var<storage, read> wgt: array<{{TW}}>;
#endif
#if SPLIT
alias TO = f32;
#else
alias TO = {{TX}};
#endif
#if VO
@group(0) @binding(3) var<storage, read_write> out: array<vec4<TO>>;
#else
@group(0) @binding(3) var<storage, read_write> out: array<TO>;
#endif
#if BIAS
@group(0) @binding({{B_BIAS}}) var<storage, read> bias: array<{{TB}}>;
#endif
#if RES
#if VO
@group(0) @binding({{B_RES}}) var<storage, read> res: array<vec4<{{TX}}>>;
#else
@group(0) @binding({{B_RES}}) var<storage, read> res: array<{{TX}}>;
#endif
#endif

#if SG8
const WG = 256u;
const SUBM = 32u; // output channels per subgroup
#else
const WG = 128u;
const SUBM = 64u;
#endif
const NSG = WG / 32u; // subgroups
const MI = SUBM / 16u; // accumulator rows per subgroup
const BM = 128u; // output channels per workgroup
const BN = 128u; // output pixels per workgroup
#if BK64
const BK = 64u;
#else
const BK = 32u;
#endif
const KHW: u32 = {{KH}}u * {{KW}}u;
// Row pitches in vec4<f16>: BK / 4 + 2 (80 bytes for 32-deep weight rows, 144 for 64-deep ones) and 34
// (272 bytes) for the 128-wide pixel rows; each keeps the 16-byte alignment of cooperative loads and
// puts 8 consecutive rows on different banks. LEAN: unpadded.
#if LEAN
const PK = BK / 4u;
const PN = 32u;
#else
const PK = BK / 4u + 2u;
const PN = 34u;
#endif

var<workgroup> ws: array<vec4<f16>, BM * PK>; // ws[o][k / 4]
var<workgroup> xs: array<vec4<f16>, BK * PN>; // xs[k][pixel / 4]

#if EPI4
const EW = 64u; // staged columns per subgroup and round
#else
const EW = 16u;
#endif
#ifnot LEAN
var<workgroup> cs: array<f32, NSG * 16u * EW>;
#endif

// End of this workgroup's K range.
var<private> k_end: u32;
// The 4 pixels this invocation gathers: offset of each kernel window's top-left corner in x (may be
// negative), with MASK the bit mask of in-image taps (bit kh*KW + kw; 0 for pixels past the end), else
// the corner's row and column and whether the pixel exists.
var<private> pix: vec4<i32>;
var<private> mask: vec4<u32>;
var<private> hi0: vec4<i32>;
var<private> wi0: vec4<i32>;

// Four K-consecutive weights w[row, k..k+3], zero outside.
#if VA
fn fetch_w(row: u32, k: u32) -> vec4<f16> {
    // K % 4 == 0 and K-range ends are multiples of 4: the four are all in range or all out.
    if row < p.o && k < k_end {
        return vec4<f16>(wgt[(p.offs[0].y + row * p.k + k) / 4u]);
    }
    return vec4<f16>(0.0);
}
#else
fn w_at(row: u32, k: u32) -> f16 {
    if row < p.o && k < k_end {
        return f16(wgt[p.offs[0].y + row * p.k + k]);
    }
    return f16(0.0);
}

fn fetch_w(row: u32, k: u32) -> vec4<f16> {
    return vec4<f16>(w_at(row, k), w_at(row, k + 1u), w_at(row, k + 2u), w_at(row, k + 3u));
}
#endif

// The im2col values of reduction index k for this invocation's 4 pixels.
#if XVEC
fn gather(k: u32) -> vec4<f16> {
    // 1x1 stride 1: k is the channel and the 4 pixels are contiguous, in one image, 16-byte aligned.
    if k >= k_end || mask.x == 0u {
        return vec4<f16>(0.0);
    }
    return vec4<f16>(xin[(p.offs[0].x + u32(pix.x) + k * p.hw_out) / 4u]);
}
#else
fn tap(corner: i32, bits: u32, r: u32, delta: u32, hi: i32, wi: i32) -> f16 {
#if MASK
    let inside = ((bits >> r) & 1u) != 0u;
#else
    let inside = bits != 0u && hi >= 0 && hi < i32(p.h) && wi >= 0 && wi < i32(p.w);
#endif
    if inside {
        return f16(xin[p.offs[0].x + u32(corner + i32(delta))]);
    }
    return f16(0.0);
}

fn gather(k: u32) -> vec4<f16> {
    if k >= k_end {
        return vec4<f16>(0.0);
    }
    let c = k / KHW;
    let r = k - c * KHW;
    let kh = r / {{KW}}u;
    let kw = r - kh * {{KW}}u;
    // Offset of this tap from the window corner, the same for every pixel.
    let delta = c * p.h * p.w + kh * p.w + kw;
    let hi = hi0 + vec4<i32>(i32(kh));
    let wi = wi0 + vec4<i32>(i32(kw));
    return vec4<f16>(
        tap(pix.x, mask.x, r, delta, hi.x, wi.x),
        tap(pix.y, mask.y, r, delta, hi.y, wi.y),
        tap(pix.z, mask.z, r, delta, hi.z, wi.z),
        tap(pix.w, mask.w, r, delta, hi.w, wi.w),
    );
}
#endif

// Global -> registers for one K step, written out (a loop-indexed private array would live in local
// memory). The weight tile has VPR vec4 per BK-deep row: invocation lid takes column lid % VPR of
// channel rows lid / VPR + RPP i. The input tile has 32 vec4 per 128-pixel row: invocation lid takes
// pixel group lid % 32 (the pixels `locate` prepared) of K rows lid / 32 + KPP i. With i < 4 (ST8: 8)
// that covers both tiles: 4 subgroups stage 8 per operand, 8 subgroups 4 (BK64: 8).
const VPR = BK / 4u;
const RPP = WG / VPR;
const KPP = WG / 32u;
#if ST8
struct Stage {
    v0: vec4<f16>, v1: vec4<f16>, v2: vec4<f16>, v3: vec4<f16>,
    v4: vec4<f16>, v5: vec4<f16>, v6: vec4<f16>, v7: vec4<f16>,
}
#else
struct Stage {
    v0: vec4<f16>, v1: vec4<f16>, v2: vec4<f16>, v3: vec4<f16>,
}
#endif

fn load_w(lid: u32, m0: u32, k0: u32) -> Stage {
    let r = m0 + lid / VPR;
    let k = k0 + (lid % VPR) * 4u;
    return Stage(
        fetch_w(r, k), fetch_w(r + RPP, k), fetch_w(r + 2u * RPP, k), fetch_w(r + 3u * RPP, k),
#if ST8
        fetch_w(r + 4u * RPP, k), fetch_w(r + 5u * RPP, k), fetch_w(r + 6u * RPP, k), fetch_w(r + 7u * RPP, k),
#endif
    );
}

fn store_w(lid: u32, s: Stage) {
    let o = (lid / VPR) * PK + lid % VPR;
    let d = RPP * PK;
    ws[o] = s.v0;
    ws[o + d] = s.v1;
    ws[o + 2u * d] = s.v2;
    ws[o + 3u * d] = s.v3;
#if ST8
    ws[o + 4u * d] = s.v4;
    ws[o + 5u * d] = s.v5;
    ws[o + 6u * d] = s.v6;
    ws[o + 7u * d] = s.v7;
#endif
}

fn load_x(lid: u32, k0: u32) -> Stage {
    let k = k0 + lid / 32u;
    return Stage(
        gather(k), gather(k + KPP), gather(k + 2u * KPP), gather(k + 3u * KPP),
#if ST8
        gather(k + 4u * KPP), gather(k + 5u * KPP), gather(k + 6u * KPP), gather(k + 7u * KPP),
#endif
    );
}

fn store_x(lid: u32, s: Stage) {
    let o = (lid / 32u) * PN + lid % 32u;
    let d = KPP * PN;
    xs[o] = s.v0;
    xs[o + d] = s.v1;
    xs[o + 2u * d] = s.v2;
    xs[o + 3u * d] = s.v3;
#if ST8
    xs[o + 4u * d] = s.v4;
    xs[o + 5u * d] = s.v5;
    xs[o + 6u * d] = s.v6;
    xs[o + 7u * d] = s.v7;
#endif
}

// Per-pixel constants of the 4 pixels starting at `q0` (their images may differ).
fn locate(q0: u32) {
    for (var e = 0u; e < 4u; e++) {
        let q = q0 + e;
        let qq = min(q, p.pixels - 1u);
        let n = qq / p.hw_out;
        let hw = qq - n * p.hw_out;
        let ho = hw / p.wo;
        let wo = hw - ho * p.wo;
        let h0 = i32(ho * {{S}}u) - {{P}};
        let w0 = i32(wo * {{S}}u) - {{P}};
        hi0[e] = h0;
        wi0[e] = w0;
#if XVEC
        pix[e] = i32(n * p.chw + hw);
        mask[e] = u32(q < p.pixels);
#else
        pix[e] = i32(n * p.chw) + h0 * i32(p.w) + w0;
#if MASK
        var bits = 0u;
        for (var r = 0u; r < KHW; r++) {
            let hi = h0 + i32(r / {{KW}}u);
            let wi = w0 + i32(r % {{KW}}u);
            if hi >= 0 && hi < i32(p.h) && wi >= 0 && wi < i32(p.w) {
                bits |= 1u << r;
            }
        }
        mask[e] = select(0u, bits, q < p.pixels);
#else
        mask[e] = u32(q < p.pixels);
#endif
#endif
    }
}

// Stores output channel `o` of the 4 pixels starting at `q` (all < p.pixels with VO). `base` is the
// output's (or this split's scratch) base offset.
fn emit(o: u32, q: u32, acc: vec4<f32>, base: u32) {
    var v = acc;
#if BIAS
    v += vec4<f32>(f32(bias[{{OFF_BIAS}} + o]));
#endif
    let hw = p.hw_out;
#if VO
    // Ho*Wo % 4 == 0: an aligned group of 4 pixels lies in one image and one vec4.
    let n = q / hw;
    let i = n * p.o * hw + o * hw + (q - n * hw);
#if RES
    v += vec4<f32>(res[({{OFF_RES}} + i) / 4u]);
#endif
    out[(base + i) / 4u] = vec4<TO>(v);
#else
    for (var e = 0u; e < 4u; e++) {
        let qe = q + e;
        if qe < p.pixels {
            let n = qe / hw;
            let i = n * p.o * hw + o * hw + (qe - n * hw);
            var r = v[e];
#if RES
            r += f32(res[{{OFF_RES}} + i]);
#endif
            out[base + i] = TO(r);
        }
    }
#endif
}

#ifnot LEAN
// Writes the staged 16 x EW blocks of all subgroups: block q covers channels
// m0 + (q / 2) * SUBM + i * 16 + 0..15 and pixels n0 + (q % 2) * 64 + c0 + 0..EW-1.
fn flush(lid: u32, m0: u32, n0: u32, i: u32, c0: u32, base: u32) {
    let quads = NSG * 16u * EW / 4u;
    for (var e = lid; e < quads; e += WG) {
        let q = e / (16u * EW / 4u);
        let rem = e % (16u * EW / 4u);
        let r = rem / (EW / 4u);
        let c = (rem % (EW / 4u)) * 4u;
        let s = q * 16u * EW + r * EW + c;
        let row = m0 + (q / 2u) * SUBM + i * 16u + r;
        let col = n0 + (q % 2u) * 64u + c0 + c;
        if row < p.o && col < p.pixels {
            emit(row, col, vec4<f32>(cs[s], cs[s + 1u], cs[s + 2u], cs[s + 3u]), base);
        }
    }
}
#endif

#ifnot EMULATE
fn load_wm(i: u32, wm: u32, ks: u32) -> coop_mat16x16<f16, A> {
    let o = (wm * SUBM + i * 16u) * PK + ks * 4u;
    return coopLoadT<coop_mat16x16<f16, A>>(&ws[o], PK);
}

fn load_xm(j: u32, wn: u32, ks: u32) -> coop_mat16x16<f16, B> {
    let o = ks * 16u * PN + (wn * 64u + j * 16u) / 4u;
    return coopLoadT<coop_mat16x16<f16, B>>(&xs[o], PN);
}

// Accumulator -> staging slot j of subgroup q.
fn stage(c: coop_mat16x16<f32, C>, q: u32, j: u32) {
    let o = q * 16u * EW + j * 16u;
    coopStoreT(c, &cs[o], EW);
}

@compute @workgroup_size(WG)
fn conv2d_coop(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
    // Channel tiles vary fastest: the workgroups gathering one pixel tile run together (L2 reuse).
    let split = g / p.tiles;
    let t = g - split * p.tiles;
    let m0 = (t % p.tiles_m) * BM;
    let n0 = (t / p.tiles_m) * BN;
    let k_begin = split * p.k_split;
    let kend = min(k_begin + p.k_split, p.k);
    k_end = kend;
    locate(n0 + (lid % 32u) * 4u);
    let wm = sg / 2u;
    let wn = sg % 2u;

    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
#ifnot SG8
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
#endif

    let ksteps = (kend - k_begin + BK - 1u) / BK;
#if NOPREFETCH
    for (var t = 0u; t < ksteps; t++) {
        let k0 = k_begin + t * BK;
        store_w(lid, load_w(lid, m0, k0));
        store_x(lid, load_x(lid, k0));
        workgroupBarrier();
#else
    var rw = load_w(lid, m0, k_begin);
    var rx = load_x(lid, k_begin);
    for (var t = 0u; t < ksteps; t++) {
        store_w(lid, rw);
        store_x(lid, rx);
        workgroupBarrier();
        // Prefetch the next K step while this one is multiplied.
        if t + 1u < ksteps {
            let k1 = k_begin + (t + 1u) * BK;
            rw = load_w(lid, m0, k1);
            rx = load_x(lid, k1);
        }
#endif
        for (var ks = 0u; ks < BK / 16u; ks++) {
            let a0 = load_wm(0u, wm, ks);
            let a1 = load_wm(1u, wm, ks);
#ifnot SG8
            let a2 = load_wm(2u, wm, ks);
            let a3 = load_wm(3u, wm, ks);
#endif
            let b0 = load_xm(0u, wn, ks);
            let b1 = load_xm(1u, wn, ks);
            let b2 = load_xm(2u, wn, ks);
            let b3 = load_xm(3u, wn, ks);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
#ifnot SG8
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c22 = coopMultiplyAdd(a2, b2, c22);
            c23 = coopMultiplyAdd(a2, b3, c23);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
            c32 = coopMultiplyAdd(a3, b2, c32);
            c33 = coopMultiplyAdd(a3, b3, c33);
#endif
        }
        workgroupBarrier();
    }

    let base = p.offs[0].z + split * p.total;
#if EPI4
    stage(c00, sg, 0u);
    stage(c01, sg, 1u);
    stage(c02, sg, 2u);
    stage(c03, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 0u, 0u, base);
    workgroupBarrier();
    stage(c10, sg, 0u);
    stage(c11, sg, 1u);
    stage(c12, sg, 2u);
    stage(c13, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 1u, 0u, base);
#ifnot SG8
    workgroupBarrier();
    stage(c20, sg, 0u);
    stage(c21, sg, 1u);
    stage(c22, sg, 2u);
    stage(c23, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 2u, 0u, base);
    workgroupBarrier();
    stage(c30, sg, 0u);
    stage(c31, sg, 1u);
    stage(c32, sg, 2u);
    stage(c33, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 3u, 0u, base);
#endif
#else
    stage(c00, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 0u, base); workgroupBarrier();
    stage(c01, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 16u, base); workgroupBarrier();
    stage(c02, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 32u, base); workgroupBarrier();
    stage(c03, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 48u, base); workgroupBarrier();
    stage(c10, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 0u, base); workgroupBarrier();
    stage(c11, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 16u, base); workgroupBarrier();
    stage(c12, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 32u, base); workgroupBarrier();
    stage(c13, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 48u, base);
#ifnot SG8
    workgroupBarrier();
    stage(c20, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 0u, base); workgroupBarrier();
    stage(c21, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 16u, base); workgroupBarrier();
    stage(c22, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 32u, base); workgroupBarrier();
    stage(c23, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 48u, base); workgroupBarrier();
    stage(c30, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 0u, base); workgroupBarrier();
    stage(c31, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 16u, base); workgroupBarrier();
    stage(c32, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 32u, base); workgroupBarrier();
    stage(c33, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 48u, base);
#endif
#endif
}
#else
// Emulated accumulators: invocation lane l = lid % 32 of group q = lid / 32 holds, of accumulator (i, j)
// (i < MI, j < 4) of group q's part of the block, row l / 2 and columns (l % 2) * 8 + 0..7, at
// acc[(i * 4 + j) * 8 + e].
var<private> acc: array<f32, MI * 4u * 8u>;

fn w_el(row: u32, k: u32) -> f32 {
    return f32(ws[row * PK + k / 4u][k % 4u]);
}

fn x_el(k: u32, col: u32) -> f32 {
    return f32(xs[k * PN + col / 4u][col % 4u]);
}

fn emulate_step(lane: u32, wm: u32, wn: u32) {
    for (var kk = 0u; kk < BK; kk++) {
        for (var i = 0u; i < MI; i++) {
            let a = w_el(wm * SUBM + i * 16u + lane / 2u, kk);
            for (var j = 0u; j < 4u; j++) {
                for (var e = 0u; e < 8u; e++) {
                    let b = x_el(kk, wn * 64u + j * 16u + (lane % 2u) * 8u + e);
                    acc[(i * 4u + j) * 8u + e] = fma(a, b, acc[(i * 4u + j) * 8u + e]);
                }
            }
        }
    }
}

#if LEAN
// Accumulator (i, j) straight to memory: row lane / 2 of it, columns (lane % 2) * 8 + 0..7 as two
// groups of 4 (aligned to 4, so with VO each is one vec4 in one image, as in `flush`).
fn emit_emulated(lane: u32, wm: u32, wn: u32, m0: u32, n0: u32, i: u32, j: u32, base: u32) {
    let row = m0 + wm * SUBM + i * 16u + lane / 2u;
    let col = n0 + wn * 64u + j * 16u + (lane % 2u) * 8u;
    let a = (i * 4u + j) * 8u;
    if row < p.o && col < p.pixels {
        emit(row, col, vec4<f32>(acc[a], acc[a + 1u], acc[a + 2u], acc[a + 3u]), base);
    }
    if row < p.o && col + 4u < p.pixels {
        emit(row, col + 4u, vec4<f32>(acc[a + 4u], acc[a + 5u], acc[a + 6u], acc[a + 7u]), base);
    }
}
#else
// Accumulator (i, j) -> staging slot `slot` of group q.
fn stage_emulated(lane: u32, q: u32, i: u32, j: u32, slot: u32) {
    let o = q * 16u * EW + (lane / 2u) * EW + slot * 16u + (lane % 2u) * 8u;
    for (var e = 0u; e < 8u; e++) {
        cs[o + e] = acc[(i * 4u + j) * 8u + e];
    }
}
#endif

@compute @workgroup_size(WG)
fn conv2d_coop(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
    let split = g / p.tiles;
    let t = g - split * p.tiles;
    let m0 = (t % p.tiles_m) * BM;
    let n0 = (t / p.tiles_m) * BN;
    let k_begin = split * p.k_split;
    let kend = min(k_begin + p.k_split, p.k);
    k_end = kend;
    locate(n0 + (lid % 32u) * 4u);
    let sg = lid / 32u;
    let lane = lid % 32u;
    let wm = sg / 2u;
    let wn = sg % 2u;

    let ksteps = (kend - k_begin + BK - 1u) / BK;
#if NOPREFETCH
    for (var t = 0u; t < ksteps; t++) {
        let k0 = k_begin + t * BK;
        store_w(lid, load_w(lid, m0, k0));
        store_x(lid, load_x(lid, k0));
        workgroupBarrier();
#else
    var rw = load_w(lid, m0, k_begin);
    var rx = load_x(lid, k_begin);
    for (var t = 0u; t < ksteps; t++) {
        store_w(lid, rw);
        store_x(lid, rx);
        workgroupBarrier();
        if t + 1u < ksteps {
            let k1 = k_begin + (t + 1u) * BK;
            rw = load_w(lid, m0, k1);
            rx = load_x(lid, k1);
        }
#endif
        emulate_step(lane, wm, wn);
        workgroupBarrier();
    }

    let base = p.offs[0].z + split * p.total;
    for (var i = 0u; i < MI; i++) {
#if LEAN
        for (var j = 0u; j < 4u; j++) {
            emit_emulated(lane, wm, wn, m0, n0, i, j, base);
        }
#else
#if EPI4
        for (var j = 0u; j < 4u; j++) {
            stage_emulated(lane, sg, i, j, j);
        }
        workgroupBarrier();
        flush(lid, m0, n0, i, 0u, base);
        workgroupBarrier();
#else
        for (var j = 0u; j < 4u; j++) {
            stage_emulated(lane, sg, i, j, 0u);
            workgroupBarrier();
            flush(lid, m0, n0, i, j * 16u, base);
            workgroupBarrier();
        }
#endif
#endif
    }
}
#endif
