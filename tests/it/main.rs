//! Integration tests: the bag format against rosbag2's reference bags, the CLI's behaviour on
//! bad input, and recording end to end.
mod bounds;
mod closed_splits;
mod common;
mod concurrency;
mod crash;
mod errors;
mod final_status;
mod format;
mod free_floor;
mod fuzz;
mod hostile_bags;
mod install;
mod play;
mod play_keys;
mod reader;
mod record;
mod recovery;
mod retention;
mod root_lock;
mod service;
mod snapshot;
