//! The matvec kernels.
