//! The page walker on intact files and on structured damage whose loss is known exactly.
mod pagewalk_common;

use std::ops::ControlFlow;

use pagewalk_common::*;
use ringbag::bag::pagewalk::{walk, walk_bytes, PageSizeSource, WalkOptions};

fn assert_recovers_everything(orig: &Original, flavour: Flavour) {
    let out = run(&orig.bytes);
    let r = &out.walk.report;
    assert_eq!(r.page_size_source, PageSizeSource::Header);
    assert_eq!(r.page_size as usize, orig.page_size);
    assert!(r.schema_page_readable);
    assert_all_genuine(orig, &out, "intact");
    assert_eq!(
        out.messages.len(),
        orig.messages.len(),
        "intact file loses no message"
    );
    assert_eq!(r.messages_recovered as usize, orig.messages.len());
    assert_eq!(r.overflow_chains_broken, 0);
    assert_eq!(r.cells_undecodable, 0);
    assert_eq!(r.rows_implausible, 0);
    assert_eq!(r.messages_unknown_topic, 0);
    assert_eq!(
        r.pages_unaccounted, 0,
        "every page is a b-tree, free or overflow page"
    );
    // Live-tree rows come in rowid order.
    assert!(out.messages.windows(2).all(|w| w[0].id < w[1].id));
    let names: Vec<&str> = out.walk.topics.iter().map(|t| t.name.as_str()).collect();
    let expected: Vec<&str> = TOPICS.iter().map(|t| t.0).collect();
    assert_eq!(names, expected);
    match flavour {
        Flavour::Humble => {
            assert_eq!(
                (r.schema_version, r.distro.as_deref()),
                (Some(3), Some("humble"))
            );
            assert!(out
                .walk
                .topics
                .iter()
                .all(|t| t.type_description_hash.is_none()));
            assert!(out.walk.definitions.is_empty());
        }
        Flavour::Jazzy => {
            assert_eq!(
                (r.schema_version, r.distro.as_deref()),
                (Some(4), Some("jazzy"))
            );
            assert_eq!(
                out.walk.topics[0].type_description_hash.as_deref(),
                Some(format!("RIHS01_{:064}", 1).as_str())
            );
            assert_eq!(out.walk.definitions.len(), TOPICS.len());
            assert_eq!(out.walk.definitions[0].topic_type, "sensor_msgs/msg/Image");
            assert_eq!(
                out.walk.definitions[0].encoded_message_definition,
                "uint32 height\n".repeat(300)
            );
        }
    }
    assert_eq!(out.walk.topics[1].type_name, "sensor_msgs/msg/Imu");
    assert_eq!(out.walk.topics[1].serialization_format, "cdr");
    assert!(out.walk.topics[1]
        .offered_qos_profiles
        .contains("reliability: 1"));
}

#[test]
fn intact_files_recover_every_row_byte_for_byte_at_every_page_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, &ps) in [512usize, 1024, 4096, 8192, 65536].iter().enumerate() {
        for flavour in [Flavour::Humble, Flavour::Jazzy] {
            let orig = build(dir.path(), flavour, ps, 80, 100 + i as u64, None);
            assert_recovers_everything(&orig, flavour);
        }
    }
}

#[test]
fn deleted_rows_are_not_resurrected_from_free_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Jazzy, 4096, 150, 7, Some(3));
    let out = run(&orig.bytes);
    assert!(out.walk.report.freelist_readable);
    assert!(
        out.walk.report.freelist_pages > 0,
        "the deletes freed pages"
    );
    assert_all_genuine(&orig, &out, "after deletes");
    assert_eq!(out.messages.len(), orig.messages.len());
}

#[test]
fn zeroing_any_single_page_loses_exactly_the_rows_stored_on_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut trials = 0;
    for (ps, seed) in [(4096usize, 11u64), (8192, 12)] {
        let orig = build(dir.path(), Flavour::Jazzy, ps, 60, seed, None);
        for (name, pgno, kind, ncell) in &orig.pages {
            let mut bytes = orig.bytes.clone();
            bytes[page_range(&orig, *pgno)].fill(0);
            let out = run(&bytes);
            let what = format!("page {pgno} ({name} {kind}) zeroed, page size {ps}");
            assert!(out.elapsed < TIME_BOUND, "{what}: took {:?}", out.elapsed);
            assert_all_genuine(&orig, &out, &what);
            let lost = orig.messages.len() - out.messages.len();
            let expected = match (name.as_str(), kind.as_str()) {
                ("messages", "leaf") => *ncell as usize,
                ("messages", "overflow") => 1,
                _ => 0,
            };
            assert_eq!(lost, expected, "{what}");
            let topics_lost = orig.topics.len() - out.walk.topics.len();
            let expected_topics = if (name.as_str(), kind.as_str()) == ("topics", "leaf") {
                *ncell as usize
            } else {
                0
            };
            assert_eq!(topics_lost, expected_topics, "{what}: topics");
            if *pgno == 1 {
                assert_eq!(
                    out.walk.report.page_size_source,
                    PageSizeSource::Guessed,
                    "{what}"
                );
                assert_eq!(out.walk.report.page_size as usize, ps, "{what}");
                assert_eq!(out.walk.report.schema_version, Some(4), "{what}");
                assert_eq!(out.walk.definitions.len(), TOPICS.len(), "{what}");
            }
            trials += 1;
        }
    }
    println!("single-page zeroing trials: {trials}");
}

#[test]
fn zeroed_header_page_is_recovered_by_shape_at_every_page_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, &ps) in [512usize, 2048, 4096, 16384, 65536].iter().enumerate() {
        for flavour in [Flavour::Humble, Flavour::Jazzy] {
            let orig = build(dir.path(), flavour, ps, 60, 200 + i as u64, None);
            let mut bytes = orig.bytes.clone();
            bytes[..ps].fill(0);
            let out = run(&bytes);
            let what = format!("{flavour:?} page size {ps}, page 1 zeroed");
            assert_eq!(
                out.walk.report.page_size_source,
                PageSizeSource::Guessed,
                "{what}"
            );
            assert_eq!(out.walk.report.page_size as usize, ps, "{what}");
            assert!(!out.walk.report.schema_page_readable);
            assert_all_genuine(&orig, &out, &what);
            assert_eq!(out.messages.len(), orig.messages.len(), "{what}");
            assert_eq!(out.walk.topics.len(), TOPICS.len(), "{what}");
            let expect_hash = flavour == Flavour::Jazzy;
            assert!(
                out.walk
                    .topics
                    .iter()
                    .all(|t| t.type_description_hash.is_some() == expect_hash),
                "{what}: topics told apart from definitions"
            );
        }
    }
}

#[test]
fn a_broken_overflow_link_drops_only_its_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Humble, 4096, 80, 21, None);
    let overflow: Vec<u32> = orig
        .pages
        .iter()
        .filter(|p| p.0 == "messages" && p.2 == "overflow")
        .map(|p| p.1)
        .collect();
    let leaf = orig
        .pages
        .iter()
        .find(|p| p.0 == "messages" && p.2 == "leaf")
        .map(|p| p.1);
    let mut rng = Rng::new(5);
    let mut trials = 0;
    for _ in 0..60 {
        let pgno = overflow[rng.below(overflow.len() as u64) as usize];
        let start = page_range(&orig, pgno).start;
        let next = u32::from_be_bytes(orig.bytes[start..start + 4].try_into().expect("4 bytes"));
        // Redirect the link: out of the file, into itself (a cycle), into a leaf page, or
        // (on the last page of a chain, where next is 0) to a real page so the chain is too long.
        let bad: u32 = match rng.below(3) {
            0 => 0xFFFF_FF00,
            1 => pgno,
            _ => leaf.unwrap_or(2),
        };
        let bad = if bad == next { 0xFFFF_FF00 } else { bad };
        let mut bytes = orig.bytes.clone();
        bytes[start..start + 4].copy_from_slice(&bad.to_be_bytes());
        let out = run(&bytes);
        let what = format!("overflow page {pgno}: next {next} -> {bad}");
        assert_all_genuine(&orig, &out, &what);
        assert_eq!(orig.messages.len() - out.messages.len(), 1, "{what}");
        assert_eq!(out.walk.report.overflow_chains_broken, 1, "{what}");
        trials += 1;
    }
    println!("overflow link trials: {trials}");
}

#[test]
fn a_zero_tailed_blob_is_kept_when_zero_pages_are_not_holes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Humble, 4096, 40, 31, None);
    // Zero the last overflow page of some chain: with the default it is a hole and the row is
    // dropped; without, the row comes back with the zeroed tail.
    let last = orig
        .pages
        .iter()
        .filter(|p| p.0 == "messages" && p.2 == "overflow")
        .map(|p| p.1)
        .find(|&p| {
            let s = page_range(&orig, p).start;
            orig.bytes[s..s + 4] == [0, 0, 0, 0]
        })
        .expect("a last overflow page");
    let mut bytes = orig.bytes.clone();
    bytes[page_range(&orig, last)].fill(0);
    let strict = run(&bytes);
    assert_eq!(orig.messages.len() - strict.messages.len(), 1);
    let lenient = run_with(
        &bytes,
        WalkOptions {
            zero_page_is_hole: false,
        },
    );
    assert_eq!(lenient.messages.len(), orig.messages.len());
    let changed = lenient
        .messages
        .iter()
        .filter(|m| orig.messages[&m.id].2 != m.data)
        .count();
    assert_eq!(changed, 1);
}

#[test]
fn zeroing_the_messages_root_turns_every_leaf_into_a_recovered_orphan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Jazzy, 4096, 400, 41, None);
    let internal: Vec<u32> = orig
        .pages
        .iter()
        .filter(|p| p.0 == "messages" && p.2 == "internal")
        .map(|p| p.1)
        .collect();
    assert!(!internal.is_empty(), "the messages tree has interior pages");
    let mut bytes = orig.bytes.clone();
    for p in &internal {
        bytes[page_range(&orig, *p)].fill(0);
    }
    let out = run(&bytes);
    assert!(out.walk.report.tree_links_broken > 0 || out.walk.report.leaf_pages_orphan > 0);
    assert!(out.walk.report.leaf_pages_orphan > 0);
    assert_all_genuine(&orig, &out, "interior pages zeroed");
    assert_eq!(out.messages.len(), orig.messages.len());
}

#[test]
fn the_callback_can_stop_the_walk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Humble, 4096, 30, 51, None);
    let mut n = 0;
    let w = walk_bytes(&orig.bytes, WalkOptions::default(), |_| {
        n += 1;
        if n == 5 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    assert_eq!(n, 5);
    assert!(w.report.stopped_early);
}

#[test]
fn empty_short_and_missing_files_recover_nothing_without_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, bytes) in [
        ("empty.db3", vec![]),
        ("short.db3", b"SQLite format 3\0".repeat(4)[..50].to_vec()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).expect("write");
        let w = walk(&path, |_| ControlFlow::Continue(())).expect("walk a short file");
        assert_eq!(w.report.messages_recovered, 0, "{name}");
        assert_eq!(
            w.report.page_size_source,
            PageSizeSource::NotFound,
            "{name}"
        );
        assert!(w.topics.is_empty());
    }
    let missing = dir.path().join("missing.db3");
    let err = walk(&missing, |_| ControlFlow::Continue(())).expect_err("missing file");
    assert!(err.to_string().contains("missing.db3"), "{err}");
}

#[test]
fn walking_a_file_on_disk_matches_walking_its_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Jazzy, 4096, 40, 61, None);
    let path = dir.path().join("copy.db3");
    std::fs::write(&path, &orig.bytes).expect("write");
    let mut ids = Vec::new();
    let w = walk(&path, |m| {
        ids.push(m.id);
        ControlFlow::Continue(())
    })
    .expect("walk");
    assert_eq!(ids, orig.messages.keys().copied().collect::<Vec<_>>());
    assert_eq!(w.topics.len(), TOPICS.len());
}

#[test]
fn a_wrong_page_size_in_an_intact_header_is_outvoted_by_the_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Humble, 4096, 60, 71, None);
    for wrong in [1024u16, 8192, 1] {
        let mut bytes = orig.bytes.clone();
        bytes[16..18].copy_from_slice(&wrong.to_be_bytes());
        let out = run(&bytes);
        assert_eq!(out.walk.report.page_size, 4096, "header said {wrong}");
        assert_eq!(out.walk.report.page_size_source, PageSizeSource::Guessed);
        assert_all_genuine(&orig, &out, "wrong page size");
        assert_eq!(out.messages.len(), orig.messages.len());
    }
}

#[test]
fn rows_appended_on_leaves_whose_parent_update_was_lost_are_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Same seed and schema: `after` is `before` plus more appended rows.
    let before = build(dir.path(), Flavour::Humble, 4096, 300, 81, None);
    let dir2 = tempfile::tempdir().expect("tempdir");
    let after = build(dir2.path(), Flavour::Humble, 4096, 360, 81, None);
    let internal: std::collections::HashSet<u32> = before
        .pages
        .iter()
        .filter(|p| p.0 == "messages" && p.2 == "internal")
        .map(|p| p.1)
        .collect();
    assert!(!internal.is_empty());
    // Power loss after the new leaf and overflow pages reached disk, before the interior
    // pages were rewritten: every interior page of `messages` reverts to its old content.
    let mut torn = after.bytes.clone();
    for p in &internal {
        let r = page_range(&before, *p);
        torn[r.clone()].copy_from_slice(&before.bytes[r]);
    }
    let out = run(&torn);
    assert!(
        out.walk.report.leaf_pages_orphan > 0,
        "the new leaves are orphans"
    );
    assert_all_genuine(&after, &out, "torn append");
    assert_eq!(out.messages.len(), after.messages.len());
}
