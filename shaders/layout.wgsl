// Layout ops: copies that move elements without arithmetic, so they are bandwidth-bound; each entry
// point has a vec4 form (V = vec4<T>) used where sizes and offsets allow it.
// Entry points:
//   upsample2x   nearest 2x upsampling of [N*C, H, W] rows
//   copy_rows    rows of `len` elements to a strided destination (channel concatenation)
//   permute      gather with rank-4 strides, for permutations that keep the last dimension
//   transpose    32x32 tiles through workgroup memory, for permutations that move the last dimension
// Specialisation: T (f32|f16), F16, VEC (elements handled as vec4<T>).
#if F16
enable f16;
#endif

#if VEC
alias V = vec4<{{T}}>;
#else
alias V = {{T}};
#endif

struct Params {
    off_src: u32, off_dst: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    // upsample2x: a = elements (V) per input row, b = input rows, n = total input V elements.
    // copy_rows:  a = row length (V), b = destination row stride (V), c = destination offset (V), n = total.
    // permute:    shape = output shape (V in the last dim), strides = input stride per output dim.
    // transpose:  see the entry point.
    n: u32, a: u32, b: u32, c: u32,
    shape: vec4<u32>,
    strides: vec4<u32>,
    ext: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<V>;
@group(0) @binding(2) var<storage, read_write> dst: array<V>;

// With VEC the base offsets (in elements) are multiples of 4, checked on the host.
#if VEC
fn src_base() -> u32 { return p.off_src / 4u; }
fn dst_base() -> u32 { return p.off_dst / 4u; }
#else
fn src_base() -> u32 { return p.off_src; }
fn dst_base() -> u32 { return p.off_dst; }
#endif

fn linear(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

@compute @workgroup_size(256)
fn upsample2x(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear(gid, nwg);
    if i >= p.n {
        return;
    }
    // Input row r, column j (in V units) -> output rows 2r and 2r+1, columns 2j and 2j+1; an output
    // row is 2a V units long.
    let r = i / p.a;
    let j = i - r * p.a;
    let v = src[src_base() + i];
    let o = dst_base() + 4u * r * p.a + 2u * j;
#if VEC
    let lo = V(v.x, v.x, v.y, v.y);
    let hi = V(v.z, v.z, v.w, v.w);
    dst[o] = lo;
    dst[o + 1u] = hi;
    dst[o + 2u * p.a] = lo;
    dst[o + 2u * p.a + 1u] = hi;
#else
    dst[o] = v;
    dst[o + 1u] = v;
    dst[o + 2u * p.a] = v;
    dst[o + 2u * p.a + 1u] = v;
#endif
}

@compute @workgroup_size(256)
fn copy_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear(gid, nwg);
    if i >= p.n {
        return;
    }
    let r = i / p.a;
    let j = i - r * p.a;
    dst[dst_base() + p.c + r * p.b + j] = src[src_base() + i];
}

@compute @workgroup_size(256)
fn permute(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear(gid, nwg);
    if i >= p.n {
        return;
    }
    var r = i;
    let i3 = r % p.shape.w;
    r = r / p.shape.w;
    let i2 = r % p.shape.z;
    r = r / p.shape.z;
    let i1 = r % p.shape.y;
    let i0 = r / p.shape.y;
    dst[dst_base() + i] = src[src_base() + dot(vec4<u32>(i0, i1, i2, i3), p.strides)];
}

// Transpose of the two innermost-moving dimensions: the input's last dimension L (contiguous in the
// input, stride p.b in the output) and the input dimension A that becomes the output's last (stride p.a
// in the input, contiguous in the output), with up to two batch dimensions.
// p.shape = (size A, size L, batch 0, batch 1), p.strides = (input stride of batch 0, batch 1,
// output stride of batch 0, batch 1), p.ext = (tiles along A, tiles along L, -, -), p.n = total tiles.
// The tile is stored padded (33 columns) so the column reads hit different banks. Scalar only.
#ifnot VEC
var<workgroup> tile: array<{{T}}, 1056u>;

@compute @workgroup_size(32, 8)
fn transpose(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let t = wid.x + wid.y * nwg.x;
    if t >= p.n {
        return;
    }
    let tiles_a = p.ext.x;
    let tiles_l = p.ext.y;
    let ta = t % tiles_a;
    let rest = t / tiles_a;
    let tl = rest % tiles_l;
    let bt = rest / tiles_l;
    let b0 = bt / p.shape.w;
    let b1 = bt - b0 * p.shape.w;
    let in_base = src_base() + b0 * p.strides.x + b1 * p.strides.y;
    let out_base = dst_base() + b0 * p.strides.z + b1 * p.strides.w;
    let a0 = ta * 32u;
    let l0 = tl * 32u;
    // Read: rows along A, threads along L (contiguous input).
    for (var k = 0u; k < 32u; k += 8u) {
        let a = a0 + lid.y + k;
        let l = l0 + lid.x;
        if a < p.shape.x && l < p.shape.y {
            tile[(lid.y + k) * 33u + lid.x] = src[in_base + a * p.a + l];
        }
    }
    workgroupBarrier();
    // Write: rows along L, threads along A (contiguous output).
    for (var k = 0u; k < 32u; k += 8u) {
        let l = l0 + lid.y + k;
        let a = a0 + lid.x;
        if a < p.shape.x && l < p.shape.y {
            dst[out_base + l * p.b + a] = tile[lid.x * 33u + lid.y + k];
        }
    }
}
#endif
