//! The upload engine: which bags and files go in which order ([`plan_root`], [`bag_files`]),
//! and one resumable, verified upload of a file ([`Uploader::upload_file`]) or of a bag's
//! files in order ([`Uploader::upload_bag`]). The CLI drives it once; the daemon drives it
//! forever. Retry policy is the caller's: every call here is one attempt, and what it
//! achieved is in the journal, so the next attempt continues from there.
//!
//! Invariants:
//! * a file counts as uploaded (journal `done`) only after HEAD showed the expected size and
//!   ETag (single PUT: the MD5; multipart: MD5 of the part MD5s, `-N`), computed locally;
//! * a part is recorded in the journal only after the server acknowledged it, and a part the
//!   journal or the server (ListParts, with a matching MD5) has is never sent again;
//! * a bag's metadata.yaml goes after all its splits, and again whenever its content changed;
//! * a bag whose lock is held (being recorded) is never read;
//! * memory: one part buffer per part in flight (`part_size × concurrency`, plus small
//!   buffers). A part is read once into its buffer, hashed for its `Content-MD5`, and sent
//!   from memory: one read of the disk per part (the recorder's disk is the scarcer
//!   resource on a Jetson), and a retried request resends the same bytes it hashed;
//! * CPU: a multipart upload has one reader, which reads parts two at a time and hashes them
//!   side by side (about half the CPU per byte of one MD5 after the other), and `concurrency`
//!   senders.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::client::{Body, S3Client, ServerPart};
use super::journal::{unix_ms_now, FileEntry, FileIdentity, Journal, PartDone, JOURNAL_FILE};
use super::md5::{self, Md5};
use super::parts::{bare_etag, hex, multipart_etag, PartPlan};
use super::rate::{MonotonicClock, TokenBucket};
use super::{KeyTemplate, Target, Tuning, UploadError};
use crate::bag::lock::LockState;

/// The name rosbag2 gives a bag's metadata file.
pub const METADATA_FILE: &str = "metadata.yaml";
/// Multipart uploads of ours that no journal references are aborted after this long.
pub const STALE_UPLOAD_AGE: Duration = Duration::from_secs(24 * 3600);

/// Counters the daemon shows; cheap to read from any thread.
#[derive(Debug, Default)]
pub struct Counters {
    /// Body bytes sent, retried bytes included.
    pub bytes_sent: AtomicU64,
    pub files_done: AtomicU64,
    pub backlog_files: AtomicU64,
    pub backlog_bytes: AtomicU64,
    /// Unix milliseconds of the last verified file; 0 = never.
    pub last_success_unix_ms: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CountersSnapshot {
    pub bytes_sent: u64,
    pub files_done: u64,
    pub backlog_files: u64,
    pub backlog_bytes: u64,
    pub last_success_unix_ms: u64,
    pub last_error: Option<String>,
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            files_done: self.files_done.load(Ordering::Relaxed),
            backlog_files: self.backlog_files.load(Ordering::Relaxed),
            backlog_bytes: self.backlog_bytes.load(Ordering::Relaxed),
            last_success_unix_ms: self.last_success_unix_ms.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn set_error(&self, e: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// What one successful attempt at a file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// Sent now (all of it, or the parts that were missing).
    Uploaded {
        /// Body bytes sent by this attempt.
        bytes_sent: u64,
        parts_sent: u32,
        /// Parts the server already had from an earlier attempt (not sent again).
        parts_reused: u32,
    },
    /// Already in the bucket (journal and HEAD agree); nothing sent.
    AlreadyThere,
}

/// One file of a bag, as [`Uploader::upload_bag`] reports it.
#[derive(Debug)]
pub struct FileReport {
    pub name: String,
    pub key: String,
    pub size: u64,
    pub result: Result<FileOutcome, UploadError>,
}

/// What [`Uploader::upload_bag`] did.
#[derive(Debug, Default)]
pub struct BagOutcome {
    /// Why the bag was left alone (being recorded, not finished cleanly).
    pub skipped: Option<String>,
    pub files: Vec<FileReport>,
}

impl BagOutcome {
    pub fn all_uploaded(&self) -> bool {
        self.skipped.is_none() && self.files.iter().all(|f| f.result.is_ok())
    }
}

/// Snapshot and crash bags go before continuous ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BagClass {
    Snapshot,
    Continuous,
}

/// A bag under a recording root, in upload order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBag {
    pub dir: PathBuf,
    pub class: BagClass,
    /// metadata.yaml's starting time, or i64::MAX when it has none (sorts last).
    pub start_ns: i64,
    pub lock: LockState,
}

/// Does `dir` look like a bag (a metadata.yaml or a split in it)?
pub fn is_bag_dir(dir: &Path) -> bool {
    dir.join(METADATA_FILE).is_file() || !split_names(dir).is_empty()
}

/// The bags directly under `root`, in upload order: snapshot and crash bags first, then
/// continuous ones; within a class oldest first (metadata starting time, then name).
pub fn plan_root(root: &Path) -> Result<Vec<PlannedBag>, UploadError> {
    let mut bags = Vec::new();
    for e in fs::read_dir(root).map_err(UploadError::io(root))? {
        let e = e.map_err(UploadError::io(root))?;
        let dir = e.path();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        if hidden || !e.file_type().is_ok_and(|t| t.is_dir()) || !is_bag_dir(&dir) {
            continue;
        }
        bags.push(plan_bag(&dir));
    }
    bags.sort_by(|a, b| {
        (a.class, a.start_ns, a.dir.file_name()).cmp(&(b.class, b.start_ns, b.dir.file_name()))
    });
    Ok(bags)
}

/// Class, start and lock state of one bag directory.
pub fn plan_bag(dir: &Path) -> PlannedBag {
    let meta = crate::bag::metadata::BagMetadata::read(dir).ok();
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let by_name = name.contains("_snapshot_") || name.contains("_crash_");
    let by_meta = meta.as_ref().is_some_and(|m| {
        m.custom_data
            .keys()
            .any(|k| k.starts_with("ringbag.snapshot."))
    });
    PlannedBag {
        dir: dir.to_path_buf(),
        class: if by_name || by_meta {
            BagClass::Snapshot
        } else {
            BagClass::Continuous
        },
        start_ns: meta
            .map(|m| m.starting_time_ns)
            .unwrap_or(crate::bag::metadata::NO_START),
        lock: crate::bag::lock::state(dir),
    }
}

/// The split files of a bag (`*.db3`, `*.db3.zstd`), in split order.
pub(crate) fn split_names(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && (n.ends_with(".db3") || n.ends_with(".db3.zstd")))
        .collect();
    names.sort_by_key(|n| (split_index(n), n.clone()));
    names
}

/// `bag_12.db3` → 12 (splits without an index sort last).
fn split_index(name: &str) -> u64 {
    let stem = name
        .strip_suffix(".db3.zstd")
        .or_else(|| name.strip_suffix(".db3"))
        .unwrap_or(name);
    stem.rsplit_once('_')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The files of a bag in upload order: its splits in split order, then metadata.yaml.
pub fn bag_files(dir: &Path) -> Vec<String> {
    let mut names = split_names(dir);
    if dir.join(METADATA_FILE).is_file() {
        names.push(METADATA_FILE.to_string());
    }
    names
}

/// What [`Uploader::abort_stale`] aborted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StaleReport {
    /// Journaled uploads whose file is gone.
    pub file_gone: Vec<String>,
    /// Uploads under our key prefix that no journal references, older than the threshold.
    pub unreferenced: Vec<String>,
}

pub struct Uploader {
    client: S3Client,
    tuning: Tuning,
    keys: KeyTemplate,
    bucket: Option<TokenBucket>,
    cancel: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// Part buffers kept from one file to the next (at most `concurrency`, each at most
    /// `part_size`): a fresh 16 MiB buffer per file and worker is zeroed and page-faulted
    /// again, about 7 % of the CPU per GB with 256 MiB splits. Released when the agent goes
    /// idle ([`Uploader::release_buffers`]), so an idle uploader holds no part memory.
    buffers: Mutex<Vec<Vec<u8>>>,
}

/// A part buffer from [`Uploader::buffers`], given back when dropped (on every path out of a
/// worker, errors included).
struct PooledBuffer<'a> {
    pool: &'a Mutex<Vec<Vec<u8>>>,
    buf: Vec<u8>,
}

impl PooledBuffer<'_> {
    /// The first `n` bytes, growing the buffer if needed. Bytes kept from an earlier part are
    /// not zeroed again: the caller overwrites all `n` (read_exact_at).
    fn slice(&mut self, n: usize) -> &mut [u8] {
        if self.buf.len() < n {
            // Exactly `n`: Vec's amortized growth would round a 3 MiB buffer grown for a
            // 5 MiB part up to 6 MiB, past the `part_size × concurrency` memory bound.
            self.buf.reserve_exact(n - self.buf.len());
            self.buf.resize(n, 0);
        }
        &mut self.buf[..n]
    }
}

impl Drop for PooledBuffer<'_> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
    }
}

/// A part read into its buffer and hashed, on its way to a sender. Dropping it gives the
/// buffer back to the reader, whether it was sent or not (a failed send, a stop, a panic).
struct ReadPart<'p> {
    number: u32,
    off: u64,
    len: u64,
    md5: [u8; 16],
    /// Always `Some` until the drop takes it.
    buf: Option<PooledBuffer<'p>>,
    give_back: crossbeam_channel::Sender<PooledBuffer<'p>>,
}

impl ReadPart<'_> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => b.slice(self.len as usize),
            None => &mut [],
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b.buf[..self.len as usize],
            None => &[],
        }
    }
}

impl Drop for ReadPart<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // The reader is gone only once the upload is over; the buffer then goes back to
            // the pool through its own drop.
            let _ = self.give_back.send(buf);
        }
    }
}

/// Sets the flag when the thread unwinds, so that the reader stops waiting for its buffer.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// What every part of one multipart upload shares.
struct Upload<'a> {
    file: &'a fs::File,
    key: &'a str,
    upload_id: &'a str,
    bag: &'a Path,
    name: &'a str,
}

impl std::fmt::Debug for Uploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploader")
            .field("client", &self.client)
            .field("tuning", &self.tuning)
            .finish_non_exhaustive()
    }
}

impl Uploader {
    pub fn new(target: &Target, tuning: Tuning, keys: KeyTemplate) -> Result<Self, UploadError> {
        let client = S3Client::new(target, tuning.concurrency)?;
        let bucket = tuning
            .max_rate
            .map(|r| TokenBucket::new(r, Arc::new(MonotonicClock::default())));
        Ok(Uploader {
            client,
            tuning: Tuning {
                concurrency: tuning.concurrency.max(1),
                ..tuning
            },
            keys,
            bucket,
            cancel: Arc::new(AtomicBool::new(false)),
            counters: Arc::new(Counters::default()),
            buffers: Mutex::new(Vec::new()),
        })
    }

    /// Fill `buf` from `file` at `off`, [`READ_PIECE`] bytes per read.
    fn read_in_pieces(
        &self,
        file: &fs::File,
        path: &Path,
        buf: &mut [u8],
        off: u64,
    ) -> Result<(), UploadError> {
        let mut done = 0u64;
        for piece in buf.chunks_mut(READ_PIECE) {
            self.check_cancel()?;
            file.read_exact_at(piece, off + done)
                .map_err(UploadError::io(path))?;
            done += piece.len() as u64;
        }
        Ok(())
    }

    fn buffer(&self) -> PooledBuffer<'_> {
        let buf = self
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default();
        PooledBuffer {
            pool: &self.buffers,
            buf,
        }
    }

    /// Free the part buffers kept between files (nothing is being sent: the agent is idle or
    /// backing off).
    pub fn release_buffers(&self) {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Bytes held by kept part buffers.
    #[cfg(test)]
    fn buffered_bytes(&self) -> usize {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(Vec::capacity)
            .sum()
    }

    /// Setting this flag stops every transfer within one body chunk (and between parts);
    /// the attempt then fails with [`UploadError::Cancelled`]. Clear it to go on.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub fn client(&self) -> &S3Client {
        &self.client
    }

    pub fn key_of(&self, bag: &Path, file: &str) -> String {
        self.keys.render(&bag_name(bag), file)
    }

    fn check_cancel(&self) -> Result<(), UploadError> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(UploadError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Upload a bag's files in order (splits, then metadata.yaml). `retry` is asked after
    /// each failed attempt at a file (the error and how many attempts failed so far) whether
    /// to try again; it does any waiting. `progress` sees each file's final report. When a
    /// split cannot be uploaded, metadata.yaml (which marks the bag complete) is withheld.
    pub fn upload_bag(
        &self,
        dir: &Path,
        retry: &mut dyn FnMut(&str, &UploadError, u32) -> bool,
        progress: &mut dyn FnMut(&FileReport),
    ) -> BagOutcome {
        let mut out = BagOutcome::default();
        match crate::bag::lock::state(dir) {
            LockState::Held => {
                out.skipped =
                    Some("being recorded (its lock is held); uploaded once closed".into());
                return out;
            }
            LockState::Unclean => {
                out.skipped = Some(format!(
                    "not finished cleanly (a recorder died); run `ringbag reindex {}` first",
                    dir.display()
                ));
                return out;
            }
            LockState::Clean => {}
        }
        let mut failed_splits = 0usize;
        for name in bag_files(dir) {
            let key = self.key_of(dir, &name);
            let size = fs::metadata(dir.join(&name)).map(|m| m.len()).unwrap_or(0);
            let result = if name == METADATA_FILE && failed_splits > 0 {
                Err(UploadError::MetadataWithheld {
                    missing: failed_splits,
                })
            } else {
                let mut attempt = 0u32;
                loop {
                    let r = self.upload_file(dir, &name);
                    if let Err(e) = &r {
                        attempt += 1;
                        if retry(&name, e, attempt) {
                            continue;
                        }
                    }
                    break r;
                }
            };
            if result.is_err() && name != METADATA_FILE {
                failed_splits += 1;
            }
            let report = FileReport {
                name,
                key,
                size,
                result,
            };
            progress(&report);
            let stop =
                matches!(&report.result, Err(e) if e.class() != super::ErrorClass::Permanent);
            out.files.push(report);
            if stop {
                // The target or the link is failing: the next files would fail alike.
                break;
            }
        }
        out
    }

    /// Is `path` (a file of a bag) verified in the bucket, as the journal says, and still
    /// the file that was uploaded? Answered from the journal alone (no network).
    pub fn is_uploaded(path: &Path) -> bool {
        let (Some(bag), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        else {
            return false;
        };
        let Ok(text) = fs::read(bag.join(JOURNAL_FILE)) else {
            return false;
        };
        let Ok(j) = serde_json::from_slice::<Journal>(&text) else {
            return false;
        };
        let Ok(id) = FileIdentity::of(path) else {
            return false;
        };
        j.files
            .get(name)
            .is_some_and(|e| e.done && e.identity == id)
    }

    /// Recount the backlog (files of `bags` not verified in the bucket) into the counters.
    pub fn refresh_backlog(&self, bags: &[PlannedBag]) {
        let (mut files, mut bytes) = (0u64, 0u64);
        for b in bags {
            for name in bag_files(&b.dir) {
                let p = b.dir.join(&name);
                if !Self::is_uploaded(&p) {
                    files += 1;
                    bytes += fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                }
            }
        }
        self.counters.backlog_files.store(files, Ordering::Relaxed);
        self.counters.backlog_bytes.store(bytes, Ordering::Relaxed);
    }

    /// One attempt at uploading `bag/name`: resumes a journaled multipart upload, skips what
    /// is already in the bucket, and returns only after HEAD verified size and ETag.
    pub fn upload_file(&self, bag: &Path, name: &str) -> Result<FileOutcome, UploadError> {
        let r = self.upload_file_inner(bag, name);
        match &r {
            Ok(_) => {
                self.counters.set_error(None);
                self.counters
                    .last_success_unix_ms
                    .store(unix_ms_now(), Ordering::Relaxed);
            }
            Err(UploadError::Cancelled) => {}
            Err(e) => self.counters.set_error(Some(e.to_string())),
        }
        r
    }

    fn upload_file_inner(&self, bag: &Path, name: &str) -> Result<FileOutcome, UploadError> {
        self.check_cancel()?;
        let path = bag.join(name);
        let key = self.key_of(bag, name);
        let mut journal = Journal::load(bag)?.journal;
        let identity = match FileIdentity::of(&path) {
            Ok(i) => i,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(entry) = journal.files.remove(name) {
                    if let Some(id) = entry.upload_id.as_ref().filter(|_| !entry.done) {
                        self.client.abort(&entry.key, id)?;
                    }
                    journal.save(bag)?;
                }
                return Err(UploadError::FileGone { path });
            }
            Err(e) => return Err(UploadError::io(&path)(e)),
        };
        let plan =
            PartPlan::new(identity.size, self.tuning.part_size).ok_or(UploadError::TooLarge {
                path: path.clone(),
                size: identity.size,
            })?;
        // metadata.yaml is rewritten in place of itself (a new inode each time): whether it
        // changed is a question of content.
        let by_content = name == METADATA_FILE;
        let content_md5 = if by_content {
            Some(hex(&Md5::digest(
                &fs::read(&path).map_err(UploadError::io(&path))?,
            )))
        } else {
            None
        };

        if let Some(entry) = journal.files.get(name).cloned() {
            let same = entry.key == key
                && if by_content {
                    entry.content_md5 == content_md5
                } else {
                    entry.identity == identity
                };
            if !same {
                // Another file now (rewritten, or the key template changed): start over.
                if let Some(id) = entry.upload_id.as_ref().filter(|_| !entry.done) {
                    self.client.abort(&entry.key, id)?;
                }
                journal.files.remove(name);
                journal.save(bag)?;
            } else if entry.done {
                let expected = entry.etag.clone().unwrap_or_default();
                if self.verify(&key, identity.size, &expected)? {
                    return Ok(FileOutcome::AlreadyThere);
                }
                // Gone from the bucket (deleted, lifecycle): upload again.
                journal.files.remove(name);
                journal.save(bag)?;
            }
        }
        if !journal.files.contains_key(name) {
            // Nothing journaled (first time, or the journal was lost): the object may be in
            // the bucket already, from a run whose journal is gone.
            if let Some(info) = self.client.head(&key)? {
                if info.size == identity.size && info.etag == self.local_etag(&path, &plan)? {
                    let mut entry = FileEntry::new(key.clone(), identity);
                    entry.content_md5 = content_md5;
                    entry.etag = Some(info.etag);
                    entry.done = true;
                    entry.done_unix_ms = Some(unix_ms_now());
                    journal.files.insert(name.to_string(), entry);
                    journal.save(bag)?;
                    return Ok(FileOutcome::AlreadyThere);
                }
            }
            let mut entry = FileEntry::new(key.clone(), identity);
            entry.content_md5 = content_md5;
            entry.part_size = plan.part_size;
            journal.files.insert(name.to_string(), entry);
        }
        if plan.is_multipart() {
            self.put_multipart(bag, name, &path, &key, identity, plan, journal)
        } else {
            self.put_single(bag, name, &path, &key, identity, journal)
        }
    }

    /// HEAD shows `size` and `etag`?
    fn verify(&self, key: &str, size: u64, etag: &str) -> Result<bool, UploadError> {
        Ok(self
            .client
            .head(key)?
            .is_some_and(|i| i.size == size && i.etag == bare_etag(etag)))
    }

    /// [`Self::verify`] after a send: an object that does not match is a failed upload.
    fn require_verified(&self, key: &str, size: u64, expected: &str) -> Result<(), UploadError> {
        if self.verify(key, size, expected)? {
            return Ok(());
        }
        Err(UploadError::VerifyFailed {
            key: key.into(),
            detail: format!("HEAD does not show {size} bytes with ETag {expected}"),
        })
    }

    /// The ETag the object of this file must have, computed from the file.
    fn local_etag(&self, path: &Path, plan: &PartPlan) -> Result<String, UploadError> {
        let file = open_for_upload(path)?;
        if !plan.is_multipart() {
            return Ok(hex(&md5_range(&file, path, 0, plan.file_size)?));
        }
        let mut md5s = Vec::with_capacity(plan.parts as usize);
        for n in 1..=plan.parts {
            let (off, len) = plan.range(n);
            md5s.push(md5_range(&file, path, off, len)?);
        }
        Ok(multipart_etag(&md5s))
    }

    fn body<'a>(&'a self, bytes: &'a [u8], md5: [u8; 16], sent: &'a AtomicU64) -> Body<'a> {
        Body {
            bytes,
            md5,
            bucket: self.bucket.as_ref(),
            cancel: &self.cancel,
            sent,
            total: Some(&self.counters.bytes_sent),
        }
    }

    fn finish(
        &self,
        bag: &Path,
        name: &str,
        path: &Path,
        identity: FileIdentity,
        mut journal: Journal,
        etag: String,
    ) -> Result<(), UploadError> {
        // A closed split never changes; if this one did, what is in the bucket is not it.
        if FileIdentity::of(path).ok() != Some(identity) {
            journal.files.remove(name);
            journal.save(bag)?;
            return Err(UploadError::FileChanged {
                path: path.to_path_buf(),
            });
        }
        if let Some(e) = journal.files.get_mut(name) {
            // The upload id stays (completed, no longer abortable): it shows which upload
            // made the object, and a resume after a kill can be checked against it.
            e.parts.clear();
            e.etag = Some(etag);
            e.done = true;
            e.done_unix_ms = Some(unix_ms_now());
        }
        journal.save(bag)?;
        self.counters.files_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn put_single(
        &self,
        bag: &Path,
        name: &str,
        path: &Path,
        key: &str,
        identity: FileIdentity,
        mut journal: Journal,
    ) -> Result<FileOutcome, UploadError> {
        // Journaled as multipart under a smaller part size: that upload would bill forever.
        if let Some(e) = journal.files.get_mut(name) {
            if let Some(id) = e.upload_id.take() {
                self.client.abort(key, &id)?;
                e.parts.clear();
            }
        }
        let file = open_for_upload(path)?;
        let mut pooled = self.buffer();
        let buf = pooled.slice(identity.size as usize);
        self.read_in_pieces(&file, path, buf, 0)?;
        let md5 = Md5::digest(buf);
        let sent = AtomicU64::new(0);
        self.client.put_object(key, &self.body(buf, md5, &sent))?;
        drop(pooled);
        drop_cache(&file, 0, identity.size);
        let expected = hex(&md5);
        self.require_verified(key, identity.size, &expected)?;
        self.finish(bag, name, path, identity, journal, expected)?;
        Ok(FileOutcome::Uploaded {
            bytes_sent: sent.load(Ordering::Relaxed),
            parts_sent: 1,
            parts_reused: 0,
        })
    }

    /// The parts of upload `id` the server holds that are the file's bytes: those the
    /// journal recorded with the same ETag, and those it missed (a kill between the
    /// server's answer and the journal write) whose ETag is the MD5 of our bytes. `None`
    /// when the server no longer knows the upload.
    fn reconcile_parts(
        &self,
        key: &str,
        id: &str,
        plan: &PartPlan,
        path: &Path,
        journaled: &BTreeMap<u32, PartDone>,
    ) -> Result<Option<BTreeMap<u32, PartDone>>, UploadError> {
        let Some(server) = self.client.list_parts(key, id)? else {
            return Ok(None);
        };
        let server: BTreeMap<u32, ServerPart> = server.into_iter().map(|p| (p.number, p)).collect();
        let mut kept = BTreeMap::new();
        let mut file = None;
        for (n, s) in &server {
            if *n == 0 || *n > plan.parts || s.size != plan.range(*n).1 {
                continue;
            }
            if let Some(p) = journaled.get(n) {
                if bare_etag(&p.etag) == s.etag {
                    kept.insert(*n, p.clone());
                }
                continue;
            }
            if file.is_none() {
                file = Some(open_for_upload(path)?);
            }
            if let Some(f) = &file {
                let (off, len) = plan.range(*n);
                let md5 = hex(&md5_range(f, path, off, len)?);
                if md5 == s.etag {
                    kept.insert(
                        *n,
                        PartDone {
                            md5,
                            etag: s.etag.clone(),
                        },
                    );
                }
            }
        }
        Ok(Some(kept))
    }

    #[allow(clippy::too_many_arguments)]
    fn put_multipart(
        &self,
        bag: &Path,
        name: &str,
        path: &Path,
        key: &str,
        identity: FileIdentity,
        plan: PartPlan,
        mut journal: Journal,
    ) -> Result<FileOutcome, UploadError> {
        let entry = journal
            .files
            .get(name)
            .cloned()
            .unwrap_or_else(|| FileEntry::new(key.to_string(), identity));
        let mut upload_id = entry.upload_id.clone();
        let mut done: BTreeMap<u32, PartDone> = BTreeMap::new();
        if let Some(id) = &upload_id {
            if entry.part_size != plan.part_size {
                // Journaled with another part size: its parts do not fit this split.
                self.client.abort(key, id)?;
                upload_id = None;
            } else {
                match self.reconcile_parts(key, id, &plan, path, &entry.parts)? {
                    Some(kept) => done = kept,
                    None => {
                        // Completed by an attempt killed before it wrote the journal, or
                        // aborted/expired on the server.
                        if let Some(info) = self.client.head(key)? {
                            let expected = self.local_etag(path, &plan)?;
                            if info.size == identity.size && info.etag == expected {
                                self.finish(bag, name, path, identity, journal, expected)?;
                                return Ok(FileOutcome::AlreadyThere);
                            }
                        }
                        upload_id = None;
                    }
                }
            }
        }
        if upload_id.is_none() {
            // No usable journaled upload: adopt the newest upload of this key the server has
            // (the journal was lost), abort the others, or create one.
            let mut ours: Vec<_> = self
                .client
                .list_uploads(key)?
                .into_iter()
                .filter(|u| u.key == key)
                .collect();
            ours.sort_by_key(|u| u.initiated);
            while let Some(u) = ours.pop() {
                if upload_id.is_none() {
                    if let Some(kept) =
                        self.reconcile_parts(key, &u.upload_id, &plan, path, &BTreeMap::new())?
                    {
                        upload_id = Some(u.upload_id.clone());
                        done = kept;
                        continue;
                    }
                } else {
                    self.client.abort(key, &u.upload_id)?;
                }
            }
            if upload_id.is_none() {
                upload_id = Some(self.client.create_multipart(key)?);
            }
        }
        let upload_id = upload_id.unwrap_or_default();
        let reused = done.len() as u32;
        if let Some(e) = journal.files.get_mut(name) {
            e.upload_id = Some(upload_id.clone());
            e.part_size = plan.part_size;
            e.parts = done.clone();
            e.started_unix_ms.get_or_insert_with(unix_ms_now);
        }
        journal.save(bag)?;

        let missing: Vec<u32> = (1..=plan.parts).filter(|n| !done.contains_key(n)).collect();
        let state = Mutex::new((journal, done));
        let failed: Mutex<Option<UploadError>> = Mutex::new(None);
        let stop = AtomicBool::new(false);
        let sent = AtomicU64::new(0);
        let fail = |e: UploadError| {
            stop.store(true, Ordering::Relaxed);
            let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
            // The first real cause; a cancellation seen by the others is its echo.
            if f.is_none() || matches!(*f, Some(UploadError::Cancelled)) {
                *f = Some(e);
            }
        };
        let file = open_for_upload(path)?;
        let senders = self.tuning.concurrency.min(missing.len()).max(1);
        std::thread::scope(|s| {
            let (to_send, jobs) = crossbeam_channel::bounded::<ReadPart>(senders);
            let (give_back, returned) = crossbeam_channel::unbounded();
            for _ in 0..senders {
                let jobs = jobs.clone();
                // Named, so that `top -H` and the tests tell them apart; they inherit the
                // priorities of the thread that spawns them (the daemon's uploader lowers its
                // own).
                let spawned = std::thread::Builder::new()
                    .name("ringbag-upsend".into())
                    .spawn_scoped(s, || {
                        let _on_panic = StopOnPanic(&stop);
                        let upload = Upload {
                            file: &file,
                            key,
                            upload_id: &upload_id,
                            bag,
                            name,
                        };
                        for part in jobs {
                            if stop.load(Ordering::Relaxed) {
                                continue; // dropping the part gives its buffer back
                            }
                            if let Err(e) = self.send_part(&upload, &part, &sent, &state) {
                                fail(e);
                            }
                        }
                    });
                if let Err(e) = spawned {
                    fail(UploadError::io(path)(e));
                }
            }
            drop(jobs);
            let buffers = (0..senders).map(|_| self.buffer()).collect();
            let r = self.read_parts(
                &file, path, &plan, &missing, buffers, &stop, &to_send, &give_back, &returned,
            );
            // Closing the queue ends the senders once they have sent what is in it.
            drop(to_send);
            if let Err(e) = r {
                fail(e);
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        self.check_cancel()?;
        let (journal, done) = state.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut etags = Vec::with_capacity(plan.parts as usize);
        let mut md5s = Vec::with_capacity(plan.parts as usize);
        for n in 1..=plan.parts {
            let p = done.get(&n).ok_or_else(|| UploadError::BadResponse {
                key: key.into(),
                op: "UploadPart",
                detail: format!("part {n} missing after all parts were sent"),
            })?;
            etags.push(format!("\"{}\"", bare_etag(&p.etag)));
            md5s.push(
                super::parts::from_hex16(&p.md5).ok_or_else(|| UploadError::Journal {
                    path: bag.join(JOURNAL_FILE),
                    detail: format!("{name}: part {n} has no valid MD5"),
                })?,
            );
        }
        let expected = multipart_etag(&md5s);
        self.client.complete(key, &upload_id, &etags)?;
        self.require_verified(key, identity.size, &expected)?;
        self.finish(bag, name, path, identity, journal, expected)?;
        Ok(FileOutcome::Uploaded {
            bytes_sent: sent.load(Ordering::Relaxed),
            parts_sent: missing.len() as u32,
            parts_reused: reused,
        })
    }

    /// Read the `missing` parts of `file`, hash them and queue them for the senders, each in
    /// a buffer of `free` (one per sender). Parts are read two at a time into two buffers
    /// and hashed side by side ([`md5::update_pair`]: MD5 costs about half the CPU per byte
    /// that way), so a part waits for a second free buffer unless it is the last one or
    /// there is only one buffer. Every queued part gives its buffer back when dropped, sent
    /// or not, so waiting here always ends.
    #[allow(clippy::too_many_arguments)]
    fn read_parts<'p>(
        &'p self,
        file: &fs::File,
        path: &Path,
        plan: &PartPlan,
        missing: &[u32],
        mut free: Vec<PooledBuffer<'p>>,
        stop: &AtomicBool,
        to_send: &crossbeam_channel::Sender<ReadPart<'p>>,
        give_back: &crossbeam_channel::Sender<PooledBuffer<'p>>,
        returned: &crossbeam_channel::Receiver<PooledBuffer<'p>>,
    ) -> Result<(), UploadError> {
        let lanes = free.len().min(2);
        let mut todo = missing;
        while !todo.is_empty() {
            let take = todo.len().min(lanes);
            while free.len() < take {
                // The timeout only matters if a sender panicked (its part went back, but the
                // queue may hold parts no one will take): `stop` then ends the wait.
                match returned.recv_timeout(Duration::from_millis(200)) {
                    Ok(buf) => free.push(buf),
                    Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
                    Err(_) => {}
                }
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            self.check_cancel()?;
            let (now, rest) = todo.split_at(take);
            todo = rest;
            let mut parts: Vec<ReadPart<'p>> = now
                .iter()
                .zip(free.drain(..take))
                .map(|(&n, buf)| {
                    let (off, len) = plan.range(n);
                    ReadPart {
                        number: n,
                        off,
                        len,
                        md5: [0; 16],
                        buf: Some(buf),
                        give_back: give_back.clone(),
                    }
                })
                .collect();
            self.read_and_hash(file, path, &mut parts)?;
            for part in parts {
                // Room for every part: the queue holds as many as there are buffers.
                if to_send.send(part).is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Fill each part's buffer from `file`, [`READ_PIECE`] bytes at a time, and set its MD5;
    /// two parts are read piece by piece in turn and hashed side by side.
    fn read_and_hash(
        &self,
        file: &fs::File,
        path: &Path,
        parts: &mut [ReadPart<'_>],
    ) -> Result<(), UploadError> {
        let mut hashes: Vec<Md5> = parts.iter().map(|_| Md5::new()).collect();
        let longest = parts.iter().map(|p| p.len).max().unwrap_or(0);
        let mut at = 0u64;
        while at < longest {
            self.check_cancel()?;
            let mut pieces: [&[u8]; 2] = [&[], &[]];
            for (part, piece) in parts.iter_mut().zip(pieces.iter_mut()) {
                let (off, len) = (part.off, part.len);
                let end = (at + READ_PIECE as u64).min(len);
                if at >= end {
                    continue;
                }
                let buf = part.bytes_mut();
                let dst = &mut buf[at as usize..end as usize];
                file.read_exact_at(dst, off + at)
                    .map_err(UploadError::io(path))?;
                *piece = dst;
            }
            match &mut hashes[..] {
                [x, y] => md5::update_pair(x, pieces[0], y, pieces[1]),
                [x] => x.update(pieces[0]),
                _ => {}
            }
            at += READ_PIECE as u64;
        }
        for (part, h) in parts.iter_mut().zip(hashes) {
            part.md5 = h.finalize();
        }
        Ok(())
    }

    /// Send one part with its Content-MD5, record it in the journal (saved), and drop its
    /// bytes from the page cache.
    fn send_part(
        &self,
        upload: &Upload<'_>,
        part: &ReadPart<'_>,
        sent: &AtomicU64,
        state: &Mutex<(Journal, BTreeMap<u32, PartDone>)>,
    ) -> Result<(), UploadError> {
        self.check_cancel()?;
        let part_sent = AtomicU64::new(0);
        let r = self.client.upload_part(
            upload.key,
            upload.upload_id,
            part.number,
            &self.body(part.bytes(), part.md5, &part_sent),
        );
        sent.fetch_add(part_sent.load(Ordering::Relaxed), Ordering::Relaxed);
        let etag = r?;
        drop_cache(upload.file, part.off, part.len);
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let (journal, done) = &mut *st;
        done.insert(
            part.number,
            PartDone {
                md5: hex(&part.md5),
                etag,
            },
        );
        if let Some(e) = journal.files.get_mut(upload.name) {
            e.parts = done.clone();
        }
        journal.save(upload.bag)
    }

    /// Abort multipart uploads of ours that would otherwise bill forever: journaled uploads
    /// whose file is gone (in the bags under `roots`), and uploads under our key prefix that
    /// no journal references and that are older than `older_than` (24 h in service).
    pub fn abort_stale(
        &self,
        roots: &[&Path],
        older_than: Duration,
        now: SystemTime,
    ) -> Result<StaleReport, UploadError> {
        let mut report = StaleReport::default();
        let mut referenced = BTreeSet::new();
        let mut bags = Vec::new();
        for root in roots {
            if is_bag_dir(root) {
                bags.push(root.to_path_buf());
            } else {
                bags.extend(plan_root(root)?.into_iter().map(|b| b.dir));
            }
        }
        for bag in bags {
            if !bag.join(JOURNAL_FILE).exists() {
                continue;
            }
            let mut journal = Journal::load(&bag)?.journal;
            let mut changed = false;
            let names: Vec<String> = journal.files.keys().cloned().collect();
            for name in names {
                let Some(entry) = journal.files.get(&name) else {
                    continue;
                };
                let Some(id) = entry.upload_id.clone().filter(|_| !entry.done) else {
                    continue;
                };
                if bag.join(&name).exists() {
                    referenced.insert(id);
                    continue;
                }
                self.client.abort(&entry.key, &id)?;
                report.file_gone.push(entry.key.clone());
                journal.files.remove(&name);
                changed = true;
            }
            if changed {
                journal.save(&bag)?;
            }
        }
        for u in self.client.list_uploads(&self.keys.prefix())? {
            if referenced.contains(&u.upload_id) {
                continue;
            }
            let old = u
                .initiated
                .is_some_and(|t| super::error::age_of(t, now) >= older_than);
            if old {
                self.client.abort(&u.key, &u.upload_id)?;
                report.unreferenced.push(u.key);
            }
        }
        Ok(report)
    }
}

fn bag_name(bag: &Path) -> String {
    bag.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Open a file to upload, telling the kernel it is read once, front to back.
fn open_for_upload(path: &Path) -> Result<fs::File, UploadError> {
    let file = fs::File::open(path).map_err(UploadError::io(path))?;
    // Advice only: a kernel that ignores it costs page cache, not correctness.
    let _ = nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL,
    );
    Ok(file)
}

/// Drop what was sent from the page cache, so uploads do not evict the recorder's pages.
fn drop_cache(file: &fs::File, off: u64, len: u64) {
    let _ = nix::fcntl::posix_fadvise(
        file,
        off as i64,
        len as i64,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Bytes a part is read in at a time. One 16 MiB pread puts 16 MiB of reads in the disk's
/// queue at once, and a read-preferring scheduler (mq-deadline) then makes the recorder's
/// writes and fsyncs wait behind all of it; 1 MiB at a time leaves them room in between.
const READ_PIECE: usize = 1 << 20;

/// MD5 of `len` bytes at `off`, read in 1 MiB pieces (bounded memory), then dropped from the
/// page cache.
fn md5_range(file: &fs::File, path: &Path, off: u64, len: u64) -> Result<[u8; 16], UploadError> {
    let mut h = Md5::new();
    let mut buf = vec![0u8; (1 << 20).min(len as usize).max(1)];
    let mut done = 0u64;
    while done < len {
        let n = buf.len().min((len - done) as usize);
        file.read_exact_at(&mut buf[..n], off + done)
            .map_err(UploadError::io(path))?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    drop_cache(file, off, len);
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An uploader that never connects (nothing here sends).
    fn offline_uploader() -> Uploader {
        let target = Target {
            endpoint: "http://127.0.0.1:9".into(),
            region: "r".into(),
            bucket: "b".into(),
            path_style: true,
            ca_file: None,
            credentials: super::super::Credentials {
                access_key_id: "k".into(),
                secret_access_key: "s".into(),
                session_token: None,
            },
        };
        let tuning = Tuning {
            part_size: 5 << 20,
            concurrency: 2,
            ..Tuning::default()
        };
        let keys = KeyTemplate::new("x/{bag}/{file}", "r").unwrap();
        Uploader::new(&target, tuning, keys).unwrap()
    }

    #[test]
    fn part_buffers_are_reused_from_file_to_file_and_freed_when_idle() {
        let u = offline_uploader();
        let grab = |sizes: [usize; 2]| {
            let mut a = u.buffer();
            let mut b = u.buffer();
            a.slice(sizes[0]).fill(1);
            b.slice(sizes[1]).fill(2);
        };
        grab([5 << 20, 3 << 20]);
        let kept = u.buffered_bytes();
        assert!(kept >= 8 << 20, "{kept}");
        // The next file's workers take the same two buffers: nothing grows.
        grab([5 << 20, 5 << 20]);
        grab([1 << 20, 2 << 20]);
        let again = u.buffered_bytes();
        assert!(again <= 10 << 20 && again >= kept, "{kept} then {again}");
        assert_eq!(u.buffers.lock().unwrap().len(), 2);
        u.release_buffers();
        assert_eq!(u.buffered_bytes(), 0);
    }

    #[test]
    fn splits_go_in_split_order_and_metadata_last() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            "b_10.db3",
            "b_2.db3",
            "b_0.db3",
            "metadata.yaml",
            ".ringbag.lock",
            "b_1.db3-wal",
            JOURNAL_FILE,
        ] {
            fs::write(dir.path().join(n), b"x").unwrap();
        }
        assert_eq!(
            bag_files(dir.path()),
            ["b_0.db3", "b_2.db3", "b_10.db3", "metadata.yaml"]
        );
    }
}
