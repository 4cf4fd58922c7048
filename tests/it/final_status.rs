//! The status file left after a clean stop says what the bag holds: the same counts as the
//! exit summary and the split files' rows, nothing unwritten (`record --status-file` and the
//! daemon's status file).

use crate::common::SpawnExecd;
use std::path::{Path, PathBuf};

use crate::common::{spawn, stderr, wait_deadline};

const MESSAGES: u64 = 3000;

/// Rows in every split of every bag directory under `root` (or of `root` itself as a bag).
fn rows_under(root: &Path) -> u64 {
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    dirs.extend(
        std::fs::read_dir(root)
            .expect("root")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir()),
    );
    let mut total = 0;
    for d in dirs {
        for f in ringbag::bag::reader::find_split_files(&d).unwrap_or_default() {
            let c = rusqlite::Connection::open(d.join(f)).expect("split opens");
            let n: i64 = c
                .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
                .expect("count");
            total += n as u64;
        }
    }
    total
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("status file")).expect("status JSON")
}

#[test]
fn records_last_status_file_equals_the_exit_summary_and_the_bags_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bag = tmp.path().join("bag");
    let status = tmp.path().join("status.json");
    let count = MESSAGES.to_string();
    let child = spawn(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        &count,
        "--clock",
        "system",
        "-o",
        bag.to_str().expect("utf-8"),
        "--status-file",
        status.to_str().expect("utf-8"),
    ]);
    let out = wait_deadline(child, 60).expect("record ends on its own");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    // The exit summary's topic line: "... written N  dropped 0  unwritten 0 ...".
    let line = err
        .lines()
        .find(|l| l.trim_start().starts_with("/synthetic/small"))
        .unwrap_or_else(|| panic!("no topic line in the summary: {err}"));
    let after = |word: &str| -> Option<u64> {
        let w: Vec<&str> = line.split_whitespace().collect();
        w.iter()
            .position(|x| *x == word)
            .and_then(|i| w.get(i + 1))
            .and_then(|n| n.parse().ok())
    };
    assert_eq!(after("written"), Some(MESSAGES), "{line}");
    assert_eq!(after("unwritten"), Some(0), "{line}");
    assert_eq!(rows_under(&bag), MESSAGES);
    let st = json(&status);
    assert_eq!(st["committed"].as_u64(), Some(MESSAGES), "{st}");
    assert_eq!(st["splits"].as_u64(), Some(1), "{st}");
}

#[test]
fn the_daemons_last_status_file_equals_its_exit_summary_and_the_bags_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let config = tmp.path().join("ringbag.toml");
    // Enough to leave the queue holding messages when the source ends (at full pace) and
    // more than one split, so that the end of the bag really is written after `finishing`.
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
             synthetic_profile = \"small\"\nsynthetic_rate = \"max\"\n\
             synthetic_count = {MESSAGES}\nclock = \"system\"\nmax_bag_size = \"256KiB\"\n{}",
            root.display(),
            status.display(),
            crate::common::control_socket_key(&status)
        ),
    )
    .expect("config");
    let child = crate::common::daemon_command(&config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .expect("daemon starts");
    let out = wait_deadline(child, 60).expect("the daemon ends after synthetic_count");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("finished: {MESSAGES} messages written, 0 dropped")),
        "the exit summary: {err}"
    );
    assert_eq!(rows_under(&root), MESSAGES, "rows in the bag");
    let st = json(&status);
    assert_eq!(st["committed"].as_u64(), Some(MESSAGES), "{st:#}");
    assert_eq!(st["dropped"].as_u64(), Some(0), "{st:#}");
    let topics = st["topics"].as_array().expect("topics");
    let sum = |key: &str| -> u64 { topics.iter().map(|t| t[key].as_u64().expect(key)).sum() };
    assert_eq!(sum("written"), MESSAGES, "{st:#}");
    assert_eq!(sum("accepted"), MESSAGES, "{st:#}");
    assert_eq!(sum("unwritten"), 0, "{st:#}");
}
