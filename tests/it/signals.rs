//! The requests `record` and `daemon` document (SIGUSR1, SIGUSR2, SIGHUP) against the real
//! binary: none ends the process at any moment, a SIGUSR1 burst does not push history out of
//! a file budget, and a reload keeps the black box's history.

use crate::common::SpawnExecd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ringbag::bag::reader::Bag;

use crate::common::{
    daemon_command, now_ns, ringbag, small_daemon_config, stamps, status_committed, status_json,
    trigger, wait_deadline,
};

const DEADLINE: Duration = Duration::from_secs(30);

/// Poll `cond` every 5 ms until it holds; fail the test at [`DEADLINE`] or when `child` ends.
fn wait_until(child: &mut Child, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("ringbag exited ({st}) while waiting for {what}");
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).expect("signal");
}

/// Stop with SIGTERM; (exit code, stderr). Fails the test if it does not end in time.
fn stop(child: Child) -> (Option<i32>, String) {
    signal(&child, Signal::SIGTERM);
    let out = wait_deadline(child, DEADLINE.as_secs()).expect("ringbag ends after SIGTERM");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether `pid` has a handler for `sig` (its `SigCgt` in /proc).
fn catches(pid: u32, sig: Signal) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as i32 - 1)) != 0)
}

/// Messages the daemon accepted so far (its status file's topics): with a ring the synthetic
/// topic is ring-only, so `committed` stays 0.
fn accepted(status: &Path) -> u64 {
    status_json(status)
        .and_then(|v| {
            v["topics"]
                .as_array()
                .map(|ts| ts.iter().filter_map(|t| t["accepted"].as_u64()).sum())
        })
        .unwrap_or(0)
}

/// The bag the daemon's status file says it records into.
fn status_bag(status: &Path) -> String {
    status_json(status)
        .and_then(|v| v["bag"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn runner_set() -> bool {
    std::env::var("RINGBAG_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty())
}

fn daemon(config: &Path) -> Child {
    daemon_command(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("daemon starts")
}

/// A daemon config recording the synthetic `small` profile (1 kHz of 100 B) into
/// `<tmp>/root`; `extra` adds keys. Returns (config, root, status file).
fn config(tmp: &Path, extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let root = tmp.join("root");
    let status = tmp.join("status.json");
    let config = tmp.join("ringbag.toml");
    std::fs::write(&config, small_daemon_config(&root, &status, extra)).unwrap();
    (config, root, status)
}

/// A config with a snapshot ring and control socket inside `tmp`.
fn ring_keys(tmp: &Path) -> String {
    format!(
        "snapshot_size = \"8MiB\"\nsnapshot_file = \"{}\"\ncontrol_socket = \"{}\"\n",
        tmp.join("ring").display(),
        tmp.join("control.sock").display()
    )
}

fn dirs(root: &Path, part: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().contains(part))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Wait until the first snapshot bag under `root` is finished (has its metadata.yaml).
fn wait_snapshot_finished(child: &mut Child, root: &Path) {
    wait_until(child, "the snapshot to finish", || {
        dirs(root, "_snapshot_")
            .first()
            .is_some_and(|b| b.join("metadata.yaml").is_file())
    });
}

fn message_count(bag: &Path) -> u64 {
    Bag::open(bag).expect("bag opens").metadata.message_count
}

#[test]
fn record_without_a_ring_logs_sigusr2_once_and_survives_every_request() {
    let tmp = tempfile::tempdir().unwrap();
    let status = tmp.path().join("status.json");
    let bag = tmp.path().join("bag");
    let mut child = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--log-level", "info"])
        .arg("--status-file")
        .arg(&status)
        .arg("-o")
        .arg(&bag)
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("record starts");
    wait_until(&mut child, "messages committed", || {
        status_committed(&status).is_some_and(|n| n > 0)
    });
    // Before, SIGUSR2 ended it with exit 140 (and SIGUSR1 and SIGHUP likewise), the bag
    // left unfinished.
    for sig in [
        Signal::SIGUSR2,
        Signal::SIGUSR2,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        signal(&child, sig);
    }
    let after = status_committed(&status).unwrap_or(0);
    wait_until(&mut child, "recording to go on after the signals", || {
        status_committed(&status).is_some_and(|n| n > after + 200)
    });
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        err.matches("SIGUSR2: no snapshot ring configured; ignored")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("SIGHUP: `ringbag record` has no configuration to reload; ignored"));
    assert!(message_count(&bag) > after, "the bag is complete: {err}");
}

#[test]
fn a_sigusr2_in_the_daemons_first_moments_takes_a_snapshot_instead_of_killing_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = config(tmp.path(), &ring_keys(tmp.path()));
    let mut child = daemon(&config);
    if runner_set() {
        // Under an emulator the emulator catches every signal itself: /proc cannot say when
        // ringbag's own handlers exist. Check the weaker promise there.
        wait_until(&mut child, "the status file", || status.is_file());
    } else {
        // As early as the process shows any handler (before, SIGHUP and SIGUSR1 were caught
        // here but SIGUSR2 only once the bag existed: it ended the daemon with exit 140).
        let pid = child.id();
        wait_until(&mut child, "the first handler", || {
            catches(pid, Signal::SIGHUP)
        });
    }
    signal(&child, Signal::SIGUSR2);
    wait_until(&mut child, "messages accepted", || accepted(&status) > 0);
    wait_until(&mut child, "the snapshot bag", || {
        !dirs(&root, "_snapshot_sigusr2").is_empty()
    });
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("SIGUSR2: snapshot requested"), "{err}");
    for bag in dirs(&root, "") {
        assert_eq!(
            ringbag::bag::lock::state(&bag),
            ringbag::bag::lock::LockState::Clean,
            "{} left unfinished: {err}",
            bag.display()
        );
    }
}

#[test]
fn a_burst_of_sigusr1_does_not_push_history_out_of_a_file_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = config(tmp.path(), "max_bag_files = 5\n");
    let mut child = daemon(&config);
    // About 1.5 s of history (1.5k messages of 100 B: far below the 1 MiB split size).
    wait_until(&mut child, "history to record", || {
        status_committed(&status).is_some_and(|n| n >= 1_500)
    });
    let before = status_committed(&status).unwrap();
    for _ in 0..6 {
        signal(&child, Signal::SIGUSR1);
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_until(&mut child, "recording to go on", || {
        status_committed(&status).is_some_and(|n| n > before + 300)
    });
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    let bags = dirs(&root, "");
    assert_eq!(bags.len(), 1, "{bags:?}");
    // Before: one split per SIGUSR1, 30 ms each, and the budget of 5 files deleted the one
    // holding the history.
    let kept = message_count(&bags[0]);
    assert!(
        kept > before,
        "{kept} messages kept, {before} were committed before the burst: {err}"
    );
    assert!(err.contains("SIGUSR1: closing the current split"), "{err}");
    assert!(err.contains("not closing another within 1 s"), "{err}");
}

/// The stamps of a bag's messages.
#[test]
fn a_trigger_right_after_a_reload_holds_the_history_from_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = config(tmp.path(), &ring_keys(tmp.path()));
    let mut child = daemon(&config);
    // 1.5 s of history in the ring.
    wait_until(&mut child, "history to record", || {
        accepted(&status) >= 1_500
    });
    let reload_ns = now_ns();
    signal(&child, Signal::SIGHUP);
    wait_until(&mut child, "the second bag", || {
        dirs(&root, "_0002").len() == 1
    });
    wait_until(&mut child, "the status of the second bag", || {
        status_bag(&status).ends_with("_0002")
    });
    let sock = tmp.path().join("control.sock");
    let t = trigger(&sock, &["--reason", "after reload", "--post", "0"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    wait_snapshot_finished(&mut child, &root);
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    let snap = dirs(&root, "_snapshot_after-reload");
    assert_eq!(snap.len(), 1, "{:?}: {err}", dirs(&root, ""));
    let before: Vec<i64> = stamps(&snap[0])
        .into_iter()
        .filter(|t| *t < reload_ns)
        .collect();
    // Before, the reload emptied the ring: the snapshot began at the new bag.
    assert!(
        before.len() >= 1_000,
        "{} messages from before the reload: {err}",
        before.len()
    );
    assert!(err.contains("kept across the reload"), "{err}");
    let gap_line = err
        .lines()
        .find(|l| l.contains("were not recorded during the reload"))
        .unwrap_or_else(|| panic!("the reload's gap is logged: {err}"));
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(st["reloads"], 1, "{st}");
    let counted_ms = st["reload_gap_ms"].as_u64().expect("reload_gap_ms");
    // The hole the reload left in the ring (1 kHz: 1 ms between messages otherwise) is
    // within what was counted.
    let all = stamps(&snap[0]);
    let hole_ms = all.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) / 1_000_000;
    assert!(
        hole_ms as u64 <= counted_ms + 5,
        "a {hole_ms} ms hole, {counted_ms} ms counted: {gap_line}"
    );
    eprintln!(
        "reload: {} messages of the pre-reload history in the snapshot; hole {hole_ms} ms, counted {counted_ms} ms",
        before.len()
    );
}

#[test]
fn a_reload_that_changes_the_ring_size_carries_the_newest_history_over() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = config(tmp.path(), &ring_keys(tmp.path()));
    let mut child = daemon(&config);
    wait_until(&mut child, "history to record", || {
        accepted(&status) >= 1_500
    });
    let reload_ns = now_ns();
    // A smaller ring (4 MiB still holds far more than this run).
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("snapshot_size = \"8MiB\"", "snapshot_size = \"4MiB\""),
    )
    .unwrap();
    signal(&child, Signal::SIGHUP);
    wait_until(&mut child, "the status of the second bag", || {
        status_bag(&status).ends_with("_0002")
    });
    let t = trigger(
        &tmp.path().join("control.sock"),
        &["--reason", "after resize", "--post", "0"],
    );
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    wait_snapshot_finished(&mut child, &root);
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    let snap = dirs(&root, "_snapshot_after-resize");
    let stamps = stamps(&snap[0]);
    let before = stamps.iter().filter(|t| **t < reload_ns).count();
    assert!(
        before >= 1_000,
        "{before} messages from before the reload: {err}"
    );
    // The history goes on without a hole in the ring's order.
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "in order");
    assert!(err.contains("settings changed on reload"), "{err}");
    assert_eq!(
        std::fs::metadata(tmp.path().join("ring")).unwrap().len(),
        4 << 20,
        "the new ring has the new size"
    );
    assert!(
        !tmp.path().join("ring.reload").exists(),
        "the old ring is gone"
    );
}
