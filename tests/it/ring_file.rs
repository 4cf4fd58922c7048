//! The snapshot ring's file: only a ring of ours is ever opened, recovered or replaced. A
//! symbolic link, a directory, a special file, another user's ring, one others may read, or
//! any other file at the ring's path is bad input (exit 2, one line) and stays as it was.

use crate::common::SpawnExecd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringbag::snapshot::ring::{Ring, RingTopic, RingWriter};

use crate::common::{run, stderr, topic};

/// `record` of 20 synthetic messages into `out` with a 4 MiB ring at `ring` (None: the
/// default place).
fn record_with_ring(out: &Path, ring: Option<&Path>, extra: &[&str]) -> std::process::Output {
    let out_s = out.to_string_lossy().into_owned();
    let ring_s = ring.map(|r| r.to_string_lossy().into_owned());
    let mut a = vec![
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "20",
        "--clock",
        "system",
        "--snapshot-size",
        "4MiB",
        "-o",
        &out_s,
    ];
    if let Some(r) = &ring_s {
        a.extend(["--snapshot-file", r.as_str()]);
    }
    a.extend(extra);
    run(&a)
}

/// Exit 2, exactly one line (`ringbag: error: ...` containing `needle`), no bag, and no
/// word about a replacement or a recovery that did not happen.
fn assert_refused(o: &std::process::Output, out: &Path, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("ringbag: error: "), "{e}");
    assert!(e.contains(needle), "wanted {needle:?}: {e}");
    assert!(!e.contains("replaces"), "{e}");
    assert!(!out.exists(), "nothing recorded: {e}");
}

/// An unclean ring (as a kill -9 leaves it) with 10 records, at `path`.
fn unclean_ring(path: &Path) {
    let r = Arc::new(Ring::create(path, 1 << 16, 0).unwrap());
    let mut w = RingWriter::new(r);
    let t = w
        .add_topic(RingTopic::new(&topic("/a", "std_msgs/msg/String"), None))
        .unwrap();
    for i in 0..10 {
        w.append(t, i, &[7u8; 100]).unwrap();
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_snapshot_file_that_is_not_a_ring_is_refused_and_left_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let precious = tmp.path().join("notes.txt");
    std::fs::write(&precious, b"someone's data, not a ring\n").unwrap();
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = tmp.path().join("root/bag");
    let o = record_with_ring(&out, Some(&precious), &[]);
    assert_refused(&o, &out, "is not a ringbag ring; not overwritten");
    assert_eq!(
        std::fs::read(&precious).unwrap(),
        b"someone's data, not a ring\n"
    );
}

#[test]
fn a_symbolic_link_at_the_ring_path_is_not_followed_and_its_target_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("shadow");
    std::fs::write(&target, b"root:x:0:0\n").unwrap();
    let link = tmp.path().join("ring");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = tmp.path().join("root/bag");
    let o = record_with_ring(&out, Some(&link), &[]);
    assert_refused(&o, &out, "a symbolic link");
    assert_eq!(std::fs::read(&target).unwrap(), b"root:x:0:0\n");
    // A dangling link: its target is not created either.
    let absent = tmp.path().join("absent");
    let dangling = tmp.path().join("ring2");
    std::os::unix::fs::symlink(&absent, &dangling).unwrap();
    let o = record_with_ring(&out, Some(&dangling), &[]);
    assert_refused(&o, &out, "a symbolic link");
    assert!(!absent.exists());
    // A link to a ring of ours is refused too: the link, not the ring, is at the path.
    let real = tmp.path().join("real.ring");
    unclean_ring(&real);
    let before = std::fs::read(&real).unwrap();
    let to_ring = tmp.path().join("ring3");
    std::os::unix::fs::symlink(&real, &to_ring).unwrap();
    let o = record_with_ring(&out, Some(&to_ring), &[]);
    assert_refused(&o, &out, "a symbolic link");
    assert_eq!(std::fs::read(&real).unwrap(), before);
}

#[test]
fn a_ring_of_another_user_is_neither_recovered_nor_reused_nor_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = tmp.path().join("planted.ring");
    unclean_ring(&ring);
    // As if `nobody` had made it: a complete, unclean ring that recovery would turn into a
    // crash bag in our root.
    std::os::unix::fs::chown(&ring, Some(65534), Some(65534)).unwrap();
    let before = std::fs::read(&ring).unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let out = root.join("bag");
    let o = record_with_ring(&out, Some(&ring), &[]);
    assert_refused(&o, &out, "owned by uid 65534");
    assert_eq!(entries(&root), Vec::<PathBuf>::new(), "no crash bag");
    assert_eq!(std::fs::read(&ring).unwrap(), before);
    assert_eq!(std::fs::symlink_metadata(&ring).unwrap().uid(), 65534);
}

#[test]
fn a_ring_others_may_change_or_that_has_two_links_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("root/bag");
    let ring = tmp.path().join("open.ring");
    unclean_ring(&ring);
    std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o664)).unwrap();
    let before = std::fs::read(&ring).unwrap();
    let o = record_with_ring(&out, Some(&ring), &[]);
    assert_refused(&o, &out, "mode 0664");
    assert_eq!(std::fs::read(&ring).unwrap(), before);
    // A hard link elsewhere (someone else's name for it) is refused as well.
    std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&ring, tmp.path().join("other-name")).unwrap();
    let o = record_with_ring(&out, Some(&ring), &[]);
    assert_refused(&o, &out, "2 hard links");
    assert_eq!(std::fs::read(&ring).unwrap(), before);
}

#[test]
fn a_ring_of_ours_an_earlier_version_left_readable_is_recovered_and_narrowed_to_0600() {
    // Earlier versions created the ring under the umask (0644 by record, 0640 by the
    // service). Nobody else could write it, so it is ours to recover; refusing it would leave
    // the service failed (exit 2 is not restarted) after an upgrade without a reboot.
    for mode in [0o644, 0o640] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("root/bag");
        let ring = tmp.path().join("old.ring");
        unclean_ring(&ring);
        std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(mode)).unwrap();
        let o = record_with_ring(&out, Some(&ring), &[]);
        let e = stderr(&o);
        assert!(o.status.success(), "{mode:o}: {e}");
        assert!(e.contains("narrowed to 0600"), "{mode:o}: {e}");
        let m = std::fs::symlink_metadata(&ring).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o600, "{mode:o}");
        let crash: Vec<_> = entries(&tmp.path().join("root"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("_crash_"))
            .collect();
        assert_eq!(crash.len(), 1, "{mode:o}: one crash bag: {e}");
    }
}

#[test]
fn a_directory_a_device_or_a_fifo_as_the_ring_is_bad_input_before_anything_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("root/bag");
    let dir = tmp.path().join("a-dir");
    std::fs::create_dir(&dir).unwrap();
    let fifo = tmp.path().join("a-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for (path, kind) in [
        (dir.as_path(), "a directory"),
        (Path::new("/dev/null"), "a character device"),
        (fifo.as_path(), "a FIFO"),
    ] {
        let o = record_with_ring(&out, Some(path), &[]);
        assert_refused(&o, &out, &format!("{}: {kind}", path.display()));
        assert!(!tmp.path().join("root").exists(), "{kind}: no root created");
    }
    assert!(entries(&dir).is_empty());
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn the_ring_is_created_0600_whatever_the_umask_and_reused_by_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = tmp.path().join("ring");
    // The test process's umask (022 under cargo) would make a plain create 0644.
    let o = record_with_ring(&tmp.path().join("root/a"), Some(&ring), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = std::fs::symlink_metadata(&ring).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
    // Ours, so the next run into another bag uses it again.
    let o = record_with_ring(&tmp.path().join("root/b"), Some(&ring), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // An empty file of ours (a ring whose creation was cut short) is taken over too.
    let empty = tmp.path().join("empty.ring");
    std::fs::File::create(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = record_with_ring(&tmp.path().join("root/c"), Some(&empty), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 4 << 20);
}

#[test]
fn the_default_ring_lives_in_a_0700_directory_of_the_user_in_dev_shm() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let dir = ringbag::snapshot::default_ring_dir();
    assert_eq!(
        dir,
        Path::new("/dev/shm").join(format!("ringbag-{}", nix::unistd::geteuid().as_raw()))
    );
    let settings = ringbag::snapshot::RingSettings {
        size: 4 << 20,
        window_ns: 0,
        file: None,
        dir: dir.clone(),
        trigger_topic: None,
    };
    std::fs::create_dir_all(&root).unwrap();
    let ring = settings.ring_file(&root);
    assert_eq!(ring.parent(), Some(dir.as_path()));
    let o = record_with_ring(&root.join("bag"), None, &[]);
    // Clean up before asserting: the ring is in the real /dev/shm. The directory is removed
    // only when empty (other tests' rings may be in it).
    let ring_meta = std::fs::symlink_metadata(&ring);
    let dir_meta = std::fs::symlink_metadata(&dir);
    let _ = std::fs::remove_file(&ring);
    let _ = std::fs::remove_dir(&dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir_meta = dir_meta.unwrap();
    assert!(dir_meta.is_dir());
    assert_eq!(dir_meta.uid(), nix::unistd::geteuid().as_raw());
    assert_eq!(dir_meta.mode() & 0o077, 0, "{:o}", dir_meta.mode());
    assert_eq!(ring_meta.unwrap().mode() & 0o7777, 0o600);
}

#[test]
fn check_config_refuses_a_snapshot_file_that_is_not_a_ring_as_the_daemon_would() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let precious = tmp.path().join("data.bin");
    std::fs::write(&precious, [1u8; 64]).unwrap();
    let config = tmp.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nsource = \"synthetic\"\nsnapshot_size = \"4MiB\"\n\
             snapshot_file = \"{}\"\ncontrol_socket = \"{}\"\n",
            root.display(),
            precious.display(),
            tmp.path().join("c.sock").display()
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    for args in [
        &["daemon", "--config", cfg, "--check-config"][..],
        &["daemon", "--config", cfg][..],
    ] {
        let o = run(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{args:?}: {e}");
        assert!(
            e.contains(&format!(
                ":4:17: snapshot_file: {}: exists and is not a ringbag ring",
                precious.display()
            )),
            "{args:?}: {e}"
        );
    }
    assert_eq!(std::fs::read(&precious).unwrap(), [1u8; 64]);
    assert!(!root.exists());
    // A path that is free passes the check, creating nothing.
    let free = tmp.path().join("free.ring");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(precious.to_str().unwrap(), free.to_str().unwrap());
    std::fs::write(&config, text).unwrap();
    let o = run(&["daemon", "--config", cfg, "--check-config"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!free.exists());
}

/// Kills the daemon if the test fails before stopping it.
struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status file's `ring` object, once the file parses.
fn ring_status(status: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(status).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(v.get("ring")?.clone()).filter(|r| !r.is_null())
}

/// Poll `cond` on the status file's ring every 20 ms for up to `secs`.
fn wait_ring(
    status: &Path,
    secs: u64,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(r) = ring_status(status).filter(|r| cond(r)) {
            return r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            ring_status(status)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_daemon_with_a_ring_reports_its_fill_oldest_message_and_open_snapshot_in_status() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let ring = tmp.path().join("ring");
    let sock = tmp.path().join("c.sock");
    let config = tmp.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "output_root = \"{}\"\nstatus_file = \"{}\"\nsource = \"synthetic\"\n\
             synthetic_profile = \"small\"\nclock = \"system\"\nmax_bag_size = \"1MiB\"\n\
             max_record_size = \"16MiB\"\nsnapshot_size = \"16MiB\"\nsnapshot_duration = 600\n\
             snapshot_file = \"{}\"\ncontrol_socket = \"{}\"\n",
            root.display(),
            status.display(),
            ring.display(),
            sock.display()
        ),
    )
    .unwrap();
    let mut d = KillOnDrop(
        crate::common::ringbag()
            .args(["daemon", "--config", config.to_str().unwrap()])
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn_execd()
            .expect("daemon starts"),
    );
    let first = wait_ring(&status, 60, "messages in the ring", |r| {
        r["appended"].as_u64() > Some(0) && r["oldest_ns"].is_i64()
    });
    assert_eq!(first["path"], ring.to_str().unwrap());
    // 16 MiB at ~140 KB/s: minutes before anything is evicted, even under emulation.
    assert_eq!(first["size_bytes"], 16 << 20);
    let capacity = first["capacity_bytes"].as_u64().unwrap();
    assert!(capacity > 15 << 20 && capacity < 16 << 20, "{first}");
    assert_eq!(first["window_s"], 600.0);
    let used = first["used_bytes"].as_u64().unwrap();
    assert!(used > 0 && used <= capacity, "{first}");
    let fill = first["fill"].as_f64().unwrap();
    assert!(
        (fill - used as f64 / capacity as f64).abs() < 1e-9,
        "{first}"
    );
    assert!(first["oldest_age_s"].as_f64().unwrap() >= 0.0, "{first}");
    assert!(first["pending_trigger"].is_null(), "{first}");
    // The figures move as messages arrive: more appended, more held, the oldest older.
    let later = wait_ring(&status, 60, "the ring's figures moving", |r| {
        r["appended"].as_u64() > first["appended"].as_u64()
            && r["used_bytes"].as_u64() > Some(used)
            && r["oldest_age_s"].as_f64() > first["oldest_age_s"].as_f64()
    });
    assert_eq!(
        later["oldest_ns"], first["oldest_ns"],
        "nothing evicted yet"
    );
    // A trigger with a long post-window: its snapshot stays open, and says so.
    let o = run(&[
        "trigger",
        "--control-socket",
        sock.to_str().unwrap(),
        "--reason",
        "estop",
        "--post",
        "300",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let open = wait_ring(&status, 60, "the open snapshot", |r| {
        !r["pending_trigger"].is_null()
    });
    let p = &open["pending_trigger"];
    assert_eq!(p["reason"], "estop");
    let (t, end) = (
        p["trigger_ns"].as_i64().unwrap(),
        p["end_ns"].as_i64().unwrap(),
    );
    assert_eq!(end - t, 300_000_000_000, "{p}");
    // `ringbag status` shows the same, for a person and as JSON.
    let human = run(&["status", "--file", status.to_str().unwrap()]);
    assert_eq!(human.status.code(), Some(0), "{}", stderr(&human));
    let text = crate::common::stdout(&human);
    assert!(text.lines().next().unwrap().contains(" MiB ("), "{text}");
    assert!(text.lines().next().unwrap().contains("; ring "), "{text}");
    assert!(
        text.contains(&format!("ring:  {}:", ring.display())),
        "{text}"
    );
    assert!(text.contains("snapshot open: \"estop\""), "{text}");
    let json = run(&["status", "--json", "--file", status.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&crate::common::stdout(&json)).unwrap();
    assert_eq!(v["ring"]["pending_trigger"]["reason"], "estop");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let code = loop {
        if let Some(st) = d.0.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "daemon stops on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
}

#[test]
fn a_ring_a_real_other_user_left_in_a_shared_directory_is_refused_and_theirs_lives_in_their_own_dir(
) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: needs root to run ringbag as nobody");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A directory everyone may write, as /tmp or /dev/shm.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let shared_ring = tmp.path().join("shared.ring");
    let nobody_out = tmp.path().join("nobody-root/bag");
    let as_nobody = |ring: Option<&Path>| {
        let mut c = crate::common::ringbag_as_nobody();
        c.args([
            "record",
            "--source",
            "synthetic",
            "--synthetic-profile",
            "small",
        ])
        .args(["--synthetic-rate", "max", "--synthetic-count", "20"])
        .args(["--clock", "system", "--snapshot-size", "4MiB", "-o"])
        .arg(&nobody_out)
        .env_remove("RINGBAG_LOG");
        if let Some(r) = ring {
            c.arg("--snapshot-file").arg(r);
        }
        c.output()
    };
    let o = match as_nobody(Some(&shared_ring)) {
        Ok(o) if o.status.code() != Some(127) && !stderr(&o).starts_with("setpriv:") => o,
        other => {
            eprintln!("SKIP: cannot run ringbag as nobody: {other:?}");
            return;
        }
    };
    assert!(o.status.success(), "{}", stderr(&o));
    let m = std::fs::symlink_metadata(&shared_ring).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (65534, 0o600));
    let before = std::fs::read(&shared_ring).unwrap();
    // Root, pointed at nobody's ring: refused, nothing recovered, the ring as it was.
    let root = tmp.path().join("root");
    let out = root.join("bag");
    let o = record_with_ring(&out, Some(&shared_ring), &[]);
    assert_refused(&o, &out, "a ring owned by uid 65534");
    assert!(!root.exists());
    assert_eq!(std::fs::read(&shared_ring).unwrap(), before);
    // nobody's default ring: in /dev/shm/ringbag-65534, 0700, its own.
    let _ = std::fs::remove_dir_all(&nobody_out);
    let o = as_nobody(None).unwrap();
    let dir = Path::new("/dev/shm/ringbag-65534");
    let dir_meta = std::fs::symlink_metadata(dir);
    let rings = entries(dir);
    let _ = std::fs::remove_dir_all(dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir_meta = dir_meta.unwrap();
    assert_eq!((dir_meta.uid(), dir_meta.mode() & 0o7777), (65534, 0o700));
    assert_eq!(rings.len(), 1, "{rings:?}");
}
