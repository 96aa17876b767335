//! Kernel correctness on a real GPU device (lavapipe in CI): each test runs one family's self-test
//! checks, which compare against f64 CPU references on fresh random inputs with poisoned outputs.

mod common;

mod attention;
mod conv;
mod elementwise;
mod embedding;
mod grid_sync;
mod layout;
mod matmul;
mod matvec;
mod norm;
mod qkv_rope;
mod quant;
mod rope;
mod sample;
mod softmax;
mod spirv;
