//! How block-quantized rows sit in GPU memory. Every type keeps its GGUF bytes except Q4_0, whose
//! rows are split at upload: a row's `nb` f16 scales first, then its `nb` 16-byte groups of nibbles
//! (the same bytes, reordered; the row keeps its length, so row views and shards are unchanged).
//! A GGUF Q4_0 block is 18 bytes, so its nibbles start at every alignment; split, a lane loads a
//! block's nibbles as one 16-byte vector where rows are whole multiples of 8 blocks, and a team's
//! loads are contiguous (`shaders/dequant.wgsl`'s Q4_0 loader reads this layout).
//! On the H200 (2026-12-01, `drift bench kernels`, timing the loaders on the same bytes) the split
//! layout with vector loads took the 8B model's Q4_0 products from 33.3 to 32.1 us (28672x4096),
//! 21.5 to 21.1 (4096x14336), 16.2 to 15.6 (6144x4096) and 13.8 to 13.2 (4096x4096), and the 8B Q4_0
//! model's decode from 379.6 to 392.4 tok/s (`drift bench llm --shape llama-3.1-8b --quant q4_0`).

use std::borrow::Cow;

use crate::error::Result;
use crate::shape_err;
use crate::tensor::DType;

/// The bytes to upload for `bytes` of `dtype` blocks in GGUF order, rows of `k` elements.
pub fn to_gpu(dtype: DType, k: usize, bytes: &[u8]) -> Result<Cow<'_, [u8]>> {
    if dtype != DType::Q4_0 {
        return Ok(Cow::Borrowed(bytes));
    }
    let (nb, row) = q4_0_row(k, bytes.len())?;
    let mut out = vec![0u8; bytes.len()];
    for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        let (scales, nibbles) = dst.split_at_mut(2 * nb);
        for (b, block) in src.chunks_exact(18).enumerate() {
            scales[2 * b..2 * b + 2].copy_from_slice(&block[..2]);
            nibbles[16 * b..16 * b + 16].copy_from_slice(&block[2..]);
        }
    }
    Ok(Cow::Owned(out))
}

/// Blocks per row and row bytes of Q4_0 rows of `k` elements, checked against `len` bytes.
fn q4_0_row(k: usize, len: usize) -> Result<(usize, usize)> {
    let nb = k / 32;
    let row = 18 * nb;
    if k == 0 || !k.is_multiple_of(32) || !len.is_multiple_of(row) {
        return Err(shape_err!(
            "Q4_0 rows of {k} elements cannot hold {len} bytes"
        ));
    }
    Ok((nb, row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_rows_split_into_scales_then_nibbles() {
        // Two rows of three blocks; every byte distinct.
        let gguf: Vec<u8> = (0..2 * 3 * 18).map(|i| i as u8).collect();
        let gpu = to_gpu(DType::Q4_0, 96, &gguf).unwrap();
        // Row 0: the scales of blocks 0, 1, 2 (bytes 0-1, 18-19, 36-37), then their nibbles.
        assert_eq!(&gpu[..6], &[0, 1, 18, 19, 36, 37]);
        assert_eq!(&gpu[6..22], &gguf[2..18]);
        assert_eq!(&gpu[22..38], &gguf[20..36]);
        // Row 1 starts where it did, and holds the same bytes.
        assert_eq!(&gpu[54..56], &gguf[54..56]);
        let (mut a, mut b) = (gpu[54..].to_vec(), gguf[54..].to_vec());
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn other_types_and_bad_lengths() {
        let b = vec![7u8; 34];
        assert!(matches!(
            to_gpu(DType::Q8_0, 32, &b).unwrap(),
            Cow::Borrowed(_)
        ));
        assert!(to_gpu(DType::Q4_0, 32, &b).is_err());
        assert!(to_gpu(DType::Q4_0, 48, &b[..18]).is_err());
    }
}
