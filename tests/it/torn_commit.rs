//! A process death *inside* a commit, at every page boundary of it, deterministically.
//!
//! With journaling off (`write-optimized`) or in memory (`none`), SQLite writes a commit's
//! dirty pages in place, in ascending page order, one `pwrite` per page: pages that already
//! existed (the header page, the b-tree roots) come first, the new pages at the end of the
//! file last. A kill between the two halves leaves the old pages rewritten and the new ones
//! missing. When the messages table's root is still a leaf and a commit makes it overflow,
//! SQLite moves the root's cells — rows an *earlier* commit made and the status file
//! already counted — to a new page at the end of the file, and turns the root into an
//! interior page pointing there: cut in between, those rows are gone from the file (CI's
//! "committed 64, reindexed 60").
//!
//! The cut is made without timing: a child process (this test binary, re-run) writes a
//! first batch, then lowers its own `RLIMIT_FSIZE` to the file's size plus `k` × 4 KiB and
//! writes a second batch. The commit's writes below the limit land; the first one that
//! would reach past it raises `SIGXFSZ`, which kills the child there (or, where the signal
//! is ignored, fails with `EFBIG` and the child exits at once): the file is exactly what a
//! kill -9 after that many bytes of the commit leaves. 4 KiB steps also cut a 64 KiB page
//! between its 4 KiB pieces, as a kill inside one `pwrite` can. For every `k` until the
//! commit completes, the parent runs `reindex` and reads the bag: every row of the first
//! batch must come back byte for byte, and nothing that was not written.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use ringbag::bag::reader::{find_split_files, Bag, ReadFilter};
use ringbag::bag::reindex::{reindex, ReindexOptions};
use ringbag::bag::schema::{choose_page_size, guard_journal_bytes, StoragePreset};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::Flavour;

use crate::common::{topic, with_runner};

const CHILD_ENV: &str = "RINGBAG_TORN_COMMIT_CHILD";
const TEST_NAME: &str = "torn_commit::a_kill_inside_a_commit_loses_no_row_an_earlier_commit_made";
/// Exit code of a child whose commit failed with `EFBIG` (SIGXFSZ ignored).
const EXIT_CUT: i32 = 3;
/// Printed by the child once the first batch is committed.
const FIRST_COMMITTED: &str = "first batch committed";

/// One shape of recording: the first batch must stay inside the messages table's root leaf,
/// the second must make it overflow.
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    flavour: Flavour,
    preset: StoragePreset,
    /// `-b`: 1 MiB gives 4 KiB pages, 0 (unbounded) 64 KiB pages with `write-optimized`.
    max_bag_size: u64,
    message_bytes: usize,
    first: usize,
    second: usize,
}

const SHAPES: &[Shape] = &[
    // Small rows, entirely inside 4 KiB leaf pages.
    Shape {
        name: "jazzy-4k-local",
        flavour: Flavour::Jazzy,
        preset: StoragePreset::WriteOptimized,
        max_bag_size: 1 << 20,
        message_bytes: 700,
        first: 4,
        second: 4,
    },
    // CI's case: rows of which the leaf keeps a small part and overflow pages the rest, so
    // the root holds several and the commit that splits it writes dozens of new pages.
    Shape {
        name: "jazzy-4k-overflow",
        flavour: Flavour::Jazzy,
        preset: StoragePreset::WriteOptimized,
        max_bag_size: 1 << 20,
        message_bytes: 20_935,
        first: 4,
        second: 8,
    },
    // Tiny rows: the most index entries per root page, the largest journal.
    Shape {
        name: "jazzy-4k-tiny",
        flavour: Flavour::Jazzy,
        preset: StoragePreset::WriteOptimized,
        max_bag_size: 1 << 20,
        message_bytes: 8,
        first: 120,
        second: 60,
    },
    // 64 KiB pages: a page is written in 4 KiB pieces a kill can fall between.
    Shape {
        name: "humble-64k",
        flavour: Flavour::Humble,
        preset: StoragePreset::WriteOptimized,
        max_bag_size: 0,
        message_bytes: 8_000,
        first: 4,
        second: 8,
    },
    // rosbag2's own pragmas: a journal in memory does not survive the process either.
    Shape {
        name: "jazzy-none",
        flavour: Flavour::Jazzy,
        preset: StoragePreset::None,
        max_bag_size: 1 << 20,
        message_bytes: 700,
        first: 4,
        second: 4,
    },
];

const T0: i64 = 1_700_000_000_000_000_000;

/// Message `i` of a recording: its own bytes, so a row that came back can be told apart.
fn message(shape: &Shape, i: usize) -> (i64, Vec<u8>) {
    let data = (0..shape.message_bytes)
        .map(|j| (i * 31 + j * 7 + j / 251) as u8)
        .collect();
    (T0 + i as i64 * 1_000_000, data)
}

fn child(spec: &str) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let mut parts = spec.split('|');
    let (dir, shape, step) = (
        PathBuf::from(parts.next().expect("dir")),
        parts.next().expect("shape"),
        parts.next().expect("step").parse::<u64>().expect("step"),
    );
    let shape = SHAPES
        .iter()
        .find(|s| s.name == shape)
        .expect("known shape");
    // A death by SIGXFSZ would otherwise dump core.
    setrlimit(Resource::RLIMIT_CORE, 0, 0).expect("no core dumps");
    let mut opts = WriterOptions::new(shape.flavour);
    opts.preset = shape.preset;
    opts.max_bag_size = shape.max_bag_size;
    let mut w = BagWriter::create(&dir, opts).expect("create bag");
    let t = w
        .add_topic(topic("/t", "std_msgs/msg/String"), None)
        .expect("topic");
    let batch = |range: std::ops::Range<usize>| -> Vec<(i64, Vec<u8>)> {
        range.map(|i| message(shape, i)).collect()
    };
    let first = batch(0..shape.first);
    let rows: Vec<_> = first.iter().map(|(ts, d)| (t, *ts, d.as_slice())).collect();
    w.write_rows(&rows).expect("first batch");
    println!("{FIRST_COMMITTED}");
    let split = w.open_split_path().expect("open split").to_path_buf();
    let size = std::fs::metadata(&split).expect("split size").len();
    let (_, hard) = getrlimit(Resource::RLIMIT_FSIZE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_FSIZE, size + step * 4096, hard).expect("setrlimit");
    let second = batch(shape.first..shape.first + shape.second);
    let rows: Vec<_> = second
        .iter()
        .map(|(ts, d)| (t, *ts, d.as_slice()))
        .collect();
    // No destructor may run after a cut: the file must stay as the cut left it.
    match w.write_rows(&rows) {
        Ok(()) => std::process::exit(0),
        Err(_) => std::process::exit(EXIT_CUT),
    }
}

/// Run the child for `step`; true when its second commit completed (no cut).
fn run_child(dir: &Path, shape: &Shape, step: u64) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let exe = std::env::current_exe().expect("test binary");
    let out = with_runner(&exe)
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!("{}|{}|{step}", dir.display(), shape.name),
        )
        .stdin(Stdio::null())
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(FIRST_COMMITTED),
        "{} step {step}: the first batch was not committed: {stdout}{}",
        shape.name,
        String::from_utf8_lossy(&out.stderr)
    );
    match (out.status.code(), out.status.signal()) {
        (Some(0), _) => true,
        (Some(EXIT_CUT), _) => false,
        (_, Some(s)) if s == nix::sys::signal::Signal::SIGXFSZ as i32 => false,
        other => panic!(
            "{} step {step}: child ended with {other:?}: {stdout}{}",
            shape.name,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn a_kill_inside_a_commit_loses_no_row_an_earlier_commit_made() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cuts = 0;
    let mut losses = Vec::new();
    let mut journals = 0;
    for shape in SHAPES {
        let written: Vec<(i64, Vec<u8>)> = (0..shape.first + shape.second)
            .map(|i| message(shape, i))
            .collect();
        let mut step = 0;
        loop {
            let bag = tmp.path().join(format!("{}-{step}", shape.name));
            if run_child(&bag, shape, step) {
                // The completed commit split the root: the split is back to its preset's
                // journal mode, with no -journal beside it.
                let split = find_split_files(&bag).expect("splits");
                let journal = bag.join(format!("{}-journal", split[0]));
                assert!(
                    !journal.exists(),
                    "{}: {} left",
                    shape.name,
                    journal.display()
                );
                break;
            }
            cuts += 1;
            // What the budget reserves for a guarded commit's journal must hold it.
            let split = find_split_files(&bag).expect("splits");
            let journal = bag.join(format!("{}-journal", split[0]));
            let page = choose_page_size(shape.preset, shape.max_bag_size, 0, 0);
            if let Ok(m) = std::fs::metadata(&journal) {
                journals += 1;
                assert!(
                    m.len() <= guard_journal_bytes(u64::from(page)),
                    "{} cut after {step} x 4 KiB: a {} byte -journal, more than the budget's {}",
                    shape.name,
                    m.len(),
                    guard_journal_bytes(u64::from(page))
                );
            }
            let report = reindex(&bag, ReindexOptions::default()).unwrap_or_else(|e| {
                panic!("{} cut after {step} x 4 KiB: reindex: {e}", shape.name)
            });
            let b = Bag::open(&bag).expect("bag opens after reindex");
            let back: Vec<(i64, Vec<u8>)> = b
                .messages(&ReadFilter::default())
                .expect("messages")
                .map(|m| m.map(|m| (m.timestamp, m.data)).expect("message reads"))
                .collect();
            let files = find_split_files(&bag).expect("splits");
            let missing = written[..shape.first]
                .iter()
                .filter(|m| !back.contains(m))
                .count();
            if missing > 0 {
                losses.push(format!(
                    "{} cut after {step} x 4 KiB of the second commit: {missing} of the first \
                     batch's {} committed rows gone ({} rows back; reindex: {}; files {files:?})",
                    shape.name,
                    shape.first,
                    back.len(),
                    report.summary().lines().nth(1).unwrap_or_default().trim()
                ));
            }
            if let Some(m) = back.iter().find(|m| !written.contains(m)) {
                losses.push(format!(
                    "{} cut after {step} x 4 KiB: a row that was never written came back (at {})",
                    shape.name, m.0
                ));
            }
            step += 1;
            assert!(
                step < 2000,
                "{}: the second commit never completed",
                shape.name
            );
        }
        // A shape whose second commit was never cut tests nothing.
        assert!(
            step > 0,
            "{}: the second commit needed no new page",
            shape.name
        );
    }
    assert!(
        losses.is_empty(),
        "{} of {cuts} cuts lost committed rows or returned torn ones:\n{}",
        losses.len(),
        losses.join("\n")
    );
    // Every cut fell inside a guarded commit, and the journal is what brought the rows back.
    assert_eq!(journals, cuts, "a cut left no -journal to play back");
    eprintln!("torn commits: {cuts} cuts, every first batch came back");
}
