//! Unary elementwise ops: scale and the activations the models use.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, float_defines, grid};
use crate::tensor::Tensor;
use crate::{shader, shape_err};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `x * alpha`
    Scale(f32),
    /// `x * sigmoid(x)`
    Silu,
    /// GELU with the tanh approximation (GPT-2, "gelu_pytorch_tanh").
    GeluTanh,
    /// Exact GELU with erf (CLIP ViT-L "gelu", diffusers' GEGLU).
    GeluErf,
    /// `x * sigmoid(1.702 x)` (OpenAI CLIP).
    QuickGelu,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Scale(_) => "scale",
            UnaryOp::Silu => "silu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::QuickGelu => "quick_gelu",
        }
    }

    fn expr(self) -> &'static str {
        match self {
            UnaryOp::Scale(_) => "x * p.alpha",
            UnaryOp::Silu => "x / (1.0 + exp(-x))",
            UnaryOp::GeluTanh => {
                "0.5 * x * (1.0 + tanh_safe(0.7978845608 * (x + 0.044715 * x * x * x)))"
            }
            UnaryOp::GeluErf => "0.5 * x * (1.0 + erf_approx(x * 0.7071067812))",
            UnaryOp::QuickGelu => "x / (1.0 + exp(-1.702 * x))",
        }
    }

    fn alpha(self) -> f32 {
        match self {
            UnaryOp::Scale(a) => a,
            _ => 0.0,
        }
    }
}

/// `out = op(x)`; `x` and `out` have the same shape and float dtype (may be the same tensor).
pub fn unary(gpu: &Gpu, op: UnaryOp, x: &Tensor, out: &Tensor) -> Result<Dispatch> {
    if x.numel() != out.numel() || x.dtype != out.dtype {
        return Err(shape_err!(
            "{}: input {:?} {:?} vs output {:?} {:?}",
            op.name(),
            x.shape,
            x.dtype,
            out.shape,
            out.dtype
        ));
    }
    let n = x.numel() as u32;
    let spec = KernelSpec::new(
        format!("{}_{}", op.name(), x.dtype.wgsl()),
        shader!("activation.wgsl"),
        "unary",
    )
    .defines(float_defines(x.dtype))
    .define("EXPR", op.expr());
    let kernel = gpu.kernel(&spec)?;
    gpu.dispatch(
        &kernel,
        &[n, op.alpha().to_bits(), 0],
        &[x, out],
        grid(n.div_ceil(256), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: n as f64 * 8.0,
            bytes: 2.0 * n as f64 * x.elem_bytes() as f64,
        },
    )
}

/// `out[t, i] = silu(gu[t, i]) * gu[t, inner + i]` for a fused gate/up projection `gu` `[T, 2 inner]`.
pub fn swiglu(gpu: &Gpu, gu: &Tensor, out: &Tensor) -> Result<Dispatch> {
    let inner = out.dim(-1);
    if gu.numel() != 2 * out.numel() || gu.dim(-1) != 2 * inner || gu.dtype != out.dtype {
        return Err(shape_err!(
            "swiglu: gate/up {:?} {:?} vs output {:?} {:?}",
            gu.shape,
            gu.dtype,
            out.shape,
            out.dtype
        ));
    }
    let n = out.numel() as u32;
    let spec = KernelSpec::new(
        format!("swiglu_{}", out.dtype.wgsl()),
        shader!("activation.wgsl"),
        "swiglu",
    )
    .defines(float_defines(out.dtype))
    .define("EXPR", "x");
    let kernel = gpu.kernel(&spec)?;
    gpu.dispatch(
        &kernel,
        &[n, 0, inner as u32],
        &[gu, out],
        grid(n.div_ceil(256), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: n as f64 * 6.0,
            bytes: 3.0 * n as f64 * out.elem_bytes() as f64,
        },
    )
}
