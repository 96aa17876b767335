//! Offsets for intermediate tensors in one arena: greedy by size (Pisarchyk & Lee 2020, "Efficient
//! Memory Management for Deep Neural Net Inference"), the planner ML Drift uses.
//!
//! Every intermediate has a lifetime (the first and last op that touches it). Tensors are placed from
//! the largest down; each goes into the smallest gap, among the already placed tensors whose lifetimes
//! overlap its own, that fits it, or after the last of them. Tensors that are never alive at the same
//! time share bytes.

use serde::Serialize;

/// One intermediate tensor: alive from op `first` to op `last` inclusive, `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub first: usize,
    pub last: usize,
    pub size: u64,
}

impl Lifetime {
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// The result: an offset per tensor (same order as the input), the arena size, and what one buffer per
/// tensor would have needed.
#[derive(Clone, Debug, Serialize)]
pub struct ArenaPlan {
    pub offsets: Vec<u64>,
    pub arena_bytes: u64,
    pub naive_bytes: u64,
}

/// Plans offsets aligned to `alignment` bytes (a power of two; storage-binding offsets need 256 on most
/// devices).
pub fn plan_greedy_by_size(tensors: &[Lifetime], alignment: u64) -> ArenaPlan {
    assert!(
        alignment.is_power_of_two(),
        "alignment must be a power of two"
    );
    let aligned = |s: u64| s.div_ceil(alignment) * alignment;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        tensors[b]
            .size
            .cmp(&tensors[a].size)
            .then(tensors[a].first.cmp(&tensors[b].first))
    });

    let mut offsets = vec![0u64; tensors.len()];
    // Placed tensors as (offset, aligned size, index), kept sorted by offset.
    let mut placed: Vec<(u64, u64, usize)> = Vec::with_capacity(tensors.len());
    let mut arena = 0u64;
    for &i in &order {
        let t = &tensors[i];
        let size = aligned(t.size);
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut prev_end = 0u64;
        for &(off, sz, j) in &placed {
            if !tensors[j].overlaps(t) {
                continue;
            }
            if off >= prev_end {
                let gap = off - prev_end;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev_end));
                }
            }
            prev_end = prev_end.max(off + sz);
        }
        let offset = best.map_or(prev_end, |(_, o)| o);
        offsets[i] = offset;
        arena = arena.max(offset + size);
        let at = placed.partition_point(|&(o, _, _)| o <= offset);
        placed.insert(at, (offset, size, i));
    }
    ArenaPlan {
        offsets,
        arena_bytes: arena,
        naive_bytes: tensors.iter().map(|t| aligned(t.size)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let t = [
            Lifetime {
                first: 0,
                last: 1,
                size: 1000,
            },
            Lifetime {
                first: 2,
                last: 3,
                size: 1000,
            },
        ];
        let p = plan_greedy_by_size(&t, 256);
        assert_eq!(p.offsets, vec![0, 0]);
        assert_eq!(p.arena_bytes, 1024);
        assert_eq!(p.naive_bytes, 2048);
    }

    #[test]
    fn overlapping_lifetimes_are_stacked() {
        let t = [
            Lifetime {
                first: 0,
                last: 2,
                size: 512,
            },
            Lifetime {
                first: 1,
                last: 3,
                size: 256,
            },
        ];
        let p = plan_greedy_by_size(&t, 256);
        assert_eq!(p.offsets, vec![0, 512]);
        assert_eq!(p.arena_bytes, 768);
    }
}
