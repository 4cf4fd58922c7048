//! `ringbag convert`: merged inputs round-trip byte for byte, every selection and window
//! writes exactly its messages, splits obey their limits, bad option files are one line and
//! exit 2 with nothing written, and the real rosbag2 / rosbags read what it writes (and it
//! reads what the real `ros2 bag convert` writes) where they are installed.

use std::path::{Path, PathBuf};

use ringbag::bag::qos::{Durability, Reliability};
use ringbag::bag::reader::{open_read_only, Bag, ReadFilter};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::{Flavour, MessageDefinition, TopicInfo};

use crate::common::{cdr_string, run, stderr, topic, RunOutput};

const T0: i64 = 1_700_000_000_000_000_000;
const MS: i64 = 1_000_000;

type Msg = (String, i64, Vec<u8>);
/// A selection case: output name, the entry's keys, which messages it must hold.
type Case = (&'static str, String, Box<dyn Fn(&Msg) -> bool>);

/// A Jazzy bag with `topics` (name, type), a message on each every `step` from `t0`
/// (`n` per topic), a QoS that is not the default and a definition per type.
fn make_bag(dir: &Path, topics: &[(&str, &str)], t0: i64, step: i64, n: usize) -> Vec<Msg> {
    let mut w = BagWriter::create(dir, WriterOptions::new(Flavour::Jazzy)).expect("create");
    let mut idx = Vec::new();
    for (name, ty) in topics {
        let mut t = topic(name, ty);
        t.offered_qos_profiles[0].reliability = Reliability::BestEffort;
        t.offered_qos_profiles[0].durability = Durability::TransientLocal;
        t.type_description_hash = format!("RIHS01_{}", "ab".repeat(32));
        let def = MessageDefinition {
            topic_type: ty.to_string(),
            encoding: "ros2msg".into(),
            encoded_message_definition: format!("string data # {ty}"),
            type_description_hash: t.type_description_hash.clone(),
        };
        idx.push(w.add_topic(t, Some(def)).expect("topic"));
    }
    let mut out = Vec::new();
    for i in 0..n {
        for (k, (name, _)) in topics.iter().enumerate() {
            let ts = t0 + i as i64 * step;
            let data = cdr_string(&format!("{name} {i} {}", "x".repeat(i % 7)));
            w.write_batch([(idx[k], ts, data.as_slice())])
                .expect("write");
            out.push((name.to_string(), ts, data));
        }
    }
    w.finish().expect("finish");
    out
}

fn read_all(bag: &Path) -> (Bag, Vec<Msg>) {
    let b = Bag::open(bag).expect("open output");
    let msgs = b
        .messages(&ReadFilter::default())
        .expect("read")
        .map(|m| {
            let m = m.expect("message");
            (b.topics[m.topic].name.clone(), m.timestamp, m.data)
        })
        .collect();
    (b, msgs)
}

fn definitions(bag: &Bag) -> Vec<(String, String, String, String)> {
    let conn = open_read_only(&bag.splits[0].path).expect("split");
    let mut st = conn
        .prepare("SELECT topic_type, encoding, encoded_message_definition, type_description_hash FROM message_definitions ORDER BY topic_type")
        .expect("prepare");
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

fn convert(inputs: &[&Path], options: &Path) -> std::process::Output {
    let mut args: Vec<String> = vec!["convert".into()];
    for i in inputs {
        args.push("-i".into());
        args.push(i.display().to_string());
    }
    args.push("-o".into());
    args.push(options.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&args)
}

fn write_options(dir: &Path, yaml: &str) -> PathBuf {
    let p = dir.join("out.yaml");
    std::fs::write(&p, yaml).expect("options");
    p
}

fn two_inputs(tmp: &Path) -> (PathBuf, PathBuf, Vec<Msg>) {
    let a = tmp.join("a");
    let b = tmp.join("b");
    let mut all = make_bag(
        &a,
        &[
            ("/imu", "sensor_msgs/msg/Imu"),
            ("/cam/info", "sensor_msgs/msg/CameraInfo"),
        ],
        T0,
        10 * MS,
        50,
    );
    all.extend(make_bag(
        &b,
        &[
            ("/gps", "sensor_msgs/msg/NavSatFix"),
            ("/_hidden", "std_msgs/msg/String"),
        ],
        T0 + 5 * MS,
        10 * MS,
        50,
    ));
    all.sort_by_key(|m| m.1);
    (a, b, all)
}

#[test]
fn merged_inputs_round_trip_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, all) = two_inputs(tmp.path());
    let out = tmp.path().join("merged");
    let opts = write_options(
        tmp.path(),
        &format!(
            "output_bags:\n- uri: {}\n  storage_id: sqlite3\n  all_topics: true\n  include_hidden_topics: true\n",
            out.display()
        ),
    );
    let o = convert(&[&a, &b], &opts);
    assert!(o.status.success(), "{}", stderr(&o));
    let (bag, msgs) = read_all(&out);
    assert_eq!(msgs, all, "every message, in time order, same bytes");
    let (ia, _) = read_all(&a);
    let (ib, _) = read_all(&b);
    let mut want: Vec<TopicInfo> = ia.topics.iter().chain(&ib.topics).cloned().collect();
    let mut got = bag.topics.clone();
    want.sort_by(|x, y| x.name.cmp(&y.name));
    got.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(got, want, "names, types, QoS and hashes carried over");
    let mut want_defs = definitions(&ia);
    want_defs.extend(definitions(&ib));
    want_defs.sort();
    assert_eq!(definitions(&bag), want_defs);
    assert_eq!(bag.metadata.message_count, all.len() as u64);
    assert_eq!(bag.metadata.version, 9);
}

#[test]
fn filters_and_windows_select_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, all) = two_inputs(tmp.path());
    let (start, end) = (T0 + 100 * MS, T0 + 205 * MS);
    let cases: Vec<Case> = vec![
        ("named", "topics: [/imu, gps]".into(), Box::new(|m: &Msg| m.0 == "/imu" || m.0 == "/gps")),
        ("regex", "regex: ^/cam".into(), Box::new(|m: &Msg| m.0 == "/cam/info")),
        (
            "humble_all_exclude",
            "all: true\n  exclude: imu".into(),
            Box::new(|m: &Msg| m.0 == "/cam/info" || m.0 == "/gps"),
        ),
        (
            "exclusions",
            "all_topics: true\n  exclude_regex: cam\n  exclude_topics: [/gps]".into(),
            Box::new(|m: &Msg| m.0 == "/imu"),
        ),
        (
            "types",
            "topic_types: [sensor_msgs/msg/NavSatFix, std_msgs/msg/String]\n  exclude_topic_types: [std_msgs/msg/String]".into(),
            Box::new(|m: &Msg| m.0 == "/gps"),
        ),
        ("nothing_selected_is_all_but_hidden", "storage_id: ''".into(), Box::new(|m: &Msg| m.0 != "/_hidden")),
        (
            "window",
            format!("all_topics: true\n  start_time_ns: {start}\n  end_time_ns: {end}"),
            Box::new(move |m: &Msg| m.0 != "/_hidden" && m.1 >= start && m.1 <= end),
        ),
    ];
    // All cases as entries of one file: several outputs in one run.
    let mut yaml = String::from("output_bags:\n");
    for (name, body, _) in &cases {
        yaml.push_str(&format!(
            "- uri: {}\n  {body}\n",
            tmp.path().join(name).display()
        ));
    }
    let opts = write_options(tmp.path(), &yaml);
    let o = convert(&[&a, &b], &opts);
    assert!(o.status.success(), "{}", stderr(&o));
    for (name, _, keep) in &cases {
        let (_, got) = read_all(&tmp.path().join(name));
        let want: Vec<Msg> = all.iter().filter(|m| keep(m)).cloned().collect();
        assert!(!want.is_empty(), "{name}: the case selects something");
        assert_eq!(got.len(), want.len(), "{name}");
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn splits_obey_size_and_duration_and_humble_flavour_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let all = make_bag(&a, &[("/big", "std_msgs/msg/String")], T0, 20 * MS, 3000);
    let by_size = tmp.path().join("by_size");
    let by_time = tmp.path().join("by_time");
    let opts = write_options(
        tmp.path(),
        &format!(
            "output_bags:\n- uri: {}\n  max_bagfile_size: 86016\n  bag_format: humble\n- uri: {}\n  max_bagfile_duration: 10\n",
            by_size.display(),
            by_time.display()
        ),
    );
    let o = convert(&[&a], &opts);
    assert!(o.status.success(), "{}", stderr(&o));
    let (bag, msgs) = read_all(&by_size);
    assert_eq!(msgs, all);
    assert!(bag.splits.len() > 1, "split by size");
    // As `record -b`: the size is projected before each commit, so a split may end one
    // SQLite page (4 KiB) past the limit, never more.
    for s in &bag.splits {
        assert!(
            s.size_bytes <= 86_016 + 4096,
            "{} is {} bytes",
            s.rel,
            s.size_bytes
        );
        assert_eq!(s.schema_version, Some(3), "Humble schema");
    }
    assert_eq!(bag.metadata.version, 5, "Humble metadata.yaml");
    let (bag, msgs) = read_all(&by_time);
    assert_eq!(msgs, all);
    // 3000 messages 20 ms apart: 60 s, so six splits of 10 s.
    assert_eq!(bag.splits.len(), 6);
    for f in &bag.metadata.files {
        assert!(f.duration_ns < 10_000_000_000, "{f:?}");
        assert_eq!(f.message_count, 500);
    }
}

#[test]
fn bad_options_are_one_line_exit_2_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    make_bag(&a, &[("/x", "std_msgs/msg/String")], T0, MS, 3);
    let out = tmp.path().join("out");
    let u = out.display().to_string();
    let existing = tmp.path().join("exists");
    std::fs::create_dir(&existing).unwrap();
    let cases = [
        (
            format!("output_bags:\n- uri: {u}\n  topicz: [/x]\n"),
            "unknown key \"topicz\"",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  max_bagfile_size: -5\n"),
            "max_bagfile_size",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  all_topics: yes please\n"),
            "all_topics",
        ),
        (format!("output_bags:\n- uri: {u}\n  regex: '('\n"), "regex"),
        (
            format!("output_bags:\n- uri: {u}\n  storage_id: mcap\n"),
            "sqlite3",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: message\n"),
            "compression_mode message needs compression_format: zstd",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: file\n  compression_format: lz4\n"),
            "compression_format \"lz4\": unknown; ringbag compresses with zstd only",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: file\n"),
            "compression_mode file needs compression_format: zstd",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_format: zstd\n"),
            "compression_format \"zstd\" needs compression_mode: file or message",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: folder\n  compression_format: zstd\n"),
            "compression_mode \"folder\"",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: file\n  compression_format: zstd\n  compression_threads: -1\n"),
            "compression_threads",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  compression_mode: file\n  compression_format: zstd\n  compression_queue_size: many\n"),
            "compression_queue_size",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  start_time_ns: 5\n  end_time_ns: 4\n"),
            "before",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  bag_format: iron\n"),
            "bag_format",
        ),
        (
            format!("output_bags:\n- uri: {u}\n  max_bagfile_size: 1000\n"),
            "86016",
        ),
        (format!("outputs:\n- uri: {u}\n"), "unknown key"),
        ("output_bags: []\n".to_string(), "empty"),
        ("output_bags:\n- topics: [/x]\n".to_string(), "uri"),
        ("output_bags: [\n".to_string(), "not YAML"),
        (
            format!("output_bags:\n- uri: {u}\n- uri: {}\n", existing.display()),
            "already exists",
        ),
        (format!("output_bags:\n- uri: {u}\n- uri: {u}\n"), "twice"),
    ];
    for (yaml, want) in &cases {
        let opts = write_options(tmp.path(), yaml);
        let o = convert(&[&a], &opts);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{yaml}: {err}");
        assert_eq!(err.lines().count(), 1, "{yaml}: {err}");
        assert!(
            err.starts_with("ringbag: error: ") && err.contains(want),
            "{yaml}: {err}"
        );
        assert!(!out.exists(), "{yaml}: nothing written");
    }
    assert_eq!(
        std::fs::read_dir(&existing).unwrap().count(),
        0,
        "existing left alone"
    );
    // A missing input is bad input too.
    let opts = write_options(tmp.path(), &format!("output_bags:\n- uri: {u}\n"));
    let o = convert(&[&tmp.path().join("nope")], &opts);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1);
    assert!(!out.exists());
}

/// The python of the venv with the rosbags library (this checkout's, else the main one's),
/// or None.
fn venv_python() -> Option<PathBuf> {
    [
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python")),
        PathBuf::from("/work/main/.venv/bin/python"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Run `script` in bash with `distro` sourced (loopback DDS), or None when it is not
/// installed (a SKIP line; a panic under RINGBAG_ROS_REQUIRED for Jazzy, which CI has).
fn with_distro(distro: &str, setups: &[&str], script: &str) -> Option<std::process::Output> {
    let sourced = std::env::var("ROS_DISTRO").is_ok_and(|d| d == distro);
    let setup = setups.iter().find(|p| Path::new(p).exists());
    let script = match (sourced, setup) {
        (true, _) => script.to_string(),
        (false, Some(s)) => format!("source {s} >/dev/null 2>&1 && {script}"),
        (false, None) => {
            if distro == "jazzy" && std::env::var_os("RINGBAG_ROS_REQUIRED").is_some() {
                panic!("no Jazzy, but RINGBAG_ROS_REQUIRED is set");
            }
            eprintln!("SKIP: no {distro} installed");
            return None;
        }
    };
    Some(
        std::process::Command::new("bash")
            .args(["-c", &script])
            .env("RMW_IMPLEMENTATION", "rmw_cyclonedds_cpp")
            .env(
                "CYCLONEDDS_URI",
                concat!(
                    "file://",
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/cyclonedds-loopback.xml"
                ),
            )
            .run_output()
            .expect("bash runs"),
    )
}

fn with_jazzy(script: &str) -> Option<std::process::Output> {
    with_distro(
        "jazzy",
        &["/opt/ros2-jazzy/setup.bash", "/opt/ros/jazzy/setup.bash"],
        script,
    )
}

#[test]
fn real_rosbag2_and_rosbags_read_the_output_and_ringbag_reads_ros2_bag_convert() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, all) = two_inputs(tmp.path());
    let out = tmp.path().join("merged");
    let humble = tmp.path().join("humble");
    let opts = write_options(
        tmp.path(),
        &format!(
            "output_bags:\n- uri: {}\n  all_topics: true\n  include_hidden_topics: true\n  max_bagfile_size: 200000\n- uri: {}\n  all: true\n  bag_format: humble\n",
            out.display(),
            humble.display()
        ),
    );
    let o = convert(&[&a, &b], &opts);
    assert!(o.status.success(), "{}", stderr(&o));

    if let Some(py) = venv_python() {
        let script = "import sys\nfrom rosbags.rosbag2 import Reader\nwith Reader(sys.argv[1]) as r:\n    print(sum(1 for _ in r.messages()), sorted(c.topic for c in r.connections))\n";
        let o = std::process::Command::new(&py)
            .args(["-c", script, &out.display().to_string()])
            .run_output()
            .expect("python runs");
        assert!(o.status.success(), "rosbags: {}", stderr(&o));
        assert_eq!(
            crate::common::stdout(&o).trim(),
            format!("{} ['/_hidden', '/cam/info', '/gps', '/imu']", all.len())
        );
    } else {
        eprintln!("SKIP: no rosbags venv");
    }

    // The Humble-flavoured output, through Humble's own `ros2 bag info`.
    let visible = all.iter().filter(|m| m.0 != "/_hidden").count();
    if let Some(o) = with_distro(
        "humble",
        &["/opt/ros2-local/setup.bash", "/opt/ros/humble/setup.bash"],
        &format!("ros2 bag info {}", humble.display()),
    ) {
        let info = crate::common::stdout(&o);
        assert!(o.status.success(), "humble ros2 bag info: {}", stderr(&o));
        assert!(
            info.contains(&format!("Messages:          {visible}")),
            "{info}"
        );
    }

    let Some(o) = with_jazzy(&format!("ros2 bag info {}", out.display())) else {
        return;
    };
    let info = crate::common::stdout(&o);
    assert!(o.status.success(), "ros2 bag info: {}", stderr(&o));
    assert!(
        info.contains(&format!("Messages:          {}", all.len())),
        "{info}"
    );

    // ringbag reads what the real `ros2 bag convert` writes from ringbag's merged bag.
    let theirs = tmp.path().join("theirs");
    let their_opts = tmp.path().join("theirs.yaml");
    std::fs::write(
        &their_opts,
        format!("output_bags:\n- uri: {}\n  storage_id: sqlite3\n  all_topics: true\n  include_hidden_topics: true\n", theirs.display()),
    )
    .unwrap();
    let o = with_jazzy(&format!(
        "ros2 bag convert -i {} -o {}",
        out.display(),
        their_opts.display()
    ))
    .expect("Jazzy was there a moment ago");
    assert!(o.status.success(), "ros2 bag convert: {}", stderr(&o));
    let (bag, msgs) = read_all(&theirs);
    assert_eq!(msgs, all, "ringbag reads rosbag2's rewrite, same bytes");
    let (ours, _) = read_all(&out);
    let mut want = ours.topics.clone();
    let mut got = bag.topics.clone();
    want.sort_by(|x, y| x.name.cmp(&y.name));
    got.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(
        got.iter()
            .map(|t| (&t.name, &t.type_name))
            .collect::<Vec<_>>(),
        want.iter()
            .map(|t| (&t.name, &t.type_name))
            .collect::<Vec<_>>()
    );
}

/// A bag compressed by rosbag2's file mode (`.db3.zstd` splits) is an input like any other:
/// the output is plain and holds every message, definition and QoS byte for byte.
#[test]
fn a_compressed_input_converts_into_a_plain_bag_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _, _) = two_inputs(tmp.path());
    let (plain, want) = read_all(&a);
    let want_defs = definitions(&plain);
    crate::compressed::compress_like_rosbag2(&a);
    let out = tmp.path().join("plain");
    let opts = write_options(
        tmp.path(),
        &format!(
            "output_bags:\n- uri: {}\n  all_topics: true\n",
            out.display()
        ),
    );
    let o = convert(&[&a], &opts);
    assert!(o.status.success(), "{}", stderr(&o));
    let (bag, msgs) = read_all(&out);
    assert_eq!(msgs, want);
    assert_eq!(bag.metadata.compression_mode, "");
    assert!(bag
        .splits
        .iter()
        .all(|s| s.path.extension() == Some("db3".as_ref())));
    assert_eq!(bag.topics, plain.topics);
    assert_eq!(definitions(&bag), want_defs);
}

/// Every message of `bag` as the python rosbags library reads it (topic, timestamp, bytes,
/// in its order), or None without the venv (a SKIP line).
fn rosbags_messages(bag: &Path) -> Option<Vec<Msg>> {
    let Some(py) = venv_python() else {
        eprintln!("SKIP: no rosbags venv");
        return None;
    };
    let script = "import sys\nfrom rosbags.rosbag2 import Reader\nwith Reader(sys.argv[1]) as r:\n    for c, t, d in r.messages():\n        print(c.topic, t, bytes(d).hex())\n";
    let o = std::process::Command::new(py)
        .args(["-c", script, &bag.display().to_string()])
        .run_output()
        .expect("python runs");
    assert!(o.status.success(), "rosbags: {}", stderr(&o));
    let hex = |h: &str| -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
            .collect()
    };
    Some(
        crate::common::stdout(&o)
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f[0].to_string(), f[1].parse().expect("ts"), hex(f[2]))
            })
            .collect(),
    )
}

/// The files of a bag directory, sorted.
fn files_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("bag dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `compression_mode: file` + `compression_format: zstd`: every split of the output is a
/// `.db3.zstd` (no `.db3` or `.partial` left), metadata.yaml says so as rosbag2 writes it,
/// the size limit holds for each split before compression, and ringbag's reader, the
/// rosbags library and (where installed) the real Jazzy `ros2 bag convert` give back every
/// message in order, byte for byte. Both spellings of the mode, both flavours, a queue of
/// one and an unbounded one.
#[test]
fn compressed_output_is_rosbag2_file_mode_and_reads_back_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, mut all) = two_inputs(tmp.path());
    let c = tmp.path().join("c");
    all.extend(make_bag(
        &c,
        &[("/big", "std_msgs/msg/String")],
        T0 + 3 * MS,
        20 * MS,
        3000,
    ));
    all.sort_by_key(|m| m.1);
    let split = tmp.path().join("split");
    let humble = tmp.path().join("humble");
    let opts = write_options(
        tmp.path(),
        &format!(
            "output_bags:\n- uri: {}\n  all_topics: true\n  include_hidden_topics: true\n  max_bagfile_size: 86016\n  compression_mode: file\n  compression_format: zstd\n  compression_threads: 2\n  compression_queue_size: 1\n- uri: {}\n  all: true\n  include_hidden_topics: true\n  bag_format: humble\n  compression_mode: FILE\n  compression_format: zstd\n  compression_queue_size: 0\n  compression_threads_priority: 1\n",
            split.display(),
            humble.display()
        ),
    );
    let o = convert(&[&a, &b, &c], &opts);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 2, "one line per output: {err}");

    for (dir, name, version) in [(&split, "split", 9), (&humble, "humble", 5)] {
        let m = crate::common::assert_file_mode_compressed(dir, name);
        assert_eq!(m.version, version);
        assert_eq!(m.message_count, all.len() as u64);
        let (_, msgs) = read_all(dir);
        assert!(msgs == all, "{name}: ringbag reads every message back");
        if let Some(theirs) = rosbags_messages(dir) {
            assert!(theirs == all, "{name}: rosbags reads every message back");
        }
    }
    // Each split within the limit before compression (one SQLite page over at most, as
    // `record -b`), and smaller after it.
    let files = files_of(&split);
    assert!(files.len() > 3, "split by size: {files:?}");
    for f in files.iter().filter(|n| n.ends_with(".zstd")) {
        let z = std::fs::read(split.join(f)).unwrap();
        let plain = zstd::decode_all(&z[..]).expect("one zstd stream");
        assert!(plain.len() <= 86_016 + 4096, "{f}: {} bytes", plain.len());
        assert!(z.len() < plain.len(), "{f}: {} of {}", z.len(), plain.len());
        assert_eq!(&plain[..16], b"SQLite format 3\0", "{f}");
    }
    assert_eq!(files_of(&humble).len(), 2, "one split and metadata.yaml");

    // The real rosbag2 decompresses it with its zstd plugin: `ros2 bag convert` to a plain bag.
    let theirs = tmp.path().join("theirs");
    let their_opts = tmp.path().join("theirs.yaml");
    std::fs::write(
        &their_opts,
        format!(
            "output_bags:\n- uri: {}\n  storage_id: sqlite3\n  all_topics: true\n  include_hidden_topics: true\n",
            theirs.display()
        ),
    )
    .unwrap();
    if let Some(o) = with_jazzy(&format!(
        "ros2 bag convert -i {} -o {}",
        split.display(),
        their_opts.display()
    )) {
        assert!(o.status.success(), "ros2 bag convert: {}", stderr(&o));
        let (_, msgs) = read_all(&theirs);
        assert!(msgs == all, "rosbag2 reads ringbag's compressed splits");
    }
}

/// A bag ringbag compressed (convert's own output, as `record --compression-mode file`
/// writes it) converts back into a plain bag, byte for byte.
#[test]
fn a_bag_ringbag_compressed_converts_back_into_a_plain_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let all = make_bag(&a, &[("/big", "std_msgs/msg/String")], T0, 20 * MS, 2000);
    let z = tmp.path().join("z");
    let o = convert(
        &[&a],
        &write_options(
            tmp.path(),
            &format!(
                "output_bags:\n- uri: {}\n  max_bagfile_size: 86016\n  compression_mode: file\n  compression_format: zstd\n",
                z.display()
            ),
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(files_of(&z).iter().any(|f| f.ends_with("_1.db3.zstd")));
    let back = tmp.path().join("back");
    let o = convert(
        &[&z],
        &write_options(
            tmp.path(),
            &format!("output_bags:\n- uri: {}\n", back.display()),
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(files_of(&back), ["back_0.db3", "metadata.yaml"]);
    let (bag, msgs) = read_all(&back);
    assert!(msgs == all, "every message back, in order");
    assert_eq!(bag.metadata.compression_mode, "");
    assert_eq!(bag.metadata.compression_format, "");
}

/// Offline compression (convert's): a split whose compression fails (its `.partial` path is
/// taken by a directory) stays a plain `.db3`, listed so in metadata.yaml, the next split is
/// compressed, every message reads back, and `finish` fails with one line naming the split
/// (convert prints it as `ringbag: error: …` and exits 1).
#[test]
fn a_failed_offline_compression_leaves_the_plain_split_and_fails_finish_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("f");
    let mut opts = WriterOptions::new(Flavour::Jazzy);
    opts.max_bag_size = 86_016;
    opts.compression = ringbag::bag::filemode::FileCompression::from_flags("file", "zstd", 1, 1)
        .expect("file mode");
    let mut w = BagWriter::create(&dir, opts).expect("create");
    w.compress_offline();
    std::fs::create_dir(dir.join(".f_0.db3.zstd.partial")).unwrap();
    let t = w
        .add_topic(topic("/x", "std_msgs/msg/String"), None)
        .unwrap();
    let mut want = Vec::new();
    for i in 0..1500i64 {
        let data = cdr_string(&format!("message {i} {}", "y".repeat(40)));
        w.write_batch([(t, T0 + i * MS, data.as_slice())]).unwrap();
        want.push(("/x".to_string(), T0 + i * MS, data));
    }
    let e = w
        .finish()
        .expect_err("a split was not compressed")
        .to_string();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("f_0.db3: not compressed, left as a plain .db3: "),
        "{e}"
    );
    let files = files_of(&dir);
    assert!(files.contains(&"f_0.db3".to_string()), "{files:?}");
    assert!(files.contains(&"f_1.db3.zstd".to_string()), "{files:?}");
    assert!(!files.contains(&"f_1.db3".to_string()), "{files:?}");
    let m = ringbag::bag::metadata::BagMetadata::read(&dir).unwrap();
    assert_eq!(m.relative_file_paths[0], "f_0.db3");
    assert_eq!(m.relative_file_paths[1], "f_1.db3.zstd");
    let (_, msgs) = read_all(&dir);
    assert!(msgs == want, "nothing lost");
}
