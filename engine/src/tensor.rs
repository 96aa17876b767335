//! Logical tensors over physical storage (ML Drift's tensor virtualisation): a tensor is a shape, a
//! dtype and a layout; where its bytes live is a separate [`Storage`] (buffer, byte offset, length), so
//! views, reshapes and row shards cost no copies.

use std::sync::Arc;

use serde::Serialize;

use crate::error::Result;
use crate::memory::GpuBuffer;
use crate::shape_err;

/// Element types. Block-quantised types store `block_elems` values in `block_bytes` bytes (GGML layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
}

impl DType {
    /// Values per block (1 for plain types).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::U32 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes for `n` values; `n` must be a whole number of blocks for quantised types.
    pub fn bytes_for(self, n: usize) -> Result<u64> {
        if !n.is_multiple_of(self.block_elems()) {
            return Err(shape_err!(
                "{n} values of {self:?} are not a whole number of blocks"
            ));
        }
        Ok((n / self.block_elems() * self.block_bytes()) as u64)
    }

    /// The WGSL scalar type for plain types.
    pub fn wgsl(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            _ => "u32",
        }
    }
}

/// How the bytes of a tensor are arranged, recorded so each kernel can check it gets the layout it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Layout {
    /// Last dimension contiguous (C order).
    RowMajor,
    /// A 2-D matrix `[rows, cols]` stored as its transpose `[cols, rows]` (e.g. a weight laid out K-major
    /// for a matmul that streams along K).
    Transposed,
    /// Images/activations as `[N, C, H, W]`.
    Nchw,
    /// GGML quantised blocks along the last dimension, rows contiguous.
    Blocks,
}

/// Where a tensor's bytes are.
#[derive(Clone, Debug)]
pub struct Storage {
    pub buffer: Arc<GpuBuffer>,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub layout: Layout,
    pub storage: Storage,
}

/// What a kernel binds for a tensor: the buffer range from the closest aligned offset below the tensor,
/// and how many elements into that range the tensor starts.
pub struct Binding<'a> {
    pub resource: wgpu::BindingResource<'a>,
    pub base_elems: u32,
}

/// Storage-binding offsets must be multiples of this on every device Drift supports.
pub const BINDING_ALIGN: u64 = 256;

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Size of dimension `d`, counting from the end when negative.
    pub fn dim(&self, d: isize) -> usize {
        let i = if d < 0 {
            self.shape.len() as isize + d
        } else {
            d
        };
        self.shape[i as usize]
    }

    pub fn byte_len(&self) -> u64 {
        self.storage.len
    }

    /// Bytes per plain element (quantised tensors count in u32 words).
    pub fn elem_bytes(&self) -> u64 {
        if self.dtype.is_quantized() {
            4
        } else {
            self.dtype.block_bytes() as u64
        }
    }

    /// Same bytes, new shape with the same number of elements.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(shape_err!("cannot reshape {:?} to {shape:?}", self.shape));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// A view of `shape` starting `elem_offset` elements into this tensor; no copy.
    pub fn view(&self, elem_offset: usize, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let start = self.dtype.bytes_for(elem_offset)?;
        let len = self.dtype.bytes_for(n)?;
        if start + len > self.storage.len {
            return Err(shape_err!(
                "view of {shape:?} at element {elem_offset} exceeds a tensor of {:?}",
                self.shape
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: self.dtype,
            layout: self.layout,
            storage: Storage {
                buffer: self.storage.buffer.clone(),
                offset: self.storage.offset + start,
                len,
            },
        })
    }

    /// Rows `start..end` of the leading dimension, as a view.
    pub fn rows(&self, start: usize, end: usize) -> Result<Tensor> {
        let row: usize = self.shape[1..].iter().product();
        let mut shape = self.shape.clone();
        shape[0] = end - start;
        self.view(start * row, &shape)
    }

    /// The binding for this tensor. Fails when the range is over the device's storage binding limit:
    /// callers then shard with [`Tensor::row_shards`].
    pub fn binding(&self, max_binding: u64) -> Result<Binding<'_>> {
        let aligned = self.storage.offset / BINDING_ALIGN * BINDING_ALIGN;
        let pad = self.storage.offset - aligned;
        let size = (pad + self.storage.len).div_ceil(4) * 4;
        let size = size.min(self.storage.buffer.size() - aligned);
        if size > max_binding {
            return Err(shape_err!(
                "tensor {:?} ({} bytes) is over the device's {max_binding}-byte storage binding",
                self.shape,
                size
            ));
        }
        if !pad.is_multiple_of(self.elem_bytes()) {
            return Err(shape_err!(
                "tensor offset {} is not element aligned",
                self.storage.offset
            ));
        }
        Ok(Binding {
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.storage.buffer.buffer,
                offset: aligned,
                size: std::num::NonZeroU64::new(size.max(4)),
            }),
            base_elems: (pad / self.elem_bytes()) as u32,
        })
    }

    /// Splits along the leading dimension into views that each fit in `max_binding` bytes (plus the
    /// alignment padding a binding may need). Weights bigger than one binding are consumed shard by shard.
    pub fn row_shards(&self, max_binding: u64) -> Result<Vec<RowShard>> {
        let rows = self.shape[0];
        let row_bytes = self.storage.len / rows.max(1) as u64;
        let per = ((max_binding.saturating_sub(BINDING_ALIGN)) / row_bytes.max(1)) as usize;
        if per == 0 {
            return Err(shape_err!(
                "one row of {:?} is larger than a storage binding",
                self.shape
            ));
        }
        let mut out = Vec::new();
        let mut r = 0;
        while r < rows {
            let e = (r + per).min(rows);
            out.push(RowShard {
                row_start: r,
                tensor: self.rows(r, e)?,
            });
            r = e;
        }
        Ok(out)
    }
}

/// A contiguous block of rows of a larger (logical) tensor.
#[derive(Clone, Debug)]
pub struct RowShard {
    pub row_start: usize,
    pub tensor: Tensor,
}
