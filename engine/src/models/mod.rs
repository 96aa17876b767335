//! Model definitions: configuration, weights, and the dispatch programs they run.

pub mod config;
pub mod hf;
pub mod llama;
