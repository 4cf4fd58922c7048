//! The status file (`/run/ringbag/status.json`), rewritten atomically every second, and
//! `ringbag status`, which reads it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::pipeline::{Progress, TopicStats};
use crate::record::{Finished, RecordSettings, Running};

/// The status file is stale (the service is not recording) when older than this.
pub const STALE_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TopicStatus {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub qos: String,
    /// Messages accepted per second over the last interval.
    pub rate_hz: f64,
    /// Payload bytes accepted so far (this bag).
    pub bytes: u64,
    pub accepted: u64,
    pub written: u64,
    /// Payload bytes committed to the bag (absent in files of older versions).
    #[serde(default)]
    pub written_bytes: u64,
    pub dropped_queue_full: u64,
    pub dropped_oversize: u64,
    pub dropped_after_stop: u64,
    pub unwritten: u64,
    /// Reported lost by the middleware before reaching ringbag (live ROS 2 only).
    #[serde(default)]
    pub lost_in_middleware: u64,
    /// Accepted and left out of continuous recording by `--topic-rate` (absent in files of
    /// older versions).
    #[serde(default)]
    pub throttled: u64,
    /// Accepted and kept in the snapshot ring only (`--snapshot-topics`; absent in files of
    /// older versions).
    #[serde(default)]
    pub ring_only: u64,
    /// Accepted and left out of the bag while recording was paused (absent in files of
    /// older versions).
    #[serde(default)]
    pub paused: u64,
}

impl TopicStatus {
    /// Refused or discarded by ringbag, whatever the cause (as `TopicSummary::dropped`).
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_oversize + self.dropped_after_stop
    }
}

/// A histogram of durations, as the writer keeps it ([`crate::pipeline::DurationHistogram`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HistogramStatus {
    /// Upper bounds of the finite buckets, seconds.
    pub bounds_s: Vec<f64>,
    /// Per bucket, not cumulative: one per bound, then one above the last (`+Inf`).
    pub buckets: Vec<u64>,
    /// Sum of the durations, seconds.
    pub sum_s: f64,
    /// How many: the sum of `buckets`.
    pub count: u64,
}

/// The writer thread's health (absent in files of older versions: zeros).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WriterStatus {
    /// Time away from the queue per writer turn that wrote a batch or rotated.
    pub batch_duration: HistogramStatus,
    /// The longest of those, seconds.
    pub longest_stall_s: f64,
    /// Bytes queued now, and the most seen queued at once.
    pub queue_bytes: u64,
    pub peak_queue_bytes: u64,
    /// Longest single background fsync/fdatasync, seconds.
    pub fsync_longest_s: f64,
    /// Background syncs completed.
    pub fsyncs: u64,
}

/// The snapshot thread's counts (this process); null without a ring.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotCountsStatus {
    /// Triggers received per source (`socket`, `signal`, `topic`, `service`; all listed).
    pub triggers: std::collections::BTreeMap<String, u64>,
    /// Snapshot bags finished and kept.
    pub written: u64,
    /// Snapshots that could not be started or were removed unfinished.
    pub failed: u64,
}

impl SnapshotCountsStatus {
    pub fn of(ring: &crate::snapshot::ring::Ring) -> Self {
        let c = ring.counters();
        SnapshotCountsStatus {
            triggers: crate::snapshot::trigger::Origin::ALL
                .iter()
                .map(|o| (o.name().to_string(), c.triggers[o.index()].load(Relaxed)))
                .collect(),
            written: c.written.load(Relaxed),
            failed: c.failed.load(Relaxed),
        }
    }
}

/// Use of the budget against each limit (`null` = limit off).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BudgetStatus {
    pub bytes: u64,
    pub max_record_size: Option<u64>,
    pub files: u64,
    pub max_bag_files: Option<u32>,
    pub span_s: f64,
    pub max_record_duration_s: Option<f64>,
    pub free_bytes: Option<u64>,
    pub partition_bytes: Option<u64>,
    pub min_free_space: Option<u64>,
    pub min_free_space_percent: Option<f64>,
}

/// Closed files retention deleted before they were uploaded: the budget forced it and no
/// uploaded file was left to delete.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeletedBeforeUploadStatus {
    pub files: u64,
    pub bytes: u64,
    /// The same per bag still under the root (a bag deleted whole leaves this list; the
    /// totals keep it).
    #[serde(default)]
    pub bags: Vec<BagDeletedBeforeUpload>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BagDeletedBeforeUpload {
    pub bag: PathBuf,
    pub files: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClockStatus {
    /// "ptp" or "system": what stamps.
    pub source: String,
    pub requested: String,
    pub fallback_reason: Option<String>,
    /// PHC time − UTC applied (time scale), seconds; null for the system clock.
    pub phc_minus_utc_s: Option<i64>,
    /// Stamping clock − the system's wall clock (CLOCK_REALTIME) now, ns: how far the
    /// bag's timestamps are from the host's idea of UTC.
    pub offset_ns: i64,
    pub uncertainty_ns: Option<f64>,
    pub drift_ppb: Option<f64>,
    pub steps: u64,
}

/// The black box's memory ring (`null` without `snapshot_size`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RingStatus {
    pub path: PathBuf,
    /// The ring file's whole size (`snapshot_size`), bytes.
    pub size_bytes: u64,
    /// Its data area, bytes: what messages can fill.
    pub capacity_bytes: u64,
    /// Bytes of the data area holding messages now.
    pub used_bytes: u64,
    /// `used_bytes / capacity_bytes`, 0 to 1.
    pub fill: f64,
    /// `snapshot_duration` in seconds; null = bounded by size only.
    pub window_s: Option<f64>,
    /// Messages appended since the ring was created.
    pub appended: u64,
    /// Stamp of the oldest message held (ns since the epoch, the recording's clock); null
    /// when the ring is empty.
    pub oldest_ns: Option<i64>,
    /// How long ago that was, seconds: how far back a trigger now can reach.
    pub oldest_age_s: Option<f64>,
    /// The snapshot being written (its reason and window), kept in the ring so that a
    /// restart finishes it; null when none is open.
    pub pending_trigger: Option<PendingStatus>,
}

/// An open snapshot: why, and the window it covers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PendingStatus {
    pub reason: String,
    pub trigger_ns: i64,
    /// null: from the oldest message in the ring.
    pub start_ns: Option<i64>,
    pub end_ns: i64,
}

impl RingStatus {
    /// Read the ring's published state (safe while the writer appends; no locks).
    pub fn of(ring: &crate::snapshot::ring::Ring, now_ns: i64) -> RingStatus {
        let window_ns = ring.window_ns();
        let capacity = ring.capacity();
        let used = ring.used_bytes();
        let oldest_ns = ring.oldest_ts();
        RingStatus {
            path: ring.path().to_path_buf(),
            size_bytes: crate::snapshot::ring::Ring::file_size(capacity),
            capacity_bytes: capacity,
            used_bytes: used,
            fill: if capacity > 0 {
                used as f64 / capacity as f64
            } else {
                0.0
            },
            window_s: (window_ns > 0).then(|| window_ns as f64 / 1e9),
            appended: ring.seq(),
            oldest_ns,
            oldest_age_s: oldest_ns.map(|t| now_ns.saturating_sub(t).max(0) as f64 / 1e9),
            pending_trigger: ring.pending_trigger().map(|p| PendingStatus {
                reason: p.reason,
                trigger_ns: p.trigger_ns,
                start_ns: (p.start_ns != i64::MIN).then_some(p.start_ns),
                end_ns: p.end_ns,
            }),
        }
    }

    /// `ring 3.1 of 60.0 MiB (5 %), oldest 12 s ago; snapshot "estop" open`: for STATUS=.
    fn line(&self) -> String {
        let mut s = format!(
            "ring {} of {} ({:.0} %)",
            mib(self.used_bytes),
            mib(self.capacity_bytes),
            self.fill * 100.0
        );
        if let Some(age) = self.oldest_age_s {
            s.push_str(&format!(", oldest {age:.0} s ago"));
        }
        if let Some(p) = &self.pending_trigger {
            s.push_str(&format!("; snapshot \"{}\" open", p.reason));
        }
        s
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub pid: u32,
    /// Wall-clock time of this write, ms since the Unix epoch.
    pub updated_unix_ms: u64,
    pub uptime_s: f64,
    pub config: PathBuf,
    pub bag: PathBuf,
    pub split: Option<PathBuf>,
    pub splits_created: u64,
    pub messages_per_s: f64,
    pub mb_per_s: f64,
    pub committed: u64,
    pub dropped: u64,
    /// Sum of the topics' `lost_in_middleware`.
    #[serde(default)]
    pub lost_in_middleware: u64,
    pub budget: BudgetStatus,
    pub clock: ClockStatus,
    pub topics: Vec<TopicStatus>,
    pub last_error: Option<String>,
    /// The snapshot ring; absent in files of older versions, null without a ring.
    #[serde(default)]
    pub ring: Option<RingStatus>,
    /// Why the recording stopped on its own with an error (the bag deleted under it, a full
    /// disk), once it has: the rates above are then the last ones, not a live recording's.
    #[serde(default)]
    pub stopped: Option<String>,
    /// SIGHUP reloads since the service started.
    #[serde(default)]
    pub reloads: u64,
    /// Time not recorded across those reloads (old bag stopped accepting to the new bag
    /// recording), ms.
    #[serde(default)]
    pub reload_gap_ms: u64,
    /// Files deleted before they were uploaded; null when retention has no upload ledger
    /// (no offload), absent in files of older versions (read as null).
    #[serde(default)]
    pub deleted_before_upload: Option<DeletedBeforeUploadStatus>,
    /// Fleet offload (`[upload]`); null when it is off, absent in files of older versions.
    #[serde(default)]
    pub upload: Option<crate::upload::agent::UploadStatus>,
    /// Split files retention deleted from this bag (absent in files of older versions).
    #[serde(default)]
    pub splits_deleted: u64,
    /// The writer thread: batch durations, stalls, the queue, background fsyncs.
    #[serde(default)]
    pub writer: WriterStatus,
    /// Triggers and snapshots counted by the snapshot thread; null without a ring.
    #[serde(default)]
    pub snapshots: Option<SnapshotCountsStatus>,
    /// Recording is paused (`ringbag pause`); the ring, if any, still records. Absent in
    /// files of older versions (false).
    #[serde(default)]
    pub paused: bool,
    /// Messages of this bag left out while paused: the sum of the topics' `paused`.
    #[serde(default)]
    pub paused_messages: u64,
}

impl Status {
    /// One line for systemd's STATUS= (`systemctl status` shows it).
    pub fn line(&self) -> String {
        let b = &self.budget;
        let mut parts = Vec::new();
        if let Some(why) = &self.stopped {
            parts.push(format!("STOPPED: {why}"));
        }
        if self.paused {
            parts.push(format!(
                "PAUSED ({} messages not recorded)",
                self.paused_messages
            ));
        }
        parts.push(format!(
            "{:.0} msg/s, {:.2} MB/s, {} dropped",
            self.messages_per_s, self.mb_per_s, self.dropped
        ));
        if !self.paused && self.paused_messages > 0 {
            parts.push(format!("{} left out while paused", self.paused_messages));
        }
        if self.lost_in_middleware > 0 {
            parts.push(format!("{} lost in middleware", self.lost_in_middleware));
        }
        let mut budget = vec![match b.max_record_size {
            Some(m) => format!("{} of {}", mib(b.bytes), mib(m)),
            None => mib(b.bytes),
        }];
        if let Some(m) = b.max_bag_files {
            budget.push(format!("{} of {m} files", b.files));
        }
        if let Some(m) = b.max_record_duration_s {
            budget.push(format!("{:.0} of {m:.0} s", b.span_s));
        }
        if let (Some(free), true) = (
            b.free_bytes,
            b.min_free_space.is_some() || b.min_free_space_percent.is_some(),
        ) {
            budget.push(format!("{} free", mib(free)));
        }
        parts.push(format!("budget {}", budget.join(", ")));
        let clock = match self.clock.uncertainty_ns {
            Some(u) => format!("clock {} ±{:.0} ns", self.clock.source, u),
            None => format!("clock {}", self.clock.source),
        };
        parts.push(clock);
        if self.reloads > 0 {
            parts.push(format!(
                "{} reloads, {} ms unrecorded",
                self.reloads, self.reload_gap_ms
            ));
        }
        if let Some(d) = self.deleted_before_upload.as_ref().filter(|d| d.files > 0) {
            parts.push(format!(
                "{} files ({}) deleted before upload",
                d.files,
                mib(d.bytes)
            ));
        }
        if let Some(u) = &self.upload {
            parts.push(u.line());
        }
        if let Some(r) = &self.ring {
            parts.push(r.line());
        }
        parts.join("; ")
    }

    /// For a person (`ringbag status`).
    pub fn human(&self, age: Duration) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.line());
        let _ = writeln!(
            s,
            "pid {}, up {:.0} s, status written {:.1} s ago",
            self.pid,
            self.uptime_s,
            age.as_secs_f64()
        );
        let _ = writeln!(s, "bag:   {}", self.bag.display());
        let _ = writeln!(
            s,
            "recording: {}, {} messages left out while paused",
            if self.paused { "paused" } else { "running" },
            self.paused_messages
        );
        if let Some(split) = &self.split {
            let _ = writeln!(
                s,
                "split: {} ({} created)",
                split.display(),
                self.splits_created
            );
        }
        let b = &self.budget;
        // "7.1 MiB of 8.0 MiB", or "7.1 MiB (no limit)" when that limit is off.
        let of = |used: String, limit: Option<String>| match limit {
            Some(l) => format!("{used} of {l}"),
            None => format!("{used} (no limit)"),
        };
        let _ = writeln!(
            s,
            "budget: {}; {}; {}",
            of(mib(b.bytes), b.max_record_size.map(mib)),
            of(
                format!("{} files", b.files),
                b.max_bag_files.map(|n| n.to_string())
            ),
            of(
                format!("{:.0} s", b.span_s),
                b.max_record_duration_s.map(|d| format!("{d:.0} s"))
            )
        );
        if let Some(free) = b.free_bytes {
            let _ = writeln!(
                s,
                "free space: {} (floor {}{})",
                mib(free),
                b.min_free_space.map_or_else(|| "off".to_string(), mib),
                b.min_free_space_percent
                    .map(|p| format!(", {p}%"))
                    .unwrap_or_default()
            );
        }
        if let Some(u) = &self.upload {
            let _ = writeln!(s, "{}", u.human());
        }
        if let Some(d) = &self.deleted_before_upload {
            let _ = write!(
                s,
                "deleted before upload: {} files, {}",
                d.files,
                mib(d.bytes)
            );
            for b in &d.bags {
                let name = b.bag.file_name().unwrap_or(b.bag.as_os_str());
                let _ = write!(
                    s,
                    "; {}: {} files, {}",
                    name.to_string_lossy(),
                    b.files,
                    mib(b.bytes)
                );
            }
            s.push('\n');
        }
        let c = &self.clock;
        let _ = writeln!(
            s,
            "clock: {} (requested {}), offset from system {} ns, uncertainty {}, steps {}{}",
            c.source,
            c.requested,
            c.offset_ns,
            c.uncertainty_ns
                .map(|u| format!("{u:.0} ns"))
                .unwrap_or_else(|| "n/a".into()),
            c.steps,
            c.fallback_reason
                .as_deref()
                .map(|r| format!("; fallback: {r}"))
                .unwrap_or_default()
        );
        if let Some(r) = &self.ring {
            let _ = writeln!(
                s,
                "ring:  {}: {} of {} ({:.1} %), file {}, window {}, {} messages appended, oldest {}",
                r.path.display(),
                mib(r.used_bytes),
                mib(r.capacity_bytes),
                r.fill * 100.0,
                mib(r.size_bytes),
                r.window_s
                    .map_or_else(|| "by size only".to_string(), |w| format!("{w:.0} s")),
                r.appended,
                match (r.oldest_ns, r.oldest_age_s) {
                    (Some(t), Some(age)) => format!("{} ({age:.1} s ago)", utc(t)),
                    _ => "none (empty)".to_string(),
                }
            );
            if let Some(p) = &r.pending_trigger {
                let _ = writeln!(
                    s,
                    "snapshot open: \"{}\", triggered {}, window {} to {}",
                    p.reason,
                    utc(p.trigger_ns),
                    p.start_ns
                        .map_or_else(|| "the oldest message".to_string(), utc),
                    utc(p.end_ns)
                );
            }
        }
        for t in &self.topics {
            let _ = writeln!(
                s,
                "  {:<32} {:>8.1} Hz {:>12} B  written {:>9}  dropped {} (queue {}, oversize {}, after stop {})  lost in middleware {}  {}",
                t.name,
                t.rate_hz,
                t.bytes,
                t.written,
                t.dropped(),
                t.dropped_queue_full,
                t.dropped_oversize,
                t.dropped_after_stop,
                t.lost_in_middleware,
                t.qos
            );
        }
        if let Some(e) = &self.last_error {
            let _ = writeln!(s, "last error: {e}");
        }
        s
    }
}

fn utc(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The counts of the previous snapshot: when, messages and bytes accepted, per topic.
type Previous = (Instant, u64, u64, Vec<(String, u64)>);

/// Builds successive [`Status`] snapshots; remembers the previous counts for rates.
pub struct Collector {
    pub config: PathBuf,
    pub started: Instant,
    prev: Option<Previous>,
    reloads: u64,
    reload_gap_ms: u64,
}

impl Collector {
    pub fn new(config: PathBuf, started: Instant) -> Self {
        Collector {
            config,
            started,
            prev: None,
            reloads: 0,
            reload_gap_ms: 0,
        }
    }

    /// A reload left `gap` unrecorded: counted in every status from now on.
    pub fn note_reload(&mut self, gap: Duration) {
        self.reloads += 1;
        self.reload_gap_ms = self
            .reload_gap_ms
            .saturating_add(u64::try_from(gap.as_millis()).unwrap_or(u64::MAX));
    }

    /// Forget rates (a new bag starts its counters at zero).
    pub fn reset_rates(&mut self) {
        self.prev = None;
    }

    /// While recording.
    pub fn collect(&mut self, run: &Running<'_>, last_error: Option<String>) -> Status {
        let progress = run.pipeline.progress();
        let topics = run.pipeline.topic_stats();
        self.collect_counts(
            &progress,
            &topics,
            run.clock,
            run.settings,
            run.ring.as_deref(),
            last_error,
        )
    }

    /// After the pipeline finished: the final counts, as the exit summary has them.
    pub fn collect_finished(&mut self, done: &Finished<'_>, last_error: Option<String>) -> Status {
        self.collect_counts(
            done.progress,
            done.topics,
            done.clock,
            done.settings,
            done.ring.as_deref(),
            last_error,
        )
    }

    fn collect_counts(
        &mut self,
        progress: &Progress,
        topics: &[std::sync::Arc<TopicStats>],
        clock: &crate::clock::ClockHandle,
        settings: &RecordSettings,
        ring: Option<&crate::snapshot::ring::Ring>,
        last_error: Option<String>,
    ) -> Status {
        let now = Instant::now();
        let accepted: u64 = topics.iter().map(|t| t.accepted()).sum();
        let bytes: u64 = topics.iter().map(|t| t.bytes()).sum();
        let (dt, prev_acc, prev_bytes, prev_topics) = match &self.prev {
            Some((t, a, b, per)) => (now.duration_since(*t).as_secs_f64(), *a, *b, per.clone()),
            None => (0.0, accepted, bytes, Vec::new()),
        };
        let rate = |now: u64, before: u64| {
            if dt > 0.0 {
                now.saturating_sub(before) as f64 / dt
            } else {
                0.0
            }
        };
        let topic_status: Vec<TopicStatus> = topics
            .iter()
            .map(|t| {
                let before = prev_topics
                    .iter()
                    .find(|(n, _)| *n == t.name)
                    .map_or(t.accepted(), |(_, a)| *a);
                TopicStatus {
                    name: t.name.clone(),
                    type_name: t.type_name.clone(),
                    qos: t.qos.clone(),
                    rate_hz: rate(t.accepted(), before),
                    bytes: t.bytes(),
                    accepted: t.accepted(),
                    written: t.written(),
                    written_bytes: t.written_bytes(),
                    dropped_queue_full: t.dropped(),
                    dropped_oversize: t.oversize(),
                    dropped_after_stop: t.dropped_after_stop(),
                    unwritten: t.unwritten(),
                    lost_in_middleware: t.lost_in_middleware(),
                    throttled: t.throttled(),
                    ring_only: t.ring_only(),
                    paused: t.paused(),
                }
            })
            .collect();
        self.prev = Some((
            now,
            accepted,
            bytes,
            topics
                .iter()
                .map(|t| (t.name.clone(), t.accepted()))
                .collect(),
        ));
        let s = settings;
        let policy = &s.retention;
        let oldest = progress.budget_oldest_ns.load(Relaxed);
        let now_ns = crate::clock::TimeSource::now_ns(clock);
        let wall_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let span_s = if oldest >= 0 && now_ns > oldest {
            (now_ns - oldest) as f64 / 1e9
        } else {
            0.0
        };
        let root = s.output.parent().unwrap_or(Path::new("/"));
        let fs = nix::sys::statvfs::statvfs(root).ok();
        #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
        let (free, total) = match fs {
            Some(st) => (
                Some(st.blocks_available() as u64 * st.fragment_size() as u64),
                Some(st.blocks() as u64 * st.fragment_size() as u64),
            ),
            None => (None, None),
        };
        let tracker = clock.status();
        let clock_settings = &s.clock;
        let source = clock.source_name().to_string();
        let dropped = topic_status.iter().map(TopicStatus::dropped).sum();
        let lost_in_middleware = topic_status.iter().map(|t| t.lost_in_middleware).sum();
        let paused_messages = topic_status.iter().map(|t| t.paused).sum();
        let bag = s.output.clone();
        let split_index = progress.splits.load(Relaxed);
        let split = (split_index > 0).then(|| {
            let name = bag
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            bag.join(format!("{name}_{}.db3", split_index - 1))
        });
        Status {
            pid: std::process::id(),
            updated_unix_ms: unix_ms_now(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            config: self.config.clone(),
            bag,
            split,
            splits_created: split_index,
            messages_per_s: rate(accepted, prev_acc),
            mb_per_s: rate(bytes, prev_bytes) / 1e6,
            committed: progress.committed.load(Relaxed),
            dropped,
            lost_in_middleware,
            budget: BudgetStatus {
                bytes: progress.budget_bytes.load(Relaxed),
                max_record_size: policy.max_record_size,
                files: progress.budget_files.load(Relaxed),
                max_bag_files: policy.max_bag_files,
                span_s,
                max_record_duration_s: policy.max_record_duration_ns.map(|d| d as f64 / 1e9),
                free_bytes: free,
                partition_bytes: total,
                min_free_space: policy.min_free_space,
                min_free_space_percent: policy.min_free_space_percent,
            },
            clock: ClockStatus {
                phc_minus_utc_s: (source == "ptp")
                    .then(|| clock_settings.phc_minus_utc_ns() / 1_000_000_000),
                offset_ns: now_ns.saturating_sub(wall_ns),
                source,
                requested: clock_settings.kind.as_str().to_string(),
                fallback_reason: clock.fallback_reason().map(str::to_string),
                uncertainty_ns: tracker.as_ref().and_then(|t| t.uncertainty_now_ns),
                drift_ppb: tracker.as_ref().and_then(|t| t.drift_ppb),
                steps: tracker.as_ref().map_or(0, |t| t.steps),
            },
            topics: topic_status,
            last_error,
            ring: ring.map(|r| RingStatus::of(r, now_ns)),
            stopped: progress.failure.get().cloned(),
            reloads: self.reloads,
            reload_gap_ms: self.reload_gap_ms,
            deleted_before_upload: s.upload_retention.ledger.as_ref().map(|_| {
                let bags = progress
                    .deleted_before_upload_per_bag
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(bag, n)| BagDeletedBeforeUpload {
                        bag: bag.clone(),
                        files: n.files,
                        bytes: n.bytes,
                    })
                    .collect();
                DeletedBeforeUploadStatus {
                    files: progress.deleted_before_upload_files.load(Relaxed),
                    bytes: progress.deleted_before_upload_bytes.load(Relaxed),
                    bags,
                }
            }),
            // The service fills it in (the uploader is not the recording's).
            upload: None,
            splits_deleted: progress.splits_deleted.load(Relaxed),
            writer: writer_status(progress),
            snapshots: ring.map(SnapshotCountsStatus::of),
            paused: s.pipeline.pause.is_paused(),
            paused_messages,
        }
    }
}

fn writer_status(p: &Progress) -> WriterStatus {
    let (buckets, _, sum_ns) = p.batch_duration.snapshot();
    WriterStatus {
        batch_duration: HistogramStatus {
            bounds_s: crate::pipeline::BATCH_BUCKETS_S.to_vec(),
            // The buckets' own total, not the separate count: read while the writer adds, the
            // two may differ by a batch, and `+Inf` must equal `_count`.
            count: buckets.iter().sum(),
            buckets,
            sum_s: sum_ns as f64 / 1e9,
        },
        longest_stall_s: p.longest_stall_ns.load(Relaxed) as f64 / 1e9,
        queue_bytes: p.queue_bytes.load(Relaxed),
        peak_queue_bytes: p.peak_queue_bytes.load(Relaxed),
        fsync_longest_s: p.sync.longest_ns.load(Relaxed) as f64 / 1e9,
        fsyncs: p.sync.completed.load(Relaxed),
    }
}

/// Replace `path` atomically with `status` as JSON.
pub fn write(path: &Path, status: &Status) -> Result<(), crate::bag::BagError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| crate::bag::BagError::invalid(path, "needs a file name in UTF-8"))?;
    let mut text = serde_json::to_string_pretty(status)
        .map_err(|e| crate::bag::BagError::invalid(path, e.to_string()))?;
    text.push('\n');
    crate::bag::metadata::write_file_atomic(dir, name, text.as_bytes())
}

/// What `ringbag status` found.
#[derive(Debug)]
pub enum Read {
    /// Fresh: the service is recording.
    Fresh(Box<Status>, Duration),
    /// Older than [`STALE_AFTER`]: not recording.
    Stale(Box<Status>, Duration),
}

/// The largest status file `ringbag status` reads: one the service writes holds ~0.5 KiB per
/// topic, so this is tens of thousands of topics; /dev/zero or a huge file is refused instead.
pub const MAX_STATUS_BYTES: u64 = 16 << 20;

/// Read the status file; Err is one line naming the file (missing, unreadable, not ours).
/// Only a regular file is read, never blocking on a FIFO and never more than
/// [`MAX_STATUS_BYTES`] ([`crate::config::read_small_regular_file`]).
pub fn read(path: &Path) -> Result<Read, String> {
    let text = crate::config::read_small_regular_file(path, MAX_STATUS_BYTES)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let status: Status = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a ringbag status file: {e}", path.display()))?;
    let age = Duration::from_millis(unix_ms_now().saturating_sub(status.updated_unix_ms));
    // The file's mtime too: a clock step must not make a dead service look alive.
    let mtime_age = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default();
    let age = age.max(mtime_age);
    Ok(if age > STALE_AFTER {
        Read::Stale(Box::new(status), age)
    } else {
        Read::Fresh(Box::new(status), age)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_says_the_ring_fill_oldest_age_and_open_snapshot_in_one_line() {
        let mut st = Status::default();
        st.clock.source = "system".into();
        assert!(!st.line().contains("ring"), "no ring, no word of one");
        st.ring = Some(RingStatus {
            path: "/run/ringbag/r.ring".into(),
            size_bytes: 64 << 20,
            capacity_bytes: 63 << 20,
            used_bytes: 21 << 20,
            fill: 1.0 / 3.0,
            window_s: Some(60.0),
            appended: 1000,
            oldest_ns: Some(1),
            oldest_age_s: Some(41.6),
            pending_trigger: Some(PendingStatus {
                reason: "estop".into(),
                trigger_ns: 5,
                start_ns: None,
                end_ns: 10,
            }),
        });
        let line = st.line();
        assert!(!line.contains('\n'));
        assert!(
            line.ends_with(
                "; ring 21.0 MiB of 63.0 MiB (33 %), oldest 42 s ago; snapshot \"estop\" open"
            ),
            "{line}"
        );
        // Status files of earlier versions (no `ring`) still read.
        let mut v = serde_json::to_value(&st).unwrap();
        v.as_object_mut().unwrap().remove("ring");
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back.ring, None);
    }

    #[test]
    fn deleted_before_upload_shows_in_the_line_the_human_report_and_the_json_and_old_files_read() {
        let mut st = Status::default();
        st.clock.source = "system".into();
        // A ledger, nothing lost: no word in STATUS=, a zero in the report.
        st.deleted_before_upload = Some(DeletedBeforeUploadStatus::default());
        assert!(!st.line().contains("before upload"), "{}", st.line());
        assert!(st
            .human(Duration::ZERO)
            .contains("deleted before upload: 0 files, 0.0 MiB"));
        st.deleted_before_upload = Some(DeletedBeforeUploadStatus {
            files: 3,
            bytes: 3 << 20,
            bags: vec![BagDeletedBeforeUpload {
                bag: "/var/lib/ringbag/boot_7".into(),
                files: 3,
                bytes: 3 << 20,
            }],
        });
        let line = st.line();
        assert!(!line.contains('\n'));
        assert!(
            line.contains("; 3 files (3.0 MiB) deleted before upload"),
            "{line}"
        );
        let human = st.human(Duration::ZERO);
        assert!(
            human.contains("deleted before upload: 3 files, 3.0 MiB; boot_7: 3 files, 3.0 MiB\n"),
            "{human}"
        );
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(v["deleted_before_upload"]["files"], 3);
        assert_eq!(v["deleted_before_upload"]["bags"][0]["bytes"], 3 << 20);
        let back: Status = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, st);
        // Status files of earlier versions (no such field) still read, as "no offload".
        let mut old = v;
        old.as_object_mut().unwrap().remove("deleted_before_upload");
        let back: Status = serde_json::from_value(old).unwrap();
        assert_eq!(back.deleted_before_upload, None);
    }

    #[test]
    fn the_paused_state_and_count_show_in_the_line_the_human_report_and_the_json() {
        let mut st = Status::default();
        st.clock.source = "system".into();
        assert!(!st.line().contains("PAUSED") && !st.line().contains("paused"));
        assert!(st
            .human(Duration::ZERO)
            .contains("recording: running, 0 messages left out while paused\n"));
        st.paused = true;
        st.paused_messages = 42;
        assert!(
            st.line()
                .starts_with("PAUSED (42 messages not recorded); 0 msg/s"),
            "{}",
            st.line()
        );
        assert!(st
            .human(Duration::ZERO)
            .contains("recording: paused, 42 messages left out while paused\n"));
        st.paused = false;
        assert!(
            st.line().contains("; 42 left out while paused;"),
            "{}",
            st.line()
        );
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(
            (v["paused"].clone(), v["paused_messages"].clone()),
            (false.into(), 42.into())
        );
        // Status files of earlier versions (no such fields) read as running, none paused.
        let mut old = v;
        old.as_object_mut().unwrap().remove("paused");
        old.as_object_mut().unwrap().remove("paused_messages");
        let back: Status = serde_json::from_value(old).unwrap();
        assert!(!back.paused && back.paused_messages == 0);
    }
}
