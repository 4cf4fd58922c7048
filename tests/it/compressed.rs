//! Bags compressed by rosbag2's file mode (`ros2 bag record --compression-mode file
//! --compression-format zstd`): `info`, `play` and the library reader read them through a
//! private decompressed copy, never writing in the bag, and a damaged `.zstd` is left out
//! with one warning. The real `ros2 bag record`'s output is read in tests/ros_live.rs.

use std::fs;
use std::path::Path;

use ringbag::bag::reader::{Bag, ReadFilter};
use ringbag::bag::{BagMetadata, Flavour};

use crate::common::{ringbag, stderr, stdout, write_bag, RunOutput};

const TOPICS: [(&str, &str); 2] = [
    ("/chatter", "std_msgs/msg/String"),
    ("/other", "std_msgs/msg/String"),
];

/// Turn `dir`'s splits into what rosbag2's zstd file compression leaves: each `<split>.db3`
/// replaced by `<split>.db3.zstd` (one zstd stream of the whole file), `relative_file_paths`
/// naming the `.zstd` files, `files[].path` still the `.db3` names (as Humble and Jazzy
/// write them), `compression_format: zstd`, `compression_mode: FILE`.
pub fn compress_like_rosbag2(dir: &Path) {
    let mut m = BagMetadata::read(dir).expect("metadata.yaml");
    for rel in &m.relative_file_paths {
        let plain = dir.join(rel);
        let z = zstd::encode_all(&fs::read(&plain).expect("split")[..], 1).expect("zstd");
        fs::write(dir.join(format!("{rel}.zstd")), z).expect("write .zstd");
        fs::remove_file(&plain).expect("rm .db3");
    }
    m.relative_file_paths = m
        .relative_file_paths
        .iter()
        .map(|r| format!("{r}.zstd"))
        .collect();
    m.compression_format = "zstd".into();
    m.compression_mode = "FILE".into();
    let flavour = m.flavour();
    m.write_atomic(dir, flavour).expect("metadata.yaml");
}

/// Every file of `dir` with its bytes, by name.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `ringbag ARGS` with its own empty TMPDIR, returned for checking it is left empty.
fn run_with_tmpdir(tmpdir: &Path, args: &[&str]) -> std::process::Output {
    fs::create_dir_all(tmpdir).unwrap();
    ringbag()
        .env("TMPDIR", tmpdir)
        .args(args)
        .run_output()
        .expect("ringbag runs")
}

/// (topic, timestamp) of each `play --sink echo` line.
fn echoed(out: &str) -> Vec<(String, i64)> {
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[2].to_string(), f[1].parse().expect("bag ns"))
        })
        .collect()
}

#[test]
fn info_play_and_the_reader_read_a_bag_compressed_in_rosbag2_file_mode() {
    for flavour in [Flavour::Humble, Flavour::Jazzy] {
        let tmp = tempfile::tempdir().unwrap();
        let bag = tmp.path().join("z");
        let written = write_bag(&bag, flavour, &TOPICS, 60, 50);
        compress_like_rosbag2(&bag);
        let names: Vec<String> = snapshot(&bag).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "metadata.yaml",
                "z_0.db3.zstd",
                "z_1.db3.zstd",
                "z_2.db3.zstd"
            ],
            "{flavour:?}"
        );
        let before = snapshot(&bag);
        let private = tmp.path().join("tmpdir");
        let b = bag.to_str().unwrap();

        let out = run_with_tmpdir(&private, &["info", "--json", b]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let info: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
        assert_eq!(info["message_count"].as_u64(), Some(120), "{info:#}");
        let counts: Vec<u64> = info["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| f["message_count"].as_u64().unwrap())
            .collect();
        assert_eq!(counts, [50, 50, 20], "{info:#}");
        let out = run_with_tmpdir(&private, &["info", b]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stdout(&out).contains("z_2.db3.zstd") && !stdout(&out).contains("? messages"),
            "{}",
            stdout(&out)
        );

        let out = run_with_tmpdir(&private, &["play", b, "--sink", "echo", "-r", "1000"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let want: Vec<(String, i64)> = written.iter().map(|(t, ts, _)| (t.clone(), *ts)).collect();
        assert_eq!(echoed(&stdout(&out)), want, "{flavour:?}");

        // Nothing written in the bag, and no decompressed copy left in TMPDIR.
        assert!(
            snapshot(&bag) == before,
            "{flavour:?}: a reader changed the bag"
        );
        assert_eq!(fs::read_dir(&private).unwrap().count(), 0, "{flavour:?}");

        let opened = Bag::open(&bag).expect("library open");
        let msgs: Vec<(String, i64, Vec<u8>)> = opened
            .messages(&ReadFilter::default())
            .expect("messages")
            .map(|m| {
                let m = m.expect("message");
                (opened.topics[m.topic].name.clone(), m.timestamp, m.data)
            })
            .collect();
        assert!(msgs == written, "{flavour:?}: the reader's bytes differ");
    }
}

#[test]
fn a_truncated_or_corrupt_zstd_split_is_left_out_with_one_warning_and_the_rest_plays() {
    for (case, damage) in [
        (
            "truncated",
            (|z: &mut Vec<u8>| z.truncate(z.len() / 2)) as fn(&mut Vec<u8>),
        ),
        // Not a zstd frame (its magic number smashed). A flip inside a block may decode to
        // other bytes undetected (rosbag2 writes no checksum), then SQLite finds the damage.
        ("corrupt", |z: &mut Vec<u8>| z[..4].fill(0)),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let bag = tmp.path().join("z");
        let written = write_bag(&bag, Flavour::Jazzy, &TOPICS, 60, 50);
        compress_like_rosbag2(&bag);
        let victim = bag.join("z_1.db3.zstd");
        let mut z = fs::read(&victim).unwrap();
        damage(&mut z);
        fs::write(&victim, z).unwrap();
        let private = tmp.path().join("tmpdir");
        let out = run_with_tmpdir(
            &private,
            &[
                "play",
                bag.to_str().unwrap(),
                "--sink",
                "echo",
                "-r",
                "1000",
            ],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{case}: {err}");
        let want: Vec<(String, i64)> = written
            .iter()
            .enumerate()
            .filter(|(i, _)| !(50..100).contains(i))
            .map(|(_, (t, ts, _))| (t.clone(), *ts))
            .collect();
        assert_eq!(echoed(&stdout(&out)), want, "{case}: {err}");
        let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warn")).collect();
        assert_eq!(warnings.len(), 1, "{case}: {err}");
        assert!(
            warnings[0].contains(&victim.display().to_string())
                && warnings[0].contains("cannot be decompressed (zstd)"),
            "{case}: {err}"
        );
        assert_eq!(fs::read_dir(&private).unwrap().count(), 0, "{case}");
    }
}

#[test]
fn reindex_rebuilds_the_metadata_of_a_compressed_bag_as_rosbag2_writes_it_and_leaves_the_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    let written = write_bag(&bag, Flavour::Jazzy, &TOPICS, 60, 50);
    compress_like_rosbag2(&bag);
    let want = BagMetadata::read(&bag).unwrap();
    let splits: Vec<(String, Vec<u8>)> = snapshot(&bag)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".zstd"))
        .collect();
    fs::remove_file(bag.join("metadata.yaml")).unwrap();
    let private = tmp.path().join("tmpdir");
    let out = run_with_tmpdir(&private, &["reindex", "--json", bag.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(report["message_count"].as_u64(), Some(120), "{report:#}");
    let got = BagMetadata::read(&bag).unwrap();
    assert_eq!(got.relative_file_paths, want.relative_file_paths);
    assert_eq!(got.files, want.files);
    assert_eq!(
        (
            got.compression_format.as_str(),
            got.compression_mode.as_str()
        ),
        ("zstd", "FILE")
    );
    assert_eq!(got.message_count, 120);
    // The compressed splits are read, never rewritten; nothing is left in TMPDIR.
    let after: Vec<(String, Vec<u8>)> = snapshot(&bag)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".zstd"))
        .collect();
    assert!(after == splits, "reindex rewrote a compressed split");
    assert_eq!(fs::read_dir(&private).unwrap().count(), 0);
    let out = run_with_tmpdir(
        &private,
        &[
            "play",
            bag.to_str().unwrap(),
            "--sink",
            "echo",
            "-r",
            "1000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(echoed(&stdout(&out)).len(), written.len());
}

#[test]
fn reindex_leaves_a_damaged_zstd_split_untouched_and_reports_its_messages_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    write_bag(&bag, Flavour::Humble, &TOPICS, 60, 50);
    compress_like_rosbag2(&bag);
    let victim = bag.join("z_1.db3.zstd");
    let z = fs::read(&victim).unwrap();
    fs::write(&victim, &z[..z.len() / 2]).unwrap();
    let out = ringbag()
        .args(["reindex", "--json", bag.to_str().unwrap()])
        .run_output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    let lost: Vec<(String, u64)> = report["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["file"].as_str().unwrap().to_string(),
                s["messages_lost"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    assert!(
        lost.contains(&("z_1.db3.zstd".to_string(), 50)),
        "{report:#}\n{}",
        stderr(&out)
    );
    assert_eq!(fs::read(&victim).unwrap(), &z[..z.len() / 2]);
    let m = BagMetadata::read(&bag).unwrap();
    assert_eq!(m.relative_file_paths, ["z_0.db3.zstd", "z_2.db3.zstd"]);
    assert_eq!(m.message_count, 70);
}

#[test]
fn a_split_there_both_plain_and_as_a_partial_zstd_is_read_from_the_db3() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    let written = write_bag(&bag, Flavour::Jazzy, &TOPICS, 60, 50);
    // As a compression cut short leaves it: the whole `.db3` and the start of its `.zstd`.
    let z = zstd::encode_all(&fs::read(bag.join("z_1.db3")).unwrap()[..], 1).unwrap();
    fs::write(bag.join("z_1.db3.zstd"), &z[..z.len() / 3]).unwrap();
    fs::remove_file(bag.join("metadata.yaml")).unwrap();
    let b = bag.to_str().unwrap();
    let private = tmp.path().join("tmpdir");
    let out = run_with_tmpdir(&private, &["play", b, "--sink", "echo", "-r", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        echoed(&stdout(&out)).len(),
        written.len(),
        "{}",
        stderr(&out)
    );
    let out = run_with_tmpdir(&private, &["reindex", b]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let m = BagMetadata::read(&bag).unwrap();
    assert_eq!(m.relative_file_paths, ["z_0.db3", "z_1.db3", "z_2.db3"]);
    assert_eq!((m.message_count, m.compression_mode.as_str()), (120, ""));
}

#[test]
fn compress_file_makes_what_the_readers_read_and_reindex_removes_a_partial_one() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    let written = write_bag(&bag, Flavour::Humble, &TOPICS, 60, 50);
    let mut m = BagMetadata::read(&bag).unwrap();
    for rel in &mut m.relative_file_paths {
        let plain = bag.join(&*rel);
        ringbag::bag::compressed::compress_file(&plain, 1).expect("compress");
        fs::remove_file(plain).unwrap();
        rel.push_str(".zstd");
    }
    (m.compression_format, m.compression_mode) = ("zstd".into(), "FILE".into());
    m.write_atomic(&bag, Flavour::Humble).unwrap();
    // A compression killed half-way: its hidden partial file beside a complete split.
    fs::write(bag.join(".z_2.db3.zstd.partial"), b"(\xb5/\xfd").unwrap();
    let b = bag.to_str().unwrap();
    let private = tmp.path().join("tmpdir");
    let out = run_with_tmpdir(&private, &["play", b, "--sink", "echo", "-r", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let want: Vec<(String, i64)> = written.iter().map(|(t, ts, _)| (t.clone(), *ts)).collect();
    assert_eq!(echoed(&stdout(&out)), want);
    let out = run_with_tmpdir(&private, &["reindex", b]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!bag.join(".z_2.db3.zstd.partial").exists());
    let after = BagMetadata::read(&bag).unwrap();
    assert_eq!(after.relative_file_paths, m.relative_file_paths);
    assert_eq!(after.message_count, 120);
}

#[test]
fn recovery_at_start_reindexes_a_compressed_bag_left_unclean_or_with_a_stale_partial_only() {
    use ringbag::bag::lock::{state, LockState, LOCK_FILE};
    use ringbag::bag::reindex::{recover_root, unfinished_reason};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for name in ["fine", "cut", "unclean"] {
        write_bag(&root.join(name), Flavour::Jazzy, &TOPICS, 60, 50);
        compress_like_rosbag2(&root.join(name));
    }
    // A compression killed half-way (its hidden partial), and a writer that died (its lock
    // marker, with every split already compressed and listed).
    fs::write(
        root.join("cut").join(".cut_2.db3.zstd.partial"),
        b"(\xb5/\xfd",
    )
    .unwrap();
    fs::write(root.join("unclean").join(LOCK_FILE), b"").unwrap();
    assert_eq!(state(&root.join("unclean")), LockState::Unclean);
    assert_eq!(unfinished_reason(&root.join("fine")), None);
    assert_eq!(
        unfinished_reason(&root.join("cut")).as_deref(),
        Some(".cut_2.db3.zstd.partial is left from a compression cut short")
    );
    let fine_before = snapshot(&root.join("fine"));
    let rec = recover_root(root);
    assert!(rec.skipped.is_empty(), "{:?}", rec.skipped);
    let recovered: Vec<_> = rec.reports.iter().map(|r| r.bag.clone()).collect();
    assert_eq!(recovered, [root.join("cut"), root.join("unclean")]);
    assert_eq!(
        snapshot(&root.join("fine")),
        fine_before,
        "a finished bag is left alone"
    );
    assert!(!root.join("cut").join(".cut_2.db3.zstd.partial").exists());
    for name in ["fine", "cut", "unclean"] {
        let dir = root.join(name);
        assert_eq!(state(&dir), LockState::Clean, "{name}");
        let m = BagMetadata::read(&dir).unwrap();
        let want: Vec<String> = (0..3).map(|i| format!("{name}_{i}.db3.zstd")).collect();
        assert_eq!(
            m.relative_file_paths, want,
            "{name}: the splits stay compressed"
        );
        assert_eq!(
            (m.message_count, m.compression_mode.as_str()),
            (120, "FILE"),
            "{name}"
        );
        let bag = Bag::open(&dir).unwrap();
        let n = bag.messages(&ReadFilter::default()).unwrap().count();
        assert_eq!(n, 120, "{name}");
    }
    assert!(recover_root(root).reports.is_empty(), "recovered once");
}

/// A message far larger than its compressed split (a 3 MB image of one colour in a `.zstd`
/// of a few KiB) reads: values are bounded by the decompressed copy's size, not the
/// `.zstd`'s.
#[test]
fn a_message_larger_than_its_compressed_split_reads() {
    use ringbag::bag::writer::{BagWriter, WriterOptions};
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    let image = vec![7u8; 3 << 20];
    let mut w = BagWriter::create(&bag, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let t = w
        .add_topic(crate::common::topic("/cam", "sensor_msgs/msg/Image"), None)
        .unwrap();
    w.write_batch([(t, 1, image.as_slice())]).unwrap();
    w.finish().unwrap();
    compress_like_rosbag2(&bag);
    let z = fs::metadata(bag.join("z_0.db3.zstd")).unwrap().len();
    assert!(z < 1 << 20, "{z} bytes");
    let opened = Bag::open(&bag).unwrap();
    let got: Vec<Vec<u8>> = opened
        .messages(&ReadFilter::default())
        .unwrap()
        .map(|m| m.unwrap().data)
        .collect();
    assert!(got == [image], "read back whole");
}
