//! Models from Hugging Face (issue 7).
//!
//! [`download`]: resumable, sha256-verified downloads of single files (`.part` + JSON sidecar,
//! HTTP Range resume, retries with backoff, clear 401/403/404/disk-full errors, cancel, progress).
//! The catalog, the local library and the CLI/GUI front-ends build on it.

// Not every item is used by the app yet (the CLI `models` commands and the Models tab come next).
#![allow(dead_code)]

pub mod download;
