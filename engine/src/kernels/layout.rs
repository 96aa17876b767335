//! Layout ops for the UNet and attention: nearest 2x upsampling, channel concatenation (skip
//! connections) and permutations of rank <= 4 (transposes, NCHW <-> NHWC, heads split/merge).
//! All are pure copies: they use vec4 accesses where sizes and offsets are multiples of 4, and the
//! permutations that move the last dimension go through 32x32 workgroup-memory tiles so both the reads
//! and the writes are contiguous. See `shaders/layout.wgsl`.

use crate::error::{DriftError, Result};
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, float_defines, grid};
use crate::tensor::{DType, Layout, Tensor};
use crate::{shader, shape_err};

/// Whether a tensor's first element is 4-element aligned within its binding (vec4 access).
fn vec4_aligned(t: &Tensor) -> bool {
    t.storage.offset.is_multiple_of(4 * t.elem_bytes())
}

fn check_float(gpu: &Gpu, op: &str, ts: &[&Tensor]) -> Result<()> {
    let dtype = ts[0].dtype;
    for t in ts {
        if t.dtype != dtype {
            return Err(shape_err!(
                "{op}: dtypes differ ({:?} vs {:?})",
                dtype,
                t.dtype
            ));
        }
        if !matches!(t.layout, Layout::RowMajor | Layout::Nchw) {
            return Err(shape_err!(
                "{op}: tensors must be row-major, got {:?}",
                t.layout
            ));
        }
    }
    match dtype {
        DType::F32 => Ok(()),
        DType::F16 if gpu.caps.f16 => Ok(()),
        DType::F16 => Err(DriftError::Unsupported(format!(
            "{op}: f16 on a device without f16"
        ))),
        d => Err(shape_err!("{op}: f32 or f16 tensors only, got {d:?}")),
    }
}

fn spec(name: &str, entry: &'static str, dtype: DType, vec: bool) -> KernelSpec {
    KernelSpec::new(
        format!("{name}_{}{}", dtype.wgsl(), if vec { "_v4" } else { "" }),
        shader!("layout.wgsl"),
        entry,
    )
    .defines(float_defines(dtype))
    .define("VEC", u8::from(vec))
}

/// The params after the base offsets: n, a, b, c, shape, strides, ext.
fn params(
    n: usize,
    abc: [usize; 3],
    shape: [usize; 4],
    strides: [usize; 4],
    ext: [usize; 4],
) -> Vec<u32> {
    let mut v = vec![n as u32];
    v.extend(abc.iter().map(|&x| x as u32));
    v.extend(shape.iter().map(|&x| x as u32));
    v.extend(strides.iter().map(|&x| x as u32));
    v.extend(ext.iter().map(|&x| x as u32));
    v
}

fn check_32bit(op: &str, ts: &[&Tensor]) -> Result<()> {
    if ts.iter().any(|t| t.numel() >= u32::MAX as usize) {
        return Err(shape_err!("{op}: tensor too large for 32-bit indexing"));
    }
    Ok(())
}

/// Nearest-neighbour 2x upsampling of the last two dimensions: `x` `[.., H, W]` (normally
/// `[N, C, H, W]`) to `out` `[.., 2H, 2W]`.
pub fn upsample_nearest2x(gpu: &Gpu, x: &Tensor, out: &Tensor) -> Result<Dispatch> {
    check_float(gpu, "upsample_nearest2x", &[x, out])?;
    check_32bit("upsample_nearest2x", &[out])?;
    let r = x.rank();
    let mut want = x.shape.clone();
    if r >= 2 {
        want[r - 2] *= 2;
        want[r - 1] *= 2;
    }
    if r < 2 || out.shape != want {
        return Err(shape_err!(
            "upsample_nearest2x of {:?} gives {want:?}, output is {:?}",
            x.shape,
            out.shape
        ));
    }
    let w = x.shape[r - 1];
    // A thread per input vec4 writes two vec4 to each of two output rows.
    let vec = w.is_multiple_of(4) && vec4_aligned(x) && vec4_aligned(out);
    let v = if vec { 4 } else { 1 };
    let n = x.numel() / v;
    let kernel = gpu.kernel(&spec("upsample2x", "upsample2x", x.dtype, vec))?;
    gpu.dispatch(
        &kernel,
        &params(n, [w / v, 0, 0], [0; 4], [0; 4], [0; 4]),
        &[x, out],
        grid(
            n.div_ceil(256) as u32,
            gpu.caps.max_workgroups_per_dimension,
        ),
        Cost {
            flops: 0.0,
            bytes: (x.byte_len() + out.byte_len()) as f64,
        },
    )
}

/// Copies `src` (rows of `len` elements) into `dst` at element `dst_off`, rows `stride` apart.
fn copy_rows(
    gpu: &Gpu,
    src: &Tensor,
    dst: &Tensor,
    len: usize,
    stride: usize,
    dst_off: usize,
) -> Result<Dispatch> {
    let vec = len.is_multiple_of(4)
        && stride.is_multiple_of(4)
        && dst_off.is_multiple_of(4)
        && vec4_aligned(src)
        && vec4_aligned(dst);
    let v = if vec { 4 } else { 1 };
    let n = src.numel() / v;
    let kernel = gpu.kernel(&spec("copy_rows", "copy_rows", src.dtype, vec))?;
    gpu.dispatch(
        &kernel,
        &params(
            n,
            [len / v, stride / v, dst_off / v],
            [0; 4],
            [0; 4],
            [0; 4],
        ),
        &[src, dst],
        grid(
            n.div_ceil(256) as u32,
            gpu.caps.max_workgroups_per_dimension,
        ),
        Cost {
            flops: 0.0,
            bytes: 2.0 * src.byte_len() as f64,
        },
    )
}

/// `out = cat([a, b], dim 1)`: `a` `[N, Ca, ..]`, `b` `[N, Cb, ..]`, `out` `[N, Ca + Cb, ..]` (UNet skip
/// connections). Two independent dispatches (one per input); an empty input gets none.
pub fn concat_channels(gpu: &Gpu, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<Vec<Dispatch>> {
    check_float(gpu, "concat_channels", &[a, b, out])?;
    check_32bit("concat_channels", &[out])?;
    let r = a.rank();
    let same_rest =
        r >= 2 && b.rank() == r && a.shape[0] == b.shape[0] && a.shape[2..] == b.shape[2..];
    let mut want = a.shape.clone();
    if same_rest {
        want[1] += b.shape[1];
    }
    if !same_rest || out.shape != want {
        return Err(shape_err!(
            "concat_channels of {:?} and {:?} (same N and trailing dimensions) into {:?}",
            a.shape,
            b.shape,
            out.shape
        ));
    }
    let inner: usize = a.shape[2..].iter().product();
    let (ca, cb) = (a.shape[1], b.shape[1]);
    let stride = (ca + cb) * inner;
    let mut ds = Vec::new();
    if a.numel() > 0 {
        ds.push(copy_rows(gpu, a, out, ca * inner, stride, 0)?);
    }
    if b.numel() > 0 {
        ds.push(copy_rows(gpu, b, out, cb * inner, stride, ca * inner)?);
    }
    Ok(ds)
}

/// Simplifies a permutation of `shape`: drops size-1 dimensions and merges input dimensions that stay
/// adjacent and in order. Returns the reduced input shape and permutation (at least rank 1); permuting
/// the reduced shape moves the same elements to the same places.
pub fn simplify_permutation(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let keep: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    if keep.is_empty() {
        return (vec![1], vec![0]);
    }
    let new_index = |d: usize| keep.iter().position(|&k| k == d).unwrap_or(0);
    let shape1: Vec<usize> = keep.iter().map(|&d| shape[d]).collect();
    let perm1: Vec<usize> = perm
        .iter()
        .filter(|&&d| shape[d] != 1)
        .map(|&d| new_index(d))
        .collect();
    // Runs of consecutive input dimensions, in output order.
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &d in &perm1 {
        match groups.last_mut() {
            Some(g) if g.1 + 1 == d => g.1 = d,
            _ => groups.push((d, d)),
        }
    }
    let mut by_start: Vec<usize> = (0..groups.len()).collect();
    by_start.sort_by_key(|&g| groups[g].0);
    let in_shape: Vec<usize> = by_start
        .iter()
        .map(|&g| shape1[groups[g].0..=groups[g].1].iter().product())
        .collect();
    let mut rank_of = vec![0; groups.len()];
    for (i, &g) in by_start.iter().enumerate() {
        rank_of[g] = i;
    }
    (in_shape, rank_of)
}

/// `out = x.permute(perm)`: output dimension `d` is input dimension `perm[d]` (rank <= 4; `[1, 0]` is a
/// transpose, `[0, 2, 3, 1]` NCHW -> NHWC, `[0, 2, 1, 3]` `[B, L, H, D]` -> `[B, H, L, D]`).
pub fn permute(gpu: &Gpu, x: &Tensor, perm: &[usize], out: &Tensor) -> Result<Dispatch> {
    check_float(gpu, "permute", &[x, out])?;
    check_32bit("permute", &[x])?;
    let rank = x.rank();
    let mut seen = [false; 4];
    let valid = (1..=4).contains(&rank)
        && perm.len() == rank
        && perm
            .iter()
            .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
    if !valid {
        return Err(shape_err!(
            "permute: {perm:?} is not a permutation of the {rank} dimensions of {:?} (rank 1..4)",
            x.shape
        ));
    }
    let want: Vec<usize> = perm.iter().map(|&d| x.shape[d]).collect();
    if out.shape != want {
        return Err(shape_err!(
            "permute {perm:?} of {:?} gives {want:?}, output is {:?}",
            x.shape,
            out.shape
        ));
    }
    let (shape, perm) = simplify_permutation(&x.shape, perm);
    let r = shape.len();
    let mut in_strides = vec![1usize; r];
    for d in (0..r - 1).rev() {
        in_strides[d] = in_strides[d + 1] * shape[d + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
    let mut out_strides = vec![1usize; r];
    for d in (0..r - 1).rev() {
        out_strides[d] = out_strides[d + 1] * out_shape[d + 1];
    }
    let cost = Cost {
        flops: 0.0,
        bytes: (x.byte_len() + out.byte_len()) as f64,
    };
    let max = gpu.caps.max_workgroups_per_dimension;
    if perm[r - 1] == r - 1 {
        // The last dimension stays: a gather with contiguous rows on both sides.
        let vec = shape[r - 1].is_multiple_of(4) && vec4_aligned(x) && vec4_aligned(out);
        let v = if vec { 4 } else { 1 };
        let mut s4 = [1usize; 4];
        let mut st4 = [0usize; 4];
        for d in 0..r {
            s4[4 - r + d] = out_shape[d];
            st4[4 - r + d] = in_strides[perm[d]] / v;
        }
        s4[3] /= v;
        st4[3] = 1;
        let n = x.numel() / v;
        let kernel = gpu.kernel(&spec("permute", "permute", x.dtype, vec))?;
        return gpu.dispatch(
            &kernel,
            &params(n, [0; 3], s4, st4, [0; 4]),
            &[x, out],
            grid(n.div_ceil(256) as u32, max),
            cost,
        );
    }
    // The last dimension moves: tiled transpose of input dims A (-> output's last) and L (input's last).
    let a = perm[r - 1];
    let l = r - 1;
    let l_out = perm.iter().position(|&d| d == l).unwrap_or(0);
    let mut bsize = [1usize; 2];
    let mut bstride_in = [0usize; 2];
    let mut bstride_out = [0usize; 2];
    for (i, d) in (0..r).filter(|&d| d != a && d != l).enumerate() {
        bsize[i] = shape[d];
        bstride_in[i] = in_strides[d];
        bstride_out[i] = out_strides[perm.iter().position(|&q| q == d).unwrap_or(0)];
    }
    let tiles_a = shape[a].div_ceil(32);
    let tiles_l = shape[l].div_ceil(32);
    let tiles = tiles_a * tiles_l * bsize[0] * bsize[1];
    let kernel = gpu.kernel(&spec("transpose", "transpose", x.dtype, false))?;
    gpu.dispatch(
        &kernel,
        &params(
            tiles,
            [in_strides[a], out_strides[l_out], 0],
            [shape[a], shape[l], bsize[0], bsize[1]],
            [bstride_in[0], bstride_in[1], bstride_out[0], bstride_out[1]],
            [tiles_a, tiles_l, 0, 0],
        ),
        &[x, out],
        grid(tiles as u32, max),
        cost,
    )
}

#[cfg(test)]
mod tests {
    use super::simplify_permutation as s;

    #[test]
    fn permutations_simplify() {
        assert_eq!(s(&[2, 3, 4, 5], &[0, 1, 2, 3]), (vec![120], vec![0]));
        assert_eq!(
            s(&[2, 3, 4, 5], &[0, 2, 1, 3]),
            (vec![2, 3, 4, 5], vec![0, 2, 1, 3])
        );
        assert_eq!(
            s(&[2, 3, 4, 5], &[0, 2, 3, 1]),
            (vec![2, 3, 20], vec![0, 2, 1])
        );
        assert_eq!(s(&[2, 3, 4, 5], &[2, 3, 0, 1]), (vec![6, 20], vec![1, 0]));
        assert_eq!(s(&[1, 3, 1, 5], &[2, 3, 0, 1]), (vec![3, 5], vec![1, 0]));
        assert_eq!(s(&[1, 1], &[1, 0]), (vec![1], vec![0]));
        assert_eq!(s(&[4, 1, 6], &[1, 2, 0]), (vec![4, 6], vec![1, 0]));
    }
}
