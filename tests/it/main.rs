//! Integration tests: the bag format against rosbag2's reference bags, the CLI's behaviour on
//! bad input, and recording end to end.
mod common;
mod concurrency;
mod crash;
mod errors;
mod format;
mod fuzz;
mod reader;
mod record;
mod recovery;
mod retention;
