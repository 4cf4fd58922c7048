#!/usr/bin/env bash
# Recording throughput against this machine's own limits, measured in one run on the same
# filesystem, and playback timing. Usage: scripts/bench.sh [--json] [--dir DIR] [--quick] [--play-only]
# Prints messages/s, MB/s, CPU s per GB, drops and peak RSS for ringbag, beside `dd` and a bare
# SQLite insert loop with the same rows, pragmas and batch size, and the ratios; then large
# messages (1 MiB, 6 MiB) with the writer's longest stall and the copies per message, and the
# robot mix in real time with 64 MiB and 1 GiB splits. `--ringbag BIN` measures another build
# (e.g. an older one) against the same floor. Playback: the error of each message's send time
# against its schedule (p50/p99/max) at rate 1 and 10 beside a bare sleep loop, time to the
# first message in the middle of a >= 5 GB bag, peak RSS, CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ringbag --example bare_sqlite --example sleep_jitter
# Copies per message: an LD_PRELOAD counter of memcpy/memmove bytes (scripts/bench/copycount.c).
# The C compiler is the one rusqlite's bundled SQLite is built with.
mkdir -p target/release
cc -O2 -shared -fPIC -o target/release/copycount.so scripts/bench/copycount.c -ldl
exec python3 scripts/bench.py "$@"
