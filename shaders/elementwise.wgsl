// Binary elementwise ops with numpy broadcasting (rank <= 4): out = a OP b.
// Specialisation: T (f32|f16), F16, OP (a WGSL expression over f32 `x` and `y`).
#if F16
enable f16;
#endif

struct Params {
    off_a: u32, off_b: u32, off_out: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    n: u32, p0: u32, p1: u32, p2: u32,
    shape: vec4<u32>,    // output shape, padded to rank 4 with leading 1s
    stride_a: vec4<u32>, // element stride of `a` per output dimension (0 where broadcast)
    stride_b: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<{{T}}>;
@group(0) @binding(2) var<storage, read> b: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
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
    let idx = vec4<u32>(i0, i1, i2, i3);
    let x = f32(a[p.off_a + dot(idx, p.stride_a)]);
    let y = f32(b[p.off_b + dot(idx, p.stride_b)]);
    out[p.off_out + i] = {{T}}({{OP}});
}
