//! Recording in rosbag2's file compression mode (`record --compression-mode file
//! --compression-format zstd`): each closed split becomes `<split>.db3.zstd` on the
//! compression threads, metadata.yaml names it so, and the readers give back every message
//! byte for byte. Bags rosbag2 compressed are read in tests/it/compressed.rs.

use std::fs;
use std::path::Path;

use ringbag::bag::filemode::FileCompression;
use ringbag::bag::reader::{Bag, ReadFilter};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::{BagMetadata, Flavour, TopicInfo};

use crate::common::{ringbag, stderr, stdout, RunOutput};

/// File names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Message `i`: its topic (of 2) and bytes, about as compressible as sensor data (a smooth
/// ramp with noise in the low bits), 200 B to 20 KB.
fn message(i: usize) -> (usize, Vec<u8>) {
    let len = 200 + (i * 7919) % 20_000;
    let mut x = i as u32 | 1;
    let data = (0..len)
        .map(|j| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((j / 64) as u8).wrapping_add((x & 3) as u8)
        })
        .collect();
    (i % 2, data)
}

/// A pipeline (the recorder's: sync and compression threads) writing into `dir`.
fn pipeline(dir: &Path, compression: FileCompression) -> ringbag::pipeline::Pipeline {
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.max_bag_size = 256 << 10;
    opts.compression = Some(compression);
    ringbag::pipeline::Pipeline::start(
        BagWriter::create(dir, opts).unwrap(),
        None,
        std::sync::Arc::new(ringbag::clock::SystemClock),
        ringbag::pipeline::PipelineConfig::default(),
    )
}

/// Every message of the bag at `dir` by topic, in the order read, through the library reader.
fn read_back(dir: &Path) -> Vec<Vec<Vec<u8>>> {
    let bag = Bag::open(dir).expect("bag opens");
    let mut got = vec![Vec::new(), Vec::new()];
    for m in bag.messages(&ReadFilter::default()).unwrap() {
        let m = m.unwrap();
        let t = ["/imu", "/scan"]
            .iter()
            .position(|n| *n == bag.topics[m.topic].name)
            .unwrap();
        got[t].push(m.data);
    }
    got
}

/// `n` messages pushed through a pipeline compressing with `c` into `dir`; its summary.
fn record(dir: &Path, c: FileCompression, n: usize) -> ringbag::pipeline::RecordSummary {
    let p = pipeline(dir, c);
    let producer = p.producer();
    let topics = [
        producer.add_topic(TopicInfo::new("/imu", "std_msgs/msg/String"), None),
        producer.add_topic(TopicInfo::new("/scan", "std_msgs/msg/String"), None),
    ];
    for i in 0..n {
        let (t, data) = message(i);
        assert!(producer.push(&topics[t], &data), "message {i} dropped");
    }
    drop(producer);
    let (result, summary) = p.finish();
    result.unwrap();
    assert_eq!(summary.written, n as u64);
    summary
}

/// The messages `0..n` by topic, as [`read_back`] gives them.
fn want(n: usize) -> Vec<Vec<Vec<u8>>> {
    let mut w = vec![Vec::new(), Vec::new()];
    for i in 0..n {
        let (t, d) = message(i);
        w[t].push(d);
    }
    w
}

#[test]
fn file_mode_leaves_only_zstd_splits_listed_as_rosbag2_does_and_every_message_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("z");
    const N: usize = 600;
    let c = FileCompression {
        per_message: false,
        threads: 2,
        queue_size: 0,
        level: 1,
    };
    record(&dir, c, N);
    let files = names(&dir);
    let splits: Vec<&String> = files.iter().filter(|n| *n != "metadata.yaml").collect();
    assert!(splits.len() > 3, "rotations happened: {files:?}");
    let m = crate::common::assert_file_mode_compressed(&dir, "z");
    assert_eq!(m.message_count, N as u64);
    let payload: u64 = (0..N).map(|i| message(i).1.len() as u64).sum();
    let packed: u64 = splits
        .iter()
        .map(|n| fs::metadata(dir.join(n)).unwrap().len())
        .sum();
    assert!(
        packed < payload * 3 / 4,
        "{packed} bytes compressed for {payload} of payload"
    );
    assert!(read_back(&dir) == want(N), "the reader's bytes differ");

    let d = dir.to_str().unwrap();
    let out = ringbag().args(["info", "--json", d]).run_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(info["message_count"].as_u64(), Some(N as u64), "{info:#}");
    let out = ringbag()
        .args(["play", d, "--sink", "echo", "-r", "1000"])
        .run_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), N);
}

/// Splits closing faster than one thread compresses them, behind a queue of one: the writer
/// never waits, so some splits find the queue full and stay plain `.db3` for a while, each
/// time counted in custom_data; they are compressed when the queue has room or at the
/// latest at finish, so the finished bag is compressed throughout (the real `ros2 bag play`
/// refuses a file-mode bag with a plain split), and nothing is lost.
#[test]
fn a_full_queue_defers_splits_counted_and_the_finished_bag_is_compressed_throughout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("z");
    const N: usize = 2000;
    let c = FileCompression {
        per_message: false,
        threads: 1,
        queue_size: 1,
        // A slow level, so that the queue does fill.
        level: 7,
    };
    record(&dir, c, N);
    let files = names(&dir);
    assert!(
        files
            .iter()
            .all(|n| n == "metadata.yaml" || n.ends_with(".db3.zstd")),
        "{files:?}"
    );
    let m = BagMetadata::read(&dir).unwrap();
    let full: u64 = m
        .custom_data
        .get("ringbag.compression_queue_full")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(full > 0, "the queue was full at times: {:?}", m.custom_data);
    // metadata.yaml lists exactly the files on disk, counts true.
    crate::retention::assert_true_and_readable(&dir);
    assert!(read_back(&dir) == want(N), "the reader's bytes differ");
    let out = ringbag()
        .args([
            "play",
            dir.to_str().unwrap(),
            "--sink",
            "echo",
            "-r",
            "1000",
        ])
        .run_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), N);
}

/// A [`Compression`] that holds the jobs handed to it until the test runs them.
struct Held(std::sync::Arc<std::sync::Mutex<Vec<ringbag::bag::filemode::CompressJob>>>);

impl ringbag::bag::writer::Compression for Held {
    fn offer(
        &mut self,
        job: ringbag::bag::filemode::CompressJob,
    ) -> Result<(), ringbag::bag::filemode::CompressJob> {
        self.0.lock().unwrap().push(job);
        Ok(())
    }
    fn push(&mut self, job: ringbag::bag::filemode::CompressJob) {
        job.run();
    }
    fn wait_all(&mut self) {
        for j in self.0.lock().unwrap().drain(..) {
            j.run();
        }
    }
}

/// Retention deleting a split whose compression is queued: the job then does nothing (no
/// `.zstd` brings the deleted split back), the reserve it held is released, and the other
/// splits compress and are listed by their `.zstd`.
#[test]
fn a_split_deleted_while_its_compression_is_queued_is_not_brought_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("z");
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.compression = Some(FileCompression {
        per_message: false,
        threads: 1,
        queue_size: 0,
        level: 1,
    });
    let mut w = BagWriter::create(&dir, opts).unwrap();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    w.set_compression(Box::new(Held(held.clone())));
    let t = w
        .add_topic(TopicInfo::new("/imu", "std_msgs/msg/String"), None)
        .unwrap();
    let mut written = Vec::new();
    for i in 0..3 {
        for k in 0..50 {
            let data = message(i * 50 + k).1;
            w.write_batch([(t, (i * 50 + k) as i64, data.as_slice())])
                .unwrap();
            written.push(data);
        }
        if i < 2 {
            w.split().unwrap();
        }
    }
    // z_0 and z_1 are closed, their jobs held; z_2 is open.
    assert_eq!(held.lock().unwrap().len(), 2);
    assert!(w.compression_reserve() > 0);
    let gone = w.delete_oldest_closed().unwrap().unwrap();
    assert_eq!(gone.path, dir.join("z_0.db3"));
    let jobs: Vec<_> = held.lock().unwrap().drain(..).collect();
    for j in jobs {
        j.run();
    }
    assert_eq!(w.compression_reserve(), 0, "every job released its reserve");
    assert_eq!(
        names(&dir),
        [".ringbag.lock", "metadata.yaml", "z_1.db3.zstd", "z_2.db3"]
    );
    assert!(!dir.join("z_0.db3.zstd").exists() && !dir.join("z_0.db3").exists());
    let m = BagMetadata::read(&dir).unwrap();
    assert_eq!(m.relative_file_paths, ["z_1.db3.zstd"]);
    assert_eq!(m.compression_mode, "FILE");
    w.finish().unwrap();
    assert_eq!(
        names(&dir),
        ["metadata.yaml", "z_1.db3.zstd", "z_2.db3.zstd"]
    );
    let m = BagMetadata::read(&dir).unwrap();
    assert_eq!(m.relative_file_paths, ["z_1.db3.zstd", "z_2.db3.zstd"]);
    let bag = Bag::open(&dir).unwrap();
    let got: Vec<Vec<u8>> = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .map(|m| m.unwrap().data)
        .collect();
    assert!(
        got == written[50..],
        "splits 1 and 2 read back byte for byte"
    );
}

/// The split numbers of the split files (`.db3`, `.db3.zstd`) in `names`.
fn split_numbers(names: &[String]) -> std::collections::BTreeSet<u64> {
    names
        .iter()
        .filter_map(|n| {
            let n = n.strip_suffix(".zstd").unwrap_or(n).strip_suffix(".db3")?;
            n.rsplit('_').next()?.parse().ok()
        })
        .collect()
}

/// kill -9 while splits are compressed (a `.partial` on disk, or failing that several
/// `.zstd`s): after `ringbag reindex` the bag opens with every split it had, in whichever
/// form, each message once, and no `.partial` is left.
#[test]
fn kill_9_during_compression_then_reindex_opens_with_every_closed_split() {
    use crate::common::{wait_for, SpawnExecd};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let mut child = ringbag()
        .args([
            "record",
            "-o",
            dir.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-profile",
            "robot",
            "--synthetic-rate",
            "max",
            "--synthetic-count",
            "100000",
            "-b",
            "2MiB",
            "--compression-mode",
            "file",
            "--compression-format",
            "zstd",
            "--compression-threads",
            "1",
            "--compression-queue-size",
            "0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn_execd()
        .unwrap();
    let partial = || {
        fs::read_dir(&dir).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        })
    };
    let some_zstd = || {
        fs::read_dir(&dir).is_ok_and(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".zstd"))
                .count()
                >= 3
        })
    };
    let mut seen_zstd = false;
    let caught = wait_for(std::time::Duration::from_secs(60), || {
        seen_zstd |= some_zstd();
        seen_zstd && partial()
    });
    assert!(seen_zstd, "compression happened");
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let before = names(&dir);
    eprintln!("killed with a .partial on disk: {caught}");
    let splits = split_numbers(&before);
    assert!(splits.len() > 3, "{before:?}");

    let out = ringbag()
        .args(["reindex", dir.to_str().unwrap()])
        .run_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let after = names(&dir);
    assert!(!after.iter().any(|n| n.ends_with(".partial")), "{after:?}");
    let m = BagMetadata::read(&dir).unwrap();
    let listed = split_numbers(&m.relative_file_paths);
    // Every split on disk is listed, except perhaps the one open at the kill when it was
    // still empty (reindex leaves a split with no rows out).
    let newest = *splits.last().unwrap();
    for s in &splits {
        assert!(
            listed.contains(s) || *s == newest,
            "split {s} not listed: {:?} (on disk {before:?})",
            m.relative_file_paths
        );
    }
    let bag = Bag::open(&dir).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut n = 0u64;
    for msg in bag.messages(&ReadFilter::default()).unwrap() {
        let msg = msg.unwrap();
        assert!(
            seen.insert((msg.topic, msg.timestamp)),
            "a message read twice"
        );
        n += 1;
    }
    assert_eq!(n, m.message_count);
}

/// The service's config keys `compression_mode = "file"`, `compression_format = "zstd"`
/// record as `record`'s flags do: the daemon's bag is compressed throughout and reads whole.
#[test]
fn the_daemon_with_compression_keys_records_zstd_splits() {
    const MESSAGES: u64 = 20_000;
    let (_tmp, bag) = crate::common::daemon_bag_compressed("file", MESSAGES);
    let bags = [bag];
    let files = names(&bags[0]);
    assert!(
        files.iter().filter(|n| n.ends_with(".db3.zstd")).count() > 1
            && !files.iter().any(|n| n.ends_with(".db3")),
        "{files:?}"
    );
    let (m, _) = crate::retention::assert_true_and_readable(&bags[0]);
    assert_eq!(m.message_count, MESSAGES);
}
