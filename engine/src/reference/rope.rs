//! CPU reference for the rope kernels (filled in with the kernels).
