//! Recording in rosbag2's file compression mode (`--compression-mode file --compression-format
//! zstd`): each closed split is compressed whole into `<split>.db3.zstd` ([`compress_partial`])
//! off the writer's thread, and metadata.yaml then names it by that name.
//!
//! The writer's thread never waits for a compression: it hands a [`CompressJob`] to a
//! [`Compression`](super::writer::Compression) (the pipeline's thread pool) without blocking,
//! and a split that finds the queue full stays a plain `.db3` for a while (ringbag's readers
//! take each split by its own name, so a bag may mix both): the writer hands it over once
//! the queue has room, and at `finish` at the latest, because the real `ros2 bag play`
//! refuses a file-mode bag with a plain split.
//!
//! One owner for metadata.yaml: every rewrite, the writer's own and the compressor's, goes
//! through the bag's [`MetadataGate`] lock, under which the [`Listing`] maps each compressed
//! split to its `.zstd` name. A job renames its `.zstd` and rewrites metadata.yaml under that
//! lock, and deletes the `.db3` only then, so metadata.yaml never names a file that is gone:
//! on disk, `.zstd` fsynced and renamed → metadata.yaml naming it → `.db3` deleted → directory
//! fsynced. Retention deleting a split marks it under the same lock; a job for it stops
//! within a MiB, or at the latest before its rename, and so never brings a deleted split
//! back.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::compressed::{compress_partial, ZSTD_FORMAT, ZSTD_SUFFIX};
use super::metadata::{sync_dir, BagMetadata};
use super::writer::MetadataGate;
use super::BagError;

/// What rosbag2 writes as metadata.yaml's `compression_mode` in file mode.
pub const FILE_MODE: &str = "FILE";

/// `--compression-mode file`'s settings, or (`per_message`) `--compression-mode message`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCompression {
    /// rosbag2's message mode: each message's data is one zstd frame in a plain `.db3`
    /// ([`super::compressed::MessageZip`]); the splits themselves are not compressed, and
    /// `threads`/`queue_size` are not used (ringbag compresses messages on the writer thread).
    pub per_message: bool,
    /// Compression threads (at least 1).
    pub threads: usize,
    /// Closed splits waiting for a thread; 0 = no limit (as rosbag2). A split that finds the
    /// queue full stays a plain `.db3`.
    pub queue_size: usize,
    /// zstd level (rosbag2's is 1: [`super::compressed::DEFAULT_LEVEL`]).
    pub level: i32,
}

impl FileCompression {
    /// Whether closed splits are compressed whole (file mode), not each message.
    pub fn whole_splits(&self) -> bool {
        !self.per_message
    }

    /// ros2 bag's compression flags (`--compression-mode`, `--compression-format`,
    /// `--compression-threads`, `--compression-queue-size`; the service's config keys of the
    /// same names): None for mode `none`, file mode with zstd, or one line saying why not.
    /// `message` mode gives `per_message`; a format without a mode, or a mode without a
    /// format, is refused as ros2 bag refuses them. Threads 0 = one per core (rosbag2's 0).
    pub fn from_flags(
        mode: &str,
        format: &str,
        threads: u32,
        queue_size: u32,
    ) -> Result<Option<Self>, String> {
        if !format.is_empty() && format != ZSTD_FORMAT {
            return Err(format!(
                "--compression-format {format}: unknown compression format (zstd is the only one)"
            ));
        }
        match mode {
            "none" | "" if !format.is_empty() => {
                Err("--compression-format needs a --compression-mode (as in ros2 bag)".into())
            }
            "none" | "" => Ok(None),
            "file" | "message" if format.is_empty() => Err(format!(
                "--compression-mode {mode} needs a --compression-format (zstd, as in ros2 bag)"
            )),
            "file" | "message" => Ok(Some(FileCompression {
                per_message: mode == "message",
                threads: match threads {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n as usize,
                },
                queue_size: queue_size as usize,
                level: super::compressed::DEFAULT_LEVEL,
            })),
            mode => Err(format!(
                "--compression-mode {mode}: unknown mode (none, file or message)"
            )),
        }
    }
}

/// Which splits of the bag are compressed, kept under the bag's [`MetadataGate`] lock.
#[derive(Debug, Default)]
pub struct Listing {
    /// Splits (`<name>_<N>.db3`) whose `.zstd` is complete: metadata.yaml names them by it.
    pub(crate) compressed: HashSet<String>,
    /// Splits handed to compression and not done yet, with the flag that stops their job.
    pub(crate) queued: HashMap<String, Arc<AtomicBool>>,
    /// The last metadata.yaml written (before the mapping), for the rewrite that names a
    /// newly compressed split.
    pub(crate) last: Option<BagMetadata>,
    /// Set by [`BagWriter::compress_offline`](super::writer::BagWriter::compress_offline):
    /// a failed job records its error in `failed` (for `finish` to return) instead of only
    /// logging it, as a live recorder does.
    pub(crate) report: bool,
    /// The first failed compression (its split, and why), when `report` is set.
    pub(crate) failed: Option<(PathBuf, String)>,
    /// Splits whose `.db3` is gone since the writer last looked, with their `.zstd`'s size:
    /// retention counts them at that size from then on.
    pub(crate) shrunk: Vec<(String, u64)>,
}

impl Listing {
    /// Name each compressed split in `m` by its `.zstd`, as rosbag2 does: in
    /// `relative_file_paths` (its `files[].path` keeps the `.db3` name), with
    /// `compression_format`/`compression_mode` set once any split is compressed.
    pub fn apply(&self, m: &mut BagMetadata) {
        let mut any = false;
        for p in &mut m.relative_file_paths {
            if self.compressed.contains(p.as_str()) {
                p.push_str(ZSTD_SUFFIX);
                any = true;
            }
        }
        if any {
            m.compression_format = ZSTD_FORMAT.into();
            m.compression_mode = FILE_MODE.into();
        }
    }

    /// The split `rel` is being deleted: stop its job if one is queued or running. True
    /// when its `.zstd` was complete.
    pub fn forget(&mut self, rel: &str) -> bool {
        if let Some(stop) = self.queued.remove(rel) {
            stop.store(true, Ordering::Relaxed);
        }
        self.compressed.remove(rel)
    }

    fn queue(&mut self, rel: &str) -> Arc<AtomicBool> {
        self.queued.entry(rel.to_string()).or_default().clone()
    }
}

/// The compression of one closed split, and everything after it: see the module's text.
#[derive(Debug)]
pub struct CompressJob {
    dir: PathBuf,
    rel: String,
    level: i32,
    /// Bytes counted in `reserve` for this job: the most its `.zstd` can take.
    bound: u64,
    stop: Arc<AtomicBool>,
    gate: Arc<MetadataGate>,
    /// What jobs handed over and not done may still add to the disk (retention counts it).
    reserve: Arc<AtomicU64>,
}

impl CompressJob {
    /// A job for the closed split `dir/rel` of `bound` bytes at most compressed, registered
    /// in the gate's listing (so a deletion stops it from now on). Counted in `reserve` from
    /// [`handed_over`](Self::handed_over) on.
    pub(crate) fn new(
        dir: &Path,
        rel: &str,
        level: i32,
        bound: u64,
        gate: Arc<MetadataGate>,
        reserve: Arc<AtomicU64>,
    ) -> Self {
        let stop = gate.with_listing(|l| l.queue(rel)).unwrap_or_default();
        CompressJob {
            dir: dir.to_path_buf(),
            rel: rel.to_string(),
            level,
            bound,
            stop,
            gate,
            reserve,
        }
    }

    /// The split it compresses.
    pub fn split(&self) -> PathBuf {
        self.dir.join(&self.rel)
    }

    /// The split's file name (`<name>_<N>.db3`).
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// The most bytes it may add to the disk.
    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// Count the job in the reserve before it reaches a thread.
    pub(crate) fn handed_over(&self) {
        self.reserve.fetch_add(self.bound, Ordering::Relaxed);
    }

    /// Dropped without running (the queue was full): the split stays a plain `.db3` for now.
    pub fn skip(self) {
        self.reserve.fetch_sub(self.bound, Ordering::Relaxed);
        self.gate.with_listing(|l| l.queued.remove(&self.rel));
    }

    /// Compress the split, name it by its `.zstd` in metadata.yaml, delete the `.db3`. A
    /// failure leaves the split as it was (a plain `.db3`, listed so); logged here, as no one
    /// waits for the answer. The reserve is released once the extra file is gone.
    pub fn run(self) {
        let src = self.split();
        let r = self.compress(&src);
        self.reserve.fetch_sub(self.bound, Ordering::Relaxed);
        match r {
            Ok(true) => log::debug!("compressed split {}", src.display()),
            Ok(false) => log::debug!("{}: deleted while compressed", src.display()),
            Err(e) => {
                // Offline (convert), the first failure is the command's one error line.
                let kept = self.gate.with_listing(|l| {
                    if l.report && l.failed.is_none() {
                        l.failed = Some((src.clone(), e.to_string()));
                    }
                    l.report
                });
                if kept != Some(true) {
                    log::error!("compressing a split: {e}; it stays a plain .db3");
                }
            }
        }
    }

    fn compress(&self, src: &Path) -> Result<bool, BagError> {
        let stopped = || self.stop.load(Ordering::Relaxed);
        let done = || self.gate.with_listing(|l| l.queued.remove(&self.rel));
        let c = compress_partial(src, self.level, &stopped).or_else(|e| {
            // A split that retention deleted before this job opened it: its stop flag was set
            // under the gate's lock before the unlink, so reading it under the lock after the
            // failure sees it. Not an error: nothing is lost that the budget did not let go.
            let deleted = self
                .gate
                .with_listing(|_| self.stop.load(Ordering::Relaxed))
                .unwrap_or(false);
            if deleted {
                Ok(None)
            } else {
                Err(e)
            }
        });
        let Some(c) = c.inspect_err(|_| {
            done();
        })?
        else {
            done();
            return Ok(false);
        };
        // Renamed and listed under the lock: retention's deletion (also under it) comes
        // either before (the job stops here) or after (it deletes the .zstd too).
        let published = self.gate.publish_compressed(&self.rel, || c.rename())?;
        if !published {
            // `c` drops its .partial.
            return Ok(false);
        }
        match fs::remove_file(src) {
            Ok(()) => {
                // Only now, with the `.db3` gone, may the budget count the split at its
                // `.zstd`'s size: told earlier, retention would undercount the disk.
                let zstd = self.dir.join(format!("{}{ZSTD_SUFFIX}", self.rel));
                if let Ok(m) = fs::metadata(&zstd) {
                    self.gate
                        .with_listing(|l| l.shrunk.push((self.rel.clone(), m.len())));
                    self.gate.shrunk.fetch_add(1, Ordering::Release);
                }
            }
            // Retention deleted the split meanwhile (both forms).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(BagError::io(src)(e)),
        }
        sync_dir(&self.dir)?;
        Ok(true)
    }
}
