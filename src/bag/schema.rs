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
/// See the README's durability table.
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

/// Page size chosen by measurement (`scripts/bench.sh` sweeps 4, 16 and 64 KiB with the bare
/// loop): 4 KiB wrote 1 MiB messages fastest in each of three runs (e.g. 959 vs 841 vs
/// 856 MB/s) and 100 B messages within noise of the others; it also keeps an empty split at
/// 24 KiB, far below rosbag2's 86016-byte minimum split size. It is SQLite's default, set
/// explicitly so a build with another default cannot change the files.
pub const WRITE_OPTIMIZED_PAGE_SIZE: u32 = 4096;
/// Page cache for the writer, KiB. Holds the right-most b-tree paths and a batch of index
/// pages; more does not help an append-only workload.
pub const WRITE_OPTIMIZED_CACHE_KIB: u32 = 8 * 1024;

impl StoragePreset {
    /// Pragmas that must run before the first table is created (page size).
    pub fn create_pragmas(self) -> String {
        match self {
            StoragePreset::WriteOptimized => {
                format!("PRAGMA page_size={WRITE_OPTIMIZED_PAGE_SIZE};")
            }
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
