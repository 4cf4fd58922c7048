#!/bin/sh
# Creates the Python venv the interop tests use (rosbags + pytest), at $1 or ./.venv.
# Usage: tests/interop/setup_venv.sh [venv-dir]
#   then: .venv/bin/pytest tests/interop/test_synthetic_cdr.py
set -eu
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# rosbags is pure Python and knows ROS 2 Jazzy's types (CDR codec, RIHS01 hashes).
"$venv/bin/pip" install --quiet 'rosbags>=0.10' pytest
"$venv/bin/python" -c 'import rosbags; print("rosbags", rosbags.__version__ if hasattr(rosbags, "__version__") else "installed")'
