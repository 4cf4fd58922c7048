"""Decode ringbag's synthetic messages with rosbags, an independent CDR implementation.

Checks that every synthetic topic's bytes are valid CDR for its type (they deserialize, the
field values are the ones the generator promises, and rosbags re-serializes them to the very
same bytes), and that the embedded Jazzy interface data (RIHS01 hashes, ros2msg definitions)
equal what rosbags computes.

The messages come from the ignored Rust test `dumps_one_message_per_topic_for_rosbags`.
Set RINGBAG_SYNTHETIC_DUMP_DIR to a directory it already filled, or leave it unset and this
module runs cargo itself (honouring CARGO_TARGET_DIR).

    tests/interop/setup_venv.sh .venv && .venv/bin/pytest tests/interop/test_synthetic_cdr.py
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import struct
import subprocess
from pathlib import Path

import pytest
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

REPO = Path(__file__).resolve().parents[2]
REFERENCE_BAG = REPO.parent / "shared/reference-bags/jazzy/jazzy_ref"

# (profile, topic, type): what the generator must offer.
EXPECTED_TOPICS = [
    ("robot", "/imu", "sensor_msgs/msg/Imu"),
    ("robot", "/tf", "tf2_msgs/msg/TFMessage"),
    ("robot", "/camera/front/image_raw", "sensor_msgs/msg/Image"),
    ("robot", "/camera/rear/image_raw", "sensor_msgs/msg/Image"),
    ("robot", "/points", "sensor_msgs/msg/PointCloud2"),
    ("small", "/synthetic/small", "std_msgs/msg/String"),
    ("medium", "/synthetic/medium", "std_msgs/msg/String"),
    ("large", "/synthetic/large", "std_msgs/msg/String"),
]
STRING_SIZES = {"small": 100, "medium": 64 * 1024, "large": 1024 * 1024}


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("RINGBAG_SYNTHETIC_DUMP_DIR")
    if given and (Path(given) / "manifest.json").is_file():
        return Path(given)
    out = Path(given) if given else tmp_path_factory.mktemp("synthetic_dump")
    subprocess.run(
        [
            "cargo", "test", "--quiet", "--test", "synthetic_cdr", "--",
            "--ignored", "--exact", "dumps_one_message_per_topic_for_rosbags",
        ],
        cwd=REPO,
        env={**os.environ, "RINGBAG_SYNTHETIC_DUMP_DIR": str(out)},
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def manifest(dump_dir: Path) -> dict[str, dict]:
    entries = json.loads((dump_dir / "manifest.json").read_text())
    return {f"{e['profile']}:{e['topic']}": e for e in entries}


@pytest.fixture(scope="module")
def jazzy():
    return get_typestore(Stores.ROS2_JAZZY)


def load(dump_dir: Path, entry: dict) -> bytes:
    return (dump_dir / entry["file"]).read_bytes()


def check_stamp(header, entry: dict) -> None:
    sec, nanosec = divmod(entry["stamp_ns"], 1_000_000_000)
    assert (header.stamp.sec, header.stamp.nanosec) == (sec, nanosec)


def test_the_generator_offers_exactly_the_expected_topics(manifest):
    got = sorted((e["profile"], e["topic"], e["type"]) for e in manifest.values())
    assert got == sorted(EXPECTED_TOPICS)


@pytest.mark.parametrize(("profile", "topic", "typename"), EXPECTED_TOPICS)
def test_message_decodes_and_reserializes_to_the_same_bytes(
    dump_dir, manifest, jazzy, profile, topic, typename
):
    entry = manifest[f"{profile}:{topic}"]
    data = load(dump_dir, entry)
    assert len(data) == entry["size"]
    assert data[:4] == b"\x00\x01\x00\x00"
    msg = jazzy.deserialize_cdr(data, typename)
    # Same bytes back means our alignment, padding and lengths are exactly rmw's.
    assert bytes(jazzy.serialize_cdr(msg, typename)) == data


@pytest.mark.parametrize(("profile", "topic", "typename"), EXPECTED_TOPICS)
def test_embedded_hash_equals_what_rosbags_computes(manifest, jazzy, profile, topic, typename):
    entry = manifest[f"{profile}:{topic}"]
    assert entry["type_description_hash"] == jazzy.hash_rihs01(typename)


@pytest.mark.parametrize(("profile", "topic", "typename"), EXPECTED_TOPICS)
def test_embedded_definition_describes_the_jazzy_type(manifest, jazzy, profile, topic, typename):
    entry = manifest[f"{profile}:{topic}"]
    assert entry["definition_encoding"] == "ros2msg"
    text = entry["definition"]
    # Parse our definition alone (an empty store), then hash it: equal hashes mean the same
    # fields, types and dependencies as Jazzy's typestore, recursively.
    store = get_typestore(Stores.EMPTY)
    store.register(get_types_from_msg(text, typename))
    assert store.hash_rihs01(typename) == jazzy.hash_rihs01(typename)
    # rosbag2's layout: dependency sections introduced by 80 '=' and "MSG: pkg/Type".
    ours = {line[5:] for line in text.splitlines() if line.startswith("MSG: ")}
    theirs_text, _ = jazzy.generate_msgdef(typename, ros_version=2)
    theirs = {line[5:] for line in theirs_text.splitlines() if line.startswith("MSG: ")}
    assert ours == theirs
    assert all(
        prev == "=" * 80
        for prev, line in zip(text.splitlines(), text.splitlines()[1:])
        if line.startswith("MSG: ")
    )


def test_string_definition_equals_the_real_jazzy_recording(manifest):
    if not REFERENCE_BAG.is_dir():
        pytest.skip(f"no reference bag at {REFERENCE_BAG}")
    db = sqlite3.connect(f"file:{REFERENCE_BAG / 'jazzy_ref_0.db3'}?mode=ro", uri=True)
    row = db.execute(
        "SELECT topic_type, encoding, encoded_message_definition, type_description_hash"
        " FROM message_definitions"
    ).fetchone()
    entry = manifest["small:/synthetic/small"]
    assert row == (entry["type"], entry["definition_encoding"], entry["definition"],
                   entry["type_description_hash"])


def test_imu_fields(dump_dir, manifest, jazzy):
    entry = manifest["robot:/imu"]
    msg = jazzy.deserialize_cdr(load(dump_dir, entry), entry["type"])
    check_stamp(msg.header, entry)
    assert msg.header.frame_id == "imu_link"
    q = msg.orientation
    assert math.isclose(q.x**2 + q.y**2 + q.z**2 + q.w**2, 1.0, rel_tol=1e-12)
    assert math.isclose(q.z, math.sin(entry["seq"] * 0.001 / 2), rel_tol=1e-12)
    for cov in (msg.orientation_covariance, msg.angular_velocity_covariance,
                msg.linear_acceleration_covariance):
        assert list(cov) == [0.01, 0, 0, 0, 0.01, 0, 0, 0, 0.01]
    assert msg.angular_velocity.z == 0.4
    assert msg.linear_acceleration.z == 9.80665


def test_tf_fields(dump_dir, manifest, jazzy):
    entry = manifest["robot:/tf"]
    msg = jazzy.deserialize_cdr(load(dump_dir, entry), entry["type"])
    frames = [(t.header.frame_id, t.child_frame_id) for t in msg.transforms]
    assert frames == [("map", "odom"), ("odom", "base_link")]
    for t in msg.transforms:
        check_stamp(t.header, entry)
        r = t.transform.rotation
        assert math.isclose(r.x**2 + r.y**2 + r.z**2 + r.w**2, 1.0, rel_tol=1e-12)
    base = msg.transforms[1].transform.translation
    assert math.isclose(math.hypot(base.x, base.y), 5.0, rel_tol=1e-12)


@pytest.mark.parametrize("camera", ["front", "rear"])
def test_image_fields(dump_dir, manifest, jazzy, camera):
    entry = manifest[f"robot:/camera/{camera}/image_raw"]
    msg = jazzy.deserialize_cdr(load(dump_dir, entry), entry["type"])
    check_stamp(msg.header, entry)
    assert msg.header.frame_id == f"camera_{camera}_optical_frame"
    assert (msg.height, msg.width, msg.encoding) == (720, 1280, "rgb8")
    assert msg.is_bigendian == 0
    assert msg.step == 1280 * 3
    assert len(msg.data) == msg.step * msg.height
    assert bytes(msg.data[:8]) == struct.pack("<Q", entry["seq"])
    # Pixel (x=100, y=360) of the gradient: red along x, green along y, blue constant.
    px = msg.data[360 * msg.step + 100 * 3: 360 * msg.step + 100 * 3 + 3]
    assert list(px) == [100 * 255 // 1280, 360 * 255 // 720, 128]


def test_point_cloud_fields(dump_dir, manifest, jazzy):
    entry = manifest["robot:/points"]
    data = load(dump_dir, entry)
    msg = jazzy.deserialize_cdr(data, entry["type"])
    check_stamp(msg.header, entry)
    assert msg.header.frame_id == "lidar_link"
    assert (msg.height, msg.width) == (1, 65536)
    fields = [(f.name, f.offset, f.datatype, f.count) for f in msg.fields]
    float32 = 7  # sensor_msgs/PointField FLOAT32
    assert fields == [("x", 0, float32, 1), ("y", 4, float32, 1), ("z", 8, float32, 1),
                      ("intensity", 12, float32, 1)]
    assert not msg.is_bigendian
    assert (msg.point_step, msg.row_step) == (16, 16 * 65536)
    assert len(msg.data) == msg.row_step * msg.height
    assert msg.is_dense
    _, _, _, intensity = struct.unpack_from("<4f", bytes(msg.data[:16]))
    assert intensity == float(entry["seq"])
    assert 1_000_000 <= len(data) <= 1_100_000  # "about 1 MB"


@pytest.mark.parametrize("profile", ["small", "medium", "large"])
def test_string_fields_and_exact_sizes(dump_dir, manifest, jazzy, profile):
    entry = manifest[f"{profile}:/synthetic/{profile}"]
    data = load(dump_dir, entry)
    assert len(data) == STRING_SIZES[profile]
    msg = jazzy.deserialize_cdr(data, entry["type"])
    assert len(msg.data.encode()) == STRING_SIZES[profile] - 9
    assert msg.data.startswith(f"seq={entry['seq']:016x} stamp={entry['stamp_ns']:016x} ")
    assert msg.data.isprintable()
