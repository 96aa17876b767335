//! The attention kernels.
