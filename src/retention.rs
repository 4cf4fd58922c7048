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
//!
//! With fleet offload, the uploader answers "is this file out?" through an [`UploadLedger`]
//! ([`Retention::with_upload_ledger`]): when the budget needs room, uploaded files go first,
//! oldest uploaded first, whichever bag holds them; a file not uploaded goes only when no
//! uploaded one is left and the budget still forces it, and is then counted
//! ([`Retention::deleted_before_upload`]). Without a ledger, the oldest split goes, as before.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::bag::lock::{self, BagLock, LockState, LOCK_FILE};
use crate::bag::metadata::{
    sync_dir, BagMetadata, FileInfo, TopicWithCount, METADATA_FILE, NO_START,
};
use crate::bag::reader::{find_splits, open_read_only, read_topics, split_stats};
use crate::bag::writer::{row_growth_bytes, split_size_on_disk, BagWriter, ClosedSplit};
use crate::bag::{BagError, TopicInfo};

/// Reserve for a new split's empty file (schema, topics) until the real size is learned from
/// the writer's first, still empty split.
pub const MIN_EMPTY_SPLIT_BYTES: u64 = 64 * 1024;
/// Reserve per split closed inside a batch (Jazzy writes a metadata row at close).
pub const CLOSE_RESERVE_BYTES: u64 = 32 * 1024;
/// metadata.yaml is rewritten through a temporary file next to it.
const METADATA_SLACK_BYTES: u64 = 4096;
/// B-tree pages a commit may rewrite or add beyond the rows' own (interior pages of the
/// messages table and the timestamp index, the header page): 8 pages, here of 4 KiB
/// ([`commit_reserve`] for other page sizes). It also holds a split's first commits' rollback
/// journal (`bag::schema::guard_journal_bytes`, `StoragePreset::commits_can_tear`): while
/// the `messages` root is a leaf, neither b-tree has interior pages yet, so such a commit
/// adds at most 2 pages beyond its rows (the first child of each root), and 2 pages plus the
/// journal fit in 8 (`the_commit_reserve_holds_a_guarded_commits_journal`).
pub const COMMIT_RESERVE_BYTES: u64 = 8 * 4096;

/// [`COMMIT_RESERVE_BYTES`] for a split of `page_size`-byte pages.
pub fn commit_reserve(page_size: u64) -> u64 {
    8 * page_size
}
/// What `du` counts beyond the files: the bag directory itself, and the lock file.
pub const BAG_DIR_RESERVE_BYTES: u64 = 2 * 4096;

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
         (--min-free-space/--min-free-space-percent) plus {batch} bytes for the next batch \
         and {beside} bytes a snapshot may still write, and no closed split is left to \
         delete; stopping so the disk never fills"
    )]
    OutOfSpace {
        path: PathBuf,
        available: u64,
        floor: u64,
        batch: u64,
        beside: u64,
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

/// `ringbag record`'s free-space floor when no floor flag is given: this share of the
/// partition (percent)...
pub const DEFAULT_MIN_FREE_SPACE_PERCENT: u64 = 5;
/// ...or this many bytes, whichever is smaller (a large disk need not keep 5 % empty).
pub const DEFAULT_MIN_FREE_SPACE_MAX: u64 = 1 << 30;

/// The default floor on a partition of `total` bytes (see the constants above).
pub fn default_min_free_space(total: u64) -> u64 {
    (total / 100 * DEFAULT_MIN_FREE_SPACE_PERCENT).min(DEFAULT_MIN_FREE_SPACE_MAX)
}

impl RetentionPolicy {
    /// True when a limit deletes old splits to make room (the free-space floor aside).
    pub fn is_circular(&self) -> bool {
        self.max_record_size.is_some()
            || self.max_record_duration_ns.is_some()
            || self.max_bag_files.is_some()
    }

    /// True when a free-space floor is set (`--min-free-space` or `--min-free-space-percent`).
    pub fn has_free_floor(&self) -> bool {
        self.min_free_space.is_some() || self.min_free_space_percent.is_some()
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

/// Where a closed file stands with the uploader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadState {
    /// Verified in the bucket (HEAD showed the expected size and ETag): may be deleted.
    Uploaded,
    /// Being transferred now: [`UploadLedger::abort`] it before deleting it.
    InFlight,
    /// Not out yet, nothing reads it (queued, waiting for a retry, or unknown to the uploader).
    Pending,
}

/// What retention asks the uploader about a closed file. Files are named as retention and the
/// writer spell them, not canonicalized: the recording root as configured (absolute in the
/// service), joined with the bag directory's name and the split's; the uploader keys its
/// state the same way. Implemented by the uploader, which holds the real state; the writer
/// thread only asks, when it needs room and once per turn, so every answer must be cheap: no
/// I/O, and no lock held across network calls.
pub trait UploadLedger: Send + Sync + std::fmt::Debug {
    fn state(&self, file: &Path) -> UploadState;
    /// Stop any transfer of `file` and keep it from starting again; returns once nothing
    /// reads it (retention deletes it next). Called before every forced deletion of a file
    /// not uploaded, pending ones included, so none can start between the answer and the
    /// unlink.
    fn abort(&self, file: &Path);
    /// `file` (`bytes` on disk) was deleted before it got out, forced by the budget: record it
    /// in the bag's upload journal. Called after the file is gone.
    fn deleted_before_upload(&self, file: &Path, bytes: u64);
    /// A number that changes whenever a file becomes [`UploadState::Uploaded`] (a counter of
    /// files verified will do). With `delete_after_upload`, retention looks for uploaded files
    /// only when it changed, so a turn without news costs one atomic load, not a pass over
    /// every file on the budget.
    fn generation(&self) -> u64;
    /// One or more splits were closed (fsynced, listed): the uploader may look now instead of
    /// at its next poll. Called on the writer thread, at most once per batch: it must only
    /// signal, never wait.
    fn split_closed(&self) {}
}

/// How a budget works with the uploader, carried by the settings that build a [`Retention`]
/// (`RecordSettings`, the crash recovery's options). The default (no ledger) is retention as
/// it was before offload: oldest first.
#[derive(Debug, Clone, Default)]
pub struct UploadRetention {
    pub ledger: Option<Arc<dyn UploadLedger>>,
    /// `[upload] delete_after_upload`: delete a file once it is verified in the bucket.
    pub delete_after_upload: bool,
}

/// Files and bytes deleted before they got out (forced by the budget).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeletedBeforeUpload {
    pub files: u64,
    pub bytes: u64,
}

/// What retention needs from the bag being recorded. `BagWriter` is the real one; unit tests
/// use a fake.
pub trait CurrentBag {
    fn dir(&self) -> &Path;
    /// Bytes on disk of the open split with its `-wal`/`-shm` (0 when none is open).
    fn open_split_footprint(&self) -> u64;
    /// Whether a split is open (between closing one and opening the next, none is).
    fn has_open_split(&self) -> bool {
        true
    }
    /// (start, end) of the open split's messages, if any.
    fn open_split_span(&self) -> Option<(i64, i64)>;
    /// Bytes closing the open split may add (a final metadata row, a WAL checkpoint).
    fn close_reserve(&self) -> u64 {
        CLOSE_RESERVE_BYTES
    }
    /// Bytes of the open split's `-wal` (WAL presets); a checkpoint may copy that much into
    /// the file while the `-wal` still exists.
    fn open_split_wal(&self) -> u64 {
        0
    }
    /// Whether the splits are written through a WAL (every page is written twice).
    fn uses_wal(&self) -> bool {
        false
    }
    /// The open split's SQLite page size (the unit of its growth and of a commit's reserve).
    fn page_size(&self) -> u64 {
        4096
    }
    /// What compressions of closed splits in flight may still add beside them
    /// (`--compression-mode file`: each its `.zstd` while the `.db3` exists).
    fn compression_reserve(&self) -> u64 {
        0
    }
    fn take_newly_closed(&mut self) -> Vec<ClosedSplit>;
    /// Closed splits (by the path `take_newly_closed` gave) now on disk at a smaller size:
    /// their `.db3` replaced by a `.zstd` of that many bytes.
    fn take_compressed_sizes(&mut self) -> Vec<(PathBuf, u64)> {
        Vec::new()
    }
    /// Delete the closed split at `path` (as given by `take_newly_closed`), keeping
    /// metadata.yaml true; `None` when no closed split is there.
    fn delete_closed(&mut self, path: &Path) -> Result<Option<ClosedSplit>, BagError>;
    fn set_split_limit(&mut self, n: u32);
    fn split_limit_reached(&self) -> bool;
}

impl CurrentBag for BagWriter {
    fn dir(&self) -> &Path {
        BagWriter::dir(self)
    }
    fn open_split_footprint(&self) -> u64 {
        BagWriter::open_split_footprint(self)
    }
    fn has_open_split(&self) -> bool {
        self.open_split_index().is_some()
    }
    fn open_split_span(&self) -> Option<(i64, i64)> {
        BagWriter::open_split_span(self)
    }
    fn close_reserve(&self) -> u64 {
        BagWriter::close_reserve(self)
    }
    fn open_split_wal(&self) -> u64 {
        self.open_split_path()
            .map_or(0, |p| crate::bag::writer::sidecar_sizes(p).0)
    }
    fn uses_wal(&self) -> bool {
        self.options().preset.uses_wal()
    }
    fn page_size(&self) -> u64 {
        BagWriter::page_size(self)
    }
    fn compression_reserve(&self) -> u64 {
        BagWriter::compression_reserve(self)
    }
    fn take_compressed_sizes(&mut self) -> Vec<(PathBuf, u64)> {
        BagWriter::take_compressed_sizes(self)
    }
    fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
        BagWriter::take_newly_closed(self)
    }
    fn delete_closed(&mut self, path: &Path) -> Result<Option<ClosedSplit>, BagError> {
        BagWriter::delete_closed(self, path)
    }
    fn set_split_limit(&mut self, n: u32) {
        BagWriter::set_split_limit(self, n)
    }
    fn split_limit_reached(&self) -> bool {
        BagWriter::split_limit_reached(self)
    }
}

/// Bytes on disk for rows that add `growth` bytes to the file, before what a `-wal` already
/// holds: the b-tree pages a commit rewrites on top, and with a WAL every page once in the
/// `-wal` (plus its frame header) and once more in the file at the next checkpoint.
pub fn rows_disk_growth(growth: u64, uses_wal: bool, page_size: u64) -> u64 {
    let file = growth + commit_reserve(page_size);
    if uses_wal {
        2 * file + file / 128
    } else {
        file
    }
}

/// The largest single message the size budget can ever hold, from
/// [`Retention::oversize_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OversizeLimit {
    /// Bytes one message row may add to disk; `None` without a size budget.
    room: Option<u64>,
    uses_wal: bool,
    page_size: u64,
}

impl OversizeLimit {
    /// No size budget: every message fits.
    pub const NONE: OversizeLimit = OversizeLimit {
        room: None,
        uses_wal: false,
        page_size: 4096,
    };

    /// Whether a message of `len` payload bytes fits.
    pub fn fits(&self, len: u64) -> bool {
        self.room.is_none_or(|room| {
            let growth = row_growth_bytes(len, self.page_size);
            rows_disk_growth(growth, self.uses_wal, self.page_size) <= room
        })
    }
}

/// The bag being recorded before it exists: no split, nothing closed, nothing of its own to
/// delete. Lets the limits be enforced over the older bags alone.
struct NoBagYet<'a> {
    dir: &'a Path,
}

impl CurrentBag for NoBagYet<'_> {
    fn dir(&self) -> &Path {
        self.dir
    }
    fn open_split_footprint(&self) -> u64 {
        0
    }
    fn has_open_split(&self) -> bool {
        false
    }
    fn open_split_span(&self) -> Option<(i64, i64)> {
        None
    }
    fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
        Vec::new()
    }
    fn delete_closed(&mut self, _path: &Path) -> Result<Option<ClosedSplit>, BagError> {
        Ok(None)
    }
    fn set_split_limit(&mut self, _n: u32) {}
    fn split_limit_reached(&self) -> bool {
        false
    }
}

/// Whose split a FIFO entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// A split of the older bag with this [`OldBag::id`]. Without a ledger it is always the
    /// front split of the front older bag when it reaches the FIFO's front.
    Old(u64),
    /// A closed split of the bag being recorded.
    Current,
}

#[derive(Debug, Clone)]
struct Entry {
    owner: Owner,
    size: u64,
    /// `NO_START` when the split has no (readable) messages.
    start_ns: i64,
    /// The split file: what the ledger is asked about and what is deleted.
    path: PathBuf,
}

/// A split of an older bag.
#[derive(Debug, Clone)]
struct OldSplit {
    /// The split's file as on disk: `<split>.db3`, or `<split>.db3.zstd` once compressed
    /// (rosbag2's file mode).
    rel: String,
    /// Listed in metadata.yaml (an unreadable leftover of a crash is not).
    listed: bool,
}

/// A finished (or interrupted) bag under the recording root.
#[derive(Debug)]
struct OldBag {
    /// Ascending in the order bags join the budget (`Retention::old` stays sorted by it).
    id: u64,
    dir: PathBuf,
    meta: BagMetadata,
    splits: VecDeque<OldSplit>,
    meta_bytes: u64,
}

/// What the budget holds, for status reports ([`Retention::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub files: u64,
    pub oldest_start_ns: Option<i64>,
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
    /// Largest empty split seen (footprint with sidecars): the reserve for opening one.
    empty_split_bytes: u64,
    /// Whether `empty_split_bytes` was measured (else it is the fallback guess).
    empty_split_learned: bool,
    deleted_total: u64,
    /// Bytes a bag being written under the root beside the recording (a snapshot) was granted
    /// ([`Retention::room_beside`]), counted against `max_record_size` until it is finished
    /// and adopted ([`Retention::adopt_bag`]).
    in_progress_bytes: u64,
    /// What that bag occupies now, as it last reported ([`Room::report_on_disk`]): the rest
    /// of its grant is still to be written, so the free-space floor keeps room for it. Without
    /// it, the recording's own batches could take the free space a snapshot was granted, and
    /// the snapshot's next writes then went below the floor.
    ///
    /// [`Room::report_on_disk`]: crate::pipeline::room::Room::report_on_disk
    beside_on_disk: Option<Arc<AtomicU64>>,
    /// What it occupied at its last question (`room_beside`), when it does not report.
    beside_asked_on_disk: u64,
    /// The uploader's answers; `None` keeps the plain oldest-first order.
    ledger: Option<Arc<dyn UploadLedger>>,
    /// Delete every uploaded file at each turn, room needed or not.
    delete_after_upload: bool,
    /// The ledger's generation at the last sweep for `delete_after_upload`.
    swept_generation: Option<u64>,
    /// Next [`OldBag::id`].
    next_bag_id: u64,
    /// Largest metadata.yaml of an older bag (an upper bound: it only grows, and is recomputed
    /// when a bag leaves): with a ledger any older bag, not only the front one, may be
    /// rewritten to lose a split.
    max_old_meta_bytes: u64,
    before_upload: DeletedBeforeUpload,
    /// Per bag directory, for bags still on the budget (an older bag that leaves takes its
    /// entry with it, so this stays bounded; the total above keeps everything).
    before_upload_per_bag: BTreeMap<PathBuf, DeletedBeforeUpload>,
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
            empty_split_learned: false,
            deleted_total: 0,
            in_progress_bytes: 0,
            beside_on_disk: None,
            beside_asked_on_disk: 0,
            ledger: None,
            delete_after_upload: false,
            swept_generation: None,
            next_bag_id: 0,
            max_old_meta_bytes: 0,
            before_upload: DeletedBeforeUpload::default(),
            before_upload_per_bag: BTreeMap::new(),
        }
    }

    /// Ask `ledger` which closed files are out before deleting any (see the module doc).
    pub fn with_upload_ledger(mut self, ledger: Arc<dyn UploadLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// With a ledger: delete every closed file the ledger says is uploaded at each turn
    /// ([`Retention::after_batch`]), even when the budget does not need the room.
    pub fn with_delete_after_upload(mut self, on: bool) -> Self {
        self.delete_after_upload = on;
        self
    }

    /// Apply `u`: its ledger if any, and `delete_after_upload`.
    pub fn with_upload(self, u: &UploadRetention) -> Self {
        let r = match &u.ledger {
            Some(l) => self.with_upload_ledger(l.clone()),
            None => self,
        };
        r.with_delete_after_upload(u.delete_after_upload)
    }

    /// Whether a ledger is attached ([`Retention::with_upload_ledger`]).
    pub fn has_upload_ledger(&self) -> bool {
        self.ledger.is_some()
    }

    /// Files and bytes deleted before they got out, since this budget was opened.
    pub fn deleted_before_upload(&self) -> DeletedBeforeUpload {
        self.before_upload
    }

    /// The same per bag directory, for the bags still on the budget that lost any.
    pub fn deleted_before_upload_per_bag(&self) -> &BTreeMap<PathBuf, DeletedBeforeUpload> {
        &self.before_upload_per_bag
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
            r.push_old_bag(b);
        }
        Ok(r)
    }

    fn push_old_bag(&mut self, mut b: OldBag) {
        b.id = self.next_bag_id;
        self.next_bag_id += 1;
        for s in &b.splits {
            let path = b.dir.join(&s.rel);
            let start = b
                .meta
                .files
                .iter()
                .find(|f| f.describes(&s.rel) && f.message_count > 0)
                .map_or(NO_START, |f| f.starting_time_ns);
            self.push(Entry {
                owner: Owner::Old(b.id),
                size: split_size_on_disk(&path)
                    + other_forms(&path)
                        .iter()
                        .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
                        .sum::<u64>(),
                start_ns: start,
                path,
            });
        }
        self.old_meta_bytes += b.meta_bytes + BAG_DIR_RESERVE_BYTES;
        self.max_old_meta_bytes = self.max_old_meta_bytes.max(b.meta_bytes);
        self.old.push_back(b);
    }

    /// A finished bag that appeared under the root while recording (a snapshot bag): its
    /// splits join the budget behind everything already on it and are deleted in that order.
    /// The next [`Retention::after_batch`] enforces the limits with it counted. A bag that
    /// cannot be read is left alone, with a warning.
    pub fn adopt_bag(&mut self, dir: &Path) {
        match OldBag::open(dir) {
            Ok(Some(b)) => self.push_old_bag(b),
            Ok(None) => {}
            Err(e) => log::warn!("retention: leaving {} alone: {e}", dir.display()),
        }
    }

    /// Where a bag written beside the recording reports what it occupies (see
    /// `beside_on_disk`).
    pub fn with_beside_on_disk(mut self, gauge: Arc<AtomicU64>) -> Self {
        self.beside_on_disk = Some(gauge);
        self
    }

    /// Bytes granted to a bag beside the recording that it has not written yet: it only
    /// grows while it holds a grant, so its newest figure is the larger one.
    fn beside_unwritten(&self) -> u64 {
        let reported = self.beside_on_disk.as_ref().map_or(0, |g| g.load(Relaxed));
        self.in_progress_bytes
            .saturating_sub(reported.max(self.beside_asked_on_disk))
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
    /// What the budget holds now (for status reports): bytes of every split on it (closed,
    /// older bags' metadata, the open split), split files (the open one included), and the
    /// start of the oldest kept message.
    pub fn usage<B: CurrentBag + ?Sized>(&self, w: &B) -> Usage {
        let open = u64::from(w.has_open_split());
        Usage {
            bytes: self.fifo_bytes + self.old_meta_bytes + w.open_split_footprint(),
            files: self.fifo.len() as u64 + open,
            oldest_start_ns: self
                .fifo
                .iter()
                .map(|e| e.start_ns)
                .find(|&s| s != NO_START)
                .or_else(|| w.open_split_span().map(|(s, _)| s)),
        }
    }
    /// Splits deleted so far.
    pub fn deleted(&self) -> u64 {
        self.deleted_total
    }

    /// Make room before rows that may add up to `growth` bytes to the split file (the sum of
    /// [`row_growth_bytes`] over them), whose newest message is at `newest_ns`, are committed
    /// into the open split; returns splits deleted.
    pub fn before_batch<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        growth: u64,
        newest_ns: i64,
    ) -> Result<u64, RetentionError> {
        self.sync(w);
        let need = self.disk_growth(w, growth);
        self.enforce(w, need, newest_ns)
    }

    /// Make room before the open split is closed (its final metadata row, a checkpoint).
    pub fn before_close<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
    ) -> Result<u64, RetentionError> {
        self.sync(w);
        let need = w.close_reserve();
        let newest = w.open_split_span().map_or(NO_START, |(_, e)| e);
        self.enforce(w, need, newest)
    }

    /// Make room for the next split, after the previous one was closed and before the new
    /// one is created: this is where a rotation frees its place under `--max-bag-files` and
    /// the size budget, so neither is exceeded while the new file appears.
    pub fn before_open<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
    ) -> Result<u64, RetentionError> {
        self.sync(w);
        let need = self.empty_split_bytes;
        self.enforce(w, need, NO_START)
    }

    /// Before the bag being recorded is created under `root` (a recording root at start):
    /// delete the oldest splits of older bags until a new bag with an empty split fits under
    /// every limit, so the bound also holds while the new bag appears. Returns splits deleted.
    pub fn before_new_bag(&mut self, root: &Path) -> Result<u64, RetentionError> {
        let mut nothing_yet = NoBagYet { dir: root };
        let need = self.empty_split_bytes;
        self.enforce(&mut nothing_yet, need, NO_START)
    }

    /// Close the open split and open the next, deleting old splits in between so that no
    /// bound is exceeded while the new file appears; returns splits deleted. The caller
    /// checks `--max-splits` first ([`BagWriter::may_open_another_split`]).
    pub fn rotate(&mut self, w: &mut BagWriter) -> Result<u64, RetentionError> {
        let mut deleted = self.before_close(w)?;
        w.close_split()?;
        deleted += self.before_open(w)?;
        w.open_next_split()?;
        Ok(deleted)
    }

    /// Which messages can ever be stored under the size budget: alone in a fresh split, with
    /// every closed split deleted. The caller drops the others (counted as oversize) instead
    /// of breaking the bound. Taken once per batch: the file-system reads happen here, and
    /// [`OversizeLimit::fits`] is arithmetic only, cheap enough for every message.
    pub fn oversize_limit<B: CurrentBag + ?Sized>(&self, w: &B) -> OversizeLimit {
        let Some(max) = self.policy.max_record_size else {
            return OversizeLimit::NONE;
        };
        let meta = fs::metadata(w.dir().join(METADATA_FILE)).map_or(0, |m| m.len());
        let fixed = self.empty_split_bytes + self.metadata_reserve(meta) + BAG_DIR_RESERVE_BYTES;
        let uses_wal = w.uses_wal();
        let wal = if uses_wal { w.open_split_wal() } else { 0 };
        OversizeLimit {
            room: Some(max.saturating_sub(fixed + wal)),
            uses_wal,
            page_size: w.page_size(),
        }
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
        let swept = self.sweep_uploaded(w)?;
        self.deleted_total += swept;
        let newest = w.open_split_span().map_or(NO_START, |(_, e)| e);
        let n = self.enforce(w, 0, newest)?;
        Ok((Verdict::Continue, n + swept))
    }

    /// `delete_after_upload`: delete every closed file the ledger says is uploaded, when the
    /// ledger's generation moved since the last sweep (else nothing to look at: O(1)). A
    /// sweep asks about every file on the budget once: O(files kept), once per upload news.
    fn sweep_uploaded<B: CurrentBag + ?Sized>(&mut self, w: &mut B) -> Result<u64, RetentionError> {
        let Some(ledger) = self.ledger.clone().filter(|_| self.delete_after_upload) else {
            return Ok(0);
        };
        // Read before looking: a file verified during the sweep moves it again.
        let generation = ledger.generation();
        if self.swept_generation == Some(generation) {
            return Ok(0);
        }
        self.swept_generation = Some(generation);
        let mut deleted = 0;
        let mut i = 0;
        while i < self.fifo.len() {
            if ledger.state(&self.fifo[i].path) != UploadState::Uploaded {
                i += 1;
                continue;
            }
            let before = self.fifo.len();
            self.delete_at(w, i)?;
            deleted += 1;
            if self.fifo.len() + 1 < before {
                // An older bag was abandoned with it: entries before `i` may have gone too.
                i = 0;
            }
        }
        Ok(deleted)
    }

    fn push(&mut self, e: Entry) {
        self.fifo_bytes += e.size;
        self.fifo.push_back(e);
    }

    /// Pull newly closed splits into the FIFO; learn the empty-split size. The pipeline calls
    /// it once before the first batch, while the first split is still empty.
    pub fn sync<B: CurrentBag + ?Sized>(&mut self, w: &mut B) {
        w.set_split_limit(self.policy.max_splits);
        let closed = w.take_newly_closed();
        if let (false, Some(ledger)) = (closed.is_empty(), &self.ledger) {
            ledger.split_closed();
        }
        for c in closed {
            self.push(Entry {
                owner: Owner::Current,
                size: c.size_bytes,
                start_ns: if c.file.message_count == 0 {
                    NO_START
                } else {
                    c.file.starting_time_ns
                },
                path: c.path,
            });
        }
        // After the closed ones: a split may close and finish compressing between two calls.
        for (path, size) in w.take_compressed_sizes() {
            let entry = self
                .fifo
                .iter_mut()
                .find(|e| e.owner == Owner::Current && e.path == path);
            if let Some(e) = entry.filter(|e| size < e.size) {
                self.fifo_bytes -= e.size - size;
                e.size = size;
            }
        }
        if w.has_open_split() && w.open_split_span().is_none() {
            // The first split is empty when recording starts, so the real size is known
            // before the first batch; the guess is only a fallback.
            let seen = w.open_split_footprint();
            self.empty_split_bytes = if self.empty_split_learned {
                self.empty_split_bytes.max(seen)
            } else {
                seen
            };
            self.empty_split_learned = true;
        }
    }

    /// Worst-case bytes on disk for rows that add up to `growth` bytes to the file: the
    /// b-tree pages a commit rewrites on top, and with a WAL every page once in the `-wal`
    /// (plus its frame header) and once more in the file at the next checkpoint.
    fn disk_growth<B: CurrentBag + ?Sized>(&self, w: &B, growth: u64) -> u64 {
        let wal = if w.uses_wal() {
            // The checkpoint may also copy what the -wal already holds into the file.
            w.open_split_wal()
        } else {
            0
        };
        rows_disk_growth(growth, w.uses_wal(), w.page_size()) + wal
    }

    /// metadata.yaml is rewritten through a temp file: old and new exist together for a
    /// moment, and the new one may list one more file.
    fn metadata_reserve(&self, meta: u64) -> u64 {
        2 * meta + meta / 4 + METADATA_SLACK_BYTES
    }

    /// Bytes on the size budget besides the closed splits, with `need` more to come.
    fn size_fixed<B: CurrentBag + ?Sized>(&self, w: &B, need: u64) -> u64 {
        let meta = fs::metadata(w.dir().join(METADATA_FILE)).map_or(0, |m| m.len());
        w.open_split_footprint()
            + need
            + w.compression_reserve()
            + self.metadata_reserve(meta)
            + BAG_DIR_RESERVE_BYTES
            + self.in_progress_bytes
            + self.old_meta_bytes
            + self.old_meta_rewrite_reserve()
    }

    /// An older bag's metadata.yaml is rewritten when it loses a split (old and new side by
    /// side for a moment): without a ledger only the front bag loses splits, with one any.
    fn old_meta_rewrite_reserve(&self) -> u64 {
        if self.ledger.is_some() {
            self.max_old_meta_bytes
        } else {
            self.old.front().map_or(0, |b| b.meta_bytes)
        }
    }

    /// Room for a bag written beside the recording (a snapshot) to occupy `bytes`, of which
    /// it holds `on_disk` now, while keeping `headroom` for the recording's own growth until
    /// it can delete again (the rest of its open split and the next empty one): deletes the
    /// oldest closed splits as needed. `Ok(Err(why))` when even with every closed split gone
    /// the size budget or the free-space floor cannot hold it; the bag then keeps what it
    /// was granted before (and is counted with that).
    pub fn room_beside<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        bytes: u64,
        on_disk: u64,
        headroom: u64,
    ) -> Result<Result<u64, String>, RetentionError> {
        self.sync(w);
        let before = self.in_progress_bytes;
        self.in_progress_bytes = bytes;
        let mut deleted = 0;
        let mut refused = None;
        if let Some(max) = self.policy.max_record_size {
            let fixed = self.size_fixed(w, headroom);
            while !self.fifo.is_empty() && self.fifo_bytes + fixed > max {
                self.delete_for_room(w)?;
                deleted += 1;
            }
            if self.fifo_bytes + fixed > max {
                refused = Some(format!(
                    "--max-record-size {max} holds no more: the continuous recording keeps \
                     {} bytes for its open and next split",
                    fixed.saturating_sub(bytes)
                ));
            }
        }
        if refused.is_none() && self.policy.has_free_floor() {
            // The bag's own growth is counted by `keep_free_space` (the grant asked for, less
            // what it reported it occupies).
            self.beside_asked_on_disk = on_disk;
            let growth = headroom + METADATA_SLACK_BYTES;
            match self.keep_free_space(w, growth) {
                Ok(n) => deleted += n,
                Err(RetentionError::OutOfSpace {
                    available, floor, ..
                }) => {
                    refused = Some(format!(
                        "only {available} bytes free, above the free-space floor of {floor} \
                         bytes (--min-free-space/--min-free-space-percent) too few for {} more \
                         bytes and the continuous recording's next split",
                        bytes.saturating_sub(on_disk)
                    ))
                }
                Err(e) => {
                    self.in_progress_bytes = before;
                    return Err(e);
                }
            }
        }
        self.deleted_total += deleted;
        Ok(match refused {
            Some(why) => {
                self.in_progress_bytes = before;
                Err(why)
            }
            None => Ok(deleted),
        })
    }

    fn enforce<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        need: u64,
        newest_ns: i64,
    ) -> Result<u64, RetentionError> {
        let mut deleted = 0;
        if let Some(max) = self.policy.max_record_size {
            let fixed = self.size_fixed(w, need);
            while !self.fifo.is_empty() && self.fifo_bytes + fixed > max {
                self.delete_for_room(w)?;
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
                    // Only the oldest split's going shortens the span: uploaded or not, it is
                    // the one the duration limit forces.
                    self.delete_at(w, 0)?;
                    deleted += 1;
                }
            }
        }
        if let Some(n) = self.policy.max_bag_files {
            // One place is always the open split's (or, before it is created, the next one's).
            let allowed = u64::from(n).saturating_sub(1);
            while !self.fifo.is_empty() && self.fifo.len() as u64 > allowed {
                self.delete_for_room(w)?;
                deleted += 1;
            }
        }
        if self.policy.has_free_floor() {
            deleted += self.keep_free_space(w, need + METADATA_SLACK_BYTES)?;
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
        let beside = self.beside_unwritten();
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
            let enough = floor.saturating_add(batch).saturating_add(beside);
            // A split being compressed grows its `.zstd` beside the `.db3` between two of
            // these checks, so the floor keeps room for what the compressions in flight may
            // still write (their bound; what they wrote already is counted twice, safely).
            // Re-read each pass: deleting a split stops its compression, and then its reserve
            // goes once the thread has dropped the partial file.
            let compressing = w.compression_reserve();
            if s.available >= enough.saturating_add(compressing) {
                return Ok(deleted);
            }
            // With nothing left to delete, every compression in flight is of a deleted split
            // and about to give its bytes back: only the batch itself may stop the recording.
            if self.fifo.is_empty() && s.available >= enough {
                return Ok(deleted);
            }
            if self.fifo.is_empty() {
                return Err(RetentionError::OutOfSpace {
                    path,
                    available: s.available,
                    floor,
                    batch,
                    beside,
                });
            }
            self.delete_for_room(w)?;
            deleted += 1;
        }
    }

    /// Leave the older bag at `pos` in `old` alone from now on: its remaining splits leave the
    /// budget (and the FIFO), with a warning; recording goes on. O(files on the budget), and
    /// only when an older bag fails.
    fn abandon_old_bag(&mut self, pos: usize, why: &BagError) {
        let Some(bag) = self.old.remove(pos) else {
            return;
        };
        log::warn!(
            "retention: leaving {} alone from now on: {why}",
            bag.dir.display()
        );
        let owner = Owner::Old(bag.id);
        let mut freed = 0;
        self.fifo.retain(|e| {
            let keep = e.owner != owner;
            if !keep {
                freed += e.size;
            }
            keep
        });
        self.fifo_bytes -= freed;
        self.old_meta_bytes -= bag.meta_bytes;
        self.forget_bag(&bag);
    }

    /// An older bag left the budget: its per-bag count goes, the metadata reserve shrinks.
    /// O(older bags), once per bag.
    fn forget_bag(&mut self, bag: &OldBag) {
        self.before_upload_per_bag.remove(&bag.dir);
        self.max_old_meta_bytes = self.old.iter().map(|b| b.meta_bytes).max().unwrap_or(0);
    }

    /// FIFO index of the split to delete when the budget needs room: without a ledger the
    /// oldest; with one the oldest uploaded, else (nothing uploaded is left) the oldest.
    /// Cost: O(1) ledger lookups when the oldest file is uploaded (uploads keep up, the
    /// common case); worst case (nothing on the budget uploaded, say after a long time
    /// offline) one lookup per file on the budget for each deletion.
    fn victim(&self) -> usize {
        let Some(ledger) = self.ledger.as_ref() else {
            return 0;
        };
        self.fifo
            .iter()
            .position(|e| ledger.state(&e.path) == UploadState::Uploaded)
            .unwrap_or(0)
    }

    /// Delete one split because the budget needs room ([`Retention::victim`]).
    fn delete_for_room<B: CurrentBag + ?Sized>(&mut self, w: &mut B) -> Result<(), RetentionError> {
        let i = self.victim();
        self.delete_at(w, i)
    }

    /// Delete the split of FIFO entry `i`, whichever bag holds it. With a ledger, a split not
    /// uploaded has its transfer aborted first (also when the ledger said pending: it must
    /// not start between the answer and the unlink), and once it is gone it is counted,
    /// logged and reported to the ledger as deleted before upload.
    fn delete_at<B: CurrentBag + ?Sized>(
        &mut self,
        w: &mut B,
        i: usize,
    ) -> Result<(), RetentionError> {
        let Some(e) = self.fifo.remove(i) else {
            return Ok(());
        };
        self.fifo_bytes -= e.size;
        let forced = match self.ledger.as_ref() {
            Some(l) if l.state(&e.path) != UploadState::Uploaded => {
                l.abort(&e.path);
                true
            }
            _ => false,
        };
        let gone = match e.owner {
            Owner::Current => w.delete_closed(&e.path)?.is_some(),
            Owner::Old(id) => self.delete_old_split(id, &e.path)?,
        };
        if forced && gone {
            self.count_before_upload(&e);
        }
        Ok(())
    }

    fn count_before_upload(&mut self, e: &Entry) {
        self.before_upload.files += 1;
        self.before_upload.bytes += e.size;
        let still_here = match e.owner {
            Owner::Current => true,
            Owner::Old(id) => self.old.binary_search_by_key(&id, |b| b.id).is_ok(),
        };
        if let (true, Some(bag)) = (still_here, e.path.parent()) {
            let c = self
                .before_upload_per_bag
                .entry(bag.to_path_buf())
                .or_default();
            c.files += 1;
            c.bytes += e.size;
        }
        log::warn!(
            "retention: deleted {} ({} bytes) before it was uploaded: the budget needed the \
             room and no uploaded file was left to delete",
            e.path.display(),
            e.size
        );
        if let Some(l) = self.ledger.as_ref() {
            l.deleted_before_upload(&e.path, e.size);
        }
    }

    /// Delete `path`, a split of the older bag `id`; true when this call deleted it.
    fn delete_old_split(&mut self, id: u64, path: &Path) -> Result<bool, RetentionError> {
        let Ok(pos) = self.old.binary_search_by_key(&id, |b| b.id) else {
            return Ok(false);
        };
        let bag = &mut self.old[pos];
        let Some(rel) = path
            .strip_prefix(&bag.dir)
            .ok()
            .and_then(|r| r.to_str())
            .map(str::to_string)
        else {
            return Ok(false);
        };
        // Hold the older bag's lock while changing it, so a reindex or another recorder's
        // retention never works on it at the same moment.
        let guard = match OldBagLock::acquire(&bag.dir) {
            Ok(g) => g,
            Err(e) => {
                // Taken by someone else since the scan, removed by another recorder sharing
                // the root, or not ours to change (permissions).
                self.abandon_old_bag(pos, &e);
                return Ok(false);
            }
        };
        let before = bag.meta_bytes;
        let emptied = match bag.delete_split(&rel) {
            Ok(emptied) => emptied,
            Err(e) => {
                // An older bag is not worth the recording: stop counting it. Dropping the
                // guard keeps its marker: a reindex will look at it.
                drop(guard);
                self.abandon_old_bag(pos, &e);
                return Ok(false);
            }
        };
        guard.release()?;
        self.old_meta_bytes = self.old_meta_bytes - before + bag.meta_bytes;
        self.max_old_meta_bytes = self.max_old_meta_bytes.max(bag.meta_bytes);
        if emptied {
            self.old_meta_bytes -= bag.meta_bytes + BAG_DIR_RESERVE_BYTES;
            if let Some(b) = self.old.remove(pos) {
                self.forget_bag(&b);
            }
        }
        Ok(true)
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
        // Compressed splits too (`.db3.zstd`, as rosbag2's file mode leaves them): they are on
        // the budget like any split. A split there in both forms (a compression cut short) is
        // its `.db3`; the other form is counted and deleted with it (`other_forms`).
        let on_disk = find_splits(dir)?;
        if on_disk.is_empty() {
            return Ok(None);
        }
        // `files[].path` names a compressed split by its `.db3` name (`FileInfo::describes`).
        let consistent = meta.files.len() == on_disk.len()
            && on_disk
                .iter()
                .all(|rel| meta.files.iter().any(|f| f.describes(rel)));
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
                            // As rosbag2 writes it: the `.db3` name of a compressed split.
                            path: rel
                                .strip_suffix(crate::bag::compressed::ZSTD_SUFFIX)
                                .unwrap_or(rel)
                                .to_string(),
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
            id: 0,
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
        // A compressed split is listed here by its `.db3.zstd` name (rosbag2 opens what this
        // list names), in `files[].path` by its `.db3` name.
        let on_disk: std::collections::HashSet<&str> =
            self.splits.iter().map(|s| s.rel.as_str()).collect();
        m.relative_file_paths = m
            .files
            .iter()
            .map(|f| {
                let z = format!("{}{}", f.path, crate::bag::compressed::ZSTD_SUFFIX);
                if on_disk.contains(z.as_str()) {
                    z
                } else {
                    f.path.clone()
                }
            })
            .collect();
        if m.relative_file_paths
            .iter()
            .any(|r| r.ends_with(".db3.zstd"))
        {
            // rosbag2 reads a bag in file mode only with these set (as reindex writes them).
            m.compression_format = crate::bag::compressed::ZSTD_FORMAT.into();
            m.compression_mode = "FILE".into();
        }
    }

    fn write_meta(&mut self) -> Result<(), BagError> {
        let flavour = self.meta.flavour();
        self.meta.write_atomic(&self.dir, flavour)?;
        self.meta_bytes = fs::metadata(self.dir.join(METADATA_FILE)).map_or(0, |m| m.len());
        Ok(())
    }

    /// Delete the split `rel` (the oldest one, without a ledger); returns true when the bag
    /// is now empty and was removed.
    fn delete_split(&mut self, rel: &str) -> Result<bool, BagError> {
        let Some(split) = self
            .splits
            .iter()
            .position(|s| s.rel == rel)
            .and_then(|i| self.splits.remove(i))
        else {
            return Ok(self.splits.is_empty());
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
            self.meta.files.retain(|f| !f.describes(&split.rel));
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
            self.meta.files.retain(|f| !f.describes(&split.rel));
            self.refresh_totals();
            // metadata.yaml first (see BagWriter::delete_oldest_closed for why).
            self.write_meta()?;
        }
        crate::bag::writer::remove_split_file(&crate::bag::writer::RealStorage, &path)?;
        for other in other_forms(&path) {
            match fs::remove_file(&other) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BagError::io(&other)(e)),
            }
        }
        sync_dir(&self.dir)?;
        Ok(false)
    }
}

/// The files of a split besides `path` itself (and its `-wal`/`-shm`) that may be on disk
/// while it is compressed: the complete `<split>.db3.zstd` of a `.db3` whose compression was
/// cut short before the `.db3` went, and the hidden `.<split>.db3.zstd.partial` being
/// written. They take room like the split, so they are on its budget entry and go with it.
fn other_forms(path: &Path) -> Vec<PathBuf> {
    use crate::bag::compressed::{PARTIAL_SUFFIX, ZSTD_SUFFIX};
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let plain = name.strip_suffix(ZSTD_SUFFIX).unwrap_or(name);
    let mut v = vec![dir.join(format!(".{plain}{PARTIAL_SUFFIX}"))];
    if plain == name {
        v.push(dir.join(format!("{plain}{ZSTD_SUFFIX}")));
    }
    v
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
            stats.end_ns.saturating_sub(stats.start_ns)
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    const MB: u64 = 1 << 20;
    const S: i64 = 1_000_000_000;

    #[test]
    fn the_commit_reserve_holds_a_guarded_commits_journal() {
        use crate::bag::schema::{guard_journal_bytes, LARGE_PAGE_SIZE, SMALL_PAGE_SIZE};
        for page in [SMALL_PAGE_SIZE, LARGE_PAGE_SIZE].map(u64::from) {
            // The two new root children a guarded commit may add, plus its journal.
            assert!(
                2 * page + guard_journal_bytes(page) <= commit_reserve(page),
                "{page}-byte pages"
            );
        }
    }

    /// An in-memory current bag: closed splits with sizes and spans, an open split.
    #[derive(Debug, Default)]
    struct FakeBag {
        dir: PathBuf,
        closed: VecDeque<ClosedSplit>,
        newly: Vec<ClosedSplit>,
        open_size: u64,
        open_span: Option<(i64, i64)>,
        deleted: Vec<u32>,
        next: u32,
        /// Shared with `FakeSpace`: deletions free bytes.
        freed: Option<Arc<Mutex<u64>>>,
        /// `compression_reserve`: what compressions in flight may still write.
        compressing: u64,
        /// Compressions ended since retention last looked (`take_compressed_sizes`).
        compressed: Vec<(PathBuf, u64)>,
    }

    impl FakeBag {
        fn new(_limits: (u64, i64)) -> Self {
            FakeBag {
                dir: PathBuf::from("/fake/bag"),
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
        /// The newest closed split's compression ended: it is `size` bytes on disk now.
        fn compress_newest(&mut self, size: u64) {
            let c = self.closed.back_mut().unwrap();
            c.size_bytes = size;
            self.compressed.push((c.path.clone(), size));
        }
        fn on_disk(&self) -> u64 {
            self.closed.iter().map(|c| c.size_bytes).sum::<u64>() + self.open_size
        }
    }

    impl CurrentBag for FakeBag {
        fn dir(&self) -> &Path {
            &self.dir
        }
        fn open_split_footprint(&self) -> u64 {
            self.open_size
        }
        fn open_split_span(&self) -> Option<(i64, i64)> {
            self.open_span
        }
        fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
            std::mem::take(&mut self.newly)
        }
        fn delete_closed(&mut self, path: &Path) -> Result<Option<ClosedSplit>, BagError> {
            let c = self
                .closed
                .iter()
                .position(|c| c.path == path)
                .and_then(|i| self.closed.remove(i));
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
        fn compression_reserve(&self) -> u64 {
            self.compressing
        }
        fn take_compressed_sizes(&mut self) -> Vec<(PathBuf, u64)> {
            std::mem::take(&mut self.compressed)
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
    fn room_beside_deletes_oldest_splits_keeps_the_recordings_headroom_and_refuses_past_it() {
        let mut bag = FakeBag::new((MB, 0));
        let mut r = Retention::new(size_policy(8 * MB));
        for i in 0..6 {
            bag.close(MB, i * S, i * S + S / 2);
        }
        let headroom = MB + MB / 2;
        // 3 MiB beside the recording: the oldest splits go until it fits with the headroom.
        assert!(r
            .room_beside(&mut bag, 3 * MB, 0, headroom)
            .unwrap()
            .is_ok());
        assert_eq!(bag.deleted, vec![0, 1, 2]);
        let fixed = MIN_EMPTY_SPLIT_BYTES + METADATA_SLACK_BYTES + BAG_DIR_RESERVE_BYTES;
        assert!(bag.on_disk() + 3 * MB + headroom + fixed <= 8 * MB);
        // The recording's own next batch now counts the 3 MiB granted.
        r.before_batch(&mut bag, MB, 7 * S).unwrap();
        assert!(bag.on_disk() + 3 * MB + MB <= 8 * MB);
        // More than the budget can ever hold beside the recording: refused, with every
        // closed split gone, and the earlier grant stays counted.
        let why = r
            .room_beside(&mut bag, 7 * MB, 3 * MB, headroom)
            .unwrap()
            .unwrap_err();
        assert!(why.contains("--max-record-size"), "{why}");
        assert!(bag.closed.is_empty());
        bag.close(MB, 8 * S, 9 * S);
        bag.close(MB, 9 * S, 10 * S);
        r.before_batch(&mut bag, MB, 10 * S).unwrap();
        assert!(bag.on_disk() + 3 * MB + MB <= 8 * MB, "3 MiB still counted");
    }

    #[test]
    fn room_beside_refuses_what_would_break_the_free_space_floor() {
        let freed = Arc::new(Mutex::new(0));
        let mut bag = FakeBag::new((MB, 0));
        bag.freed = Some(freed.clone());
        let mut r = Retention::new(RetentionPolicy {
            min_free_space: Some(10 * MB),
            ..Default::default()
        })
        .with_free_space(Box::new(FakeSpace {
            base_available: 11 * MB,
            total: 100 * MB,
            freed,
        }));
        bag.close(MB, 0, S);
        bag.close(MB, S, 2 * S);
        // 1 MiB free above the floor, 2 MiB to delete: 2.5 MiB of growth fits after deleting.
        assert!(r.room_beside(&mut bag, 3 * MB, MB / 2, 0).unwrap().is_ok());
        assert_eq!(bag.deleted, vec![0, 1]);
        let why = r
            .room_beside(&mut bag, 5 * MB, MB / 2, 0)
            .unwrap()
            .unwrap_err();
        assert!(why.contains("free-space floor"), "{why}");
    }

    #[test]
    fn the_recordings_batches_leave_free_what_a_snapshot_was_granted_and_has_not_written() {
        // `freed` is the whole free space here: deletions add to it, writes take from it.
        let free = Arc::new(Mutex::new(14 * MB));
        let take = |bytes: u64| *free.lock().unwrap() -= bytes;
        let mut bag = FakeBag::new((MB, 0));
        bag.freed = Some(free.clone());
        let reported = Arc::new(AtomicU64::new(0));
        let mut r = Retention::new(RetentionPolicy {
            min_free_space: Some(10 * MB),
            ..Default::default()
        })
        .with_free_space(Box::new(FakeSpace {
            base_available: 0,
            total: 100 * MB,
            freed: free.clone(),
        }))
        .with_beside_on_disk(reported.clone());
        for i in 0..4 {
            bag.close(MB, i * S, i * S + S / 2);
        }
        // A snapshot is granted 3 MiB: 4 MiB are free above the floor, nothing goes.
        assert!(r.room_beside(&mut bag, 3 * MB, 0, 0).unwrap().is_ok());
        assert!(bag.deleted.is_empty());
        // Before it writes them, the recording asks for a 1.5 MiB batch: the free space it
        // sees still holds the snapshot's 3 MiB, which must stay free for it.
        let batch = MB + MB / 2;
        r.before_batch(&mut bag, batch, 5 * S).unwrap();
        assert_eq!(bag.deleted, vec![0], "one split makes room for both");
        take(r.disk_growth(&bag, batch));
        take(3 * MB);
        reported.store(3 * MB, Ordering::Relaxed);
        assert!(*free.lock().unwrap() >= 10 * MB, "the floor held");
        // Written in full, the grant asks nothing more of the recording's next batch.
        let before = *free.lock().unwrap();
        r.before_batch(&mut bag, 64 * 1024, 6 * S).unwrap();
        assert_eq!(
            bag.deleted,
            vec![0],
            "nothing more deleted at {before} B free"
        );
        // Given back, the grant counts for nothing.
        assert!(r.room_beside(&mut bag, 0, 0, 0).unwrap().is_ok());
        assert_eq!(r.beside_unwritten(), 0);
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
            let reserve =
                incoming + COMMIT_RESERVE_BYTES + METADATA_SLACK_BYTES + BAG_DIR_RESERVE_BYTES;
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
    fn keeps_at_most_max_bag_files_at_every_step_of_a_rotation() {
        let mut bag = FakeBag::new((MB, 0));
        let policy = RetentionPolicy {
            max_bag_files: Some(4),
            ..Default::default()
        };
        let mut r = Retention::new(policy);
        // Files on disk: the closed splits plus the open one while it exists.
        let files = |b: &FakeBag, open: bool| b.closed.len() + usize::from(open);
        for i in 0..12 {
            r.before_close(&mut bag).unwrap();
            assert!(files(&bag, true) <= 4, "before close at {i}");
            // The rotation: close (the file stays), make room, then create the next split.
            bag.close(MB / 2, i * S, i * S + 1);
            assert!(files(&bag, false) <= 4, "after close at {i}");
            r.before_open(&mut bag).unwrap();
            assert!(
                files(&bag, true) <= 4,
                "{} closed + a new split at {i}",
                bag.closed.len()
            );
            r.after_batch(&mut bag).unwrap();
        }
        // Exact, not merely bounded: once warm, 3 closed splits and the open one.
        assert_eq!(bag.closed.len(), 3);
    }

    /// Compression lets the ring keep more: once a split's `.db3` is gone, the budget counts
    /// it at its `.zstd`'s size, and the bound holds on what is really on disk.
    #[test]
    fn compressed_splits_count_at_their_zstd_size_so_the_ring_keeps_more() {
        let mut plain = FakeBag::new((MB, 0));
        let mut zipped = FakeBag::new((MB, 0));
        let mut rp = Retention::new(size_policy(6 * MB));
        let mut rz = Retention::new(size_policy(6 * MB));
        for i in 0..40 {
            for (bag, r, zip) in [(&mut plain, &mut rp, false), (&mut zipped, &mut rz, true)] {
                r.before_close(bag).unwrap();
                bag.close(MB, i * S, i * S + 1);
                r.before_open(bag).unwrap();
                if zip {
                    bag.compress_newest(MB / 4);
                }
                r.after_batch(bag).unwrap();
                assert!(bag.on_disk() <= 6 * MB, "{} bytes at {i}", bag.on_disk());
                assert_eq!(r.usage(bag).bytes, bag.on_disk() + r.old_meta_bytes);
            }
        }
        assert!(
            zipped.closed.len() >= 3 * plain.closed.len(),
            "{} compressed splits kept, {} plain",
            zipped.closed.len(),
            plain.closed.len()
        );
    }

    /// A bag on a 100 MiB partition with `available` bytes free (plus what deletions free)
    /// and retention keeping a 10 MiB floor.
    fn floor_of_10_mib(available: u64) -> (FakeBag, Retention) {
        let freed = Arc::new(Mutex::new(0));
        let mut bag = FakeBag::new((MB, 0));
        bag.freed = Some(freed.clone());
        let policy = RetentionPolicy {
            min_free_space: Some(10 * MB),
            ..Default::default()
        };
        let space = FakeSpace {
            base_available: available,
            total: 100 * MB,
            freed,
        };
        (bag, Retention::new(policy).with_free_space(Box::new(space)))
    }

    #[test]
    fn deletes_oldest_splits_until_the_free_space_floor_holds() {
        let (mut bag, mut r) = floor_of_10_mib(8 * MB);
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
    fn the_free_space_floor_keeps_room_for_the_compressions_in_flight() {
        let (mut bag, mut r) = floor_of_10_mib(8 * MB);
        // A split being compressed may still write up to 2 MiB of `.zstd` beside its `.db3`.
        bag.compressing = 2 * MB;
        for i in 0..8 {
            bag.close(MB, i * S, i * S + 1);
        }
        bag.open_span = Some((8 * S, 8 * S));
        let n = r.before_batch(&mut bag, 1000, 9 * S).unwrap();
        // 8 MiB free + k deleted MiB must cover 10 MiB, the 2 MiB the compression may still
        // write and the batch reserve: k = 5 (3 without compression, the test above).
        assert_eq!(n, 5);
        assert_eq!(bag.deleted, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn compressions_of_deleted_splits_never_stop_the_recording() {
        let (mut bag, mut r) = floor_of_10_mib(10 * MB);
        // Every closed split is gone once the floor asks for them, and their compressions are
        // still stopping (their reserve not released yet): the batch itself fits above the
        // floor, so recording goes on.
        bag.compressing = 4 * MB;
        bag.close(MB, 0, 1);
        bag.open_span = Some((S, S));
        let n = r.before_batch(&mut bag, 1000, 2 * S).unwrap();
        assert_eq!(n, 1, "the closed split went for the compression's reserve");
        assert_eq!(bag.deleted, vec![0]);
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

    #[test]
    fn the_default_floor_is_5_percent_of_the_partition_or_1_gib_whichever_is_smaller() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_min_free_space(512 * MB), 512 * MB / 100 * 5);
        assert_eq!(default_min_free_space(20 * GIB), 20 * GIB / 100 * 5);
        assert_eq!(default_min_free_space(21 * GIB), GIB);
        assert_eq!(default_min_free_space(4 << 40), GIB);
        assert_eq!(default_min_free_space(0), 0);
    }

    /// A ledger that says which FakeBag splits (by index) are uploaded, and records calls.
    #[derive(Debug, Default)]
    struct Ledger {
        uploaded: Mutex<Vec<PathBuf>>,
        calls: Mutex<Vec<String>>,
        closed_signals: AtomicU64,
    }
    impl UploadLedger for Ledger {
        fn split_closed(&self) {
            self.closed_signals.fetch_add(1, Ordering::SeqCst);
        }
        fn state(&self, file: &Path) -> UploadState {
            if self.uploaded.lock().unwrap().iter().any(|p| p == file) {
                UploadState::Uploaded
            } else {
                UploadState::Pending
            }
        }
        fn abort(&self, file: &Path) {
            self.calls
                .lock()
                .unwrap()
                .push(format!("abort {}", file.display()));
        }
        fn deleted_before_upload(&self, file: &Path, bytes: u64) {
            self.calls
                .lock()
                .unwrap()
                .push(format!("lost {} {bytes}", file.display()));
        }
        fn generation(&self) -> u64 {
            0
        }
    }

    #[test]
    fn the_ledger_hears_of_closed_splits_once_per_sync_that_took_any() {
        let mut bag = FakeBag::new((MB, 0));
        let ledger = Arc::new(Ledger::default());
        let mut r = Retention::new(size_policy(64 * MB)).with_upload_ledger(ledger.clone());
        r.sync(&mut bag);
        assert_eq!(ledger.closed_signals.load(Ordering::SeqCst), 0);
        bag.close(MB, 0, S);
        bag.close(MB, S, 2 * S);
        r.sync(&mut bag);
        assert_eq!(ledger.closed_signals.load(Ordering::SeqCst), 1);
        r.sync(&mut bag);
        assert_eq!(ledger.closed_signals.load(Ordering::SeqCst), 1);
        bag.close(MB, 2 * S, 3 * S);
        r.sync(&mut bag);
        assert_eq!(ledger.closed_signals.load(Ordering::SeqCst), 2);
        assert_eq!(r.closed_splits(), 3);
    }

    #[test]
    fn with_a_ledger_room_beside_and_the_size_budget_take_uploaded_splits_first() {
        let mut bag = FakeBag::new((MB, 0));
        let ledger = Arc::new(Ledger::default());
        let mut r = Retention::new(size_policy(8 * MB)).with_upload_ledger(ledger.clone());
        for i in 0..6 {
            bag.close(MB, i * S, i * S + S / 2);
        }
        // Splits 3 and 5 are out; 0, 1, 2 and 4 are not.
        for i in [3, 5] {
            ledger
                .uploaded
                .lock()
                .unwrap()
                .push(bag.dir.join(format!("b_{i}.db3")));
        }
        // 3 MiB beside the recording needs 3 deletions: both uploaded, then the oldest.
        assert!(r
            .room_beside(&mut bag, 3 * MB, 0, MB + MB / 2)
            .unwrap()
            .is_ok());
        assert_eq!(bag.deleted, vec![3, 5, 0]);
        assert_eq!(
            r.deleted_before_upload(),
            DeletedBeforeUpload {
                files: 1,
                bytes: MB
            }
        );
        assert_eq!(
            *ledger.calls.lock().unwrap(),
            vec![
                "abort /fake/bag/b_0.db3".to_string(),
                format!("lost /fake/bag/b_0.db3 {MB}")
            ]
        );
        assert_eq!(
            r.deleted_before_upload_per_bag()
                .get(Path::new("/fake/bag")),
            Some(&DeletedBeforeUpload {
                files: 1,
                bytes: MB
            })
        );
        assert_eq!(r.closed_bytes(), 3 * MB);
        assert_eq!(r.closed_splits(), 3);
    }

    #[test]
    fn the_duration_limit_deletes_the_oldest_split_even_when_newer_ones_are_uploaded() {
        // Only the oldest split's going shortens the span: it is forced, and counted.
        let mut bag = FakeBag::new((0, S));
        let ledger = Arc::new(Ledger::default());
        let mut r = Retention::new(RetentionPolicy {
            max_record_duration_ns: Some(3 * S),
            ..Default::default()
        })
        .with_upload_ledger(ledger.clone());
        for i in 0..4 {
            bag.close(MB, i * S, (i + 1) * S);
        }
        ledger
            .uploaded
            .lock()
            .unwrap()
            .push(bag.dir.join("b_3.db3"));
        bag.open_span = Some((4 * S, 4 * S + S / 2));
        r.after_batch(&mut bag).unwrap();
        assert_eq!(bag.deleted, vec![0, 1]);
        assert_eq!(r.deleted_before_upload().files, 2);
    }

    #[test]
    fn without_a_ledger_nothing_counts_as_deleted_before_upload() {
        let mut bag = FakeBag::new((MB, 0));
        let mut r = Retention::new(size_policy(4 * MB));
        for i in 0..10 {
            bag.close(MB, i * S, i * S + S / 2);
            r.before_batch(&mut bag, 1024, i * S + S).unwrap();
        }
        assert!(r.deleted() > 0);
        assert_eq!(r.deleted_before_upload(), DeletedBeforeUpload::default());
        assert!(!r.has_upload_ledger());
    }
}
