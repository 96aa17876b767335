//! Remote backends: any OpenAI-compatible server (vLLM, Ollama, llama.cpp's server, LM Studio, another
//! Drift's `drift serve`) in place of the local engine, for `drift chat/generate --remote` and the
//! chat tab's Remote backend.

mod client;
#[cfg(test)]
mod client_tests;
mod endpoint;
mod error;
mod sse;
mod stream;
#[cfg(test)]
pub mod test_server;

pub use client::{Prompt, RemoteClient, Sampling};
pub use stream::{Finish, StreamedReply};
