//! CPU reference for the attention kernels (filled in with the kernels).
