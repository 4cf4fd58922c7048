//! Crash recovery of a damaged snapshot ring: whatever the ring's header and tables say, the
//! next start reads each intact record at most once, says what it could not recover and why,
//! writes only a bag ringbag itself reads (or none), obeys the budget, and records.

use crate::common::SpawnExecd;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use ringbag::bag::reader::Bag;
use ringbag::snapshot::ring::{PendingTrigger, Ring, RingTopic, RingWriter, DATA_AT, REC_HEADER};

use crate::common::stamps as stamps_of;
use crate::common::{cdr_string, now_ns, ringbag, stderr, topic, wait_deadline, RunOutput};

/// Header fields (see the layout in src/snapshot/ring.rs).
const H_CAPACITY: u64 = 16;
const H_TAIL: u64 = 40;
const H_HEAD: u64 = 48;
const TOPIC_SLOTS_AT: u64 = 4096;
const TOPIC_SLOT_BYTES: u64 = 256 * 1024;
const CAPACITY: u64 = 1 << 20;
const RECORDS: i64 = 200;

/// A ring left by a recorder that died: `RECORDS` strings on /chatter 1 ms apart, ending a
/// second ago, plus one record per stamp in `extra`. Returns the stamps of the regular ones.
fn plant_ring(path: &Path, extra: &[i64]) -> Vec<i64> {
    plant_ring_with(path, extra, None)
}

fn plant_ring_with(path: &Path, extra: &[i64], pending: Option<PendingTrigger>) -> Vec<i64> {
    let ring = Arc::new(Ring::create(path, CAPACITY, 0).expect("create ring"));
    ring.set_pending_trigger(pending.as_ref());
    let mut w = RingWriter::new(ring);
    let t = w
        .add_topic(RingTopic::new(
            &topic("/chatter", "std_msgs/msg/String"),
            None,
        ))
        .expect("topic");
    let t0 = now_ns() - 1_000_000_000 - RECORDS * 1_000_000;
    let stamps: Vec<i64> = (0..RECORDS).map(|i| t0 + i * 1_000_000).collect();
    for (i, ts) in stamps.iter().enumerate() {
        w.append(t, *ts, &cdr_string(&format!("hello {i}")))
            .expect("append");
        if i == 100 {
            for x in extra {
                w.append(t, *x, &cdr_string("extreme")).expect("append");
            }
        }
    }
    // Dropped without mark_clean: as after a kill -9.
    stamps
}

fn poke(path: &Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
}

fn peek_u64(path: &Path, at: u64) -> u64 {
    let b = std::fs::read(path).unwrap();
    u64::from_le_bytes(b[at as usize..at as usize + 8].try_into().unwrap())
}

/// `ringbag record` into `root/name` with the ring at `ring`: a few synthetic messages, so
/// it ends by itself once recording has started. Killed (None) after 60 s.
fn restart(root: &Path, name: &str, ring: &Path, extra: &[&str]) -> Option<std::process::Output> {
    let child = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-count", "5"])
        .args(["--snapshot-size", "2MiB"])
        .args(if extra.contains(&"--bag-format") {
            &[][..]
        } else {
            &["--bag-format", "jazzy"][..]
        })
        .arg("--snapshot-file")
        .arg(ring)
        .arg("-o")
        .arg(root.join(name))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("spawn record");
    wait_deadline(child, 60)
}

/// The restart recorded its 5 messages into `root/new` (into the ring only, by default).
fn recorded(root: &Path, err: &str) -> bool {
    Bag::open(&root.join("new")).is_ok() && err.contains("accepted 5 messages")
}

fn crash_bags(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("_crash_"))
        .collect();
    v.sort();
    v
}

/// The crash bag's size must never pass the budget: the splits' bytes on disk.
fn bag_bytes(bag: &Path) -> u64 {
    std::fs::read_dir(bag)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Damage done to a planted ring file.
type Corruption = Box<dyn Fn(&Path)>;

#[test]
fn a_ring_with_a_corrupted_header_is_recovered_once_per_record_and_recording_starts() {
    let rec = REC_HEADER + 16; // one "hello N" record: header + 16 bytes of CDR
    let cases: Vec<(&str, Corruption, i64)> = vec![
        (
            "head 2^62",
            Box::new(|p: &Path| poke(p, H_HEAD, &(1u64 << 62).to_le_bytes())),
            RECORDS,
        ),
        (
            "tail beyond head",
            Box::new(|p: &Path| {
                let head = peek_u64(p, H_HEAD);
                poke(p, H_TAIL, &(head + 8 * 1000).to_le_bytes())
            }),
            RECORDS,
        ),
        (
            "head - tail beyond the capacity",
            Box::new(|p: &Path| poke(p, H_HEAD, &(3 * CAPACITY + 64).to_le_bytes())),
            RECORDS,
        ),
        (
            "a record's length beyond the file (its header CRC intact)",
            Box::new(move |p: &Path| {
                // Record 10's header: length u32::MAX, its header CRC recomputed.
                let at = DATA_AT + 10 * rec;
                let mut h =
                    std::fs::read(p).unwrap()[at as usize..(at + REC_HEADER) as usize].to_vec();
                h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
                let crc = crc32fast::hash(&h[..24]);
                h[24..28].copy_from_slice(&crc.to_le_bytes());
                poke(p, at, &h);
            }),
            RECORDS - 1,
        ),
        (
            "capacity smaller than the file",
            Box::new(|p: &Path| poke(p, H_CAPACITY, &(64u64 * 1024).to_le_bytes())),
            RECORDS,
        ),
    ];
    for (what, corrupt, expected) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let ring = tmp.path().join("ring");
        let planted = plant_ring(&ring, &[]);
        corrupt(&ring);
        let started = std::time::Instant::now();
        let out = restart(&root, "new", &ring, &[])
            .unwrap_or_else(|| panic!("{what}: recovery did not finish within 60 s"));
        let err = stderr(&out);
        assert!(out.status.success(), "{what}: {err}");
        let crash = crash_bags(&root);
        assert_eq!(crash.len(), 1, "{what}: {crash:?}\n{err}");
        let got = stamps_of(&crash[0]);
        // Each real record at most once, and every intact one.
        let mut unique = got.clone();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "{what}: duplicates");
        assert!(got.iter().all(|t| planted.contains(t)), "{what}");
        assert_eq!(got.len() as i64, expected, "{what}: {err}");
        if what != "a record's length beyond the file (its header CRC intact)" {
            assert!(
                err.contains("the ring's header is damaged"),
                "{what}: the repair is reported: {err}"
            );
        } else {
            assert!(err.contains("lost 1 damaged records"), "{what}: {err}");
        }
        // Recording started and finished.
        assert!(recorded(&root, &err), "{what}: {err}");
        eprintln!(
            "{what}: recovered {} of {} records in {:.2} s",
            got.len(),
            RECORDS,
            started.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn the_crash_bag_obeys_the_roots_size_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ring = tmp.path().join("ring");
    // 1 MiB of records (1 KiB each) against a budget of 512 KiB.
    {
        let r = Arc::new(Ring::create(&ring, CAPACITY, 0).unwrap());
        let mut w = RingWriter::new(r);
        let t = w
            .add_topic(RingTopic::new(
                &topic("/cam", "sensor_msgs/msg/CompressedImage"),
                None,
            ))
            .unwrap();
        let t0 = now_ns() - 2_000_000_000;
        for i in 0..1000i64 {
            w.append(t, t0 + i * 1_000_000, &[i as u8; 1000]).unwrap();
        }
    }
    let budget = 512 * 1024;
    let out = restart(
        &root,
        "new",
        &ring,
        // Without --recover the root's other bags are not on the budget: the crash bag must
        // fit under it alone, at every moment (the recording after it cannot repair that).
        &["-b", "100KiB", "--max-record-size", &budget.to_string()],
    )
    .expect("finishes");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let crash = crash_bags(&root);
    assert_eq!(crash.len(), 1, "{err}");
    let bytes = bag_bytes(&crash[0]);
    assert!(bytes <= budget, "crash bag of {bytes} bytes: {err}");
    // The newest are kept (retention deletes the oldest splits), in order, each once.
    let got = stamps_of(&crash[0]);
    assert!(!got.is_empty() && got.len() < 1000, "{} kept", got.len());
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    eprintln!(
        "crash bag under --max-record-size {budget}: {bytes} bytes, the newest {} of 1000 records",
        got.len()
    );
}

#[test]
fn a_ring_whose_topic_table_is_garbage_writes_no_bag_and_says_what_was_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ring = tmp.path().join("ring");
    plant_ring(&ring, &[]);
    for slot in [TOPIC_SLOTS_AT, TOPIC_SLOTS_AT + TOPIC_SLOT_BYTES] {
        poke(&ring, slot + 16, b"garbage garbage garbage");
    }
    let out = restart(&root, "new", &ring, &[]).expect("finishes");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "no crash bag written: lost {RECORDS} records: neither copy of its topic table is intact"
        )),
        "{err}"
    );
    assert!(crash_bags(&root).is_empty(), "{err}");
    assert!(recorded(&root, &err), "{err}");
}

#[test]
fn records_with_extreme_stamps_are_left_out_and_the_crash_bag_reads_and_plays() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ring = tmp.path().join("ring");
    let planted = plant_ring(
        &ring,
        &[i64::MIN, -1, 0, i64::MAX, now_ns() + 400 * 86_400e9 as i64],
    );
    let out = restart(&root, "new", &ring, &[]).expect("finishes");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("lost 5 records stamped outside the plausible"),
        "{err}"
    );
    let crash = crash_bags(&root);
    assert_eq!(crash.len(), 1, "{err}");
    assert_eq!(stamps_of(&crash[0]), planted);
    let info = ringbag()
        .arg("info")
        .arg(&crash[0])
        .run_output()
        .expect("info runs");
    assert!(info.status.success(), "{}", stderr(&info));
    let play = ringbag()
        .arg("play")
        .arg(&crash[0])
        .args(["--sink", "echo"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("play runs");
    let play = wait_deadline(play, 30).expect("play ends");
    assert!(play.status.success(), "{}", stderr(&play));
}

#[test]
fn a_failed_start_leaves_no_crash_bag_for_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ring = tmp.path().join("ring");
    // The control socket cannot be bound: its directory is a regular file.
    let blocker = tmp.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let bad_sock = blocker.join("control.sock");
    for name in ["first", "second"] {
        let out = restart(
            &root,
            name,
            &ring,
            &["--control-socket", bad_sock.to_str().unwrap()],
        )
        .expect("finishes");
        let err = stderr(&out);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.lines()
                .any(|l| l.starts_with("ringbag: error: ") && l.contains("control.sock")),
            "{err}"
        );
        assert!(!err.contains("left its ring"), "{name}: {err}");
    }
    // A later start-up error, after the ring exists: the budget cannot make room for the new
    // bag. A free-space floor of 99.999% is never met here: the 1.5 MiB ring itself is on
    // the same filesystem, more than 0.001% of any filesystem under 150 GB.
    let out = restart(
        &root,
        "floor",
        &ring,
        &["--recover", "--min-free-space-percent", "99.999"],
    )
    .expect("finishes");
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("ringbag: error: ") && l.contains("free-space floor")),
        "{err}"
    );
    assert!(!err.contains("left its ring"), "{err}");
    let out = restart(&root, "third", &ring, &[]).expect("finishes");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("left its ring"), "{err}");
    assert!(crash_bags(&root).is_empty(), "{err}");
}

#[test]
fn a_humble_crash_bag_carries_its_trigger_in_snapshot_yaml_which_info_reindex_and_play_accept() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ring = tmp.path().join("ring");
    let t = now_ns() - 1_100_000_000;
    let planted = plant_ring_with(
        &ring,
        &[],
        Some(PendingTrigger {
            reason: "estop".into(),
            trigger_ns: t,
            start_ns: t - 5_000_000_000,
            end_ns: t + 2_000_000_000,
            origin: "socket".into(),
            ..Default::default()
        }),
    );
    let out = restart(&root, "new", &ring, &["--bag-format", "humble"]).expect("finishes");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let crash = crash_bags(&root);
    assert_eq!(crash.len(), 1, "{err}");
    let side: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(crash[0].join("snapshot.yaml")).unwrap())
            .unwrap();
    assert_eq!(side["reason"].as_str(), Some("estop"));
    assert_eq!(side["origin"].as_str(), Some("socket"));
    assert_eq!(
        side["trigger_time_ns"].as_str(),
        Some(t.to_string().as_str())
    );
    assert_eq!(
        side["window_start_ns"].as_str(),
        Some((t - 5_000_000_000).to_string().as_str())
    );
    assert_eq!(
        side["window_end_ns"].as_str(),
        Some((t + 2_000_000_000).to_string().as_str())
    );
    assert!(side["trigger_time"].as_str().unwrap().ends_with('Z'));
    // ringbag's own tools take the bag with its side file as it is.
    let info = ringbag().arg("info").arg(&crash[0]).run_output().unwrap();
    assert!(info.status.success(), "{}", stderr(&info));
    let reindex = ringbag()
        .arg("reindex")
        .arg(&crash[0])
        .run_output()
        .unwrap();
    assert!(reindex.status.success(), "{}", stderr(&reindex));
    assert!(crash[0].join("snapshot.yaml").is_file());
    assert_eq!(stamps_of(&crash[0]), planted);
    let play = ringbag()
        .arg("play")
        .arg(&crash[0])
        .args(["--sink", "echo"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .unwrap();
    let play = wait_deadline(play, 30).expect("play ends");
    assert!(play.status.success(), "{}", stderr(&play));
    // Retention deletes the bag, side file and all, once the budget needs its place.
    let out = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "medium", "--synthetic-count", "30"])
        .args(["--bag-format", "humble", "--recover", "-b", "100KiB"])
        .args(["--max-record-size", "400KiB"])
        .arg("-o")
        .arg(root.join("later"))
        .run_output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!crash[0].exists(), "{}", stderr(&out));
}
