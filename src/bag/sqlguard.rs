//! Limits on what SQLite does for a reader of a split that may be hostile.
//!
//! A `.db3` is input. Its schema can make `topics` or `messages` a VIEW (an infinitely
//! recursive one hangs every query; one yielding a huge string costs gigabytes), a virtual
//! table, or a table with generated columns evaluated on every read. So every connection that
//! reads a split is hardened here before its first query:
//!
//! * `PRAGMA trusted_schema=OFF`: functions the schema names run only when SQLite marks
//!   them innocuous, and triggers or views planted in the file cannot reach anything else.
//! * The rosbag2 tables must be real tables without generated columns ([`check_tables`]):
//!   anything else is refused, never queried.
//! * No value may be longer than the file (`SQLITE_LIMIT_LENGTH`): every value a real table
//!   holds fits in its file, so a longer one is computed, i.e. hostile.
//! * A work budget per statement in VM instructions, proportional to the file's size (a
//!   progress handler): no statement can run away, yet a legitimate read of every row,
//!   which costs a few instructions per byte, is far inside it.
//! * `topics` and `message_definitions` are measured before any value is read
//!   ([`check_sizes`]): row count, longest value and total, from record headers only.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rusqlite::limits::Limit;
use rusqlite::Connection;

use super::BagError;

/// VM instructions between two calls of the progress handler.
const OPS_PER_CALL: i32 = 10_000;
/// Work any statement may do whatever the file's size (about 0.1 s): schema lookups, a
/// seek, an empty table.
const BASE_OPS: u64 = 20_000_000;
/// Work per byte of the file (and its WAL). Reading a row costs some 50 instructions and a
/// row takes at least some 20 bytes on disk, so a full read needs about 3 per byte.
const OPS_PER_BYTE: u64 = 64;
/// The smallest length limit, for tiny files: SQL text and small computed values.
const MIN_LENGTH: u64 = 1 << 20;
/// SQLite's own default and upper bound for SQLITE_LIMIT_LENGTH.
const MAX_LENGTH: u64 = 1_000_000_000;

/// The tables rosbag2 defines; each one a split has must be a real table.
const ROSBAG2_TABLES: &str = "('messages', 'topics', 'schema', 'metadata', 'message_definitions')";

/// The work a connection's statements may still do; see [`Budget::recharge`].
#[derive(Clone, Debug)]
pub struct Budget {
    left: Arc<AtomicU64>,
    /// The file does not change while read (no recorder holds its bag): its size bounds
    /// every value in it. A live split's size is only a snapshot (a checkpoint moves pages
    /// from its `-wal` into it between two `stat`s), so it gets SQLite's default length
    /// limit; its tables are checked all the same.
    fixed: bool,
    /// The size of the SQLite file when `path` is not it: a compressed split read through
    /// its decompressed copy (unlinked once open) is bounded by the copy's size, not by the
    /// `.zstd`'s, which may be 20 times smaller.
    size: Option<u64>,
}

impl Budget {
    /// Refill the budget for the next statement(s) and set the length limit from the file's
    /// size now (a live split grows while it is read).
    pub fn recharge(&self, conn: &Connection, path: &Path) {
        let size = self
            .size
            .unwrap_or_else(|| file_len(path) + file_len(&side(path, "-wal")));
        let ops = BASE_OPS.saturating_add(OPS_PER_BYTE.saturating_mul(size));
        self.left
            .store(ops / OPS_PER_CALL as u64 + 1, Ordering::Relaxed);
        let len = if self.fixed {
            size.clamp(MIN_LENGTH, MAX_LENGTH)
        } else {
            MAX_LENGTH
        };
        // Cannot fail for a valid limit id; the default (1e9) would then stay.
        let _ = conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, len as i32);
    }
}

fn side(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Harden `conn` (opened on `path`) as described in the module documentation, and check
/// its rosbag2 tables. An error here means the file is hostile, not damaged.
/// `fixed`: the file does not change while it is read (see [`Budget`]).
pub fn harden(conn: &mut Connection, path: &Path, fixed: bool) -> Result<Budget, BagError> {
    harden_sized(conn, path, fixed, None)
}

/// [`harden`] of a connection to a file of `size` bytes other than `path` (the decompressed
/// copy of the compressed split `path`); None = `path`'s own size.
pub fn harden_sized(
    conn: &mut Connection,
    path: &Path,
    fixed: bool,
    size: Option<u64>,
) -> Result<Budget, BagError> {
    let budget = limit_sized(conn, path, fixed, size)?;
    check_tables(conn, path)?;
    check_sizes(conn, path)?;
    Ok(budget)
}

/// The limits of [`harden`] without the table check (for a salvage, which reads what it
/// can of a split already checked).
pub fn limit(conn: &mut Connection, path: &Path, fixed: bool) -> Result<Budget, BagError> {
    limit_sized(conn, path, fixed, None)
}

fn limit_sized(
    conn: &mut Connection,
    path: &Path,
    fixed: bool,
    size: Option<u64>,
) -> Result<Budget, BagError> {
    let sqlite = BagError::sqlite(path);
    conn.pragma_update(None, "trusted_schema", false)
        .map_err(sqlite)?;
    let budget = Budget {
        left: Arc::new(AtomicU64::new(0)),
        fixed,
        size,
    };
    let left = Arc::clone(&budget.left);
    conn.progress_handler(
        OPS_PER_CALL,
        Some(move || {
            // true interrupts the statement: the budget is spent.
            left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_err()
        }),
    )
    .map_err(BagError::sqlite(path))?;
    budget.recharge(conn, path);
    Ok(budget)
}

/// Refuse `path` if it is hostile (its rosbag2 tables are not real tables): an
/// [`BagError::Invalid`] naming it. A file SQLite cannot read at all is no concern here.
pub fn refuse_hostile(path: &Path) -> Result<(), BagError> {
    let Ok(mut conn) = Connection::open_with_flags(
        super::fsguard::sqlite_ro_uri(path, true),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
            | rusqlite::OpenFlags::SQLITE_OPEN_URI
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) else {
        return Ok(());
    };
    match harden(&mut conn, path, true) {
        Err(e @ BagError::Invalid { .. }) => Err(e),
        _ => Ok(()),
    }
}

/// Refuse a split whose rosbag2 tables are views, virtual tables, or have generated
/// columns: reading any of those runs code the file chose. Only the schema is looked at.
pub fn check_tables(conn: &Connection, path: &Path) -> Result<(), BagError> {
    // One statement (preparing is most of what opening a small split costs).
    let (odd, generated): (Option<String>, Option<String>) = conn
        .query_row(
            &format!(
                "SELECT (SELECT '`' || name || '` is a ' || \
                   CASE WHEN type = 'view' THEN 'view' ELSE 'virtual table' END \
                   FROM sqlite_master WHERE lower(name) IN {ROSBAG2_TABLES} \
                   AND (type = 'view' OR (type = 'table' AND rootpage = 0)) LIMIT 1), \
                 (SELECT t FROM (SELECT 'messages' AS t UNION ALL SELECT 'topics') \
                   WHERE EXISTS (SELECT 1 FROM pragma_table_xinfo(t) WHERE hidden IN (2, 3)) \
                   LIMIT 1)"
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(BagError::sqlite(path))?;
    if let Some(what) = odd {
        return Err(BagError::invalid(
            path,
            format!("{what}, not a table: not a rosbag2 split; not read"),
        ));
    }
    if let Some(table) = generated {
        return Err(BagError::invalid(
            path,
            format!(
                "`{table}` has generated columns (computed on every read): not a rosbag2 \
                 split; not read"
            ),
        ));
    }
    Ok(())
}

/// The longest topic name, type, serialization format or type hash read from a split, in
/// characters. ROS 2 names are far shorter; this only bounds a hostile row.
pub const MAX_TOPIC_FIELD: usize = 4096;
/// The longest QoS profile text or message definition read from a split, in characters.
pub const MAX_TOPIC_TEXT: usize = 4 << 20;
/// The most topics (or message definitions) read from one split.
pub const MAX_TOPICS: usize = 100_000;
/// The most text all topic rows of one split may hold together, in characters.
pub const MAX_TOPICS_TOTAL: usize = 64 << 20;

/// `SELECT` expression for a text column read at most `max` characters long (one more, so
/// that the reader can tell a longer value apart): SQLite never hands over more. It still
/// loads the whole value to cut it, so [`harden`] measured every one first ([`check_sizes`]).
pub fn bounded(column: &str, max: usize) -> String {
    format!("substr({column}, 1, {})", max + 1)
}

/// What every split reads of `topics` and `message_definitions`: (table, [(column, most
/// characters)]).
const SIZED: [(&str, &[(&str, usize)]); 2] = [
    (
        "topics",
        &[
            ("name", MAX_TOPIC_FIELD),
            ("type", MAX_TOPIC_FIELD),
            ("serialization_format", MAX_TOPIC_FIELD),
            ("offered_qos_profiles", MAX_TOPIC_TEXT),
            ("type_description_hash", MAX_TOPIC_FIELD),
        ],
    ),
    (
        "message_definitions",
        &[
            ("topic_type", MAX_TOPIC_FIELD),
            ("encoding", MAX_TOPIC_FIELD),
            ("encoded_message_definition", MAX_TOPIC_TEXT),
            ("type_description_hash", MAX_TOPIC_FIELD),
        ],
    ),
];

/// The words every refusal of a hostile split ends with; see [`is_hostile`].
pub const HOSTILE: &str = "not a rosbag2 split; not read";

/// True when `e` refuses a split as hostile (by [`harden`], [`check_len`] or a row count),
/// not as damaged: a tolerant reader stops at it rather than leaving the split out.
pub fn is_hostile(e: &BagError) -> bool {
    matches!(e, BagError::Invalid { .. }) && e.to_string().ends_with(HOSTILE)
}

/// Refuse a split whose `topics` or `message_definitions` has more than [`MAX_TOPICS`]
/// rows, a value longer than its limit allows (in bytes: 4 per character) or more than
/// [`MAX_TOPICS_TOTAL`] bytes in all, before any of their values is read: `octet_length`
/// of a column takes the length from the record header without loading the value, and
/// `LIMIT` bounds the rows looked at. (`substr` of a 300 MB value loads all 300 MB first.)
/// The exact limits in characters are checked on the values read ([`check_len`]).
pub fn check_sizes(conn: &Connection, path: &Path) -> Result<(), BagError> {
    for (table, columns) in SIZED {
        let present: Vec<String> = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(BagError::sqlite(path))?;
        let cols: Vec<(&str, usize)> = columns
            .iter()
            .copied()
            .filter(|(c, _)| present.iter().any(|p| p == c))
            .collect();
        if cols.is_empty() {
            continue;
        }
        // Per column the longest value, then the row count and the sum of all lengths.
        let inner: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, (c, _))| format!("coalesce(octet_length(\"{c}\"), 0) AS c{i}"))
            .collect();
        let outer: Vec<String> = (0..cols.len()).map(|i| format!("max(c{i})")).collect();
        let sum: Vec<String> = (0..cols.len()).map(|i| format!("c{i}")).collect();
        let sql = format!(
            "SELECT {}, count(*), coalesce(sum({}), 0) FROM (SELECT {} FROM \"{table}\" LIMIT {})",
            outer.join(", "),
            sum.join(" + "),
            inner.join(", "),
            MAX_TOPICS + 1
        );
        let got: Vec<i64> = conn
            .query_row(&sql, [], |r| {
                (0..cols.len() + 2)
                    .map(|i| Ok(r.get::<_, Option<i64>>(i)?.unwrap_or(0)))
                    .collect()
            })
            .map_err(BagError::sqlite(path))?;
        let refuse = |what: String| Err(BagError::invalid(path, format!("{what}: {HOSTILE}")));
        for (i, (c, max)) in cols.iter().enumerate() {
            if got[i] as u64 > 4 * *max as u64 {
                return refuse(format!(
                    "`{table}`.{c} holds a value longer than {max} characters"
                ));
            }
        }
        if got[cols.len()] as usize > MAX_TOPICS {
            return refuse(format!("`{table}` has more than {MAX_TOPICS} rows"));
        }
        if got[cols.len() + 1] as u64 > MAX_TOPICS_TOTAL as u64 {
            return refuse(format!(
                "`{table}` holds more than {} MiB of text",
                MAX_TOPICS_TOTAL >> 20
            ));
        }
    }
    Ok(())
}

/// Check one text value read through [`bounded`].
pub fn check_len(
    path: &Path,
    what: &str,
    value: &str,
    max: usize,
    total: &mut usize,
) -> Result<(), BagError> {
    let n = value.chars().count();
    *total += value.len();
    if n > max {
        return Err(BagError::invalid(
            path,
            format!("{what} is longer than {max} characters: not a rosbag2 split; not read"),
        ));
    }
    if *total > MAX_TOPICS_TOTAL {
        return Err(BagError::invalid(
            path,
            format!(
                "its topics hold more than {} MiB of text: not a rosbag2 split; not read",
                MAX_TOPICS_TOTAL >> 20
            ),
        ));
    }
    Ok(())
}

/// True when `e` is SQLite stopping a statement for [`harden`]'s limits.
pub fn is_limit(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::OperationInterrupted | rusqlite::ErrorCode::TooBig)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(dir: &Path, sql: &str) -> std::path::PathBuf {
        let p = dir.join("x_0.db3");
        let _ = std::fs::remove_file(&p);
        let c = Connection::open(&p).unwrap();
        c.execute_batch(sql).unwrap();
        p
    }

    fn open(p: &Path) -> Connection {
        Connection::open_with_flags(p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
    }

    #[test]
    fn views_virtual_tables_and_generated_columns_are_refused_real_tables_pass() {
        let d = tempfile::tempdir().unwrap();
        let real = "CREATE TABLE topics(id INTEGER PRIMARY KEY, name TEXT); \
                    CREATE TABLE messages(id INTEGER PRIMARY KEY, data BLOB);";
        let p = db(d.path(), real);
        harden(&mut open(&p), &p, true).unwrap();
        for (sql, want) in [
            (
                "CREATE TABLE t(id); CREATE VIEW Topics AS SELECT * FROM t;",
                "`Topics` is a view, not a table",
            ),
            (
                "CREATE VIRTUAL TABLE messages USING fts5(data);",
                "`messages` is a virtual table, not a table",
            ),
            (
                "CREATE TABLE messages(id INTEGER PRIMARY KEY, \
                 data BLOB AS (zeroblob(900000000)));",
                "`messages` has generated columns",
            ),
        ] {
            let p = db(d.path(), sql);
            let e = harden(&mut open(&p), &p, true).unwrap_err().to_string();
            assert!(e.contains(want), "{sql}: {e}");
        }
    }

    #[test]
    fn no_statement_runs_away_or_builds_a_value_longer_than_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = db(
            d.path(),
            "CREATE TABLE messages(id INTEGER PRIMARY KEY, data BLOB);",
        );
        let mut c = open(&p);
        let budget = harden(&mut c, &p, true).unwrap();
        let started = std::time::Instant::now();
        let e = c
            .query_row(
                "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) \
                 SELECT count(*) FROM r",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert!(is_limit(&e), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        // A recharge makes room for the next statement.
        budget.recharge(&c, &p);
        let e = c
            .query_row("SELECT length(zeroblob(2000000))", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_err();
        assert!(is_limit(&e), "{e}");
        let n: i64 = c
            .query_row("SELECT length(zeroblob(1000))", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1000);
    }
}
