//! Bulk tensor copy in 16-byte units.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, grid};
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// Copies `src` into `dst` (same byte length, a multiple of 16, both 16-byte aligned).
pub fn copy(gpu: &Gpu, src: &Tensor, dst: &Tensor) -> Result<Dispatch> {
    let len = src.byte_len();
    if len != dst.byte_len()
        || !len.is_multiple_of(16)
        || !src.storage.offset.is_multiple_of(16)
        || !dst.storage.offset.is_multiple_of(16)
    {
        return Err(shape_err!(
            "copy needs equal, 16-byte aligned sizes and offsets (src {len} bytes at {}, dst {} at {})",
            src.storage.offset,
            dst.byte_len(),
            dst.storage.offset
        ));
    }
    // Seen by the kernel as u32 words (base offsets in the params header count u32s).
    let as_words = |t: &Tensor| Tensor {
        dtype: DType::U32,
        shape: vec![(len / 4) as usize],
        ..t.clone()
    };
    let (s, d) = (as_words(src), as_words(dst));
    let n = (len / 16) as u32;
    let kernel = gpu.kernel(&KernelSpec::new(
        "copy_vec4",
        shader!("copy.wgsl"),
        "copy_vec4",
    ))?;
    gpu.dispatch(
        &kernel,
        &[n],
        &[&s, &d],
        grid(n.div_ceil(256), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: 0.0,
            bytes: 2.0 * len as f64,
        },
    )
}
