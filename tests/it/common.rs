//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::{Flavour, QosProfile, TopicInfo};

/// The `ringbag` binary. Under cross testing the binary is for another architecture, so
/// `RINGBAG_TEST_RUNNER` (e.g. `qemu-aarch64-static -L /usr/aarch64-linux-gnu`) prefixes it.
///
/// Its stdin is /dev/null unless a test sets another: `record` and `play` take keyboard
/// controls on a terminal, and children of a `cargo test` run from one would otherwise all put
/// that terminal in raw mode at once (each saving the others' raw mode as the one to restore).
pub fn ringbag() -> Command {
    let mut c = with_runner(Path::new(env!("CARGO_BIN_EXE_ringbag")));
    c.stdin(Stdio::null());
    c
}

/// `ringbag` run as the unprivileged user `nobody` through `setpriv` (root, as in CI,
/// ignores permission bits), with the same runner prefix as [`ringbag`].
pub fn ringbag_as_nobody() -> Command {
    let rb = ringbag();
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(rb.get_program())
        .args(rb.get_args());
    c
}

/// Run one test of this binary in a process of its own (for figures that are per process,
/// such as RSS, which tests running in parallel threads would otherwise distort). The test
/// sees `RINGBAG_TEST_CHILD=1` and does the work; the parent asserts that exactly that one
/// test ran and passed.
pub fn run_test_in_own_process(name: &str) -> Output {
    let exe = std::env::current_exe().expect("test binary path");
    let o = with_runner(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("RINGBAG_TEST_CHILD", "1")
        .run_output()
        .expect("test binary runs");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("1 passed"),
        "{name} in its own process: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// True inside the process `run_test_in_own_process` started.
pub fn in_test_child() -> bool {
    std::env::var_os("RINGBAG_TEST_CHILD").is_some()
}

/// `bin` as a command, prefixed by `RINGBAG_TEST_RUNNER` when set.
pub fn with_runner(bin: &Path) -> Command {
    match std::env::var("RINGBAG_TEST_RUNNER")
        .ok()
        .filter(|r| !r.trim().is_empty())
    {
        Some(runner) => {
            let mut parts = runner.split_whitespace();
            let mut c = Command::new(parts.next().expect("runner has a program"));
            c.args(parts).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

pub fn run(args: &[&str]) -> Output {
    ringbag().args(args).run_output().expect("ringbag runs")
}

/// A child still running the test binary's own program this long after it was spawned never
/// reached exec: see [`RunOutput`].
const STUCK_BEFORE_EXEC: Duration = Duration::from_secs(20);

/// `Command::output`, except that a child which deadlocked between fork and exec is killed
/// and started again. Under user-mode qemu (the aarch64 stage) that happens: qemu emulates
/// the fork of a multi-threaded guest, and once in CI the child of a test sat in a futex for
/// 14 minutes before it could exec `systemctl --version`. Such a child is still a copy of the
/// test binary (its `/proc/PID/cmdline` is ours): it never ran the command, so running it again
/// is safe. A child that did exec is waited for, however long it takes.
pub trait RunOutput {
    fn run_output(&mut self) -> std::io::Result<Output>;
}

impl RunOutput for Command {
    fn run_output(&mut self) -> std::io::Result<Output> {
        // As `output()` does: no stdin, both outputs captured.
        self.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn_execd()?
            .wait_with_output()
    }
}

/// `Command::spawn`, returning only once the child has exec'd its program: a child that
/// deadlocked between fork and exec (see [`RunOutput`]) is killed and started again, up to
/// three times. On the host `spawn` already waits for the exec, so the first look settles it.
/// Tests that time the child, signal it or read its output need this under qemu: a stuck
/// child would otherwise look like a recorder that hangs.
pub trait SpawnExecd {
    fn spawn_execd(&mut self) -> std::io::Result<std::process::Child>;
}

impl SpawnExecd for Command {
    fn spawn_execd(&mut self) -> std::io::Result<std::process::Child> {
        for _ in 0..3 {
            let mut child = self.spawn()?;
            let spawned = Instant::now();
            // Polls a condition (the kernel's view of the child's command line), not a
            // timing guess: it ends as soon as the exec happened.
            loop {
                if !stuck_before_exec(child.id()) {
                    return Ok(child);
                }
                if spawned.elapsed() >= STUCK_BEFORE_EXEC {
                    eprintln!(
                        "child {} ({:?}) is stuck between fork and exec after {:?}: \
                         killed, started again",
                        child.id(),
                        self.get_program(),
                        spawned.elapsed()
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Err(std::io::Error::other(
            "the child was stuck between fork and exec three times",
        ))
    }
}

/// True while process `pid` still runs this very program (our command line): it has not
/// exec'd what it was spawned for. Under qemu-user, `/proc/self/cmdline` shows the guest's
/// arguments while another process's shows the host's, `qemu-aarch64-static -L … ` and then
/// the guest's: so theirs may also end with ours, whole arguments only.
fn stuck_before_exec(pid: u32) -> bool {
    let (Ok(ours), Ok(theirs)) = (
        std::fs::read("/proc/self/cmdline"),
        std::fs::read(format!("/proc/{pid}/cmdline")),
    ) else {
        return false;
    };
    if ours.is_empty() || theirs.len() < ours.len() {
        return false;
    }
    let prefix = theirs.len() - ours.len();
    theirs.ends_with(&ours) && (prefix == 0 || theirs[prefix - 1] == 0)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `../shared/reference-bags` next to the repository, if this machine has it.
pub fn reference_bags() -> Option<PathBuf> {
    // RINGBAG_REFERENCE_BAGS overrides (cross mounts the project only; see Cross.toml).
    let p = std::env::var_os("RINGBAG_REFERENCE_BAGS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference-bags"));
    if p.join("humble/humble_ref/metadata.yaml").exists() {
        Some(p)
    } else {
        eprintln!("SKIP: ../shared/reference-bags is absent; reference comparisons not run");
        None
    }
}

pub fn topic(name: &str, ty: &str) -> TopicInfo {
    let mut t = TopicInfo::new(name, ty);
    t.offered_qos_profiles = vec![QosProfile::default()];
    t
}

/// The `committed` count of a recorder's status file (`--status-file`), or `None` while the
/// file is missing or being replaced.
pub fn status_committed(status: &Path) -> Option<u64> {
    status_json(status).and_then(|v| v["committed"].as_u64())
}

/// A status file, parsed; `None` while it is missing or being replaced.
pub fn status_json(status: &Path) -> Option<serde_json::Value> {
    std::fs::read(status)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
}

/// Removes from `c` every variable through which the caller's environment could hand it
/// S3 credentials (and RINGBAG_LOG), so that a test gives it only the ones it means to.
pub fn without_credentials(c: &mut Command) -> &mut Command {
    for v in [
        "CREDENTIALS_DIRECTORY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "RINGBAG_LOG",
    ] {
        c.env_remove(v);
    }
    c
}

/// `ringbag daemon --config <config>` as outside systemd: no notify socket, watchdog or
/// journal stream, and RINGBAG_LOG unset. The caller sets the stdio and spawns.
pub fn daemon_command(config: &Path) -> Command {
    let mut c = ringbag();
    c.args(["daemon", "--config"])
        .arg(config)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("JOURNAL_STREAM")
        .env_remove("RINGBAG_LOG");
    c
}

/// The text of a daemon config recording the synthetic `small` profile (1 kHz of 100 B) into
/// `root` with 1 MiB splits under a 16 MiB budget, its status file at `status`; `extra` adds
/// keys. Its control socket is the status file's path with `.sock` for `.json` unless `extra`
/// names one.
pub fn small_daemon_config(root: &Path, status: &Path, extra: &str) -> String {
    let socket = if extra.contains("control_socket") {
        String::new()
    } else {
        control_socket_key(status)
    };
    format!(
        "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
         synthetic_profile = \"small\"\nclock = \"system\"\nmax_bag_size = \"1MiB\"\n\
         max_record_size = \"16MiB\"\n{socket}{extra}",
        root.display(),
        status.display()
    )
}

/// `control_socket = "<status file>.sock"`: the daemon always serves one, and its default
/// (/run/ringbag/control.sock) would be shared by every test daemon at once. One per status
/// file, so that two daemons of a test (each with its status file) have a socket each.
pub fn control_socket_key(status: &Path) -> String {
    format!(
        "control_socket = \"{}\"\n",
        status.with_extension("sock").display()
    )
}

/// Poll `cond` every 10 ms until it holds or `limit` passes; whether it held.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// SIGSTOP `pid` and return once every thread of it is stopped (`/proc` says `T`): the
/// signal is only queued when kill(2) returns, and a thread running on another CPU goes on
/// for a moment. A look taken after this sees the process as it will stay.
pub fn freeze(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .expect("SIGSTOP");
    let all_stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.filter_map(|t| t.ok()).all(|t| {
                std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| {
                    // Gone meanwhile counts as stopped; "T" stopped, "t" traced.
                    s.rsplit(')').next().is_some_and(|r| {
                        matches!(r.trim_start().chars().next(), Some('T' | 't' | 'Z' | 'X'))
                    })
                })
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_stopped() {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop within 10 s"
        );
        std::thread::yield_now();
    }
}

/// `RINGBAG_STRESS_PERCENT` (default 100): how much of its load a test puts on a slow machine
/// (`scripts/cross-test.sh` sets 20 under qemu).
pub fn stress_percent() -> u64 {
    std::env::var("RINGBAG_STRESS_PERCENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// The system clock now, ns since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// The stamps of every message of `bag`, in the reader's order.
pub fn stamps(bag: &Path) -> Vec<i64> {
    ringbag::bag::reader::Bag::open(bag)
        .expect("bag opens")
        .messages(&ringbag::bag::reader::ReadFilter::default())
        .expect("read")
        .map(|m| m.expect("message").timestamp)
        .collect()
}

/// Send SIGINT to `child` (ignoring a child that is already gone).
pub fn sigint(child: &std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
}

/// `ringbag trigger --control-socket <sock> args`.
pub fn trigger(sock: &Path, args: &[&str]) -> Output {
    ringbag()
        .arg("trigger")
        .arg("--control-socket")
        .arg(sock)
        .args(args)
        .run_output()
        .expect("ringbag trigger runs")
}

/// Entries of `root` whose name contains `part`, sorted (none when `root` cannot be read).
pub fn bags_named(root: &Path, part: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().contains(part))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A CDR std_msgs/String payload.
pub fn cdr_string(s: &str) -> Vec<u8> {
    let mut v = vec![0, 1, 0, 0];
    v.extend_from_slice(&((s.len() + 1) as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

/// Write a bag with `per_topic` messages on each of `topics`, timestamps interleaved
/// 1 ms apart from `t0`, split every `split_every` messages. Returns what was written,
/// in timestamp order: (topic, timestamp, data).
pub fn write_bag(
    dir: &Path,
    flavour: Flavour,
    topics: &[(&str, &str)],
    per_topic: usize,
    split_every: usize,
) -> Vec<(String, i64, Vec<u8>)> {
    let mut w = BagWriter::create(dir, WriterOptions::new(flavour)).expect("create bag");
    let idx: Vec<usize> = topics
        .iter()
        .map(|(n, t)| w.add_topic(topic(n, t), None).expect("add topic"))
        .collect();
    let t0 = 1_700_000_000_000_000_000i64;
    let mut written = Vec::new();
    let mut n = 0;
    for i in 0..per_topic {
        for (k, (name, _)) in topics.iter().enumerate() {
            let ts = t0 + (n as i64) * 1_000_000;
            let data = cdr_string(&format!("{name} #{i}"));
            w.write_batch([(idx[k], ts, data.as_slice())])
                .expect("write");
            written.push((name.to_string(), ts, data));
            n += 1;
            if split_every > 0 && n % split_every == 0 {
                w.split().expect("split");
            }
        }
    }
    w.finish().expect("finish");
    written
}

/// Wait for `child`, reading its pipes meanwhile (a full pipe would block it), and kill it
/// if it runs past `secs`: `None` when it had to be killed.
pub fn wait_deadline(child: std::process::Child, secs: u64) -> Option<std::process::Output> {
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let timed_out = done_rx
            .recv_timeout(std::time::Duration::from_secs(secs))
            .is_err();
        if timed_out {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        timed_out
    });
    let out = child.wait_with_output().ok();
    let _ = done_tx.send(());
    if watchdog.join().unwrap_or(true) {
        None
    } else {
        out
    }
}

/// Spawn `ringbag args` with piped output and RINGBAG_LOG unset.
pub fn spawn(args: &[&str]) -> std::process::Child {
    ringbag()
        .args(args)
        .env_remove("RINGBAG_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .expect("ringbag starts")
}

/// The harness's detector: a forked child that has not exec'd is still running our own
/// command line (what a child deadlocked inside qemu's fork emulation looks like), and a child
/// that did exec is not. (The host's `Command::spawn` itself waits for exec, so a stuck child
/// can only be made here by forking by hand.)
#[test]
fn a_child_that_never_execs_is_told_apart_from_one_that_did() {
    use nix::sys::signal::{kill, Signal};
    use nix::sys::wait::waitpid;
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the child calls only pause(2) and _exit(2), both async-signal-safe, so forking
    // this multi-threaded test process is sound; the parent kills and reaps it below.
    let child = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => unsafe {
            libc::pause();
            libc::_exit(0)
        },
        ForkResult::Parent { child } => child,
    };
    assert!(stuck_before_exec(child.as_raw() as u32));
    kill(child, Signal::SIGKILL).unwrap();
    waitpid(child, None).unwrap();
    let mut execd = Command::new("sleep").arg("30").spawn().expect("sleep runs");
    // Under qemu-user `spawn` can return before the child has exec'd (qemu runs the vfork of
    // posix_spawn as a plain fork, so the parent does not wait for the exec): wait until the
    // kernel shows `sleep`'s own command line, which is what proves the exec happened.
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read(format!("/proc/{}/cmdline", execd.id()))
        .map(|c| !c.starts_with(b"sleep\0"))
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "sleep never exec'd");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!stuck_before_exec(execd.id()));
    execd.kill().unwrap();
    execd.wait().unwrap();
}

/// Every directory under `root` (the bags of a recording root), sorted; none when it is
/// missing.
pub fn bag_dirs(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The state a crash leaves between retention's metadata rewrite and the removal of a
/// split: metadata.yaml of the bag in `dir` without its split number `index`, the file
/// still there. Returns what was unlisted.
pub fn unlist_split(dir: &Path, index: usize) -> ringbag::bag::metadata::FileInfo {
    let mut meta = ringbag::bag::metadata::BagMetadata::read(dir).unwrap();
    let gone = meta.files.remove(index);
    meta.relative_file_paths.retain(|p| *p != gone.path);
    meta.message_count -= gone.message_count;
    meta.starting_time_ns = meta.files[0].starting_time_ns;
    meta.write_atomic(dir, ringbag::bag::Flavour::Jazzy)
        .unwrap();
    assert!(dir.join(&gone.path).exists());
    gone
}

/// `promtool ARGS` with `stdin` fed to it: (success, its output), or None when promtool is not
/// installed (then the caller skips, saying so) — unless RINGBAG_PROMTOOL_REQUIRED is set, as
/// scripts/test.sh sets it where it installed Prometheus: then a missing promtool fails.
pub fn promtool(args: &[&str], stdin: &str) -> Option<(bool, String)> {
    use std::io::Write;
    let spawned = Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("RINGBAG_PROMTOOL_REQUIRED").is_none(),
                "promtool: {e}, and RINGBAG_PROMTOOL_REQUIRED is set"
            );
            eprintln!(
                "promtool not installed: `promtool {}` skipped",
                args.join(" ")
            );
            return None;
        }
    };
    // A promtool that exits without reading all of stdin is reported by its status below.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let o = child.wait_with_output().unwrap();
    Some((
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    ))
}

/// Asserts that the bag in `dir` is compressed in rosbag2's file mode throughout: only
/// `<name>_<N>.db3.zstd` splits on disk (no `.db3`, no `.partial`), listed in order in
/// `relative_file_paths`, the `.db3` names kept in `files[].path` as rosbag2 keeps them, and
/// `compression_format: zstd`, `compression_mode: FILE`. Returns the metadata.
pub fn assert_file_mode_compressed(dir: &Path, name: &str) -> ringbag::bag::metadata::BagMetadata {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "metadata.yaml")
        .collect();
    files.sort();
    assert!(
        files.iter().all(|n| n.ends_with(".db3.zstd")),
        "only .zstd splits (no .db3, no .partial): {files:?}"
    );
    let m = ringbag::bag::metadata::BagMetadata::read(dir).unwrap();
    assert_eq!(
        (m.compression_format.as_str(), m.compression_mode.as_str()),
        ("zstd", "FILE")
    );
    assert_eq!(
        m.relative_file_paths,
        (0..files.len())
            .map(|i| format!("{name}_{i}.db3.zstd"))
            .collect::<Vec<_>>()
    );
    assert!(
        m.files.iter().all(|f| f.path.ends_with(".db3")),
        "{:?}",
        m.files
    );
    m
}

/// Runs `ringbag daemon` on the synthetic `small` profile at max rate for `messages`
/// messages, with 256 KiB splits and `compression_mode = "<mode>"`, `compression_format =
/// "zstd"` (the service's spelling of record's flags); asserts a clean exit and returns its
/// one bag directory.
pub fn daemon_bag_compressed(mode: &str, messages: u64) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let config = tmp.path().join("ringbag.toml");
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
             synthetic_profile = \"small\"\nsynthetic_rate = \"max\"\n\
             synthetic_count = {messages}\nclock = \"system\"\nmax_bag_size = \"256KiB\"\n\
             compression_mode = \"{mode}\"\ncompression_format = \"zstd\"\n{}",
            root.display(),
            status.display(),
            control_socket_key(&status)
        ),
    )
    .unwrap();
    let child = daemon_command(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .unwrap();
    let out = wait_deadline(child, 60).expect("the daemon ends after synthetic_count");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let bags = bag_dirs(&root);
    assert_eq!(bags.len(), 1, "{bags:?}");
    let bag = bags[0].clone();
    (tmp, bag)
}
