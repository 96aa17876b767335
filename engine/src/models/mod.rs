//! Model definitions: configuration, weights, and the dispatch programs they run.

pub mod config;
pub mod hf;
pub mod llama;
pub mod llama_weights;
pub mod load;
pub mod shapes;
