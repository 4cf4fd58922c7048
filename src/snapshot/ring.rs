//! The memory ring: a fixed-size file (on tmpfs by default) mapped with memmap2, holding the
//! newest messages of the snapshot topics so that a trigger, or the next start after a crash,
//! can turn them into a bag.
//!
//! Layout (all integers little-endian, every field 8-byte aligned):
//!
//! ```text
//! 0        header (4 KiB): magic, version, capacity, window, state, tail, head, seq, pid
//! 4 KiB    topic table, slot A and slot B (256 KiB each)
//! 516 KiB  pending trigger, slot A and slot B (4 KiB each)
//! 524 KiB  data area: `capacity` bytes, used as a circle
//! ```
//!
//! Positions (`tail`, `head`) are logical byte offsets that only grow; the physical offset is
//! `pos % capacity`. A record is a 32-byte header (magic, length, topic, data CRC, timestamp,
//! header CRC) and its data padded to 8 bytes. A record never straddles the end of the data
//! area: when it would, the rest of the lap is skipped (with a wrap marker when it has room
//! for one).
//!
//! Crash consistency. The writer advances `tail` past what it is about to overwrite and
//! publishes it (release, then a full fence) *before* writing; it writes the record and only
//! then publishes `head` and `seq` with release ordering. So after a kill -9 every record in
//! `[tail, head)` is complete: the page cache of a tmpfs file outlives the process. A record
//! being written when the process died lies beyond `head` and is never read. Damage the
//! ordering cannot explain (a truncated or corrupted file) is caught by the CRCs and skipped
//! with a warning. A power cut or a reboot loses the ring: tmpfs is RAM.
//!
//! Concurrent reading (the snapshot thread while the writer thread appends) follows the
//! seqlock pattern: copy the record, then re-read `tail`; if the tail has passed the record,
//! the copy may be torn and is discarded as evicted. The CRCs are a second net.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering::*};

use memmap2::MmapRaw;
use serde::{Deserialize, Serialize};

use crate::bag::qos::{parse_profiles_str, profiles_to_yaml_string, PolicyStyle};
use crate::bag::{MessageDefinition, TopicInfo};

const MAGIC: &[u8; 8] = b"RBRING01";
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 4096;
const TOPIC_SLOT_BYTES: u64 = 256 * 1024;
const TRIGGER_SLOT_BYTES: u64 = 4096;
/// The longest pending-trigger record (its JSON) a slot holds; a longer one would be cut and
/// unreadable after a crash.
pub const PENDING_TRIGGER_MAX_BYTES: usize = (TRIGGER_SLOT_BYTES - 16) as usize;
const TOPIC_SLOTS_AT: u64 = HEADER_BYTES;
const TRIGGER_SLOTS_AT: u64 = TOPIC_SLOTS_AT + 2 * TOPIC_SLOT_BYTES;
/// Where the data area starts.
pub const DATA_AT: u64 = TRIGGER_SLOTS_AT + 2 * TRIGGER_SLOT_BYTES;
/// Smallest data area accepted (`--snapshot-size` minus the fixed part).
pub const MIN_CAPACITY: u64 = 64 * 1024;

// Header field offsets.
const H_VERSION: usize = 8;
const H_CAPACITY: usize = 16;
const H_WINDOW: usize = 24;
const H_STATE: usize = 32;
const H_TAIL: usize = 40;
const H_HEAD: usize = 48;
const H_SEQ: usize = 56;
const H_PID: usize = 64;

const STATE_RUNNING: u64 = 1;
const STATE_CLEAN: u64 = 2;

const REC_MAGIC: u32 = 0x4352_4252; // "RBRC"
/// Record header bytes.
pub const REC_HEADER: u64 = 32;
/// Topic id of a wrap marker: the rest of the lap is empty.
const WRAP: u32 = u32::MAX;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    /// A path ringbag must not use as its ring: a symbolic link, a directory or special
    /// file, a file of another user or readable by others, a file that is not a ring of ours,
    /// or a ring directory others can write. Bad input: nothing is read, written or deleted.
    #[error("{}: {message}", path.display())]
    Refused { path: PathBuf, message: String },
    /// Another live recorder holds this ring (its lock).
    #[error("{}: the ring is in use by another running recorder (use another recording root or --snapshot-file)", path.display())]
    InUse { path: PathBuf },
    /// The filesystem cannot hold the ring (bad input: choose a smaller size or another place).
    #[error("{}: a ring of {size} bytes does not fit: {available} bytes free on its filesystem (smaller --snapshot-size, or --snapshot-file elsewhere)", path.display())]
    NoRoom {
        path: PathBuf,
        size: u64,
        available: u64,
    },
}

/// Round up to 8 bytes.
fn pad8(n: u64) -> u64 {
    (n + 7) & !7
}

/// Bytes a record of `len` data bytes takes in the ring.
pub fn record_size(len: usize) -> u64 {
    REC_HEADER + pad8(len as u64)
}

/// A topic as stored in the ring's topic table: enough to write it into a bag.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingTopic {
    pub name: String,
    pub type_name: String,
    pub serialization_format: String,
    /// `offered_qos_profiles` as the YAML string of the `topics` table.
    pub qos: String,
    pub type_description_hash: String,
    pub definition: Option<RingDefinition>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingDefinition {
    pub topic_type: String,
    pub encoding: String,
    pub text: String,
    pub type_description_hash: String,
}

impl RingTopic {
    pub fn new(info: &TopicInfo, def: Option<&MessageDefinition>) -> Self {
        RingTopic {
            name: info.name.clone(),
            type_name: info.type_name.clone(),
            serialization_format: info.serialization_format.clone(),
            qos: profiles_to_yaml_string(&info.offered_qos_profiles, PolicyStyle::Integer),
            type_description_hash: info.type_description_hash.clone(),
            definition: def.map(|d| RingDefinition {
                topic_type: d.topic_type.clone(),
                encoding: d.encoding.clone(),
                text: d.encoded_message_definition.clone(),
                type_description_hash: d.type_description_hash.clone(),
            }),
        }
    }

    pub fn info(&self) -> TopicInfo {
        TopicInfo {
            name: self.name.clone(),
            type_name: self.type_name.clone(),
            serialization_format: self.serialization_format.clone(),
            offered_qos_profiles: parse_profiles_str(&self.qos).unwrap_or_default(),
            type_description_hash: self.type_description_hash.clone(),
        }
    }

    pub fn definition(&self) -> Option<MessageDefinition> {
        self.definition.as_ref().map(|d| MessageDefinition {
            topic_type: d.topic_type.clone(),
            encoding: d.encoding.clone(),
            encoded_message_definition: d.text.clone(),
            type_description_hash: d.type_description_hash.clone(),
        })
    }
}

/// A trigger whose bag was not finished yet, kept in the ring so a restart can finish it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct PendingTrigger {
    pub reason: String,
    pub trigger_ns: i64,
    /// Messages from here (ns) ...
    pub start_ns: i64,
    /// ... to here.
    pub end_ns: i64,
    /// The snapshot bag being written, so that recovery can finish it instead of leaving a
    /// half-written bag beside the crash bag (absent in rings of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bag: Option<PathBuf>,
    /// Trigger origins (`socket`, `signal`, ...), for the crash bag's metadata.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub origin: String,
}

/// One record read from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHead {
    pub topic: u32,
    pub ts: i64,
    pub len: u32,
}

/// What reading at a position found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A record; its data is in the caller's buffer. `next` is the position after it.
    Record { head: RecordHead, next: u64 },
    /// A valid record header the caller did not want; its data was not read.
    Skipped { head: RecordHead, next: u64 },
    /// The position was overwritten; reading resumes at `tail`.
    Evicted { tail: u64 },
    /// Nothing published at this position yet.
    End,
    /// A damaged record (CRC): skip to `next` (`None`: no valid record follows).
    Damaged { next: Option<u64>, why: String },
}

/// The mapped ring. Shared (`Arc`) between the writer thread, which appends through a
/// [`RingWriter`], and the snapshot thread, which reads.
pub struct Ring {
    map: MmapRaw,
    path: PathBuf,
    capacity: u64,
    /// Bytes of the data area actually backed by the file (less than `capacity` only for a
    /// truncated file found at recovery).
    backed: u64,
    /// The file, locked (flock) for this process: a second recorder on the same root must
    /// not recover or overwrite a live ring. The kernel drops the lock when we die.
    _file: nix::fcntl::Flock<File>,
    /// What the snapshot thread did with this ring in this process (not in the file).
    counters: SnapshotCounters,
}

/// Snapshot events counted since the ring was opened in this process, for the metrics: the
/// snapshot thread adds (relaxed), the status reads. The ring outlives a reload, so do these.
#[derive(Debug, Default)]
pub struct SnapshotCounters {
    /// Triggers received, by [`super::trigger::Origin::index`] (refused, rate-limited and
    /// extending ones included).
    pub triggers: [std::sync::atomic::AtomicU64; super::trigger::Origin::ALL.len()],
    /// Snapshot bags finished and kept.
    pub written: std::sync::atomic::AtomicU64,
    /// Snapshots that could not be started or were removed unfinished.
    pub failed: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Ring {
    /// The snapshot thread's counts of triggers and snapshots (this process).
    pub fn counters(&self) -> &SnapshotCounters {
        &self.counters
    }

    /// The total file size for a data area of `capacity` bytes.
    pub fn file_size(capacity: u64) -> u64 {
        DATA_AT + capacity
    }

    /// Data area bytes for a `--snapshot-size` of `size` bytes (the file's whole size).
    pub fn capacity_for(size: u64) -> u64 {
        size.saturating_sub(DATA_AT) & !7
    }

    /// Create (or replace) the ring file, reserve its space (so a full tmpfs is an error now,
    /// never a SIGBUS later) and map it.
    pub fn create(path: &Path, capacity: u64, window_ns: i64) -> Result<Ring, RingError> {
        let io = |source| RingError::Io {
            path: path.to_path_buf(),
            source,
        };
        if capacity < MIN_CAPACITY || !capacity.is_multiple_of(8) {
            return Err(RingError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "data area of {capacity} bytes: needs at least {MIN_CAPACITY}, a multiple of 8"
                ),
            });
        }
        let size = Ring::file_size(capacity);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        check_room(path, size)?;
        let file = match open_trusted(path, true)? {
            // Only a ring of ours is ever replaced (open_trusted): any other file is
            // someone's data.
            Some(file) => lock(file, path)?,
            None => {
                // O_EXCL: a file (or symbolic link) planted since the check above is an error,
                // never opened; 0600: the ring holds the robot's data, for our user only.
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(path)
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::AlreadyExists => RingError::Refused {
                            path: path.to_path_buf(),
                            message: "appeared while the ring was being created (another process writes this directory); not touched".into(),
                        },
                        _ => io(e),
                    })?;
                lock(file, path)?
            }
        };
        // Under a umask such as 0277 the creation mode loses bits; ours is exactly 0600.
        nix::sys::stat::fchmod(&*file, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| io(e.into()))?;
        // Only now, holding the lock: drop the old contents (a fresh ring starts empty). The
        // magic goes in first, so a crash at any point of the set-up leaves an empty file or
        // one that starts with it: ours either way, replaced at the next start, never refused.
        file.set_len(0).map_err(io)?;
        {
            use std::os::unix::fs::FileExt;
            file.write_all_at(MAGIC, 0).map_err(io)?;
        }
        file.set_len(size).map_err(io)?;
        // Reserve the pages: on tmpfs an mmap write into a hole when the filesystem is full
        // is a SIGBUS; a failed fallocate here is an error message instead.
        nix::fcntl::posix_fallocate(&*file, 0, size as i64).map_err(|e| match e {
            nix::errno::Errno::ENOSPC => RingError::NoRoom {
                path: path.to_path_buf(),
                size,
                available: available_bytes(path),
            },
            e => io(std::io::Error::from(e)),
        })?;
        let map = MmapRaw::map_raw(&*file).map_err(io)?;
        let ring = Ring {
            map,
            path: path.to_path_buf(),
            capacity,
            backed: capacity,
            _file: file,
            counters: SnapshotCounters::default(),
        };
        ring.write_bytes(0, MAGIC);
        ring.write_bytes(H_VERSION as u64, &VERSION.to_le_bytes());
        ring.write_bytes(H_CAPACITY as u64, &capacity.to_le_bytes());
        ring.write_bytes(H_WINDOW as u64, &window_ns.to_le_bytes());
        ring.atomic(H_TAIL).store(0, Relaxed);
        ring.atomic(H_HEAD).store(0, Relaxed);
        ring.atomic(H_SEQ).store(0, Relaxed);
        ring.atomic(H_PID)
            .store(u64::from(std::process::id()), Relaxed);
        ring.atomic(H_STATE).store(STATE_RUNNING, Release);
        Ok(ring)
    }

    /// Open a ring left by an earlier run, read-only in spirit (only its state is changed by
    /// [`Ring::mark_clean`]). A file shorter than its header says (truncated) is mapped as far
    /// as it goes; reading stops with a warning where it ends.
    pub fn open_existing(path: &Path) -> Result<Ring, RingError> {
        let io = |source| RingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |message: String| RingError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        // The same checks as before a ring is replaced: a ring another user planted (or one
        // others can read or change) is never recovered into our root.
        let file = open_trusted(path, true)?
            .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
        let file = lock(file, path)?;
        let len = file.metadata().map_err(io)?.len();
        if len < DATA_AT {
            return Err(invalid(format!(
                "{len} bytes: too short for a ringbag ring (header and tables need {DATA_AT})"
            )));
        }
        let map = MmapRaw::map_raw(&*file).map_err(io)?;
        let mut ring = Ring {
            map,
            path: path.to_path_buf(),
            capacity: 0,
            backed: 0,
            _file: file,
            counters: SnapshotCounters::default(),
        };
        let mut magic = [0u8; 8];
        ring.read_bytes(0, &mut magic);
        if &magic != MAGIC {
            return Err(invalid("not a ringbag ring (bad magic)".into()));
        }
        let mut v = [0u8; 4];
        ring.read_bytes(H_VERSION as u64, &mut v);
        if u32::from_le_bytes(v) != VERSION {
            return Err(invalid(format!(
                "ring version {} (this ringbag reads {VERSION})",
                u32::from_le_bytes(v)
            )));
        }
        let mut c = [0u8; 8];
        ring.read_bytes(H_CAPACITY as u64, &mut c);
        let capacity = u64::from_le_bytes(c);
        if capacity < MIN_CAPACITY || !capacity.is_multiple_of(8) || capacity > (1 << 48) {
            return Err(invalid(format!("implausible capacity {capacity}")));
        }
        ring.capacity = capacity;
        ring.backed = (len - DATA_AT).min(capacity);
        if ring.backed < capacity {
            log::warn!(
                "{}: the ring file is truncated ({} of {} data bytes); records beyond its end are skipped",
                path.display(),
                ring.backed,
                capacity
            );
        }
        Ok(ring)
    }

    /// For recovery of a ring an earlier run left: check the header's `capacity`, `tail` and
    /// `head` against the file and against each other, and repair what does not check out,
    /// so that a walk from `tail` to `head` covers at most one lap (each record at most once)
    /// whatever the header says. Returns one line per repair (empty: the header is sound).
    ///
    /// Why repair rather than refuse: the records carry their own CRCs, so a header damaged
    /// by a stray write still leaves them recoverable; what must never happen is a walk
    /// bounded only by a corrupted `head` (2^62 bytes: the same records, lap after lap).
    pub fn repair_for_recovery(&mut self) -> Vec<String> {
        let mut repaired = Vec::new();
        // The map is as long as the file was when it was opened.
        let file_data = (self.map.len() as u64).saturating_sub(DATA_AT) & !7;
        if file_data > self.capacity {
            // A ring file is created at exactly DATA_AT + capacity bytes and never grows: a
            // longer file means the capacity field is wrong, and positions were taken modulo
            // the file's size.
            repaired.push(format!(
                "capacity {} disagrees with the file's {file_data} data bytes; the file's size is used",
                self.capacity
            ));
            self.capacity = file_data;
            self.backed = file_data;
        }
        let (tail, head, cap) = (self.tail(), self.head(), self.capacity);
        let sound =
            tail.is_multiple_of(8) && head.is_multiple_of(8) && tail <= head && head - tail <= cap;
        if !sound {
            // Walk exactly one lap, which visits every byte of the data area once and so
            // finds every intact record once. Where it starts decides only whether a record
            // straddling the start is lost: the tail if a record header starts there (the
            // head is the damaged one), else the head if it is aligned (everything after the
            // writer's next position is older, so a lap from it ends at the newest record),
            // else the tail rounded down.
            let start = if tail.is_multiple_of(8) && self.header_at(tail).is_some() {
                tail % cap
            } else if head.is_multiple_of(8) {
                head % cap
            } else {
                (tail % cap) & !7
            };
            repaired.push(format!(
                "tail {tail} and head {head} do not fit a data area of {cap} bytes (tail <= head, head - tail <= capacity, both multiples of 8); one lap from position {start} is read instead"
            ));
            self.atomic(H_TAIL).store(start, Release);
            self.atomic(H_HEAD).store(start + cap, Release);
        }
        repaired
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn window_ns(&self) -> i64 {
        let mut w = [0u8; 8];
        self.read_bytes(H_WINDOW as u64, &mut w);
        i64::from_le_bytes(w)
    }

    /// The published oldest position.
    pub fn tail(&self) -> u64 {
        self.atomic(H_TAIL).load(Acquire)
    }

    /// The published end: every record before it is complete.
    pub fn head(&self) -> u64 {
        self.atomic(H_HEAD).load(Acquire)
    }

    /// Records ever appended.
    pub fn seq(&self) -> u64 {
        self.atomic(H_SEQ).load(Acquire)
    }

    /// Bytes of the data area the ring holds now (records and lap skips between the
    /// published tail and head), at most `capacity`. Safe while the writer appends.
    pub fn used_bytes(&self) -> u64 {
        // The tail first: the head read after it is at least as new, so never behind it.
        let tail = self.tail();
        self.head().saturating_sub(tail).min(self.capacity)
    }

    /// The stamp of the oldest record the ring holds (None when empty or unreadable), from
    /// its header alone. Safe while the writer appends: a record evicted under the read is
    /// passed over for the new tail's (a few tries; a ring that wraps that fast says None).
    pub fn oldest_ts(&self) -> Option<i64> {
        // An empty Vec: `read_if` never touches it when `want` refuses, so nothing is
        // allocated (callers poll this once a second from the status thread).
        let mut none = Vec::new();
        for _ in 0..8 {
            match self.read_if(self.tail(), &mut none, |_| false) {
                Step::Skipped { head, .. } | Step::Record { head, .. } => return Some(head.ts),
                Step::Evicted { .. } => continue,
                Step::End | Step::Damaged { .. } => return None,
            }
        }
        None
    }

    /// Whether the run that wrote this ring ended cleanly.
    pub fn was_clean(&self) -> bool {
        self.atomic(H_STATE).load(Acquire) == STATE_CLEAN
    }

    /// The pid that created the ring.
    pub fn pid(&self) -> u64 {
        self.atomic(H_PID).load(Relaxed)
    }

    /// Mark a clean end: nothing needs recovering from this ring.
    pub fn mark_clean(&self) {
        self.atomic(H_STATE).store(STATE_CLEAN, Release);
        // Best effort: tmpfs has nothing to flush; a ring on a disk gets its state written.
        let _ = self.map.flush_range(0, HEADER_BYTES as usize);
    }

    /// Mark the ring in use again by this process (a reload that keeps the ring after the
    /// previous recording marked it clean): a crash from now on is recovered at the restart.
    pub fn mark_running(&self) {
        self.atomic(H_PID)
            .store(u64::from(std::process::id()), Relaxed);
        self.atomic(H_STATE).store(STATE_RUNNING, Release);
    }

    /// The header word at `off`, as an atomic.
    fn atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && (off as u64) + 8 <= HEADER_BYTES);
        // SAFETY: the map is at least DATA_AT > HEADER_BYTES bytes long and page-aligned, so
        // `off` (a multiple of 8 inside the header) is in bounds and 8-byte aligned; the
        // memory lives as long as `self`; header words are only ever accessed through these
        // atomics once the ring is set up.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// Copy `src` into the file at byte `at` (absolute).
    fn write_bytes(&self, at: u64, src: &[u8]) {
        assert!(
            at + src.len() as u64 <= self.map.len() as u64,
            "ring write in bounds"
        );
        // SAFETY: in bounds (asserted); only the single writer of this region writes it (the
        // writer thread for the data area and topic slots, the snapshot thread for the trigger
        // slots); concurrent readers validate what they copy (see the module comment).
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.map.as_mut_ptr().add(at as usize),
                src.len(),
            )
        }
    }

    /// Copy from the file at byte `at` (absolute) into `dst`.
    fn read_bytes(&self, at: u64, dst: &mut [u8]) {
        assert!(
            at + dst.len() as u64 <= self.map.len() as u64,
            "ring read in bounds"
        );
        // SAFETY: in bounds (asserted); the bytes may be changing under a concurrent writer,
        // which is why callers validate them (CRC, tail re-check) before use.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(at as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    fn phys(&self, pos: u64) -> u64 {
        pos % self.capacity
    }

    /// Read a record header at logical `pos` (which must not be in the last <32 bytes of a
    /// lap). `None` when the bytes are not a valid header.
    fn header_at(&self, pos: u64) -> Option<RecordHead> {
        let p = self.phys(pos);
        if p + REC_HEADER > self.backed {
            return None;
        }
        let mut h = [0u8; REC_HEADER as usize];
        self.read_bytes(DATA_AT + p, &mut h);
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if word(0) != REC_MAGIC || word(24) != crc32fast::hash(&h[..24]) {
            return None;
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&h[16..24]);
        Some(RecordHead {
            len: word(4),
            topic: word(8),
            ts: i64::from_le_bytes(ts),
        })
    }

    fn data_crc_at(&self, pos: u64) -> u32 {
        let mut c = [0u8; 4];
        self.read_bytes(DATA_AT + self.phys(pos) + 12, &mut c);
        u32::from_le_bytes(c)
    }

    /// Where the record (or skip) at `pos` ends, from its header; `None` for a bad header.
    /// Handles lap ends: fewer than 32 bytes left, or a wrap marker.
    fn skip_lap_end(&self, pos: u64) -> u64 {
        let room = self.capacity - self.phys(pos);
        if room < REC_HEADER {
            pos + room
        } else {
            pos
        }
    }

    /// Read the record at `pos` into `buf`. Safe to call while the writer appends: a record
    /// overwritten during the copy is reported as `Evicted`.
    pub fn read(&self, pos: u64, buf: &mut Vec<u8>) -> Step {
        self.read_if(pos, buf, |_| true)
    }

    /// As [`Ring::read`], but a record whose header `want` refuses is passed over without
    /// copying or checking its data (`Skipped`): cheap enough to keep up with the writer.
    pub fn read_if(&self, pos: u64, buf: &mut Vec<u8>, want: impl Fn(&RecordHead) -> bool) -> Step {
        let head = self.head();
        let mut pos = pos;
        loop {
            let tail = self.tail();
            if pos < tail {
                return Step::Evicted { tail };
            }
            pos = self.skip_lap_end(pos);
            if pos >= head {
                return Step::End;
            }
            let Some(h) = self.header_at(pos) else {
                if !self.still_valid(pos) {
                    return Step::Evicted { tail: self.tail() };
                }
                return Step::Damaged {
                    next: self.resync(pos + 8, head),
                    why: format!("bad record header at position {pos}"),
                };
            };
            if h.topic == WRAP {
                let room = self.capacity - self.phys(pos);
                pos += room;
                continue;
            }
            let size = record_size(h.len as usize);
            let next = pos + size;
            if next > head || self.phys(pos) + size > self.capacity {
                if !self.still_valid(pos) {
                    return Step::Evicted { tail: self.tail() };
                }
                return Step::Damaged {
                    next: self.resync(pos + 8, head),
                    why: format!(
                        "record at position {pos} claims {} bytes, beyond the published end",
                        h.len
                    ),
                };
            }
            if self.phys(pos) + size > self.backed {
                return Step::Damaged {
                    next: None,
                    why: format!(
                        "record at position {pos} lies beyond the end of the truncated file"
                    ),
                };
            }
            if !want(&h) {
                // The header may belong to a newer record if the tail passed meanwhile.
                if !self.still_valid(pos) {
                    return Step::Evicted { tail: self.tail() };
                }
                return Step::Skipped { head: h, next };
            }
            buf.clear();
            buf.resize(h.len as usize, 0);
            self.read_bytes(DATA_AT + self.phys(pos) + REC_HEADER, buf);
            let crc = self.data_crc_at(pos);
            if !self.still_valid(pos) {
                return Step::Evicted { tail: self.tail() };
            }
            if crc32fast::hash(buf) != crc {
                return Step::Damaged {
                    next: Some(next),
                    why: format!(
                        "record at position {pos} (topic {}, {} bytes): data checksum mismatch",
                        h.topic, h.len
                    ),
                };
            }
            return Step::Record { head: h, next };
        }
    }

    /// The position of the first record stamped at or after `min_ts` (the head if none),
    /// reading headers only. Stamps are receive times from several topics, so they are only
    /// nearly ordered: the caller filters by stamp anyway and seeks a second early.
    pub fn seek(&self, min_ts: i64) -> u64 {
        let head = self.head();
        let mut pos = self.tail();
        if min_ts == i64::MIN {
            return pos;
        }
        while pos < head {
            pos = self.skip_lap_end(pos);
            if pos >= head {
                break;
            }
            let tail = self.tail();
            if pos < tail {
                pos = tail;
                continue;
            }
            match self.header_at(pos) {
                Some(h) if h.topic == WRAP => pos += self.capacity - self.phys(pos),
                Some(h) if h.ts >= min_ts => return pos,
                Some(h) => pos += record_size(h.len as usize),
                // Overwritten meanwhile or damaged: `read` reports which.
                None => return pos,
            }
        }
        pos
    }

    /// After copying bytes at `pos`: were they still the record (not overwritten meanwhile)?
    fn still_valid(&self, pos: u64) -> bool {
        // Pairs with the writer's fence after publishing the tail and before overwriting.
        fence(Acquire);
        self.tail() <= pos
    }

    /// The next position after `from` (8-aligned) where a valid record header starts, before
    /// `head`.
    fn resync(&self, from: u64, head: u64) -> Option<u64> {
        let mut pos = pad8(from);
        while pos < head {
            pos = self.skip_lap_end(pos);
            if pos >= head {
                break;
            }
            if self.header_at(pos).is_some() {
                return Some(pos);
            }
            pos += 8;
        }
        None
    }

    /// Read the topic table (the newest valid slot).
    pub fn topics(&self) -> Vec<RingTopic> {
        self.topics_checked().unwrap_or_default()
    }

    /// Read the topic table, or say why it cannot be read (for recovery, which must tell what
    /// it lost: records whose topic has no name cannot go into a bag).
    pub fn topics_checked(&self) -> Result<Vec<RingTopic>, String> {
        let bytes = self.read_slot(TOPIC_SLOTS_AT, TOPIC_SLOT_BYTES).ok_or_else(|| {
            "neither copy of its topic table is intact (checksum or length wrong, or never written)"
                .to_string()
        })?;
        serde_json::from_slice(&bytes).map_err(|e| format!("its topic table does not parse ({e})"))
    }

    /// The pending trigger, if one was recorded and not cleared.
    pub fn pending_trigger(&self) -> Option<PendingTrigger> {
        self.read_slot(TRIGGER_SLOTS_AT, TRIGGER_SLOT_BYTES)
            .and_then(|b| serde_json::from_slice::<Option<PendingTrigger>>(&b).ok())
            .flatten()
    }

    /// Record (or clear, with `None`) the pending trigger. Only the snapshot thread calls it.
    pub fn set_pending_trigger(&self, t: Option<&PendingTrigger>) {
        let text = serde_json::to_vec(&t).unwrap_or_default();
        self.write_slot(TRIGGER_SLOTS_AT, TRIGGER_SLOT_BYTES, &text);
    }

    fn write_topics(&self, topics: &[RingTopic]) -> bool {
        let text = serde_json::to_vec(topics).unwrap_or_default();
        if text.len() as u64 + 16 > TOPIC_SLOT_BYTES {
            return false;
        }
        self.write_slot(TOPIC_SLOTS_AT, TOPIC_SLOT_BYTES, &text);
        true
    }

    /// A slot: generation (u64, 0 = being written), length (u32), CRC (u32), bytes. Two
    /// slots alternate, so a write torn by a crash leaves the previous content readable.
    fn slot_gen(&self, at: u64) -> u64 {
        let mut g = [0u8; 8];
        self.read_bytes(at, &mut g);
        u64::from_le_bytes(g)
    }

    fn write_slot(&self, base: u64, slot: u64, text: &[u8]) {
        let ga = self.slot_gen(base);
        let gb = self.slot_gen(base + slot);
        let (at, gen) = if ga <= gb {
            (base, gb + 1)
        } else {
            (base + slot, ga + 1)
        };
        let max = (slot - 16) as usize;
        let text = &text[..text.len().min(max)];
        self.write_bytes(at, &0u64.to_le_bytes());
        fence(Release);
        self.write_bytes(at + 16, text);
        self.write_bytes(at + 8, &(text.len() as u32).to_le_bytes());
        self.write_bytes(at + 12, &crc32fast::hash(text).to_le_bytes());
        fence(Release);
        self.write_bytes(at, &gen.to_le_bytes());
    }

    fn read_slot(&self, base: u64, slot: u64) -> Option<Vec<u8>> {
        let mut best: Option<(u64, Vec<u8>)> = None;
        for at in [base, base + slot] {
            let gen = self.slot_gen(at);
            if gen == 0 {
                continue;
            }
            let mut lc = [0u8; 8];
            self.read_bytes(at + 8, &mut lc);
            let len = u32::from_le_bytes([lc[0], lc[1], lc[2], lc[3]]) as u64;
            let crc = u32::from_le_bytes([lc[4], lc[5], lc[6], lc[7]]);
            if len > slot - 16 {
                continue;
            }
            let mut text = vec![0u8; len as usize];
            self.read_bytes(at + 16, &mut text);
            if crc32fast::hash(&text) != crc {
                continue;
            }
            if best.as_ref().is_none_or(|(g, _)| gen > *g) {
                best = Some((gen, text));
            }
        }
        best.map(|(_, t)| t)
    }
}

/// Take the ring file's exclusive lock without waiting.
fn lock(file: File, path: &Path) -> Result<nix::fcntl::Flock<File>, RingError> {
    use nix::fcntl::{Flock, FlockArg};
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
        nix::errno::Errno::EWOULDBLOCK => RingError::InUse {
            path: path.to_path_buf(),
        },
        e => RingError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::from(e),
        },
    })
}

/// What a file that is not a regular file is, for the error line.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn refused(path: &Path, message: impl Into<String>) -> RingError {
    RingError::Refused {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn not_a_ring(path: &Path) -> RingError {
    refused(
        path,
        "exists and is not a ringbag ring; not overwritten (remove it, or choose another --snapshot-file)",
    )
}

/// A regular file, or the error naming what is there instead.
fn check_regular(meta: &std::fs::Metadata, path: &Path) -> Result<(), RingError> {
    if meta.file_type().is_file() {
        return Ok(());
    }
    Err(refused(
        path,
        format!(
            "{}, not a ring file; not touched",
            kind_of(meta.file_type())
        ),
    ))
}

/// Whether a ring may be trusted: ours (our effective user, one link) and writable by nobody
/// else. `Ok(true)`: ours, but others may read it (a ring an earlier version created under the
/// umask: 0644 by `record`, 0640 by the service). Nobody else could have written it, so it is
/// trusted and the opener narrows it to 0600; refusing it would leave the service failed after
/// an upgrade without a reboot (exit 2 is not restarted).
fn check_owner(meta: &std::fs::Metadata, path: &Path) -> Result<bool, RingError> {
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(refused(
            path,
            format!(
                "a ring owned by uid {}, not by this process (uid {euid}); neither recovered nor replaced (remove it)",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(
            path,
            format!(
                "a ring of mode {:04o}: group or others may change it (a ring is 0600); neither recovered nor replaced (chmod 600 it, or remove it)",
                meta.mode() & 0o7777
            ),
        ));
    }
    if meta.nlink() != 1 {
        return Err(refused(
            path,
            format!(
                "a ring with {} hard links (a ring has one); neither recovered nor replaced",
                meta.nlink()
            ),
        ));
    }
    Ok(meta.mode() & 0o077 != 0)
}

/// Open an existing ring of ours (for writing too with `write`): without following a
/// symbolic link, without opening anything but a regular file, and only when it is a ring
/// ([`is_ours`]) that may be trusted ([`check_owner`]). `Ok(None)`: nothing at `path`.
fn open_trusted(path: &Path, write: bool) -> Result<Option<File>, RingError> {
    let io = |source| RingError::Io {
        path: path.to_path_buf(),
        source,
    };
    // lstat first: opening a device or a FIFO can have effects of its own (a tape rewinds,
    // a FIFO blocks), so nothing but a regular file is opened at all.
    let before = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        // ENOTDIR: a file where a directory of the path should be; the caller says which.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(io(e)),
    };
    check_regular(&before, path)?;
    // O_NOFOLLOW and O_NONBLOCK: if the name was swapped for a link or a FIFO since the
    // lstat, the open fails or returns at once instead of following or blocking; fstat then
    // checks what was really opened. Opening changes nothing (no O_TRUNC, no O_CREAT).
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused(path, "a symbolic link, not a ring file; not followed"),
            _ => io(e),
        })?;
    let meta = file.metadata().map_err(io)?;
    check_regular(&meta, path)?;
    if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(refused(
            path,
            "was replaced while it was being opened; not touched",
        ));
    }
    // What the file is comes first (a text file must not be called an unsafe ring); whether
    // a ring may be trusted, second.
    if !is_ours(&file, path)? {
        return Err(not_a_ring(path));
    }
    if check_owner(&meta, path)? && write {
        // Readable by others only: narrow it before it holds anything new. Through the
        // descriptor, so it is the file checked above that changes, whatever the name is now.
        nix::sys::stat::fchmod(&file, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| io(e.into()))?;
        log::warn!(
            "{}: a ring of mode {:04o} (others could read it): narrowed to 0600",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(Some(file))
}

/// Whether a file holds a ring of ours: it starts with the magic, or it is empty (a ring
/// whose creation was cut short: [`Ring::create`] writes the magic first). Reads 8 bytes.
fn is_ours(file: &File, path: &Path) -> Result<bool, RingError> {
    use std::os::unix::fs::FileExt;
    let len = file
        .metadata()
        .map_err(|source| RingError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if len == 0 {
        return Ok(true);
    }
    let mut magic = [0u8; 8];
    Ok(file.read_exact_at(&mut magic, 0).is_ok() && &magic == MAGIC)
}

/// Check, before anything is created, that [`Ring::create`] (and recovery) may use `path`:
/// either nothing is there and its directory exists or can be created, or a ring of ours is
/// there ([`is_ours`], [`check_owner`]). Refuses a symbolic link, a directory, a special file,
/// another user's file, one others may read or change, and any file that is not a ring, with
/// the reason. Reads at most the file's first 8 bytes; changes nothing. `record`, the daemon
/// and `--check-config` call it, so all three judge a path alike.
pub fn preflight(path: &Path) -> Result<(), RingError> {
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return Err(refused(path, "needs a file name"));
    }
    match open_trusted(path, false)? {
        Some(_) => Ok(()),
        None => {
            // The nearest existing ancestor must be a directory (create_dir_all makes the rest).
            let parent = path
                .ancestors()
                .skip(1)
                .map(|d| {
                    if d.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        d
                    }
                })
                .find(|d| d.symlink_metadata().is_ok())
                .unwrap_or(Path::new("."));
            match std::fs::metadata(parent) {
                Ok(m) if m.is_dir() => {
                    use nix::unistd::{access, AccessFlags};
                    access(parent, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
                        refused(
                            path,
                            format!(
                                "cannot create the ring in {}: {}",
                                parent.display(),
                                std::io::Error::from(e)
                            ),
                        )
                    })
                }
                Ok(_) => Err(refused(
                    path,
                    format!("{} is not a directory", parent.display()),
                )),
                Err(e) => Err(refused(
                    path,
                    format!("cannot create the ring in {}: {e}", parent.display()),
                )),
            }
        }
    }
}

/// Make sure the directory of derived ring files (`/dev/shm/ringbag-<uid>` for `record`,
/// `/run/ringbag` for the service) is ours alone: created 0700 when missing; when present,
/// a real directory (not a symbolic link), owned by our effective user, writable by no one
/// else. In a world-writable place such as /dev/shm anyone could otherwise plant the ring's
/// predictable name (a link to a file of ours, or a ring of theirs to be recovered).
pub fn ensure_private_dir(dir: &Path) -> Result<(), RingError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| RingError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(RingError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    check_private_dir(dir)
}

/// The checks of [`ensure_private_dir`] on a directory that exists; a missing one passes
/// (it is created 0700). Changes nothing.
pub fn check_private_dir(dir: &Path) -> Result<(), RingError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(RingError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    if !meta.is_dir() {
        return Err(refused(
            dir,
            format!(
                "{}, not the ring's directory; not used",
                kind_of(meta.file_type())
            ),
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(refused(
            dir,
            format!(
                "the ring's directory is owned by uid {}, not by this process (uid {euid}); not used (remove it)",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(
            dir,
            format!(
                "the ring's directory has mode {:04o}: others may write it; not used (chmod 700 it)",
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Free bytes on the filesystem that will hold `path`: that of its nearest existing ancestor
/// (the ring's directory may not exist yet, e.g. /run/ringbag before the service starts).
pub fn available_bytes(path: &Path) -> u64 {
    let dir = path
        .ancestors()
        .skip(1)
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("."));
    nix::sys::statvfs::statvfs(dir)
        .map(|s| {
            #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
            let n = s.blocks_available() as u64 * s.fragment_size() as u64;
            n
        })
        .unwrap_or(u64::MAX)
}

/// Refuse a ring its filesystem cannot hold (counting the space an old ring at `path` frees).
pub fn check_room(path: &Path, size: u64) -> Result<(), RingError> {
    // lstat: a link's target is not ours to count (nor to replace).
    let existing = std::fs::symlink_metadata(path).map_or(0, |m| m.blocks() * 512);
    let available = available_bytes(path).saturating_add(existing);
    if available < size {
        return Err(RingError::NoRoom {
            path: path.to_path_buf(),
            size,
            available,
        });
    }
    Ok(())
}

/// Why a message did not go into the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendError {
    /// Larger than the whole ring.
    TooLarge,
    /// The topic table is full (hundreds of KiB of definitions).
    TopicTableFull,
}

/// The one appender of a ring (the writer thread).
pub struct RingWriter {
    ring: std::sync::Arc<Ring>,
    head: u64,
    tail: u64,
    seq: u64,
    window_ns: i64,
    newest_ts: i64,
    topics: Vec<RingTopic>,
    /// Records evicted so far (by size or window).
    pub evicted: u64,
}

impl RingWriter {
    pub fn new(ring: std::sync::Arc<Ring>) -> Self {
        let window_ns = ring.window_ns();
        // A ring kept across a reload already holds records of these topics: their ids
        // must keep meaning the same topics (a fresh ring's table is empty).
        let topics = ring.topics();
        RingWriter {
            head: ring.head(),
            tail: ring.tail(),
            seq: ring.seq(),
            ring,
            window_ns,
            newest_ts: i64::MIN,
            topics,
            evicted: 0,
        }
    }

    pub fn ring(&self) -> &std::sync::Arc<Ring> {
        &self.ring
    }

    /// Add a topic to the ring's table; returns its ring id.
    pub fn add_topic(&mut self, topic: RingTopic) -> Result<u32, AppendError> {
        if let Some(i) = self.topics.iter().position(|t| t.name == topic.name) {
            return Ok(i as u32);
        }
        self.topics.push(topic);
        if !self.ring.write_topics(&self.topics) {
            self.topics.pop();
            return Err(AppendError::TopicTableFull);
        }
        Ok((self.topics.len() - 1) as u32)
    }

    /// The header of the record at `pos` as this writer wrote it (it reads its own bytes).
    fn size_at(&self, pos: u64) -> (u64, Option<i64>) {
        let r = &self.ring;
        let room = r.capacity - r.phys(pos);
        if room < REC_HEADER {
            return (room, None);
        }
        match r.header_at(pos) {
            Some(h) if h.topic == WRAP => (room, None),
            Some(h) => (record_size(h.len as usize), Some(h.ts)),
            // Cannot happen for bytes this writer wrote; never loop forever on it.
            None => (room, None),
        }
    }

    fn evict_one(&mut self) {
        let (size, ts) = self.size_at(self.tail);
        self.tail += size;
        if ts.is_some() {
            self.evicted += 1;
        }
    }

    /// Append one message. Evicts the oldest records as the size and the window require.
    pub fn append(&mut self, topic: u32, ts: i64, data: &[u8]) -> Result<(), AppendError> {
        let cap = self.ring.capacity;
        let size = record_size(data.len());
        if size > cap || data.len() > u32::MAX as usize {
            return Err(AppendError::TooLarge);
        }
        let mut pos = self.head;
        let room = cap - self.ring.phys(pos);
        let wrap_from = (room < size).then_some(pos);
        if room < size {
            pos += room;
        }
        let end = pos + size;
        // By size: everything the new bytes (and a lap skip) cover must go.
        while self.tail < self.head && self.tail + cap < end {
            self.evict_one();
        }
        if self.tail == self.head && self.tail + cap < end {
            // Everything evicted and still no room before the lap's end: the ring restarts at
            // the record's position (no wrap marker needed: nothing before it is kept).
            self.tail = pos;
        }
        // By time: the window ends at the newest stamp.
        self.newest_ts = self.newest_ts.max(ts);
        if self.window_ns > 0 {
            let oldest_kept = self.newest_ts.saturating_sub(self.window_ns);
            while self.tail < self.head {
                match self.size_at(self.tail) {
                    (_, Some(t)) if t >= oldest_kept => break,
                    _ => self.evict_one(),
                }
            }
        }
        self.ring.atomic(H_TAIL).store(self.tail, Release);
        // Readers must see the new tail before any byte below changes (seqlock writer side).
        fence(SeqCst);
        if let Some(w) = wrap_from.filter(|w| self.tail <= *w) {
            let room = cap - self.ring.phys(w);
            if room >= REC_HEADER {
                self.write_header(w, WRAP, 0, (room - REC_HEADER) as u32, 0);
            }
        }
        let p = self.ring.phys(pos);
        self.ring.write_bytes(DATA_AT + p + REC_HEADER, data);
        self.write_header(pos, topic, ts, data.len() as u32, crc32fast::hash(data));
        self.head = end;
        self.seq += 1;
        self.ring.atomic(H_HEAD).store(end, Release);
        self.ring.atomic(H_SEQ).store(self.seq, Release);
        Ok(())
    }

    fn write_header(&self, pos: u64, topic: u32, ts: i64, len: u32, crc: u32) {
        let mut h = [0u8; REC_HEADER as usize];
        h[0..4].copy_from_slice(&REC_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&len.to_le_bytes());
        h[8..12].copy_from_slice(&topic.to_le_bytes());
        h[12..16].copy_from_slice(&crc.to_le_bytes());
        h[16..24].copy_from_slice(&ts.to_le_bytes());
        let hcrc = crc32fast::hash(&h[..24]);
        h[24..28].copy_from_slice(&hcrc.to_le_bytes());
        self.ring.write_bytes(DATA_AT + self.ring.phys(pos), &h);
    }
}

/// Every valid record of a ring from its tail to its head, oldest first, calling `f` with
/// each; damaged records are skipped with a warning. Returns (records, damaged).
pub fn scan(ring: &Ring, mut f: impl FnMut(RecordHead, &[u8])) -> (u64, u64) {
    let mut pos = ring.tail();
    let mut buf = Vec::new();
    let (mut n, mut damaged) = (0, 0);
    loop {
        match ring.read(pos, &mut buf) {
            Step::Record { head, next } => {
                f(head, &buf);
                n += 1;
                pos = next;
            }
            Step::Skipped { next, .. } => pos = next,
            Step::Evicted { tail } => pos = tail,
            Step::End => break,
            Step::Damaged { next, why } => {
                damaged += 1;
                log::warn!("{}: {why}; skipped", ring.path().display());
                match next {
                    Some(p) => pos = p,
                    None => break,
                }
            }
        }
    }
    (n, damaged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ring(cap: u64, window_ns: i64) -> (tempfile::TempDir, Arc<Ring>) {
        let dir = tempfile::tempdir().unwrap();
        let r = Ring::create(&dir.path().join("ring"), cap, window_ns).unwrap();
        (dir, Arc::new(r))
    }

    /// Deterministic mixed sizes: mostly small, some medium, a few large.
    fn size_of(i: u64) -> usize {
        let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        match x % 100 {
            0 => 40_000 + (x % 20_000) as usize,
            1..=9 => 1_000 + (x % 3_000) as usize,
            _ => (x % 200) as usize,
        }
    }

    fn payload(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|k| (i as usize + k) as u8).collect()
    }

    #[test]
    fn wraps_a_million_mixed_messages_keeping_exactly_the_newest_that_fit() {
        let cap = 1 << 20;
        let (_d, r) = ring(cap, 0);
        let mut w = RingWriter::new(r.clone());
        let t = w
            .add_topic(RingTopic::new(&TopicInfo::new("/a", "x/msg/Y"), None))
            .unwrap();
        let total = 1_000_000u64;
        for i in 0..total {
            w.append(t, i as i64, &payload(i, size_of(i))).unwrap();
        }
        // What must be kept: the longest suffix whose records fit in one lap's worth of
        // bytes, accounting for lap skips. Recompute it independently by simulation of sizes.
        let mut seen = Vec::new();
        let (n, damaged) = scan(&r, |h, data| {
            assert_eq!(data, payload(h.ts as u64, size_of(h.ts as u64)).as_slice());
            seen.push(h.ts as u64);
        });
        assert_eq!(damaged, 0);
        assert_eq!(n as usize, seen.len());
        // Oldest first, consecutive, ending at the newest: eviction is exactly FIFO.
        let first = seen[0];
        assert_eq!(seen, (first..total).collect::<Vec<_>>());
        // Exact bound: the kept records fit in the ring, and one more (the next older) would not.
        let kept_bytes: u64 = (first..total).map(|i| record_size(size_of(i))).sum();
        assert!(kept_bytes <= cap);
        assert!(r.head() - r.tail() <= cap);
        let with_older = (r.head() - r.tail()) + record_size(size_of(first - 1));
        assert!(
            with_older > cap,
            "record {} was evicted though it would fit",
            first - 1
        );
        assert_eq!(w.evicted, first);
        assert_eq!(r.seq(), total);
    }

    #[test]
    fn the_window_keeps_exactly_the_records_within_duration_of_the_newest() {
        let (_d, r) = ring(1 << 20, 1_000);
        let mut w = RingWriter::new(r.clone());
        for i in 0..10_000i64 {
            w.append(0, i * 10, &[1, 2, 3]).unwrap();
        }
        let mut stamps = Vec::new();
        scan(&r, |h, _| stamps.push(h.ts));
        // newest 99990; window 1000 ns: keep ts >= 98990.
        assert_eq!(stamps.first(), Some(&98_990));
        assert_eq!(stamps.last(), Some(&99_990));
        assert_eq!(stamps.len(), 101);
    }

    #[test]
    fn records_nearly_as_large_as_the_ring_each_evict_the_last_and_read_back_whole() {
        let (_d, r) = ring(MIN_CAPACITY, 0);
        let mut w = RingWriter::new(r.clone());
        for i in 0..50u64 {
            let len = 30_000 + (i as usize * 997) % 30_000;
            w.append(0, i as i64, &payload(i, len)).unwrap();
            let mut seen = Vec::new();
            let (_, damaged) = scan(&r, |h, data| {
                assert_eq!(data, payload(h.ts as u64, data.len()).as_slice());
                seen.push(h.ts);
            });
            assert_eq!(damaged, 0, "after record {i}");
            assert_eq!(seen.last(), Some(&(i as i64)));
            assert!(seen.len() <= 2);
        }
    }

    #[test]
    fn a_record_larger_than_the_ring_is_refused() {
        let (_d, r) = ring(MIN_CAPACITY, 0);
        let mut w = RingWriter::new(r);
        assert_eq!(
            w.append(0, 0, &vec![0u8; MIN_CAPACITY as usize]),
            Err(AppendError::TooLarge)
        );
    }

    #[test]
    fn a_restart_reads_topics_records_and_the_pending_trigger_of_an_unclean_ring() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        {
            let r = Arc::new(Ring::create(&path, 1 << 16, 0).unwrap());
            let mut w = RingWriter::new(r.clone());
            let mut info = TopicInfo::new("/cam", "sensor_msgs/msg/Image");
            info.offered_qos_profiles = vec![crate::bag::QosProfile::default()];
            let t = w.add_topic(RingTopic::new(&info, None)).unwrap();
            for i in 0..10 {
                w.append(t, i, &[i as u8; 100]).unwrap();
            }
            r.set_pending_trigger(Some(&PendingTrigger {
                reason: "estop".into(),
                trigger_ns: 5,
                start_ns: 0,
                end_ns: 15,
                ..Default::default()
            }));
            // Dropped without mark_clean: as after a kill -9.
        }
        let r = Ring::open_existing(&path).unwrap();
        assert!(!r.was_clean());
        let topics = r.topics();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0].name, "/cam");
        assert_eq!(topics[0].info().offered_qos_profiles.len(), 1);
        assert_eq!(r.pending_trigger().unwrap().reason, "estop");
        let (n, damaged) = scan(&r, |_, _| {});
        assert_eq!((n, damaged), (10, 0));
        r.set_pending_trigger(None);
        assert_eq!(r.pending_trigger(), None);
        r.mark_clean();
        drop(r);
        assert!(Ring::open_existing(&path).unwrap().was_clean());
    }

    /// Write 20 records of 1000 bytes into a fresh ring file; return its path.
    fn ring_with_twenty(dir: &Path) -> PathBuf {
        let path = dir.join("ring");
        let r = Arc::new(Ring::create(&path, 1 << 16, 0).unwrap());
        let mut w = RingWriter::new(r);
        for i in 0..20 {
            w.append(0, i, &[i as u8; 1000]).unwrap();
        }
        path
    }

    #[test]
    fn a_corrupted_head_record_is_skipped_with_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = ring_with_twenty(dir.path());
        // Corrupt data of the newest record (the last 1032 bytes before head), then its
        // header of the one before.
        let last = DATA_AT + 19 * record_size(1000);
        let mut f = OpenOptions::new().write(true).open(&path).unwrap();
        use std::io::{Seek, SeekFrom, Write};
        f.seek(SeekFrom::Start(last + REC_HEADER + 10)).unwrap();
        f.write_all(b"garbage").unwrap();
        f.seek(SeekFrom::Start(last - record_size(1000) + 4))
            .unwrap();
        f.write_all(&[0xff; 4]).unwrap();
        drop(f);
        let r = Ring::open_existing(&path).unwrap();
        let mut stamps = Vec::new();
        let (n, damaged) = scan(&r, |h, _| stamps.push(h.ts));
        assert_eq!(damaged, 2);
        assert_eq!(n, 18);
        assert_eq!(stamps, (0..18).collect::<Vec<_>>());
    }

    #[test]
    fn a_truncated_ring_file_yields_what_it_still_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = ring_with_twenty(dir.path());
        // Cut inside record 12.
        let cut = DATA_AT + 12 * record_size(1000) + 500;
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let r = Ring::open_existing(&path).unwrap();
        let mut stamps = Vec::new();
        let (n, damaged) = scan(&r, |h, _| stamps.push(h.ts));
        assert_eq!(n, 12);
        assert_eq!(damaged, 1);
        assert_eq!(stamps, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn a_file_too_short_for_a_header_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = ring_with_twenty(dir.path());
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let e = Ring::open_existing(&path).unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
    }

    #[test]
    fn the_ring_directory_is_made_0700_and_refused_when_others_could_plant_files_in_it() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shm/ringbag-0");
        ensure_private_dir(&dir).unwrap();
        let m = std::fs::symlink_metadata(&dir).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o700);
        // Writable by others: anyone could plant the ring's predictable name.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = ensure_private_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("mode 1777: others may write it"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Another user's directory (as root here: chown to nobody).
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            let e = ensure_private_dir(&dir).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
        // A symbolic link to a directory of ours is not the directory.
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = check_private_dir(&link).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        assert!(matches!(
            ensure_private_dir(&link),
            Err(RingError::Refused { .. })
        ));
    }

    #[test]
    fn preflight_accepts_a_free_path_or_a_ring_of_ours_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let free = dir.path().join("sub/dir/ring");
        preflight(&free).unwrap();
        assert!(!dir.path().join("sub").exists());
        let path = ring_with_twenty(dir.path());
        let before = std::fs::read(&path).unwrap();
        preflight(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Below a plain file: nowhere to create it.
        let e = preflight(&path.join("x")).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn a_reader_racing_the_writer_sees_only_whole_records_or_evictions() {
        let (_d, r) = ring(MIN_CAPACITY, 0);
        let reader = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut pos = 0;
                let mut good = 0u64;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while std::time::Instant::now() < deadline {
                    match r.read(pos, &mut buf) {
                        Step::Record { head, next } => {
                            assert!(buf.iter().all(|b| *b == head.ts as u8), "torn copy");
                            good += 1;
                            pos = next;
                        }
                        Step::Evicted { tail } => pos = tail,
                        Step::End => {
                            if r.seq() >= 200_000 {
                                break;
                            }
                        }
                        Step::Damaged { why, .. } => panic!("{why}"),
                        Step::Skipped { .. } => unreachable!("read wants every record"),
                    }
                }
                good
            })
        };
        let mut w = RingWriter::new(r.clone());
        for i in 0..200_000i64 {
            w.append(0, i, &vec![i as u8; (i % 700) as usize]).unwrap();
        }
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn a_header_that_does_not_fit_the_file_is_repaired_to_one_lap_read_once() {
        const CAP: u64 = 2 * MIN_CAPACITY;
        let dir = tempfile::tempdir().unwrap();
        // Wrapped several times: the records lie across the lap's end.
        let path = dir.path().join("ring");
        let kept = {
            let r = Arc::new(Ring::create(&path, CAP, 0).unwrap());
            let mut w = RingWriter::new(r.clone());
            for i in 0..300 {
                w.append(0, i, &[i as u8; 1000]).unwrap();
            }
            let mut kept = Vec::new();
            scan(&r, |h, _| kept.push(h.ts));
            kept
        };
        let sound = Ring::open_existing(&path).unwrap();
        let (tail, head) = (sound.tail(), sound.head());
        drop(sound);
        let poke = |at: usize, v: u64| {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = OpenOptions::new().write(true).open(&path).unwrap();
            f.seek(SeekFrom::Start(at as u64)).unwrap();
            f.write_all(&v.to_le_bytes()).unwrap();
        };
        for (what, at, v) in [
            ("head 2^62", H_HEAD, 1u64 << 62),
            ("tail beyond head", H_TAIL, head + 8),
            ("head - tail beyond capacity", H_HEAD, tail + 5 * CAP),
            ("head not a multiple of 8", H_HEAD, head - 3),
            ("capacity below the file's", H_CAPACITY, MIN_CAPACITY),
        ] {
            poke(H_TAIL, tail);
            poke(H_HEAD, head);
            poke(H_CAPACITY, CAP);
            poke(at, v);
            let mut r = Ring::open_existing(&path).unwrap();
            let repaired = r.repair_for_recovery();
            assert_eq!(repaired.len(), 1, "{what}: {repaired:?}");
            assert!(r.head() - r.tail() <= CAP, "{what}");
            let mut seen = Vec::new();
            scan(&r, |h, _| seen.push(h.ts));
            seen.sort_unstable();
            let before = seen.len();
            seen.dedup();
            assert_eq!(seen.len(), before, "{what}: a record read twice");
            // Every record the sound header gave, and only records once written.
            assert!(kept.iter().all(|t| seen.contains(t)), "{what}: {seen:?}");
            assert!(seen.iter().all(|t| (0..300).contains(t)), "{what}");
        }
        // A sound header is left as it is.
        poke(H_TAIL, tail);
        poke(H_HEAD, head);
        poke(H_CAPACITY, CAP);
        let mut r = Ring::open_existing(&path).unwrap();
        assert!(r.repair_for_recovery().is_empty());
        assert_eq!((r.tail(), r.head()), (tail, head));
    }
}
