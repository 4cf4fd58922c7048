//! The daemon's uploader: a thread of its own that sends every closed file under the
//! recording root to the bucket, forever, and answers retention's question "is this file
//! out?" ([`crate::retention::UploadLedger`]) from memory.
//!
//! What it uploads: of each bag, the splits its metadata.yaml lists (the writer lists a split
//! only once it is closed and fsynced, so an open split is never read), then metadata.yaml
//! itself, again whenever it changed. Snapshot and crash bags first, then oldest first
//! ([`plan_root`]). A bag without metadata.yaml (a snapshot being cut) or left unclean by a
//! crash (the daemon reindexes those at start) waits.
//!
//! Never slows the recording: the thread (and the part workers it spawns, which inherit it)
//! runs at nice 19 and idle I/O priority; the writer thread only takes the ledger's mutex for
//! a map lookup, never while a transfer runs; a forced deletion waits at most
//! [`ABORT_WAIT`] for a transfer of that file to stop (the engine reads each part into memory
//! before sending it, so a file deleted while a part is in flight costs nothing but that
//! part).
//!
//! Retries: transient errors back off exponentially with full jitter from 1 s to 5 min,
//! forever; configuration errors (credentials, bucket, clock, TLS, DNS) wait the cap each time
//! and are logged as what they are, once per change, so a SIGHUP with a fixed config (a new
//! agent) recovers without a restart loop.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::backoff::{Backoff, BACKOFF_BASE, BACKOFF_CAP};
use super::engine::{plan_root, Counters, FileOutcome, Uploader, METADATA_FILE, STALE_UPLOAD_AGE};
use super::journal::{FileIdentity, Journal};
use super::settings::ResolvedUpload;
use super::{ErrorClass, UploadError};
use crate::bag::lock::LockState;
use crate::bag::metadata::BagMetadata;
use crate::bag::reader::split_number;
use crate::retention::{UploadLedger, UploadState};

/// How long a forced deletion waits for a transfer of its file to stop.
pub const ABORT_WAIT: Duration = Duration::from_millis(200);
/// How long a stop waits for the thread before leaving it behind ([`UploadAgent::stop`]).
pub const STOP_WAIT: Duration = Duration::from_secs(2);
/// How often the root is looked at for newly closed files when there is nothing to send.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How often abandoned multipart uploads of ours are looked for and aborted.
const STALE_SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// The same error is logged again at most this often (the status shows it all the time).
const RELOG_EVERY: Duration = Duration::from_secs(600);

/// The ledger's state: what the agent knows. Locked only for lookups and updates, never
/// across a network call.
#[derive(Debug, Default)]
struct LedgerState {
    /// Files verified in the bucket (journal `done`, identity unchanged).
    uploaded: HashSet<PathBuf>,
    /// The file a transfer is reading now.
    in_flight: Option<PathBuf>,
    /// Files retention is deleting or has deleted: never started again.
    forbidden: HashSet<PathBuf>,
    /// Forced deletions not yet written to their bag's journal.
    deleted: Vec<(PathBuf, u64)>,
}

/// Retention's view of the uploads ([`UploadLedger`]), shared by the agent thread (which
/// updates it) and the writer thread (which asks).
#[derive(Debug)]
pub struct Ledger {
    state: Mutex<LedgerState>,
    /// Signalled whenever `in_flight` changes.
    changed: Condvar,
    generation: AtomicU64,
    /// The uploader's cancellation flag: set to stop the transfer in flight.
    cancel: Arc<AtomicBool>,
    /// The agent thread's wake-up (see [`UploadAgent::nudge`]).
    wake: Wake,
}

/// A flag and its condvar: set and notified to end the agent thread's sleep early.
type Wake = Arc<(Mutex<bool>, Condvar)>;

fn signal(wake: &Wake) {
    let (m, c) = &**wake;
    *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
    c.notify_all();
}

impl Ledger {
    fn new(cancel: Arc<AtomicBool>, wake: Wake) -> Self {
        Ledger {
            state: Mutex::new(LedgerState::default()),
            changed: Condvar::new(),
            generation: AtomicU64::new(0),
            cancel,
            wake,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        // A panic elsewhere while holding it leaves plain data: go on with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_uploaded(&self, file: PathBuf) {
        if self.lock().uploaded.insert(file) {
            self.generation.fetch_add(1, Relaxed);
        }
    }

    /// Start a transfer of `file` unless retention took it meanwhile.
    fn begin(&self, file: &Path) -> bool {
        let mut s = self.lock();
        if s.forbidden.contains(file) {
            return false;
        }
        s.in_flight = Some(file.to_path_buf());
        true
    }

    fn end(&self) {
        let mut s = self.lock();
        s.in_flight = None;
        self.cancel.store(false, Relaxed);
        drop(s);
        self.changed.notify_all();
    }

    fn take_deleted(&self) -> Vec<(PathBuf, u64)> {
        std::mem::take(&mut self.lock().deleted)
    }

    /// Forget files that are no longer on disk (bounded memory over years).
    fn prune(&self) {
        let mut s = self.lock();
        s.uploaded.retain(|p| p.exists());
        s.forbidden.retain(|p| p.exists());
    }
}

impl UploadLedger for Ledger {
    fn state(&self, file: &Path) -> UploadState {
        let s = self.lock();
        if s.uploaded.contains(file) {
            UploadState::Uploaded
        } else if s.in_flight.as_deref() == Some(file) {
            UploadState::InFlight
        } else {
            UploadState::Pending
        }
    }

    fn abort(&self, file: &Path) {
        let mut s = self.lock();
        s.forbidden.insert(file.to_path_buf());
        if s.in_flight.as_deref() != Some(file) {
            return;
        }
        self.cancel.store(true, Relaxed);
        let deadline = Instant::now() + ABORT_WAIT;
        while s.in_flight.as_deref() == Some(file) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // The transfer is stuck in the network, not in the file: deleting it under
                // an open descriptor is safe, and the flag stops the transfer when it moves.
                log::debug!(
                    "upload: {} still in flight after {} ms; deleted anyway",
                    file.display(),
                    ABORT_WAIT.as_millis()
                );
                return;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn deleted_before_upload(&self, file: &Path, bytes: u64) {
        self.lock().deleted.push((file.to_path_buf(), bytes));
    }

    fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// A split was closed: look at the root now. The flag is held only to set it (the agent
    /// thread holds it only around its condvar wait), so the writer thread never waits here.
    fn split_closed(&self) {
        signal(&self.wake);
    }
}

/// The uploads as the status shows them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UploadStatus {
    /// `endpoint/bucket`.
    pub target: String,
    /// Closed files not yet verified in the bucket.
    pub backlog_files: u64,
    pub backlog_bytes: u64,
    /// Age of the oldest of them (by its modification time), seconds.
    pub oldest_backlog_age_s: Option<f64>,
    /// Body bytes sent (retries included) since the agent started.
    pub bytes_sent: u64,
    /// Sending rate since the previous status, bytes/s.
    pub rate_bytes_per_s: f64,
    pub files_uploaded: u64,
    /// Unix ms of the last verified file; null when none yet.
    pub last_success_unix_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Failed upload attempts since the agent started, by [`UploadError::kind`] (every kind
    /// listed, zeros included); absent in files of older versions.
    #[serde(default)]
    pub errors: std::collections::BTreeMap<String, u64>,
}

impl UploadStatus {
    /// `upload backlog 3 files (48.0 MiB, oldest 65 s), 2.1 MB/s`, plus the last error: for
    /// STATUS=.
    pub fn line(&self) -> String {
        let mut s = format!(
            "upload backlog {} files ({:.1} MiB",
            self.backlog_files,
            self.backlog_bytes as f64 / (1u64 << 20) as f64
        );
        if let Some(age) = self.oldest_backlog_age_s {
            s.push_str(&format!(", oldest {age:.0} s"));
        }
        s.push_str(&format!(
            "), {:.2} MB/s",
            self.rate_bytes_per_s / 1_000_000.0
        ));
        if let Some(e) = &self.last_error {
            s.push_str(&format!(", failing: {e}"));
        }
        s
    }

    /// For `ringbag status`.
    pub fn human(&self) -> String {
        let last = match self.last_success_unix_ms {
            Some(ms) => chrono::DateTime::from_timestamp_millis(ms as i64).map_or_else(
                || ms.to_string(),
                |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
            None => "never".to_string(),
        };
        let mut s = format!(
            "upload: to {}; backlog {} files, {:.1} MiB{}; {:.2} MB/s; {} files and {:.1} MiB sent; last success {last}",
            self.target,
            self.backlog_files,
            self.backlog_bytes as f64 / (1u64 << 20) as f64,
            self.oldest_backlog_age_s
                .map(|a| format!(", oldest {a:.0} s old"))
                .unwrap_or_default(),
            self.rate_bytes_per_s / 1_000_000.0,
            self.files_uploaded,
            self.bytes_sent as f64 / (1u64 << 20) as f64,
        );
        if let Some(e) = &self.last_error {
            s.push_str(&format!("\nupload last error: {e}"));
        }
        s
    }
}

/// What the agent thread shares with the status.
#[derive(Debug, Default)]
struct Shared {
    oldest_backlog_unix_ms: AtomicU64,
    files_uploaded: AtomicU64,
    /// Failed attempts by kind, indexed as [`super::error::ERROR_KINDS`].
    errors: [AtomicU64; super::error::ERROR_KINDS.len()],
    /// (when, bytes_sent) at the previous status, for the rate.
    prev: Mutex<Option<(Instant, u64)>>,
}

/// A running uploader. Dropping it (or [`UploadAgent::stop`]) stops the thread within one
/// body chunk of the transfer in flight.
pub struct UploadAgent {
    ledger: Arc<Ledger>,
    counters: Arc<Counters>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    wake: Wake,
    target: String,
    resolved: ResolvedUpload,
    root: PathBuf,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for UploadAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadAgent")
            .field("target", &self.target)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl UploadAgent {
    /// Start uploading what is closed under `root`. Before it returns, the ledger knows every
    /// file the bags' journals say is verified in the bucket, so retention's first question
    /// (crash recovery's budget included) already has the right answer.
    pub fn start(resolved: &ResolvedUpload, root: &Path) -> Result<UploadAgent, UploadError> {
        let uploader = Uploader::new(&resolved.target, resolved.tuning, resolved.key.clone())?;
        let wake: Wake = Arc::new((Mutex::new(false), Condvar::new()));
        let ledger = Arc::new(Ledger::new(uploader.cancel_flag(), wake.clone()));
        let counters = uploader.counters();
        let shared = Arc::new(Shared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut files = 0;
        if let Ok(bags) = plan_root(root) {
            for b in &bags {
                for f in journaled_done(&b.dir) {
                    ledger.mark_uploaded(f);
                    files += 1;
                }
            }
        }
        let target = format!("{}/{}", resolved.target.endpoint, resolved.target.bucket);
        log::info!(
            "upload: {}; {files} files already in the bucket",
            resolved.summary()
        );
        let handle = {
            let ctx = AgentThread {
                uploader,
                ledger: ledger.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
                wake: wake.clone(),
                root: root.to_path_buf(),
            };
            std::thread::Builder::new()
                .name("ringbag-upload".into())
                .spawn(move || ctx.run())
                .map_err(|e| UploadError::Setup {
                    detail: format!("cannot start the upload thread: {e}"),
                })?
        };
        Ok(UploadAgent {
            ledger,
            counters,
            shared,
            stop,
            wake,
            target,
            resolved: resolved.clone(),
            root: root.to_path_buf(),
            handle: Some(handle),
        })
    }

    /// Whether this agent already uploads `resolved` from `root` (a reload that changed
    /// neither keeps it running).
    pub fn serves(&self, resolved: &ResolvedUpload, root: &Path) -> bool {
        self.resolved == *resolved && self.root == root
    }

    /// `[upload] delete_after_upload`: retention deletes a file once it is verified.
    pub fn delete_after_upload(&self) -> bool {
        self.resolved.tuning.delete_after_upload
    }

    /// Retention's side of the uploads.
    pub fn ledger(&self) -> Arc<dyn UploadLedger> {
        self.ledger.clone()
    }

    /// Look at the root now (a split was closed) rather than at the next poll.
    pub fn nudge(&self) {
        signal(&self.wake);
    }

    pub fn status(&self) -> UploadStatus {
        let c = self.counters.snapshot();
        let now = Instant::now();
        let rate = {
            let mut prev = self.shared.prev.lock().unwrap_or_else(|p| p.into_inner());
            let rate = match *prev {
                Some((t, b)) if now > t => {
                    c.bytes_sent.saturating_sub(b) as f64 / (now - t).as_secs_f64()
                }
                _ => 0.0,
            };
            *prev = Some((now, c.bytes_sent));
            rate
        };
        let oldest = self.shared.oldest_backlog_unix_ms.load(Relaxed);
        UploadStatus {
            target: self.target.clone(),
            backlog_files: c.backlog_files,
            backlog_bytes: c.backlog_bytes,
            oldest_backlog_age_s: (oldest > 0 && c.backlog_files > 0)
                .then(|| unix_ms().saturating_sub(oldest) as f64 / 1000.0),
            bytes_sent: c.bytes_sent,
            rate_bytes_per_s: rate,
            files_uploaded: self.shared.files_uploaded.load(Relaxed),
            last_success_unix_ms: (c.last_success_unix_ms > 0).then_some(c.last_success_unix_ms),
            last_error: c.last_error,
            errors: super::error::ERROR_KINDS
                .iter()
                .zip(&self.shared.errors)
                .map(|(k, n)| (k.to_string(), n.load(Relaxed)))
                .collect(),
        }
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Stop the thread, waiting at most [`STOP_WAIT`] for it. A transfer blocked in the
    /// network (a black-holed route: the kernel's send buffer full, no reset) sees the cancel
    /// flag only when the socket moves or the idle timeout (a minute) fires, and a stop must
    /// not wait for that: systemd would kill the service at its stop timeout. Such a thread is
    /// left behind, cancelled: it ends with its transfer, or with the process, which is as
    /// safe as a kill -9 (the journal is replaced atomically, and a part not acknowledged is
    /// sent again).
    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        self.ledger.cancel.store(true, Relaxed);
        self.nudge();
        if let Some(h) = self.handle.take() {
            let deadline = Instant::now() + STOP_WAIT;
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                log::warn!(
                    "upload: a transfer is stuck in the network; stopped without waiting for it (it is sent again later)"
                );
            }
        }
    }
}

impl Drop for UploadAgent {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Files of `bag` its journal says are verified in the bucket and that are still the file
/// that was uploaded (same size, mtime and inode). No network: the journal marks a file done
/// only after HEAD verified it, and is fsynced before it says so.
fn journaled_done(bag: &Path) -> Vec<PathBuf> {
    let Ok(loaded) = Journal::load(bag) else {
        return Vec::new();
    };
    loaded
        .journal
        .files
        .iter()
        .filter(|(_, e)| e.done)
        .filter_map(|(name, e)| {
            let path = bag.join(name);
            // metadata.yaml is compared by content by the engine; here only splits matter
            // (retention never deletes metadata.yaml on its own).
            (name != METADATA_FILE && FileIdentity::of(&path).ok() == Some(e.identity))
                .then_some(path)
        })
        .collect()
}

/// The closed files of a bag in upload order: the splits metadata.yaml lists that exist,
/// then metadata.yaml. None when the bag is not ready (no readable metadata.yaml yet, or left
/// unclean by a crash).
///
/// A bag being recorded lists its open split while it has no closed one on disk (its first
/// split, or when retention or `delete_after_upload` took every closed one: see
/// `BagWriter::recording_metadata`), so in such a bag the split with the highest number on
/// disk is never taken: it is the open one (or, for a moment between a close and the next
/// open, a closed one that the next pass takes).
fn closed_files(dir: &Path, lock: LockState) -> Option<Vec<String>> {
    if lock == LockState::Unclean {
        return None;
    }
    let meta = BagMetadata::read(dir).ok()?;
    let open = if lock == LockState::Held {
        // Unreadable while recording: wait for the next pass rather than risk the open split.
        let on_disk = crate::bag::reader::find_split_files(dir).ok()?;
        Some(on_disk.iter().filter_map(|n| split_number(n)).max()?)
    } else {
        None
    };
    let mut names: Vec<String> = meta
        .files
        .iter()
        .map(|f| f.path.clone())
        .filter(|p| !p.contains('/') && dir.join(p).is_file())
        .collect();
    let listed = names.len();
    names.retain(|p| open.is_none() || split_number(p) != open);
    // A listing that names the open split is not the bag's: it goes once that split closed.
    if names.len() == listed {
        names.push(METADATA_FILE.to_string());
    }
    Some(names)
}

struct AgentThread {
    uploader: Uploader,
    ledger: Arc<Ledger>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    wake: Wake,
    root: PathBuf,
}

/// What one pass over the root ended with.
enum Pass {
    /// Everything closed is in the bucket.
    Idle,
    /// A file failed: wait this long before the next pass.
    Failed(Duration),
    Stopped,
}

impl AgentThread {
    fn run(self) {
        lower_priority("upload", true);
        let seed = unix_ms() ^ u64::from(std::process::id());
        let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP, seed);
        let mut last_logged: Option<(String, Instant)> = None;
        let mut last_sweep: Option<Instant> = None;
        while !self.stop.load(Relaxed) {
            // A file retention deleted may leave a multipart upload open: abort it now, not
            // within the hour.
            if self.record_deletions()
                || last_sweep.is_none_or(|t| t.elapsed() >= STALE_SWEEP_EVERY)
            {
                last_sweep = Some(Instant::now());
                self.sweep_stale();
            }
            let wait = match self.pass(&mut backoff, &mut last_logged) {
                Pass::Stopped => break,
                Pass::Idle => {
                    backoff.reset();
                    IDLE_POLL
                }
                Pass::Failed(d) => d,
            };
            // Nothing is being sent until the next pass: no part memory held meanwhile.
            self.uploader.release_buffers();
            self.sleep(wait);
        }
        self.record_deletions();
    }

    /// Wait `d`, or until stopped or nudged.
    fn sleep(&self, d: Duration) {
        let (m, c) = &*self.wake;
        let mut woken = m.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = Instant::now() + d;
        while !*woken && !self.stop.load(Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            woken = c
                .wait_timeout(woken, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *woken = false;
    }

    /// Send every closed file not yet in the bucket, in order; stop at the first failure.
    fn pass(&self, backoff: &mut Backoff, last_logged: &mut Option<(String, Instant)>) -> Pass {
        let bags = match plan_root(&self.root) {
            Ok(b) => b,
            Err(e) => return self.failed(&e, backoff, last_logged),
        };
        self.ledger.prune();
        // The backlog first, so the status is right while the pass runs.
        let mut work: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let (mut files, mut bytes, mut oldest) = (0u64, 0u64, u64::MAX);
        for b in &bags {
            let Some(names) = closed_files(&b.dir, b.lock) else {
                continue;
            };
            for n in names.iter().filter(|n| *n != METADATA_FILE) {
                let p = b.dir.join(n);
                if self.ledger.state(&p) == UploadState::Uploaded {
                    continue;
                }
                if let Ok(m) = std::fs::metadata(&p) {
                    files += 1;
                    bytes += m.len();
                    if let Ok(t) = m.modified() {
                        let ms = t
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64);
                        oldest = oldest.min(ms);
                    }
                }
            }
            work.push((b.dir.clone(), names));
        }
        let c = self.uploader.counters();
        c.backlog_files.store(files, Relaxed);
        c.backlog_bytes.store(bytes, Relaxed);
        self.shared
            .oldest_backlog_unix_ms
            .store(if files > 0 { oldest } else { 0 }, Relaxed);

        for (dir, names) in work {
            let mut splits_missing = 0;
            for name in names {
                if self.stop.load(Relaxed) {
                    return Pass::Stopped;
                }
                let path = dir.join(&name);
                let is_meta = name == METADATA_FILE;
                if is_meta && splits_missing > 0 {
                    // metadata.yaml marks the bag complete: only after its splits.
                    continue;
                }
                if !is_meta && self.ledger.state(&path) == UploadState::Uploaded {
                    continue;
                }
                if !self.ledger.begin(&path) {
                    splits_missing += 1;
                    continue;
                }
                let r = self.uploader.upload_file(&dir, &name);
                self.ledger.end();
                match r {
                    Ok(outcome) => {
                        if !is_meta {
                            if let FileOutcome::Uploaded {
                                bytes_sent,
                                parts_reused,
                                ..
                            } = outcome
                            {
                                // A resumed upload (after a restart) says so: the parts the
                                // server had already were not sent again.
                                let resumed = match parts_reused {
                                    0 => String::new(),
                                    1 => "; resumed, 1 part was already there".to_string(),
                                    n => format!("; resumed, {n} parts were already there"),
                                };
                                log::info!(
                                    ringbag_bag:% = dir.display();
                                    "upload: {} ({} bytes sent{resumed})",
                                    path.display(),
                                    bytes_sent
                                );
                                self.shared.files_uploaded.fetch_add(1, Relaxed);
                            }
                            self.ledger.mark_uploaded(path.clone());
                            let size = std::fs::metadata(&path).map_or(0, |m| m.len());
                            c.backlog_files
                                .fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1))
                                .ok();
                            c.backlog_bytes
                                .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(size)))
                                .ok();
                        }
                        *last_logged = None;
                    }
                    Err(UploadError::Cancelled) if self.stop.load(Relaxed) => return Pass::Stopped,
                    // Retention took it (aborted), or it went before we got to it.
                    Err(UploadError::Cancelled | UploadError::FileGone { .. }) => {
                        splits_missing += usize::from(!is_meta);
                    }
                    // A live bag's metadata.yaml is rewritten at every split close: the
                    // newer one goes at the next pass; not worth a warning each time.
                    Err(UploadError::FileChanged { .. }) if is_meta => {
                        log::debug!("upload: {} changed while sent; again later", path.display());
                    }
                    Err(e) if e.class() == ErrorClass::Permanent => {
                        self.count_error(&e);
                        // This file cannot go as it is (changed, unreadable): say so, go on.
                        log::warn!("upload: {}: {e}", path.display());
                        splits_missing += usize::from(!is_meta);
                    }
                    Err(e) => return self.failed(&e, backoff, last_logged),
                }
            }
        }
        Pass::Idle
    }

    /// One more failure of `e`'s kind (a relaxed add; a cancellation is none).
    fn count_error(&self, e: &UploadError) {
        if let Some(i) = e
            .kind()
            .and_then(|k| super::error::ERROR_KINDS.iter().position(|&x| x == k))
        {
            self.shared.errors[i].fetch_add(1, Relaxed);
        }
    }

    /// Log `e` once per change (or every [`RELOG_EVERY`]) and say how long to wait.
    fn failed(
        &self,
        e: &UploadError,
        backoff: &mut Backoff,
        last_logged: &mut Option<(String, Instant)>,
    ) -> Pass {
        self.count_error(e);
        let text = e.to_string();
        let config = e.class() == ErrorClass::Configuration;
        let wait = if config {
            // At the cap rate, as the log line says; a tenth of jitter so that a fleet given
            // the same bad config does not knock all at once.
            BACKOFF_CAP.mul_f64(0.9) + backoff.at_cap() / 10
        } else {
            backoff.next_delay()
        };
        let repeat = last_logged
            .as_ref()
            .is_some_and(|(t, at)| *t == text && at.elapsed() < RELOG_EVERY);
        if !repeat {
            if config {
                log::error!(
                    "upload: {text}; recording goes on, retrying every {} s (fix the config and reload with SIGHUP)",
                    wait.as_secs()
                );
            } else {
                log::warn!("upload: {text}; retrying in {:.1} s", wait.as_secs_f64());
            }
            *last_logged = Some((text, Instant::now()));
        }
        Pass::Failed(wait)
    }

    /// Write retention's forced deletions into their bags' journals; true when there were any.
    fn record_deletions(&self) -> bool {
        let mut by_bag: HashMap<PathBuf, Vec<(String, u64)>> = HashMap::new();
        let deleted = self.ledger.take_deleted();
        let any = !deleted.is_empty();
        for (file, bytes) in deleted {
            if let (Some(bag), Some(name)) = (file.parent(), file.file_name()) {
                by_bag
                    .entry(bag.to_path_buf())
                    .or_default()
                    .push((name.to_string_lossy().into_owned(), bytes));
            }
        }
        for (bag, files) in by_bag {
            if !bag.is_dir() {
                // The whole bag went: nothing to write into.
                continue;
            }
            let mut journal = Journal::load(&bag).map(|l| l.journal).unwrap_or_default();
            for (name, bytes) in files {
                journal.note_deleted_before_upload(&name, bytes, unix_ms());
            }
            if let Err(e) = journal.save(&bag) {
                log::warn!("upload: cannot record a deletion in {}: {e}", bag.display());
            }
        }
        any
    }

    fn sweep_stale(&self) {
        match self
            .uploader
            .abort_stale(&[&self.root], STALE_UPLOAD_AGE, SystemTime::now())
        {
            Ok(r) => {
                let n = r.file_gone.len() + r.unreferenced.len();
                if n > 0 {
                    log::info!("upload: aborted {n} abandoned multipart uploads");
                }
            }
            Err(e) => log::debug!("upload: looking for abandoned uploads: {e}"),
        }
    }
}

/// Nice 19 (the lowest) and the idle I/O class for this thread (and the reader and senders it
/// spawns, which inherit both): uploads take what the recorder leaves. At nice 19 a thread
/// still gets a share of a busy CPU (about 1.5 % beside each nice-0 thread), so uploads slow
/// down on a saturated robot but never stop; SCHED_IDLE would let them starve. With
/// `idle_io` false the I/O class is best-effort at its lowest level instead (the split
/// compressor: its reads come from the page cache, and the idle class could starve its writes
/// for as long as the recorder writes). `who` names the thread in the log.
pub(crate) fn lower_priority(who: &str, idle_io: bool) {
    // SAFETY: gettid has no preconditions and returns this thread's id.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
    // SAFETY: setpriority with a valid `which` and our own thread id only changes our nice
    // value (Linux keeps it per thread); failure is reported by the return value.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) } != 0 {
        log::debug!(
            "{who}: cannot lower the thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_BE: libc::c_long = 2;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
    let prio = if idle_io {
        IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT
    } else {
        (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7
    };
    // SAFETY: ioprio_set takes three integers and only changes the I/O priority of the thread
    // named (ours); failure is reported by the return value.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            prio,
        )
    };
    if r != 0 {
        log::debug!(
            "{who}: cannot lower the I/O priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger::new(
            Arc::new(AtomicBool::new(false)),
            Arc::new((Mutex::new(false), Condvar::new())),
        )
    }

    #[test]
    fn a_closed_split_wakes_the_agent_thread_without_waiting() {
        let l = ledger();
        assert!(!*l.wake.0.lock().unwrap());
        // Held by the agent thread only around its condvar wait: setting never blocks.
        l.split_closed();
        assert!(*l.wake.0.lock().unwrap());
    }

    /// A bag directory with splits `names` on disk and a metadata.yaml listing `listed`.
    fn bag_with(dir: &Path, names: &[&str], listed: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        for n in names {
            std::fs::write(dir.join(n), b"split").unwrap();
        }
        let mut m = BagMetadata::empty(crate::bag::Flavour::Jazzy);
        m.files = listed
            .iter()
            .map(|p| crate::bag::metadata::FileInfo {
                path: p.to_string(),
                starting_time_ns: 0,
                duration_ns: 0,
                message_count: 1,
            })
            .collect();
        m.relative_file_paths = listed.iter().map(|p| p.to_string()).collect();
        m.write_atomic(dir, m.flavour()).unwrap();
    }

    #[test]
    fn the_open_split_a_live_bags_metadata_lists_is_not_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        // The first split, open: metadata.yaml names it so that the bag names a file.
        bag_with(&dir, &["b_0.db3"], &["b_0.db3"]);
        let lock = crate::bag::lock::BagLock::acquire(&dir).unwrap();
        assert_eq!(crate::bag::lock::state(&dir), LockState::Held);
        assert_eq!(closed_files(&dir, LockState::Held), Some(Vec::new()));
        // Rotated: b_0 closed and listed, b_1 open and not listed.
        bag_with(&dir, &["b_1.db3"], &["b_0.db3"]);
        assert_eq!(
            closed_files(&dir, LockState::Held),
            Some(vec!["b_0.db3".to_string(), METADATA_FILE.to_string()])
        );
        // Finished: every listed split is closed.
        bag_with(&dir, &[], &["b_0.db3", "b_1.db3"]);
        lock.release_clean().unwrap();
        assert_eq!(
            closed_files(&dir, LockState::Clean).map(|v| v.len()),
            Some(3)
        );
    }

    #[test]
    fn the_ledger_answers_uploaded_in_flight_and_pending() {
        let l = ledger();
        let a = Path::new("/r/b/b_0.db3");
        let b = Path::new("/r/b/b_1.db3");
        assert_eq!(l.state(a), UploadState::Pending);
        let g = l.generation();
        l.mark_uploaded(a.to_path_buf());
        assert_eq!(l.state(a), UploadState::Uploaded);
        assert!(l.generation() > g, "retention must see news");
        assert!(l.begin(b));
        assert_eq!(l.state(b), UploadState::InFlight);
        l.end();
        assert_eq!(l.state(b), UploadState::Pending);
    }

    #[test]
    fn an_aborted_file_is_never_started_again_and_its_transfer_is_cancelled() {
        let l = Arc::new(ledger());
        let f = PathBuf::from("/r/b/b_2.db3");
        assert!(l.begin(&f));
        // The "transfer" ends when it sees the flag.
        let worker = {
            let l = l.clone();
            std::thread::spawn(move || {
                while !l.cancel.load(Relaxed) {
                    std::thread::yield_now();
                }
                l.end();
            })
        };
        l.abort(&f);
        assert_eq!(l.state(&f), UploadState::Pending, "no longer in flight");
        worker.join().unwrap();
        assert!(!l.begin(&f), "an aborted file must not start again");
        assert!(!l.cancel.load(Relaxed), "the next file is not cancelled");
    }

    #[test]
    fn an_abort_of_a_transfer_stuck_in_the_network_returns_within_its_bound() {
        let l = ledger();
        let f = PathBuf::from("/r/b/b_3.db3");
        assert!(l.begin(&f));
        let t = Instant::now();
        l.abort(&f);
        // The writer thread must not wait for a network timeout.
        assert!(t.elapsed() < ABORT_WAIT * 5, "{:?}", t.elapsed());
        assert!(l.cancel.load(Relaxed));
    }

    #[test]
    fn the_open_split_of_a_bag_being_recorded_is_never_taken_nor_its_listing() {
        use crate::bag::writer::{BagWriter, WriterOptions};
        use crate::bag::{Flavour, TopicInfo};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        let mut w = BagWriter::create(&dir, WriterOptions::new(Flavour::Jazzy)).unwrap();
        let t = w
            .add_topic(TopicInfo::new("/t", "std_msgs/msg/String"), None)
            .unwrap();
        w.write_batch([(t, 1, &[0u8, 1, 0, 0][..])]).unwrap();
        // Only the open split exists, and metadata.yaml lists it (a bag always names a file).
        let listed = BagMetadata::read(&dir).unwrap().files;
        assert_eq!(listed.len(), 1, "{listed:?}");
        let state = crate::bag::lock::state(&dir);
        assert_eq!(state, LockState::Held);
        assert_eq!(closed_files(&dir, state), Some(vec![]));
        w.split().unwrap();
        assert_eq!(
            closed_files(&dir, crate::bag::lock::state(&dir)),
            Some(vec!["b_0.db3".to_string(), METADATA_FILE.to_string()])
        );
        w.finish().unwrap();
        assert_eq!(
            closed_files(&dir, crate::bag::lock::state(&dir)),
            Some(vec![
                "b_0.db3".to_string(),
                "b_1.db3".to_string(),
                METADATA_FILE.to_string()
            ])
        );
    }

    #[test]
    fn forced_deletions_are_handed_over_once() {
        let l = ledger();
        l.deleted_before_upload(Path::new("/r/b/b_0.db3"), 10);
        assert_eq!(l.take_deleted(), vec![(PathBuf::from("/r/b/b_0.db3"), 10)]);
        assert!(l.take_deleted().is_empty());
    }
}
