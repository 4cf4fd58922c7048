//! Recording end to end through the binary.

use ringbag::bag::reader::{Bag, ReadFilter};

use crate::common::{run, stderr};

#[test]
fn synthetic_robot_recording_gives_a_complete_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("robot");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "500",
        "--bag-format",
        "humble",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bag = Bag::open(&out).unwrap();
    assert_eq!(bag.metadata.message_count, 500);
    assert_eq!(bag.metadata.version, 5);
    let names: Vec<&str> = bag.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "/imu",
            "/tf",
            "/camera/front/image_raw",
            "/camera/rear/image_raw",
            "/points"
        ]
    );
    let n = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len();
    assert_eq!(n, 500);
    assert_eq!(
        bag.metadata.custom_data.len(),
        0,
        "humble metadata has no custom_data"
    );
}
