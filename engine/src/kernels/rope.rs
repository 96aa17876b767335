//! The rope kernels.
