//! Splits compressed whole by rosbag2's file mode (`--compression-mode file
//! --compression-format zstd`): `<name>_<N>.db3.zstd`, one zstd stream of the whole `.db3`,
//! listed under that name in metadata.yaml's `relative_file_paths` and `files[].path`, with
//! `compression_format: zstd` and `compression_mode: FILE`.
//!
//! SQLite needs a file, so a compressed split is read through a decompressed copy. rosbag2
//! writes that copy beside the `.zstd` (in the bag directory); ringbag's readers never write
//! in a bag (a bag in a read-only directory reads, and reading never races a recorder or an
//! uploader over the directory's files), so the copy goes to a private file in [`scratch_dir`],
//! streamed through a fixed-size buffer so memory stays bounded whatever the split's size. The copy is unlinked as soon as SQLite has opened it:
//! the connection's descriptor keeps it alive, and nothing is left behind when the reader
//! ends or is killed (bar the instant between the copy and the open).

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::BagError;

/// The suffix rosbag2's zstd plugin appends to a compressed split (its compression identifier).
pub const ZSTD_SUFFIX: &str = ".zstd";

/// What metadata.yaml's `compression_format` says for zstd.
pub const ZSTD_FORMAT: &str = "zstd";

/// True when `path` names a zstd-compressed split (`….db3.zstd`).
pub fn is_zstd(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.ends_with(".db3.zstd"))
}

/// Where decompressed copies go: `TMPDIR` when set, else `/var/tmp`, else `/tmp`. Not `/tmp`
/// first: on many systems (Jetson images included) it is a tmpfs, where a copy of a split of
/// gigabytes would take that much RAM; `/var/tmp` is on disk by convention (FHS). Copies are
/// unlinked at once, so its persistence across reboots never matters.
pub fn scratch_dir() -> PathBuf {
    match std::env::var_os("TMPDIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None if Path::new("/var/tmp").is_dir() => PathBuf::from("/var/tmp"),
        None => PathBuf::from("/tmp"),
    }
}

/// A decompressed copy of a compressed split, removed when dropped (so also when the
/// decompression or the open fails half-way).
#[derive(Debug)]
pub struct Decompressed {
    pub path: PathBuf,
}

impl Drop for Decompressed {
    fn drop(&mut self) {
        // Already unlinked after a successful open: NotFound is the normal case.
        let _ = fs::remove_file(&self.path);
    }
}

/// Decompress `src` (a `.db3.zstd`) into a fresh private file (mode 0600, created exclusively)
/// in [`scratch_dir`]. A truncated or corrupt stream is an `Invalid` error naming
/// `src`, so a tolerant reader leaves the split out with one warning.
pub fn decompress(src: &Path) -> Result<Decompressed, BagError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let input = fs::File::open(src).map_err(BagError::io(src))?;
    let name = src
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(ZSTD_SUFFIX))
        .unwrap_or("split.db3");
    let dir = scratch_dir();
    let path = dir.join(format!(
        ".ringbag-{}-{}-{name}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(BagError::io(&path))?;
    let out = Decompressed { path };
    // A zstd reader over a buffered file: the window (at most 128 MiB for level 19 streams,
    // 8 MiB and less at the levels rosbag2 and ringbag write) plus 128 KiB of buffers.
    let mut decoder = zstd::stream::read::Decoder::new(input).map_err(BagError::io(src))?;
    match io::copy(&mut decoder, &mut output) {
        Ok(_) => Ok(out),
        // Write errors name the temporary copy (ENOSPC in TMPDIR is not the bag's fault).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
            Err(BagError::io(out.path.clone())(e))
        }
        Err(e) => Err(BagError::invalid(
            src,
            format!("cannot be decompressed (zstd): {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decompresses_a_whole_file_stream_and_removes_the_copy_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("b_0.db3.zstd");
        let plain: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        fs::write(&src, zstd::encode_all(&plain[..], 3).unwrap()).unwrap();
        let d = decompress(&src).unwrap();
        assert_eq!(fs::read(&d.path).unwrap(), plain);
        assert!(d.path.starts_with(scratch_dir()));
        assert!(d.path.to_str().unwrap().ends_with("b_0.db3"));
        let p = d.path.clone();
        drop(d);
        assert!(!p.exists());
    }

    #[test]
    fn a_truncated_stream_is_invalid_naming_the_split_and_leaves_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("b_1.db3.zstd");
        let plain: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let z = zstd::encode_all(&plain[..], 1).unwrap();
        fs::write(&src, &z[..z.len() / 2]).unwrap();
        let e = decompress(&src).unwrap_err();
        assert!(matches!(e, BagError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains("b_1.db3.zstd"), "{e}");
        assert_eq!(leftovers("b_1.db3"), 0);
        fs::write(&src, b"not zstd at all").unwrap();
        assert!(matches!(
            decompress(&src).unwrap_err(),
            BagError::Invalid { .. }
        ));
    }

    /// This process's copies of splits named `name`.
    fn leftovers(name: &str) -> usize {
        let me = format!(".ringbag-{}-", std::process::id());
        fs::read_dir(scratch_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&me) && n.ends_with(name))
            .count()
    }

    #[test]
    fn recognises_compressed_split_names() {
        assert!(is_zstd(Path::new("/b/b_0.db3.zstd")));
        assert!(!is_zstd(Path::new("/b/b_0.db3")));
        assert!(!is_zstd(Path::new("/b/x.zstd")));
    }
}
