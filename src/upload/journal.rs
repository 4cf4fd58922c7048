//! The per-bag upload journal: `<bag>/.ringbag-upload.json`.
//!
//! A dot-file, so rosbag2, `ringbag info` and `reindex` ignore it. It records, per file of the
//! bag: the object key, the identity of the file that was uploaded (size, mtime, inode), the
//! multipart upload id with its part size and the parts done (number → MD5 and ETag), and
//! whether the object was verified in the bucket (HEAD: size and ETag).
//!
//! It is replaced atomically (temp file, fsync, rename, fsync of the directory) after every
//! part and every file, so after a kill -9 or a power cut it holds either the state before or
//! after a step, never a torn mix. It is a cache of what the server knows: a journal that
//! cannot be read is renamed aside and the state is rebuilt from the server (HEAD,
//! ListMultipartUploads, ListParts), never trusted blindly.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::UploadError;

pub const JOURNAL_FILE: &str = ".ringbag-upload.json";
const VERSION: u32 = 1;

/// The identity of a closed file: if any of these differ, it is not the file we uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub size: u64,
    pub mtime_ns: i64,
    pub inode: u64,
}

impl FileIdentity {
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        let m = fs::metadata(path)?;
        Ok(FileIdentity {
            size: m.len(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            inode: m.ino(),
        })
    }
}

/// A part the server acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartDone {
    /// Hex MD5 of the part's bytes (what its Content-MD5 said).
    pub md5: String,
    /// The ETag the server answered.
    pub etag: String,
}

/// One file of the bag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub key: String,
    pub identity: FileIdentity,
    /// Hex MD5 of the whole content, for files compared by content (metadata.yaml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_md5: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    #[serde(default)]
    pub part_size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<u32, PartDone>,
    /// The ETag the object must have (single PUT: the MD5; multipart: `md5-of-md5s-N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Verified in the bucket by HEAD (size and ETag).
    #[serde(default)]
    pub done: bool,
    /// Unix milliseconds when this file was verified (the order uploads finished in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_unix_ms: Option<u64>,
    /// Unix milliseconds when the multipart upload was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ms: Option<u64>,
}

impl FileEntry {
    pub fn new(key: String, identity: FileIdentity) -> FileEntry {
        FileEntry {
            key,
            identity,
            content_md5: None,
            upload_id: None,
            part_size: 0,
            parts: BTreeMap::new(),
            etag: None,
            done: false,
            done_unix_ms: None,
            started_unix_ms: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    /// By file name inside the bag.
    pub files: BTreeMap<String, FileEntry>,
    /// Files retention deleted before they got out (forced by the budget): the bag's own
    /// record of what is missing from the bucket. Absent in journals of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_before_upload: Vec<DeletedFile>,
}

/// A file deleted before it was uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedFile {
    pub file: String,
    pub bytes: u64,
    pub unix_ms: u64,
}

impl Journal {
    /// Record that `file` (`bytes`) was deleted before it got out. Its entry stays: the
    /// sweep for abandoned uploads aborts a journaled upload whose file is gone.
    pub fn note_deleted_before_upload(&mut self, file: &str, bytes: u64, unix_ms: u64) {
        self.deleted_before_upload.push(DeletedFile {
            file: file.to_string(),
            bytes,
            unix_ms,
        });
    }
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            version: VERSION,
            files: BTreeMap::new(),
            deleted_before_upload: Vec::new(),
        }
    }
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    pub journal: Journal,
    /// The journal existed but could not be read; it was moved here and the server is the
    /// only source of truth for this bag.
    pub set_aside: Option<PathBuf>,
}

pub fn path_in(bag: &Path) -> PathBuf {
    bag.join(JOURNAL_FILE)
}

impl Journal {
    /// Load the journal of `bag`: empty when there is none; a journal that cannot be parsed
    /// (torn by a disk fault, edited by hand) is renamed aside with a warning, not fatal.
    pub fn load(bag: &Path) -> Result<Loaded, UploadError> {
        let path = path_in(bag);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    journal: Journal::default(),
                    set_aside: None,
                })
            }
            Err(e) => return Err(UploadError::io(&path)(e)),
        };
        match serde_json::from_slice::<Journal>(&text) {
            Ok(j) if j.version == VERSION => Ok(Loaded {
                journal: j,
                set_aside: None,
            }),
            other => {
                let why = match other {
                    Ok(j) => format!("unknown version {}", j.version),
                    Err(e) => e.to_string(),
                };
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let aside = bag.join(format!("{JOURNAL_FILE}.corrupt-{stamp}"));
                fs::rename(&path, &aside).map_err(UploadError::io(&path))?;
                log::warn!(
                    "{}: unreadable upload journal ({why}); moved to {}; reconciling with the bucket",
                    path.display(),
                    aside.display()
                );
                Ok(Loaded {
                    journal: Journal::default(),
                    set_aside: Some(aside),
                })
            }
        }
    }

    /// Replace the journal of `bag` atomically and durably.
    pub fn save(&self, bag: &Path) -> Result<(), UploadError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| UploadError::Journal {
            path: path_in(bag),
            detail: e.to_string(),
        })?;
        crate::bag::metadata::write_file_atomic(bag, JOURNAL_FILE, &bytes).map_err(|e| {
            UploadError::Journal {
                path: path_in(bag),
                detail: e.to_string(),
            }
        })
    }
}

pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Journal {
        let mut j = Journal::default();
        let mut e = FileEntry::new(
            "ringbag/r/b/b_0.db3".into(),
            FileIdentity {
                size: 40 << 20,
                mtime_ns: 1_700_000_000_123_456_789,
                inode: 42,
            },
        );
        e.upload_id = Some("up-1".into());
        e.part_size = 16 << 20;
        e.parts.insert(
            1,
            PartDone {
                md5: "00112233445566778899aabbccddeeff".into(),
                etag: "\"00112233445566778899aabbccddeeff\"".into(),
            },
        );
        j.files.insert("b_0.db3".into(), e);
        let mut m = FileEntry::new(
            "ringbag/r/b/metadata.yaml".into(),
            FileIdentity {
                size: 900,
                mtime_ns: 5,
                inode: 43,
            },
        );
        m.content_md5 = Some("ffeeddccbbaa99887766554433221100".into());
        m.done = true;
        m.done_unix_ms = Some(1234);
        j.files.insert("metadata.yaml".into(), m);
        j
    }

    #[test]
    fn a_journal_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let j = sample();
        j.save(dir.path()).unwrap();
        let loaded = Journal::load(dir.path()).unwrap();
        assert!(loaded.set_aside.is_none());
        assert_eq!(loaded.journal, j);
        // No temp file is left beside it.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [JOURNAL_FILE]);
    }

    #[test]
    fn a_missing_journal_is_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = Journal::load(dir.path()).unwrap();
        assert_eq!(loaded.journal, Journal::default());
        assert!(loaded.set_aside.is_none());
    }

    #[test]
    fn a_corrupt_journal_is_set_aside_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = serde_json::to_vec(&sample()).unwrap();
        bytes.truncate(bytes.len() / 2);
        fs::write(path_in(dir.path()), &bytes).unwrap();
        let loaded = Journal::load(dir.path()).unwrap();
        assert_eq!(loaded.journal, Journal::default());
        let aside = loaded.set_aside.expect("set aside");
        assert_eq!(fs::read(&aside).unwrap(), bytes, "kept for a post-mortem");
        assert!(!path_in(dir.path()).exists());
        // A journal of a future version is not guessed at either.
        fs::write(path_in(dir.path()), br#"{"version":9,"files":{}}"#).unwrap();
        assert!(Journal::load(dir.path()).unwrap().set_aside.is_some());
    }
}
