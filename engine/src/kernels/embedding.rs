//! The embedding kernels.
