//! Split-K for the cooperative matmul: a product whose 128x128 output blocks are too few to fill the
//! device (a prefill's `512 x 2048` outputs are 64 blocks on the H200's 132 SMs) cuts K into equal
//! slices, runs them as the batch entries of one grid into f32 partials, and sums the slices in a
//! second pass (`shaders/matmul_splitk.wgsl`) that also adds the bias and converts.

use crate::error::Result;
use crate::exec::{Cost, Dispatch};
use crate::gpu::Gpu;
use crate::kernels::{KernelSpec, grid};
use crate::shader;
use crate::tensor::{DType, Tensor};

/// Workgroups a split aims for: about two 128x128 blocks per SM of a large GPU (the H200 has 132).
const TARGET_GROUPS: usize = 256;

/// Partials of the largest split the automatic choice makes: 4 slices of fewer than
/// `TARGET_GROUPS / 2` blocks of 128 x 128 (32 MiB of f32).
pub(crate) const MAX_PARTIALS: usize = 4 * (TARGET_GROUPS / 2) * 128 * 128;

/// K per slice at least this long (shorter slices spend their time filling the pipeline).
const MIN_SLICE_K: usize = 256;

/// K steps of the cooperative kernel divide every slice (64: its largest).
const SLICE_ALIGN: usize = 64;

/// Slices of K for an `m x n x k` product (1: no split). `requested`: 0 automatic, else that many
/// where K allows. `DRIFT_MATMUL_SPLITK=N` caps the automatic choice at N slices (1: none), for A/B
/// timing.
pub(crate) fn slices(requested: usize, m: usize, n: usize, k: usize) -> usize {
    let fits = |s: usize| k.is_multiple_of(s * SLICE_ALIGN) && k / s >= MIN_SLICE_K;
    if requested > 0 {
        return if requested > 1 && fits(requested) {
            requested
        } else {
            1
        };
    }
    let cap = std::env::var("DRIFT_MATMUL_SPLITK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let tiles = m.div_ceil(128) * n.div_ceil(128);
    if tiles * 2 > TARGET_GROUPS {
        return 1;
    }
    [2, 4]
        .into_iter()
        .filter(|&s| s <= cap && fits(s))
        .find(|&s| tiles * s >= TARGET_GROUPS)
        .or_else(|| [4, 2].into_iter().find(|&s| s <= cap && fits(s)))
        .unwrap_or(1)
}

/// `out = sum_s part[s] (+ bias)` over the `slices` f32 partials `[slices, M, N]` of an `[M, N]` output.
pub(crate) fn sum_slices(
    gpu: &Gpu,
    part: &Tensor,
    out: &Tensor,
    bias: Option<&Tensor>,
    slices: usize,
) -> Result<Dispatch> {
    let n = out.dim(-1);
    let mn = out.numel();
    let bias_dtype = bias.map_or(out.dtype, |t| t.dtype);
    let f16 = out.dtype == DType::F16 || bias_dtype == DType::F16;
    let spec = KernelSpec::new(
        format!(
            "matmul_splitk_sum_{}{}",
            out.dtype.wgsl(),
            bias.map_or(String::new(), |b| format!("_bias{}", b.dtype.wgsl()))
        ),
        shader!("matmul_splitk.wgsl"),
        "sum_slices",
    )
    .define("TO", out.dtype.wgsl())
    .define("TB", bias_dtype.wgsl())
    .define("F16", u8::from(f16))
    .define("BIAS", u8::from(bias.is_some()));
    let kernel = gpu.kernel(&spec)?;
    let mut tensors = vec![part, out];
    tensors.extend(bias);
    let groups = (mn / 4).div_ceil(256) as u32;
    gpu.dispatch(
        &kernel,
        &[mn as u32, n as u32, slices as u32],
        &tensors,
        grid(groups, gpu.caps.max_workgroups_per_dimension),
        Cost {
            flops: (mn * slices) as f64,
            bytes: (mn * slices * 4) as f64 + (mn as u64 * out.elem_bytes()) as f64,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::slices;

    #[test]
    fn splits_only_products_of_few_blocks_and_whole_k_steps() {
        // Llama 3.2 1B prefill of 512 tokens: O and down (64 blocks) in 4, QKV (96) in 4, gate-up
        // (512 blocks) whole.
        assert_eq!(slices(0, 512, 2048, 2048), 4);
        assert_eq!(slices(0, 512, 2048, 8192), 4);
        assert_eq!(slices(0, 512, 3072, 2048), 4);
        assert_eq!(slices(0, 512, 16384, 2048), 1);
        // 128 blocks: 2 slices reach the target.
        assert_eq!(slices(0, 1024, 2048, 2048), 2);
        // K too short, or not whole 64-steps per slice.
        assert_eq!(slices(0, 512, 2048, 256), 1);
        assert_eq!(slices(0, 512, 2048, 576), 1);
        assert_eq!(slices(0, 512, 2048, 640), 2);
        // Asked for: honoured where K allows, else whole.
        assert_eq!(slices(2, 4096, 4096, 4096), 2);
        assert_eq!(slices(4, 64, 64, 512), 1);
        assert_eq!(slices(1, 512, 2048, 2048), 1);
    }
}
