#!/usr/bin/env bash
# The main job on its built-in default: record the synthetic robot (IMU 400 Hz, tf 100 Hz,
# two 720p cameras at 30 Hz, a 1 MB point cloud at 10 Hz) for ~5 s into a bag split every
# 64 MiB, then describe it. Needs only a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-demo_bags/robot_$(date +%Y%m%d_%H%M%S)}
mkdir -p "$(dirname "$out")"
cargo build --release --quiet
./target/release/ringbag record --source synthetic --synthetic-profile robot \
  --synthetic-count 2700 -b 64MiB -o "$out"
./target/release/ringbag info "$out"
