// Embedding gather: out[t, :] = table[ids[t], :] for the ids inside this dispatch's row shard
// [row_start, row_start + shard_rows); ids >= vocab are written as zeros by the dispatch that has
// ZERO_OOB (the first shard), so no id ever reads out of bounds. Other ids are left to other shards.
//
// Specialisation:
//   TT, TO     element types of table and out (f32|f16); F16 when either is f16
//   VEC4       table and out bound as vec4 arrays (dim % 4 == 0 and both base offsets % 4 == 0)
#if F16
enable f16;
#endif

struct Params {
    off_table: u32, off_ids: u32, off_out: u32, o3: u32, o4: u32, o5: u32, o6: u32, o7: u32,
    n_ids: u32,
    dim_v: u32,       // vectors per row
    row_start: u32,
    shard_rows: u32,
    vocab: u32,
    zero_oob: u32,
    blocks: u32,      // workgroups per row (1024 vectors each)
}

@group(0) @binding(0) var<uniform> p: Params;
#if VEC4
@group(0) @binding(1) var<storage, read> table: array<vec4<{{TT}}>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<{{TO}}>>;
alias VO = vec4<{{TO}}>;
const VW: u32 = 4u;
#else
@group(0) @binding(1) var<storage, read> table: array<{{TT}}>;
@group(0) @binding(3) var<storage, read_write> out: array<{{TO}}>;
alias VO = {{TO}};
const VW: u32 = 1u;
#endif
@group(0) @binding(2) var<storage, read> ids: array<u32>;

// A workgroup copies up to 4 * 256 vectors of one token's row: the id is read once per thread and
// the four loads are issued before the stores.
@compute @workgroup_size(256)
fn gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let wg = wid.x + wid.y * nwg.x;
    let t = wg / p.blocks;
    if t >= p.n_ids {
        return;
    }
    let c0 = (wg % p.blocks) * 1024u + lid;
    let id = ids[p.off_ids + t];
    // Unsigned: ids below row_start wrap around and fail the test too.
    let local = id - p.row_start;
    let o = p.off_out / VW + t * p.dim_v;
    if local < p.shard_rows {
        let src = p.off_table / VW + local * p.dim_v;
        var a: array<VO, 4>;
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k * 256u;
            if c < p.dim_v {
                a[k] = VO(table[src + c]);
            }
        }
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k * 256u;
            if c < p.dim_v {
                out[o + c] = a[k];
            }
        }
    } else if p.zero_oob != 0u && id >= p.vocab {
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k * 256u;
            if c < p.dim_v {
                out[o + c] = VO(0.0);
            }
        }
    }
}
