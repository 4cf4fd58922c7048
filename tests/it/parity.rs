//! `ros2 bag` parity: Jazzy's spellings of the record and play flags through the synthetic
//! source and the echo sink, `ringbag list`, and the README's parity table held against the
//! real Jazzy `ros2 bag record/play --help` (run by scripts/ros-test.sh's jazzy stage).

use std::collections::BTreeSet;
use std::path::Path;

use ringbag::bag::Flavour;

use crate::common::{run, stderr, stdout, write_bag};

/// Exit 2, one `ringbag: error:` line holding every needle, and nothing created at `never`.
fn assert_bad_input(args: &[&str], needles: &[&str], never: &Path) {
    let o = run(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "args {args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("ringbag: error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
    assert!(!never.exists(), "{args:?} created {}", never.display());
}

/// The topics of `bag` that hold messages, sorted.
fn recorded_topics(bag: &Path) -> Vec<String> {
    let b = ringbag::bag::reader::Bag::open(bag).expect("open");
    let mut got: Vec<String> = b
        .metadata
        .topics
        .iter()
        .filter(|t| t.message_count > 0)
        .map(|t| t.topic.name.clone())
        .collect();
    got.sort();
    got
}

#[test]
fn jazzy_selection_flags_record_exactly_their_topics_with_the_synthetic_source() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // Jazzy's --topics, and the Humble positional list beside it: one list.
        (vec!["/imu", "--topics", "/tf"], vec!["/imu", "/tf"]),
        (vec!["--topics", "imu"], vec!["/imu"]),
        // --all-topics: every topic (-a adds the services, which the synthetic source has none of).
        (
            vec!["--all-topics", "--exclude-topics", "/points"],
            vec![
                "/camera/front/image_raw",
                "/camera/rear/image_raw",
                "/imu",
                "/tf",
            ],
        ),
        // Exact type names select; they add to named topics.
        (
            vec!["--topic-types", "sensor_msgs/msg/Image", "--topics", "/tf"],
            vec!["/camera/front/image_raw", "/camera/rear/image_raw", "/tf"],
        ),
        // Excluded types win over -a, and work on their own (everything else is kept).
        (
            vec![
                "--exclude-topic-types",
                "sensor_msgs/msg/Image",
                "sensor_msgs/msg/PointCloud2",
            ],
            vec!["/imu", "/tf"],
        ),
        (
            vec!["-a", "--exclude-topic-types", "sensor_msgs/msg/Imu"],
            vec![
                "/camera/front/image_raw",
                "/camera/rear/image_raw",
                "/points",
                "/tf",
            ],
        ),
        // Every synthetic topic is published: accepted, nothing changes.
        (
            vec!["--include-unpublished-topics", "--topics", "/imu"],
            vec!["/imu"],
        ),
    ];
    for (i, (args, want)) in cases.into_iter().enumerate() {
        let bag = tmp.path().join(format!("sel{i}"));
        let mut cmd = vec!["record", "--source", "synthetic", "--synthetic-rate", "max"];
        cmd.extend(["--synthetic-count", "300", "--log-level", "error", "-o"]);
        cmd.push(bag.to_str().unwrap());
        cmd.extend(args.iter().copied());
        let o = run(&cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        assert_eq!(recorded_topics(&bag), want, "{cmd:?}");
    }
}

#[test]
fn record_flags_without_a_meaning_on_the_synthetic_source_are_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let o = out.to_str().unwrap();
    let with = |extra: &[&'static str]| -> Vec<&str> {
        ["record", "--source", "synthetic", "-o", o]
            .into_iter()
            .chain(extra.iter().copied())
            .collect()
    };
    for (extra, needles) in [
        (
            vec!["--use-sim-time"],
            vec!["--use-sim-time: the synthetic source has no /clock"],
        ),
        (
            vec!["--ignore-leaf-topics"],
            vec!["--ignore-leaf-topics: the synthetic source's topics have no subscribers"],
        ),
        (
            vec!["--node-name", "rec"],
            vec!["--node-name rec: the synthetic source has no ROS node"],
        ),
        (
            vec!["--topic-types", "sensor_msgs/Imu"],
            vec!["--topic-types \"sensor_msgs/Imu\": not a type name"],
        ),
        (
            vec!["--topic-types", "std_msgs/msg/String"],
            vec!["keeps none of the robot profile's topics"],
        ),
        (
            vec!["--exclude-topic-types", "bad"],
            vec!["--exclude-topic-types \"bad\": not a type name"],
        ),
        (
            vec!["--compression-mode", "message"],
            vec!["--compression-mode message needs a --compression-format"],
        ),
        (
            vec!["--compression-mode", "file"],
            vec!["--compression-mode file needs a --compression-format"],
        ),
        (
            vec!["--compression-format", "zstd"],
            vec!["--compression-format needs a --compression-mode"],
        ),
        (
            vec!["--services", "/set"],
            vec!["--services: the synthetic source has no services"],
        ),
        (
            vec!["--all-services"],
            vec!["--all-services: the synthetic source has no services"],
        ),
        (
            vec!["-a", "--exclude-services", "/set"],
            vec!["--exclude-services: the synthetic source has no services"],
        ),
    ] {
        assert_bad_input(&with(&extra), &needles, &out);
    }
}

/// Jazzy's play selection of services (rosbag2 0.26's player and sqlite3 reader): each kind
/// answers to its own list, `-e`/`-x` and `--exclude-topics` to both; through the echo sink,
/// every played message's bytes and order checked against what was written. Calling the
/// services (`--publish-service-requests`) is the ros sink's: on the echo sink it is refused
/// in one line, as is `--service-requests-source` without it.
#[test]
fn play_selects_services_as_jazzy_and_refuses_service_calls_on_the_echo_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    let written = write_bag(
        &bag,
        Flavour::Jazzy,
        &[
            ("/set/_service_event", "std_srvs/srv/SetBool_Event"),
            ("/a", "std_msgs/msg/String"),
            (
                "/add/_service_event",
                "example_interfaces/srv/AddTwoInts_Event",
            ),
        ],
        3,
        0,
    );
    let b = bag.to_str().unwrap();
    let never = tmp.path().join("never");
    for (extra, needle) in [
        (
            &["--publish-service-requests"][..],
            "--publish-service-requests: the echo sink calls no services (--sink ros only)",
        ),
        (
            &["--service-requests-source", "client_introspection"],
            "--service-requests-source: only with --publish-service-requests",
        ),
    ] {
        let args: Vec<&str> = ["play", b, "--sink", "echo"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        assert_bad_input(&args, &[needle], &never);
    }
    // (topic, bag time, bytes) of each message played, in order.
    let played = |extra: &[&str]| -> (Vec<(String, i64, Vec<u8>)>, String) {
        let args: Vec<&str> = ["play", b, "--sink", "echo", "--echo-format", "jsonl"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let o = run(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let got = stdout(&o)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                let hex = v["data_hex"].as_str().expect("data_hex");
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect();
                let topic = v["topic"].as_str().expect("topic").to_string();
                (topic, v["bag_ns"].as_i64().expect("bag_ns"), bytes)
            })
            .collect();
        // stderr without play's closing `played N messages` line: the warnings.
        let warnings = stderr(&o)
            .lines()
            .filter(|l| !l.starts_with("ringbag: played "))
            .map(|l| format!("{l}\n"))
            .collect();
        (got, warnings)
    };
    let only = |names: &[&str]| -> Vec<(String, i64, Vec<u8>)> {
        written
            .iter()
            .filter(|(t, _, _)| names.contains(&t.as_str()))
            .cloned()
            .collect()
    };
    let (set, a, add) = ("/set/_service_event", "/a", "/add/_service_event");
    for (extra, want) in [
        (&[][..], vec![set, a, add]),
        // --topics alone selects topics only: every service still plays.
        (&["--topics", "/a"], vec![set, a, add]),
        (&["--topics", "/set/_service_event"], vec![set, add]),
        // --services alone: those services (named without the suffix, `/` optional) and every topic.
        (&["--services", "set"], vec![set, a]),
        (&["--topics", "/a", "--services", "/add"], vec![a, add]),
        (&["--exclude-services", "/set"], vec![a, add]),
        (
            &["--services", "/set", "/add", "--exclude-services", "/add"],
            vec![set, a],
        ),
        // -e and -x match both kinds; --exclude-topics takes an event topic too (rosbag2's reader).
        (&["--topics", "/a", "-e", "^/add"], vec![a, add]),
        (&["-x", "_service_event$"], vec![a]),
        (&["--exclude-topics", "/add/_service_event"], vec![set, a]),
    ] {
        let (got, err) = played(extra);
        assert_eq!(got, only(&want), "{extra:?}");
        assert!(err.is_empty(), "{extra:?}: {err}");
    }
    // A service the bag lacks is one warning, and the rest plays.
    let (got, err) = played(&["--services", "/nope", "/set"]);
    assert_eq!(got, only(&[set, a]));
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("--services /nope: the bag has no such service"),
        "{err}"
    );
    // `burst` takes --services too, as ros2 bag burst does.
    let o = run(&[
        "burst",
        b,
        "--sink",
        "echo",
        "--services",
        "/add",
        "--topics",
        "/a",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let topics: Vec<String> = stdout(&o)
        .lines()
        .map(|l| l.split(' ').nth(2).expect("topic field").to_string())
        .collect();
    let want: Vec<String> = only(&[a, add]).into_iter().map(|m| m.0).collect();
    assert_eq!(topics, want);
    // info lists the event topic as a service, apart from the topics, as Jazzy's ros2 bag
    // info does; `Messages:` counts the topics' messages only.
    let o = run(&["info", b]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        "Messages:          3",
        "Topic information: Topic: /a | Type: std_msgs/msg/String | Count: 3 | Serialization \
         Format: cdr",
        "Service:           2",
        "Service: /set | Type: std_srvs/srv/SetBool | Event Count: 3 | Serialization Format: cdr",
        "Service: /add | Type: example_interfaces/srv/AddTwoInts | Event Count: 3 | \
         Serialization Format: cdr",
    ] {
        assert!(
            out.lines().any(|l| l.ends_with(line)),
            "no line {line:?} in\n{out}"
        );
    }
    assert!(!out.contains("Topic: /set"), "{out}");
}

#[test]
fn play_jazzy_flags_ack_loan_and_clock_topics_through_the_echo_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    write_bag(
        &bag,
        Flavour::Jazzy,
        &[("/a", "std_msgs/msg/String"), ("/b", "std_msgs/msg/String")],
        5,
        0,
    );
    let b = bag.to_str().unwrap();
    // The echo lines without their first field, the send time.
    let played = |o: &std::process::Output| -> Vec<String> {
        stdout(o)
            .lines()
            .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest).to_string())
            .collect()
    };
    let plain = run(&["play", b, "--sink", "echo"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(played(&plain).len(), 10, "{}", stdout(&plain));
    // The echo sink has nothing to acknowledge and never loans: the same output, exit 0.
    for extra in [
        vec!["--disable-loan-message"],
        vec!["--wait-for-all-acked", "0"],
        vec!["--wait-for-all-acked", "250", "--disable-loan-message"],
    ] {
        let mut cmd = vec!["play", b, "--sink", "echo"];
        cmd.extend(extra.iter().copied());
        let o = run(&cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        assert_eq!(played(&o), played(&plain), "{cmd:?}");
    }
    let never = tmp.path().join("never");
    assert_bad_input(
        &["play", b, "--sink", "echo", "--wait-for-all-acked", "-5"],
        &["--wait-for-all-acked -5: must be 0"],
        &never,
    );
    // --clock-topics: /clock with the message's time right before each message of those
    // topics (the bag's names, before --remap); --clock-topics-all: before every message.
    for (extra, before) in [
        (vec!["--clock-topics", "a"], vec!["/a"]),
        (vec!["--clock-topics-all"], vec!["/a", "/b"]),
        (vec!["--clock-topics", "/b", "-m", "/b:=/c"], vec!["/c"]),
    ] {
        let mut cmd = vec!["play", b, "--sink", "echo"];
        cmd.extend(extra.iter().copied());
        let o = run(&cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        let lines = played(&o);
        let msgs: Vec<&String> = lines.iter().filter(|l| !l.contains(" /clock ")).collect();
        assert_eq!(msgs.len(), 10, "{cmd:?}: {lines:?}");
        let mut expect = Vec::new();
        for m in &msgs {
            let (bag_ns, rest) = m.split_once(' ').unwrap();
            let topic = rest.split(' ').next().unwrap();
            if before.contains(&topic) {
                expect.push(format!("{bag_ns} /clock rosgraph_msgs/msg/Clock 12"));
            }
            expect.push(m.to_string());
        }
        assert_eq!(lines, expect, "{cmd:?}");
    }
}

#[test]
fn list_prints_the_plugins_as_ros2_bag_list_does() {
    for (kind, want) in [
        ("storage", "sqlite3\n"),
        ("compressor", "zstd\n"),
        ("decompressor", "zstd\n"),
        ("converter", ""),
    ] {
        let o = run(&["list", kind]);
        assert!(o.status.success(), "{kind}: {}", stderr(&o));
        assert_eq!(stdout(&o), want, "{kind}");
        assert!(o.stderr.is_empty(), "{kind}: {}", stderr(&o));
    }
    let o = run(&["list", "-v", "storage"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.starts_with("available storage plugins are:\nname: sqlite3\n\t"),
        "{text}"
    );
    let o = run(&["list", "mcap"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));
}

// ---------------------------------------------------------------------------------------------
// The parity table against the real Jazzy

/// The long flags (`--x`) of a `--help` text: every `--name` token in it.
fn long_flags(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = help.as_bytes();
    let mut i = 0;
    while let Some(at) = help[i..].find("--") {
        let start = i + at;
        let mut end = start + 2;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'-') {
            end += 1;
        }
        // `--` alone, or a hyphenated word cut by argparse's wrapping (`--all-` / `topics`),
        // is not a flag: a flag starts after a space, `[`, `(`, `,` or a line start.
        let before = if start == 0 { b' ' } else { bytes[start - 1] };
        let name = &help[start..end];
        if end > start + 2
            && !name.ends_with('-')
            && matches!(before, b' ' | b'[' | b'(' | b',' | b'\n' | b'`')
        {
            out.insert(name.to_string());
        }
        i = end.max(start + 2);
    }
    out
}

/// The README's parity table rows for `cmd` (`record` or `play`): the first cell's flags,
/// mapped to the second cell (ringbag's equivalent).
fn parity_rows(readme: &str, cmd: &str) -> Vec<(BTreeSet<String>, String)> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("`ros2 bag` parity"))
        .expect("README has a \"## `ros2 bag` parity\" section");
    let heading = format!("\n### `ros2 bag {cmd}`");
    let table = section
        .split_once(&heading)
        .unwrap_or_else(|| panic!("the parity section has a {heading:?} table"))
        .1;
    let table = table.split("\n### ").next().unwrap_or(table);
    table
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|--") && !l.starts_with("| ---"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let (first, second) = (cells.get(1)?, cells.get(2)?);
            Some((long_flags(first), second.to_string()))
        })
        .filter(|(flags, _)| !flags.is_empty())
        .collect()
}

/// The Jazzy `ros2 bag <cmd> --help`, or None (with the reason) when no Jazzy is at hand.
/// Under scripts/ros-test.sh jazzy the sourced environment is used; elsewhere
/// /opt/ros2-jazzy or /opt/ros/jazzy is sourced in a subshell.
fn jazzy_help(cmd: &str) -> Result<String, String> {
    let sourced = std::env::var("ROS_DISTRO").is_ok_and(|d| d == "jazzy");
    let script = if sourced {
        format!("ros2 bag {cmd} --help")
    } else {
        let setup = ["/opt/ros2-jazzy/setup.bash", "/opt/ros/jazzy/setup.bash"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("no Jazzy (neither ROS_DISTRO=jazzy nor /opt/ros2-jazzy or /opt/ros/jazzy)")?;
        format!("source {setup} >/dev/null 2>&1 && ros2 bag {cmd} --help")
    };
    use crate::common::RunOutput;
    let o = std::process::Command::new("bash")
        .args(["-c", &script])
        .run_output()
        .map_err(|e| format!("bash: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "`{script}` failed ({}): {}",
            o.status,
            stderr(&o).trim()
        ));
    }
    Ok(stdout(&o))
}

/// Every flag of the real Jazzy `ros2 bag record/play --help` has a row in the README's parity
/// table; a row that names a ringbag flag (anything but "not yet") names one that
/// `ringbag record/play --help` has. Skips with a SKIP line without Jazzy, unless
/// RINGBAG_ROS_REQUIRED is set (scripts/ros-test.sh sets it).
#[test]
fn every_jazzy_record_and_play_flag_has_a_parity_row_that_holds() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let required = std::env::var_os("RINGBAG_ROS_REQUIRED").is_some();
    for cmd in ["record", "play"] {
        let rows = parity_rows(&readme, cmd);
        let ours = run(&[cmd, "--help"]);
        assert!(ours.status.success(), "{}", stderr(&ours));
        let ours = long_flags(&stdout(&ours));
        // The table's own claims hold whether or not Jazzy is here.
        for (flags, equivalent) in &rows {
            let claimed = long_flags(equivalent);
            for f in &claimed {
                assert!(
                    ours.contains(f),
                    "README parity row {flags:?} ({cmd}) names {f}, which `ringbag {cmd} --help` lacks"
                );
            }
        }
        let jazzy = match jazzy_help(cmd) {
            Ok(h) => h,
            Err(why) if !required => {
                println!(
                    "SKIP every_jazzy_record_and_play_flag_has_a_parity_row_that_holds: {why}"
                );
                return;
            }
            Err(why) => panic!("RINGBAG_ROS_REQUIRED is set: {why}"),
        };
        let jazzy = long_flags(&jazzy);
        assert!(
            jazzy.contains("--output") || jazzy.contains("--rate"),
            "not a ros2 bag {cmd} help: {jazzy:?}"
        );
        let covered: BTreeSet<&String> = rows.iter().flat_map(|(f, _)| f).collect();
        let missing: Vec<&String> = jazzy.iter().filter(|f| !covered.contains(f)).collect();
        assert!(
            missing.is_empty(),
            "Jazzy `ros2 bag {cmd}` flags without a row in the README's parity table: {missing:?}"
        );
    }
}

#[test]
fn long_flags_reads_argparse_and_clap_help() {
    let argparse = "usage: x [-h] [--topics Topic [Topic ...]]\n  --exclude-regex X  Works on \
                    top of --all, --all-\n                        topics, --topics\n";
    let got: Vec<String> = long_flags(argparse).into_iter().collect();
    assert_eq!(got, ["--all", "--exclude-regex", "--topics"]);
    let clap = "  -a, --all  Record all topics [aliases: --all-topics]\n";
    let got: Vec<String> = long_flags(clap).into_iter().collect();
    assert_eq!(got, ["--all", "--all-topics"]);
}

#[test]
fn storage_config_file_applies_safe_write_pragmas_and_refuses_the_rest_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("sqlite.yaml");
    let c = cfg.to_str().unwrap();
    std::fs::write(
        &cfg,
        "write:\n  pragmas: [\"synchronous = NORMAL\", \"cache_size = -16384\"]\n",
    )
    .unwrap();
    let bag = tmp.path().join("ok");
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "300",
        "--log-level",
        "error",
        "--storage-config-file",
        c,
        "-o",
        bag.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b = ringbag::bag::reader::Bag::open(&bag).expect("open");
    assert_eq!(b.metadata.message_count, 300);

    let never = tmp.path().join("never");
    let n = never.to_str().unwrap();
    for (pragma, preset, says) in [
        (
            "journal_mode = MEMORY",
            "write-optimized",
            "the journal is the storage preset's",
        ),
        (
            "synchronous = OFF",
            "resilient",
            "weaker than the resilient preset's synchronous=NORMAL",
        ),
        ("page_size = 8192", "write-optimized", "page size"),
        (
            "wal_autocheckpoint = 0",
            "resilient",
            "not one ringbag knows",
        ),
    ] {
        std::fs::write(&cfg, format!("write:\n  pragmas: [\"{pragma}\"]\n")).unwrap();
        let args = [
            "record",
            "--source",
            "synthetic",
            "--storage-preset-profile",
            preset,
            "--storage-config-file",
            c,
            "-o",
            n,
        ];
        assert_bad_input(
            &args,
            &["--storage-config-file ", c, "write: pragma", says],
            &never,
        );
    }
    // play reads: the write section is the recorder's; read pragmas are refused.
    std::fs::write(&cfg, "write:\n  pragmas: [\"journal_mode = OFF\"]\n").unwrap();
    let b = bag.to_str().unwrap();
    let o = run(&["play", b, "--sink", "echo", "--storage-config-file", c]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 300);
    std::fs::write(&cfg, "read:\n  pragmas: [\"cache_size = 100\"]\n").unwrap();
    assert_bad_input(
        &["play", b, "--sink", "echo", "--storage-config-file", c],
        &["read: pragma \"cache_size = 100\": not applied"],
        &never,
    );
}

#[test]
fn record_compression_mode_none_and_its_queue_flags_record_plain_splits() {
    use crate::common::{ringbag, RunOutput};
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("plain");
    let o = ringbag()
        .args([
            "record",
            "--source",
            "synthetic",
            "--synthetic-profile",
            "small",
        ])
        .args(["--synthetic-rate", "max", "--synthetic-count", "20"])
        .args(["--compression-mode", "none", "--compression-threads", "2"])
        .args(["--compression-queue-size", "3", "-o"])
        .arg(&out)
        .run_output()
        .expect("record runs");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = ringbag::bag::BagMetadata::read(&out).unwrap();
    assert_eq!(m.message_count, 20);
    assert!(m.relative_file_paths.iter().all(|r| r.ends_with(".db3")));
    assert_eq!(
        (m.compression_format.as_str(), m.compression_mode.as_str()),
        ("", "")
    );
}

/// `record --compression-mode file --compression-format zstd` (ros2 bag's flags, through the
/// command line): every split of the finished bag is a `.db3.zstd`, listed as rosbag2 lists
/// them, every message there.
#[test]
fn record_compression_mode_file_records_zstd_splits_as_rosbag2_does() {
    use crate::common::{ringbag, RunOutput};
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("z");
    let o = ringbag()
        .args([
            "record",
            "--source",
            "synthetic",
            "--synthetic-profile",
            "medium",
        ])
        .args(["--synthetic-rate", "max", "--synthetic-count", "60"])
        .args(["-b", "100KiB", "--compression-mode", "file"])
        .args(["--compression-format", "zstd", "--compression-threads", "1"])
        .args(["--compression-queue-size", "1", "-o"])
        .arg(&out)
        .run_output()
        .expect("record runs");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = ringbag::bag::BagMetadata::read(&out).unwrap();
    assert_eq!(m.message_count, 60);
    assert!(
        m.relative_file_paths.len() > 1,
        "{:?}",
        m.relative_file_paths
    );
    assert!(
        m.relative_file_paths
            .iter()
            .all(|r| r.ends_with(".db3.zstd")),
        "{:?}",
        m.relative_file_paths
    );
    assert_eq!(
        (m.compression_format.as_str(), m.compression_mode.as_str()),
        ("zstd", "FILE")
    );
    crate::retention::assert_true_and_readable(&out);
}
