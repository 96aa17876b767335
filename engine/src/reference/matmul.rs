//! CPU reference for the matmul kernels (filled in with the kernels).
