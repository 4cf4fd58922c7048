//! The synthetic source's messages: exact sizes, valid CDR framing, determinism, no buffer
//! growth, and Jazzy interface data that matches real rosbag2 output.

use std::path::{Path, PathBuf};

use ringbag::source::synthetic::{SyntheticProfile, SyntheticTopic};

const ALL_PROFILES: [SyntheticProfile; 4] = [
    SyntheticProfile::Robot,
    SyntheticProfile::Small,
    SyntheticProfile::Medium,
    SyntheticProfile::Large,
];

fn all_topics() -> Vec<SyntheticTopic> {
    ALL_PROFILES.iter().flat_map(|p| p.topics()).collect()
}

fn encode_one(topic: &SyntheticTopic, seq: u64, stamp_ns: i64) -> Vec<u8> {
    let mut buf = Vec::new();
    topic.encoder().encode(seq, stamp_ns, &mut buf);
    buf
}

fn single_message_size(profile: SyntheticProfile) -> usize {
    let topics = profile.topics();
    assert_eq!(topics.len(), 1, "{profile:?} is a single-topic profile");
    let mut enc = topics[0].encoder();
    let mut buf = Vec::new();
    enc.encode(12345, 1_796_154_073_962_475_246, &mut buf);
    assert_eq!(enc.size_hint(), buf.len());
    buf.len()
}

#[test]
fn small_profile_messages_are_exactly_100_bytes() {
    assert_eq!(single_message_size(SyntheticProfile::Small), 100);
}

#[test]
fn medium_profile_messages_are_exactly_64_kib() {
    assert_eq!(single_message_size(SyntheticProfile::Medium), 64 * 1024);
}

#[test]
fn large_profile_messages_are_exactly_1_mib() {
    assert_eq!(single_message_size(SyntheticProfile::Large), 1024 * 1024);
}

#[test]
fn every_message_starts_with_the_cdr_le_header_and_has_the_hinted_size() {
    for topic in all_topics() {
        let mut enc = topic.encoder();
        for seq in [0, 1, 999, u64::MAX] {
            let mut buf = Vec::new();
            enc.encode(seq, 1_700_000_000_123_456_789, &mut buf);
            assert_eq!(&buf[..4], &[0, 1, 0, 0], "{}", topic.info.name);
            assert_eq!(buf.len(), enc.size_hint(), "{}", topic.info.name);
        }
    }
}

#[test]
fn headers_carry_the_given_stamp() {
    // Imu, Image and PointCloud2 start with std_msgs/Header: sec at payload 0, nanosec at 4.
    let stamp = 1_796_154_073_962_475_246i64;
    for topic in SyntheticProfile::Robot.topics() {
        let buf = encode_one(&topic, 7, stamp);
        // TFMessage starts with the u32 count of transforms, then the first header.
        let at = if topic.info.type_name == "tf2_msgs/msg/TFMessage" {
            8
        } else {
            4
        };
        let sec = i32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
        let nanosec = u32::from_le_bytes(buf[at + 4..at + 8].try_into().unwrap());
        assert_eq!(i64::from(sec), stamp / 1_000_000_000, "{}", topic.info.name);
        assert_eq!(
            i64::from(nanosec),
            stamp % 1_000_000_000,
            "{}",
            topic.info.name
        );
    }
}

#[test]
fn encoding_is_deterministic_and_varies_with_seq_and_stamp() {
    for topic in all_topics() {
        let a = encode_one(&topic, 42, 1_000_000_000);
        let b = encode_one(&topic, 42, 1_000_000_000);
        assert_eq!(a, b, "{} is deterministic", topic.info.name);
        assert_ne!(
            a,
            encode_one(&topic, 43, 1_000_000_000),
            "{} varies with seq",
            topic.info.name
        );
        assert_ne!(
            a,
            encode_one(&topic, 42, 2_000_000_000),
            "{} varies with stamp",
            topic.info.name
        );
    }
}

#[test]
fn reusing_an_encoder_gives_the_same_bytes_as_a_fresh_one() {
    // Patching a template must not leave traces of the previous message.
    for topic in all_topics() {
        let mut enc = topic.encoder();
        let mut buf = Vec::new();
        for seq in 0..5 {
            buf.clear();
            enc.encode(seq, seq as i64 * 1000, &mut buf);
        }
        assert_eq!(buf, encode_one(&topic, 4, 4000), "{}", topic.info.name);
    }
}

#[test]
fn buffers_do_not_grow_after_warm_up() {
    for topic in all_topics() {
        let mut enc = topic.encoder();
        let mut buf = Vec::new();
        enc.encode(0, 0, &mut buf);
        let (cap, ptr) = (buf.capacity(), buf.as_ptr());
        for seq in 1..200u64 {
            buf.clear();
            enc.encode(seq, seq as i64 * 2_500_000, &mut buf);
            assert_eq!(
                buf.capacity(),
                cap,
                "{} reallocated at seq {seq}",
                topic.info.name
            );
            assert_eq!(
                buf.as_ptr(),
                ptr,
                "{} reallocated at seq {seq}",
                topic.info.name
            );
        }
    }
}

#[test]
fn a_buffer_sized_by_size_hint_never_reallocates() {
    for topic in all_topics() {
        let mut enc = topic.encoder();
        let mut buf = Vec::with_capacity(enc.size_hint());
        let ptr = buf.as_ptr();
        enc.encode(3, 3, &mut buf);
        assert_eq!(buf.as_ptr(), ptr, "{}", topic.info.name);
    }
}

#[test]
fn robot_profile_has_the_issue_topics_types_and_rates() {
    let got: Vec<(String, String, f64)> = SyntheticProfile::Robot
        .topics()
        .into_iter()
        .map(|t| (t.info.name, t.info.type_name, t.rate_hz))
        .collect();
    let want = [
        ("/imu", "sensor_msgs/msg/Imu", 400.0),
        ("/tf", "tf2_msgs/msg/TFMessage", 100.0),
        ("/camera/front/image_raw", "sensor_msgs/msg/Image", 30.0),
        ("/camera/rear/image_raw", "sensor_msgs/msg/Image", 30.0),
        ("/points", "sensor_msgs/msg/PointCloud2", 10.0),
    ];
    assert_eq!(got.len(), want.len());
    for ((name, ty, rate), (wn, wt, wr)) in got.iter().zip(want) {
        assert_eq!((name.as_str(), ty.as_str(), *rate), (wn, wt, wr));
    }
}

#[test]
fn robot_profile_message_sizes_match_the_geometry() {
    let sizes: Vec<(String, usize)> = SyntheticProfile::Robot
        .topics()
        .iter()
        .map(|t| (t.info.name.clone(), t.encoder().size_hint()))
        .collect();
    for (name, size) in &sizes {
        match name.as_str() {
            // 1280 x 720 x 3 bytes of pixels plus a header of a few dozen bytes.
            n if n.starts_with("/camera/") => {
                assert!((2_764_800..2_764_800 + 128).contains(size), "{n}: {size}")
            }
            // 65536 points x 16 bytes plus header and field descriptions.
            "/points" => assert!(
                (1_048_576..1_048_576 + 256).contains(size),
                "/points: {size}"
            ),
            "/imu" => assert_eq!(
                *size,
                4 + 8 + 4 + 9 + 3 + 32 + 72 + 24 + 72 + 24 + 72,
                "/imu"
            ),
            _ => assert!(*size < 512, "{name}: {size}"),
        }
    }
}

#[test]
fn every_topic_carries_a_jazzy_hash_and_a_ros2msg_definition() {
    for topic in all_topics() {
        let def = &topic.definition;
        assert_eq!(def.topic_type, topic.info.type_name);
        assert_eq!(def.encoding, "ros2msg", "{}", def.topic_type);
        assert!(topic.info.type_description_hash.starts_with("RIHS01_"));
        assert_eq!(topic.info.type_description_hash.len(), 7 + 64);
        assert_eq!(def.type_description_hash, topic.info.type_description_hash);
        assert_eq!(topic.info.serialization_format, "cdr");
        assert!(topic.info.offered_qos_profiles.is_empty());
    }
}

#[test]
fn imu_definition_lists_dependencies_as_rosbag2_does() {
    let imu = &SyntheticProfile::Robot.topics()[0]
        .definition
        .encoded_message_definition;
    let delimiters: Vec<&str> = imu.lines().filter(|l| l.starts_with("MSG: ")).collect();
    // Sorted per file, depth first, each once: Header's own dependency follows Header.
    assert_eq!(
        delimiters,
        [
            "MSG: geometry_msgs/Quaternion",
            "MSG: geometry_msgs/Vector3",
            "MSG: std_msgs/Header",
            "MSG: builtin_interfaces/Time",
        ]
    );
    assert!(imu.contains("float64[9] linear_acceleration_covariance # Row major x, y z\n\n====="));
}

#[test]
fn tf_definition_qualifies_bare_type_names_with_the_package() {
    let tf = SyntheticProfile::Robot.topics()[1]
        .definition
        .encoded_message_definition
        .clone();
    let delimiters: Vec<&str> = tf.lines().filter(|l| l.starts_with("MSG: ")).collect();
    assert_eq!(
        delimiters,
        [
            "MSG: geometry_msgs/TransformStamped",
            "MSG: geometry_msgs/Transform",
            "MSG: geometry_msgs/Quaternion",
            "MSG: geometry_msgs/Vector3",
            "MSG: std_msgs/Header",
            "MSG: builtin_interfaces/Time",
        ]
    );
}

fn reference_bag() -> Option<PathBuf> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference-bags/jazzy/jazzy_ref");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: no reference bags at {}", dir.display());
        None
    }
}

#[test]
fn string_definition_and_hash_equal_the_real_jazzy_recording() {
    let Some(dir) = reference_bag() else { return };
    let db = rusqlite::Connection::open_with_flags(
        dir.join("jazzy_ref_0.db3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (topic_type, encoding, text, hash): (String, String, String, String) = db
        .query_row(
            "SELECT topic_type, encoding, encoded_message_definition, type_description_hash \
             FROM message_definitions",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    let small = &SyntheticProfile::Small.topics()[0];
    assert_eq!(small.definition.topic_type, topic_type);
    assert_eq!(small.definition.encoding, encoding);
    assert_eq!(small.definition.encoded_message_definition, text);
    assert_eq!(small.definition.type_description_hash, hash);
    let metadata = std::fs::read_to_string(dir.join("metadata.yaml")).unwrap();
    assert!(metadata.contains(&format!(
        "type_description_hash: {}",
        small.info.type_description_hash
    )));
}

#[test]
fn string_messages_have_the_framing_of_the_real_recording() {
    // The reference bag's "hi" is 00 01 00 00 | 03 00 00 00 | 'h' 'i' 00: length counts the NUL.
    let msg = encode_one(&SyntheticProfile::Small.topics()[0], 1, 2);
    let negative = encode_one(&SyntheticProfile::Small.topics()[0], 0xabc, -1);
    assert!(negative[8..].starts_with(b"seq=0000000000000abc stamp=ffffffffffffffff "));
    let len = u32::from_le_bytes(msg[4..8].try_into().unwrap()) as usize;
    assert_eq!(len, msg.len() - 8);
    assert_eq!(msg.last(), Some(&0));
    let text = std::str::from_utf8(&msg[8..msg.len() - 1]).unwrap();
    assert!(!text.contains('\0'));
    assert!(
        text.starts_with("seq=0000000000000001 stamp=0000000000000002 "),
        "{text}"
    );
}

/// Writes one message per synthetic topic, and a manifest, for `tests/interop/test_synthetic_cdr.py`
/// (which runs this with `RINGBAG_SYNTHETIC_DUMP_DIR` set) to decode with rosbags.
#[test]
#[ignore = "interop helper: run by tests/interop/test_synthetic_cdr.py"]
fn dumps_one_message_per_topic_for_rosbags() {
    let dir = PathBuf::from(
        std::env::var_os("RINGBAG_SYNTHETIC_DUMP_DIR").expect("set RINGBAG_SYNTHETIC_DUMP_DIR"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let mut manifest = Vec::new();
    for profile in ALL_PROFILES {
        for topic in profile.topics() {
            let seq = 77u64;
            let stamp_ns = 1_796_154_073_962_475_246i64;
            let data = encode_one(&topic, seq, stamp_ns);
            let file = format!(
                "{}{}.cdr",
                format!("{profile:?}").to_lowercase(),
                topic.info.name.replace('/', "_")
            );
            std::fs::write(dir.join(&file), &data).unwrap();
            manifest.push(serde_json::json!({
                "profile": format!("{profile:?}").to_lowercase(),
                "topic": topic.info.name,
                "type": topic.info.type_name,
                "file": file,
                "seq": seq,
                "stamp_ns": stamp_ns,
                "size": data.len(),
                "type_description_hash": topic.info.type_description_hash,
                "definition_encoding": topic.definition.encoding,
                "definition": topic.definition.encoded_message_definition,
            }));
        }
    }
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
}
