//! CPU reference for the softmax kernels (filled in with the kernels).
