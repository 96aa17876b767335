//! Allocation, upload and readback on [`Gpu`], with out-of-memory turned into errors.

use std::sync::Arc;

use half::f16;

use super::Gpu;
use crate::error::{DriftError, Result};
use crate::memory::{Category, GpuBuffer};
use crate::shape_err;
use crate::tensor::{DType, Layout, RowShard, Storage, Tensor};

const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    /// A tracked buffer; out-of-memory and over-limit sizes become errors instead of a lost device.
    pub fn create_buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        category: Category,
    ) -> Result<Arc<GpuBuffer>> {
        let size = size.max(4).div_ceil(4) * 4;
        if size > self.caps.max_buffer_size {
            return Err(DriftError::OutOfMemory {
                what: format!(
                    "{label} (over the device's {}-byte buffer limit)",
                    self.caps.max_buffer_size
                ),
                bytes: size,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(DriftError::OutOfMemory {
                what: format!("{label}: {e}"),
                bytes: size,
            });
        }
        Ok(Arc::new(GpuBuffer::new(
            buffer,
            category,
            self.memory().clone(),
        )))
    }

    /// An uninitialised tensor in its own buffer.
    pub fn tensor(
        &self,
        label: &str,
        shape: &[usize],
        dtype: DType,
        category: Category,
    ) -> Result<Tensor> {
        let len = dtype.bytes_for(shape.iter().product())?;
        let buffer = self.create_buffer(label, len, STORAGE_USAGE, category)?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            layout: Layout::RowMajor,
            storage: Storage {
                buffer,
                offset: 0,
                len,
            },
        })
    }

    /// A u32 tensor of `words` zeros: the scratch of kernels whose workgroups count their arrivals
    /// (the last to arrive merges the others' partial results and sets its count back to zero).
    pub fn arrival_scratch(&self, label: &str, words: usize) -> Result<Tensor> {
        self.tensor_from_bytes(
            label,
            &[words],
            DType::U32,
            Layout::RowMajor,
            &vec![0u8; words * 4],
            Category::Activations,
        )
    }

    /// A tensor holding `bytes` (already in `dtype`'s encoding and `layout`; blocks in GGUF order,
    /// which [`crate::kernels::quant_rows::to_gpu`] turns into the kernels' row layout).
    pub fn tensor_from_bytes(
        &self,
        label: &str,
        shape: &[usize],
        dtype: DType,
        layout: Layout,
        bytes: &[u8],
        category: Category,
    ) -> Result<Tensor> {
        let mut t = self.tensor(label, shape, dtype, category)?;
        if bytes.len() as u64 != t.storage.len {
            return Err(shape_err!(
                "{label}: {} bytes given for {shape:?} {dtype:?} ({} expected)",
                bytes.len(),
                t.storage.len
            ));
        }
        t.layout = layout;
        if layout == Layout::Blocks {
            let k = shape.last().copied().unwrap_or(0);
            self.write_tensor_bytes(&t, &crate::kernels::quant_rows::to_gpu(dtype, k, bytes)?)?;
        } else {
            self.write_tensor_bytes(&t, bytes)?;
        }
        Ok(t)
    }

    /// f32 values stored as `dtype` (f32 or f16), row-major.
    pub fn tensor_from_f32(
        &self,
        label: &str,
        shape: &[usize],
        dtype: DType,
        values: &[f32],
        category: Category,
    ) -> Result<Tensor> {
        let bytes = encode_f32(values, dtype)?;
        self.tensor_from_bytes(label, shape, dtype, Layout::RowMajor, &bytes, category)
    }

    /// A weight that may be larger than one buffer: rows are spread over as many buffers as needed
    /// (each at most `max_buffer_bytes`, normally the device's limit) and returned as row shards.
    pub fn weight_rows(
        &self,
        label: &str,
        shape: &[usize],
        dtype: DType,
        layout: Layout,
        bytes: &[u8],
        max_buffer_bytes: u64,
    ) -> Result<Vec<RowShard>> {
        let rows = shape[0];
        let row_bytes = dtype.bytes_for(shape[1..].iter().product())? as usize;
        if row_bytes * rows != bytes.len() {
            return Err(shape_err!(
                "{label}: {} bytes given for {shape:?} {dtype:?}",
                bytes.len()
            ));
        }
        let per =
            (max_buffer_bytes.min(self.caps.max_buffer_size) as usize / row_bytes.max(1)).max(1);
        let mut shards = Vec::new();
        let mut r = 0;
        while r < rows {
            let e = (r + per).min(rows);
            let mut s = shape.to_vec();
            s[0] = e - r;
            let t = self.tensor_from_bytes(
                label,
                &s,
                dtype,
                layout,
                &bytes[r * row_bytes..e * row_bytes],
                Category::Weights,
            )?;
            shards.push(RowShard {
                row_start: r,
                tensor: t,
            });
            r = e;
        }
        Ok(shards)
    }

    pub fn write_tensor_bytes(&self, t: &Tensor, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > t.storage.len {
            return Err(shape_err!(
                "{} bytes written into a {}-byte tensor",
                bytes.len(),
                t.storage.len
            ));
        }
        // Queue writes move whole 4-byte words: the tail of an odd-length write is padded with zeros,
        // which stays inside the tensor's buffer (buffers are sized in whole words).
        if !t.storage.offset.is_multiple_of(4) {
            return Err(shape_err!(
                "unaligned tensor write at offset {}",
                t.storage.offset
            ));
        }
        if bytes.len().is_multiple_of(4) {
            self.queue
                .write_buffer(&t.storage.buffer.buffer, t.storage.offset, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue
                .write_buffer(&t.storage.buffer.buffer, t.storage.offset, &padded);
        }
        Ok(())
    }

    pub fn write_tensor_f32(&self, t: &Tensor, values: &[f32]) -> Result<()> {
        self.write_tensor_bytes(t, &encode_f32(values, t.dtype)?)
    }

    /// Fills a tensor with 0xFF bytes (NaN in f32 and f16) so a kernel that skips an element is caught.
    pub fn poison(&self, t: &Tensor) -> Result<()> {
        self.write_tensor_bytes(t, &vec![0xFF; t.storage.len as usize])
    }

    /// Copies a tensor's bytes back to the CPU (blocking).
    pub fn read_bytes(&self, t: &Tensor) -> Result<Vec<u8>> {
        let start = t.storage.offset / 4 * 4;
        let end = (t.storage.offset + t.storage.len).div_ceil(4) * 4;
        let staging = self.create_buffer(
            "readback",
            end - start,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            Category::Staging,
        )?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(
            &t.storage.buffer.buffer,
            start,
            &staging.buffer,
            0,
            end - start,
        );
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.buffer.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|e| DriftError::Gpu(e.to_string()))?
            .map_err(|e| DriftError::Gpu(format!("readback failed: {e}")))?;
        let view = staging
            .buffer
            .get_mapped_range(..)
            .map_err(|e| DriftError::Gpu(format!("readback failed: {e:?}")))?;
        let skip = (t.storage.offset - start) as usize;
        let out = view[skip..skip + t.storage.len as usize].to_vec();
        drop(view);
        staging.buffer.unmap();
        Ok(out)
    }

    /// Reads an f32/f16/u32 tensor as f32 values.
    pub fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(t)?;
        decode_f32(&bytes, t.dtype)
    }
}

/// Encodes f32 values as `dtype` bytes (f32, f16, bf16).
pub fn encode_f32(values: &[f32], dtype: DType) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        other => {
            return Err(DriftError::Unsupported(format!(
                "encoding f32 as {other:?}"
            )));
        }
    })
}

/// Decodes f32/f16/bf16/u32 bytes to f32.
pub fn decode_f32(bytes: &[u8], dtype: DType) -> Result<Vec<f32>> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::U32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(DriftError::Unsupported(format!(
                "decoding {other:?} as f32"
            )));
        }
    })
}
