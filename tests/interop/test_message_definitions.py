"""ringbag's `message_definitions` rows against rosbags, an independent .msg reader.

ringbag composes a type's `ros2msg` text the way rosbag2 Jazzy does (src/source/msgdef.rs):
the type's .msg file, then every nested type after an 80 `=` line and `MSG: pkg/Type`. Here
rosbags parses that concatenation as it parses a bag's definitions (`AnyReader` hands the
whole text to `get_types_from_msg`), and the result must equal what rosbags reads from the
individual .msg files: the same types, with the same fields and constants.

The .msg files come from tests/interop/data/jazzy_msg (verbatim Jazzy copies, so this runs
without ROS) and, when a ROS 2 Jazzy installation is found (AMENT_PREFIX_PATH or
/opt/ros2-jazzy), from that installation too.

    .venv/bin/pytest tests/interop/test_message_definitions.py
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from rosbags.highlevel import AnyReader
from rosbags.typesys import get_types_from_msg

HERE = Path(__file__).resolve().parent
VENDORED_SHARE = HERE / "data" / "jazzy_msg"

# sensor_msgs/msg/Image and every type nested in it.
IMAGE_TREE = ["sensor_msgs/msg/Image", "std_msgs/msg/Header", "builtin_interfaces/msg/Time"]


def installed_shares() -> list[Path]:
    """`share` directories of a ROS 2 Jazzy installation, in AMENT_PREFIX_PATH order."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(":") if p]
    prefixes.append("/opt/ros2-jazzy")
    return [Path(p) / "share" for p in prefixes if (Path(p) / "share").is_dir()]


def msg_file(shares: list[Path], type_name: str) -> Path | None:
    pkg, _, name = type_name.split("/")
    for share in shares:
        path = share / pkg / "msg" / f"{name}.msg"
        if path.is_file():
            return path
    return None


@pytest.fixture(params=["vendored", "installed"])
def msg_shares(request: pytest.FixtureRequest) -> list[Path]:
    if request.param == "vendored":
        return [VENDORED_SHARE]
    shares = installed_shares()
    if any(msg_file(shares, t) is None for t in IMAGE_TREE):
        pytest.skip("no ROS 2 installation with sensor_msgs, std_msgs and builtin_interfaces")
    return shares


@pytest.fixture(scope="module")
def robot_bag(ringbag_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Jazzy bag from the synthetic robot profile, which has sensor_msgs/msg/Image topics."""
    bag = tmp_path_factory.mktemp("msgdef") / "robot"
    subprocess.run(
        [str(ringbag_bin), "record", "-o", str(bag), "--source", "synthetic",
         "--synthetic-profile", "robot", "--synthetic-rate", "max", "--synthetic-count", "5",
         "--bag-format", "jazzy", "--clock", "system"],
        check=True, capture_output=True,
    )
    return bag


def definition_row(bag: Path, type_name: str) -> tuple[str, str]:
    (db,) = bag.glob("*.db3")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT encoding, encoded_message_definition FROM message_definitions"
            " WHERE topic_type = ?", (type_name,),
        ).fetchall()
    finally:
        con.close()
    assert len(rows) == 1, rows
    return rows[0]


def test_image_definition_parses_to_the_types_of_the_individual_msg_files(robot_bag, msg_shares):
    encoding, text = definition_row(robot_bag, "sensor_msgs/msg/Image")
    assert encoding == "ros2msg"
    # As AnyReader reads a ros2msg row: the whole concatenation, named by the topic's type.
    ours = get_types_from_msg(text, "sensor_msgs/msg/Image")

    theirs = {}
    for type_name in IMAGE_TREE:
        path = msg_file(msg_shares, type_name)
        assert path is not None, type_name
        theirs.update(get_types_from_msg(path.read_text(), type_name))

    assert sorted(ours) == sorted(theirs) == sorted(IMAGE_TREE)
    for type_name in IMAGE_TREE:
        # (constants, fields): names, types and array bounds, in order.
        assert ours[type_name] == theirs[type_name], type_name
    consts, fields = ours["sensor_msgs/msg/Image"]
    assert [f[0] for f in fields] == [
        "header", "height", "width", "encoding", "is_bigendian", "step", "data",
    ]
    assert [f[0] for f in ours["std_msgs/msg/Header"][1]] == ["stamp", "frame_id"]
    assert [f[0] for f in ours["builtin_interfaces/msg/Time"][1]] == ["sec", "nanosec"]


def test_the_bag_decodes_from_its_own_definitions(robot_bag):
    """No default type store: rosbags must take every type from the bag, and its RIHS01 hash
    of each parsed definition must equal the stored type_description_hash."""
    with AnyReader([robot_bag]) as reader:
        images = [c for c in reader.connections if c.msgtype == "sensor_msgs/msg/Image"]
        assert images
        decoded = 0
        for conn, _, raw in reader.messages(connections=images):
            msg = reader.deserialize(raw, conn.msgtype)
            assert (msg.width, msg.height, msg.encoding) == (1280, 720, "rgb8")
            assert msg.header.frame_id
            decoded += 1
        assert decoded >= 1
