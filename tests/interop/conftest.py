"""Shared fixtures for the interop tests: ringbag against rosbags, no ROS needed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from rosbags.typesys import Stores, get_typestore

REPO_ROOT = Path(__file__).resolve().parents[2]

# Distros whose bag flavour ringbag writes, and rosbags' matching type store.
DISTROS = {"humble": Stores.ROS2_HUMBLE, "jazzy": Stores.ROS2_JAZZY}


def _cargo_target_dir() -> Path:
    # Ask cargo instead of guessing: honours CARGO_TARGET_DIR and .cargo/config.toml.
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(out)["target_directory"])


@pytest.fixture(scope="session")
def ringbag_bin() -> Path:
    """The ringbag binary: $RINGBAG_BIN (scripts/test.sh sets it), else a fresh debug build."""
    env_bin = os.environ.get("RINGBAG_BIN")
    if env_bin:
        path = Path(env_bin)
        if not path.is_file():
            pytest.fail(f"RINGBAG_BIN={env_bin} is not a file")
        return path
    subprocess.run(["cargo", "build", "--bin", "ringbag"], cwd=REPO_ROOT, check=True)
    return _cargo_target_dir() / "debug" / "ringbag"


@pytest.fixture
def tmp_bag_dir(tmp_path: Path) -> Path:
    """An empty directory to record bags into (a bag is created inside it, not as it)."""
    root = tmp_path / "bags"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def reference_bags() -> Path:
    """Bags recorded by the real `ros2 bag record`: ../shared/reference-bags next to the repo."""
    path = Path(os.environ.get("RINGBAG_REFERENCE_BAGS", REPO_ROOT.parent / "shared" / "reference-bags"))
    if not path.is_dir():
        pytest.skip(f"reference bags not found at {path} (set RINGBAG_REFERENCE_BAGS)")
    return path


@pytest.fixture(params=sorted(DISTROS), scope="session")
def distro(request: pytest.FixtureRequest) -> str:
    """Each bag flavour in turn: tests using it run once for humble and once for jazzy."""
    return request.param


@pytest.fixture(scope="session")
def typestore(distro: str):
    """rosbags' message definitions for `distro`, to decode CDR without ROS."""
    return get_typestore(DISTROS[distro])
