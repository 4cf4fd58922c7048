//! The service's TOML file. Keys are `ringbag record`'s long option names (underscores for
//! dashes) with the same units, so an operator learns one vocabulary. Unknown keys are errors:
//! a typo in a field config must not silently fall back to a default.

pub mod keys;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bag::schema::StoragePreset;
use crate::bag::Flavour;
use crate::clock::{ClockKind, ClockSettings, Timescale};
use crate::retention::RetentionPolicy;
use crate::source::synthetic::SyntheticProfile;
use crate::units::{parse_bytes, parse_duration_ns};
use crate::upload::settings::{Environment, RawUpload, ResolvedUpload, UploadSettings};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A mistake at a place in the file: `file:line:column: key: problem`.
    #[error("{}:{line}:{column}: {key}: {message}", path.display())]
    At {
        path: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
}

/// A size or duration written as a number or as a string with a unit.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Quantity {
    Number(u64),
    Text(String),
}

impl Quantity {
    pub(crate) fn bytes(&self) -> Result<u64, String> {
        match self {
            // The same ceiling as a size written with units: a file size is signed 64-bit.
            Quantity::Number(n) if *n > crate::units::MAX_BYTES => Err(format!(
                "{n} is too large (at most {} bytes, 8 EiB)",
                crate::units::MAX_BYTES
            )),
            Quantity::Number(n) => Ok(*n),
            Quantity::Text(s) => parse_bytes(s),
        }
    }
    fn duration_ns(&self) -> Result<i64, String> {
        match self {
            Quantity::Number(n) => i64::try_from(*n)
                .ok()
                .and_then(|s| s.checked_mul(1_000_000_000))
                .ok_or_else(|| format!("{n} s is too long")),
            Quantity::Text(s) => parse_duration_ns(s),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub output_root: Option<PathBuf>,
    pub bag_format: Option<Flavour>,
    #[serde(default)]
    pub topics: Vec<String>,
    #[serde(default)]
    pub all: bool,
    pub regex: Option<String>,
    pub exclude_regex: Option<String>,
    #[serde(default)]
    pub exclude_topics: Vec<String>,
    #[serde(default)]
    pub topic_types: Vec<String>,
    #[serde(default)]
    pub exclude_topic_types: Vec<String>,
    #[serde(default)]
    pub include_hidden_topics: bool,
    pub max_bag_size: Option<Quantity>,
    pub max_bag_duration: Option<Quantity>,
    pub max_record_size: Option<Quantity>,
    pub max_record_duration: Option<Quantity>,
    pub max_bag_files: Option<u32>,
    pub min_free_space: Option<Quantity>,
    pub min_free_space_percent: Option<f64>,
    pub storage_preset_profile: Option<StoragePreset>,
    /// `record`'s compression flags: `none` (default) or `file` with format `zstd`.
    pub compression_mode: Option<String>,
    pub compression_format: Option<String>,
    pub compression_threads: Option<u32>,
    pub compression_queue_size: Option<u32>,
    pub max_cache_size: Option<Quantity>,
    pub clock: Option<ClockKind>,
    pub ptp_device: Option<PathBuf>,
    pub ptp_timescale: Option<Timescale>,
    pub tai_utc_offset: Option<i64>,
    /// Milliseconds.
    pub ptp_poll_interval: Option<u64>,
    /// Microseconds.
    pub ptp_step_threshold: Option<u64>,
    /// Where messages come from: "ros" (needs a build with the `ros` feature) or "synthetic".
    pub source: Option<SourceChoice>,
    pub synthetic_profile: Option<SyntheticProfile>,
    pub synthetic_rate: Option<SyntheticRate>,
    /// Stop cleanly after this many synthetic messages; 0 = until stopped.
    pub synthetic_count: Option<u64>,
    /// The service's status file, rewritten atomically every second.
    pub status_file: Option<PathBuf>,
    /// Black box (see `ringbag record --help`): the ring's size, window and file.
    pub snapshot_size: Option<Quantity>,
    pub snapshot_duration: Option<Quantity>,
    pub snapshot_file: Option<PathBuf>,
    #[serde(default)]
    pub snapshot_topics: Vec<String>,
    pub snapshot_regex: Option<String>,
    /// `["/camera/front/image_raw=2", ...]`
    #[serde(default)]
    pub topic_rate: Vec<String>,
    pub trigger_topic: Option<String>,
    /// Default /run/ringbag/control.sock, ring or not.
    pub control_socket: Option<PathBuf>,
    /// Fleet offload (`[upload]`): on when the table is there (unless `enabled = false`).
    pub upload: Option<RawUpload>,
    /// Prometheus metrics for node_exporter's textfile collector (a `*.prom` path).
    pub metrics_textfile: Option<PathBuf>,
    /// How often that file is rewritten (seconds, or a duration with units); default 10 s.
    pub metrics_interval: Option<Quantity>,
    /// `host:port` serving `GET /metrics`.
    pub metrics_listen: Option<String>,
}

/// Default `metrics_interval`.
pub const DEFAULT_METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The metrics keys, checked ([`crate::metrics`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSettings {
    pub textfile: Option<PathBuf>,
    pub interval: std::time::Duration,
    pub listen: Option<std::net::SocketAddr>,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            textfile: None,
            interval: DEFAULT_METRICS_INTERVAL,
            listen: None,
        }
    }
}

/// `metrics_textfile`: written as the status file is (a rename in its directory), and read by
/// node_exporter's textfile collector, which reads only `*.prom` files.
pub fn check_metrics_textfile(path: &Path) -> Result<(), String> {
    check_status_file(path)?;
    if path.extension().and_then(|e| e.to_str()) != Some("prom") {
        return Err(
            "must end in .prom (node_exporter's textfile collector reads only *.prom files)".into(),
        );
    }
    Ok(())
}

/// `metrics_interval`: from 1 s (a rewrite a second is the status file's own pace) to 1 h.
pub fn parse_metrics_interval(ns: i64) -> Result<std::time::Duration, String> {
    if !(1_000_000_000..=3_600_000_000_000).contains(&ns) {
        return Err("must be from 1 s to 1 h".into());
    }
    Ok(std::time::Duration::from_nanos(ns as u64))
}

/// `metrics_listen`: an IP address and a port (a host name would make start-up wait on DNS).
pub fn parse_metrics_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse::<std::net::SocketAddr>().map_err(|_| {
        format!("{text:?} is not an address and port like \"127.0.0.1:9466\" or \"[::1]:9466\"")
    })
}

/// `source = "ros" | "synthetic"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceChoice {
    Ros,
    Synthetic,
}

/// `synthetic_rate = "realtime" | "max"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyntheticRate {
    Realtime,
    Max,
}

/// Default recording root (systemd's `StateDirectory=ringbag` plus `bags`).
pub const DEFAULT_OUTPUT_ROOT: &str = "/var/lib/ringbag/bags";
/// Default status file (systemd's `RuntimeDirectory=ringbag`).
pub const DEFAULT_STATUS_FILE: &str = "/run/ringbag/status.json";
/// rosbag2's smallest split size (21 pages of 4 KiB).
pub const MIN_MAX_BAG_SIZE: u64 = 86016;
/// Above this, `[upload]`'s memory (part_size × concurrency) is warned about.
pub const UPLOAD_MEMORY_WARNING: u64 = 1 << 30;
/// Default `max_cache_size`, as on the command line.
pub const DEFAULT_MAX_CACHE_SIZE: u64 = 100 << 20;

/// A config checked from end to end: every value resolved, every combination possible.
#[derive(Debug, Clone)]
pub struct Checked {
    pub config: ServiceConfig,
    pub budgets: Budgets,
    pub retention: RetentionPolicy,
    pub clock: ClockSettings,
    pub output_root: PathBuf,
    pub status_file: PathBuf,
    pub source: SourceChoice,
    pub synthetic_profile: SyntheticProfile,
    pub synthetic_rate: SyntheticRate,
    pub synthetic_count: u64,
    /// The synthetic profile's topics the selection keys keep (`GeneratorConfig::topics`).
    pub synthetic_topics: u64,
    pub max_cache_size: u64,
    /// `compression_mode = "file"`: closed splits compressed (as `record`'s flags).
    pub compression: Option<crate::bag::filemode::FileCompression>,
    pub snapshot: crate::snapshot::SnapshotSettings,
    /// Settings that are valid but cannot act as written (a snapshot or rate key naming a
    /// topic the selection does not record); logged by [`ServiceConfig::load_checked`].
    pub warnings: Vec<String>,
    /// `[upload]`, when uploads are on (the table is there and not `enabled = false`).
    pub upload: Option<UploadPlan>,
    pub metrics: MetricsSettings,
}

/// The `[upload]` table checked, and its credentials looked up (each check looks again, so a
/// SIGHUP picks up fixed or rotated credentials).
#[derive(Debug, Clone)]
pub struct UploadPlan {
    pub settings: UploadSettings,
    /// Credentials that cannot be had are not a reason to stop recording: the daemon records
    /// on and uploads nothing until a reload finds them. `--check-config` refuses them
    /// ([`Checked::upload_problem`]).
    pub resolved: Result<ResolvedUpload, Located>,
}

/// A problem at a place in the config file, kept until someone reports it (clonable, unlike
/// [`ConfigError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
    pub key: String,
    pub message: String,
}

impl Located {
    pub fn to_error(&self) -> ConfigError {
        ConfigError::At {
            path: self.path.clone(),
            line: self.line,
            column: self.column,
            key: self.key.clone(),
            message: self.message.clone(),
        }
    }
}

impl Checked {
    /// `to <endpoint>/<bucket> as <robot_id>, credentials from <source>` when uploads are on
    /// and their credentials were found (`--check-config` prints it after "upload: ").
    pub fn upload_summary(&self) -> Option<String> {
        self.upload
            .as_ref()
            .and_then(|p| p.resolved.as_ref().ok())
            .map(ResolvedUpload::summary)
    }

    /// Why uploads could not run with this config although it is valid for recording (no
    /// credentials): an error for `--check-config`, a logged error for the daemon.
    pub fn upload_problem(&self) -> Option<ConfigError> {
        self.upload
            .as_ref()
            .and_then(|p| p.resolved.as_ref().err())
            .map(Located::to_error)
    }
}

/// A [`ConfigError::At`] for `key` at `span` of `text` (line 1, column 1 without a span).
fn located(
    text: &str,
    path: &Path,
    span: Option<std::ops::Range<usize>>,
    key: &str,
    message: String,
) -> ConfigError {
    let (line, column) = span.map_or((1, 1), |s| line_column(text, s.start));
    ConfigError::At {
        path: path.to_path_buf(),
        line,
        column,
        key: key.to_string(),
        message,
    }
}

/// A config file's `[upload]` table as written ([`ServiceConfig::load_upload_table`]), with
/// where each of its keys is in the file.
pub struct UploadTable {
    pub raw: RawUpload,
    path: PathBuf,
    text: String,
    spans: Spans,
}

impl UploadTable {
    /// `file:line:col: upload.<key>: message`, at the key's value, or at the table's header
    /// when the table does not set the key (a required one missing).
    pub fn locate(&self, key: &str, message: String) -> ConfigError {
        let key = format!("upload.{key}");
        let span = self.spans.value(&key).or(self.spans.key("upload"));
        located(&self.text, &self.path, span, &key, message)
    }

    /// The config file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut at = offset.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Top-level keys with the byte spans of the key and of its value.
struct Spans(Vec<(String, std::ops::Range<usize>, std::ops::Range<usize>)>);

impl Spans {
    fn of(text: &str) -> Self {
        let Ok(table) = toml::de::DeTable::parse(text) else {
            return Spans(Vec::new());
        };
        let mut spans = Vec::new();
        // A table's own keys (`upload.endpoint`) come before the table's, so that `key_at`
        // names the innermost key.
        for (k, v) in table.get_ref() {
            if let Some(inner) = v.get_ref().as_table() {
                for (ik, iv) in inner {
                    spans.push((
                        format!("{}.{}", k.get_ref(), ik.get_ref()),
                        ik.span(),
                        iv.span(),
                    ));
                }
            }
        }
        for (k, v) in table.get_ref() {
            spans.push((k.get_ref().to_string(), k.span(), v.span()));
        }
        Spans(spans)
    }
    /// The key's own span, if the file sets it.
    fn key(&self, key: &str) -> Option<std::ops::Range<usize>> {
        self.0
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, k, _)| k.clone())
    }
    /// The keys of table `table` as written (`upload.x` → `x`).
    fn keys_of<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter_map(move |(k, _, _)| {
            k.strip_prefix(table)
                .and_then(|rest| rest.strip_prefix('.'))
        })
    }
    /// The value's span of `key`, if the file sets it.
    fn value(&self, key: &str) -> Option<std::ops::Range<usize>> {
        self.0
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, v)| v.clone())
    }
    /// The key whose key or value contains byte `at`.
    fn key_at(&self, at: usize) -> Option<&str> {
        self.0
            .iter()
            .find(|(_, k, v)| k.contains(&at) || v.contains(&at) || v.end == at)
            .map(|(k, _, _)| k.as_str())
    }
}

/// Rewrites `--max-bag-size` / `-b/--max-bag-size` in a shared validation message as the
/// config's key `max_bag_size`.
fn flags_as_keys(message: &str) -> String {
    let short = regex::Regex::new(r"-[a-z]/--").expect("static regex");
    let long = regex::Regex::new(r"--([a-z][a-z-]*)").expect("static regex");
    let m = short.replace_all(message, "--");
    long.replace_all(&m, |c: &regex::Captures| c[1].replace('-', "_"))
        .into_owned()
}

/// Sizes and durations resolved to bytes and nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budgets {
    pub max_bag_size: u64,
    pub max_bag_duration_ns: i64,
    pub max_record_size: Option<u64>,
    pub max_record_duration_ns: Option<i64>,
    pub min_free_space: Option<u64>,
    pub max_cache_size: Option<u64>,
}

impl ServiceConfig {
    /// The topic selection keys, as the `record` flags carry them (both sources use them).
    pub fn selection(&self) -> crate::source::select::RosSourceOptions {
        crate::source::select::RosSourceOptions {
            topics: self.topics.clone(),
            all: self.all,
            regex: self.regex.clone(),
            exclude_regex: self.exclude_regex.clone(),
            exclude_topics: self.exclude_topics.clone(),
            topic_types: self.topic_types.clone(),
            exclude_topic_types: self.exclude_topic_types.clone(),
            include_hidden_topics: self.include_hidden_topics,
            ..Default::default()
        }
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read_config_text(path)?, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            // toml's messages span several lines with a caret; keep the first for one-line errors.
            message: e
                .message()
                .lines()
                .next()
                .unwrap_or("invalid TOML")
                .to_string(),
        })
    }

    /// Parse `text`: syntax, unknown keys and types, each mistake one [`ConfigError::At`]
    /// (`file:line:col: key: problem`). A secret or a TLS switch in `[upload]` is told where
    /// credentials go, or that there is no such switch, before serde's generic "unknown key".
    fn parse_located(text: &str, path: &Path, spans: &Spans) -> Result<Self, ConfigError> {
        let at = |span: Option<std::ops::Range<usize>>, key: &str, message: String| {
            located(text, path, span, key, message)
        };
        for k in spans.keys_of("upload") {
            if crate::upload::settings::KEYS.contains(&k) {
                continue;
            }
            let message = if crate::upload::settings::is_secret_key(k) {
                crate::upload::settings::WHERE_CREDENTIALS_GO
            } else if crate::upload::settings::is_insecure_key(k) {
                crate::upload::settings::TLS_ALWAYS_VERIFIED
            } else {
                continue;
            };
            let key = format!("upload.{k}");
            return Err(at(spans.key(&key), &key, message.to_string()));
        }
        toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .and_then(|s| spans.key_at(s.start))
                .unwrap_or("(file)")
                .to_string();
            let first = e.message().lines().next().unwrap_or("invalid TOML");
            let message = if first.starts_with("unknown field") {
                "unknown key".to_string()
            } else {
                first.to_string()
            };
            at(e.span(), &key, message)
        })
    }

    /// The `[upload]` table of the ringbag.toml at `path`, for `ringbag upload --config`:
    /// read and parsed as `--check-config` reads it (the whole file: syntax, unknown keys and
    /// types anywhere are errors with `file:line:col`), but the rest is not checked against
    /// this machine (a robot's file on a laptop names a recording root that is not there).
    /// The table's values are checked by the caller, after its flags override them
    /// ([`UploadTable::locate`] places a problem).
    pub fn load_upload_table(path: &Path) -> Result<UploadTable, ConfigError> {
        let text = read_config_text(path)?;
        let spans = Spans::of(&text);
        let config = Self::parse_located(&text, path, &spans)?;
        let Some(raw) = config.upload else {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: "has no [upload] table".into(),
            });
        };
        Ok(UploadTable {
            raw,
            path: path.to_path_buf(),
            text,
            spans,
        })
    }

    /// Read and check `path` from end to end (`ringbag daemon --check-config`).
    pub fn load_checked(path: &Path) -> Result<Checked, ConfigError> {
        let text = read_config_text(path)?;
        let checked = Self::check_with(&text, path, &Environment::process())?;
        for w in &checked.warnings {
            log::warn!("{}: {w}", path.display());
        }
        Ok(checked)
    }

    /// Parse and check `text` (read from `path`): every mistake is one [`ConfigError::At`]
    /// naming the line and column, the key and the problem. Checks what can be known before
    /// recording: syntax, unknown keys, types, units, bounds, combinations of limits, the
    /// source, and that the recording root can be written.
    pub fn check(text: &str, path: &Path) -> Result<Checked, ConfigError> {
        Self::check_with(text, path, &Environment::process())
    }

    /// [`ServiceConfig::check`] with the environment `[upload]` reads (variables for the
    /// credentials, the machine id) given.
    pub fn check_with(
        text: &str,
        path: &Path,
        env: &Environment<'_>,
    ) -> Result<Checked, ConfigError> {
        let spans = Spans::of(text);
        let at = |span: Option<std::ops::Range<usize>>, key: &str, message: String| {
            located(text, path, span, key, message)
        };
        let config = Self::parse_located(text, path, &spans)?;
        let err = |key: &str, message: String| at(spans.value(key), key, message);
        let bytes = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.bytes().map_err(|e| err(key, e)))
                .transpose()
        };
        let dur = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.duration_ns().map_err(|e| err(key, e)))
                .transpose()
        };
        let budgets = Budgets {
            max_bag_size: bytes("max_bag_size", &config.max_bag_size)?.unwrap_or(0),
            max_bag_duration_ns: dur("max_bag_duration", &config.max_bag_duration)?.unwrap_or(0),
            max_record_size: bytes("max_record_size", &config.max_record_size)?,
            max_record_duration_ns: dur("max_record_duration", &config.max_record_duration)?,
            min_free_space: bytes("min_free_space", &config.min_free_space)?,
            max_cache_size: bytes("max_cache_size", &config.max_cache_size)?,
        };
        if budgets.max_bag_size > 0 && budgets.max_bag_size < MIN_MAX_BAG_SIZE {
            return Err(err(
                "max_bag_size",
                format!(
                    "{} bytes is below the minimum of {MIN_MAX_BAG_SIZE} bytes (as in rosbag2)",
                    budgets.max_bag_size
                ),
            ));
        }
        let compression = crate::bag::filemode::FileCompression::from_flags(
            config.compression_mode.as_deref().unwrap_or("none"),
            config.compression_format.as_deref().unwrap_or(""),
            config.compression_threads.unwrap_or(0),
            config.compression_queue_size.unwrap_or(1),
        )
        .map_err(|m| {
            let m = flags_as_keys(&m);
            let key = if m.starts_with("compression_format") {
                "compression_format"
            } else {
                "compression_mode"
            };
            // `key: file needs …`, not `key: key file needs …`.
            let m = m.strip_prefix(key).map_or(m.as_str(), str::trim_start);
            err(key, m.to_string())
        })?;
        let max_cache_size = budgets.max_cache_size.unwrap_or(DEFAULT_MAX_CACHE_SIZE);
        if max_cache_size == 0 {
            return Err(err("max_cache_size", "must be greater than 0".into()));
        }
        let retention = RetentionPolicy {
            max_record_size: budgets.max_record_size,
            max_record_duration_ns: budgets.max_record_duration_ns,
            max_bag_files: config.max_bag_files,
            min_free_space: budgets.min_free_space,
            min_free_space_percent: config.min_free_space_percent,
            max_splits: 0,
        };
        if let Err(m) = retention.validate(budgets.max_bag_size, budgets.max_bag_duration_ns) {
            let m = flags_as_keys(&m);
            // Blame the first limit the message names (the one the combination is about).
            let key = [
                "max_record_size",
                "max_record_duration",
                "max_bag_files",
                "min_free_space_percent",
                "min_free_space",
            ]
            .into_iter()
            .find(|k| m.starts_with(k))
            .or_else(|| {
                ["max_record_size", "max_record_duration", "max_bag_files"]
                    .into_iter()
                    .find(|k| spans.value(k).is_some())
            })
            .unwrap_or("max_record_size");
            return Err(err(key, m));
        }
        let clock = config.clock_settings();
        if let Err(e) = clock.validate() {
            let m = e.to_string();
            let key = if m.contains("poll interval") {
                "ptp_poll_interval"
            } else if m.contains("tai-utc-offset") {
                "tai_utc_offset"
            } else {
                "ptp_step_threshold"
            };
            return Err(err(key, flags_as_keys(&m)));
        }
        let source = config.source.unwrap_or(if cfg!(feature = "ros") {
            SourceChoice::Ros
        } else {
            SourceChoice::Synthetic
        });
        if source == SourceChoice::Ros {
            if !cfg!(feature = "ros") {
                return Err(err(
                    "source",
                    "\"ros\": this ringbag was built without the `ros` feature (use \"synthetic\", or rebuild with --features ros)".into(),
                ));
            }
            for key in ["synthetic_profile", "synthetic_rate", "synthetic_count"] {
                if spans.value(key).is_some() {
                    return Err(err(key, "only applies with source = \"synthetic\"".into()));
                }
            }
        }
        for (key, re) in [
            ("regex", &config.regex),
            ("exclude_regex", &config.exclude_regex),
        ] {
            if let Some(re) = re {
                if let Err(e) = regex::Regex::new(re) {
                    let why = crate::source::select::regex_error_line(&e);
                    return Err(err(key, format!("not a valid regular expression: {why}")));
                }
            }
        }
        let output_root = config
            .output_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_ROOT));
        if let Err(m) = check_root(&output_root) {
            return Err(err("output_root", m));
        }
        let snapshot = config.snapshot_settings(&output_root).map_err(|m| {
            let key = [
                "snapshot_size",
                "snapshot_duration",
                "snapshot_file",
                "snapshot_topics",
                "snapshot_regex",
                "topic_rate",
                "trigger_topic",
                "control_socket",
            ]
            .into_iter()
            .find(|k| m.starts_with(k))
            .unwrap_or("snapshot_size");
            let m = m
                .strip_prefix(key)
                .unwrap_or(&m)
                .trim_start_matches(':')
                .trim();
            err(key, m.to_string())
        })?;
        if let Some(ring) = &snapshot.ring {
            let file = ring.ring_file(&output_root);
            preflight_snapshot_file(&file)
                .map_err(|m| err("snapshot_file", format!("{}: {m}", shown(&file))))?;
        }
        let status_file = config
            .status_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATUS_FILE));
        if let Err(m) = check_status_file(&status_file) {
            return Err(err("status_file", format!("{}: {m}", shown(&status_file))));
        }
        {
            let file = snapshot.ring.as_ref().map(|r| r.ring_file(&output_root));
            let mut named = vec![("status_file", status_file.as_path())];
            if let Some(file) = file.as_deref() {
                named.push(("snapshot_file", file));
            }
            if let Some(socket) = snapshot.control_socket.as_deref() {
                named.push(("control_socket", socket));
            }
            if let Some((a, b)) = shared_path(&named) {
                let path = named
                    .iter()
                    .find(|(k, _)| *k == a)
                    .map_or(Path::new(""), |n| n.1);
                return Err(err(
                    a,
                    format!(
                        "{}: the same file as {b}; each needs a path of its own",
                        shown(path)
                    ),
                ));
            }
        }
        let metrics = MetricsSettings {
            textfile: match &config.metrics_textfile {
                Some(p) => {
                    check_metrics_textfile(p)
                        .map_err(|m| err("metrics_textfile", format!("{}: {m}", shown(p))))?;
                    if p == &status_file {
                        return Err(err(
                            "metrics_textfile",
                            format!(
                                "{}: the same file as status_file; each needs a path of its own",
                                shown(p)
                            ),
                        ));
                    }
                    Some(p.clone())
                }
                None => None,
            },
            interval: match &config.metrics_interval {
                Some(q) => q
                    .duration_ns()
                    .and_then(parse_metrics_interval)
                    .map_err(|m| err("metrics_interval", m))?,
                None => DEFAULT_METRICS_INTERVAL,
            },
            listen: match &config.metrics_listen {
                Some(t) => Some(parse_metrics_listen(t).map_err(|m| err("metrics_listen", m))?),
                None => None,
            },
        };
        let synthetic_profile = config.synthetic_profile.unwrap_or(SyntheticProfile::Robot);
        let synthetic_topics = if source == SourceChoice::Synthetic {
            crate::source::generator::select_topics(synthetic_profile, &config.selection())
                .map_err(|m| {
                    // The key to point at: the first selection key the file sets.
                    let key = [
                        ("topics", !config.topics.is_empty()),
                        ("regex", config.regex.is_some()),
                        ("exclude_regex", config.exclude_regex.is_some()),
                        ("exclude_topics", !config.exclude_topics.is_empty()),
                        ("topic_types", !config.topic_types.is_empty()),
                        (
                            "exclude_topic_types",
                            !config.exclude_topic_types.is_empty(),
                        ),
                    ]
                    .into_iter()
                    .find_map(|(k, set)| set.then_some(k))
                    .unwrap_or("all");
                    if m.is_about_the_profile() {
                        err(key, format!("with source = \"synthetic\": {m}"))
                    } else {
                        err(key, m.to_string())
                    }
                })?
        } else {
            crate::source::generator::ALL_TOPICS
        };
        let mut warnings = crate::snapshot::settings::unrecorded_policy_topics(
            &config.selection(),
            &snapshot.policy,
            "",
        );
        let upload = match &config.upload {
            None => None,
            Some(raw) => {
                let uerr = |key: &str, message: String| {
                    let key = format!("upload.{key}");
                    at(spans.value(&key).or(spans.key("upload")), &key, message)
                };
                let settings = raw.check(env).map_err(|e| uerr(e.key, e.message))?;
                // A split larger than 10000 parts could never be uploaded.
                let most = settings
                    .tuning
                    .part_size
                    .saturating_mul(crate::upload::settings::MAX_PARTS);
                if budgets.max_bag_size > most {
                    return Err(uerr(
                        "part_size",
                        format!(
                            "{} bytes × 10000 parts (S3's most) = {most} bytes is below \
                             max_bag_size ({} bytes): a full split could not be uploaded",
                            settings.tuning.part_size, budgets.max_bag_size
                        ),
                    ));
                }
                // Each part in flight is held in memory (the uploader's budget is
                // part_size × concurrency + 8 MiB): say so when that is a lot for a robot.
                let held = settings
                    .tuning
                    .part_size
                    .saturating_mul(settings.tuning.concurrency as u64);
                if held > UPLOAD_MEMORY_WARNING {
                    warnings.push(format!(
                        "upload: part_size × concurrency = {} MiB held in memory while uploading",
                        held >> 20
                    ));
                }
                if settings.bucket.contains('.')
                    && !settings.path_style
                    && settings.endpoint.starts_with("https://")
                {
                    warnings.push(format!(
                        "upload.bucket: `{}` holds a '.': with virtual-host style addressing \
                         its host name does not match a wildcard certificate; set \
                         path_style = true if TLS fails",
                        settings.bucket
                    ));
                }
                settings.enabled.then(|| {
                    let resolved = settings.resolve(env).map_err(|e| {
                        let key = match &e {
                            crate::upload::settings::CredentialsError::Bad {
                                from: crate::upload::settings::CredentialSource::File(_),
                                ..
                            } => "upload.credentials_file",
                            _ => "upload",
                        };
                        let (line, column) = spans
                            .value(key)
                            .filter(|_| key != "upload")
                            .or(spans.key("upload"))
                            .map_or((1, 1), |s| line_column(text, s.start));
                        Located {
                            path: path.to_path_buf(),
                            line,
                            column,
                            key: key.to_string(),
                            message: e.to_string(),
                        }
                    });
                    UploadPlan { settings, resolved }
                })
            }
        };
        Ok(Checked {
            upload,
            metrics,
            budgets,
            retention,
            clock,
            output_root,
            status_file,
            source,
            synthetic_profile,
            synthetic_topics,
            synthetic_rate: config.synthetic_rate.unwrap_or(SyntheticRate::Realtime),
            synthetic_count: config.synthetic_count.unwrap_or(0),
            max_cache_size,
            compression,
            warnings,
            snapshot,
            config,
        })
    }

    /// The snapshot keys, checked as `record`'s flags are (same rules, key names). The control
    /// socket defaults to /run/ringbag/control.sock (with or without a ring); the ring lives in
    /// /run/ringbag (tmpfs).
    fn snapshot_settings(&self, root: &Path) -> Result<crate::snapshot::SnapshotSettings, String> {
        let text = |q: &Option<Quantity>| {
            q.as_ref().map(|q| match q {
                Quantity::Number(n) => n.to_string(),
                Quantity::Text(t) => t.clone(),
            })
        };
        let size = text(&self.snapshot_size);
        let duration = text(&self.snapshot_duration);
        // The service always serves its control socket, ring or not: a daemon started paused
        // (or paused by `ringbag pause`) must be resumable. One exception: the default path
        // when it cannot be used (a daemon tried by hand as an ordinary user has no
        // /run/ringbag) and nothing needs it (no ring). Refusing to start there would make
        // every hand-run daemon name a socket; it runs without one and says so. A path that
        // was asked for, or a ring's socket, is still checked and refused below.
        let socket = match &self.control_socket {
            Some(p) => Some(p.clone()),
            None => {
                let default = PathBuf::from(crate::snapshot::control::DEFAULT_CONTROL_SOCKET);
                match crate::snapshot::control::check_socket_path(&default) {
                    Err(e) if size.is_none() => {
                        log::warn!(
                            "control_socket is not set and the default cannot be used: {e}; \
                             this daemon serves no control socket (`ringbag pause`, `resume` \
                             and `trigger` cannot reach it); set control_socket"
                        );
                        None
                    }
                    _ => Some(default),
                }
            }
        };
        // The service runs in / (systemd): a relative path would name another file there than
        // the one `--check-config` looked at in the shell's directory.
        for (key, path) in [
            ("snapshot_file", self.snapshot_file.as_deref()),
            ("control_socket", socket.as_deref()),
        ] {
            if let Some(p) = path.filter(|p| !p.is_absolute()) {
                return Err(format!("{key}: {}: must be an absolute path", shown(p)));
            }
        }
        crate::snapshot::settings::snapshot_settings(
            &crate::snapshot::settings::SnapshotOptions {
                size: size.as_deref(),
                duration: duration.as_deref(),
                file: self.snapshot_file.as_deref(),
                topics: &self.snapshot_topics,
                regex: self.snapshot_regex.as_deref(),
                rates: &self.topic_rate,
                trigger_topic: self.trigger_topic.as_deref(),
                control_socket: socket.as_deref(),
            },
            Path::new(crate::snapshot::SERVICE_RING_DIR),
            root,
            "",
        )
    }

    /// The clock settings, defaults as on the command line.
    pub fn clock_settings(&self) -> ClockSettings {
        let d = ClockSettings::default();
        ClockSettings {
            kind: self.clock.unwrap_or(d.kind),
            ptp_device: self.ptp_device.clone().unwrap_or(d.ptp_device),
            timescale: self.ptp_timescale.unwrap_or(d.timescale),
            tai_utc_offset_s: self.tai_utc_offset.unwrap_or(d.tai_utc_offset_s),
            poll_interval: self
                .ptp_poll_interval
                .map(std::time::Duration::from_millis)
                .unwrap_or(d.poll_interval),
            step_threshold: self
                .ptp_step_threshold
                .map(std::time::Duration::from_micros)
                .unwrap_or(d.step_threshold),
        }
    }

    pub fn budgets(&self, path: &Path) -> Result<Budgets, ConfigError> {
        let invalid = |key: &str, e: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: format!("{key}: {e}"),
        };
        let bytes = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.bytes().map_err(|e| invalid(key, e)))
                .transpose()
        };
        let dur = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.duration_ns().map_err(|e| invalid(key, e)))
                .transpose()
        };
        Ok(Budgets {
            max_bag_size: bytes("max_bag_size", &self.max_bag_size)?.unwrap_or(0),
            max_bag_duration_ns: dur("max_bag_duration", &self.max_bag_duration)?.unwrap_or(0),
            max_record_size: bytes("max_record_size", &self.max_record_size)?,
            max_record_duration_ns: dur("max_record_duration", &self.max_record_duration)?,
            min_free_space: bytes("min_free_space", &self.min_free_space)?,
            max_cache_size: bytes("max_cache_size", &self.max_cache_size)?,
        })
    }
}

/// The largest config file read (a real one is a few KiB): a mistaken path to a huge file,
/// or a device such as /dev/zero, is refused instead of read into memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a small text file (the config, the status file) cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SmallFileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("is {0}, not a regular file; not read")]
    NotRegular(&'static str),
    #[error("larger than {0} bytes; not read")]
    TooLarge(u64),
    #[error("not UTF-8 text")]
    NotText,
}

/// Read `path` only if it is a regular file of at most `cap` bytes, without ever blocking:
/// opened with `O_NONBLOCK` (a FIFO opens at once instead of waiting for a writer; the flag
/// has no effect on a regular file's reads), `fstat` of the opened descriptor says what was
/// opened (no race with a rename in between), and at most `cap + 1` bytes are read, so a file
/// that grows meanwhile cannot make it read without end. Symbolic links are followed (a
/// config is often a link into a package). A `stat` first keeps devices from being opened
/// at all: opening some has effects of its own (/dev/watchdog arms the watchdog).
pub fn read_small_regular_file(path: &Path, cap: u64) -> Result<String, SmallFileError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = |m: &std::fs::Metadata| {
        SmallFileError::NotRegular(crate::bag::fsguard::kind(&m.file_type()))
    };
    if let Some(m) = std::fs::metadata(path).ok().filter(|m| !m.is_file()) {
        return Err(not_regular(&m));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(not_regular(&m));
    }
    if m.len() > cap {
        return Err(SmallFileError::TooLarge(cap));
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(SmallFileError::TooLarge(cap));
    }
    String::from_utf8(bytes).map_err(|_| SmallFileError::NotText)
}

/// The config file's text ([`read_small_regular_file`], at most [`MAX_CONFIG_BYTES`]).
fn read_config_text(path: &Path) -> Result<String, ConfigError> {
    read_small_regular_file(path, MAX_CONFIG_BYTES).map_err(|e| match e {
        SmallFileError::Io(source) => ConfigError::Read {
            path: path.to_path_buf(),
            source,
        },
        other => ConfigError::Invalid {
            path: path.to_path_buf(),
            message: other.to_string(),
        },
    })
}

/// A path for a one-line message: a NUL byte (which a TOML string may hold) shown as `\0`.
fn shown(path: &Path) -> String {
    path.display().to_string().replace('\0', "\\0")
}

/// What no path may hold, whatever the file: a NUL byte (no system call takes it), a
/// component longer than NAME_MAX, or more than PATH_MAX bytes in all.
fn path_text_problem(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Some("contains a NUL byte".into());
    }
    if bytes.len() >= libc::PATH_MAX as usize {
        return Some(format!(
            "{} bytes long; a path holds at most {} bytes",
            bytes.len(),
            libc::PATH_MAX - 1
        ));
    }
    path.components()
        .map(|c| c.as_os_str().len())
        .find(|&n| n > 255)
        .map(|n| format!("has a name of {n} bytes; at most 255 bytes each"))
}

/// The status file as the service writes it: replaced by a rename in its directory every
/// second. So it needs a UTF-8 file name, and whatever is already there must be a regular
/// file (a rename would replace a directory's, FIFO's, device's or link's name with ours);
/// its directory may be missing (systemd's RuntimeDirectory= creates /run/ringbag at start,
/// and the service writes once it exists) but no ancestor may be a file.
pub fn check_status_file(path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        // As for output_root: the service's directory is /, not the shell's.
        return Err("must be an absolute path".into());
    }
    if let Some(m) = path_text_problem(path) {
        return Err(m);
    }
    match path.file_name() {
        None => return Err("needs a file name".into()),
        Some(n) if n.to_str().is_none() => return Err("needs a file name in UTF-8".into()),
        Some(_) => {}
    }
    if path.is_dir() {
        return Err("exists and is a directory; the status file needs a file name".into());
    }
    if let Some(m) = status_file_taken(path) {
        return Err(m);
    }
    for anc in path.ancestors().skip(1) {
        match std::fs::metadata(anc) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => return Err(format!("{} is not a directory", anc.display())),
            Err(_) => continue,
        }
    }
    Ok(())
}

/// Why the status file may not be written at `path` when something other than a regular
/// file or a directory is there: a FIFO, device, socket or symbolic link, whose name the
/// rename that writes the status file would take over (as root, `/dev/null` itself). None
/// when nothing or a regular file is there (a directory fails the rename on its own).
pub fn status_file_taken(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let ft = path.symlink_metadata().ok()?.file_type();
    if ft.is_file() || ft.is_dir() {
        return None;
    }
    let kind = if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_socket() {
        "a socket"
    } else {
        crate::bag::fsguard::kind(&ft)
    };
    Some(format!(
        "exists and is {kind}, not a regular file; not replaced (the status file is written by a rename)"
    ))
}

/// The first two of `named` (name, path) that are one file: the same path once made absolute
/// and cleared of `.`/`..` (links in the parents resolved where they exist), or two names of
/// one existing file. The status file, the ring and the control socket each need a file of
/// their own: the status file's rename would replace the ring or the socket, losing the black
/// box, and the next start would refuse what is left there (exit 2, not restarted).
pub fn shared_path<'a>(named: &[(&'a str, &Path)]) -> Option<(&'a str, &'a str)> {
    use std::os::unix::fs::MetadataExt;
    let key = |p: &Path| {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut clean = PathBuf::new();
        for c in abs.components() {
            match c {
                std::path::Component::ParentDir => {
                    clean.pop();
                }
                std::path::Component::CurDir => {}
                c => clean.push(c),
            }
        }
        // The parent through its links (the file itself may not exist yet).
        match (clean.parent(), clean.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or(clean),
            _ => clean,
        }
    };
    let ids: Vec<(PathBuf, Option<(u64, u64)>)> = named
        .iter()
        .map(|(_, p)| {
            let inode = std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
            (key(p), inode)
        })
        .collect();
    for i in 0..named.len() {
        for j in i + 1..named.len() {
            let same_inode = matches!((ids[i].1, ids[j].1), (Some(a), Some(b)) if a == b);
            if ids[i].0 == ids[j].0 || same_inode {
                return Some((named[i].0, named[j].0));
            }
        }
    }
    None
}

/// The ring file's name as text (no NUL) and its kind, named with the key's own words before
/// the snapshot settings run the ring's full preflight (`ring::preflight`: links, foreign
/// owners, files that are not rings), which record and the daemon's start share.
fn preflight_snapshot_file(path: &Path) -> Result<(), String> {
    if let Some(m) = path_text_problem(path) {
        return Err(m);
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!(
            "is {}, not a regular file (the ring is a file of its own)",
            crate::bag::fsguard::kind(&m.file_type())
        )),
        _ => Ok(()),
    }
}

/// The recording root must be a directory this process can create bags in, or be creatable
/// (its nearest existing ancestor writable).
pub fn check_root(root: &Path) -> Result<(), String> {
    use nix::unistd::{faccessat, AccessFlags};
    if !root.is_absolute() {
        return Err(format!("{}: must be an absolute path", root.display()));
    }
    if let Some(m) = path_text_problem(root) {
        return Err(format!("{}: {m}", shown(root)));
    }
    for dir in root.ancestors() {
        if std::fs::metadata(dir).is_err() && dir.symlink_metadata().is_ok() {
            // mkdir -p would fail on it (EEXIST) at every start.
            return Err(format!(
                "{}: {} is a symbolic link to a missing target",
                root.display(),
                dir.display()
            ));
        }
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {
                if nix::sys::statvfs::statvfs(dir).is_ok_and(|st| st.blocks() == 0) {
                    return Err(format!(
                        "{}: on a filesystem without storage (such as /proc or /sys)",
                        root.display()
                    ));
                }
                // AT_EACCESS: the effective ids decide, as they will for mkdir/create.
                return faccessat(
                    nix::fcntl::AT_FDCWD,
                    dir,
                    AccessFlags::W_OK | AccessFlags::X_OK,
                    nix::fcntl::AtFlags::AT_EACCESS,
                )
                .map_err(|e| {
                    if dir == root {
                        format!(
                            "{} is not writable: {}",
                            root.display(),
                            std::io::Error::from(e)
                        )
                    } else {
                        format!(
                            "{}: cannot be created in {}: {}",
                            root.display(),
                            dir.display(),
                            std::io::Error::from(e)
                        )
                    }
                });
            }
            Ok(_) => {
                return Err(format!(
                    "{}: {} is not a directory",
                    root.display(),
                    dir.display()
                ))
            }
            Err(_) => continue,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../systemd/ringbag.toml");

    #[test]
    fn the_shipped_example_parses_with_the_documented_meaning() {
        let p = Path::new("ringbag.toml");
        let c = ServiceConfig::parse(EXAMPLE, p).unwrap();
        let clock = c.clock_settings();
        assert_eq!(clock.kind, ClockKind::Auto);
        assert_eq!(clock.ptp_device, PathBuf::from("/dev/ptp0"));
        assert_eq!(clock.timescale, Timescale::Tai);
        assert_eq!(clock.tai_utc_offset_s, 37);
        assert_eq!(clock.poll_interval, std::time::Duration::from_millis(1000));
        assert_eq!(clock.step_threshold, std::time::Duration::from_micros(100));
        clock.validate().unwrap();
        let b = c.budgets(p).unwrap();
        assert_eq!(b.max_bag_size, 512 << 20);
        assert_eq!(b.max_bag_duration_ns, 300_000_000_000);
        assert_eq!(b.max_record_size, Some(64 << 30));
        assert_eq!(b.max_record_duration_ns, Some(7 * 86_400_000_000_000));
        assert_eq!(c.bag_format, Some(Flavour::Humble));
        assert_eq!(
            c.storage_preset_profile,
            Some(StoragePreset::WriteOptimized)
        );
    }

    #[test]
    fn compression_keys_take_record_s_values_and_refuse_the_rest_naming_the_key() {
        let root = tempfile::tempdir().unwrap();
        let base = format!(
            "output_root = \"{}\"\nsource = \"synthetic\"\n",
            root.path().display()
        );
        let c = ServiceConfig::check(&base, Path::new("c.toml")).unwrap();
        assert_eq!(c.compression, None, "plain splits by default");
        let c = ServiceConfig::check(
            &format!(
                "{base}compression_mode = \"file\"\ncompression_format = \"zstd\"\n\
                 compression_threads = 2\ncompression_queue_size = 4\n"
            ),
            Path::new("c.toml"),
        )
        .unwrap();
        let f = c.compression.expect("file mode");
        assert_eq!((f.threads, f.queue_size, f.level), (2, 4, 1));
        let c = ServiceConfig::check(
            &format!("{base}compression_mode = \"message\"\ncompression_format = \"zstd\"\n"),
            Path::new("c.toml"),
        )
        .unwrap();
        assert!(c.compression.expect("message mode").per_message);
        for (extra, says) in [
            (
                "compression_mode = \"message\"\n",
                (
                    "c.toml:3:",
                    "compression_mode: message needs a compression_format",
                ),
            ),
            (
                "compression_mode = \"file\"\n",
                (
                    "c.toml:3:",
                    "compression_mode: file needs a compression_format",
                ),
            ),
            (
                "compression_format = \"zstd\"\n",
                ("c.toml:3:", "compression_format: needs a compression_mode"),
            ),
            (
                "compression_mode = \"file\"\ncompression_format = \"lz4\"\n",
                (
                    "c.toml:4:",
                    "compression_format: lz4: unknown compression format",
                ),
            ),
        ] {
            let e = ServiceConfig::check(&format!("{base}{extra}"), Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(says.0) && e.contains(says.1), "{extra}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_shipped_upload_example_uncommented_is_a_valid_table_with_the_defaults() {
        let (_, block) = EXAMPLE
            .split_once("\n# [upload]\n")
            .expect("an [upload] block");
        let table: String = block
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            // The example's CA file does not exist here.
            .filter(|l| !l.starts_with("ca_file"))
            .map(|l| format!("{l}\n"))
            .collect();
        let c = check_upload(&table, &KEYS_ENV).unwrap();
        let plan = c.upload.expect("on");
        assert_eq!(
            plan.settings.region,
            crate::upload::settings::DEFAULT_REGION
        );
        assert_eq!(
            plan.settings.key.render("b", "f"),
            "ringbag/orin-07/b/f",
            "the default template"
        );
        let t = plan.settings.tuning;
        assert_eq!((t.part_size, t.concurrency), (16 << 20, 2));
        assert!(!t.delete_after_upload);
        assert_eq!(
            plan.settings.credentials_file.as_deref(),
            Some(Path::new("/etc/ringbag/s3.credentials"))
        );
    }

    #[test]
    fn byte_offsets_become_one_based_lines_and_columns_in_characters() {
        let t = "a = 1\nµs = \"x\"\n";
        assert_eq!(line_column(t, 0), (1, 1));
        assert_eq!(line_column(t, 4), (1, 5));
        assert_eq!(line_column(t, 6), (2, 1));
        // After the two-byte µ: column 3, not 4.
        assert_eq!(line_column(t, 9), (2, 3));
        assert_eq!(line_column(t, 999), (3, 1));
    }

    #[test]
    fn shared_validation_messages_name_config_keys_not_flags() {
        assert_eq!(
            flags_as_keys("--max-record-size needs -b/--max-bag-size or -d/--max-bag-duration"),
            "max_record_size needs max_bag_size or max_bag_duration"
        );
    }

    #[test]
    fn the_selection_keys_choose_the_synthetic_topics_as_the_flags_do() {
        let p = Path::new("c.toml");
        let check = |extra: &str| {
            ServiceConfig::check(
                &format!(
                    "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n{extra}"
                ),
                p,
            )
        };
        assert_eq!(
            check("").unwrap().synthetic_topics,
            crate::source::generator::ALL_TOPICS
        );
        // The robot profile's topics in order: /imu, /tf, cameras, /points.
        assert_eq!(
            check("topics = [\"/tf\", \"imu\"]\n")
                .unwrap()
                .synthetic_topics,
            0b11
        );
        // The shipped config's live topic list: the profile's /imu and /tf are kept, the rest
        // warned about.
        assert_eq!(
            check("topics = [\"/imu\", \"/camera/image_raw\", \"/tf\", \"/tf_static\"]\n")
                .unwrap()
                .synthetic_topics,
            0b11
        );
        assert_eq!(
            check("exclude_regex = \"^/(camera|points)\"\n")
                .unwrap()
                .synthetic_topics,
            0b11
        );
        // Jazzy's type keys, as --topic-types / --exclude-topic-types.
        assert_eq!(
            check("topic_types = [\"sensor_msgs/msg/Imu\", \"tf2_msgs/msg/TFMessage\"]\n")
                .unwrap()
                .synthetic_topics,
            0b11
        );
        assert_eq!(
            check("exclude_topic_types = [\"sensor_msgs/msg/Image\", \"sensor_msgs/msg/PointCloud2\"]\n")
                .unwrap()
                .synthetic_topics,
            0b11
        );
        for (text, key, says) in [
            ("topics = [\"/camera/image_raw\"]\n", "topics", "keeps none"),
            ("regex = \"^/nothing\"\n", "regex", "keeps none"),
            (
                "topic_types = [\"std_msgs/msg/String\"]\n",
                "topic_types",
                "keeps none",
            ),
            (
                "exclude_topic_types = [\"Imu\"]\n",
                "exclude_topic_types",
                "not a type name",
            ),
        ] {
            let e = check(text).map(|_| ()).unwrap_err().to_string();
            assert!(e.starts_with("c.toml:"), "{e}");
            assert!(e.contains(key) && e.contains(says), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn clock_settings_default_like_the_command_line() {
        let c = ServiceConfig::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c.clock_settings(), ClockSettings::default());
    }

    #[test]
    fn a_misspelt_key_is_an_error_naming_it() {
        let e = ServiceConfig::parse(
            "ptp_devcie = \"/dev/ptp1\"\n",
            Path::new("/etc/ringbag/ringbag.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("/etc/ringbag/ringbag.toml:"), "{e}");
        assert!(e.contains("ptp_devcie"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }

    #[test]
    fn bad_units_name_the_key() {
        let p = Path::new("c.toml");
        let c = ServiceConfig::parse("max_bag_size = \"12 parsecs\"\n", p).unwrap();
        let e = c.budgets(p).unwrap_err().to_string();
        assert!(e.contains("max_bag_size"), "{e}");
        let e = ServiceConfig::parse("clock = \"sundial\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sundial"), "{e}");
    }

    #[test]
    fn sizes_and_durations_beyond_64_bits_are_refused_in_the_config_too() {
        let p = Path::new("c.toml");
        for text in [
            "max_bag_size = 18446744073709551615\n",
            "max_bag_size = \"17179869184GiB\"\n",
            "max_bag_duration = 9223372037\n",
        ] {
            let c = ServiceConfig::parse(text, p).unwrap();
            let e = c.budgets(p).unwrap_err().to_string();
            assert!(
                e.contains("too large") || e.contains("too long"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn snapshot_and_rate_keys_naming_a_topic_the_selection_drops_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let check = |selection: &str| {
            let text = format!(
                "output_root = \"{}/bags\"\nsource = \"synthetic\"\nsnapshot_size = \"8MiB\"\n\
                 snapshot_file = \"{}/ring\"\n\
                 snapshot_topics = [\"/camera/front/image_raw\", \"/points\"]\n\
                 topic_rate = [\"/camera/rear/image_raw=2\", \"/imu=50\"]\n{selection}",
                dir.path().display(),
                dir.path().display()
            );
            ServiceConfig::check(&text, Path::new("c.toml"))
                .unwrap()
                .warnings
        };
        // No selection, or one that keeps them: nothing to say.
        assert_eq!(check(""), Vec::<String>::new());
        assert_eq!(
            check("regex = \"^/(camera|points|imu)\"\n"),
            Vec::<String>::new()
        );
        assert_eq!(
            check("exclude_regex = \"^/camera/\"\n"),
            [
                "snapshot_topics names /camera/front/image_raw, which the topic selection does \
                 not record (excluded): it never reaches the ring",
                "topic_rate names /camera/rear/image_raw, which the topic selection does not \
                 record (excluded): it never reaches the bag",
            ]
        );
        assert_eq!(
            check("topics = [\"/imu\", \"/camera/front/image_raw\"]\n"),
            [
                "snapshot_topics names /points, which the topic selection does not record (not \
                 selected): it never reaches the ring",
                "topic_rate names /camera/rear/image_raw, which the topic selection does not \
                 record (not selected): it never reaches the bag",
            ]
        );
    }

    #[test]
    fn snapshot_keys_resolve_like_the_flags_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bags");
        let text = format!(
            "output_root = \"{}\"\nsource = \"synthetic\"\nsnapshot_size = \"8MiB\"\n\
             snapshot_duration = 30\nsnapshot_file = \"{}/ring\"\n\
             snapshot_regex = \"^/camera/\"\ntopic_rate = [\"/imu=50\"]\n\
             trigger_topic = \"/estop:std_msgs/msg/Bool\"\n",
            root.display(),
            dir.path().display()
        );
        let c = ServiceConfig::check(&text, Path::new("c.toml")).unwrap();
        let ring = c.snapshot.ring.as_ref().expect("ring on");
        assert_eq!(ring.size, 8 << 20);
        assert_eq!(ring.window_ns, 30_000_000_000);
        assert_eq!(
            c.snapshot.control_socket.as_deref(),
            Some(Path::new("/run/ringbag/control.sock"))
        );
        assert!(!c.snapshot.policy.route("/camera/x").continuous);
        assert!(c.snapshot.policy.route("/tf").continuous);
        assert_eq!(c.snapshot.policy.rates, vec![("/imu".to_string(), 50.0)]);
        let bad = text.replace("std_msgs/msg/Bool", "nav_msgs/msg/Odometry");
        let e = ServiceConfig::check(&bad, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("c.toml:8:"), "{e}");
        assert!(e.contains("trigger_topic: "), "{e}");
        assert!(e.contains("unknown trigger topic type"), "{e}");
        let e = ServiceConfig::check(
            &format!(
                "output_root = \"{}\"\nsnapshot_topics = [\"/a\"]\n",
                root.display()
            ),
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("snapshot_topics: needs snapshot_size"), "{e}");
        // Without a ring the service still serves its control socket: pause and resume.
        let c = ServiceConfig::check(
            &format!(
                "output_root = \"{}\"\nsource = \"synthetic\"\n",
                root.display()
            ),
            Path::new("c.toml"),
        )
        .unwrap();
        assert!(c.snapshot.ring.is_none());
        assert_eq!(
            c.snapshot.control_socket.as_deref(),
            Some(Path::new(crate::snapshot::control::DEFAULT_CONTROL_SOCKET))
        );
    }

    /// A config with `[upload]` (its keys `upload`), checked with `vars` as the environment.
    fn check_upload(upload: &str, vars: &[(&str, &str)]) -> Result<Checked, ConfigError> {
        let text = format!(
            "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n[upload]\n{upload}"
        );
        let env = Environment::from_vars(vars, Path::new("/nonexistent/machine-id"));
        ServiceConfig::check_with(&text, Path::new("c.toml"), &env)
    }

    const KEYS_ENV: [(&str, &str); 2] = [
        ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
        ("AWS_SECRET_ACCESS_KEY", "sEcReTvAlUe"),
    ];
    const GOOD: &str = "endpoint = \"https://s3.example.com\"\nbucket = \"fleet\"\n\
                        robot_id = \"orin-07\"\n";

    #[test]
    fn the_upload_table_turns_uploads_on_and_resolves_into_the_shared_types() {
        let c = check_upload(GOOD, &KEYS_ENV).unwrap();
        let plan = c.upload.as_ref().expect("uploads on");
        let r = plan.resolved.as_ref().unwrap();
        assert_eq!(r.target.endpoint, "https://s3.example.com");
        assert_eq!(r.target.bucket, "fleet");
        assert_eq!(r.target.credentials.access_key_id, "AKIDTEST");
        assert_eq!(r.tuning, crate::upload::Tuning::default());
        assert_eq!(
            c.upload_summary().as_deref(),
            Some(
                "to https://s3.example.com/fleet as orin-07, credentials from the environment \
                 (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            )
        );
        assert!(c.upload_problem().is_none());
        // No table, or `enabled = false`: off (the keys are still checked).
        let none = ServiceConfig::check_with(
            "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n",
            Path::new("c.toml"),
            &Environment::from_vars(&[], Path::new("/nonexistent")),
        )
        .unwrap();
        assert!(none.upload.is_none() && none.upload_summary().is_none());
        let off = check_upload(&format!("enabled = false\n{GOOD}"), &[]).unwrap();
        assert!(off.upload.is_none() && off.upload_problem().is_none());
        let e = check_upload("enabled = false\nendpoint = \"ftp://x\"\n", &[])
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.toml:5:12: upload.endpoint: must start"),
            "{e}"
        );
        // An inline table is the same table.
        let text = "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n\
                    upload = { endpoint = \"http://127.0.0.1:3900\", bucket = \"b-1\", \
                    robot_id = \"r\", region = \"garage\", path_style = true, part_size = \
                    \"5MiB\", max_rate = \"1MiB\", concurrency = 4, delete_after_upload = true }\n";
        let env = Environment::from_vars(&KEYS_ENV, Path::new("/nonexistent"));
        let c = ServiceConfig::check_with(text, Path::new("c.toml"), &env).unwrap();
        let r = c.upload.unwrap().resolved.unwrap();
        assert_eq!(r.target.endpoint, "http://127.0.0.1:3900");
        assert_eq!(
            (r.target.region.as_str(), r.target.path_style),
            ("garage", true)
        );
        assert_eq!(
            r.tuning,
            crate::upload::Tuning {
                part_size: 5 << 20,
                concurrency: 4,
                max_rate: Some(1 << 20),
                delete_after_upload: true
            }
        );
    }

    #[test]
    fn every_upload_mistake_is_one_line_with_file_line_column_and_upload_key() {
        let cases: Vec<(String, String)> = vec![
            (
                "bucket = \"fleet\"\n".into(),
                "c.toml:3:2: upload.endpoint: is required: https://host[:port] of the S3 service"
                    .into(),
            ),
            (
                "endpoint = \"http://s3.example.com\"\nbucket = \"fleet\"\n".into(),
                "c.toml:4:12: upload.endpoint: plain http:// to s3.example.com, which is not \
                 loopback: data and signatures would cross the network unencrypted; use \
                 https://, or set allow_http = true"
                    .into(),
            ),
            (
                format!("{GOOD}bucket2 = 1\n"),
                "c.toml:7:1: upload.bucket2: unknown key".into(),
            ),
            (
                format!("{GOOD}secret_key = \"sEcReTvAlUe\"\n"),
                format!(
                    "c.toml:7:1: upload.secret_key: {}",
                    crate::upload::settings::WHERE_CREDENTIALS_GO
                ),
            ),
            (
                format!("{GOOD}aws_secret_access_key = \"sEcReTvAlUe\"\n"),
                format!(
                    "c.toml:7:1: upload.aws_secret_access_key: {}",
                    crate::upload::settings::WHERE_CREDENTIALS_GO
                ),
            ),
            (
                format!("{GOOD}access_key = 12\n"),
                format!(
                    "c.toml:7:1: upload.access_key: {}",
                    crate::upload::settings::WHERE_CREDENTIALS_GO
                ),
            ),
            (
                format!("{GOOD}insecure = true\n"),
                "c.toml:7:1: upload.insecure: TLS is always verified; for a private certificate \
                 authority set ca_file"
                    .into(),
            ),
            (
                format!("{GOOD}concurrency = \"two\"\n"),
                "c.toml:7:15: upload.concurrency: invalid type: string \"two\", expected u64"
                    .into(),
            ),
            (
                format!("{GOOD}concurrency = 0\n"),
                "c.toml:7:15: upload.concurrency: 0 is outside 1..=16 (parts in flight)".into(),
            ),
            (
                format!("{GOOD}part_size = \"1MiB\"\n"),
                "c.toml:7:13: upload.part_size: 1048576 bytes is outside 5 MiB..=5 GiB (S3's \
                 part sizes; AWS refuses smaller parts with EntityTooSmall)"
                    .into(),
            ),
            (
                format!("{GOOD}max_rate = 0\n"),
                "c.toml:7:12: upload.max_rate: 0 bytes/s would never send anything; leave \
                 max_rate out for no limit"
                    .into(),
            ),
            (
                "endpoint = \"https://s3.example.com\"\nbucket = \"Fleet\"\nrobot_id = \"r\"\n"
                    .into(),
                "c.toml:5:10: upload.bucket: `Fleet`: a bucket name has 3 to 63 lowercase \
                 letters, digits, '.' and '-', starting and ending with a letter or digit"
                    .into(),
            ),
            (
                "endpoint = \"https://s3.example.com\"\nbucket = \"fleet\"\n".into(),
                "c.toml:3:2: upload.robot_id: not set, and /nonexistent/machine-id is missing, \
                 empty or uninitialized: set robot_id"
                    .into(),
            ),
            (
                format!("{GOOD}key = \"{{bag}}/{{file}}/{{host}}\"\n"),
                "c.toml:7:7: upload.key: unknown placeholder {host}; use {robot}, {bag} and \
                 {file}"
                    .into(),
            ),
            (
                format!("{GOOD}credentials_file = \"s3.credentials\"\n"),
                "c.toml:7:20: upload.credentials_file: s3.credentials: must be an absolute path"
                    .into(),
            ),
            (
                format!("{GOOD}ca_file = \"/nonexistent/ca.pem\"\n"),
                "c.toml:7:11: upload.ca_file: /nonexistent/ca.pem: cannot read it: No such file \
                 or directory (os error 2)"
                    .into(),
            ),
        ];
        let mut wrong = Vec::new();
        for (upload, want) in &cases {
            match check_upload(upload, &KEYS_ENV) {
                Ok(_) => wrong.push(format!("{upload}: accepted")),
                Err(e) => {
                    let e = e.to_string();
                    assert!(!e.contains("sEcReTvAlUe"), "{e}");
                    assert_eq!(e.lines().count(), 1, "{e}");
                    if &e != want {
                        wrong.push(format!("{upload}\n  got:  {e}\n  want: {want}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn dotted_keys_are_the_same_table_and_a_secret_there_is_refused_too() {
        let text = "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n\
                    upload.endpoint = \"https://s3.example.com\"\nupload.bucket = \"fleet\"\n\
                    upload.robot_id = \"r\"\nupload.secret_key = \"sEcReTvAlUe\"\n";
        let env = Environment::from_vars(&KEYS_ENV, Path::new("/nonexistent"));
        let e = ServiceConfig::check_with(text, Path::new("c.toml"), &env)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "c.toml:6:8: upload.secret_key: {}",
                crate::upload::settings::WHERE_CREDENTIALS_GO
            )
        );
        let ok = text.replace("upload.secret_key = \"sEcReTvAlUe\"\n", "");
        let c = ServiceConfig::check_with(&ok, Path::new("c.toml"), &env).unwrap();
        assert_eq!(c.upload.unwrap().settings.bucket, "fleet");
    }

    #[test]
    fn a_dotted_bucket_with_virtual_host_style_over_https_is_warned_about() {
        let dotted = GOOD.replace("\"fleet\"", "\"fleet.bags\"");
        let c = check_upload(&dotted, &KEYS_ENV).unwrap();
        assert_eq!(
            c.warnings,
            [
                "upload.bucket: `fleet.bags` holds a '.': with virtual-host style addressing its \
              host name does not match a wildcard certificate; set path_style = true if TLS \
              fails"
            ]
        );
        let c = check_upload(&format!("{dotted}path_style = true\n"), &KEYS_ENV).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn more_than_a_gibibyte_of_parts_in_flight_is_warned_about() {
        let c = check_upload(&format!("{GOOD}part_size = \"512MiB\"\n"), &KEYS_ENV).unwrap();
        assert!(c.warnings.is_empty(), "exactly 1 GiB: {:?}", c.warnings);
        let c = check_upload(
            &format!("{GOOD}part_size = \"1GiB\"\nconcurrency = 4\n"),
            &KEYS_ENV,
        )
        .unwrap();
        assert_eq!(
            c.warnings,
            ["upload: part_size × concurrency = 4096 MiB held in memory while uploading"]
        );
    }

    #[test]
    fn a_part_size_too_small_for_a_split_is_refused() {
        let text = format!(
            "source = \"synthetic\"\noutput_root = \"/tmp/ringbag-cfg-test\"\n\
             max_bag_size = \"60GiB\"\n[upload]\n{GOOD}part_size = \"5MiB\"\n"
        );
        let env = Environment::from_vars(&KEYS_ENV, Path::new("/nonexistent"));
        let e = ServiceConfig::check_with(&text, Path::new("c.toml"), &env)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "c.toml:8:13: upload.part_size: 5242880 bytes × 10000 parts (S3's most) = \
             52428800000 bytes is below max_bag_size (64424509440 bytes): a full split could \
             not be uploaded"
        );
        // The default 16 MiB parts cover it.
        let ok = text.replace("part_size = \"5MiB\"\n", "");
        assert!(ServiceConfig::check_with(&ok, Path::new("c.toml"), &env).is_ok());
    }

    #[test]
    fn missing_credentials_leave_the_config_valid_for_recording_but_are_a_located_problem() {
        let dir = tempfile::tempdir().unwrap();
        // None anywhere: the table's header is the place.
        let c = check_upload(GOOD, &[]).unwrap();
        assert!(c.upload_summary().is_none());
        assert_eq!(
            c.upload_problem().unwrap().to_string(),
            "c.toml:3:2: upload: no credentials: CREDENTIALS_DIRECTORY is not set, no \
             upload.credentials_file, and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set"
        );
        // A credentials file readable by others: the key's value is the place.
        let file = dir.path().join("s3.credentials");
        std::fs::write(
            &file,
            "aws_access_key_id = AKIDFILE\naws_secret_access_key = sEcReTvAlUe\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let upload = format!("{GOOD}credentials_file = \"{}\"\n", file.display());
        let c = check_upload(&upload, &KEYS_ENV).unwrap();
        let e = c.upload_problem().unwrap().to_string();
        assert_eq!(
            e,
            format!(
                "c.toml:7:20: upload.credentials_file: credentials from credentials_file {}: \
                 mode 0644 lets group or others read it; chmod 600 it (0600 or stricter)",
                file.display()
            )
        );
        // Fixed, the next check (a SIGHUP's) finds them.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = check_upload(&upload, &KEYS_ENV).unwrap();
        assert!(c.upload_problem().is_none());
        let r = c.upload.unwrap().resolved.unwrap();
        assert_eq!(r.target.credentials.access_key_id, "AKIDFILE");
        // And nothing shown anywhere holds the secret.
        assert!(!format!("{r:?}").contains("sEcReTvAlUe"));
    }
}
