//! Kernel correctness on a real GPU device (lavapipe in CI): each test runs one family's self-test
//! checks, which compare against f64 CPU references on fresh random inputs with poisoned outputs.

mod common;

mod elementwise;
mod matmul;
mod matvec;
mod softmax;
mod norm;
mod rope;
mod embedding;
mod attention;
mod conv;
mod layout;
mod quant;
