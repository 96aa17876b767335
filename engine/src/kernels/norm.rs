//! The norm kernels.
