//! Models from Hugging Face (issue 7).
//!
//! - [`download`]: resumable, sha256-verified downloads of single files (`.part` + JSON sidecar,
//!   HTTP Range resume, retries with backoff, clear 401/403/404/disk-full errors, cancel,
//!   progress), and the hub's `X-Linked-Etag` sha256 when no hash is known.
//! - [`manager`]: several downloads at once with a limit; pause, resume, cancel.
//! - [`catalog`]: the curated list in `assets/catalog.json`; [`api`]: any repo's files.
//! - [`library`]: the models on disk ([`inspect`] reads their headers); [`estimate`]: will it fit.
//!
//! Downloads use ureq on threads (the issue suggested tokio + reqwest): blocking I/O on a worker
//! thread per download is all the app needs, without an async runtime next to eframe's loop.

pub mod api;
pub mod catalog;
pub mod download;
pub mod estimate;
pub mod inspect;
pub mod kind;
pub mod library;
pub mod manager;
pub mod pull;
