//! The CLI subcommands, one file each.

pub mod bench;
pub mod chat;
pub mod generate;
pub mod image;
pub mod info;
pub mod models;
pub mod selftest;
pub mod serve;
