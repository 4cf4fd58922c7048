//! Black-box snapshots end to end: the ring survives kill -9, triggers over the control
//! socket, the per-topic split and throttle counts, bad input.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use ringbag::bag::reader::{Bag, ReadFilter};

use crate::common::{bags_named, ringbag, run, sigint, stderr, trigger, wait_for};

/// A recorder of the synthetic `profile` with a ring, listening on `sock`.
fn recorder(root: &Path, name: &str, sock: &Path, ring: &Path, extra: &[&str]) -> Child {
    ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--bag-format", "jazzy", "--log-level", "info"])
        .arg("-o")
        .arg(root.join(name))
        .args(["--snapshot-size", "16MiB"])
        .arg("--snapshot-file")
        .arg(ring)
        .arg("--control-socket")
        .arg(sock)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("spawn record")
}

/// The `seq=` counter of a synthetic String message.
fn text_seq(data: &[u8]) -> u64 {
    let text = &data[8..8 + 20];
    let hex = std::str::from_utf8(&text[4..20]).expect("seq hex");
    u64::from_str_radix(hex, 16).expect("seq")
}

fn stop(child: Child) -> String {
    sigint(&child);
    let out = child.wait_with_output().expect("recorder ends");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn kill_9_100_ms_after_a_trigger_still_yields_a_bag_with_every_pre_window_message() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    // 100 B messages at 1 kHz into the ring only: 16 MiB holds far more than this run.
    let mut child = recorder(
        &root,
        "first",
        &sock,
        &ring,
        &["--synthetic-profile", "small"],
    );
    assert!(
        wait_for(Duration::from_secs(20), || sock.exists()),
        "socket appears"
    );
    // Let the ring fill for a moment so the pre-window holds messages (the check below does
    // not depend on how many).
    std::thread::sleep(Duration::from_millis(500));
    let t = trigger(&sock, &["--reason", "crash test", "--post", "10"]);
    assert!(t.status.success(), "{}", stderr(&t));
    let triggered_at = Instant::now();
    assert!(
        stderr(&t).starts_with("ringbag: snapshot started: "),
        "{}",
        stderr(&t)
    );
    std::thread::sleep(Duration::from_millis(100).saturating_sub(triggered_at.elapsed()));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // The restart into the same root finds the ring and writes the crash bag first.
    let out = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-count", "1"])
        .args(["--bag-format", "jazzy", "--snapshot-size", "16MiB"])
        .arg("--snapshot-file")
        .arg(&ring)
        .arg("-o")
        .arg(root.join("second"))
        .run_output()
        .expect("restart");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("with the snapshot \"crash test\" unfinished"),
        "{}",
        stderr(&out)
    );
    let crash = bags_named(&root, "_crash_crash-test");
    assert_eq!(
        crash.len(),
        1,
        "{:?}",
        std::fs::read_dir(&root).unwrap().collect::<Vec<_>>()
    );
    // One trigger, one bag: the snapshot bag being written at the kill was merged into the
    // crash bag and removed, not left beside it with an unclean lock.
    assert!(
        stderr(&out).contains("of the unfinished snapshot bag"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        bags_named(&root, "_snapshot_"),
        Vec::<PathBuf>::new(),
        "{}",
        stderr(&out)
    );
    let bag = Bag::open(&crash[0]).expect("crash bag opens");
    let custom = &bag.metadata.custom_data;
    assert_eq!(custom["ringbag.snapshot.reason"], "crash test");
    let trigger_ns: i64 = custom["ringbag.snapshot.trigger_time_ns"].parse().unwrap();
    let msgs: Vec<_> = bag
        .messages(&ReadFilter::default())
        .expect("read")
        .map(|m| m.expect("message"))
        .collect();
    let seqs: Vec<u64> = msgs.iter().map(|m| text_seq(&m.data)).collect();
    // Every message from the first the recorder made up to past the trigger: the pre-window
    // is all of the ring, and none of it is missing.
    assert_eq!(seqs.first(), Some(&0));
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let pre: Vec<_> = msgs.iter().filter(|m| m.timestamp <= trigger_ns).collect();
    assert!(pre.len() >= 100, "{} pre-window messages", pre.len());
    assert!(
        msgs.last().unwrap().timestamp > trigger_ns,
        "the messages up to the kill are there too"
    );
    eprintln!(
        "{}",
        stderr(&out)
            .lines()
            .find(|l| l.contains("left its ring"))
            .unwrap_or("")
    );
    eprintln!(
        "kill -9 100 ms after the trigger: crash bag {} holds {} messages ({} before the trigger), seq 0..{} without a gap",
        crash[0].display(),
        msgs.len(),
        pre.len(),
        seqs.len()
    );
    // Not recovered twice.
    let again = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-count", "1"])
        .args(["--snapshot-size", "16MiB"])
        .arg("--snapshot-file")
        .arg(&ring)
        .arg("-o")
        .arg(root.join("third"))
        .run_output()
        .expect("third run");
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(bags_named(&root, "_crash_").len(), 1);
}

#[test]
fn overlapping_and_stormy_triggers_make_one_bag_that_records_them_all() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    let child = recorder(
        &root,
        "cont",
        &sock,
        &ring,
        &["--synthetic-profile", "small"],
    );
    assert!(
        wait_for(Duration::from_secs(20), || sock.exists()),
        "socket appears"
    );
    let first = trigger(&sock, &["--reason", "first", "--pre", "0.2", "--post", "1"]);
    assert!(
        stderr(&first).contains("snapshot started"),
        "{}",
        stderr(&first)
    );
    let mut extended = 0;
    for i in 0..30 {
        let t = trigger(
            &sock,
            &["--reason", &format!("storm {}", i % 3), "--post", "1"],
        );
        assert!(t.status.success(), "{}", stderr(&t));
        extended += usize::from(stderr(&t).contains("snapshot extended"));
    }
    assert_eq!(
        extended, 30,
        "every overlapping trigger extends the open snapshot"
    );
    let bags = bags_named(&root, "_snapshot_");
    assert_eq!(bags.len(), 1, "{bags:?}");
    assert!(
        wait_for(Duration::from_secs(30), || bags[0]
            .join("metadata.yaml")
            .exists()),
        "the snapshot finishes while recording goes on"
    );
    let log = stop(child);
    let bag = Bag::open(&bags[0]).expect("snapshot bag opens");
    let c = &bag.metadata.custom_data;
    assert_eq!(c["ringbag.snapshot.triggers"], "31", "{log}");
    assert_eq!(
        c["ringbag.snapshot.reason"],
        "first; storm 0; storm 1; storm 2"
    );
    assert_eq!(c["ringbag.snapshot.origin"], "socket");
    let trigger_ns: i64 = c["ringbag.snapshot.trigger_time_ns"].parse().unwrap();
    let end_ns: i64 = c["ringbag.snapshot.window_end_ns"].parse().unwrap();
    let msgs: Vec<_> = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .map(|m| m.unwrap())
        .collect();
    // Window bounds: 0.2 s before the first trigger, up to the extended end; nothing missing.
    assert!(msgs
        .iter()
        .all(|m| m.timestamp >= trigger_ns - 200_000_000 && m.timestamp <= end_ns));
    let seqs: Vec<u64> = msgs.iter().map(|m| text_seq(&m.data)).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "no gap");
    assert!(
        end_ns > trigger_ns + 1_000_000_000,
        "extended past the first post-window"
    );
}

#[test]
fn ring_only_topics_stay_out_of_the_continuous_bag_and_throttled_ones_are_counted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let out = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "robot", "--synthetic-count", "2000"])
        .args(["--snapshot-size", "64MiB", "--snapshot-regex", "^/camera/"])
        .args(["--snapshot-topics", "/points"])
        .args(["--topic-rate", "/imu=40"])
        // 2000 robot messages are under 700 MB: with this budget the queue cannot fill, however
        // slowly the writer runs (qemu in CI dropped 151 IMU messages behind the cameras at
        // 100 MiB), so every count below is exact and load cannot change it.
        .args(["--max-cache-size", "1GiB"])
        .arg("--snapshot-file")
        .arg(tmp.path().join("ring"))
        .arg("-o")
        .arg(root.join("cont"))
        .run_output()
        .expect("record");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let line = |topic: &str| -> Vec<u64> {
        let mut lines = err
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(topic));
        let first = lines.next().unwrap_or_else(|| panic!("{topic} in {err}"));
        let mut nums: Vec<u64> = first
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if let Some(next) = lines.next().filter(|l| l.contains("ring only")) {
            nums.extend(
                next.split_whitespace()
                    .filter_map(|w| w.parse::<u64>().ok()),
            );
        } else {
            nums.extend([0, 0]);
        }
        nums // accepted written dropped unwritten lost [ring_only throttled]
    };
    let imu = line("/imu");
    let cam = line("/camera/front/image_raw");
    let points = line("/points");
    let tf = line("/tf");
    assert_eq!(cam[1], 0, "cameras are ring-only: {err}");
    assert_eq!(cam[5], cam[0], "{err}");
    assert_eq!(points[1], 0);
    assert_eq!(points[5], points[0]);
    // IMU: written + throttled = accepted exactly; no drops, none unwritten.
    assert_eq!(imu[1] + imu[6], imu[0], "{err}");
    assert_eq!((imu[2], imu[3]), (0, 0));
    assert!(imu[6] > 0 && imu[1] > 0, "{err}");
    // Neither ring-only nor throttled: recorded as without a ring.
    assert_eq!((tf[1], tf[5], tf[6]), (tf[0], 0, 0), "{err}");
    // The bag agrees.
    let bag = Bag::open(&root.join("cont")).expect("bag");
    let count = |t: &str| {
        bag.metadata
            .topics
            .iter()
            .find(|x| x.topic.name == t)
            .map_or(0, |x| x.message_count)
    };
    assert_eq!(count("/camera/front/image_raw"), 0);
    assert_eq!(count("/points"), 0);
    assert_eq!(count("/imu"), imu[1]);
    // The IMU runs at 400 Hz: at 40 Hz about a tenth is kept.
    let kept = imu[1] as f64 / imu[0] as f64;
    assert!((0.07..0.14).contains(&kept), "kept {kept} of the IMU");
}

#[test]
fn bad_snapshot_input_is_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out_dir = tmp.path().join("b");
    let ring = tmp.path().join("ring");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--snapshot-size".into(), "100TiB".into()],
            "does not fit",
        ),
        (
            vec![
                "--snapshot-size".into(),
                "8MiB".into(),
                "--trigger-topic".into(),
                "/estop:geometry_msgs/msg/Twist".into(),
            ],
            "unknown trigger topic type",
        ),
        (
            vec!["--snapshot-topics".into(), "/cam".into()],
            "--snapshot-topics needs --snapshot-size",
        ),
        (
            vec!["--topic-rate".into(), "/cam=fast".into()],
            "--topic-rate",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["record", "--source", "synthetic", "--synthetic-count", "1"];
        let ring_s = ring.to_string_lossy().to_string();
        let out_s = out_dir.to_string_lossy().to_string();
        args.extend(["--snapshot-file", &ring_s, "-o", &out_s]);
        let extra_refs: Vec<&str> = extra.iter().map(String::as_str).collect();
        let o = if extra_refs[0] == "--snapshot-size" {
            let mut a = args.clone();
            a.extend(&extra_refs);
            run(&a)
        } else {
            // Without a ring, --snapshot-file itself would be the complaint.
            let mut a = vec![
                "record",
                "--source",
                "synthetic",
                "--synthetic-count",
                "1",
                "-o",
                &out_s,
            ];
            a.extend(&extra_refs);
            run(&a)
        };
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{extra:?}: {e}");
        assert!(e.contains(needle), "{extra:?}: {e}");
        assert!(!out_dir.exists(), "{extra:?}: nothing created");
    }
    // The default ring file lives on /dev/shm (tmpfs): larger than its free space.
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-count",
        "1",
        "--snapshot-size",
        "100TiB",
        "-o",
        &out_dir.to_string_lossy(),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("ringbag: error: /dev/shm/ringbag-") && e.contains("does not fit"),
        "{e}"
    );
    assert!(!out_dir.exists());
    // A trigger with no recorder running.
    let o = run(&[
        "trigger",
        "--control-socket",
        &tmp.path().join("none.sock").to_string_lossy(),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("no recorder is listening"), "{e}");
}

/// Bytes of every split file under `root`.
fn splits_bytes(root: &Path) -> u64 {
    let mut total = 0;
    for bag in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(bag.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.contains(".db3") {
                total += f.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

#[test]
fn snapshot_bags_count_against_the_retention_budget_while_recording_goes_on() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    let budget = 1u64 << 20;
    let child = recorder(
        &root,
        "cont",
        &sock,
        &ring,
        &[
            "--synthetic-profile",
            "small",
            "--snapshot-topics",
            "/not/recorded",
            "-b",
            "86016",
            "--max-record-size",
            "1MiB",
        ],
    );
    assert!(
        wait_for(Duration::from_secs(20), || sock.exists()),
        "socket appears"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let t = trigger(&sock, &["--reason", "budget", "--post", "0.2"]);
    assert!(stderr(&t).contains("snapshot started"), "{}", stderr(&t));
    let snap = bags_named(&root, "_snapshot_budget")
        .pop()
        .expect("snapshot bag");
    assert!(
        wait_for(Duration::from_secs(30), || snap
            .join("metadata.yaml")
            .exists()),
        "snapshot finishes"
    );
    let splits_at_first = ringbag::bag::reader::find_split_files(&snap).unwrap().len();
    assert!(splits_at_first >= 1, "{splits_at_first} splits");
    // The continuous bag keeps growing; retention must reach the snapshot's oldest split
    // (and remove the bag with its last one). Meanwhile everything stays within the budget
    // (a split of slack for the open split's header pages and metadata, as the circular tests
    // allow).
    let mut most = 0;
    let deleted = wait_for(Duration::from_secs(60), || {
        most = most.max(splits_bytes(&root));
        ringbag::bag::reader::find_split_files(&snap).map_or(0, |f| f.len()) < splits_at_first
    });
    assert!(
        most <= budget + 86016,
        "{most} bytes on disk, budget {budget}"
    );
    let log = stop(child);
    assert!(deleted, "retention never deleted a snapshot split: {log}");
    // Everything under the root, snapshot included, within the budget (a split of slack for
    // the open split's header pages and metadata, as the circular tests allow).
    let total = splits_bytes(&root);
    assert!(
        total <= budget + 86016,
        "{total} bytes on disk, budget {budget}"
    );
}

/// Bytes under `root` as `du -b` counts them (every file, and a page per directory), or
/// `None` when the sample is torn: every counted file is stat'ed again at the end and must
/// still be the same inode, so a file deleted while sampling cannot add a peak that never
/// existed (files only grow between deletions: a sample that passes is a lower bound).
fn root_bytes(root: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 4096;
    let mut seen = Vec::new();
    for bag in std::fs::read_dir(root).ok()?.flatten() {
        let Ok(m) = bag.metadata() else { continue };
        if !m.is_dir() {
            total += m.len();
            continue;
        }
        total += 4096;
        for f in std::fs::read_dir(bag.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(m) = f.metadata() else { continue };
            total += m.len();
            seen.push((f.path(), m.ino()));
        }
    }
    seen.iter()
        .all(|(p, ino)| std::fs::symlink_metadata(p).is_ok_and(|m| m.ino() == *ino))
        .then_some(total)
}

/// Whether `bag` is finished (metadata.yaml written, no lock left) or gone.
fn finished_or_gone(bag: &Path) -> bool {
    !bag.exists()
        || (bag.join("metadata.yaml").exists()
            && ringbag::bag::lock::state(bag) == ringbag::bag::lock::LockState::Clean)
}

#[test]
fn a_snapshot_larger_than_the_budget_keeps_the_root_within_it_at_every_sample_and_is_cut_short() {
    snapshot_larger_than_the_budget("write-optimized");
}

#[test]
fn with_the_wal_preset_a_snapshot_larger_than_the_budget_keeps_the_root_within_it_too() {
    snapshot_larger_than_the_budget("resilient");
}

fn snapshot_larger_than_the_budget(preset: &str) {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    let budget: u64 = 2 << 20;
    // 6.5 MB/s of 64 KiB messages into the ring and the continuous bag (no topic is
    // ring-only): the ring holds about 16 MiB by the trigger, eight times the budget.
    let child = recorder(
        &root,
        "cont",
        &sock,
        &ring,
        &[
            "--synthetic-profile",
            "medium",
            "--snapshot-topics",
            "/not/recorded",
            "-b",
            "256KiB",
            "--max-record-size",
            "2MiB",
            "--storage-preset-profile",
            preset,
        ],
    );
    assert!(
        wait_for(Duration::from_secs(20), || sock.exists()),
        "socket appears"
    );
    std::thread::sleep(Duration::from_millis(2500));
    let t = trigger(&sock, &["--reason", "big", "--post", "0.2"]);
    assert!(stderr(&t).contains("snapshot started"), "{}", stderr(&t));
    let snap = bags_named(&root, "_snapshot_big")
        .pop()
        .expect("snapshot bag");
    let (mut most, mut samples, mut torn) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut finished_at = None;
    // Sample while the snapshot is written and 0.5 s after it is finished.
    while Instant::now() < deadline
        && finished_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500))
    {
        match root_bytes(&root) {
            Some(b) => {
                most = most.max(b);
                samples += 1;
            }
            None => torn += 1,
        }
        if finished_at.is_none() && finished_or_gone(&snap) {
            finished_at = Some(Instant::now());
        }
    }
    let log = stop(child);
    eprintln!("{preset}: root peak {most} B of {budget} B, {samples} samples ({torn} torn)");
    assert!(finished_at.is_some(), "the snapshot never finished: {log}");
    assert!(samples > 50, "{samples} samples");
    assert!(
        most <= budget,
        "the root held {most} bytes, budget {budget}: {log}"
    );
    assert!(
        log.contains("snapshot ring") && log.contains("is cut short"),
        "no warning at start: {log}"
    );
    assert!(log.contains("cut short: --max-record-size"), "{log}");
    assert!(!log.contains("ERROR") && !log.contains("panicked"), "{log}");
    // What was kept of it is a finished, readable bag that says it was cut.
    if snap.exists() {
        let bag = Bag::open(&snap).expect("snapshot bag opens");
        assert!(bag
            .metadata
            .custom_data
            .contains_key("ringbag.snapshot.cut"));
        assert!(bag
            .messages(&ReadFilter::default())
            .unwrap()
            .all(|m| m.is_ok()));
    }
}

#[test]
fn a_snapshot_keeps_the_free_space_floor_and_the_continuous_recording_goes_on() {
    // 4 MiB above the floor, for the continuous recording and the snapshot: the snapshot meets
    // the floor within its first MiBs, long before the ring (16 MiB) could wrap under it.
    let Some(fs) = crate::retention::Tmpfs::mount("16m") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let root = fs.dir.join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    let floor: u64 = 12 << 20;
    let free = || {
        let s = nix::sys::statvfs::statvfs(&fs.dir).unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    };
    let child = recorder(
        &root,
        "cont",
        &sock,
        &ring,
        &[
            "--synthetic-profile",
            "medium",
            "--snapshot-topics",
            "/not/recorded",
            "-b",
            "512KiB",
            "--min-free-space",
            "12MiB",
        ],
    );
    assert!(
        wait_for(Duration::from_secs(20), || sock.exists()),
        "socket appears"
    );
    std::thread::sleep(Duration::from_millis(2500));
    let t = trigger(&sock, &["--reason", "floor", "--post", "0.2"]);
    assert!(stderr(&t).contains("snapshot started"), "{}", stderr(&t));
    let snap = bags_named(&root, "_snapshot_floor")
        .pop()
        .expect("snapshot bag");
    let mut least = u64::MAX;
    let mut finished_at = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pid_alive = true;
    while Instant::now() < deadline
        && finished_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500))
    {
        least = least.min(free());
        if finished_at.is_none() && finished_or_gone(&snap) {
            finished_at = Some(Instant::now());
        }
        pid_alive =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), None).is_ok();
    }
    assert!(pid_alive);
    let o = {
        sigint(&child);
        child.wait_with_output().expect("recorder ends")
    };
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    eprintln!("least free {least} B, floor {floor} B");
    assert!(finished_at.is_some(), "the snapshot never finished: {log}");
    // The continuous recording went on, and stopped cleanly when asked.
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        least >= floor,
        "only {least} bytes free, floor {floor}: {log}"
    );
    assert!(
        log.contains("cut short: only")
            || log.contains("removed, nothing of its window fitted: only"),
        "{log}"
    );
    assert!(finished_or_gone(&snap), "{log}");
    if snap.exists() {
        let bag = Bag::open(&snap).expect("snapshot bag opens");
        assert!(bag
            .metadata
            .custom_data
            .contains_key("ringbag.snapshot.cut"));
    }
}

#[test]
fn a_stop_right_after_a_trigger_finishes_the_snapshot_whole_within_the_budget() {
    // The writer thread makes room for a snapshot bag batch by batch; it used to stop
    // answering as soon as the recording ended, so a SIGINT right after a trigger cut the
    // snapshot short at its first grant (or removed it). Now the writer keeps answering until
    // the open snapshot is finished with everything the ring holds.
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    let ring = tmp.path().join("ring");
    let status = tmp.path().join("status.json");
    let status_s = status.to_string_lossy().into_owned();
    // Every message goes into the ring; naming another topic as ring-only keeps
    // /synthetic/small in the continuous bag too, so the status file counts it.
    let mut child = recorder(
        &root,
        "bag",
        &sock,
        &ring,
        &[
            "--synthetic-profile",
            "small",
            "--synthetic-rate",
            "max",
            "--snapshot-topics",
            "/not/recorded",
            "--max-record-size",
            "1GiB",
            "-b",
            "64MiB",
            "--status-file",
            &status_s,
        ],
    );
    let committed = || -> u64 {
        std::fs::read_to_string(&status)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["committed"].as_u64())
            .unwrap_or(0)
    };
    // 60k messages of 100 B: about 8 MiB of ring records, far more than one copy batch.
    const HISTORY: u64 = 60_000;
    if !wait_for(Duration::from_secs(120), || committed() >= HISTORY) {
        let _ = child.kill();
        panic!("no history recorded: {}", stop(child));
    }
    // A post-window far beyond the stop: only the stop can close this snapshot.
    let t = trigger(&sock, &["--reason", "then stop", "--post", "600"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let err = stop(child);
    let snaps = bags_named(&root, "_snapshot_then-stop");
    assert_eq!(snaps.len(), 1, "{err}");
    let snap = &snaps[0];
    assert!(
        !snap.join(".ringbag.lock").exists(),
        "finished cleanly: {err}"
    );
    assert!(
        !err.contains("cut short") && !err.contains("removed"),
        "{err}"
    );
    let held = Bag::open(snap)
        .expect("snapshot opens")
        .metadata
        .message_count;
    assert!(
        held >= HISTORY,
        "the snapshot holds {held} messages; the ring held at least {HISTORY}: {err}"
    );
}
