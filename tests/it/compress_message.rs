//! Bags in rosbag2's message compression mode (`ros2 bag record --compression-mode message
//! --compression-format zstd`): plain `.db3` splits whose rows each hold one zstd frame of the
//! serialized message, with `compression_format: zstd` and `compression_mode: MESSAGE` in
//! metadata.yaml. `info`, `play`, `reindex` and the library reader hand out the messages
//! decompressed; a row that does not decompress is skipped with a warning when playing and is
//! the one error line of a strict read (`convert`). `record`, the daemon and `convert` write
//! such bags (`--compression-mode message`). The real `ros2 bag` side is in tests/ros_live.rs.

use std::fs;
use std::path::{Path, PathBuf};

use ringbag::bag::reader::{Bag, ReadFilter};
use ringbag::bag::{BagMetadata, Flavour};

use crate::common::{ringbag, stderr, stdout, write_bag, RunOutput};

const TOPICS: [(&str, &str); 2] = [
    ("/chatter", "std_msgs/msg/String"),
    ("/other", "std_msgs/msg/String"),
];

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Every split of `dir` (a directory with metadata.yaml).
fn splits(dir: &Path) -> Vec<PathBuf> {
    let m = BagMetadata::read(dir).expect("metadata.yaml");
    m.relative_file_paths.iter().map(|r| dir.join(r)).collect()
}

/// The `data` column of every row of `split`, by row id.
fn blobs(split: &Path) -> Vec<(i64, Vec<u8>)> {
    let c = rusqlite::Connection::open(split).expect("open split");
    let mut st = c
        .prepare("SELECT id, data FROM messages ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Turn `dir` into what rosbag2's message mode writes: each row's data replaced by a zstd
/// frame of it at level 1 (`ZSTD_compress`, so with its content size), metadata.yaml saying
/// `compression_format: zstd` and `compression_mode: <mode>`.
fn compress_rows_like_rosbag2(dir: &Path, mode: &str) {
    for split in splits(dir) {
        let c = rusqlite::Connection::open(&split).expect("open split");
        for (id, data) in blobs(&split) {
            let z = zstd::bulk::compress(&data, 1).unwrap();
            c.execute(
                "UPDATE messages SET data = ?1 WHERE id = ?2",
                rusqlite::params![z, id],
            )
            .unwrap();
        }
    }
    let mut m = BagMetadata::read(dir).expect("metadata.yaml");
    m.compression_format = "zstd".into();
    m.compression_mode = mode.into();
    let flavour = m.flavour();
    m.write_atomic(dir, flavour).expect("metadata.yaml");
}

/// (topic, bag timestamp, data length) of each `play --sink echo` line.
fn echoed(out: &str) -> Vec<(String, i64, usize)> {
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[2].to_string(),
                f[1].parse().expect("bag ns"),
                f[4].parse().expect("length"),
            )
        })
        .collect()
}

/// What the library reader hands out: (topic, timestamp, data).
fn read_all(bag: &Path) -> Vec<(String, i64, Vec<u8>)> {
    let opened = Bag::open(bag).expect("library open");
    opened
        .messages(&ReadFilter::default())
        .expect("messages")
        .map(|m| {
            let m = m.expect("message");
            (opened.topics[m.topic].name.clone(), m.timestamp, m.data)
        })
        .collect()
}

fn play_echo(bag: &Path) -> std::process::Output {
    ringbag()
        .args([
            "play",
            bag.to_str().unwrap(),
            "--sink",
            "echo",
            "-r",
            "1000",
        ])
        .run_output()
        .expect("ringbag runs")
}

#[test]
fn info_play_reindex_and_the_reader_decompress_a_message_mode_bag() {
    // rosbag2 writes `MESSAGE`, the rosbags library `message`: both read.
    for (flavour, mode) in [(Flavour::Humble, "MESSAGE"), (Flavour::Jazzy, "message")] {
        let tmp = tempfile::tempdir().unwrap();
        let bag = tmp.path().join("m");
        let written = write_bag(&bag, flavour, &TOPICS, 60, 50);
        compress_rows_like_rosbag2(&bag, mode);
        // Really compressed on disk: every row a zstd frame of the message written.
        let on_disk: Vec<Vec<u8>> = splits(&bag)
            .iter()
            .flat_map(|s| blobs(s).into_iter().map(|(_, b)| b))
            .collect();
        assert_eq!(on_disk.len(), written.len());
        for (z, (_, _, plain)) in on_disk.iter().zip(&written) {
            assert_eq!(z[..4], ZSTD_MAGIC);
            assert_eq!(&zstd::decode_all(&z[..]).unwrap(), plain);
        }

        assert!(
            read_all(&bag) == written,
            "{flavour:?}: the reader's bytes differ"
        );

        let out = play_echo(&bag);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).matches("decompress").count(),
            0,
            "{}",
            stderr(&out)
        );
        let want: Vec<(String, i64, usize)> = written
            .iter()
            .map(|(t, ts, d)| (t.clone(), *ts, d.len()))
            .collect();
        assert_eq!(echoed(&stdout(&out)), want, "{flavour:?}");

        let out = ringbag()
            .args(["info", "--json", bag.to_str().unwrap()])
            .run_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let info: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
        assert_eq!(info["message_count"].as_u64(), Some(120), "{info:#}");

        // reindex keeps the mode (only metadata.yaml tells the rows are compressed).
        let out = ringbag()
            .args(["reindex", bag.to_str().unwrap()])
            .run_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let m = BagMetadata::read(&bag).unwrap();
        assert_eq!(
            (m.compression_format.as_str(), m.compression_mode.as_str()),
            ("zstd", mode)
        );
        assert!(read_all(&bag) == written, "{flavour:?}: after reindex");
    }
}

/// A row that is not a zstd frame (or a truncated one) is one lost message: `play` skips it
/// with a warning and a count and plays the rest; a strict read (`convert`) fails with one
/// line naming the split and the row.
#[test]
fn a_row_that_does_not_decompress_is_skipped_by_play_and_refused_by_convert() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("m");
    let written = write_bag(&bag, Flavour::Jazzy, &TOPICS, 20, 0);
    compress_rows_like_rosbag2(&bag, "MESSAGE");
    let split = &splits(&bag)[0];
    let c = rusqlite::Connection::open(split).unwrap();
    let (_, z) = blobs(split)[5].clone();
    c.execute("UPDATE messages SET data = x'00010203' WHERE id = 3", [])
        .unwrap();
    c.execute(
        "UPDATE messages SET data = ?1 WHERE id = 6",
        [&z[..z.len() - 3]],
    )
    .unwrap();
    drop(c);

    let out = play_echo(&bag);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let want: Vec<(String, i64, usize)> = written
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2 && *i != 5)
        .map(|(_, (t, ts, d))| (t.clone(), *ts, d.len()))
        .collect();
    assert_eq!(echoed(&stdout(&out)), want);
    let err = stderr(&out);
    assert!(
        err.contains("skipping message 3") && err.contains("does not decompress"),
        "{err}"
    );
    assert!(
        err.contains("skipped 2 messages whose data did not decompress"),
        "{err}"
    );

    let opts = tmp.path().join("out.yaml");
    fs::write(
        &opts,
        format!(
            "output_bags:\n- uri: {}\n  all_topics: true\n",
            tmp.path().join("o").display()
        ),
    )
    .unwrap();
    let out = ringbag()
        .args([
            "convert",
            "-i",
            bag.to_str().unwrap(),
            "-o",
            opts.to_str().unwrap(),
        ])
        .run_output()
        .unwrap();
    // A damaged input is a runtime failure of convert (exit 1), as for any unreadable split.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ringbag: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("m_0.db3: message 3 (at "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The python of the venv with the rosbags library (this checkout's, else the main one's).
fn venv_python() -> Option<PathBuf> {
    [
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python")),
        PathBuf::from("/work/main/.venv/bin/python"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// A bag the python `rosbags` library writes in message mode (its `compression_mode:
/// message`) reads back byte for byte.
#[test]
fn ringbag_reads_what_rosbags_writes_in_message_mode() {
    let Some(py) = venv_python() else {
        eprintln!("SKIP: no rosbags venv");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("py");
    let script = r#"
import sys
from pathlib import Path
from rosbags.rosbag2 import Writer
from rosbags.rosbag2.enums import CompressionFormat, CompressionMode
from rosbags.typesys import Stores, get_typestore
ts = get_typestore(Stores.ROS2_HUMBLE)
w = Writer(Path(sys.argv[1]), version=8)
w.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
with w:
    c = w.add_connection('/blob', 'std_msgs/msg/String', typestore=ts)
    for i in range(40):
        w.write(c, 1_000 + i, bytes([0, 1, 0, 0]) + bytes([i % 7]) * (i * 50))
"#;
    let o = std::process::Command::new(&py)
        .args(["-c", script, bag.to_str().unwrap()])
        .run_output()
        .expect("python runs");
    assert!(o.status.success(), "rosbags: {}", stderr(&o));
    let m = BagMetadata::read(&bag).unwrap();
    assert!(m.compression_mode.eq_ignore_ascii_case("message"), "{m:?}");
    let want: Vec<(String, i64, Vec<u8>)> = (0..40u8)
        .map(|i| {
            let mut d = vec![0, 1, 0, 0];
            d.extend(std::iter::repeat_n(i % 7, i as usize * 50));
            ("/blob".to_string(), 1_000 + i as i64, d)
        })
        .collect();
    assert!(
        read_all(&bag) == want,
        "ringbag's reading of rosbags' bag differs"
    );
}

/// Every row of every split of `bag` as stored: each must be one zstd frame declaring its
/// size; returned decompressed, in (timestamp, split, id) order as the reader merges them.
fn frames_decompressed(bag: &Path) -> Vec<(i64, Vec<u8>)> {
    let mut v = Vec::new();
    for (k, split) in splits(bag).iter().enumerate() {
        let c = rusqlite::Connection::open(split).expect("open split");
        let mut st = c
            .prepare("SELECT id, timestamp, data FROM messages")
            .unwrap();
        let rows: Vec<(i64, i64, Vec<u8>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (id, ts, z) in rows {
            assert_eq!(z[..4], ZSTD_MAGIC, "{}: row {id}", split.display());
            let size = zstd::zstd_safe::get_frame_content_size(&z).unwrap();
            let plain = zstd::decode_all(&z[..]).unwrap();
            assert_eq!(size, Some(plain.len() as u64), "row {id} declares its size");
            v.push(((ts, k, id), plain));
        }
    }
    v.sort_by_key(|(k, _)| *k);
    v.into_iter().map(|((ts, _, _), d)| (ts, d)).collect()
}

/// What `rosbags` reads from `bag`: (timestamp, data) of each message in its order.
fn rosbags_read(py: &Path, bag: &Path) -> Vec<(i64, Vec<u8>)> {
    let script = "import sys\nfrom rosbags.rosbag2 import Reader\nwith Reader(sys.argv[1]) as r:\n    for c, t, d in r.messages():\n        print(t, bytes(d).hex())\n";
    let o = std::process::Command::new(py)
        .args(["-c", script, bag.to_str().unwrap()])
        .run_output()
        .expect("python runs");
    assert!(o.status.success(), "rosbags: {}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| {
            let (t, hex) = l.split_once(' ').expect("two fields");
            let d = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (t.parse().unwrap(), d)
        })
        .collect()
}

/// Check `bag` is in rosbag2's message mode throughout and every message reads back byte
/// for byte through the reader, `play --sink echo` and (`with_rosbags`) `rosbags`, which
/// refuses a bag whose types have no definitions (`encoding: unknown`, as `write_bag`'s).
/// Returns the messages.
fn assert_message_mode(bag: &Path, with_rosbags: bool) -> Vec<(i64, Vec<u8>)> {
    let m = BagMetadata::read(bag).expect("metadata.yaml");
    assert_eq!(
        (m.compression_format.as_str(), m.compression_mode.as_str()),
        ("zstd", "MESSAGE")
    );
    assert!(
        m.relative_file_paths.iter().all(|p| p.ends_with(".db3")),
        "{:?}",
        m.relative_file_paths
    );
    let stored = frames_decompressed(bag);
    assert_eq!(stored.len() as u64, m.message_count);
    let read: Vec<(i64, Vec<u8>)> = read_all(bag)
        .into_iter()
        .map(|(_, ts, d)| (ts, d))
        .collect();
    assert!(read == stored, "the reader's bytes differ from the frames'");
    let out = play_echo(bag);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let echoed: Vec<(i64, usize)> = echoed(&stdout(&out))
        .into_iter()
        .map(|(_, ts, n)| (ts, n))
        .collect();
    let want: Vec<(i64, usize)> = stored.iter().map(|(ts, d)| (*ts, d.len())).collect();
    assert_eq!(echoed, want);
    if let Some(py) = venv_python().filter(|_| with_rosbags) {
        let mut theirs = rosbags_read(&py, bag);
        let mut ours = stored.clone();
        // rosbags orders ties of a timestamp its own way.
        theirs.sort();
        ours.sort();
        assert!(theirs == ours, "rosbags reads other bytes");
    } else {
        eprintln!("SKIP: no rosbags venv");
    }
    stored
}

/// `record --compression-mode message --compression-format zstd`: plain `.db3` splits of
/// zstd frames (level 1, size declared), metadata.yaml in message mode, everything read back;
/// `-b` counts the compressed bytes: the splits are sized by what is on disk.
#[test]
fn record_in_message_mode_writes_one_frame_per_message_and_splits_by_compressed_size() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("r");
    // ~900 MB of the robot mix natively; a fifth under qemu (stress_percent 20), still
    // several full splits of compressed frames.
    let count = (3000 * crate::common::stress_percent() / 100).max(600) as usize;
    let out = ringbag()
        .args([
            "record",
            "-o",
            bag.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-profile",
            "robot",
            "--synthetic-rate",
            "max",
            "--synthetic-count",
            &count.to_string(),
            "-b",
            "1MiB",
            "--compression-mode",
            "message",
            "--compression-format",
            "zstd",
        ])
        .run_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stored = assert_message_mode(&bag, true);
    assert_eq!(stored.len(), count);
    let plain: u64 = stored.iter().map(|(_, d)| d.len() as u64).sum();
    let sizes: Vec<u64> = splits(&bag)
        .iter()
        .map(|s| fs::metadata(s).unwrap().len())
        .collect();
    let on_disk: u64 = sizes.iter().sum();
    // Had -b counted the messages' own bytes, there would be at least plain / 1 MiB splits.
    assert!(
        (sizes.len() as u64) < plain / (1 << 20) / 2 && on_disk * 2 < plain,
        "{} splits of {sizes:?} bytes for {plain} bytes of messages",
        sizes.len()
    );
    // Every split but the last is full: about 1 MiB, never much more.
    for s in &sizes[..sizes.len() - 1] {
        assert!(*s > 512 << 10 && *s < (1 << 20) + (64 << 10), "{sizes:?}");
    }
}

/// The service's keys `compression_mode = "message"`, `compression_format = "zstd"` record
/// as `record`'s flags do.
#[test]
fn the_daemon_with_message_mode_keys_records_frames() {
    const MESSAGES: usize = 5_000;
    let (_tmp, bag) = crate::common::daemon_bag_compressed("message", MESSAGES as u64);
    let bags = [bag];
    assert_eq!(assert_message_mode(&bags[0], true).len(), MESSAGES);
}

/// `convert` with `compression_mode: message` writes what `record` does, from a plain input
/// and from a message-mode one alike; and a message-mode input converts to a plain output.
#[test]
fn convert_writes_and_reads_message_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let written = write_bag(&input, Flavour::Jazzy, &TOPICS, 200, 150);
    let want: Vec<(i64, Vec<u8>)> = written.iter().map(|(_, t, d)| (*t, d.clone())).collect();
    let convert = |from: &Path, to: &Path, extra: &str| {
        let opts = tmp.path().join("o.yaml");
        fs::write(
            &opts,
            format!(
                "output_bags:\n- uri: {}\n  all_topics: true\n{extra}",
                to.display()
            ),
        )
        .unwrap();
        let out = ringbag()
            .args([
                "convert",
                "-i",
                from.to_str().unwrap(),
                "-o",
                opts.to_str().unwrap(),
            ])
            .run_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    let zipped = tmp.path().join("zipped");
    convert(
        &input,
        &zipped,
        "  compression_mode: message\n  compression_format: zstd\n",
    );
    assert_eq!(assert_message_mode(&zipped, false), want);
    let plain = tmp.path().join("plain");
    convert(&zipped, &plain, "");
    let m = BagMetadata::read(&plain).unwrap();
    assert_eq!(m.compression_mode, "");
    let back: Vec<(i64, Vec<u8>)> = splits(&plain)
        .iter()
        .flat_map(|s| blobs(s).into_iter().map(|(_, d)| d))
        .zip(&want)
        .map(|(d, (ts, _))| (*ts, d))
        .collect();
    assert_eq!(back, want, "stored plain again");
}
