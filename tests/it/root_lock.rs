//! One recorder per recording root: a second daemon (or `record --recover`) on a root a daemon
//! holds is refused with one line naming the root and the holder's pid, exit 2, before it
//! touches anything; the first keeps recording.

use crate::common::SpawnExecd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{
    daemon_command, ringbag, small_daemon_config, status_committed, stderr, wait_deadline,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn config(tmp: &Path, name: &str, root: &Path, status: &Path) -> PathBuf {
    let path = tmp.join(name);
    std::fs::write(&path, small_daemon_config(root, status, "")).expect("config");
    path
}

fn daemon(config: &Path) -> Child {
    daemon_command(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("daemon starts")
}

/// Entries of `root` (bags, and the lock file).
fn entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .expect("root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Wait until the status file's committed count exceeds `above`.
fn committed_beyond(first: &mut Child, status: &Path, above: u64) -> u64 {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(n) = status_committed(status).filter(|&n| n > above) {
            return n;
        }
        if let Ok(Some(st)) = first.try_wait() {
            panic!("the first daemon exited ({st})");
        }
        assert!(
            Instant::now() < end,
            "the first daemon's count never passed {above}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_second_daemon_on_the_same_root_exits_2_naming_the_root_and_the_first_ones_pid() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    let status_a = tmp.path().join("a.json");
    let status_b = tmp.path().join("b.json");
    let mut first = daemon(&config(tmp.path(), "a.toml", &root, &status_a));
    let before = committed_beyond(&mut first, &status_a, 0);
    let in_root = entries(&root);
    let bags = in_root.iter().filter(|e| root.join(e).is_dir()).count();
    assert_eq!(bags, 1, "{in_root:?}");

    let second = daemon(&config(tmp.path(), "b.toml", &root, &status_b));
    let out = wait_deadline(second, 30).expect("the second daemon exits at once");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("ringbag: error: {}: ", root.display()))
            && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    assert!(!status_b.exists(), "no status file written");
    assert_eq!(entries(&root), in_root, "no bag made, nothing recovered");

    // A recorder with --recover budgets over the root as the daemon does: refused too.
    let out = ringbag()
        .args(["record", "--source", "synthetic", "--synthetic-count", "10"])
        .args(["--clock", "system", "--recover", "-o"])
        .arg(root.join("manual"))
        .output()
        .expect("record runs");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("pid {}", first.id())),
        "{}",
        stderr(&out)
    );
    assert_eq!(entries(&root), in_root);

    // The first one records on, unaffected, and stops cleanly.
    committed_beyond(&mut first, &status_a, before);
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let out = wait_deadline(first, 30).expect("the first daemon stops");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // Its lock went with it: the root is free again.
    let again = daemon(&config(tmp.path(), "b.toml", &root, &status_b));
    let mut again = again;
    committed_beyond(&mut again, &status_b, 0);
    kill(Pid::from_raw(again.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let out = wait_deadline(again, 30).expect("stops");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_sighup_that_moves_to_a_root_another_daemon_holds_keeps_the_running_configuration() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (root_a, root_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (status_a, status_b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    let mut a = daemon(&config(tmp.path(), "a.toml", &root_a, &status_a));
    let b_config = config(tmp.path(), "b.toml", &root_b, &status_b);
    let mut b = daemon(&b_config);
    committed_beyond(&mut a, &status_a, 0);
    committed_beyond(&mut b, &status_b, 0);
    // B's config now names A's root.
    config(tmp.path(), "b.toml", &root_a, &status_b);
    kill(Pid::from_raw(b.id() as i32), Signal::SIGHUP).expect("SIGHUP");
    // The refusal shows in B's status file (its last error), which it keeps writing.
    let end = Instant::now() + DEADLINE;
    loop {
        let last = std::fs::read(&status_b)
            .ok()
            .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
            .and_then(|v| v["last_error"].as_str().map(str::to_string))
            .unwrap_or_default();
        if last.contains("keeping the running configuration") {
            assert!(
                last.contains(&format!(
                    "{}: recording root already in use",
                    root_a.display()
                )) && last.contains(&format!("pid {}", a.id())),
                "{last}"
            );
            break;
        }
        if let Ok(Some(st)) = b.try_wait() {
            panic!("daemon B exited ({st})");
        }
        assert!(
            Instant::now() < end,
            "the SIGHUP was never answered: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let bags = |root: &Path| {
        entries(root)
            .iter()
            .filter(|e| root.join(e).is_dir())
            .count()
    };
    assert_eq!(bags(&root_a), 1, "B started no bag in A's root");
    assert_eq!(bags(&root_b), 1, "B goes on with its bag");
    for child in [a, b] {
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
        let out = wait_deadline(child, 30).expect("stops");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
}
