// Bulk copy, 16 bytes per invocation: the bandwidth baseline other kernels are measured against, and
// the copy used for large moves (faster than copy_buffer_to_buffer on NVIDIA, see the H200 notes).

struct Params {
    off_src: u32, off_dst: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    n_vec4: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn copy_vec4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i < p.n_vec4 {
        // Base offsets count u32 words; 16-byte alignment makes them multiples of 4.
        dst[(p.off_dst >> 2u) + i] = src[(p.off_src >> 2u) + i];
    }
}
