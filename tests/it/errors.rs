//! Bad input: one clear line on stderr naming the file or flag, exit code 2, no panic, and
//! nothing written.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::fs;
use std::path::Path;

use ringbag::bag::Flavour;

use crate::common::{run, stderr, write_bag};

/// Assert exit 2 with exactly one stderr line that contains every `needle`.
fn assert_bad_input(args: &[&str], needles: &[&str]) {
    let o = run(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "args {args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line for {args:?}, got: {err}"
    );
    assert!(err.starts_with("ringbag: error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

fn good_bag(tmp: &Path) -> std::path::PathBuf {
    let dir = tmp.join("bag");
    write_bag(
        &dir,
        Flavour::Humble,
        &[("/a", "std_msgs/msg/String")],
        20,
        10,
    );
    dir
}

#[test]
fn info_on_a_missing_path_names_it() {
    assert_bad_input(
        &["info", "/nonexistent/ringbag-bag"],
        &["/nonexistent/ringbag-bag", "no such file"],
    );
}

#[test]
fn info_on_a_directory_that_is_not_a_bag_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().to_str().unwrap();
    assert_bad_input(&["info", p], &[p, "not a bag"]);
}

#[test]
fn info_rejects_an_unknown_metadata_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    let meta = dir.join("metadata.yaml");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("version: 5", "version: 10");
    fs::write(&meta, text).unwrap();
    assert_bad_input(
        &["info", dir.to_str().unwrap()],
        &["metadata.yaml", "unsupported metadata version 10"],
    );
}

#[test]
fn info_rejects_a_truncated_split() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    let db = dir.join("bag_1.db3");
    let f = fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.set_len(50).unwrap();
    assert_bad_input(&["info", dir.to_str().unwrap()], &["bag_1.db3"]);
}

#[test]
fn info_rejects_a_file_that_is_not_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    fs::write(dir.join("bag_0.db3"), vec![b'x'; 8192]).unwrap();
    assert_bad_input(
        &["info", dir.to_str().unwrap()],
        &["bag_0.db3", "not a SQLite database"],
    );
    let single = tmp.path().join("lone.db3");
    fs::write(&single, b"hello").unwrap();
    assert_bad_input(&["info", single.to_str().unwrap()], &["lone.db3"]);
}

#[test]
fn info_rejects_metadata_that_lists_a_missing_split() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    fs::remove_file(dir.join("bag_1.db3")).unwrap();
    assert_bad_input(
        &["info", dir.to_str().unwrap()],
        &["metadata.yaml", "bag_1.db3", "does not exist"],
    );
}

#[test]
fn info_rejects_metadata_with_a_topic_no_file_has() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    let meta = dir.join("metadata.yaml");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("name: /a", "name: /ghost");
    fs::write(&meta, text).unwrap();
    assert_bad_input(
        &["info", dir.to_str().unwrap()],
        &["metadata.yaml", "/ghost"],
    );
}

#[test]
fn info_rejects_metadata_that_is_not_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    fs::write(
        dir.join("metadata.yaml"),
        "rosbag2_bagfile_information: [unclosed",
    )
    .unwrap();
    assert_bad_input(
        &["info", dir.to_str().unwrap()],
        &["metadata.yaml", "not valid YAML"],
    );
}

#[test]
fn record_rejects_impossible_flags_before_creating_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    assert_bad_input(
        &["record", "-o", o, "-b", "1000"],
        &["--max-bag-size", "86016"],
    );
    assert_bad_input(
        &["record", "-o", o, "--max-cache-size", "lots"],
        &["--max-cache-size", "`lots`"],
    );
    assert_bad_input(
        &["record", "-o", o, "-d", "5 fortnights"],
        &["--max-bag-duration"],
    );
    assert_bad_input(
        &["record", "-o", o, "-s", "mcap"],
        &["--storage mcap", "sqlite3"],
    );
    assert_bad_input(
        &["record", "-o", o, "--custom-data", "novalue"],
        &["--custom-data", "KEY=VALUE"],
    );
    #[cfg(not(feature = "ros"))]
    assert_bad_input(
        &["record", "-o", o, "--source", "ros"],
        &["--source ros", "`ros` feature"],
    );
    assert!(!out.exists(), "nothing may be created on bad input");
}

#[test]
fn record_refuses_an_existing_output_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_bag(tmp.path());
    let before = fs::read(dir.join("bag_0.db3")).unwrap();
    assert_bad_input(
        &[
            "record",
            "-o",
            dir.to_str().unwrap(),
            "--synthetic-count",
            "5",
        ],
        &["already exists"],
    );
    assert_eq!(
        fs::read(dir.join("bag_0.db3")).unwrap(),
        before,
        "existing data untouched"
    );
}

/// Assert exit 2 and that stderr is exactly `line` (one line) and stdout is empty.
fn assert_exact_error(args: &[&str], env: &[(&str, &str)], line: &str) {
    let o = crate::common::ringbag()
        .args(args)
        .env_remove("RINGBAG_LOG")
        .envs(env.iter().copied())
        .run_output()
        .expect("ringbag runs");
    assert_eq!(o.status.code(), Some(2), "args {args:?}: {}", stderr(&o));
    assert_eq!(stderr(&o), format!("{line}\n"), "args {args:?}");
    assert!(o.stdout.is_empty(), "args {args:?}");
}

#[test]
fn flag_parser_errors_are_one_prefixed_line_with_exit_two() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["record", "-o", o, "-b", "-10"],
            "ringbag: error: --max-bag-size: `-10`: a size cannot be negative",
        ),
        (
            &["record", "-o", o, "--bag-format", "bogus"],
            "ringbag: error: invalid value 'bogus' for '--bag-format <BAG_FORMAT>'; possible values: humble, jazzy",
        ),
        (
            &["info"],
            "ringbag: error: the following required arguments were not provided: <BAG>; usage: ringbag info <BAG>",
        ),
        (
            &["reindex", "--json"],
            "ringbag: error: the following required arguments were not provided: <BAG>; usage: ringbag reindex --json <BAG>",
        ),
        (
            &["record", "--no-such-flag"],
            "ringbag: error: unexpected argument '--no-such-flag' found; tip: to pass '--no-such-flag' as a value, use '-- --no-such-flag'; usage: ringbag record [OPTIONS] [TOPICS]...",
        ),
        (
            &[],
            "ringbag: error: a command is required: record, info, play, clock, reindex, daemon, status, trigger or upload (see `ringbag --help`)",
        ),
        (
            &["bogus"],
            "ringbag: error: unrecognized subcommand 'bogus'; usage: ringbag [OPTIONS] <COMMAND>",
        ),
        (
            &["record", "-o", o, "--subscription-depth", "many"],
            "ringbag: error: invalid value 'many' for '--subscription-depth <N>': invalid digit found in string",
        ),
        (
            &["record", "-o", o, "--max-splits", "-1"],
            "ringbag: error: invalid value '-1' for '--max-splits <MAX_SPLITS>': -1 is not in 0..=4294967295",
        ),
        (
            &["play", "x", "-r", "fast"],
            "ringbag: error: invalid value 'fast' for '--rate <RATE>': invalid float literal",
        ),
        (
            &["play", "x", "--start-offset", "-5"],
            "ringbag: error: --start-offset: `-5`: a duration cannot be negative",
        ),
        (
            &["--log-level", "bogus", "info", "x"],
            "ringbag: error: invalid value 'bogus' for '--log-level <LOG_LEVEL>'; possible values: error, warn, info, debug, trace",
        ),
    ];
    for (args, line) in cases {
        assert_exact_error(args, &[], line);
    }
    assert!(!out.exists(), "nothing may be created on bad input");
}

#[test]
fn sizes_and_durations_that_overflow_are_refused_not_wrapped() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    // 17179869184 GiB is 2^64 bytes: it used to saturate silently to u64::MAX.
    assert_exact_error(
        &["record", "-o", o, "-b", "17179869184GiB"],
        &[],
        "ringbag: error: --max-bag-size: `17179869184GiB` is too large (at most 9223372036854775807 bytes, 8 EiB)",
    );
    assert_exact_error(
        &["record", "-o", o, "--max-cache-size", "18446744073709551616"],
        &[],
        "ringbag: error: --max-cache-size: `18446744073709551616` is too large (at most 9223372036854775807 bytes, 8 EiB)",
    );
    assert_exact_error(
        &["record", "-o", o, "-b", "1MiB", "--max-record-size", "9300000TB"],
        &[],
        "ringbag: error: --max-record-size: `9300000TB` is too large (at most 9223372036854775807 bytes, 8 EiB)",
    );
    assert_exact_error(
        &["record", "-o", o, "-d", "106752d"],
        &[],
        "ringbag: error: --max-bag-duration: `106752d` is too long (at most 106751 days)",
    );
    assert_exact_error(
        &["record", "-o", o, "--ptp-poll-interval", "18446744073709551615"],
        &[],
        "ringbag: error: invalid clock setting: poll interval 18446744073709551615 ms is outside 10..=60000 ms",
    );
    assert_exact_error(
        &["play", "x", "--start-offset", "9223372037"],
        &[],
        "ringbag: error: --start-offset: `9223372037` is too long (at most 106751 days)",
    );
    assert!(!out.exists());
}

#[test]
fn an_invalid_log_level_is_refused_from_the_flag_and_from_the_environment() {
    assert_exact_error(
        &["info", "/nonexistent/x"],
        &[("RINGBAG_LOG", "bogus")],
        "ringbag: error: RINGBAG_LOG=bogus: not a log level (valid levels: error, warn, info, debug, trace)",
    );
    // A valid level (any case) is used; the flag overrides the environment.
    for env in ["debug", "WARN", ""] {
        assert_exact_error(
            &["info", "/nonexistent/x"],
            &[("RINGBAG_LOG", env)],
            "ringbag: error: /nonexistent/x: no such file or directory",
        );
    }
    assert_exact_error(
        &["--log-level", "error", "info", "/nonexistent/x"],
        &[("RINGBAG_LOG", "bogus")],
        "ringbag: error: /nonexistent/x: no such file or directory",
    );
}

#[test]
fn help_and_version_still_print_normally_with_exit_zero() {
    for args in [
        &["--help"][..],
        &["record", "--help"],
        &["--version"],
        &["help"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(o.stderr.is_empty(), "{args:?}: {}", stderr(&o));
        let out = crate::common::stdout(&o);
        assert!(
            out.starts_with("ringbag ") || out.contains("Usage: ringbag"),
            "{out}"
        );
    }
}

#[test]
fn record_with_clock_ptp_on_a_non_phc_fails_before_creating_the_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    assert_bad_input(
        &[
            "record",
            "-o",
            o,
            "--clock",
            "ptp",
            "--ptp-device",
            "/dev/null",
            "--synthetic-count",
            "5",
        ],
        &["/dev/null", "not a PTP hardware clock"],
    );
    assert_bad_input(
        &[
            "record",
            "-o",
            o,
            "--clock",
            "ptp",
            "--ptp-device",
            "/nonexistent/ptp9",
        ],
        &["/nonexistent/ptp9"],
    );
    assert!(!out.exists());
    assert_bad_input(
        &["clock", "--clock", "ptp", "--ptp-device", "/dev/null"],
        &["/dev/null"],
    );
}

#[test]
fn record_with_clock_auto_falls_back_and_says_so_in_the_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("auto");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "auto",
        "--ptp-device",
        "/nonexistent/ptp9",
        "--synthetic-count",
        "20",
        "--synthetic-rate",
        "max",
        "--bag-format",
        "jazzy",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("/nonexistent/ptp9").count(),
        1,
        "one warning: {}",
        stderr(&o)
    );
    let bag = ringbag::bag::reader::Bag::open(&out).unwrap();
    let cd = &bag.metadata.custom_data;
    assert_eq!(
        cd.get("ringbag.clock").map(String::as_str),
        Some("system"),
        "{cd:?}"
    );
    assert!(
        cd.get("ringbag.clock.fallback_reason")
            .is_some_and(|r| r.contains("/nonexistent/ptp9")),
        "{cd:?}"
    );
    assert_eq!(
        cd.get("ringbag.dropped_messages").map(String::as_str),
        Some("0")
    );
}

#[test]
fn record_stamps_with_the_tracked_stand_in_clock_and_records_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ptp");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "ptp",
        "--ptp-device",
        "@monotonic-raw",
        "--synthetic-count",
        "50",
        "--synthetic-rate",
        "max",
        "--bag-format",
        "jazzy",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bag = ringbag::bag::reader::Bag::open(&out).unwrap();
    assert_eq!(
        bag.metadata
            .custom_data
            .get("ringbag.clock")
            .map(String::as_str),
        Some("ptp")
    );
    // The stand-in reads TAI-like time: after the 37 s correction stamps are near UTC.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (now - bag.metadata.starting_time_ns).abs() < 30_000_000_000,
        "stamps are UTC, not TAI"
    );
}

/// Run `ringbag` with OS-string arguments (non-UTF-8 names need them).
fn run_os(args: &[&std::ffi::OsStr]) -> std::process::Output {
    crate::common::ringbag()
        .args(args)
        .env_remove("RINGBAG_LOG")
        .run_output()
        .expect("ringbag runs")
}

fn assert_one_error_line(o: &std::process::Output, line: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    assert_eq!(stderr(o), format!("{line}\n"));
}

/// Everything in `dir`, sorted, to prove a refusal created nothing.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn unusable_output_paths_are_bad_input_with_one_line_and_nothing_created() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    fs::write(t.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink(t.join("missing"), t.join("dangling")).unwrap();
    let before = listing(t);
    let record = |out: &OsStr| {
        run_os(&[
            OsStr::new("record"),
            OsStr::new("-o"),
            out,
            OsStr::new("--clock"),
            OsStr::new("system"),
            OsStr::new("--synthetic-count"),
            OsStr::new("5"),
        ])
    };
    let d = t.display();
    let cases: Vec<(std::path::PathBuf, String)> = vec![
        (
            t.join("dangling"),
            format!("ringbag: error: {d}/dangling: is a symbolic link to a missing target; choose another output"),
        ),
        (
            t.join("dangling/sub"),
            format!("ringbag: error: {d}/dangling/sub: {d}/dangling is a symbolic link to a missing target"),
        ),
        (
            t.join("file/sub"),
            format!("ringbag: error: {d}/file/sub: {d}/file is not a directory"),
        ),
        (
            t.join("file/a/b"),
            format!("ringbag: error: {d}/file/a/b: {d}/file is not a directory"),
        ),
        (
            "/proc/ringbag-test".into(),
            "ringbag: error: /proc/ringbag-test: /proc is on a filesystem without storage (such as /proc or /sys)".into(),
        ),
        (
            "/sys/ringbag-test/x".into(),
            "ringbag: error: /sys/ringbag-test/x: /sys is on a filesystem without storage (such as /proc or /sys)".into(),
        ),
    ];
    for (out, line) in &cases {
        assert_one_error_line(&record(out.as_os_str()), line);
    }
    let bad_name = t.join(OsStr::from_bytes(b"bag\xff"));
    assert_one_error_line(
        &record(bad_name.as_os_str()),
        &format!(
            "ringbag: error: {d}/bag\u{fffd}: the bag name is not valid UTF-8 (rosbag2 stores file names as text)"
        ),
    );
    assert_eq!(listing(t), before, "nothing may be created on bad input");
    assert!(!Path::new("/proc/ringbag-test").exists());
}

#[test]
fn an_output_directory_the_user_may_not_create_is_bad_input() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // Reachable by everyone, writable by its owner only.
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let locked = tmp.path().join("locked");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
    let out = locked.join("bag");
    let args = [
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "system",
        "--synthetic-count",
        "5",
    ];
    let o = if nix::unistd::geteuid().is_root() {
        // Root ignores permission bits (CI runs as root): drop to nobody for this run.
        let probe = crate::common::ringbag_as_nobody()
            .arg("--version")
            .run_output();
        if !probe.is_ok_and(|p| p.status.success()) {
            eprintln!("SKIP: cannot run ringbag as nobody through setpriv");
            return;
        }
        crate::common::ringbag_as_nobody()
            .args(args)
            .env_remove("RINGBAG_LOG")
            .run_output()
            .unwrap()
    } else {
        run(&args)
    };
    assert_one_error_line(
        &o,
        &format!(
            "ringbag: error: {}: cannot create the bag directory in {}: Permission denied (os error 13)",
            out.display(),
            locked.display()
        ),
    );
    assert!(listing(&locked).is_empty());
}

#[test]
fn an_unwritable_status_file_is_bad_input_before_the_bag_is_created() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    fs::write(t.join("file"), b"x").unwrap();
    fs::create_dir(t.join("adir")).unwrap();
    let out = t.join("bag");
    let d = t.display();
    let cases: Vec<(std::path::PathBuf, String)> = vec![
        (
            t.join("missing/status.json"),
            format!("ringbag: error: {d}/missing/status.json: cannot write the status file: No such file or directory (os error 2)"),
        ),
        (
            t.join("file/status.json"),
            format!("ringbag: error: {d}/file/status.json: cannot write the status file: Not a directory (os error 20)"),
        ),
        (
            t.join("adir"),
            format!("ringbag: error: {d}/adir: cannot write the status file: Is a directory (os error 21)"),
        ),
        (
            t.join(OsStr::from_bytes(b"s\xff.json")),
            format!("ringbag: error: {d}/s\u{fffd}.json: cannot write the status file: needs a file name in UTF-8"),
        ),
        (
            "/proc/ringbag-status.json".into(),
            "ringbag: error: /proc/ringbag-status.json: cannot write the status file: No such file or directory (os error 2)".into(),
        ),
    ];
    for (status, line) in &cases {
        let o = run_os(&[
            OsStr::new("record"),
            OsStr::new("-o"),
            out.as_os_str(),
            OsStr::new("--clock"),
            OsStr::new("system"),
            OsStr::new("--synthetic-count"),
            OsStr::new("5"),
            OsStr::new("--status-file"),
            status.as_os_str(),
        ]);
        assert_one_error_line(&o, line);
    }
    assert!(!out.exists(), "the bag is not created");
    assert_eq!(listing(t), ["adir", "file"]);
}

/// Run `args` and require it to end within 10 s (a FIFO used to block `open` forever).
fn run_within_deadline(args: &[&str]) -> std::process::Output {
    crate::common::wait_deadline(crate::common::spawn(args), 10)
        .unwrap_or_else(|| panic!("ringbag {args:?} hung (killed after 10 s)"))
}

#[test]
fn a_fifo_as_ptp_device_is_refused_at_once_by_clock_and_record() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("ptp-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let f = fifo.to_str().unwrap();
    let why = format!("{f} is not a PTP hardware clock (not a character device but a FIFO)");

    // --clock ptp: one error line, exit 2, no bag.
    let o = run_within_deadline(&["clock", "--clock", "ptp", "--ptp-device", f]);
    assert_one_error_line(&o, &format!("ringbag: error: {why}"));
    let never = tmp.path().join("never");
    let o = run_within_deadline(&[
        "record",
        "-o",
        never.to_str().unwrap(),
        "--clock",
        "ptp",
        "--ptp-device",
        f,
        "--synthetic-count",
        "5",
    ]);
    assert_one_error_line(&o, &format!("ringbag: error: {why}"));
    assert!(!never.exists());

    // --clock auto: the report says why it fell back, exit 0, nothing on stderr.
    let o = run_within_deadline(&[
        "clock",
        "--clock",
        "auto",
        "--ptp-device",
        f,
        "--samples",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    assert!(
        crate::common::stdout(&o).contains(&format!("fallback:         {why}")),
        "{}",
        crate::common::stdout(&o)
    );
    // record --clock auto: exactly one warning line, then a bag stamped by the system clock.
    let out = tmp.path().join("auto");
    let o = run_within_deadline(&[
        "--log-level",
        "warn",
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "auto",
        "--ptp-device",
        f,
        "--synthetic-count",
        "5",
        "--synthetic-rate",
        "max",
        "--bag-format",
        "jazzy",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let warnings: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| l.starts_with("ringbag: "))
        .map(String::from)
        .collect();
    assert_eq!(
        warnings,
        [format!(
            "ringbag: warn: {why}; --clock auto: stamping with the system clock"
        )]
    );
    let bag = ringbag::bag::reader::Bag::open(&out).unwrap();
    assert_eq!(
        bag.metadata
            .custom_data
            .get("ringbag.clock")
            .map(String::as_str),
        Some("system")
    );
}

/// Run `args` with stdout a pipe whose reader is already gone; returns (exit code, stderr).
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let mut child = crate::common::ringbag()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .expect("ringbag runs");
    // The reader closes before ringbag writes anything: `| head -c0`.
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("ringbag ends");
    (o.status.code(), stderr(&o))
}

#[test]
fn a_reader_that_closes_the_pipe_early_is_not_a_failure_or_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = good_bag(tmp.path());
    let bag = bag.to_str().unwrap();
    for args in [
        vec!["info", bag],
        vec!["info", "--json", bag],
        vec!["play", bag, "--sink", "echo", "--rate", "1000"],
    ] {
        let (code, err) = with_closed_stdout(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The selection flags are checked and applied with the synthetic source too: a bad pattern
/// is one line and exit 2 (before, it was ignored and recording ran until stopped), and a
/// selection that can never record anything is refused before the bag exists.
#[test]
fn record_selection_flags_are_checked_and_applied_with_the_synthetic_source() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    let synthetic = ["record", "--source", "synthetic", "-o", o];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        synthetic
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .collect()
    };
    assert_exact_error(
        &with(&["-e", "("]),
        &[],
        "ringbag: error: invalid -e/--regex pattern \"(\": unclosed group",
    );
    assert_bad_input(
        &with(&["--exclude-regex", "a{99999999}"]),
        &["--exclude-regex", "a{99999999}"],
    );
    assert_bad_input(
        &with(&["/nope"]),
        &["keeps none of the robot profile's topics", "/imu, /tf"],
    );
    assert_bad_input(
        &with(&["-e", "^/zzz"]),
        &["keeps none of the robot profile's topics"],
    );
    assert_bad_input(
        &with(&[
            "--exclude-topics",
            "/imu",
            "/tf",
            "/camera/front/image_raw",
            "/camera/rear/image_raw",
            "/points",
        ]),
        &["keeps none"],
    );
    assert!(!out.exists(), "nothing may be created on bad input");

    // A named topic the profile lacks is warned about, as live recording would wait for it.
    let bag = tmp.path().join("absent");
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-count",
        "10",
        "--log-level",
        "warn",
        "-o",
        bag.to_str().unwrap(),
        "/imu",
        "/nope",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "ringbag: warn: the robot synthetic profile has no /nope (its topics: /imu, /tf"
        ),
        "{}",
        stderr(&o)
    );
    // Named topics, and a pattern minus an exclusion, record exactly those topics.
    for (args, want) in [
        (vec!["imu", "/tf"], vec!["/imu", "/tf"]),
        (
            vec!["-e", "^/camera/", "--exclude-regex", "rear"],
            vec!["/camera/front/image_raw"],
        ),
        (
            vec!["--exclude-topics", "/points", "/camera/rear/image_raw"],
            vec!["/camera/front/image_raw", "/imu", "/tf"],
        ),
    ] {
        let bag = tmp.path().join(format!("sel{}", want.len()));
        let mut cmd = vec!["record", "--source", "synthetic", "--synthetic-rate", "max"];
        cmd.extend(["--synthetic-count", "200", "--log-level", "error", "-o"]);
        cmd.push(bag.to_str().unwrap());
        cmd.extend(args.iter().copied());
        let o = run(&cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        let b = ringbag::bag::reader::Bag::open(&bag).expect("open");
        let mut got: Vec<String> = b
            .metadata
            .topics
            .iter()
            .filter(|t| t.message_count > 0)
            .map(|t| t.topic.name.clone())
            .collect();
        got.sort();
        assert_eq!(got, want, "{cmd:?}");
        assert_eq!(b.metadata.message_count, 200, "{cmd:?}");
    }
}

#[test]
fn snapshot_and_rate_flags_naming_a_topic_the_selection_drops_are_warned_about() {
    // The recording still runs (the selection may be the deliberate part), and says once
    // per option which topic can never reach the ring or the bag, and why.
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("b");
    let ring = tmp.path().join("ring");
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-count",
        "10",
        "--log-level",
        "warn",
        "-o",
        bag.to_str().unwrap(),
        "--exclude-regex",
        "^/camera/",
        "--snapshot-size",
        "8MiB",
        "--snapshot-file",
        ring.to_str().unwrap(),
        "--snapshot-topics",
        "/camera/front/image_raw",
        "--snapshot-topics",
        "/points",
        "--topic-rate",
        "/camera/rear/image_raw=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("which the topic selection does not record"))
        .collect();
    assert_eq!(
        warned,
        [
            "ringbag: warn: --snapshot-topics names /camera/front/image_raw, which the topic \
             selection does not record (excluded): it never reaches the ring",
            "ringbag: warn: --topic-rate names /camera/rear/image_raw, which the topic selection \
             does not record (excluded): it never reaches the bag",
        ],
        "{err}"
    );
    assert!(bag.join("metadata.yaml").exists(), "{err}");
}

/// Run `args` with stdout closed (`>&-`) or on /dev/full; returns (exit code, stderr).
fn with_broken_stdout(args: &[&str], closed: bool) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut cmd = crate::common::ringbag();
    cmd.args(args)
        .env_remove("RINGBAG_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    if closed {
        cmd.stdout(Stdio::null());
        // SAFETY: close() is async-signal-safe and touches nothing of the parent's memory;
        // it runs after stdout was set up, so the program starts with descriptor 1 closed.
        unsafe {
            cmd.pre_exec(|| {
                libc::close(1);
                Ok(())
            });
        }
    } else {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        cmd.stdout(full);
    }
    let o = crate::common::wait_deadline(cmd.spawn_execd().expect("ringbag runs"), 60)
        .expect("ringbag ends within 60 s");
    (o.status.code(), stderr(&o))
}

/// A closed stdout (`>&-`) made `info` and `play --sink echo` exit 0 having printed nothing
/// (the standard library turns EBADF into success). A closed stdout and a full one are both
/// write failures: exit 1 and one line naming stdout, for every command that prints.
#[test]
fn a_closed_or_full_stdout_is_a_write_failure_of_every_printing_command() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = good_bag(tmp.path());
    let bag = bag.to_str().unwrap();
    for args in [
        vec!["info", bag],
        vec!["info", "--json", bag],
        vec!["play", bag, "--sink", "echo", "--rate", "1000"],
        vec![
            "play",
            bag,
            "--sink",
            "echo",
            "--echo-format",
            "jsonl",
            "--rate",
            "1000",
        ],
        vec!["reindex", "--dry-run", bag],
        vec!["reindex", "--dry-run", "--json", bag],
    ] {
        // Under a user-mode emulator (RINGBAG_TEST_RUNNER) the emulator itself starts with
        // descriptor 1 closed and may open its own files there: only /dev/full is checked.
        let emulated = std::env::var("RINGBAG_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty());
        for closed in [true, false] {
            if closed && emulated {
                continue;
            }
            let (code, err) = with_broken_stdout(&args, closed);
            let what = format!("{args:?} closed={closed}");
            assert_eq!(code, Some(1), "{what}: {err}");
            let lines: Vec<&str> = err
                .lines()
                .filter(|l| !l.starts_with("ringbag: keys"))
                .collect();
            let want = if closed {
                "ringbag: error: stdout: Bad file descriptor (os error 9)"
            } else {
                "ringbag: error: stdout: No space left on device (os error 28)"
            };
            assert_eq!(lines, [want], "{what}");
        }
    }
}
