//! CPU reference for the layout kernels (filled in with the kernels).
