# shellcheck shell=bash
# Sourced by scripts/ros-test.sh and scripts/bench-ros.sh: finds, installs and sources one
# ROS 2 distro, with DDS confined to loopback. Not a command of its own.
#
#   ros_env_find DISTRO      sets ROS_SETUP to the distro's setup.bash, or ROS_SKIP to why not
#   ros_env_install DISTRO   installs the prebuilt of ../shared/ros2-prebuilt when it is there
#   ros_env_source DISTRO    a clean environment with that distro sourced, DDS on loopback
#   ros_env_loopback         DDS on loopback for the ROS 2 already sourced
#
# Where a distro comes from, first match wins:
#   1. the prebuilt in $RINGBAG_ROS_PREBUILT (default: ../shared/ros2-prebuilt next to the
#      repository), which unpacks Humble to /opt/ros2-local and Jazzy to /opt/ros2-jazzy;
#   2. an installed /opt/ros/<distro> (the official packages, on a developer's machine).

RINGBAG_ROOT="${RINGBAG_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
RINGBAG_ROS_PREBUILT="${RINGBAG_ROS_PREBUILT:-$(cd "$RINGBAG_ROOT/.." && pwd)/shared/ros2-prebuilt}"

# Where the prebuilt unpacks each distro (fixed by its tarballs).
ros_env_prebuilt_prefix() {
    case "$1" in
        humble) echo /opt/ros2-local ;;
        jazzy) echo /opt/ros2-jazzy ;;
        *) return 1 ;;
    esac
}

ros_env_check_distro() {
    case "$1" in
        humble | jazzy) ;;
        *)
            echo "unknown ROS 2 distro '$1' (humble or jazzy)" >&2
            return 2
            ;;
    esac
}

ros_env_find() {
    ros_env_check_distro "$1" || return
    local distro="$1" prefix
    prefix="$(ros_env_prebuilt_prefix "$distro")"
    ROS_SETUP=""
    ROS_SKIP=""
    if [[ -f "$prefix/setup.bash" ]]; then
        ROS_SETUP="$prefix/setup.bash"
    elif [[ -f "$RINGBAG_ROS_PREBUILT/$distro.tar.zst" ]]; then
        # Installable: ros_env_install unpacks it to $prefix.
        ROS_SETUP="$prefix/setup.bash"
    elif [[ -f "/opt/ros/$distro/setup.bash" ]]; then
        ROS_SETUP="/opt/ros/$distro/setup.bash"
    else
        ROS_SKIP="no ROS 2 $distro: neither $RINGBAG_ROS_PREBUILT/$distro.tar.zst (../shared/ros2-prebuilt) nor /opt/ros/$distro/setup.bash"
    fi
}

# Runs the prebuilt's install.sh (idempotent: an unpacked distro is left as it is). Callers
# call it only when ros_env_find named a setup.bash that is not there yet. Needs root or sudo.
ros_env_install() {
    ros_env_check_distro "$1" || return
    local distro="$1"
    if [[ ! -f "$RINGBAG_ROS_PREBUILT/install.sh" || ! -f "$RINGBAG_ROS_PREBUILT/$distro.tar.zst" ]]; then
        return 0
    fi
    echo "ros: installing the prebuilt $distro ($RINGBAG_ROS_PREBUILT/install.sh)"
    if [[ $EUID -eq 0 ]]; then
        bash "$RINGBAG_ROS_PREBUILT/install.sh" "$distro"
    else
        sudo bash "$RINGBAG_ROS_PREBUILT/install.sh" "$distro"
    fi
}

# Leaves only this distro in the environment: a shell that already sourced another ROS 2
# (or a workspace) would otherwise mix two distros' libraries and message packages.
ros_env_source() {
    ros_env_find "$1" || return
    [[ -n "$ROS_SETUP" && -f "$ROS_SETUP" ]] || {
        echo "${ROS_SKIP:-ROS 2 $1 is not installed ($ROS_SETUP missing)}" >&2
        return 1
    }
    local v
    for v in AMENT_PREFIX_PATH CMAKE_PREFIX_PATH COLCON_PREFIX_PATH ROS_DISTRO ROS_VERSION \
        ROS_PYTHON_VERSION ROS_LOCALHOST_ONLY ROS_AUTOMATIC_DISCOVERY_RANGE ROS_STATIC_PEERS \
        RMW_IMPLEMENTATION PYTHONPATH; do
        unset "$v"
    done
    # setup.bash prepends to these; drop earlier ROS entries (any /opt/ros*) first.
    # (grep finding no other entry is not an error, also under `set -o pipefail`.)
    LD_LIBRARY_PATH="$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | { grep -v '^/opt/ros' || true; } | paste -sd: -)"
    PATH="$(tr ':' '\n' <<<"$PATH" | { grep -v '^/opt/ros' || true; } | paste -sd: -)"
    export LD_LIBRARY_PATH PATH
    # setup.bash reads unset variables.
    local had_u=0
    [[ $- == *u* ]] && had_u=1
    set +u
    # shellcheck disable=SC1090
    source "$ROS_SETUP"
    [[ $had_u -eq 1 ]] && set -u
    [[ "${ROS_DISTRO:-}" == "$1" ]] || {
        echo "$ROS_SETUP set ROS_DISTRO='${ROS_DISTRO:-}', not '$1'" >&2
        return 1
    }
    ros_env_loopback
}

# DDS on loopback only, for the sourced distro: interface lo, no multicast, the one peer
# 127.0.0.1 (tests/cyclonedds-loopback.xml). Humble's ROS_LOCALHOST_ONLY=1 would make
# rmw_cyclonedds select lo a second time, which CycloneDDS refuses; from Iron on that variable
# is deprecated (a warning in every process) and the config file alone does it.
ros_env_loopback() {
    export CYCLONEDDS_URI="file://$RINGBAG_ROOT/tests/cyclonedds-loopback.xml"
    export RMW_IMPLEMENTATION=rmw_cyclonedds_cpp
    if [[ "${ROS_DISTRO:-}" == humble ]]; then
        export ROS_LOCALHOST_ONLY=0
    else
        unset ROS_LOCALHOST_ONLY ROS_AUTOMATIC_DISCOVERY_RANGE ROS_STATIC_PEERS
    fi
}
