//! The bag lock: `<bag>/.ringbag.lock`, held with `flock(LOCK_EX)` by the process that writes
//! the bag (a recorder, or `reindex` while it repairs the bag) for its whole life.
//!
//! Two facts come from it, both without trusting timestamps or listings:
//! * **live**: the lock is held. The kernel releases it when the holder dies (kill -9
//!   included), so a held lock always means a running writer. `reindex`, `--recover` and
//!   retention over a recording root leave such a bag alone.
//! * **finished cleanly**: the file is absent. Only a clean `finish()` removes it, after
//!   metadata.yaml and every split are fsynced. A file that is present but unlocked is the
//!   mark of a run that died (crash, kill -9, power cut): the bag must be reindexed.
//!
//! The lock file is created (and the directory fsynced) before the first split, so after a
//! power cut a bag with split files always still has its marker.
//!
//! Also the recording root's lock, [`RootLock`]: one daemon (or `record --recover`) per root.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::metadata::sync_dir;
use super::BagError;

/// Name of the lock and unclean-finish marker inside a bag directory.
pub const LOCK_FILE: &str = ".ringbag.lock";

/// What the lock file says about a bag directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// No lock file: the last writer finished cleanly (or the bag was not written by ringbag).
    Clean,
    /// The lock file exists and nobody holds it: the last writer died before finishing.
    Unclean,
    /// Another process holds the lock: the bag is being written right now.
    Held,
}

/// An exclusive hold on a bag directory. Dropping it releases the lock but leaves the file,
/// i.e. marks the bag as not finished cleanly; [`BagLock::release_clean`] removes it.
#[derive(Debug)]
pub struct BagLock {
    /// Kept only for the lock it carries: dropping the `Flock` unlocks.
    _lock: Flock<fs::File>,
    dir: PathBuf,
}

impl BagLock {
    /// Take the lock of `dir`, creating the lock file if needed; fails with
    /// [`BagError::Busy`] when another process holds it. The file and the directory entry
    /// are fsynced before this returns, so the unclean-finish marker survives a power cut.
    pub fn acquire(dir: &Path) -> Result<BagLock, BagError> {
        let path = dir.join(LOCK_FILE);
        // A clean finish unlinks the file while holding the lock. Whoever opened it just
        // before then locks an orphaned inode while a third process may create and lock a
        // new file: two "holders". So a lock counts only if the path still names the locked
        // file; otherwise start again on the new one.
        let mut attempts = 0;
        loop {
            let lock = lock_file(dir, &path)?;
            if same_file(&lock, &path) {
                return Self::claimed(lock, dir, &path);
            }
            attempts += 1;
            if attempts >= 100 {
                return Err(BagError::Busy {
                    path: dir.to_path_buf(),
                });
            }
        }
    }

    /// Note the holder in the file and make file and directory entry durable.
    fn claimed(mut lock: Flock<fs::File>, dir: &Path, path: &Path) -> Result<BagLock, BagError> {
        // Who holds it, for a person looking at a stuck bag; not used by the logic.
        let note = format!("pid {}\n", std::process::id());
        let written = lock
            .set_len(0)
            .and_then(|_| lock.write_all(note.as_bytes()))
            .and_then(|_| lock.sync_all());
        written.map_err(BagError::io(path))?;
        sync_dir(dir)?;
        Ok(BagLock {
            _lock: lock,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Mark the bag as finished cleanly: remove the lock file and fsync the directory. Call
    /// only after metadata.yaml and every split are durable.
    pub fn release_clean(self) -> Result<(), BagError> {
        let path = self.dir.join(LOCK_FILE);
        // Unlink while still holding the lock: nobody can take it in between and then see
        // the file vanish under them.
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BagError::io(&path)(e)),
        }
        sync_dir(&self.dir)
    }
}

/// Open (creating if needed, 0644) a lock file for reading and writing, never following a
/// symlink or blocking on a FIFO planted under the lock's name. Shared by the bag lock and
/// the root lock.
fn open_lock_file(path: &Path) -> std::io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
}

/// Open (creating if needed) and exclusively lock the lock file at `path`.
fn lock_file(dir: &Path, path: &Path) -> Result<Flock<fs::File>, BagError> {
    let file = open_lock_file(path).map_err(BagError::io(path))?;
    if !file.metadata().map_err(BagError::io(path))?.is_file() {
        return Err(BagError::invalid(path, "lock file is not a regular file"));
    }
    // A prober ([`state`]) holds a shared lock for a few microseconds; retry briefly so
    // that a probe racing a new recording never makes it fail.
    let mut file = file;
    let mut tries = 0;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if tries < 50 => {
                file = f;
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(BagError::Busy {
                    path: dir.to_path_buf(),
                })
            }
            Err((_, e)) => return Err(BagError::io(path)(std::io::Error::from(e))),
        }
    }
}

/// True when `path` (not following a symlink) is the very file `f` has open.
fn same_file(f: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Probe a bag directory's lock without waiting. Never blocks and never creates anything.
pub fn state(dir: &Path) -> LockState {
    let path = dir.join(LOCK_FILE);
    // See `acquire`: a file unlinked by a clean finish while we opened it is not a marker.
    for _ in 0..100 {
        let file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LockState::Clean,
            // Present but unopenable (permissions, a symlink): we cannot prove it dead, and
            // a live bag must never be touched; treat it as held.
            Err(_) => return LockState::Held,
        };
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            // Dropping the shared lock releases it at once.
            Ok(l) if same_file(&l, &path) => return LockState::Unclean,
            Ok(_) => continue,
            Err(_) => return LockState::Held,
        }
    }
    LockState::Held
}

/// Name of the recording root's lock file: one recorder per root (`<root>/.ringbag-root.lock`).
/// A name of its own, not [`LOCK_FILE`]: a root is not a bag, and its lock is no
/// unclean-finish marker. Retention, recovery and bag listings look only at directories, so
/// they never see it.
pub const ROOT_LOCK_FILE: &str = ".ringbag-root.lock";

/// The recording root is held by another process (or its lock cannot be taken).
#[derive(Debug, thiserror::Error)]
pub enum RootLockError {
    #[error(
        "{}: recording root already in use by another ringbag{} (it holds {}); one recorder per root, or each would leave the other's bag out of the budget",
        root.display(),
        pid.map(|p| format!(", pid {p}")).unwrap_or_default(),
        ROOT_LOCK_FILE
    )]
    Held { root: PathBuf, pid: Option<u32> },
    #[error("{}: cannot lock the recording root: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RootLockError {
    /// Held, or a root where the lock cannot be made (permission, read-only): the user's
    /// setup, not a failure while working.
    pub fn is_bad_input(&self) -> bool {
        match self {
            RootLockError::Held { .. } => true,
            RootLockError::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(
                    libc::EACCES
                        | libc::EPERM
                        | libc::EROFS
                        | libc::ENOTDIR
                        | libc::ENOENT
                        | libc::ELOOP
                        | libc::EISDIR
                        | libc::EINVAL
                )
            ),
        }
    }
}

/// A hold on a recording root for the holder's whole life: exclusive for the daemon (two
/// daemons on one root would each leave the other's live bag out of the budget, so the root
/// could grow to twice it, and would share a status file and ring), shared for
/// `record --recover`, which budgets over the root too: it cannot start beside a daemon nor a
/// daemon beside it, while several such recorders may share a root as before. The kernel
/// releases it when the holder dies. The file stays (never unlinked, so no holder can lock an
/// orphaned inode). With shared holders the pid noted is the last one's.
#[derive(Debug)]
pub struct RootLock {
    /// Kept only for the lock it carries: dropping the `Flock` unlocks.
    _lock: Flock<fs::File>,
}

impl RootLock {
    /// Take the exclusive lock of `root` (an existing directory) without waiting, noting our
    /// pid in the file for whoever is refused next.
    pub fn acquire(root: &Path) -> Result<RootLock, RootLockError> {
        Self::take(root, FlockArg::LockExclusiveNonblock)
    }

    /// Take a shared lock of `root` (see [`RootLock`]).
    pub fn acquire_shared(root: &Path) -> Result<RootLock, RootLockError> {
        Self::take(root, FlockArg::LockSharedNonblock)
    }

    fn take(root: &Path, how: FlockArg) -> Result<RootLock, RootLockError> {
        let path = root.join(ROOT_LOCK_FILE);
        let io = |source| RootLockError::Io {
            path: path.clone(),
            source,
        };
        let file = open_lock_file(&path).map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let mut lock = match Flock::lock(file, how) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(RootLockError::Held {
                    root: root.to_path_buf(),
                    pid: holder_pid(&path),
                })
            }
            Err((_, e)) => return Err(io(std::io::Error::from(e))),
        };
        let note = format!("pid {}\n", std::process::id());
        lock.set_len(0)
            .and_then(|_| lock.write_all(note.as_bytes()))
            .map_err(io)?;
        Ok(RootLock { _lock: lock })
    }
}

/// The pid a root lock's holder noted in it (None while it is being written, or unreadable).
fn holder_pid(path: &Path) -> Option<u32> {
    let text = fs::read_to_string(path).ok()?;
    text.trim().strip_prefix("pid ")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_root_is_refused_naming_the_holders_pid_and_free_again_when_released() {
        let d = tempfile::tempdir().unwrap();
        let first = RootLock::acquire(d.path()).unwrap();
        // flock locks belong to the open file description: a second open conflicts as
        // another process's would.
        match RootLock::acquire(d.path()).unwrap_err() {
            RootLockError::Held { root, pid } => {
                assert_eq!(root, d.path());
                assert_eq!(pid, Some(std::process::id()));
            }
            e => panic!("{e}"),
        }
        assert!(
            RootLock::acquire_shared(d.path()).is_err(),
            "shared vs exclusive"
        );
        drop(first);
        // Shared holders (record --recover) coexist, and keep a daemon out.
        let a = RootLock::acquire_shared(d.path()).unwrap();
        let b = RootLock::acquire_shared(d.path()).unwrap();
        assert!(RootLock::acquire(d.path()).is_err());
        drop((a, b));
        let again = RootLock::acquire(d.path()).unwrap();
        // Not a bag's lock: the root is no bag, clean or not.
        assert_eq!(state(d.path()), LockState::Clean);
        drop(again);
    }

    #[test]
    fn a_held_lock_is_seen_as_held_and_a_second_writer_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(state(d.path()), LockState::Clean);
        let l = BagLock::acquire(d.path()).unwrap();
        // flock locks belong to the open file description, so a second open in this
        // process conflicts just as another process would.
        assert_eq!(state(d.path()), LockState::Held);
        let e = BagLock::acquire(d.path()).unwrap_err();
        assert!(matches!(e, BagError::Busy { .. }), "{e}");
        drop(l);
        assert_eq!(state(d.path()), LockState::Unclean);
    }

    #[test]
    fn only_a_clean_release_removes_the_marker() {
        let d = tempfile::tempdir().unwrap();
        BagLock::acquire(d.path()).unwrap().release_clean().unwrap();
        assert_eq!(state(d.path()), LockState::Clean);
        assert!(!d.path().join(LOCK_FILE).exists());
        // A stale marker can be taken over (reindex does this) and then cleared.
        drop(BagLock::acquire(d.path()).unwrap());
        assert_eq!(state(d.path()), LockState::Unclean);
        BagLock::acquire(d.path()).unwrap().release_clean().unwrap();
        assert_eq!(state(d.path()), LockState::Clean);
    }

    #[test]
    fn a_lock_on_a_file_unlinked_by_a_clean_finish_is_not_taken_for_the_bags_lock() {
        // The race `acquire` and `state` guard against: a process opened the lock file just
        // before a clean finish unlinked it, and a new file now stands under the name.
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(LOCK_FILE);
        fs::write(&path, b"").unwrap();
        let old = fs::File::open(&path).unwrap();
        assert!(same_file(&old, &path));
        fs::remove_file(&path).unwrap();
        assert!(!same_file(&old, &path), "unlinked: no longer the lock");
        fs::write(&path, b"").unwrap();
        assert!(
            !same_file(&old, &path),
            "a new file under the name is another lock"
        );
    }

    #[test]
    fn a_fifo_under_the_lock_name_neither_hangs_nor_counts_as_a_lock() {
        let d = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(
            &d.path().join(LOCK_FILE),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let e = BagLock::acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
