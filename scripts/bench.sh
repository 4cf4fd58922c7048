#!/usr/bin/env bash
# Recording throughput against this machine's own limits, measured in one run on the same
# filesystem, and playback timing.
#   Usage: scripts/bench.sh [--json] [--dir DIR] [--quick] [--only write|large|robot|upload|plots|compress]
#                           [--rounds N] [--robot-rounds N] [--ringbag BIN] [--play-only]
# Prints messages/s, MB/s, CPU s per GB, drops and peak RSS for ringbag, beside `dd` and a bare
# SQLite insert loop with the same rows, pragmas and batch size, and the ratios; then 100 B,
# 1 MiB and 6 MiB messages against the floor (bare loop, blobs bound in place, 64 KiB pages),
# --rounds times back to back (median ratio and range: one load spike costs one round), with the
# writer's longest stall and the copies per message; and the robot mix in real time with 64 MiB
# and 1 GiB splits (--robot-rounds times). `--ringbag BIN` measures another build (e.g. an older
# one) against the same floor. On a VM guest with free page reporting it says how much memory
# went back to the host during the run (fresh memory is slow there). Playback: the error of each
# message's send time against its schedule (p50/p99/max) at rate 1 and 10 beside a bare sleep
# loop, time to the first message in the middle of a >= 5 GB bag, peak RSS, CPU.
# Upload (--only upload; needs Garage, see scripts/garage.sh, and boto3 in .venv): 2 GiB of
# 256 MiB splits to Garage on loopback by `ringbag upload` and by boto3's upload_file (the
# reference: same part size and parts in flight), MB/s, CPU s per GB and peak RSS of each, both
# read back byte for byte; then the robot mix in real time without and with uploads running.
# Compression (--only compress): ratio and CPU s/GB of zstd levels 1 and 3 on the robot mix and
# the lidar cloud with realistic payloads (ringbag's compress_file, timed by its thread's CPU
# clock, beside the zstd CLI), and the robot mix in real time with and without file mode.
# --only plots: the sections scripts/plot-bench.py draws (floor rounds with a dd row per round,
# the robot mix with its writer's stalls second by second, playback timing with its
# distributions), e.g. `scripts/bench.sh --json --quick --only plots > docs/bench/bench.json`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ringbag --example bare_sqlite --example bare_queue --example sleep_jitter --example insert_probe --example metrics_cost --example zstd_file
# Copies per message: an LD_PRELOAD counter of memcpy/memmove bytes (scripts/bench/copycount.c).
# The C compiler is the one rusqlite's bundled SQLite is built with.
mkdir -p target/release
cc -O2 -shared -fPIC -o target/release/copycount.so scripts/bench/copycount.c -ldl
exec python3 scripts/bench.py "$@"
