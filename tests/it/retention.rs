//! Circular logging end to end: the size, duration, file-count and free-space budgets hold
//! while recording, old splits go first, and what remains is a true, readable bag.

use crate::common::SpawnExecd;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Instant;

use ringbag::bag::metadata::BagMetadata;
use ringbag::bag::reader::{find_split_files, find_splits, split_number, Bag, ReadFilter};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::Flavour;
use ringbag::retention::{Retention, RetentionPolicy, Verdict};

use crate::common::{ringbag, run, stderr, topic};

const MIB: u64 = 1 << 20;

/// Total bytes of every file in `dir` (splits, sidecars, metadata.yaml and its temp file).
/// Files that vanish between listing and stat are skipped.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn spawn_record(args: &[&str]) -> Child {
    ringbag()
        .arg("record")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("ringbag starts")
}

/// Poll `sample` as often as possible until the child exits; returns (exit output, samples).
fn sample_while_running(mut child: Child, mut sample: impl FnMut()) -> (std::process::Output, u64) {
    let mut n = 0;
    while child.try_wait().expect("wait works").is_none() {
        sample();
        n += 1;
    }
    sample();
    (child.wait_with_output().expect("output"), n + 1)
}

/// metadata.yaml lists exactly the split files on disk, its counts match the rows, and every
/// message reads back. Returns (metadata, messages as (topic, timestamp)).
pub(crate) fn assert_true_and_readable(dir: &Path) -> (BagMetadata, Vec<(usize, i64)>) {
    let meta = BagMetadata::read(dir).expect("metadata.yaml reads");
    // Compressed splits (`.db3.zstd`) included; `files[].path` names them by their `.db3`
    // name, as rosbag2 writes it.
    let on_disk: BTreeSet<String> = find_splits(dir).unwrap().into_iter().collect();
    let listed: BTreeSet<String> = meta.relative_file_paths.iter().cloned().collect();
    assert_eq!(
        listed, on_disk,
        "metadata.yaml must list exactly the files on disk"
    );
    let files: BTreeSet<String> = meta.files.iter().map(|f| f.path.clone()).collect();
    let plain: BTreeSet<String> = on_disk
        .iter()
        .map(|r| r.strip_suffix(".zstd").unwrap_or(r).to_string())
        .collect();
    assert_eq!(files, plain);
    let bag = Bag::open(dir).expect("bag opens");
    let msgs: Vec<(usize, i64)> = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .map(|m| m.map(|m| (m.topic, m.timestamp)).expect("message reads"))
        .collect();
    assert_eq!(msgs.len() as u64, meta.message_count, "message_count");
    for t in &meta.topics {
        let idx = bag.topic_index(&t.topic.name).unwrap();
        let n = msgs.iter().filter(|(i, _)| *i == idx).count() as u64;
        assert_eq!(n, t.message_count, "count of {}", t.topic.name);
    }
    if let (Some(first), Some(last)) = (msgs.first(), msgs.last()) {
        assert_eq!(meta.starting_time_ns, first.1, "starting_time");
        assert_eq!(meta.duration_ns, last.1 - first.1, "duration");
    }
    (meta, msgs)
}

fn lowest_split(dir: &Path) -> u64 {
    find_split_files(dir)
        .unwrap()
        .iter()
        .filter_map(|f| split_number(f))
        .min()
        .unwrap()
}

#[test]
fn duration_budget_bounds_the_span_of_the_kept_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dur");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "realtime",
        "--synthetic-count",
        "6000",
        "-d",
        "1",
        "--max-record-duration",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, msgs) = assert_true_and_readable(&out);
    let span = msgs.last().unwrap().1 - msgs.first().unwrap().1;
    eprintln!("duration bound: kept span {span} ns of limit 3e9 ns");
    assert!(span <= 3_000_000_000, "span {span} ns over 3 s");
    // Coverage: at least the limit minus one split duration (less a batch interval or two,
    // by which a split can run over -d).
    assert!(span >= 1_900_000_000, "span {span} ns under 1.9 s");
    assert!(lowest_split(&out) >= 2, "old splits were deleted");
}

#[test]
fn max_splits_stops_with_exactly_that_many_files_and_a_readable_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("five");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "medium",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "100000",
        "-b",
        "1MiB",
        "--max-splits",
        "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("--max-splits 5"), "{}", stderr(&o));
    let files = find_split_files(&out).unwrap();
    assert_eq!(files.len(), 5, "{files:?}");
    let (meta, msgs) = assert_true_and_readable(&out);
    assert_eq!(meta.files.len(), 5);
    assert!(meta.files.iter().all(|f| f.message_count > 0));
    assert!(msgs.len() >= 5 * 10, "{} messages", msgs.len());
}

#[test]
fn circular_flags_are_refused_before_recording_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o_ = out.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--max-record-size", "10MiB"],
            &["--max-record-size", "-b/--max-bag-size"],
        ),
        (
            &["-d", "60", "--max-record-size", "10MiB"],
            &["needs -b/--max-bag-size"],
        ),
        (
            &["-b", "1MiB", "--max-record-size", "1.5MiB"],
            &["--max-record-size"],
        ),
        (
            &["-b", "1MiB", "--max-record-size", "1MiB"],
            &["twice --max-bag-size"],
        ),
        (
            &["-d", "10", "--max-record-duration", "15"],
            &["twice --max-bag-duration"],
        ),
        (
            &["-b", "1MiB", "--max-record-size", "0"],
            &["--max-record-size", "greater than 0"],
        ),
        (
            &["-d", "1", "--max-record-duration=-5"],
            &["--max-record-duration"],
        ),
        (
            &["-b", "1MiB", "--max-bag-files", "0"],
            &["--max-bag-files"],
        ),
        (
            &["--min-free-space-percent", "120"],
            &["--min-free-space-percent", "100"],
        ),
        // `--min-free-space 0` is valid: it turns the floor (the default one too) off
        // (free_floor.rs).
    ];
    for (extra, needles) in cases {
        let mut args = vec!["record", "-o", o_, "--source", "synthetic"];
        args.extend_from_slice(extra);
        let o = run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        for n in *needles {
            assert!(err.contains(n), "`{n}` missing for {extra:?}: {err}");
        }
        assert!(!out.exists(), "{extra:?} created the bag");
    }
}

// ---- free space ----------------------------------------------------------------------

/// A tmpfs of `size` mounted on a fresh directory; unmounted on drop. `None` when mounting
/// is not possible here (not root, no CAP_SYS_ADMIN).
pub(crate) struct Tmpfs {
    pub(crate) dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Tmpfs {
    pub(crate) fn mount(size: &str) -> Option<Tmpfs> {
        let tmp = tempfile::tempdir().ok()?;
        let dir = tmp.path().join("mnt");
        fs::create_dir(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIP: cannot mount a tmpfs here; free space covered by unit tests only");
            return None;
        }
        Some(Tmpfs { dir, _tmp: tmp })
    }
    fn available(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.dir).unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn free_space_floor_holds_on_a_small_filesystem_by_deleting_old_splits() {
    let Some(fs16) = Tmpfs::mount("16m") else {
        return;
    };
    let out = fs16.dir.join("bag");
    let floor = 8 * MIB;
    let child = spawn_record(&[
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "medium",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "600",
        "-b",
        "1MiB",
        "--min-free-space",
        "8MiB",
    ]);
    let mut min_free = u64::MAX;
    let (o, samples) = sample_while_running(child, || {
        let free = fs16.available();
        min_free = min_free.min(free);
        assert!(free >= floor, "only {free} bytes free, floor {floor}");
    });
    assert!(o.status.success(), "{}", stderr(&o));
    eprintln!("free-space floor: {samples} samples, min free {min_free} B, floor {floor} B");
    assert_true_and_readable(&out);
    assert!(lowest_split(&out) > 0, "old splits were deleted");
}

#[test]
fn free_space_shortfall_with_nothing_to_delete_stops_cleanly_with_exit_1() {
    let Some(small) = Tmpfs::mount("4m") else {
        return;
    };
    let out = small.dir.join("bag");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "medium",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "1000",
        "-b",
        "1MiB",
        "--min-free-space",
        "8MiB",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("free-space floor") && err.contains("no closed split"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // It stopped before writing anything that would eat into the floor.
    assert!(small.available() > 3 * MIB, "{} free", small.available());
}

// ---- across bags (the service's recording root) ----------------------------------------

pub(crate) const T0: i64 = 1_700_000_000_000_000_000;

/// A finished bag with `splits` splits of `per_split` 1 KiB messages on two topics, starting
/// at `t0`, one message per millisecond.
pub(crate) fn old_bag(dir: &Path, t0: i64, splits: usize, per_split: usize) {
    let mut w = BagWriter::create(dir, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let a = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let b = w
        .add_topic(topic("/b", "std_msgs/msg/String"), None)
        .unwrap();
    let data = vec![7u8; 1024];
    let mut ts = t0;
    for s in 0..splits {
        for i in 0..per_split {
            let t = if i % 3 == 0 { b } else { a };
            w.write_batch([(t, ts, data.as_slice())]).unwrap();
            ts += 1_000_000;
        }
        if s + 1 < splits {
            w.split().unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn across_bags_the_oldest_bag_loses_its_oldest_splits_first_and_goes_when_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // Named so that name order and time order disagree: time order must win.
    old_bag(&root.join("boot_b"), T0, 3, 10);
    old_bag(&root.join("boot_a"), T0 + 3_600_000_000_000, 3, 10);
    fs::create_dir(root.join("not_a_bag")).unwrap();
    let current = root.join("boot_c");
    let mut w = BagWriter::create(&current, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let t = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let policy = RetentionPolicy {
        max_bag_files: Some(6),
        ..Default::default()
    };
    let mut r = Retention::open_root(root, &current, policy).unwrap();
    assert_eq!(r.closed_splits(), 6);
    assert_eq!(
        r.older_bags(),
        vec![root.join("boot_b"), root.join("boot_a")]
    );
    let data = vec![1u8; 100];
    let mut ts = T0 + 7_200_000_000_000;
    let mut trail = Vec::new();
    for step in 0..9 {
        let deleted = r.before_batch(&mut w, 200, ts).unwrap();
        w.write_batch([(t, ts, data.as_slice())]).unwrap();
        ts += 1_000_000;
        w.split().unwrap();
        let (v, more) = r.after_batch(&mut w).unwrap();
        assert_eq!(v, Verdict::Continue);
        let files = |d: &str| {
            find_split_files(&root.join(d))
                .map(|f| f.len())
                .unwrap_or(0)
        };
        trail.push((
            step,
            deleted + more,
            files("boot_b"),
            files("boot_a"),
            files("boot_c"),
        ));
        // Every bag still there is true and readable after each deletion.
        for d in ["boot_b", "boot_a"] {
            if root.join(d).exists() {
                assert_true_and_readable(&root.join(d));
            }
        }
        let total = files("boot_b") + files("boot_a") + files("boot_c");
        assert!(total <= 6, "step {step}: {total} files: {trail:?}");
    }
    // boot_b (oldest by time) emptied first and was removed; then boot_a; then the
    // current bag's own oldest splits.
    assert!(!root.join("boot_b").exists(), "{trail:?}");
    assert!(!root.join("boot_a").exists(), "{trail:?}");
    assert!(root.join("not_a_bag").exists());
    // Until boot_b is gone, boot_a keeps all its splits.
    for &(step, _, b, a, _) in &trail {
        assert!(b == 0 || a == 3, "step {step}: {trail:?}");
    }
    let b_counts: Vec<usize> = trail.iter().map(|t| t.2).collect();
    assert!(b_counts.windows(2).all(|w| w[1] <= w[0]), "{trail:?}");
    assert!(r.older_bags().is_empty());
    w.finish().unwrap();
    let (meta, _) = assert_true_and_readable(&current);
    assert!(meta.files.len() <= 6);
    assert!(
        lowest_split(&current) > 0,
        "current bag's oldest splits went last"
    );
}

#[test]
fn a_root_bag_with_unlisted_splits_is_reconciled_before_its_splits_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let old = root.join("crashed");
    old_bag(&old, T0, 3, 10);
    // An interrupted recording: metadata.yaml still names only the first split.
    let mut meta = BagMetadata::read(&old).unwrap();
    meta.files.truncate(1);
    meta.relative_file_paths.truncate(1);
    meta.message_count = meta.files[0].message_count;
    meta.write_atomic(&old, Flavour::Jazzy).unwrap();
    let current = root.join("now");
    let w = BagWriter::create(&current, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let r = Retention::open_root(root, &current, RetentionPolicy::default()).unwrap();
    assert_eq!(r.closed_splits(), 3);
    let (meta, msgs) = assert_true_and_readable(&old);
    assert_eq!(meta.files.len(), 3);
    assert_eq!(msgs.len(), 30);
    w.finish().unwrap();
}

/// Record one batch into a new bag beside the older bags (its open split makes one file
/// more than `max_bag_files` allows), until `gone` is deleted (at most `steps` batches).
fn record_until_gone(root: &Path, r: &mut Retention, gone: &Path, steps: usize) {
    let current = root.join("now");
    let mut w = BagWriter::create(&current, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let t = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let data = vec![1u8; 100];
    let mut ts = T0 + 7_200_000_000_000;
    for _ in 0..steps {
        if !gone.exists() {
            break;
        }
        r.before_batch(&mut w, 200, ts).unwrap();
        w.write_batch([(t, ts, data.as_slice())]).unwrap();
        ts += 1_000_000;
        let (v, _) = r.after_batch(&mut w).unwrap();
        assert_eq!(v, Verdict::Continue);
    }
    assert!(!gone.exists(), "{} was not deleted", gone.display());
    w.finish().unwrap();
}

#[test]
fn a_root_bag_compressed_by_rosbag2_is_counted_and_loses_its_oldest_zstd_split_staying_true() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let old = root.join("zbag");
    old_bag(&old, T0, 3, 10);
    crate::compressed::compress_like_rosbag2(&old);
    let rels = BagMetadata::read(&old).unwrap().relative_file_paths;
    assert!(rels.iter().all(|r| r.ends_with(".db3.zstd")), "{rels:?}");
    let policy = RetentionPolicy {
        max_bag_files: Some(3),
        ..Default::default()
    };
    let mut r = Retention::open_root(root, &root.join("now"), policy).unwrap();
    // Every compressed split is on the budget, at its size on disk.
    assert_eq!(r.closed_splits(), 3);
    let zbytes: u64 = rels
        .iter()
        .map(|r| fs::metadata(old.join(r)).unwrap().len())
        .sum();
    assert_eq!(r.closed_bytes(), zbytes);
    record_until_gone(root, &mut r, &old.join(&rels[0]), 3);
    let (meta, msgs) = assert_true_and_readable(&old);
    // The remaining splits stay compressed and listed as rosbag2 lists them.
    assert_eq!(meta.relative_file_paths, rels[1..].to_vec());
    assert_eq!(meta.compression_format, "zstd");
    assert_eq!(meta.compression_mode, "FILE");
    assert_eq!(msgs.len(), 20);
}

#[test]
fn a_split_there_plain_compressed_and_partial_is_counted_whole_and_deleted_in_every_form() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let old = root.join("mixed");
    old_bag(&old, T0, 3, 10);
    let rels = BagMetadata::read(&old).unwrap().relative_file_paths;
    // Split 0: its compression completed but the `.db3` was not removed yet (a crash in
    // between); split 1: a compression in progress (its hidden `.partial`).
    let z0 = ringbag::bag::compressed::compress_file(&old.join(&rels[0]), 1).unwrap();
    let partial1 = old.join(format!(".{}.zstd.partial", rels[1]));
    fs::write(&partial1, vec![0u8; 5000]).unwrap();
    let policy = RetentionPolicy {
        max_bag_files: Some(3),
        ..Default::default()
    };
    let mut r = Retention::open_root(root, &root.join("now"), policy).unwrap();
    assert_eq!(r.closed_splits(), 3);
    let meta_len = fs::metadata(old.join("metadata.yaml")).unwrap().len();
    // Every byte of every form is on the budget.
    assert_eq!(r.closed_bytes(), dir_bytes(&old) - meta_len);
    record_until_gone(root, &mut r, &old.join(&rels[0]), 3);
    assert!(!z0.exists(), "the .zstd of a deleted split must go with it");
    assert!(partial1.exists(), "split 1 is still there");
    let (meta, msgs) = assert_true_and_readable(&old);
    assert_eq!(meta.relative_file_paths, rels[1..].to_vec());
    assert_eq!(msgs.len(), 20);
}

// ---- long run ------------------------------------------------------------------------

fn rss_bytes() -> u64 {
    let statm = fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[test]
fn five_thousand_splits_under_a_size_budget_keep_memory_and_time_per_split_flat() {
    if !crate::common::in_test_child() {
        // RSS is per process: measured in a process of its own, so that other tests running
        // in parallel threads of this binary cannot make it look as if memory grew.
        let o = crate::common::run_test_in_own_process(
            "retention::five_thousand_splits_under_a_size_budget_keep_memory_and_time_per_split_flat",
        );
        eprint!("{}", String::from_utf8_lossy(&o.stderr));
        return;
    }
    // tmpfs when available, so the figures measure our work rather than the disk's fsync.
    let tmpfs = Tmpfs::mount("256m");
    let tmp = tempfile::tempdir().unwrap();
    let dir = match &tmpfs {
        Some(t) => t.dir.join("long"),
        None => tmp.path().join("long"),
    };
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.max_bag_size = 86016;
    let mut w = BagWriter::create(&dir, opts).unwrap();
    let t = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let limit = 1024 * 1024;
    let mut r = Retention::new(RetentionPolicy {
        max_record_size: Some(limit),
        ..Default::default()
    });
    let data = vec![3u8; 20_000];
    let target = 5000u32;
    let mut ts = T0;
    let mut marks: Vec<(u32, Instant, u64)> = Vec::new();
    let mut max_dir = 0;
    let started = Instant::now();
    while w.splits_created() < target {
        // As the recorder's pipeline does: rotate through retention when the split is full,
        // make room, write.
        let row = [(t, ts, data.as_slice())];
        if w.rows_fitting(&row) == 0 {
            r.rotate(&mut w).unwrap();
        }
        let growth = ringbag::bag::writer::row_growth_bytes(data.len() as u64, w.page_size());
        r.before_batch(&mut w, growth, ts).unwrap();
        w.write_rows(&row).unwrap();
        ts += 1_000_000;
        r.after_batch(&mut w).unwrap();
        let n = w.splits_created();
        if n.is_multiple_of(100) && marks.last().is_none_or(|m| m.0 != n) {
            marks.push((n, Instant::now(), rss_bytes()));
            let b = dir_bytes(&dir);
            max_dir = max_dir.max(b);
            assert!(b <= limit, "{b} bytes at split {n}");
        }
    }
    let total = started.elapsed();
    let at = |n: u32| marks.iter().find(|m| m.0 == n).copied().unwrap();
    let (_, t_1000, rss_1000) = at(1000);
    let (_, t_2000, _) = at(2000);
    let (_, t_4000, _) = at(4000);
    let (_, t_5000, rss_5000) = at(5000);
    let first = (t_2000 - t_1000).as_secs_f64() * 1e3 / 1000.0;
    let last = (t_5000 - t_4000).as_secs_f64() * 1e3 / 1000.0;
    eprintln!(
        "long run: {target} splits in {:.1} s ({}); ms/split splits 1000-2000: {first:.3}, \
         4000-5000: {last:.3}; RSS at 1000: {} KiB, at 5000: {} KiB; max dir {max_dir} B of \
         {limit} B; deleted {}",
        total.as_secs_f64(),
        if tmpfs.is_some() { "tmpfs" } else { "disk" },
        rss_1000 / 1024,
        rss_5000 / 1024,
        r.deleted()
    );
    assert!(r.deleted() as u32 >= target - 20);
    assert!(
        last < first * 3.0 + 0.5,
        "time per split grew: {first} -> {last} ms"
    );
    assert!(
        rss_5000 < rss_1000 + 16 * MIB,
        "RSS grew from {rss_1000} to {rss_5000}"
    );
    w.finish().unwrap();
    assert_true_and_readable(&dir);
}

#[test]
fn a_crash_between_the_metadata_rewrite_and_the_file_removal_leaves_a_readable_bag() {
    // Retention rewrites metadata.yaml without the oldest split first, then removes the file:
    // this is the state a crash in between leaves.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cut");
    old_bag(&dir, T0, 3, 10);
    crate::common::unlist_split(&dir, 0);
    let meta = BagMetadata::read(&dir).unwrap();
    let bag = Bag::open(&dir).expect("the reader opens it");
    let n = bag.messages(&ReadFilter::default()).unwrap().count() as u64;
    assert_eq!(n, meta.message_count);
}

#[test]
fn a_recovered_bag_stays_inside_the_budget_of_the_next_recording() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // A crashed recording: 6 splits of ~80 KB and no metadata.yaml.
    let crashed = root.join("boot_1");
    crate::common::write_bag(
        &crashed,
        Flavour::Jazzy,
        &[("/a", "std_msgs/msg/String")],
        600,
        100,
    );
    fs::remove_file(crashed.join("metadata.yaml")).unwrap();
    let crashed_before = dir_bytes(&crashed);
    let limit = 600 * 1024u64;
    let out = root.join("boot_2");
    let o = run(&[
        "record",
        "--recover",
        "-o",
        out.to_str().unwrap(),
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "20000",
        "-b",
        "86016",
        "--max-record-size",
        &limit.to_string(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The crashed bag was reindexed, then paid for the new recording, oldest splits first.
    let total = dir_bytes(&out) + dir_bytes(&crashed);
    assert!(total <= limit, "{total} > {limit}");
    assert!(
        dir_bytes(&crashed) < crashed_before,
        "the recovered bag's old splits went first"
    );
    if crashed.exists() {
        let bag = Bag::open(&crashed).expect("what remains of the recovered bag is true");
        let n = bag.messages(&ReadFilter::default()).unwrap().count() as u64;
        assert_eq!(n, bag.metadata.message_count);
    }
    Bag::open(&out).unwrap();
}

#[test]
fn older_bags_over_the_budget_make_room_before_the_new_bag_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    old_bag(&root.join("boot_a"), T0, 3, 10);
    old_bag(&root.join("boot_b"), T0 + 3_600_000_000_000, 3, 10);
    let all_splits = |root: &Path| -> usize {
        ["boot_a", "boot_b"]
            .iter()
            .map(|b| find_split_files(&root.join(b)).map_or(0, |f| f.len()))
            .sum()
    };
    assert_eq!(all_splits(root), 6);
    // A restart with a smaller budget: 3 files, the new bag's first split included.
    let policy = RetentionPolicy {
        max_bag_files: Some(3),
        ..Default::default()
    };
    let current = root.join("boot_c");
    let mut r = Retention::open_root(root, &current, policy).unwrap();
    let deleted = r.before_new_bag(root).unwrap();
    assert_eq!(
        deleted, 4,
        "oldest first, until the new split has its place"
    );
    assert_eq!(all_splits(root), 2);
    assert!(
        !root.join("boot_a").exists(),
        "the emptied oldest bag is gone"
    );
    assert_true_and_readable(&root.join("boot_b"));
    assert!(!current.exists(), "nothing of the new bag exists yet");
}
