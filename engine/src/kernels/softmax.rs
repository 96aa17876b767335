//! The softmax kernels.
