//! `ringbag play`: read a bag in time order and hand each message to a sink at the pace it
//! was recorded (scaled by `--rate`), with `ros2 bag play`'s flags and keyboard controls.
//!
//! * `plan`: which topics play, under which names (`--remap`) and QoS, and `/clock`;
//!   decided before anything is read, so conflicts are bad input.
//! * `reader`: a thread reading the bag's time-ordered merge into a queue bounded in
//!   messages and bytes; damaged splits are skipped with a warning.
//! * `schedule`: the scheduler, on the calling thread: coarse sleep, then a spin for the last
//!   200 µs on CLOCK_MONOTONIC; pause, step, rate, loop, `/clock`.
//! * `sink`: `echo` (lines with the send time, for checking timing) or `ros` (feature `ros`).
//! * `keys`: the keyboard controls on a terminal.

pub mod keys;
pub mod plan;
mod reader;
mod schedule;
pub mod sink;

use std::collections::HashSet;
use std::path::PathBuf;

use crossbeam_channel::Receiver;

use crate::bag::metadata::NO_START;
use crate::bag::reader::{Bag, ReadFilter};
use crate::bag::BagError;
use crate::source::select::QosOverrides;

pub use keys::{Command, Keyboard};
pub use plan::{PlayTopic, Selection};
#[cfg(feature = "ros")]
pub use sink::RosSink;
pub use sink::{monotonic_ns, EchoFormat, EchoSink, Sink, SinkError};

/// `--read-ahead-queue-size`, as ros2 bag play.
pub const DEFAULT_READ_AHEAD_MESSAGES: usize = 1000;
/// `--read-ahead-queue-bytes`: about 20 images of 6 MB, so a bag of large messages keeps
/// playing through a slow read of a second or so without holding gigabytes.
pub const DEFAULT_READ_AHEAD_BYTES: u64 = 128 << 20;
/// `--clock` without a value, as ros2 bag play.
pub const DEFAULT_CLOCK_HZ: f64 = 40.0;

#[derive(Debug, Clone)]
pub struct PlaySettings {
    pub bag: PathBuf,
    pub selection: Selection,
    /// `--remap` as normalized (old, new) pairs.
    pub remap: Vec<(String, String)>,
    /// Playback speed factor; 2.0 plays twice as fast.
    pub rate: f64,
    /// Skip this much of the bag's start.
    pub start_offset_ns: i64,
    pub loop_playback: bool,
    /// Play at most this much bag time from the start (after the offset).
    pub playback_duration_ns: Option<i64>,
    /// Play messages recorded up to this time (ns since the epoch, inclusive).
    pub playback_until_ns: Option<i64>,
    /// Wait this long before the first message.
    pub delay_ns: i64,
    pub start_paused: bool,
    pub read_ahead_messages: usize,
    pub read_ahead_bytes: u64,
    /// Publish `/clock` at this rate.
    pub clock_hz: Option<f64>,
    /// Publish `/clock` with a message's time right before it (`--clock-topics[-all]`).
    pub clock_before: ClockBefore,
    /// Per-topic publisher QoS, by the bag's topic name.
    pub qos_overrides: QosOverrides,
    /// Run the scheduler thread SCHED_FIFO at this priority (1..=99).
    pub rt_priority: Option<i32>,
    /// `ringbag burst`: publish as fast as the sink takes them, without timing, at most this
    /// many messages (0 = all), as `ros2 bag burst --num-messages`. `None`: timed play.
    pub burst: Option<u64>,
}

/// `--clock-topics` / `--clock-topics-all`: which played messages `/clock` is updated for,
/// just before each (with the message's recorded time), as ros2 bag play does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClockBefore {
    #[default]
    Never,
    /// These topics of the bag (its names, before `--remap`).
    Topics(Vec<String>),
    /// Every message.
    All,
}

impl ClockBefore {
    /// Per topic of the bag (in `topics`' order): whether `/clock` precedes its messages.
    fn per_topic(&self, topics: &[crate::bag::TopicInfo]) -> Vec<bool> {
        match self {
            ClockBefore::Never => Vec::new(),
            ClockBefore::All => vec![true; topics.len()],
            ClockBefore::Topics(names) => {
                for n in names
                    .iter()
                    .filter(|n| !topics.iter().any(|t| &t.name == *n))
                {
                    log::warn!("--clock-topics: the bag has no topic {n}");
                }
                topics.iter().map(|t| names.contains(&t.name)).collect()
            }
        }
    }
}

impl PlaySettings {
    /// Everything as `ringbag play BAG` without options.
    pub fn new(bag: impl Into<PathBuf>) -> Self {
        PlaySettings {
            bag: bag.into(),
            selection: Selection::default(),
            remap: Vec::new(),
            rate: 1.0,
            start_offset_ns: 0,
            loop_playback: false,
            playback_duration_ns: None,
            playback_until_ns: None,
            delay_ns: 0,
            start_paused: false,
            read_ahead_messages: DEFAULT_READ_AHEAD_MESSAGES,
            read_ahead_bytes: DEFAULT_READ_AHEAD_BYTES,
            clock_hz: None,
            clock_before: ClockBefore::Never,
            qos_overrides: QosOverrides::new(),
            rt_priority: None,
            burst: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    /// The bag could not be opened (missing, corrupt, hostile).
    #[error(transparent)]
    Bag(#[from] BagError),
    /// The settings do not fit this bag (an offset past its end, a remap conflict, ...).
    #[error("{0}")]
    BadInput(String),
    /// Reading failed while playing.
    #[error("{0}")]
    Read(BagError),
    #[error("sink: {0}")]
    Sink(String),
    /// Writing the sink's output failed; the message names it (`stdout: ...`).
    #[error("{0}")]
    Output(String),
}

impl PlayError {
    /// Exit 2 rather than 1: nothing was wrong with the machine, only with what was asked.
    pub fn is_bad_input(&self) -> bool {
        match self {
            // No file descriptor left is the machine's failure, not the bag's.
            PlayError::Bag(e) => !e.is_out_of_descriptors(),
            PlayError::BadInput(_) => true,
            _ => false,
        }
    }
}

/// Counts of a play run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlayReport {
    /// Messages of the bag published (`/clock` not counted).
    pub published: u64,
    pub loops: u64,
}

/// Open `settings.bag` (what is readable of it; skipped splits are logged) and play it into
/// `sink` until the end (or forever with loop), or `stop()` is true. No keyboard controls.
pub fn play(
    settings: &PlaySettings,
    sink: &mut dyn Sink,
    stop: &dyn Fn() -> bool,
) -> Result<PlayReport, PlayError> {
    let (bag, skipped) = Bag::open_tolerant(&settings.bag)?;
    for s in &skipped {
        log::warn!("skipped {s}");
    }
    play_bag(&bag, &skipped_paths(&skipped), settings, sink, stop, None)
}

/// The paths of splits [`Bag::open_tolerant`] left out (already reported, never again).
pub fn skipped_paths(skipped: &[crate::bag::reader::Skipped]) -> HashSet<PathBuf> {
    skipped.iter().map(|s| s.path.clone()).collect()
}

/// A time since the epoch as exact seconds, e.g. `1700000000.100000000 s`.
fn epoch_secs(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:09} s", a / 1_000_000_000, a % 1_000_000_000)
}

fn secs(ns: i64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// [`play`] on a bag that is already open (`settings.bag` is not read). `commands` are the
/// keyboard controls, if any; `reported` the skipped splits already warned about.
pub fn play_bag(
    bag: &Bag,
    reported: &HashSet<PathBuf>,
    settings: &PlaySettings,
    sink: &mut dyn Sink,
    stop: &dyn Fn() -> bool,
    commands: Option<Receiver<Command>>,
) -> Result<PlayReport, PlayError> {
    if settings.start_paused && commands.is_none() {
        return Err(PlayError::BadInput(
            "--start-paused needs the keyboard controls (stdin is not a terminal, or \
             --disable-keyboard-controls): nothing could resume playback"
                .into(),
        ));
    }
    let meta = &bag.metadata;
    // What the splits hold (their first and last rows when the bag was opened) decides what
    // plays, not metadata.yaml's summary: a message stamped before its start, or after its
    // end, plays too, with one warning that the summary is wrong.
    let first = bag.splits.iter().filter_map(|s| s.first_ns).min();
    let last = bag.splits.iter().filter_map(|s| s.last_ns).max();
    let (Some(first), Some(last)) = (first, last) else {
        log::warn!("{}: holds no messages; nothing to play", bag.path.display());
        return Ok(PlayReport::default());
    };
    let listed_end = meta.end_time_ns();
    if first < meta.starting_time_ns || (meta.starting_time_ns != NO_START && last > listed_end) {
        log::warn!(
            "{}: metadata.yaml says the bag spans {} to {}, but its splits hold messages from              {} to {}; playing every message (`ringbag reindex` rewrites metadata.yaml)",
            bag.path.display(),
            epoch_secs(meta.starting_time_ns),
            epoch_secs(listed_end),
            epoch_secs(first),
            epoch_secs(last)
        );
    }
    let bag_start = first.min(meta.starting_time_ns);
    let bag_end = if meta.starting_time_ns == NO_START {
        last
    } else {
        last.max(listed_end)
    };
    let bag_duration = bag_end.saturating_sub(bag_start);
    if settings.start_offset_ns > bag_duration {
        return Err(PlayError::BadInput(format!(
            "--start-offset {}: past the end of the bag ({} long)",
            secs(settings.start_offset_ns),
            secs(bag_duration)
        )));
    }
    let start = bag_start.saturating_add(settings.start_offset_ns);
    if let Some(until) = settings.playback_until_ns {
        if until < start {
            return Err(PlayError::BadInput(format!(
                "--playback-until: {} is before the start of playback ({}: the bag's start{})",
                epoch_secs(until),
                epoch_secs(start),
                if settings.start_offset_ns > 0 {
                    " + --start-offset"
                } else {
                    ""
                }
            )));
        }
    }
    let end = [
        settings.playback_until_ns,
        settings
            .playback_duration_ns
            .map(|d| start.saturating_add(d)),
    ]
    .into_iter()
    .flatten()
    .min();
    let plan = plan::plan(
        &bag.topics,
        &settings.selection,
        &settings.remap,
        &settings.qos_overrides,
        settings.clock_hz.is_some() || settings.clock_before != ClockBefore::Never,
    )
    .map_err(|e| PlayError::BadInput(e.to_string()))?;
    let clock_before = settings.clock_before.per_topic(&bag.topics);
    for w in &plan.warnings {
        log::warn!("{w}");
    }
    if plan.plays_nothing() {
        let list: Vec<String> = bag
            .topics
            .iter()
            .map(|t| format!("{} [{}]", t.name, t.type_name))
            .collect();
        log::warn!(
            "no topic of the bag matches {}; nothing played. The bag's topics: {}",
            if settings.selection.is_filtering() {
                "the topic filters"
            } else {
                "the selection"
            },
            list.join(", ")
        );
        return Ok(PlayReport::default());
    }
    sink.prepare(&plan.topics).map_err(|e| match e {
        SinkError::Closed => PlayError::Sink("output closed before playing".into()),
        SinkError::Failed(e) => PlayError::Sink(e),
        SinkError::Output(e) => PlayError::Output(e),
    })?;
    let read_topics = plan.read_topics(&bag.topics);
    let filter = ReadFilter {
        topics: (read_topics.len() < bag.topics.len()).then_some(read_topics),
        // Without an offset, every row plays: also one stamped before the first row seen
        // when the bag was opened (a live split's rows, a clock stepped back).
        start_ns: (settings.start_offset_ns > 0).then_some(start),
        end_ns: end,
    };
    let queue = reader::ReadAhead::new(settings.read_ahead_messages, settings.read_ahead_bytes);
    let now = monotonic_ns();
    let timeline = schedule::Timeline {
        anchor_wall: now.saturating_add(settings.delay_ns),
        anchor_bag: start,
        rate: settings.rate,
        paused: settings.start_paused.then_some(start),
    };
    let span = schedule::Span {
        bag_start,
        bag_duration,
        play_start: start,
        play_end: end.unwrap_or(i64::MAX).min(bag_end),
    };
    let clock_period_ns = settings.clock_hz.map(|hz| ((1e9 / hz) as i64).max(1));
    std::thread::scope(|scope| {
        let job = reader::ReadJob {
            bag,
            filter,
            loop_playback: settings.loop_playback,
            reported: reported.clone(),
            rt_priority: settings.rt_priority,
        };
        let queue = &queue;
        let reader = std::thread::Builder::new()
            .name("play-reader".into())
            .spawn_scoped(scope, move || {
                let path = job.bag.path.clone();
                // A reader that dies must not leave the scheduler waiting for items forever.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    reader::read_into(job, queue)
                }));
                if r.is_err() {
                    queue.push(reader::Item::Failed(BagError::invalid(
                        path,
                        "the reader thread failed (panicked); playback stopped",
                    )));
                }
            })
            .map_err(|e| PlayError::Sink(format!("cannot start the reader thread: {e}")))?;
        let keys = commands.is_some();
        let mut scheduler = schedule::Scheduler::new(
            sink,
            &plan,
            queue,
            commands,
            stop,
            timeline,
            span,
            clock_period_ns,
            settings.rt_priority,
        );
        scheduler.clock_before = clock_before;
        scheduler.burst = settings.burst;
        if keys {
            eprintln!(
                "ringbag: keys: space pause/resume, right arrow next message (while paused), up/down rate +/-10%"
            );
            if settings.start_paused {
                scheduler.status("paused (--start-paused)");
            }
        }
        let r = scheduler.run();
        queue.close();
        let _ = reader.join();
        r
    })
}
