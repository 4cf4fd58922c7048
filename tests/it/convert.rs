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
            format!(
                "output_bags:\n- uri: {u}\n  compression_mode: file\n  compression_format: zstd\n"
            ),
            "compress",
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

    let py = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python"));
    let py = if py.exists() {
        py.to_path_buf()
    } else {
        PathBuf::from("/work/main/.venv/bin/python")
    };
    if py.exists() {
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
