// Unary elementwise ops: out = f(x), computed in f32; and SwiGLU (gated, two inputs per output).
// Specialisation: T (f32|f16), F16, EXPR (a WGSL expression over f32 `x` and the scalar `p.alpha`).
#if F16
enable f16;
#endif

struct Params {
    off_x: u32, off_out: u32, o2: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    n: u32, alpha: f32, inner: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), WGSL has no builtin.
fn erf_approx(v: f32) -> f32 {
    let s = sign(v);
    let z = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return s * (1.0 - poly * exp(-z * z));
}

// tanh that stays finite for large |v| (some drivers return NaN from tanh(±large)).
fn tanh_safe(v: f32) -> f32 {
    let e = exp(-2.0 * abs(clamp(v, -20.0, 20.0)));
    return sign(v) * (1.0 - e) / (1.0 + e);
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.n {
        return;
    }
    let x = f32(src[p.off_x + i]);
    out[p.off_out + i] = {{T}}({{EXPR}});
}

// SwiGLU on a fused gate/up projection: gu rows are [gate (inner), up (inner)]; out = silu(gate) * up.
@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.n {
        return;
    }
    let row = i / p.inner;
    let col = i % p.inner;
    let g = f32(src[p.off_x + row * 2u * p.inner + col]);
    let u = f32(src[p.off_x + row * 2u * p.inner + p.inner + col]);
    out[p.off_out + i] = {{T}}(g / (1.0 + exp(-g)) * u);
}
