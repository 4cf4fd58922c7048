#!/usr/bin/env bash
# The race of issue 11: `ringbag record --source ros` and `ros2 bag record` record the same
# reliable publisher (examples/ros_flood.rs) at the same time, in four scenarios, RUNS times
# each (default 5). Prints per scenario the median kept counts, CPU and peak RSS of both and
# the losses ringbag reported; the markdown table also goes to --out FILE / $BENCH_ROS_OUT.
#
# Usage: scripts/bench-ros.sh [--distro humble|jazzy] [--runs N] [--scenarios 1,3] [--out FILE]
#                             [--dir DIR] [--keep]
#   --distro D  run against that distro: the prebuilt of ../shared/ros2-prebuilt (installed
#               when missing; root or sudo) or /opt/ros/D, in a clean environment. Without it
#               the ROS 2 already sourced in this shell is used.
#   env: RUNS, SCENARIOS, BENCH_ROS_OUT, BENCH_ROS_DIR, BENCH_ROS_DOMAIN_ID (default 87),
#        CARGO_TARGET_DIR (the build goes to $CARGO_TARGET_DIR/ros-$ROS_DISTRO, default
#        target/ros-$ROS_DISTRO as for scripts/ros-test.sh: r2r's bindings are per distro)
# Without --distro and without a sourced ROS 2 it says why and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

DISTRO=""
if [[ "${1:-}" == --distro ]]; then
    [[ $# -ge 2 ]] || { echo "bench-ros: --distro needs humble or jazzy" >&2; exit 2; }
    DISTRO="$2"
    shift 2
elif [[ "${1:-}" == --distro=* ]]; then
    DISTRO="${1#--distro=}"
    shift
fi

# shellcheck source=scripts/ros-env.sh
source scripts/ros-env.sh
if [[ -n "$DISTRO" ]]; then
    ros_env_find "$DISTRO" || exit 2
    [[ -z "$ROS_SKIP" ]] || { echo "bench-ros: $ROS_SKIP" >&2; exit 1; }
    [[ -f "$ROS_SETUP" ]] || ros_env_install "$DISTRO"
    ros_env_source "$DISTRO"
elif ! command -v ros2 >/dev/null 2>&1 || [ -z "${AMENT_PREFIX_PATH:-}" ]; then
    echo "bench-ros: skipped: no sourced ROS 2 (need \`ros2\` on PATH and AMENT_PREFIX_PATH set, or --distro humble|jazzy)"
    exit 0
fi

# DDS on loopback only (see tests/ros_live.rs), in a domain of its own.
ros_env_loopback
export ROS_DOMAIN_ID="${BENCH_ROS_DOMAIN_ID:-87}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/ros-${ROS_DISTRO:-unknown}"

echo "bench-ros: ROS 2 $ROS_DISTRO; building ringbag and examples/ros_flood (--features ros --release) in $CARGO_TARGET_DIR"
nice -n 10 cargo build --release --quiet --features ros --bin ringbag --example ros_flood
exec python3 scripts/bench_ros.py \
    --ringbag "$CARGO_TARGET_DIR/release/ringbag" \
    --flood "$CARGO_TARGET_DIR/release/examples/ros_flood" "$@"
