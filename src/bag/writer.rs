//! The split writer: one bag directory, splits `<name>_<N>.db3`, metadata.yaml.
//!
//! The caller (the pipeline's writer thread) hands over batches; each batch is one SQLite
//! transaction through one cached prepared INSERT. Splitting by size and duration happens
//! inside a batch, before the message that would cross the limit, so a message larger than
//! the split size simply gets a split of its own.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OpenFlags};

use super::compressed::compressed_bound;
use super::filemode::{CompressJob, FileCompression, Listing};
use super::insert::MessageInsert;
use super::lock::BagLock;
use super::metadata::{
    sync_dir, write_file_atomic, BagMetadata, FileInfo, TopicWithCount, METADATA_FILE, NO_START,
};
use super::qos::{profiles_to_yaml_string, PolicyStyle};
use super::schema::{choose_page_size, create_tables, StoragePreset, GUARD_JOURNAL_MODE};
use super::{BagError, Flavour, MessageDefinition, TopicInfo};

/// Per-row bytes SQLite adds beyond the payload (cell header, index entry, page slack),
/// used to project a split's size before a commit. Measured: 100 B messages grow the file by
/// ~140 B each with 4 KiB pages; 64 is a floor, and the real size is re-read after commit.
pub const ROW_OVERHEAD_BYTES: u64 = 64;

#[derive(Debug, Clone)]
pub struct WriterOptions {
    pub flavour: Flavour,
    pub preset: StoragePreset,
    /// Split when the open file would exceed this many bytes; 0 = never.
    pub max_bag_size: u64,
    /// Split when the open file would span more than this; 0 = never.
    pub max_bag_duration_ns: i64,
    pub custom_data: BTreeMap<String, String>,
    /// `--storage-config-file`'s write pragmas (`storage_config`, validated against the
    /// preset), run on each split's connection after the preset's own.
    pub extra_pragmas: String,
    /// `--compression-mode file`: each closed split becomes a `.db3.zstd`
    /// ([`super::filemode`]). None = plain `.db3` splits.
    pub compression: Option<FileCompression>,
}

impl WriterOptions {
    pub fn new(flavour: Flavour) -> Self {
        WriterOptions {
            flavour,
            preset: StoragePreset::WriteOptimized,
            max_bag_size: 0,
            max_bag_duration_ns: 0,
            custom_data: BTreeMap::new(),
            extra_pragmas: String::new(),
            compression: None,
        }
    }
}

#[derive(Debug)]
struct TopicState {
    info: TopicInfo,
    definition: Option<MessageDefinition>,
    /// Messages of this topic in the splits still on disk.
    count: u64,
}

/// The split being written.
#[derive(Debug)]
struct OpenSplit {
    index: u32,
    rel: String,
    path: PathBuf,
    /// Declared before `conn`: fields drop in order, and the statement must be finalized
    /// before its connection closes.
    insert: MessageInsert,
    conn: Connection,
    /// A second descriptor, for the [`Durability`] thread's write-back and for reading the
    /// `messages` root's page type while the split is guarded; declared after `conn` so
    /// that, dropped in order, it closes only after the connection (see
    /// [`Durability::opened`]).
    file: Arc<fs::File>,
    /// Byte offset of the `messages` table's root page in the file.
    messages_root_offset: u64,
    /// Commits go through a rollback journal ([`GUARD_JOURNAL_MODE`]) because the
    /// `messages` root is still a leaf: see [`StoragePreset::commits_can_tear`].
    guarded: bool,
    start_ns: i64,
    end_ns: i64,
    count: u64,
    per_topic: Vec<u64>,
    /// Topics already in this file's `topics` table (index = ringbag topic index).
    registered: Vec<bool>,
    /// Types already in `message_definitions`.
    definitions: Vec<String>,
    /// File size after the last commit.
    size_committed: u64,
    /// Projected bytes written since the last commit.
    pending_bytes: u64,
    /// This file's SQLite page size (`schema::choose_page_size`).
    page_size: u32,
}

/// A finished, fsynced split: what retention needs to account for and delete it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedSplit {
    pub index: u32,
    pub file: FileInfo,
    pub path: PathBuf,
    pub size_bytes: u64,
    /// Message count per topic index.
    pub per_topic: Vec<u64>,
}

impl ClosedSplit {
    pub fn end_ns(&self) -> i64 {
        if self.file.message_count == 0 {
            NO_START
        } else {
            self.file.starting_time_ns + self.file.duration_ns
        }
    }
}

/// What a finished bag looks like.
#[derive(Debug, Clone)]
pub struct BagSummary {
    pub dir: PathBuf,
    pub metadata: BagMetadata,
    pub size_bytes: u64,
}

/// The file-system calls that make a split durable or remove it. Injectable so a test can
/// record their order (`tests/it/crash.rs`); `RealStorage` is the only production impl.
/// Shared with a [`Durability`] thread, hence `Sync`.
pub trait StorageOps: Send + Sync {
    fn sync_file(&self, path: &Path) -> std::io::Result<()>;
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    fn remove_file(&self, path: &Path) -> std::io::Result<()>;
}

/// fsync and unlink through the OS.
#[derive(Debug, Default)]
pub struct RealStorage;

impl StorageOps for RealStorage {
    fn sync_file(&self, path: &Path) -> std::io::Result<()> {
        match fs::File::open(path) {
            Ok(f) => f.sync_all(),
            // A closed split already compressed (`--compression-mode file`) and its .db3
            // deleted: the split is durable in its .zstd, which was fsynced before the .db3
            // went.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut zstd = path.as_os_str().to_owned();
                zstd.push(super::compressed::ZSTD_SUFFIX);
                fs::File::open(zstd).map_err(|_| e)?.sync_all()
            }
            Err(e) => Err(e),
        }
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        fs::File::open(dir).and_then(|d| d.sync_all())
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        fs::remove_file(path)
    }
}

/// Makes closed splits durable off the writer's thread (the recorder's pipeline installs one,
/// `pipeline::syncer`), so closing a 1 GiB split does not stall recording; and keeps the dirty
/// data of the open split bounded meanwhile, so that closing fsync is short and a power cut
/// loses little of the open split. Without one, [`BagWriter`] fsyncs each split inline when
/// it closes it. `bag` itself starts no thread: this is the seam.
///
/// The writer's promise is unchanged: a closed split is fsynced, then its directory, before
/// it can be deleted ([`BagWriter::delete_oldest_closed`] waits for it) and before the bag
/// counts as finished ([`BagWriter::finish`] waits for all).
pub trait Durability: Send {
    /// A split was opened. `file` is a second descriptor of it, open until the split closes
    /// (closing any descriptor of a file drops the process's POSIX locks on it, SQLite's
    /// included, so none may be opened and closed meanwhile).
    fn opened(&mut self, path: &Path, file: Arc<fs::File>);
    /// The open split's file now holds `size` committed bytes.
    fn committed(&mut self, size: u64);
    /// The split at `path` (`messages` rows) was closed, its connection too: make it durable
    /// through `ops` (`sync_file`, then `sync_dir(dir)`), possibly later, on another thread.
    fn closed(&mut self, path: &Path, dir: &Path, messages: u64, ops: Arc<dyn StorageOps>);
    /// Block until the closed split `path` is durable; its sync's error if it failed.
    fn wait(&mut self, path: &Path) -> std::io::Result<()>;
    /// Block until every closed split is durable; the first error if any sync failed.
    fn wait_all(&mut self) -> std::io::Result<()>;
    /// A background sync's failure not reported yet.
    fn take_failure(&mut self) -> Option<(PathBuf, std::io::Error)>;
    /// Rewrite metadata.yaml with `write` once every split closed before this call is
    /// durable (so it never lists a split whose rows a power cut may still take), possibly
    /// later, on another thread; a newer `write` may replace one not written yet. A failure
    /// is reported through `take_failure`.
    fn metadata(&mut self, write: MetadataWrite);
}

/// Runs [`CompressJob`]s off the writer's thread (the pipeline installs a pool of nice'd
/// threads, `pipeline::compress`); without one, the writer runs each job inline. `bag`
/// itself starts no thread: this is the seam.
pub trait Compression: Send {
    /// Hand `job` over without waiting; give it back when the queue is full.
    fn offer(&mut self, job: CompressJob) -> Result<(), CompressJob>;
    /// Hand `job` over, waiting for room in the queue (the bag's last split, at finish).
    fn push(&mut self, job: CompressJob);
    /// Wait until every job handed over is done.
    fn wait_all(&mut self);
}

/// Orders the rewrites of one bag's metadata.yaml made on different threads (the writer's
/// own, and a [`Durability`] thread's after a split close): a rewrite older than the last
/// one written is dropped, so the listing never goes back in time (say, to name a split that
/// retention has deleted meanwhile). With file compression it is also the one owner of the
/// split names metadata.yaml gives (see [`super::filemode`]).
#[derive(Debug, Default)]
pub struct MetadataGate {
    state: Mutex<GateState>,
    /// Set at creation: whether `state.listing` exists (read without the lock).
    compressing: bool,
    /// Compressions that pushed to `Listing::shrunk` so far: the writer takes the lock to
    /// read that list only when this moved (not once per batch).
    pub(crate) shrunk: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct GateState {
    /// Generation of the last metadata.yaml written.
    written: u64,
    /// With file compression: which splits metadata.yaml names by their `.zstd`.
    listing: Option<Listing>,
    dir: PathBuf,
    flavour: Option<Flavour>,
}

impl MetadataGate {
    fn new(dir: &Path, flavour: Flavour, compressing: bool) -> Self {
        MetadataGate {
            state: Mutex::new(GateState {
                written: 0,
                listing: compressing.then(Listing::default),
                dir: dir.to_path_buf(),
                flavour: Some(flavour),
            }),
            compressing,
            shrunk: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` on the listing, under the lock; None without file compression.
    pub(crate) fn with_listing<T>(&self, f: impl FnOnce(&mut Listing) -> T) -> Option<T> {
        self.lock().listing.as_mut().map(f)
    }

    /// Under the lock: unless the split `rel` was deleted meanwhile, `rename` its `.zstd`
    /// into place, mark it compressed and rewrite the last metadata.yaml written so that it
    /// names the `.zstd` (that rewrite's directory fsync makes the rename durable too).
    /// False when the split was deleted. Either way the split's job is done.
    pub(crate) fn publish_compressed(
        &self,
        rel: &str,
        rename: impl FnOnce() -> Result<(), BagError>,
    ) -> Result<bool, BagError> {
        let mut st = self.lock();
        let GateState {
            listing: Some(listing),
            dir,
            flavour,
            ..
        } = &mut *st
        else {
            return Ok(false);
        };
        let Some(stop) = listing.queued.remove(rel) else {
            return Ok(false);
        };
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        rename()?;
        listing.compressed.insert(rel.to_string());
        match (&listing.last, flavour) {
            (Some(last), Some(flavour)) => {
                let mut m = last.clone();
                listing.apply(&mut m);
                write_file_atomic(dir, METADATA_FILE, m.to_yaml(*flavour).as_bytes())?;
            }
            _ => sync_dir(dir)?,
        }
        Ok(true)
    }
}

/// One rewrite of metadata.yaml, prepared on the writer's thread (the metadata, O(topics +
/// splits on disk) to copy), turned into YAML and written by [`MetadataWrite::write`]
/// wherever that work and the fsyncs may take their time.
#[derive(Debug)]
pub struct MetadataWrite {
    dir: PathBuf,
    meta: BagMetadata,
    flavour: Flavour,
    generation: u64,
    gate: Arc<MetadataGate>,
}

impl MetadataWrite {
    /// Replace metadata.yaml atomically (temp file, fsync, rename, fsync of the directory),
    /// unless a newer rewrite of it got there first.
    pub fn write(self) -> Result<(), BagError> {
        let outdated = || self.gate.lock().written > self.generation;
        if outdated() {
            return Ok(());
        }
        // The YAML outside the lock (the other thread's rewrite need not wait for it), but
        // under it when compressing: which splits are compressed may change until then.
        let yaml = (!self.gate.compressing).then(|| self.meta.to_yaml(self.flavour));
        // Held across the write: a newer rewrite on another thread waits for this one
        // rather than being overtaken by it (a few ms, and only at a split close or delete).
        let mut st = self.gate.lock();
        if st.written > self.generation {
            return Ok(());
        }
        let yaml = match (yaml, &st.listing) {
            (Some(y), _) => y,
            (None, Some(l)) => {
                let mut m = self.meta.clone();
                l.apply(&mut m);
                m.to_yaml(self.flavour)
            }
            (None, None) => self.meta.to_yaml(self.flavour),
        };
        write_file_atomic(&self.dir, METADATA_FILE, yaml.as_bytes())?;
        st.written = self.generation;
        if let Some(l) = st.listing.as_mut() {
            l.last = Some(self.meta);
        }
        Ok(())
    }

    /// The file it replaces.
    pub fn path(&self) -> PathBuf {
        self.dir.join(METADATA_FILE)
    }
}

pub struct BagWriter {
    ops: Arc<dyn StorageOps>,
    durability: Option<Box<dyn Durability>>,
    /// Held for the writer's whole life; removed only by a clean `finish()`.
    lock: Option<BagLock>,
    dir: PathBuf,
    name: String,
    opts: WriterOptions,
    topics: Vec<TopicState>,
    split: Option<OpenSplit>,
    closed: VecDeque<ClosedSplit>,
    /// Splits closed since the caller last asked (retention consumes these).
    newly_closed: Vec<ClosedSplit>,
    next_index: u32,
    failed: Option<String>,
    /// `--max-splits`: never open split number `split_limit` (0 = no limit).
    split_limit: u32,
    /// Set when a split was due but the limit forbade it; the writer then writes nothing more.
    split_limit_reached: bool,
    /// Messages and payload bytes written so far, for the next split's page size.
    rows_seen: u64,
    bytes_seen: u64,
    /// Orders metadata.yaml rewrites across threads; `meta_generation` numbers the last one
    /// prepared.
    meta_gate: Arc<MetadataGate>,
    meta_generation: u64,
    /// `meta_gate.shrunk` when [`BagWriter::take_compressed_sizes`] last looked.
    shrunk_seen: u64,
    /// Where compression jobs run (`--compression-mode file`); inline when None.
    compression: Option<Box<dyn Compression>>,
    /// The split closed last, to hand to compression when the next one opens: after
    /// retention made room for it ([`BagWriter::compression_reserve`] counts it).
    compress_next: Option<CompressJob>,
    /// What compressions handed over and not done may still add to the disk.
    compress_reserve: Arc<AtomicU64>,
    /// Times a closed split found the compression queue full.
    compression_queue_full: u64,
    /// Splits that found the queue full, still plain `.db3` (name, bound of their `.zstd`),
    /// oldest first: handed over one per split opened while the queue has room, and the
    /// rest at `finish`, so a finished bag is compressed throughout (the real `ros2 bag
    /// play` refuses a bag in file mode with a plain split: "ZSTD decompression error").
    deferred: VecDeque<(String, u64)>,
    /// [`BagWriter::compress_offline`]: wait for the queue, fail `finish` on a failed job.
    offline_compression: bool,
}

impl std::fmt::Debug for BagWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BagWriter")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// One message to write: topic index (from `add_topic`), receive time, CDR bytes.
pub type Row<'a> = (usize, i64, &'a [u8]);

impl BagWriter {
    /// Create `dir` (it must not exist) and open split 0.
    ///
    /// All or nothing: a failure part-way (a full disk, no inodes left) removes what this
    /// call created, so it never leaves a bag directory with an empty split and no metadata.
    /// A partition without room for an empty bag is refused before anything is created.
    pub fn create(dir: &Path, opts: WriterOptions) -> Result<Self, BagError> {
        /// An empty split (24 KiB with 4 KiB pages), metadata.yaml, the lock file and the
        /// directory blocks, with slack for a filesystem's allocation granularity.
        const NEW_BAG_MIN_FREE_BYTES: u64 = 128 * 1024;
        /// Directories this call made, deepest first; one that is not empty (someone else
        /// wrote into it meanwhile) stays.
        fn remove_created_dirs(dirs: &[PathBuf]) {
            for d in dirs {
                let _ = fs::remove_dir(d);
            }
        }
        // symlink_metadata: a dangling symlink "exists" too (create_dir would fail on it).
        if dir.symlink_metadata().is_ok() {
            return Err(BagError::AlreadyExists {
                path: dir.to_path_buf(),
            });
        }
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| BagError::invalid(dir, "output path has no usable directory name"))?
            .to_string();
        // The directories this call creates (the bag and any missing parents), deepest first,
        // to remove on failure; and the existing ancestor whose partition will hold the bag.
        let mut created = Vec::new();
        let mut base = None;
        for a in dir.ancestors() {
            let a = if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            };
            if a.symlink_metadata().is_ok() {
                base = Some(a);
                break;
            }
            created.push(a.to_path_buf());
        }
        if let Some(base) = base {
            if let Ok(st) = nix::sys::statvfs::statvfs(base) {
                if st.blocks() == 0 {
                    return Err(BagError::invalid(
                        dir,
                        "cannot create a bag on a filesystem without storage (such as /proc)",
                    ));
                }
                #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
                let free = (st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64);
                if free < NEW_BAG_MIN_FREE_BYTES {
                    return Err(BagError::Io {
                        path: dir.to_path_buf(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::StorageFull,
                            format!(
                                "no space for a new bag: {free} bytes free on its partition, \
                                 {NEW_BAG_MIN_FREE_BYTES} needed"
                            ),
                        ),
                    });
                }
            }
        }
        if let Err(e) = fs::create_dir_all(dir) {
            remove_created_dirs(&created);
            return Err(match e.raw_os_error() {
                // Space and device trouble is a failure while working; the rest says the
                // path itself cannot hold a bag (permission, read-only, a file in the way,
                // a pseudo filesystem such as /proc).
                Some(libc::ENOSPC | libc::EDQUOT | libc::EIO) | None => BagError::io(dir)(e),
                Some(_) => BagError::invalid(dir, format!("cannot create the bag directory: {e}")),
            });
        }
        let built = (|| {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
            // The lock (and unclean-finish marker) exists before any split does.
            let lock = BagLock::acquire(dir)?;
            let meta_gate = Arc::new(MetadataGate::new(
                dir,
                opts.flavour,
                opts.compression.is_some_and(|c| c.whole_splits()),
            ));
            let mut w = BagWriter {
                ops: Arc::new(RealStorage),
                durability: None,
                lock: Some(lock),
                dir: dir.to_path_buf(),
                name,
                opts,
                topics: Vec::new(),
                split: None,
                closed: VecDeque::new(),
                newly_closed: Vec::new(),
                next_index: 0,
                failed: None,
                split_limit: 0,
                split_limit_reached: false,
                rows_seen: 0,
                bytes_seen: 0,
                meta_gate,
                meta_generation: 0,
                shrunk_seen: 0,
                compression: None,
                compress_next: None,
                compress_reserve: Arc::default(),
                compression_queue_full: 0,
                offline_compression: false,
                deferred: VecDeque::new(),
            };
            let r = w.open_split().and_then(|_| {
                // A metadata.yaml from the first moment: a crash before the first split
                // closes still leaves a bag that names its files (reindex refreshes counts).
                w.write_metadata()
            });
            if let Err(e) = r {
                // Close the split quietly: the directory is about to be removed, so Drop's
                // "run reindex" warning would be wrong.
                w.split = None;
                return Err(e);
            }
            Ok(w)
        })();
        built.inspect_err(|_| {
            if let Err(e) = fs::remove_dir_all(dir) {
                log::warn!(
                    "{}: cannot remove the unfinished bag directory: {e}",
                    dir.display()
                );
            }
            remove_created_dirs(created.get(1..).unwrap_or_default());
        })
    }

    /// Run compression jobs (`--compression-mode file`) through `c` (off this thread)
    /// instead of inline.
    pub fn set_compression(&mut self, c: Box<dyn Compression>) {
        self.compression = Some(c);
    }

    /// Compress as an offline rewrite (`convert`) wants, not as a live recorder must: the
    /// writer waits for room in the compression queue rather than leaving a split plain for
    /// later (nothing is arriving that could be lost meanwhile, and the plain splits on disk
    /// stay bounded by the queue), and a failed compression makes [`finish`](Self::finish)
    /// fail, naming the split (still a plain `.db3`, listed so), instead of only being logged.
    pub fn compress_offline(&mut self) {
        self.offline_compression = true;
        self.meta_gate.with_listing(|l| l.report = true);
    }

    /// What compressions of closed splits, handed over or about to be, may still add to the
    /// disk beside those splits (each its `.zstd`, at most [`compressed_bound`] of the
    /// split): the size budget counts it, so it holds while both forms of a split exist.
    /// "About to be": the split closed last and the oldest deferred one, the two that the
    /// next split's opening may hand over.
    pub fn compression_reserve(&self) -> u64 {
        self.compress_reserve.load(Ordering::Relaxed)
            + self.compress_next.as_ref().map_or(0, CompressJob::bound)
            + self.deferred.front().map_or(0, |d| d.1)
    }

    /// Times a closed split found the compression queue full (it was compressed later).
    pub fn compression_queue_full(&self) -> u64 {
        self.compression_queue_full
    }

    /// Hand the split closed last to compression: without waiting (a full queue defers it,
    /// counted and logged: it stays a plain `.db3` until the queue has room), or at `finish`
    /// waiting for room, as rosbag2 compresses a bag's last split when it closes. With room
    /// left, the oldest deferred split follows it.
    fn hand_over_compression(&mut self, wait: bool) {
        let wait = wait || self.offline_compression;
        if let Some(job) = self.compress_next.take() {
            job.handed_over();
            match self.compression.as_mut() {
                None => job.run(),
                Some(c) if wait => c.push(job),
                Some(c) => {
                    if let Err(job) = c.offer(job) {
                        self.compression_queue_full += 1;
                        log::warn!(
                            "{}: the compression queue is full (--compression-queue-size); \
                             this split stays a plain .db3 until it has room",
                            job.split().display()
                        );
                        self.deferred
                            .push_back((job.rel().to_string(), job.bound()));
                        job.skip();
                        return;
                    }
                }
            }
        }
        if wait {
            return;
        }
        let Some((rel, bound)) = self.deferred.front().cloned() else {
            return;
        };
        if self.compression.is_none() {
            return;
        }
        let job = self.new_job(&rel, bound);
        job.handed_over();
        match self.compression.as_mut().map(|c| c.offer(job)) {
            Some(Ok(())) => {
                self.deferred.pop_front();
            }
            Some(Err(job)) => job.skip(),
            None => {}
        }
    }

    fn new_job(&self, rel: &str, bound: u64) -> CompressJob {
        CompressJob::new(
            &self.dir,
            rel,
            self.opts.compression.map_or(0, |c| c.level),
            bound,
            self.meta_gate.clone(),
            self.compress_reserve.clone(),
        )
    }

    /// Route fsyncs and deletions of splits through `ops` (tests record their order).
    pub fn set_storage_ops(&mut self, ops: Box<dyn StorageOps>) {
        self.ops = Arc::from(ops);
    }

    /// Make closed splits durable through `d` (off this thread) instead of inline. Takes
    /// effect from the next split opened; the open one gets its descriptor now.
    pub fn set_durability(&mut self, mut d: Box<dyn Durability>) -> Result<(), BagError> {
        if let Some(s) = self.split.as_mut() {
            // The split's own second descriptor: opening and dropping another one would drop
            // SQLite's POSIX locks on the file.
            d.opened(&s.path, s.file.clone());
            d.committed(s.size_committed);
        }
        self.durability = Some(d);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn flavour(&self) -> Flavour {
        self.opts.flavour
    }
    pub fn options(&self) -> &WriterOptions {
        &self.opts
    }

    /// Register a topic; returns the index to use in rows. Registering the same name again
    /// returns the existing index.
    pub fn add_topic(
        &mut self,
        info: TopicInfo,
        definition: Option<MessageDefinition>,
    ) -> Result<usize, BagError> {
        self.check_ok()?;
        if let Some(i) = self.topics.iter().position(|t| t.info.name == info.name) {
            return Ok(i);
        }
        self.topics.push(TopicState {
            info,
            definition,
            count: 0,
        });
        let idx = self.topics.len() - 1;
        let r = self.register_in_split(idx);
        self.guard(r)?;
        Ok(idx)
    }

    pub fn set_custom_data(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.opts.custom_data.insert(key.into(), value.into());
    }

    /// Write rows as one transaction (several if a split boundary falls inside the batch),
    /// rotating splits as needed with no budget to consult. The recorder's pipeline uses the
    /// finer steps below instead, so retention can act between closing and opening a split.
    pub fn write_batch<'a, I>(&mut self, rows: I) -> Result<(), BagError>
    where
        I: IntoIterator<Item = Row<'a>>,
    {
        let rows: Vec<Row<'a>> = rows.into_iter().collect();
        let mut rest = rows.as_slice();
        while !rest.is_empty() && !self.split_limit_reached {
            let n = self.rows_fitting(rest);
            if n == 0 {
                if !self.may_open_another_split() {
                    // `--max-splits` is a stop condition: what arrives after the last allowed
                    // split fills up is not recorded.
                    self.split_limit_reached = true;
                    return Ok(());
                }
                self.split()?;
                continue;
            }
            self.write_rows(&rest[..n])?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// How many leading `rows` go into the open split before a split is due (by size or
    /// duration). An empty split takes at least one row, however large.
    pub fn rows_fitting(&self, rows: &[Row]) -> usize {
        let Some(s) = self.split.as_ref() else {
            return 0;
        };
        let (size, dur) = (self.opts.max_bag_size, self.opts.max_bag_duration_ns);
        let mut start = s.start_ns;
        let mut bytes = s.size_committed + s.pending_bytes;
        for (i, &(_, ts, data)) in rows.iter().enumerate() {
            let empty = s.count == 0 && i == 0;
            let len = row_estimate(data.len() as u64, s.page_size);
            if !empty
                && ((size > 0 && bytes + len > size)
                    || (dur > 0 && ts.saturating_sub(start) >= dur))
            {
                return i;
            }
            start = if empty { ts } else { start.min(ts) };
            bytes += len;
        }
        rows.len()
    }

    /// Write `rows` into the open split as one transaction, without any split check (the
    /// caller sized them with [`rows_fitting`](Self::rows_fitting)).
    pub fn write_rows(&mut self, rows: &[Row]) -> Result<(), BagError> {
        self.check_ok()?;
        let r = self.write_rows_inner(rows);
        self.guard(r)
    }

    fn write_rows_inner(&mut self, rows: &[Row]) -> Result<(), BagError> {
        if self.split.is_none() {
            return Err(BagError::invalid(&self.dir, "no open split to write into"));
        }
        self.begin()?;
        {
            let Self {
                split,
                topics,
                dir,
                rows_seen,
                bytes_seen,
                ..
            } = self;
            let s = split.as_mut().expect("checked above");
            for &(topic, ts, data) in rows {
                if topic >= topics.len() {
                    return Err(BagError::invalid(
                        &*dir,
                        format!("row names unknown topic index {topic}"),
                    ));
                }
                s.insert
                    .insert(topic as i64 + 1, ts, data)
                    .map_err(BagError::sqlite(&s.path))?;
                s.count += 1;
                s.per_topic[topic] += 1;
                s.start_ns = s.start_ns.min(ts);
                s.end_ns = if s.count == 1 { ts } else { s.end_ns.max(ts) };
                s.pending_bytes += row_estimate(data.len() as u64, s.page_size);
                topics[topic].count += 1;
                *rows_seen += 1;
                *bytes_seen += data.len() as u64;
            }
        }
        self.commit()
    }

    /// Whether a split is due by time at `now_ns` (lets quiet topics rotate on a timer).
    pub fn split_due_by_time(&self, now_ns: i64) -> bool {
        let dur = self.opts.max_bag_duration_ns;
        match &self.split {
            Some(s) if dur > 0 && s.count > 0 => now_ns.saturating_sub(s.start_ns) >= dur,
            _ => false,
        }
    }

    /// False once `--max-splits` files exist: the open split is then the last one.
    pub fn may_open_another_split(&self) -> bool {
        self.split_limit == 0 || self.next_index < self.split_limit
    }

    /// Record that a split was due but the limit forbade it: the writer writes nothing more.
    pub fn mark_split_limit_reached(&mut self) {
        self.split_limit_reached = true;
    }

    /// Close the open split (commit, final metadata row, fsync file and directory); no split
    /// is open afterwards until [`open_next_split`](Self::open_next_split).
    pub fn close_split(&mut self) -> Result<(), BagError> {
        self.check_ok()?;
        let r = self.close_open_split();
        self.guard(r)
    }

    /// Open the next split after [`close_split`](Self::close_split).
    pub fn open_next_split(&mut self) -> Result<(), BagError> {
        self.check_ok()?;
        if self.split.is_some() {
            return Ok(());
        }
        let r = self.open_split();
        self.guard(r)
    }

    /// Bytes closing the open split may add before it is final: the Jazzy split-metadata
    /// row, and (WAL presets) the checkpoint that copies the `-wal` into the file while the
    /// `-wal` still exists.
    pub fn close_reserve(&self) -> u64 {
        let Some(s) = &self.split else {
            return 0;
        };
        let mut reserve = 0;
        if self.opts.flavour == Flavour::Jazzy {
            let text = self.split_metadata(&s.rel, s.start_ns, s.end_ns, s.count, &s.per_topic);
            // The row's own pages plus the b-tree pages its insert may touch or split.
            reserve += 2 * text.len() as u64 + 4 * u64::from(s.page_size);
        }
        let (wal, _) = sidecar_sizes(&s.path);
        reserve + wal
    }

    /// The open split's page size, or the next split's when none is open: what
    /// [`row_growth_bytes`] and the budget's reserves are computed with.
    pub fn page_size(&self) -> u64 {
        u64::from(match &self.split {
            Some(s) => s.page_size,
            None => choose_page_size(
                self.opts.preset,
                self.opts.max_bag_size,
                self.rows_seen,
                self.bytes_seen,
            ),
        })
    }

    /// Bytes on disk of the open split including its `-wal` and `-shm`, as of its last commit.
    pub fn open_split_footprint(&self) -> u64 {
        self.split
            .as_ref()
            .map_or(0, |s| split_size_on_disk(&s.path))
    }

    /// Close the open split and open the next one.
    pub fn split(&mut self) -> Result<(), BagError> {
        self.check_ok()?;
        let r = self.rotate();
        self.guard(r)
    }

    /// (start, end) of the open split's messages, if it has any.
    pub fn open_split_span(&self) -> Option<(i64, i64)> {
        self.split
            .as_ref()
            .filter(|s| s.count > 0)
            .map(|s| (s.start_ns, s.end_ns))
    }
    pub fn open_split_path(&self) -> Option<&Path> {
        self.split.as_ref().map(|s| s.path.as_path())
    }
    pub fn open_split_index(&self) -> Option<u32> {
        self.split.as_ref().map(|s| s.index)
    }
    /// Closed splits still on disk, oldest first.
    pub fn closed_splits(&self) -> &VecDeque<ClosedSplit> {
        &self.closed
    }
    /// Splits closed since the last call.
    pub fn take_newly_closed(&mut self) -> Vec<ClosedSplit> {
        std::mem::take(&mut self.newly_closed)
    }
    /// Closed splits whose compression ended since the last call (their `.db3` gone), by
    /// their `.db3` path, with the size of the `.zstd` that stays. An atomic load when none.
    pub fn take_compressed_sizes(&mut self) -> Vec<(PathBuf, u64)> {
        let done = self
            .meta_gate
            .shrunk
            .load(std::sync::atomic::Ordering::Acquire);
        if done == self.shrunk_seen {
            return Vec::new();
        }
        self.shrunk_seen = done;
        let dir = &self.dir;
        self.meta_gate
            .with_listing(|l| {
                l.shrunk
                    .drain(..)
                    .map(|(rel, size)| (dir.join(rel), size))
                    .collect()
            })
            .unwrap_or_default()
    }
    /// Number of split files created so far, including the open one.
    pub fn splits_created(&self) -> u32 {
        self.next_index
    }
    /// Never create more than `n` split files (0 = no limit): when split number `n` would be
    /// opened, the writer stops writing instead and `split_limit_reached()` turns true.
    pub fn set_split_limit(&mut self, n: u32) {
        self.split_limit = n;
    }
    pub fn split_limit_reached(&self) -> bool {
        self.split_limit_reached
    }

    /// Delete the oldest closed split (never the open one) and rewrite metadata.yaml so it
    /// lists exactly what remains. Returns what was deleted.
    pub fn delete_oldest_closed(&mut self) -> Result<Option<ClosedSplit>, BagError> {
        self.delete_closed_at(0)
    }

    /// Delete the closed split at `path` (any of them, never the open one) and rewrite
    /// metadata.yaml so it lists exactly what remains, per-topic counts, start and duration
    /// included; `None` when no closed split is at `path`. Retention deletes a split that is
    /// out (uploaded) this way even when older ones are not. O(closed splits) to find it.
    pub fn delete_closed(&mut self, path: &Path) -> Result<Option<ClosedSplit>, BagError> {
        match self.closed.iter().position(|c| c.path == path) {
            Some(i) => self.delete_closed_at(i),
            None => {
                self.check_ok()?;
                Ok(None)
            }
        }
    }

    fn delete_closed_at(&mut self, i: usize) -> Result<Option<ClosedSplit>, BagError> {
        self.check_ok()?;
        let Some(old) = self.closed.remove(i) else {
            return Ok(None);
        };
        for (t, n) in self.topics.iter_mut().zip(&old.per_topic) {
            t.count -= n;
        }
        // metadata.yaml first: a crash in between leaves an unlisted older file, which the
        // reader accepts, rather than a listed file that is gone, which it refuses. Written
        // here, not queued: the file goes next. It lists the closed splits, as at a close.
        let r = self.prepare_metadata(self.recording_metadata()).write();
        // A compression of this split stops (under the gate's lock: after this, no job
        // renames a .zstd of it); whether its .zstd was complete says which form to delete.
        let compressed = self
            .meta_gate
            .with_listing(|l| l.forget(&old.file.path))
            .unwrap_or(false);
        if self
            .compress_next
            .as_ref()
            .is_some_and(|j| j.split() == old.path)
        {
            self.compress_next = None;
        }
        self.deferred.retain(|d| d.0 != old.file.path);
        let r = r.and_then(|_| {
            if let Some(d) = self.durability.as_mut() {
                // Never delete ahead of durability: newer splits must be on disk first.
                d.wait(&old.path).map_err(BagError::io(&old.path))?;
            }
            if compressed {
                let mut zstd = old.path.as_os_str().to_owned();
                zstd.push(super::compressed::ZSTD_SUFFIX);
                let zstd = PathBuf::from(zstd);
                self.ops.remove_file(&zstd).map_err(BagError::io(&zstd))?;
                // The job deletes the .db3 after its rename: it may be gone already.
                match self.ops.remove_file(&old.path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(BagError::io(&old.path)(e))
                    }
                    _ => {}
                }
            } else {
                remove_split_file(self.ops.as_ref(), &old.path)?;
            }
            self.ops
                .sync_dir(&self.dir)
                .map_err(BagError::io(&self.dir))
        });
        self.guard(r)?;
        Ok(Some(old))
    }

    /// The metadata as of the last commit: closed splits plus the open one.
    pub fn metadata(&self) -> BagMetadata {
        self.metadata_with(true)
    }

    /// What metadata.yaml says while the bag is recorded: the closed splits, every one with
    /// its final counts, and not the open one, whose counts would be stale at the next
    /// commit (a reader then sees a bag whose listing lags its splits: in progress while the
    /// lock is held, else interrupted and for `reindex`). With no closed split on disk (the
    /// first split, or retention deleted every closed one) the open split is listed, so the
    /// bag always names a file.
    pub fn recording_metadata(&self) -> BagMetadata {
        self.metadata_with(self.closed.is_empty())
    }

    fn metadata_with(&self, include_open: bool) -> BagMetadata {
        let mut files: Vec<FileInfo> = self.closed.iter().map(|c| c.file.clone()).collect();
        let open = self.split.as_ref();
        if let Some(s) = open.filter(|_| include_open) {
            files.push(open_file_info(s));
        }
        let mut m = BagMetadata::empty(self.opts.flavour);
        let with_msgs = files.iter().filter(|f| f.message_count > 0);
        let start = with_msgs.clone().map(|f| f.starting_time_ns).min();
        let end = with_msgs.map(|f| f.starting_time_ns + f.duration_ns).max();
        if let (Some(start), Some(end)) = (start, end) {
            m.starting_time_ns = start;
            m.duration_ns = end - start;
        }
        m.message_count = files.iter().map(|f| f.message_count).sum();
        m.topics = self
            .topics
            .iter()
            .enumerate()
            .map(|(i, t)| TopicWithCount {
                topic: t.info.clone(),
                message_count: match open.filter(|_| !include_open) {
                    // `count` covers every split on disk, the open one too.
                    Some(s) => t.count - s.per_topic.get(i).copied().unwrap_or(0),
                    None => t.count,
                },
            })
            .collect();
        m.relative_file_paths = files.iter().map(|f| f.path.clone()).collect();
        m.files = files;
        m.custom_data = self.opts.custom_data.clone();
        if self.opts.compression.is_some_and(|c| c.per_message) {
            // rosbag2's message mode: the readers decompress each row only when told so here.
            m.compression_format = super::compressed::ZSTD_FORMAT.into();
            m.compression_mode = super::compressed::MESSAGE_MODE.into();
        }
        m
    }

    /// Finish the bag: commit, record the split's own metadata, fsync the file and the
    /// directory, write metadata.yaml atomically. After an earlier failure, finishes what it
    /// can and returns the original error.
    pub fn finish(mut self) -> Result<BagSummary, BagError> {
        // The complete metadata.yaml is written below, once every split is durable.
        let close = self.close_split_publishing(false);
        // The last split is compressed now, as rosbag2 does at close; the bag is finished
        // once every compression handed over is done (bounded by the queue), and then the
        // deferred ones, one at a time (the reserve retention kept holds one), so that a
        // finished bag has no plain split left.
        if close.is_ok() {
            self.hand_over_compression(true);
        }
        let synced = match self.durability.as_mut() {
            Some(d) => d.wait_all().map_err(BagError::io(&self.dir)),
            None => Ok(()),
        };
        if let Some(c) = self.compression.as_mut() {
            c.wait_all();
        }
        if close.is_ok() {
            while let Some((rel, bound)) = self.deferred.pop_front() {
                let job = self.new_job(&rel, bound);
                job.handed_over();
                job.run();
            }
        }
        if self.compression_queue_full > 0 {
            self.set_custom_data(
                "ringbag.compression_queue_full",
                self.compression_queue_full.to_string(),
            );
        }
        let close = close.and(synced);
        let meta = self.write_metadata();
        if let Some(reason) = self.failed.take() {
            return Err(BagError::Failed {
                path: self.dir.clone(),
                reason,
            });
        }
        close?;
        meta?;
        // Everything is durable: only now does the bag count as cleanly finished.
        if let Some(lock) = self.lock.take() {
            lock.release_clean()?;
        }
        // The bag is whole and readable (a split that failed to compress is listed as its
        // plain .db3), but not what was asked for: say so (only `compress_offline` records).
        if let Some((split, e)) = self.meta_gate.with_listing(|l| l.failed.take()).flatten() {
            return Err(BagError::invalid(
                split,
                format!("not compressed, left as a plain .db3: {e}"),
            ));
        }
        let mut metadata = self.metadata();
        self.meta_gate.with_listing(|l| l.apply(&mut metadata));
        let size_bytes = self.closed.iter().map(|c| c.size_bytes).sum();
        Ok(BagSummary {
            dir: self.dir.clone(),
            metadata,
            size_bytes,
        })
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    // ---- internals -------------------------------------------------------------------

    fn check_ok(&mut self) -> Result<(), BagError> {
        if let Some((path, e)) = self.durability.as_mut().and_then(|d| d.take_failure()) {
            // A closed split could not be made durable: the recording cannot keep its promise.
            log::error!("{}: fsync failed: {e}", path.display());
            self.failed = Some(format!("fsync of {} failed: {e}", path.display()));
        }
        match &self.failed {
            Some(reason) => Err(BagError::Failed {
                path: self.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// After an I/O error the writer refuses further writes (the file may be inconsistent
    /// with our counters); the caller finishes what it can and exits non-zero.
    fn guard<T>(&mut self, r: Result<T, BagError>) -> Result<T, BagError> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                self.failed = Some(e.to_string());
            }
            if let Some(s) = &self.split {
                // Best effort: keep what the failed batch managed to write. Errors here add
                // nothing to the one we already report.
                let _ = s.conn.execute_batch("COMMIT");
            }
        }
        r
    }

    fn begin(&mut self) -> Result<(), BagError> {
        let s = self.split.as_mut().expect("a split is open");
        s.conn
            .execute_batch("BEGIN")
            .map_err(BagError::sqlite(&s.path))
    }

    fn commit(&mut self) -> Result<(), BagError> {
        let preset = self.opts.preset;
        let s = self.split.as_mut().expect("a split is open");
        s.conn
            .execute_batch("COMMIT")
            .map_err(BagError::sqlite(&s.path))?;
        // Once the root has become an interior page, appends only ever add pages: a torn
        // commit can lose only its own rows, and the journal is no longer needed.
        if s.guarded && !messages_root_is_leaf(s)? {
            end_guard(s, preset)?;
        }
        s.size_committed = split_size_on_disk(&s.path);
        s.pending_bytes = 0;
        if let Some(d) = self.durability.as_mut() {
            d.committed(s.size_committed);
        }
        Ok(())
    }

    fn split_path(&self, index: u32) -> (String, PathBuf) {
        let rel = format!("{}_{}.db3", self.name, index);
        let path = self.dir.join(&rel);
        (rel, path)
    }

    fn open_split(&mut self) -> Result<(), BagError> {
        self.hand_over_compression(false);
        let index = self.next_index;
        let (rel, path) = self.split_path(index);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(BagError::sqlite(&path))?;
        let preset = self.opts.preset;
        let page_size = choose_page_size(
            preset,
            self.opts.max_bag_size,
            self.rows_seen,
            self.bytes_seen,
        );
        let setup = || -> rusqlite::Result<()> {
            conn.execute_batch(&preset.create_pragmas(page_size))?;
            apply_pragmas(&conn, &preset.write_pragmas())?;
            apply_pragmas(&conn, &self.opts.extra_pragmas)?;
            create_tables(&conn, self.opts.flavour)?;
            if self.opts.flavour == Flavour::Jazzy {
                // rosbag2 Jazzy writes a placeholder row at open and the final one at close.
                let placeholder = self.split_metadata(&rel, NO_START, 0, 0, &[]);
                conn.execute(
                    "INSERT INTO metadata (metadata_version, metadata) VALUES (?1, ?2)",
                    params![self.opts.flavour.metadata_version(), placeholder],
                )?;
            }
            Ok(())
        };
        setup().map_err(BagError::sqlite(&path))?;
        // Make the empty split (header, schema) and its directory entry durable before any
        // metadata.yaml names it: otherwise a power cut can leave a listed 0-byte file, which
        // no reader opens (it has no tables). One small fsync per split.
        // The connection is closed around the fsync: SQLite's locks are POSIX record locks,
        // which the kernel drops for the whole process when *any* descriptor of the file is
        // closed, so fsyncing through a second descriptor would leave the split unlocked for
        // its whole life and let readers see half-written pages.
        conn.close().map_err(|(_, e)| BagError::Sqlite {
            path: path.clone(),
            source: e,
        })?;
        self.ops.sync_file(&path).map_err(BagError::io(&path))?;
        self.ops
            .sync_dir(&self.dir)
            .map_err(BagError::io(&self.dir))?;
        let conn = Connection::open_with_flags(&path, flags).map_err(BagError::sqlite(&path))?;
        // Per-connection settings (locking mode, synchronous, cache) are set again; the
        // journal mode and page size live in the file.
        apply_pragmas(&conn, &preset.write_pragmas())
            .and_then(|()| apply_pragmas(&conn, &self.opts.extra_pragmas))
            .map_err(BagError::sqlite(&path))?;
        let guarded = preset.commits_can_tear();
        if guarded {
            switch_journal(&conn, &path, GUARD_JOURNAL_MODE)?;
        }
        let root: i64 = conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
                [],
                |r| r.get(0),
            )
            .map_err(BagError::sqlite(&path))?;
        let insert = MessageInsert::prepare(&conn).map_err(BagError::sqlite(&path))?;
        let file = Arc::new(fs::File::open(&path).map_err(BagError::io(&path))?);
        if let Some(d) = self.durability.as_mut() {
            d.opened(&path, file.clone());
        }
        self.next_index += 1;
        self.split = Some(OpenSplit {
            index,
            rel,
            insert,
            file,
            // Page n starts at (n - 1) * page size; the messages root is never page 1, so
            // its page-type byte is the page's first.
            messages_root_offset: (root.max(1) as u64 - 1) * u64::from(page_size),
            guarded,
            page_size,
            size_committed: split_size_on_disk(&path),
            path,
            conn,
            start_ns: NO_START,
            end_ns: NO_START,
            count: 0,
            per_topic: vec![0; self.topics.len()],
            registered: vec![false; self.topics.len()],
            definitions: Vec::new(),
            pending_bytes: 0,
        });
        for i in 0..self.topics.len() {
            self.register_in_split(i)?;
        }
        Ok(())
    }

    /// Insert topic `idx` (and its definition) into the open split. rosbag2 lists every known
    /// topic in every split, so each file is readable alone.
    fn register_in_split(&mut self, idx: usize) -> Result<(), BagError> {
        let flavour = self.opts.flavour;
        let Some(s) = self.split.as_mut() else {
            return Ok(());
        };
        if s.registered.len() <= idx {
            s.registered.resize(idx + 1, false);
            s.per_topic.resize(idx + 1, 0);
        }
        if s.registered[idx] {
            return Ok(());
        }
        let t = &self.topics[idx];
        let style = match flavour {
            Flavour::Humble => PolicyStyle::Integer,
            Flavour::Jazzy => PolicyStyle::Name,
        };
        let qos = profiles_to_yaml_string(&t.info.offered_qos_profiles, style);
        // The topics and message_definitions roots overflow like the messages root does
        // (the 10th Jazzy topic in 4 KiB pages): a registration after the split's guarded
        // start goes through the rollback journal too, so that a torn one cannot take the
        // topics registered before it (and so their messages) with it. Rare: once per topic.
        let reguard = !s.guarded && self.opts.preset.commits_can_tear();
        if reguard {
            switch_journal(&s.conn, &s.path, GUARD_JOURNAL_MODE)?;
        }
        s.conn
            .execute_batch("BEGIN")
            .map_err(BagError::sqlite(&s.path))?;
        let r = match flavour {
            Flavour::Humble => s.conn.execute(
                "INSERT INTO topics (id, name, type, serialization_format, offered_qos_profiles) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![idx as i64 + 1, t.info.name, t.info.type_name, t.info.serialization_format, qos],
            ),
            Flavour::Jazzy => s.conn.execute(
                "INSERT INTO topics (id, name, type, serialization_format, offered_qos_profiles, type_description_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![idx as i64 + 1, t.info.name, t.info.type_name, t.info.serialization_format, qos, t.info.type_description_hash],
            ),
        };
        r.map_err(BagError::sqlite(&s.path))?;
        if flavour == Flavour::Jazzy && !s.definitions.contains(&t.info.type_name) {
            // rosbag2 writes a row per type even when the definition is unknown.
            let def = t.definition.clone().unwrap_or_else(|| MessageDefinition {
                topic_type: t.info.type_name.clone(),
                encoding: "unknown".into(),
                encoded_message_definition: String::new(),
                type_description_hash: t.info.type_description_hash.clone(),
            });
            s.conn
                .execute(
                    "INSERT INTO message_definitions (topic_type, encoding, encoded_message_definition, type_description_hash) VALUES (?1, ?2, ?3, ?4)",
                    params![def.topic_type, def.encoding, def.encoded_message_definition, def.type_description_hash],
                )
                .map_err(BagError::sqlite(&s.path))?;
            s.definitions.push(t.info.type_name.clone());
        }
        s.conn
            .execute_batch("COMMIT")
            .map_err(BagError::sqlite(&s.path))?;
        if reguard {
            end_guard(s, self.opts.preset)?;
        }
        s.registered[idx] = true;
        s.size_committed = split_size_on_disk(&s.path);
        Ok(())
    }

    /// Split-local metadata text for Jazzy's `metadata` table: this file only, so the work
    /// per split is O(topics), never O(splits so far).
    fn split_metadata(
        &self,
        rel: &str,
        start: i64,
        end: i64,
        count: u64,
        per_topic: &[u64],
    ) -> String {
        let mut m = BagMetadata::empty(self.opts.flavour);
        let file = FileInfo {
            path: rel.to_string(),
            starting_time_ns: start,
            duration_ns: if count > 0 { end - start } else { 0 },
            message_count: count,
        };
        m.starting_time_ns = file.starting_time_ns;
        m.duration_ns = file.duration_ns;
        m.message_count = count;
        m.topics = self
            .topics
            .iter()
            .enumerate()
            .filter(|(i, _)| count > 0 || per_topic.get(*i).is_some())
            .map(|(i, t)| TopicWithCount {
                topic: t.info.clone(),
                message_count: per_topic.get(i).copied().unwrap_or(0),
            })
            .collect();
        m.relative_file_paths = vec![file.path.clone()];
        m.files = vec![file];
        m.custom_data = self.opts.custom_data.clone();
        if self.opts.compression.is_some_and(|c| c.per_message) {
            // As rosbag2 Jazzy stores it in each split's `metadata` row in message mode.
            m.compression_format = super::compressed::ZSTD_FORMAT.into();
            m.compression_mode = super::compressed::MESSAGE_MODE.into();
        }
        m.to_table_yaml(self.opts.flavour)
    }

    /// Commit and close the open split; fsync it and the directory before it counts as
    /// closed (retention may delete older splits only after that); then rewrite
    /// metadata.yaml to list it, so that a bag whose recorder is killed names every closed
    /// split with its counts (`ros2 bag info` reads only that file).
    fn close_open_split(&mut self) -> Result<(), BagError> {
        self.close_split_publishing(true)
    }

    /// [`close_open_split`](Self::close_open_split); metadata.yaml only if `publish`.
    fn close_split_publishing(&mut self, publish: bool) -> Result<(), BagError> {
        let Some(mut s) = self.split.take() else {
            return Ok(());
        };
        if self.opts.flavour == Flavour::Jazzy {
            let text = self.split_metadata(&s.rel, s.start_ns, s.end_ns, s.count, &s.per_topic);
            s.conn
                .execute(
                    "INSERT INTO metadata (metadata_version, metadata) VALUES (?1, ?2)",
                    params![self.opts.flavour.metadata_version(), text],
                )
                .map_err(BagError::sqlite(&s.path))?;
        }
        // A split closed while still guarded (a few small rows) gets its own journal mode back
        // and loses its empty -journal: closed splits are single files.
        if s.guarded {
            end_guard(&mut s, self.opts.preset)?;
        }
        let file = open_file_info(&s);
        let OpenSplit {
            index,
            path,
            insert,
            conn,
            file: second_fd,
            per_topic,
            ..
        } = s;
        // SQLite closes no connection with a live statement.
        drop(insert);
        // A WAL split (`resilient`) is folded back into one self-contained file: every frame
        // checkpointed into it and the file switched to a rollback journal, which removes
        // its -wal and -shm. A closed split then reads with no side files, so readers need
        // no write access to the bag and never create any.
        let unwal = (|| -> rusqlite::Result<()> {
            let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
            if mode.eq_ignore_ascii_case("wal") {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                conn.query_row("PRAGMA journal_mode=DELETE", [], |_| Ok(()))?;
            }
            Ok(())
        })();
        unwal.map_err(BagError::sqlite(&path))?;
        conn.close().map_err(|(_, e)| BagError::Sqlite {
            path: path.clone(),
            source: e,
        })?;
        // Only now, with the connection (and its locks) gone, may the second descriptor close.
        drop(second_fd);
        match self.durability.as_mut() {
            Some(d) => d.closed(&path, &self.dir, file.message_count, self.ops.clone()),
            None => {
                self.ops.sync_file(&path).map_err(BagError::io(&path))?;
                self.ops
                    .sync_dir(&self.dir)
                    .map_err(BagError::io(&self.dir))?;
                log_durable_split(&path, file.message_count);
            }
        }
        let closed = ClosedSplit {
            index,
            size_bytes: split_size_on_disk(&path),
            file,
            path,
            per_topic,
        };
        if self.opts.compression.is_some_and(|c| c.whole_splits()) {
            // Handed over when the next split opens (or at finish): after retention made
            // room for its reserve.
            self.hand_over_compression(false);
            self.compress_next =
                Some(self.new_job(&closed.file.path, compressed_bound(closed.size_bytes)));
        }
        self.closed.push_back(closed.clone());
        self.newly_closed.push(closed);
        if publish {
            // No split is open now: this lists exactly the closed ones. Copied here (O(topics
            // + splits on disk)), turned into YAML and written after the split's fsync: on the
            // sync thread when there is one, so the writer waits for neither.
            let write = self.prepare_metadata(self.recording_metadata());
            match self.durability.as_mut() {
                Some(d) => d.metadata(write),
                None => write.write()?,
            }
        }
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), BagError> {
        self.close_open_split()?;
        self.open_split()
    }

    /// The complete metadata (the open split included), written now.
    fn write_metadata(&mut self) -> Result<(), BagError> {
        self.prepare_metadata(self.metadata()).write()
    }

    /// A rewrite of metadata.yaml with `m`, numbered after every one prepared before.
    fn prepare_metadata(&mut self, m: BagMetadata) -> MetadataWrite {
        self.meta_generation += 1;
        MetadataWrite {
            dir: self.dir.clone(),
            meta: m,
            flavour: self.opts.flavour,
            generation: self.meta_generation,
            gate: self.meta_gate.clone(),
        }
    }
}

impl Drop for BagWriter {
    /// Best effort only: `finish()` is the way to close a bag. A writer dropped without it
    /// (a panic elsewhere) still commits, so `reindex` finds the rows.
    fn drop(&mut self) {
        if let Some(s) = &self.split {
            if !s.conn.is_autocommit() {
                if let Err(e) = s.conn.execute_batch("COMMIT") {
                    log::error!("{}: commit on drop failed: {e}", s.path.display());
                }
            }
            log::warn!(
                "{}: bag writer dropped without finish(); run `ringbag reindex` on it",
                self.dir.display()
            );
        }
    }
}

/// The power-cut test (scripts/powercut-test.sh) reads these lines: a split logged here is
/// durable (file and directory fsynced) and must come back intact.
pub fn log_durable_split(path: &Path, messages: u64) {
    log::debug!(
        "closed split {}: {messages} messages, fsynced",
        path.display()
    );
}

fn open_file_info(s: &OpenSplit) -> FileInfo {
    FileInfo {
        path: s.rel.clone(),
        starting_time_ns: s.start_ns,
        duration_ns: if s.count > 0 {
            s.end_ns - s.start_ns
        } else {
            0
        },
        message_count: s.count,
    }
}

/// What a row adds to the file as far as splitting by size is concerned, before its commit
/// shows the real size: payload plus row overhead, plus, for a payload that spills into
/// overflow pages, the unused tail of its last page (up to a page; 64 KiB with large pages).
fn row_estimate(len: u64, page_size: u32) -> u64 {
    let page = u64::from(page_size);
    let tail = if len + ROW_OVERHEAD_BYTES > page.saturating_sub(35) {
        page
    } else {
        0
    };
    len + ROW_OVERHEAD_BYTES + tail
}

/// Set `conn`'s journal mode (outside any transaction). SQLite answers with the mode in force,
/// which is the old one when it refused the switch.
fn switch_journal(conn: &Connection, path: &Path, mode: &str) -> Result<(), BagError> {
    let now: String = conn
        .query_row(&format!("PRAGMA journal_mode={mode}"), [], |r| r.get(0))
        .map_err(BagError::sqlite(path))?;
    if now.eq_ignore_ascii_case(mode) {
        Ok(())
    } else {
        Err(BagError::invalid(
            path,
            format!("SQLite kept journal_mode {now} instead of {mode}"),
        ))
    }
}

/// Whether the open split's `messages` root page is still a table leaf (type byte 13; an
/// interior page is 5). Read from the file (one byte, in the page cache: every commit's
/// pages were written there), not through SQLite, whose `dbstat` would also walk the
/// overflow chains of every row on the page.
fn messages_root_is_leaf(s: &OpenSplit) -> Result<bool, BagError> {
    use std::os::unix::fs::FileExt;
    let mut kind = [0u8; 1];
    s.file
        .read_exact_at(&mut kind, s.messages_root_offset)
        .map_err(BagError::io(&s.path))?;
    Ok(kind[0] == 13)
}

/// Back to the preset's own journal mode, with no `-journal` left beside the split (in
/// `EXCLUSIVE` locking mode SQLite keeps the empty file; it holds nothing to play back once
/// the commit that used it has completed).
fn end_guard(s: &mut OpenSplit, preset: StoragePreset) -> Result<(), BagError> {
    switch_journal(&s.conn, &s.path, preset.journal_mode())?;
    let mut journal = s.path.as_os_str().to_owned();
    journal.push("-journal");
    let journal = PathBuf::from(journal);
    match fs::remove_file(&journal) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(BagError::io(&journal)(e)),
    }
    s.guarded = false;
    Ok(())
}

/// Run `PRAGMA x=y;` statements one by one: some (journal_mode) return a row, which
/// `execute_batch` would treat as an error.
pub fn apply_pragmas(conn: &Connection, pragmas: &str) -> rusqlite::Result<()> {
    for stmt in pragmas.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let mut st = conn.prepare(stmt)?;
        let mut rows = st.query([])?;
        while rows.next()?.is_some() {}
    }
    Ok(())
}

/// The most one message row of `len` payload bytes can add to a split file: an upper bound
/// that the size budget relies on, derived from SQLite's b-tree layout (pages of `page_size`
/// bytes, no reserved bytes) rather than measured, so it holds for every size:
/// * a cell of up to `MAX_LOCAL` bytes lives in a table leaf. Rows are appended in rowid
///   order and SQLite starts a new rightmost leaf only when the next cell does not fit, so a
///   leaf wastes less than one cell: each cell costs at most twice its size, or a whole page
///   when two cannot share one;
/// * a larger payload keeps a local part in the leaf (as above) and spills the rest into
///   overflow pages of `page_size - 4` bytes each;
/// * the `timestamp_idx` entry (timestamp, rowid) costs at most twice its size likewise.
///
/// Interior pages of both b-trees are covered per commit (the retention's commit reserve).
pub fn row_growth_bytes(len: u64, page_size: u64) -> u64 {
    let page = page_size.max(512);
    let usable = page;
    let max_local = usable - 35;
    let min_local = (usable - 12) * 32 / 255 - 23;
    let overflow_data = usable - 4;
    // Record: header (4 serial types) + topic_id (up to 8) + timestamp (8) + blob.
    const RECORD_OVERHEAD: u64 = 4 + 9 + 8 + 8;
    // Cell: payload-size and rowid varints (up to 9 each), a 4-byte overflow pointer, and
    // the 2-byte cell pointer in the page header.
    const CELL_OVERHEAD: u64 = 9 + 9 + 4 + 2;
    const INDEX_ENTRY: u64 = 2 * (9 + 9 + 8 + 8 + 2);
    let payload = len + RECORD_OVERHEAD;
    let (local, overflow_pages) = if payload <= max_local {
        (payload, 0)
    } else {
        let mut local = min_local + (payload - min_local) % overflow_data;
        if local > max_local {
            local = min_local;
        }
        (local, (payload - local).div_ceil(overflow_data))
    };
    let cell = local + CELL_OVERHEAD;
    // The leaf page header (8 bytes) leaves `page - 8` for cells.
    let leaf = if 2 * cell > usable - 8 {
        page
    } else {
        2 * cell + 8
    };
    leaf + overflow_pages * page + INDEX_ENTRY
}

/// A split's footprint: the .db3 plus its `-wal` and `-shm`, if any (the disk budget is what
/// counts).
pub fn split_size_on_disk(path: &Path) -> u64 {
    let main = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let (wal, shm) = sidecar_sizes(path);
    main + wal + shm
}

/// Sizes of a split's `-wal` and `-shm` files (0 when absent).
pub fn sidecar_sizes(path: &Path) -> (u64, u64) {
    let len = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        fs::metadata(PathBuf::from(p)).map_or(0, |m| m.len())
    };
    (len("-wal"), len("-shm"))
}

/// Remove a split and any SQLite side files (`-wal`, `-shm`, `-journal`) next to it.
pub fn remove_split_file(ops: &dyn StorageOps, path: &Path) -> Result<(), BagError> {
    ops.remove_file(path).map_err(BagError::io(path))?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let side = PathBuf::from(side);
        if side.exists() {
            fs::remove_file(&side).map_err(BagError::io(&side))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::schema::{LARGE_PAGE_SIZE, SMALL_PAGE_SIZE};

    /// The background syncer may reach a closed split after its compression deleted the
    /// `.db3`: the split is then durable in its `.zstd` (fsynced before the `.db3` went), not
    /// a failed fsync that would stop the recording. A split gone in both forms still fails.
    #[test]
    fn syncing_a_split_already_compressed_syncs_its_zstd() {
        let dir = tempfile::tempdir().unwrap();
        let split = dir.path().join("b_0.db3");
        fs::write(dir.path().join("b_0.db3.zstd"), b"z").unwrap();
        RealStorage.sync_file(&split).unwrap();
        let gone = dir.path().join("b_1.db3");
        let e = RealStorage.sync_file(&gone).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn storage_config_pragmas_run_after_the_presets_on_every_split() {
        let dir = tempfile::tempdir().unwrap();
        let bag = dir.path().join("b");
        let mut w = BagWriter::create(
            &bag,
            WriterOptions {
                extra_pragmas: "PRAGMA synchronous=FULL;PRAGMA cache_size=-1234;".into(),
                ..WriterOptions::new(Flavour::Jazzy)
            },
        )
        .unwrap();
        for _ in 0..2 {
            let conn = &w.split.as_ref().expect("an open split").conn;
            let sync: i64 = conn
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap();
            let cache: i64 = conn
                .query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap();
            // FULL = 2, over write-optimized's OFF; the cache over its 8 MiB.
            assert_eq!((sync, cache), (2, -1234));
            // The preset's own settings stay.
            let journal: String = conn
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            assert_ne!(journal, "wal");
            w.split().unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn the_page_size_is_large_only_for_large_splits_of_large_messages() {
        use StoragePreset::*;
        const MIB: u64 = 1 << 20;
        let (l, s) = (LARGE_PAGE_SIZE, SMALL_PAGE_SIZE);
        // (preset, -b, messages seen, bytes seen, page size)
        let cases = [
            // Nothing seen yet: the split size decides.
            (WriteOptimized, 0, 0, 0, l),
            (WriteOptimized, 64 * MIB, 0, 0, l),
            (WriteOptimized, 64 * MIB - 1, 0, 0, s),
            (WriteOptimized, 86016, 0, 0, s),
            // Then the messages: 100 B on average go back to small pages, camera frames stay.
            (WriteOptimized, 0, 1000, 100_000, s),
            (WriteOptimized, 0, 10, 10 * MIB, l),
            (WriteOptimized, 0, 10, 40_960, l),
            (WriteOptimized, 0, 10, 40_950, s),
            // The other presets keep SQLite's default, as rosbag2's files do.
            (Resilient, 0, 0, 0, s),
            (None, 0, 10, 10 * MIB, s),
        ];
        for (preset, b, rows, bytes, want) in cases {
            assert_eq!(
                choose_page_size(preset, b, rows, bytes),
                want,
                "{preset:?} -b {b}, {rows} rows of {bytes} bytes"
            );
        }
    }

    #[test]
    fn row_growth_bounds_what_each_commit_really_adds_at_both_page_sizes() {
        // The size budget relies on it: one row per commit, sizes around every boundary of
        // the b-tree layout (local payload, overflow pages) for 4 KiB and 64 KiB pages.
        let sizes = [
            0u64,
            1,
            100,
            1000,
            4000,
            4061,
            4062,
            4100,
            9000,
            60_000,
            65_400,
            65_500,
            70_000,
            200_000,
            1 << 20,
            6_220_800,
        ];
        for page in [u64::from(SMALL_PAGE_SIZE), u64::from(LARGE_PAGE_SIZE)] {
            let tmp = tempfile::tempdir().unwrap();
            let max_bag_size = if page == 4096 { 16 << 20 } else { 0 };
            let mut opts = WriterOptions::new(Flavour::Jazzy);
            opts.max_bag_size = max_bag_size;
            let mut w = BagWriter::create(&tmp.path().join("b"), opts).unwrap();
            assert_eq!(w.page_size(), page);
            let t = w
                .add_topic(TopicInfo::new("/t", "std_msgs/msg/String"), None)
                .unwrap();
            let mut ts = 1;
            for round in 0..3 {
                for &len in &sizes {
                    let data = vec![7u8; len as usize];
                    let before = w.open_split_footprint();
                    w.write_rows(&[(t, ts, data.as_slice())]).unwrap();
                    ts += 1;
                    let grew = w.open_split_footprint() - before;
                    let bound = row_growth_bytes(len, page) + 8 * page;
                    assert!(
                        grew <= bound,
                        "page {page}, round {round}, {len} B: grew {grew} > {bound}"
                    );
                }
            }
            w.finish().unwrap();
        }
    }
}
