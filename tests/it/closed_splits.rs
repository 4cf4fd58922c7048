//! metadata.yaml is rewritten at every split close: a recorder killed with SIGKILL leaves a
//! bag whose metadata.yaml (all that `ros2 bag info` reads) names every closed split with its
//! counts, also after retention deleted some, instead of 0 messages until `reindex`.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{run, spawn, stderr, stdout};
use ringbag::bag::reader::{find_split_files, split_number};

fn rows(split: &Path) -> u64 {
    let c =
        rusqlite::Connection::open_with_flags(split, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("split opens");
    let n: i64 = c
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .expect("count");
    n as u64
}

/// metadata.yaml as plain YAML, read as rosbag2 would, not through ringbag's reader.
fn metadata(bag: &Path) -> Option<serde_yaml_ng::Value> {
    let text = std::fs::read_to_string(bag.join("metadata.yaml")).ok()?;
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    Some(v["rosbag2_bagfile_information"].clone())
}

fn listed(m: &serde_yaml_ng::Value) -> Vec<String> {
    m["relative_file_paths"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// True when metadata.yaml lists exactly the split files on disk but the newest (the open
/// one), and at least `closes` splits were closed (the newest file's number).
fn lists_every_closed_split(bag: &Path, closes: u64) -> bool {
    let files = find_split_files(bag).unwrap_or_default();
    let Some((newest, closed)) = files.split_last() else {
        return false;
    };
    split_number(newest).is_some_and(|n| n >= closes)
        && metadata(bag).is_some_and(|m| listed(&m) == closed)
}

#[test]
fn a_killed_recording_leaves_metadata_listing_every_closed_split_with_its_counts() {
    killed_after_closes(&[], 3);
}

#[test]
fn with_retention_deleting_splits_the_listing_of_a_killed_recording_stays_true() {
    // 4 files kept: by the 5th close the oldest splits are gone.
    killed_after_closes(&["--max-bag-files", "4"], 5);
}

/// Record ~600 rows of 100 B per split at 1 kHz (a close about every 0.6 s) with `extra`
/// flags, kill -9 the recorder after at least `closes` split closes, and check metadata.yaml.
fn killed_after_closes(extra: &[&str], closes: u64) {
    let tmp = tempfile::tempdir().expect("tmp");
    let bag = tmp.path().join("killed");
    let mut args = vec![
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--clock",
        "system",
        "-b",
        "86016",
        "-o",
        bag.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    let mut child = spawn(&args);
    let pid = Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Kill it at a moment when the listing is complete: checked while the process is stopped
    // (the close of a split and its metadata.yaml on the sync thread are a few ms apart).
    loop {
        assert!(
            Instant::now() < deadline,
            "metadata.yaml never listed the closed splits: {} files, it lists {:?}",
            find_split_files(&bag).unwrap_or_default().len(),
            metadata(&bag).map(|m| listed(&m))
        );
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the recorder exited early: {st}");
        }
        if lists_every_closed_split(&bag, closes) {
            crate::common::freeze(pid.as_raw());
            if lists_every_closed_split(&bag, closes) {
                kill(pid, Signal::SIGKILL).expect("kill -9");
                break;
            }
            kill(pid, Signal::SIGCONT).expect("continue");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();

    let files = find_split_files(&bag).expect("splits");
    let (open, closed) = files.split_last().expect("files");
    if extra.is_empty() {
        assert_eq!(split_number(&files[0]), Some(0), "{files:?}");
    } else {
        assert!(
            split_number(&files[0]).expect("numbered") >= 1,
            "retention deleted the oldest splits: {files:?}"
        );
    }
    let m = metadata(&bag).expect("metadata.yaml parses");
    assert_eq!(
        listed(&m),
        closed,
        "every closed split, in order, not the open one"
    );
    let entries = m["files"].as_sequence().expect("files");
    assert_eq!(entries.len(), closed.len());
    let mut total = 0;
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for (f, name) in entries.iter().zip(closed) {
        assert_eq!(f["path"].as_str(), Some(name.as_str()));
        let n = f["message_count"].as_u64().expect("count");
        assert_eq!(n, rows(&bag.join(name)), "{name}: count as in the file");
        assert!(n > 0, "{name}");
        let start = f["starting_time"]["nanoseconds_since_epoch"]
            .as_i64()
            .expect("start");
        let dur = f["duration"]["nanoseconds"].as_i64().expect("duration");
        first = first.min(start);
        last = last.max(start + dur);
        total += n;
    }
    assert_eq!(m["message_count"].as_u64(), Some(total));
    let per_topic: u64 = m["topics_with_message_count"]
        .as_sequence()
        .expect("topics")
        .iter()
        .map(|t| t["message_count"].as_u64().expect("topic count"))
        .sum();
    assert_eq!(per_topic, total, "per-topic counts cover the closed splits");
    assert_eq!(
        m["starting_time"]["nanoseconds_since_epoch"].as_i64(),
        Some(first)
    );
    assert_eq!(m["duration"]["nanoseconds"].as_i64(), Some(last - first));

    // ringbag info still says what the bag is: interrupted, its open split unlisted.
    let out = run(&["info", bag.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("does not list {open}")) && err.contains("ringbag reindex"),
        "{err}"
    );
    // What `ros2 bag info` shows: metadata.yaml alone, i.e. the bag without its open split.
    let copy = tmp.path().join("listed");
    std::fs::create_dir(&copy).expect("mkdir");
    for name in closed.iter().map(String::as_str).chain(["metadata.yaml"]) {
        std::fs::copy(bag.join(name), copy.join(name)).expect("copy");
    }
    let out = run(&["info", "--json", copy.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(info["message_count"].as_u64(), Some(total), "{info:#}");
}
