// Tiled matrix multiplication, portable (no subgroups, no cooperative matrices):
//   out[b, m, col0 + n] = sum_k a[b, m, k] * B(b, k, n) (+ bias[col0 + n]),   accumulation in f32,
// where B(b, k, n) = b[b, k, n] or, with trans_b, b[b, n, k] (the nn.Linear weight layout).
// A workgroup of 16x16 threads computes a BM x BN = 16R x 16R block of `out`; each thread holds R x R
// outputs (rows h*64 + ty*4 + i, columns g*64 + tx*4 + j), so its workgroup-memory reads are vec4s that
// neighbouring threads share or read from consecutive addresses. Tiles of A and B (BK = 16 deep) go
// through workgroup memory as f32; the next tile is fetched into registers while the current one is
// multiplied (global latency hidden behind the FMAs). Out-of-range elements load as zeros.
//
// wgpu compiles every WGSL loop with an iteration guard (naga's loop bounding), which keeps drivers
// from unrolling it, so private arrays here are only ever indexed by constants (an array indexed by a
// loop counter would live in slow local memory); the per-thread work is written out for R = 4 and 8.
//
// Specialisation: T (input scalar), TO (output scalar), TB (bias scalar), F16, R (4 or 8) and R8,
// BIAS, and VA / VB / VO: that operand is read or written as vec4 (the host checks the contiguous
// length is a multiple of 4 and every base offset is too). The B layout is a uniform flag (trans_b).
#if F16
enable f16;
#endif

struct Params {
    off_a: u32, off_b: u32, off_out: u32, off_bias: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    m: u32, n: u32, k: u32, tiles_m: u32,
    tiles_n: u32, groups: u32, a_bs: u32, b_bs: u32, // batch strides in elements (b_bs 0: shared b)
    out_bs: u32, ldo: u32, col0: u32, ldb: u32,      // out row stride / column offset; b row stride
    trans_b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if VA
@group(0) @binding(1) var<storage, read> ma: array<vec4<{{T}}>>;
#else
@group(0) @binding(1) var<storage, read> ma: array<{{T}}>;
#endif
#if VB
@group(0) @binding(2) var<storage, read> mb: array<vec4<{{T}}>>;
#else
@group(0) @binding(2) var<storage, read> mb: array<{{T}}>;
#endif
#if VO
@group(0) @binding(3) var<storage, read_write> mo: array<vec4<{{TO}}>>;
#else
@group(0) @binding(3) var<storage, read_write> mo: array<{{TO}}>;
#endif
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<{{TB}}>;
#endif

const R = {{R}}u;
const BM = 16u * R;
const BN = 16u * R;
const BK = 16u;
const BM4 = BM / 4u;
const BN4 = BN / 4u;
const GROUP_M = 8u;    // tile rows walked together so their B tiles stay in L2

var<workgroup> As: array<vec4<f32>, BK * BM4>; // As[k][m / 4]
var<workgroup> Bs: array<vec4<f32>, BK * BN4>; // Bs[k][n / 4]

// This invocation's outputs: acc[(h * 4 + i) * (R / 4) + g] holds row h * 64 + ty * 4 + i, columns
// g * 64 + tx * 4 + 0..3 of the block.
var<private> acc: array<vec4<f32>, R * R / 4u>;

// (tile row, tile column, batch) of linear workgroup g, in groups of GROUP_M tile rows.
fn tile_of(g: u32) -> vec3<u32> {
    let per_batch = p.tiles_m * p.tiles_n;
    let bt = g / per_batch;
    let t = g % per_batch;
    let group = GROUP_M * p.tiles_n;
    let first = (t / group) * GROUP_M;
    let rows = min(p.tiles_m - first, GROUP_M);
    return vec3<u32>(first + (t % group) % rows, (t % group) / rows, bt);
}

// Tile loads: an invocation moves R * 4 elements of each tile per K step, as R / 4 vec4 "chunks"
// (chunk i = 0 or 1): the next step's chunks wait in registers while this step is multiplied.
// Vector paths: chunk i is one vec4 load along the contiguous dimension. Scalar paths: chunk i is four
// elements 256 apart (consecutive invocations read consecutive addresses).

// ---- A: [M, K], K contiguous; stored transposed, As[k][m] ----
#if VA
fn load_a(lid: u32, m0: u32, k0: u32, base: u32, i: u32) -> vec4<f32> {
    let idx = lid + i * 256u;
    let row = m0 + idx / 4u;
    let kk = k0 + (idx % 4u) * 4u;
    if row < p.m && kk < p.k {
        return vec4<f32>(ma[(base + row * p.k + kk) / 4u]);
    }
    return vec4<f32>(0.0);
}

fn store_a(lid: u32, i: u32, v: vec4<f32>) {
    let idx = lid + i * 256u;
    let row = idx / 4u;
    let kk = (idx % 4u) * 4u;
    let s = row / 4u;
    let c = row % 4u;
    As[kk * BM4 + s][c] = v.x;
    As[(kk + 1u) * BM4 + s][c] = v.y;
    As[(kk + 2u) * BM4 + s][c] = v.z;
    As[(kk + 3u) * BM4 + s][c] = v.w;
}
#else
fn a_at(m0: u32, k0: u32, base: u32, idx: u32) -> f32 {
    let row = m0 + idx / BK;
    let kk = k0 + idx % BK;
    if row < p.m && kk < p.k {
        return f32(ma[base + row * p.k + kk]);
    }
    return 0.0;
}

fn load_a(lid: u32, m0: u32, k0: u32, base: u32, i: u32) -> vec4<f32> {
    let idx = lid + i * 1024u;
    return vec4<f32>(
        a_at(m0, k0, base, idx),
        a_at(m0, k0, base, idx + 256u),
        a_at(m0, k0, base, idx + 512u),
        a_at(m0, k0, base, idx + 768u),
    );
}

fn a_put(idx: u32, v: f32) {
    let row = idx / BK;
    As[(idx % BK) * BM4 + row / 4u][row % 4u] = v;
}

fn store_a(lid: u32, i: u32, v: vec4<f32>) {
    let idx = lid + i * 1024u;
    a_put(idx, v.x);
    a_put(idx + 256u, v.y);
    a_put(idx + 512u, v.z);
    a_put(idx + 768u, v.w);
}
#endif

// ---- B: with `trans` (p.trans_b) [N, K] and walked like A, else [K, N] with n contiguous; Bs[k][n].
// The branch is uniform, so it costs a few instructions per tile and saves a specialisation (lavapipe
// takes about a second for each). ----
#if VB
fn load_b(lid: u32, n0: u32, k0: u32, base: u32, trans: bool, i: u32) -> vec4<f32> {
    let idx = lid + i * 256u;
    if trans {
        let row = n0 + idx / 4u;
        let kk = k0 + (idx % 4u) * 4u;
        if row < p.n && kk < p.k {
            return vec4<f32>(mb[(base + row * p.ldb + kk) / 4u]);
        }
    } else {
        let kk = k0 + idx / BN4;
        let col = n0 + (idx % BN4) * 4u;
        if kk < p.k && col < p.n {
            return vec4<f32>(mb[(base + kk * p.ldb + col) / 4u]);
        }
    }
    return vec4<f32>(0.0);
}

fn store_b(lid: u32, i: u32, v: vec4<f32>, trans: bool) {
    let idx = lid + i * 256u;
    if trans {
        let row = idx / 4u;
        let kk = (idx % 4u) * 4u;
        let s = row / 4u;
        let c = row % 4u;
        Bs[kk * BN4 + s][c] = v.x;
        Bs[(kk + 1u) * BN4 + s][c] = v.y;
        Bs[(kk + 2u) * BN4 + s][c] = v.z;
        Bs[(kk + 3u) * BN4 + s][c] = v.w;
    } else {
        Bs[idx] = v;
    }
}
#else
fn b_at(n0: u32, k0: u32, base: u32, trans: bool, idx: u32) -> f32 {
    if trans {
        let row = n0 + idx / BK;
        let kk = k0 + idx % BK;
        if row < p.n && kk < p.k {
            return f32(mb[base + row * p.ldb + kk]);
        }
    } else {
        let kk = k0 + idx / BN;
        let col = n0 + idx % BN;
        if kk < p.k && col < p.n {
            return f32(mb[base + kk * p.ldb + col]);
        }
    }
    return 0.0;
}

fn load_b(lid: u32, n0: u32, k0: u32, base: u32, trans: bool, i: u32) -> vec4<f32> {
    let idx = lid + i * 1024u;
    return vec4<f32>(
        b_at(n0, k0, base, trans, idx),
        b_at(n0, k0, base, trans, idx + 256u),
        b_at(n0, k0, base, trans, idx + 512u),
        b_at(n0, k0, base, trans, idx + 768u),
    );
}

fn b_put(idx: u32, v: f32, trans: bool) {
    if trans {
        let row = idx / BK;
        Bs[(idx % BK) * BN4 + row / 4u][row % 4u] = v;
    } else {
        let col = idx % BN;
        Bs[(idx / BN) * BN4 + col / 4u][col % 4u] = v;
    }
}

fn store_b(lid: u32, i: u32, v: vec4<f32>, trans: bool) {
    let idx = lid + i * 1024u;
    b_put(idx, v.x, trans);
    b_put(idx + 256u, v.y, trans);
    b_put(idx + 512u, v.z, trans);
    b_put(idx + 768u, v.w, trans);
}
#endif

// One k of the block product: acc += A[rows, k] (x) B[k, columns].
#if R8
fn mac(kk: u32, tx: u32, ty: u32) {
    let a0 = As[kk * BM4 + ty];
    let a1 = As[kk * BM4 + 16u + ty];
    let b0 = Bs[kk * BN4 + tx];
    let b1 = Bs[kk * BN4 + 16u + tx];
    acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
    acc[1] = fma(vec4<f32>(a0.x), b1, acc[1]);
    acc[2] = fma(vec4<f32>(a0.y), b0, acc[2]);
    acc[3] = fma(vec4<f32>(a0.y), b1, acc[3]);
    acc[4] = fma(vec4<f32>(a0.z), b0, acc[4]);
    acc[5] = fma(vec4<f32>(a0.z), b1, acc[5]);
    acc[6] = fma(vec4<f32>(a0.w), b0, acc[6]);
    acc[7] = fma(vec4<f32>(a0.w), b1, acc[7]);
    acc[8] = fma(vec4<f32>(a1.x), b0, acc[8]);
    acc[9] = fma(vec4<f32>(a1.x), b1, acc[9]);
    acc[10] = fma(vec4<f32>(a1.y), b0, acc[10]);
    acc[11] = fma(vec4<f32>(a1.y), b1, acc[11]);
    acc[12] = fma(vec4<f32>(a1.z), b0, acc[12]);
    acc[13] = fma(vec4<f32>(a1.z), b1, acc[13]);
    acc[14] = fma(vec4<f32>(a1.w), b0, acc[14]);
    acc[15] = fma(vec4<f32>(a1.w), b1, acc[15]);
}
#else
fn mac(kk: u32, tx: u32, ty: u32) {
    let a0 = As[kk * BM4 + ty];
    let b0 = Bs[kk * BN4 + tx];
    acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
    acc[1] = fma(vec4<f32>(a0.y), b0, acc[1]);
    acc[2] = fma(vec4<f32>(a0.z), b0, acc[2]);
    acc[3] = fma(vec4<f32>(a0.w), b0, acc[3]);
}
#endif

// Writes four outputs (row, col..col + 3), guarded, with the bias.
fn put(o_base: u32, row: u32, col: u32, acc_v: vec4<f32>) {
    if row >= p.m {
        return;
    }
    var v = acc_v;
#if BIAS
    let bb = p.off_bias + p.col0 + col;
    if col < p.n {
        v.x += f32(bias[bb]);
    }
    if col + 1u < p.n {
        v.y += f32(bias[bb + 1u]);
    }
    if col + 2u < p.n {
        v.z += f32(bias[bb + 2u]);
    }
    if col + 3u < p.n {
        v.w += f32(bias[bb + 3u]);
    }
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

@compute @workgroup_size(256)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
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
    let tx = lid % 16u;
    let ty = lid / 16u;
    let trans = p.trans_b != 0u;

    var ra0 = load_a(lid, m0, 0u, a_base, 0u);
    var rb0 = load_b(lid, n0, 0u, b_base, trans, 0u);
#if R8
    var ra1 = load_a(lid, m0, 0u, a_base, 1u);
    var rb1 = load_b(lid, n0, 0u, b_base, trans, 1u);
#endif
    let ktiles = (p.k + BK - 1u) / BK;
    for (var t = 0u; t < ktiles; t++) {
        store_a(lid, 0u, ra0);
        store_b(lid, 0u, rb0, trans);
#if R8
        store_a(lid, 1u, ra1);
        store_b(lid, 1u, rb1, trans);
#endif
        workgroupBarrier();
        if t + 1u < ktiles {
            let k1 = (t + 1u) * BK;
            ra0 = load_a(lid, m0, k1, a_base, 0u);
            rb0 = load_b(lid, n0, k1, b_base, trans, 0u);
#if R8
            ra1 = load_a(lid, m0, k1, a_base, 1u);
            rb1 = load_b(lid, n0, k1, b_base, trans, 1u);
#endif
        }
        for (var kk = 0u; kk < BK; kk += 4u) {
            mac(kk, tx, ty);
            mac(kk + 1u, tx, ty);
            mac(kk + 2u, tx, ty);
            mac(kk + 3u, tx, ty);
        }
        workgroupBarrier();
    }

    let o_base = p.off_out + tile.z * p.out_bs + p.col0;
    let r0 = m0 + ty * 4u;
    let c0 = n0 + tx * 4u;
#if R8
    let c1 = c0 + 64u;
    put(o_base, r0, c0, acc[0]);
    put(o_base, r0, c1, acc[1]);
    put(o_base, r0 + 1u, c0, acc[2]);
    put(o_base, r0 + 1u, c1, acc[3]);
    put(o_base, r0 + 2u, c0, acc[4]);
    put(o_base, r0 + 2u, c1, acc[5]);
    put(o_base, r0 + 3u, c0, acc[6]);
    put(o_base, r0 + 3u, c1, acc[7]);
    put(o_base, r0 + 64u, c0, acc[8]);
    put(o_base, r0 + 64u, c1, acc[9]);
    put(o_base, r0 + 65u, c0, acc[10]);
    put(o_base, r0 + 65u, c1, acc[11]);
    put(o_base, r0 + 66u, c0, acc[12]);
    put(o_base, r0 + 66u, c1, acc[13]);
    put(o_base, r0 + 67u, c0, acc[14]);
    put(o_base, r0 + 67u, c1, acc[15]);
#else
    put(o_base, r0, c0, acc[0]);
    put(o_base, r0 + 1u, c0, acc[1]);
    put(o_base, r0 + 2u, c0, acc[2]);
    put(o_base, r0 + 3u, c0, acc[3]);
#endif
}
