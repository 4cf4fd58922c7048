//! `ringbag daemon` end to end with a synthetic source, systemd's notify socket played by a
//! bound datagram socket, and signals; `ringbag status`; `--check-config` error lines.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{ringbag, run, stderr, stdout};

const DEADLINE: Duration = Duration::from_secs(30);

/// A notification as received, with whether the first split existed at that moment.
#[derive(Debug, Clone)]
struct Note {
    text: String,
    first_split_existed: bool,
}

struct Daemon {
    child: Child,
    notes: Arc<Mutex<Vec<Note>>>,
    stop_reader: Arc<std::sync::atomic::AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn first_split_exists(root: &Path) -> bool {
    std::fs::read_dir(root)
        .map(|d| {
            d.flatten().any(|bag| {
                let name = bag.file_name().to_string_lossy().into_owned();
                bag.path().join(format!("{name}_0.db3")).is_file()
            })
        })
        .unwrap_or(false)
}

impl Daemon {
    fn start(tmp: &Path, config: &Path, root: &Path, env: &[(&str, &str)]) -> Daemon {
        let sock_path = tmp.join(format!(
            "notify-{}.sock",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let sock = UnixDatagram::bind(&sock_path).expect("bind notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let notes = Arc::new(Mutex::new(Vec::new()));
        let stop_reader = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Read as systemd does, all the time: a full datagram queue would block the sender.
        let reader = {
            let notes = notes.clone();
            let stop = stop_reader.clone();
            let root = root.to_path_buf();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(n) = sock.recv(&mut buf) {
                        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                        let first_split_existed = first_split_exists(&root);
                        notes.lock().unwrap().push(Note {
                            text,
                            first_split_existed,
                        });
                    }
                }
            })
        };
        let mut cmd = ringbag();
        cmd.args(["daemon", "--config"])
            .arg(config)
            .env("NOTIFY_SOCKET", &sock_path)
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("JOURNAL_STREAM")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn_execd().expect("daemon starts");
        Daemon {
            child,
            notes,
            stop_reader,
            reader: Some(reader),
        }
    }

    fn notes(&self) -> Vec<Note> {
        self.notes.lock().unwrap().clone()
    }

    fn lines_with(&self, prefix: &str) -> Vec<(String, bool)> {
        self.notes()
            .iter()
            .flat_map(|n| {
                n.text
                    .lines()
                    .filter(|l| l.starts_with(prefix))
                    .map(|l| (l.to_string(), n.first_split_existed))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Wait until `cond` holds, failing the test at the deadline.
    fn wait_for(&mut self, what: &str, mut cond: impl FnMut(&Daemon) -> bool) {
        let end = Instant::now() + DEADLINE;
        while !cond(self) {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("daemon exited ({st}) while waiting for {what}");
            }
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).expect("signal");
    }

    /// Wait for the exit; returns (status, stderr).
    fn wait(mut self) -> (std::process::ExitStatus, String, Vec<Note>) {
        let end = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("daemon did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        // Let the reader take what is still queued.
        std::thread::sleep(Duration::from_millis(50));
        self.stop_reader
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let notes = self.notes();
        (status, err, notes)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stop_reader
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn write_config(tmp: &Path, extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let root = tmp.join("root");
    let status = tmp.join("run/status.json");
    std::fs::create_dir_all(tmp.join("run")).unwrap();
    let config = tmp.join("ringbag.toml");
    std::fs::write(
        &config,
        crate::common::small_daemon_config(&root, &status, extra),
    )
    .unwrap();
    (config, root, status)
}

use crate::common::bag_dirs as bags;

fn splits(bag: &Path) -> usize {
    ringbag::bag::reader::find_split_files(bag)
        .map(|f| f.len())
        .unwrap_or(0)
}

/// Every bag under `root` opens and was finished cleanly (no lock left), with messages.
fn assert_complete(root: &Path) -> u64 {
    let mut total = 0;
    for bag in bags(root) {
        assert_eq!(
            ringbag::bag::lock::state(&bag),
            ringbag::bag::lock::LockState::Clean,
            "{} left unfinished",
            bag.display()
        );
        let info = run(&["info", bag.to_str().unwrap()]);
        assert!(info.status.success(), "{}", stderr(&info));
        let b = ringbag::bag::reader::Bag::open(&bag).expect("bag opens");
        let n = b.metadata.message_count;
        assert!(n > 0, "{} holds no message", bag.display());
        total += n;
    }
    total
}

#[test]
fn daemon_is_ready_only_after_the_first_split_exists_then_reports_status_and_stops_cleanly_on_sigterm(
) {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    let ready = d.lines_with("READY=1");
    assert!(ready[0].1, "READY=1 arrived before the first split existed");
    d.wait_for("two STATUS= lines after READY", |d| {
        d.lines_with("STATUS=")
            .iter()
            .filter(|(l, _)| l.contains("msg/s"))
            .count()
            >= 2
    });
    let line = d.lines_with("STATUS=").last().unwrap().0.clone();
    assert!(
        line.contains("MB/s") && line.contains("dropped") && line.contains("budget"),
        "{line}"
    );
    assert!(
        line.contains("of 16.0 MiB") && line.contains("clock system"),
        "{line}"
    );
    assert!(status.is_file(), "status file written");
    // No watchdog without WATCHDOG_USEC.
    assert!(d.lines_with("WATCHDOG=1").is_empty());
    d.signal(Signal::SIGTERM);
    let (st, err, notes) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(
        notes
            .iter()
            .any(|n| n.text.lines().any(|l| l == "STOPPING=1")),
        "no STOPPING=1: {notes:?}"
    );
    assert_eq!(bags(&root).len(), 1);
    assert!(assert_complete(&root) > 0);
}

#[test]
fn with_watchdog_usec_the_daemon_pings_while_the_writer_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, _) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[("WATCHDOG_USEC", "200000")]);
    d.wait_for("three WATCHDOG=1", |d| {
        d.lines_with("WATCHDOG=1").len() >= 3
    });
    d.signal(Signal::SIGINT);
    let (st, err, _) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
}

#[test]
fn sigusr1_closes_the_split_at_once_and_sighup_starts_a_new_bag() {
    let tmp = tempfile::tempdir().unwrap();
    // Splits by size only at 1 MiB: at ~100 kB/s nothing splits on its own within the test.
    let (config, root, _) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    let first = bags(&root).pop().expect("a bag");
    assert_eq!(splits(&first), 1);
    d.signal(Signal::SIGUSR1);
    d.wait_for("a second split", |_| splits(&first) == 2);
    d.signal(Signal::SIGHUP);
    d.wait_for("a second bag", |_| bags(&root).len() == 2);
    d.wait_for("READY=1 for the second bag", |d| {
        d.lines_with("READY=1").len() >= 2
    });
    d.signal(Signal::SIGTERM);
    let (st, err, notes) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(notes
        .iter()
        .any(|n| n.text.lines().any(|l| l == "RELOADING=1")));
    let all = bags(&root);
    assert_eq!(all.len(), 2);
    // Names: UTC start time, then a rising sequence number.
    let names: Vec<String> = all
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        names[0].ends_with("_0001") && names[1].ends_with("_0002"),
        "{names:?}"
    );
    assert_eq!(splits(&all[0]), 2, "the first bag keeps both splits");
    assert_complete(&root);
}

#[test]
fn sighup_with_an_invalid_config_keeps_the_running_bag_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{good}max_bag_sise = 5\n")).unwrap();
    d.signal(Signal::SIGHUP);
    d.wait_for("last_error in the status file", |_| {
        std::fs::read_to_string(&status)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["last_error"].as_str().map(str::to_string))
            .is_some_and(|e| e.contains("keeping the running configuration"))
    });
    assert_eq!(bags(&root).len(), 1, "no new bag for an invalid config");
    d.signal(Signal::SIGTERM);
    let (st, err, _) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
    let line = format!(
        "ringbag: error: SIGHUP: {}:9:1: max_bag_sise: unknown key; keeping the running configuration",
        config.display()
    );
    assert!(err.lines().any(|l| l == line), "{err}");
    assert_complete(&root);
}

#[test]
fn status_prints_the_file_and_exits_3_when_it_is_stale_and_2_when_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("two STATUS lines", |d| d.lines_with("STATUS=").len() >= 2);
    // The topic appears in the file once its first message was accepted, which can take
    // more than two status periods under emulation.
    d.wait_for("the topic in the status file", |_| {
        std::fs::read_to_string(&status).is_ok_and(|t| t.contains("/synthetic/small"))
    });
    let file = status.to_str().unwrap();
    let human = run(&["status", "--file", file]);
    assert_eq!(human.status.code(), Some(0), "{}", stderr(&human));
    let text = stdout(&human);
    assert!(
        text.contains("/synthetic/small") && text.contains("bag:"),
        "{text}"
    );
    let json = run(&["status", "--json", "--file", file]);
    assert_eq!(json.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("json");
    assert_eq!(v["topics"][0]["name"], "/synthetic/small");
    assert_eq!(v["clock"]["source"], "system");
    assert_eq!(v["budget"]["max_record_size"], 16 << 20);
    assert!(v["budget"]["free_bytes"].as_u64().unwrap() > 0);
    d.signal(Signal::SIGTERM);
    let (st, _, _) = d.wait();
    assert_eq!(st.code(), Some(0));
    // A service that stopped: the file ages. Make it 10 s old rather than wait.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    let ms = v["updated_unix_ms"].as_u64().unwrap() - 10_000;
    v["updated_unix_ms"] = ms.into();
    std::fs::write(&status, v.to_string()).unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(10);
    std::fs::File::options()
        .write(true)
        .open(&status)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let stale = run(&["status", "--file", file]);
    assert_eq!(stale.status.code(), Some(3), "{}", stderr(&stale));
    assert!(stderr(&stale).contains("not recording"));
    let missing = run(&[
        "status",
        "--file",
        tmp.path().join("nope.json").to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(stderr(&missing).lines().count(), 1);
}

#[test]
fn a_killed_daemon_is_recovered_at_the_next_start_before_ready() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, status) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("100 messages committed", |_| {
        crate::common::status_committed(&status).is_some_and(|n| n >= 100)
    });
    d.signal(Signal::SIGKILL);
    let _ = d.wait();
    let killed = bags(&root).pop().unwrap();
    assert_eq!(
        ringbag::bag::lock::state(&killed),
        ringbag::bag::lock::LockState::Unclean
    );
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    // Recovery ran before READY: the killed bag is finished and readable now.
    assert_eq!(
        ringbag::bag::lock::state(&killed),
        ringbag::bag::lock::LockState::Clean
    );
    // While recovering it asked systemd for more start time, before READY.
    let notes = d.notes();
    let at = |prefix: &str| {
        notes
            .iter()
            .position(|n| n.text.lines().any(|l| l.starts_with(prefix)))
    };
    let extend = at("EXTEND_TIMEOUT_USEC=").expect("EXTEND_TIMEOUT_USEC sent");
    assert!(extend < at("READY=1").unwrap(), "{notes:?}");
    d.signal(Signal::SIGTERM);
    let (st, err, _) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
    assert_eq!(bags(&root).len(), 2);
    assert_complete(&root);
}

/// `--check-config`: one line `ringbag: error: FILE:LINE:COLUMN: KEY: PROBLEM`, exit 2.
#[test]
fn check_config_names_file_line_column_key_and_problem_for_each_class_of_mistake() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let a_file = tmp.path().join("plain-file");
    std::fs::write(&a_file, "x").unwrap();
    let head = format!(
        "output_root = \"{}\"\nsource = \"synthetic\"\n",
        root.display()
    );
    let cases: Vec<(String, String)> = vec![
        (
            format!("{head}max_bag_sise = \"1MiB\"\n"),
            "3:1: max_bag_sise: unknown key".into(),
        ),
        (
            format!("{head}all = \"yes\"\n"),
            "3:7: all: invalid type: string \"yes\", expected a boolean".into(),
        ),
        (
            format!("{head}max_bag_size = \"12 parsecs\"\n"),
            "3:16: max_bag_size: `12 parsecs`: unknown size unit `parsecs` (use bytes, KiB, MiB, GiB, KB, MB or GB)".into(),
        ),
        (
            format!("{head}max_record_size = \"1GiB\"\n"),
            "3:19: max_record_size: max_record_size needs a split limit (max_bag_size or max_bag_duration): only closed splits can be deleted".into(),
        ),
        (
            format!("output_root = \"{}/bags\"\n", a_file.display()),
            format!(
                "1:15: output_root: {}/bags: {} is not a directory",
                a_file.display(),
                a_file.display()
            ),
        ),
        (
            "source = \"synthetic\"\noutput_root = \"/proc/ringbag\"\n".into(),
            "2:15: output_root: /proc/ringbag: on a filesystem without storage (such as /proc or /sys)".into(),
        ),
        (
            "output_root = \"bags\"\n".into(),
            "1:15: output_root: bags: must be an absolute path".into(),
        ),
        (
            format!("{head}clock = \"sundial\"\n"),
            "3:9: clock: unknown variant `sundial`, expected one of `system`, `ptp`, `auto`".into(),
        ),
        (
            format!("{head}ptp_poll_interval = 5\n"),
            "3:21: ptp_poll_interval: invalid clock setting: poll interval 5 ms is outside 10..=60000 ms".into(),
        ),
        (
            format!("output_root = \"{}\"\nsource = \"ros\"\n", root.display()),
            "2:10: source: \"ros\": this ringbag was built without the `ros` feature (use \"synthetic\", or rebuild with --features ros)".into(),
        ),
        (
            format!("{head}max_bag_size = \n"),
            "3:16: (file): string values must be quoted, expected literal string".into(),
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        if cfg!(feature = "ros") && want.contains("`ros` feature") {
            continue;
        }
        let path = tmp.path().join(format!("c{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = run(&[
            "daemon",
            "--config",
            path.to_str().unwrap(),
            "--check-config",
        ]);
        assert_eq!(o.status.code(), Some(2), "{text}: {}", stderr(&o));
        let expected = format!("ringbag: error: {}:{want}\n", path.display());
        if stderr(&o) != expected {
            wrong.push(format!("{text}\n  got:  {}  want: {expected}", stderr(&o)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // And a good one exits 0, creating nothing.
    let good = tmp.path().join("good.toml");
    std::fs::write(
        &good,
        format!("output_root = \"{}\"\nsource = \"synthetic\"\nmax_bag_size = \"1MiB\"\nmax_record_size = \"8MiB\"\n", root.display()),
    )
    .unwrap();
    let o = run(&[
        "daemon",
        "--config",
        good.to_str().unwrap(),
        "--check-config",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!root.exists());
}

#[test]
fn the_daemon_with_a_bad_config_exits_2_with_one_line_and_records_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, _) = write_config(tmp.path(), "max_bag_files = 1\n");
    let o = run(&["daemon", "--config", config.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains(":9:17: max_bag_files: max_bag_files 1: must be at least 2"),
        "{e}"
    );
    assert!(!root.exists());
}

/// Receives journald's native protocol on `/run/systemd/journal/socket` (inside a private
/// mount namespace with its own /run), runs the command with stderr in a file whose
/// device:inode is `JOURNAL_STREAM`, prints each datagram followed by `--`.
const FAKE_JOURNALD: &str = r#"
import os, socket, subprocess, sys
os.makedirs('/run/systemd/journal', exist_ok=True)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind('/run/systemd/journal/socket')
s.settimeout(0.2)
err = open(sys.argv[1], 'w+')
st = os.fstat(err.fileno())
env = dict(os.environ, JOURNAL_STREAM='%d:%d' % (st.st_dev, st.st_ino))
p = subprocess.Popen(sys.argv[2:], stderr=err, env=env)
while True:
    try:
        d = s.recv(1 << 16)
        sys.stdout.buffer.write(d + b'\n--\n')
    except socket.timeout:
        if p.poll() is not None:
            break
sys.exit(p.returncode)
"#;

#[test]
fn when_stderr_is_the_journal_entries_carry_priority_and_ringbag_fields() {
    let skip = |why: &str| eprintln!("SKIP journal test: {why}");
    if std::env::var("RINGBAG_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty()) {
        return skip("cross runner");
    }
    if !nix::unistd::geteuid().is_root() {
        return skip("needs root for a private mount namespace");
    }
    let probe = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .run_output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return skip("unshare --mount is not possible here");
    }
    let python = std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .run_output();
    if !python.is_ok_and(|o| o.status.success()) {
        return skip("python3 is missing");
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("journald.py");
    std::fs::write(&script, FAKE_JOURNALD).unwrap();
    let err_file = tmp.path().join("stderr");
    let bag = tmp.path().join("bag");
    let o = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs /run && exec python3 \"$@\"")
        .arg("sh")
        .arg(&script)
        .arg(&err_file)
        .arg(env!("CARGO_BIN_EXE_ringbag"))
        .args([
            "record",
            "--source",
            "synthetic",
            "--synthetic-profile",
            "small",
        ])
        .args(["--synthetic-count", "50", "--clock", "auto"])
        .args(["--ptp-device", "/nonexistent/ptp9", "-o"])
        .arg(&bag)
        .run_output()
        .expect("unshare runs");
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert!(o.status.success(), "{}\n{err}", stderr(&o));
    let entries = journal_entries(&o.stdout);
    let field = |e: &Vec<(String, String)>, k: &str| {
        e.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
    };
    let with_message = |needle: &str| {
        entries
            .iter()
            .find(|e| field(e, "MESSAGE").is_some_and(|m| m.contains(needle)))
            .unwrap_or_else(|| panic!("no entry with {needle:?} in {entries:?}"))
    };
    let fallback = with_message("stamping with the system clock");
    assert_eq!(
        field(fallback, "PRIORITY").as_deref(),
        Some("4"),
        "{fallback:?}"
    );
    let recording = with_message("recording into");
    // systemd-journal-logger maps info to notice (5), warn to warning (4).
    assert_eq!(field(recording, "PRIORITY").as_deref(), Some("5"));
    assert_eq!(
        field(recording, "RINGBAG_BAG"),
        Some(bag.display().to_string())
    );
    // They went to the journal, not to the stderr stream.
    assert!(!err.contains("recording into"), "{err}");
}

/// Datagrams as the fake journald printed them (each followed by `\n--\n`), parsed as the
/// native protocol: `KEY=value` lines, or `KEY`, a 64-bit little-endian length, the bytes.
fn journal_entries(out: &[u8]) -> Vec<Vec<(String, String)>> {
    let mut entries = Vec::new();
    let mut fields = Vec::new();
    let mut i = 0;
    while i < out.len() {
        let nl = out[i..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(out.len(), |p| i + p);
        let line = &out[i..nl];
        if line.is_empty() {
            i = nl + 1; // the datagram's own final newline before `--`
        } else if line == b"--" {
            entries.push(std::mem::take(&mut fields));
            i = nl + 1;
        } else if let Some(eq) = line.iter().position(|&b| b == b'=') {
            fields.push((
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            ));
            i = nl + 1;
        } else {
            let len_at = nl + 1;
            let len = u64::from_le_bytes(out[len_at..len_at + 8].try_into().unwrap()) as usize;
            let value = &out[len_at + 8..len_at + 8 + len];
            fields.push((
                String::from_utf8_lossy(line).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ));
            i = len_at + 8 + len + 1;
        }
    }
    entries
}

/// Bytes of every split file (with `-wal`/`-shm`) under the root.
fn root_split_bytes(root: &Path) -> u64 {
    bags(root)
        .iter()
        .flat_map(|b| {
            ringbag::bag::reader::find_split_files(b)
                .unwrap_or_default()
                .into_iter()
                .map(move |f| ringbag::bag::writer::split_size_on_disk(&b.join(f)))
        })
        .sum()
}

#[test]
fn the_budget_spans_every_bag_in_the_root_across_reloads() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let config = tmp.path().join("ringbag.toml");
    let budget: u64 = 3 << 20;
    // 100 × 64 KiB messages a second: the 3 MiB budget fills within a second.
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
             synthetic_profile = \"medium\"\nclock = \"system\"\nmax_bag_size = \"512KiB\"\n\
             max_record_size = \"3MiB\"\n{}",
            root.display(),
            status.display(),
            crate::common::control_socket_key(&status)
        ),
    )
    .unwrap();
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    let first = bags(&root).pop().unwrap();
    let first_split = first.join(format!(
        "{}_0.db3",
        first.file_name().unwrap().to_string_lossy()
    ));
    d.wait_for("retention to delete the first split", |_| {
        !first_split.exists()
    });
    d.signal(Signal::SIGHUP);
    d.wait_for("a second bag", |_| bags(&root).len() == 2);
    let second = bags(&root).pop().unwrap();
    // The second bag alone outgrows the budget: the first bag's splits must make room.
    d.wait_for("the first bag to be emptied or removed", |_| {
        splits(&first) == 0 || !first.exists()
    });
    assert!(root_split_bytes(&root) <= budget);
    d.signal(Signal::SIGTERM);
    let (st, err, _) = d.wait();
    assert_eq!(st.code(), Some(0), "{err}");
    let total = root_split_bytes(&root);
    assert!(
        total <= budget,
        "{total} bytes of splits over a {budget} budget"
    );
    let info = run(&["info", second.to_str().unwrap()]);
    assert!(info.status.success(), "{}", stderr(&info));
}

#[test]
fn deleting_the_output_root_under_the_daemon_is_noticed_within_a_second_said_in_status_and_exits_1()
{
    let tmp = tempfile::tempdir().unwrap();
    let (config, root, _status) = write_config(tmp.path(), "");
    let mut d = Daemon::start(tmp.path(), &config, &root, &[]);
    d.wait_for("READY=1", |d| !d.lines_with("READY=1").is_empty());
    d.wait_for("a STATUS= line", |d| !d.lines_with("STATUS=").is_empty());
    std::fs::remove_dir_all(&root).expect("delete the root");
    let deleted_at = Instant::now();
    let stopped = |d: &Daemon| {
        d.lines_with("STATUS=STOPPED:")
            .iter()
            .any(|(l, _)| l.contains("deleted"))
    };
    let end = Instant::now() + DEADLINE;
    while !stopped(&d) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = deleted_at.elapsed();
    let (st, err, notes) = d.wait();
    eprintln!(
        "deletion in STATUS= after {:.0} ms",
        took.as_secs_f64() * 1e3
    );
    let status_lines: Vec<&str> = notes
        .iter()
        .flat_map(|n| n.text.lines())
        .filter(|l| l.starts_with("STATUS="))
        .collect();
    assert!(
        status_lines
            .iter()
            .any(|l| l.starts_with("STATUS=STOPPED:") && l.contains("deleted")),
        "{status_lines:?}\n{err}"
    );
    // The writer checks every 250 ms; the rest is slack for a busy machine (and qemu).
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("the bag directory was deleted with its recording root")
            && err
                .lines()
                .last()
                .unwrap_or_default()
                .starts_with("ringbag: error: "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
