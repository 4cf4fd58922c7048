//! Reading: order across splits, filters, seeking through the index, bags without metadata.

use ringbag::bag::reader::{Bag, ReadFilter, CURSOR_ORDER, CURSOR_SELECT};
use ringbag::bag::Flavour;

use crate::common::write_bag;

const TOPICS: [(&str, &str); 3] = [
    ("/a", "std_msgs/msg/String"),
    ("/b", "std_msgs/msg/String"),
    ("/c", "std_msgs/msg/String"),
];

#[test]
fn messages_come_back_in_time_order_across_splits() {
    for flavour in [Flavour::Humble, Flavour::Jazzy] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bag");
        let written = write_bag(&dir, flavour, &TOPICS, 40, 25);
        let bag = Bag::open(&dir).unwrap();
        assert_eq!(bag.splits.len(), 5, "120 messages split every 25 → 5 files");
        let got: Vec<(String, i64, Vec<u8>)> = bag
            .messages(&ReadFilter::default())
            .unwrap()
            .map(|m| {
                let m = m.unwrap();
                (bag.topics[m.topic].name.clone(), m.timestamp, m.data)
            })
            .collect();
        assert_eq!(got, written);
        assert_eq!(bag.metadata.message_count, 120);
        assert_eq!(
            bag.metadata
                .files
                .iter()
                .map(|f| f.message_count)
                .sum::<u64>(),
            120
        );
    }
}

#[test]
fn topic_filter_and_start_time_select_exactly_the_matching_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    let written = write_bag(&dir, Flavour::Jazzy, &TOPICS, 30, 20);
    let bag = Bag::open(&dir).unwrap();
    let start = written[47].1;
    let end = written[80].1;
    let filter = ReadFilter {
        topics: Some(vec!["/b".into(), "/c".into()]),
        start_ns: Some(start),
        end_ns: Some(end),
    };
    let got: Vec<i64> = bag
        .messages(&filter)
        .unwrap()
        .map(|m| m.unwrap().timestamp)
        .collect();
    let want: Vec<i64> = written
        .iter()
        .filter(|(t, ts, _)| (t == "/b" || t == "/c") && *ts >= start && *ts <= end)
        .map(|w| w.1)
        .collect();
    assert_eq!(got, want);
    let e = bag
        .messages(&ReadFilter {
            topics: Some(vec!["/nope".into()]),
            ..Default::default()
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("has no topic /nope"), "{e}");
}

#[test]
fn seeking_uses_the_timestamp_index_not_a_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    write_bag(&dir, Flavour::Humble, &TOPICS, 5, 0);
    let c = rusqlite::Connection::open(dir.join("bag_0.db3")).unwrap();
    let sql = format!("EXPLAIN QUERY PLAN {CURSOR_SELECT} {CURSOR_ORDER}");
    let plan: Vec<String> = c
        .prepare(&sql)
        .unwrap()
        .query_map([0i64, 0i64], |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let plan = plan.join(" | ");
    assert!(plan.contains("USING INDEX timestamp_idx"), "{plan}");
    assert!(
        plan.contains("timestamp>?")
            || plan.contains("(timestamp,rowid)>")
            || plan.contains("timestamp>"),
        "{plan}"
    );
    assert!(!plan.contains("SCAN messages"), "{plan}");
    assert!(!plan.contains("TEMP B-TREE"), "no sort step: {plan}");
}

#[test]
fn bag_without_metadata_yaml_is_derived_from_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    let written = write_bag(&dir, Flavour::Jazzy, &TOPICS, 10, 7);
    let with = Bag::open(&dir).unwrap();
    std::fs::remove_file(dir.join("metadata.yaml")).unwrap();
    let without = Bag::open(&dir).unwrap();
    assert!(without.derived);
    assert_eq!(without.metadata.message_count, written.len() as u64);
    assert_eq!(without.metadata.starting_time_ns, written[0].1);
    assert_eq!(
        without.metadata.duration_ns,
        written.last().unwrap().1 - written[0].1
    );
    assert_eq!(without.metadata.files, with.metadata.files);
    assert_eq!(without.metadata.topics, with.metadata.topics);
}

#[test]
fn split_numbers_order_numerically_not_lexically() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    let written = write_bag(&dir, Flavour::Humble, &TOPICS[..1], 12, 1);
    std::fs::remove_file(dir.join("metadata.yaml")).unwrap();
    let bag = Bag::open(&dir).unwrap();
    let rels: Vec<&str> = bag.splits.iter().map(|s| s.rel.as_str()).collect();
    assert_eq!(rels[9..12], ["bag_9.db3", "bag_10.db3", "bag_11.db3"]);
    let ts: Vec<i64> = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .map(|m| m.unwrap().timestamp)
        .collect();
    assert_eq!(ts, written.iter().map(|w| w.1).collect::<Vec<_>>());
}
