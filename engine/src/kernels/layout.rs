//! The layout kernels.
