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

/// rosbag2's zstd level (`kDefaultZstdCompressionLevel`).
pub const DEFAULT_LEVEL: i32 = 1;

/// The suffix of a `.zstd` being written (`.<split>.db3.zstd.partial`): hidden and not a split
/// name, so no reader, uploader or retention takes it for one; `reindex` removes a stale one.
pub const PARTIAL_SUFFIX: &str = ".zstd.partial";

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
    decompress_into(src, &scratch_dir(), SCRATCH_RESERVE)
}

/// What a decompressed copy leaves free on the scratch filesystem: ringbag's default
/// free-space floor (`--min-free-space`). A few KiB of hostile `.zstd` can expand to
/// terabytes, and the scratch directory (/var/tmp) is often on the disk a recorder writes
/// to: reading a bag must never take that disk's last space.
pub const SCRATCH_RESERVE: u64 = 1 << 30;

/// [`decompress`] into `dir`, leaving `reserve` bytes of its filesystem free.
fn decompress_into(src: &Path, dir: &Path, reserve: u64) -> Result<Decompressed, BagError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let input = fs::File::open(src).map_err(BagError::io(src))?;
    let name = src
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(ZSTD_SUFFIX))
        .unwrap_or("split.db3");
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
    // Measured once: the copy may grow to what is free now, less the reserve (plus one byte,
    // which tells "exactly that much" from "more").
    let room = crate::snapshot::ring::available_bytes(&out.path).saturating_sub(reserve);
    match io::copy(&mut io::Read::take(&mut decoder, room + 1), &mut output) {
        Ok(n) if n > room => Err(BagError::io(out.path.clone())(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "decompressing {} takes more than the {room} bytes this filesystem can spare \
                 (it keeps {reserve} bytes free); set TMPDIR to a larger one",
                src.display()
            ),
        ))),
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

/// Compress the closed split `src` (`<name>.db3`) into `<name>.db3.zstd` as rosbag2's zstd
/// plugin does (one zstd frame of the whole file, at `level`), with the frame's content size
/// in its header (rosbag2's older whole-buffer decompressor needs it). Crash-safe: the frame
/// is written to `.<name>.db3.zstd.partial`, fsynced, renamed and the directory fsynced, so a
/// `.db3.zstd` is complete whenever it exists; `src` is left for the caller to remove once
/// metadata.yaml names the `.zstd`. Returns the `.zstd` path.
pub fn compress_file(src: &Path, level: i32) -> Result<PathBuf, BagError> {
    let c = compress_partial(src, level, &|| false)?.expect("never stopped");
    c.publish()
}

/// A split compressed into its hidden `.partial` file, fsynced, not yet renamed: removed when
/// dropped unless [`publish`](Compressed::publish)ed.
#[derive(Debug)]
pub struct Compressed {
    partial: Decompressed,
    dst: PathBuf,
    dir: PathBuf,
}

impl Compressed {
    /// Rename the `.partial` to its `.db3.zstd` name and fsync the directory.
    pub fn publish(self) -> Result<PathBuf, BagError> {
        self.rename()?;
        super::metadata::sync_dir(&self.dir)?;
        Ok(self.dst)
    }

    /// The rename alone (the caller makes it durable, e.g. by the metadata.yaml rewrite that
    /// follows, which fsyncs the directory).
    pub fn rename(&self) -> Result<(), BagError> {
        fs::rename(&self.partial.path, &self.dst).map_err(BagError::io(&self.dst))
    }

    /// The `.db3.zstd` it becomes.
    pub fn dst(&self) -> &Path {
        &self.dst
    }
}

/// Bytes a `.zstd` of a `len`-byte file can take at most (zstd's `ZSTD_compressBound`, with
/// room for the frame header and a block header per 128 KiB block): what a compression in
/// flight may add to the disk beside the split it compresses.
pub fn compressed_bound(len: u64) -> u64 {
    len + len / 128 + (128 << 10)
}

/// [`compress_file`] up to the fsynced `.partial`, checking `stop` every MiB: `Ok(None)`
/// (and no `.partial` left) when it said to stop, as when retention deleted the split.
pub fn compress_partial(
    src: &Path,
    level: i32,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Compressed>, BagError> {
    let name = src
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| BagError::invalid(src, "not a split file name"))?;
    let dir = match src.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dst = dir.join(format!("{name}{ZSTD_SUFFIX}"));
    let partial = Decompressed {
        path: dir.join(format!(".{name}{PARTIAL_SUFFIX}")),
    };
    let mut input = fs::File::open(src).map_err(BagError::io(src))?;
    let len = input.metadata().map_err(BagError::io(src))?.len();
    let out = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&partial.path)
        .map_err(BagError::io(&partial.path))?;
    let io_err = BagError::io(&partial.path);
    let mut enc = zstd::stream::write::Encoder::new(out, level).map_err(BagError::io(src))?;
    enc.include_contentsize(true).map_err(BagError::io(src))?;
    enc.set_pledged_src_size(Some(len))
        .map_err(BagError::io(src))?;
    // Exactly the pledged length: a closed split does not grow, and zstd fails the frame
    // rather than write a wrong content size if it did. A MiB at a time, so that a split
    // deleted meanwhile stops costing CPU and disk within a MiB.
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        if stop() {
            return Ok(None);
        }
        let n = (buf.len() as u64).min(left) as usize;
        io::Read::read_exact(&mut input, &mut buf[..n]).map_err(BagError::io(src))?;
        io::Write::write_all(&mut enc, &buf[..n]).map_err(BagError::io(&partial.path))?;
        left -= n as u64;
    }
    let out = enc.finish().map_err(io_err)?;
    out.sync_all().map_err(BagError::io(&partial.path))?;
    Ok(Some(Compressed {
        partial,
        dst,
        dir: dir.to_path_buf(),
    }))
}

/// What rosbag2 writes as metadata.yaml's `compression_mode` in message mode (rosbags, the
/// python library, writes it lower-case: readers compare without case, as rosbag2 does).
pub const MESSAGE_MODE: &str = "MESSAGE";

/// True when metadata.yaml's `compression_mode` says message mode (any case, as rosbag2's
/// `compression_mode_from_string` and rosbags read it).
pub fn is_message_mode(mode: &str) -> bool {
    mode.eq_ignore_ascii_case(MESSAGE_MODE)
}

/// The most a message-mode blob may decompress to: SQLite's own limit on a value, so no
/// message ringbag reads back can be larger than one a bag could hold uncompressed. A few
/// bytes of hostile frame that claim more are refused before anything is allocated.
pub const MAX_MESSAGE: u64 = 1_000_000_000;

/// One message-mode blob (a zstd frame of the serialized message, as rosbag2's
/// `ZstdCompressor::compress_serialized_bag_message` writes it) decompressed with `dec`, a
/// context reused across messages. The frame's declared size sizes the one allocation (the
/// message handed out); a frame that does not say its size (rosbags writes them with it, as
/// rosbag2 does; a stream encoder would not) is decoded as a stream, bounded the same way.
pub fn decompress_message(
    dec: &mut zstd::bulk::Decompressor<'static>,
    blob: &[u8],
) -> Result<Vec<u8>, String> {
    match zstd::zstd_safe::get_frame_content_size(blob) {
        Ok(Some(n)) if n > MAX_MESSAGE => Err(format!(
            "its zstd frame claims {n} bytes, more than a message can hold ({MAX_MESSAGE})"
        )),
        Ok(Some(n)) => {
            let mut out = Vec::with_capacity(n as usize);
            dec.decompress_to_buffer(blob, &mut out)
                .map_err(|e| format!("not a zstd frame of {n} bytes: {e}"))?;
            if out.len() as u64 != n {
                return Err(format!(
                    "its zstd frame holds {} bytes, not the {n} it declares",
                    out.len()
                ));
            }
            Ok(out)
        }
        Ok(None) => {
            let mut out = Vec::new();
            let d = zstd::stream::read::Decoder::new(blob).map_err(|e| e.to_string())?;
            io::Read::read_to_end(&mut io::Read::take(d, MAX_MESSAGE + 1), &mut out)
                .map_err(|e| format!("not a zstd frame: {e}"))?;
            if out.len() as u64 > MAX_MESSAGE {
                return Err(format!("it decompresses to more than {MAX_MESSAGE} bytes"));
            }
            Ok(out)
        }
        Err(_) => Err("not a zstd frame (rosbag2's message compression)".into()),
    }
}

/// rosbag2's message mode on the writing side: each row's data replaced by one zstd frame of
/// it (level [`DEFAULT_LEVEL`], content size in the header, as `ZSTD_compress` writes it), so
/// the split size and the budget count what lands on disk. One compression context and one
/// output arena, both reused batch after batch: after the first batches nothing is allocated
/// per message (the arena keeps the capacity of the largest batch compressed so far).
pub struct MessageZip {
    ctx: zstd::bulk::Compressor<'static>,
    arena: Vec<u8>,
    /// End offset in `arena` of each row's frame (its start is the previous end).
    ends: Vec<usize>,
}

impl std::fmt::Debug for MessageZip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageZip")
    }
}

impl MessageZip {
    pub fn new() -> io::Result<Self> {
        Ok(MessageZip {
            ctx: zstd::bulk::Compressor::new(DEFAULT_LEVEL)?,
            arena: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// `rows` with each data compressed, pointing into the arena (valid until the next call).
    pub fn compress<'s>(
        &'s mut self,
        rows: &[super::writer::Row],
    ) -> io::Result<Vec<super::writer::Row<'s>>> {
        self.arena.clear();
        self.ends.clear();
        for &(_, _, data) in rows {
            let start = self.arena.len();
            // Room for the worst case, then cut to what the frame took.
            self.arena
                .resize(start + zstd::zstd_safe::compress_bound(data.len()), 0);
            let n = self
                .ctx
                .compress_to_buffer(data, &mut self.arena[start..])?;
            self.arena.truncate(start + n);
            self.ends.push(start + n);
        }
        let mut start = 0;
        Ok(rows
            .iter()
            .zip(&self.ends)
            .map(|(&(topic, ts, _), &end)| {
                let row = (topic, ts, &self.arena[start..end]);
                start = end;
                row
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's frames: one per row, each with its content size (rosbag2's decompressor
    /// sizes its buffer from it), decompressing to the row's data; empty data too.
    #[test]
    fn message_zip_writes_one_sized_frame_per_row() {
        let mut z = MessageZip::new().unwrap();
        let big = vec![7u8; 100_000];
        for _ in 0..2 {
            let rows: Vec<super::super::writer::Row> =
                vec![(0, 1, b"hello".as_slice()), (1, 2, &[]), (0, 3, &big)];
            let out = z.compress(&rows).unwrap();
            assert_eq!(out.len(), 3);
            for (o, r) in out.iter().zip(&rows) {
                assert_eq!((o.0, o.1), (r.0, r.1));
                assert_eq!(o.2[..4], [0x28, 0xB5, 0x2F, 0xFD]);
                let size = zstd::zstd_safe::get_frame_content_size(o.2).unwrap();
                assert_eq!(size, Some(r.2.len() as u64));
                assert_eq!(zstd::bulk::decompress(o.2, r.2.len()).unwrap(), r.2);
            }
            assert!(out[2].2.len() < 1000);
        }
    }

    /// Message mode: a frame as rosbag2 writes it (size declared) and a stream frame (size
    /// not declared) both read back; a blob that is not zstd, a truncated frame, and a frame
    /// that claims more than a message can hold are errors, never a panic or a huge allocation.
    #[test]
    fn message_blobs_decompress_and_bad_ones_are_errors() {
        let mut dec = zstd::bulk::Decompressor::new().unwrap();
        let plain: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let frame = zstd::bulk::compress(&plain, DEFAULT_LEVEL).unwrap();
        assert_eq!(frame[..4], [0x28, 0xB5, 0x2F, 0xFD]);
        assert_eq!(decompress_message(&mut dec, &frame).unwrap(), plain);
        let stream = zstd::encode_all(&plain[..], 1).unwrap();
        assert_eq!(decompress_message(&mut dec, &stream).unwrap(), plain);
        assert_eq!(
            decompress_message(&mut dec, &zstd::bulk::compress(&[], 1).unwrap()).unwrap(),
            b""
        );
        assert!(decompress_message(&mut dec, b"plain cdr bytes").is_err());
        assert!(decompress_message(&mut dec, &frame[..frame.len() / 2]).is_err());
        // A header claiming 2^40 bytes (single-segment frame, 8-byte size field).
        let mut huge = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let e = decompress_message(&mut dec, &huge).unwrap_err();
        assert!(e.contains("claims"), "{e}");
    }

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

    /// A stream that expands beyond what the scratch filesystem can spare (a "zstd bomb": 64
    /// MiB of zeros in a few KiB) is refused as a lack of room, not written out, and leaves no
    /// copy.
    #[test]
    fn a_stream_larger_than_the_scratch_room_is_refused_and_leaves_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("b_2.db3.zstd");
        let bomb = zstd::encode_all(io::Read::take(io::repeat(0), 64 << 20), 1).unwrap();
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
        fs::write(&src, &bomb).unwrap();
        // Leave about 1 MiB of room, whatever this machine has free.
        let free = crate::snapshot::ring::available_bytes(&dir.path().join("x"));
        let e = decompress_into(&src, dir.path(), free.saturating_sub(1 << 20)).unwrap_err();
        assert!(matches!(e, BagError::Io { .. }), "{e:?}");
        assert!(e.to_string().contains("can spare"), "{e}");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "only the .zstd is left: {left:?}");
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
    fn compress_file_writes_one_frame_with_its_content_size_and_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("b_3.db3");
        let plain: Vec<u8> = (0..500_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        fs::write(&src, &plain).unwrap();
        let dst = compress_file(&src, DEFAULT_LEVEL).unwrap();
        assert_eq!(dst, dir.path().join("b_3.db3.zstd"));
        let z = fs::read(&dst).unwrap();
        assert!(z.len() < plain.len() / 10, "{} bytes", z.len());
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&z).ok(),
            Some(Some(plain.len() as u64))
        );
        assert_eq!(zstd::decode_all(&z[..]).unwrap(), plain);
        assert_eq!(
            fs::read(&src).unwrap(),
            plain,
            "the .db3 is the caller's to remove"
        );
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["b_3.db3", "b_3.db3.zstd"]);
        assert_eq!(fs::read(&decompress(&dst).unwrap().path).unwrap(), plain);
    }

    #[test]
    fn recognises_compressed_split_names() {
        assert!(is_zstd(Path::new("/b/b_0.db3.zstd")));
        assert!(!is_zstd(Path::new("/b/b_0.db3")));
        assert!(!is_zstd(Path::new("/b/x.zstd")));
    }
}
