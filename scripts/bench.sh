#!/usr/bin/env bash
# Recording throughput against this machine's own limits, measured in one run on the same
# filesystem. Usage: scripts/bench.sh [--json] [--dir DIR] [--quick]
# Prints messages/s, MB/s, CPU s per GB, drops and peak RSS for ringbag, beside `dd` and a bare
# rusqlite insert loop with the same rows, pragmas and batch size, and the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ringbag --example bare_sqlite
exec python3 scripts/bench.py "$@"
