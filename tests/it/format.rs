//! What ringbag writes, compared with bags recorded by the real `ros2 bag record`
//! (../shared/reference-bags): SQLite schema text, table rows, metadata.yaml key by key.
//!
//! The trick: replay the reference bag's own messages (same topic, QoS, timestamps, bytes)
//! through ringbag's writer into a bag of the same name. Then everything, times and counts
//! included, must come out equal, not only alike in form.

use std::path::Path;

use rusqlite::Connection;
use serde_yaml_ng::Value;

use ringbag::bag::reader::{Bag, ReadFilter};
use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::{BagMetadata, Flavour, MessageDefinition};
use ringbag::source::synthetic;

use crate::common::reference_bags;

fn rows(db: &Path, sql: &str) -> Vec<Vec<String>> {
    let c = Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c.prepare(sql).unwrap();
    let n = st.column_count();
    st.query_map([], |r| {
        (0..n)
            .map(|i| {
                Ok(match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => "NULL".to_string(),
                    rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                    rusqlite::types::ValueRef::Real(v) => v.to_string(),
                    rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                    rusqlite::types::ValueRef::Blob(b) => format!("{b:02x?}"),
                })
            })
            .collect()
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Replay `reference` (a bag dir) into `out/<same name>` with ringbag in `flavour`.
fn replay(reference: &Path, out: &Path, flavour: Flavour) -> std::path::PathBuf {
    let name = reference.file_name().unwrap();
    let dir = out.join(name);
    let bag = Bag::open(reference).expect("reference opens");
    let mut w = BagWriter::create(&dir, WriterOptions::new(flavour)).unwrap();
    let mut idx = Vec::new();
    for t in &bag.topics {
        let def = synthetic::full_msg_definition(&t.type_name).map(|text| MessageDefinition {
            topic_type: t.type_name.clone(),
            encoding: "ros2msg".into(),
            encoded_message_definition: text,
            type_description_hash: t.type_description_hash.clone(),
        });
        let mut info = t.clone();
        if flavour == Flavour::Jazzy && info.type_description_hash.is_empty() {
            info.type_description_hash = synthetic::type_description_hash(&t.type_name)
                .unwrap_or_default()
                .into();
        }
        idx.push(w.add_topic(info, def).unwrap());
    }
    let msgs: Vec<_> = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    w.write_batch(
        msgs.iter()
            .map(|m| (idx[m.topic], m.timestamp, m.data.as_slice())),
    )
    .unwrap();
    w.finish().unwrap();
    dir
}

const MASTER: &str = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid";

fn compare_tables(ours: &Path, theirs: &Path, jazzy: bool) {
    assert_eq!(
        rows(ours, MASTER),
        rows(theirs, MASTER),
        "sqlite_master (DDL text and order)"
    );
    assert_eq!(
        rows(ours, "SELECT * FROM schema"),
        rows(theirs, "SELECT * FROM schema")
    );
    assert_eq!(
        rows(ours, "SELECT * FROM topics"),
        rows(theirs, "SELECT * FROM topics")
    );
    assert_eq!(
        rows(
            ours,
            "SELECT topic_id, timestamp, data FROM messages ORDER BY id"
        ),
        rows(
            theirs,
            "SELECT topic_id, timestamp, data FROM messages ORDER BY id"
        ),
    );
    for pragma in [
        "PRAGMA encoding",
        "PRAGMA user_version",
        "PRAGMA application_id",
        "PRAGMA auto_vacuum",
    ] {
        assert_eq!(rows(ours, pragma), rows(theirs, pragma), "{pragma}");
    }
    if jazzy {
        assert_eq!(
            rows(ours, "SELECT * FROM message_definitions"),
            rows(theirs, "SELECT * FROM message_definitions"),
        );
        // A placeholder at open and the final row at close, as rosbag2 Jazzy writes them.
        let meta = rows(
            ours,
            "SELECT metadata_version, metadata FROM metadata ORDER BY id",
        );
        assert_eq!(meta.len(), 2);
        for row in &meta {
            assert_eq!(row[0], "9");
            let v: Value = serde_yaml_ng::from_str(&row[1]).unwrap();
            BagMetadata::from_value(&v).expect("metadata row parses");
        }
        let theirs_final: Value = serde_yaml_ng::from_str(
            &rows(
                theirs,
                "SELECT metadata FROM metadata ORDER BY id DESC LIMIT 1",
            )[0][0],
        )
        .unwrap();
        let ours_final: Value = serde_yaml_ng::from_str(&meta[1][1]).unwrap();
        assert_same_yaml(&ours_final, &theirs_final, "metadata table");
    } else {
        assert_eq!(
            rows(ours, "SELECT count(*) FROM metadata"),
            vec![vec!["0".to_string()]],
            "Humble leaves it empty"
        );
    }
}

/// Same keys in the same order, same values (custom_data aside, which ringbag fills).
fn assert_same_yaml(ours: &Value, theirs: &Value, at: &str) {
    match (ours, theirs) {
        (Value::Mapping(a), Value::Mapping(b)) => {
            let ka: Vec<_> = a.keys().collect();
            let kb: Vec<_> = b.keys().collect();
            assert_eq!(ka, kb, "keys at {at}");
            for (k, va) in a {
                if k.as_str() == Some("custom_data") {
                    assert!(va.is_null() || va.is_mapping(), "custom_data form at {at}");
                    continue;
                }
                assert_same_yaml(va, &b[k], &format!("{at}.{}", k.as_str().unwrap_or("?")));
            }
        }
        (Value::Sequence(a), Value::Sequence(b)) => {
            assert_eq!(a.len(), b.len(), "length at {at}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_same_yaml(x, y, &format!("{at}[{i}]"));
            }
        }
        (a, b) => assert_eq!(a, b, "value at {at}"),
    }
}

fn compare_metadata_yaml(ours: &Path, theirs: &Path) {
    let a: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(ours.join("metadata.yaml")).unwrap())
            .unwrap();
    let b: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(theirs.join("metadata.yaml")).unwrap())
            .unwrap();
    assert_same_yaml(&a, &b, "metadata.yaml");
}

#[test]
fn humble_bag_matches_ros2_bag_record_table_by_table_and_key_by_key() {
    let Some(refs) = reference_bags() else { return };
    let theirs = refs.join("humble/humble_ref");
    let tmp = tempfile::tempdir().unwrap();
    let ours = replay(&theirs, tmp.path(), Flavour::Humble);
    compare_tables(
        &ours.join("humble_ref_0.db3"),
        &theirs.join("humble_ref_0.db3"),
        false,
    );
    compare_metadata_yaml(&ours, &theirs);
}

#[test]
fn jazzy_bag_matches_ros2_bag_record_table_by_table_and_key_by_key() {
    let Some(refs) = reference_bags() else { return };
    let theirs = refs.join("jazzy/jazzy_ref");
    if !theirs.exists() {
        eprintln!("SKIP: no Jazzy reference bag");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ours = replay(&theirs, tmp.path(), Flavour::Jazzy);
    compare_tables(
        &ours.join("jazzy_ref_0.db3"),
        &theirs.join("jazzy_ref_0.db3"),
        true,
    );
    compare_metadata_yaml(&ours, &theirs);
}

#[test]
fn reader_returns_every_reference_message_byte_for_byte() {
    let Some(refs) = reference_bags() else { return };
    for (dir, db, n) in [
        ("humble/humble_ref", "humble_ref_0.db3", 49),
        ("jazzy/jazzy_ref", "jazzy_ref_0.db3", 51),
    ] {
        let p = refs.join(dir);
        let bag = Bag::open(&p).unwrap();
        let ours: Vec<Vec<String>> = bag
            .messages(&ReadFilter::default())
            .unwrap()
            .map(|m| {
                let m = m.unwrap();
                vec![
                    "1".to_string(),
                    m.timestamp.to_string(),
                    format!("{:02x?}", m.data),
                ]
            })
            .collect();
        assert_eq!(ours.len(), n, "{dir}");
        assert_eq!(
            ours,
            rows(
                &p.join(db),
                "SELECT topic_id, timestamp, data FROM messages ORDER BY timestamp, id"
            )
        );
        assert_eq!(bag.metadata.message_count, n as u64);
        // The single .db3 opens alone too.
        let single = Bag::open(&p.join(db)).unwrap();
        assert_eq!(single.metadata.message_count, n as u64);
    }
}

#[test]
fn mcap_reference_bag_is_refused_with_a_clear_message() {
    let Some(refs) = reference_bags() else { return };
    for dir in ["humble/humble_ref_mcap", "jazzy/jazzy_ref_mcap"] {
        let p = refs.join(dir);
        if !p.exists() {
            continue;
        }
        let e = Bag::open(&p).unwrap_err().to_string();
        assert!(e.contains("storage `mcap` is not supported"), "{e}");
    }
}

#[test]
fn metadata_versions_one_to_nine_all_parse() {
    for v in 1..=9u32 {
        let qos = if v >= 9 {
            "\n        offered_qos_profiles:\n          - history: keep_last\n            depth: 5\n            reliability: best_effort\n            durability: volatile\n            deadline: {sec: 0, nsec: 0}\n            lifespan: {sec: 0, nsec: 0}\n            liveliness: automatic\n            liveliness_lease_duration: {sec: 0, nsec: 0}\n            avoid_ros_namespace_conventions: false"
        } else if v >= 4 {
            "\n        offered_qos_profiles: \"- history: 1\\n  depth: 5\\n  reliability: 2\\n  durability: 2\\n  deadline: {sec: 0, nsec: 0}\\n  lifespan: {sec: 0, nsec: 0}\\n  liveliness: 1\\n  liveliness_lease_duration: {sec: 0, nsec: 0}\\n  avoid_ros_namespace_conventions: false\""
        } else {
            ""
        };
        let text = format!(
            "rosbag2_bagfile_information:\n  version: {v}\n  storage_identifier: sqlite3\n  relative_file_paths:\n    - b_0.db3\n  duration:\n    nanoseconds: 10\n  starting_time:\n    nanoseconds_since_epoch: 5\n  message_count: 2\n  topics_with_message_count:\n    - topic_metadata:\n        name: /a\n        type: std_msgs/msg/String\n        serialization_format: cdr{qos}\n      message_count: 2\n"
        );
        let m = BagMetadata::parse(&text, Path::new("metadata.yaml"))
            .unwrap_or_else(|e| panic!("v{v}: {e}"));
        assert_eq!(m.version, v);
        assert_eq!(m.topics[0].message_count, 2);
        if v >= 4 {
            assert_eq!(m.topics[0].topic.offered_qos_profiles[0].depth, 5, "v{v}");
        }
    }
}
