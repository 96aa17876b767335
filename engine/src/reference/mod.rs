//! CPU references for every kernel, in f64, written for clarity rather than speed. The self-test and the
//! tests compare GPU results against these.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod layout;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod softmax;
