//! Errors of the bag format layer. Every variant names the file it is about.
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
}
