//! ringbag: an always-on ROS 2 bag recorder for edge devices.
//!
//! The library holds everything; `main.rs` only calls `cli::main_entry`. Module dependencies
//! point one way (see docs/architecture.md): `bag` knows nothing of clocks, threads,
//! sources or the CLI, so the format can be tested and fuzzed alone.

pub mod bag;
pub mod cli;
pub mod clock;
pub mod config;
pub mod convert;
pub mod metrics;
pub mod pipeline;
pub mod play;
pub mod record;
pub mod retention;
pub mod service;
pub mod signals;
pub mod snapshot;
pub mod source;
pub mod units;
pub mod upload;
