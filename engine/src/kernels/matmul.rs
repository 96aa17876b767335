//! The matmul kernels.
