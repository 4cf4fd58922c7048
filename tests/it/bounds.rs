//! The circular budget under stress: the directory is sampled as fast as the test can list it
//! while recordings run at full rate across split sizes, message sizes (100 B to 2.7 MB),
//! limits and storage presets. Every sample must hold the bound: total bytes of every file in
//! the bag directory ≤ `--max-record-size`, split files ≤ `--max-bag-files`. Afterwards the
//! bag reads, and the exit summary's counts add up to what is in the bag.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};

use ringbag::bag::reader::{Bag, ReadFilter};

use crate::common::ringbag;

/// One sample of a bag directory: (bytes of every file, split files), or `None` when the
/// sample is torn. Files are listed and stat'ed one by one, so a sample taken across a
/// deletion could add a file that is already gone to one that grew since, and show a peak
/// that never existed: every counted file is stat'ed again at the end, and the sample only
/// counts if each one is still there as the same inode. Files only grow between deletions,
/// so a sample that passes is a lower bound of what was on disk at its end.
fn sample(dir: &Path, listing: &mut Vec<(String, u64)>) -> Option<(u64, usize)> {
    use std::os::unix::fs::MetadataExt;
    listing.clear();
    let Ok(rd) = fs::read_dir(dir) else {
        return Some((0, 0));
    };
    let (mut bytes, mut splits) = (0, 0);
    let mut seen = Vec::new();
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_file() {
            bytes += m.len();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".db3") {
                splits += 1;
            }
            seen.push((e.path(), m.ino()));
            listing.push((name, m.len()));
        }
    }
    let intact = seen
        .iter()
        .all(|(p, ino)| fs::symlink_metadata(p).is_ok_and(|m| m.ino() == *ino));
    intact.then_some((bytes, splits))
}

struct Peak {
    bytes: u64,
    /// The files at the byte peak, to explain a failure.
    at_peak: Vec<(String, u64)>,
    splits: usize,
    samples: u64,
    /// Samples discarded because a counted file was deleted while sampling.
    torn: u64,
}

/// Sample `dir` until the child exits; stderr is read on a thread so it can never block it.
fn record_sampling(args: &[String], dir: &Path) -> (std::process::ExitStatus, String, Peak) {
    let mut child: Child = ringbag()
        .arg("record")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("ringbag starts");
    let mut err = child.stderr.take().expect("stderr piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let mut listing = Vec::new();
    let mut peak = Peak {
        at_peak: Vec::new(),
        bytes: 0,
        splits: 0,
        samples: 0,
        torn: 0,
    };
    loop {
        let done = child.try_wait().expect("wait works").is_some();
        let Some((b, n)) = sample(dir, &mut listing) else {
            peak.torn += 1;
            if done {
                break;
            }
            continue;
        };
        if b > peak.bytes {
            peak.bytes = b;
            peak.at_peak.clone_from(&listing);
        }
        peak.splits = peak.splits.max(n);
        peak.samples += 1;
        if done {
            break;
        }
    }
    let status = child.wait().expect("wait");
    (status, reader.join().expect("stderr reader"), peak)
}

/// A number from the exit summary: the word after `key` in the first line containing it.
fn summary_number(err: &str, key: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.contains(key))
        .unwrap_or_else(|| panic!("no `{key}` in summary:\n{err}"));
    let rest = &line[line.find(key).unwrap() + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{key}` in: {line}"))
}

/// Message counts scaled by `RINGBAG_STRESS_PERCENT` (default 100): the aarch64 stage runs
/// under emulation, about ten times slower, and sets 20 (scripts/cross-test.sh).
fn scaled(n: u64) -> u64 {
    (n * crate::common::stress_percent() / 100).max(1)
}

struct Case {
    profile: &'static str,
    count: u64,
    split: &'static str,
    limit: &'static str,
    extra: &'static [&'static str],
}

fn bytes_of(s: &str) -> u64 {
    ringbag::cli::units::parse_bytes(s).expect("test sizes parse")
}

/// Record `case` and check the size bound at every sample; returns (summary, peak).
fn run_case(case: &Case, preset: &str) -> (String, Peak) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b");
    let mut args: Vec<String> = [
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        case.profile,
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        &scaled(case.count).to_string(),
        "-b",
        case.split,
        "--max-record-size",
        case.limit,
        "--storage-preset-profile",
        preset,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(case.extra.iter().map(|s| s.to_string()));
    let (status, err, peak) = record_sampling(&args, &out);
    let what = format!(
        "{} messages, -b {}, --max-record-size {}, {preset} {:?}",
        case.profile, case.split, case.limit, case.extra
    );
    assert!(status.success(), "{what}: {err}");
    let limit = bytes_of(case.limit);
    eprintln!(
        "{what}: peak {} of {limit} bytes ({:.3}), {} samples ({} torn, discarded)",
        peak.bytes,
        peak.bytes as f64 / limit as f64,
        peak.samples,
        peak.torn
    );
    assert!(
        peak.bytes <= limit,
        "{what}: the directory held {} bytes, over the {limit} byte bound: {:?}",
        peak.bytes,
        peak.at_peak
    );
    assert_adds_up(&out, &err, &what);
    (err, peak)
}

/// The bag reads, and the summary's counts are the bag's: written = kept + deleted by
/// retention is not knowable from the bag alone, so check what is: accepted = written +
/// oversize + unwritten, and a bag that lost nothing to retention holds exactly `written`.
fn assert_adds_up(dir: &Path, err: &str, what: &str) {
    let bag = Bag::open(dir).unwrap_or_else(|e| panic!("{what}: bag opens: {e}"));
    let read = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .inspect(|m| assert!(m.is_ok(), "{what}: message reads: {m:?}"))
        .count() as u64;
    assert_eq!(read, bag.metadata.message_count, "{what}: metadata count");
    let accepted = summary_number(err, "accepted ");
    let written = summary_number(err, "written ");
    let unwritten = summary_number(err, "unwritten ");
    let oversize = summary_number(err, "oversize ");
    assert_eq!(
        accepted,
        written + oversize + unwritten,
        "{what}: accepted = written + oversize + unwritten:\n{err}"
    );
    if summary_number(err, "deleted by retention ") == 0 {
        assert_eq!(
            read, written,
            "{what}: nothing deleted, so the bag holds all written"
        );
    } else {
        assert!(read <= written, "{what}: {read} read, {written} written");
    }
}

const PRESETS: [&str; 3] = ["write-optimized", "resilient", "none"];

#[test]
fn the_size_bound_holds_at_every_sample_across_split_and_message_sizes_and_presets() {
    let cases = [
        // The smallest split with the tightest budget: rotations dominate.
        Case {
            profile: "small",
            count: 30_000,
            split: "86016",
            limit: "172032",
            extra: &[],
        },
        // Messages a large fraction of the split.
        Case {
            profile: "medium",
            count: 120,
            split: "86016",
            limit: "172032",
            extra: &["--bag-format", "humble"],
        },
        Case {
            profile: "medium",
            count: 200,
            split: "1MiB",
            limit: "3MiB",
            extra: &[],
        },
        // Messages larger than a split: each gets a split of its own.
        Case {
            profile: "large",
            count: 30,
            split: "200KiB",
            limit: "4MiB",
            extra: &[],
        },
    ];
    for case in &cases {
        for preset in PRESETS {
            let (err, _) = run_case(case, preset);
            if preset != "resilient" {
                // These budgets hold every message (the WAL preset needs more room: each
                // page is written twice, so some of its cases drop oversize messages).
                assert_eq!(summary_number(&err, "oversize "), 0, "{err}");
            }
        }
    }
}

#[test]
fn camera_images_larger_than_a_split_stay_under_the_bound() {
    // The robot mix: 2.7 MB images, 1 MiB point clouds, small IMU and TF messages.
    let case = Case {
        profile: "robot",
        count: 300,
        split: "1MiB",
        limit: "8MiB",
        extra: &[],
    };
    for preset in PRESETS {
        run_case(&case, preset);
    }
}

#[test]
fn messages_that_can_never_fit_are_dropped_as_oversize_and_the_bound_holds() {
    // 1 MiB messages under a 1 MiB budget: none can fit, even alone in a fresh split.
    let case = Case {
        profile: "large",
        count: 12,
        split: "200KiB",
        limit: "1MiB",
        extra: &[],
    };
    for preset in PRESETS {
        let (err, _) = run_case(&case, preset);
        assert_eq!(summary_number(&err, "oversize "), scaled(12), "{err}");
        assert_eq!(summary_number(&err, "written "), 0, "{err}");
        let warnings = err
            .lines()
            .filter(|l| l.contains("cannot fit under --max-record-size"))
            .count();
        assert_eq!(warnings, 1, "one warning per topic:\n{err}");
    }
}

fn files_bound_holds(split_args: &[&str], count: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("f");
    let mut args: Vec<String> = [
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-count",
        &count.to_string(),
        "--max-bag-files",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(split_args.iter().map(|s| s.to_string()));
    let (status, err, peak) = record_sampling(&args, &out);
    assert!(status.success(), "{err}");
    eprintln!(
        "--max-bag-files 2 {split_args:?}: at most {} split files over {} samples",
        peak.splits, peak.samples
    );
    assert!(
        peak.splits <= 2,
        "{split_args:?}: {} split files at once under --max-bag-files 2",
        peak.splits
    );
    assert!(summary_number(&err, "deleted by retention ") > 0, "{err}");
    assert_adds_up(&out, &err, "--max-bag-files 2");
}

#[test]
fn max_bag_files_is_exact_at_every_sample_when_splitting_by_size() {
    files_bound_holds(&["-b", "86016", "--synthetic-rate", "max"], scaled(30_000));
}

#[test]
fn max_bag_files_is_exact_at_every_sample_when_splitting_by_duration() {
    // 1000 messages/s for 2 s, a split every 0.3 s.
    files_bound_holds(&["-d", "0.3", "--synthetic-rate", "realtime"], 2000);
}

/// `record` with `args` to completion; returns (exit code, stderr, status-file count).
fn record_with_status(args: &[&str], status: &Path) -> (i32, String, u64) {
    let o = ringbag()
        .arg("record")
        .args(args)
        .arg("--status-file")
        .arg(status)
        .run_output()
        .expect("ringbag runs");
    let committed = crate::common::status_committed(status).expect("status file holds a count");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        committed,
    )
}

/// The summary's "splits kept" and "bag size" are what is on disk.
fn assert_disk_figures(dir: &Path, err: &str) {
    let files = ringbag::bag::reader::find_split_files(dir).unwrap();
    let bytes: u64 = files
        .iter()
        .map(|f| fs::metadata(dir.join(f)).unwrap().len())
        .sum();
    assert_eq!(
        summary_number(err, "splits kept "),
        files.len() as u64,
        "{err}"
    );
    assert_eq!(summary_number(err, "bag size now "), bytes, "{err}");
    assert!(bytes > 0);
}

#[test]
fn after_a_max_splits_stop_the_status_file_summary_and_bag_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let status = tmp.path().join("status.json");
    let (code, err, committed) = record_with_status(
        &[
            "-o",
            out.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-profile",
            "small",
            "--synthetic-rate",
            "max",
            "--synthetic-count",
            &scaled(50_000).to_string(),
            "-b",
            "86016",
            "--max-splits",
            "3",
        ],
        &status,
    );
    assert_eq!(code, 0, "{err}");
    let bag = Bag::open(&out).unwrap();
    let in_bag = bag.metadata.message_count;
    assert_eq!(
        committed, in_bag,
        "status file: never more than is in the bag"
    );
    assert_eq!(summary_number(&err, "written "), in_bag, "{err}");
    assert_adds_up(&out, &err, "--max-splits 3");
    assert_disk_figures(&out, &err);
    // What was accepted and never written is counted, in the summary and in the bag.
    let unwritten = summary_number(&err, "unwritten ");
    assert!(unwritten > 0, "{err}");
    assert_eq!(
        bag.metadata.custom_data.get("ringbag.unwritten_at_stop"),
        Some(&unwritten.to_string())
    );
    let dropped: u64 = bag.metadata.custom_data["ringbag.dropped_messages"]
        .parse()
        .unwrap();
    assert_eq!(
        dropped,
        summary_number(&err, "dropped ") + unwritten,
        "{err}"
    );
}

#[test]
fn a_full_disk_stop_counts_every_accepted_message_and_reports_what_is_on_disk() {
    let Some(fs) = crate::retention::Tmpfs::mount("24m") else {
        return;
    };
    let out = fs.dir.join("full");
    // Beside the full disk, so its last update is not lost to it.
    let status_dir = tempfile::tempdir().unwrap();
    let status = status_dir.path().join("status.json");
    let (code, err, committed) = record_with_status(
        &[
            "-o",
            out.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-profile",
            "medium",
            "--synthetic-rate",
            "max",
            "-b",
            "2MiB",
            // The full disk is the subject: the default free-space floor would delete the
            // 2 MiB splits and record on in a circle instead.
            "--min-free-space",
            "0",
        ],
        &status,
    );
    assert_eq!(code, 1, "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("free"), "{err}");
    let bag = Bag::open(&out).unwrap();
    let in_bag = bag.metadata.message_count;
    assert_eq!(committed, in_bag, "{err}");
    assert_eq!(summary_number(&err, "written "), in_bag, "{err}");
    let accepted = summary_number(&err, "accepted ");
    assert_eq!(
        accepted,
        in_bag + summary_number(&err, "unwritten "),
        "accepted = written + unwritten:\n{err}"
    );
    assert_disk_figures(&out, &err);
}

#[test]
fn a_reader_of_a_live_bag_never_trips_over_a_split_retention_just_deleted() {
    // Retention rewrites metadata.yaml and then deletes the oldest split, many times a second
    // here; a reader that read the old listing must not fail on the vanished file. (A live
    // bag's newest split is not listed yet, which the reader reports as a recording in
    // progress: that answer is right.)
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("live");
    let mut child = ringbag()
        .args(["record", "-o", out.to_str().unwrap()])
        .args(["--source", "synthetic", "--synthetic-profile", "small"])
        .args(["--synthetic-rate", "max", "--synthetic-count"])
        .arg(scaled(60_000).to_string())
        .args(["-b", "86016", "--max-bag-files", "3", "--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_execd()
        .expect("ringbag starts");
    let (mut opened, mut failures) = (0, Vec::new());
    while child.try_wait().expect("wait").is_none() {
        if !out.join("metadata.yaml").exists() {
            continue;
        }
        match Bag::open(&out) {
            Ok(_) => opened += 1,
            Err(e) if e.to_string().contains("recording in progress") => opened += 1,
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(child.wait().unwrap().success());
    eprintln!("read a live bag's metadata {opened} times");
    assert!(opened > 0);
    assert!(
        failures.is_empty(),
        "{} failures: {:?}",
        failures.len(),
        &failures[..1]
    );
}

/// `--compression-mode file`: while a split is compressed its `.db3` and its growing
/// `.zstd.partial` (then `.zstd`) exist side by side, and retention keeps room for that
/// (`BagWriter::compression_reserve`). Every file of the directory counts at every sample,
/// the partial ones included; retention deletes splits whose compression is queued or
/// running, counts a compressed split at its `.zstd`'s size once its `.db3` is gone, and
/// the bag reads afterwards.
#[test]
fn the_size_bound_holds_at_every_sample_while_splits_are_compressed() {
    for queue in ["1", "0"] {
        let extra: &'static [&'static str] = match queue {
            "1" => &[
                "--compression-mode",
                "file",
                "--compression-format",
                "zstd",
                "--compression-queue-size",
                "1",
            ],
            _ => &[
                "--compression-mode",
                "file",
                "--compression-format",
                "zstd",
                "--compression-queue-size",
                "0",
                "--compression-threads",
                "2",
            ],
        };
        // Retention counts a split at its `.zstd`'s size once compressed, so the template
        // payloads (~19x smaller) may all fit when compression keeps up; the robot mix's
        // realistic payloads (~1.4x) always overflow the budget, so that case must delete.
        let realistic: &'static [&'static str] = Box::leak(
            [extra, &["--synthetic-payload", "realistic"]]
                .concat()
                .into_boxed_slice(),
        );
        for (profile, count, split, limit, extra) in [
            ("medium", 400, "1MiB", "6MiB", extra),
            ("robot", 300, "1MiB", "10MiB", realistic),
        ] {
            let case = Case {
                profile,
                count,
                split,
                limit,
                extra,
            };
            let (err, peak) = run_case(&case, "write-optimized");
            // A split deleted before its queued job started is no failed compression.
            assert!(
                !err.contains("compressing a split"),
                "queue {queue}, {profile}: {err}"
            );
            if profile == "robot" {
                assert!(
                    summary_number(&err, "deleted by retention ") > 0,
                    "queue {queue}, {profile}: the budget was exercised:\n{err}"
                );
            }
            assert!(peak.samples > 0);
        }
    }
}
