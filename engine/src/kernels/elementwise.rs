//! Binary elementwise ops with numpy broadcasting.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, float_defines, grid};
use crate::tensor::Tensor;
use crate::{shader, shape_err};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Mul,
}

impl BinaryOp {
    fn expr(self) -> &'static str {
        match self {
            BinaryOp::Add => "x + y",
            BinaryOp::Mul => "x * y",
        }
    }

    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Mul => "mul",
        }
    }
}

/// The broadcast shape of `a` and `b` (right-aligned, each dimension equal or 1).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(shape_err!(
                "cannot broadcast {a:?} with {b:?} (dimension {i}: {x} vs {y})"
            )),
        })
        .collect()
}

/// Element strides of `shape` as seen from `out` (rank 4, 0 where broadcast).
fn strides4(shape: &[usize], out: &[usize]) -> [u32; 4] {
    let mut s = [0u32; 4];
    let mut stride = 1usize;
    for k in 0..shape.len() {
        let d = shape.len() - 1 - k;
        let o = 3 - k;
        if shape[d] != 1 || out[out.len() - 1 - k] == 1 {
            s[o] = stride as u32;
        }
        stride *= shape[d];
    }
    s
}

/// `out = a OP b`, broadcasting `a` and `b` to `out`'s shape. All three share one float dtype.
pub fn binary(gpu: &Gpu, op: BinaryOp, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<Dispatch> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    if shape != out.shape {
        return Err(shape_err!(
            "{} of {:?} and {:?} gives {shape:?}, output is {:?}",
            op.name(),
            a.shape,
            b.shape,
            out.shape
        ));
    }
    if shape.len() > 4 {
        return Err(shape_err!("broadcasting supports rank <= 4, got {shape:?}"));
    }
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(shape_err!(
            "{}: dtypes differ ({:?}, {:?}, {:?})",
            op.name(),
            a.dtype,
            b.dtype,
            out.dtype
        ));
    }
    let mut shape4 = [1u32; 4];
    for (k, &d) in shape.iter().rev().enumerate() {
        shape4[3 - k] = d as u32;
    }
    let n = out.numel() as u32;
    let spec = KernelSpec::new(
        format!("{}_{}", op.name(), out.dtype.wgsl()),
        shader!("elementwise.wgsl"),
        "binary",
    )
    .defines(float_defines(out.dtype))
    .define("OP", op.expr());
    let kernel = gpu.kernel(&spec)?;
    let mut params = vec![n, 0, 0, 0];
    params.extend(shape4);
    params.extend(strides4(&a.shape, &shape));
    params.extend(strides4(&b.shape, &shape));
    let eb = out.elem_bytes() as f64;
    gpu.dispatch(
        &kernel,
        &params,
        &[a, b, out],
        grid(n.div_ceil(256), gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: n as f64,
            bytes: (a.numel() + b.numel() + out.numel()) as f64 * eb,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shape(&[2, 3], &[3]).unwrap(), vec![2, 3]);
        assert_eq!(broadcast_shape(&[2, 1, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
        assert!(broadcast_shape(&[2, 3], &[4]).is_err());
        assert_eq!(strides4(&[3], &[2, 3]), [0, 0, 0, 1]);
        assert_eq!(strides4(&[2, 1, 4], &[2, 3, 4]), [0, 4, 0, 1]);
    }
}
