//! Errors of the bag format layer. Every variant names the file it is about, so the binary
//! can print one line that says where and what.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BagError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: {}", sqlite_message(.source))]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: already exists; choose another output (ros2 bag refuses to overwrite too)")]
    AlreadyExists { path: PathBuf },
    #[error(
        "{path}: storage `{storage}` is not supported (ringbag reads and writes sqlite3 only)"
    )]
    UnsupportedStorage { path: PathBuf, storage: String },
    #[error("{path}: another ringbag process is writing this bag (its lock is held); left alone")]
    Busy { path: PathBuf },
    #[error("{path}: writer stopped after an earlier error: {reason}")]
    Failed { path: PathBuf, reason: String },
}

impl BagError {
    pub(crate) fn sqlite(path: impl Into<PathBuf>) -> impl FnOnce(rusqlite::Error) -> BagError {
        let path = path.into();
        move |source| BagError::Sqlite { path, source }
    }
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> BagError {
        let path = path.into();
        move |source| BagError::Io { path, source }
    }
    pub(crate) fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> BagError {
        BagError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
    /// True when a file could not be opened because the process (EMFILE) or the system
    /// (ENFILE) has no file descriptor left: a failure of the machine, never of the input.
    pub fn is_out_of_descriptors(&self) -> bool {
        matches!(self, BagError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
    }
    /// True when the underlying cause is a full disk (ENOSPC or SQLITE_FULL).
    pub fn is_disk_full(&self) -> bool {
        match self {
            BagError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            BagError::Sqlite { source, .. } => {
                source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
            }
            BagError::Failed { reason, .. } => reason.contains("disk is full"),
            _ => false,
        }
    }
}

/// SQLite's own messages are terse ("file is not a database"); say what it means for a bag.
fn sqlite_message(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => {
            "not a SQLite database (or its header is damaged)".into()
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            "database is damaged (run `ringbag reindex` to salvage it)".into()
        }
        Some(rusqlite::ErrorCode::DiskFull) => "disk is full (SQLITE_FULL)".into(),
        // Only the limits of `sqlguard` interrupt a reader's statements.
        Some(rusqlite::ErrorCode::OperationInterrupted) => {
            "a query did far more work than a file of this size can need (a hostile schema?); \
             stopped"
                .into()
        }
        Some(rusqlite::ErrorCode::TooBig) => {
            "a value longer than the file itself (computed by a hostile schema?); not read".into()
        }
        _ => e.to_string(),
    }
}
