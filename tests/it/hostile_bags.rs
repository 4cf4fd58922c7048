//! Bags built by a hostile or careless hand: FIFOs where files should be, metadata.yaml naming
//! files outside the bag or values that cannot be true, files that are not rosbag2 splits,
//! bags in directories the reader may not write. Every command must finish quickly with one
//! clear line, never hang, never write, and never destroy what is not its own.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use ringbag::bag::Flavour;

use crate::common::{ringbag, stderr, write_bag};

/// Run ringbag with `args`, killed if it runs past `secs`. Both pipes are read while
/// waiting (a full pipe would block the child). Panics naming the command on a timeout.
fn run_deadline<S: AsRef<OsStr>>(args: &[S], secs: u64) -> Output {
    let child = ringbag()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("spawn ringbag");
    let out = crate::common::wait_deadline(child, secs);
    let cmd: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    out.unwrap_or_else(|| panic!("`ringbag {}` hung (killed after {secs} s)", cmd.join(" ")))
}

/// Assert exit 2 and exactly one stderr line, `ringbag: error: ...` containing `want`.
fn assert_one_line_error(out: &Output, want: &str, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: not one line: {err}");
    assert!(
        lines[0].starts_with("ringbag: error: ") && lines[0].contains(want),
        "{what}: {err}"
    );
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
}

fn small_bag(dir: &Path) {
    write_bag(
        dir,
        Flavour::Jazzy,
        &[("/a", "std_msgs/msg/String")],
        20,
        10,
    );
}

/// Every reading command, as argument lists ending in the bag.
fn commands(bag: &Path) -> Vec<Vec<PathBuf>> {
    let b = bag.to_path_buf();
    vec![
        vec!["info".into(), b.clone()],
        vec!["info".into(), "--json".into(), b.clone()],
        vec!["play".into(), "--sink".into(), "echo".into(), b.clone()],
        vec!["reindex".into(), b.clone()],
        vec!["reindex".into(), "--dry-run".into(), b],
    ]
}

#[test]
fn a_fifo_split_is_refused_by_every_command_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    // Alone, and next to real splits.
    let alone = tmp.path().join("f");
    fs::create_dir(&alone).unwrap();
    mkfifo(&alone.join("f_0.db3"));
    let mixed = tmp.path().join("m");
    small_bag(&mixed);
    mkfifo(&mixed.join("m_7.db3"));
    for bag in [&alone, &mixed] {
        for args in commands(bag) {
            let out = run_deadline(&args, 10);
            assert_one_line_error(&out, "is a FIFO, not a regular file", &format!("{args:?}"));
        }
    }
    // A FIFO given as the bag itself.
    let out = run_deadline(&["info".as_ref(), alone.join("f_0.db3").as_os_str()], 10);
    assert_one_line_error(&out, "not a bag", "info FIFO");
}

#[test]
fn a_directory_named_like_a_split_is_not_a_split() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("d");
    small_bag(&bag);
    fs::create_dir(bag.join("d_9.db3")).unwrap();
    let out = run_deadline(&["info".as_ref(), bag.as_os_str()], 10);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_fifo_metadata_yaml_is_refused_by_every_command_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("y");
    small_bag(&bag);
    fs::remove_file(bag.join("metadata.yaml")).unwrap();
    mkfifo(&bag.join("metadata.yaml"));
    for args in commands(&bag) {
        let out = run_deadline(&args, 10);
        assert_one_line_error(
            &out,
            "metadata.yaml: is a FIFO, not a regular file; not opened",
            &format!("{args:?}"),
        );
    }
}

#[test]
fn a_metadata_yaml_listing_a_fifo_is_refused_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("l");
    small_bag(&bag);
    // The bag's first split is replaced by a FIFO of the same name.
    fs::remove_file(bag.join("l_0.db3")).unwrap();
    mkfifo(&bag.join("l_0.db3"));
    for args in commands(&bag) {
        let out = run_deadline(&args, 10);
        assert_one_line_error(&out, "l_0.db3", &format!("{args:?}"));
        assert!(stderr(&out).contains("FIFO"), "{args:?}: {}", stderr(&out));
    }
    // metadata.yaml naming a FIFO that is not a .db3 file at all.
    let bag2 = tmp.path().join("n");
    small_bag(&bag2);
    mkfifo(&bag2.join("pipe"));
    let meta = bag2.join("metadata.yaml");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("n_1.db3", "pipe");
    fs::write(&meta, text).unwrap();
    for args in &commands(&bag2)[..3] {
        let out = run_deadline(args, 10);
        assert_one_line_error(
            &out,
            "metadata.yaml: lists pipe, which is a FIFO, not a regular file; not opened",
            &format!("{args:?}"),
        );
    }
}

#[test]
fn a_fifo_side_file_is_refused_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    for suffix in ["-wal", "-journal", "-shm"] {
        let bag = tmp
            .path()
            .join(format!("s{}", suffix.trim_start_matches('-')));
        small_bag(&bag);
        let name = bag.file_name().unwrap().to_string_lossy().into_owned();
        mkfifo(&bag.join(format!("{name}_1.db3{suffix}")));
        for args in commands(&bag) {
            let out = run_deadline(&args, 10);
            assert_one_line_error(&out, "is a FIFO", &format!("{args:?}"));
        }
    }
}

#[test]
fn record_recover_is_not_hung_by_a_fifo_bag_in_the_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("fifo_bag");
    fs::create_dir(&f).unwrap();
    mkfifo(&f.join("fifo_bag_0.db3"));
    let y = tmp.path().join("fifo_yaml");
    small_bag(&y);
    fs::remove_file(y.join("metadata.yaml")).unwrap();
    mkfifo(&y.join("metadata.yaml"));
    let out = tmp.path().join("new");
    let o = run_deadline(
        &[
            "record".as_ref(),
            "--source".as_ref(),
            "synthetic".as_ref(),
            "--synthetic-profile".as_ref(),
            "small".as_ref(),
            "--synthetic-count".as_ref(),
            "10".as_ref(),
            "--recover".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
        20,
    );
    // Whether a bag that cannot be recovered stops the recording is the recovery policy's
    // business; here it must only finish, and name what it could not use.
    assert!(o.status.code().is_some(), "{}", stderr(&o));
}

/// Write `bag`'s metadata.yaml with `from` replaced by `to` (first occurrence only).
fn edit_metadata(bag: &Path, from: &str, to: &str) {
    let meta = bag.join("metadata.yaml");
    let text = fs::read_to_string(&meta).unwrap();
    assert!(text.contains(from), "{from} not in\n{text}");
    fs::write(&meta, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn metadata_paths_outside_the_bag_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_bag(&src);
    // A real split outside the bag: it would read fine if it were opened.
    fs::copy(src.join("src_0.db3"), tmp.path().join("outside_0.db3")).unwrap();
    let outside_abs = tmp.path().join("outside_0.db3");
    for (name, entry) in [
        ("dotdot", "../outside_0.db3".to_string()),
        ("deep", "sub/../../outside_0.db3".to_string()),
        ("absolute", outside_abs.display().to_string()),
    ] {
        let bag = tmp.path().join(name);
        small_bag(&bag);
        let meta = bag.join("metadata.yaml");
        let text = fs::read_to_string(&meta)
            .unwrap()
            .replace(&format!("{name}_0.db3"), &entry);
        fs::write(&meta, text).unwrap();
        for args in &commands(&bag)[..3] {
            let out = run_deadline(args, 10);
            assert_one_line_error(
                &out,
                &format!("metadata.yaml: lists {entry:?}, which "),
                &format!("{name} {args:?}"),
            );
        }
    }
}

#[test]
fn legacy_paths_with_the_bag_directory_in_front_still_read() {
    // rosbag2 before metadata version 4 wrote `<bag>/<bag>_0.db3`.
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("old");
    small_bag(&bag);
    edit_metadata(&bag, "- old_0.db3", "- old/old_0.db3");
    let out = run_deadline(&["info".as_ref(), bag.as_os_str()], 10);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn impossible_counts_durations_and_start_times_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &str, &str); 6] = [
        (
            "dur",
            "  duration:\n    nanoseconds: ",
            "  duration:\n    nanoseconds: -",
            "metadata.yaml: duration is negative",
        ),
        (
            "cnt",
            "  message_count: ",
            "  message_count: -",
            "`message_count` is negative",
        ),
        (
            "start",
            "    nanoseconds_since_epoch: ",
            "    nanoseconds_since_epoch: -",
            "starting time is before 1970",
        ),
        (
            "topic",
            "    message_count: ",
            "    message_count: -",
            "topic /a: message_count` is negative",
        ),
        (
            "fdur",
            "    duration:\n      nanoseconds: ",
            "    duration:\n      nanoseconds: -",
            "file fdur_0.db3: duration is negative",
        ),
        (
            "fcnt",
            "    message_count: 10",
            "    message_count: -10",
            "file fcnt_0.db3: message_count` is negative",
        ),
    ];
    for (name, from, to, want) in cases {
        let bag = tmp.path().join(name);
        small_bag(&bag);
        edit_metadata(&bag, from, to);
        for args in &commands(&bag)[..3] {
            let out = run_deadline(args, 10);
            assert_one_line_error(&out, want, &format!("{name} {args:?}"));
            assert!(stderr(&out).contains("metadata.yaml: "), "{}", stderr(&out));
        }
    }
}

/// Name, size and bytes of every file in `dir`, to prove that reading changed nothing.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = fs::read(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    v.sort();
    v
}

/// `ringbag args…` as the unprivileged user `nobody` (root ignores permission bits), or
/// `None` when this machine cannot switch users.
fn run_as_nobody(args: &[&OsStr]) -> Option<Output> {
    let out = crate::common::ringbag_as_nobody()
        .args(args)
        .stdin(Stdio::null())
        .run_output();
    match out {
        Ok(o) if o.status.code() == Some(127) || stderr(&o).starts_with("setpriv:") => {
            eprintln!("SKIPPED as nobody: {}", stderr(&o));
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("SKIPPED as nobody: cannot run setpriv: {e}");
            None
        }
    }
}

#[test]
fn readers_never_write_a_resilient_bag_and_need_no_write_access() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bag = tmp.path().join("r");
    let rec = run_deadline(
        &[
            "record".as_ref(),
            "--source".as_ref(),
            "synthetic".as_ref(),
            "--synthetic-profile".as_ref(),
            "medium".as_ref(),
            "--synthetic-rate".as_ref(),
            "max".as_ref(),
            "--synthetic-count".as_ref(),
            "40".as_ref(),
            "-b".as_ref(),
            "1MiB".as_ref(),
            "--storage-preset-profile".as_ref(),
            "resilient".as_ref(),
            "-o".as_ref(),
            bag.as_os_str(),
        ],
        60,
    );
    assert!(rec.status.success(), "{}", stderr(&rec));
    // The recorder folded every split's WAL back into it: no side files, rollback mode.
    let names: Vec<String> = snapshot(&bag).into_iter().map(|(n, _)| n).collect();
    assert!(
        names
            .iter()
            .all(|n| n == "metadata.yaml" || n.ends_with(".db3")),
        "{names:?}"
    );
    assert!(names.len() >= 3, "{names:?}");
    for (n, bytes) in snapshot(&bag) {
        if n.ends_with(".db3") {
            assert_eq!(&bytes[18..20], &[1, 1], "{n} is still in WAL mode");
        }
    }
    // A split left in WAL mode (a bag from an older recorder, or rosbag2's own resilient
    // preset) must read too.
    {
        let c = rusqlite::Connection::open(bag.join("r_0.db3")).unwrap();
        let m: String = c
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(m, "wal");
    }
    assert_eq!(&fs::read(bag.join("r_0.db3")).unwrap()[18..20], &[2, 2]);
    let before = snapshot(&bag);
    let readers: [Vec<&OsStr>; 3] = [
        vec!["info".as_ref(), bag.as_os_str()],
        vec!["info".as_ref(), "--json".as_ref(), bag.as_os_str()],
        vec![
            "play".as_ref(),
            "--sink".as_ref(),
            "echo".as_ref(),
            "--rate".as_ref(),
            "1000".as_ref(),
            bag.as_os_str(),
        ],
    ];
    for args in &readers {
        let out = run_deadline(args, 30);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(snapshot(&bag) == before, "{args:?} changed the bag");
    }
    for args in &readers {
        let Some(out) = run_as_nobody(args) else {
            return;
        };
        assert!(out.status.success(), "{args:?} as nobody: {}", stderr(&out));
        assert!(
            snapshot(&bag) == before,
            "{args:?} as nobody changed the bag"
        );
    }
    let played = run_as_nobody(&readers[2]).expect("ran above");
    assert_eq!(
        String::from_utf8_lossy(&played.stdout).lines().count(),
        40,
        "every message plays"
    );
}

#[test]
fn a_split_with_the_wal_of_an_interrupted_recording_is_left_to_reindex() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("w");
    small_bag(&bag);
    let c = rusqlite::Connection::open(bag.join("w_1.db3")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; INSERT INTO messages (topic_id, timestamp, data) \
         SELECT topic_id, timestamp + 1, data FROM messages LIMIT 1;",
    )
    .unwrap();
    assert!(fs::metadata(bag.join("w_1.db3-wal")).unwrap().len() > 0);
    let before = snapshot(&bag);
    let out = run_deadline(&["info".as_ref(), bag.as_os_str()], 10);
    assert_one_line_error(
        &out,
        "w_1.db3: has a -wal of an interrupted recording; run `ringbag reindex` to apply it",
        "info",
    );
    assert!(snapshot(&bag) == before, "info changed the bag");
    drop(c);
}

/// Files that are not rosbag2 splits, by name and bytes.
fn foreign_files() -> Vec<(&'static str, Vec<u8>)> {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("people.sqlite");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch(
        "CREATE TABLE people(name TEXT, age INTEGER); \
         INSERT INTO people VALUES ('ada', 36), ('alan', 41);",
    )
    .unwrap();
    drop(c);
    // Deterministic noise, with no SQLite header.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    vec![("sqlite", fs::read(&db).unwrap()), ("random", noise)]
}

#[test]
fn reindex_leaves_a_file_that_is_not_a_split_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    for (kind, bytes) in foreign_files() {
        for extra in [&[][..], &["--discard-damaged"][..], &["--dry-run"][..]] {
            let bag = tmp.path().join(format!(
                "{kind}{}",
                extra.len() * 10 + extra.first().map_or(0, |e| e.len())
            ));
            fs::create_dir(&bag).unwrap();
            fs::write(bag.join("x_0.db3"), &bytes).unwrap();
            let before = snapshot(&bag);
            let mut args: Vec<&OsStr> = vec!["reindex".as_ref()];
            args.extend(extra.iter().map(|e| OsStr::new(*e)));
            args.push(bag.as_os_str());
            let out = run_deadline(&args, 20);
            assert_one_line_error(&out, "x_0.db3: ", &format!("{kind} {extra:?}"));
            assert!(
                stderr(&out).contains("not a rosbag2 split"),
                "{}",
                stderr(&out)
            );
            assert!(
                snapshot(&bag) == before,
                "{kind} {extra:?}: the directory changed"
            );
        }
    }
}

#[test]
fn reindex_reports_a_stray_file_next_to_real_splits_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    for (kind, bytes) in foreign_files() {
        for discard in [false, true] {
            let bag = tmp.path().join(format!("{kind}{discard}"));
            small_bag(&bag);
            let name = bag.file_name().unwrap().to_string_lossy().into_owned();
            let stray = format!("{name}_9.db3");
            fs::write(bag.join(&stray), &bytes).unwrap();
            let mut args: Vec<&OsStr> = vec!["reindex".as_ref(), "--json".as_ref()];
            if discard {
                args.push("--discard-damaged".as_ref());
            }
            args.push(bag.as_os_str());
            let out = run_deadline(&args, 20);
            assert!(out.status.success(), "{kind}: {}", stderr(&out));
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let s = r["splits"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["file"] == stray.as_str())
                .unwrap_or_else(|| panic!("{stray} not in the report: {r}"));
            assert_eq!(s["method"], "not-a-split", "{s}");
            assert!(s["damaged_kept_as"].is_null(), "{s}");
            assert_eq!(
                fs::read(bag.join(&stray)).unwrap(),
                bytes,
                "{kind}: bytes changed"
            );
            assert!(!bag.join(format!("{stray}.damaged")).exists());
            let meta = fs::read_to_string(bag.join("metadata.yaml")).unwrap();
            assert!(!meta.contains(&stray), "metadata.yaml lists the stray file");
            assert_eq!(r["message_count"], 20, "{r}");
        }
    }
}

#[test]
fn recover_does_not_touch_a_sibling_directory_of_foreign_db3_files() {
    let tmp = tempfile::tempdir().unwrap();
    let sib = tmp.path().join("sib");
    fs::create_dir(&sib).unwrap();
    for (kind, bytes) in foreign_files() {
        fs::write(sib.join(format!("{kind}_0.db3")), &bytes).unwrap();
    }
    let before = snapshot(&sib);
    let out = tmp.path().join("new");
    let _ = run_deadline(
        &[
            "record".as_ref(),
            "--source".as_ref(),
            "synthetic".as_ref(),
            "--synthetic-profile".as_ref(),
            "small".as_ref(),
            "--synthetic-count".as_ref(),
            "10".as_ref(),
            "--recover".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
        30,
    );
    assert!(
        snapshot(&sib) == before,
        "--recover changed files that are not splits"
    );
}

/// Record `profile` with a status file and kill -9 it once `at_least` messages are
/// committed. Returns the bag and the committed count at the kill.
fn killed_recording(root: &Path, profile: &str, size: &str, at_least: u64) -> (PathBuf, u64) {
    let bag = root.join(profile);
    let status = root.join(format!("{profile}.json"));
    let mut child = ringbag()
        .args(["record", "--source", "synthetic", "--log-level", "error"])
        .args(["--synthetic-profile", profile, "--synthetic-rate", "max"])
        .args(["-b", size, "--bag-format", "humble", "--clock", "system"])
        .arg("-o")
        .arg(&bag)
        .arg("--status-file")
        .arg(&status)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn_execd()
        .expect("spawn record");
    let committed = || crate::common::status_committed(&status).unwrap_or(0);
    // Kill while the open split is well filled, so that truncating it cuts rows.
    let newest_len = || -> u64 {
        ringbag::bag::reader::find_split_files(&bag)
            .ok()
            .and_then(|f| f.last().cloned())
            .and_then(|n| fs::metadata(bag.join(n)).ok())
            .map_or(0, |m| m.len())
    };
    // Not inside a commit that still has a rollback journal (a split's first commits keep
    // one, see `GUARD_JOURNAL_MODE`): SQLite would roll such a split back to its last commit,
    // intact, and the tear this caller wants would not be there.
    let hot_journal = || -> bool {
        ringbag::bag::reader::find_split_files(&bag)
            .ok()
            .and_then(|f| f.last().cloned())
            .and_then(|n| fs::metadata(bag.join(format!("{n}-journal"))).ok())
            .is_some_and(|m| m.len() > 0)
    };
    let ready = || committed() >= at_least && newest_len() >= 1 << 20 && !hot_journal();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "recording did not reach {at_least} messages"
        );
        if ready() {
            // Freeze it, then look again: between a look and a kill the recorder may rotate
            // (slow under emulation), leaving an empty newest split to tear.
            crate::common::freeze(pid.as_raw());
            if ready() {
                break;
            }
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    (bag, committed())
}

#[test]
fn a_torn_open_split_reports_its_loss_as_unknown_never_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let (bag, committed) = killed_recording(tmp.path(), "medium", "2MiB", 150);
    assert!(committed >= 150);
    let files = ringbag::bag::reader::find_split_files(&bag).unwrap();
    let newest = files.last().unwrap().clone();
    let path = bag.join(&newest);
    let len = fs::metadata(&path).unwrap().len();
    assert!(len > 200_000, "{newest} holds rows ({len} bytes)");
    // How many rows the bag holds untorn: a reindexed copy tells.
    let whole = tmp.path().join("whole");
    fs::create_dir(&whole).unwrap();
    for e in fs::read_dir(&bag).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), whole.join(e.file_name())).unwrap();
    }
    let out = run_deadline(
        &["reindex".as_ref(), "--json".as_ref(), whole.as_os_str()],
        60,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let untorn = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["message_count"]
        .as_u64()
        .unwrap();
    assert!(
        untorn >= committed,
        "untorn {untorn}, committed {committed}"
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len * 7 / 10)
        .unwrap();

    // Text: the dry run changes nothing and says "unknown", with the reason.
    let out = run_deadline(
        &["reindex".as_ref(), "--dry-run".as_ref(), bag.as_os_str()],
        60,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{newest}:")))
        .unwrap_or_else(|| panic!("{newest} not reported:\n{text}"));
    assert!(line.contains("lost unknown ("), "{line}");
    assert!(line.contains("the file is truncated ("), "{line}");
    assert!(!line.contains("lost 0"), "{line}");
    assert!(
        text.contains("an unknown number of messages lost in total"),
        "{text}"
    );

    let out = run_deadline(
        &["reindex".as_ref(), "--json".as_ref(), bag.as_os_str()],
        60,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = r["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["file"] == newest.as_str())
        .unwrap();
    assert!(s["messages_lost"].is_null(), "{s}");
    assert_eq!(s["loss_basis"], "unknown", "{s}");
    assert!(
        s["loss_unknown_reason"]
            .as_str()
            .is_some_and(|w| w.contains("truncated")),
        "{s}"
    );
    assert!(r["messages_lost"].is_null(), "{r}");
    // Rows really were lost: the report above is about a real loss, not a false alarm.
    let kept = r["message_count"].as_u64().unwrap();
    assert!(kept < untorn, "kept {kept} of {untorn}");
    eprintln!(
        "torn open split: committed {committed} (status file), {untorn} untorn, kept {kept}, \
         lost at least {}: {}",
        s["messages_lost_at_least"], s["loss_unknown_reason"]
    );
}

#[test]
fn a_truncated_closed_split_reports_a_known_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("c");
    write_bag(
        &bag,
        Flavour::Humble,
        &[("/a", "std_msgs/msg/String")],
        3000,
        1500,
    );
    let path = bag.join("c_0.db3");
    let len = fs::metadata(&path).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len * 7 / 10)
        .unwrap();
    let out = run_deadline(
        &["reindex".as_ref(), "--json".as_ref(), bag.as_os_str()],
        60,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &r["splits"][0];
    let kept = s["messages_kept"].as_u64().unwrap();
    assert_eq!(s["messages_lost"].as_u64(), Some(1500 - kept), "{s}");
    assert_eq!(s["loss_basis"], "metadata-yaml", "{s}");
}

/// A one-split bag whose `table` (topics or messages) was replaced by a VIEW `view_sql`
/// with the same columns (the real table is kept under another name).
fn bag_with_view(dir: &Path, table: &str, view_sql: &str) {
    write_bag(dir, Flavour::Jazzy, &[("/a", "std_msgs/msg/String")], 5, 0);
    let name = dir.file_name().unwrap().to_str().unwrap();
    let c = rusqlite::Connection::open(dir.join(format!("{name}_0.db3"))).unwrap();
    c.execute_batch(&format!(
        "ALTER TABLE {table} RENAME TO {table}_real; CREATE VIEW {table} AS {view_sql};"
    ))
    .unwrap();
}

/// Views that never end or yield a gigabyte, as `topics` and as `messages`.
fn hostile_views() -> Vec<(&'static str, &'static str, String)> {
    let endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)";
    let huge = "replace(hex(zeroblob(400000000)), '00', 'xy')";
    vec![
        (
            "recursive topics",
            "topics",
            format!(
                "{endless} SELECT n AS id, '/t' || n AS name, 'std_msgs/msg/String' AS type, \
                 'cdr' AS serialization_format, '' AS offered_qos_profiles, \
                 '' AS type_description_hash FROM r"
            ),
        ),
        (
            "huge-string topics",
            "topics",
            format!(
                "SELECT id, {huge} AS name, type, serialization_format, offered_qos_profiles, \
                 type_description_hash FROM topics_real"
            ),
        ),
        (
            "recursive messages",
            "messages",
            format!(
                "{endless} SELECT n AS id, 1 AS topic_id, 1700000000000000000 + n AS timestamp, \
                 x'00' AS data FROM r"
            ),
        ),
        (
            "huge-blob messages",
            "messages",
            "SELECT id, topic_id, timestamp, zeroblob(900000000) AS data FROM messages_real"
                .to_string(),
        ),
    ]
}

/// [`run_deadline`] with at most 1 GiB of address space (the views below cost 2-3 GB when
/// they were read). Not under an emulator (RINGBAG_TEST_RUNNER), whose own reservations
/// count against the limit.
fn run_bounded(args: &[PathBuf], secs: u64) -> Output {
    run_limited(args, secs, 1 << 30)
}

/// [`run_bounded`] with at most `bytes` of address space.
fn run_limited(args: &[PathBuf], secs: u64, bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let emulated = std::env::var("RINGBAG_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty());
    let mut cmd = ringbag();
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !emulated {
        // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent's memory.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: bytes as libc::rlim_t,
                    rlim_max: bytes as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    crate::common::wait_deadline(cmd.spawn_execd().expect("spawn ringbag"), secs)
        .unwrap_or_else(|| panic!("`ringbag {args:?}` hung (killed after {secs} s)"))
}

/// A `.db3` whose `topics` or `messages` is a view (endless, or yielding a gigabyte) hung
/// `info`, `play` and `reindex`, or cost them gigabytes. Only real tables are read: every
/// command refuses it at once (in 1 GiB of address space), one line, exit 2, and reindex
/// changes nothing.
#[test]
fn a_split_whose_tables_are_hostile_views_is_refused_promptly_by_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (what, table, sql)) in hostile_views().into_iter().enumerate() {
        let bag = tmp.path().join(format!("v{i}"));
        bag_with_view(&bag, table, &sql);
        let before = snapshot(&bag);
        for args in commands(&bag) {
            let started = std::time::Instant::now();
            let out = run_bounded(&args, 20);
            assert_one_line_error(
                &out,
                &format!("`{table}` is a view, not a table: not a rosbag2 split; not read"),
                &format!("{what}: {args:?}"),
            );
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{what}: {args:?} took {:?}",
                started.elapsed()
            );
        }
        assert_eq!(snapshot(&bag), before, "{what}: a command changed the bag");
    }
}

/// A bag whose one split got `sql` run on its real `topics` table.
fn bag_with_topics(dir: &Path, sql: &str) {
    small_bag(dir);
    let name = dir.file_name().unwrap().to_str().unwrap();
    let c = rusqlite::Connection::open(dir.join(format!("{name}_0.db3"))).unwrap();
    c.execute_batch(sql).unwrap();
}

/// Address space for the commands below: a value of the sizes used here, once read, is
/// over it.
const TIGHT: u64 = 256 << 20;

/// Every command on `bag` ends within 15 s, in [`TIGHT`] address space, with one line
/// containing `want`, exit 2, and leaves the bag as it was.
fn refused_promptly_and_in_bounded_memory(bag: &Path, want: &str, what: &str) {
    let before = fs::read_dir(bag).unwrap().count();
    for args in commands(bag) {
        let started = std::time::Instant::now();
        let out = run_limited(&args, 60, TIGHT);
        assert_one_line_error(&out, want, &format!("{what}: {args:?}"));
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}: {args:?} took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(fs::read_dir(bag).unwrap().count(), before, "{what}");
}

/// One 300 MB QoS string in a real `topics` table: `reindex` took 29 s and 1.4 GB, and
/// `info` and `play` read all of it (315 MB) before refusing it. Lengths are checked in
/// SQL before a value is read: every command refuses it at once in 256 MiB.
#[test]
fn a_huge_value_in_a_real_topics_table_is_refused_before_it_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("q");
    bag_with_topics(
        &bag,
        "UPDATE topics SET offered_qos_profiles = printf('%.*c', 300000000, 'x');",
    );
    refused_promptly_and_in_bounded_memory(
        &bag,
        "`topics`.offered_qos_profiles holds a value longer than 4194304 characters: \
         not a rosbag2 split; not read",
        "300 MB QoS",
    );
}

/// Two million rows in a real `topics` table: `reindex` ran past 60 s in 2.67 GB. Rows are
/// counted (up to the limit) before any is read: every command refuses it at once.
#[test]
fn millions_of_rows_in_a_real_topics_table_are_refused_before_they_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("m");
    bag_with_topics(
        &bag,
        "INSERT INTO topics (name, type, serialization_format, offered_qos_profiles, \
           type_description_hash) \
         WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 2000000) \
         SELECT '/t' || n, 'std_msgs/msg/String', 'cdr', '', '' FROM r;",
    );
    refused_promptly_and_in_bounded_memory(&bag, "more than 100000", "2 M topics");
}

/// A 200 KB metadata.yaml of 100,000 `[` stalled `info` and `play` for over 30 s in the
/// YAML parser. Its nesting is measured before parsing: refused at once, one line, exit 2.
/// (Deep block nesting likewise; an oversized file is refused before it is read.)
#[test]
fn a_deeply_nested_metadata_yaml_is_refused_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = [
        (
            "flow",
            format!("rosbag2_bagfile_information: {}", "[".repeat(100_000)),
        ),
        (
            "block",
            format!("rosbag2_bagfile_information:\n{}x\n", "- ".repeat(20_000)),
        ),
    ];
    for (what, text) in deep {
        let bag = tmp.path().join(what);
        small_bag(&bag);
        fs::write(bag.join("metadata.yaml"), text).unwrap();
        for args in commands(&bag)
            .into_iter()
            .filter(|a| a[0] != Path::new("reindex"))
        {
            let started = std::time::Instant::now();
            let out = run_deadline(&args, 20);
            assert_one_line_error(
                &out,
                "metadata.yaml: not a rosbag2 metadata.yaml: nested more than 64 levels deep",
                &format!("{what}: {args:?}"),
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: {args:?}"
            );
        }
    }
    let big = tmp.path().join("big");
    small_bag(&big);
    let f = fs::File::create(big.join("metadata.yaml")).unwrap();
    // Sparse: no disk space is used.
    f.set_len(129 << 20).unwrap();
    let out = run_deadline(&["info".as_ref(), big.as_os_str()], 20);
    assert_one_line_error(
        &out,
        "metadata.yaml: is 129.0 MiB, more than the 128 MiB a metadata.yaml may be; not read",
        "oversized",
    );
}
