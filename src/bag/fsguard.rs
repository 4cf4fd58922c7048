//! Guards for opening files named by a bag directory or its metadata.yaml.
//!
//! A bag is input: its directory may hold a FIFO, a socket or a device under a split's or
//! metadata.yaml's name, and its metadata.yaml may name any path. `open(2)` on a FIFO blocks
//! until a writer appears, so every file a reader, `reindex` or `--recover` opens is checked
//! here first: regular files only, and metadata entries only inside the bag directory.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path};

use super::BagError;

/// What a non-regular file is, for the error message.
pub fn kind(ft: &fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

fn not_regular(path: &Path, ft: &fs::FileType) -> BagError {
    BagError::invalid(
        path,
        format!("is {}, not a regular file; not opened", kind(ft)),
    )
}

/// Succeeds only when `path` (following symlinks) is a regular file. `stat` never blocks,
/// so this is safe on a FIFO; the caller may then open the file.
pub fn require_regular(path: &Path) -> Result<fs::Metadata, BagError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(m),
        Ok(m) => Err(not_regular(path, &m.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(BagError::NotFound {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(BagError::io(path)(e)),
    }
}

/// True when `path` exists and is something a split may not be (FIFO, socket, device).
/// Directories are not splits either, but are simply not counted as one.
pub fn is_special(ft: &fs::FileType) -> bool {
    !ft.is_file() && !ft.is_dir() && !ft.is_symlink()
}

/// The special-file error for a `.db3` name that is not a regular file or directory.
pub fn special_split(path: &Path, ft: &fs::FileType) -> BagError {
    not_regular(path, ft)
}

/// SQLite opens `<split>-wal`, `-journal` and `-shm` on its own; any of them that exists
/// must be a regular file too, or SQLite would block opening it.
pub fn check_side_files(split: &Path) -> Result<(), BagError> {
    for suffix in ["-wal", "-journal", "-shm"] {
        let mut s = split.as_os_str().to_owned();
        s.push(suffix);
        let side = Path::new(&s);
        match fs::metadata(side) {
            Ok(m) if !m.is_file() => return Err(not_regular(side, &m.file_type())),
            _ => {}
        }
    }
    Ok(())
}

/// Why [`read_regular_text`] did not return the text.
#[derive(Debug)]
pub enum TextError {
    Bag(BagError),
    /// Larger than the bound (its size in bytes, or the bound + 1 if it grew while read).
    TooLarge(u64),
}

impl From<BagError> for TextError {
    fn from(e: BagError) -> Self {
        TextError::Bag(e)
    }
}

/// Read a small text file the bag names (metadata.yaml), of at most `max` bytes, without
/// ever blocking: opened with `O_NONBLOCK | O_NOFOLLOW` (a FIFO opens at once instead of
/// waiting for a writer, a symlink is refused), then `fstat` says whether what was opened is
/// a regular file and how large. Only then is it read; `O_NONBLOCK` has no effect on reads
/// of a regular file.
pub fn read_regular_text(path: &Path, max: u64) -> Result<String, TextError> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BagError::NotFound {
                path: path.to_path_buf(),
            },
            _ if e.raw_os_error() == Some(libc::ELOOP) => {
                BagError::invalid(path, "is a symbolic link; not followed")
            }
            _ => BagError::io(path)(e),
        })?;
    let m = f.metadata().map_err(BagError::io(path))?;
    if !m.is_file() {
        return Err(not_regular(path, &m.file_type()).into());
    }
    if m.len() > max {
        return Err(TextError::TooLarge(m.len()));
    }
    let mut text = String::new();
    // Bounded also while reading: the file may grow after the fstat.
    f.take(max + 1)
        .read_to_string(&mut text)
        .map_err(BagError::io(path))?;
    if text.len() as u64 > max {
        return Err(TextError::TooLarge(max + 1));
    }
    Ok(text)
}

/// Why a path listed in metadata.yaml may not be opened, if it may not: only paths inside
/// the bag directory are, so an absolute path or any `..` component is refused. (rosbag2
/// before metadata version 4 wrote `<bag dir name>/<file>`, which stays inside.)
pub fn listed_path_problem(rel: &str) -> Option<&'static str> {
    if rel.is_empty() {
        return Some("is empty");
    }
    let p = Path::new(rel);
    if p.is_absolute() {
        return Some("is an absolute path; only files inside the bag directory are read");
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Some("leaves the bag directory (`..`); only files inside it are read");
    }
    None
}

/// A `file:` URI for SQLite (opened with `SQLITE_OPEN_URI`): read-only, and `immutable=1`
/// when the caller knows no process writes the file (SQLite then takes no locks and never
/// looks for or creates `-wal`/`-shm`). Bytes outside the unreserved set are %-escaped so
/// that `?`, `#` and `%` in a path stay part of it.
pub fn sqlite_ro_uri(path: &Path, immutable: bool) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    let bytes = path.as_os_str().as_bytes();
    if bytes.first() == Some(&b'/') {
        // An empty authority, so that a path starting with `//` is not taken for a host.
        uri.push_str("//");
    }
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?mode=ro");
    if immutable {
        uri.push_str("&immutable=1");
    }
    uri
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_paths_must_stay_inside_the_bag() {
        assert_eq!(listed_path_problem("b_0.db3"), None);
        assert_eq!(listed_path_problem("b/b_0.db3"), None);
        assert_eq!(listed_path_problem("./b_0.db3"), None);
        assert!(listed_path_problem("../outside_0.db3").is_some());
        assert!(listed_path_problem("b/../../x_0.db3").is_some());
        assert!(listed_path_problem("/etc/passwd").is_some());
        assert!(listed_path_problem("").is_some());
    }

    #[test]
    fn uris_escape_what_sqlite_would_parse() {
        assert_eq!(
            sqlite_ro_uri(Path::new("/a b/x?y#%_0.db3"), true),
            "file:///a%20b/x%3Fy%23%25_0.db3?mode=ro&immutable=1"
        );
        assert_eq!(
            sqlite_ro_uri(Path::new("r_0.db3"), false),
            "file:r_0.db3?mode=ro"
        );
    }

    #[test]
    fn a_fifo_is_neither_read_nor_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("metadata.yaml");
        nix::unistd::mkfifo(&f, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = match read_regular_text(&f, 1 << 20).unwrap_err() {
            TextError::Bag(e) => e.to_string(),
            TextError::TooLarge(n) => panic!("{n}"),
        };
        assert!(
            e.ends_with("metadata.yaml: is a FIFO, not a regular file; not opened"),
            "{e}"
        );
        let e = require_regular(&f).unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
    }
}
