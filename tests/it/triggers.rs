//! Triggers at the edges: the reason's bound (CLI, socket, the record that survives kill -9),
//! a slow control-socket client, reasons that try to forge log lines, a trigger storm.

use crate::common::SpawnExecd;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use ringbag::bag::reader::Bag;
use ringbag::snapshot::trigger::MAX_REASON_BYTES;

use crate::common::{
    bags_named, now_ns, ringbag, sigint, stderr, trigger, wait_deadline, RunOutput,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn wait_for(cond: impl FnMut() -> bool) -> bool {
    crate::common::wait_for(DEADLINE, cond)
}

/// A recorder of the synthetic `small` profile with a ring and a control socket in `tmp`.
fn recorder(tmp: &Path, name: &str) -> Child {
    ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--log-level", "info"])
        .args(["--bag-format", "jazzy", "--snapshot-size", "8MiB"])
        .arg("--snapshot-file")
        .arg(tmp.join("ring"))
        .arg("--control-socket")
        .arg(tmp.join("control.sock"))
        .arg("-o")
        .arg(tmp.join("root").join(name))
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("record starts")
}

/// SIGINT, then the recorder's stderr.
fn stop(child: Child) -> String {
    sigint(&child);
    let out = crate::common::wait_deadline(child, DEADLINE.as_secs()).expect("recorder ends");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The recorder stopped (SIGSTOP) until this is dropped (SIGCONT), also when a test fails.
struct Frozen(i32);

impl Frozen {
    fn new(child: &Child) -> Frozen {
        let pid = child.id() as i32;
        crate::common::freeze(pid);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal the recorder");
}

/// The snapshot bag whose name holds `part`, once it is finished (its metadata.yaml is in).
fn finished_snapshot(root: &Path, part: &str) -> std::path::PathBuf {
    assert!(
        wait_for(|| bags_named(root, part)
            .first()
            .is_some_and(|b| b.join("metadata.yaml").is_file())),
        "snapshot {part} finished"
    );
    bags_named(root, part).remove(0)
}

fn trigger_time_ns(bag: &Path) -> i64 {
    Bag::open(bag).unwrap().metadata.custom_data["ringbag.snapshot.trigger_time_ns"]
        .parse()
        .unwrap()
}

/// One raw request over the socket; the answer line.
fn raw_request(sock: &Path, line: &str) -> String {
    let s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    (&s).write_all(line.as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    answer
}

#[test]
fn a_reason_over_the_bound_is_refused_with_one_line_by_the_cli_and_the_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let long = "x".repeat(MAX_REASON_BYTES + 1);
    // Checked before any recorder is asked: the same line with or without one.
    let o = trigger(&sock, &["--reason", &long]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "ringbag: error: --reason: {} bytes long; at most {MAX_REASON_BYTES}\n",
            MAX_REASON_BYTES + 1
        )
    );
    let child = recorder(tmp.path(), "cont");
    assert!(wait_for(|| sock.exists()), "socket appears");
    let answer = raw_request(&sock, &format!("{{\"reason\": \"{long}\"}}\n"));
    let log = stop(child);
    assert!(
        answer.contains("\"refused\"") && answer.contains("at most 512"),
        "{answer}"
    );
    assert!(bags_named(&tmp.path().join("root"), "_snapshot_").is_empty());
    assert!(!log.contains("snapshot started"), "{log}");
}

#[test]
fn a_reason_at_the_bound_survives_a_kill_9_mid_snapshot_with_its_window() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let sock = tmp.path().join("control.sock");
    // Control characters take six bytes each in the record's JSON: the longest it can be.
    let reason: String = "\u{1}".repeat(MAX_REASON_BYTES - 8) + "estop-42";
    assert_eq!(reason.len(), MAX_REASON_BYTES);
    let mut child = recorder(tmp.path(), "first");
    assert!(wait_for(|| sock.exists()), "socket appears");
    let t = trigger(&sock, &["--reason", &reason, "--pre", "1", "--post", "30"]);
    assert!(t.status.success(), "{}", stderr(&t));
    // Extensions add reasons: the record still holds the window (it keeps what fits).
    for i in 0..4 {
        let more = format!("{}{i}", "\u{2}".repeat(MAX_REASON_BYTES - 1));
        let t = trigger(&sock, &["--reason", &more, "--post", "40"]);
        assert!(stderr(&t).contains("snapshot extended"), "{}", stderr(&t));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let out = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--synthetic-count", "1"])
        .args(["--bag-format", "jazzy", "--snapshot-size", "8MiB"])
        .arg("--snapshot-file")
        .arg(tmp.path().join("ring"))
        .arg("-o")
        .arg(root.join("second"))
        .run_output()
        .expect("restart");
    assert!(out.status.success(), "{}", stderr(&out));
    let crash = bags_named(&root, "_crash_");
    assert_eq!(crash.len(), 1, "{}", stderr(&out));
    let bag = Bag::open(&crash[0]).expect("crash bag opens");
    let c = &bag.metadata.custom_data;
    let recorded = &c["ringbag.snapshot.reason"];
    assert!(
        recorded.starts_with(&format!("{reason}; ")),
        "the first reason whole: {recorded:?}"
    );
    assert!(recorded.ends_with(" more"), "{recorded:?}");
    let trigger_ns: i64 = c["ringbag.snapshot.trigger_time_ns"].parse().unwrap();
    let start: i64 = c["ringbag.snapshot.window_start_ns"].parse().unwrap();
    let end: i64 = c["ringbag.snapshot.window_end_ns"].parse().unwrap();
    assert_eq!(start, trigger_ns - 1_000_000_000);
    assert!(end >= trigger_ns + 40_000_000_000, "extended window end");
    assert!(end < trigger_ns + 60_000_000_000);
}

#[test]
fn a_slow_client_does_not_delay_another_clients_trigger_and_is_cut_off_in_bounded_time() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let child = recorder(tmp.path(), "cont");
    assert!(wait_for(|| sock.exists()), "socket appears");
    // The slow client: one byte of a request every 300 ms, for up to 8 s; another thread
    // waits for its answer and the end of the connection.
    let slow = UnixStream::connect(&sock).expect("connect");
    let started = Instant::now();
    let writer = {
        let slow = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            let request = b"{\"reason\": \"slowly\"}\n";
            for b in request.iter().cycle().take(8_000 / 300) {
                if (&slow).write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let reader = std::thread::spawn(move || {
        slow.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut answer = String::new();
        let _ = (&slow).read_to_string(&mut answer);
        (answer, started.elapsed())
    });
    // Its first byte is in: the server holds the connection now.
    std::thread::sleep(Duration::from_millis(50));
    let before_ns = now_ns();
    let fast = trigger(&sock, &["--reason", "fast", "--post", "0"]);
    let fast_done = started.elapsed();
    let after_ns = now_ns();
    assert!(fast.status.success(), "{}", stderr(&fast));
    // The slow one is answered (refused) and closed by the server's bound, not its own end.
    let (answer, slow_done) = reader.join().unwrap();
    let _ = writer.join();
    // The slow request line is complete only after 6 s (its newline is byte 21): a server
    // that served it first made the fast one wait at least that long. (Not "before the slow
    // one is cut off": under qemu the fast one alone may take about as long as that bound.)
    assert!(
        fast_done < Duration::from_secs(5),
        "the fast trigger ({fast_done:?}) waited for the slow client ({slow_done:?})"
    );
    assert!(
        slow_done < Duration::from_secs(6),
        "the slow client was held {slow_done:?}"
    );
    assert!(answer.contains("not complete within 2 s"), "{answer}");
    let root = tmp.path().join("root");
    assert!(wait_for(|| bags_named(&root, "_snapshot_fast")
        .first()
        .is_some_and(|b| b.join("metadata.yaml").is_file())));
    let log = stop(child);
    assert!(bags_named(&root, "_snapshot_slowly").is_empty(), "{log}");
    // The trigger time is when it was asked for.
    let bag = Bag::open(&bags_named(&root, "_snapshot_fast")[0]).unwrap();
    let at: i64 = bag.metadata.custom_data["ringbag.snapshot.trigger_time_ns"]
        .parse()
        .unwrap();
    assert!(
        (before_ns..=after_ns).contains(&at),
        "{before_ns} {at} {after_ns}"
    );
    eprintln!("fast trigger answered after {fast_done:?}; slow client cut off after {slow_done:?}");
}

#[test]
fn reasons_are_logged_escaped_on_one_line_and_a_storm_gives_a_bounded_number_of_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let child = recorder(tmp.path(), "cont");
    assert!(wait_for(|| sock.exists()), "socket appears");
    let forged = "a\nringbag: error: forged\x1b[31m";
    let t = trigger(&sock, &["--reason", forged, "--post", "5"]);
    assert!(t.status.success(), "{}", stderr(&t));
    let storm_started = Instant::now();
    let storm = 300;
    for i in 0..storm {
        let answer = raw_request(
            &sock,
            &format!("{{\"reason\": \"storm {i}\", \"post_s\": 5}}\n"),
        );
        assert!(answer.contains("extended"), "{answer}");
    }
    let storm_s = storm_started.elapsed().as_secs();
    let log = stop(child);
    assert!(
        log.lines().any(
            |l| l.contains("trigger (a\\nringbag: error: forged\\u{1b}[31m, Socket): snapshot")
        ),
        "{log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("ringbag: error: forged")),
        "{log}"
    );
    assert!(!log.contains('\x1b'), "{log}");
    // One "extends" line a second at most (plus the first), each with the count it stands for.
    let extends = log
        .lines()
        .filter(|l| l.contains("extends snapshot"))
        .count();
    assert!(
        extends as u64 <= storm_s + 2,
        "{extends} lines for {storm} extensions in {storm_s} s: {log}"
    );
    assert!(extends >= 1, "{log}");
}

#[test]
fn a_trigger_sent_to_a_stopped_recorder_is_reported_failed_and_never_happens_later() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let root = tmp.path().join("root");
    let child = recorder(tmp.path(), "cont");
    assert!(wait_for(|| sock.exists()), "socket appears");
    let frozen = Frozen::new(&child);
    // It connects into the listen backlog and writes its request; nobody reads it.
    let asked = Instant::now();
    let t = trigger(&sock, &["--reason", "stopped", "--post", "0"]);
    let took = asked.elapsed();
    drop(frozen);
    assert_eq!(t.status.code(), Some(1), "{}", stderr(&t));
    assert_eq!(
        stderr(&t),
        format!(
            "ringbag: error: --control-socket {}: no answer within 10 s; the trigger was not taken\n",
            sock.display()
        )
    );
    // Its own 10 s, plus the start of the process (seconds under a loaded emulator).
    let limit = if std::env::var_os("RINGBAG_TEST_RUNNER").is_some() {
        25
    } else {
        13
    };
    assert!(took < Duration::from_secs(limit), "gave up after {took:?}");
    // The recorder reads the old request now. A later trigger's bag, once finished, shows
    // the recorder has long handled it: no snapshot was ever taken for it.
    let later = trigger(&sock, &["--reason", "later", "--post", "0"]);
    assert!(
        stderr(&later).contains("snapshot started"),
        "{}",
        stderr(&later)
    );
    finished_snapshot(&root, "_snapshot_later");
    let log = stop(child);
    assert!(bags_named(&root, "_snapshot_stopped").is_empty(), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("trigger (stopped, Socket) dropped: sent")
                && l.contains("s ago, its client has given up")),
        "{log}"
    );
    eprintln!("the client gave up after {took:?}");
}

#[test]
fn a_trigger_sent_during_a_short_freeze_is_stamped_with_its_send_time() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let root = tmp.path().join("root");
    let child = recorder(tmp.path(), "cont");
    assert!(wait_for(|| sock.exists()), "socket appears");
    let frozen = Frozen::new(&child);
    let before_ns = now_ns();
    let client = ringbag()
        .arg("trigger")
        .arg("--control-socket")
        .arg(&sock)
        .args(["--reason", "frozen", "--post", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("ringbag trigger starts");
    // The freeze under test: shorter than the recorder's bound on a request's age (4 s),
    // long enough that the client (slow to start under an emulator) has sent well before
    // the resume.
    std::thread::sleep(Duration::from_millis(3000));
    let resumed_ns = now_ns();
    drop(frozen);
    let t = wait_deadline(client, DEADLINE.as_secs()).expect("trigger ends");
    assert!(stderr(&t).contains("snapshot started"), "{}", stderr(&t));
    let bag = finished_snapshot(&root, "_snapshot_frozen");
    let _ = stop(child);
    let at = trigger_time_ns(&bag);
    // Stamped when the client sent it (within a second of its start even when emulated),
    // not when the recorder resumed and read it.
    assert!(
        (before_ns..resumed_ns - 1_000_000_000).contains(&at),
        "trigger time {at}: {} ms after the client started, resumed at {} ms",
        (at - before_ns) / 1_000_000,
        (resumed_ns - before_ns) / 1_000_000
    );
}
