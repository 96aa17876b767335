//! The conv kernels.
