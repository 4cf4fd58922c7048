//! Property tests standing in for fuzzing (stable Rust has no cargo-fuzz): arbitrary and
//! mutated input to the metadata parser and to the .db3 reader must give errors, never
//! panics or hangs. Case counts stay small so the suite also runs under qemu; raise them with
//! PROPTEST_CASES for a longer local run.

use std::path::Path;

use proptest::prelude::*;

use ringbag::bag::reader::{Bag, ReadFilter};
use ringbag::bag::{BagMetadata, Flavour};

use crate::common::write_bag;

fn valid_metadata() -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    write_bag(&dir, Flavour::Jazzy, &[("/a", "std_msgs/msg/String")], 3, 2);
    std::fs::read_to_string(dir.join("metadata.yaml")).unwrap()
}

fn valid_db3() -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    write_bag(
        &dir,
        Flavour::Humble,
        &[("/a", "std_msgs/msg/String"), ("/b", "std_msgs/msg/String")],
        30,
        0,
    );
    std::fs::read(dir.join("bag_0.db3")).unwrap()
}

/// Open `bytes` as a single-file bag and read everything; any outcome but a panic is fine.
fn open_and_read(bytes: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("x_0.db3");
    std::fs::write(&p, bytes).unwrap();
    if let Ok(bag) = Bag::open(&p) {
        if let Ok(it) = bag.messages(&ReadFilter::default()) {
            for m in it {
                if m.is_err() {
                    break;
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn metadata_parser_survives_arbitrary_text(text in ".{0,400}") {
        let _ = BagMetadata::parse(&text, Path::new("metadata.yaml"));
    }

    #[test]
    fn metadata_parser_survives_mutations_of_a_real_file(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = valid_metadata().into_bytes();
        for (i, b) in edits {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        let text = String::from_utf8_lossy(&bytes);
        let _ = BagMetadata::parse(&text, Path::new("metadata.yaml"));
    }

    #[test]
    fn reader_survives_arbitrary_bytes_as_a_db3(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        open_and_read(&bytes);
    }

    #[test]
    fn reader_survives_damage_to_a_real_db3(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..32),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = valid_db3();
        for (i, b) in edits {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        if truncate {
            let n = cut.index(bytes.len());
            bytes.truncate(n);
        }
        open_and_read(&bytes);
    }
}
