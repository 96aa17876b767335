//! GEGLU, the feed-forward gate of Stable Diffusion's transformer blocks (diffusers' `GEGLU`): one
//! fused projection gives rows `[hidden, gate]` and `out = hidden * gelu_erf(gate)`. One pass, f32 math,
//! vec4 loads and stores where the inner width and the offsets allow. See `shaders/geglu.wgsl`.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::softmax::float_dtype;
use crate::kernels::{KernelSpec, float_defines, grid};
use crate::tensor::{DType, Tensor};
use crate::{shader, shape_err};

/// `out[.., i] = x[.., i] * gelu_erf(x[.., inner + i])` for `x` `[.., 2 inner]` and `out` `[.., inner]`
/// (same leading dimensions, one float dtype). `out` must not overlap `x`.
pub fn geglu(gpu: &Gpu, x: &Tensor, out: &Tensor) -> Result<Dispatch> {
    float_dtype("geglu input", x)?;
    if x.rank() == 0 || out.rank() != x.rank() {
        return Err(shape_err!(
            "geglu: input {:?} and output {:?} ranks differ",
            x.shape,
            out.shape
        ));
    }
    let inner = out.dim(-1);
    let r = x.rank();
    if x.shape[..r - 1] != out.shape[..r - 1] || x.dim(-1) != 2 * inner || x.dtype != out.dtype {
        return Err(shape_err!(
            "geglu: input {:?} {:?} must be [.., 2 * {inner}] of output {:?} {:?}",
            x.shape,
            x.dtype,
            out.shape,
            out.dtype
        ));
    }
    if x.dtype == DType::F16 && !gpu.caps.f16 {
        return Err(crate::DriftError::Unsupported(
            "f16 geglu on a device without shader-f16".into(),
        ));
    }
    if std::sync::Arc::ptr_eq(&x.storage.buffer, &out.storage.buffer)
        && x.storage.offset < out.storage.offset + out.storage.len
        && out.storage.offset < x.storage.offset + x.storage.len
    {
        return Err(shape_err!("geglu: output overlaps the input"));
    }
    if out.numel() >= u32::MAX as usize / 2 {
        return Err(shape_err!(
            "geglu: {:?} is too large for 32-bit indexing",
            x.shape
        ));
    }
    let aligned = |t: &Tensor| t.storage.offset.is_multiple_of(4 * t.elem_bytes());
    let vec = inner.is_multiple_of(4) && aligned(x) && aligned(out);
    let v = if vec { 4 } else { 1 };
    let (vt, vf) = if vec {
        (format!("vec4<{}>", x.dtype.wgsl()), "vec4<f32>".to_string())
    } else {
        (x.dtype.wgsl().to_string(), "f32".to_string())
    };
    let spec = KernelSpec::new(
        format!("geglu_{}{}", x.dtype.wgsl(), if vec { "_v4" } else { "" }),
        shader!("geglu.wgsl"),
        "geglu",
    )
    .defines(float_defines(x.dtype))
    .define("VEC", u8::from(vec))
    .define("V", vt)
    .define("VF", vf);
    let kernel = gpu.kernel(&spec)?;
    let n = out.numel() / v;
    gpu.dispatch(
        &kernel,
        &[n as u32, (inner / v) as u32],
        &[x, out],
        grid(
            n.div_ceil(256) as u32,
            gpu.caps.max_workgroups_per_dimension,
        ),
        Cost {
            flops: out.numel() as f64 * 12.0,
            bytes: (x.byte_len() + out.byte_len()) as f64,
        },
    )
}
