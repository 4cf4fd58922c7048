//! The single writer thread: drains the queue in batches, one transaction per batch, and
//! applies the retention budget around every commit.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use crossbeam_utils::CachePadded;

use super::queue::{give_back_batch, Item, Producer, Register, Shared};
use super::room::Room;
use super::stats::{RecordSummary, TopicStats, TopicSummary};
use super::syncer::{BackgroundSync, SyncHealth, WRITEBACK_INTERVAL};
use crate::bag::writer::{row_growth_bytes, BagSummary, BagWriter, Row};
use crate::bag::{BagError, MessageDefinition, TopicInfo};
use crate::clock::TimeSource;
use crate::retention::{OversizeLimit, Retention, RetentionError, Verdict};

/// Where the continuous bag stands on a message, as a [`Tap`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuous {
    Write,
    /// Kept in the snapshot ring only.
    RingOnly,
    /// Left out by `--topic-rate`.
    Throttled,
}

/// What the writer thread does with messages besides the bag: the snapshot ring and the
/// per-topic policies (`snapshot::Tap`). Runs on the writer thread, so it must be quick and
/// never block (a memcpy into the ring is).
pub trait Tap: Send {
    /// A topic was registered (before any of its messages reaches [`Tap::message`]).
    fn topic(&mut self, id: u32, info: &TopicInfo, definition: Option<&MessageDefinition>);
    /// One message, in queue order; says whether the continuous bag writes it too.
    fn message(&mut self, id: u32, ts: i64, data: &[u8]) -> Continuous;
    /// Bags finished under the recording root since the last call (snapshot bags): the
    /// retention budget adopts them, so they count against it while recording goes on.
    fn finished_bags(&mut self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
    /// Where such a bag being written asks for room on the budget ([`Room`]): the writer
    /// thread answers at every turn of its loop. Taken once, when the writer starts.
    fn room(&self) -> Option<Arc<Room>> {
        None
    }
}

/// Free space kept in hand beyond each batch, for metadata.yaml and split headers.
pub const DISK_RESERVE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Byte budget of queued messages (`--max-cache-size`).
    pub max_cache_size: usize,
    /// Queue slots; a second bound for floods of tiny messages.
    pub queue_slots: usize,
    /// A batch ends at this many messages ...
    pub batch_max_messages: usize,
    /// ... or this many bytes ...
    pub batch_max_bytes: usize,
    /// ... or when its oldest message has waited this long.
    pub batch_max_delay: Duration,
    /// Pause and resume (`--start-paused`, keys, the control socket): shared with whoever
    /// flips it; the writer reads it once per batch ([`super::pause`]).
    pub pause: Arc<super::PauseSwitch>,
    /// Where each split close is told (the ROS side's `events/write_split`); None: nobody.
    pub split_events: Option<super::SplitEventSender>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            max_cache_size: 100 * 1024 * 1024,
            queue_slots: 1 << 16,
            batch_max_messages: 4096,
            // A batch is written in one turn of the writer, and the queue waits for that
            // turn. With 8 MiB, the robot mix in real time (176 MB/s, 2.7 MB camera frames
            // tipping batches to 8-11 MiB) had turns of 35-115 ms, up to 363 ms, on tmpfs
            // here; with 2 MiB, and a message that would cross the cap starting the next batch,
            // 24-30 ms on quiet runs. Throughput at max rate did not move (1 MiB, 6 MiB
            // and 64 KiB messages, 5 alternating runs each: medians within 3 %, either way).
            batch_max_bytes: 2 << 20,
            batch_max_delay: Duration::from_millis(50),
            pause: Arc::default(),
            split_events: None,
        }
    }
}

/// A writer turn this long is logged (debug) when it is the longest so far.
const SLOW_TURN_NS: u64 = 20_000_000;

/// Smallest batch byte cap under a retention limit (a single larger message still goes).
const MIN_BATCH_BYTES: u64 = 64 * 1024;

impl PipelineConfig {
    /// Defaults with `max_cache_size`, and batches capped under a retention limit: retention
    /// runs between batches, so a batch must be small next to a split and the budget for
    /// the bound to hold within one batch. Shared by `record` and the service.
    pub fn for_limits(
        max_cache_size: u64,
        max_bag_size: u64,
        retention: &crate::retention::RetentionPolicy,
    ) -> Self {
        let mut pipeline = PipelineConfig {
            max_cache_size: usize::try_from(max_cache_size).unwrap_or(usize::MAX),
            ..PipelineConfig::default()
        };
        if retention.is_circular() || retention.has_free_floor() {
            let mut cap = pipeline.batch_max_bytes as u64;
            if max_bag_size > 0 {
                cap = cap.min(max_bag_size / 4);
            }
            if let Some(size) = retention.max_record_size {
                cap = cap.min(size / 8);
            }
            pipeline.batch_max_bytes =
                usize::try_from(cap.max(MIN_BATCH_BYTES)).unwrap_or(usize::MAX);
        }
        pipeline
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error(transparent)]
    Retention(#[from] RetentionError),
    #[error("{path}: only {available} bytes free, a batch needs {needed}; stopped before the disk filled (free some space, or bound the recording with --max-record-size / --min-free-space)")]
    DiskFull {
        path: std::path::PathBuf,
        available: u64,
        needed: u64,
    },
    #[error("writer thread panicked: {0}")]
    Panicked(String),
    /// The bag's files were deleted (or replaced) under the running recorder: what it
    /// writes would go into unlinked files that vanish at close, so it stops instead.
    #[error("{}: {what} while recording; stopped (what was written since is lost; the service restarts into a new bag)", path.display())]
    BagGone {
        path: std::path::PathBuf,
        what: String,
    },
}

/// Why the writer stopped on its own (the caller may also stop it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Requested,
    /// `--max-splits` reached: a clean, successful end.
    MaxSplits(u32),
}

/// What the writer has made durable against a process crash, for status reporting: counted
/// after each successful commit, so a reader never sees more than is in the file.
#[derive(Debug, Default)]
pub struct Progress {
    /// Messages committed (lower bound: a batch is counted when all of it is committed).
    pub committed: std::sync::atomic::AtomicU64,
    /// Split files created so far, the open one included.
    pub splits: std::sync::atomic::AtomicU64,
    /// Iterations of the writer loop. The loop turns at least every 5 ms even when idle, so
    /// a counter that stops moving means the writer is stuck (in I/O, a lock, a bug): the
    /// service's watchdog pings only while it moves.
    pub loops: std::sync::atomic::AtomicU64,
    /// Set by [`Pipeline::request_rotate`]; the writer closes the open split at its next turn.
    pub rotate_requested: AtomicBool,
    /// With `rotate_requested`: leave the split open if it holds no message yet
    /// ([`Pipeline::request_rotate_unless_empty`]).
    pub rotate_unless_empty: AtomicBool,
    /// What the retention budget holds, published after each batch and rotation (0 / -1
    /// without retention): bytes, split files, start of the oldest kept message (ns).
    pub budget_bytes: std::sync::atomic::AtomicU64,
    pub budget_files: std::sync::atomic::AtomicU64,
    pub budget_oldest_ns: std::sync::atomic::AtomicI64,
    /// Files and bytes retention deleted before the uploader got them out (forced by the
    /// budget), published after each batch; 0 without an upload ledger.
    pub deleted_before_upload_files: std::sync::atomic::AtomicU64,
    pub deleted_before_upload_bytes: std::sync::atomic::AtomicU64,
    /// The same per bag still on the budget; rewritten only when the files count above moves
    /// (rare: only forced deletions), so the writer takes this lock almost never.
    pub deleted_before_upload_per_bag:
        Mutex<Vec<(std::path::PathBuf, crate::retention::DeletedBeforeUpload)>>,
    /// Longest time the writer spent away from the queue in one go (writing a batch with its
    /// retention and rotations), ns: how long producers had to be absorbed by the queue.
    pub longest_stall_ns: std::sync::atomic::AtomicU64,
    /// How much of that longest stall the writer thread spent on a CPU, ns: near all of it
    /// means work (SQLite, the kernel copying into the page cache); little means waiting.
    pub longest_stall_cpu_ns: std::sync::atomic::AtomicU64,
    /// Most bytes seen queued at once (sampled at every turn of the writer loop).
    pub peak_queue_bytes: std::sync::atomic::AtomicU64,
    /// Bytes queued at the last turn of the writer loop.
    pub queue_bytes: std::sync::atomic::AtomicU64,
    /// Each turn's time away from the queue (the span `longest_stall_ns` is the most of), in
    /// fixed buckets.
    pub batch_duration: super::stats::DurationHistogram,
    /// Split files retention deleted (this recording).
    pub splits_deleted: std::sync::atomic::AtomicU64,
    /// The background syncer (closing fsyncs, write-back of the open split).
    pub sync: Arc<SyncHealth>,
    /// Why the writer stopped on its own with an error (set once, as it stops), for the
    /// status reports: the last figures must not read like a healthy recording.
    pub failure: std::sync::OnceLock<String>,
}

impl Progress {
    /// [`Pipeline::request_rotate`], for whoever holds only the progress (the ROS side's
    /// `~/split_bagfile`): two relaxed stores, never a wait on the writer.
    pub fn request_rotate(&self) {
        self.rotate_unless_empty.store(false, Relaxed);
        self.rotate_requested.store(true, Relaxed);
    }
}

pub struct Pipeline {
    progress: Arc<Progress>,
    shared: Arc<Shared>,
    producer: Producer,
    handle: Option<JoinHandle<Result<(BagSummary, StopReason), PipelineError>>>,
    started: Instant,
    bag_dir: std::path::PathBuf,
    pause: Arc<super::PauseSwitch>,
}

impl Pipeline {
    /// Start the writer thread over an open bag.
    pub fn start(
        writer: BagWriter,
        retention: Option<Retention>,
        clock: Arc<dyn TimeSource>,
        cfg: PipelineConfig,
    ) -> Pipeline {
        Pipeline::start_with_tap(writer, retention, clock, cfg, None)
    }

    /// [`Pipeline::start`] with a [`Tap`] (the snapshot ring and per-topic policies).
    pub fn start_with_tap(
        mut writer: BagWriter,
        retention: Option<Retention>,
        clock: Arc<dyn TimeSource>,
        cfg: PipelineConfig,
        tap: Option<Box<dyn Tap>>,
    ) -> Pipeline {
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_slots.max(1));
        let (reg_tx, reg_rx) = crossbeam_channel::unbounded();
        // Pools (the shared one and each topic's large buffers): half the cache budget, at
        // most 64 MiB, so RSS stays near the budget. The robot mix keeps up to 4 buffers per
        // camera and point-cloud topic, some grown to twice a frame (2.7 -> 5.5 MB): a
        // quarter (25 MiB) freed some of them, to be allocated again. The shared pool has as
        // many places as the queue has slots: a batch of 4,096 small messages comes back
        // whole (with 1,024 places three in four were freed by the writer and allocated
        // again by the producers, 5 % of the writer's time at 100 B).
        let pool_budget = (cfg.max_cache_size / 2).min(64 << 20);
        let (pool_tx, pool_rx) = crossbeam_channel::bounded(cfg.queue_slots.max(1));
        let shared = Arc::new(Shared {
            in_flight: CachePadded::new(AtomicUsize::new(0)),
            budget: cfg.max_cache_size,
            stop: AtomicBool::new(false),
            writer_gone: AtomicBool::new(false),
            sources_done: AtomicBool::new(false),
            next_topic: AtomicU32::new(0),
            topics: Mutex::new(Vec::new()),
            pool_tx,
            pool_rx,
            pool_bytes: CachePadded::new(AtomicUsize::new(0)),
            pool_budget,
            bursts: Default::default(),
        });
        let progress = Arc::new(Progress::default());
        // Closing fsyncs and the open split's write-back run on their own thread, so that
        // neither stalls the writer (and with it the queue).
        match BackgroundSync::start(progress.sync.clone(), WRITEBACK_INTERVAL) {
            Some(bg) => {
                if let Err(e) = writer.set_durability(Box::new(bg)) {
                    log::warn!("background sync unavailable ({e}); fsyncing on the writer thread");
                }
            }
            None => log::warn!("cannot start the sync thread; fsyncing on the writer thread"),
        }
        // Closed splits are compressed (`--compression-mode file`) on threads of their own,
        // which the writer hands them to without ever waiting.
        if let Some(c) = writer.options().compression.filter(|c| c.whole_splits()) {
            match super::compress::CompressPool::start(&c) {
                Some(pool) => writer.set_compression(Box::new(pool)),
                None => log::warn!(
                    "cannot start the compression threads; compressing on the writer thread"
                ),
            }
        }
        let bag_dir = writer.dir().to_path_buf();
        let room = tap.as_ref().and_then(|t| t.room());
        let retention = match (&room, retention) {
            (Some(room), Some(r)) => Some(r.with_beside_on_disk(room.on_disk_gauge())),
            (_, r) => r,
        };
        if let Some(room) = &room {
            room.set_bounded(retention.as_ref().is_some_and(|r| {
                r.policy().max_record_size.is_some() || r.policy().has_free_floor()
            }));
        }
        progress
            .splits
            .store(u64::from(writer.splits_created()), Relaxed);
        let pause = cfg.pause.clone();
        let ctx = WriterCtx {
            message_mode: writer.options().compression.is_some_and(|c| c.per_message),
            msgzip: None,
            progress: progress.clone(),
            shared: shared.clone(),
            rx,
            reg_rx,
            writer: Some(writer),
            retention,
            cfg,
            topic_map: Vec::new(),
            topic_stats: Vec::new(),
            written_scratch: Vec::new(),
            clock: clock.clone(),
            tap,
            last_batch: (0, 0),
            presence: Presence::new(&bag_dir),
            room,
        };
        let handle = std::thread::Builder::new()
            .name("ringbag-writer".into())
            .spawn(move || ctx.run())
            .ok();
        let producer = Producer {
            shared: shared.clone(),
            tx,
            reg_tx,
            clock,
        };
        let p = Pipeline {
            progress,
            shared,
            producer,
            handle,
            started: Instant::now(),
            bag_dir,
            pause,
        };
        if p.handle.is_none() {
            p.shared.writer_gone.store(true, Relaxed);
            p.shared.stop.store(true, Relaxed);
        }
        p
    }

    /// The pause switch (the one in its [`PipelineConfig`]).
    pub fn pause(&self) -> &Arc<super::PauseSwitch> {
        &self.pause
    }

    /// Ask the writer to close the open split now and open the next (through retention, as
    /// a size or time split does). Returns at once; the writer acts at its next turn.
    pub fn request_rotate(&self) {
        self.progress.request_rotate();
    }

    /// [`Pipeline::request_rotate`], except that a split holding no message yet is left
    /// open (SIGUSR1): with a file budget (`max_bag_files`) an empty split would push a split
    /// of real history out. The writer logs the skip.
    pub fn request_rotate_unless_empty(&self) {
        self.progress.rotate_unless_empty.store(true, Relaxed);
        self.progress.rotate_requested.store(true, Relaxed);
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
    }

    /// Committed-message and split counters, updated by the writer thread.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    pub fn producer(&self) -> Producer {
        self.producer.clone()
    }

    /// True once the writer has stopped on its own or a stop was requested.
    pub fn stopping(&self) -> bool {
        self.shared.stop.load(Relaxed)
    }

    /// Per-topic counters so far.
    pub fn topic_stats(&self) -> Vec<Arc<TopicStats>> {
        self.shared
            .topics
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// Stop accepting, write everything already accepted, finish the bag.
    pub fn finish(
        mut self,
    ) -> (
        Result<(BagSummary, StopReason), PipelineError>,
        RecordSummary,
    ) {
        self.shared.stop.store(true, Relaxed);
        // Every source has been stopped and joined by now (the caller's contract): the
        // writer may count and finish.
        self.shared.sources_done.store(true, Release);
        // The writer may be parked (it naps up to 5 ms when the queue is empty): start its
        // last turn now rather than at the end of the nap.
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
        let result = match self.handle.take() {
            Some(h) => h.join().unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(PipelineError::Panicked(msg))
            }),
            None => Err(PipelineError::Panicked(
                "writer thread could not be spawned".into(),
            )),
        };
        let p = &self.progress;
        let mut summary = RecordSummary {
            wall_time: self.started.elapsed(),
            splits_deleted: p.splits_deleted.load(Relaxed),
            longest_stall: Duration::from_nanos(p.longest_stall_ns.load(Relaxed)),
            longest_stall_cpu: Duration::from_nanos(p.longest_stall_cpu_ns.load(Relaxed)),
            peak_queue_bytes: p.peak_queue_bytes.load(Relaxed),
            longest_sync: Duration::from_nanos(p.sync.longest_ns.load(Relaxed)),
            paused_at_end: self.pause.is_paused(),
            ..Default::default()
        };
        // Producers and the writer have stopped: these counts are final and add up.
        for t in &self.topic_stats() {
            summary.bytes_accepted += t.bytes();
            summary.add_topic(TopicSummary::of(t));
        }
        // What is on disk, whether or not the bag finished cleanly.
        let (splits, bytes) = splits_on_disk(&self.bag_dir);
        summary.splits_kept = splits;
        summary.bag_size_bytes = bytes;
        (result, summary)
    }
}

impl Drop for Pipeline {
    /// Dropped without `finish()`: let the writer thread finish the bag on its own.
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.sources_done.store(true, Release);
    }
}

/// When one turn of the writer loop began, by the clock and by the writer thread's own CPU
/// time (one system call per turn: a few hundred per second at most, as turns are batches or
/// naps of up to 5 ms).
#[derive(Clone, Copy)]
struct Turn {
    started: Instant,
    cpu_ns: Option<u64>,
}

impl Turn {
    fn start() -> Turn {
        Turn {
            started: Instant::now(),
            cpu_ns: thread_cpu_ns(),
        }
    }
}

/// CPU time the calling thread has used, in ns.
fn thread_cpu_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

struct WriterCtx {
    /// `--compression-mode message`: each row compressed on this thread (`write_rows_of`).
    message_mode: bool,
    /// Its context and arena, made at the first batch and kept.
    msgzip: Option<crate::bag::compressed::MessageZip>,
    progress: Arc<Progress>,
    shared: Arc<Shared>,
    rx: Receiver<Item>,
    reg_rx: Receiver<Register>,
    writer: Option<BagWriter>,
    retention: Option<Retention>,
    cfg: PipelineConfig,
    /// Producer topic id → bag topic index.
    topic_map: Vec<Option<usize>>,
    /// Producer topic id → its counters (written, oversize).
    topic_stats: Vec<Option<Arc<TopicStats>>>,
    /// Rows written per producer topic id in the current batch, published once per batch
    /// (an atomic per row would share cache lines with the producers' counters).
    /// Per topic id: rows and payload bytes committed by this batch, not yet published.
    written_scratch: Vec<(u64, u64)>,
    clock: Arc<dyn TimeSource>,
    tap: Option<Box<dyn Tap>>,
    /// Messages and bytes of the batch written last, for the slow-turn log line.
    last_batch: (usize, usize),
    /// Watches that the bag's directory and open split are still the files being written.
    presence: Presence,
    /// Where a snapshot bag being written asks for room on the budget.
    room: Option<Arc<Room>>,
}

/// How often the writer checks that its bag still exists ([`Presence`]).
const PRESENCE_EVERY: Duration = Duration::from_millis(250);

/// Whether the bag directory and the open split are still on disk as the files the writer
/// holds open. A deleted directory (or recording root) leaves SQLite writing into unlinked
/// files: every commit succeeds and the data vanishes at close. Two stats of paths every
/// [`PRESENCE_EVERY`], off the per-message path, find it.
struct Presence {
    last: Instant,
    /// The bag directory's inode when recording started.
    dir_ino: Option<u64>,
    /// The open split's path and inode, learned when first seen.
    split: Option<(std::path::PathBuf, u64)>,
}

impl Presence {
    fn new(dir: &std::path::Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        Presence {
            last: Instant::now(),
            dir_ino: std::fs::symlink_metadata(dir).ok().map(|m| m.ino()),
            split: None,
        }
    }

    /// `Some(what happened)` when the bag or its open split is gone or replaced. Stat errors
    /// other than "not found" say nothing (a transient EIO must not end the recording here;
    /// the next write reports it).
    fn check(&mut self, w: &BagWriter) -> Option<String> {
        if self.last.elapsed() < PRESENCE_EVERY {
            return None;
        }
        self.check_now(w)
    }

    /// [`Presence::check`] whenever it was last done.
    fn check_now(&mut self, w: &BagWriter) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        self.last = Instant::now();
        let gone = |p: &std::path::Path| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let dir = w.dir();
        match std::fs::symlink_metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let root = dir.parent().filter(|p| !p.as_os_str().is_empty());
                return Some(match root {
                    Some(r) if gone(r) => format!(
                        "the bag directory was deleted with its recording root {}",
                        r.display()
                    ),
                    _ => "the bag directory was deleted".to_string(),
                });
            }
            Ok(m) if self.dir_ino.is_some_and(|i| i != m.ino()) => {
                return Some("the bag directory was replaced by another one".to_string());
            }
            _ => {}
        }
        let path = w.open_split_path()?;
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
                "the open split {} was deleted",
                path.file_name().unwrap_or_default().to_string_lossy()
            )),
            Ok(m) => match &self.split {
                Some((p, ino)) if p == path && *ino != m.ino() => Some(format!(
                    "the open split {} was replaced by another file",
                    path.file_name().unwrap_or_default().to_string_lossy()
                )),
                Some((p, _)) if p == path => None,
                _ => {
                    self.split = Some((path.to_path_buf(), m.ino()));
                    None
                }
            },
            Err(_) => None,
        }
    }
}

/// How long the writer waits at the end of a recording for the open snapshot's next question
/// before it leaves it to the room it was given (a snapshot that copies asks at least once a
/// batch, i.e. every few MiB).
const WIND_DOWN_IDLE: Duration = Duration::from_secs(10);

impl WriterCtx {
    fn run(mut self) -> Result<(BagSummary, StopReason), PipelineError> {
        let mut r = self.run_loop();
        if let Err(e) = &r {
            // Another error may come first from a bag deleted under the recording (retention
            // cannot read the free space of a directory that is gone): say what happened.
            if !matches!(e, PipelineError::BagGone { .. }) {
                if let Some(what) = self
                    .presence
                    .check_now(self.writer.as_ref().expect("writer"))
                {
                    r = Err(PipelineError::BagGone {
                        path: self.writer().dir().to_path_buf(),
                        what,
                    });
                }
            }
        }
        if let Some(room) = self.room.clone() {
            if r.is_ok() {
                self.wind_down_snapshot(&room);
            }
            // From here a snapshot still being written keeps to the room it was given.
            room.writer_gone();
        }
        if let Err(e) = &r {
            if matches!(e, PipelineError::BagGone { .. }) {
                // Said at once (journal, the status file's last error): finishing a bag
                // whose directory is gone may take a moment before the exit line.
                log::error!("{e}");
            }
            let _ = self.progress.failure.set(e.to_string());
        }
        // Whatever happened, stop producers and finish the bag with what was committed.
        // Nothing is written after this point, so producers stop queueing (and count why).
        self.shared.stop.store(true, Relaxed);
        self.shared.writer_gone.store(true, Relaxed);
        // The bag's counts must be final: wait until the caller has stopped every source
        // (`Pipeline::finish`), releasing what producers still queue meanwhile.
        while !self.shared.sources_done.load(Acquire) {
            self.drain_and_discard();
            std::thread::park_timeout(Duration::from_millis(5));
        }
        self.drain_and_discard();
        self.annotate_custom_data();
        let writer = self.writer.take().expect("writer present until finish");
        let last = writer.open_split_path().map(std::path::Path::to_path_buf);
        let finished = writer.finish();
        // rosbag2 tells of the final close too, with no file opened.
        if let (Some(tx), Some(last), Ok(_)) = (&self.cfg.split_events, &last, &finished) {
            tx.send(last, None);
        }
        // Whatever is still queued will never be written (it counts as unwritten); release
        // its bytes so the budget accounting stays right while producers shut down.
        self.drain_and_discard();
        match (r, finished) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e.into()),
            (Ok(reason), Ok(summary)) => Ok((summary, reason)),
        }
    }

    /// The recording has ended and every message it took is in the ring: let the open
    /// snapshot finish with what the ring holds while this thread still makes room for it,
    /// so that a stop right after a trigger gives the whole snapshot inside the budget
    /// instead of one cut short. Waits while the snapshot makes progress (asks for room),
    /// at most [`WIND_DOWN_IDLE`] without a question; the service's stop timeout bounds it.
    fn wind_down_snapshot(&mut self, room: &Room) {
        room.wind_down();
        let mut seen = room.questions();
        let mut idle_since = Instant::now();
        while room.holding() && idle_since.elapsed() < WIND_DOWN_IDLE {
            if let Err(e) = self.answer_room() {
                log::warn!("making room for the last snapshot: {e}");
                return;
            }
            let now = room.questions();
            if now != seen {
                seen = now;
                idle_since = Instant::now();
            }
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }

    fn writer(&mut self) -> &mut BagWriter {
        self.writer.as_mut().expect("writer present until finish")
    }

    fn run_loop(&mut self) -> Result<StopReason, PipelineError> {
        if let (Some(ret), Some(w)) = (self.retention.as_mut(), self.writer.as_mut()) {
            // Learn the empty split's real size before any message is judged against it.
            ret.sync(w);
        }
        // Enforce the budget over the whole root before the first message: older bags (a
        // restart, a smaller budget after a reload) may already exceed it.
        if let Some(reason) = self.after_batch()? {
            return Ok(reason);
        }
        let mut batch: Vec<Item> = Vec::with_capacity(self.cfg.batch_max_messages);
        let mut batch_bytes = 0usize;
        // Messages in `batch`: an item may be a burst of many.
        let mut batch_messages = 0usize;
        // A message that would have taken the batch over its byte cap: it starts the next
        // batch, so a batch is at most the cap, or one larger message alone, and a turn is
        // never two camera frames long.
        let mut carry: Option<Item> = None;
        let mut batch_started = Instant::now();
        let mut last_drop_report = Instant::now();
        let mut reported_drops = 0u64;
        loop {
            // While the syncer is inside an fsync the loop does not count as progress: a
            // storage stall must stop the service watchdog's pings wherever it happens.
            if !self.progress.sync.busy.load(Relaxed) {
                self.progress.loops.fetch_add(1, Relaxed);
            }
            let queued = self.shared.in_flight.load(Relaxed) as u64;
            self.progress.peak_queue_bytes.fetch_max(queued, Relaxed);
            self.progress.queue_bytes.store(queued, Relaxed);
            let turn = Turn::start();
            if let Some(what) = self
                .presence
                .check(self.writer.as_ref().expect("writer present"))
            {
                return Err(PipelineError::BagGone {
                    path: self.writer().dir().to_path_buf(),
                    what,
                });
            }
            self.answer_room()?;
            let stopping = self.shared.stop.load(Relaxed);
            if self.progress.rotate_requested.swap(false, Relaxed) && !stopping {
                // Write what is batched (and carried) into the split being closed first, so
                // the closed split holds everything accepted before the request.
                batch.extend(carry.take());
                if !batch.is_empty() {
                    let stop = self.write(&mut batch)?;
                    (batch_bytes, batch_messages) = (0, 0);
                    if let Some(reason) = stop {
                        return Ok(reason);
                    }
                }
                // A split that holds no message is not closed on SIGUSR1: with a file
                // budget (`max_bag_files`) an empty split would push a split of history out.
                let unless_empty = self.progress.rotate_unless_empty.load(Relaxed);
                let empty = self.writer().open_split_span().is_none();
                if unless_empty && empty && queued > 0 {
                    // Messages accepted before the request are still queued: this turn
                    // writes them, the next one closes the split with them.
                    self.progress.rotate_requested.store(true, Relaxed);
                } else {
                    self.progress.rotate_unless_empty.store(false, Relaxed);
                    if unless_empty && empty {
                        log::info!("SIGUSR1: the current split holds no message; not closed");
                    } else if let Some(reason) = self.rotate()? {
                        return Ok(reason);
                    }
                    if let Some(reason) = self.after_batch()? {
                        return Ok(reason);
                    }
                    self.note_stall(turn);
                    continue;
                }
            }
            self.drain_registrations()?;
            let mut disconnected = false;
            if batch.is_empty() {
                if let Some(item) = carry.take() {
                    batch_started = Instant::now();
                    (batch_bytes, batch_messages) = (item.bytes(), item.count());
                    batch.push(item);
                }
            }
            while batch_messages < self.cfg.batch_max_messages
                && batch_bytes < self.cfg.batch_max_bytes
            {
                match self.rx.try_recv() {
                    Ok(item) => {
                        if batch.is_empty() {
                            batch_started = Instant::now();
                        } else if batch_bytes + item.bytes() > self.cfg.batch_max_bytes
                            || batch_messages + item.count() > self.cfg.batch_max_messages
                        {
                            carry = Some(item);
                            break;
                        }
                        batch_bytes += item.bytes();
                        batch_messages += item.count();
                        batch.push(item);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        disconnected = true;
                        break;
                    }
                }
            }
            // A carried message means the batch reached its cap.
            let full = carry.is_some()
                || batch_messages >= self.cfg.batch_max_messages
                || batch_bytes >= self.cfg.batch_max_bytes;
            let due = !batch.is_empty() && batch_started.elapsed() >= self.cfg.batch_max_delay;
            if full || due || ((stopping || disconnected) && !batch.is_empty()) {
                let stop = self.write(&mut batch)?;
                (batch_bytes, batch_messages) = (0, 0);
                if let Some(reason) = stop {
                    return Ok(reason);
                }
                if let Some(reason) = self.after_batch()? {
                    return Ok(reason);
                }
                self.note_stall(turn);
                continue;
            }
            // (A carried message is always in `batch` by now: it is moved there whenever
            // the batch is empty, and only set aside while the batch is not.)
            // A stop is asked for while the sources still run (SIGTERM, the end of a
            // synthetic count): what they queue until they have stopped (`finish` says so)
            // was accepted and is written too, never discarded as unwritten.
            if batch.is_empty()
                && ((stopping && self.shared.sources_done.load(Acquire)) || disconnected)
                && self.rx.is_empty()
            {
                return Ok(StopReason::Requested);
            }
            // Quiet topics still rotate on time.
            let now = self.clock.now_ns();
            if self.writer().split_due_by_time(now) {
                if let Some(reason) = self.rotate()? {
                    return Ok(reason);
                }
                if let Some(reason) = self.after_batch()? {
                    return Ok(reason);
                }
                self.note_stall(turn);
            }
            if last_drop_report.elapsed() >= Duration::from_secs(1) {
                reported_drops = self.report_drops(reported_drops);
                last_drop_report = Instant::now();
            }
            // Nothing to do yet: park briefly. Producers never wake us (that would cost them
            // a syscall); the queue holds far more than what arrives in one park.
            let wait = if batch.is_empty() {
                Duration::from_millis(5)
            } else {
                self.cfg
                    .batch_max_delay
                    .saturating_sub(batch_started.elapsed())
                    .min(Duration::from_millis(5))
            };
            std::thread::park_timeout(wait);
        }
    }

    fn note_stall(&self, turn: Turn) {
        let ns = turn.started.elapsed().as_nanos() as u64;
        self.progress.batch_duration.record_ns(ns);
        let before = self.progress.longest_stall_ns.fetch_max(ns, Relaxed);
        if ns <= before {
            return;
        }
        // Only this thread writes the pair, and readers take it after the writer has ended
        // (the exit summary), so the two need not change as one.
        let cpu_ns = match (turn.cpu_ns, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        };
        self.progress.longest_stall_cpu_ns.store(cpu_ns, Relaxed);
        if ns >= SLOW_TURN_NS {
            // Where a new longest stall happened, for whoever chases one (`--log-level debug`).
            log::debug!(
                "writer: new longest stall {:.1} ms, {:.1} ms of it on the CPU, writing {} messages of {} bytes (split {}, {} bytes queued)",
                ns as f64 / 1e6,
                cpu_ns as f64 / 1e6,
                self.last_batch.0,
                self.last_batch.1,
                self.progress.splits.load(Relaxed),
                self.shared.in_flight.load(Relaxed)
            );
        }
    }

    fn drain_registrations(&mut self) -> Result<(), PipelineError> {
        while let Ok(reg) = self.reg_rx.try_recv() {
            if let Some(tap) = self.tap.as_mut() {
                tap.topic(reg.id, &reg.info, reg.definition.as_ref());
            }
            let idx = self.writer().add_topic(reg.info, reg.definition)?;
            let id = reg.id as usize;
            if self.topic_map.len() <= id {
                self.topic_map.resize(id + 1, None);
                self.topic_stats.resize(id + 1, None);
                self.written_scratch.resize(id + 1, (0, 0));
            }
            self.topic_map[id] = Some(idx);
            self.topic_stats[id] = Some(reg.stats);
        }
        Ok(())
    }

    /// Write one batch: split it at split boundaries, let retention make room before each
    /// run of rows and around each rotation, commit each run. Returns a stop reason when
    /// `--max-splits` ends the recording inside the batch.
    fn write(&mut self, batch: &mut Vec<Item>) -> Result<Option<StopReason>, PipelineError> {
        let (messages, bytes) = batch
            .iter()
            .fold((0, 0), |(n, b), i| (n + i.count(), b + i.bytes()));
        let result = self.write_rows_of(batch, messages);
        self.last_batch = (messages, bytes);
        give_back_batch(&self.shared, &self.topic_stats, batch);
        self.shared.in_flight.fetch_sub(bytes, Relaxed);
        result
    }

    /// `messages`: how many the batch holds, counted once by `write`.
    fn write_rows_of(
        &mut self,
        batch: &[Item],
        messages: usize,
    ) -> Result<Option<StopReason>, PipelineError> {
        // Rows in batch order with their producer ids; oversize messages are left out here.
        let mut rows: Vec<Row> = Vec::with_capacity(messages);
        let mut ids: Vec<u32> = Vec::with_capacity(messages);
        // Once per batch: the per-message check below is arithmetic, no system call.
        let limit = match (self.retention.as_ref(), self.writer.as_ref()) {
            (Some(ret), Some(w)) => ret.oversize_limit(w),
            _ => OversizeLimit::NONE,
        };
        let mut registrations_drained = false;
        // Once per batch (see `pause`): after the tap, so the snapshot ring keeps recording.
        let paused = self.cfg.pause.is_paused();
        let mut paused_messages = 0;
        for (topic, ts, data) in batch.iter().flat_map(Item::messages) {
            let mut idx = self.topic_map.get(topic as usize).copied().flatten();
            if idx.is_none() && !registrations_drained {
                // A registration sent before its first message may still be in flight.
                self.drain_registrations()?;
                registrations_drained = true;
                idx = self.topic_map.get(topic as usize).copied().flatten();
            }
            let Some(idx) = idx else {
                continue; // Unknown topic: stays "unwritten" in the counts.
            };
            if let Some(tap) = self.tap.as_mut() {
                let route = tap.message(topic, ts, data);
                if route != Continuous::Write {
                    // Counted per message on the writer thread, only for messages left out.
                    if let Some(Some(s)) = self.topic_stats.get(topic as usize) {
                        let counter = match route {
                            Continuous::RingOnly => &s.ring_only,
                            _ => &s.throttled,
                        };
                        counter.fetch_add(1, Relaxed);
                    }
                    continue;
                }
            }
            if paused {
                if let Some(Some(s)) = self.topic_stats.get(topic as usize) {
                    s.paused.fetch_add(1, Relaxed);
                }
                paused_messages += 1;
                continue;
            }
            if !self.fits_budget(topic, data.len(), &limit) {
                continue;
            }
            rows.push((idx, ts, data));
            ids.push(topic);
        }
        self.cfg.pause.add_messages(paused_messages);
        // `--compression-mode message`: each row's data becomes a zstd frame here, before
        // the split and budget checks, so they count the bytes that land on disk. On the
        // writer thread: the queue in front of it already absorbs its stalls, and one context
        // and one arena reused batch after batch cost no lock and no allocation per message
        // (a context per producer thread would be neither); level 1 runs at hundreds of MB/s
        // a core, and the time shows in the writer's stall figures like SQLite's own.
        if !self.message_mode {
            return self.commit_rows(&rows, &ids);
        }
        let dir = || {
            self.writer
                .as_ref()
                .map(|w| w.dir().to_path_buf())
                .unwrap_or_default()
        };
        let mut zip = match self.msgzip.take() {
            Some(z) => z,
            None => crate::bag::compressed::MessageZip::new().map_err(BagError::io(dir()))?,
        };
        let r = match zip.compress(&rows) {
            Ok(zipped) => self.commit_rows(&zipped, &ids),
            Err(e) => Err(BagError::io(dir())(e).into()),
        };
        self.msgzip = Some(zip);
        r
    }

    /// Write `rows` (of producer topics `ids`) split by split, with retention and the
    /// free-space check before each run: the rest of [`write_rows_of`](Self::write_rows_of).
    fn commit_rows(
        &mut self,
        rows: &[Row],
        ids: &[u32],
    ) -> Result<Option<StopReason>, PipelineError> {
        let mut done = 0;
        let mut stop = None;
        while done < rows.len() {
            let rest = &rows[done..];
            let n = self.writer().rows_fitting(rest);
            if n == 0 {
                // The open split is full: rotate, with retention between close and open.
                if let Some(reason) = self.rotate()? {
                    stop = Some(reason);
                    break;
                }
                continue;
            }
            let chunk = &rest[..n];
            let page = self.writer().page_size();
            let growth: u64 = chunk
                .iter()
                .map(|r| row_growth_bytes(r.2.len() as u64, page))
                .sum();
            let newest = chunk.iter().map(|r| r.1).max().unwrap_or(0);
            if let Some(ret) = self.retention.as_mut() {
                let w = self.writer.as_mut().expect("writer present");
                let d = ret.before_batch(w, growth, newest)?;
                self.progress.splits_deleted.fetch_add(d, Relaxed);
            }
            self.check_free_space(growth)?;
            self.writer
                .as_mut()
                .expect("writer present")
                .write_rows(chunk)?;
            // Only after COMMIT returned: these rows are in the file.
            for (&id, row) in ids[done..done + n].iter().zip(chunk) {
                let w = &mut self.written_scratch[id as usize];
                w.0 += 1;
                w.1 += row.2.len() as u64;
            }
            // Published per commit, so a later failure in this batch cannot hide them.
            self.publish_written();
            self.progress.committed.fetch_add(n as u64, Relaxed);
            done += n;
        }
        Ok(stop)
    }

    /// Whether `item` can ever fit under `--max-record-size`; if not, count it as oversize
    /// (warning once per topic) so the bound holds and the loss is visible.
    fn fits_budget(&mut self, topic: u32, len: usize, limit: &OversizeLimit) -> bool {
        if limit.fits(len as u64) {
            return true;
        }
        if let Some(Some(stats)) = self.topic_stats.get(topic as usize) {
            if stats.oversize.fetch_add(1, Relaxed) == 0 {
                log::warn!(
                    ringbag_topic = stats.name.as_str();
                    "{}: a {} byte message cannot fit under --max-record-size {} even with every \
                     older split deleted; dropping such messages (counted as oversize)",
                    stats.name,
                    len,
                    self.retention
                        .as_ref()
                        .and_then(|r| r.policy().max_record_size)
                        .unwrap_or(0)
                );
            }
        }
        false
    }

    /// Add the batch's written rows to the topics' counters.
    fn publish_written(&mut self) {
        for (id, (n, bytes)) in self.written_scratch.iter_mut().enumerate() {
            if *n > 0 {
                if let Some(Some(stats)) = self.topic_stats.get(id) {
                    stats.written.fetch_add(*n, Relaxed);
                    stats.written_bytes.fetch_add(*bytes, Relaxed);
                }
                *n = 0;
                *bytes = 0;
            }
        }
    }

    /// Close the open split and open the next, letting retention delete old splits in
    /// between so that no bound is exceeded while the new file appears. Returns
    /// `MaxSplits` instead when `--max-splits` files already exist.
    fn rotate(&mut self) -> Result<Option<StopReason>, PipelineError> {
        let w = self.writer.as_mut().expect("writer present");
        if !w.may_open_another_split() {
            // `--max-splits` is a stop condition: the open split is the last one.
            w.mark_split_limit_reached();
            return Ok(Some(StopReason::MaxSplits(self.retention_max_splits())));
        }
        // Only with a listener (the ROS side): the path is copied once per split.
        let closed = self
            .cfg
            .split_events
            .as_ref()
            .and(w.open_split_path())
            .map(std::path::Path::to_path_buf);
        match self.retention.as_mut() {
            Some(ret) => {
                let d = ret.rotate(w)?;
                self.progress.splits_deleted.fetch_add(d, Relaxed);
            }
            None => {
                w.split()?;
                w.take_newly_closed();
            }
        }
        self.progress
            .splits
            .store(u64::from(w.splits_created()), Relaxed);
        if let (Some(tx), Some(closed)) = (&self.cfg.split_events, closed) {
            tx.send(&closed, w.open_split_path());
        }
        Ok(None)
    }

    /// Answer a snapshot bag's question for room ([`Room`]), if one waits: make room on the
    /// budget for what it asks while keeping this recording's own room until it can delete
    /// again, and check the partition can take it beside [`DISK_RESERVE_BYTES`]. One atomic
    /// load when nothing is asked.
    fn answer_room(&mut self) -> Result<(), PipelineError> {
        // Every turn asks; only a waiting question pays for the Arc (an atomic increment).
        let Some((seq, bytes, on_disk)) = self.room.as_ref().and_then(|r| r.question()) else {
            return Ok(());
        };
        let room = self.room.clone().expect("a question came from the room");
        // A bag finished since is adopted first: its release must not leave it uncounted.
        if let (Some(tap), Some(ret)) = (self.tap.as_mut(), self.retention.as_mut()) {
            for dir in tap.finished_bags() {
                ret.adopt_bag(&dir);
            }
        }
        let w = self.writer.as_mut().expect("writer present");
        let headroom = continuous_headroom(w, self.cfg.batch_max_bytes as u64);
        let verdict = match self.retention.as_mut() {
            Some(ret) => match ret.room_beside(w, bytes, on_disk, headroom)? {
                Ok(d) => {
                    self.progress.splits_deleted.fetch_add(d, Relaxed);
                    Ok(())
                }
                // Giving room back is always granted (the bag is finished or removed).
                Err(_) if bytes == 0 => Ok(()),
                Err(why) => Err(why),
            },
            None => Ok(()),
        };
        let verdict = verdict.and_then(|()| {
            let growth = bytes.saturating_sub(on_disk);
            if growth == 0 {
                return Ok(());
            }
            let Ok(st) = nix::sys::statvfs::statvfs(w.dir()) else {
                return Ok(()); // Unknown: the snapshot's own writes report a failure.
            };
            #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
            let available = st.blocks_available() as u64 * st.fragment_size() as u64;
            let needed = growth + headroom + DISK_RESERVE_BYTES;
            if available < needed {
                return Err(format!(
                    "only {available} bytes free on the partition, {growth} more for the \
                     snapshot and {} kept for the continuous recording",
                    headroom + DISK_RESERVE_BYTES
                ));
            }
            Ok(())
        });
        room.answer(seq, verdict);
        Ok(())
    }

    fn retention_max_splits(&self) -> u32 {
        self.retention.as_ref().map_or(0, |r| r.policy().max_splits)
    }

    /// With journaling off, hitting ENOSPC mid-transaction can leave the open split
    /// damaged. So never start a batch the filesystem cannot hold: one statvfs per batch.
    fn check_free_space(&mut self, incoming: u64) -> Result<(), PipelineError> {
        let dir = self.writer().dir().to_path_buf();
        let Ok(st) = nix::sys::statvfs::statvfs(&dir) else {
            return Ok(()); // Unknown: let the write itself report any failure.
        };
        #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
        let available = st.blocks_available() as u64 * st.fragment_size() as u64;
        // The batch, its index pages, and metadata.yaml rewrites with room to spare.
        let needed = incoming + incoming / 8 + DISK_RESERVE_BYTES;
        if available < needed {
            return Err(PipelineError::DiskFull {
                path: dir,
                available,
                needed,
            });
        }
        Ok(())
    }

    fn after_batch(&mut self) -> Result<Option<StopReason>, PipelineError> {
        if let (Some(tap), Some(ret)) = (self.tap.as_mut(), self.retention.as_mut()) {
            for dir in tap.finished_bags() {
                ret.adopt_bag(&dir);
            }
        }
        let Some(ret) = self.retention.as_mut() else {
            self.writer().take_newly_closed();
            return Ok(None);
        };
        let w = self.writer.as_mut().expect("writer present");
        let (verdict, deleted) = ret.after_batch(w)?;
        self.progress.splits_deleted.fetch_add(deleted, Relaxed);
        let usage = ret.usage(w);
        let p = &self.progress;
        p.budget_bytes.store(usage.bytes, Relaxed);
        p.budget_files.store(usage.files, Relaxed);
        p.budget_oldest_ns
            .store(usage.oldest_start_ns.unwrap_or(-1), Relaxed);
        let lost = ret.deleted_before_upload();
        if lost.files != p.deleted_before_upload_files.load(Relaxed) {
            // Per bag first: a reader that sees the new total finds the bags that make it.
            let per_bag = ret
                .deleted_before_upload_per_bag()
                .iter()
                .map(|(d, n)| (d.clone(), *n))
                .collect();
            *p.deleted_before_upload_per_bag
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = per_bag;
            p.deleted_before_upload_bytes.store(lost.bytes, Relaxed);
            p.deleted_before_upload_files.store(lost.files, Relaxed);
        }
        Ok(match verdict {
            Verdict::Continue => None,
            Verdict::StopMaxSplits(n) => Some(StopReason::MaxSplits(n)),
        })
    }

    /// Log drops at most once a second; producers only count.
    fn report_drops(&self, already: u64) -> u64 {
        let topics = self.shared.topic_stats();
        let total: u64 = topics.iter().map(|t| t.dropped()).sum();
        if total > already {
            let detail: Vec<String> = topics
                .iter()
                .filter(|t| t.dropped() > 0)
                .map(|t| format!("{}={}", t.name, t.dropped()))
                .collect();
            log::warn!(
                "dropped {} messages in the last second (queue full; raise --max-cache-size?); totals: {}",
                total - already,
                detail.join(", ")
            );
        }
        total
    }

    /// What was not recorded goes into the bag's custom_data so the bag says it is
    /// incomplete: the total and per topic over every cause, and the total of each cause.
    /// Runs after producers were told the writer is gone, so the counts are final but for a
    /// producer that raced that flag.
    fn annotate_custom_data(&mut self) {
        let topics = self.shared.topic_stats();
        let sum = |f: fn(&TopicStats) -> u64| topics.iter().map(|t| f(t)).sum::<u64>();
        let total = sum(TopicStats::not_recorded);
        let causes = [
            ("ringbag.dropped_queue_full", sum(TopicStats::dropped)),
            ("ringbag.dropped_oversize", sum(TopicStats::oversize)),
            ("ringbag.unwritten_at_stop", sum(TopicStats::unwritten)),
            (
                "ringbag.dropped_after_stop",
                sum(TopicStats::dropped_after_stop),
            ),
        ];
        let clock_data = self.clock.custom_data();
        let w = self.writer.as_mut().expect("writer present until finish");
        for (k, v) in clock_data {
            w.set_custom_data(k, v);
        }
        w.set_custom_data("ringbag.dropped_messages", total.to_string());
        for (k, v) in causes.into_iter().filter(|(_, v)| *v > 0) {
            w.set_custom_data(k, v.to_string());
        }
        for t in topics.iter().filter(|t| t.not_recorded() > 0) {
            w.set_custom_data(
                format!("ringbag.dropped_messages.{}", t.name),
                t.not_recorded().to_string(),
            );
        }
        // Kept apart from ringbag's own drops, each as a total and per topic, when not zero:
        // losses before ringbag saw the message (the publisher or the network outran the
        // middleware, not the recorder), and messages left out on request (pause), so that a
        // reader of the bag can tell a paused gap from a loss.
        for (key, count) in [
            (
                "ringbag.lost_in_middleware",
                TopicStats::lost_in_middleware as fn(&TopicStats) -> u64,
            ),
            ("ringbag.paused_messages", TopicStats::paused),
        ] {
            let total = sum(count);
            if total > 0 {
                w.set_custom_data(key, total.to_string());
            }
            for t in topics.iter().filter(|t| count(t) > 0) {
                w.set_custom_data(format!("{key}.{}", t.name), count(t).to_string());
            }
        }
    }

    /// After a failure, release whatever is still queued so producers' budget accounting
    /// stays right while they shut down.
    fn drain_and_discard(&mut self) {
        while let Ok(item) = self.rx.try_recv() {
            self.shared.in_flight.fetch_sub(item.bytes(), Relaxed);
            if let Item::Burst(b) = item {
                super::burst::give_back(&self.shared, b.buf);
            }
        }
    }
}

/// What the continuous recording may still add before retention can delete again: the rest
/// of its open split (with a batch's worth of overshoot), the next empty split and the close
/// of this one, counted twice with a WAL.
fn continuous_headroom(w: &BagWriter, batch_bytes: u64) -> u64 {
    let rest = w
        .options()
        .max_bag_size
        .saturating_sub(w.open_split_footprint())
        + batch_bytes;
    crate::retention::rows_disk_growth(rest, w.options().preset.uses_wal(), w.page_size())
        + crate::retention::MIN_EMPTY_SPLIT_BYTES
        + w.close_reserve()
}

/// Split files of a bag directory and their bytes (with `-wal`/`-shm`), as found on disk.
fn splits_on_disk(dir: &std::path::Path) -> (u32, u64) {
    // Compressed splits too (`--compression-mode file`): each split once, in its one form.
    let files = crate::bag::reader::find_splits(dir).unwrap_or_default();
    let bytes = files
        .iter()
        .map(|f| crate::bag::writer::split_size_on_disk(&dir.join(f)))
        .sum();
    (files.len() as u32, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::writer::WriterOptions;
    use crate::bag::{Flavour, TopicInfo};

    /// Poll `cond` every ms until it holds (10 s at most).
    fn wait(what: &str, cond: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_rotation_unless_empty_leaves_an_empty_split_open_and_closes_one_with_messages() {
        let tmp = tempfile::tempdir().expect("tmp");
        let w = BagWriter::create(&tmp.path().join("bag"), WriterOptions::new(Flavour::Jazzy))
            .expect("create");
        let clock: Arc<dyn crate::clock::TimeSource> = Arc::new(crate::clock::SystemClock);
        let p = Pipeline::start(w, None, clock, PipelineConfig::default());
        let progress = p.progress();
        let splits = || progress.splits.load(Relaxed);
        wait("the first split", || splits() == 1);
        p.request_rotate_unless_empty();
        // Taken by the writer (and two more turns: anything it did is published).
        wait("the request to be taken", || {
            !progress.rotate_requested.load(Relaxed)
        });
        let turns = progress.loops.load(Relaxed);
        wait("two more turns", || {
            progress.loops.load(Relaxed) > turns + 1
        });
        assert_eq!(splits(), 1, "an empty split is not closed");
        let producer = p.producer();
        let topic = producer.add_topic(TopicInfo::new("/t", "std_msgs/msg/String"), None);
        assert!(producer.push(&topic, b"\0\x01\0\0\x02\0\0\0x\0"));
        // Asked while the message may still be queued: it goes into the split that closes.
        p.request_rotate_unless_empty();
        wait("the split with a message to close", || splits() == 2);
        let (result, summary) = p.finish();
        result.expect("finish");
        assert_eq!(summary.written, 1);
    }

    /// `~/split_bagfile` and `events/write_split` without ROS: a rotation asked through the
    /// progress (even of an empty split, as rosbag2's service splits) tells of the closed
    /// and the opened file, and the final close of the last file with none opened.
    #[test]
    fn each_split_close_and_the_final_close_are_told_to_the_split_event_queue() {
        let tmp = tempfile::tempdir().expect("tmp");
        let bag = tmp.path().join("bag");
        let w = BagWriter::create(&bag, WriterOptions::new(Flavour::Jazzy)).expect("create");
        let clock: Arc<dyn crate::clock::TimeSource> = Arc::new(crate::clock::SystemClock);
        let (tx, rx) = crate::pipeline::split_events();
        let cfg = PipelineConfig {
            split_events: Some(tx),
            ..PipelineConfig::default()
        };
        let p = Pipeline::start(w, None, clock, cfg);
        let progress = p.progress();
        wait("the first split", || progress.splits.load(Relaxed) == 1);
        progress.request_rotate();
        wait("the second split", || progress.splits.load(Relaxed) == 2);
        let (result, _) = p.finish();
        result.expect("finish");
        let file = |i: u32| bag.join(format!("bag_{i}.db3")).display().to_string();
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv()).collect();
        assert_eq!(
            got,
            [
                crate::pipeline::SplitEvent {
                    closed_file: file(0),
                    opened_file: file(1),
                },
                crate::pipeline::SplitEvent {
                    closed_file: file(1),
                    opened_file: String::new(),
                },
            ]
        );
        assert_eq!(rx.dropped(), 0);
        assert!(std::path::Path::new(&file(1)).exists());
    }
}
