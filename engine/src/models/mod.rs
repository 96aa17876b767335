//! Model definitions: configuration, weights, and the dispatch programs they run.

pub mod clip;
pub mod config;
pub mod hf;
pub mod llama;
pub mod llama_step;
pub mod llama_weights;
pub mod load;
pub mod sd_graph;
pub mod sd_weights;
pub mod shapes;
pub mod unet;
pub mod vae;
