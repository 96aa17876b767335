//! The CLI subcommands, one file each.

pub mod bench;
pub mod info;
pub mod selftest;
