// Matrix-vector products on Q4_0 / Q4_1 / Q8_0 weights with integer dot products (decode, one
// activation row):  out[row0 + r] = sum_k w[r, k] * x[k]  (+ matvec_fuse.wgsl's bias / residual),
// w one row shard [rows, K] kept in its GGUF block layout (dequant.wgsl's loaders, appended).
//
// The workgroup first turns the whole input row (after matvec_fuse.wgsl's prologue: RMSNorm or
// SwiGLU) into int8 in workgroup memory, per block of 32 (the weights' own blocking) with one scale d =
// max |x| / 127, as two terms: x = d (qh + ql / 254) with qh = round(x / d) and ql the rounded rest,
// both in -127..127, so x is kept to about 15 bits (error <= max|x| / 64516 per block: a single int8
// term, as llama.cpp uses, moved SmolLM2's near-tied first-token logits by 0.25 and flipped its greedy
// answer). Then each team (a subgroup) takes R rows; its lanes stride over the blocks, and a block's
// 32 products are 16 dot4I8Packed (SPIR-V OpSDot where the device has integer dot products: one
// instruction per 4 products) and a few scalars: about 1.5 instructions per weight, against ~8 when
// every weight is decoded to a float (matvec_quant.wgsl).
//
// With S = sum q qh + (sum q ql) / 254 over a block and sx its f32 sum of x:
// Q4_0: w = d (q - 8), q = 4-bit;  sum w x = dw (dx S - 8 sx)
// Q4_1: w = d q + m;               sum w x = dw dx S + m sx
// Q8_0: w = d q, q = int8;         sum w x = dw dx S
//
// KW > 1 (KWS) also splits each row's blocks over KW workgroups (products of few rows: more
// workgroups, each quantizing only its own slice of x). A workgroup writes its rows' partial sums to
// `kw_scr` and counts itself in; the last of the KW to arrive adds the KW partials in slice order
// (the result does not depend on arrival order), applies the epilogue and resets the count. With
// NORM each workgroup also leaves its slice's sum of x^2, which the last one adds up for the scale;
// the paired-row epilogues run in the last workgroup, which then holds all of the row set's sums.
//
// Specialisation: Q4_0 | Q4_1 | Q8_0, ALIGNED, W4 (dequant.wgsl); TX / TO, F16, R (rows per team), RG,
// KT (teams per row group) and KSPLIT (KT > 1), KW / KWS / SCR_B, XQ4 (x's layout), BU
// (blocks per row in flight per lane), PF (prefetch before the pre-pass), XV4 and
// matvec_fuse.wgsl's BIAS, NORM, SWIGLU, RES and paired-row epilogues (PAIRS with GLU or ROPE: the
// workgroup's RPW rows, a whole number of them in the shard); MAXB (blocks of x the workgroup memory
// holds, >= K / 32).
// Needs subgroups (teams are subgroups of any size: team g = subgroup_id, += num_subgroups).
// Params and the bindings are in matvec_quant_io.wgsl (prepended).

const NB = 1u;
// Measurement builds only (`DRIFT_DP4A_DBG`, wrong results): 1 drops x's low term from the dot
// products, 2 replaces the arithmetic by an xor of the loaded words, 3 the weight loads by words made
// from the indices, 4 skips the pre-pass and reads x's blocks from global memory (20 words per block
// at the start of the weight binding, as a producer-quantized x would be read); 5 skips the product.
const DBG = {{DBG}}u;
const R = {{R}}u;
// Blocks per row a lane loads before using any (1, 2 or 4), and whether the first step's loads are
// issued before the pre-pass (PF).
const BU = {{BU}}u;
const RBU = R * BU;
const PF = {{PF}}u;
const WG = 256u;
const TEAMS = 8u;
// Row groups per workgroup: each team takes RG groups of R rows, so the pre-pass is shared by
// TEAMS * R * RG rows.
const RG = {{RG}}u;
// Teams per row group (KT): they split the row's blocks into KT slices and meet in kpart, so a product
// of few rows still runs many subgroups per row set (KT = 1: a team takes whole rows).
const KT = {{KT}}u;
// Rows per workgroup (the paired-row epilogues of matvec_fuse.wgsl pair them up).
const RPW = TEAMS / KT * R * RG;
const MAXB = {{MAXB}}u;
// Workgroups per row set (each takes a slice of the blocks, see the header).
const KW = {{KW}}u;

#if KWS
// Row sets' arrival counts (set i at i, zero between dispatches), then each row's KW partial sums
// (row r's slice j at nsets + r KW + j, f32 bits), then (NORM) each set's slices' sums of x^2 (set
// i's slice j at nsets + rows KW + i KW + j).
@group(0) @binding({{SCR_B}}) var<storage, read_write> kw_scr: array<atomic<u32>>;
var<workgroup> kw_last: u32;

fn kw_part(row: u32, j: u32) -> u32 {
    return (p.rows + RPW - 1u) / RPW + row * KW + j;
}

fn kw_sq(row_set: u32, j: u32) -> u32 {
    return (p.rows + RPW - 1u) / RPW + (p.rows + row_set) * KW + j;
}
#endif

// x block c: 8 words of 4 int8 qh (elements 4j .. 4j + 3 in word j), then 8 of ql, and (dx, sum x).
// Stored plane-major: the lanes of a team read consecutive blocks, so each of their loads reads one
// contiguous span, free of bank conflicts. Block-major (16 words of block c together) made the loads
// 16-way bank conflicts, which bounded the kernel on the H200 (Q4_0 and Q8_0 took nearly the same time
// per block). XQ4: 4 vec4 planes (vec4 i of block c at xq[i MAXB + c], 4 vector loads per block);
// else 16 word planes (word j at xq[j MAXB + c], 16 loads).
#if XQ4
var<workgroup> xq: array<vec4<u32>, MAXB * 4u>;
#else
var<workgroup> xq: array<u32, MAXB * 16u>;
#endif
var<workgroup> xd: array<vec2<f32>, MAXB>;
#if KSPLIT
// The teams' partial sums, team g's row r at g R + r.
var<workgroup> kpart: array<f32, TEAMS * RG * R>;
#endif
// Per-subgroup partial sums of x^2 (NORM), for up to WG subgroups.
var<workgroup> sq_part: array<f32, WG>;

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

// Quantizes block c of the (prologue'd) input into slot `at` of xq / xd.
fn quantize_block(at: u32, c: u32) {
    let e = 32u * c;
    let v0 = x_in4(0u, e);
    let v1 = x_in4(0u, e + 4u);
    let v2 = x_in4(0u, e + 8u);
    let v3 = x_in4(0u, e + 12u);
    let v4 = x_in4(0u, e + 16u);
    let v5 = x_in4(0u, e + 20u);
    let v6 = x_in4(0u, e + 24u);
    let v7 = x_in4(0u, e + 28u);
    let m = max(
        max(max(max4(abs(v0)), max4(abs(v1))), max(max4(abs(v2)), max4(abs(v3)))),
        max(max(max4(abs(v4)), max4(abs(v5))), max(max4(abs(v6)), max4(abs(v7)))),
    );
    let inv = select(0.0, 127.0 / m, m > 0.0);
    let s0 = v0 * inv;
    let s1 = v1 * inv;
    let s2 = v2 * inv;
    let s3 = v3 * inv;
    let s4 = v4 * inv;
    let s5 = v5 * inv;
    let s6 = v6 * inv;
    let s7 = v7 * inv;
#if XQ4
    xq[at] = vec4<u32>(hi8(s0), hi8(s1), hi8(s2), hi8(s3));
    xq[at + MAXB] = vec4<u32>(hi8(s4), hi8(s5), hi8(s6), hi8(s7));
    xq[at + 2u * MAXB] = vec4<u32>(lo8(s0), lo8(s1), lo8(s2), lo8(s3));
    xq[at + 3u * MAXB] = vec4<u32>(lo8(s4), lo8(s5), lo8(s6), lo8(s7));
#else
    split(s0, at);
    split(s1, at + MAXB);
    split(s2, at + 2u * MAXB);
    split(s3, at + 3u * MAXB);
    split(s4, at + 4u * MAXB);
    split(s5, at + 5u * MAXB);
    split(s6, at + 6u * MAXB);
    split(s7, at + 7u * MAXB);
#endif
    let sx = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7));
    xd[at] = vec2<f32>(m / 127.0, (sx.x + sx.y) + (sx.z + sx.w));
}

#ifnot XQ4
// Four scaled values as qh at xq[o] and ql at xq[o + 8 MAXB] (hi8, lo8).
fn split(s: vec4<f32>, o: u32) {
    xq[o] = hi8(s);
    xq[o + 8u * MAXB] = lo8(s);
}
#endif

// Four scaled values (|s| <= 127) as packed int8: qh = round(s), and ql = round((s - qh) 254).
fn hi8(s: vec4<f32>) -> u32 {
    return pack4xI8(vec4<i32>(round(s)));
}

fn lo8(s: vec4<f32>) -> u32 {
    return pack4xI8(vec4<i32>(round((s - round(s)) * 254.0)));
}

// DBG 4: vec4 i of the 5 per x block in global memory.
fn xg4(i: u32) -> vec4<u32> {
#if W4
    return w4[i];
#else
    return vec4<u32>(w[4u * i], w[4u * i + 1u], w[4u * i + 2u], w[4u * i + 3u]);
#endif
}

#if XQ
// x quantized by its producer (xq_produce.wgsl's layout), bound as vec4<u32> at binding 2: vec4 i of
// block c.
var<private> xq_first: u32;

fn xq4(c: u32, i: u32) -> vec4<u32> {
    return xs[tensor_base(2u) / 4u + 5u * (xq_first + c) + i];
}
#endif

// (dx, sum x, sum x^2 (XQ only)) of x's block in slot c.
fn x_meta(c: u32) -> vec3<f32> {
#if XQ
    return bitcast<vec3<f32>>(xq4(c, 4u).xyz);
#else
    if DBG == 4u {
        let v = xg4(5u * c + 4u);
        return vec3<f32>(bitcast<f32>(v.x & 0x3FFFFFFFu), bitcast<f32>(v.y & 0x3FFFFFFFu), 0.0);
    }
    return vec3<f32>(xd[c], 0.0);
#endif
}

// The int8 words of x's block c (qh then ql).
fn x_block(c: u32) -> array<u32, 16> {
#if XQ
    let h0 = xq4(c, 0u);
    let h1 = xq4(c, 1u);
    let l0 = xq4(c, 2u);
    let l1 = xq4(c, 3u);
    return array<u32, 16>(
        h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w, l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w,
    );
#else
    if DBG == 4u {
        let h0 = xg4(5u * c);
        let h1 = xg4(5u * c + 1u);
        let l0 = xg4(5u * c + 2u);
        let l1 = xg4(5u * c + 3u);
        return array<u32, 16>(
            h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w, l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w,
        );
    }
#if XQ4
    let h0 = xq[c];
    let h1 = xq[c + MAXB];
    let l0 = xq[c + 2u * MAXB];
    let l1 = xq[c + 3u * MAXB];
    return array<u32, 16>(
        h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w, l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w,
    );
#else
    let m = MAXB;
    return array<u32, 16>(
        xq[c], xq[c + m], xq[c + 2u * m], xq[c + 3u * m], xq[c + 4u * m], xq[c + 5u * m], xq[c + 6u * m],
        xq[c + 7u * m], xq[c + 8u * m], xq[c + 9u * m], xq[c + 10u * m], xq[c + 11u * m], xq[c + 12u * m],
        xq[c + 13u * m], xq[c + 14u * m], xq[c + 15u * m],
    );
#endif
#endif
}

// sum q x over a block in units of dx, from the 8 weight words `wq` (4 int8 or 4-bit values each, in
// x's element order) and the block's x words.
fn dot_block(wq: array<u32, 8>, x: array<u32, 16>) -> f32 {
    let h = ((dot4I8Packed(wq[0], x[0]) + dot4I8Packed(wq[1], x[1])) + (dot4I8Packed(wq[2], x[2]) + dot4I8Packed(wq[3], x[3])))
        + ((dot4I8Packed(wq[4], x[4]) + dot4I8Packed(wq[5], x[5])) + (dot4I8Packed(wq[6], x[6]) + dot4I8Packed(wq[7], x[7])));
    let l = ((dot4I8Packed(wq[0], x[8]) + dot4I8Packed(wq[1], x[9])) + (dot4I8Packed(wq[2], x[10]) + dot4I8Packed(wq[3], x[11])))
        + ((dot4I8Packed(wq[4], x[12]) + dot4I8Packed(wq[5], x[13])) + (dot4I8Packed(wq[6], x[14]) + dot4I8Packed(wq[7], x[15])));
    if DBG == 1u {
        return f32(h);
    }
    return fma(f32(l), 1.0 / 254.0, f32(h));
}

// Sixteen nibbles (elements 0..16 low, 16..32 high) as 8 words of 4-bit values in element order.
fn nibble_words(w0: u32, w1: u32, w2: u32, w3: u32) -> array<u32, 8> {
    let m = 0x0F0F0F0Fu;
    return array<u32, 8>(w0 & m, w1 & m, w2 & m, w3 & m, (w0 >> 4u) & m, (w1 >> 4u) & m, (w2 >> 4u) & m, (w3 >> 4u) & m);
}

#if Q4_0
fn block_dot(r: Raw, x: array<u32, 16>, dx: vec2<f32>) -> f32 {
    let o = r.odd;
    let a = r.a;
    if DBG == 2u {
        return bitcast<f32>((a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4]) & 0x807FFFFFu);
    }
    let q = nibble_words(at2(a[0], a[1], o), at2(a[1], a[2], o), at2(a[2], a[3], o), at2(a[3], a[4], o));
    return half0(a[0], o) * fma(dx.x, dot_block(q, x), -8.0 * dx.y);
}
#endif

#if Q4_1
fn block_dot(r: Raw, x: array<u32, 16>, dx: vec2<f32>) -> f32 {
    let o = r.odd;
    let a = r.a;
    let q = nibble_words(at0(a[1], a[2], o), at0(a[2], a[3], o), at0(a[3], a[4], o), at0(a[4], a[5], o));
    let dm = unpack2x16float(at0(a[0], a[1], o));
    return fma(dm.x * dx.x, dot_block(q, x), dm.y * dx.y);
}
#endif

#if Q8_0
fn block_dot(r: Raw, x: array<u32, 16>, dx: vec2<f32>) -> f32 {
    let o = r.odd;
    let a = r.a;
    let q = array<u32, 8>(
        at2(a[0], a[1], o), at2(a[1], a[2], o), at2(a[2], a[3], o), at2(a[3], a[4], o),
        at2(a[4], a[5], o), at2(a[5], a[6], o), at2(a[6], a[7], o), at2(a[7], a[8], o),
    );
    return half0(a[0], o) * dx.x * dot_block(q, x);
}
#endif

@compute @workgroup_size(WG)
fn matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
) {
    // DBG 5: the product is skipped (its in-situ cost in the model).
    if DBG == 5u {
        return;
    }
    let wgi = wid.x + wid.y * nwg.x;
    let wg_first = (wgi / KW) * RPW;
    // The workgroup's blocks [kb.x, kb.y) (all of them without KWS); xq / xd slot = block - kb.x.
    let kper = (p.nchunks + KW - 1u) / KW;
    let kb0 = min((wgi % KW) * kper, p.nchunks);
    let kb = vec2<u32>(kb0, min(kb0 + kper, p.nchunks));
    // A step's weight blocks: R rows x BU blocks per lane, all loaded before any is used.
    var wv: array<Raw, RBU>;
    var rb: array<u32, R>;
#if PF
    // The first step's loads go out before the pre-pass, so DRAM latency overlaps it.
    let sl0 = k_slice(sg, kb);
    if sg < TEAMS * RG && wg_first + (sg / KT) * R < p.rows && sl0.x + lane < sl0.y {
        row_bases(&rb, wg_first, sg / KT);
        load_step(&wv, &rb, sl0.x + lane, sgs, sl0.y);
    }
#endif

    // The input's sum of squares (NORM; XQN: per team, from the blocks; unused otherwise).
    var sumsq = 0.0;
#if XQ
    // 1. The input row arrives quantized by its producer: no pre-pass.
    xq_first = kb.x;
    // The pre-pass's workgroup memory stays allocated though unused (a product of no rows never
    // runs): it sets how many workgroups share an SM, and the 8B token was 0.22 ms slower on the
    // H200 without it (quant_dp4a.rs, workgroup_blocks).
    if MAXB > 1u && p.rows == 0u {
#if XQ4
        xq[lid % (4u * MAXB)] = vec4<u32>();
#else
        xq[lid % (16u * MAXB)] = 0u;
#endif
        xd[lid % MAXB] = vec2<f32>();
    }
#else
    // 1. The input row, quantized once per workgroup (and, with NORM, its sum of squares).
    fuse_begin_row();
    for (var c = lid; c < kb.y - kb.x && DBG != 4u; c += WG) {
        quantize_block(c, kb.x + c);
    }
#if NORM
    let part = subgroupAdd((sq[0].x + sq[0].y) + (sq[0].z + sq[0].w));
    if lane == 0u {
        sq_part[sg] = part;
    }
#endif
    if DBG != 4u {
        workgroupBarrier();
    }
#if NORM
    for (var i = 0u; i < nsg; i++) {
        sumsq += sq_part[i];
    }
#endif
#endif

    // 2. Teams of R rows; lanes stride over the blocks, BU blocks per row at a time.
    var loaded = PF == 1u;
    for (var g = sg; g < TEAMS * RG; g += nsg) {
        // Team g: rows rgi R .. of the workgroup, blocks sl.x .. sl.y of them.
        let rgi = g / KT;
        let sl = k_slice(g, kb);
        let first = wg_first + rgi * R;
        if first >= p.rows {
            break;
        }
        // Only the team's first group was prefetched.
        let prefetched = loaded;
        loaded = false;
        row_bases(&rb, wg_first, rgi);
        var acc: array<f32, R>;
        // XQN: the squares of the team's blocks (all of the row: KT = 1, KW = 1).
        var sq_acc = 0.0;
        for (var c = sl.x + lane; c < sl.y; c += BU * sgs) {
            if !(prefetched && c == sl.x + lane) {
                load_step(&wv, &rb, c, sgs, sl.y);
            }
            for (var u = 0u; u < BU; u++) {
                let cu = c + u * sgs;
                // Block c itself is inside the slice (the loop's condition).
                if u == 0u || cu < sl.y {
                    let x = x_block(cu - kb.x);
                    let xm = x_meta(cu - kb.x);
                    let dx = xm.xy;
#if XQN
                    sq_acc += xm.z;
#endif
                    for (var r = 0u; r < R; r++) {
                        acc[r] += block_dot(wv[r * BU + u], x, dx);
                    }
                }
            }
        }
#if XQN
        sumsq = subgroupAdd(sq_acc);
#endif
        for (var r = 0u; r < R; r++) {
            let s = subgroupAdd(acc[r]);
#if KSPLIT
            if lane == 0u {
                kpart[g * R + r] = s;
            }
#else
            let row = first + r;
            if lane == 0u && row < p.rows {
                finish_row(wg_first, rgi * R + r, s, sumsq, wgi % KW);
            }
#endif
        }
    }
#if KSPLIT
    // The KT slices of each row meet.
    workgroupBarrier();
    if lid < RPW && wg_first + lid < p.rows {
        let base = (lid / R) * KT * R + lid % R;
        var s = 0.0;
        for (var ks = 0u; ks < KT; ks++) {
            s += kpart[base + ks * R];
        }
        finish_row(wg_first, lid, s, sumsq, wgi % KW);
    }
#endif
#if KWS
    // Padding workgroups of a 2D grid (past the last row set) take no part.
    if wg_first < p.rows {
        // Every partial before the count (release); the last workgroup of the row set adds them.
#if NORM
        if lid == 0u {
            atomicStore(&kw_scr[kw_sq(wgi / KW, wgi % KW)], bitcast<u32>(sumsq));
        }
#endif
        storageBarrier();
        if lid == 0u {
            kw_last = u32(atomicAdd(&kw_scr[wgi / KW], 1u) == KW - 1u);
        }
        if workgroupUniformLoad(&kw_last) == 1u {
            storageBarrier();
            var sq_all = 0.0;
#if NORM
            for (var j = 0u; j < KW; j++) {
                sq_all += bitcast<f32>(atomicLoad(&kw_scr[kw_sq(wgi / KW, j)]));
            }
#endif
            if lid < RPW && wg_first + lid < p.rows {
                var s = 0.0;
                for (var j = 0u; j < KW; j++) {
                    s += bitcast<f32>(atomicLoad(&kw_scr[kw_part(wg_first + lid, j)]));
                }
                finish_total(wg_first, lid, s, sq_all);
            }
            if lid == 0u {
                atomicStore(&kw_scr[wgi / KW], 0u);
            }
#if PAIRS
            pair_finish(wg_first, lid);
#else
#if XQO
            xq_finish(p.row0 + wg_first, lid);
#endif
#endif
        }
    }
#else
#if PAIRS
    pair_finish(wg_first, lid);
#else
#if XQO
    xq_finish(p.row0 + wg_first, lid);
#endif
#endif
#endif
}

// Row rr of the workgroup is the sum s (with NORM, of the normed input, whose sum of squares is
// sumsq): its output, or its value kept for the paired-row epilogue, or (KWS) the partial sum of the
// workgroup's slice of the blocks.
fn finish_row(wg_first: u32, rr: u32, s: f32, sumsq: f32, slice: u32) {
#if KWS
    atomicStore(&kw_scr[kw_part(wg_first + rr, slice)], bitcast<u32>(s));
#else
    finish_total(wg_first, rr, s, sumsq);
#endif
}

// Row rr's whole sum s (and with NORM the input's sum of squares): its output, or its value kept for
// the paired-row epilogue.
fn finish_total(wg_first: u32, rr: u32, s: f32, sumsq: f32) {
#if NORM
    let red = vec2<f32>(s, sumsq);
#else
#if XQN
    // The producer applied the norm's weight; its 1 / rms from the blocks' squares.
    let red = s * inverseSqrt(sumsq / f32(p.k) + p.eps);
#else
    let red = s;
#endif
#endif
#if PAIRS
    pair_keep(rr, weight_row(wg_first, rr), red);
#else
    let v = write_out(wg_first + rr, 0u, red);
#if XQO
    xq_keep(rr, p.row0 + wg_first + rr, v);
#endif
#endif
}

// Team g's blocks of the row: [x, y), within the workgroup's blocks kb.
fn k_slice(g: u32, kb: vec2<u32>) -> vec2<u32> {
    let per = (kb.y - kb.x + KT - 1u) / KT;
    let c0 = min(kb.x + (g % KT) * per, kb.y);
    return vec2<u32>(c0, min(c0 + per, kb.y));
}

// Byte offsets of the R weight rows of the workgroup's row group g.
fn row_bases(rb: ptr<function, array<u32, R>>, wg_first: u32, g: u32) {
    for (var r = 0u; r < R; r++) {
        (*rb)[r] = tensor_base(1u) * 4u + p.wbyte + weight_row(wg_first, g * R + r) * p.row_bytes;
    }
}

// The raw blocks c, c + sgs, ... (BU of them, those before block `end`) of each of the R rows.
fn load_step(wv: ptr<function, array<Raw, RBU>>, rb: ptr<function, array<u32, R>>, c: u32, sgs: u32, end: u32) {
    for (var u = 0u; u < BU; u++) {
        let cu = c + u * sgs;
        if u == 0u || cu < end {
            for (var r = 0u; r < R; r++) {
#if Q4_0
                if DBG == 3u {
                    let h = (*rb)[r] ^ (cu * 2654435761u);
                    (*wv)[r * BU + u] = Raw(array<u32, 5>(h, h >> 3u, h >> 5u, h >> 7u, h >> 9u), true);
                } else {
                    (*wv)[r * BU + u] = load((*rb)[r], cu);
                }
#else
                (*wv)[r * BU + u] = load((*rb)[r], cu);
#endif
            }
        }
    }
}

// The weight row of the workgroup's row rr (rows past the end clamp to the last).
fn weight_row(wg_first: u32, rr: u32) -> u32 {
#if PAIRS
    return pair_row(wg_first, rr);
#else
    return min(wg_first + rr, p.rows - 1u);
#endif
}
