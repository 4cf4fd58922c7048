//! The snapshot thread: takes triggers, cuts windows out of the ring into new bags, off the
//! writer thread (which keeps appending to the ring meanwhile). Also the crash bag written at
//! start from a ring a dead recorder left.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::ring::{PendingTrigger, Ring, RingTopic, Step};
use super::trigger::{
    bounded_reason, escape_reason, reason_for_name, Decision, Origin, Outcome, Planner,
    TriggerRequest, Window,
};
use crate::bag::writer::{row_growth_bytes, BagWriter, Row, WriterOptions};
use crate::bag::{BagError, Flavour};
use crate::clock::TimeSource;
use crate::pipeline::{Answer, Room};
use crate::retention::{
    rows_disk_growth, Retention, RetentionError, RetentionPolicy, Verdict, BAG_DIR_RESERVE_BYTES,
    MIN_EMPTY_SPLIT_BYTES,
};

/// Wait this long past a snapshot's end before closing it: messages stamped before the end
/// may still be in the recorder's queue or batch (the batch delay is 50 ms).
const CLOSE_GRACE_NS: i64 = 300_000_000;
/// Rows per bag transaction while recovering a crashed ring (bytes); a live snapshot uses the
/// recording's batch cap ([`Config::batch_bytes`]).
const COPY_BATCH_BYTES: usize = 16 << 20;
/// How long a snapshot waits for the writer thread to make room before it gives up (the
/// writer answers at every turn, within milliseconds unless its storage stalls).
const ROOM_WAIT: Duration = Duration::from_secs(10);
/// Ring bytes one copy call scans before the thread looks for triggers again.
const COPY_SCAN_BYTES: u64 = 16 << 20;

/// A request to the snapshot thread.
pub enum Cmd {
    Trigger {
        req: TriggerRequest,
        origin: Origin,
        /// The trigger's time (a trigger topic's message stamp); None = when it was asked
        /// for (the ticket's), else now.
        at_ns: Option<i64>,
        reply: Option<Sender<Outcome>>,
        /// A requester that waits for the answer a bounded time (the control socket).
        ticket: Option<Ticket>,
    },
}

/// A trigger that is answered within a deadline: whoever comes first, the snapshot thread
/// taking it or the requester giving up on it, decides. So a trigger reported as failed
/// never happens later, and one that happens is always reported.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// When the trigger was asked for (its client's send time, or when the request was
    /// complete): the trigger's time.
    pub asked: Instant,
    state: Arc<AtomicU8>,
}

const TICKET_OPEN: u8 = 0;
const TICKET_TAKEN: u8 = 1;
const TICKET_ABANDONED: u8 = 2;

impl Ticket {
    pub fn new() -> Ticket {
        Ticket::sent_ago(Duration::ZERO)
    }

    /// A ticket for a trigger asked for `age` ago (a control socket request's age, from its
    /// send time): the snapshot thread stamps it `age` before now on the recorder's clock.
    pub fn sent_ago(age: Duration) -> Ticket {
        let now = Instant::now();
        Ticket {
            asked: now.checked_sub(age).unwrap_or(now),
            state: Arc::new(AtomicU8::new(TICKET_OPEN)),
        }
    }

    /// The snapshot thread: true when the trigger may be acted on (not abandoned).
    pub fn take(&self) -> bool {
        self.state
            .compare_exchange(TICKET_OPEN, TICKET_TAKEN, SeqCst, SeqCst)
            .is_ok()
    }

    /// The requester: true when the trigger will now never be acted on; false when the
    /// snapshot thread has already taken it (its answer is on the way).
    pub fn abandon(&self) -> bool {
        self.state
            .compare_exchange(TICKET_OPEN, TICKET_ABANDONED, SeqCst, SeqCst)
            .is_ok()
    }
}

impl Default for Ticket {
    fn default() -> Self {
        Ticket::new()
    }
}

/// At most one "extends snapshot" info line per this long; the others are counted into the
/// next line (a trigger storm must not flood the journal).
const EXTEND_LOG_EVERY: Duration = Duration::from_secs(1);

/// What the snapshot thread needs.
pub struct Config {
    pub root: PathBuf,
    /// Flavour, preset and split size of snapshot bags (those of the continuous bag).
    pub writer: WriterOptions,
    pub clock: Arc<dyn TimeSource>,
    /// Told of every finished snapshot bag (the writer thread's retention adopts them).
    pub finished: Option<Sender<PathBuf>>,
    /// Where the snapshot bag asks the writer thread for room on the budget before each
    /// batch (None: no budget to keep, e.g. unit tests).
    pub room: Option<Arc<Room>>,
    /// Bytes of ring records per bag transaction: the recording's batch cap, so the room
    /// asked for at a time is small next to the budget.
    pub batch_bytes: usize,
}

/// What a finished snapshot holds (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub messages: u64,
    /// Records overwritten in the ring before they could be copied (the bag writer was slower
    /// than the ring wrapped), as bytes of the ring skipped.
    pub evicted_bytes: u64,
    pub damaged: u64,
    /// Records whose topic id the ring's topic table does not name (they cannot be written).
    pub unnamed: u64,
    /// Records passed over for their stamp (outside the window; at recovery: implausible).
    pub out_of_range: u64,
    /// Records left out because the budget could not hold them (recovery only).
    pub over_budget: u64,
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
}

/// Where a copy call stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    /// At the ring's head: nothing more to copy yet.
    Head,
    /// Past the window's end (with grace): the snapshot is complete.
    PastEnd,
    /// Its byte budget used up: call again.
    Budget,
    /// No room for more on the budget or the partition: the snapshot ends here.
    Cut,
}

/// A bag's asks for room on the budget, and what it was granted so far.
struct RoomClient {
    room: Arc<Room>,
    /// Bytes the bag may occupy (0 until first granted).
    granted: u64,
}

/// Bytes a bag directory occupies as `du` counts it: every file in it, plus the directory.
fn dir_bytes(dir: &Path) -> u64 {
    let files: u64 = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    files + BAG_DIR_RESERVE_BYTES
}

impl RoomClient {
    /// May the bag in `dir` grow by up to `growth` bytes? Asks the writer thread when that
    /// goes beyond what was granted, `step` more so the next batches need no question.
    /// `Err(why)`: the snapshot must end.
    fn make_room(&mut self, dir: &Path, growth: u64, step: u64) -> Result<(), String> {
        let on_disk = dir_bytes(dir);
        self.room.report_on_disk(on_disk);
        let need = on_disk + growth;
        if need <= self.granted {
            return Ok(());
        }
        let mut ask = need + step;
        loop {
            match self.room.ask(ask, on_disk, ROOM_WAIT) {
                Answer::Granted => {
                    self.granted = ask;
                    return Ok(());
                }
                // Perhaps the exact need still fits.
                Answer::Refused(_) if ask > need => ask = need,
                Answer::Refused(why) => return Err(why),
                Answer::WriterGone if !self.room.bounded() => {
                    // No budget to keep: only the partition must not fill.
                    let free = nix::sys::statvfs::statvfs(dir.parent().unwrap_or(dir))
                        .map(|st| {
                            #[allow(clippy::unnecessary_cast)] // 32-bit on some targets
                            let f = st.blocks_available() as u64 * st.fragment_size() as u64;
                            f
                        })
                        .unwrap_or(u64::MAX);
                    let growth = need - on_disk;
                    if free < growth + crate::pipeline::DISK_RESERVE_BYTES {
                        return Err(format!(
                            "only {free} bytes free on the partition, {growth} needed"
                        ));
                    }
                    self.granted = need;
                    return Ok(());
                }
                Answer::WriterGone => {
                    // The recording has ended: its bag no longer grows, but nothing deletes
                    // any more either, so the snapshot keeps to the room it was given.
                    return Err(
                        "the recording stopped; nothing is deleted to make more room".into(),
                    );
                }
            }
        }
    }

    /// The bag is finished (and handed to retention) or removed: give its room back.
    fn release(&mut self) {
        if self.granted > 0 {
            self.granted = 0;
            let _ = self.room.ask(0, 0, ROOM_WAIT);
        }
    }
}

/// Copies records from a ring into a bag: ring topic ids → bag topic indexes, batches.
struct Copier {
    topic_idx: Vec<Option<usize>>,
    /// The topic table as read once (recovery: the dead run's table cannot change, and
    /// re-reading it per unknown id would parse it per record); None: read it when an id is
    /// new (a live ring gains topics).
    topics: Option<Vec<RingTopic>>,
    arena: Vec<u8>,
    rows: Vec<(usize, i64, usize, usize)>,
    buf: Vec<u8>,
    stats: CopyStats,
    /// Rows are written when this many bytes are buffered.
    batch_bytes: usize,
    /// The root's budget (recovery): rows go in as the pipeline writes them, with retention
    /// between splits and before every commit. None: no budget to consult (a live snapshot is
    /// counted by the recording's own retention while it is written).
    budget: Option<Retention>,
    /// Why the budget stopped the copy (the rest was not written).
    halted: Option<String>,
    /// (bag topic, stamp, data CRC) of rows already written from an unfinished snapshot bag
    /// (recovery): the ring's copy of each is left out once. Bounded by that bag's rows.
    merged: std::collections::HashSet<(usize, i64, u32)>,
    room: Option<RoomClient>,
    /// Why the copy stopped short of its window, once it has.
    cut: Option<String>,
}

/// Damaged records logged one by one before they are only counted (a ring of garbage must
/// not flood the journal).
const DAMAGED_LOGGED: u64 = 10;

impl Copier {
    fn new() -> Self {
        Copier {
            topic_idx: Vec::new(),
            topics: None,
            arena: Vec::new(),
            rows: Vec::new(),
            buf: Vec::new(),
            stats: CopyStats::default(),
            batch_bytes: COPY_BATCH_BYTES,
            budget: None,
            halted: None,
            merged: std::collections::HashSet::new(),
            room: None,
            cut: None,
        }
    }

    /// A copier that asks `room` before each batch and batches `batch_bytes` at most.
    fn with_room(room: Option<Arc<Room>>, batch_bytes: usize) -> Self {
        Copier {
            batch_bytes: batch_bytes.clamp(64 << 10, COPY_BATCH_BYTES),
            room: room.map(|room| RoomClient { room, granted: 0 }),
            ..Copier::new()
        }
    }

    fn bag_topic(
        &mut self,
        ring: &Ring,
        bag: &mut BagWriter,
        id: u32,
    ) -> Result<Option<usize>, BagError> {
        if let Some(Some(i)) = self.topic_idx.get(id as usize) {
            return Ok(Some(*i));
        }
        let read;
        let topics = match &self.topics {
            Some(t) => t,
            None => {
                read = ring.topics();
                &read
            }
        };
        let Some(t) = topics.get(id as usize) else {
            return Ok(None);
        };
        let idx = bag.add_topic(t.info(), t.definition())?;
        if self.topic_idx.len() <= id as usize {
            self.topic_idx.resize(id as usize + 1, None);
        }
        self.topic_idx[id as usize] = Some(idx);
        Ok(Some(idx))
    }

    /// Copy records from `*cursor` up to the ring's head whose stamps are in `[start, end]`,
    /// at most about `budget_bytes` of the ring per call (so triggers are answered between
    /// calls).
    fn copy(
        &mut self,
        ring: &Ring,
        bag: &mut BagWriter,
        cursor: &mut u64,
        start: i64,
        end: i64,
        budget_bytes: u64,
    ) -> Result<Copied, BagError> {
        let mut scanned = 0u64;
        let mut result = Copied::Budget;
        while scanned < budget_bytes && self.halted.is_none() {
            let step = ring.read_if(*cursor, &mut self.buf, |h| h.ts >= start && h.ts <= end);
            match step {
                Step::Skipped { head, next } => {
                    scanned += next - *cursor;
                    *cursor = next;
                    self.stats.out_of_range += 1;
                    // Stamps are receive times, ordered to within the writer's batching: a
                    // record this far past the end means nothing later belongs in the window.
                    if head.ts > end.saturating_add(CLOSE_GRACE_NS) {
                        result = Copied::PastEnd;
                        break;
                    }
                }
                Step::Record { head, next } => {
                    scanned += next - *cursor;
                    *cursor = next;
                    let Some(idx) = self.bag_topic(ring, bag, head.topic)? else {
                        self.stats.unnamed += 1;
                        continue;
                    };
                    if !self.merged.is_empty()
                        && self
                            .merged
                            .remove(&(idx, head.ts, crc32fast::hash(&self.buf)))
                    {
                        continue; // Already in the bag, from the unfinished snapshot.
                    }
                    let at = self.arena.len();
                    self.arena.extend_from_slice(&self.buf);
                    self.rows.push((idx, head.ts, at, self.buf.len()));
                    if self.arena.len() >= self.batch_bytes && !self.flush(bag)? {
                        return Ok(Copied::Cut);
                    }
                }
                Step::Evicted { tail } => {
                    if self.stats.evicted_bytes == 0 {
                        log::warn!(
                            "{}: the ring overwrote records before the snapshot copied them (the bag is written slower than the ring wraps); skipping ahead",
                            ring.path().display()
                        );
                    }
                    self.stats.evicted_bytes += tail.saturating_sub(*cursor);
                    *cursor = tail;
                }
                Step::End => {
                    result = Copied::Head;
                    break;
                }
                Step::Damaged { next, why } => {
                    self.stats.damaged += 1;
                    if self.stats.damaged <= DAMAGED_LOGGED {
                        log::warn!("{}: {why}; skipped", ring.path().display());
                    }
                    match next {
                        Some(p) => *cursor = p,
                        None => {
                            *cursor = ring.head();
                        }
                    }
                }
            }
        }
        if !self.flush(bag)? {
            return Ok(Copied::Cut);
        }
        if self.halted.is_some() {
            // The budget cannot take more: nothing else will be written.
            return Ok(Copied::Head);
        }
        Ok(result)
    }

    /// Write the batched rows; false (nothing written) when there is no room for them.
    fn flush(&mut self, bag: &mut BagWriter) -> Result<bool, BagError> {
        if self.rows.is_empty() {
            return Ok(true);
        }
        if let Some(room) = self.room.as_mut() {
            let growth = batch_disk_growth(bag, &self.rows);
            if let Err(why) = room.make_room(bag.dir(), growth, self.batch_bytes as u64) {
                self.cut = Some(why);
                self.rows.clear();
                self.arena.clear();
                return Ok(false);
            }
        }
        let arena = &self.arena;
        let rows: Vec<Row> = self
            .rows
            .iter()
            .map(|&(idx, ts, at, len)| (idx, ts, &arena[at..at + len]))
            .collect();
        let written = match self.budget.as_mut() {
            None => {
                bag.write_batch(rows.iter().copied())?;
                rows.clone()
            }
            Some(ret) => match write_budgeted(bag, ret, &rows, &mut self.stats.over_budget) {
                Ok(w) => w,
                Err(Halt::Bag(e)) => return Err(e),
                Err(Halt::Stop(why, w)) => {
                    self.halted = Some(why);
                    w
                }
            },
        };
        self.stats.messages += written.len() as u64;
        if !written.is_empty() {
            let (lo, hi) = written.iter().fold((i64::MAX, i64::MIN), |(lo, hi), r| {
                (lo.min(r.1), hi.max(r.1))
            });
            self.stats.first_ns = Some(self.stats.first_ns.map_or(lo, |f| f.min(lo)));
            self.stats.last_ns = Some(self.stats.last_ns.map_or(hi, |l| l.max(hi)));
        }
        drop(rows);
        self.rows.clear();
        self.arena.clear();
        Ok(true)
    }
}

/// An empty split's footprint with `page`-byte pages: six pages (schema and topics) and
/// sidecars, with slack; at least the recorder's own fallback reserve.
fn empty_split_bytes(page: u64) -> u64 {
    MIN_EMPTY_SPLIT_BYTES.max(8 * page)
}

/// Worst-case bytes a batch of `rows` adds to a bag on disk, finishing it included: the rows
/// as SQLite lays them out (with a WAL, twice), a new split for every split size the batch
/// may fill, the close of the open split and a metadata.yaml rewritten through a temp file.
fn batch_disk_growth(bag: &BagWriter, rows: &[(usize, i64, usize, usize)]) -> u64 {
    let page = bag.page_size();
    let opts = bag.options();
    let (rows_growth, bytes) = rows.iter().fold((0, 0), |(g, b), r| {
        (g + row_growth_bytes(r.3 as u64, page), b + r.3 as u64)
    });
    let splits = match opts.max_bag_size {
        0 => 0,
        size => 1 + bytes / size,
    };
    let meta = std::fs::metadata(bag.dir().join(crate::bag::metadata::METADATA_FILE))
        .map_or(0, |m| m.len());
    rows_disk_growth(rows_growth, opts.preset.uses_wal(), page)
        + splits * (empty_split_bytes(page) + bag.close_reserve())
        + bag.close_reserve()
        + 2 * meta
        + meta / 4
        + 8192
}

/// Why [`write_budgeted`] stopped early.
enum Halt<'a> {
    Bag(BagError),
    /// The budget cannot hold more (the reason), with the rows written before.
    Stop(String, Vec<Row<'a>>),
}

/// Write `rows` as the pipeline's writer does under a budget: split by size and duration,
/// retention between closing a split and opening the next, room made before every commit,
/// messages that can never fit left out (counted in `over_budget`). Returns the rows written.
fn write_budgeted<'a>(
    bag: &mut BagWriter,
    ret: &mut Retention,
    rows: &[Row<'a>],
    over_budget: &mut u64,
) -> Result<Vec<Row<'a>>, Halt<'a>> {
    let limit = ret.oversize_limit(bag);
    let fitting: Vec<Row> = rows
        .iter()
        .copied()
        .filter(|r| limit.fits(r.2.len() as u64))
        .collect();
    *over_budget += (rows.len() - fitting.len()) as u64;
    let mut done = 0;
    let stop = |why: String, done: usize| Halt::Stop(why, fitting[..done].to_vec());
    let retention = |e: RetentionError, done: usize| match e {
        RetentionError::Bag(e) => Halt::Bag(e),
        e => stop(e.to_string(), done),
    };
    while done < fitting.len() {
        let rest = &fitting[done..];
        let n = bag.rows_fitting(rest);
        if n == 0 {
            if !bag.may_open_another_split() {
                bag.mark_split_limit_reached();
                return Err(stop(
                    format!("--max-splits {} reached", ret.policy().max_splits),
                    done,
                ));
            }
            ret.rotate(bag).map_err(|e| retention(e, done))?;
            continue;
        }
        let chunk = &rest[..n];
        let page = bag.page_size();
        let growth: u64 = chunk
            .iter()
            .map(|r| row_growth_bytes(r.2.len() as u64, page))
            .sum();
        let newest = chunk.iter().map(|r| r.1).max().unwrap_or(0);
        ret.before_batch(bag, growth, newest)
            .map_err(|e| retention(e, done))?;
        bag.write_rows(chunk).map_err(Halt::Bag)?;
        done += n;
        match ret.after_batch(bag).map_err(|e| retention(e, done))? {
            (Verdict::Continue, _) => {}
            (Verdict::StopMaxSplits(n), _) => {
                return Err(stop(format!("--max-splits {n} reached"), done));
            }
        }
    }
    Ok(fitting)
}

/// `2026-12-02T03-04-05Z_snapshot_estop` (or `_crash`), unique under `root`.
pub fn snapshot_dir(root: &Path, at_ns: i64, kind: &str, reason: &str) -> PathBuf {
    let t = chrono::DateTime::from_timestamp_nanos(at_ns);
    let base = format!(
        "{}_{kind}_{}",
        t.format("%Y-%m-%dT%H-%M-%SZ"),
        reason_for_name(reason)
    );
    let mut dir = root.join(&base);
    let mut n = 2;
    while dir.symlink_metadata().is_ok() {
        dir = root.join(format!("{base}-{n}"));
        n += 1;
    }
    dir
}

fn utc_text(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%dT%H:%M:%S%.9fZ")
        .to_string()
}

fn origins_text(origins: &[Origin]) -> String {
    origins
        .iter()
        .map(|o| format!("{o:?}").to_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

/// The side file of a Humble-format snapshot bag: Humble's metadata.yaml has no `custom_data`,
/// so the trigger's reason, origin, window and time go beside it.
pub const SNAPSHOT_SIDE_FILE: &str = "snapshot.yaml";

/// Record why and what a snapshot (or crash) bag holds: `ringbag.snapshot.<key>` in Jazzy's
/// `custom_data`; for Humble, which has none, in [`SNAPSHOT_SIDE_FILE`] (written atomically,
/// before the bag is finished, so a finished bag never lacks it). A side file that cannot be
/// written is logged: the messages matter more than their label.
fn describe_snapshot(bag: &mut BagWriter, dir: &Path, fields: &[(&str, String)]) {
    for (k, v) in fields {
        bag.set_custom_data(format!("ringbag.snapshot.{k}"), v.clone());
    }
    if bag.flavour() == Flavour::Humble {
        let map: std::collections::BTreeMap<&str, &str> =
            fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let text = serde_yaml_ng::to_string(&map).unwrap_or_default();
        if let Err(e) = crate::bag::metadata::write_file_atomic(
            dir,
            SNAPSHOT_SIDE_FILE,
            format!("# ringbag snapshot: why and what this bag holds\n{text}").as_bytes(),
        ) {
            log::warn!("{}: cannot write {SNAPSHOT_SIDE_FILE}: {e}", dir.display());
        }
    }
}

/// The snapshot being written.
struct Open {
    bag: BagWriter,
    dir: PathBuf,
    window: Window,
    cursor: u64,
    reasons: Vec<String>,
    origins: Vec<Origin>,
    triggers: u64,
    copier: Copier,
    opened: Instant,
}

/// The thread's state.
pub struct Snapshotter {
    ring: Arc<Ring>,
    cfg: Config,
    planner: Planner,
    open: Option<Open>,
    /// Finished snapshot bags, for the caller (retention, tests).
    pub finished: Vec<PathBuf>,
    /// When the last "extends" line was logged, and the extensions not logged since.
    extend_logged: Option<Instant>,
    extends_unlogged: u64,
}

impl Snapshotter {
    pub fn new(ring: Arc<Ring>, cfg: Config) -> Self {
        Snapshotter {
            ring,
            cfg,
            planner: Planner::default(),
            open: None,
            finished: Vec::new(),
            extend_logged: None,
            extends_unlogged: 0,
        }
    }

    /// Run until `rx` disconnects (the recorder stops); then finish the open snapshot with
    /// what the ring holds and return the bags written.
    pub fn run(mut self, rx: Receiver<Cmd>) -> Vec<PathBuf> {
        let mut more = false;
        loop {
            let wait = if more {
                Duration::ZERO
            } else if self.open.is_some() {
                Duration::from_millis(10)
            } else {
                Duration::from_millis(100)
            };
            match rx.recv_timeout(wait) {
                Ok(Cmd::Trigger {
                    req,
                    origin,
                    at_ns,
                    reply,
                    ticket,
                }) => {
                    if ticket.as_ref().is_some_and(|t| !t.take()) {
                        // Its requester gave up waiting and reported a failure: it must not
                        // happen now, late and stamped with the wrong time.
                        log::warn!(
                            "trigger ({origin:?}) dropped: answered as failed before it was taken"
                        );
                        continue;
                    }
                    // The time it was asked for, not when this thread got to it.
                    let at_ns = at_ns.or_else(|| {
                        ticket.as_ref().map(|t| {
                            let waited =
                                i64::try_from(t.asked.elapsed().as_nanos()).unwrap_or(i64::MAX);
                            self.cfg.clock.now_ns().saturating_sub(waited)
                        })
                    });
                    let out = self.trigger(&req, origin, at_ns);
                    if let Some(r) = reply {
                        let _ = r.send(out);
                    }
                    // Take every queued trigger before copying (a storm is answered fast).
                    continue;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.cfg.room.as_ref().is_some_and(|r| r.winding_down()) {
                // The recording has ended and its last message is in the ring: finish now,
                // while the writer thread still makes room.
                break;
            }
            more = self.pump(false);
        }
        self.pump(true);
        self.finished
    }

    fn trigger(&mut self, req: &TriggerRequest, origin: Origin, at_ns: Option<i64>) -> Outcome {
        self.ring.counters().triggers[origin.index()].fetch_add(1, Relaxed);
        if let (Origin::Socket | Origin::Service, Err(why)) = (origin, req.check_reason()) {
            log::warn!("trigger ({origin:?}) refused: {why}");
            return Outcome::Refused { why };
        }
        let reason = req
            .reason
            .as_deref()
            .filter(|r| !r.trim().is_empty())
            .map(|r| bounded_reason(r).to_string())
            .unwrap_or_else(|| format!("{origin:?}").to_lowercase());
        // Logged escaped: a reason is whatever a client sent.
        let shown_reason = escape_reason(&reason);
        let (pre, post) = match req.windows() {
            Ok(w) => w,
            Err(why) => {
                log::warn!("trigger ({shown_reason}) refused: {why}");
                return Outcome::Refused { why };
            }
        };
        let now = at_ns.unwrap_or_else(|| self.cfg.clock.now_ns());
        match self
            .planner
            .decide(now, pre, post, self.open.as_ref().map(|o| &o.window))
        {
            Decision::Extend { end_ns } => {
                let o = self
                    .open
                    .as_mut()
                    .expect("extend only with an open snapshot");
                o.window.end_ns = end_ns;
                o.triggers += 1;
                if !o.reasons.contains(&reason) && o.reasons.len() < 16 {
                    o.reasons.push(reason.clone());
                }
                if !o.origins.contains(&origin) {
                    o.origins.push(origin);
                }
                let bag = o.dir.display().to_string();
                if self
                    .extend_logged
                    .is_none_or(|t| t.elapsed() >= EXTEND_LOG_EVERY)
                {
                    self.extend_logged = Some(Instant::now());
                    log::info!(
                        ringbag_bag = bag.as_str();
                        "trigger ({shown_reason}, {origin:?}): extends snapshot {bag} to {}{}",
                        utc_text(end_ns),
                        match std::mem::take(&mut self.extends_unlogged) {
                            0 => String::new(),
                            n => format!(" ({n} more extensions since the last line)"),
                        }
                    );
                } else {
                    self.extends_unlogged += 1;
                    log::debug!(
                        "trigger ({shown_reason}, {origin:?}): extends snapshot {bag} to {}",
                        utc_text(end_ns)
                    );
                }
                self.persist_pending();
                Outcome::Extended { bag }
            }
            Decision::RateLimited { suppressed } => {
                // The first of a storm as a warning, then every 100th: a storm must not
                // flood the journal; the total goes into the next snapshot's log line.
                log::debug!(
                    "trigger ({shown_reason}, {origin:?}): rate-limited ({suppressed} in a row)"
                );
                if suppressed == 1 || suppressed % 100 == 0 {
                    log::warn!(
                        "trigger ({shown_reason}, {origin:?}): rate-limited ({suppressed} in a row; at most {} snapshots at once, then one a minute)",
                        super::trigger::STORM_BURST
                    );
                }
                Outcome::RateLimited { suppressed }
            }
            Decision::Start(window) => match self.start(window, &reason, origin) {
                Ok(bag) => Outcome::Started { bag },
                Err(e) => {
                    self.ring.counters().failed.fetch_add(1, Relaxed);
                    log::error!("trigger ({shown_reason}): cannot start the snapshot bag: {e}");
                    Outcome::Refused { why: e.to_string() }
                }
            },
        }
    }

    fn start(&mut self, window: Window, reason: &str, origin: Origin) -> Result<String, String> {
        let dir = snapshot_dir(&self.cfg.root, window.first_trigger_ns, "snapshot", reason);
        let mut copier = Copier::with_room(self.cfg.room.clone(), self.cfg.batch_bytes);
        if let Some(room) = copier.room.as_mut() {
            // Even the empty bag (a split, metadata.yaml, the lock) is on the budget.
            let o = &self.cfg.writer;
            let page = u64::from(crate::bag::schema::choose_page_size(
                o.preset,
                o.max_bag_size,
                0,
                0,
            ));
            room.make_room(
                &dir,
                empty_split_bytes(page) + 8192,
                copier.batch_bytes as u64,
            )
            .map_err(|why| format!("no room for a snapshot: {why}"))?;
        }
        let bag = match BagWriter::create(&dir, self.cfg.writer.clone()) {
            Ok(b) => b,
            Err(e) => {
                if let Some(room) = copier.room.as_mut() {
                    room.release();
                }
                return Err(e.to_string());
            }
        };
        let cursor = self
            .ring
            .seek(window.start_ns.saturating_sub(1_000_000_000));
        let shown = dir.display().to_string();
        log::info!(
            ringbag_bag = shown.as_str();
            "trigger ({}, {origin:?}): snapshot {shown}: from {} to {}{}",
            escape_reason(reason),
            if window.start_ns == i64::MIN {
                "the oldest message in the ring".to_string()
            } else {
                utc_text(window.start_ns)
            },
            utc_text(window.end_ns),
            match self.planner.suppressed_total {
                0 => String::new(),
                n => format!(" ({n} triggers rate-limited so far)"),
            }
        );
        self.open = Some(Open {
            bag,
            dir,
            window,
            cursor,
            reasons: vec![reason.to_string()],
            origins: vec![origin],
            triggers: 1,
            copier,
            opened: Instant::now(),
        });
        // Before answering: a kill -9 right after the trigger still finds it at the restart.
        self.persist_pending();
        Ok(shown)
    }

    fn persist_pending(&self) {
        if let Some(o) = &self.open {
            self.ring.set_pending_trigger(Some(&pending_that_fits(
                &o.reasons,
                &o.window,
                &o.dir,
                &origins_text(&o.origins),
            )));
        }
    }

    /// Copy what the ring has for the open snapshot; close it once its end has passed (or
    /// at once when `stopping`). Returns true when there is more to copy right away.
    fn pump(&mut self, stopping: bool) -> bool {
        let Some(o) = self.open.as_mut() else {
            return false;
        };
        let result = loop {
            let copied = o.copier.copy(
                &self.ring,
                &mut o.bag,
                &mut o.cursor,
                o.window.start_ns,
                o.window.end_ns,
                COPY_SCAN_BYTES,
            );
            match copied {
                Ok(Copied::PastEnd | Copied::Cut) => break Ok(true),
                Ok(Copied::Head) => break Ok(false),
                // More to copy: keep going unless a trigger waits (checked by the caller).
                Ok(Copied::Budget) if stopping => continue,
                Ok(Copied::Budget) => return true,
                Err(e) => break Err(e),
            }
        };
        let now = self.cfg.clock.now_ns();
        let due = now > o.window.end_ns.saturating_add(CLOSE_GRACE_NS);
        if matches!(result, Ok(false)) && !due && !stopping {
            return false;
        }
        let o = self.open.take().expect("open snapshot");
        self.close(o, result.err());
        false
    }

    fn close(&mut self, o: Open, failure: Option<BagError>) {
        let Open {
            mut bag,
            dir,
            window,
            reasons,
            origins,
            triggers,
            mut copier,
            opened,
            ..
        } = o;
        let s = &copier.stats;
        let mut custom = vec![
            ("reason", reasons.join("; ")),
            ("trigger_time", utc_text(window.first_trigger_ns)),
            ("trigger_time_ns", window.first_trigger_ns.to_string()),
            ("origin", origins_text(&origins)),
            ("triggers", triggers.to_string()),
            ("window_start_ns", window.start_ns.to_string()),
            ("window_end_ns", window.end_ns.to_string()),
            ("evicted_bytes_before_copy", s.evicted_bytes.to_string()),
            ("damaged_records", s.damaged.to_string()),
        ];
        if let Some(why) = &copier.cut {
            custom.push(("cut", why.clone()));
        }
        describe_snapshot(&mut bag, &dir, &custom);
        let messages = s.messages;
        let last = s.last_ns;
        let shown = dir.display().to_string();
        // A snapshot is finished (readable, on the budget) or removed: never left unfinished
        // with its lock, its space on disk but on no budget.
        let keep = match (failure, bag.finish()) {
            (None, Ok(_)) if messages == 0 && copier.cut.is_some() => {
                log::warn!(
                    ringbag_bag = shown.as_str();
                    "snapshot {shown}: removed, nothing of its window fitted: {}",
                    copier.cut.as_deref().unwrap_or_default()
                );
                false
            }
            (None, Ok(summary)) => {
                match &copier.cut {
                    Some(why) => log::warn!(
                        ringbag_bag = shown.as_str();
                        "snapshot {shown} cut short: {why}; it holds {messages} messages ({} bytes) up to {}, of a window to {}",
                        summary.size_bytes,
                        last.map_or_else(|| "-".to_string(), utc_text),
                        utc_text(window.end_ns)
                    ),
                    None => log::info!(
                        ringbag_bag = shown.as_str();
                        "snapshot {shown} complete: {messages} messages, {} bytes, {:.2} s after the trigger was taken",
                        summary.size_bytes,
                        opened.elapsed().as_secs_f64()
                    ),
                }
                true
            }
            (Some(e), Ok(_)) => {
                log::error!(ringbag_bag = shown.as_str(); "snapshot {shown}: {e}; finished with the {messages} messages copied before");
                messages > 0
            }
            (_, Err(e)) => {
                log::error!(ringbag_bag = shown.as_str(); "snapshot {shown}: {e}; removed");
                false
            }
        };
        let counters = self.ring.counters();
        if keep {
            &counters.written
        } else {
            &counters.failed
        }
        .fetch_add(1, Relaxed);
        if keep {
            if let Some(tx) = &self.cfg.finished {
                let _ = tx.send(dir.clone());
            }
            self.finished.push(dir);
        } else if let Err(e) = std::fs::remove_dir_all(&dir) {
            log::error!(ringbag_bag = shown.as_str(); "snapshot {shown}: cannot remove it: {e}");
        }
        // After the bag is handed over (retention adopts it before it answers this), or
        // removed: it counts twice for a moment, never zero times.
        if let Some(room) = copier.room.as_mut() {
            room.release();
        }
        self.planner.closed(window.end_ns);
        self.ring.set_pending_trigger(None);
    }
}

/// The pending-trigger record for `reasons` and `window`, with as many of the reasons as its
/// slot in the ring holds: the window is never lost to a long list of reasons. The first
/// reason always fits (it is at most `MAX_REASON_BYTES`, six times that when escaped).
fn pending_that_fits(
    reasons: &[String],
    window: &Window,
    bag: &Path,
    origin: &str,
) -> PendingTrigger {
    let fits = |p: &PendingTrigger| {
        serde_json::to_vec(&Some(p)).map_or(usize::MAX, |v| v.len())
            <= super::ring::PENDING_TRIGGER_MAX_BYTES
    };
    let mut kept = reasons.len();
    loop {
        let mut reason = reasons[..kept].join("; ");
        if kept < reasons.len() {
            reason.push_str(&format!("; and {} more", reasons.len() - kept));
        }
        let mut p = PendingTrigger {
            reason,
            trigger_ns: window.first_trigger_ns,
            start_ns: window.start_ns,
            end_ns: window.end_ns,
            bag: Some(bag.to_path_buf()),
            origin: origin.to_string(),
        };
        if fits(&p) {
            return p;
        }
        if kept <= 1 {
            // One reason alone is too long (a trigger from inside the process, or a long bag
            // path): cut it until the record fits, so the window and the bag are never lost.
            while !p.reason.is_empty() && !fits(&p) {
                let mut cut = p.reason.len().saturating_sub(64);
                while !p.reason.is_char_boundary(cut) {
                    cut -= 1;
                }
                p.reason.truncate(cut);
            }
            return p;
        }
        kept -= 1;
    }
}

/// What [`recover`] did.
#[derive(Debug)]
pub struct Recovered {
    /// The crash bag; None when the ring held no message that could be written.
    pub bag: Option<PathBuf>,
    pub stats: CopyStats,
    pub pending: Option<PendingTrigger>,
    /// What the ring's header said that did not check out, and what was done instead.
    pub repaired: Vec<String>,
}

/// The outcome of a recovery that wrote no bag (the ring held nothing writable), with the
/// one line that says so and what was lost.
fn no_crash_bag(
    left_by: &str,
    lost: &[String],
    stats: CopyStats,
    pending: Option<PendingTrigger>,
    repaired: Vec<String>,
) -> Recovered {
    log::warn!(
        "{left_by}: no crash bag written: {}",
        if lost.is_empty() {
            "it holds no message".to_string()
        } else {
            format!("lost {}", lost.join("; "))
        }
    );
    Recovered {
        bag: None,
        stats,
        pending,
        repaired,
    }
}

/// How [`recover`] writes the crash bag.
#[derive(Debug, Clone)]
pub struct RecoverOptions {
    pub writer: WriterOptions,
    /// The root's budget: the crash bag obeys it like any other bag.
    pub retention: RetentionPolicy,
    /// The root is a recording root (`--recover`, the service): its other bags are on the
    /// budget too, oldest first. Otherwise the crash bag alone must fit.
    pub whole_root: bool,
    /// The uploader's ledger, so the crash bag's room goes from uploaded files first.
    pub upload_retention: crate::retention::UploadRetention,
    /// Now, on the recorder's clock.
    pub now_ns: i64,
}

/// Stamps this far around the ring's median stamp are believed (at least; a longer window
/// widens it). A ring holds the last seconds to minutes; a record stamped decades away is
/// damage, and in a bag it would make the duration overflow or play wait for years.
const PLAUSIBLE_SPAN_NS: i64 = 24 * 3600 * 1_000_000_000;
/// Stamps sampled for the median (whatever the ring's size: memory stays bounded).
const STAMP_SAMPLE: usize = 4096;

/// A first pass over a ring's record headers: how many, and a sample of their stamps.
struct Survey {
    records: u64,
    sample: Vec<i64>,
}

fn survey(ring: &Ring) -> Survey {
    let (mut pos, mut buf) = (ring.tail(), Vec::new());
    let mut out = Survey {
        records: 0,
        sample: Vec::new(),
    };
    // Every `stride`-th record is sampled; the stride doubles (and every other sample goes)
    // when the sample is full, so it stays spread over the whole ring.
    let mut stride = 1u64;
    loop {
        match ring.read_if(pos, &mut buf, |_| false) {
            Step::Skipped { head, next } => {
                if out.records.is_multiple_of(stride) {
                    if out.sample.len() == STAMP_SAMPLE {
                        let mut i = 0;
                        out.sample.retain(|_| {
                            i += 1;
                            i % 2 == 1
                        });
                        stride *= 2;
                    }
                    if out.records.is_multiple_of(stride) {
                        out.sample.push(head.ts);
                    }
                }
                out.records += 1;
                pos = next;
            }
            // A walk bounded by the repaired header never goes back (only a live writer
            // moves the tail); stop rather than risk a loop.
            Step::Evicted { .. } | Step::End | Step::Damaged { next: None, .. } => break,
            Step::Damaged { next: Some(p), .. } => pos = p,
            Step::Record { next, .. } => pos = next,
        }
    }
    out
}

/// The stamps a crash bag accepts: not before the epoch (rosbag2 and `ringbag info` refuse a
/// bag that starts before it, and a span from before it can overflow), not more than a day
/// after now, and within [`PLAUSIBLE_SPAN_NS`] (or the ring's window) of the median stamp.
fn plausible_range(sample: &[i64], window_ns: i64, now_ns: i64) -> (i64, i64) {
    let (lo, hi) = (0, now_ns.saturating_add(PLAUSIBLE_SPAN_NS).max(0));
    let mut inside: Vec<i64> = sample
        .iter()
        .copied()
        .filter(|t| (lo..=hi).contains(t))
        .collect();
    if inside.is_empty() {
        return (lo, hi);
    }
    inside.sort_unstable();
    let median = inside[inside.len() / 2];
    let span = PLAUSIBLE_SPAN_NS.max(window_ns);
    (
        median.saturating_sub(span).max(lo),
        median.saturating_add(span).min(hi),
    )
}

/// At start: if the ring at `path` was left by a run that died (or with a trigger whose bag
/// was not finished), write everything it holds into a "crash" bag under `root` first.
/// `Ok(None)`: no ring, or one that ended cleanly. A ring that cannot be read is logged and
/// left to be replaced.
///
/// Nothing in the ring is trusted: the header's positions are checked against the file (at
/// most one lap is read, each record at most once), records are checked by their CRCs, stamps
/// must be plausible, the crash bag obeys the root's budget, and a ring with nothing writable
/// gives no bag. Every loss is said in the log, with its reason.
pub fn recover(
    path: &Path,
    root: &Path,
    opts: RecoverOptions,
) -> Result<Option<Recovered>, BagError> {
    if !path.exists() {
        return Ok(None);
    }
    let mut ring = match Ring::open_existing(path) {
        Ok(r) => r,
        Err(e) => {
            log::warn!("{e}; not recovered, a new ring replaces it");
            return Ok(None);
        }
    };
    let pending = ring.pending_trigger();
    if ring.was_clean() && pending.is_none() {
        return Ok(None);
    }
    let shown = path.display().to_string();
    let repaired = ring.repair_for_recovery();
    for r in &repaired {
        log::warn!("{shown}: the ring's header is damaged: {r}");
    }
    let left_by = format!(
        "the previous recorder (pid {}) left its ring {shown}{}",
        ring.pid(),
        pending
            .as_ref()
            .map(|p| format!(
                " with the snapshot \"{}\" unfinished",
                escape_reason(&p.reason)
            ))
            .unwrap_or_default()
    );
    let survey = survey(&ring);
    let topics = ring.topics_checked();
    let mut lost = Vec::new();
    let table_read = topics.is_ok();
    let topics = match topics {
        Ok(t) => t,
        Err(why) => {
            if survey.records > 0 {
                lost.push(format!(
                    "{} records: {why}, so no record can be given its topic",
                    survey.records
                ));
            }
            Vec::new()
        }
    };
    let (lo, hi) = plausible_range(&survey.sample, ring.window_ns(), opts.now_ns);
    let half = pending.as_ref().and_then(|p| unfinished_snapshot(root, p));
    if (survey.records == 0 || topics.is_empty()) && half.is_none() {
        // Nothing can be written: no bag (an empty crash bag after every failed start would
        // only crowd the budget), one line instead.
        finish_ring(&ring);
        return Ok(Some(no_crash_bag(
            &left_by,
            &lost,
            CopyStats::default(),
            pending,
            repaired,
        )));
    }
    let (kind, reason, at) = match &pending {
        Some(p) => ("crash", p.reason.clone(), p.trigger_ns),
        None => ("crash", "recorder-died".to_string(), opts.now_ns),
    };
    let dir = snapshot_dir(root, at, kind, &reason);
    let p = &opts.retention;
    let budgeted = p.is_circular() || p.has_free_floor();
    let mut copier = Copier::new();
    copier.topics = Some(topics);
    if budgeted {
        let mut ret = if opts.whole_root {
            Retention::open_root(root, &dir, p.clone())
                .map_err(|e| BagError::invalid(root, e.to_string()))?
                .with_upload(&opts.upload_retention)
        } else {
            Retention::new(p.clone()).with_upload(&opts.upload_retention)
        };
        // As for any new bag: room first, so the bound also holds while it appears.
        if let Err(e) = ret.before_new_bag(root) {
            log::warn!("{shown}: making room for the crash bag: {e}");
        }
        // Batches small against the budget, as the pipeline's (a 16 MiB batch could not be
        // made room for under a small --max-record-size).
        let mut cap = COPY_BATCH_BYTES as u64;
        if opts.writer.max_bag_size > 0 {
            cap = cap.min(opts.writer.max_bag_size / 4);
        }
        if let Some(size) = p.max_record_size {
            cap = cap.min(size / 8);
        }
        copier.batch_bytes = cap.max(64 * 1024) as usize;
        copier.budget = Some(ret);
    }
    let mut bag = BagWriter::create(&dir, opts.writer.clone())?;
    if let Some(ret) = copier.budget.as_mut() {
        // Before the first batch, while the first split is empty (retention learns its size).
        ret.sync(&mut bag);
    }
    // The half-written snapshot of the pending trigger first: its rows are in this bag, so
    // one trigger gives one bag.
    let merged = half
        .as_ref()
        .map(|h| merge_unfinished(h, &mut bag, &mut copier, (lo, hi)));
    let start = ring.tail();
    let mut cursor = start;
    // `repair_for_recovery` bounds the walk to one lap; each call advances the cursor.
    while copier.copy(&ring, &mut bag, &mut cursor, lo, hi, u64::MAX)? != Copied::Head {}
    debug_assert!(cursor - start <= ring.capacity() + 8);
    let s = copier.stats.clone();
    if s.damaged > 0 {
        lost.push(format!(
            "{} damaged records (bad header, length or checksum)",
            s.damaged
        ));
    }
    if s.unnamed > 0 && table_read {
        lost.push(format!(
            "{} records of topic ids its topic table does not name",
            s.unnamed
        ));
    }
    if s.out_of_range > 0 {
        lost.push(format!(
            "{} records stamped outside the plausible {} .. {} (before 1970, in the future, or far from the others)",
            s.out_of_range,
            utc_text(lo),
            utc_text(hi)
        ));
    }
    if s.over_budget > 0 {
        lost.push(format!(
            "{} records larger than the budget can ever hold",
            s.over_budget
        ));
    }
    if let Some(why) = &copier.halted {
        lost.push(format!("the rest, as the budget holds no more ({why})"));
    }
    let mut fields = vec![
        (
            "recovered",
            format!(
                "ring {shown} of pid {} that {}",
                ring.pid(),
                if ring.was_clean() {
                    "stopped with a snapshot unfinished"
                } else {
                    "died"
                }
            ),
        ),
        ("damaged_records", s.damaged.to_string()),
    ];
    if !lost.is_empty() {
        fields.push(("lost", lost.join("; ")));
    }
    if !repaired.is_empty() {
        fields.push(("ring_header_repaired", repaired.join("; ")));
    }
    match &pending {
        Some(p) => {
            fields.push(("reason", p.reason.clone()));
            fields.push(("trigger_time", utc_text(p.trigger_ns)));
            fields.push(("trigger_time_ns", p.trigger_ns.to_string()));
            fields.push(("window_start_ns", p.start_ns.to_string()));
            fields.push(("window_end_ns", p.end_ns.to_string()));
            if !p.origin.is_empty() {
                fields.push(("origin", p.origin.clone()));
            }
        }
        None => fields.push(("reason", "crash".to_string())),
    }
    describe_snapshot(&mut bag, &dir, &fields);
    bag.finish()?;
    finish_ring(&ring);
    if let Some(h) = &half {
        if matches!(merged, Some(Ok(_))) {
            remove_bag_dir(h);
        }
    }
    if s.messages == 0 {
        // An empty snapshot bag and a ring with nothing writable: no bag at all.
        remove_bag_dir(&dir);
        return Ok(Some(no_crash_bag(&left_by, &lost, s, pending, repaired)));
    }
    let merged_text = match (&half, &merged) {
        (Some(h), Some(Ok(n))) => format!(
            " (with the {n} messages of the unfinished snapshot bag {}, removed)",
            h.display()
        ),
        (Some(h), Some(Err(e))) => format!(
            " (the unfinished snapshot bag {} is left as it is: {e})",
            h.display()
        ),
        _ => String::new(),
    };
    log::warn!(
        ringbag_bag:% = dir.display();
        "{left_by}: wrote its {} messages to {}{merged_text}{}",
        s.messages,
        dir.display(),
        if lost.is_empty() {
            String::new()
        } else {
            format!("; lost {}", lost.join("; "))
        }
    );
    // Ringbag must read back what it wrote: say so loudly if it cannot.
    if let Err(e) = crate::bag::reader::Bag::open(&dir) {
        log::error!(ringbag_bag:% = dir.display(); "the crash bag {} does not read back: {e}", dir.display());
    }
    Ok(Some(Recovered {
        bag: Some(dir),
        stats: s,
        pending,
        repaired,
    }))
}

/// Nothing left to recover from this ring (it is replaced next).
fn finish_ring(ring: &Ring) {
    ring.set_pending_trigger(None);
    ring.mark_clean();
}

/// The bag the pending trigger's snapshot was being written to, if it is still there (under
/// `root`: a path from a damaged ring must not send recovery anywhere else).
fn unfinished_snapshot(root: &Path, p: &PendingTrigger) -> Option<PathBuf> {
    let dir = p.bag.as_ref()?;
    let name = dir.file_name()?;
    let under_root = root.join(name);
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    (same(dir, &under_root) && under_root.is_dir()).then_some(under_root)
}

fn remove_bag_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            if let Some(parent) = dir.parent() {
                let _ = crate::bag::metadata::sync_dir(parent);
            }
        }
        Err(e) => log::warn!("{}: cannot remove the bag directory: {e}", dir.display()),
    }
}

/// Copy the messages of the half-written snapshot bag `dir` (stamped in `[lo, hi]`) into the
/// crash bag; returns how many. Its rows came from the ring, but the ring may have wrapped
/// since they were copied, so only the bag may still hold some of them: all are taken, and
/// the ring's copies of them are then left out ([`Copier::merged`]).
fn merge_unfinished(
    dir: &Path,
    bag: &mut BagWriter,
    copier: &mut Copier,
    (lo, hi): (i64, i64),
) -> Result<u64, String> {
    // Its recorder died: the lock is stale and metadata.yaml lags the split. Reindex makes it
    // readable (`--recover` has done so already; a plain `record` has not).
    use crate::bag::lock::{state, LockState};
    match state(dir) {
        LockState::Held => return Err("another process holds its lock".into()),
        LockState::Unclean => {}
        LockState::Clean if crate::bag::reindex::unfinished_reason(dir).is_some() => {}
        LockState::Clean => {
            return merge_rows(dir, bag, copier, (lo, hi));
        }
    }
    {
        crate::bag::reindex::reindex(dir, crate::bag::reindex::ReindexOptions::default())
            .map_err(|e| e.to_string())?;
    }
    merge_rows(dir, bag, copier, (lo, hi))
}

fn merge_rows(
    dir: &Path,
    bag: &mut BagWriter,
    copier: &mut Copier,
    (lo, hi): (i64, i64),
) -> Result<u64, String> {
    use crate::bag::reader::{Bag, ReadFilter};
    let half = Bag::open(dir).map_err(|e| e.to_string())?;
    let mut idx = Vec::with_capacity(half.topics.len());
    for t in &half.topics {
        // The ring's table keeps the message definition; the bag's topics row may not.
        let def = copier
            .topics
            .as_ref()
            .and_then(|ts| ts.iter().find(|r| r.name == t.name))
            .and_then(|r| r.definition());
        idx.push(bag.add_topic(t.clone(), def).map_err(|e| e.to_string())?);
    }
    let mut n = 0;
    for m in half
        .messages(&ReadFilter::default())
        .map_err(|e| e.to_string())?
    {
        let m = m.map_err(|e| e.to_string())?;
        if !(lo..=hi).contains(&m.timestamp) {
            copier.stats.out_of_range += 1;
            continue;
        }
        let i = idx[m.topic];
        copier
            .merged
            .insert((i, m.timestamp, crc32fast::hash(&m.data)));
        let at = copier.arena.len();
        copier.arena.extend_from_slice(&m.data);
        copier.rows.push((i, m.timestamp, at, m.data.len()));
        if copier.arena.len() >= copier.batch_bytes {
            copier.flush(bag).map_err(|e| e.to_string())?;
        }
        n += 1;
    }
    copier.flush(bag).map_err(|e| e.to_string())?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::reader::{Bag, ReadFilter};
    use crate::bag::{Flavour, TopicInfo};
    use crate::snapshot::ring::{RingTopic, RingWriter};
    use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

    const MS: i64 = 1_000_000;

    struct FakeClock(AtomicI64);
    impl TimeSource for FakeClock {
        fn now_ns(&self) -> i64 {
            self.0.load(Relaxed)
        }
    }

    /// A ring of `capacity` bytes at `path`, a writer and its one topic (/a, a String).
    fn ring_with_topic(path: &Path, capacity: u64) -> (Arc<Ring>, RingWriter, u32) {
        let ring = Arc::new(Ring::create(path, capacity, 0).unwrap());
        let mut w = RingWriter::new(ring.clone());
        let t = w
            .add_topic(RingTopic::new(
                &TopicInfo::new("/a", "std_msgs/msg/String"),
                None,
            ))
            .unwrap();
        (ring, w, t)
    }

    fn stamps(bag: &Path) -> Vec<i64> {
        Bag::open(bag)
            .unwrap()
            .messages(&ReadFilter::default())
            .unwrap()
            .map(|m| m.unwrap().timestamp)
            .collect()
    }

    #[test]
    fn a_trigger_its_requester_abandoned_never_happens() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::create(&dir.path().join("ring"), 1 << 20, 0).unwrap());
        let cfg = Config {
            root: dir.path().join("root"),
            writer: WriterOptions::new(Flavour::Jazzy),
            clock: Arc::new(FakeClock(AtomicI64::new(1_000 * MS))),
            finished: None,
            room: None,
            batch_bytes: COPY_BATCH_BYTES,
        };
        std::fs::create_dir_all(&cfg.root).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let ticket = Ticket::new();
        // The control socket gave up waiting (and answered "refused") before the thread
        // got to the trigger.
        assert!(ticket.abandon());
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        tx.send(Cmd::Trigger {
            req: TriggerRequest::default(),
            origin: Origin::Socket,
            at_ns: None,
            reply: Some(rtx),
            ticket: Some(ticket.clone()),
        })
        .unwrap();
        drop(tx);
        let bags = Snapshotter::new(ring, cfg).run(rx);
        assert!(bags.is_empty());
        assert!(rrx.recv().is_err(), "no answer: it was never acted on");
        assert!(!ticket.take(), "an abandoned ticket stays abandoned");
        assert_eq!(
            std::fs::read_dir(dir.path().join("root")).unwrap().count(),
            0
        );
    }

    #[test]
    fn a_snapshot_holds_exactly_its_window_and_the_next_one_starts_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (ring, mut w, t) = ring_with_topic(&dir.path().join("ring"), 4 << 20);
        for i in 0..10_000i64 {
            w.append(t, i * MS, &i.to_le_bytes()).unwrap();
        }
        // The clock is long past every window: each snapshot closes once copied.
        let clock = Arc::new(FakeClock(AtomicI64::new(1_000_000 * MS)));
        let (ftx, frx) = crossbeam_channel::unbounded();
        let cfg = Config {
            root: dir.path().join("root"),
            writer: WriterOptions::new(Flavour::Jazzy),
            clock,
            finished: Some(ftx),
            room: None,
            batch_bytes: 2 << 20,
        };
        std::fs::create_dir_all(&cfg.root).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let worker = std::thread::spawn(move || Snapshotter::new(ring, cfg).run(rx));
        let trigger = |at_ms: i64, pre_s: Option<f64>, post_s: f64| {
            let (rtx, rrx) = crossbeam_channel::bounded(1);
            tx.send(Cmd::Trigger {
                req: TriggerRequest {
                    reason: Some("test".into()),
                    pre_s,
                    post_s: Some(post_s),
                    ..Default::default()
                },
                origin: Origin::Socket,
                at_ns: Some(at_ms * MS),
                reply: Some(rtx),
                ticket: None,
            })
            .unwrap();
            rrx.recv_timeout(Duration::from_secs(10)).unwrap()
        };
        assert!(matches!(
            trigger(5_000, Some(1.0), 2.0),
            Outcome::Started { .. }
        ));
        let first = frx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(
            stamps(&first),
            (4_000..=7_000).map(|i| i * MS).collect::<Vec<_>>()
        );
        // Pre-window "all of the ring", but the previous snapshot already holds up to 7 s.
        assert!(matches!(trigger(9_000, None, 0.5), Outcome::Started { .. }));
        let second = frx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(
            stamps(&second),
            (7_001..=9_500).map(|i| i * MS).collect::<Vec<_>>()
        );
        let meta = Bag::open(&second).unwrap().metadata;
        assert_eq!(
            meta.custom_data["ringbag.snapshot.trigger_time_ns"],
            (9_000 * MS).to_string()
        );
        assert_eq!(meta.custom_data["ringbag.snapshot.reason"], "test");
        drop(tx);
        assert_eq!(worker.join().unwrap(), vec![first, second]);
    }

    /// Snapshot the whole of a ring of 1 KiB records while a fake writer thread grants room up
    /// to `limit` bytes; returns the finished bags, the largest grant and the root's files.
    fn snapshot_with_room(limit: u64) -> (Vec<PathBuf>, u64, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (ring, mut w, t) = ring_with_topic(&dir.path().join("ring"), 8 << 20);
        for i in 0..4_000i64 {
            w.append(t, i * MS, &[7u8; 1024]).unwrap();
        }
        let room = Arc::new(Room::default());
        room.set_bounded(true);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (room, stop) = (room.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut most = 0;
                while !stop.load(Relaxed) {
                    if let Some((seq, bytes, _)) = room.question() {
                        if bytes <= limit {
                            most = most.max(bytes);
                            room.answer(seq, Ok(()));
                        } else {
                            room.answer(seq, Err("the test's budget".into()));
                        }
                    }
                    std::thread::yield_now();
                }
                most
            })
        };
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let cfg = Config {
            root: root.clone(),
            // 1 MiB splits: 4 KiB pages, as under a small budget.
            writer: WriterOptions {
                max_bag_size: 1 << 20,
                ..WriterOptions::new(Flavour::Jazzy)
            },
            clock: Arc::new(FakeClock(AtomicI64::new(1_000_000 * MS))),
            finished: None,
            room: Some(room),
            batch_bytes: 64 << 10,
        };
        let mut s = Snapshotter::new(ring, cfg);
        let req = TriggerRequest {
            reason: Some("room".into()),
            pre_s: None,
            post_s: Some(0.0),
            ..Default::default()
        };
        let out = s.trigger(&req, Origin::Socket, Some(3_999 * MS));
        assert!(matches!(out, Outcome::Started { .. }), "{out:?}");
        // Copy, answering as the thread's loop does, until the snapshot is closed.
        let mut turns = 0;
        while s.open.is_some() {
            s.pump(false);
            // The bag never holds more than it was granted.
            if let Some(o) = &s.open {
                let granted = o.copier.room.as_ref().map_or(0, |r| r.granted);
                assert!(dir_bytes(&o.dir) <= granted);
            }
            turns += 1;
            assert!(turns < 10_000);
        }
        stop.store(true, Relaxed);
        let most = writer.join().unwrap();
        (s.finished, most, dir)
    }

    #[test]
    fn the_ring_counts_triggers_by_source_and_snapshots_written_and_failed() {
        let dir = tempfile::tempdir().unwrap();
        let (ring, mut w, t) = ring_with_topic(&dir.path().join("ring"), 4 << 20);
        for i in 0..2_000i64 {
            w.append(t, i * MS, &i.to_le_bytes()).unwrap();
        }
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let cfg = Config {
            root: root.clone(),
            writer: WriterOptions::new(Flavour::Jazzy),
            clock: Arc::new(FakeClock(AtomicI64::new(1_000_000 * MS))),
            finished: None,
            room: None,
            batch_bytes: 2 << 20,
        };
        let mut s = Snapshotter::new(ring.clone(), cfg);
        let req = |pre_s: f64| TriggerRequest {
            reason: Some("count".into()),
            pre_s: Some(pre_s),
            post_s: Some(0.5),
            ..Default::default()
        };
        let c = ring.counters();
        assert!(matches!(
            s.trigger(&req(1.0), Origin::Socket, Some(1_000 * MS)),
            Outcome::Started { .. }
        ));
        // Extends the open one; then one refused (a negative window): both counted.
        let out = s.trigger(&req(1.0), Origin::Signal, Some(1_200 * MS));
        assert!(matches!(out, Outcome::Extended { .. }), "{out:?}");
        let out = s.trigger(&req(-1.0), Origin::Service, Some(1_300 * MS));
        assert!(matches!(out, Outcome::Refused { .. }), "{out:?}");
        let mut turns = 0;
        while s.open.is_some() {
            s.pump(false);
            turns += 1;
            assert!(turns < 10_000);
        }
        assert_eq!(c.written.load(Relaxed), 1);
        assert_eq!(c.failed.load(Relaxed), 0);
        // A root that cannot hold a bag any more: the next snapshot fails to start.
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::write(&root, b"not a directory").unwrap();
        let out = s.trigger(&req(0.1), Origin::Topic, Some(1_900 * MS));
        assert!(matches!(out, Outcome::Refused { .. }), "{out:?}");
        assert_eq!(c.failed.load(Relaxed), 1);
        assert_eq!(c.written.load(Relaxed), 1);
        let by_source: Vec<u64> = Origin::ALL
            .iter()
            .map(|o| c.triggers[o.index()].load(Relaxed))
            .collect();
        // socket, signal, topic, service
        assert_eq!(by_source, vec![1, 1, 1, 1]);
    }

    #[test]
    fn a_snapshot_without_room_for_its_window_is_cut_short_as_a_finished_bag_within_its_grant() {
        let (bags, most, _dir) = snapshot_with_room(1 << 20);
        assert_eq!(bags.len(), 1);
        let bag = Bag::open(&bags[0]).unwrap();
        assert_eq!(
            bag.metadata.custom_data["ringbag.snapshot.cut"],
            "the test's budget"
        );
        let n = stamps(&bags[0]).len();
        assert!(n > 100 && n < 4_000, "{n} messages");
        assert_eq!(
            crate::bag::lock::state(&bags[0]),
            crate::bag::lock::LockState::Clean
        );
        assert!(
            dir_bytes(&bags[0]) <= most,
            "{} > {most}",
            dir_bytes(&bags[0])
        );
    }

    #[test]
    fn a_snapshot_of_which_nothing_fits_is_removed() {
        // Room for the empty bag only.
        let (bags, _, dir) = snapshot_with_room(200 << 10);
        assert!(bags.is_empty());
        let left: Vec<_> = std::fs::read_dir(dir.path().join("root"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_humble_snapshot_bag_carries_reason_and_window_in_its_side_file() {
        let dir = tempfile::tempdir().unwrap();
        let (ring, mut w, t) = ring_with_topic(&dir.path().join("ring"), 1 << 20);
        for i in 0..100i64 {
            w.append(t, i * MS, &i.to_le_bytes()).unwrap();
        }
        let cfg = Config {
            root: dir.path().join("root"),
            writer: WriterOptions::new(Flavour::Humble),
            clock: Arc::new(FakeClock(AtomicI64::new(1_000_000 * MS))),
            finished: None,
            room: None,
            batch_bytes: COPY_BATCH_BYTES,
        };
        std::fs::create_dir_all(&cfg.root).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        tx.send(Cmd::Trigger {
            req: TriggerRequest {
                reason: Some("estop".into()),
                pre_s: Some(0.05),
                post_s: Some(0.02),
                ..Default::default()
            },
            origin: Origin::Socket,
            at_ns: Some(50 * MS),
            reply: Some(rtx),
            ticket: None,
        })
        .unwrap();
        drop(tx);
        let bags = Snapshotter::new(ring, cfg).run(rx);
        assert!(matches!(rrx.recv().unwrap(), Outcome::Started { .. }));
        assert_eq!(bags.len(), 1);
        assert_eq!(
            stamps(&bags[0]),
            (0..=70).map(|i| i * MS).collect::<Vec<_>>()
        );
        let side: std::collections::BTreeMap<String, String> = serde_yaml_ng::from_str(
            &std::fs::read_to_string(bags[0].join(SNAPSHOT_SIDE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(side["reason"], "estop");
        assert_eq!(side["origin"], "socket");
        assert_eq!(side["trigger_time_ns"], (50 * MS).to_string());
        assert_eq!(side["window_start_ns"], "0");
        assert_eq!(side["window_end_ns"], (70 * MS).to_string());
    }

    #[test]
    fn recovery_merges_the_interrupted_snapshot_whose_oldest_rows_the_ring_lost_each_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let ring_path = dir.path().join("ring");
        let base = 1_700_000_000_000_000_000i64;
        let data = |i: i64| vec![i as u8; 1000];
        // The snapshot had copied records 0..150 when the recorder died; the ring (64 KiB,
        // about 63 such records) has since wrapped and holds only the newest of 0..200.
        let half = root.join("2026-01-01T00-00-00Z_snapshot_estop");
        {
            let mut b = BagWriter::create(&half, WriterOptions::new(Flavour::Jazzy)).unwrap();
            let t = b
                .add_topic(TopicInfo::new("/a", "std_msgs/msg/String"), None)
                .unwrap();
            for i in 0..150 {
                b.write_batch([(t, base + i * MS, data(i).as_slice())])
                    .unwrap();
            }
            b.finish().unwrap();
        }
        {
            let (ring, mut w, t) = ring_with_topic(&ring_path, 1 << 16);
            for i in 0..200 {
                w.append(t, base + i * MS, &data(i)).unwrap();
            }
            ring.set_pending_trigger(Some(&PendingTrigger {
                reason: "estop".into(),
                trigger_ns: base,
                start_ns: base,
                end_ns: base + 10_000 * MS,
                bag: Some(half.clone()),
                origin: "socket".into(),
            }));
            // Dropped without mark_clean: as after a kill -9.
        }
        let r = recover(
            &ring_path,
            &root,
            RecoverOptions {
                writer: WriterOptions::new(Flavour::Jazzy),
                retention: RetentionPolicy::default(),
                whole_root: true,
                upload_retention: Default::default(),
                now_ns: base + 300 * MS,
            },
        )
        .unwrap()
        .unwrap();
        let bag = r.bag.expect("a crash bag");
        assert_eq!(
            stamps(&bag),
            (0..200).map(|i| base + i * MS).collect::<Vec<_>>()
        );
        assert!(
            !half.exists(),
            "the interrupted snapshot is merged and removed"
        );
        let c = Bag::open(&bag).unwrap().metadata.custom_data;
        assert_eq!(c["ringbag.snapshot.reason"], "estop");
        assert_eq!(c["ringbag.snapshot.origin"], "socket");
        // Recovered once: the ring is clean now.
        let again = recover(
            &ring_path,
            &root,
            RecoverOptions {
                writer: WriterOptions::new(Flavour::Jazzy),
                retention: RetentionPolicy::default(),
                whole_root: true,
                upload_retention: Default::default(),
                now_ns: base,
            },
        )
        .unwrap();
        assert!(again.is_none());
    }

    #[test]
    fn a_longest_reason_in_a_deep_root_still_leaves_a_readable_pending_trigger_naming_the_bag() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::create(&dir.path().join("ring"), 1 << 16, 0).unwrap());
        // A root as deep as SQLite opens (its unix VFS takes paths of up to 512 bytes; the
        // bag's and the split's names come on top) and a reason at its bound: the record must
        // still fit the ring's 4 KiB slot, naming the bag and keeping the window. The root is
        // made 406 bytes long whatever the temp dir's own length (CI's is longer than /tmp).
        const ROOT_LEN: usize = 406;
        let mut root = dir.path().join("root");
        assert!(root.as_os_str().len() + 2 <= ROOT_LEN, "{}", root.display());
        while root.as_os_str().len() < ROOT_LEN {
            let left = ROOT_LEN - root.as_os_str().len() - 1;
            root = root.join("d".repeat(left.clamp(1, 192)));
        }
        assert_eq!(root.as_os_str().len(), ROOT_LEN);
        let cfg = Config {
            root,
            writer: WriterOptions::new(Flavour::Jazzy),
            clock: Arc::new(FakeClock(AtomicI64::new(0))),
            finished: None,
            room: None,
            batch_bytes: COPY_BATCH_BYTES,
        };
        std::fs::create_dir_all(&cfg.root).unwrap();
        let mut sn = Snapshotter::new(ring.clone(), cfg);
        let req = TriggerRequest {
            reason: Some("é".repeat(super::super::trigger::MAX_REASON_BYTES / 2)),
            pre_s: Some(1.0),
            post_s: Some(1.0),
            ..Default::default()
        };
        let Outcome::Started { bag } = sn.trigger(&req, Origin::Socket, Some(5 * MS)) else {
            panic!("not started");
        };
        let p = ring.pending_trigger().expect("readable");
        assert_eq!(p.bag, Some(PathBuf::from(bag)));
        assert!(p.reason.starts_with('é'));
        assert!(
            serde_json::to_vec(&Some(&p)).unwrap().len()
                <= super::super::ring::PENDING_TRIGGER_MAX_BYTES
        );
        assert_eq!(p.origin, "socket");
    }
}
