//! `ringbag record`: wire clock, bag writer, retention, pipeline and source together, run
//! until the source ends, a signal arrives or a stop condition holds, then finish cleanly.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::bag::writer::{BagSummary, BagWriter, WriterOptions};
use crate::bag::BagError;
use crate::clock::TimeSource;
use crate::pipeline::{Pipeline, PipelineConfig, PipelineError, RecordSummary, StopReason};
use crate::retention::{Retention, RetentionPolicy};
use crate::signals;
use crate::source::generator::{self, GeneratorConfig};

/// Where messages come from, resolved.
#[derive(Debug, Clone)]
pub enum SourceSettings {
    Synthetic(GeneratorConfig),
    /// Boxed: the selection lists make it many times the synthetic variant's size.
    #[cfg(feature = "ros")]
    Ros(Box<crate::source::select::RosSourceOptions>),
}

#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub output: PathBuf,
    pub writer: WriterOptions,
    pub pipeline: PipelineConfig,
    pub retention: RetentionPolicy,
    pub source: SourceSettings,
    pub clock: crate::clock::ClockSettings,
    /// Reindex unfinished bags in the output's parent directory before recording.
    pub recover: bool,
    /// Where to write `{"committed": N, "splits": K, "paused": B, "paused_messages": P}`
    /// every ~100 ms.
    pub status_file: Option<PathBuf>,
    /// The space bar pauses and resumes (`record` on a terminal; never the service).
    pub keyboard_controls: bool,
    /// `record` without a floor flag: the default free-space floor (bytes) in
    /// `retention.min_free_space`, said in one line at start. None otherwise.
    pub default_free_floor: Option<u64>,
    /// The snapshot ring, triggers and per-topic policy.
    pub snapshot: crate::snapshot::SnapshotSettings,
    /// The uploader's ledger for retention (uploaded files deleted first), and
    /// `delete_after_upload`; the default (none) deletes oldest first.
    pub upload_retention: crate::retention::UploadRetention,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("source failed: {0}")]
    Source(String),
    #[error(transparent)]
    Clock(#[from] crate::clock::ClockError),
    #[error("cannot install signal handlers: {0}")]
    Signals(nix::Error),
    /// The output directory cannot be created where it was asked for (exists, permission,
    /// a parent that is not a directory, a pseudo filesystem): bad input, not a failure.
    #[error(transparent)]
    Output(BagError),
    /// `--status-file` cannot be written at start: bad input.
    #[error("{}: cannot write the status file: {reason}", path.display())]
    StatusFile { path: PathBuf, reason: String },
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
}

impl RecordError {
    /// True when the error is the user's input (exit 2), not a failure while working.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RecordError::Output(_)
                | RecordError::StatusFile { .. }
                | RecordError::Clock(_)
                | RecordError::Bag(BagError::AlreadyExists { .. })
        ) || matches!(self, RecordError::Snapshot(e) if e.is_bad_input())
    }
}

/// Errors of `BagWriter::create` that say the output path itself is unusable. A full disk or
/// an I/O error stays a failure (exit 1).
fn create_error(e: BagError) -> RecordError {
    let bad_path = match &e {
        BagError::AlreadyExists { .. } | BagError::Invalid { .. } => true,
        BagError::Io { source, .. } => matches!(
            source.raw_os_error(),
            Some(
                libc::EACCES
                    | libc::EPERM
                    | libc::EROFS
                    | libc::ENOTDIR
                    | libc::ENOENT
                    | libc::ELOOP
                    | libc::ENAMETOOLONG
                    | libc::EEXIST
                    | libc::EISDIR
            )
        ),
        _ => false,
    };
    if bad_path {
        RecordError::Output(e)
    } else {
        RecordError::Bag(e)
    }
}

pub struct RecordOutcome {
    pub bag: BagSummary,
    pub stop: StopReason,
    pub summary: RecordSummary,
}

/// Record until done. On a writer failure the bag is finished as far as possible and the
/// error is returned (with the summary, so the caller can still print what was kept).
/// A failed recording: the error, and what was recorded before it (if the pipeline ran).
pub struct RecordFailure {
    pub error: RecordError,
    pub summary: Option<RecordSummary>,
}

fn failure(error: RecordError, summary: Option<RecordSummary>) -> Box<RecordFailure> {
    Box::new(RecordFailure { error, summary })
}

/// What a recording shows its supervisor while it runs (the daemon: notify, status file,
/// SIGUSR1 / SIGHUP).
pub struct Running<'a> {
    pub pipeline: &'a Pipeline,
    pub clock: &'a crate::clock::ClockHandle,
    pub settings: &'a RecordSettings,
    /// The snapshot ring, when there is one (its state goes into the status).
    pub ring: Option<Arc<crate::snapshot::ring::Ring>>,
}

/// A recording after its pipeline finished: every count is final (the exit summary's).
pub struct Finished<'a> {
    pub progress: &'a crate::pipeline::Progress,
    pub topics: &'a [Arc<crate::pipeline::TopicStats>],
    pub clock: &'a crate::clock::ClockHandle,
    pub settings: &'a RecordSettings,
    /// The snapshot ring, when there is one (its state goes into the status).
    pub ring: Option<Arc<crate::snapshot::ring::Ring>>,
}

/// Hooks into [`run_with`]: `record` has none; the service uses them to drive systemd's
/// notify protocol and its status file from the same recording code path.
pub trait Supervisor {
    /// Recovery of unfinished bags in the root starts (`true`) or ends (`false`).
    fn recovering(&mut self, _active: bool) {}
    /// The first split is open and the pipeline runs.
    fn started(&mut self, _run: &Running<'_>) {}
    /// Every turn of the main loop (~20 ms). Return true to end this recording cleanly.
    fn tick(&mut self, _run: &Running<'_>) -> bool {
        false
    }
    /// The recording is about to be finished (queue flushed, split committed).
    fn finishing(&mut self, _run: &Running<'_>) {}
    /// The snapshot ring the previous recording of this process kept (a reload): the next
    /// recording goes on with its history instead of an empty ring.
    fn take_ring(&mut self) -> Option<Arc<crate::snapshot::ring::Ring>> {
        None
    }
    /// The recording has ended cleanly with this ring (marked clean, nothing open in it): keep
    /// it for [`Supervisor::take_ring`], or drop it.
    fn keep_ring(&mut self, _ring: Arc<crate::snapshot::ring::Ring>) {}
    /// The control socket of the previous recording of this process (a reload): the next
    /// recording goes on serving it when its path is unchanged.
    fn take_control(&mut self) -> Option<crate::snapshot::control::ControlServer> {
        None
    }
    /// This recording is ending: keep its control socket for [`Supervisor::take_control`],
    /// or drop it (which stops it and removes the socket file).
    fn keep_control(&mut self, _control: crate::snapshot::control::ControlServer) {}
    /// The pipeline has finished (cleanly or not): the counts are final. What a status
    /// file says last must be this, not the state at `finishing`, when the queue still
    /// held messages that were then written.
    fn finished(&mut self, _done: &Finished<'_>) {}
}

/// No hooks: plain `ringbag record`.
pub struct Unsupervised;
impl Supervisor for Unsupervised {
    fn tick(&mut self, _run: &Running<'_>) -> bool {
        if signals::take_reload() {
            log::info!("SIGHUP: `ringbag record` has no configuration to reload; ignored");
        }
        false
    }
}

pub fn run(settings: RecordSettings) -> Result<RecordOutcome, Box<RecordFailure>> {
    run_with(settings, &mut Unsupervised)
}

/// [`run`] with a supervisor's hooks.
pub fn run_with(
    settings: RecordSettings,
    hooks: &mut dyn Supervisor,
) -> Result<RecordOutcome, Box<RecordFailure>> {
    // Signals keep their default action (end the process) until the writer exists: nothing
    // before it (PHC, recovery, creating the bag) may hold a SIGTERM back. See `signals`.
    //
    // The status file first: one that cannot be written is bad input, refused before the
    // clock, recovery or the bag touch anything. It starts at 0, which is never more than
    // the bag holds.
    let mut status = settings.status_file.as_deref().map(StatusFile::new);
    if let Some(st) = &status {
        if let Some(reason) = crate::config::status_file_taken(st.path) {
            return Err(failure(
                RecordError::StatusFile {
                    path: st.path.to_path_buf(),
                    reason,
                },
                None,
            ));
        }
        let pause = &settings.pipeline.pause;
        write_status_counts(st.path, 0, 0, pause).map_err(|e| {
            failure(
                RecordError::StatusFile {
                    path: st.path.to_path_buf(),
                    reason: io_reason(&e),
                },
                None,
            )
        })?;
    }
    // The clock next: `--clock ptp` with an unreadable device must fail before any bag exists.
    let clock_handle = crate::clock::start(&settings.clock).map_err(|e| failure(e.into(), None))?;
    // `--use-sim-time`: every stamp (the queue's, the writer's quiet-split check, snapshots)
    // is /clock's time, which the ROS source stores; the clock handle stays for the status.
    #[cfg(feature = "ros")]
    let sim = match &settings.source {
        SourceSettings::Ros(o) if o.use_sim_time => Some(Arc::new(crate::clock::SimClock::new())),
        _ => None,
    };
    #[cfg(not(feature = "ros"))]
    let sim: Option<Arc<crate::clock::SimClock>> = None;
    let clock: Arc<dyn TimeSource> = match &sim {
        Some(s) => s.clone(),
        None => Arc::new(clock_handle.clone()),
    };
    let root = settings
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    if settings.recover {
        let root = root.as_path();
        // Best effort: bags it cannot recover are logged and skipped; recording goes on.
        hooks.recovering(true);
        let recovery = crate::bag::reindex::recover_root(root);
        hooks.recovering(false);
        for r in &recovery.reports {
            log::warn!(
                ringbag_bag:% = r.bag.display();
                "recovered {}: {} messages kept, {}",
                r.bag.display(),
                r.message_count,
                r.lost_text()
            );
        }
    }
    // The black box next: a ring a crashed run left becomes a bag before anything else (so
    // the budget below counts it), then a fresh ring, its thread and its control socket.
    // The socket of the recording before a reload goes on when it is still the one wanted:
    // no gap in which `ringbag pause` would find no recorder. Otherwise it closes here, and a
    // new path is checked before the ring: a recorder already listening there (the service
    // started twice) must not cost the ring it left or create a new one.
    use crate::snapshot::control::{ControlServer, Route};
    let wanted = settings.snapshot.control_socket.as_deref();
    let kept = hooks
        .take_control()
        .filter(|c| wanted.is_some_and(|p| c.serves(p, &settings.pipeline.pause)));
    if let (None, Some(socket)) = (&kept, wanted) {
        crate::snapshot::control::refuse_if_listening(socket)
            .map_err(|e| failure(crate::snapshot::SnapshotError::from(e).into(), None))?;
    }
    let mut snapshots = match start_snapshots(&settings, &root, clock.clone(), hooks.take_ring()) {
        Ok(s) => s,
        Err(e) => return Err(failure(e.into(), None)),
    };
    // The control socket, ring or not (pause and resume need none): triggers go to the
    // snapshot thread, or are answered that there is no ring.
    // Made only for a socket: a route holds a sender of the snapshot thread, which ends only
    // once every sender is gone (a route left lying here would keep `finish` waiting).
    let route = || match snapshots.as_ref().and_then(|s| s.sender()) {
        Some(tx) => Route::Ring(tx),
        None => Route::NoRing,
    };
    let started = match (kept, wanted) {
        (Some(c), _) => {
            c.set_route(route());
            Ok(Some(c))
        }
        (None, Some(p)) => {
            ControlServer::start(p, route(), settings.pipeline.pause.clone()).map(Some)
        }
        (None, None) => Ok(None),
    };
    let mut control = match started {
        Ok(c) => c,
        Err(e) => {
            // Finished, the ring (still empty) is marked clean: no crash bag for the next start.
            if let Some(s) = snapshots.take() {
                s.finish();
            }
            return Err(failure(
                crate::snapshot::SnapshotError::from(e).into(),
                None,
            ));
        }
    };
    // With --recover the parent directory is a recording root (as the service uses it): the
    // budget then spans the recovered bags too, oldest first. Otherwise only this bag counts.
    //
    // Any start-up error from here on first finishes the snapshot machinery: its ring, still
    // empty, is then marked clean, so a failed start leaves no crash bag to the next one.
    let abandon =
        |snapshots: &mut Option<crate::snapshot::Snapshots>,
         control: &mut Option<crate::snapshot::control::ControlServer>| {
            // The socket first: it holds a sender of the snapshot thread's channel, and that
            // thread (joined by `finish`) ends only once every sender is gone.
            if let Some(c) = control.take() {
                c.stop();
            }
            if let Some(s) = snapshots.take() {
                s.finish();
            }
        };
    let retention = if settings.recover {
        let opened = Retention::open_root(&root, &settings.output, settings.retention.clone())
            .map(|r| r.with_upload(&settings.upload_retention))
            .and_then(|mut r| {
                // The older bags may already exceed the budget (a smaller budget after a
                // restart or reload): make room before the new bag appears, not after.
                r.before_new_bag(&root).map(|_| r)
            });
        match opened {
            Ok(r) => r,
            Err(e) => {
                abandon(&mut snapshots, &mut control);
                return Err(failure(RecordError::Pipeline(e.into()), None));
            }
        }
    } else {
        Retention::new(settings.retention.clone()).with_upload(&settings.upload_retention)
    };
    let writer = match BagWriter::create(&settings.output, settings.writer.clone()) {
        Ok(w) => w,
        Err(e) => {
            abandon(&mut snapshots, &mut control);
            return Err(failure(create_error(e), None));
        }
    };
    // From here a clean stop saves something: the first SIGINT/SIGTERM asks for it. (SIGHUP,
    // SIGUSR1 and SIGUSR2 are caught since `main_entry` began.)
    if let Err(e) = signals::install() {
        if let Err(fe) = writer.finish() {
            log::error!("{fe}");
        }
        abandon(&mut snapshots, &mut control);
        return Err(failure(RecordError::Signals(e), None));
    }
    log::info!(
        ringbag_bag:% = settings.output.display();
        "recording into {}",
        settings.output.display()
    );
    if let Some(floor) = settings.default_free_floor {
        log::info!(
            "keeping {:.1} MiB free on the bag's partition (the default floor: {} % of it or \
             1 GiB, whichever is smaller; --min-free-space 0 turns it off)",
            floor as f64 / (1u64 << 20) as f64,
            crate::retention::DEFAULT_MIN_FREE_SPACE_PERCENT
        );
    }
    let tap: Option<Box<dyn crate::pipeline::Tap>> = if settings.snapshot.active() {
        let ring = snapshots
            .as_ref()
            .map(|s| crate::snapshot::ring::RingWriter::new(s.ring.clone()));
        Some(Box::new(crate::snapshot::SnapshotTap::new(
            ring,
            settings.snapshot.policy.clone(),
            settings
                .snapshot
                .ring
                .as_ref()
                .and_then(|r| r.trigger_topic.clone()),
            snapshots.as_ref().and_then(|s| s.sender()),
            snapshots.as_mut().and_then(|s| s.take_finished()),
            snapshots.as_ref().map(|s| s.room()),
        )))
    } else {
        None
    };
    // Only the ROS interface below adds to it.
    #[allow(unused_mut)]
    let mut pipeline_cfg = settings.pipeline.clone();
    // rosbag2's `events/write_split`, with a live ROS source: the writer tells of each split
    // close over a bounded queue that the ROS interface (started below) drains.
    #[cfg(all(feature = "ros", ringbag_rosbag2_iface))]
    let split_events = match &settings.source {
        SourceSettings::Ros(_) => {
            let (tx, rx) = crate::pipeline::split_events();
            pipeline_cfg.split_events = Some(tx);
            Some(rx)
        }
        _ => None,
    };
    let pipeline = Pipeline::start_with_tap(writer, Some(retention), clock, pipeline_cfg, tap);
    let producer = pipeline.producer();
    let source = {
        let producer = producer.clone();
        let src = settings.source.clone();
        let watcher = SourceEnd::watching();
        let source_ended = watcher.ended.clone();
        std::thread::Builder::new()
            .name("ringbag-source".into())
            .spawn(move || -> Result<(), String> {
                // The main thread waits for this thread's end between its checks; wake it
                // then (also on a panic) so a finished recording is not left to the next check.
                let _end = watcher;
                match src {
                    SourceSettings::Synthetic(cfg) => {
                        generator::run(cfg, &producer);
                        Ok(())
                    }
                    #[cfg(feature = "ros")]
                    SourceSettings::Ros(opts) => match &sim {
                        Some(sim) => crate::source::ros::run_with_sim_time(&opts, producer, sim),
                        None => crate::source::ros::run(&opts, producer),
                    }
                    .map_err(|e| e.to_string()),
                }
            })
            .map(|h| (h, source_ended))
    };
    let (source, source_ended) = match source {
        Ok(h) => h,
        Err(e) => {
            let (_, summary) = pipeline.finish();
            abandon(&mut snapshots, &mut control);
            return Err(failure(
                RecordError::Source(format!("cannot start source thread: {e}")),
                Some(summary),
            ));
        }
    };
    // rosbag2's `~/snapshot` service, with a live ROS source and a ring.
    #[cfg(all(feature = "ros", ringbag_std_srvs))]
    let ros_service = match (
        &settings.source,
        snapshots.as_ref().and_then(|s| s.sender()),
    ) {
        (SourceSettings::Ros(opts), Some(tx)) => {
            match crate::snapshot::ros_service::RosSnapshotService::start(tx, &opts.node_name) {
                Ok(s) => Some(s),
                Err(e) => {
                    log::warn!("{e}; snapshots by ROS service are off (the other triggers work)");
                    None
                }
            }
        }
        _ => None,
    };
    // rosbag2's `~/pause`, `~/resume`, `~/is_paused`, `~/split_bagfile` and
    // `events/write_split`, with a live ROS source.
    #[cfg(all(feature = "ros", ringbag_rosbag2_iface))]
    let ros_iface = match (&settings.source, split_events) {
        (SourceSettings::Ros(opts), Some(events)) => {
            match crate::source::ros_iface::RosInterface::start(
                &opts.node_name,
                pipeline.pause().clone(),
                pipeline.progress(),
                events,
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    log::warn!("{e}; the recorder's ROS services and split events are off");
                    None
                }
            }
        }
        _ => None,
    };
    // The main thread only watches: signals, the source ending, the writer stopping itself.
    let progress = pipeline.progress();
    let mut last_status = std::time::Instant::now() - STATUS_INTERVAL;
    let running = Running {
        pipeline: &pipeline,
        clock: &clock_handle,
        settings: &settings,
        ring: snapshots.as_ref().map(|s| s.ring.clone()),
    };
    // A SIGUSR1 while starting has nothing to close: the previous bag was finished and the
    // first split has just opened. (A SIGUSR2 is kept: the ring exists now.)
    let _ = signals::take_rotate();
    hooks.started(&running);
    if pipeline.pause().is_paused() {
        log::info!("recording is paused: nothing is written to the bag until it is resumed");
    }
    let keys = RecordKeys::start(&settings);
    let mut requests = Requests::default();
    while !source_ended.load(std::sync::atomic::Ordering::Acquire) && !pipeline.stopping() {
        if signals::stop_requested() {
            log::info!("stop requested; writing what was accepted");
            break;
        }
        if hooks.tick(&running) {
            break;
        }
        requests.rotate(&running);
        requests.snapshot(snapshots.as_ref());
        if let Some(k) = &keys {
            k.poll(pipeline.pause());
        }
        if let Some(st) = status.as_mut() {
            if last_status.elapsed() >= STATUS_INTERVAL {
                last_status = std::time::Instant::now();
                st.update(&progress, pipeline.pause());
            }
        }
        // Woken early when the source ends (`SourceEnd`).
        std::thread::park_timeout(Duration::from_millis(20));
    }
    // The terminal gets its mode back before the summary is printed.
    drop(keys);
    hooks.finishing(&running);
    producer.request_stop();
    let source_result = source
        .join()
        .unwrap_or_else(|_| Err("source thread panicked".to_string()));
    #[cfg(all(feature = "ros", ringbag_std_srvs))]
    if let Some(s) = ros_service {
        s.stop();
    }
    // No more triggers into this recording's snapshot thread, which finishes below (and
    // ends only once the socket's sender is gone). The socket itself stops here, before the
    // pipeline finishes, unless the supervisor keeps it for the next recording (a reload).
    if let Some(c) = control {
        c.set_route(Route::Between);
        hooks.keep_control(c);
    }
    // Every source has been joined: no topic registers any more, so this list is final.
    let topics = pipeline.topic_stats();
    let (result, summary) = pipeline.finish();
    // Only now: the writer has told of its final close, which goes out before the node does.
    #[cfg(all(feature = "ros", ringbag_rosbag2_iface))]
    if let Some(s) = ros_iface {
        s.stop();
    }
    hooks.finished(&Finished {
        progress: &progress,
        topics: &topics,
        clock: &clock_handle,
        settings: &settings,
        ring: snapshots.as_ref().map(|s| s.ring.clone()),
    });
    // The writer thread has appended its last message to the ring: finish the open snapshot.
    if let Some(s) = snapshots.take() {
        let ring = s.ring.clone();
        s.finish();
        hooks.keep_ring(ring);
    }
    if let Some(st) = status.as_mut() {
        st.update(&progress, &settings.pipeline.pause);
    }
    match (result, source_result) {
        (Err(e), _) => Err(failure(e.into(), Some(summary))),
        (Ok(_), Err(e)) => Err(failure(RecordError::Source(e), Some(summary))),
        (Ok((bag, stop)), Ok(())) => Ok(RecordOutcome { bag, stop, summary }),
    }
}

/// `record`'s keyboard controls, as `ros2 bag record` has them: the space bar pauses and
/// resumes. The terminal handling (raw mode, restored on every way out) is `play`'s.
struct RecordKeys {
    /// Held for its Drop, which puts the terminal back.
    _keyboard: crate::play::keys::Keyboard,
    commands: crossbeam_channel::Receiver<crate::play::keys::Command>,
}

impl RecordKeys {
    /// None when asked not to (`--disable-keyboard-controls`, the service) or when stdin is
    /// not a terminal of ours.
    fn start(settings: &RecordSettings) -> Option<RecordKeys> {
        if !settings.keyboard_controls {
            return None;
        }
        let keyboard = crate::play::keys::Keyboard::start_keeping_sighup()?;
        // ros2 bag record says this at start (stderr, with the other log lines).
        log::info!("Press SPACE for pausing/resuming");
        let commands = keyboard.commands();
        Some(RecordKeys {
            _keyboard: keyboard,
            commands,
        })
    }

    /// Act on the keys pressed since the last turn; the arrows (play's) mean nothing here.
    fn poll(&self, pause: &crate::pipeline::PauseSwitch) {
        while let Ok(c) = self.commands.try_recv() {
            if c == crate::play::keys::Command::TogglePause {
                pause.toggle("keyboard");
            }
        }
    }
}

/// SIGUSR1 closes the open split at most once per this: a burst of SIGUSR1 would otherwise
/// close one nearly empty split per signal, and with `max_bag_files` each of those pushes a
/// split of real history out of the budget.
pub const ROTATE_MIN_GAP: Duration = Duration::from_secs(1);

/// The main loop's handling of SIGUSR1 and SIGUSR2 (the same in `record` and the daemon).
#[derive(Default)]
struct Requests {
    /// When SIGUSR1 last closed a split.
    last_rotate: Option<std::time::Instant>,
    /// SIGUSR1s skipped since the last close (reported with the next one).
    rotates_skipped: u64,
    /// SIGUSR2 without a ring was logged once; later ones are counted at debug level.
    snapshot_ignored: u64,
}

impl Requests {
    /// SIGUSR1: close the current split, unless one was closed less than
    /// [`ROTATE_MIN_GAP`] ago (then say so once per burst). The writer itself skips a split
    /// that holds no message.
    fn rotate(&mut self, run: &Running<'_>) {
        use std::sync::atomic::Ordering::Relaxed;
        if !signals::take_rotate() {
            return;
        }
        if let Some(ago) = self
            .last_rotate
            .map(|t| t.elapsed())
            .filter(|ago| *ago < ROTATE_MIN_GAP)
        {
            if self.rotates_skipped == 0 {
                log::info!(
                    "SIGUSR1: a split was closed {} ms ago; not closing another within {} s (a burst would push history out of the budget)",
                    ago.as_millis(),
                    ROTATE_MIN_GAP.as_secs()
                );
            }
            self.rotates_skipped += 1;
            return;
        }
        let bag = &run.settings.output;
        let split = bag.join(format!(
            "{}_{}.db3",
            bag.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            run.pipeline
                .progress()
                .splits
                .load(Relaxed)
                .saturating_sub(1)
        ));
        log::info!(
            ringbag_bag:% = bag.display(), ringbag_split:% = split.display();
            "SIGUSR1: closing the current split {}{}",
            split.display(),
            match std::mem::take(&mut self.rotates_skipped) {
                0 => String::new(),
                n => format!(" ({n} SIGUSR1 skipped before)"),
            }
        );
        self.last_rotate = Some(std::time::Instant::now());
        run.pipeline.request_rotate_unless_empty();
    }

    /// SIGUSR2: a snapshot, or without a ring one log line (then debug lines).
    fn snapshot(&mut self, snapshots: Option<&crate::snapshot::Snapshots>) {
        if !signals::take_snapshot_trigger() {
            return;
        }
        match snapshots {
            Some(s) => {
                log::info!("SIGUSR2: snapshot requested");
                s.trigger("sigusr2", crate::snapshot::trigger::Origin::Signal);
            }
            None => {
                self.snapshot_ignored += 1;
                if self.snapshot_ignored == 1 {
                    log::warn!("SIGUSR2: no snapshot ring configured; ignored");
                } else {
                    log::debug!(
                        "SIGUSR2: no snapshot ring configured; ignored ({} so far)",
                        self.snapshot_ignored
                    );
                }
            }
        }
    }
}

/// Held by the source thread until it ends (returns or panics): then it says so and wakes
/// the main thread, which parks between its checks. A flag rather than
/// `JoinHandle::is_finished`, which turns true only after the thread's closure has returned:
/// a main thread woken before that would find it unfinished and park again for a full turn.
struct SourceEnd {
    main: std::thread::Thread,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl SourceEnd {
    /// For the calling thread to wait on.
    fn watching() -> SourceEnd {
        SourceEnd {
            main: std::thread::current(),
            ended: Arc::default(),
        }
    }
}

impl Drop for SourceEnd {
    fn drop(&mut self) {
        self.ended.store(true, std::sync::atomic::Ordering::Release);
        self.main.unpark();
    }
}

/// Recover a ring a crashed run left under `root`, then create the new ring and start the
/// snapshot thread. None without `--snapshot-size`. With `kept` (the
/// ring of the recording before a reload): the same ring goes on when its file, size and
/// window are unchanged; otherwise the newest records that fit are copied into the new one.
fn start_snapshots(
    settings: &RecordSettings,
    root: &std::path::Path,
    clock: Arc<dyn TimeSource>,
    kept: Option<Arc<crate::snapshot::ring::Ring>>,
) -> Result<Option<crate::snapshot::Snapshots>, crate::snapshot::SnapshotError> {
    use crate::snapshot::{ring::Ring, snapshotter, Snapshots};
    let Some(rs) = &settings.snapshot.ring else {
        return Ok(None);
    };
    std::fs::create_dir_all(root).map_err(|source| crate::snapshot::ring::RingError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    // Checked again here, not only when the arguments were: a daemon's ring may have been
    // replaced since its start. A foreign or unsafe file is refused before recovery reads it.
    let path = rs.prepare(root)?;
    let capacity = Ring::capacity_for(rs.size);
    let ring = match kept {
        Some(old)
            if old.path() == path
                && old.capacity() == capacity
                && old.window_ns() == rs.window_ns =>
        {
            old.mark_running();
            log::info!(
                "snapshot ring {}: kept across the reload with its {} bytes of history",
                path.display(),
                old.head().saturating_sub(old.tail())
            );
            old
        }
        kept => {
            // A kept ring with other settings is set aside (renamed when it is at the new
            // ring's path), so that its history can be carried over into the new one.
            let old = kept.and_then(|r| set_aside(r, &path));
            // A failure to write the crash bag is logged, not fatal: recording matters more.
            let recover = snapshotter::RecoverOptions {
                writer: snapshot_writer(&settings.writer),
                retention: settings.retention.clone(),
                whole_root: settings.recover,
                upload_retention: settings.upload_retention.clone(),
                now_ns: clock.now_ns(),
            };
            if let Err(e) = snapshotter::recover(&path, root, recover) {
                log::error!("{}: cannot write the crash bag: {e}", path.display());
            }
            let ring = match (Ring::create(&path, capacity, rs.window_ns), old) {
                (Ok(r), old) => {
                    let ring = Arc::new(r);
                    if let Some((old, old_path)) = old {
                        carry_over(&old, &ring);
                        drop(old);
                        let _ = std::fs::remove_file(&old_path);
                    }
                    ring
                }
                (Err(e), Some((old, old_path))) => {
                    // No room for both at once: the old history goes, the new ring comes.
                    log::warn!(
                        "{}: {e}; the previous ring's history is dropped to make room",
                        path.display()
                    );
                    drop(old);
                    let _ = std::fs::remove_file(&old_path);
                    Arc::new(Ring::create(&path, capacity, rs.window_ns)?)
                }
                (Err(e), None) => return Err(e.into()),
            };
            log::info!(
                "snapshot ring {}: {} bytes{}",
                path.display(),
                ring.capacity(),
                if rs.window_ns > 0 {
                    format!(", at most {} s", rs.window_ns as f64 / 1e9)
                } else {
                    String::new()
                }
            );
            ring
        }
    };
    if let Some(max) = settings.retention.max_record_size {
        // What the continuous recording keeps for itself (a split, a batch, an empty split and
        // reserves) is not the snapshot's: a ring that holds more is cut short at a trigger.
        let room = max.saturating_sub(
            settings.writer.max_bag_size + settings.pipeline.batch_max_bytes as u64 + (256 << 10),
        );
        if ring.capacity() > room {
            log::warn!(
                "snapshot ring {}: {} bytes, more than --max-record-size {max} leaves a snapshot \
                 beside the continuous recording (about {room} bytes): a snapshot that needs \
                 more is cut short, with a warning",
                path.display(),
                ring.capacity()
            );
        }
    }
    let cfg = snapshotter::Config {
        root: root.to_path_buf(),
        writer: snapshot_writer(&settings.writer),
        clock,
        finished: None,
        room: None,
        batch_bytes: settings.pipeline.batch_max_bytes,
    };
    match Snapshots::start(ring.clone(), cfg) {
        Ok(s) => Ok(Some(s)),
        Err(e) => {
            // The start fails (e.g. the control socket cannot be bound) with the ring still
            // empty: left "running", the next start would write an empty crash bag for it.
            ring.mark_clean();
            Err(e)
        }
    }
}

/// A ring kept across a reload whose settings changed: out of the new ring's way. Returns it
/// with the path its file has now (to delete once its records are copied), or None when it
/// cannot be moved (then it is dropped, and its file is replaced by the new ring).
fn set_aside(
    old: Arc<crate::snapshot::ring::Ring>,
    new_path: &std::path::Path,
) -> Option<(Arc<crate::snapshot::ring::Ring>, PathBuf)> {
    if old.path() != new_path {
        return Some((old.clone(), old.path().to_path_buf()));
    }
    let mut aside = new_path.as_os_str().to_owned();
    aside.push(".reload");
    let aside = PathBuf::from(aside);
    // The mapping and the lock belong to the open file, not its name: renaming keeps both.
    match std::fs::rename(new_path, &aside) {
        Ok(()) => Some((old, aside)),
        Err(e) => {
            log::warn!(
                "{}: cannot set the previous ring aside ({e}); its history is dropped",
                new_path.display()
            );
            None
        }
    }
}

/// Copy the records of `old` into the new ring, oldest first: the new ring's own size and
/// window evict what does not fit, so it keeps the newest history that fits.
fn carry_over(old: &crate::snapshot::ring::Ring, new: &Arc<crate::snapshot::ring::Ring>) {
    use crate::snapshot::ring::{scan, RingWriter};
    let mut w = RingWriter::new(new.clone());
    let ids: Vec<Option<u32>> = old
        .topics()
        .into_iter()
        .map(|t| w.add_topic(t).ok())
        .collect();
    let (records, _) = scan(old, |head, data| {
        if let Some(Some(id)) = ids.get(head.topic as usize) {
            let _ = w.append(*id, head.ts, data);
        }
    });
    log::info!(
        "snapshot ring {}: settings changed on reload; the previous ring's {records} records copied, {} bytes of the newest kept",
        new.path().display(),
        new.head().saturating_sub(new.tail())
    );
}

const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// `--status-file` and whether its last write failed: a failure is logged once, the return to
/// normal once, and a new failure after that once again (not every 100 ms).
struct StatusFile<'a> {
    path: &'a std::path::Path,
    failing: bool,
}

impl<'a> StatusFile<'a> {
    fn new(path: &'a std::path::Path) -> Self {
        StatusFile {
            path,
            failing: false,
        }
    }

    fn update(&mut self, p: &crate::pipeline::Progress, pause: &crate::pipeline::PauseSwitch) {
        use std::sync::atomic::Ordering::Relaxed;
        let r = write_status_counts(
            self.path,
            p.committed.load(Relaxed),
            p.splits.load(Relaxed),
            pause,
        );
        match (r, self.failing) {
            (Ok(()), true) => {
                self.failing = false;
                log::info!("status file {}: written again", self.path.display());
            }
            (Err(e), false) => {
                self.failing = true;
                log::warn!(
                    "status file {}: cannot write it: {}; retrying quietly",
                    self.path.display(),
                    io_reason(&e)
                );
            }
            _ => {}
        }
    }
}

/// The problem without the path (the caller names the file the user gave, not a temp name).
fn io_reason(e: &BagError) -> String {
    match e {
        BagError::Io { source, .. } => source.to_string(),
        BagError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// `--status-file`: replaced atomically, so a reader (or a test that kills us) always sees a
/// complete object whose count is already in the bag.
fn write_status_counts(
    path: &std::path::Path,
    committed: u64,
    splits: u64,
    pause: &crate::pipeline::PauseSwitch,
) -> Result<(), BagError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| BagError::invalid(path, "needs a file name in UTF-8"))?;
    let text = format!(
        "{{\"committed\": {committed}, \"splits\": {splits}, \"paused\": {}, \"paused_messages\": {}}}\n",
        pause.is_paused(),
        pause.messages()
    );
    crate::bag::metadata::write_file_atomic(dir, name, text.as_bytes())
}

/// The recording's writer options for a snapshot bag: the same but plain splits. A snapshot
/// is written on the snapshotter's thread inside the room retention granted it, which does
/// not cover a compression's second copy of a split (`--compression-mode file` applies to the
/// continuous recording only).
fn snapshot_writer(w: &WriterOptions) -> WriterOptions {
    WriterOptions {
        compression: None,
        ..w.clone()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn snapshot_bags_are_written_plain_whatever_the_recording_compresses() {
        let mut w = super::WriterOptions::new(crate::bag::Flavour::Jazzy);
        w.max_bag_size = 1 << 20;
        w.compression = Some(crate::bag::filemode::FileCompression {
            per_message: false,
            threads: 1,
            queue_size: 1,
            level: 1,
        });
        let s = super::snapshot_writer(&w);
        assert_eq!(s.compression, None);
        assert_eq!(s.max_bag_size, 1 << 20);
    }
    use super::SourceEnd;
    use std::sync::atomic::Ordering::Acquire;
    use std::time::{Duration, Instant};

    /// How the main thread waits for the source (`run`'s loop), with a nap far longer than
    /// any test should take: a source end that did not wake it would show as a full nap.
    fn wait_for(source: impl FnOnce(SourceEnd) + Send + 'static) {
        let nap = Duration::from_secs(30);
        let watcher = SourceEnd::watching();
        let ended = watcher.ended.clone();
        assert!(!ended.load(Acquire));
        let t = Instant::now();
        let h = std::thread::spawn(move || source(watcher));
        // Bounded, so that a source end that never says so fails instead of hanging.
        while !ended.load(Acquire) && t.elapsed() < 2 * nap {
            std::thread::park_timeout(nap);
        }
        let waited = t.elapsed();
        let _ = h.join();
        assert!(ended.load(Acquire), "the source's end was never said");
        assert!(
            waited < nap,
            "the main thread slept a whole nap ({waited:?}) after the source ended"
        );
    }

    #[test]
    fn the_main_thread_is_woken_when_the_source_ends_or_panics() {
        wait_for(drop);
        wait_for(|end| {
            let _end = end;
            panic!("a source that panics still says it ended");
        });
    }
}
