//! CPU reference for the norm kernels (filled in with the kernels).
