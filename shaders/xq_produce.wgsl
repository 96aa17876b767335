// x quantized by its producer (appended to matvec_quant_dp4a.wgsl with XQO): a product whose
// output is the next product's input (the residual stream after O or down, the GLU activation) also
// writes that output in the integer-dot-product kernel's x format, so the next product reads its
// blocks straight from memory (XQ) instead of every workgroup quantizing the whole row first and
// waiting at a barrier (on the H200 that pre-pass and barrier were ~0.45 ms of Llama 3.1 8B's 2.49 ms
// token, BENCHMARKS.md 2026-12-02).
//
// Layout of xq_out, per 32-element block c at word 20 c: 8 words of qh, 8 of ql (4 int8 each, elements
// 4j .. 4j + 3 in word j: matvec_quant_dp4a.wgsl's split of x = d (qh + ql / 254)), then d, the sum of
// the block's values and the sum of their squares before the gain (f32 bits), and a zero word. The
// values are y = v * g (XQG: g the next RMSNorm's weight, the norm's 1 / rms is applied by the
// consumer from the squares) with v the output as stored (rounded to TO; a driver may keep it
// unrounded, the H200's does: within half an f16 ulp).
//
// The workgroup's XQ_VALS values (a whole number of blocks, starting on a block) are kept in
// workgroup memory (xq_keep) and quantized together (xq_finish, uniform control flow).
#if XQO
const XQO_B = {{XQO_B}}u;
@group(0) @binding({{XQO_B}}) var<storage, read_write> xq_out: array<u32>;
#if XQG
const XQG_B = {{XQG_B}}u;
@group(0) @binding({{XQG_B}}) var<storage, read> xq_g: array<{{TQG}}>;
#endif

const XQ_VALS = {{XQ_VALS}}u;
// 0 (`DRIFT_DP4A_XQ=nowrite`, timing only, wrong results): everything but the stores to xq_out.
const XQW = {{XQW}}u;

// y = v times the gain at element e.
fn xq_gained(e: u32, v: f32) -> f32 {
#if XQG
    return v * f32(xq_g[tensor_base(XQG_B) + e]);
#else
    return v;
#endif
}

// The block at word o's scale (max |y| m / 127), sum of y and sum of squares ss, and its zero word.
fn xq_put_meta(o: u32, m: f32, sx: f32, ss: f32) {
    if XQW == 1u {
        xq_out[o + 16u] = bitcast<u32>(m / 127.0);
        xq_out[o + 17u] = bitcast<u32>(sx);
        xq_out[o + 18u] = bitcast<u32>(ss);
        xq_out[o + 19u] = 0u;
    }
}

#if XQL
// XQL (subgroups of 32, and the value of element e held by the invocation e % 32 of a subgroup: the
// GLU epilogue's and the split-K last workgroup's rows): each block is one subgroup's values, reduced
// and packed by subgroup operations, with no workgroup memory or barrier.
fn xq_keep(i: u32, e: u32, v: f32) {
    let y = xq_gained(e, v);
    let m = subgroupMax(abs(y));
    let sx = subgroupAdd(y);
    let ss = subgroupAdd(v * v);
    let inv = select(0.0, 127.0 / m, m > 0.0);
    let s = y * inv;
    // This element's bytes at its place in the word of 4 (pack4xI8's order), gathered over the 4.
    let sh = 8u * (e % 4u);
    var wh = (u32(i32(round(s))) & 0xFFu) << sh;
    var wl = (u32(i32(round((s - round(s)) * 254.0))) & 0xFFu) << sh;
    wh |= subgroupShuffleXor(wh, 1u);
    wl |= subgroupShuffleXor(wl, 1u);
    wh |= subgroupShuffleXor(wh, 2u);
    wl |= subgroupShuffleXor(wl, 2u);
    let o = tensor_base(XQO_B) + (e / 32u) * 20u;
    if e % 4u == 0u {
        if XQW == 1u {
            xq_out[o + (e % 32u) / 4u] = wh;
        }
        if XQW == 1u {
            xq_out[o + 8u + (e % 32u) / 4u] = wl;
        }
    }
    if e % 32u == 0u {
        xq_put_meta(o, m, sx, ss);
    }
}

fn xq_finish(e0: u32, lid: u32) {}
#else
var<workgroup> xq_v: array<f32, XQ_VALS>;
var<workgroup> xq_s: array<f32, XQ_VALS>;
var<workgroup> xq_b: array<vec2<i32>, XQ_VALS>;

// Value i of the workgroup's, at element e of the row: v as stored.
fn xq_keep(i: u32, e: u32, v: f32) {
    xq_v[i] = xq_gained(e, v);
    xq_s[i] = v * v;
}

// Quantizes the kept values (elements e0 .. e0 + XQ_VALS of the row) into xq_out.
fn xq_finish(e0: u32, lid: u32) {
    workgroupBarrier();
    if lid < XQ_VALS {
        let b0 = lid / 32u * 32u;
        var m = 0.0;
        var sx = 0.0;
        var ss = 0.0;
        for (var i = 0u; i < 32u; i++) {
            let y = xq_v[b0 + i];
            m = max(m, abs(y));
            sx += y;
            ss += xq_s[b0 + i];
        }
        let inv = select(0.0, 127.0 / m, m > 0.0);
        let s = xq_v[lid] * inv;
        xq_b[lid] = vec2<i32>(i32(round(s)), i32(round((s - round(s)) * 254.0)));
        if lid == b0 {
            xq_put_meta(tensor_base(XQO_B) + (e0 / 32u + lid / 32u) * 20u, m, sx, ss);
        }
    }
    workgroupBarrier();
    // Word wd of block blk: qh (wd < 8) or ql of elements 4 (wd % 8) ..
    if lid < XQ_VALS / 2u {
        let blk = lid / 16u;
        let wd = lid % 16u;
        let e = blk * 32u + (wd % 8u) * 4u;
        let a = xq_b[e];
        let b = xq_b[e + 1u];
        let c = xq_b[e + 2u];
        let d = xq_b[e + 3u];
        let q = select(vec4<i32>(a.y, b.y, c.y, d.y), vec4<i32>(a.x, b.x, c.x, d.x), wd < 8u);
        if XQW == 1u {
            xq_out[tensor_base(XQO_B) + (e0 / 32u + blk) * 20u + wd] = pack4xI8(q);
        }
    }
}
#endif
#endif
