//! Raw command-line arguments (clap). Validation into settings happens in `cli::resolve`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bag::schema::StoragePreset;
use crate::bag::Flavour;
use crate::source::synthetic::SyntheticProfile;

#[derive(Debug, Parser)]
#[command(
    name = "ringbag",
    version,
    about = "Always-on ROS 2 bag recorder: rosbag2-compatible SQLite bags, circular logging, PTP time"
)]
pub struct Cli {
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "info", env = "RINGBAG_LOG")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record topics into a bag (like `ros2 bag record`).
    Record(Box<RecordArgs>),
    /// Describe a bag (like `ros2 bag info`), plus the size of each split.
    Info(InfoArgs),
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Bag directory, or a single .db3 file.
    pub bag: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// Live ROS 2 topics through r2r (needs a build with `--features ros`).
    Ros,
    /// Built-in robot-like generator of valid CDR messages.
    Synthetic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyntheticRate {
    /// At the profile's rates (e.g. IMU 400 Hz); never waits, counts drops.
    Realtime,
    /// As fast as the writer accepts (waits when the queue is full; for benchmarks).
    Max,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Topics to record (ROS source). Empty with neither -a nor -e records nothing.
    pub topics: Vec<String>,
    /// Record all topics (ROS source).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Record topics matching this regular expression (ROS source).
    #[arg(short = 'e', long)]
    pub regex: Option<String>,
    /// Exclude topics matching this regular expression.
    #[arg(long, alias = "exclude")]
    pub exclude_regex: Option<String>,
    /// Exclude these topics (repeatable).
    #[arg(long, num_args = 1..)]
    pub exclude_topics: Vec<String>,
    /// Also record hidden topics (a name part starting with `_`).
    #[arg(long)]
    pub include_hidden_topics: bool,
    /// Topic discovery polling interval, milliseconds.
    #[arg(short = 'p', long, default_value_t = 100)]
    pub polling_interval: u64,
    /// Subscribe only to topics present at start.
    #[arg(long)]
    pub no_discovery: bool,
    /// YAML file with per-topic QoS overrides (as ros2 bag record).
    #[arg(long)]
    pub qos_profile_overrides_path: Option<PathBuf>,

    /// Output bag directory [default: rosbag2_YYYY_MM_DD-HH_MM_SS]. Must not exist.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Storage plugin. Only sqlite3.
    #[arg(short = 's', long, default_value = "sqlite3")]
    pub storage: String,
    /// Files as this rosbag2 release writes them [default: humble if ROS_DISTRO=humble, else jazzy].
    #[arg(long, value_enum)]
    pub bag_format: Option<Flavour>,
    /// Byte budget of messages queued for the writer; beyond it messages are dropped and
    /// counted. Bytes, or with KiB/MiB/GiB/KB/MB/GB.
    #[arg(long, default_value = "100MiB")]
    pub max_cache_size: String,
    /// SQLite tuning and durability: write-optimized, resilient, none (rosbag2 default).
    #[arg(long, value_enum, default_value = "write-optimized")]
    pub storage_preset_profile: StoragePreset,
    /// Extra KEY=VALUE stored in the bag's custom_data (repeatable; Jazzy format).
    #[arg(long, num_args = 1..)]
    pub custom_data: Vec<String>,

    /// Start a new split when the open one reaches this size. Bytes or with units; min 86016; 0 = off.
    #[arg(short = 'b', long, default_value = "0")]
    pub max_bag_size: String,
    /// Start a new split when the open one spans this long. Seconds or with s/m/h/d; 0 = off.
    #[arg(short = 'd', long, default_value = "0")]
    pub max_bag_duration: String,
    /// Stop recording (exit 0) once this many split files have been created; 0 = off.
    #[arg(long, default_value_t = 0)]
    pub max_splits: u32,

    /// Where messages come from [default: ros in builds with the `ros` feature, else synthetic].
    #[arg(long, value_enum)]
    pub source: Option<SourceKind>,
    /// Synthetic source profile: robot (IMU, tf, 2 cameras, point cloud), small (100 B),
    /// medium (64 KiB), large (1 MiB).
    #[arg(long, value_enum, default_value = "robot")]
    pub synthetic_profile: SyntheticProfile,
    /// Synthetic source pace: realtime or max.
    #[arg(long, value_enum, default_value = "realtime")]
    pub synthetic_rate: SyntheticRate,
    /// Stop cleanly after this many synthetic messages in total; 0 = until stopped.
    #[arg(long, default_value_t = 0)]
    pub synthetic_count: u64,
}
