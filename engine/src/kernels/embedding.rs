//! Embedding gather: rows of a table (f32 or f16, possibly larger than one storage binding) by token
//! ids read on the GPU.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::softmax::{float_dtype, vec4_ok};
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, RowShard, Tensor};
use crate::{shader, shape_err};

/// Options of [`embedding`].
#[derive(Clone, Copy, Debug, Default)]
pub struct EmbeddingOptions {
    /// Largest binding a table shard may take; `None` is the device's storage binding limit. Tests
    /// set it small to exercise sharding.
    pub max_binding: Option<u64>,
}

/// `out[t] = table[ids[t]]` for `table` `[vocab, dim]`, `ids` U32 `[n]`, `out` `[n, dim]` (f32 or f16
/// each); ids >= vocab give zero rows. The table is split into row shards that each fit one binding,
/// one dispatch per shard.
pub fn embedding(
    gpu: &Gpu,
    table: &Tensor,
    ids: &Tensor,
    out: &Tensor,
    opts: &EmbeddingOptions,
) -> Result<Vec<Dispatch>> {
    if table.rank() != 2 {
        return Err(shape_err!(
            "embedding: table {:?} must be [vocab, dim]",
            table.shape
        ));
    }
    let shards = table.row_shards(opts.max_binding.unwrap_or(gpu.caps.max_storage_binding))?;
    embedding_shards(gpu, &shards, table.shape[0], ids, out)
}

/// [`embedding`] over a table already held as row shards (for example one spread over several
/// buffers by `Gpu::weight_rows`); `vocab` is the total number of rows. Every shard must fit one
/// storage binding.
pub fn embedding_shards(
    gpu: &Gpu,
    shards: &[RowShard],
    vocab: usize,
    ids: &Tensor,
    out: &Tensor,
) -> Result<Vec<Dispatch>> {
    let first = shards
        .first()
        .ok_or_else(|| shape_err!("embedding: no table shards"))?;
    let dim = first.tensor.shape.get(1).copied().unwrap_or(0);
    let mut next = 0;
    for s in shards {
        float_dtype("embedding table", &s.tensor)?;
        if s.tensor.rank() != 2 || s.tensor.shape[1] != dim || s.tensor.dtype != first.tensor.dtype
        {
            return Err(shape_err!(
                "embedding: table shards differ ({:?} vs {:?})",
                s.tensor.shape,
                first.tensor.shape
            ));
        }
        if s.row_start != next {
            return Err(shape_err!(
                "embedding: shard at row {} where {next} was expected",
                s.row_start
            ));
        }
        next += s.tensor.shape[0];
    }
    if next != vocab {
        return Err(shape_err!(
            "embedding: shards hold {next} rows, vocab is {vocab}"
        ));
    }
    float_dtype("embedding output", out)?;
    let n = ids.numel();
    if ids.dtype != DType::U32 || out.shape != [n, dim] {
        return Err(shape_err!(
            "embedding: ids {:?} {:?} and output {:?} for rows of {dim} (want U32 [n], [n, {dim}])",
            ids.dtype,
            ids.shape,
            out.shape
        ));
    }
    if vocab > u32::MAX as usize || n * dim > u32::MAX as usize {
        return Err(shape_err!(
            "embedding: {vocab} x {dim} table or {n} ids too large"
        ));
    }
    let tt = first.tensor.dtype;
    let mut dispatches = Vec::with_capacity(shards.len());
    for (i, s) in shards.iter().enumerate() {
        let vec4 = vec4_ok(gpu, dim, &[&s.tensor, out])?;
        let vw = if vec4 { 4 } else { 1 };
        let name = format!(
            "embedding_{}_{}{}",
            tt.wgsl(),
            out.dtype.wgsl(),
            if vec4 { "_v4" } else { "" }
        );
        let spec = KernelSpec::new(name, shader!("embedding.wgsl"), "gather")
            .define("TT", tt.wgsl())
            .define("TO", out.dtype.wgsl())
            .define("F16", u8::from(tt == DType::F16 || out.dtype == DType::F16))
            .define("VEC4", u8::from(vec4));
        let kernel = gpu.kernel(&spec)?;
        let blocks = (dim / vw).div_ceil(1024);
        // Each shard reads the ids and its share of rows; a full copy's worth over all shards.
        let share = if shards.len() == 1 {
            1.0
        } else {
            s.tensor.shape[0] as f64 / vocab as f64
        };
        dispatches.push(gpu.dispatch(
            &kernel,
            &[
                n as u32,
                (dim / vw) as u32,
                s.row_start as u32,
                s.tensor.shape[0] as u32,
                vocab as u32,
                u32::from(i == 0),
                blocks as u32,
            ],
            &[&s.tensor, ids, out],
            grid((n * blocks) as u32, gpu.caps.max_workgroups_per_dimension),
            Cost {
                flops: 0.0,
                bytes: n as f64 * 4.0
                    + share * (n * dim) as f64 * (s.tensor.elem_bytes() + out.elem_bytes()) as f64,
            },
        )?);
    }
    Ok(dispatches)
}
