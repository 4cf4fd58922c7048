"""The black box's crash bag, read by rosbags: kill -9 of the recorder 100 ms after a trigger,
restart, and every message of the pre-window (all of the ring) is in the bag the restart
writes, in order, decodable.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from rosbags.highlevel import AnyReader
# rosbags' own YAML library: the venv has nothing else.
from ruamel.yaml import YAML


def _wait_for(path: Path, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return path.exists()


def test_crash_bag_after_kill_9_holds_every_pre_window_message(ringbag_bin, tmp_path, distro, typestore):
    root = tmp_path / "root"
    sock = tmp_path / "control.sock"
    ring = tmp_path / "ring"
    common = ["--source", "synthetic", "--clock", "system", "--bag-format", distro,
              "--synthetic-profile", "small", "--snapshot-size", "16MiB", "--snapshot-file", str(ring)]
    rec = subprocess.Popen([str(ringbag_bin), "record", *common, "--control-socket", str(sock),
                            "-o", str(root / "first")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(sock, 20), "control socket appears"
        time.sleep(0.5)  # some pre-window; the checks below do not depend on how much
        t = subprocess.run([str(ringbag_bin), "trigger", "--control-socket", str(sock),
                            "--reason", "interop crash"], capture_output=True, text=True, timeout=30)
        assert t.returncode == 0, t.stderr
        time.sleep(0.1)
    finally:
        rec.send_signal(signal.SIGKILL)
        rec.wait()
    again = subprocess.run([str(ringbag_bin), "record", *common, "--synthetic-count", "1",
                            "-o", str(root / "second")], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    crash = [p for p in root.iterdir() if "_crash_interop-crash" in p.name]
    assert len(crash) == 1, sorted(p.name for p in root.iterdir())
    meta = YAML(typ="safe").load((crash[0] / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    trigger_ns = None
    if distro == "jazzy":
        custom = meta["custom_data"]
        assert custom["ringbag.snapshot.reason"] == "interop crash"
        trigger_ns = int(custom["ringbag.snapshot.trigger_time_ns"])
    seqs, stamps = [], []
    with AnyReader([crash[0]], default_typestore=typestore) as reader:
        assert [(c.topic, c.msgtype) for c in reader.connections] == [
            ("/synthetic/small", "std_msgs/msg/String")
        ]
        for conn, ts, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            m = re.match(r"seq=([0-9a-f]{16}) ", msg.data)
            assert m, msg.data[:40]
            seqs.append(int(m.group(1), 16))
            stamps.append(ts)
    assert seqs == list(range(len(seqs))), "every message from the first one, no gap"
    if trigger_ns is not None:
        assert sum(1 for s in stamps if s <= trigger_ns) >= 100
        assert stamps[-1] > trigger_ns
