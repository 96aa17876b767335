//! CPU reference for the conv kernels (filled in with the kernels).
