//! Model file formats, read memory-mapped with every offset checked against the file.

pub mod gguf;
pub mod safetensors;
