// GEGLU, the gated feed-forward of diffusers' transformer blocks: each input row is
// [hidden (inner), gate (inner)] (one fused projection) and out = hidden * gelu_erf(gate), computed in f32.
// Specialisation: T (f32|f16), F16, VEC (1: rows and offsets in vec4, V = vec4<T>, VF = vec4<f32>).
#if F16
enable f16;
#endif

struct Params {
    off_x: u32, off_out: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    // Outputs and inner width, both in units of V.
    n: u32, inner: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<{{V}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), componentwise; WGSL has no builtin.
fn erf_approx(v: {{VF}}) -> {{VF}} {
    let z = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - poly * exp(-z * z));
}

@compute @workgroup_size(256)
fn geglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.n {
        return;
    }
#if VEC
    let bx = p.off_x / 4u;
    let bo = p.off_out / 4u;
#else
    let bx = p.off_x;
    let bo = p.off_out;
#endif
    let row = i / p.inner;
    let col = i - row * p.inner;
    let h = {{VF}}(src[bx + row * 2u * p.inner + col]);
    let g = {{VF}}(src[bx + row * 2u * p.inner + p.inner + col]);
    out[bo + i] = {{V}}(h * (0.5 * g * (1.0 + erf_approx(g * 0.7071067812))));
}
