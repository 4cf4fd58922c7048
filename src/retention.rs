//! Circular budget over a recording root (issue 4): total size, total duration, file count,
//! free space, and the max-splits stop condition.
//!
//! The budget sees one FIFO of closed splits, oldest first: the splits of older bags found
//! under the recording root (ordered by their starting time, then split number), followed by
//! the closed splits of the bag being recorded. Running totals (bytes, count) make every check
//! O(1); deleting a split costs one file removal plus one metadata.yaml rewrite of its bag.
//! Only closed, fsynced splits are ever deleted, never the open one.
//!
//! `ringbag record` budgets its own bag only (`Retention::new`); the service passes the
//! recording root (`Retention::open_root`) so the budget spans one bag per boot.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};

use crate::bag::lock::{self, BagLock, LockState, LOCK_FILE};
use crate::bag::metadata::{
    sync_dir, BagMetadata, FileInfo, TopicWithCount, METADATA_FILE, NO_START,
};
use crate::bag::reader::{find_split_files, open_read_only, read_topics, split_stats};
use crate::bag::writer::{split_size_on_disk, BagWriter, ClosedSplit};
use crate::bag::{BagError, TopicInfo};

/// Worst-case growth of a split per projected byte: SQLite leaves pages partly filled (a row
/// just over half a page wastes nearly half of it) and adds an index entry per row, so the
/// file can grow by up to about twice the payload-plus-row-overhead estimate.
pub const GROWTH_FACTOR: u64 = 2;
/// Smallest reserve for a new split's empty file (schema, topics); the real size, learned
/// from the writer, replaces it when larger.
pub const MIN_EMPTY_SPLIT_BYTES: u64 = 64 * 1024;
/// Reserve per split closed inside a batch (Jazzy writes a metadata row at close).
pub const CLOSE_RESERVE_BYTES: u64 = 32 * 1024;
/// metadata.yaml is rewritten through a temporary file next to it.
const METADATA_SLACK_BYTES: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error("{path}: cannot read free space: {source}")]
    FreeSpace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: only {available} bytes free, below the free-space floor of {floor} bytes \
         (--min-free-space/--min-free-space-percent) plus {batch} bytes for the next batch, \
         and no closed split is left to delete; stopping so the disk never fills"
    )]
    OutOfSpace {
        path: PathBuf,
        available: u64,
        floor: u64,
        batch: u64,
    },
    #[error("{path}: cannot scan the recording root: {source}")]
    Scan {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    StopMaxSplits(u32),
}

/// The limits. `None` means off; `Some(0)` is never valid (see `validate`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RetentionPolicy {
    /// `--max-record-size`: total bytes of all splits.
    pub max_record_size: Option<u64>,
    /// `--max-record-duration`: span from the oldest kept split's start to the newest message.
    pub max_record_duration_ns: Option<i64>,
    /// `--max-bag-files`: split files kept, the open one included.
    pub max_bag_files: Option<u32>,
    /// `--min-free-space`: bytes that must stay free on the partition.
    pub min_free_space: Option<u64>,
    /// `--min-free-space-percent`: percent of the partition that must stay free.
    pub min_free_space_percent: Option<f64>,
    /// `--max-splits`: stop once this many split files exist (a stop condition); 0 = off.
    pub max_splits: u32,
}

impl RetentionPolicy {
    /// True when a limit deletes old splits to make room (the free-space floor aside).
    pub fn is_circular(&self) -> bool {
        self.max_record_size.is_some()
            || self.max_record_duration_ns.is_some()
            || self.max_bag_files.is_some()
    }

    /// Reject combinations that cannot work, with one line naming the flags.
    pub fn validate(&self, max_bag_size: u64, max_bag_duration_ns: i64) -> Result<(), String> {
        if self.max_record_size == Some(0) {
            return Err("--max-record-size must be greater than 0".into());
        }
        if self.max_record_duration_ns.is_some_and(|d| d <= 0) {
            return Err("--max-record-duration must be greater than 0".into());
        }
        if let Some(n) = self.max_bag_files {
            if n < 2 {
                return Err(format!(
                    "--max-bag-files {n}: must be at least 2 (the open split plus one closed split)"
                ));
            }
        }
        if self.min_free_space == Some(0) {
            return Err("--min-free-space must be greater than 0".into());
        }
        if let Some(p) = self.min_free_space_percent {
            if !(p > 0.0 && p < 100.0) {
                return Err(format!(
                    "--min-free-space-percent {p}: must be greater than 0 and less than 100"
                ));
            }
        }
        if self.is_circular() && max_bag_size == 0 && max_bag_duration_ns == 0 {
            let which = [
                self.max_record_size.map(|_| "--max-record-size"),
                self.max_record_duration_ns.map(|_| "--max-record-duration"),
                self.max_bag_files.map(|_| "--max-bag-files"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            return Err(format!(
                "{which} needs a split limit (-b/--max-bag-size or -d/--max-bag-duration): \
                 only closed splits can be deleted"
            ));
        }
        if let Some(size) = self.max_record_size {
            if max_bag_size == 0 {
                // Split by time only, one split could outgrow the whole budget unnoticed.
                return Err(format!(
                    "--max-record-size {size}: needs -b/--max-bag-size (at most half of it) so \
                     that no single split can outgrow the budget"
                ));
            }
            if size < max_bag_size.saturating_mul(2) {
                return Err(format!(
                    "--max-record-size {size}: must be at least twice --max-bag-size \
                     (2 x {max_bag_size} = {} bytes)",
                    max_bag_size.saturating_mul(2)
                ));
            }
        }
        if let Some(d) = self.max_record_duration_ns {
            if max_bag_duration_ns > 0 && d < max_bag_duration_ns.saturating_mul(2) {
                return Err(format!(
                    "--max-record-duration {}s: must be at least twice --max-bag-duration \
                     (2 x {}s)",
                    d as f64 / 1e9,
                    max_bag_duration_ns as f64 / 1e9
                ));
            }
        }
        Ok(())
    }
}

/// Free and total bytes of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use (`f_bavail`): the conservative figure.
    pub available: u64,
    pub total: u64,
}

/// Where free space comes from; a trait so tests can inject values.
pub trait FreeSpace: Send + std::fmt::Debug {
    fn space(&self, path: &Path) -> std::io::Result<Space>;
}

/// The real filesystem, through statvfs(2).
#[derive(Debug, Clone, Copy, Default)]
pub struct Statvfs;

impl FreeSpace for Statvfs {
    fn space(&self, path: &Path) -> std::io::Result<Space> {
        let s = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
        let frag = s.fragment_size() as u64;
        Ok(Space {
            available: (s.blocks_available() as u64).saturating_mul(frag),
            total: (s.blocks() as u64).saturating_mul(frag),
        })
    }
}

/// What retention needs from the bag being recorded. `BagWriter` is the real one; unit tests
/// use a fake.
pub trait CurrentBag {
    fn dir(&self) -> &Path;
    /// Bytes on disk of the open split.
    fn open_split_size(&self) -> u64;
    /// (start, end) of the open split's messages, if any.
    fn open_split_span(&self) -> Option<(i64, i64)>;
    /// Split limits of the writer: (max bytes, max duration ns); 0 = off.
    fn split_limits(&self) -> (u64, i64);
    fn take_newly_closed(&mut self) -> Vec<ClosedSplit>;
    fn delete_oldest_closed(&mut self) -> Result<Option<ClosedSplit>, BagError>;
    fn set_split_limit(&mut self, n: u32);
    fn split_limit_reached(&self) -> bool;
    /// Bytes of the open split's `-wal` and `-shm` files (WAL presets only).
    fn open_split_sidecars(&self) -> (u64, u64) {
        (0, 0)
    }
}

impl CurrentBag for BagWriter {
    fn dir(&self) -> &Path {
        BagWriter::dir(self)
    }
    fn open_split_size(&self) -> u64 {
        BagWriter::open_split_size(self)
    }
    fn open_split_span(&self) -> Option<(i64, i64)> {
        BagWriter::open_split_span(self)
    }
    fn split_limits(&self) -> (u64, i64) {
        let o = self.options();
        (o.max_bag_size, o.max_bag_duration_ns)
    }
    fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
        BagWriter::take_newly_closed(self)
    }
    fn delete_oldest_closed(&mut self) -> Result<Option<ClosedSplit>, BagError> {
        BagWriter::delete_oldest_closed(self)
    }
    fn set_split_limit(&mut self, n: u32) {
        BagWriter::set_split_limit(self, n)
    }
    fn split_limit_reached(&self) -> bool {
        BagWriter::split_limit_reached(self)
    }
    fn open_split_sidecars(&self) -> (u64, u64) {
        let (Some(idx), Some(name)) = (
            self.open_split_index(),
            BagWriter::dir(self).file_name().and_then(|n| n.to_str()),
        ) else {
            return (0, 0);
        };
        let base = BagWriter::dir(self).join(format!("{name}_{idx}.db3"));
        let len = |suffix: &str| {
            let mut p = base.as_os_str().to_owned();
            p.push(suffix);
            fs::metadata(PathBuf::from(p)).map_or(0, |m| m.len())
        };
        (len("-wal"), len("-shm"))
    }
}

/// Whose split a FIFO entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The front split of the front older bag.
    Old,
    /// The oldest closed split of the bag being recorded.
    Current,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    owner: Owner,
    size: u64,
    /// `NO_START` when the split has no (readable) messages.
    start_ns: i64,
}

/// A split of an older bag.
#[derive(Debug, Clone)]
struct OldSplit {
    rel: String,
    /// Listed in metadata.yaml (an unreadable leftover of a crash is not).
    listed: bool,
}

/// A finished (or interrupted) bag under the recording root.
#[derive(Debug)]
struct OldBag {
    dir: PathBuf,
    meta: BagMetadata,
    splits: VecDeque<OldSplit>,
    meta_bytes: u64,
}

/// The circular budget.
#[derive(Debug)]
pub struct Retention {
    policy: RetentionPolicy,
    fifo: VecDeque<Entry>,
    /// Sum of `fifo` sizes.
    fifo_bytes: u64,
    old: VecDeque<OldBag>,
    /// Sum of the older bags' metadata.yaml sizes (they are on the same budget).
    old_meta_bytes: u64,
    free: Box<dyn FreeSpace>,
    /// Largest empty split seen: the reserve for each split a batch may open.
    empty_split_bytes: u64,
    deleted_total: u64,
}

impl Retention {
    /// A budget over the bag being recorded only (`ringbag record`).
    pub fn new(policy: RetentionPolicy) -> Self {
        Retention {
            policy,
            fifo: VecDeque::new(),
            fifo_bytes: 0,
            old: VecDeque::new(),
            old_meta_bytes: 0,
            free: Box::new(Statvfs),
            empty_split_bytes: MIN_EMPTY_SPLIT_BYTES,
            deleted_total: 0,
        }
    }

    /// A budget over every bag under `root` plus the one being recorded in `current` (which
    /// is skipped in the scan). Older bags are ordered by starting time; a bag whose
    /// metadata.yaml is missing or unreadable is left alone (and not counted), with a warning.
    /// Split files on disk that metadata.yaml does not list (an interrupted recording) are
    /// added to it from their rows, so the rewritten metadata stays true.
    pub fn open_root(
        root: &Path,
        current: &Path,
        policy: RetentionPolicy,
    ) -> Result<Self, RetentionError> {
        let mut r = Retention::new(policy);
        let scan = |source| RetentionError::Scan {
            path: root.to_path_buf(),
            source,
        };
        let current_c = fs::canonicalize(current).unwrap_or_else(|_| current.to_path_buf());
        let mut bags = Vec::new();
        for e in fs::read_dir(root).map_err(scan)? {
            let dir = e.map_err(scan)?.path();
            if !dir.is_dir() || !dir.join(METADATA_FILE).is_file() {
                continue;
            }
            if fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone()) == current_c {
                continue;
            }
            if lock::state(&dir) == LockState::Held {
                // Another recorder (or a reindex) owns it: its budget is not ours to spend.
                log::info!(
                    "retention: leaving {} alone: another process holds its lock",
                    dir.display()
                );
                continue;
            }
            match OldBag::open(&dir) {
                Ok(Some(b)) => bags.push(b),
                Ok(None) => {}
                Err(e) => log::warn!("retention: leaving {} alone: {e}", dir.display()),
            }
        }
        bags.sort_by(|a, b| {
            (a.meta.starting_time_ns, &a.dir).cmp(&(b.meta.starting_time_ns, &b.dir))
        });
        for b in bags {
            for s in &b.splits {
                let path = b.dir.join(&s.rel);
                let start = b
                    .meta
                    .files
                    .iter()
                    .find(|f| f.path == s.rel && f.message_count > 0)
                    .map_or(NO_START, |f| f.starting_time_ns);
                r.push(Entry {
                    owner: Owner::Old,
                    size: split_size_on_disk(&path),
                    start_ns: start,
                });
            }
            r.old_meta_bytes += b.meta_bytes;
            r.old.push_back(b);
        }
        Ok(r)
    }

    /// Use another source of free-space figures (tests).
    pub fn with_free_space(mut self, free: Box<dyn FreeSpace>) -> Self {
        self.free = free;
        self
    }

    pub fn policy(&self) -> &RetentionPolicy {
        &self.policy
    }
    /// Bytes of the closed splits on the budget (older bags included).
    pub fn closed_bytes(&self) -> u64 {
        self.fifo_bytes
    }
    /// Closed splits on the budget (older bags included).
    pub fn closed_splits(&self) -> usize {
        self.fifo.len()
    }
    /// Older bags still under the root.
    pub fn older_bags(&self) -> Vec<PathBuf> {
        self.old.iter().map(|b| b.dir.clone()).collect()
    }
    /// Splits deleted so far.
    pub fn deleted(&self) -> u64 {
        self.deleted_total
    }

    /// Make room before a batch of `incoming` projected bytes (payload plus row overhead)
    /// whose newest message is at `newest_ns` is committed; returns splits deleted.
    pub fn before_batch<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        incoming: u64,
        newest_ns: i64,
    ) -> Result<u64, RetentionError> {
        self.sync(w);
        self.enforce(w, incoming, newest_ns)
    }

    /// Account for splits closed by the last batch (or a timer split) and re-apply the
    /// limits; returns the verdict and splits deleted.
    pub fn after_batch<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
    ) -> Result<(Verdict, u64), RetentionError> {
        self.sync(w);
        if self.policy.max_splits > 0 && w.split_limit_reached() {
            return Ok((Verdict::StopMaxSplits(self.policy.max_splits), 0));
        }
        let newest = w.open_split_span().map_or(NO_START, |(_, e)| e);
        let n = self.enforce(w, 0, newest)?;
        Ok((Verdict::Continue, n))
    }

    fn push(&mut self, e: Entry) {
        self.fifo_bytes += e.size;
        self.fifo.push_back(e);
    }

    /// Pull newly closed splits into the FIFO; learn the empty-split size.
    fn sync<B: CurrentBag + ?Sized>(&mut self, w: &mut B) {
        w.set_split_limit(self.policy.max_splits);
        for c in w.take_newly_closed() {
            self.push(Entry {
                owner: Owner::Current,
                size: c.size_bytes,
                start_ns: if c.file.message_count == 0 {
                    NO_START
                } else {
                    c.file.starting_time_ns
                },
            });
        }
        if w.open_split_span().is_none() {
            self.empty_split_bytes = self.empty_split_bytes.max(w.open_split_size());
        }
    }

    /// Splits the coming batch may open (size and duration boundaries inside it).
    fn splits_ahead<B: CurrentBag + ?Sized>(&self, w: &B, growth: u64, newest_ns: i64) -> u64 {
        let (max_size, max_dur) = w.split_limits();
        let mut n = 0;
        let open = w.open_split_size();
        if max_size > 0 && open + growth > max_size {
            n += (open + growth) / max_size + 1;
        }
        if let (true, Some((start, _))) = (max_dur > 0, w.open_split_span()) {
            if newest_ns != NO_START && newest_ns.saturating_sub(start) >= max_dur {
                n += (newest_ns.saturating_sub(start) / max_dur) as u64;
            }
        }
        n
    }

    fn enforce<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        incoming: u64,
        newest_ns: i64,
    ) -> Result<u64, RetentionError> {
        let mut deleted = 0;
        let growth = incoming.saturating_mul(GROWTH_FACTOR);
        let ahead = self.splits_ahead(w, growth, newest_ns);
        // One more split than the batch needs: a timer split may open one before the next
        // batch, without asking us.
        let split_reserve = (ahead + 1) * (self.empty_split_bytes + CLOSE_RESERVE_BYTES);
        // WAL presets: a checkpoint (at the latest when the split closes) copies the -wal's
        // pages into the .db3 while the -wal still exists, so the footprint briefly holds
        // them twice; -shm sits beside the open split.
        let (wal, shm) = w.open_split_sidecars();
        let batch_reserve = growth + split_reserve + wal + shm;

        if let Some(max) = self.policy.max_record_size {
            let meta = fs::metadata(w.dir().join(METADATA_FILE)).map_or(0, |m| m.len());
            let fixed = w.open_split_size()
                + batch_reserve
                + 2 * meta
                + METADATA_SLACK_BYTES
                + self.old_meta_bytes;
            while !self.fifo.is_empty() && self.fifo_bytes + fixed > max {
                self.delete_oldest(w)?;
                deleted += 1;
            }
        }
        if let Some(limit) = self.policy.max_record_duration_ns {
            let newest = match w.open_split_span() {
                Some((_, end)) if newest_ns == NO_START => end,
                Some((_, end)) => end.max(newest_ns),
                None => newest_ns,
            };
            if newest != NO_START {
                while let Some(front) = self.fifo.front() {
                    if front.start_ns != NO_START && newest.saturating_sub(front.start_ns) <= limit
                    {
                        break;
                    }
                    self.delete_oldest(w)?;
                    deleted += 1;
                }
            }
        }
        if let Some(n) = self.policy.max_bag_files {
            let allowed = u64::from(n).saturating_sub(1 + ahead);
            while !self.fifo.is_empty() && self.fifo.len() as u64 > allowed {
                self.delete_oldest(w)?;
                deleted += 1;
            }
        }
        if self.policy.min_free_space.is_some() || self.policy.min_free_space_percent.is_some() {
            deleted += self.keep_free_space(w, batch_reserve)?;
        }
        self.deleted_total += deleted;
        Ok(deleted)
    }

    /// Delete oldest splits until the partition keeps its floor after the coming batch; stop
    /// recording (an error) when nothing is left to delete.
    fn keep_free_space<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        batch: u64,
    ) -> Result<u64, RetentionError> {
        let path = w.dir().to_path_buf();
        let mut deleted = 0;
        loop {
            let s = self
                .free
                .space(&path)
                .map_err(|source| RetentionError::FreeSpace {
                    path: path.clone(),
                    source,
                })?;
            let pct = self
                .policy
                .min_free_space_percent
                .map_or(0, |p| (s.total as f64 * p / 100.0).ceil() as u64);
            let floor = self.policy.min_free_space.unwrap_or(0).max(pct);
            if s.available >= floor.saturating_add(batch) {
                return Ok(deleted);
            }
            if self.fifo.is_empty() {
                return Err(RetentionError::OutOfSpace {
                    path,
                    available: s.available,
                    floor,
                    batch,
                });
            }
            self.delete_oldest(w)?;
            deleted += 1;
        }
    }

    /// Leave the front older bag alone from now on: its remaining splits (each with its FIFO
    /// entry at the front) leave the budget, with a warning; recording goes on.
    fn abandon_front_old_bag(&mut self, why: &BagError) {
        let Some(bag) = self.old.pop_front() else {
            return;
        };
        log::warn!(
            "retention: leaving {} alone from now on: {why}",
            bag.dir.display()
        );
        for _ in 0..bag.splits.len() {
            if let Some(e) = self.fifo.pop_front() {
                self.fifo_bytes -= e.size;
            }
        }
        self.old_meta_bytes -= bag.meta_bytes;
    }

    /// Delete the oldest closed split on the budget, whichever bag holds it.
    fn delete_oldest<B: CurrentBag + ?Sized>(&mut self, w: &mut B) -> Result<(), RetentionError> {
        let Some(e) = self.fifo.pop_front() else {
            return Ok(());
        };
        self.fifo_bytes -= e.size;
        match e.owner {
            Owner::Current => {
                w.delete_oldest_closed()?;
            }
            Owner::Old => {
                if let Some(bag) = self.old.front_mut() {
                    // Hold the older bag's lock while changing it, so a reindex or another
                    // recorder's retention never works on it at the same moment.
                    let guard = match OldBagLock::acquire(&bag.dir) {
                        Ok(g) => g,
                        Err(e) => {
                            // Taken by someone else since the scan, removed by another
                            // recorder sharing the root, or not ours to change (permissions).
                            bag.splits.pop_front(); // its FIFO entry is already gone
                            self.abandon_front_old_bag(&e);
                            return Ok(());
                        }
                    };
                    let before = bag.meta_bytes;
                    let emptied = match bag.delete_oldest() {
                        Ok(emptied) => emptied,
                        Err(e) => {
                            // An older bag is not worth the recording: stop counting it.
                            // Dropping the guard keeps its marker: a reindex will look at it.
                            drop(guard);
                            self.abandon_front_old_bag(&e);
                            return Ok(());
                        }
                    };
                    guard.release()?;
                    self.old_meta_bytes = self.old_meta_bytes - before + bag.meta_bytes;
                    if emptied {
                        self.old_meta_bytes -= bag.meta_bytes;
                        self.old.pop_front();
                    }
                }
            }
        }
        Ok(())
    }
}

/// The lock of an older bag while retention changes it. A bag that was clean is clean
/// again after a successful change; one left unclean by a crash keeps its marker (it still
/// needs a reindex), and so does any bag if we die in between.
struct OldBagLock {
    lock: BagLock,
    was_unclean: bool,
}

impl OldBagLock {
    fn acquire(dir: &Path) -> Result<Self, BagError> {
        let was_unclean = dir.join(LOCK_FILE).exists();
        let lock = BagLock::acquire(dir)?;
        if !dir.join(METADATA_FILE).exists() {
            // Another recorder sharing the root removed this bag, or is removing it and our
            // lock file is what keeps its directory from going: finish that, leave it be.
            let meta = dir.join(METADATA_FILE);
            lock.release_clean()?;
            let _ = fs::remove_dir(dir);
            return Err(BagError::NotFound { path: meta });
        }
        Ok(OldBagLock { lock, was_unclean })
    }

    fn release(self) -> Result<(), BagError> {
        if self.was_unclean || !self.lock.dir().exists() {
            // Unclean stays unclean; a removed bag has nothing left to mark.
            return Ok(());
        }
        self.lock.release_clean()
    }
}

impl OldBag {
    /// Read a bag under the root; reconcile metadata.yaml with the split files on disk.
    /// `None` when it has no split files at all.
    fn open(dir: &Path) -> Result<Option<OldBag>, BagError> {
        let mut meta = BagMetadata::read(dir)?;
        let on_disk = find_split_files(dir)?;
        if on_disk.is_empty() {
            return Ok(None);
        }
        let listed: Vec<String> = meta.files.iter().map(|f| f.path.clone()).collect();
        let consistent =
            listed.len() == on_disk.len() && on_disk.iter().all(|f| listed.contains(f));
        let mut splits: VecDeque<OldSplit> = on_disk
            .iter()
            .map(|rel| OldSplit {
                rel: rel.clone(),
                listed: true,
            })
            .collect();
        let dirty = !consistent;
        if dirty {
            // An interrupted recording (files metadata.yaml does not list) or a crash after a
            // deletion (listed files gone): recount this bag from its rows, once, so the
            // metadata we rewrite later is true. Unreadable files still count against the
            // budget, go first, and stay out of the metadata.
            log::info!(
                "retention: reconciling {} with its split files",
                dir.display()
            );
            meta.files.clear();
            for t in &mut meta.topics {
                t.message_count = 0;
            }
            let mut unreadable = Vec::new();
            splits.clear();
            for rel in &on_disk {
                match split_counts(&dir.join(rel)) {
                    Ok((file, per_topic)) => {
                        for (info, n) in per_topic {
                            match meta.topics.iter_mut().find(|t| t.topic.name == info.name) {
                                Some(t) => t.message_count += n,
                                None => meta.topics.push(TopicWithCount {
                                    topic: info,
                                    message_count: n,
                                }),
                            }
                        }
                        meta.files.push(FileInfo {
                            path: rel.clone(),
                            ..file
                        });
                        splits.push_back(OldSplit {
                            rel: rel.clone(),
                            listed: true,
                        });
                    }
                    Err(e) => {
                        log::warn!("retention: {rel} in {} is unreadable: {e}", dir.display());
                        unreadable.push(OldSplit {
                            rel: rel.clone(),
                            listed: false,
                        });
                    }
                }
            }
            for u in unreadable.into_iter().rev() {
                splits.push_front(u);
            }
        }
        let mut bag = OldBag {
            dir: dir.to_path_buf(),
            meta,
            splits,
            meta_bytes: 0,
        };
        if dirty {
            bag.refresh_totals();
            let guard = OldBagLock::acquire(dir)?;
            bag.write_meta()?;
            guard.release()?;
        }
        bag.meta_bytes = fs::metadata(dir.join(METADATA_FILE)).map_or(0, |m| m.len());
        Ok(Some(bag))
    }

    /// Start, duration, count and file list from the remaining files: O(files of this bag).
    fn refresh_totals(&mut self) {
        let m = &mut self.meta;
        let with = m.files.iter().filter(|f| f.message_count > 0);
        let start = with.clone().map(|f| f.starting_time_ns).min();
        let end = with.map(|f| f.starting_time_ns + f.duration_ns).max();
        match (start, end) {
            (Some(s), Some(e)) => {
                m.starting_time_ns = s;
                m.duration_ns = e - s;
            }
            _ => {
                m.starting_time_ns = NO_START;
                m.duration_ns = 0;
            }
        }
        m.message_count = m.files.iter().map(|f| f.message_count).sum();
        m.relative_file_paths = m.files.iter().map(|f| f.path.clone()).collect();
    }

    fn write_meta(&mut self) -> Result<(), BagError> {
        let flavour = self.meta.flavour();
        self.meta.write_atomic(&self.dir, flavour)?;
        self.meta_bytes = fs::metadata(self.dir.join(METADATA_FILE)).map_or(0, |m| m.len());
        Ok(())
    }

    /// Delete the oldest split; returns true when the bag is now empty and was removed.
    fn delete_oldest(&mut self) -> Result<bool, BagError> {
        let Some(split) = self.splits.pop_front() else {
            return Ok(true);
        };
        let path = self.dir.join(&split.rel);
        if self.splits.is_empty() {
            // Nothing left: the whole bag goes. Remove the metadata first so a crash never
            // leaves a bag that lists a missing file.
            let meta = self.dir.join(METADATA_FILE);
            match fs::remove_file(&meta) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BagError::io(&meta)(e)),
            }
            fs::remove_dir_all(&self.dir).map_err(BagError::io(&self.dir))?;
            if let Some(parent) = self.dir.parent() {
                sync_dir(parent)?;
            }
            log::info!("retention: removed emptied bag {}", self.dir.display());
            return Ok(true);
        }
        // Another recorder sharing the root may have changed this bag since we read it (we
        // hold its lock now): start from what is on disk, O(files of this bag).
        self.meta = BagMetadata::read(&self.dir)?;
        if fs::symlink_metadata(&path).is_err() {
            // Already deleted by that other recorder; its metadata.yaml no longer lists it.
            self.meta.files.retain(|f| f.path != split.rel);
            self.refresh_totals();
            self.write_meta()?;
            return Ok(false);
        }
        if split.listed {
            // Per-topic counts of this one split, from its rows: bounded by the split size.
            match split_counts(&path) {
                Ok((_, per_topic)) => {
                    for (info, n) in per_topic {
                        if let Some(t) = self
                            .meta
                            .topics
                            .iter_mut()
                            .find(|t| t.topic.name == info.name)
                        {
                            t.message_count = t.message_count.saturating_sub(n);
                        }
                    }
                }
                Err(e) => log::warn!("retention: counting {}: {e}", path.display()),
            }
            self.meta.files.retain(|f| f.path != split.rel);
            self.refresh_totals();
            // metadata.yaml first (see BagWriter::delete_oldest_closed for why).
            self.write_meta()?;
        }
        crate::bag::writer::remove_split_file(&crate::bag::writer::RealStorage, &path)?;
        sync_dir(&self.dir)?;
        Ok(false)
    }
}

/// A split's summary and per-topic counts (by topic name), read from its rows.
fn split_counts(path: &Path) -> Result<(FileInfo, Vec<(TopicInfo, u64)>), BagError> {
    let conn = open_read_only(path)?;
    let stats = split_stats(&conn, path)?;
    let topics = read_topics(&conn, path)?;
    let per_topic = topics
        .into_iter()
        .filter_map(|(id, info)| stats.per_topic_id.get(&id).map(|n| (info, *n)))
        .collect();
    let file = FileInfo {
        path: String::new(),
        starting_time_ns: stats.start_ns,
        duration_ns: if stats.count > 0 {
            stats.end_ns - stats.start_ns
        } else {
            0
        },
        message_count: stats.count,
    };
    Ok((file, per_topic))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const MB: u64 = 1 << 20;
    const S: i64 = 1_000_000_000;

    /// An in-memory current bag: closed splits with sizes and spans, an open split.
    #[derive(Debug, Default)]
    struct FakeBag {
        dir: PathBuf,
        closed: VecDeque<ClosedSplit>,
        newly: Vec<ClosedSplit>,
        open_size: u64,
        open_span: Option<(i64, i64)>,
        limits: (u64, i64),
        deleted: Vec<u32>,
        next: u32,
        /// Shared with `FakeSpace`: deletions free bytes.
        freed: Option<Arc<Mutex<u64>>>,
    }

    impl FakeBag {
        fn new(limits: (u64, i64)) -> Self {
            FakeBag {
                dir: PathBuf::from("/fake/bag"),
                limits,
                open_size: MIN_EMPTY_SPLIT_BYTES,
                ..Default::default()
            }
        }
        /// Close the open split as a split of `size` bytes spanning `start..end`.
        fn close(&mut self, size: u64, start: i64, end: i64) {
            let c = ClosedSplit {
                index: self.next,
                file: FileInfo {
                    path: format!("b_{}.db3", self.next),
                    starting_time_ns: start,
                    duration_ns: end - start,
                    message_count: 1,
                },
                path: self.dir.join(format!("b_{}.db3", self.next)),
                size_bytes: size,
                per_topic: vec![1],
            };
            self.next += 1;
            self.closed.push_back(c.clone());
            self.newly.push(c);
        }
        fn on_disk(&self) -> u64 {
            self.closed.iter().map(|c| c.size_bytes).sum::<u64>() + self.open_size
        }
    }

    impl CurrentBag for FakeBag {
        fn dir(&self) -> &Path {
            &self.dir
        }
        fn open_split_size(&self) -> u64 {
            self.open_size
        }
        fn open_split_span(&self) -> Option<(i64, i64)> {
            self.open_span
        }
        fn split_limits(&self) -> (u64, i64) {
            self.limits
        }
        fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
            std::mem::take(&mut self.newly)
        }
        fn delete_oldest_closed(&mut self) -> Result<Option<ClosedSplit>, BagError> {
            let c = self.closed.pop_front();
            if let Some(c) = &c {
                self.deleted.push(c.index);
                if let Some(f) = &self.freed {
                    *f.lock().unwrap() += c.size_bytes;
                }
            }
            Ok(c)
        }
        fn set_split_limit(&mut self, _n: u32) {}
        fn split_limit_reached(&self) -> bool {
            false
        }
    }

    #[derive(Debug)]
    struct FakeSpace {
        base_available: u64,
        total: u64,
        freed: Arc<Mutex<u64>>,
    }
    impl FreeSpace for FakeSpace {
        fn space(&self, _path: &Path) -> std::io::Result<Space> {
            Ok(Space {
                available: self.base_available + *self.freed.lock().unwrap(),
                total: self.total,
            })
        }
    }

    fn size_policy(max: u64) -> RetentionPolicy {
        RetentionPolicy {
            max_record_size: Some(max),
            ..Default::default()
        }
    }

    #[test]
    fn deletes_oldest_closed_splits_until_the_coming_batch_fits_the_size_budget() {
        let mut bag = FakeBag::new((MB, 0));
        let mut r = Retention::new(size_policy(4 * MB));
        for i in 0..10 {
            bag.close(MB, i * S, i * S + S / 2);
            bag.open_size = MIN_EMPTY_SPLIT_BYTES;
            let incoming = 100 * 1024;
            r.before_batch(&mut bag, incoming, i * S + S).unwrap();
            // The bound holds with the batch's worst-case growth and a new split counted.
            let reserve = incoming * GROWTH_FACTOR
                + 2 * (r.empty_split_bytes + CLOSE_RESERVE_BYTES)
                + METADATA_SLACK_BYTES;
            assert!(bag.on_disk() + reserve <= 4 * MB, "split {i}");
            assert_eq!(
                r.closed_bytes(),
                bag.closed.iter().map(|c| c.size_bytes).sum::<u64>()
            );
        }
        // Deleted strictly oldest first.
        assert_eq!(
            bag.deleted,
            (0..bag.deleted.len() as u32).collect::<Vec<_>>()
        );
        assert!(bag.deleted.len() >= 7, "deleted {:?}", bag.deleted);
        assert_eq!(r.deleted(), bag.deleted.len() as u64);
    }

    #[test]
    fn never_deletes_the_open_split_even_when_it_alone_exceeds_the_budget() {
        let mut bag = FakeBag::new((MB, 0));
        let mut r = Retention::new(size_policy(2 * MB));
        bag.close(MB, 0, S);
        bag.open_size = 3 * MB;
        let n = r.before_batch(&mut bag, MB, 2 * S).unwrap();
        assert_eq!(n, 1);
        assert!(bag.closed.is_empty());
        assert_eq!(bag.open_size, 3 * MB);
        // Nothing left to delete: no error, no further deletions.
        assert_eq!(r.before_batch(&mut bag, MB, 3 * S).unwrap(), 0);
    }

    #[test]
    fn keeps_the_span_from_the_oldest_split_to_the_newest_message_within_the_duration() {
        let mut bag = FakeBag::new((0, 10 * S));
        let policy = RetentionPolicy {
            max_record_duration_ns: Some(30 * S),
            ..Default::default()
        };
        let mut r = Retention::new(policy);
        for i in 0..20i64 {
            bag.close(MB, i * 10 * S, i * 10 * S + 10 * S - 1);
            let newest = (i + 1) * 10 * S + 5 * S;
            bag.open_span = Some(((i + 1) * 10 * S, newest));
            r.before_batch(&mut bag, 1000, newest).unwrap();
            let oldest = bag
                .closed
                .front()
                .map_or(newest, |c| c.file.starting_time_ns);
            assert!(newest - oldest <= 30 * S, "span {} at {i}", newest - oldest);
            // Coverage: at least the limit minus one split duration once warmed up.
            if i >= 3 {
                assert!(
                    newest - oldest >= 20 * S,
                    "coverage {} at {i}",
                    newest - oldest
                );
            }
        }
    }

    #[test]
    fn keeps_at_most_max_bag_files_counting_the_open_split() {
        let mut bag = FakeBag::new((MB, 0));
        let policy = RetentionPolicy {
            max_bag_files: Some(4),
            ..Default::default()
        };
        let mut r = Retention::new(policy);
        for i in 0..12 {
            bag.close(MB / 2, i * S, i * S + 1);
            r.after_batch(&mut bag).unwrap();
            assert!(bag.closed.len() < 4, "{} closed at {i}", bag.closed.len());
        }
        // A batch that will cross the size limit reserves a place for the split it opens.
        bag.open_size = MB - 1000;
        r.before_batch(&mut bag, 10_000, 20 * S).unwrap();
        assert!(bag.closed.len() < 3);
    }

    #[test]
    fn deletes_oldest_splits_until_the_free_space_floor_holds() {
        let freed = Arc::new(Mutex::new(0));
        let mut bag = FakeBag::new((MB, 0));
        bag.freed = Some(freed.clone());
        let policy = RetentionPolicy {
            min_free_space: Some(10 * MB),
            ..Default::default()
        };
        let space = FakeSpace {
            base_available: 8 * MB,
            total: 100 * MB,
            freed,
        };
        let mut r = Retention::new(policy).with_free_space(Box::new(space));
        for i in 0..6 {
            bag.close(MB, i * S, i * S + 1);
        }
        bag.open_span = Some((6 * S, 6 * S));
        let n = r.before_batch(&mut bag, 1000, 7 * S).unwrap();
        // 8 MiB free + k deleted MiB must cover 10 MiB plus the batch reserve: k = 3.
        assert_eq!(n, 3);
        assert_eq!(bag.deleted, vec![0, 1, 2]);
    }

    #[test]
    fn stops_with_a_clear_error_when_space_is_short_and_nothing_is_left_to_delete() {
        let freed = Arc::new(Mutex::new(0));
        let mut bag = FakeBag::new((MB, 0));
        bag.freed = Some(freed.clone());
        let policy = RetentionPolicy {
            min_free_space_percent: Some(20.0),
            ..Default::default()
        };
        let space = FakeSpace {
            base_available: 10 * MB,
            total: 100 * MB,
            freed,
        };
        let mut r = Retention::new(policy).with_free_space(Box::new(space));
        bag.close(MB, 0, 1);
        let e = r.before_batch(&mut bag, 1000, S).unwrap_err().to_string();
        assert_eq!(bag.deleted, vec![0]);
        for needle in [
            "/fake/bag",
            "free-space floor",
            "--min-free-space",
            "no closed split",
        ] {
            assert!(e.contains(needle), "`{needle}` missing from: {e}");
        }
        assert!(e.contains(&(20 * MB).to_string()), "{e}");
    }

    #[test]
    fn running_totals_match_the_splits_kept_after_thousands_of_updates() {
        let mut bag = FakeBag::new((MB, 0));
        let mut r = Retention::new(size_policy(10 * MB));
        for i in 0..5000i64 {
            bag.close(MB / 2 + (i as u64 % 7) * 1000, i, i + 1);
            r.after_batch(&mut bag).unwrap();
        }
        assert_eq!(r.closed_splits(), bag.closed.len());
        assert_eq!(
            r.closed_bytes(),
            bag.closed.iter().map(|c| c.size_bytes).sum::<u64>()
        );
    }

    #[test]
    fn validation_rejects_a_circular_limit_without_a_split_limit() {
        let e = size_policy(10 * MB).validate(0, 0).unwrap_err();
        assert!(
            e.contains("--max-record-size") && e.contains("-b/--max-bag-size"),
            "{e}"
        );
        let p = RetentionPolicy {
            max_bag_files: Some(3),
            ..Default::default()
        };
        assert!(p.validate(0, 0).unwrap_err().contains("--max-bag-files"));
        // The free-space floor alone needs no split limit: it stops recording instead.
        let p = RetentionPolicy {
            min_free_space: Some(MB),
            ..Default::default()
        };
        assert!(p.validate(0, 0).is_ok());
    }

    #[test]
    fn validation_rejects_a_size_budget_under_twice_the_split_size() {
        let e = size_policy(3 * MB).validate(2 * MB, 0).unwrap_err();
        assert!(
            e.contains("--max-record-size") && e.contains("twice --max-bag-size"),
            "{e}"
        );
        assert!(size_policy(4 * MB).validate(2 * MB, 0).is_ok());
        let e = size_policy(4 * MB).validate(0, 10 * S).unwrap_err();
        assert!(
            e.contains("--max-record-size") && e.contains("needs -b/--max-bag-size"),
            "{e}"
        );
    }

    #[test]
    fn validation_rejects_a_duration_budget_under_twice_the_split_duration() {
        let p = RetentionPolicy {
            max_record_duration_ns: Some(15 * S),
            ..Default::default()
        };
        let e = p.validate(0, 10 * S).unwrap_err();
        assert!(
            e.contains("--max-record-duration 15s") && e.contains("2 x 10s"),
            "{e}"
        );
        assert!(p.validate(0, 7 * S).is_ok());
    }

    #[test]
    fn validation_rejects_zero_and_out_of_range_values() {
        assert!(size_policy(0)
            .validate(MB, 0)
            .unwrap_err()
            .contains("greater than 0"));
        for p in [0.0, 100.0, -3.0, 150.0, f64::NAN] {
            let pol = RetentionPolicy {
                min_free_space_percent: Some(p),
                ..Default::default()
            };
            let e = pol.validate(MB, 0).unwrap_err();
            assert!(e.contains("--min-free-space-percent"), "{e}");
        }
        let pol = RetentionPolicy {
            max_bag_files: Some(1),
            ..Default::default()
        };
        assert!(pol.validate(MB, 0).unwrap_err().contains("at least 2"));
    }
}
