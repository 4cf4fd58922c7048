//! Retention that knows what got out (issue 24): with an upload ledger, uploaded files are
//! deleted first, whichever bag holds them; a file not out goes only when the budget forces
//! it, is aborted first, counted and reported; `delete_after_upload` deletes what is out at
//! the next turn. Every bag stays true and readable.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use ringbag::bag::metadata::BagMetadata;
use ringbag::bag::reader::{find_split_files, Bag, ReadFilter};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::Flavour;
use ringbag::retention::{
    DeletedBeforeUpload, Retention, RetentionPolicy, UploadLedger, UploadState,
};

use crate::common::topic;
use crate::retention::{assert_true_and_readable, dir_bytes, old_bag, T0};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// `abort(path)`, and whether the file still existed then.
    Abort(PathBuf, bool),
    /// `deleted_before_upload(path, bytes)`, and whether the file still existed then.
    Lost(PathBuf, u64, bool),
}

/// The uploader's side, faked: states set by the test (unknown files are pending), calls
/// recorded in order.
#[derive(Debug, Default)]
struct FakeLedger {
    states: Mutex<HashMap<PathBuf, UploadState>>,
    events: Mutex<Vec<Event>>,
    generation: AtomicU64,
    /// Set by `deleted_before_upload` when some file marked uploaded was still on disk: a
    /// forced deletion must happen only when nothing uploaded is left.
    uploaded_left_at_forced: Mutex<Vec<PathBuf>>,
}

impl FakeLedger {
    fn set(&self, file: &Path, s: UploadState) {
        self.states.lock().unwrap().insert(file.to_path_buf(), s);
        if s == UploadState::Uploaded {
            self.generation.fetch_add(1, SeqCst);
        }
    }
    /// Mark uploaded without telling (the generation stays).
    fn set_quietly(&self, file: &Path, s: UploadState) {
        self.states.lock().unwrap().insert(file.to_path_buf(), s);
    }
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

impl UploadLedger for FakeLedger {
    fn state(&self, file: &Path) -> UploadState {
        self.states
            .lock()
            .unwrap()
            .get(file)
            .copied()
            .unwrap_or(UploadState::Pending)
    }
    fn abort(&self, file: &Path) {
        self.events
            .lock()
            .unwrap()
            .push(Event::Abort(file.to_path_buf(), file.exists()));
        self.states
            .lock()
            .unwrap()
            .insert(file.to_path_buf(), UploadState::Pending);
    }
    fn deleted_before_upload(&self, file: &Path, bytes: u64) {
        let left: Vec<PathBuf> = self
            .states
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, s)| **s == UploadState::Uploaded && p.exists())
            .map(|(p, _)| p.clone())
            .collect();
        self.uploaded_left_at_forced.lock().unwrap().extend(left);
        self.events
            .lock()
            .unwrap()
            .push(Event::Lost(file.to_path_buf(), bytes, file.exists()));
    }
    fn generation(&self) -> u64 {
        self.generation.load(SeqCst)
    }
}

fn splits(dir: &Path) -> Vec<PathBuf> {
    find_split_files(dir)
        .map(|f| f.into_iter().map(|n| dir.join(n)).collect())
        .unwrap_or_default()
}

fn files_policy(n: u32) -> RetentionPolicy {
    RetentionPolicy {
        max_bag_files: Some(n),
        ..Default::default()
    }
}

/// A recording root: `boot_a` (3 splits of 10 messages, oldest), a newer snapshot bag `snap`
/// (2 splits), and the path of the bag about to be recorded.
fn root_with_a_continuous_and_a_snapshot_bag(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let boot = root.join("boot_a");
    let snap = root.join("snapshot_estop");
    old_bag(&boot, T0, 3, 10);
    old_bag(&snap, T0 + 60_000_000_000, 2, 10);
    (boot, snap, root.join("boot_b"))
}

#[test]
fn uploaded_files_go_first_even_when_newer_and_the_older_ones_not_out_survive() {
    let tmp = tempfile::tempdir().unwrap();
    let (boot, snap, current) = root_with_a_continuous_and_a_snapshot_bag(tmp.path());
    let ledger = Arc::new(FakeLedger::default());
    for s in splits(&snap) {
        ledger.set(&s, UploadState::Uploaded);
    }
    // 5 closed splits, room for 3 (+ the new bag's first): 2 must go.
    let mut r = Retention::open_root(tmp.path(), &current, files_policy(4))
        .unwrap()
        .with_upload_ledger(ledger.clone());
    assert_eq!(r.before_new_bag(tmp.path()).unwrap(), 2);
    assert!(!snap.exists(), "the uploaded snapshot bag went, whole");
    assert_eq!(splits(&boot).len(), 3, "the older splits not out survive");
    assert_true_and_readable(&boot);
    assert_eq!(r.deleted_before_upload(), DeletedBeforeUpload::default());
    assert!(r.deleted_before_upload_per_bag().is_empty());
    assert_eq!(ledger.events(), vec![], "nothing aborted, nothing lost");

    // Without a ledger the same root loses its oldest splits instead (today's order).
    let tmp = tempfile::tempdir().unwrap();
    let (boot, snap, current) = root_with_a_continuous_and_a_snapshot_bag(tmp.path());
    let mut r = Retention::open_root(tmp.path(), &current, files_policy(4)).unwrap();
    assert_eq!(r.before_new_bag(tmp.path()).unwrap(), 2);
    assert_eq!(splits(&boot).len(), 1);
    assert_eq!(splits(&snap).len(), 2);
}

#[test]
fn a_forced_deletion_of_a_file_not_out_is_aborted_first_counted_per_bag_and_told_to_the_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let (boot, snap, current) = root_with_a_continuous_and_a_snapshot_bag(tmp.path());
    let ledger = Arc::new(FakeLedger::default());
    for s in splits(&snap) {
        ledger.set(&s, UploadState::Uploaded);
    }
    let boot_splits = splits(&boot);
    // The oldest split is being uploaded right now.
    ledger.set(&boot_splits[0], UploadState::InFlight);
    let sizes: Vec<u64> = boot_splits
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .collect();
    // Room for 1 closed split: the 2 uploaded go, then 2 of boot_a's are forced.
    let mut r = Retention::open_root(tmp.path(), &current, files_policy(2))
        .unwrap()
        .with_upload_ledger(ledger.clone());
    assert_eq!(r.before_new_bag(tmp.path()).unwrap(), 4);
    assert!(!snap.exists());
    assert_eq!(splits(&boot), vec![boot_splits[2].clone()]);
    let (meta, msgs) = assert_true_and_readable(&boot);
    assert_eq!(meta.message_count, 10);
    assert_eq!(msgs.len(), 10);
    let lost = DeletedBeforeUpload {
        files: 2,
        bytes: sizes[0] + sizes[1],
    };
    assert_eq!(r.deleted_before_upload(), lost);
    assert_eq!(
        r.deleted_before_upload_per_bag().get(&boot).copied(),
        Some(lost),
        "counted against boot_a"
    );
    assert_eq!(r.deleted_before_upload_per_bag().len(), 1);
    // Each file not out: aborted while it still existed, reported once gone; oldest first.
    assert_eq!(
        ledger.events(),
        vec![
            Event::Abort(boot_splits[0].clone(), true),
            Event::Lost(boot_splits[0].clone(), sizes[0], false),
            Event::Abort(boot_splits[1].clone(), true),
            Event::Lost(boot_splits[1].clone(), sizes[1], false),
        ]
    );
    assert!(ledger.uploaded_left_at_forced.lock().unwrap().is_empty());
}

#[test]
fn deleting_a_middle_split_of_an_older_bag_keeps_it_readable_and_its_metadata_true() {
    let tmp = tempfile::tempdir().unwrap();
    let boot = tmp.path().join("boot_a");
    old_bag(&boot, T0, 4, 10);
    let s = splits(&boot);
    let before = BagMetadata::read(&boot).unwrap();
    let ledger = Arc::new(FakeLedger::default());
    ledger.set(&s[2], UploadState::Uploaded);
    let current = tmp.path().join("boot_b");
    let mut r = Retention::open_root(tmp.path(), &current, files_policy(4))
        .unwrap()
        .with_upload_ledger(ledger.clone());
    assert_eq!(r.before_new_bag(tmp.path()).unwrap(), 1);
    assert_eq!(
        splits(&boot),
        vec![s[0].clone(), s[1].clone(), s[3].clone()]
    );
    let (meta, msgs) = assert_true_and_readable(&boot);
    assert_eq!(meta.message_count, 30);
    assert_eq!(meta.files.len(), 3);
    // The span still runs from the first split's start to the last one's end.
    assert_eq!(meta.starting_time_ns, before.starting_time_ns);
    assert_eq!(meta.duration_ns, before.duration_ns);
    // Messages 20..30 (split 2) are gone, the rest are all there.
    let expected: Vec<i64> = (0..40)
        .filter(|i| !(20..30).contains(i))
        .map(|i| T0 + i * 1_000_000)
        .collect();
    assert_eq!(msgs.iter().map(|m| m.1).collect::<Vec<_>>(), expected);
    assert_eq!(r.deleted_before_upload(), DeletedBeforeUpload::default());
}

#[test]
fn a_crash_between_the_metadata_rewrite_and_the_removal_of_a_middle_split_leaves_a_readable_bag() {
    // Retention rewrites metadata.yaml without the split first, then removes the file: this
    // is the state a crash in between leaves, for a split in the middle.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cut");
    old_bag(&dir, T0, 3, 10);
    crate::common::unlist_split(&dir, 1);
    let bag = Bag::open(&dir).expect("the reader opens it");
    let n = bag.messages(&ReadFilter::default()).unwrap().count() as u64;
    assert_eq!(
        n, 20,
        "the listed splits read; the unlisted middle one is ignored"
    );
    // The next budget over the root takes the leftover back (recounted from its rows), so
    // the metadata it rewrites later stays true.
    let mut r = Retention::open_root(tmp.path(), &tmp.path().join("next"), files_policy(10))
        .unwrap()
        .with_upload_ledger(Arc::new(FakeLedger::default()));
    assert_eq!(r.closed_splits(), 3);
    assert_eq!(r.before_new_bag(tmp.path()).unwrap(), 0);
    let (meta, _) = assert_true_and_readable(&dir);
    assert_eq!(meta.message_count, 30);
}

/// A bag being recorded with `n` closed splits of 10 messages on topic /a, and an open one.
fn recording(dir: &Path, n: usize) -> BagWriter {
    let mut w = BagWriter::create(dir, WriterOptions::new(Flavour::Jazzy)).unwrap();
    let t = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let data = vec![5u8; 512];
    let mut ts = T0;
    for _ in 0..n {
        for _ in 0..10 {
            w.write_batch([(t, ts, data.as_slice())]).unwrap();
            ts += 1_000_000;
        }
        w.split().unwrap();
    }
    w.write_batch([(t, ts, data.as_slice())]).unwrap();
    w
}

#[test]
fn delete_after_upload_removes_uploaded_files_at_the_next_turn_and_keeps_metadata_true() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    let mut w = recording(&dir, 5);
    let closed: Vec<PathBuf> = w.closed_splits().iter().map(|c| c.path.clone()).collect();
    let ledger = Arc::new(FakeLedger::default());
    // No limit at all: only delete_after_upload deletes.
    let mut r = Retention::new(RetentionPolicy::default())
        .with_upload_ledger(ledger.clone())
        .with_delete_after_upload(true);
    r.sync(&mut w);
    ledger.set(&closed[1], UploadState::Uploaded);
    ledger.set(&closed[3], UploadState::Uploaded);
    ledger.set(&closed[4], UploadState::InFlight);
    let (_, n) = r.after_batch(&mut w).unwrap();
    assert_eq!(n, 2);
    assert_eq!(r.deleted(), 2);
    for (i, p) in closed.iter().enumerate() {
        assert_eq!(p.exists(), ![1, 3].contains(&i), "{}", p.display());
    }
    // While recording, metadata.yaml lists exactly the closed splits left, with their counts.
    let meta = BagMetadata::read(&dir).unwrap();
    let listed: Vec<PathBuf> = meta.files.iter().map(|f| dir.join(&f.path)).collect();
    assert_eq!(
        listed,
        vec![closed[0].clone(), closed[2].clone(), closed[4].clone()]
    );
    assert_eq!(meta.message_count, 30);
    assert_eq!(meta.topics[0].message_count, 30);
    assert_eq!(meta.starting_time_ns, T0);
    assert_eq!(meta.duration_ns, 49 * 1_000_000);

    // Marked uploaded without news from the ledger: the turn does not look (O(1) per turn).
    ledger.set_quietly(&closed[0], UploadState::Uploaded);
    assert_eq!(r.after_batch(&mut w).unwrap().1, 0);
    assert!(closed[0].exists());
    // With news it does; the in-flight file stays whatever happens around it.
    ledger.set(&closed[2], UploadState::Uploaded);
    assert_eq!(r.after_batch(&mut w).unwrap().1, 2);
    assert!(!closed[0].exists() && !closed[2].exists());
    assert!(closed[4].exists(), "never deleted under the uploader");
    assert_eq!(ledger.events(), vec![], "nothing aborted, nothing lost");
    w.finish().unwrap();
    let (meta, msgs) = assert_true_and_readable(&dir);
    assert_eq!(meta.files.len(), 2, "split 4 and the last one");
    assert_eq!(msgs.len(), 11);
    assert!(Bag::open(&dir).is_ok());
}

#[test]
fn without_delete_after_upload_uploaded_files_stay_until_room_is_needed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    let mut w = recording(&dir, 3);
    let closed: Vec<PathBuf> = w.closed_splits().iter().map(|c| c.path.clone()).collect();
    let ledger = Arc::new(FakeLedger::default());
    let mut r = Retention::new(RetentionPolicy::default()).with_upload_ledger(ledger.clone());
    r.sync(&mut w);
    for p in &closed {
        ledger.set(p, UploadState::Uploaded);
    }
    assert_eq!(r.after_batch(&mut w).unwrap().1, 0);
    assert!(closed.iter().all(|p| p.exists()));
    w.finish().unwrap();
}

#[test]
fn the_size_budget_holds_at_every_step_while_uploaded_splits_go_first() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // An older bag, not out (the uploader is behind), and a snapshot bag, out.
    old_bag(&root.join("boot_a"), T0 - 3_600_000_000_000, 3, 10);
    old_bag(&root.join("snapshot_x"), T0 - 60_000_000_000, 2, 10);
    let dir = root.join("boot_b");
    let ledger = Arc::new(FakeLedger::default());
    for s in splits(&root.join("snapshot_x")) {
        ledger.set(&s, UploadState::Uploaded);
    }
    let limit = 1024 * 1024;
    let mut r = Retention::open_root(
        root,
        &dir,
        RetentionPolicy {
            max_record_size: Some(limit),
            ..Default::default()
        },
    )
    .unwrap()
    .with_upload_ledger(ledger.clone());
    r.before_new_bag(root).unwrap();
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.max_bag_size = 86016;
    let mut w = BagWriter::create(&dir, opts).unwrap();
    let t = w
        .add_topic(topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    r.sync(&mut w);
    let data = vec![3u8; 20_000];
    let mut ts = T0;
    let mut max_root = 0;
    for step in 0..600 {
        let row = [(t, ts, data.as_slice())];
        if w.rows_fitting(&row) == 0 {
            r.rotate(&mut w).unwrap();
        }
        let growth = ringbag::bag::writer::row_growth_bytes(data.len() as u64, w.page_size());
        r.before_batch(&mut w, growth, ts).unwrap();
        w.write_rows(&row).unwrap();
        ts += 1_000_000;
        r.after_batch(&mut w).unwrap();
        // The uploader gets every even split of the recording out, a batch after it closed;
        // odd ones never.
        for c in w.closed_splits() {
            if split_no(&c.path).is_multiple_of(2) && ledger.state(&c.path) != UploadState::Uploaded
            {
                ledger.set(&c.path, UploadState::Uploaded);
            }
        }
        let b: u64 = ["boot_a", "snapshot_x", "boot_b"]
            .iter()
            .map(|d| dir_bytes(&root.join(d)))
            .sum();
        max_root = max_root.max(b);
        assert!(
            b <= limit,
            "{b} bytes on disk at step {step}, budget {limit}"
        );
    }
    let lost = r.deleted_before_upload();
    eprintln!(
        "upload-aware size budget: max {max_root} of {limit} B; deleted {}, of which {} files \
         ({} B) before upload",
        r.deleted(),
        lost.files,
        lost.bytes
    );
    assert!(lost.files > 0, "the budget forced some deletions");
    assert!(
        r.deleted() >= 2 * lost.files - 3,
        "about as many uploaded splits went as splits not out: {} of {}",
        lost.files,
        r.deleted()
    );
    assert!(
        ledger.uploaded_left_at_forced.lock().unwrap().is_empty(),
        "a file not out was deleted while an uploaded one was left: {:?}",
        ledger.uploaded_left_at_forced.lock().unwrap()
    );
    assert!(!root.join("snapshot_x").exists(), "the uploaded bag went");
    let even_lost: Vec<Event> = ledger
        .events()
        .into_iter()
        .filter(
            |e| matches!(e, Event::Lost(p, _, _) if p.starts_with(&dir) && split_no(p).is_multiple_of(2)),
        )
        .collect();
    assert_eq!(
        even_lost,
        vec![],
        "splits that were out were never counted lost"
    );
    // Every even split still on disk is out; files not out only went when forced.
    w.finish().unwrap();
    assert_true_and_readable(&dir);
    if root.join("boot_a").exists() {
        assert_true_and_readable(&root.join("boot_a"));
    }
}

/// A ledger by rule, as an uploader that keeps up with even splits and never gets odd ones
/// out: even-numbered splits are uploaded as soon as retention asks. Its generation moves at
/// every call, so each turn sweeps.
#[derive(Debug, Default)]
struct EvenSplitsOut {
    turns: AtomicU64,
    lost: Mutex<Vec<(PathBuf, u64)>>,
}

fn split_no(p: &Path) -> u32 {
    p.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

impl UploadLedger for EvenSplitsOut {
    fn state(&self, file: &Path) -> UploadState {
        if split_no(file).is_multiple_of(2) {
            UploadState::Uploaded
        } else {
            UploadState::Pending
        }
    }
    fn abort(&self, _file: &Path) {}
    fn deleted_before_upload(&self, file: &Path, bytes: u64) {
        self.lost.lock().unwrap().push((file.to_path_buf(), bytes));
    }
    fn generation(&self) -> u64 {
        self.turns.fetch_add(1, SeqCst)
    }
}

#[test]
fn through_the_writer_thread_uploaded_splits_go_at_once_and_only_forced_ones_are_lost() {
    use ringbag::bag::TopicInfo;
    use ringbag::pipeline::{Pipeline, PipelineConfig};
    use std::sync::atomic::Ordering::Relaxed;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    let limit = 512 * 1024;
    let policy = RetentionPolicy {
        max_record_size: Some(limit),
        ..Default::default()
    };
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.max_bag_size = 64 * 1024;
    let ledger = Arc::new(EvenSplitsOut::default());
    let retention =
        Retention::new(policy.clone()).with_upload(&ringbag::retention::UploadRetention {
            ledger: Some(ledger.clone()),
            delete_after_upload: true,
        });
    let pipeline = Pipeline::start(
        BagWriter::create(&dir, opts.clone()).unwrap(),
        Some(retention),
        Arc::new(ringbag::clock::SystemClock),
        PipelineConfig::for_limits(64 << 20, opts.max_bag_size, &policy),
    );
    let progress = pipeline.progress();
    let producer = pipeline.producer();
    let h = producer.add_topic(TopicInfo::new("/a", "std_msgs/msg/String"), None);
    let payload = crate::common::cdr_string(&"x".repeat(4000));
    let mut max_dir = 0;
    // Pushed in steps the writer catches up with, so that the samples see it working.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for step in 1..=150u64 {
        for _ in 0..10 {
            while !producer.push(&h, &payload) {
                std::thread::yield_now();
            }
        }
        while progress.committed.load(Relaxed) < step * 10 && std::time::Instant::now() < deadline {
            max_dir = max_dir.max(dir_bytes(&dir));
            std::thread::yield_now();
        }
        max_dir = max_dir.max(dir_bytes(&dir));
    }
    // Closed even splits (all but the newest file, the open split) are gone once the turn
    // after the last batch has run.
    let closed_even = || {
        let mut all = splits(&dir);
        all.sort_by_key(|p| split_no(p));
        all.pop();
        all.into_iter()
            .filter(|p| split_no(p).is_multiple_of(2))
            .collect::<Vec<_>>()
    };
    while !closed_even().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let lingering_even = closed_even();
    // The figures are published at the end of the turn that deleted.
    let published = || progress.deleted_before_upload_files.load(Relaxed);
    while published() != ledger.lost.lock().unwrap().len() as u64
        && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
    }
    let lost = ledger.lost.lock().unwrap().clone();
    let files = progress.deleted_before_upload_files.load(Relaxed);
    let bytes = progress.deleted_before_upload_bytes.load(Relaxed);
    let per_bag = progress
        .deleted_before_upload_per_bag
        .lock()
        .unwrap()
        .clone();
    let (result, summary) = pipeline.finish();
    result.unwrap();
    assert_eq!(summary.written, 1500);
    eprintln!(
        "writer thread with a ledger: {} splits created, max {max_dir} of {limit} B, {} lost \
         before upload ({bytes} B)",
        progress.splits.load(Relaxed),
        lost.len()
    );
    assert!(max_dir <= limit, "{max_dir} bytes on disk, budget {limit}");
    assert!(!lost.is_empty(), "the budget forced odd splits out");
    assert!(
        lost.iter().all(|(p, _)| split_no(p) % 2 == 1),
        "only splits not out were lost: {lost:?}"
    );
    // The published figures are the ledger's.
    assert_eq!(files, lost.len() as u64);
    assert_eq!(bytes, lost.iter().map(|l| l.1).sum::<u64>());
    assert_eq!(per_bag.len(), 1);
    assert_eq!(per_bag[0].0, dir);
    assert_eq!(per_bag[0].1, DeletedBeforeUpload { files, bytes });
    let created = progress.splits.load(Relaxed) as u32;
    assert!(created > 20, "{created} splits");
    assert!(
        lingering_even.is_empty(),
        "uploaded closed splits were still there after the last turn: {lingering_even:?}"
    );
    assert_true_and_readable(&dir);
}

#[test]
fn a_crash_inside_the_writers_deletion_of_a_middle_split_leaves_a_bag_that_reads_and_recovers() {
    use ringbag::bag::reindex::{recover_root, unfinished_reason};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let dir = root.join("rec");
    fs::create_dir_all(&root).unwrap();
    let mut w = recording(&dir, 4);
    w.close_split().unwrap();
    let middle = w.closed_splits()[1].path.clone();
    let saved = fs::read(&middle).unwrap();
    // The writer rewrites metadata.yaml without the split, then unlinks it: a crash in
    // between is this (the unlink undone), and the process dies without finish().
    let gone = w.delete_closed(&middle).unwrap().expect("a closed split");
    assert_eq!(gone.path, middle);
    assert!(w.delete_closed(&middle).unwrap().is_none(), "only once");
    fs::write(&middle, saved).unwrap();
    drop(w);
    let meta = BagMetadata::read(&dir).unwrap();
    assert!(meta.files.iter().all(|f| dir.join(&f.path) != middle));
    assert_eq!(
        meta.message_count, 31,
        "4 closed splits of 10 and 1 of 1, less one"
    );
    let opened = Bag::open(&dir).expect("an unlisted middle split does not stop a reader");
    let n = opened.messages(&ReadFilter::default()).unwrap().count();
    assert_eq!(n, 31);
    assert!(
        unfinished_reason(&dir).is_some(),
        "recovery sees it unfinished"
    );
    recover_root(&root);
    // Reindex takes every split on disk back: nothing is lost that was not deleted.
    let (meta, msgs) = assert_true_and_readable(&dir);
    assert_eq!(meta.message_count, 41);
    assert_eq!(msgs.len(), 41);
}
