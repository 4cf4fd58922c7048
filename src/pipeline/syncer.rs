//! The recorder's background syncer: the fsyncs that used to stall the writer thread.
//!
//! Two jobs, both on one thread of their own:
//! * **Write-back of the open split.** With `write-optimized` nothing is synced while a split
//!   is written, so a 1 GiB split could hold 1 GiB of dirty pages: the fsync that closes it
//!   then takes seconds (recording paused ~0.5 s per split here, longer on eMMC), and a power
//!   cut loses the whole split. So every [`WRITEBACK_BYTES`] committed, the syncer *starts*
//!   write-back of the open split (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: asynchronous,
//!   no journal commit, nothing waits), and every [`WRITEBACK_INTERVAL`] with anything new it
//!   `fdatasync`s it. Dirty data stays bounded, the closing fsync is short, and after a power
//!   cut what was committed more than about one interval ago is on the disk. Why not
//!   `fdatasync` per 16 MiB: on ext4 each one commits the journal, and a journal commit holds
//!   up the writer's next `write(2)` (its i_size update) until the data it orders is on the
//!   disk, 70 to 100 ms at a time here; started write-back leaves the interval's
//!   `fdatasync` little to wait for.
//! * **Closing fsyncs.** A closed split is fsynced, then its directory, here rather than on
//!   the writer's thread. The writer waits for it only where the promise needs it: before
//!   deleting a split and before finishing the bag ([`crate::bag::writer::Durability`]).
//!
//! The writer side ([`BackgroundSync`]) only stores an atomic per commit and sends a message
//! per `WRITEBACK_BYTES` and per split; no lock on the hot path.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::bag::writer::{log_durable_split, Durability, MetadataWrite, StorageOps};

/// Start write-back of the open split after this many newly committed bytes...
pub const WRITEBACK_BYTES: u64 = 8 << 20;
/// ...or after this long with anything new. This is the power-cut bound of `write-optimized`
/// for the open split: what was committed longer ago than this (plus one fdatasync) is on
/// the disk.
pub const WRITEBACK_INTERVAL: Duration = Duration::from_secs(1);

/// metadata.yaml is rewritten at most this often: a rewrite due sooner waits, and a newer one
/// arriving meanwhile replaces it. Splits closing many times a second (tiny splits at full
/// pace) would otherwise cost a YAML of every split and two fsyncs each, O(splits) per close;
/// this bounds that work to O(splits) per interval and the listing's lag to about it.
pub const METADATA_INTERVAL: Duration = Duration::from_millis(100);

/// What the writer loop and the watchdog can see of the syncer.
#[derive(Debug, Default)]
pub struct SyncHealth {
    /// True while an fsync or fdatasync is running. The writer stops counting its loops
    /// meanwhile, so a storage stall stops the service's watchdog pings, as a stalled writer
    /// did when it fsynced itself.
    pub busy: AtomicBool,
    /// Syncs completed (interval `fdatasync`s and closing fsyncs).
    pub completed: AtomicU64,
    /// Write-backs of the open split started (every `WRITEBACK_BYTES`).
    pub writebacks_started: AtomicU64,
    /// Longest single sync, ns (for the summary).
    pub longest_ns: AtomicU64,
}

enum Job {
    Opened {
        path: PathBuf,
        file: Arc<File>,
    },
    /// Enough committed for a write-back now.
    Kick,
    Closed {
        path: PathBuf,
        dir: PathBuf,
        messages: u64,
        ops: Arc<dyn StorageOps>,
    },
    /// metadata.yaml listing the splits closed so far: queued after their `Closed`, so it
    /// is written only once they are durable.
    Metadata(MetadataWrite),
}

/// Closing syncs not done yet, and failures not reported yet; shared with the thread.
#[derive(Default)]
struct Pending {
    /// Closed splits whose sync is not finished.
    closing: HashSet<PathBuf>,
    /// Results of finished closing syncs that failed, by path, until waited for.
    errors: HashMap<PathBuf, std::io::Error>,
    /// Failures (write-back or close) for `take_failure`.
    failures: Vec<(PathBuf, std::io::Error)>,
}

struct State {
    pending: Mutex<Pending>,
    cv: Condvar,
    /// Bytes committed to the open split (writer stores, syncer reads).
    committed: AtomicU64,
    health: Arc<SyncHealth>,
}

/// The [`Durability`] the pipeline installs in its bag writer.
pub struct BackgroundSync {
    tx: Option<Sender<Job>>,
    state: Arc<State>,
    handle: Option<JoinHandle<()>>,
    /// `committed` at the last kick, so the writer sends one per `WRITEBACK_BYTES`.
    kicked_at: u64,
}

impl BackgroundSync {
    /// Start the thread, writing the open split back every `interval` (at most; normally
    /// [`WRITEBACK_INTERVAL`]). None if it cannot be spawned (the writer then syncs inline).
    pub fn start(health: Arc<SyncHealth>, interval: Duration) -> Option<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let state = Arc::new(State {
            pending: Mutex::new(Pending::default()),
            cv: Condvar::new(),
            committed: AtomicU64::new(0),
            health,
        });
        let st = state.clone();
        let handle = std::thread::Builder::new()
            .name("ringbag-sync".into())
            .spawn(move || run(rx, st, interval))
            .ok()?;
        Some(BackgroundSync {
            tx: Some(tx),
            state,
            handle: Some(handle),
            kicked_at: 0,
        })
    }

    fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            // The thread lives until this is dropped; a send can only fail after a panic
            // there, and then the writer's waits report it.
            let _ = tx.send(job);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.state.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Durability for BackgroundSync {
    fn opened(&mut self, path: &Path, file: Arc<File>) {
        self.state.committed.store(0, Relaxed);
        self.kicked_at = 0;
        self.send(Job::Opened {
            path: path.to_path_buf(),
            file,
        });
    }

    fn committed(&mut self, size: u64) {
        self.state.committed.store(size, Relaxed);
        if size.saturating_sub(self.kicked_at) >= WRITEBACK_BYTES {
            self.kicked_at = size;
            self.send(Job::Kick);
        }
    }

    fn closed(&mut self, path: &Path, dir: &Path, messages: u64, ops: Arc<dyn StorageOps>) {
        self.lock().closing.insert(path.to_path_buf());
        self.send(Job::Closed {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            messages,
            ops,
        });
    }

    fn wait(&mut self, path: &Path) -> std::io::Result<()> {
        let mut p = self.lock();
        while p.closing.contains(path) && self.handle.as_ref().is_some_and(|h| !h.is_finished()) {
            p = self.state.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if p.closing.contains(path) {
            return Err(std::io::Error::other(
                "the sync thread ended before the split was synced",
            ));
        }
        match p.errors.remove(path) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn wait_all(&mut self) -> std::io::Result<()> {
        let mut p = self.lock();
        while !p.closing.is_empty() && self.handle.as_ref().is_some_and(|h| !h.is_finished()) {
            p = self.state.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if !p.closing.is_empty() {
            return Err(std::io::Error::other(
                "the sync thread ended before every split was synced",
            ));
        }
        let first = p.errors.drain().next();
        match first {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    fn metadata(&mut self, write: MetadataWrite) {
        self.send(Job::Metadata(write));
    }

    fn take_failure(&mut self) -> Option<(PathBuf, std::io::Error)> {
        // Cheap enough per batch: uncontended, and the syncer holds it only to record results.
        self.lock().failures.pop()
    }
}

impl Drop for BackgroundSync {
    /// Finish every queued sync, then stop the thread.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The open split: its descriptor and how much of it is known to be on the disk.
struct Open {
    path: PathBuf,
    file: Arc<File>,
    /// Committed size at the last `fdatasync` (durable up to here) and when it was done.
    synced: u64,
    synced_at: Instant,
    /// Committed size when write-back was last started.
    started: u64,
}

fn run(rx: Receiver<Job>, st: Arc<State>, interval: Duration) {
    let mut open: Option<Open> = None;
    // The newest metadata.yaml not written yet, and when the last one was.
    let mut meta: Option<MetadataWrite> = None;
    let mut meta_written: Option<Instant> = None;
    // Poll for the interval's write-back a few times per interval.
    let tick = (interval / 4).min(Duration::from_secs(1));
    loop {
        let wait = match (&meta, meta_written) {
            (Some(_), Some(at)) => tick.min(METADATA_INTERVAL.saturating_sub(at.elapsed())),
            (Some(_), None) => Duration::ZERO,
            (None, _) => tick,
        };
        let job = match rx.recv_timeout(wait) {
            Ok(j) => Some(j),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The writer is gone: its last listing still goes out (a finished bag's own
                // is newer and wins).
                if let Some(w) = meta.take() {
                    write_metadata(&st, w);
                }
                break;
            }
        };
        match job {
            Some(Job::Opened { path, file }) => {
                open = Some(Open {
                    path,
                    file,
                    synced: 0,
                    synced_at: Instant::now(),
                    started: 0,
                });
            }
            Some(Job::Closed {
                path,
                dir,
                messages,
                ops,
            }) => {
                if open.as_ref().is_some_and(|o| o.path == path) {
                    open = None;
                }
                let r = timed(&st.health, || {
                    ops.sync_file(&path).and_then(|_| ops.sync_dir(&dir))
                });
                let mut p = st.pending.lock().unwrap_or_else(|e| e.into_inner());
                p.closing.remove(&path);
                match r {
                    Ok(()) => log_durable_split(&path, messages),
                    Err(e) => {
                        p.failures
                            .push((path.clone(), std::io::Error::new(e.kind(), e.to_string())));
                        p.errors.insert(path, e);
                    }
                }
                drop(p);
                st.cv.notify_all();
            }
            Some(Job::Metadata(write)) => {
                // Jobs arrive in order, so the splits a newer listing names are durable by
                // now (their `Closed` came first): it may replace an older one not written.
                meta = Some(write);
            }
            Some(Job::Kick) | None => {}
        }
        if meta.is_some() && meta_written.is_none_or(|at| at.elapsed() >= METADATA_INTERVAL) {
            if let Some(w) = meta.take() {
                write_metadata(&st, w);
            }
            meta_written = Some(Instant::now());
        }
        if let Some(o) = open.as_mut() {
            let size = st.committed.load(Relaxed);
            if size.saturating_sub(o.started) >= WRITEBACK_BYTES {
                // Asynchronous: returns once the pages are queued for the disk.
                start_writeback(&o.file);
                st.health.writebacks_started.fetch_add(1, Relaxed);
                o.started = size;
            }
            if size > o.synced && o.synced_at.elapsed() >= interval {
                match timed(&st.health, || o.file.sync_data()) {
                    Ok(()) => {
                        o.synced = size;
                        o.started = o.started.max(size);
                        o.synced_at = Instant::now();
                    }
                    Err(e) => {
                        let mut p = st.pending.lock().unwrap_or_else(|e| e.into_inner());
                        p.failures.push((o.path.clone(), e));
                        drop(p);
                        // Reported once; the writer fails the recording on it.
                        open = None;
                    }
                }
            }
        }
    }
}

/// Rewrite metadata.yaml; a failure is reported once, and the writer fails the recording on
/// it, as on a failed fsync (the disk is failing, or full beyond the budget's floor).
fn write_metadata(st: &State, w: MetadataWrite) {
    let path = w.path();
    let r = timed(&st.health, || {
        w.write().map_err(|e| std::io::Error::other(e.to_string()))
    });
    if let Err(e) = r {
        let mut p = st.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.failures.push((path, e));
    }
}

/// Start write-back of every dirty page of `file`, without waiting for it. Only a hint: on a
/// file system that does not support it nothing happens, and the interval's `fdatasync`
/// still makes the data durable.
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for as long as `file` is borrowed; sync_file_range only
    // reads its arguments (offset 0 and length 0 mean the whole file) and touches no memory
    // of ours. Its result is deliberately ignored (see above).
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Run one sync with `busy` set, and record its duration.
fn timed<T>(h: &SyncHealth, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    h.busy.store(true, Relaxed);
    let t = Instant::now();
    let r = f();
    let ns = t.elapsed().as_nanos() as u64;
    h.busy.store(false, Relaxed);
    h.completed.fetch_add(1, Relaxed);
    h.longest_ns.fetch_max(ns, Relaxed);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::writer::RealStorage;
    use std::sync::Mutex as StdMutex;

    /// Storage that records calls and can hold the next file sync until released.
    #[derive(Default)]
    struct Slow {
        calls: StdMutex<Vec<String>>,
        hold: StdMutex<bool>,
        cv: Condvar,
    }
    impl StorageOps for Slow {
        fn sync_file(&self, path: &Path) -> std::io::Result<()> {
            let mut h = self.hold.lock().unwrap();
            while *h {
                h = self.cv.wait(h).unwrap();
            }
            drop(h);
            self.calls
                .lock()
                .unwrap()
                .push(format!("file {}", path.display()));
            RealStorage.sync_file(path)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("dir {}", dir.display()));
            RealStorage.sync_dir(dir)
        }
        fn remove_file(&self, path: &Path) -> std::io::Result<()> {
            RealStorage.remove_file(path)
        }
    }

    #[test]
    fn a_close_returns_at_once_and_wait_returns_once_file_then_directory_are_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("a.db3");
        std::fs::write(&f, b"x").unwrap();
        let health = Arc::new(SyncHealth::default());
        let mut bg = BackgroundSync::start(health.clone(), WRITEBACK_INTERVAL).unwrap();
        let slow = Arc::new(Slow::default());
        *slow.hold.lock().unwrap() = true;
        bg.closed(&f, tmp.path(), 1, slow.clone());
        // The writer is not held up by the stalled sync, and the syncer shows it is busy.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !health.busy.load(Relaxed) {
            assert!(Instant::now() < deadline, "the sync never started");
            std::thread::yield_now();
        }
        assert!(slow.calls.lock().unwrap().is_empty());
        *slow.hold.lock().unwrap() = false;
        slow.cv.notify_all();
        bg.wait(&f).unwrap();
        assert_eq!(
            *slow.calls.lock().unwrap(),
            vec![
                format!("file {}", f.display()),
                format!("dir {}", tmp.path().display())
            ]
        );
        assert!(!health.busy.load(Relaxed));
        bg.wait_all().unwrap();
    }

    #[test]
    fn a_failed_close_sync_is_reported_to_wait_and_as_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("missing.db3");
        let mut bg =
            BackgroundSync::start(Arc::new(SyncHealth::default()), WRITEBACK_INTERVAL).unwrap();
        bg.closed(&gone, tmp.path(), 0, Arc::new(RealStorage));
        let e = bg.wait(&gone).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let (p, _) = bg.take_failure().expect("reported once");
        assert_eq!(p, gone);
        assert!(bg.take_failure().is_none());
    }

    #[test]
    fn write_back_starts_every_few_mib_and_the_fdatasync_comes_with_the_interval() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("open.db3");
        std::fs::write(&f, vec![0u8; 4096]).unwrap();
        let health = Arc::new(SyncHealth::default());
        // An interval that never comes: the byte threshold starts write-back, nothing syncs.
        let mut bg = BackgroundSync::start(health.clone(), Duration::from_secs(3600)).unwrap();
        bg.opened(&f, Arc::new(File::open(&f).unwrap()));
        bg.committed(WRITEBACK_BYTES - 1);
        bg.committed(WRITEBACK_BYTES + 10);
        let t = Instant::now();
        while health.writebacks_started.load(Relaxed) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no write-back started"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(health.writebacks_started.load(Relaxed), 1);
        assert_eq!(
            health.completed.load(Relaxed),
            0,
            "no fdatasync before the interval"
        );
        drop(bg);

        // A short interval: a few bytes are made durable by an fdatasync, no write-back needed.
        let health = Arc::new(SyncHealth::default());
        let mut bg = BackgroundSync::start(health.clone(), Duration::from_millis(20)).unwrap();
        bg.opened(&f, Arc::new(File::open(&f).unwrap()));
        bg.committed(100);
        let t = Instant::now();
        while health.completed.load(Relaxed) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no fdatasync after the interval"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(health.writebacks_started.load(Relaxed), 0);
        drop(bg);
    }
}
