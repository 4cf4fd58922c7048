//! The daemon's uploader (issue 24) against a real Garage: `ringbag daemon` with an `[upload]`
//! table records the synthetic robot mix and sends every closed split, then metadata.yaml; the
//! tests read everything back with an independent client and watch the status file. A hostile
//! TCP proxy ([`NetProxy`]) stands between the daemon and Garage where the network matters.
//!
//! The robot mix is throttled with `topic_rate` (cameras at 0.5 Hz, the cloud at 1 Hz: about
//! 4 MB/s) and split every MiB, so that splits close every second or so and each test runs in
//! seconds. Every wait polls a condition with a deadline; `RINGBAG_STRESS_PERCENT` scales the
//! observation windows (as in bounds.rs).

use crate::common::SpawnExecd;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ringbag::bag::metadata::BagMetadata;
use ringbag::upload::client::S3Client;
use serde_json::Value;

use crate::common::{daemon_command, status_json, wait_for, without_credentials};
use crate::garage::Garage;
use crate::netproxy::{Mode, NetProxy};

const ROBOT: &str = "r1";
/// The unit's stop timeout is longer; a daemon must stop well within this.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// Generous: a CI machine with 2 cores may be busy with something else.
const LONG: Duration = Duration::from_secs(90);

/// `secs` scaled by `RINGBAG_STRESS_PERCENT` (at least 1 s).
fn scaled(secs: u64) -> Duration {
    Duration::from_secs((secs * crate::common::stress_percent() / 100).max(1))
}

/// A test's files: the recording root, the status file, the config, the credentials file and
/// the daemon's stderr.
struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    status: PathBuf,
    cfg: PathBuf,
    creds: PathBuf,
    log: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().expect("tmp");
        let p = tmp.path().to_path_buf();
        Setup {
            root: p.join("root"),
            status: p.join("status.json"),
            cfg: p.join("ringbag.toml"),
            creds: p.join("s3.credentials"),
            log: p.join("stderr"),
            _tmp: tmp,
        }
    }

    /// A setup whose credentials file holds `g`'s key.
    fn with_creds_of(g: &Garage) -> Setup {
        let s = Setup::new();
        s.write_creds(&g.key_id, &g.secret);
        s
    }

    fn write_creds(&self, key_id: &str, secret: &str) {
        std::fs::write(
            &self.creds,
            format!("aws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n"),
        )
        .expect("write credentials");
        std::fs::set_permissions(&self.creds, std::fs::Permissions::from_mode(0o600))
            .expect("chmod credentials");
    }

    /// The robot mix into `root` with 1 MiB splits under `budget`, uploading to `endpoint`
    /// and `bucket`; `upload_extra` adds `[upload]` keys.
    fn write_config(&self, budget: &str, endpoint: &str, bucket: &str, upload_extra: &str) {
        let text = format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\n{}source = \"synthetic\"\n\
             synthetic_profile = \"robot\"\nclock = \"system\"\nmax_bag_size = \"1MiB\"\n\
             max_record_size = \"{budget}\"\n\
             topic_rate = [\"/camera/front/image_raw=0.5\", \"/camera/rear/image_raw=0.5\", \
             \"/points=1\"]\n\
             [upload]\nendpoint = \"{endpoint}\"\nbucket = \"{bucket}\"\nregion = \"garage\"\n\
             path_style = true\nrobot_id = \"{ROBOT}\"\ncredentials_file = \"{}\"\n{upload_extra}",
            self.root.display(),
            self.status.display(),
            crate::common::control_socket_key(&self.status),
            self.creds.display()
        );
        std::fs::write(&self.cfg, text).expect("write config");
    }

    fn status(&self) -> Option<Value> {
        status_json(&self.status)
    }

    fn upload_status(&self) -> Option<Value> {
        self.status()
            .map(|s| s["upload"].clone())
            .filter(|u| u.is_object())
    }

    fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn start(&self) -> Daemon {
        let mut c = daemon_command(&self.cfg);
        without_credentials(&mut c)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.log)
                    .expect("log file"),
            );
        Daemon {
            child: Some(c.spawn_execd().expect("daemon starts")),
        }
    }

    /// Every bag directory under the root, sorted.
    fn bags(&self) -> Vec<PathBuf> {
        crate::common::bag_dirs(&self.root)
    }

    /// The closed splits of every bag: those its metadata.yaml lists that exist.
    fn closed_splits(&self) -> Vec<PathBuf> {
        self.bags().iter().flat_map(|b| listed_splits(b)).collect()
    }

    /// Bytes of every file under the root.
    fn root_bytes(&self) -> u64 {
        fn walk(d: &Path) -> u64 {
            std::fs::read_dir(d)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| match e.metadata() {
                            Ok(m) if m.is_dir() => walk(&e.path()),
                            Ok(m) => m.len(),
                            Err(_) => 0,
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(&self.root)
    }
}

/// The splits `bag`'s metadata.yaml lists that exist on disk.
fn listed_splits(bag: &Path) -> Vec<PathBuf> {
    BagMetadata::read(bag)
        .map(|m| {
            m.files
                .iter()
                .map(|f| bag.join(&f.path))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default()
}

/// A hostile-network proxy in front of `g` (passing everything until told otherwise).
fn proxy_to(g: &Garage) -> NetProxy {
    NetProxy::start(
        g.endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("Garage's address"),
    )
}

/// `ringbag/<robot>/<bag>/<file>` of a file under the root.
fn key_of(file: &Path) -> String {
    let bag = file.parent().and_then(Path::file_name).expect("bag name");
    let name = file.file_name().expect("file name");
    format!(
        "ringbag/{ROBOT}/{}/{}",
        bag.to_string_lossy(),
        name.to_string_lossy()
    )
}

/// Whether the object for `file` holds exactly its bytes (stronger than equal SHA-256s).
fn in_bucket_identical(client: &S3Client, file: &Path) -> bool {
    let Ok(local) = std::fs::read(file) else {
        return false;
    };
    matches!(client.get(&key_of(file)), Ok(remote) if remote == local)
}

/// A running daemon; killed on drop if a test fails before stopping it.
struct Daemon {
    child: Option<Child>,
}

impl Daemon {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    fn signal(&self, s: Signal) {
        kill(self.pid(), s).expect("signal the daemon");
    }

    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM; the exit code, or a failure if it takes longer than [`STOP_LIMIT`].
    fn stop(&mut self) -> i32 {
        self.signal(Signal::SIGTERM);
        let t = Instant::now();
        let mut child = self.child.take().expect("running");
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st.code().unwrap_or(-1);
            }
            if t.elapsed() > STOP_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon did not stop within {STOP_LIMIT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn u64_at(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_u64()
        .unwrap_or_default()
}

/// Messages lost while recording (queue full, oversize), summed over the topics of a status.
/// A message that arrives after SIGTERM is counted as `dropped_after_stop` by design (the
/// recorder had stopped taking them), so a check made after a stop leaves those out.
fn lost_while_recording(st: &Value) -> u64 {
    st["topics"].as_array().map_or(0, |topics| {
        topics
            .iter()
            .map(|t| u64_at(t, &["dropped_queue_full"]) + u64_at(t, &["dropped_oversize"]))
            .sum()
    })
}

/// The uploader never reads a split the writer still has open (a bag's first split is
/// listed in metadata.yaml while open): such a read shows up as this warning.
fn assert_no_open_split_read(s: &Setup) {
    let log = s.logged();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(".db3") && l.contains("changed while it was being uploaded"))
        .collect();
    assert!(bad.is_empty(), "an open split was uploaded: {bad:#?}");
}

/// Poll until at least `n` closed splits exist.
fn wait_splits(s: &Setup, n: usize) {
    assert!(
        wait_for(LONG, || s.closed_splits().len() >= n),
        "fewer than {n} closed splits: {}",
        s.logged()
    );
}

/// Poll until every one of `files` is identical in the bucket. A file verified once is not
/// read back again (the polling must not load Garage more than the daemon does).
fn wait_in_bucket(client: &S3Client, files: &[PathBuf], limit: Duration) -> bool {
    let mut verified = std::collections::HashSet::new();
    let deadline = Instant::now() + limit;
    loop {
        for f in files {
            if !verified.contains(f) {
                if !in_bucket_identical(client, f) {
                    break;
                }
                verified.insert(f.clone());
            }
        }
        if verified.len() == files.len() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Poll until every split closed by now is identical in the bucket (splits closed later
/// are not waited for: the recording goes on).
fn wait_closed_in_bucket(s: &Setup, client: &S3Client, limit: Duration) -> bool {
    let files = s.closed_splits();
    assert!(!files.is_empty(), "no closed split: {}", s.logged());
    wait_in_bucket(client, &files, limit)
}

/// The message count `ringbag info --json` gives for `bag` (exit 0 asserted).
fn info_messages(bag: &Path) -> u64 {
    let o = crate::common::run(&["info", "--json", &bag.display().to_string()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "ringbag info {}: {}",
        bag.display(),
        crate::common::stderr(&o)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
    v["message_count"]
        .as_u64()
        .or_else(|| v["messages"].as_u64())
        .unwrap_or_else(|| panic!("no message count in {v}"))
}

#[test]
fn every_closed_split_and_the_final_metadata_reach_the_bucket_identical_and_the_bag_opens() {
    let Some(g) = Garage::start("upload_daemon end to end") else {
        return;
    };
    let s = Setup::with_creds_of(&g);
    s.write_config("256MiB", &g.endpoint, &g.bucket, "");
    let client = g.client();
    // A first daemon records a bag and is stopped: its last split is closed by the stop, so
    // a second daemon (the same config, as after a reboot) must send it and the final
    // metadata.yaml while it records a bag of its own.
    let mut d = s.start();
    wait_splits(&s, 4);
    // Uploads keep up while recording: the backlog empties at some point.
    assert!(
        wait_for(LONG, || s.upload_status().is_some_and(|u| u64_at(
            &u,
            &["files_uploaded"]
        ) >= 2
            && u64_at(&u, &["backlog_files"]) == 0)),
        "{:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
    let first = s.bags();
    assert_eq!(first.len(), 1, "{first:?}");
    let first = first[0].clone();
    let final_meta = std::fs::read(first.join("metadata.yaml")).expect("final metadata.yaml");
    let splits = listed_splits(&first);
    assert!(splits.len() >= 4, "{splits:?}");

    let mut d = s.start();
    let meta_key = key_of(&first.join("metadata.yaml"));
    assert!(wait_in_bucket(&client, &splits, LONG), "{}", s.logged());
    let complete = wait_for(LONG, || {
        client.get(&meta_key).is_ok_and(|m| m == final_meta)
    });
    assert!(complete, "{}", s.logged());
    // And the second bag's closed splits, while it records.
    assert!(
        wait_closed_in_bucket(&s, &client, LONG),
        "{:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
    let st = s.status().expect("status");
    assert!(
        st["topics"].as_array().is_some_and(|t| !t.is_empty()),
        "{st}"
    );
    assert_eq!(lost_while_recording(&st), 0, "{st}");
    assert_eq!(u64_at(&st, &["deleted_before_upload", "files"]), 0, "{st}");
    assert_no_open_split_read(&s);

    // The first bag as the bucket has it opens and holds every message.
    let down = tempfile::tempdir().expect("tmp");
    let bag = down.path().join(first.file_name().expect("bag name"));
    std::fs::create_dir(&bag).expect("mkdir");
    for f in splits.iter().chain([&first.join("metadata.yaml")]) {
        let body = client.get(&key_of(f)).expect("GET");
        std::fs::write(bag.join(f.file_name().expect("name")), body).expect("write");
    }
    let want = info_messages(&first);
    assert!(want > 0);
    assert_eq!(info_messages(&bag), want);
}

#[test]
fn retention_deletes_what_is_not_out_only_when_forced_and_counts_it() {
    let Some(g) = Garage::start("upload_daemon retention") else {
        return;
    };
    let proxy = proxy_to(&g);
    let s = Setup::with_creds_of(&g);
    let budget: u64 = 16 << 20;
    s.write_config("16MiB", &proxy.url(), &g.bucket, "");
    let mut d = s.start();
    let mut max_root = 0u64;
    let mut sample = |s: &Setup| {
        let b = s.root_bytes();
        max_root = max_root.max(b);
        b
    };
    // Online: the budget turns over several times, and only uploaded files go.
    let online_until = Instant::now() + scaled(12);
    while Instant::now() < online_until {
        sample(&s);
        if let Some(st) = s.status() {
            assert_eq!(
                u64_at(&st, &["deleted_before_upload", "files"]),
                0,
                "deleted before upload while the bucket was reachable: {st}\n{}",
                s.logged()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        s.upload_status()
            .is_some_and(|u| u64_at(&u, &["files_uploaded"]) >= 4),
        "{:?}",
        s.upload_status()
    );
    // Offline: the budget forces deletions of files that never got out.
    proxy.set_mode(Mode::Refuse);
    let forced = wait_for(LONG, || {
        sample(&s);
        s.status()
            .is_some_and(|st| u64_at(&st, &["deleted_before_upload", "files"]) > 0)
    });
    assert!(forced, "{:?}\n{}", s.status(), s.logged());
    let st = s.status().expect("status");
    assert!(u64_at(&st, &["deleted_before_upload", "bytes"]) > 0, "{st}");
    // The bag's journal names them (the agent writes it at its next turn).
    let bag = PathBuf::from(st["bag"].as_str().expect("bag"));
    let journaled = wait_for(LONG, || {
        sample(&s);
        std::fs::read(bag.join(".ringbag-upload.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|j| j["deleted_before_upload"].as_array().map(|a| a.len()))
            .is_some_and(|n| n > 0)
    });
    assert!(journaled, "{}", s.logged());
    let journal: Value =
        serde_json::from_slice(&std::fs::read(bag.join(".ringbag-upload.json")).expect("journal"))
            .expect("journal JSON");
    for e in journal["deleted_before_upload"].as_array().expect("array") {
        let name = e["file"].as_str().expect("file");
        assert!(name.ends_with(".db3"), "{e}");
        assert!(e["bytes"].as_u64().unwrap_or(0) > 0, "{e}");
        assert!(!bag.join(name).exists(), "{name} is listed as deleted");
    }
    assert_eq!(d.stop(), 0, "{}", s.logged());
    sample(&s);
    // A split may grow past its nominal size by one message (a 2.76 MB camera frame).
    assert!(
        max_root <= budget + (3 << 20),
        "the root held {max_root} bytes under a {budget}-byte budget"
    );
    eprintln!("retention: the root peaked at {max_root} bytes (budget {budget})");
}

#[test]
fn after_an_offline_period_the_backlog_drains_at_max_rate() {
    let Some(g) = Garage::start("upload_daemon drain") else {
        return;
    };
    let proxy = proxy_to(&g);
    proxy.set_mode(Mode::Refuse);
    let s = Setup::with_creds_of(&g);
    let max_rate: f64 = (2u64 << 20) as f64;
    s.write_config("512MiB", &proxy.url(), &g.bucket, "max_rate = \"2MiB\"\n");
    let mut d = s.start();
    // Offline: the backlog builds, with its age.
    let built = wait_for(LONG, || {
        s.upload_status().is_some_and(|u| {
            u64_at(&u, &["backlog_files"]) >= 8
                && u64_at(&u, &["backlog_bytes"]) > 16 << 20
                && u["oldest_backlog_age_s"].as_f64().is_some_and(|a| a > 0.0)
                && u["last_error"].is_string()
        })
    });
    assert!(built, "{:?}\n{}", s.upload_status(), s.logged());
    assert_eq!(
        s.upload_status().map(|u| u64_at(&u, &["bytes_sent"])),
        Some(0)
    );
    proxy.set_mode(Mode::Pass);
    // From the first status showing bytes sent (past the bucket's initial burst), over at
    // least 5 s of the status's own clock.
    let sent = |u: &Value| u64_at(u, &["bytes_sent"]);
    let mut first: Option<(u64, u64)> = None;
    let window_ms = scaled(6).as_millis() as u64;
    let mut figure = None;
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        if let Some(st) = s.status() {
            let (t, b) = (u64_at(&st, &["updated_unix_ms"]), sent(&st["upload"]));
            assert!(
                u64_at(&st, &["upload", "backlog_files"]) > 0 || b == 0,
                "the backlog emptied before the window closed: {st}"
            );
            match first {
                None if b > 0 => first = Some((t, b)),
                Some((t0, b0)) if t >= t0 + window_ms => {
                    figure = Some((b - b0) as f64 * 1000.0 / (t - t0) as f64);
                    break;
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let rate = figure.unwrap_or_else(|| panic!("no drain measured: {}", s.logged()));
    eprintln!(
        "drain: {:.0} B/s against max_rate {max_rate:.0} B/s ({:+.1} %)",
        rate,
        (rate / max_rate - 1.0) * 100.0
    );
    assert!(
        (rate - max_rate).abs() <= max_rate * 0.10,
        "drained at {rate:.0} B/s, max_rate {max_rate:.0}"
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
}

#[test]
fn a_hostile_network_never_hangs_the_daemon_nor_drops_a_message_and_everything_gets_out() {
    let Some(g) = Garage::start("upload_daemon hostile") else {
        return;
    };
    let proxy = proxy_to(&g);
    let s = Setup::with_creds_of(&g);
    s.write_config("512MiB", &proxy.url(), &g.bucket, "");
    let mut d = s.start();
    wait_splits(&s, 1);
    let modes = [
        Mode::Stall,
        Mode::Reset,
        Mode::ResetAfter(200_000),
        Mode::Delay(Duration::from_millis(300)),
        Mode::Stall,
        Mode::ResetAfter(50_000),
    ];
    let mut last_update = 0u64;
    let mut stale_for = Duration::ZERO;
    for m in modes {
        proxy.set_mode(m);
        let until = Instant::now() + scaled(2);
        while Instant::now() < until {
            // The status is rewritten every second whatever the uploader is stuck in.
            if let Some(st) = s.status() {
                let u = u64_at(&st, &["updated_unix_ms"]);
                assert!(u >= last_update);
                last_update = u;
                stale_for = Duration::from_millis(
                    (crate::common::now_ns() as u64 / 1_000_000).saturating_sub(last_update),
                );
                assert!(
                    stale_for < Duration::from_secs(5),
                    "the status has not been updated for {stale_for:?} under {m:?}"
                );
                assert_eq!(u64_at(&st, &["dropped"]), 0, "{st}");
            }
            assert!(d.running(), "the daemon exited: {}", s.logged());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    eprintln!(
        "hostile: {:?}; status last {stale_for:?} old",
        proxy.counters()
    );
    proxy.set_mode(Mode::Pass);
    let client = g.client();
    assert!(
        wait_closed_in_bucket(&s, &client, LONG),
        "{:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    // A stop in the middle of a stalled transfer is prompt too.
    proxy.set_mode(Mode::Stall);
    wait_splits(&s, s.closed_splits().len() + 1);
    assert_eq!(d.stop(), 0, "{}", s.logged());
    let st = s.status().expect("status");
    assert!(
        st["topics"].as_array().is_some_and(|t| !t.is_empty()),
        "{st}"
    );
    assert_eq!(lost_while_recording(&st), 0, "{st}");
    assert!(u64_at(&st, &["committed"]) > 0, "{st}");
}

#[test]
fn garage_killed_mid_upload_and_back_10_s_later_gets_every_split_and_no_open_upload() {
    let Some(mut g) = Garage::start("upload_daemon garage kill") else {
        return;
    };
    let s = Setup::with_creds_of(&g);
    // Splits of 12 MiB in 5 MiB parts at 2 MiB/s: a multipart upload takes seconds, so the
    // kill lands in the middle of one.
    s.write_config(
        "512MiB",
        &g.endpoint,
        &g.bucket,
        "part_size = \"5MiB\"\nmax_rate = \"2MiB\"\n",
    );
    let text = std::fs::read_to_string(&s.cfg)
        .expect("config")
        .replace("max_bag_size = \"1MiB\"", "max_bag_size = \"6MiB\"")
        .replace(
            "topic_rate = [\"/camera/front/image_raw=0.5\", \"/camera/rear/image_raw=0.5\", \
             \"/points=1\"]",
            "exclude_topics = [\"/camera/front/image_raw\", \"/camera/rear/image_raw\"]\n\
             topic_rate = [\"/points=1\"]",
        );
    assert!(text.contains("exclude_topics"), "{text}");
    std::fs::write(&s.cfg, text).expect("config");
    let client = g.client();
    let mut d = s.start();
    let mid = wait_for(LONG, || {
        s.upload_status()
            .is_some_and(|u| u64_at(&u, &["bytes_sent"]) > 0)
            && client.list_uploads("ringbag/").is_ok_and(|l| !l.is_empty())
    });
    assert!(mid, "{:?}\n{}", s.upload_status(), s.logged());
    g.kill9();
    let down_at = Instant::now();
    // Garage is down: the daemon records on and its status says why nothing goes.
    assert!(
        wait_for(scaled(10), || s
            .upload_status()
            .is_some_and(|u| u["last_error"].is_string())),
        "{:?}",
        s.upload_status()
    );
    let rest = Duration::from_secs(10).saturating_sub(down_at.elapsed());
    assert!(!wait_for(rest, || !d.running()), "{}", s.logged());
    g.launch();
    // Backoff after ~10 s of failures is a few seconds; a closed split also wakes the agent.
    assert!(
        wait_closed_in_bucket(&s, &client, LONG),
        "{:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
    // The last split (closed by the stop) is not sent by this daemon; whatever it had open
    // for it is ours to abort in the next run's sweep, so only count uploads of the splits
    // the bucket has.
    let open: Vec<String> = client
        .list_uploads("ringbag/")
        .expect("list uploads")
        .into_iter()
        .map(|u| u.key)
        .filter(|k| {
            s.closed_splits()
                .iter()
                .any(|f| key_of(f) == *k && in_bucket_identical(&client, f))
        })
        .collect();
    assert!(open.is_empty(), "multipart uploads left open: {open:?}");
    assert_no_open_split_read(&s);
    let multipart: BTreeMap<String, u64> = s
        .closed_splits()
        .iter()
        .filter(|f| std::fs::metadata(f).map_or(0, |m| m.len()) > 5 << 20)
        .map(|f| (key_of(f), std::fs::metadata(f).map_or(0, |m| m.len())))
        .collect();
    assert!(!multipart.is_empty(), "no split went multipart");
}

/// Writes one broken configuration.
type Configure<'a> = Box<dyn Fn() + 'a>;

/// Lines of the daemon's log that are about uploads and are warnings or errors.
fn upload_complaints(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| (l.contains(": error: ") || l.contains(": warn: ")) && l.contains("upload"))
        .map(str::to_string)
        .collect()
}

#[test]
fn configuration_errors_are_named_once_recording_goes_on_and_a_sighup_with_the_fix_recovers() {
    // A skewed clock (RequestTimeTooSkewed) cannot be faked for the daemon's process here;
    // the engine's unit tests cover its classification as a configuration error.
    let Some(g) = Garage::start("upload_daemon config errors") else {
        return;
    };
    let s = Setup::new();
    let client = g.client();
    // An endpoint nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = l.local_addr().expect("addr");
        drop(l);
        format!("http://{a}")
    };
    let cases: [(&str, Configure, &str); 3] = [
        (
            "wrong secret",
            Box::new(|| {
                s.write_creds(&g.key_id, "not-the-secret-0123456789");
                s.write_config("512MiB", &g.endpoint, &g.bucket, "");
            }),
            "credentials refused (403",
        ),
        (
            "missing bucket",
            Box::new(|| {
                s.write_creds(&g.key_id, &g.secret);
                s.write_config("512MiB", &g.endpoint, "no-such-bucket", "");
            }),
            "bucket no-such-bucket does not exist",
        ),
        (
            "unreachable endpoint",
            Box::new(|| {
                s.write_creds(&g.key_id, &g.secret);
                s.write_config("512MiB", &dead, &g.bucket, "");
            }),
            "connection refused",
        ),
    ];
    let mut d: Option<Daemon> = None;
    for (what, configure, names) in &cases {
        configure();
        let log_before = s.logged().len();
        let splits_before = s.closed_splits().len();
        match &d {
            None => d = Some(s.start()),
            Some(d) => d.signal(Signal::SIGHUP),
        }
        let said = || upload_complaints(&s.logged()[log_before..]);
        assert!(
            wait_for(scaled(15), || !said().is_empty()),
            "{what}: nothing logged: {}",
            s.logged()
        );
        // Watch for ~10 s: recording goes on, the status names the problem, the log does not
        // flood and the process stays.
        let until = Instant::now() + scaled(10);
        while Instant::now() < until {
            assert!(
                d.as_mut().expect("daemon").running(),
                "{what}: {}",
                s.logged()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let lines = said();
        assert_eq!(lines.len(), 1, "{what}: {lines:#?}");
        assert!(lines[0].contains(names), "{what}: {}", lines[0]);
        let err = s
            .upload_status()
            .and_then(|u| u["last_error"].as_str().map(str::to_string))
            .unwrap_or_default();
        assert!(err.contains(names), "{what}: last_error {err:?}");
        assert!(
            s.closed_splits().len() >= splits_before + 3,
            "{what}: recording stalled"
        );
        assert_eq!(
            u64_at(&s.upload_status().expect("upload"), &["files_uploaded"]),
            0,
            "{what}"
        );
        eprintln!("{what}: {}", lines[0]);
    }
    // Fixed, and reloaded: uploads happen.
    s.write_creds(&g.key_id, &g.secret);
    s.write_config("512MiB", &g.endpoint, &g.bucket, "");
    let mut d = d.expect("daemon");
    d.signal(Signal::SIGHUP);
    assert!(
        wait_for(LONG, || s
            .closed_splits()
            .iter()
            .take(3)
            .all(|f| in_bucket_identical(&client, f))),
        "{:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
}

#[test]
fn delete_after_upload_removes_verified_splits_and_keeps_every_bag_true() {
    let Some(g) = Garage::start("upload_daemon delete after upload") else {
        return;
    };
    let s = Setup::with_creds_of(&g);
    s.write_config(
        "512MiB",
        &g.endpoint,
        &g.bucket,
        "delete_after_upload = true\n",
    );
    let client = g.client();
    let mut d = s.start();
    // Splits go once verified: the root holds few even though many were recorded.
    let gone = wait_for(LONG, || {
        s.status()
            .is_some_and(|st| u64_at(&st, &["splits_created"]) >= 8)
            && s.upload_status()
                .is_some_and(|u| u64_at(&u, &["files_uploaded"]) >= 6)
    });
    assert!(gone, "{:?}\n{}", s.status(), s.logged());
    assert_eq!(d.stop(), 0, "{}", s.logged());
    let st = s.status().expect("status");
    assert_eq!(u64_at(&st, &["deleted_before_upload", "files"]), 0, "{st}");
    assert_no_open_split_read(&s);
    let bag = s.bags().pop().expect("a bag");
    let name = bag
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    // Every split the bag had: those gone from disk are in the bucket; metadata.yaml lists
    // only those left, and they open.
    let meta = BagMetadata::read(&bag).expect("metadata.yaml");
    let listed: Vec<String> = meta.files.iter().map(|f| f.path.clone()).collect();
    let mut deleted = 0;
    for i in 0..u64_at(&st, &["splits_created"]) {
        let f = bag.join(format!("{name}_{i}.db3"));
        if f.exists() {
            assert!(
                listed.contains(&format!("{name}_{i}.db3")),
                "{f:?} not listed"
            );
        } else {
            deleted += 1;
            assert!(
                !listed.contains(&format!("{name}_{i}.db3")),
                "{f:?} deleted but listed"
            );
            assert!(
                client.head(&key_of(&f)).is_ok_and(|h| h.is_some()),
                "{f:?} deleted but not in the bucket"
            );
        }
    }
    assert!(deleted >= 4, "only {deleted} splits were deleted");
    let remaining = info_messages(&bag);
    assert!(remaining > 0 || listed.is_empty());
    eprintln!("delete_after_upload: {deleted} splits deleted, {remaining} messages remain");
}

/// A multipart upload journaled in flight with parts done: (split path, upload id, parts).
fn in_flight_with_parts(s: &Setup) -> Option<(PathBuf, String, usize)> {
    s.bags().into_iter().find_map(|bag| {
        let j = ringbag::upload::journal::Journal::load(&bag).ok()?.journal;
        j.files.into_iter().find_map(|(name, e)| {
            let id = e.upload_id.filter(|_| !e.done && !e.parts.is_empty())?;
            Some((bag.join(name), id, e.parts.len()))
        })
    })
}

/// A setup uploading to `g` splits of 12 MiB in 5 MiB parts at 2 MiB/s, `concurrency` parts
/// at a time: a split takes seconds to send.
fn slow_multipart_setup(g: &Garage, concurrency: u32) -> Setup {
    let s = Setup::with_creds_of(g);
    s.write_config(
        "512MiB",
        &g.endpoint,
        &g.bucket,
        &format!("part_size = \"5MiB\"\nmax_rate = \"2MiB\"\nconcurrency = {concurrency}\n"),
    );
    let text = std::fs::read_to_string(&s.cfg)
        .expect("config")
        .replace("max_bag_size = \"1MiB\"", "max_bag_size = \"12MiB\"");
    std::fs::write(&s.cfg, text).expect("config");
    s
}

#[test]
fn kill_9_of_the_daemon_mid_multipart_resumes_the_same_upload_without_sending_done_parts_again() {
    let Some(g) = Garage::start("upload_daemon kill -9 of ringbag") else {
        return;
    };
    // The kill lands inside a multipart upload with a part or two done.
    let s = slow_multipart_setup(&g, 1);
    let client = g.client();
    let mut d = s.start();
    let mut found = None;
    assert!(
        wait_for(LONG, || {
            found = in_flight_with_parts(&s);
            found.is_some()
        }),
        "no multipart upload with a part done: {:?}\n{}",
        s.upload_status(),
        s.logged()
    );
    kill(d.pid(), Signal::SIGKILL).expect("kill -9");
    drop(d.child.take().map(|mut c| c.wait()));
    // What the journal holds after the kill (it may have saved one more part meanwhile).
    let (file, upload_id, _) = found.expect("in flight");
    let bag = file.parent().expect("bag").to_path_buf();
    let name = file
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let entry = ringbag::upload::journal::Journal::load(&bag)
        .expect("journal")
        .journal
        .files
        .get(&name)
        .cloned()
        .expect("the split is journaled");
    assert_eq!(entry.upload_id.as_deref(), Some(upload_id.as_str()));
    let parts_done = entry.parts.len() as u64;
    assert!(parts_done >= 1 && !entry.done, "{entry:?}");
    let size = std::fs::metadata(&file).expect("split").len();

    let mut d = s.start();
    assert!(
        wait_in_bucket(&client, std::slice::from_ref(&file), LONG),
        "{} never reached the bucket after the restart: {:?}\n{}",
        file.display(),
        s.upload_status(),
        s.logged()
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
    // The same upload id completed it.
    let after = ringbag::upload::journal::Journal::load(&bag)
        .expect("journal")
        .journal;
    let e = &after.files[&name];
    assert!(e.done, "{e:?}");
    assert_eq!(e.upload_id.as_deref(), Some(upload_id.as_str()), "{e:?}");
    // And only the parts not done were sent: the restarted daemon's line for the split.
    let line = s
        .logged()
        .lines()
        .find(|l| l.contains(&format!("upload: {} (", file.display())))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no upload line for {}: {}", file.display(), s.logged()));
    let sent: u64 = line
        .split(" (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line}"));
    assert!(
        sent <= size - parts_done * (5 << 20),
        "{line}: {parts_done} parts of 5 MiB were done before the kill, the split is {size} bytes"
    );
    assert!(line.contains("resumed"), "{line}");
    eprintln!("after kill -9 with {parts_done} parts journaled: {line}");
}

/// (name, nice, I/O priority class) of every thread of process `pid`.
fn thread_priorities(pid: i32) -> Vec<(String, i64, i64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid: i64 = t.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // Fields after the name: state is field 3, nice field 19.
            let nice = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()?;
            const IOPRIO_WHO_PROCESS: libc::c_long = 1;
            // SAFETY: ioprio_get takes two integers and only reads the priority of the
            // thread named; a thread gone meanwhile is an error return.
            let prio = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
            (prio >= 0).then(|| (name.trim().to_string(), nice, prio >> 13))
        })
        .collect()
}

#[test]
fn the_uploader_and_its_senders_run_at_nice_19_in_the_idle_io_class_and_the_writer_does_not() {
    let Some(g) = Garage::start("upload_daemon thread priorities") else {
        return;
    };
    // The senders live for seconds per split.
    let s = slow_multipart_setup(&g, 2);
    let mut d = s.start();
    let pid = d.pid().as_raw();
    let mut seen = Vec::new();
    assert!(
        wait_for(LONG, || {
            seen = thread_priorities(pid);
            seen.iter().any(|t| t.0 == "ringbag-upsend")
        }),
        "no part sender while uploading: {seen:?}\n{}",
        s.logged()
    );
    const IDLE: i64 = 3;
    let uploaders: Vec<_> = seen
        .iter()
        .filter(|t| t.0.starts_with("ringbag-up"))
        .collect();
    assert!(
        uploaders.iter().any(|t| t.0 == "ringbag-upload"),
        "{seen:?}"
    );
    for t in &uploaders {
        assert_eq!((t.1, t.2), (19, IDLE), "{t:?} among {seen:?}");
    }
    // The recorder keeps the priority it was started with (this test's own).
    // SAFETY: getpriority with a valid `which` and 0 (this process) only reads.
    let ours = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) } as i64;
    let writer = seen
        .iter()
        .find(|t| t.0 == "ringbag-writer")
        .unwrap_or_else(|| panic!("no writer thread: {seen:?}"));
    assert!(
        writer.1 == ours && writer.2 != IDLE,
        "{writer:?} (ours {ours})"
    );
    assert_eq!(d.stop(), 0, "{}", s.logged());
}
