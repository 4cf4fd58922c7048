//! The snapshot thread: takes triggers, cuts windows out of the ring into new bags, off the
//! writer thread (which keeps appending to the ring meanwhile). Also the crash bag written at
//! start from a ring a dead recorder left.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::ring::{PendingTrigger, Ring, Step};
use super::trigger::{
    bounded_reason, escape_reason, reason_for_name, Decision, Origin, Outcome, Planner,
    TriggerRequest, Window,
};
use crate::bag::writer::{row_growth_bytes, BagWriter, WriterOptions};
use crate::bag::BagError;
use crate::clock::TimeSource;
use crate::pipeline::{Answer, Room};
use crate::retention::{rows_disk_growth, BAG_DIR_RESERVE_BYTES, MIN_EMPTY_SPLIT_BYTES};

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
    /// When the request was complete: the trigger's time.
    pub asked: Instant,
    state: Arc<AtomicU8>,
}

const TICKET_OPEN: u8 = 0;
const TICKET_TAKEN: u8 = 1;
const TICKET_ABANDONED: u8 = 2;

impl Ticket {
    pub fn new() -> Ticket {
        Ticket {
            asked: Instant::now(),
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
    arena: Vec<u8>,
    rows: Vec<(usize, i64, usize, usize)>,
    buf: Vec<u8>,
    stats: CopyStats,
    batch_bytes: usize,
    room: Option<RoomClient>,
    /// Why the copy stopped short of its window, once it has.
    cut: Option<String>,
}

impl Copier {
    fn new() -> Self {
        Copier {
            topic_idx: Vec::new(),
            arena: Vec::new(),
            rows: Vec::new(),
            buf: Vec::new(),
            stats: CopyStats::default(),
            batch_bytes: COPY_BATCH_BYTES,
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
        let topics = ring.topics();
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
        while scanned < budget_bytes {
            let step = ring.read_if(*cursor, &mut self.buf, |h| h.ts >= start && h.ts <= end);
            match step {
                Step::Skipped { head, next } => {
                    scanned += next - *cursor;
                    *cursor = next;
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
                        self.stats.damaged += 1;
                        continue;
                    };
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
                    log::warn!("{}: {why}; skipped", ring.path().display());
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
        bag.write_batch(
            self.rows
                .iter()
                .map(|&(idx, ts, at, len)| (idx, ts, &arena[at..at + len])),
        )?;
        self.stats.messages += self.rows.len() as u64;
        let (lo, hi) = self.rows.iter().fold((i64::MAX, i64::MIN), |(lo, hi), r| {
            (lo.min(r.1), hi.max(r.1))
        });
        self.stats.first_ns = Some(self.stats.first_ns.map_or(lo, |f| f.min(lo)));
        self.stats.last_ns = Some(self.stats.last_ns.map_or(hi, |l| l.max(hi)));
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
            more = self.pump(false);
        }
        self.pump(true);
        self.finished
    }

    fn trigger(&mut self, req: &TriggerRequest, origin: Origin, at_ns: Option<i64>) -> Outcome {
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
            self.ring
                .set_pending_trigger(Some(&pending_that_fits(&o.reasons, &o.window)));
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
        let custom = [
            ("ringbag.snapshot.reason", reasons.join("; ")),
            (
                "ringbag.snapshot.trigger_time",
                utc_text(window.first_trigger_ns),
            ),
            (
                "ringbag.snapshot.trigger_time_ns",
                window.first_trigger_ns.to_string(),
            ),
            (
                "ringbag.snapshot.origin",
                origins
                    .iter()
                    .map(|o| format!("{o:?}").to_lowercase())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("ringbag.snapshot.triggers", triggers.to_string()),
            ("ringbag.snapshot.window_end_ns", window.end_ns.to_string()),
            (
                "ringbag.snapshot.evicted_bytes_before_copy",
                s.evicted_bytes.to_string(),
            ),
            ("ringbag.snapshot.damaged_records", s.damaged.to_string()),
        ];
        for (k, v) in custom {
            bag.set_custom_data(k, v);
        }
        if let Some(why) = &copier.cut {
            bag.set_custom_data("ringbag.snapshot.cut", why.clone());
        }
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
fn pending_that_fits(reasons: &[String], window: &Window) -> PendingTrigger {
    let mut kept = reasons.len();
    loop {
        let mut reason = reasons[..kept].join("; ");
        if kept < reasons.len() {
            reason.push_str(&format!("; and {} more", reasons.len() - kept));
        }
        let p = PendingTrigger {
            reason,
            trigger_ns: window.first_trigger_ns,
            start_ns: window.start_ns,
            end_ns: window.end_ns,
        };
        let len = serde_json::to_vec(&Some(&p)).map_or(usize::MAX, |v| v.len());
        if len <= super::ring::PENDING_TRIGGER_MAX_BYTES || kept <= 1 {
            return p;
        }
        kept -= 1;
    }
}

/// What [`recover`] did.
#[derive(Debug)]
pub struct Recovered {
    pub bag: PathBuf,
    pub stats: CopyStats,
    pub pending: Option<PendingTrigger>,
}

/// At start: if the ring at `path` was left by a run that died (or with a trigger whose bag
/// was not finished), write everything it holds into a "crash" bag under `root` first.
/// `Ok(None)`: no ring, or one that ended cleanly. A ring that cannot be read is logged and
/// left to be replaced.
pub fn recover(
    path: &Path,
    root: &Path,
    writer: WriterOptions,
    now_ns: i64,
) -> Result<Option<Recovered>, BagError> {
    if !path.exists() {
        return Ok(None);
    }
    let ring = match Ring::open_existing(path) {
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
    let (kind, reason, at) = match &pending {
        Some(p) => ("crash", p.reason.clone(), p.trigger_ns),
        None => ("crash", "recorder-died".to_string(), now_ns),
    };
    let dir = snapshot_dir(root, at, kind, &reason);
    let mut bag = BagWriter::create(&dir, writer)?;
    let mut copier = Copier::new();
    let mut cursor = ring.tail();
    while copier.copy(&ring, &mut bag, &mut cursor, i64::MIN, i64::MAX, u64::MAX)? != Copied::Head {
    }
    let s = copier.stats.clone();
    bag.set_custom_data(
        "ringbag.snapshot.recovered",
        format!(
            "ring {} of pid {} that {}",
            path.display(),
            ring.pid(),
            if ring.was_clean() {
                "stopped with a snapshot unfinished"
            } else {
                "died"
            }
        ),
    );
    bag.set_custom_data("ringbag.snapshot.damaged_records", s.damaged.to_string());
    if let Some(p) = &pending {
        bag.set_custom_data("ringbag.snapshot.reason", p.reason.clone());
        bag.set_custom_data("ringbag.snapshot.trigger_time", utc_text(p.trigger_ns));
        bag.set_custom_data("ringbag.snapshot.trigger_time_ns", p.trigger_ns.to_string());
        // The interrupted snapshot's window (the bag holds the whole ring around it).
        bag.set_custom_data("ringbag.snapshot.window_start_ns", p.start_ns.to_string());
        bag.set_custom_data("ringbag.snapshot.window_end_ns", p.end_ns.to_string());
    } else {
        bag.set_custom_data("ringbag.snapshot.reason", "crash".to_string());
    }
    bag.finish()?;
    ring.set_pending_trigger(None);
    ring.mark_clean();
    log::warn!(
        ringbag_bag:% = dir.display();
        "the previous recorder (pid {}) left its ring {}{}: wrote its {} messages to {}",
        ring.pid(),
        path.display(),
        pending
            .as_ref()
            .map(|p| format!(" with the snapshot \"{}\" unfinished", escape_reason(&p.reason)))
            .unwrap_or_default(),
        s.messages,
        dir.display()
    );
    Ok(Some(Recovered {
        bag: dir,
        stats: s,
        pending,
    }))
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
        let ring = Arc::new(Ring::create(&dir.path().join("ring"), 4 << 20, 0).unwrap());
        let mut w = RingWriter::new(ring.clone());
        let t = w
            .add_topic(RingTopic::new(
                &TopicInfo::new("/a", "std_msgs/msg/String"),
                None,
            ))
            .unwrap();
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
        let ring = Arc::new(Ring::create(&dir.path().join("ring"), 8 << 20, 0).unwrap());
        let mut w = RingWriter::new(ring.clone());
        let t = w
            .add_topic(RingTopic::new(
                &TopicInfo::new("/a", "std_msgs/msg/String"),
                None,
            ))
            .unwrap();
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
}
