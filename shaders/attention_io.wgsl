// The bindings and loaders the attention kernels share (appended to attention.wgsl and
// attention_decode_row.wgsl, after their Params and `enable` lines): q, k, v (QV / KV: read as vec4),
// the step state and the output (OV: written as vec4). load_* take an element index, a multiple of 4.
#if QV
@group(0) @binding(1) var<storage, read> q: array<vec4<{{QT}}>>;
fn load_q(e: u32) -> vec4<f32> {
    return vec4<f32>(q[e >> 2u]);
}
#else
@group(0) @binding(1) var<storage, read> q: array<{{QT}}>;
fn load_q(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(q[e]), f32(q[e + 1u]), f32(q[e + 2u]), f32(q[e + 3u]));
}
#endif
#if KV
@group(0) @binding(2) var<storage, read> k: array<vec4<{{KT}}>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<{{KT}}>>;
fn load_k(e: u32) -> vec4<f32> {
    return vec4<f32>(k[e >> 2u]);
}
fn load_v(e: u32) -> vec4<f32> {
    return vec4<f32>(v[e >> 2u]);
}
#else
@group(0) @binding(2) var<storage, read> k: array<{{KT}}>;
@group(0) @binding(3) var<storage, read> v: array<{{KT}}>;
fn load_k(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(k[e]), f32(k[e + 1u]), f32(k[e + 2u]), f32(k[e + 3u]));
}
fn load_v(e: u32) -> vec4<f32> {
    return vec4<f32>(f32(v[e]), f32(v[e + 1u]), f32(v[e + 2u]), f32(v[e + 3u]));
}
#endif
@group(0) @binding(4) var<storage, read> step: array<u32>;
#if OV
@group(0) @binding(5) var<storage, read_write> out: array<vec4<{{OT}}>>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e >> 2u] = vec4<{{OT}}>(x);
}
#else
@group(0) @binding(5) var<storage, read_write> out: array<{{OT}}>;
fn store_out4(e: u32, x: vec4<f32>) {
    out[e] = {{OT}}(x.x);
    out[e + 1u] = {{OT}}(x.y);
    out[e + 2u] = {{OT}}(x.z);
    out[e + 3u] = {{OT}}(x.w);
}
#endif
