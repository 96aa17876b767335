// Tiled matrix multiplication, portable (no subgroups, no cooperative matrices):
//   out[b, m, col0 + n] = sum_k a[b, m, k] * B(b, k, n) (+ bias[col0 + n]),   accumulation in f32,
// where B(b, k, n) = b[b, k, n] or, with trans_b, b[b, n, k] (the nn.Linear weight layout).
// A workgroup of 16x16 threads computes a BM x BN = 16R x 16R block of `out`; each thread holds R x R
// outputs (rows h*64 + ty*4 + i, columns g*64 + tx*4 + j), so its workgroup-memory reads are vec4s that
// neighbouring threads share or read from consecutive addresses. Tiles of A and B (BK = 16 deep) go
// through workgroup memory as f32; the next tile is fetched into registers while the current one is
// multiplied (global latency hidden behind the FMAs). Out-of-range elements load as zeros.
//
// Specialisation: T (input scalar), TO (output scalar), TB (bias scalar), F16, R (4 or 8), and
// VA / VB / VO: that operand is read or written as vec4 (the host checks the contiguous length is a
// multiple of 4 and every base offset is too). The B layout and the bias are uniform flags.
#if F16
enable f16;
#endif

struct Params {
    off_a: u32, off_b: u32, off_out: u32, off_bias: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    m: u32, n: u32, k: u32, tiles_m: u32,
    tiles_n: u32, groups: u32, a_bs: u32, b_bs: u32, // batch strides in elements (b_bs 0: shared b)
    out_bs: u32, ldo: u32, col0: u32, ldb: u32,      // out row stride / column offset; b row stride
    trans_b: u32, has_bias: u32,
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
// Without a bias the host binds another read-only tensor here; it is never read.
@group(0) @binding(4) var<storage, read> bias: array<{{TB}}>;

const R = {{R}}u;
const H = R / 4u;      // vec4 groups per thread along each dimension
const BM = 16u * R;
const BN = 16u * R;
const BK = 16u;
const BM4 = BM / 4u;
const BN4 = BN / 4u;
const GROUP_M = 8u;    // tile rows walked together so their B tiles stay in L2

var<workgroup> As: array<vec4<f32>, BK * BM4>; // As[k][m / 4]
var<workgroup> Bs: array<vec4<f32>, BK * BN4>; // Bs[k][n / 4]

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

// ---- A tile (BM rows x BK, K contiguous) ----
#if VA
fn load_a(lid: u32, m0: u32, k0: u32, base: u32) -> array<vec4<f32>, H> {
    var r: array<vec4<f32>, H>;
    for (var i = 0u; i < H; i++) {
        let idx = lid + i * 256u;
        let row = m0 + idx / 4u;
        let kk = k0 + (idx % 4u) * 4u;
        if row < p.m && kk < p.k {
            r[i] = vec4<f32>(ma[(base + row * p.k + kk) / 4u]);
        }
    }
    return r;
}

fn store_a(lid: u32, r: array<vec4<f32>, H>) {
    for (var i = 0u; i < H; i++) {
        let idx = lid + i * 256u;
        let row = idx / 4u;
        let kk = (idx % 4u) * 4u;
        let s = row / 4u;
        let c = row % 4u;
        As[kk * BM4 + s][c] = r[i].x;
        As[(kk + 1u) * BM4 + s][c] = r[i].y;
        As[(kk + 2u) * BM4 + s][c] = r[i].z;
        As[(kk + 3u) * BM4 + s][c] = r[i].w;
    }
}
#else
fn load_a(lid: u32, m0: u32, k0: u32, base: u32) -> array<f32, R> {
    var r: array<f32, R>;
    for (var i = 0u; i < R; i++) {
        let idx = lid + i * 256u;
        let row = m0 + idx / BK;
        let kk = k0 + idx % BK;
        if row < p.m && kk < p.k {
            r[i] = f32(ma[base + row * p.k + kk]);
        }
    }
    return r;
}

fn store_a(lid: u32, r: array<f32, R>) {
    for (var i = 0u; i < R; i++) {
        let idx = lid + i * 256u;
        let row = idx / BK;
        As[(idx % BK) * BM4 + row / 4u][row % 4u] = r[i];
    }
}
#endif

// ---- B tile (BK x BN) ----
// With `trans` (p.trans_b), b is [N, K] and walked like A (over rows n); otherwise b is [K, N] and
// the tile rows
// are contiguous along n. The branch is uniform (a parameter), so it costs a few instructions per tile
// and saves a specialisation.
#if VB
fn load_b(lid: u32, n0: u32, k0: u32, base: u32, trans: bool) -> array<vec4<f32>, H> {
    var r: array<vec4<f32>, H>;
    for (var i = 0u; i < H; i++) {
        let idx = lid + i * 256u;
        if trans {
            let row = n0 + idx / 4u;
            let kk = k0 + (idx % 4u) * 4u;
            if row < p.n && kk < p.k {
                r[i] = vec4<f32>(mb[(base + row * p.ldb + kk) / 4u]);
            }
        } else {
            let kk = k0 + idx / BN4;
            let col = n0 + (idx % BN4) * 4u;
            if kk < p.k && col < p.n {
                r[i] = vec4<f32>(mb[(base + kk * p.ldb + col) / 4u]);
            }
        }
    }
    return r;
}

fn store_b(lid: u32, r: array<vec4<f32>, H>, trans: bool) {
    for (var i = 0u; i < H; i++) {
        let idx = lid + i * 256u;
        if trans {
            let row = idx / 4u;
            let kk = (idx % 4u) * 4u;
            let s = row / 4u;
            let c = row % 4u;
            Bs[kk * BN4 + s][c] = r[i].x;
            Bs[(kk + 1u) * BN4 + s][c] = r[i].y;
            Bs[(kk + 2u) * BN4 + s][c] = r[i].z;
            Bs[(kk + 3u) * BN4 + s][c] = r[i].w;
        } else {
            Bs[idx] = r[i];
        }
    }
}
#else
fn load_b(lid: u32, n0: u32, k0: u32, base: u32, trans: bool) -> array<f32, R> {
    var r: array<f32, R>;
    for (var i = 0u; i < R; i++) {
        let idx = lid + i * 256u;
        if trans {
            let row = n0 + idx / BK;
            let kk = k0 + idx % BK;
            if row < p.n && kk < p.k {
                r[i] = f32(mb[base + row * p.ldb + kk]);
            }
        } else {
            let kk = k0 + idx / BN;
            let col = n0 + idx % BN;
            if kk < p.k && col < p.n {
                r[i] = f32(mb[base + kk * p.ldb + col]);
            }
        }
    }
    return r;
}

fn store_b(lid: u32, r: array<f32, R>, trans: bool) {
    for (var i = 0u; i < R; i++) {
        let idx = lid + i * 256u;
        if trans {
            let row = idx / BK;
            Bs[(idx % BK) * BN4 + row / 4u][row % 4u] = r[i];
        } else {
            let col = idx % BN;
            Bs[(idx / BN) * BN4 + col / 4u][col % 4u] = r[i];
        }
    }
}
#endif

fn bias4(col: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if col + j < p.n {
            v[j] = f32(bias[p.off_bias + p.col0 + col + j]);
        }
    }
    return v;
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

    // Always 0 (grids are 2-D). Conditions that depend on uniforms alone (the K loop, the bias flag)
    // get it added: lavapipe inlines such uniforms and recompiles the kernel for every new value
    // (about a second per shape); a built-in input in the expression stops that. Free elsewhere.
    let zero = wid.z;

    // acc[(h * 4 + i) * H + c]: row h * 64 + ty * 4 + i, columns c * 64 + tx * 4 + 0..3.
    var acc: array<vec4<f32>, R * H>;
    var ra = load_a(lid, m0, 0u, a_base);
    let trans = p.trans_b + zero != 0u;
    var rb = load_b(lid, n0, 0u, b_base, trans);
    let ktiles = (p.k + zero + BK - 1u) / BK;
    let has_bias = p.has_bias + zero != 0u;
    for (var t = 0u; t < ktiles; t++) {
        store_a(lid, ra);
        store_b(lid, rb, trans);
        workgroupBarrier();
        if t + 1u < ktiles {
            ra = load_a(lid, m0, (t + 1u) * BK, a_base);
            rb = load_b(lid, n0, (t + 1u) * BK, b_base, trans);
        }
        for (var kk = 0u; kk < BK; kk++) {
            var av: array<vec4<f32>, H>;
            var bv: array<vec4<f32>, H>;
            for (var h = 0u; h < H; h++) {
                av[h] = As[kk * BM4 + h * 16u + ty];
                bv[h] = Bs[kk * BN4 + h * 16u + tx];
            }
            for (var h = 0u; h < H; h++) {
                for (var i = 0u; i < 4u; i++) {
                    let s = vec4<f32>(av[h][i]);
                    for (var c = 0u; c < H; c++) {
                        let o = (h * 4u + i) * H + c;
                        acc[o] = fma(s, bv[c], acc[o]);
                    }
                }
            }
        }
        workgroupBarrier();
    }

    let o_base = p.off_out + tile.z * p.out_bs + p.col0;
    for (var h = 0u; h < H; h++) {
        for (var i = 0u; i < 4u; i++) {
            let row = m0 + h * 64u + ty * 4u + i;
            if row >= p.m {
                continue;
            }
            let ob = o_base + row * p.ldo;
            for (var c = 0u; c < H; c++) {
                let col = n0 + c * 64u + tx * 4u;
                var v = acc[(h * 4u + i) * H + c];
                if has_bias {
                    v += bias4(col);
                }
#if VO
                if col < p.n {
                    mo[(ob + col) / 4u] = vec4<{{TO}}>(v);
                }
#else
                for (var j = 0u; j < 4u; j++) {
                    if col + j < p.n {
                        mo[ob + col + j] = {{TO}}(v[j]);
                    }
                }
#endif
            }
        }
    }
}
