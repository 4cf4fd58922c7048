//! `ringbag play` through the echo sink: every flag, the echo formats, bad input, and bags
//! that are damaged or still being recorded. Timing is measured by `scripts/bench.sh`; the
//! checks here are exact or one-sided (a message is never sent before its time).

use crate::common::SpawnExecd;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::Flavour;

use crate::common::{cdr_string, stderr, stdout, topic};

pub const T0: i64 = 1_700_000_000_000_000_000;
pub const MS: i64 = 1_000_000;

/// One message to write: (topic, type, timestamp, bytes).
pub type Msg = (&'static str, &'static str, i64, Vec<u8>);

/// A bag holding `msgs` (in the given order), a new split every `split_every` messages.
pub fn timed_bag(dir: &Path, msgs: &[Msg], split_every: usize) {
    let mut w = BagWriter::create(dir, WriterOptions::new(Flavour::Jazzy)).expect("create bag");
    let mut ids: Vec<(&str, usize)> = Vec::new();
    for (n, (name, ty, ts, data)) in msgs.iter().enumerate() {
        let id = match ids.iter().find(|(t, _)| t == name) {
            Some((_, id)) => *id,
            None => {
                let id = w.add_topic(topic(name, ty), None).expect("add topic");
                ids.push((name, id));
                id
            }
        };
        w.write_batch([(id, *ts, data.as_slice())]).expect("write");
        if split_every > 0 && (n + 1) % split_every == 0 && n + 1 < msgs.len() {
            w.split().expect("split");
        }
    }
    w.finish().expect("finish");
}

pub const STRING: &str = "std_msgs/msg/String";
const IMU: &str = "sensor_msgs/msg/Imu";

/// `n` messages on `/a` (String) and every third one on `/b` (String), `/imu` (Imu) every
/// fifth, `gap_ms` apart from T0.
fn mixed(n: usize, gap_ms: i64) -> Vec<Msg> {
    (0..n)
        .map(|i| {
            let (t, ty) = match i {
                i if i % 5 == 4 => ("/imu", IMU),
                i if i % 3 == 2 => ("/b", STRING),
                _ => ("/a", STRING),
            };
            (
                t,
                ty,
                T0 + i as i64 * gap_ms * MS,
                cdr_string(&format!("{t} {i}")),
            )
        })
        .collect()
}

/// A parsed text echo line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub send_ns: i64,
    pub bag_ns: i64,
    pub topic: String,
    pub type_name: String,
    pub bytes: usize,
}

pub fn lines(out: &str) -> Vec<Line> {
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 5, "not an echo line: {l:?}");
            Line {
                send_ns: f[0].parse().expect("send_ns"),
                bag_ns: f[1].parse().expect("bag_ns"),
                topic: f[2].into(),
                type_name: f[3].into(),
                bytes: f[4].parse().expect("bytes"),
            }
        })
        .collect()
}

/// `ringbag play BAG --sink echo ARGS` (killed after 60 s), stdin empty.
fn play(bag: &Path, args: &[&str]) -> Output {
    // The bag first: `--topics` and `--remap` take every value up to the next flag.
    let mut all = vec!["play", bag.to_str().unwrap(), "--sink", "echo"];
    all.extend_from_slice(args);
    crate::common::wait_deadline(crate::common::spawn(&all), 60)
        .unwrap_or_else(|| panic!("play {args:?} ran past 60 s"))
}

fn ok(o: &Output) -> Vec<Line> {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    lines(&stdout(o))
}

/// Which messages of a bag a case expects.
type Keep = Box<dyn Fn(&Msg) -> bool>;
/// (topic, bag_ns) in play order.
type Played = Vec<(String, i64)>;

/// (topic, bag_ns) of each played line that is not /clock.
fn played(l: &[Line]) -> Vec<(String, i64)> {
    l.iter()
        .filter(|l| l.topic != "/clock")
        .map(|l| (l.topic.clone(), l.bag_ns))
        .collect()
}

fn expected(msgs: &[Msg], keep: impl Fn(&Msg) -> bool) -> Vec<(String, i64)> {
    msgs.iter()
        .filter(|m| keep(m))
        .map(|m| (m.0.to_string(), m.2))
        .collect()
}

/// The schedule's anchor from `--log-level debug`: (monotonic ns, bag ns, rate).
fn anchor(err: &str) -> (i64, i64, f64) {
    let l = err
        .lines()
        .find_map(|l| l.strip_prefix("ringbag: debug: schedule (start): bag "))
        .unwrap_or_else(|| panic!("no schedule line in {err}"));
    let f: Vec<&str> = l.split(' ').collect();
    (
        f[4].parse().unwrap(),
        f[0].parse().unwrap(),
        f[7].parse().unwrap(),
    )
}

fn monotonic_ns() -> i64 {
    ringbag::play::monotonic_ns()
}

fn bag_of(tmp: &Path, name: &str, msgs: &[Msg], split_every: usize) -> PathBuf {
    let p = tmp.join(name);
    timed_bag(&p, msgs, split_every);
    p
}

#[test]
fn echo_lines_carry_send_time_bag_time_topic_type_and_size_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(30, 1);
    let bag = bag_of(tmp.path(), "b", &msgs, 7);
    let before = monotonic_ns();
    let o = play(&bag, &[]);
    let l = ok(&o);
    assert_eq!(stderr(&o), "ringbag: played 30 messages\n");
    assert_eq!(l.len(), 30);
    for (line, m) in l.iter().zip(&msgs) {
        assert_eq!(
            (
                line.bag_ns,
                line.topic.as_str(),
                line.type_name.as_str(),
                line.bytes
            ),
            (m.2, m.0, m.1, m.3.len())
        );
        assert!(line.send_ns >= before);
    }
    assert!(l.windows(2).all(|w| w[0].send_ns <= w[1].send_ns));
}

#[test]
fn jsonl_lines_carry_the_same_fields_and_the_bytes_as_hex() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(12, 1);
    let bag = bag_of(tmp.path(), "j", &msgs, 0);
    let o = play(&bag, &["--echo-format", "jsonl", "-r", "100"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(got.len(), msgs.len());
    for (v, m) in got.iter().zip(&msgs) {
        let hex: String = m.3.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(v["bag_ns"], m.2);
        assert_eq!(v["topic"], m.0);
        assert_eq!(v["type"], m.1);
        assert_eq!(v["bytes"], m.3.len());
        assert_eq!(v["data_hex"], hex);
        assert!(v["send_ns"].as_i64().unwrap() > 0);
    }
}

#[test]
fn topic_filters_select_exactly_as_ros2_bag_play() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(40, 1);
    let bag = bag_of(tmp.path(), "f", &msgs, 9);
    let cases: Vec<(Vec<&str>, Keep)> = vec![
        (vec!["--topics", "/a", "imu"], Box::new(|m| m.0 != "/b")),
        (vec!["-e", "^/(a|b)$"], Box::new(|m| m.0 != "/imu")),
        // --topics and -e add up.
        (
            vec!["--topics", "/imu", "-e", "^/b"],
            Box::new(|m| m.0 != "/a"),
        ),
        (vec!["-x", "^/(a|imu)$"], Box::new(|m| m.0 == "/b")),
        (
            vec!["--exclude-topics", "/a", "/b"],
            Box::new(|m| m.0 == "/imu"),
        ),
        // Exclusion wins over inclusion.
        (
            vec!["-e", ".", "--exclude-topics", "/b", "-x", "mu"],
            Box::new(|m| m.0 == "/a"),
        ),
    ];
    for (args, keep) in cases {
        let mut a = args.clone();
        a.extend(["-r", "100"]);
        let l = ok(&play(&bag, &a));
        assert_eq!(played(&l), expected(&msgs, keep), "{args:?}");
    }
}

#[test]
fn a_named_topic_the_bag_lacks_is_a_warning_and_the_rest_plays() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(10, 1);
    let bag = bag_of(tmp.path(), "n", &msgs, 0);
    let o = play(&bag, &["--topics", "/a", "/nope"]);
    let l = ok(&o);
    assert_eq!(played(&l), expected(&msgs, |m| m.0 == "/a"));
    assert_eq!(
        stderr(&o),
        "ringbag: warn: --topics /nope: the bag has no such topic\nringbag: played 5 messages\n"
    );
}

#[test]
fn filters_that_match_no_topic_warn_with_the_bags_topics_and_exit_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = bag_of(tmp.path(), "z", &mixed(10, 1), 0);
    for args in [
        &["-e", "^/nothing"][..],
        &["--topics", "/nope"][..],
        &["-x", "."][..],
    ] {
        let o = play(&bag, args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(stdout(&o).is_empty(), "{args:?}");
        let err = stderr(&o);
        assert!(
            err.contains(
                "ringbag: warn: no topic of the bag matches the topic filters; nothing played. \
                 The bag's topics: /a [std_msgs/msg/String], /b [std_msgs/msg/String], \
                 /imu [sensor_msgs/msg/Imu]\n"
            ),
            "{args:?}: {err}"
        );
        assert!(err.ends_with("ringbag: played 0 messages\n"), "{err}");
    }
}

#[test]
fn remap_publishes_under_the_new_names_and_merges_topics_of_one_type() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(20, 1);
    let bag = bag_of(tmp.path(), "m", &msgs, 6);
    let l = ok(&play(
        &bag,
        &["-m", "/a:=/x", "-m", "b:=/x", "/imu:=/sensors/imu"],
    ));
    let want: Vec<(String, i64)> = msgs
        .iter()
        .map(|m| {
            let name = match m.0 {
                "/imu" => "/sensors/imu",
                _ => "/x",
            };
            (name.to_string(), m.2)
        })
        .collect();
    assert_eq!(played(&l), want);
    assert!(l
        .iter()
        .all(|l| (l.topic == "/x") == (l.type_name == STRING)));
    // Filters name the bag's topics, before the remap.
    let l = ok(&play(&bag, &["--topics", "/imu", "-m", "/imu:=/i"]));
    assert!(l.iter().all(|l| l.topic == "/i") && l.len() == 4);
}

#[test]
fn start_offset_duration_and_until_bound_what_plays() {
    let tmp = tempfile::tempdir().unwrap();
    // 50 messages 10 ms apart: the bag spans 490 ms.
    let msgs = mixed(50, 10);
    let bag = bag_of(tmp.path(), "w", &msgs, 11);
    let within = |lo: i64, hi: i64| expected(&msgs, move |m| m.2 >= T0 + lo && m.2 <= T0 + hi);
    let cases: Vec<(Vec<String>, Played)> = vec![
        (
            vec!["--start-offset".into(), "0.2".into()],
            within(200 * MS, i64::MAX / 2),
        ),
        (
            vec!["--playback-duration".into(), "0.1".into()],
            within(0, 100 * MS),
        ),
        (
            vec![
                "--start-offset".into(),
                "200ms".into(),
                "--playback-duration".into(),
                "0.05".into(),
            ],
            within(200 * MS, 250 * MS),
        ),
        (
            vec!["--playback-until-nsec".into(), (T0 + 120 * MS).to_string()],
            within(0, 120 * MS),
        ),
        (
            vec!["--playback-until-sec".into(), "1700000000.3".into()],
            within(0, 300 * MS),
        ),
        // The earlier of duration and until ends playback.
        (
            vec![
                "--playback-duration".into(),
                "0.4".into(),
                "--playback-until-nsec".into(),
                (T0 + 150 * MS).to_string(),
            ],
            within(0, 150 * MS),
        ),
        // The offset may reach the end exactly: the last message plays.
        (
            vec!["--start-offset".into(), "0.49".into()],
            within(490 * MS, 490 * MS),
        ),
    ];
    for (args, want) in cases {
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["-r", "20"]);
        let l = ok(&play(&bag, &a));
        assert_eq!(played(&l), want, "{args:?}");
    }
}

#[test]
fn no_message_is_sent_before_its_time_at_any_rate() {
    let tmp = tempfile::tempdir().unwrap();
    // 40 messages 10 ms apart.
    let msgs = mixed(40, 10);
    let bag = bag_of(tmp.path(), "r", &msgs, 13);
    for rate in ["0.5", "1", "4"] {
        let o = play(&bag, &["--log-level", "debug", "-r", rate]);
        let l = ok(&o);
        assert_eq!(l.len(), 40);
        let (wall, bag0, r) = anchor(&stderr(&o));
        assert_eq!(r, rate.parse::<f64>().unwrap());
        assert_eq!(bag0, T0);
        for line in &l {
            let due = wall + ((line.bag_ns - bag0) as f64 / r) as i64;
            assert!(
                line.send_ns >= due,
                "rate {rate}: {line:?} sent {} ns before its time",
                due - line.send_ns
            );
        }
    }
}

#[test]
fn delay_postpones_the_first_message() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = bag_of(tmp.path(), "d", &mixed(3, 1), 0);
    let before = monotonic_ns();
    let l = ok(&play(&bag, &["-d", "0.3"]));
    assert_eq!(l.len(), 3);
    assert!(
        l[0].send_ns - before >= 300 * MS,
        "first message {} ms after the start",
        (l[0].send_ns - before) / MS
    );
}

#[test]
fn loop_plays_the_bag_again_until_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(10, 1);
    let bag = bag_of(tmp.path(), "l", &msgs, 4);
    let mut child = crate::common::ringbag()
        .args(["play", "--sink", "echo", "-l", "-r", "10"])
        .arg(&bag)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .unwrap();
    let pid = child.id();
    let out = crate::play_keys::Collected::from(child.stdout.take().unwrap());
    out.wait_for("three passes", |s| s.lines().count() >= 30);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = crate::common::wait_deadline(child, 10).expect("SIGINT ends a loop");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let l = lines(&out.finish());
    let n = l.len();
    assert!(n >= 30);
    // Pass after pass, the same messages in the same order.
    for (i, line) in l.iter().enumerate() {
        let m = &msgs[i % 10];
        assert_eq!((line.topic.as_str(), line.bag_ns), (m.0, m.2), "line {i}");
    }
    assert_eq!(stderr(&o), format!("ringbag: played {n} messages\n"));
}

#[test]
fn clock_publishes_the_playback_time_as_rosgraph_clock() {
    let tmp = tempfile::tempdir().unwrap();
    // 31 messages 10 ms apart: 0.3 s.
    let msgs = mixed(31, 10);
    let bag = bag_of(tmp.path(), "c", &msgs, 0);
    for args in [&["--clock", "100"][..], &["--clock"][..]] {
        let mut a = args.to_vec();
        a.extend(["--echo-format", "jsonl"]);
        let o = play(&bag, &a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: Vec<serde_json::Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let clock: Vec<&serde_json::Value> = v.iter().filter(|v| v["topic"] == "/clock").collect();
        assert_eq!(v.len() - clock.len(), 31, "every message still plays");
        assert!(clock.len() >= 2, "{args:?} over 0.3 s: {}", clock.len());
        let mut last = i64::MIN;
        for c in &clock {
            assert_eq!(c["type"], "rosgraph_msgs/msg/Clock");
            assert_eq!(c["bytes"], 12);
            let t = c["bag_ns"].as_i64().unwrap();
            assert!((T0..=T0 + 300 * MS).contains(&t), "{t} outside the bag");
            assert!(t >= last, "the clock never goes back");
            last = t;
            let hex = c["data_hex"].as_str().unwrap();
            let b: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(&b[..4], &[0, 1, 0, 0]);
            let sec = i32::from_le_bytes(b[4..8].try_into().unwrap()) as i64;
            let nsec = u32::from_le_bytes(b[8..12].try_into().unwrap()) as i64;
            assert_eq!(sec * 1_000_000_000 + nsec, t);
        }
    }
}

#[test]
fn tiny_read_ahead_bounds_still_play_everything_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(60, 0);
    let bag = bag_of(tmp.path(), "q", &msgs, 7);
    for args in [
        &["--read-ahead-queue-size", "1"][..],
        &["--read-ahead-queue-bytes", "1"][..],
        &[
            "--read-ahead-queue-size",
            "2",
            "--read-ahead-queue-bytes",
            "1KiB",
        ][..],
    ] {
        let l = ok(&play(&bag, args));
        assert_eq!(played(&l), expected(&msgs, |_| true), "{args:?}");
    }
}

#[test]
fn rt_priority_plays_everything_or_says_in_one_line_why_it_cannot() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(20, 1);
    let bag = bag_of(tmp.path(), "rt", &msgs, 0);
    let o = play(&bag, &["--rt-priority", "5"]);
    assert_eq!(played(&ok(&o)), expected(&msgs, |_| true));
    // Root (as in CI) may use SCHED_FIFO; an unprivileged user gets one warning.
    let err = stderr(&o);
    let warned = err.starts_with("ringbag: warn: --rt-priority 5: cannot run SCHED_FIFO (");
    assert_eq!(err.lines().count(), 1 + usize::from(warned), "{err}");
    assert!(err.ends_with("ringbag: played 20 messages\n"), "{err}");
}

#[test]
fn a_qos_override_file_is_read_and_a_bad_one_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = bag_of(tmp.path(), "o", &mixed(5, 1), 0);
    let good = tmp.path().join("good.yaml");
    fs::write(&good, "/a:\n  reliability: best_effort\n  depth: 3\n").unwrap();
    let l = ok(&play(
        &bag,
        &["--qos-profile-overrides-path", good.to_str().unwrap()],
    ));
    assert_eq!(l.len(), 5);
    let bad = tmp.path().join("bad.yaml");
    fs::write(&bad, "/a:\n  reliability: sometimes\n").unwrap();
    let o = play(
        &bag,
        &["--qos-profile-overrides-path", bad.to_str().unwrap()],
    );
    assert_one_error(&o, "--qos-profile-overrides-path: QoS overrides ");
}

/// Exit 2 and one line on stderr that starts with `ringbag: error: ` and contains `want`.
fn assert_one_error(o: &Output, want: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("ringbag: error: ") && err.contains(want),
        "{err}"
    );
    assert!(stdout(o).is_empty());
}

#[test]
fn bad_input_is_one_line_and_exit_two() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(20, 10); // 190 ms
    let bag = bag_of(tmp.path(), "x", &msgs, 0);
    let not_sqlite = tmp.path().join("junk_0.db3");
    fs::write(&not_sqlite, vec![7u8; 10_000]).unwrap();
    let all_damaged = tmp.path().join("dmg");
    fs::create_dir(&all_damaged).unwrap();
    fs::write(all_damaged.join("dmg_0.db3"), vec![7u8; 10_000]).unwrap();
    let b = bag.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["/nonexistent/bag"], "/nonexistent/bag: no such file or directory"),
        (vec![not_sqlite.to_str().unwrap()], "not a SQLite database"),
        (
            vec![all_damaged.to_str().unwrap()],
            "dmg: no split is readable (",
        ),
        (vec![b, "-r", "0"], "--rate 0: must be a number greater than 0"),
        (vec![b, "-r", "-1"], "--rate -1: must be a number greater than 0"),
        (vec![b, "-r", "NaN"], "--rate NaN: must be a number greater than 0"),
        (vec![b, "-r", "inf"], "--rate inf: must be a number greater than 0"),
        (
            vec![b, "--start-offset", "0.2"],
            "--start-offset 0.200 s: past the end of the bag (0.190 s long)",
        ),
        (vec![b, "-m", "/a"], "--remap /a: expected OLD:=NEW (two topic names)"),
        (vec![b, "-m", ":=/x"], "--remap :=/x: invalid topic name"),
        (
            vec![b, "-m", "/imu:=/a"],
            "--remap: /a [std_msgs/msg/String] and /imu [sensor_msgs/msg/Imu] would both be published as /a; a topic has one type",
        ),
        (
            vec![b, "-m", "/a:=/x", "-m", "/a:=/y"],
            "--remap /a:=/y: /a is already remapped to /x",
        ),
        (
            vec![b, "--playback-until-nsec", "1699999999999999999"],
            "--playback-until: 1699999999.999999999 s is before the start of playback (1700000000.000000000 s",
        ),
        (
            vec![b, "--start-offset", "0.1", "--playback-until-sec", "1700000000.05"],
            "before the start of playback (1700000000.100000000 s: the bag's start + --start-offset)",
        ),
        (vec![b, "--playback-until-sec", "-1"], "is before the start of playback"),
        (vec![b, "--playback-duration", "-1"], "--playback-duration: `-1`: a duration cannot be negative"),
        (vec![b, "-d", "-1"], "--delay: `-1`: a duration cannot be negative"),
        (vec![b, "--clock", "0"], "--clock 0: must be a number of Hz greater than 0"),
        (vec![b, "--read-ahead-queue-size", "0"], "--read-ahead-queue-size 0: must be at least 1"),
        (vec![b, "--read-ahead-queue-bytes", "0"], "--read-ahead-queue-bytes 0: must be greater than 0"),
        (vec![b, "-e", "("], "-e/--regex \"(\": invalid regular expression"),
        (
            vec![b, "--clock", "-m", "/a:=/clock"],
            "--clock: the bag's topic /a would be published as /clock too",
        ),
        (vec![b, "-p"], "--start-paused needs the keyboard controls"),
        (vec![b, "--rt-priority", "0"], "--rt-priority 0: must be 1 to 99 (SCHED_FIFO priorities)"),
        (vec![b, "--rt-priority", "100"], "--rt-priority 100: must be 1 to 99"),
    ];
    for (args, want) in cases {
        let mut all = vec!["play", "--sink", "echo"];
        all.extend(&args);
        let o = crate::common::wait_deadline(crate::common::spawn(&all), 30).expect("ends");
        assert_one_error(&o, want);
    }
}

/// Overwrite `len` bytes of `file` at `at` with a pattern SQLite cannot read as a page.
fn smash(file: &Path, at: u64, len: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = fs::OpenOptions::new().write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&vec![0xa5; len]).unwrap();
}

#[test]
fn a_damaged_split_is_skipped_with_one_warning_and_the_rest_plays() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(30, 1);
    let bag = bag_of(tmp.path(), "d", &msgs, 10);
    let victim = bag.join("d_1.db3");
    // The header: not a database any more.
    smash(&victim, 0, 100);
    let o = play(&bag, &[]);
    let l = ok(&o);
    let want: Vec<(String, i64)> = msgs
        .iter()
        .enumerate()
        .filter(|(i, _)| !(10..20).contains(i))
        .map(|(_, m)| (m.0.to_string(), m.2))
        .collect();
    assert_eq!(played(&l), want);
    assert_eq!(
        stderr(&o),
        format!(
            "ringbag: warn: skipped {}: not a SQLite database (or its header is damaged)\nringbag: played 20 messages\n",
            victim.display()
        )
    );
}

/// A split refused as hostile (a view, an over-long value, too many topics) was left out
/// with a warning and the rest played, exit 0, while `info` refused the bag. It is bad
/// input for `play` too: one line, exit 2, nothing played.
#[test]
fn a_bag_with_one_hostile_split_is_refused_not_played_in_part() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (sql, want)) in [
        (
            "ALTER TABLE topics RENAME TO t; CREATE VIEW topics AS SELECT * FROM t;",
            "`topics` is a view, not a table",
        ),
        (
            "UPDATE topics SET name = printf('%.*c', 5000, 'x');",
            "a topic name is longer than 4096 characters",
        ),
        (
            "UPDATE topics SET offered_qos_profiles = printf('%.*c', 20000000, 'x');",
            "`topics`.offered_qos_profiles holds a value longer than",
        ),
        (
            "INSERT INTO topics (name, type, serialization_format, offered_qos_profiles, \
               type_description_hash) \
             WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 100001) \
             SELECT '/t' || n, 't/msg/T', 'cdr', '', '' FROM r;",
            "`topics` has more than 100000 rows",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let msgs = mixed(30, 1);
        let bag = bag_of(tmp.path(), &format!("h{i}"), &msgs, 10);
        let victim = bag.join(format!("h{i}_1.db3"));
        rusqlite::Connection::open(&victim)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
        let o = play(&bag, &[]);
        assert_one_error(&o, want);
        assert!(
            stderr(&o).contains(&format!("{}", victim.display())),
            "{}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains("not a rosbag2 split; not read"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_split_damaged_part_way_plays_up_to_the_damage_then_the_next_split() {
    let tmp = tempfile::tempdir().unwrap();
    // Messages of ~3 KiB, so the first split spans many pages.
    let msgs: Vec<Msg> = (0..120)
        .map(|i| {
            (
                "/a",
                STRING,
                T0 + i * MS,
                cdr_string(&"x".repeat(3000 + i as usize)),
            )
        })
        .collect();
    let bag = bag_of(tmp.path(), "p", &msgs, 100);
    let victim = bag.join("p_0.db3");
    let len = fs::metadata(&victim).unwrap().len();
    // A page two thirds into the file: the table's leaves and overflow pages are there.
    smash(&victim, (len * 2 / 3) / 4096 * 4096, 4096);
    let o = play(&bag, &[]);
    let l = ok(&o);
    let err = stderr(&o);
    let got = played(&l);
    let n = got.len();
    assert!((20..120).contains(&n), "played {n}: {err}");
    // What played is in order, a prefix of the damaged split and all of the next one.
    let tail: Vec<(String, i64)> = expected(&msgs[100..], |_| true);
    assert_eq!(&got[n - 20..], &tail[..], "{err}");
    let head = &got[..n - 20];
    assert_eq!(head, &expected(&msgs[..head.len()], |_| true)[..]);
    let warn = format!(
        "ringbag: warn: skipped the rest of {} after {} messages (the last at {} ns): ",
        victim.display(),
        head.len(),
        msgs[head.len() - 1].2
    );
    assert!(err.starts_with(&warn), "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
}

#[test]
fn a_bag_still_being_recorded_plays_its_unlisted_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(30, 1);
    let bag = bag_of(tmp.path(), "r", &msgs, 10);
    // As ringbag's recorder leaves it while recording: metadata.yaml from the first moment,
    // listing the first split only.
    let mut meta = ringbag::bag::BagMetadata::read(&bag).unwrap();
    meta.relative_file_paths.truncate(1);
    meta.files.truncate(1);
    meta.write_atomic(&bag, Flavour::Jazzy).unwrap();
    let o = play(&bag, &[]);
    assert_eq!(played(&ok(&o)), expected(&msgs, |_| true));
    assert_eq!(stderr(&o), "ringbag: played 30 messages\n");
    // `info` still says what is going on, and sends to `reindex` only a bag whose recorder
    // is gone (reindex refuses one whose lock is held).
    let info = || {
        let o = crate::common::run(&["info", bag.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        stderr(&o)
    };
    let head = format!(
        "ringbag: error: {}: does not list r_1.db3 (",
        bag.join("metadata.yaml").display()
    );
    let interrupted = format!("{head}recording interrupted; run `ringbag reindex`)\n");
    assert_eq!(info(), interrupted);
    let lock = ringbag::bag::lock::BagLock::acquire(&bag).unwrap();
    assert_eq!(
        info(),
        format!(
            "{head}recording in progress: a running recorder holds the bag's lock and lists \
             each split once it is closed; `ringbag play` reads it meanwhile)\n"
        )
    );
    // Released without a clean finish: the marker stays, as after a crash.
    drop(lock);
    assert_eq!(info(), interrupted);
}

#[test]
fn a_listed_split_that_is_gone_or_has_a_leftover_wal_is_skipped_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(30, 1);
    let bag = bag_of(tmp.path(), "g", &msgs, 10);
    fs::remove_file(bag.join("g_0.db3")).unwrap();
    let c = rusqlite::Connection::open(bag.join("g_2.db3")).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; DELETE FROM messages WHERE id < 0;")
        .unwrap();
    c.execute(
        "INSERT INTO messages (topic_id, timestamp, data) SELECT topic_id, timestamp + 1, data FROM messages LIMIT 1",
        [],
    )
    .unwrap();
    let o = play(&bag, &[]);
    let l = ok(&o);
    drop(c);
    assert_eq!(played(&l), expected(&msgs[10..20], |_| true));
    let err = stderr(&o);
    assert_eq!(
        err,
        format!(
            "ringbag: warn: skipped {}: listed in metadata.yaml but missing\n\
             ringbag: warn: skipped {}: has a -wal of an interrupted recording; run `ringbag reindex` to apply it\n\
             ringbag: played 10 messages\n",
            bag.join("g_0.db3").display(),
            bag.join("g_2.db3").display()
        )
    );
}

#[test]
fn a_split_deleted_after_the_bag_was_opened_is_skipped_and_the_rest_reads() {
    // A live recording's retention deletes its oldest split between `play` opening the bag
    // and reading it (or between two `--loop` passes).
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(30, 1);
    let bag = bag_of(tmp.path(), "d", &msgs, 10);
    let (opened, skipped) = ringbag::bag::reader::Bag::open_tolerant(&bag).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let victim = bag.join("d_0.db3");
    fs::remove_file(&victim).unwrap();
    let filter = ringbag::bag::reader::ReadFilter::default();
    let mut it = opened.messages_tolerant(&filter).unwrap();
    let read: Vec<i64> = it.by_ref().map(|m| m.unwrap().timestamp).collect();
    let want: Vec<i64> = msgs[10..].iter().map(|m| m.2).collect();
    assert_eq!(read, want);
    let skipped = it.take_skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].path, victim);
    assert_eq!(skipped[0].reason, "deleted since the bag was opened");
    // A strict read still says what is wrong.
    let e = opened.messages(&filter).err().expect("strict read fails");
    assert_eq!(
        e.to_string(),
        format!("{}: no such file or directory", victim.display())
    );
}

#[test]
fn play_of_a_bag_whose_recording_deletes_its_splits_meanwhile_never_fails() {
    // A live recording with `--max-bag-files` deletes its oldest split every few dozen ms:
    // each `play` opens the bag, lists it and reads it while splits vanish under it. Before
    // the fix, about one play in two ended with exit 2, "…_N.db3: no such file or directory".
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("live");
    let status = tmp.path().join("status.json");
    // --synthetic-count: ends by itself (~35 s) should this test die before killing it.
    let mut rec = crate::common::ringbag()
        .args(["--log-level", "warn", "record", "--source", "synthetic"])
        .args(["--synthetic-profile", "robot", "--synthetic-count", "20000"])
        .args(["-b", "4MiB", "--max-bag-files", "4", "--clock", "system"])
        .arg("--status-file")
        .arg(&status)
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn_execd()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let splits = || -> u64 {
        let text = fs::read_to_string(&status).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text)
            .map_or(0, |v| v["splits"].as_u64().unwrap_or(0))
    };
    while splits() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "no 5th split within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let first = splits();
    let mut plays = 0;
    while plays < 12 || splits() < first + 8 {
        let o = play(&out, &[]);
        let err = stderr(&o);
        let l = ok(&o);
        // On a slow machine (qemu) retention can delete every split a play listed before it
        // reaches them; then it plays nothing, and must say why.
        assert!(
            !l.is_empty() || err.contains(": deleted since the bag was opened"),
            "played nothing, without saying why: {err}"
        );
        assert!(
            l.windows(2).all(|w| w[0].bag_ns <= w[1].bag_ns),
            "out of order: {err}"
        );
        for line in err.lines() {
            assert!(
                line.starts_with("ringbag: played ")
                    || (line.starts_with("ringbag: warn: skipped ")
                        && (line.ends_with(": deleted since the bag was opened")
                            || line.ends_with(": listed in metadata.yaml but missing"))),
                "unexpected: {line}"
            );
        }
        plays += 1;
        assert!(std::time::Instant::now() < deadline + std::time::Duration::from_secs(60));
    }
    rec.kill().unwrap();
    rec.wait().unwrap();
}

#[test]
fn keys_are_off_when_stdin_is_not_a_terminal() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(20, 5);
    let bag = bag_of(tmp.path(), "k", &msgs, 0);
    let mut child = crate::common::ringbag()
        .args(["play", "--sink", "echo"])
        .arg(&bag)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .unwrap();
    // Space and the right arrow, which would pause and step on a terminal.
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b" \x1b[C ");
    drop(stdin);
    let o = crate::common::wait_deadline(child, 30).expect("plays to the end");
    assert_eq!(played(&ok(&o)), expected(&msgs, |_| true));
    assert_eq!(stderr(&o), "ringbag: played 20 messages\n");
}

/// A bag `dir` of `splits` one-message splits (`/a`, String), cheap to make: one split is
/// written, the others are copies of it with their row's timestamp changed, and
/// metadata.yaml lists them all. Split `k`'s message is at `ts(k)`; returns the timestamps
/// in split order.
fn copied_split_bag(dir: &Path, splits: usize, ts: impl Fn(usize) -> i64) -> Vec<i64> {
    use ringbag::bag::metadata::FileInfo;
    timed_bag(dir, &[("/a", STRING, ts(0), cdr_string("m"))], 0);
    let name = dir.file_name().unwrap().to_str().unwrap().to_string();
    let first = dir.join(format!("{name}_0.db3"));
    let mut meta = ringbag::bag::BagMetadata::read(dir).expect("metadata");
    meta.files.clear();
    meta.relative_file_paths.clear();
    let stamps: Vec<i64> = (0..splits).map(&ts).collect();
    for (k, t) in stamps.iter().enumerate() {
        let rel = format!("{name}_{k}.db3");
        if k > 0 {
            fs::copy(&first, dir.join(&rel)).unwrap();
            let c = rusqlite::Connection::open(dir.join(&rel)).unwrap();
            // No journal, no fsync: 2,000 of them would take longer than the test.
            c.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF")
                .unwrap();
            c.execute("UPDATE messages SET timestamp = ?1", [t])
                .unwrap();
        }
        meta.relative_file_paths.push(rel.clone());
        meta.files.push(FileInfo {
            path: rel,
            starting_time_ns: *t,
            duration_ns: 0,
            message_count: 1,
        });
    }
    meta.starting_time_ns = *stamps.iter().min().unwrap();
    meta.duration_ns = stamps.iter().max().unwrap() - meta.starting_time_ns;
    meta.message_count = splits as u64;
    meta.topics[0].message_count = splits as u64;
    meta.write_atomic(dir, Flavour::Jazzy).unwrap();
    stamps
}

/// `ringbag play --sink echo` on `bag` as fast as it goes, with at most `nofile` open files.
fn play_with_nofile(bag: &Path, nofile: u64) -> Output {
    use crate::common::RunOutput;
    use std::os::unix::process::CommandExt;
    let mut cmd = crate::common::ringbag();
    cmd.args(["play", "--sink", "echo", "--rate", "1000000"])
        .arg(bag)
        .env_remove("RINGBAG_LOG");
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent's memory.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.run_output().expect("ringbag runs")
}

/// `play` opened every split of a bag at once: under the usual limit of open files a bag of
/// many splits played a fraction of its messages, with exit 0 and a warning per split it
/// "skipped". Splits are now opened as the merge reaches them, so 500 splits play under
/// a limit of 64 open files: every message, in order, without a warning.
#[test]
fn a_bag_of_hundreds_of_splits_plays_every_message_under_a_small_open_file_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("many");
    // 500: far above the limit, yet quick under qemu (each split is opened three times).
    let stamps = copied_split_bag(&bag, 500, |k| T0 + k as i64 * MS);
    let o = play_with_nofile(&bag, 64);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got: Vec<i64> = lines(&stdout(&o)).iter().map(|l| l.bag_ns).collect();
    assert_eq!(got, stamps, "every message once, in order");
    assert_eq!(
        stderr(&o).trim(),
        "ringbag: played 500 messages",
        "no warning"
    );
}

/// Splits whose time ranges all overlap must be open together to merge them. When the
/// limit of open files does not allow that, it is a failure (exit 1, one line naming the
/// split), never a split silently left out with playback ending "successfully".
#[test]
fn running_out_of_file_descriptors_while_playing_is_an_error_not_a_skipped_split() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("overlap");
    // 40 splits, each with 30 rows interleaved with every other split's (more than a
    // split's first chunk, so none is read to its end at once).
    copied_split_bag(&bag, 40, |k| T0 + k as i64 * MS);
    let name = "overlap";
    for k in 0..40i64 {
        let c = rusqlite::Connection::open(bag.join(format!("{name}_{k}.db3"))).unwrap();
        c.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF")
            .unwrap();
        for j in 1..30i64 {
            c.execute(
                "INSERT INTO messages (topic_id, timestamp, data) \
                 SELECT topic_id, ?1, data FROM messages LIMIT 1",
                [T0 + (j * 40 + k) * MS],
            )
            .unwrap();
        }
    }
    fs::remove_file(bag.join("metadata.yaml")).unwrap();
    let o = play_with_nofile(&bag, 24);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].starts_with("ringbag: error: ") && lines[0].contains("Too many open files"),
        "{err}"
    );
    // With room for all of them, the same bag plays in full.
    let o = play_with_nofile(&bag, 256);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(lines_count(&o), 1200);
}

fn lines_count(o: &Output) -> usize {
    stdout(o).lines().count()
}

/// `play` read from metadata.yaml's start on: a message stamped 5 ns before it was left
/// out silently (2999 of 3000 played, exit 0). Every row the splits hold plays, and one
/// warning says that metadata.yaml disagrees with them. Likewise one after its end.
#[test]
fn messages_outside_the_span_metadata_yaml_gives_still_play_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let msgs = mixed(300, 1);
    let bag = bag_of(tmp.path(), "early", &msgs, 100);
    let listed = ringbag::bag::BagMetadata::read(&bag).unwrap();
    assert_eq!(listed.starting_time_ns, T0);
    let c = rusqlite::Connection::open(bag.join("early_0.db3")).unwrap();
    c.execute(
        "UPDATE messages SET timestamp = ?1 WHERE timestamp = ?2",
        [T0 - 5, T0],
    )
    .unwrap();
    let c = rusqlite::Connection::open(bag.join("early_2.db3")).unwrap();
    let late = T0 + 299 * MS + 7;
    c.execute(
        "UPDATE messages SET timestamp = ?1 WHERE timestamp = ?2",
        [late, T0 + 299 * MS],
    )
    .unwrap();
    drop(c);
    let o = play(&bag, &["--rate", "1000"]);
    let got: Vec<i64> = ok(&o).iter().map(|l| l.bag_ns).collect();
    let mut want: Vec<i64> = msgs.iter().map(|m| m.2).collect();
    want[0] = T0 - 5;
    want[299] = late;
    assert_eq!(got, want, "every row plays, in order");
    let err = stderr(&o);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warn")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("metadata.yaml says the bag spans")
            && warnings[0].contains("1699999999.999999995 s"),
        "{err}"
    );
    assert!(err.contains("played 300 messages"), "{err}");
}
