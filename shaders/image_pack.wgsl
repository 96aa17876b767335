// VAE decoder output [3, H, W] in [-1, 1] to an RGBA8 texture the UI draws directly (no readback).
// The bytes equal diffusion::image::to_rgb's: round(clamp((v + 1) / 2, 0, 1) * 255), alpha 255.
// Specialisation: T (f32|f16), F16.
#if F16
enable f16;
#endif

struct Params {
    off_src: u32, o1: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    width: u32, height: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<{{T}}>;
@group(0) @binding(2) var out_tex: texture_storage_2d<rgba8unorm, write>;

@compute @workgroup_size(8, 8)
fn pack_rgba8(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x >= p.width || gid.y >= p.height {
        return;
    }
    let plane = p.width * p.height;
    let i = p.off_src + gid.y * p.width + gid.x;
    var rgb = vec3<f32>(0.0);
    for (var c = 0u; c < 3u; c++) {
        let v = (f32(src[i + c * plane]) + 1.0) * 0.5;
        // floor(x + 0.5) rounds halves up like Rust's f32::round for x >= 0 (WGSL's round() ties to
        // even); storing byte / 255 converts back to exactly that byte.
        rgb[c] = floor(clamp(v, 0.0, 1.0) * 255.0 + 0.5) / 255.0;
    }
    textureStore(out_tex, vec2<i32>(gid.xy), vec4<f32>(rgb, 1.0));
}
