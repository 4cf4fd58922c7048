#!/usr/bin/env bash
# The live ROS 2 tests against one real distro: builds the `ros` feature against it and runs
# tests/ros_live.rs in full (the rcl take loop, QoS adaptation, message definitions and type
# hashes, `~/snapshot`, the recorder's `~/pause`/`~/resume`/`~/is_paused`/`~/split_bagfile` and
# `events/write_split`, play to real topics, and the distro's own `ros2 bag`: info, play and
# reindex on ringbag's bags of both formats, and a recording beside `ros2 bag record`); for
# jazzy also the README's `ros2 bag` parity table against `ros2 bag record/play --help`.
#
#   scripts/ros-test.sh humble|jazzy [--no-install] [-- test-binary args, e.g. a name filter]
#
# The distro comes from ../shared/ros2-prebuilt (installed when missing, needs root or sudo) or
# /opt/ros/<distro>; without either it prints `ros-<distro>: SKIPPED: <why>` and exits 0. With
# a distro present nothing skips: a test that cannot reach ROS fails (RINGBAG_ROS_REQUIRED=1).
# The last line is `ros-<distro>: N passed, M failed`.
#
# Env: CARGO_TARGET_DIR (the build goes to $CARGO_TARGET_DIR/ros-<distro>: r2r's bindings are
# per distro), RINGBAG_ROS_DOMAIN_ID (default 61 for humble, 62 for jazzy), RINGBAG_NICE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/ros-env.sh
source "$ROOT/scripts/ros-env.sh"

DISTRO="${1:-}"
[[ -n "$DISTRO" && "$DISTRO" != -* ]] || {
    echo "usage: scripts/ros-test.sh humble|jazzy [--no-install] [-- test filter and flags]" >&2
    exit 2
}
shift
ros_env_check_distro "$DISTRO" || exit 2
INSTALL=1
if [[ "${1:-}" == --no-install ]]; then
    INSTALL=0
    shift
fi
[[ "${1:-}" != -- ]] || shift

NAME="ros-$DISTRO"
ros_env_find "$DISTRO"
if [[ -n "$ROS_SKIP" ]]; then
    echo "$NAME: SKIPPED: $ROS_SKIP"
    exit 0
fi
if [[ ! -f "$ROS_SETUP" ]]; then
    [[ $INSTALL -eq 1 ]] || { echo "$NAME: $ROS_SETUP missing (--no-install)" >&2; exit 1; }
    ros_env_install "$DISTRO"
fi
ros_env_source "$DISTRO"
echo "$NAME: $ROS_SETUP (ROS_DISTRO=$ROS_DISTRO, $(command -v ros2))"

# A domain of its own per distro, so a run never meets another test's (or robot's) graph.
case "$DISTRO" in
    humble) export ROS_DOMAIN_ID="${RINGBAG_ROS_DOMAIN_ID:-61}" ;;
    jazzy) export ROS_DOMAIN_ID="${RINGBAG_ROS_DOMAIN_ID:-62}" ;;
esac
# In this script a missing ROS is a failure, never a skip.
export RINGBAG_ROS_REQUIRED=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/$NAME"

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
set +e
# --release: the take loop and the pipeline at the speed a robot runs them. One test at a
# time: each owns a DDS participant and some measure throughput.
nice -n "${RINGBAG_NICE:-10}" cargo test --release --features ros --test ros_live -- \
    --test-threads 1 "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
# The README's `ros2 bag` parity table against this distro's own `ros2 bag record/play --help`
# (tests/it/parity.rs): Jazzy's flags are the reference, so the jazzy stage runs it, with the
# sourced Jazzy and RINGBAG_ROS_REQUIRED set (no skip). Same features and profile as above:
# only the test binary is built on top of ros_live's build. Skipped when a filter was given.
if [[ "$DISTRO" == jazzy && $# -eq 0 ]]; then
    nice -n "${RINGBAG_NICE:-10}" cargo test --release --features ros --test it -- \
        parity::every_jazzy_record_and_play_flag_has_a_parity_row_that_holds 2>&1 | tee -a "$LOG"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
set -e
# The `ros` code compiled against real bindings (the Jazzy type-hash paths included) must be
# as warning-free as the doc-only clippy check. Checked in the output (cargo replays a cached
# crate's warnings) rather than with RUSTFLAGS=-D warnings, which would give this build
# different flags from scripts/bench-ros.sh's in the same target dir and rebuild every crate.
if grep -E "^warning: \`ringbag\` \(.*\) generated [0-9]+ warnings?" "$LOG"; then
    echo "$NAME: the ros feature builds with warnings against ROS 2 $DISTRO (above)" >&2
    rc=1
fi
awk -v n="$NAME" '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/) p += $(i - 1)
            if ($(i) ~ /^failed;?$/) f += $(i - 1)
        }
     }
     END { printf "%s: %d passed, %d failed\n", n, p, f }' "$LOG"
exit "$rc"
