//! Reading bags: a directory with metadata.yaml, a directory without it (metadata derived
//! from the .db3 files), or a single .db3 file. Splits compressed by rosbag2's file mode
//! (`.db3.zstd`) are read through a private decompressed copy (`compressed`). Messages come back in timestamp order across
//! splits; a start time is found through `timestamp_idx`, never by scanning.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::metadata::{BagMetadata, FileInfo, TopicWithCount, METADATA_FILE, NO_START};
use super::qos::parse_profiles_str;
use super::sqlguard::{bounded, check_len, MAX_TOPICS, MAX_TOPIC_FIELD, MAX_TOPIC_TEXT};
use super::{BagError, Flavour, TopicInfo};

/// An opened bag.
#[derive(Debug)]
pub struct Bag {
    pub path: PathBuf,
    /// metadata.yaml as read, or derived from the files when it is missing.
    pub metadata: BagMetadata,
    /// True when metadata.yaml was missing and the metadata was derived from the splits.
    pub derived: bool,
    pub splits: Vec<SplitFile>,
    /// Topics across all splits; `ReadMessage::topic` indexes this.
    pub topics: Vec<TopicInfo>,
}

#[derive(Debug, Clone)]
pub struct SplitFile {
    pub path: PathBuf,
    pub rel: String,
    pub size_bytes: u64,
    pub schema_version: Option<i64>,
    pub ros_distro: Option<String>,
    /// The first and last timestamp of its rows when the bag was opened (`None`: no rows
    /// then). A live recording's newest split may gain rows after that.
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMessage {
    pub topic: usize,
    pub timestamp: i64,
    pub data: Vec<u8>,
}

/// Which messages to read.
#[derive(Debug, Clone, Default)]
pub struct ReadFilter {
    /// Topic names to keep; `None` keeps all.
    pub topics: Option<Vec<String>>,
    /// First timestamp to return (inclusive), ns since epoch.
    pub start_ns: Option<i64>,
    /// Last timestamp to return (inclusive).
    pub end_ns: Option<i64>,
}

/// What a bag directory lists: see [`Bag::listing`].
enum Listing {
    NoMetadata(Vec<String>),
    Listed(Box<BagMetadata>, Vec<String>),
}

/// A split (or the rest of one) a tolerant open or read left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
    /// Set when the split failed part-way: (messages read from it, last timestamp read).
    pub after: Option<(u64, i64)>,
}

/// Why a split that vanished while a bag was being opened or read was left out.
const DELETED: &str = "deleted since the bag was opened";

impl Skipped {
    fn from_error(path: &Path, e: BagError, after: Option<(u64, i64)>) -> Self {
        // The error names the file already; keep only what is wrong with it.
        let text = e.to_string();
        let prefix = format!("{}: ", path.display());
        let mut reason = text.strip_prefix(&prefix).unwrap_or(&text).to_string();
        // A split that failed to open and is gone now was deleted in between (a live
        // recording's retention), whatever SQLite made of the missing file.
        if after.is_none() && is_gone(path) {
            reason = DELETED.into();
        }
        Skipped {
            path: path.to_path_buf(),
            reason,
            after,
        }
    }

    /// A split deleted since the bag was opened (a live recording's retention).
    fn deleted(path: PathBuf) -> Self {
        Skipped {
            path,
            reason: DELETED.into(),
            after: None,
        }
    }
}

/// Whether nothing is at `path` any more (not even a dangling link).
fn is_gone(path: &Path) -> bool {
    matches!(fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.after {
            None => write!(f, "{}: {}", self.path.display(), self.reason),
            Some((n, ts)) => write!(
                f,
                "{}: {} (after {n} messages, the last at {ts} ns)",
                self.path.display(),
                self.reason
            ),
        }
    }
}

/// The split index in `<name>_<N>.db3` (or `<name>_<N>.db3.zstd`), which orders splits (not
/// the lexical order: `_10` comes after `_9`).
pub fn split_number(file_name: &str) -> Option<u64> {
    let stem = file_name
        .strip_suffix(super::compressed::ZSTD_SUFFIX)
        .unwrap_or(file_name)
        .strip_suffix(".db3")?;
    let (_, n) = stem.rsplit_once('_')?;
    n.parse().ok()
}

/// All `*.db3` regular files in `dir`, ordered by split number (files without one go last,
/// by name). A directory with such a name is not a split and is skipped; a FIFO, socket or
/// device is an error naming it (opening one could block forever, and a bag never holds
/// one). Symlinks are followed only to look at what they point to.
///
/// Only `.db3` files: [`find_splits`] adds the compressed ones.
pub fn find_split_files(dir: &Path) -> Result<Vec<String>, BagError> {
    find_splits_with(dir, false)
}

/// [`find_split_files`] plus the compressed splits (`*.db3.zstd`) of rosbag2's file mode. When
/// a split is there both plain and compressed, only the `.db3` is listed: the `.zstd` may be
/// one whose compression was cut short (the `.db3` is removed only once it is complete).
pub fn find_splits(dir: &Path) -> Result<Vec<String>, BagError> {
    let mut names = find_splits_with(dir, true)?;
    let plain: std::collections::HashSet<String> = names
        .iter()
        .filter(|n| n.ends_with(".db3"))
        .cloned()
        .collect();
    names.retain(|n| {
        n.strip_suffix(super::compressed::ZSTD_SUFFIX)
            .is_none_or(|p| !plain.contains(p))
    });
    Ok(names)
}

fn find_splits_with(dir: &Path, compressed: bool) -> Result<Vec<String>, BagError> {
    let mut names: Vec<String> = Vec::new();
    for e in fs::read_dir(dir).map_err(BagError::io(dir))?.flatten() {
        let Ok(n) = e.file_name().into_string() else {
            continue;
        };
        if !(n.ends_with(".db3") || compressed && n.ends_with(".db3.zstd")) {
            continue;
        }
        let p = dir.join(&n);
        match fs::metadata(&p) {
            Ok(m) if m.is_dir() => continue,
            Ok(m) if super::fsguard::is_special(&m.file_type()) => {
                return Err(super::fsguard::special_split(&p, &m.file_type()))
            }
            // A regular file, or a dangling link that fails later naming itself.
            _ => names.push(n),
        }
    }
    names.sort_by(|a, b| {
        (split_number(a).unwrap_or(u64::MAX), a).cmp(&(split_number(b).unwrap_or(u64::MAX), b))
    });
    Ok(names)
}

/// Open a split for reading without ever writing to it or creating files beside it.
///
/// * Only a regular file is opened (and its `-wal`/`-journal`/`-shm`, which SQLite opens on
///   its own, must be regular files too), so a FIFO cannot block the open.
/// * `mode=ro`: SQLite never writes the file, so a bag in a read-only directory reads.
/// * `immutable=1` when no recorder holds the bag's lock: SQLite then takes no locks and
///   never looks for or creates `-wal`/`-shm`. A split with a `-wal` is the exception:
///   with a live recorder it is read through its WAL like any reader; without one the WAL
///   holds writes of an interrupted recording that only `reindex` applies (reading it here
///   would make SQLite write a `-shm`), so the split is refused.
pub fn open_read_only(path: &Path) -> Result<Connection, BagError> {
    guard_split(path)?;
    open_guarded(path).map(|(c, _)| c).map_err(BagError::from)
}

/// The checks of [`open_read_only`] that protect the reader (a regular file with regular side
/// files); what fails here is hostile or misplaced, never mere damage, so even a tolerant
/// reader refuses it.
fn guard_split(path: &Path) -> Result<(), BagError> {
    super::fsguard::require_regular(path)?;
    super::fsguard::check_side_files(path)
}

/// Why [`open_guarded`] failed. A tolerant reader leaves a `Damaged` split out with a
/// warning, but stops at a `Refused` one: a hostile file (see `sqlguard`), or no file
/// descriptor left, where leaving splits out would play a fraction of the bag and call it
/// done.
#[derive(Debug)]
enum OpenError {
    Refused(BagError),
    Damaged(BagError),
}

impl From<OpenError> for BagError {
    fn from(e: OpenError) -> BagError {
        match e {
            OpenError::Refused(e) | OpenError::Damaged(e) => e,
        }
    }
}

/// After SQLite could not open `path`: an EMFILE/ENFILE error when the cause was that no
/// file descriptor was left. SQLite's error does not carry errno, so the opening is tried
/// again here with as many descriptors as SQLite needs (the file, and with a live recorder
/// its `-wal` and `-shm`); whatever SQLite had opened it closed again before returning.
fn out_of_descriptors(path: &Path, live: bool) -> Option<BagError> {
    let exhausted =
        |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    let mut held = Vec::new();
    for _ in 0..if live { 3 } else { 1 } {
        let probe = match held.first() {
            None => fs::File::open(path),
            Some(f) => fs::File::try_clone(f),
        };
        match probe {
            Ok(f) => held.push(f),
            Err(e) if exhausted(&e) => return Some(BagError::io(path)(e)),
            Err(_) => return None,
        }
    }
    None
}

/// [`open_read_only`] after [`guard_split`]: what fails here is the file's content or state,
/// unless it is hostile or the process is out of descriptors ([`OpenError::Refused`]).
/// The connection comes hardened, with its work budget (`sqlguard`).
fn open_guarded(path: &Path) -> Result<(Connection, super::sqlguard::Budget), OpenError> {
    if super::compressed::is_zstd(path) {
        // Errors keep naming the `.zstd` (the split the user knows), not the copy. A stream
        // that does not decompress is damage, left out by a tolerant reader like a torn .db3.
        let copy = super::compressed::decompress(path).map_err(|e| match e {
            // No room for the copy: leaving splits out would play a fraction of the bag.
            e if e.is_disk_full() => OpenError::Refused(e),
            e => OpenError::Damaged(e),
        })?;
        let opened = open_sqlite(path, &copy.path, true);
        // Unlinks the copy: an open connection holds it open, and as it is opened
        // `immutable` SQLite never opens it again by name.
        drop(copy);
        return opened;
    }
    open_sqlite(path, path, false)
}

/// [`open_guarded`] of the SQLite file `db`: the split itself, or (`copy`) a compressed split's
/// decompressed private copy, which no recorder can hold. Errors name `path`.
fn open_sqlite(
    path: &Path,
    db: &Path,
    copy: bool,
) -> Result<(Connection, super::sqlguard::Budget), OpenError> {
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let held = !copy && super::lock::state(dir) == super::lock::LockState::Held;
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let has_wal = fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    if has_wal && !held {
        return Err(OpenError::Damaged(BagError::invalid(
            path,
            "has a -wal of an interrupted recording; run `ringbag reindex` to apply it",
        )));
    }
    let mut conn = Connection::open_with_flags(
        super::fsguard::sqlite_ro_uri(db, !held),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| match out_of_descriptors(path, held) {
        Some(emfile) => OpenError::Refused(emfile),
        None => OpenError::Damaged(BagError::sqlite(path)(e)),
    })?;
    // Touch the schema now so "not a database" surfaces here, naming this file.
    let has_messages: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='messages'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .map_err(|e| match out_of_descriptors(path, held) {
            // A live split's `-wal` and `-shm` are opened at the first read.
            Some(emfile) => OpenError::Refused(emfile),
            None => OpenError::Damaged(BagError::sqlite(path)(e)),
        })?;
    // Before any query touches `topics` or `messages`.
    // A copy's own size bounds its values (the `.zstd`'s would refuse a well-compressed
    // large message as too big).
    let size = copy.then(|| fs::metadata(db).map_or(0, |m| m.len()));
    let budget =
        super::sqlguard::harden_sized(&mut conn, path, !held, size).map_err(|e| match e {
            e @ BagError::Invalid { .. } => OpenError::Refused(e),
            e => OpenError::Damaged(e),
        })?;
    if !has_messages {
        return Err(OpenError::Damaged(BagError::invalid(
            path,
            "not a rosbag2 split (no `messages` table)",
        )));
    }
    Ok((conn, budget))
}

/// Schema version and distro from the `schema` table (absent before schema version 3).
pub fn read_schema(
    conn: &Connection,
    path: &Path,
) -> Result<(Option<i64>, Option<String>), BagError> {
    let has: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema'",
            [],
            |r| r.get(0),
        )
        .map_err(BagError::sqlite(path))?;
    if has == 0 {
        return Ok((None, None));
    }
    let row = conn
        .query_row("SELECT schema_version, ros_distro FROM schema", [], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .optional()
        .map_err(BagError::sqlite(path))?;
    match row {
        Some((v, _)) if !(1..=4).contains(&v) => Err(BagError::invalid(
            path,
            format!("unsupported schema version {v} (this build reads 1 to 4)"),
        )),
        Some((v, d)) => Ok((Some(v), Some(d))),
        None => Ok((None, None)),
    }
}

/// The `topics` table: (id, topic). Columns differ between schema versions, so ask which
/// exist rather than trusting the version number.
pub fn read_topics(conn: &Connection, path: &Path) -> Result<Vec<(i64, TopicInfo)>, BagError> {
    let cols: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('topics')")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(BagError::sqlite(path))?;
    let has = |c: &str| cols.iter().any(|x| x == c);
    let sql = format!(
        "SELECT id, {}, {}, {}, {}, {} FROM topics ORDER BY id",
        bounded("name", MAX_TOPIC_FIELD),
        bounded("type", MAX_TOPIC_FIELD),
        bounded("serialization_format", MAX_TOPIC_FIELD),
        if has("offered_qos_profiles") {
            bounded("offered_qos_profiles", MAX_TOPIC_TEXT)
        } else {
            "''".into()
        },
        if has("type_description_hash") {
            bounded("type_description_hash", MAX_TOPIC_FIELD)
        } else {
            "''".into()
        },
    );
    let mut st = conn.prepare(&sql).map_err(BagError::sqlite(path))?;
    let mut rows = st.query([]).map_err(BagError::sqlite(path))?;
    // Bounded per value, per row count and in total: a hostile split may hold anything.
    let (mut got, mut total) = (Vec::new(), 0usize);
    while let Some(r) = rows.next().map_err(BagError::sqlite(path))? {
        if got.len() >= MAX_TOPICS {
            return Err(BagError::invalid(
                path,
                format!(
                    "has more than {MAX_TOPICS} topics: {}",
                    super::sqlguard::HOSTILE
                ),
            ));
        }
        let row = (|| -> rusqlite::Result<_> {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
            ))
        })()
        .map_err(BagError::sqlite(path))?;
        let (_, name, type_name, fmt, qos, hash) = &row;
        for (what, v, max) in [
            ("a topic name", name, MAX_TOPIC_FIELD),
            ("a topic type", type_name, MAX_TOPIC_FIELD),
            ("a serialization format", fmt, MAX_TOPIC_FIELD),
            ("a QoS profile", qos, MAX_TOPIC_TEXT),
            ("a type description hash", hash, MAX_TOPIC_FIELD),
        ] {
            check_len(path, what, v, max, &mut total)?;
        }
        got.push(row);
    }
    got.into_iter()
        .map(|(id, name, type_name, fmt, qos, hash)| {
            let offered_qos_profiles = parse_profiles_str(&qos)
                .map_err(|e| BagError::invalid(path, format!("topic {name}: {e}")))?;
            Ok((
                id,
                TopicInfo {
                    name,
                    type_name,
                    serialization_format: fmt,
                    offered_qos_profiles,
                    type_description_hash: hash,
                },
            ))
        })
        .collect()
}

/// Count, time span and per-topic counts of one split, straight from its rows.
#[derive(Debug, Clone)]
pub struct SplitStats {
    pub count: u64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub per_topic_id: HashMap<i64, u64>,
}

pub fn split_stats(conn: &Connection, path: &Path) -> Result<SplitStats, BagError> {
    let (count, start, end): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT count(*), min(timestamp), max(timestamp) FROM messages",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(BagError::sqlite(path))?;
    let per_topic_id = conn
        .prepare("SELECT topic_id, count(*) FROM messages GROUP BY topic_id")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<Result<HashMap<_, _>, _>>()
        })
        .map_err(BagError::sqlite(path))?;
    Ok(SplitStats {
        count: count as u64,
        start_ns: start.unwrap_or(NO_START),
        end_ns: end.unwrap_or(NO_START),
        per_topic_id,
    })
}

/// The first and last timestamp of a split's rows, from `timestamp_idx`. Two subqueries:
/// SQLite answers a lone min() or max() from the index, but scans the table for both in one
/// select.
fn time_range(conn: &Connection, path: &Path) -> Result<(Option<i64>, Option<i64>), BagError> {
    conn.query_row(
        "SELECT (SELECT min(timestamp) FROM messages), (SELECT max(timestamp) FROM messages)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .map_err(BagError::sqlite(path))
}

/// Open the bag directory `path` with `open`, again when a live recording changed it
/// meanwhile. Its retention rewrites metadata.yaml and then deletes a split, so a reader that
/// read the old listing finds a listed file gone: when metadata.yaml changed meanwhile (by
/// content: an inode number is recycled by the next rewrite's temp file), or a split vanished
/// between listing and opening, the listing is stale and is read again. Bounded, because a
/// recorder with tiny splits may rotate faster than a loaded reader opens. Never blocks: a
/// FIFO under metadata.yaml's name is refused, not read.
fn retry_while_rewritten<T>(
    path: &Path,
    open: impl Fn(&Path) -> Result<T, BagError>,
) -> Result<T, BagError> {
    let meta_bytes = || {
        super::fsguard::read_regular_text(
            &path.join(METADATA_FILE),
            super::metadata::MAX_METADATA_BYTES,
        )
        .ok()
    };
    let mut tries = 0;
    loop {
        let before = meta_bytes();
        match open(path) {
            Err(BagError::NotFound { path: p }) if tries < 50 && p != path => tries += 1,
            Err(_) if tries < 50 && before.is_some() && meta_bytes() != before => tries += 1,
            r => return r,
        }
    }
}

impl Bag {
    /// Open a bag directory or a single .db3 file.
    pub fn open(path: &Path) -> Result<Bag, BagError> {
        if !path.exists() {
            return Err(BagError::NotFound {
                path: path.to_path_buf(),
            });
        }
        if !path.is_file() && !path.is_dir() {
            return Err(BagError::invalid(
                path,
                "not a bag: neither a directory nor a regular .db3 file; not opened",
            ));
        }
        if path.is_file() {
            return Self::open_files(
                path,
                path.parent().unwrap_or(Path::new(".")),
                vec![file_name(path)],
                None,
            );
        }
        retry_while_rewritten(path, Self::open_dir)
    }

    /// Open a bag directory, trusting its metadata.yaml as far as it can be trusted.
    fn open_dir(path: &Path) -> Result<Bag, BagError> {
        let meta_path = path.join(METADATA_FILE);
        let (metadata, listed) = match Self::listing(path)? {
            Listing::NoMetadata(files) => return Self::open_files(path, path, files, None),
            Listing::Listed(m, listed) => (m, listed),
        };
        for rel in &listed {
            if !path.join(rel).exists() {
                return Err(BagError::invalid(
                    &meta_path,
                    format!("lists {rel}, which does not exist (run `ringbag reindex`)"),
                ));
            }
        }
        if let Some(extra) = Self::unlisted_newer(path, &listed)?.into_iter().next() {
            // `reindex` refuses a bag whose lock is held, so only an ended recording is sent
            // there; a live one is described when it ends (play reads it meanwhile).
            let why = match super::lock::state(path) {
                super::lock::LockState::Held => {
                    "recording in progress: a running recorder holds the bag's lock and lists \
                     each split once it is closed; `ringbag play` reads it meanwhile"
                }
                _ => "recording interrupted; run `ringbag reindex`",
            };
            return Err(BagError::invalid(
                &meta_path,
                format!("does not list {extra} ({why})"),
            ));
        }
        Self::open_files(path, path, listed, Some(*metadata))
    }

    /// What a bag directory says it holds: its metadata.yaml and the files it lists (checked
    /// to stay inside the bag and to be regular files where they exist), or, without a
    /// metadata.yaml, its `.db3` files.
    fn listing(path: &Path) -> Result<Listing, BagError> {
        let meta_path = path.join(METADATA_FILE);
        // `symlink_metadata`: a FIFO, directory or link under this name is metadata.yaml
        // present (and then refused by `read`), never "missing".
        if fs::symlink_metadata(&meta_path).is_err() {
            let files = find_splits(path)?;
            if files.is_empty() {
                return Err(BagError::invalid(
                    path,
                    "not a bag: no metadata.yaml and no .db3 files",
                ));
            }
            return Ok(Listing::NoMetadata(files));
        }
        let metadata = BagMetadata::read(path)?;
        if metadata.storage_identifier != "sqlite3" {
            return Err(BagError::UnsupportedStorage {
                path: path.to_path_buf(),
                storage: metadata.storage_identifier,
            });
        }
        let listed: Vec<String> = if metadata.relative_file_paths.is_empty() {
            metadata.files.iter().map(|f| f.path.clone()).collect()
        } else {
            metadata.relative_file_paths.clone()
        };
        // Only files inside the bag directory are opened, whatever metadata.yaml says.
        if let Some((rel, problem)) = listed
            .iter()
            .chain(metadata.files.iter().map(|f| &f.path))
            .find_map(|p| super::fsguard::listed_path_problem(p).map(|why| (p, why)))
        {
            return Err(BagError::invalid(
                &meta_path,
                format!("lists {rel:?}, which {problem}"),
            ));
        }
        // Older rosbag2 wrote paths with the bag directory in front; accept both.
        let listed: Vec<String> = listed
            .into_iter()
            .map(|p| {
                let as_is = path.join(&p);
                if as_is.exists() {
                    p
                } else {
                    Path::new(&p)
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or(&p)
                        .to_string()
                }
            })
            .collect();
        for rel in &listed {
            if let Some(m) = fs::metadata(path.join(rel)).ok().filter(|m| !m.is_file()) {
                return Err(BagError::invalid(
                    &meta_path,
                    format!(
                        "lists {rel}, which is {}, not a regular file; not opened",
                        super::fsguard::kind(&m.file_type())
                    ),
                ));
            }
        }
        Ok(Listing::Listed(Box::new(metadata), listed))
    }

    /// Splits newer than the newest `listed` one that metadata.yaml does not name: a
    /// recording in progress (ringbag rewrites metadata.yaml at the end) or interrupted.
    fn unlisted_newer(path: &Path, listed: &[String]) -> Result<Vec<String>, BagError> {
        let newest_listed = listed.iter().filter_map(|f| split_number(f)).max();
        Ok(find_splits(path)?
            .into_iter()
            .filter(|f| !listed.contains(f))
            .filter(|f| {
                split_number(f)
                    .zip(newest_listed)
                    .is_some_and(|(n, m)| n > m)
            })
            .collect())
    }

    /// Open a bag to play what is readable of it: a bag still being recorded (splits
    /// metadata.yaml does not list yet are read too), or one with damaged splits. A split
    /// that is listed but missing, cannot be opened or read (damage, not a rosbag2 split, a
    /// `-wal` left to reindex, locked by the recorder writing it) is left out and returned
    /// with the reason. When anything was left out or added, the metadata is derived from
    /// the splits that were read.
    ///
    /// Still refused as by [`Bag::open`]: a missing path, a single `.db3` that does not
    /// open, an unreadable metadata.yaml, anything hostile (special files, paths outside
    /// the bag), and a bag of which no split is readable.
    pub fn open_tolerant(path: &Path) -> Result<(Bag, Vec<Skipped>), BagError> {
        retry_while_rewritten(path, Self::open_tolerant_once)
    }

    fn open_tolerant_once(path: &Path) -> Result<(Bag, Vec<Skipped>), BagError> {
        if !path.is_dir() {
            return Bag::open(path).map(|b| (b, Vec::new()));
        }
        let (metadata, mut rels) = match Self::listing(path)? {
            Listing::NoMetadata(files) => (None, files),
            Listing::Listed(m, listed) => (Some(*m), listed),
        };
        let mut skipped = Vec::new();
        rels.retain(|rel| {
            let there = path.join(rel).exists();
            if !there {
                skipped.push(Skipped {
                    path: path.join(rel),
                    reason: "listed in metadata.yaml but missing".into(),
                    after: None,
                });
            }
            there
        });
        let added = match metadata {
            Some(_) => Self::unlisted_newer(path, &rels)?,
            None => Vec::new(),
        };
        let changed = !added.is_empty() || !skipped.is_empty();
        rels.extend(added);
        let mut readable = Vec::new();
        for rel in rels {
            let p = path.join(&rel);
            match guard_split(&p) {
                Ok(()) => {}
                // Deleted since it was listed: a live recording's retention.
                Err(e @ BagError::NotFound { .. }) => {
                    skipped.push(Skipped::from_error(&p, e, None));
                    continue;
                }
                Err(e) => return Err(e),
            }
            let read = match open_guarded(&p) {
                Ok((c, _)) => read_topics(&c, &p).map(|_| ()),
                Err(OpenError::Refused(e)) => return Err(e),
                Err(OpenError::Damaged(e)) => Err(e),
            };
            match read {
                Ok(()) => readable.push(rel),
                // A hostile split is an error, as for `info`: never left out with a warning.
                Err(e) if super::sqlguard::is_hostile(&e) => return Err(e),
                Err(e) => skipped.push(Skipped::from_error(&p, e, None)),
            }
        }
        let meta_topics: Vec<TopicInfo> = metadata
            .as_ref()
            .map(|m| m.topics.iter().map(|t| t.topic.clone()).collect())
            .unwrap_or_default();
        // A split found readable above can still be deleted before `open_files` reads it:
        // against a recorder whose splits live a few dozen ms, re-listing the whole bag may
        // never win the race. The splits gone meanwhile are left out as deleted and the rest
        // opened again; each round leaves out at least one, so this ends.
        let (mut bag, derive) = loop {
            if readable.is_empty() {
                let why: Vec<String> = skipped.iter().map(|s| s.to_string()).collect();
                return Err(BagError::invalid(
                    path,
                    format!("no split is readable ({})", why.join("; ")),
                ));
            }
            let derive = metadata.is_none() || changed || !skipped.is_empty();
            let listed = if derive { None } else { metadata.clone() };
            match Self::open_files(path, path, readable.clone(), listed) {
                Ok(bag) => break (bag, derive),
                Err(e) => {
                    let before = readable.len();
                    readable.retain(|rel| {
                        let p = path.join(rel);
                        let gone = is_gone(&p);
                        if gone {
                            skipped.push(Skipped::deleted(p));
                        }
                        !gone
                    });
                    if readable.len() == before {
                        return Err(e);
                    }
                }
            }
        };
        if derive {
            // Topics as metadata.yaml had them (their QoS) first, then what only the files name.
            let mut topics = meta_topics;
            for t in std::mem::take(&mut bag.topics) {
                if !topics.iter().any(|x| x.name == t.name) {
                    topics.push(t);
                }
            }
            bag.topics = topics;
            bag.metadata.topics = {
                let counts: HashMap<&str, u64> = bag
                    .metadata
                    .topics
                    .iter()
                    .map(|t| (t.topic.name.as_str(), t.message_count))
                    .collect();
                bag.topics
                    .iter()
                    .map(|t| TopicWithCount {
                        topic: t.clone(),
                        message_count: counts.get(t.name.as_str()).copied().unwrap_or(0),
                    })
                    .collect()
            };
        }
        Ok((bag, skipped))
    }

    fn open_files(
        path: &Path,
        dir: &Path,
        rels: Vec<String>,
        metadata: Option<BagMetadata>,
    ) -> Result<Bag, BagError> {
        let mut splits = Vec::new();
        let mut topics: Vec<TopicInfo> = metadata
            .as_ref()
            .map(|m| m.topics.iter().map(|t| t.topic.clone()).collect())
            .unwrap_or_default();
        let mut derived_files = Vec::new();
        let mut derived_counts: HashMap<String, u64> = HashMap::new();
        let mut flavour = Flavour::Humble;
        let mut in_files: Vec<String> = Vec::new();
        for rel in rels {
            let p = dir.join(&rel);
            let conn = open_read_only(&p)?;
            let (schema_version, ros_distro) = read_schema(&conn, &p)?;
            if schema_version.unwrap_or(0) >= 4 {
                flavour = Flavour::Jazzy;
            }
            let file_topics = read_topics(&conn, &p)?;
            let (first_ns, last_ns) = time_range(&conn, &p)?;
            for (_, t) in &file_topics {
                in_files.push(t.name.clone());
                if !topics.iter().any(|x| x.name == t.name) {
                    topics.push(t.clone());
                }
            }
            if metadata.is_none() {
                let st = split_stats(&conn, &p)?;
                for (id, t) in &file_topics {
                    *derived_counts.entry(t.name.clone()).or_default() +=
                        st.per_topic_id.get(id).copied().unwrap_or(0);
                }
                derived_files.push(FileInfo {
                    path: rel.clone(),
                    starting_time_ns: st.start_ns,
                    duration_ns: if st.count > 0 {
                        st.end_ns.saturating_sub(st.start_ns)
                    } else {
                        0
                    },
                    message_count: st.count,
                });
            }
            splits.push(SplitFile {
                size_bytes: fs::metadata(&p).map(|m| m.len()).unwrap_or(0),
                path: p,
                rel,
                schema_version,
                ros_distro,
                first_ns,
                last_ns,
            });
        }
        if let Some(metadata) = &metadata {
            for t in &metadata.topics {
                if t.message_count > 0 && !in_files.contains(&t.topic.name) {
                    return Err(BagError::invalid(
                        path.join(METADATA_FILE),
                        format!(
                            "topic {} is in metadata.yaml but in none of its files",
                            t.topic.name
                        ),
                    ));
                }
            }
        }
        let derived = metadata.is_none();
        let metadata = match metadata {
            Some(m) => m,
            None => derive_metadata(flavour, &topics, &derived_counts, derived_files),
        };
        Ok(Bag {
            path: path.to_path_buf(),
            metadata,
            derived,
            splits,
            topics,
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.splits.iter().map(|s| s.size_bytes).sum()
    }

    pub fn topic_index(&self, name: &str) -> Option<usize> {
        self.topics.iter().position(|t| t.name == name)
    }

    /// Messages in timestamp order (ties by split, then row id) across all splits.
    pub fn messages(&self, filter: &ReadFilter) -> Result<MessageIter, BagError> {
        self.messages_with(filter, false)
    }

    /// [`Bag::messages`] that reads past damage: a split that cannot be opened or read, or
    /// fails part-way, is left out (from there on) and noted in [`MessageIter::take_skipped`]
    /// instead of ending the iteration with an error. Special files are still errors.
    pub fn messages_tolerant(&self, filter: &ReadFilter) -> Result<MessageIter, BagError> {
        self.messages_with(filter, true)
    }

    fn messages_with(&self, filter: &ReadFilter, tolerant: bool) -> Result<MessageIter, BagError> {
        if let Some(names) = &filter.topics {
            if let Some(missing) = names.iter().find(|n| self.topic_index(n).is_none()) {
                return Err(BagError::invalid(
                    &self.path,
                    format!("has no topic {missing}"),
                ));
            }
        }
        let mut it = MessageIter {
            topics: self.topics.clone(),
            cursors: Vec::new(),
            heap: BinaryHeap::new(),
            pending: BinaryHeap::new(),
            tolerant,
            skipped: Vec::new(),
            deferred: None,
        };
        let message_mode = super::compressed::is_message_mode(&self.metadata.compression_mode);
        let wanted: Option<std::sync::Arc<[String]>> = filter.topics.as_deref().map(Into::into);
        // Nothing is opened here: each split is opened when the merge reaches the first
        // timestamp it held when the bag was opened, and closed when read to its end. So a
        // bag costs file descriptors and memory for the splits whose time ranges overlap the
        // merge's current time (usually one), not for all of them: 2,000 splits play under a
        // limit of 64 open files, in 22 MB of RSS.
        for (order, s) in self.splits.iter().enumerate() {
            // Only a `stat` now, so that a strict read fails at once naming a split that is
            // gone or became a special file.
            match guard_split(&s.path) {
                Ok(()) => {}
                // Deleted since the bag was opened: a live recording's retention removes its
                // oldest splits while `play` (or a `--loop` pass) is still to reach them.
                // Nothing of it is left to read; special files stay errors.
                Err(e @ BagError::NotFound { .. }) if tolerant => {
                    it.skipped.push(Skipped::from_error(&s.path, e, None));
                    continue;
                }
                Err(e) => return Err(e),
            }
            // A split without rows when the bag was opened (a live recording's newest) may
            // have some now: it is read from the start, its rows merged where they belong.
            let first = s.first_ns.unwrap_or(i64::MIN);
            if filter.end_ns.is_some_and(|e| first > e) {
                continue;
            }
            let lower_bound = first.max(filter.start_ns.unwrap_or(i64::MIN));
            it.pending
                .push(Reverse((lower_bound, order, it.cursors.len())));
            let mut c = self.cursor(order, s, filter, &wanted);
            c.message_mode = message_mode;
            c.tolerant = tolerant;
            it.cursors.push(c);
        }
        Ok(it)
    }

    /// A cursor over split `s`, not opened yet. `wanted`: the filter's topics, shared by all
    /// cursors (a cursor not open costs only a few words).
    fn cursor(
        &self,
        order: usize,
        s: &SplitFile,
        filter: &ReadFilter,
        wanted: &Option<std::sync::Arc<[String]>>,
    ) -> SplitCursor {
        SplitCursor {
            sql: String::new(),
            conn: None,
            path: s.path.clone(),
            topics: wanted.clone(),
            id_to_topic: HashMap::new(),
            last: (filter.start_ns.unwrap_or(i64::MIN), i64::MIN),
            end: filter.end_ns,
            buf: VecDeque::new(),
            done: false,
            order,
            returned: 0,
            chunk_rows: FIRST_CHUNK_ROWS,
            chunk_bytes: FIRST_CHUNK_BYTES,
            message_mode: false,
            tolerant: false,
            dec: None,
            undecodable: 0,
        }
    }
}

/// Open `c`'s split: its topics (mapped to the bag's) and the statement reading its rows.
/// `bag_topics` are the bag's topics, which [`ReadMessage::topic`] indexes.
fn open_cursor(c: &mut SplitCursor, bag_topics: &[TopicInfo]) -> Result<(), OpenError> {
    let damaged = OpenError::Damaged;
    guard_split(&c.path).map_err(|e| match e {
        // Deleted since the bag was opened: a live recording's retention removes its
        // oldest splits while `play` (or a `--loop` pass) is still to reach them.
        e @ BagError::NotFound { .. } => damaged(e),
        e => OpenError::Refused(e),
    })?;
    let (conn, budget) = open_guarded(&c.path)?;
    let mut keep_ids = Vec::new();
    c.id_to_topic.clear();
    let topics = read_topics(&conn, &c.path).map_err(|e| {
        if super::sqlguard::is_hostile(&e) {
            OpenError::Refused(e)
        } else {
            damaged(e)
        }
    })?;
    for (id, t) in topics {
        let Some(idx) = bag_topics.iter().position(|b| b.name == t.name) else {
            return Err(damaged(BagError::invalid(
                &c.path,
                format!("topic {} appeared after the bag was opened", t.name),
            )));
        };
        if c.topics.as_ref().is_none_or(|n| n.contains(&t.name)) {
            keep_ids.push(id);
        }
        c.id_to_topic.insert(id, idx);
    }
    let topic_clause = match &c.topics {
        None => String::new(),
        Some(_) => format!(
            " AND topic_id IN ({})",
            keep_ids
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    let end_clause = if c.end.is_some() {
        " AND timestamp <= ?3"
    } else {
        ""
    };
    c.sql = format!("{CURSOR_SELECT}{topic_clause}{end_clause} {CURSOR_ORDER}");
    c.conn = Some((conn, budget));
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

fn derive_metadata(
    flavour: Flavour,
    topics: &[TopicInfo],
    counts: &HashMap<String, u64>,
    files: Vec<FileInfo>,
) -> BagMetadata {
    let mut m = BagMetadata::empty(flavour);
    let with = files.iter().filter(|f| f.message_count > 0);
    if let (Some(s), Some(e)) = (
        with.clone().map(|f| f.starting_time_ns).min(),
        with.map(|f| f.starting_time_ns + f.duration_ns).max(),
    ) {
        m.starting_time_ns = s;
        m.duration_ns = e - s;
    }
    m.message_count = files.iter().map(|f| f.message_count).sum();
    m.topics = topics
        .iter()
        .map(|t| TopicWithCount {
            topic: t.clone(),
            message_count: counts.get(&t.name).copied().unwrap_or(0),
        })
        .collect();
    m.relative_file_paths = files.iter().map(|f| f.path.clone()).collect();
    m.files = files;
    m
}

/// Row-value comparison `(timestamp, id) > (?, ?)` is answered from `timestamp_idx`
/// (whose entries are (timestamp, rowid)), so each chunk is an index seek, not a scan.
pub const CURSOR_SELECT: &str =
    "SELECT id, topic_id, timestamp, data FROM messages WHERE (timestamp, id) > (?1, ?2)";
pub const CURSOR_ORDER: &str = "ORDER BY timestamp, id";

/// Rows and bytes fetched per chunk: bounded so that 1 MiB messages don't balloon memory.
const CHUNK_ROWS: usize = 512;
const CHUNK_BYTES: usize = 8 << 20;
/// A split's first chunk is small and each next one twice as large, up to the bounds above:
/// the first message after a seek comes back without reading megabytes behind it.
const FIRST_CHUNK_ROWS: usize = 8;
const FIRST_CHUNK_BYTES: usize = 64 << 10;

struct SplitCursor {
    /// The statement reading the next chunk (set when the split is opened).
    sql: String,
    /// Topic names to read; `None` reads all.
    topics: Option<std::sync::Arc<[String]>>,
    /// Open only from when the merge reaches the split until it is read to its end.
    conn: Option<(Connection, super::sqlguard::Budget)>,
    path: PathBuf,
    id_to_topic: HashMap<i64, usize>,
    /// Last (timestamp, id) returned; the next chunk starts after it.
    last: (i64, i64),
    end: Option<i64>,
    buf: VecDeque<(i64, i64, usize, Vec<u8>)>,
    done: bool,
    order: usize,
    /// Messages handed out so far (for the note when the split fails part-way).
    returned: u64,
    /// Bounds of the next chunk (growing to CHUNK_ROWS / CHUNK_BYTES).
    chunk_rows: usize,
    chunk_bytes: usize,
    /// rosbag2's message compression mode: each row's data is a zstd frame of the message.
    message_mode: bool,
    /// A tolerant read skips a row that does not decompress (counted); a strict one fails.
    tolerant: bool,
    /// The decompression context, made at the first row and reused for the split's rows.
    dec: Option<zstd::bulk::Decompressor<'static>>,
    /// Rows skipped because they did not decompress.
    undecodable: u64,
}

impl SplitCursor {
    /// Fetch the next chunk (opening the split first if it is not open). An error opening
    /// it is `Refused` or `Damaged` as for [`open_guarded`]; reading errors are `Damaged`.
    fn fill(&mut self, bag_topics: &[TopicInfo]) -> Result<(), OpenError> {
        if self.done || !self.buf.is_empty() {
            return Ok(());
        }
        if self.conn.is_none() {
            open_cursor(self, bag_topics)?;
        }
        let r = self.fill_open().map_err(OpenError::Damaged);
        if r.is_err() || self.done {
            // Read to its end (or failed): its descriptor, page cache and topic map go now.
            self.conn = None;
            self.sql = String::new();
            self.id_to_topic = HashMap::new();
        }
        r
    }

    fn fill_open(&mut self) -> Result<(), BagError> {
        let Some((conn, budget)) = &self.conn else {
            return Ok(());
        };
        // Each chunk may do work in proportion to the file as it is now.
        budget.recharge(conn, &self.path);
        let mut st = conn
            .prepare_cached(&self.sql)
            .map_err(BagError::sqlite(&self.path))?;
        let mut rows = match self.end {
            Some(end) => st.query(rusqlite::params![self.last.0, self.last.1, end]),
            None => st.query(rusqlite::params![self.last.0, self.last.1]),
        }
        .map_err(BagError::sqlite(&self.path))?;
        let mut bytes = 0;
        while let Some(r) = rows.next().map_err(BagError::sqlite(&self.path))? {
            let row = (|| -> rusqlite::Result<_> {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                ))
            })()
            .map_err(BagError::sqlite(&self.path))?;
            let (id, topic_id, ts, data) = row;
            let topic = *self.id_to_topic.get(&topic_id).ok_or_else(|| {
                BagError::invalid(
                    &self.path,
                    format!("message {id} names unknown topic id {topic_id}"),
                )
            })?;
            self.last = (ts, id);
            let data = if self.message_mode {
                let dec = match &mut self.dec {
                    Some(d) => d,
                    None => self
                        .dec
                        .insert(zstd::bulk::Decompressor::new().map_err(BagError::io(&self.path))?),
                };
                match super::compressed::decompress_message(dec, &data) {
                    Ok(d) => d,
                    Err(why) if self.tolerant => {
                        // One bad row is one lost message, as a torn file-mode split is one
                        // lost split: the rest of the split still plays. Warned once per
                        // split here; the count is in `MessageIter::undecodable`.
                        if self.undecodable == 0 {
                            log::warn!(
                                "{}: skipping message {id} (at {ts} ns), which does not \
                                 decompress: {why}",
                                self.path.display()
                            );
                        }
                        self.undecodable += 1;
                        continue;
                    }
                    Err(why) => {
                        return Err(BagError::invalid(
                            &self.path,
                            format!("message {id} (at {ts} ns) does not decompress: {why}"),
                        ))
                    }
                }
            } else {
                data
            };
            bytes += data.len();
            self.buf.push_back((ts, id, topic, data));
            if self.buf.len() >= self.chunk_rows || bytes >= self.chunk_bytes {
                self.chunk_rows = (self.chunk_rows * 2).min(CHUNK_ROWS);
                self.chunk_bytes = (self.chunk_bytes * 2).min(CHUNK_BYTES);
                return Ok(());
            }
        }
        self.done = true;
        Ok(())
    }
}

/// Iterator over a bag's messages in time order.
pub struct MessageIter {
    /// The bag's topics, which [`ReadMessage::topic`] indexes.
    topics: Vec<TopicInfo>,
    cursors: Vec<SplitCursor>,
    /// Heads of the cursors being merged: (timestamp, split order, row id, cursor).
    heap: BinaryHeap<Reverse<(i64, usize, i64, usize)>>,
    /// Cursors not read yet, by a lower bound of their first timestamp: (bound, order, cursor).
    pending: BinaryHeap<Reverse<(i64, usize, usize)>>,
    tolerant: bool,
    skipped: Vec<Skipped>,
    /// A strict read's error, returned after the message that preceded it.
    deferred: Option<BagError>,
}

impl MessageIter {
    /// Splits (or their rest) left out so far by a tolerant read, taken once each.
    pub fn take_skipped(&mut self) -> Vec<Skipped> {
        std::mem::take(&mut self.skipped)
    }

    /// Messages a tolerant read of a message-mode bag skipped so far because their data did
    /// not decompress (each split's first is also logged as a warning).
    pub fn undecodable(&self) -> u64 {
        self.cursors.iter().map(|c| c.undecodable).sum()
    }

    /// Fetch cursor `i`'s next chunk if needed and put its head on the heap.
    fn push_head(&mut self, i: usize) -> Result<(), BagError> {
        let c = &mut self.cursors[i];
        if let Err(e) = c.fill(&self.topics) {
            c.done = true;
            c.conn = None;
            let e = match e {
                OpenError::Damaged(e) if self.tolerant => e,
                e => {
                    c.buf.clear();
                    return Err(e.into());
                }
            };
            // The rows this chunk read before the damage still play.
            let read = c.returned + c.buf.len() as u64;
            let after = (read > 0).then_some((read, c.last.0));
            self.skipped.push(Skipped::from_error(&c.path, e, after));
        }
        if let Some((ts, id, _, _)) = c.buf.front() {
            self.heap.push(Reverse((*ts, c.order, *id, i)));
        }
        Ok(())
    }

    /// Start reading every pending cursor whose first message could come before the current
    /// head of the merge (ties included: a lower split order wins a tie).
    fn activate(&mut self) -> Result<(), BagError> {
        while let Some(&Reverse((bound, order, i))) = self.pending.peek() {
            let due = match self.heap.peek() {
                None => true,
                Some(&Reverse((ts, o, _, _))) => (bound, order) <= (ts, o),
            };
            if !due {
                break;
            }
            self.pending.pop();
            self.push_head(i)?;
        }
        Ok(())
    }
}

impl Iterator for MessageIter {
    type Item = Result<ReadMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.deferred.take() {
            return Some(Err(e));
        }
        if let Err(e) = self.activate() {
            return Some(Err(e));
        }
        let Reverse((_, _, _, i)) = self.heap.pop()?;
        let (ts, _, topic, data) = self.cursors[i].buf.pop_front()?;
        self.cursors[i].returned += 1;
        if self.cursors[i].buf.is_empty() {
            if let Err(e) = self.push_head(i) {
                self.deferred = Some(e);
            }
        } else if let Some((ts, id, _, _)) = self.cursors[i].buf.front() {
            let order = self.cursors[i].order;
            self.heap.push(Reverse((*ts, order, *id, i)));
        }
        Some(Ok(ReadMessage {
            topic,
            timestamp: ts,
            data,
        }))
    }
}
