//! Raw command-line arguments (clap). Validation into settings happens in `cli::resolve`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bag::schema::StoragePreset;
use crate::bag::Flavour;
use crate::source::synthetic::{Payload, SyntheticProfile};

#[derive(Debug, Parser)]
#[command(
    name = "ringbag",
    version = env!("RINGBAG_LONG_VERSION"),
    about = "Always-on ROS 2 bag recorder: rosbag2-compatible SQLite bags, circular logging, PTP time"
)]
pub struct Cli {
    /// Log level [default: info, or the environment variable RINGBAG_LOG when set].
    // Not clap's `env`: an invalid RINGBAG_LOG must be named as such in the error, and clap
    // would report it as if --log-level had been given. `cli::log_level` reads it.
    #[arg(long, global = true, value_enum, ignore_case = true)]
    pub log_level: Option<LogLevel>,
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-level` / `RINGBAG_LOG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record topics into a bag (like `ros2 bag record`).
    Record(Box<RecordArgs>),
    /// Describe a bag (like `ros2 bag info`), plus the size of each split.
    Info(InfoArgs),
    /// Replay a bag (like `ros2 bag play`) to ROS topics, or print it with `--sink echo`.
    Play(Box<PlayArgs>),
    /// Show the clock the recorder would stamp with: source, PHC offset, drift, cost per stamp.
    Clock(ClockCmdArgs),
    /// Rebuild metadata.yaml from the .db3 files, salvaging damaged splits (after a crash).
    Reindex(ReindexArgs),
    /// Run the recording service from a TOML config (what systemd starts).
    Daemon(DaemonArgs),
    /// Show the running service's status file (exit 3 when it is older than 5 s).
    Status(StatusArgs),
    /// Ask a running recorder for a snapshot bag of its memory ring (`record --snapshot-size`).
    /// Exit 0 started/extended, 1 refused or rate-limited, 2 no recorder listening or a
    /// recorder without a ring.
    Trigger(TriggerArgs),
    /// Pause a running recorder's continuous recording over its control socket (like the
    /// `~/pause` service of `ros2 bag record`); the snapshot ring keeps recording.
    Pause(PauseArgs),
    /// Resume a recorder paused by `ringbag pause`, the space bar or `--start-paused`.
    Resume(PauseArgs),
    /// Upload bags (or every bag of a recording root) to S3-compatible object storage, once.
    Upload(Box<UploadArgs>),
    /// Print the plugins ringbag has, as `ros2 bag list` names them.
    List(ListArgs),
    /// Rewrite bags into the bags an options file lists (topics, time window, splits,
    /// flavour), merging several inputs in time order, as `ros2 bag convert`.
    Convert(ConvertArgs),
    /// Publish a bag's messages as fast as possible, without timing, as `ros2 bag burst`
    /// (Jazzy): play's selection flags, plus -n/--num-messages.
    Burst(Box<BurstArgs>),
    /// Write the man pages and shell completions into a directory (for packaging).
    // Hidden: a packaging step, not a user's command; its own page would list it otherwise.
    #[command(hide = true)]
    GenDocs(GenDocsArgs),
}

/// `ringbag gen-docs --out DIR` (`cli::gen_docs`).
#[derive(Debug, Args)]
pub struct GenDocsArgs {
    /// The directory to write man1/, man5/ and completions/ into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// `ringbag burst BAG [-n N]`: play's flags; those about timing are refused.
#[derive(Debug, Args)]
pub struct BurstArgs {
    /// Publish this many messages, then stop; 0 = all.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 0)]
    pub num_messages: u64,
    #[command(flatten)]
    pub play: PlayArgs,
}

/// `ringbag convert -i BAG [-i BAG ...] -o OPTIONS.yaml`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// An input bag (directory or .db3); repeat to merge several, in timestamp order.
    #[arg(short = 'i', long = "input", value_name = "BAG", required = true)]
    pub inputs: Vec<PathBuf>,
    /// The output options YAML: `output_bags:`, a list of rosbag2 storage and record
    /// options (uri, topics, regex, exclude, start_time_ns, max_bagfile_size,
    /// compression_mode: file or message with compression_format: zstd, ...).
    #[arg(short = 'o', long = "output-options", value_name = "OPTIONS_YAML")]
    pub output_options: PathBuf,
    /// Flavour of outputs whose entry has no `bag_format` key [default: humble if
    /// ROS_DISTRO=humble, else jazzy].
    #[arg(long, value_enum)]
    pub bag_format: Option<Flavour>,
}

/// `ringbag list`: `ros2 bag list`'s plugin kinds, answered with what ringbag itself does.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Which plugins: storage, converter, compressor or decompressor.
    #[arg(value_enum)]
    pub plugin_type: PluginKind,
    /// Also say what each one is.
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PluginKind {
    Storage,
    Converter,
    Compressor,
    Decompressor,
}

/// `ringbag upload`: the settings of a ringbag.toml `[upload]` table, as flags or from the
/// table itself (`--config`), checked by the same rules as the service's. Credentials never
/// come from a flag's value: `$CREDENTIALS_DIRECTORY/s3`, else `--credentials-file`, else
/// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN).
///
/// Value flags are kept as written (`Option<String>`), defaults included, so that a flag
/// given overrides the `--config` table's key and one not given leaves it, and so that
/// every value is refused by `upload::settings` with the flag's name (exit 2), not by the
/// parser.
#[derive(Debug, Args)]
#[command(
    after_help = "Nothing is ever deleted: `delete_after_upload` in a --config table is \
    ignored (there is no such flag), so a copy of a bag on a laptop stays where it is."
)]
pub struct UploadArgs {
    /// A bag directory, or a recording root (every bag under it).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Take the settings from the [upload] table of this ringbag.toml; a flag given as well
    /// overrides the table's key. Without it, --endpoint and --bucket are required.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// S3 endpoint, `https://host[:port]` (http:// only for loopback, or with --allow-http).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Bucket to upload into.
    #[arg(long, value_name = "B")]
    pub bucket: Option<String>,
    /// Region the requests are signed for [default: us-east-1].
    #[arg(long, value_name = "R")]
    pub region: Option<String>,
    /// Object key template over {robot}, {bag} and {file} [default: ringbag/{robot}/{bag}/{file}].
    #[arg(long = "key", value_name = "TEMPLATE")]
    pub key_template: Option<String>,
    /// The {robot} of the key [default: /etc/machine-id].
    #[arg(long, value_name = "ID")]
    pub robot_id: Option<String>,
    /// Path-style addressing (endpoint/bucket/key): MinIO, Garage, Ceph on an IP address.
    #[arg(long)]
    pub path_style: bool,
    /// Extra CA certificates (PEM) to trust beside Mozilla's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Credentials file (AWS shared-credentials format), mode 0600 or stricter, owned by you
    /// or root; used when $CREDENTIALS_DIRECTORY has no `s3`, before AWS_* variables.
    #[arg(long, value_name = "FILE")]
    pub credentials_file: Option<PathBuf>,
    /// Multipart part size (files up to this size go as one PUT): 5MiB..=5GiB [default: 16MiB].
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true)]
    pub part_size: Option<String>,
    /// Parts in flight at once, 1..=16 (each holds a part in memory) [default: 2].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub concurrency: Option<String>,
    /// Bandwidth cap over all transfers, bytes per second (or with units: 2MiB = 2 MiB/s). [default: unlimited]
    #[arg(long, value_name = "BYTES_PER_S", allow_negative_numbers = true)]
    pub max_rate: Option<String>,
    /// Accept a plain http:// endpoint that is not on loopback (sends data unencrypted).
    #[arg(long)]
    pub allow_http: bool,
}

#[derive(Debug, Args)]
pub struct TriggerArgs {
    /// Why: stored in the bag's custom_data and in its name.
    #[arg(long, default_value = "manual")]
    pub reason: String,
    /// Seconds before the trigger to keep [default: all of the ring].
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub pre: Option<f64>,
    /// Seconds after the trigger to keep.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 10.0,
        allow_negative_numbers = true
    )]
    pub post: f64,
    /// The recorder's control socket.
    #[arg(long, value_name = "PATH", default_value = crate::snapshot::control::DEFAULT_CONTROL_SOCKET)]
    pub control_socket: PathBuf,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The recorder's control socket.
    #[arg(long, value_name = "PATH", default_value = crate::snapshot::control::DEFAULT_CONTROL_SOCKET)]
    pub control_socket: PathBuf,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The service's TOML config.
    #[arg(long, value_name = "FILE", default_value = "/etc/ringbag/ringbag.toml")]
    pub config: PathBuf,
    /// Check the config (syntax, keys, types, units, combinations, the recording root) and exit.
    #[arg(long)]
    pub check_config: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the status file as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The status file [default: /run/ringbag/status.json].
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReindexArgs {
    /// Bag directory.
    pub bag: PathBuf,
    /// Report what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Delete a damaged split after salvage instead of keeping it as `<name>.db3.damaged`.
    #[arg(long)]
    pub discard_damaged: bool,
}

/// Which clock stamps messages (record, clock, and the service config).
#[derive(Debug, Args, Clone)]
pub struct ClockArgs {
    /// Timestamp source: system, ptp (fail if the PHC cannot be read), auto (ptp if readable,
    /// else system with one warning).
    #[arg(long, value_enum, default_value = "auto")]
    pub clock: crate::clock::ClockKind,
    /// PTP hardware clock device. `@monotonic-raw` is a stand-in for machines without one.
    #[arg(long, default_value = crate::clock::DEFAULT_PTP_DEVICE)]
    pub ptp_device: PathBuf,
    /// Time scale the PHC keeps: tai (ptp4l's default) or utc.
    #[arg(long, value_enum, default_value = "tai")]
    pub ptp_timescale: crate::clock::Timescale,
    /// TAI − UTC in seconds, subtracted when the PHC keeps TAI (37 since 2017).
    #[arg(long, default_value_t = crate::clock::DEFAULT_TAI_UTC_OFFSET_S, allow_negative_numbers = true)]
    pub tai_utc_offset: i64,
    /// How often the PHC offset is measured, milliseconds (10 to 60000).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    pub ptp_poll_interval: u64,
    /// A PHC offset jump larger than this is logged and counted as a step, microseconds.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    pub ptp_step_threshold: u64,
}

impl ClockArgs {
    pub fn settings(&self) -> crate::clock::ClockSettings {
        crate::clock::ClockSettings {
            kind: self.clock,
            ptp_device: self.ptp_device.clone(),
            timescale: self.ptp_timescale,
            tai_utc_offset_s: self.tai_utc_offset,
            poll_interval: std::time::Duration::from_millis(self.ptp_poll_interval),
            step_threshold: std::time::Duration::from_micros(self.ptp_step_threshold),
        }
    }
}

#[derive(Debug, Args)]
pub struct ClockCmdArgs {
    #[command(flatten)]
    pub clock: ClockArgs,
    /// Offset samples to take (100 ms apart).
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub samples: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkKind {
    /// Publish on ROS 2 topics (needs a build with `--features ros`).
    Ros,
    /// Print each message instead of publishing it.
    Echo,
}

/// `play --service-requests-source`, as ros2 bag spells its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ServiceRequestsSource {
    /// The requests as the service's server received them.
    ServiceIntrospection,
    /// The requests as the clients sent them.
    ClientIntrospection,
}

#[derive(Debug, Args)]
pub struct PlayArgs {
    /// Bag directory, or a single .db3 file.
    pub bag: PathBuf,
    /// Storage plugin of the bag (ros2 bag's flag). Only sqlite3 [default: sqlite3].
    #[arg(short = 's', long, value_name = "ID")]
    pub storage: Option<String>,
    /// Play only these topics (and those matching -e) [default: all]; services are chosen by
    /// --services. Takes every value up to the next option: give BAG first.
    #[arg(long, num_args = 1.., value_name = "TOPIC")]
    pub topics: Vec<String>,
    /// Play topics and services matching this regular expression (as well as --topics and
    /// --services).
    #[arg(short = 'e', long, value_name = "RE")]
    pub regex: Option<String>,
    /// Do not play topics and services matching this regular expression.
    #[arg(short = 'x', long, value_name = "RE")]
    pub exclude_regex: Option<String>,
    /// Do not play these topics.
    #[arg(long, num_args = 1.., value_name = "TOPIC")]
    pub exclude_topics: Vec<String>,
    /// Publish the bag's topic OLD as NEW; repeatable. Takes every value up to the next
    /// option: give BAG first.
    #[arg(short = 'm', long, num_args = 1.., value_name = "OLD:=NEW")]
    pub remap: Vec<String>,
    /// Speed factor (> 0): 2 plays twice as fast, 0.5 at half speed.
    #[arg(
        short = 'r',
        long,
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub rate: f64,
    /// Start this far into the bag. Seconds, or with s/m/h/d.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "0",
        allow_negative_numbers = true
    )]
    pub start_offset: String,
    /// Play at most this much of the bag from the start (after --start-offset). Seconds, or
    /// with s/m/h/d [default: to the end].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub playback_duration: Option<String>,
    /// Play messages recorded up to this time, seconds since the epoch (decimals exact)
    /// [default: to the end].
    #[arg(
        long,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        conflicts_with = "playback_until_nsec"
    )]
    pub playback_until_sec: Option<String>,
    /// Play messages recorded up to this time, nanoseconds since the epoch [default: to the end].
    #[arg(long, value_name = "NANOSECONDS", allow_negative_numbers = true)]
    pub playback_until_nsec: Option<i64>,
    /// Wait this long before the first message. Seconds, or with s/m/h/d.
    #[arg(
        short = 'd',
        long,
        value_name = "SECONDS",
        default_value = "0",
        allow_negative_numbers = true
    )]
    pub delay: String,
    /// Start again from the beginning at the end, until stopped.
    #[arg(short = 'l', long = "loop")]
    pub loop_playback: bool,
    /// Start paused (space resumes; needs the keyboard controls).
    #[arg(short = 'p', long)]
    pub start_paused: bool,
    /// At the end, wait up to TIMEOUT ms (0 = forever) for subscribers to acknowledge every
    /// message (ros2 bag's flag; must be >= 0). ringbag's sinks expose no acknowledgements:
    /// the echo sink has nothing to wait for, and the ros sink says once that it cannot wait.
    #[arg(long, value_name = "TIMEOUT", allow_negative_numbers = true)]
    pub wait_for_all_acked: Option<i64>,
    /// rosbag2's sqlite3 storage config YAML: checked; its `read:` pragmas are refused (exit 2),
    /// as ringbag's reader sets its own connection limits; `write:` is the recorder's.
    #[arg(long, value_name = "FILE")]
    pub storage_config_file: Option<PathBuf>,
    /// Accepted for ros2 bag's scripts; no effect: ringbag never publishes loaned messages.
    #[arg(long)]
    pub disable_loan_message: bool,
    /// Publish /clock with the message's time right before each message of these topics (the
    /// bag's names) is played. Takes every value up to the next option.
    #[arg(long, num_args = 1.., value_name = "TOPIC", conflicts_with = "clock")]
    pub clock_topics: Vec<String>,
    /// Publish /clock with the message's time right before every message played.
    #[arg(long, conflicts_with_all = ["clock", "clock_topics"])]
    pub clock_topics_all: bool,
    /// Play these services' recorded events (topics SERVICE/_service_event), and those -e
    /// matches; topics are then chosen by --topics/-e alone (as Jazzy's ros2 bag: --topics
    /// alone leaves every service playing). Takes every value up to the next option.
    #[arg(long, num_args = 1.., value_name = "SERVICE")]
    pub services: Vec<String>,
    /// Do not play these services' events (wins over --services and -e).
    #[arg(long, num_args = 1.., value_name = "SERVICE")]
    pub exclude_services: Vec<String>,
    /// ros sink, Jazzy: call the recorded services with the recorded requests instead of
    /// publishing their events (ros2 bag's flag).
    #[arg(long)]
    pub publish_service_requests: bool,
    /// With --publish-service-requests: send the requests the servers received
    /// (service_introspection) or the clients sent (client_introspection)
    /// [default: service_introspection].
    #[arg(long, value_name = "SOURCE")]
    pub service_requests_source: Option<ServiceRequestsSource>,
    /// Messages read ahead of playback, at most (>= 1).
    #[arg(long, value_name = "N", default_value_t = crate::play::DEFAULT_READ_AHEAD_MESSAGES as u64, allow_negative_numbers = true)]
    pub read_ahead_queue_size: u64,
    /// Bytes of messages read ahead of playback, at most (one message always fits). Bytes,
    /// or with KiB/MiB/GiB/KB/MB/GB.
    #[arg(
        long,
        value_name = "BYTES",
        default_value = "128MiB",
        allow_negative_numbers = true
    )]
    pub read_ahead_queue_bytes: String,
    /// Publish /clock (rosgraph_msgs/msg/Clock) with the playback time, HZ times a second
    /// [default when given without a value: 40].
    #[arg(long, value_name = "HZ", num_args = 0..=1, default_missing_value = "40", allow_negative_numbers = true)]
    pub clock: Option<f64>,
    /// YAML file with per-topic publisher QoS overrides (as ros2 bag play; keys are the bag's
    /// topic names).
    #[arg(long, value_name = "FILE")]
    pub qos_profile_overrides_path: Option<PathBuf>,
    /// Run the scheduler thread SCHED_FIFO at this priority (1 to 99) for timing that holds
    /// on a loaded machine; needs CAP_SYS_NICE or RLIMIT_RTPRIO (else one warning) [default:
    /// normal scheduling].
    #[arg(long, value_name = "PRIO", allow_negative_numbers = true)]
    pub rt_priority: Option<i32>,
    /// No keyboard controls even on a terminal (they are off anyway when stdin is not one).
    #[arg(long)]
    pub disable_keyboard_controls: bool,
    /// Where messages go [default: ros in builds with the `ros` feature, else echo].
    #[arg(long, value_enum)]
    pub sink: Option<SinkKind>,
    /// Line format of the echo sink.
    #[arg(long, value_enum, default_value = "text")]
    pub echo_format: crate::play::EchoFormat,
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
    /// Topics to record (Humble's spelling of --topics). ROS source: empty with neither -a
    /// nor -e records nothing; synthetic source: the profile's topics to keep (none given: all).
    pub topics: Vec<String>,
    /// Topics to record (Jazzy's spelling; adds to the positional list). Takes every value up
    /// to the next option.
    #[arg(long = "topics", num_args = 1.., value_name = "TOPIC")]
    pub topics_flag: Vec<String>,
    /// Record topics of these message types, exact names such as sensor_msgs/msg/Imu (as well
    /// as the named topics and -e matches).
    #[arg(long, num_args = 1.., value_name = "TYPE")]
    pub topic_types: Vec<String>,
    /// Record all topics and, on Jazzy, all services (as ros2 bag's -a/--all).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Record all topics (not services).
    #[arg(long)]
    pub all_topics: bool,
    /// ROS source, Jazzy: record these services' introspection events (the
    /// `<service>/_service_event` topics). Takes every value up to the next option.
    #[arg(long, num_args = 1.., value_name = "SERVICE")]
    pub services: Vec<String>,
    /// ROS source, Jazzy: record every service's introspection events.
    #[arg(long)]
    pub all_services: bool,
    /// ROS source, Jazzy: do not record these services (with -a, --all-services or -e).
    #[arg(long, num_args = 1.., value_name = "SERVICE")]
    pub exclude_services: Vec<String>,
    /// Record topics matching this regular expression.
    #[arg(short = 'e', long)]
    pub regex: Option<String>,
    /// Exclude topics matching this regular expression.
    #[arg(long, alias = "exclude")]
    pub exclude_regex: Option<String>,
    /// Exclude these topics (repeatable).
    #[arg(long, num_args = 1..)]
    pub exclude_topics: Vec<String>,
    /// Exclude topics of these message types (exact names, e.g. sensor_msgs/msg/Image).
    #[arg(long, num_args = 1.., value_name = "TYPE")]
    pub exclude_topic_types: Vec<String>,
    /// ROS source: also record topics that have no publisher yet, subscribed with the default
    /// QoS (or the overrides file's). The synthetic source publishes every topic: no effect.
    #[arg(long)]
    pub include_unpublished_topics: bool,
    /// ROS source: do not record a topic while nothing subscribes to it (ros2 bag's "leaf"
    /// topics); asked at every discovery poll, so it is recorded once a subscriber appears.
    /// The synthetic source has no subscribers: refused there.
    #[arg(long)]
    pub ignore_leaf_topics: bool,
    /// ROS source: the recorder's node name [default: rosbag2_recorder, as ros2 bag]; its
    /// services follow it (/NAME/pause, /NAME/resume, /NAME/is_paused, /NAME/split_bagfile on
    /// Jazzy, /NAME/snapshot with a ring). The synthetic source has no node: refused there.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// ROS source: stamp messages with the /clock topic's time (rosgraph_msgs/msg/Clock)
    /// instead of --clock's; until the first /clock message nothing is subscribed or written
    /// (as ros2 bag). Refused with --clock ptp, --no-discovery and the synthetic source.
    #[arg(long)]
    pub use_sim_time: bool,
    /// Also record hidden topics (a name part starting with `_`).
    #[arg(long)]
    pub include_hidden_topics: bool,
    /// rosbag2's compression mode: `none` (the default) writes plain `.db3` splits; `file`
    /// (with --compression-format zstd) compresses each closed split whole into
    /// `<split>.db3.zstd` on background threads, as rosbag2's file mode; `message` stores
    /// each message as one zstd frame in plain `.db3` splits (rosbag2's message mode),
    /// compressed on the writer thread; -b counts the compressed bytes.
    #[arg(long, value_name = "MODE", default_value = "none",
          value_parser = ["none", "file", "message"])]
    pub compression_mode: String,
    /// rosbag2's compression format (`zstd`, the only one, at rosbag2's level 1); needs a
    /// --compression-mode other than `none`, and that mode needs it, as in ros2 bag.
    #[arg(long, value_name = "FORMAT", default_value = "")]
    pub compression_format: String,
    /// Threads compressing closed splits, at nice 19 (0 = one per core, as rosbag2); file
    /// mode only (message mode compresses on the writer thread).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub compression_threads: u32,
    /// Closed splits waiting for a compression thread (rosbag2's default 1; 0 = no limit).
    /// The recorder never waits: a split that finds the queue full stays a plain `.db3`
    /// until the queue has room (at the latest when the recording stops), counted in
    /// custom_data `ringbag.compression_queue_full` and logged at warn.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub compression_queue_size: u32,
    /// Topic discovery polling interval, milliseconds.
    #[arg(
        short = 'p',
        long,
        default_value_t = 100,
        allow_negative_numbers = true
    )]
    pub polling_interval: u64,
    /// Subscribe only to topics present at start.
    #[arg(long)]
    pub no_discovery: bool,
    /// YAML file with per-topic QoS overrides (as ros2 bag record).
    #[arg(long)]
    pub qos_profile_overrides_path: Option<PathBuf>,
    /// Reader history of each subscription, messages: 0 = keep all (the middleware never
    /// discards what it received; losses happen, counted, in ringbag's queue); N = keep-last
    /// with at least N (rosbag2 uses 10). An override file's history/depth wins.
    #[arg(long, value_name = "N", default_value_t = crate::source::select::DEFAULT_SUBSCRIPTION_HISTORY)]
    pub subscription_depth: u64,

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
    #[arg(long, default_value = "100MiB", allow_negative_numbers = true)]
    pub max_cache_size: String,
    /// SQLite tuning and durability: write-optimized, resilient, none (rosbag2 default).
    #[arg(long, value_enum, default_value = "write-optimized")]
    pub storage_preset_profile: StoragePreset,
    /// rosbag2's sqlite3 storage config YAML (`write: pragmas: [..]`): cache_size, mmap_size,
    /// temp_store and a synchronous no weaker than the preset's are applied; pragmas the
    /// preset's guarantees rest on (journal_mode, locking_mode, page_size, a weaker
    /// synchronous) and unknown ones are refused (exit 2). `read:` is play's.
    #[arg(long, value_name = "FILE")]
    pub storage_config_file: Option<PathBuf>,
    /// Extra KEY=VALUE stored in the bag's custom_data (repeatable; Jazzy format).
    #[arg(long, num_args = 1..)]
    pub custom_data: Vec<String>,

    /// Start a new split when the open one reaches this size. Bytes or with units; min 86016; 0 = off.
    #[arg(short = 'b', long, default_value = "0", allow_negative_numbers = true)]
    pub max_bag_size: String,
    /// Start a new split when the open one spans this long. Seconds or with s/m/h/d; 0 = off.
    #[arg(short = 'd', long, default_value = "0", allow_negative_numbers = true)]
    pub max_bag_duration: String,
    /// Stop recording (exit 0) once this many split files have been created; 0 = off.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub max_splits: u32,

    /// Circular logging: keep the total size of all split files at most this many bytes (or
    /// with units), deleting the oldest closed splits first; the bound holds at every batch
    /// commit. Needs -b, and must be at least 2 x --max-bag-size. [default: off]
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub max_record_size: Option<String>,
    /// Circular logging: keep the span from the start of the oldest kept split to the newest
    /// message at most this long (seconds, or with s/m/h/d), deleting the oldest closed splits.
    /// Coverage is at least this minus one split duration, so choose -d well below it. Needs -b
    /// or -d; at least 2 x --max-bag-duration. [default: off]
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub max_record_duration: Option<String>,
    /// Circular logging: keep at most this many split files (the open one included), deleting
    /// the oldest. Needs -b or -d; at least 2. [default: off]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_bag_files: Option<u32>,
    /// Keep at least this many bytes (or with units) free on the bag's partition, deleting the
    /// oldest closed splits; when none is left and space is still short, recording stops with
    /// an error (exit 1) instead of filling the disk; 0 = off. [default, when neither this nor
    /// --min-free-space-percent is given: 5 % of the partition or 1 GiB, whichever is smaller]
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub min_free_space: Option<String>,
    /// Like --min-free-space, as a percentage (0 < P < 100) of the partition's size; with both,
    /// the larger floor applies. [default: off]
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub min_free_space_percent: Option<String>,

    /// Where messages come from [default: ros in builds with the `ros` feature, else synthetic].
    #[arg(long, value_enum)]
    pub source: Option<SourceKind>,
    /// Synthetic source profile: robot (IMU, tf, 2 cameras, point cloud), small (100 B),
    /// medium (64 KiB), large (1 MiB), mixed (100 B at 1 kHz and 2 MB at 30 Hz).
    #[arg(long, value_enum, default_value = "robot")]
    pub synthetic_profile: SyntheticProfile,
    /// Synthetic source pace: realtime or max.
    #[arg(long, value_enum, default_value = "realtime")]
    pub synthetic_rate: SyntheticRate,
    /// Synthetic payload bytes: template (one per topic, a few bytes patched per message;
    /// compresses unrealistically well) or realistic (camera frames with sensor noise, a noisy
    /// 64-ring lidar scan, noisy IMU and tf: as compressible as real data; for compression
    /// benchmarks). The String profiles are the same either way.
    #[arg(long, value_enum, value_name = "P", default_value = "template")]
    pub synthetic_payload: Payload,
    /// Stop cleanly after this many synthetic messages in total; 0 = until stopped.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub synthetic_count: u64,

    /// Before recording, reindex unfinished bags (crashed recordings) in the output's parent
    /// directory: no metadata.yaml, one older than the newest split, or one listing fewer
    /// files than exist.
    #[arg(long)]
    pub recover: bool,
    /// Write `{"committed": N, "splits": K, "paused": B, "paused_messages": P}` to this file
    /// (atomically, every ~100 ms): N messages are committed to the bag and survive a kill of
    /// the process; P were left out while paused.
    #[arg(long, value_name = "PATH")]
    pub status_file: Option<PathBuf>,

    /// Prometheus metrics for node_exporter's textfile collector: rewrite this `*.prom` file
    /// atomically every --metrics-interval, and once more at the end. [default: off]
    #[arg(long, value_name = "PATH")]
    pub metrics_textfile: Option<PathBuf>,
    /// How often --metrics-textfile is rewritten (seconds or with s/m/h; 1 s to 1 h).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "10",
        allow_negative_numbers = true
    )]
    pub metrics_interval: String,
    /// Serve Prometheus metrics at `GET /metrics` on this address and port, e.g.
    /// 127.0.0.1:9466 (refreshed every second). [default: off]
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<String>,

    /// Black box: keep the newest messages in a memory ring of this size (bytes or with
    /// units, e.g. 2GiB; at least 1MiB) on tmpfs, written to a bag only on a trigger. The ring
    /// survives a crash of the recorder (not a reboot). [default: off]
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub snapshot_size: Option<String>,
    /// Keep at most this long in the ring (seconds or with s/m/h); whichever of size and
    /// duration is reached first evicts the oldest. [default: bounded by size only]
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub snapshot_duration: Option<String>,
    /// The ring file [default: /dev/shm/ringbag-<uid>/ringbag-<recording root>-<crc>.ring,
    /// so the next record into the same root finds a ring a crash left]. Created 0600; an
    /// existing file must be a ring of this user (mode 0600, one link): anything else is
    /// refused, never overwritten.
    #[arg(long, value_name = "PATH")]
    pub snapshot_file: Option<PathBuf>,
    /// Topics kept in the ring only, not recorded continuously. With neither this nor
    /// --snapshot-regex, every topic is ring-only.
    #[arg(long, num_args = 1.., value_name = "TOPIC")]
    pub snapshot_topics: Vec<String>,
    /// Topics matching this regular expression are kept in the ring only.
    #[arg(long, value_name = "RE")]
    pub snapshot_regex: Option<String>,
    /// Record TOPIC continuously at most HZ messages per second (repeatable); the ring keeps
    /// every message. Left-out messages are counted as throttled, not as drops.
    #[arg(long, value_name = "TOPIC=HZ")]
    pub topic_rate: Vec<String>,
    /// A message on this topic triggers a snapshot; a std_msgs/msg/Bool only when true.
    /// TYPE (optional): any, std_msgs/msg/Bool or std_msgs/msg/Empty.
    #[arg(long, value_name = "TOPIC[:TYPE]")]
    pub trigger_topic: Option<String>,
    /// Listen for `ringbag trigger`, `pause` and `resume` on this unix socket; no ring needed
    /// (without --snapshot-size, pause and resume work and a trigger is answered that there
    /// is no ring). [default: none; the service always uses /run/ringbag/control.sock]
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Start with recording paused: nothing is written to the bag until it is resumed (the
    /// space bar, or `ringbag resume` with --control-socket). The snapshot ring records anyway.
    #[arg(long)]
    pub start_paused: bool,
    /// No keyboard controls even on a terminal (they are off anyway when stdin is not one).
    /// With them, the space bar pauses and resumes recording.
    #[arg(long)]
    pub disable_keyboard_controls: bool,

    #[command(flatten)]
    pub clock: ClockArgs,
}
