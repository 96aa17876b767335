// The parameters and bindings the quantized matrix-vector kernels share (matvec_quant.wgsl and
// matvec_quant_dp4a.wgsl): their builder fills both the same way. Prepended to either kernel, so it
// also holds the module's `enable` directive.
#if F16
enable f16;
#endif

struct Params {
    offs: array<vec4<u32>, 2>, // base element offsets of bindings 1..8 (tensor_base)
    rows: u32,      // rows of this shard
    k: u32,
    ldo: u32,       // row stride of out (N)
    row0: u32,      // output row of the shard's first row
    wbyte: u32,     // byte offset of the shard's first row past the word at its base offset (0..3)
    row_bytes: u32,
    nchunks: u32,   // K / 32
    eps: f32,       // NORM
    hq: u32, hkv: u32, hd: u32, rot: u32, max_ctx: u32, // ROPE (matvec_fuse.wgsl)
}

@group(0) @binding(0) var<uniform> p: Params;
#if W4
@group(0) @binding(1) var<storage, read> w4: array<vec4<u32>>;
#else
@group(0) @binding(1) var<storage, read> w: array<u32>;
#endif
#if XV4
@group(0) @binding(2) var<storage, read> xs: array<vec4<{{TX}}>>;
#else
@group(0) @binding(2) var<storage, read> xs: array<{{TX}}>;
#endif
@group(0) @binding(3) var<storage, read_write> out: array<{{TO}}>;
