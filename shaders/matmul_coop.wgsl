// Matrix multiplication on cooperative matrices (tensor cores): f16 inputs, f32 accumulation.
//   out[b, m, col0 + n] = sum_k a[b, m, k] * B(b, k, n) (+ bias[col0 + n])
// with B(b, k, n) = b[b, k, n] or, with TRANS_B, b[b, n, k].
// A workgroup of 4 subgroups computes a 128 x 128 block; subgroup q owns the 64 x 64 quadrant
// (q / 2, q % 2) as 4 x 4 accumulators of 16 x 16. Per K step of 32, the A (128 x 32) and B (32 x 128)
// tiles are staged in workgroup memory as vec4<f16> (rows padded so the 16-row matrix loads hit
// distinct banks); the next step's tiles are fetched into registers while this one is multiplied.
// Edge tiles load zeros; the results go out through a small f32 staging area in workgroup memory so
// stores are guarded, converted and biased per element (or straight to memory for interior tiles
// when DIRECT: f32 output, no bias, aligned).
//
// Cooperative operations need uniform control flow across the subgroup: every branch around them
// depends only on the workgroup id and uniforms. Offsets are computed in `let`s before each
// coopLoad/coopStore (naga's SPIR-V writer panics on inline index expressions there).
//
// wgpu compiles every WGSL loop with an iteration guard (naga's loop bounding) that keeps drivers
// from unrolling it, so the staging registers are a struct of named fields and the 16 accumulators
// named variables: nothing private is indexed by a loop counter (that would live in local memory).
// The host selects this kernel only with subgroups of 32 (128 invocations = 4 subgroups).
//
// SG8: 8 subgroups (256 invocations), each 32 x 64 of the same 128 x 128 block: half the accumulators
// per invocation (register pressure), never with EPI4. BK64 (with SG8 only): K steps of 64, twice the
// work per global-load round trip and per barrier pair. ST8 (set by the host: not SG8, or BK64): 8
// staged vec4 per operand and invocation instead of 4.
// Split K (kernels/matmul_splitk.rs): batch entry z is slice z of K; p.k is the slice's length and
// p.lda a's row stride (the whole K).
// GLU (with TRANS_B, no BIAS, no DIRECT): b stacks gate rows [0, p.half) over up rows [p.half, 2 p.half)
// and out[m, j] = silu(gate_j) * up_j. Block column y takes gate rows 64 y .. 64 y + 63 as its left 64
// columns and the matching up rows as its right 64, so each subgroup pair (wn = 0, 1) holds both
// factors of 64 output columns; the epilogue combines them from the staging area.
// Specialisation: TO (output scalar), TB (bias scalar), TRANS_B, BIAS,
// VA / VB (operand read as vec4<f16>), VO (vec4 output stores), DIRECT, EPI4 (stage 4 accumulators
// per subgroup at a time: 16 KiB; else 1: 4 KiB). DIRECT binds the output as scalars (no VO).
// NOPAD and NOPREFETCH (off in the builder) switch off the row padding and the register prefetch, for
// A/B timing on the target GPU (bench_matmul).
enable f16;
enable wgpu_cooperative_matrix;

struct Params {
    off_a: u32, off_b: u32, off_out: u32, off_bias: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    m: u32, n: u32, k: u32, tiles_m: u32,
    tiles_n: u32, groups: u32, a_bs: u32, b_bs: u32,
    out_bs: u32, ldo: u32, col0: u32, ldb: u32,
    trans_b: u32, lda: u32, half: u32, p23: u32, // trans_b: the tiled kernel's; lda: a's row stride; half: GLU's
}

@group(0) @binding(0) var<uniform> p: Params;
#if VA
@group(0) @binding(1) var<storage, read> ma: array<vec4<f16>>;
#else
@group(0) @binding(1) var<storage, read> ma: array<f16>;
#endif
#if VB
@group(0) @binding(2) var<storage, read> mb: array<vec4<f16>>;
#else
@group(0) @binding(2) var<storage, read> mb: array<f16>;
#endif
#if VO
@group(0) @binding(3) var<storage, read_write> mo: array<vec4<{{TO}}>>;
#else
@group(0) @binding(3) var<storage, read_write> mo: array<{{TO}}>;
#endif
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<{{TB}}>;
#endif

#if SG8
const WG = 256u; // 8 subgroups of 32, each owning 32 x 64 of the block
const SUBM = 32u;
#else
const WG = 128u; // 4 subgroups of 32, each owning 64 x 64 of the block
const SUBM = 64u;
#endif
const NSG = WG / 32u;
const BM = 128u;
const BN = 128u;
#if BK64
const BK = 64u;
#else
const BK = 32u;
#endif
const GROUP_M = 8u;
// Row pitches in vec4<f16> (8 bytes): 10 = 80 bytes for 32-deep rows, 34 = 272 bytes for 128-wide
// rows. Both keep the 16-byte alignment cooperative loads need and spread 8 consecutive rows over all
// 32 banks.
// With BK64 rows are 64 deep: 16 vec4 + 2 of padding (144 bytes, again 8 rows over all banks).
#if NOPAD
const PK = BK / 4u;
const PN = 32u;
#else
const PK = BK / 4u + 2u;
const PN = 34u;
#endif

var<workgroup> As: array<vec4<f16>, BM * PK>; // As[m][k / 4]
#if TRANS_B
var<workgroup> Bs: array<vec4<f16>, BN * PK>; // Bs[n][k / 4]
#else
var<workgroup> Bs: array<vec4<f16>, BK * PN>; // Bs[k][n / 4]
#endif

#if EPI4
const EW = 64u; // staged columns per subgroup and round
#else
const EW = 16u;
#endif
var<workgroup> Cs: array<f32, NSG * 16u * EW>;

fn tile_of(g: u32) -> vec3<u32> {
    let per_batch = p.tiles_m * p.tiles_n;
    let bt = g / per_batch;
    let t = g % per_batch;
    let group = GROUP_M * p.tiles_n;
    let first = (t / group) * GROUP_M;
    let rows = min(p.tiles_m - first, GROUP_M);
    return vec3<u32>(first + (t % group) % rows, (t % group) / rows, bt);
}

// Four consecutive K-contiguous elements (row, k..k+3) of a [rows, K] operand, zero outside.
#if VA
fn fetch_a(base: u32, row: u32, k: u32) -> vec4<f16> {
    if row < p.m && k < p.k {
        return ma[(base + row * p.lda + k) / 4u];
    }
    return vec4<f16>(0.0);
}
#else
fn a_at(base: u32, row: u32, k: u32) -> f16 {
    if row < p.m && k < p.k {
        return ma[base + row * p.lda + k];
    }
    return f16(0.0);
}

fn fetch_a(base: u32, row: u32, k: u32) -> vec4<f16> {
    return vec4<f16>(a_at(base, row, k), a_at(base, row, k + 1u), a_at(base, row, k + 2u), a_at(base, row, k + 3u));
}
#endif

#if TRANS_B
#if VB
fn fetch_b(base: u32, row: u32, k: u32) -> vec4<f16> {
    if row < p.n && k < p.k {
        return mb[(base + row * p.ldb + k) / 4u];
    }
    return vec4<f16>(0.0);
}
#else
fn b_at(base: u32, row: u32, k: u32) -> f16 {
    if row < p.n && k < p.k {
        return mb[base + row * p.ldb + k];
    }
    return f16(0.0);
}

fn fetch_b(base: u32, row: u32, k: u32) -> vec4<f16> {
    return vec4<f16>(b_at(base, row, k), b_at(base, row, k + 1u), b_at(base, row, k + 2u), b_at(base, row, k + 3u));
}
#endif
#else
// Four consecutive columns (k, col..col+3) of a [K, N] operand.
#if VB
fn fetch_b(base: u32, k: u32, col: u32) -> vec4<f16> {
    if k < p.k && col < p.n {
        return mb[(base + k * p.ldb + col) / 4u];
    }
    return vec4<f16>(0.0);
}
#else
fn b_at(base: u32, k: u32, col: u32) -> f16 {
    if k < p.k && col < p.n {
        return mb[base + k * p.ldb + col];
    }
    return f16(0.0);
}

fn fetch_b(base: u32, k: u32, col: u32) -> vec4<f16> {
    return vec4<f16>(b_at(base, k, col), b_at(base, k, col + 1u), b_at(base, k, col + 2u), b_at(base, k, col + 3u));
}
#endif
#endif

// Global -> registers for one K step, NST vec4 per operand and invocation (written out: a
// loop-indexed private array would live in local memory). A [rows, K] tile is VPR vec4 per row and
// one pass of the workgroup stages RPP rows; a [K, 128] tile (B not transposed) is 32 vec4 per row and
// a pass stages KPP rows.
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

fn load_a(lid: u32, m0: u32, k0: u32, base: u32) -> Stage {
    let r = m0 + lid / VPR;
    let k = k0 + (lid % VPR) * 4u;
    return Stage(
        fetch_a(base, r, k), fetch_a(base, r + RPP, k), fetch_a(base, r + 2u * RPP, k), fetch_a(base, r + 3u * RPP, k),
#if ST8
        fetch_a(base, r + 4u * RPP, k), fetch_a(base, r + 5u * RPP, k), fetch_a(base, r + 6u * RPP, k), fetch_a(base, r + 7u * RPP, k),
#endif
    );
}

// A (and B when transposed) in rows of PK vec4.
fn store_a(lid: u32, s: Stage) {
    let o = (lid / VPR) * PK + lid % VPR;
    let d = RPP * PK;
    As[o] = s.v0;
    As[o + d] = s.v1;
    As[o + 2u * d] = s.v2;
    As[o + 3u * d] = s.v3;
#if ST8
    As[o + 4u * d] = s.v4;
    As[o + 5u * d] = s.v5;
    As[o + 6u * d] = s.v6;
    As[o + 7u * d] = s.v7;
#endif
}

#if TRANS_B
// Weight row of the block's B row lr (0..127).
#if GLU
fn brow(n0: u32, lr: u32) -> u32 {
    return n0 / 2u + select(lr, p.half + lr - 64u, lr >= 64u);
}
#else
fn brow(n0: u32, lr: u32) -> u32 {
    return n0 + lr;
}
#endif

fn load_b(lid: u32, n0: u32, k0: u32, base: u32) -> Stage {
    let r = lid / VPR;
    let k = k0 + (lid % VPR) * 4u;
    return Stage(
        fetch_b(base, brow(n0, r), k), fetch_b(base, brow(n0, r + RPP), k),
        fetch_b(base, brow(n0, r + 2u * RPP), k), fetch_b(base, brow(n0, r + 3u * RPP), k),
#if ST8
        fetch_b(base, brow(n0, r + 4u * RPP), k), fetch_b(base, brow(n0, r + 5u * RPP), k),
        fetch_b(base, brow(n0, r + 6u * RPP), k), fetch_b(base, brow(n0, r + 7u * RPP), k),
#endif
    );
}

fn store_b(lid: u32, s: Stage) {
    let o = (lid / VPR) * PK + lid % VPR;
    let d = RPP * PK;
    Bs[o] = s.v0;
    Bs[o + d] = s.v1;
    Bs[o + 2u * d] = s.v2;
    Bs[o + 3u * d] = s.v3;
#if ST8
    Bs[o + 4u * d] = s.v4;
    Bs[o + 5u * d] = s.v5;
    Bs[o + 6u * d] = s.v6;
    Bs[o + 7u * d] = s.v7;
#endif
}
#else
fn load_b(lid: u32, n0: u32, k0: u32, base: u32) -> Stage {
    let k = k0 + lid / 32u;
    let c = n0 + (lid % 32u) * 4u;
    return Stage(
        fetch_b(base, k, c), fetch_b(base, k + KPP, c), fetch_b(base, k + 2u * KPP, c), fetch_b(base, k + 3u * KPP, c),
#if ST8
        fetch_b(base, k + 4u * KPP, c), fetch_b(base, k + 5u * KPP, c), fetch_b(base, k + 6u * KPP, c), fetch_b(base, k + 7u * KPP, c),
#endif
    );
}

fn store_b(lid: u32, s: Stage) {
    let o = (lid / 32u) * PN + lid % 32u;
    let d = KPP * PN;
    Bs[o] = s.v0;
    Bs[o + d] = s.v1;
    Bs[o + 2u * d] = s.v2;
    Bs[o + 3u * d] = s.v3;
#if ST8
    Bs[o + 4u * d] = s.v4;
    Bs[o + 5u * d] = s.v5;
    Bs[o + 6u * d] = s.v6;
    Bs[o + 7u * d] = s.v7;
#endif
}
#endif

fn load_am(i: u32, wm: u32, ks: u32) -> coop_mat16x16<f16, A> {
    let o = (wm * SUBM + i * 16u) * PK + ks * 4u;
    return coopLoadT<coop_mat16x16<f16, A>>(&As[o], PK);
}

fn load_bm(j: u32, wn: u32, ks: u32) -> coop_mat16x16<f16, B> {
#if TRANS_B
    // Bs holds B^T row-major, that is B column-major.
    let o = (wn * 64u + j * 16u) * PK + ks * 4u;
    return coopLoad<coop_mat16x16<f16, B>>(&Bs[o], PK);
#else
    let o = ks * 16u * PN + (wn * 64u + j * 16u) / 4u;
    return coopLoadT<coop_mat16x16<f16, B>>(&Bs[o], PN);
#endif
}

fn stage(c: coop_mat16x16<f32, C>, q: u32, j: u32) {
    let o = q * 16u * EW + j * 16u;
    coopStoreT(c, &Cs[o], EW);
}

#if BIAS
fn bias_at(col: u32) -> f32 {
    if col < p.n {
        return f32(bias[p.off_bias + p.col0 + col]);
    }
    return 0.0;
}
#endif

#if GLU
fn silu(g: vec4<f32>) -> vec4<f32> {
    return g / (vec4<f32>(1.0) + exp(-g));
}

// GLU: block q (wn = 0) holds gate and block q + 1 up of the same rows and of output columns
// n0 / 2 + c0 + 0..EW-1 (n0 / 2: 64 output columns per block column).
fn flush(lid: u32, m0: u32, n0: u32, i: u32, c0: u32, o_base: u32) {
    let per = 16u * EW / 4u;
    let quads = (NSG / 2u) * per;
    for (var e = lid; e < quads; e += WG) {
        let q = 2u * (e / per);
        let rem = e % per;
        let r = rem / (EW / 4u);
        let c = (rem % (EW / 4u)) * 4u;
        let s = q * 16u * EW + r * EW + c;
        let u = s + 16u * EW;
        let g = vec4<f32>(Cs[s], Cs[s + 1u], Cs[s + 2u], Cs[s + 3u]);
        let v = silu(g) * vec4<f32>(Cs[u], Cs[u + 1u], Cs[u + 2u], Cs[u + 3u]);
        let row = m0 + (q / 2u) * SUBM + i * 16u + r;
        let col = n0 / 2u + c0 + c;
        if row < p.m {
            let ob = o_base + row * p.ldo + col;
#if VO
            if col < p.half {
                mo[ob / 4u] = vec4<{{TO}}>(v);
            }
#else
            if col < p.half {
                mo[ob] = {{TO}}(v.x);
            }
            if col + 1u < p.half {
                mo[ob + 1u] = {{TO}}(v.y);
            }
            if col + 2u < p.half {
                mo[ob + 2u] = {{TO}}(v.z);
            }
            if col + 3u < p.half {
                mo[ob + 3u] = {{TO}}(v.w);
            }
#endif
        }
    }
}
#else
// Writes the staged 16 x EW blocks of all subgroups: block q covers rows
// m0 + (q / 2) * SUBM + i * 16 + 0..15 and columns n0 + (q % 2) * 64 + c0 + 0..EW-1.
fn flush(lid: u32, m0: u32, n0: u32, i: u32, c0: u32, o_base: u32) {
    let quads = NSG * 16u * EW / 4u;
    for (var e = lid; e < quads; e += WG) {
        let q = e / (16u * EW / 4u);
        let rem = e % (16u * EW / 4u);
        let r = rem / (EW / 4u);
        let c = (rem % (EW / 4u)) * 4u;
        let s = q * 16u * EW + r * EW + c;
        var v = vec4<f32>(Cs[s], Cs[s + 1u], Cs[s + 2u], Cs[s + 3u]);
        let row = m0 + (q / 2u) * SUBM + i * 16u + r;
        let col = n0 + (q % 2u) * 64u + c0 + c;
        if row < p.m {
#if BIAS
            v += vec4<f32>(bias_at(col), bias_at(col + 1u), bias_at(col + 2u), bias_at(col + 3u));
#endif
            let ob = o_base + row * p.ldo + col;
#if VO
            if col < p.n {
                mo[ob / 4u] = vec4<{{TO}}>(v);
            }
#else
            if col < p.n {
                mo[ob] = {{TO}}(v.x);
            }
            if col + 1u < p.n {
                mo[ob + 1u] = {{TO}}(v.y);
            }
            if col + 2u < p.n {
                mo[ob + 2u] = {{TO}}(v.z);
            }
            if col + 3u < p.n {
                mo[ob + 3u] = {{TO}}(v.w);
            }
#endif
        }
    }
}

#endif

@compute @workgroup_size(WG)
fn matmul_coop(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if g >= p.groups {
        return;
    }
    let tile = tile_of(g);
    let m0 = tile.x * BM;
    let n0 = tile.y * BN;
    let a_base = p.off_a + tile.z * p.a_bs;
    let b_base = p.off_b + tile.z * p.b_bs;
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

    let ksteps = (p.k + BK - 1u) / BK;
#if NOPREFETCH
    for (var t = 0u; t < ksteps; t++) {
        store_a(lid, load_a(lid, m0, t * BK, a_base));
        store_b(lid, load_b(lid, n0, t * BK, b_base));
        workgroupBarrier();
#else
    var ra = load_a(lid, m0, 0u, a_base);
    var rb = load_b(lid, n0, 0u, b_base);
    for (var t = 0u; t < ksteps; t++) {
        store_a(lid, ra);
        store_b(lid, rb);
        workgroupBarrier();
        if t + 1u < ksteps {
            ra = load_a(lid, m0, (t + 1u) * BK, a_base);
            rb = load_b(lid, n0, (t + 1u) * BK, b_base);
        }
#endif
        for (var ks = 0u; ks < BK / 16u; ks++) {
            let a0 = load_am(0u, wm, ks);
            let a1 = load_am(1u, wm, ks);
#ifnot SG8
            let a2 = load_am(2u, wm, ks);
            let a3 = load_am(3u, wm, ks);
#endif
            let b0 = load_bm(0u, wn, ks);
            let b1 = load_bm(1u, wn, ks);
            let b2 = load_bm(2u, wn, ks);
            let b3 = load_bm(3u, wn, ks);
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

    let o_base = p.off_out + tile.z * p.out_bs + p.col0;
#if DIRECT
    if m0 + BM <= p.m && n0 + BN <= p.n {
        // Interior tile: accumulators straight to memory (f32, 16-byte aligned rows).
        let ld = p.ldo; // the stride too must be a named value (naga caches only those)
        let r0 = o_base + (m0 + wm * SUBM) * ld + n0 + wn * 64u;
        let s = 16u * ld;
        let o00 = r0;
        coopStoreT(c00, &mo[o00], ld);
        let o01 = r0 + 16u;
        coopStoreT(c01, &mo[o01], ld);
        let o02 = r0 + 32u;
        coopStoreT(c02, &mo[o02], ld);
        let o03 = r0 + 48u;
        coopStoreT(c03, &mo[o03], ld);
        let o10 = r0 + s;
        coopStoreT(c10, &mo[o10], ld);
        let o11 = r0 + s + 16u;
        coopStoreT(c11, &mo[o11], ld);
        let o12 = r0 + s + 32u;
        coopStoreT(c12, &mo[o12], ld);
        let o13 = r0 + s + 48u;
        coopStoreT(c13, &mo[o13], ld);
#ifnot SG8
        let o20 = r0 + 2u * s;
        coopStoreT(c20, &mo[o20], ld);
        let o21 = r0 + 2u * s + 16u;
        coopStoreT(c21, &mo[o21], ld);
        let o22 = r0 + 2u * s + 32u;
        coopStoreT(c22, &mo[o22], ld);
        let o23 = r0 + 2u * s + 48u;
        coopStoreT(c23, &mo[o23], ld);
        let o30 = r0 + 3u * s;
        coopStoreT(c30, &mo[o30], ld);
        let o31 = r0 + 3u * s + 16u;
        coopStoreT(c31, &mo[o31], ld);
        let o32 = r0 + 3u * s + 32u;
        coopStoreT(c32, &mo[o32], ld);
        let o33 = r0 + 3u * s + 48u;
        coopStoreT(c33, &mo[o33], ld);
#endif
        return;
    }
#endif
#if EPI4
    stage(c00, sg, 0u);
    stage(c01, sg, 1u);
    stage(c02, sg, 2u);
    stage(c03, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 0u, 0u, o_base);
    workgroupBarrier();
    stage(c10, sg, 0u);
    stage(c11, sg, 1u);
    stage(c12, sg, 2u);
    stage(c13, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 1u, 0u, o_base);
    workgroupBarrier();
    stage(c20, sg, 0u);
    stage(c21, sg, 1u);
    stage(c22, sg, 2u);
    stage(c23, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 2u, 0u, o_base);
    workgroupBarrier();
    stage(c30, sg, 0u);
    stage(c31, sg, 1u);
    stage(c32, sg, 2u);
    stage(c33, sg, 3u);
    workgroupBarrier();
    flush(lid, m0, n0, 3u, 0u, o_base);
#else
    stage(c00, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 0u, o_base); workgroupBarrier();
    stage(c01, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 16u, o_base); workgroupBarrier();
    stage(c02, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 32u, o_base); workgroupBarrier();
    stage(c03, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 0u, 48u, o_base); workgroupBarrier();
    stage(c10, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 0u, o_base); workgroupBarrier();
    stage(c11, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 16u, o_base); workgroupBarrier();
    stage(c12, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 32u, o_base); workgroupBarrier();
    stage(c13, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 1u, 48u, o_base);
#ifnot SG8
    workgroupBarrier();
    stage(c20, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 0u, o_base); workgroupBarrier();
    stage(c21, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 16u, o_base); workgroupBarrier();
    stage(c22, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 32u, o_base); workgroupBarrier();
    stage(c23, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 2u, 48u, o_base); workgroupBarrier();
    stage(c30, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 0u, o_base); workgroupBarrier();
    stage(c31, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 16u, o_base); workgroupBarrier();
    stage(c32, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 32u, o_base); workgroupBarrier();
    stage(c33, sg, 0u); workgroupBarrier(); flush(lid, m0, n0, 3u, 48u, o_base);
#endif
#endif
}
