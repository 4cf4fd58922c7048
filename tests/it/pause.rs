//! Pause and resume of `ringbag record`: `--start-paused`, `ringbag pause` / `resume` over the
//! control socket, the space bar on a terminal. Paused messages are counted as such (never
//! as drops) in the exit summary and the status file; the snapshot ring keeps recording.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use ringbag::bag::reader::Bag;

use crate::common::{
    bags_named, ringbag, sigint, status_json, trigger, wait_deadline, RunOutput, SpawnExecd,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn wait_for(cond: impl FnMut() -> bool) -> bool {
    crate::common::wait_for(DEADLINE, cond)
}

fn message_count(bag: &Path) -> u64 {
    Bag::open(bag).expect("bag opens").metadata.message_count
}

/// `ringbag pause|resume --control-socket SOCK`.
fn control(what: &str, sock: &Path) -> std::process::Output {
    ringbag()
        .arg(what)
        .arg("--control-socket")
        .arg(sock)
        .run_output()
        .expect("ringbag runs")
}

/// `ringbag pause|resume` that succeeds and says `ringbag: recording <said>`.
fn control_says(what: &str, sock: &Path, said: &str) {
    let o = control(what, sock);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err, format!("ringbag: recording {said}\n"));
}

/// SIGINT `child`, wait for its exit, assert it was clean; its stderr.
fn stop_cleanly(child: Child) -> String {
    sigint(&child);
    let out = wait_deadline(child, DEADLINE.as_secs()).expect("the recorder ends");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

/// The `name count` of the exit summary's line that starts with `prefix` (e.g. "accepted").
fn summary_count(err: &str, prefix: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{err}"));
    line[prefix.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in `{line}`"))
}

/// The count after the first `word ` that a number follows (`written 12,` in the summary).
fn count_after(err: &str, word: &str) -> u64 {
    let pat = format!("{word} ");
    err.match_indices(&pat)
        .find_map(|(at, _)| {
            let rest = &err[at + pat.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no count after `{word}` in:\n{err}"))
}

#[test]
fn start_paused_records_nothing_and_counts_every_message_as_paused_not_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bag");
    let status = tmp.path().join("status.json");
    let o = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-rate", "max"])
        .args(["--synthetic-count", "500", "--start-paused"])
        .arg("--status-file")
        .arg(&status)
        .arg("-o")
        .arg(&out)
        .env_remove("RINGBAG_LOG")
        .run_output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(message_count(&out), 0, "{err}");
    assert_eq!(summary_count(&err, "accepted"), 500, "{err}");
    let custom = Bag::open(&out).unwrap().metadata.custom_data;
    assert_eq!(custom["ringbag.paused_messages"], "500");
    assert_eq!(custom["ringbag.paused_messages./synthetic/small"], "500");
    assert_eq!(
        custom["ringbag.dropped_messages"], "0",
        "paused is not dropped"
    );
    assert_eq!(count_after(&err, "written"), 0, "{err}");
    assert_eq!(summary_count(&err, "dropped"), 0, "{err}");
    assert!(
        err.contains("left out while paused 500 (not a loss); recording was paused at the end\n"),
        "{err}"
    );
    let st = status_json(&status).expect("status file");
    assert_eq!(st["committed"], 0);
    assert_eq!(st["paused"], true);
    assert_eq!(st["paused_messages"], 500);
}

#[test]
fn an_unpaused_recording_says_nothing_of_pausing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bag");
    let status = tmp.path().join("status.json");
    let o = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-rate", "max"])
        .args(["--synthetic-count", "300"])
        .arg("--status-file")
        .arg(&status)
        .arg("-o")
        .arg(&out)
        .env_remove("RINGBAG_LOG")
        .run_output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(message_count(&out), 300);
    let custom = Bag::open(&out).unwrap().metadata.custom_data;
    assert!(!custom.contains_key("ringbag.paused_messages"));
    assert!(!err.contains("paused"), "{err}");
    let st = status_json(&status).expect("status file");
    assert_eq!(st["paused"], false);
    assert_eq!(st["paused_messages"], 0);
}

/// A realtime recorder of the `small` profile, started paused, with a ring and a control
/// socket in `tmp`. `--snapshot-topics` names another topic, so that `/synthetic/small` is
/// recorded continuously too (without it every topic is ring-only).
fn paused_recorder(tmp: &Path) -> Child {
    ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--log-level", "info"])
        .args(["--snapshot-size", "8MiB", "--start-paused"])
        .args(["--snapshot-topics", "/ring/only"])
        .arg("--snapshot-file")
        .arg(tmp.join("ring"))
        .arg("--control-socket")
        .arg(tmp.join("control.sock"))
        .arg("--status-file")
        .arg(tmp.join("status.json"))
        .arg("-o")
        .arg(tmp.join("root").join("bag"))
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("record starts")
}

#[test]
fn pause_and_resume_over_the_control_socket_while_the_ring_keeps_recording() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let status = tmp.path().join("status.json");
    let child = paused_recorder(tmp.path());
    let st = || status_json(&status).unwrap_or_default();
    assert!(
        wait_for(|| st()["paused_messages"].as_u64() > Some(50)),
        "messages counted as paused"
    );
    assert_eq!(st()["paused"], true);
    assert_eq!(st()["committed"], 0, "nothing written while paused");
    // The ring kept recording: a snapshot taken while paused holds messages.
    let t = trigger(&sock, &["--reason", "while-paused", "--post", "0"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));

    control_says("resume", &sock, "resumed");
    let r = control("resume", &sock);
    assert_eq!(
        String::from_utf8_lossy(&r.stderr),
        "ringbag: recording was not paused\n"
    );
    assert!(
        wait_for(|| st()["committed"].as_u64() > Some(50)),
        "recording resumed"
    );
    assert_eq!(st()["paused"], false);

    control_says("pause", &sock, "paused");
    let p = control("pause", &sock);
    assert_eq!(
        String::from_utf8_lossy(&p.stderr),
        "ringbag: recording was already paused\n"
    );
    assert!(wait_for(|| st()["paused"] == true));
    let paused_before = st()["paused_messages"].as_u64().unwrap();
    assert!(
        wait_for(|| st()["paused_messages"].as_u64() > Some(paused_before)),
        "paused again"
    );

    let err = stop_cleanly(child);
    assert!(err.contains("Pausing recording. (control socket)"), "{err}");
    assert!(
        err.contains("Resuming recording. (control socket)"),
        "{err}"
    );
    // The counts add up: every accepted message was written, paused, or (realtime) dropped.
    let bag = tmp.path().join("root").join("bag");
    let written = count_after(&err, "written");
    let paused = summary_count(&err, "left out while paused");
    assert_eq!(message_count(&bag), written, "{err}");
    assert_eq!(
        summary_count(&err, "accepted"),
        written + paused + count_after(&err, "unwritten"),
        "{err}"
    );
    assert!(written > 50 && paused > 50, "{err}");
    assert!(err.contains("recording was paused at the end"), "{err}");
    let final_status = st();
    assert_eq!(final_status["paused_messages"].as_u64(), Some(paused));
    assert_eq!(final_status["committed"].as_u64(), Some(written));
    // The snapshot taken while paused.
    let root = tmp.path().join("root");
    assert!(wait_for(|| bags_named(&root, "while-paused")
        .first()
        .is_some_and(|b| b.join("metadata.yaml").is_file())));
    let snap = bags_named(&root, "while-paused").remove(0);
    assert!(message_count(&snap) > 0, "the ring recorded while paused");
}

#[test]
fn pause_and_resume_without_a_recorder_are_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("none.sock");
    for what in ["pause", "resume"] {
        let o = control(what, &sock);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(
            err.starts_with(&format!(
                "ringbag: error: {}: no recorder is listening",
                sock.display()
            )),
            "{what}: {err}"
        );
    }
}

#[test]
fn the_daemon_pauses_over_its_socket_shows_it_in_its_status_and_stays_paused_across_a_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let sock = tmp.path().join("control.sock");
    let config = tmp.path().join("ringbag.toml");
    let extra = format!(
        "snapshot_size = \"8MiB\"\nsnapshot_file = \"{}\"\ncontrol_socket = \"{}\"\n\
         snapshot_topics = [\"/ring/only\"]\n",
        tmp.path().join("ring").display(),
        sock.display()
    );
    std::fs::write(
        &config,
        crate::common::small_daemon_config(&root, &status, &extra),
    )
    .unwrap();
    let child = crate::common::daemon_command(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("daemon starts");
    let st = || status_json(&status).unwrap_or_default();
    assert!(
        wait_for(|| st()["committed"].as_u64() > Some(0)),
        "the daemon records"
    );
    assert_eq!(st()["paused"], false);
    control_says("pause", &sock, "paused");
    assert!(wait_for(
        || st()["paused"] == true && st()["paused_messages"].as_u64() > Some(10)
    ));
    let s = ringbag()
        .args(["status", "--file"])
        .arg(&status)
        .run_output()
        .unwrap();
    let human = String::from_utf8_lossy(&s.stdout);
    assert!(human.starts_with("PAUSED ("), "{human}");
    assert!(human.contains("\nrecording: paused, "), "{human}");
    let j = ringbag()
        .args(["status", "--json", "--file"])
        .arg(&status)
        .run_output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).expect("status --json");
    assert_eq!(v["paused"], true);
    assert!(v["topics"][0]["paused"].as_u64() > Some(0), "{v}");

    // A reload starts a new bag: still paused, nothing written into it.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let first_bag = st()["bag"].clone();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(wait_for(
        || st()["bag"] != first_bag && st()["paused_messages"].as_u64() > Some(10)
    ));
    assert_eq!(st()["paused"], true);
    assert_eq!(
        st()["committed"],
        0,
        "the new bag records nothing while paused"
    );
    control_says("resume", &sock, "resumed");
    assert!(wait_for(|| st()["committed"].as_u64() > Some(0)));
    assert_eq!(st()["paused"], false);
    stop_cleanly(child);
}

/// `record --start-paused` of the synthetic source on a pty, with `extra` flags: the pty, the
/// bag's path and the status file's.
fn paused_on_pty(
    tmp: &Path,
    extra: &[&str],
) -> (
    crate::play_keys::OnPty,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let out = tmp.join("bag");
    let status = tmp.join("status.json");
    let mut args = vec![
        "record",
        "--source",
        "synthetic",
        "--clock",
        "system",
        "--synthetic-profile",
        "small",
        "--start-paused",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--status-file", status.to_str().unwrap()]);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let p = crate::play_keys::OnPty::spawn_ringbag(&args, false);
    (p, out, status)
}

/// `record --start-paused` on a terminal: the space bar resumes and pauses; the terminal is
/// in raw mode while recording and back as it was at the end.
#[test]
fn the_space_bar_resumes_and_pauses_a_recording_on_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, out, status) = paused_on_pty(tmp.path(), &[]);
    p.err.wait_for("the keys' hint", |s| {
        s.contains("Press SPACE for pausing/resuming")
    });
    assert!(p.raw(), "the terminal is in raw mode while recording");
    let st = || status_json(&status).unwrap_or_default();
    assert!(wait_for(|| st()["paused_messages"].as_u64() > Some(10)));
    assert_eq!(st()["committed"], 0);
    p.type_keys(b" ");
    p.err
        .wait_for("resumed", |s| s.contains("Resuming recording. (keyboard)"));
    assert!(wait_for(|| st()["committed"].as_u64() > Some(10)));
    assert_eq!(st()["paused"], false);
    p.type_keys(b" ");
    p.err
        .wait_for("paused", |s| s.contains("Pausing recording. (keyboard)"));
    assert!(wait_for(|| st()["paused"] == true));
    // SIGHUP stays `record`'s request (logged, ignored) with the keys on: not fatal.
    p.signal(nix::sys::signal::Signal::SIGHUP);
    p.err.wait_for("SIGHUP ignored", |s| {
        s.contains("has no configuration to reload; ignored")
    });
    assert!(p.raw(), "still recording, the terminal still in raw mode");
    p.signal(nix::sys::signal::Signal::SIGINT);
    let (code, _, err, cooked) = p.finish();
    assert!(code.success(), "{err}");
    assert!(cooked, "the terminal is put back");
    assert!(err.contains("recording was paused at the end"), "{err}");
    assert_eq!(message_count(&out), count_after(&err, "written"), "{err}");
}

/// `--disable-keyboard-controls`: the space bar is not read, recording stays paused.
#[test]
fn disable_keyboard_controls_leaves_the_terminal_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, out, status) = paused_on_pty(tmp.path(), &["--disable-keyboard-controls"]);
    let st = || status_json(&status).unwrap_or_default();
    assert!(wait_for(|| st()["paused_messages"].as_u64() > Some(10)));
    assert!(!p.raw(), "the terminal is not touched");
    p.type_keys(b" \n");
    // The recorder keeps running paused: the count of paused messages goes on growing.
    let seen = st()["paused_messages"].as_u64().unwrap();
    assert!(wait_for(
        || st()["paused_messages"].as_u64() > Some(seen + 50)
    ));
    assert_eq!(st()["paused"], true);
    assert_eq!(st()["committed"], 0);
    p.signal(nix::sys::signal::Signal::SIGINT);
    let (code, _, err, _) = p.finish();
    assert!(code.success(), "{err}");
    assert!(!err.contains("Press SPACE"), "{err}");
    assert_eq!(message_count(&out), 0);
}

/// The one line `ringbag trigger` prints against a recorder without a ring.
fn assert_no_ring_answer(t: &std::process::Output, sock: &Path) {
    let err = String::from_utf8_lossy(&t.stderr);
    assert_eq!(t.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "ringbag: error: {}: the recorder has no black-box ring, so there is nothing to \
             snapshot; start `ringbag record` with --snapshot-size, or set snapshot_size in the \
             service's config and reload it (systemctl reload ringbag)\n",
            sock.display()
        )
    );
}

/// The daemon's default config (no ring) still serves its control socket: pause and resume
/// work and show in its status; a trigger is the one-line "no ring" answer. A reload that adds
/// a ring keeps the socket (a trigger now starts a snapshot, the pause holds), and one that
/// removes it again keeps it too.
#[test]
fn a_daemon_without_a_ring_pauses_and_resumes_over_its_socket_and_a_reload_adding_a_ring_keeps_it()
{
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let sock = tmp.path().join("control.sock");
    let config = tmp.path().join("ringbag.toml");
    let no_ring = format!("control_socket = \"{}\"\n", sock.display());
    std::fs::write(
        &config,
        crate::common::small_daemon_config(&root, &status, &no_ring),
    )
    .unwrap();
    let child = crate::common::daemon_command(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("daemon starts");
    let st = || status_json(&status).unwrap_or_default();
    assert!(
        wait_for(|| st()["committed"].as_u64() > Some(0)),
        "the daemon records"
    );
    let t = trigger(&sock, &["--reason", "no-ring"]);
    assert_no_ring_answer(&t, &sock);

    control_says("pause", &sock, "paused");
    assert!(wait_for(
        || st()["paused"] == true && st()["paused_messages"].as_u64() > Some(10)
    ));
    let s = ringbag()
        .args(["status", "--file"])
        .arg(&status)
        .run_output()
        .unwrap();
    let human = String::from_utf8_lossy(&s.stdout);
    assert!(human.starts_with("PAUSED ("), "{human}");

    // Reload with a ring: the socket now takes triggers, and the pause holds.
    let with_ring = format!(
        "{no_ring}snapshot_size = \"8MiB\"\nsnapshot_file = \"{}\"\n\
         snapshot_topics = [\"/ring/only\"]\n",
        tmp.path().join("ring").display()
    );
    std::fs::write(
        &config,
        crate::common::small_daemon_config(&root, &status, &with_ring),
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let first_bag = st()["bag"].clone();
    let inode = || {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&sock).map(|m| m.ino()).ok()
    };
    let socket_before = inode();
    assert!(socket_before.is_some());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(wait_for(|| st()["bag"] != first_bag));
    // The same socket, never closed: not bound again by the new bag.
    assert_eq!(
        inode(),
        socket_before,
        "the socket was kept across the reload"
    );
    // Polled: until the new bag's ring is up, a trigger is refused ("between two bags").
    let mut last = None;
    assert!(
        wait_for(|| {
            let t = trigger(&sock, &["--reason", "after-reload", "--post", "0"]);
            let ok = t.status.success();
            last = Some(t);
            ok
        }),
        "a trigger after the reload: {}",
        last.map(|t| String::from_utf8_lossy(&t.stderr).into_owned())
            .unwrap_or_default()
    );
    assert_eq!(st()["paused"], true, "the pause held across the reload");
    assert!(wait_for(|| bags_named(&root, "after-reload")
        .first()
        .is_some_and(|b| b.join("metadata.yaml").is_file())));

    // Reload without the ring again: the socket stays, triggers get the answer again.
    std::fs::write(
        &config,
        crate::common::small_daemon_config(&root, &status, &no_ring),
    )
    .unwrap();
    let second_bag = st()["bag"].clone();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(wait_for(|| st()["bag"] != second_bag));
    assert_eq!(
        inode(),
        socket_before,
        "the socket was kept across the reload"
    );
    let mut last = None;
    assert!(wait_for(|| {
        let t = trigger(&sock, &["--reason", "no-ring-again"]);
        let answered = String::from_utf8_lossy(&t.stderr).contains("has no black-box ring");
        last = Some(t);
        answered
    }));
    assert_no_ring_answer(&last.unwrap(), &sock);
    control_says("resume", &sock, "resumed");
    assert!(wait_for(|| st()["committed"].as_u64() > Some(0)));
    assert_eq!(st()["paused"], false);
    stop_cleanly(child);
    assert!(!sock.exists(), "the socket is removed at the stop");
}

/// `record --control-socket` needs no ring: pause and resume work, a trigger is the one-line
/// answer, and the socket is gone after the recorder stops.
#[test]
fn record_serves_a_control_socket_without_a_ring() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let status = tmp.path().join("status.json");
    let child = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--start-paused"])
        .arg("--control-socket")
        .arg(&sock)
        .arg("--status-file")
        .arg(&status)
        .arg("-o")
        .arg(tmp.path().join("bag"))
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("record starts");
    let st = || status_json(&status).unwrap_or_default();
    assert!(wait_for(|| st()["paused_messages"].as_u64() > Some(10)));
    assert!(sock.exists());
    assert_no_ring_answer(&trigger(&sock, &["--reason", "x"]), &sock);
    control_says("resume", &sock, "resumed");
    assert!(wait_for(|| st()["committed"].as_u64() > Some(10)));
    control_says("pause", &sock, "paused");
    assert!(wait_for(|| st()["paused"] == true));
    stop_cleanly(child);
    assert!(!sock.exists(), "the socket is removed at the end");
}

/// The socket stays one recorder's: a second daemon (another root) with the same
/// `control_socket` exits 2 with one line before it makes a bag, and a reload that would move
/// the socket onto another recorder's keeps the running configuration (and socket).
#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_a_reload_onto_a_busy_socket_is_kept_out() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let key = format!("control_socket = \"{}\"\n", sock.display());
    let (root_a, status_a) = (tmp.path().join("a"), tmp.path().join("a.json"));
    let (root_b, status_b) = (tmp.path().join("b"), tmp.path().join("b.json"));
    let config_a = tmp.path().join("a.toml");
    let config_b = tmp.path().join("b.toml");
    std::fs::write(
        &config_a,
        crate::common::small_daemon_config(&root_a, &status_a, &key),
    )
    .unwrap();
    std::fs::write(
        &config_b,
        crate::common::small_daemon_config(&root_b, &status_b, &key),
    )
    .unwrap();
    let log_a = tmp.path().join("a.log");
    let a = crate::common::daemon_command(&config_a)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_a).unwrap())
        .spawn_execd()
        .expect("daemon starts");
    let st = || status_json(&status_a).unwrap_or_default();
    assert!(wait_for(|| st()["committed"].as_u64() > Some(0)));

    let o = crate::common::daemon_command(&config_b)
        .run_output()
        .expect("second daemon runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "ringbag: error: {}: another recorder already listens on this control socket\n",
            sock.display()
        )
    );
    let bags_b: Vec<_> = std::fs::read_dir(&root_b)
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).collect())
        .unwrap_or_default();
    assert!(bags_b.is_empty(), "the refused daemon made no bag");

    // Another recorder listens on `other`; a reload of A onto it is refused.
    let other = tmp.path().join("other.sock");
    let rec = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small"])
        .arg("--control-socket")
        .arg(&other)
        .arg("-o")
        .arg(tmp.path().join("rec"))
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_execd()
        .expect("record starts");
    assert!(wait_for(|| other.exists()));
    let moved = format!("control_socket = \"{}\"\n", other.display());
    std::fs::write(
        &config_a,
        crate::common::small_daemon_config(&root_a, &status_a, &moved),
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(a.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let logged = || std::fs::read_to_string(&log_a).unwrap_or_default();
    assert!(
        wait_for(|| logged().contains("keeping the running configuration")),
        "{}",
        logged()
    );
    assert!(
        logged().contains(&format!(
            "SIGHUP: control_socket: {}: another recorder already listens on this control \
             socket; keeping the running configuration",
            other.display()
        )),
        "{}",
        logged()
    );
    // A still answers on its own socket.
    control_says("pause", &sock, "paused");
    sigint(&rec);
    sigint(&a);
    let out = wait_deadline(a, DEADLINE.as_secs()).expect("daemon ends");
    assert!(out.status.success(), "{}", logged());
    assert!(wait_deadline(rec, DEADLINE.as_secs())
        .expect("record ends")
        .status
        .success());
}

/// A daemon tried by hand as an ordinary user, with neither `control_socket` nor a ring: the
/// default socket (/run/ringbag/control.sock) cannot be made there, and nothing needs it, so
/// it records without one and says so in one warning, rather than refusing to start.
#[test]
fn a_hand_run_daemon_that_cannot_use_the_default_socket_records_without_one_and_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let status = tmp.path().join("status.json");
    let config = tmp.path().join("ringbag.toml");
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
             synthetic_profile = \"small\"\nclock = \"system\"\n",
            tmp.path().join("bags").display(),
            status.display()
        ),
    )
    .unwrap();
    // As root (CI) the default path could be made: run as `nobody`, as a user would be.
    let mut cmd = if nix::unistd::geteuid().is_root() {
        crate::common::ringbag_as_nobody()
    } else {
        ringbag()
    };
    let check = cmd
        .args(["daemon", "--check-config", "--config"])
        .arg(&config)
        .env_remove("RINGBAG_LOG")
        .run_output()
        .expect("ringbag runs");
    assert_eq!(check.status.code(), Some(0), "{check:?}");
    let mut cmd = if nix::unistd::geteuid().is_root() {
        crate::common::ringbag_as_nobody()
    } else {
        ringbag()
    };
    let child = cmd
        .args(["daemon", "--config"])
        .arg(&config)
        .env_remove("RINGBAG_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("daemon starts");
    assert!(wait_for(|| {
        crate::common::status_committed(&status).is_some_and(|n| n > 0)
    }));
    let err = stop_cleanly(child);
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("serves no control socket"))
        .collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(warned[0].contains("set control_socket"), "{err}");
}
