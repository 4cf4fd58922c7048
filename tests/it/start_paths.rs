//! The paths a recorder opens at start, as bad input (issue 22, items 8, 12, 17, 18): the
//! control socket's path, the service's config and its paths, the status file. Each refusal
//! is one line and exit 2, made before anything is created, returns at once (a FIFO must not
//! block it), and leaves what was planted there exactly as it was.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::common::{spawn, stderr, wait_deadline};

/// Run `args` and require it to end within 10 s: a FIFO used to block `open` forever, and
/// /dev/zero to be read into memory without end.
fn run_within_deadline(args: &[&str]) -> std::process::Output {
    wait_deadline(spawn(args), 10)
        .unwrap_or_else(|| panic!("ringbag {args:?} hung (killed after 10 s)"))
}

fn assert_one_error_line(o: &std::process::Output, line: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    assert_eq!(stderr(o), format!("{line}\n"));
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
}

/// What a planted file is, to prove it was left alone: its type, inode, and bytes if regular.
#[derive(Debug, PartialEq)]
struct Planted {
    kind: &'static str,
    ino: u64,
    bytes: Option<Vec<u8>>,
    link: Option<PathBuf>,
}

fn planted(p: &Path) -> Planted {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: gone: {e}", p.display()));
    let ft = m.file_type();
    let kind = if ft.is_file() {
        "file"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_char_device() {
        "char"
    } else if ft.is_symlink() {
        "link"
    } else if ft.is_socket() {
        "socket"
    } else {
        "other"
    };
    Planted {
        kind,
        ino: m.ino(),
        bytes: ft.is_file().then(|| fs::read(p).unwrap()),
        link: ft.is_symlink().then(|| fs::read_link(p).unwrap()),
    }
}

/// A character device like /dev/null, made in `dir` (only root may), so that a regression
/// deletes a copy and never the machine's own /dev/null. None when mknod is not allowed.
fn char_device(dir: &Path) -> Option<PathBuf> {
    let p = dir.join("null-copy");
    nix::sys::stat::mknod(
        &p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .ok()
    .map(|()| p)
}

/// A path in `dir` of exactly `len` bytes.
fn path_of_len(dir: &Path, len: usize) -> PathBuf {
    let base = dir.join("s").to_str().unwrap().len();
    assert!(base < len, "temp dir too long for the test");
    let p = dir.join("s".repeat(len - base + 1));
    assert_eq!(p.as_os_str().len(), len);
    p
}

/// The paths a `--control-socket` must not take: each planted thing stays exactly as it was,
/// and the refusal comes before the status file, the ring or the bag exist.
#[test]
fn record_refuses_a_control_socket_path_that_is_not_a_socket_and_leaves_it_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let plain = t.join("plain");
    fs::write(&plain, b"someone's notes\n").unwrap();
    let fifo = t.join("fifo");
    mkfifo(&fifo);
    let dir = t.join("adir");
    fs::create_dir(&dir).unwrap();
    let link = t.join("link-to-dev-null");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let long = path_of_len(t, 108);
    let d = |p: &Path| p.display().to_string();
    let mut cases: Vec<(PathBuf, String)> = vec![
        (
            plain.clone(),
            format!(
                "{}: exists and is a regular file, not a socket; only a stale socket is replaced",
                d(&plain)
            ),
        ),
        (
            fifo.clone(),
            format!(
                "{}: exists and is a FIFO, not a socket; only a stale socket is replaced",
                d(&fifo)
            ),
        ),
        (
            dir.clone(),
            format!(
                "{}: exists and is a directory, not a socket; only a stale socket is replaced",
                d(&dir)
            ),
        ),
        (
            link.clone(),
            format!(
                "{}: exists and is a symbolic link, not a socket; only a stale socket is replaced",
                d(&link)
            ),
        ),
        (
            plain.join("c.sock"),
            format!("{}/c.sock: {} is not a directory", d(&plain), d(&plain)),
        ),
        (
            long.clone(),
            format!(
                "{}: 108 bytes long; a unix socket path holds at most 107 bytes",
                d(&long)
            ),
        ),
    ];
    if let Some(dev) = char_device(t) {
        cases.push((
            dev.clone(),
            format!("{}: exists and is a character device, not a socket; only a stale socket is replaced", d(&dev)),
        ));
    }
    let before: Vec<Planted> = [&plain, &fifo, &dir, &link].map(|p| planted(p)).into();
    let out = t.join("out");
    let ring = t.join("ring");
    let status = t.join("status.json");
    for (sock, why) in &cases {
        let o = run_within_deadline(&[
            "record",
            "--source",
            "synthetic",
            "--synthetic-count",
            "5",
            "--clock",
            "system",
            "-o",
            out.to_str().unwrap(),
            "--status-file",
            status.to_str().unwrap(),
            "--snapshot-size",
            "1MiB",
            "--snapshot-file",
            ring.to_str().unwrap(),
            "--control-socket",
            sock.to_str().unwrap(),
        ]);
        assert_one_error_line(&o, &format!("ringbag: error: --control-socket: {why}"));
        assert!(!out.exists(), "{}: the bag was created", sock.display());
        assert!(!ring.exists(), "{}: the ring was created", sock.display());
        assert!(
            !status.exists(),
            "{}: the status file was written",
            sock.display()
        );
    }
    let after: Vec<Planted> = [&plain, &fifo, &dir, &link].map(|p| planted(p)).into();
    assert_eq!(before, after);
    assert!(fs::read_dir(&dir).unwrap().next().is_none());
    if let Some((dev, _)) = cases.last().filter(|(p, _)| p.ends_with("null-copy")) {
        assert_eq!(planted(dev).kind, "char");
    }
    // The longest path a unix socket takes is used, in a directory that is created.
    let longest = path_of_len(&t.join("new-dir"), 107);
    assert_eq!(longest.as_os_str().len(), 107);
    let o = run_within_deadline(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-count",
        "5",
        "--clock",
        "system",
        "-o",
        out.to_str().unwrap(),
        "--snapshot-size",
        "1MiB",
        "--snapshot-file",
        ring.to_str().unwrap(),
        "--control-socket",
        longest.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.is_dir());
}

/// A socket nobody listens on (a recorder killed -9 left it) is replaced; one a recorder
/// listens on is refused before the ring exists.
#[test]
fn a_stale_control_socket_is_replaced_and_a_live_one_refused_before_the_ring() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let record = |sock: &Path, name: &str| {
        run_within_deadline(&[
            "record",
            "--source",
            "synthetic",
            "--synthetic-count",
            "5",
            "--clock",
            "system",
            "-o",
            t.join(name).to_str().unwrap(),
            "--snapshot-size",
            "1MiB",
            "--snapshot-file",
            t.join(format!("{name}.ring")).to_str().unwrap(),
            "--control-socket",
            sock.to_str().unwrap(),
        ])
    };
    let stale = t.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap()); // the file stays, nobody listens
    let o = record(&stale, "after-stale");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(t.join("after-stale").is_dir());
    assert!(
        !stale.exists(),
        "the replacing socket is removed at the end"
    );

    let live = t.join("live.sock");
    let listener = UnixListener::bind(&live).unwrap();
    let o = record(&live, "beside-live");
    assert_one_error_line(
        &o,
        &format!(
            "ringbag: error: --control-socket: {}: another recorder already listens on this control socket",
            live.display()
        ),
    );
    assert!(!t.join("beside-live").exists());
    assert!(
        !t.join("beside-live.ring").exists(),
        "no ring before the refusal"
    );
    assert_eq!(planted(&live).kind, "socket", "the live socket is left");
    drop(listener);
}

/// `--status-file` naming a FIFO or a link: refused, not replaced by the status file's rename.
#[test]
fn record_refuses_a_status_file_that_is_a_fifo_or_a_link_and_leaves_it() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let fifo = t.join("fifo");
    mkfifo(&fifo);
    let target = t.join("target.json");
    fs::write(&target, b"{}").unwrap();
    let link = t.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let before = [planted(&fifo), planted(&link), planted(&target)];
    for (p, kind) in [(&fifo, "a FIFO"), (&link, "a symbolic link")] {
        let out = t.join("out");
        let o = run_within_deadline(&[
            "record",
            "--source",
            "synthetic",
            "--synthetic-count",
            "5",
            "--clock",
            "system",
            "-o",
            out.to_str().unwrap(),
            "--status-file",
            p.to_str().unwrap(),
        ]);
        assert_one_error_line(
            &o,
            &format!(
                "ringbag: error: {}: cannot write the status file: exists and is {kind}, not a \
                 regular file; not replaced (the status file is written by a rename)",
                p.display()
            ),
        );
        assert!(!out.exists());
    }
    assert_eq!(before, [planted(&fifo), planted(&link), planted(&target)]);
}

/// A config whose paths the daemon cannot use: `--check-config` refuses it (exit 2, one
/// line naming the key), and so does the daemon at start (exit 2, which the unit does not
/// restart, instead of exit 1 and a restart loop), leaving the planted files as they were
/// and creating no recording root.
#[test]
fn check_config_refuses_every_path_the_daemon_would_refuse_and_the_daemon_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let dir = t.join("adir");
    fs::create_dir(&dir).unwrap();
    let fifo = t.join("fifo");
    mkfifo(&fifo);
    let plain = t.join("plain");
    fs::write(&plain, b"not a socket\n").unwrap();
    let dangling = t.join("dangling");
    std::os::unix::fs::symlink(t.join("missing"), &dangling).unwrap();
    let long = path_of_len(t, 108);
    let root = t.join("root");
    let d = |p: &Path| p.display().to_string();
    // The good config these cases change one key of.
    let keys = |over: &[(&str, String)]| {
        let mut k: Vec<(&str, String)> = vec![
            ("output_root", d(&root)),
            ("source", "synthetic".into()),
            ("clock", "system".into()),
            ("status_file", d(&t.join("status.json"))),
            ("snapshot_size", "1MiB".into()),
            ("snapshot_file", d(&t.join("ring"))),
            ("control_socket", d(&t.join("c.sock"))),
        ];
        for (key, v) in over {
            k.iter_mut().find(|(n, _)| n == key).unwrap().1 = v.clone();
        }
        k.iter()
            .map(|(n, v)| format!("{n} = \"{}\"\n", v.replace('\0', "\\u0000")))
            .collect::<String>()
    };
    // (key, value, the problem after "KEY: ", whether to run the daemon too). The daemon
    // never runs with /dev/null: a regression would delete the machine's own.
    let cases: Vec<(&str, String, String, bool)> = vec![
        (
            "output_root",
            format!("{}/a\0b", d(t)),
            format!("{}/a\\0b: contains a NUL byte", d(t)),
            true,
        ),
        (
            "output_root",
            d(&dangling.join("bags")),
            format!("{}/bags: {} is a symbolic link to a missing target", d(&dangling), d(&dangling)),
            true,
        ),
        (
            "snapshot_file",
            d(&dir),
            format!("{}: a directory, not a ring file; not touched", d(&dir)),
            true,
        ),
        (
            "control_socket",
            d(&dir),
            format!("{}: exists and is a directory, not a socket; only a stale socket is replaced", d(&dir)),
            true,
        ),
        (
            "control_socket",
            d(&long),
            format!("{}: 108 bytes long; a unix socket path holds at most 107 bytes", d(&long)),
            true,
        ),
        (
            "control_socket",
            d(&fifo),
            format!("{}: exists and is a FIFO, not a socket; only a stale socket is replaced", d(&fifo)),
            true,
        ),
        (
            "control_socket",
            d(&plain),
            format!("{}: exists and is a regular file, not a socket; only a stale socket is replaced", d(&plain)),
            true,
        ),
        (
            "control_socket",
            "/dev/null".into(),
            "/dev/null: exists and is a character device, not a socket; only a stale socket is replaced".into(),
            false,
        ),
        (
            "status_file",
            d(&fifo),
            format!("{}: exists and is a FIFO, not a regular file; not replaced (the status file is written by a rename)", d(&fifo)),
            true,
        ),
        (
            "control_socket",
            "c.sock".into(),
            "c.sock: must be an absolute path".into(),
            true,
        ),
        (
            "snapshot_file",
            "ring".into(),
            "ring: must be an absolute path".into(),
            true,
        ),
        (
            "status_file",
            "status.json".into(),
            "status.json: must be an absolute path".into(),
            true,
        ),
        (
            "status_file",
            d(&dir),
            format!("{}: exists and is a directory; the status file needs a file name", d(&dir)),
            true,
        ),
        // Its rename would replace the ring (the black box lost, and the next start refusing
        // the JSON left at the ring's path) or the listening socket.
        (
            "status_file",
            d(&t.join("ring")),
            format!("{}: the same file as snapshot_file; each needs a path of its own", d(&t.join("ring"))),
            true,
        ),
        (
            "status_file",
            d(&t.join("adir/../c.sock")),
            format!("{}: the same file as control_socket; each needs a path of its own", d(&t.join("adir/../c.sock"))),
            true,
        ),
    ];
    let before = [
        planted(&dir),
        planted(&fifo),
        planted(&plain),
        planted(&dangling),
    ];
    let config = t.join("ringbag.toml");
    for (key, value, why, run_daemon) in &cases {
        let text = keys(&[(key, value.clone())]);
        fs::write(&config, &text).unwrap();
        let line = text.lines().position(|l| l.starts_with(key)).unwrap() + 1;
        let column = key.len() + 4;
        let want = format!(
            "ringbag: error: {}:{line}:{column}: {key}: {why}",
            config.display()
        );
        let o = run_within_deadline(&[
            "daemon",
            "--config",
            config.to_str().unwrap(),
            "--check-config",
        ]);
        assert_one_error_line(&o, &want);
        if *run_daemon {
            let o = run_within_deadline(&["daemon", "--config", config.to_str().unwrap()]);
            assert_one_error_line(&o, &want);
        }
        assert!(!root.exists(), "{text}: the recording root was created");
        assert!(!t.join("ring").exists(), "{text}: the ring was created");
    }
    assert_eq!(
        before,
        [
            planted(&dir),
            planted(&fifo),
            planted(&plain),
            planted(&dangling)
        ]
    );
    assert!(fs::read_dir(&dir).unwrap().next().is_none());
    // The same config with good paths passes.
    fs::write(&config, keys(&[])).unwrap();
    let o = run_within_deadline(&[
        "daemon",
        "--config",
        config.to_str().unwrap(),
        "--check-config",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `daemon --config` and `status --file` read only regular files, and at most a cap: a FIFO
/// used to hang them forever, /dev/zero to grow them to gigabytes.
#[test]
fn config_and_status_files_that_are_special_or_huge_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let fifo = t.join("fifo");
    mkfifo(&fifo);
    // Sparse: no disk space is used, whatever the machine has free.
    let big_config = t.join("big.toml");
    fs::File::create(&big_config)
        .unwrap()
        .set_len((1 << 20) + 1)
        .unwrap();
    let big_status = t.join("big.json");
    fs::File::create(&big_status)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    let commands = |p: &Path| -> [Vec<String>; 3] {
        let p = p.to_str().unwrap().to_string();
        [
            vec!["daemon".into(), "--config".into(), p.clone()],
            vec![
                "daemon".into(),
                "--config".into(),
                p.clone(),
                "--check-config".into(),
            ],
            vec!["status".into(), "--file".into(), p],
        ]
    };
    for (p, why) in [
        (fifo.as_path(), "is a FIFO, not a regular file; not read"),
        (
            Path::new("/dev/zero"),
            "is a character device, not a regular file; not read",
        ),
    ] {
        for args in commands(p) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = run_within_deadline(&args);
            assert_one_error_line(&o, &format!("ringbag: error: {}: {why}", p.display()));
        }
    }
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    let o = run_within_deadline(&[
        "daemon",
        "--config",
        big_config.to_str().unwrap(),
        "--check-config",
    ]);
    assert_one_error_line(
        &o,
        &format!(
            "ringbag: error: {}: larger than 1048576 bytes; not read",
            big_config.display()
        ),
    );
    let o = run_within_deadline(&["status", "--file", big_status.to_str().unwrap()]);
    assert_one_error_line(
        &o,
        &format!(
            "ringbag: error: {}: larger than 16777216 bytes; not read",
            big_status.display()
        ),
    );
}

#[test]
fn record_refuses_a_status_file_at_the_rings_or_the_sockets_path_before_writing_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let out = t.join("root/bag");
    let ring = t.join("x.ring");
    let sock = t.join("c.sock");
    for (status, other) in [(&ring, "--snapshot-file"), (&sock, "--control-socket")] {
        let o = run_within_deadline(&[
            "record",
            "--source",
            "synthetic",
            "--clock",
            "system",
            "--synthetic-count",
            "10",
            "--snapshot-size",
            "1MiB",
            "--snapshot-file",
            ring.to_str().unwrap(),
            "--control-socket",
            sock.to_str().unwrap(),
            "--status-file",
            status.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_one_error_line(
            &o,
            &format!(
                "ringbag: error: --status-file: {}: the same file as {other}; each needs a path of its own",
                status.display()
            ),
        );
        assert!(!ring.exists() && !sock.exists() && !out.exists());
    }
}
