#!/usr/bin/env bash
# Recording throughput against this machine's own limits, measured in one run on the same
# filesystem, and playback timing. Usage: scripts/bench.sh [--json] [--dir DIR] [--quick] [--play-only]
# Prints messages/s, MB/s, CPU s per GB, drops and peak RSS for ringbag, beside `dd` and a bare
# rusqlite insert loop with the same rows, pragmas and batch size, and the ratios. Playback: the
# error of each message's send time against its schedule (p50/p99/max) at rate 1 and 10 beside
# a bare sleep loop, time to the first message in the middle of a >= 5 GB bag, peak RSS, CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ringbag --example bare_sqlite --example sleep_jitter
exec python3 scripts/bench.py "$@"
