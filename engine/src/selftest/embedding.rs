//! Checks for the embedding gather (the reference is a plain copy, written here).

use super::softmax::{guard, output_at, outside_untouched, tensor_at};
use super::{Check, Rng, compare, float_dtypes, random, round_to, store_rtol};
use crate::error::Result;
use crate::exec::Program;
use crate::gpu::Gpu;
use crate::kernels::embedding::{EmbeddingOptions, embedding, embedding_shards};
use crate::memory::Category;
use crate::tensor::{BINDING_ALIGN, DType, Layout, Tensor};
use rand::Rng as _;

/// `out[t] = table[ids[t]]`, zeros for ids past the table.
fn reference(table: &[f32], dim: usize, ids: &[u32], out_dtype: DType) -> Vec<f64> {
    let vocab = table.len() / dim;
    ids.iter()
        .flat_map(|&id| {
            (0..dim).map(move |c| {
                let v = if (id as usize) < vocab {
                    table[id as usize * dim + c]
                } else {
                    0.0
                };
                round_to(v, out_dtype) as f64
            })
        })
        .collect()
}

struct Case {
    vocab: usize,
    dim: usize,
    n: usize,
    /// Rows per table shard (`None`: one binding).
    shard_rows: Option<usize>,
    /// Shards in separate buffers (`Gpu::weight_rows`) rather than views of one.
    separate_buffers: bool,
    out_off: usize,
}

pub fn checks(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let cases = [
        Case {
            vocab: 37,
            dim: 20,
            n: 13,
            shard_rows: None,
            separate_buffers: false,
            out_off: 0,
        },
        Case {
            vocab: 37,
            dim: 7,
            n: 11,
            shard_rows: Some(5),
            separate_buffers: false,
            out_off: 3,
        },
        Case {
            vocab: 50,
            dim: 12,
            n: 9,
            shard_rows: Some(7),
            separate_buffers: false,
            out_off: 4,
        },
        Case {
            vocab: 29,
            dim: 33,
            n: 8,
            shard_rows: Some(4),
            separate_buffers: true,
            out_off: 0,
        },
        // Rows wider than one workgroup's 1024 vectors (scalar and vec4).
        Case {
            vocab: 9,
            dim: 4101,
            n: 6,
            shard_rows: Some(4),
            separate_buffers: false,
            out_off: 1,
        },
        Case {
            vocab: 7,
            dim: 4112,
            n: 5,
            shard_rows: None,
            separate_buffers: false,
            out_off: 0,
        },
        Case {
            vocab: 300,
            dim: 64,
            n: 1,
            shard_rows: Some(64),
            separate_buffers: false,
            out_off: 0,
        },
    ];
    for tt in float_dtypes(gpu) {
        for to in float_dtypes(gpu) {
            for c in &cases {
                out.push(check(gpu, rng, c, tt, to)?);
            }
        }
    }
    Ok(out)
}

fn check(gpu: &Gpu, rng: &mut Rng, c: &Case, tt: DType, to: DType) -> Result<Check> {
    let tv = random(rng, c.vocab * c.dim, -3.0, 3.0, tt);
    let mut ids: Vec<u32> = (0..c.n)
        .map(|_| rng.random_range(0..c.vocab as u32))
        .collect();
    // First and last rows, and ids past the table (which must give zeros and read nothing).
    for (i, id) in [
        0,
        c.vocab as u32 - 1,
        c.vocab as u32,
        u32::MAX,
        c.vocab as u32 + 17,
    ]
    .into_iter()
    .enumerate()
    {
        if i < c.n {
            ids[(i * 5 + 1) % c.n] = id;
        }
    }
    let id_bytes: Vec<u8> = [9u32]
        .iter()
        .chain(&ids)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let ids_base = gpu.tensor_from_bytes(
        "ids",
        &[c.n + 1],
        DType::U32,
        Layout::RowMajor,
        &id_bytes,
        Category::Activations,
    )?;
    let ids_t = ids_base.view(1, &[c.n])?;
    let (o, ob) = output_at(gpu, "out", &[c.n, c.dim], to, c.out_off)?;
    let row_bytes = tt.bytes_for(c.dim)?;
    let ds = if c.separate_buffers {
        let rows = c.shard_rows.unwrap_or(c.vocab);
        let bytes = crate::gpu::encode_f32(&tv, tt)?;
        let shards = gpu.weight_rows(
            "table",
            &[c.vocab, c.dim],
            tt,
            Layout::RowMajor,
            &bytes,
            rows as u64 * row_bytes,
        )?;
        embedding_shards(gpu, &shards, c.vocab, &ids_t, &o)?
    } else {
        // The table at an offset inside its buffer, so shards start off binding boundaries.
        let (table, _): (Tensor, Tensor) = tensor_at(gpu, "table", &[c.vocab, c.dim], tt, &tv, 4)?;
        let opts = EmbeddingOptions {
            max_binding: c.shard_rows.map(|r| BINDING_ALIGN + r as u64 * row_bytes),
        };
        embedding(gpu, &table, &ids_t, &o, &opts)?
    };
    let name = format!(
        "{} x{} vocab {} dim {} ids {} shard rows {:?}{} out@{}",
        ds[0].name,
        ds.len(),
        c.vocab,
        c.dim,
        c.n,
        c.shard_rows,
        if c.separate_buffers { " (buffers)" } else { "" },
        c.out_off
    );
    let mut prog = Program::new();
    prog.extend(ds);
    prog.run(gpu)?;
    let want = reference(&tv, c.dim, &ids, to);
    // A copy: exact, except that narrowing f32 to f16 may round either way on some devices.
    let rtol = if tt == DType::F32 && to == DType::F16 {
        store_rtol(DType::F16)
    } else {
        0.0
    };
    let untouched = outside_untouched(gpu, &ob, c.out_off, c.n * c.dim)?;
    Ok(guard(
        compare(name, &gpu.read_f32(&o)?, &want, 1e-30, rtol),
        untouched,
    ))
}
