// Split-K matmul, second pass: the cooperative kernel wrote `slices` f32 partial products [slices, M, N]
// (K cut into equal slices, one per batch entry of its grid); this sums them in slice order, adds the
// bias and converts:  out[i] = sum_s part[s M N + i] (+ bias[i % N]),  four elements per invocation.
// The host guarantees M N, N and every base offset are multiples of 4.
// Specialisation: TO (output scalar), TB (bias scalar), F16, BIAS.
#if F16
enable f16;
#endif

struct Params {
    off_part: u32, off_out: u32, off_bias: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    mn: u32, n: u32, slices: u32, p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<{{TO}}>>;
#if BIAS
@group(0) @binding(3) var<storage, read> bias: array<{{TB}}>;
#endif

@compute @workgroup_size(256)
fn sum_slices(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.mn / 4u {
        return;
    }
    let first = p.off_part / 4u + i;
    var s = part[first];
    for (var j = 1u; j < p.slices; j++) {
        s += part[first + j * (p.mn / 4u)];
    }
#if BIAS
    let c = p.off_bias + (4u * i) % p.n;
    s += vec4<f32>(f32(bias[c]), f32(bias[c + 1u]), f32(bias[c + 2u]), f32(bias[c + 3u]));
#endif
    out[p.off_out / 4u + i] = vec4<{{TO}}>(s);
}
