//! SQLite layout of a rosbag2 split and the storage presets (pragmas).
//!
//! The DDL strings are the ones rosbag2 executes, so `sqlite3 x.db3 .schema` prints the same
//! text for our files as for theirs (checked against the reference bags in tests).

use rusqlite::Connection;

use super::Flavour;

pub const CREATE_SCHEMA: &str =
    "CREATE TABLE schema(schema_version INTEGER PRIMARY KEY,ros_distro TEXT NOT NULL);";
pub const CREATE_METADATA: &str =
    "CREATE TABLE metadata(id INTEGER PRIMARY KEY,metadata_version INTEGER NOT NULL,metadata TEXT NOT NULL);";
pub const CREATE_TOPICS_V3: &str = "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL);";
pub const CREATE_TOPICS_V4: &str = "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL,type_description_hash TEXT NOT NULL);";
pub const CREATE_MESSAGE_DEFINITIONS: &str = "CREATE TABLE message_definitions(id INTEGER PRIMARY KEY,topic_type TEXT NOT NULL,encoding TEXT NOT NULL,encoded_message_definition TEXT NOT NULL,type_description_hash TEXT NOT NULL);";
pub const CREATE_MESSAGES: &str = "CREATE TABLE messages(id INTEGER PRIMARY KEY,topic_id INTEGER NOT NULL,timestamp INTEGER NOT NULL, data BLOB NOT NULL);";
pub const CREATE_TIMESTAMP_INDEX: &str = "CREATE INDEX timestamp_idx ON messages (timestamp ASC);";

/// Create the tables of an empty split, in rosbag2's order.
pub fn create_tables(conn: &Connection, flavour: Flavour) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE_SCHEMA)?;
    conn.execute(
        "INSERT INTO schema (schema_version, ros_distro) VALUES (?1, ?2)",
        rusqlite::params![flavour.schema_version(), flavour.distro()],
    )?;
    conn.execute_batch(CREATE_METADATA)?;
    match flavour {
        Flavour::Humble => conn.execute_batch(CREATE_TOPICS_V3)?,
        Flavour::Jazzy => {
            conn.execute_batch(CREATE_TOPICS_V4)?;
            conn.execute_batch(CREATE_MESSAGE_DEFINITIONS)?;
        }
    }
    conn.execute_batch(CREATE_MESSAGES)?;
    conn.execute_batch(CREATE_TIMESTAMP_INDEX)
}

/// How a split is written: what a crash or a power cut costs, and what it buys in speed.
/// See the durability table in docs/crash-safety.md.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum StoragePreset {
    /// journal off, no syncs, exclusive lock, large cache and pages. A process crash loses
    /// only the batch in flight; a power cut can tear the open split (salvaged by `reindex`).
    WriteOptimized,
    /// WAL + synchronous=NORMAL: every committed batch survives a crash and a power cut.
    Resilient,
    /// rosbag2's default pragmas (journal in memory, synchronous off), for comparison.
    None,
}

/// SQLite's default page size, and ringbag's for small splits and small messages. An empty
/// split is 6 pages: 24 KiB, far below rosbag2's 86016-byte minimum split size.
pub const SMALL_PAGE_SIZE: u32 = 4096;
/// The page size for large splits of large messages (`write-optimized` only). Measured with
/// the bare loop (`scripts/bench.sh`, blobs bound in place, page cache): 1 MiB messages took
/// 0.13 to 0.15 s of user CPU per GiB at 64 KiB and 16 KiB pages against 0.19 to 0.27 s at
/// 4 KiB (fewer, larger overflow pages: less b-tree bookkeeping per byte); 100 B messages
/// were the same at every size (0.37 to 0.41 s per 10^6). Earlier runs that ended with an
/// fsync hid the difference behind the disk.
pub const LARGE_PAGE_SIZE: u32 = 65536;
/// Large pages only in splits at least this large (or unbounded, `-b 0`): an empty split
/// with them is 384 KiB, and each message may leave up to one page unused, which matters
/// next to small splits and tight budgets, not next to 64 MiB.
pub const LARGE_PAGE_MIN_SPLIT_BYTES: u64 = 64 << 20;
/// ...and only while the messages seen so far average at least this much (the first split,
/// before any message, takes large pages when its size allows).
pub const LARGE_PAGE_MIN_MEAN_MESSAGE_BYTES: u64 = 4096;

/// The page size of the next split: the rule above. `rows`/`bytes` are the messages written
/// so far in the recording. Only `write-optimized` chooses; the other presets keep SQLite's
/// default, as rosbag2's files have.
pub fn choose_page_size(preset: StoragePreset, max_bag_size: u64, rows: u64, bytes: u64) -> u32 {
    let large_split = max_bag_size == 0 || max_bag_size >= LARGE_PAGE_MIN_SPLIT_BYTES;
    let large_messages = rows == 0 || bytes / rows >= LARGE_PAGE_MIN_MEAN_MESSAGE_BYTES;
    if preset == StoragePreset::WriteOptimized && large_split && large_messages {
        LARGE_PAGE_SIZE
    } else {
        SMALL_PAGE_SIZE
    }
}
/// The rollback journal of a split's guarded commits ([`StoragePreset::commits_can_tear`]):
/// a killed commit leaves a hot `-journal` that SQLite (on `reindex`'s read-write open) plays
/// back, restoring the rows committed before. `TRUNCATE` leaves an empty file between commits
/// whatever the locking mode (in `EXCLUSIVE` mode `DELETE` would keep it at full size).
pub const GUARD_JOURNAL_MODE: &str = "truncate";

/// The most a guarded message commit's `-journal` holds (it exists beside the split while the
/// commit runs; the size budget's commit reserve covers it). A rollback journal keeps the old
/// content of each page that existed before the commit and is changed by it; new pages at
/// the end of the file are not journaled, and overflow pages are never rewritten. While the
/// `messages` root is a leaf that is three pages: the header page, that root, and the
/// `timestamp_idx` root, itself still one leaf (an index cell, timestamp and rowid, is
/// smaller than the row's own cell, and all rows fit in the one messages page). A record is
/// the page plus 8 bytes; the header takes one sector (SQLite's unix default, 4 KiB).
/// `tests/it/torn_commit.rs` checks real journals against it.
pub fn guard_journal_bytes(page_size: u64) -> u64 {
    const JOURNALED_PAGES: u64 = 3;
    4096 + JOURNALED_PAGES * (page_size + 8)
}

/// Page cache for the writer, KiB. Holds the right-most b-tree paths and a batch of index
/// pages; more does not help an append-only workload.
pub const WRITE_OPTIMIZED_CACHE_KIB: u32 = 8 * 1024;

impl StoragePreset {
    /// Pragmas that must run before the first table is created: the page size (from
    /// [`choose_page_size`]), which then lives in the file.
    pub fn create_pragmas(self, page_size: u32) -> String {
        match self {
            StoragePreset::WriteOptimized => format!("PRAGMA page_size={page_size};"),
            StoragePreset::Resilient | StoragePreset::None => String::new(),
        }
    }

    /// Pragmas for a connection that writes a split.
    pub fn write_pragmas(self) -> String {
        match self {
            StoragePreset::WriteOptimized => format!(
                "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA locking_mode=EXCLUSIVE; \
                 PRAGMA cache_size=-{WRITE_OPTIMIZED_CACHE_KIB}; PRAGMA temp_store=MEMORY;"
            ),
            StoragePreset::Resilient => {
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;".to_string()
            }
            StoragePreset::None => {
                "PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF;".to_string()
            }
        }
    }

    /// The journal mode of [`write_pragmas`](Self::write_pragmas), which a split returns to
    /// once its first rows are safe (see [`commits_can_tear`](Self::commits_can_tear)).
    pub fn journal_mode(self) -> &'static str {
        match self {
            StoragePreset::WriteOptimized => "off",
            StoragePreset::Resilient => "wal",
            StoragePreset::None => "memory",
        }
    }

    /// Whether a process killed inside a commit leaves the split torn: with the journal off
    /// or in memory nothing can roll the commit back. SQLite then writes a commit's pages in
    /// place, in ascending page order, so the pages that already existed are rewritten before
    /// the new ones at the end of the file exist. For an append-only table that costs only the
    /// rows being committed, except at one moment per table: when its root page, still a
    /// leaf, overflows, SQLite moves the rows an earlier commit put there to a new page at the
    /// end of the file and rewrites the root to point there. A kill in between loses rows the
    /// recorder had already reported committed. The writer therefore runs such a split with
    /// [`GUARD_JOURNAL_MODE`] until its `messages` root is an interior page (and registers
    /// topics the same way), then switches to [`journal_mode`](Self::journal_mode).
    pub fn commits_can_tear(self) -> bool {
        matches!(self, StoragePreset::WriteOptimized | StoragePreset::None)
    }

    /// Whether the preset writes through a WAL (`-wal` and `-shm` files beside the split).
    pub fn uses_wal(self) -> bool {
        matches!(self, StoragePreset::Resilient)
    }

    pub fn name(self) -> &'static str {
        match self {
            StoragePreset::WriteOptimized => "write-optimized",
            StoragePreset::Resilient => "resilient",
            StoragePreset::None => "none",
        }
    }
}
