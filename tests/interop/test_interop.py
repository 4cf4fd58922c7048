"""ringbag against an independent implementation of rosbag2: the pure-Python `rosbags`.

1. rosbags reads what ringbag writes, message by message, in both flavours, across splits,
   and decodes the CDR of every synthetic type.
2. ringbag reads what rosbags writes (metadata versions 8 and 9): `info --json` reports it
   exactly and `play --sink echo` returns the same messages.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import Writer

STAMPED = {
    "sensor_msgs/msg/Imu",
    "sensor_msgs/msg/Image",
    "sensor_msgs/msg/PointCloud2",
}


def ringbag(bin_: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_), *args], capture_output=True, text=True, check=check)


def record(bin_: Path, out: Path, distro: str, *extra: str) -> dict:
    ringbag(bin_, "record", "-o", str(out), "--source", "synthetic", "--synthetic-rate", "max",
            "--bag-format", distro, *extra)
    return json.loads(ringbag(bin_, "info", "--json", str(out)).stdout)


def rows_on_disk(bag: Path) -> list[tuple[str, int, bytes]]:
    """Every stored row, straight from SQLite, in time order across splits."""
    out = []
    meta_files = sorted(bag.glob("*.db3"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    for db in meta_files:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        topics = dict(con.execute("SELECT id, name FROM topics"))
        out += [(topics[t], ts, bytes(d)) for t, ts, d in
                con.execute("SELECT topic_id, timestamp, data FROM messages ORDER BY timestamp, id")]
        con.close()
    out.sort(key=lambda r: r[1])
    return out


def test_rosbags_reads_the_robot_profile_message_by_message(ringbag_bin, tmp_bag_dir, distro, typestore):
    bag = tmp_bag_dir / f"robot_{distro}"
    info = record(ringbag_bin, bag, distro, "--synthetic-count", "400", "-b", "24MiB")
    assert len(info["files"]) >= 3, "several splits"
    written = rows_on_disk(bag)
    assert len(written) == info["message_count"] == 400

    seen = []
    with AnyReader([bag], default_typestore=typestore) as reader:
        assert {c.topic: c.msgtype for c in reader.connections} == {t["name"]: t["type"] for t in info["topics"]}
        for conn, ts, raw in reader.messages():
            seen.append((conn.topic, ts, bytes(raw)))
            msg = reader.deserialize(raw, conn.msgtype)
            if conn.msgtype in STAMPED:
                # ringbag stamps the header with the same receive time it stores.
                assert msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec == ts
            if conn.msgtype == "sensor_msgs/msg/Image":
                assert (msg.width, msg.height, msg.encoding) == (1280, 720, "rgb8")
                assert len(msg.data) == msg.step * msg.height == 1280 * 720 * 3
            elif conn.msgtype == "sensor_msgs/msg/PointCloud2":
                assert len(msg.data) == msg.row_step * msg.height == msg.point_step * msg.width * msg.height
                assert [f.name for f in msg.fields] == ["x", "y", "z", "intensity"]
            elif conn.msgtype == "tf2_msgs/msg/TFMessage":
                assert len(msg.transforms) >= 1
                assert msg.transforms[0].header.frame_id
            elif conn.msgtype == "sensor_msgs/msg/Imu":
                assert len(msg.orientation_covariance) == 9
    assert seen == written, "same topics, timestamps and bytes, in the same order"
    counts = {}
    for topic, _, _ in seen:
        counts[topic] = counts.get(topic, 0) + 1
    assert counts == {t["name"]: t["message_count"] for t in info["topics"]}


def test_rosbags_reads_strings_across_many_splits(ringbag_bin, tmp_bag_dir, distro, typestore):
    bag = tmp_bag_dir / f"small_{distro}"
    info = record(ringbag_bin, bag, distro, "--synthetic-profile", "small", "--synthetic-count", "3000",
                  "-b", "86016")
    assert len(info["files"]) >= 3
    echoed = [json.loads(line) for line in
              ringbag(ringbag_bin, "play", str(bag), "--sink", "echo", "--echo-format", "jsonl",
                      "--rate", "1000000").stdout.splitlines()]
    with AnyReader([bag], default_typestore=typestore) as reader:
        got = []
        for conn, ts, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            assert conn.msgtype == "std_msgs/msg/String"
            assert len(raw) == 100 and isinstance(msg.data, str)
            got.append({"topic": conn.topic, "bag_ns": ts, "data_hex": bytes(raw).hex()})
    assert len(got) == 3000
    assert got == [{k: e[k] for k in ("topic", "bag_ns", "data_hex")} for e in echoed]


@pytest.mark.parametrize("version", [8, 9])
def test_ringbag_reads_what_rosbags_writes(ringbag_bin, tmp_path, version, typestore):
    bag = tmp_path / f"from_rosbags_v{version}"
    String = typestore.types["std_msgs/msg/String"]
    Imu = typestore.types["sensor_msgs/msg/Imu"]
    written = []
    with Writer(bag, version=version) as w:
        chatter = w.add_connection("/chatter", String.__msgtype__, typestore=typestore)
        imu = w.add_connection("/imu", Imu.__msgtype__, typestore=typestore)
        Header = typestore.types["std_msgs/msg/Header"]
        Time = typestore.types["builtin_interfaces/msg/Time"]
        Quat = typestore.types["geometry_msgs/msg/Quaternion"]
        Vec3 = typestore.types["geometry_msgs/msg/Vector3"]
        import numpy as np
        for i in range(25):
            ts = 1_700_000_000_000_000_000 + i * 10_000_000
            data = typestore.serialize_cdr(String(data=f"hello {i}"), String.__msgtype__)
            w.write(chatter, ts, data)
            written.append(("/chatter", ts, bytes(data)))
            if i % 5 == 0:
                m = Imu(header=Header(stamp=Time(sec=ts // 10**9, nanosec=ts % 10**9), frame_id="imu"),
                        orientation=Quat(x=0.0, y=0.0, z=0.0, w=1.0), orientation_covariance=np.zeros(9),
                        angular_velocity=Vec3(x=0.1, y=0.2, z=0.3), angular_velocity_covariance=np.zeros(9),
                        linear_acceleration=Vec3(x=0.0, y=0.0, z=9.81),
                        linear_acceleration_covariance=np.zeros(9))
                d = typestore.serialize_cdr(m, Imu.__msgtype__)
                w.write(imu, ts + 1, d)
                written.append(("/imu", ts + 1, bytes(d)))

    info = json.loads(ringbag(ringbag_bin, "info", "--json", str(bag)).stdout)
    assert info["version"] == version
    assert info["storage_identifier"] == "sqlite3"
    assert info["message_count"] == len(written) == 30
    assert info["starting_time_ns"] == written[0][1]
    assert info["duration_ns"] == written[-1][1] - written[0][1]
    assert sorted((t["name"], t["type"], t["serialization_format"], t["message_count"]) for t in info["topics"]) == [
        ("/chatter", "std_msgs/msg/String", "cdr", 25),
        ("/imu", "sensor_msgs/msg/Imu", "cdr", 5),
    ]
    db3 = sorted(bag.glob("*.db3"))
    assert [f["path"] for f in info["files"]] == [p.name for p in db3]
    assert info["files"][0]["size_bytes"] == db3[0].stat().st_size
    assert info["size_bytes"] == sum(p.stat().st_size for p in db3)

    echoed = [json.loads(line) for line in
              ringbag(ringbag_bin, "play", str(bag), "--sink", "echo", "--echo-format", "jsonl",
                      "--rate", "1000000").stdout.splitlines()]
    assert [(e["topic"], e["bag_ns"], bytes.fromhex(e["data_hex"])) for e in echoed] == written
