#!/usr/bin/env bash
# The one command that runs every test: `scripts/test.sh` (CI runs it through .ci/run).
#
# Works on a fresh Debian machine as root (or with sudo) and on a developer machine: it installs
# only what is missing, then runs every stage, stopping at the first failure.
#
#   scripts/test.sh              everything (what CI runs)
#   scripts/test.sh --quick      skip the release build and the aarch64/qemu stage (the slow ones)
#   scripts/test.sh --only STAGE one stage with its installs (repeatable; `ros` = both distros)
#   scripts/test.sh --no-install never install anything; fail if a tool is missing
#
# Stages, in order: fmt clippy docs test check-ros ros-humble ros-jazzy yocto interop powercut
# systemd release cross-aarch64 (after `install`, which always runs).
#
# Respects CARGO_TARGET_DIR (default: target/). Cargo runs under `nice` because build machines
# are usually shared; set RINGBAG_NICE=0 to not lower the priority.
#
# The upload tests need Garage (scripts/garage.sh): ../shared/garage next to the repository, or
# a build cached in ~/.cache/ringbag-garage. Without either, the install stage builds it into
# that cache once (cargo install, ~20 min on 2 cores). RINGBAG_BUILD_GARAGE=0 skips the build:
# the upload tests then skip with the reason, unless RINGBAG_UPLOAD_REQUIRED=1 (fail instead).
# RINGBAG_GARAGE_BIN=PATH uses that garage 2.5.0 binary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ALL_STAGES=(fmt clippy docs test check-ros ros-humble ros-jazzy yocto interop powercut systemd
    release cross-aarch64)
QUICK=0
INSTALL=1
ONLY=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --no-install) INSTALL=0 ;;
        --only | --only=*)
            if [[ "$1" == --only ]]; then
                [[ $# -ge 2 ]] || { echo "test.sh: --only needs a stage (${ALL_STAGES[*]})" >&2; exit 2; }
                want="$2"
                shift
            else
                want="${1#--only=}"
            fi
            case " ${ALL_STAGES[*]} ros " in
                *" $want "*) ;;
                *)
                    echo "test.sh: unknown stage '$want' (${ALL_STAGES[*]}, or ros for both distros)" >&2
                    exit 2
                    ;;
            esac
            if [[ "$want" == ros ]]; then ONLY+=(ros-humble ros-jazzy); else ONLY+=("$want"); fi
            ;;
        -h | --help)
            sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "test.sh: unknown option '$1' (try --help)" >&2
            exit 2
            ;;
    esac
    shift
done

TARGET_AARCH64=aarch64-unknown-linux-gnu
# binutils: readelf and objcopy (release checks); binutils-aarch64-linux-gnu: the aarch64 objcopy
# (release stripping); systemd: systemctl, systemd-sysusers and systemd-tmpfiles for the install
# test, which enables the unit in an image root (installing it does not make it PID 1).
# prometheus (with promtool) and prometheus-node-exporter: the metrics' format and alert rules
# are checked by promtool, and a live Prometheus scrapes a recording (tests/it/metrics.rs,
# alert_rules.rs, prometheus_live.rs), all on loopback. man-db (with groff): the install test,
# the release check and the docs stage render the generated man pages with `man -l`.
APT_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static binutils
    binutils-aarch64-linux-gnu systemd prometheus prometheus-node-exporter man-db)
VENV="$ROOT/.venv"
# rosbags and pytest (interop), oelint-adv (the Yocto layer's lint), matplotlib (the benchmark
# figures, checked in the docs stage).
REQUIREMENTS=("$ROOT/tests/interop/requirements.txt" "$ROOT/yocto/requirements.txt"
    "$ROOT/scripts/plot-requirements.txt")
NICE=(nice -n "${RINGBAG_NICE:-10}")
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-auto}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# ---------------------------------------------------------------- stage bookkeeping
STAGE_NAMES=()
STAGE_SECS=()
CURRENT_STAGE=""
T0=$SECONDS
LOGS="$(mktemp -d)"
# Every Garage node scripts/garage.sh starts during this run, as "PID DIR" lines: the ones a
# failed test left running are killed at exit (see stop_garages).
export RINGBAG_GARAGE_REGISTRY="$LOGS/garage-nodes"
# Per-suite test counts, "suite passed failed skipped", for the closing summary.
COUNTS=()
# The tests' scratch space (see setup_scratch); empty: the host's TMPDIR.
SCRATCH=""

# Sums cargo's "test result:" lines of a log into "passed failed ignored".
cargo_counts() {
    awk '/^test result:/ {
            for (i = 1; i <= NF; i++) {
                if ($(i) ~ /^passed;?$/)  p += $(i - 1)
                if ($(i) ~ /^failed;?$/)  f += $(i - 1)
                if ($(i) ~ /^ignored;?$/) g += $(i - 1)
            }
         }
         END { printf "%d %d %d\n", p, f, g }' "$1"
}

# pytest -q's closing line ("3 passed, 1 skipped in 2.1s") as "passed failed skipped".
pytest_counts() {
    local line
    line="$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error)' "$1" | tail -n1 || true)"
    local n p=0 f=0 s=0
    for n in passed failed skipped error errors; do
        local v
        v="$(grep -oE "[0-9]+ $n\b" <<<"$line" | cut -d' ' -f1 || true)"
        case "$n" in
            passed) p=${v:-0} ;;
            failed | error | errors) f=$((f + ${v:-0})) ;;
            skipped) s=${v:-0} ;;
        esac
    done
    echo "$p $f $s"
}

# Kill the Garage nodes of this run still alive: a test that panicked or was killed before its
# cleanup must not leave a server running past the CI job. The command line naming the node's
# config tells a live node from a reused pid.
stop_garages() {
    [[ -f "$RINGBAG_GARAGE_REGISTRY" ]] || return 0
    local pid dir n=0
    while read -r pid dir; do
        if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/garage.toml"; then
            kill -9 "$pid" 2>/dev/null && n=$((n + 1))
        fi
    done <"$RINGBAG_GARAGE_REGISTRY"
    if [[ $n -gt 0 ]]; then echo "test.sh: killed $n Garage node(s) left running by the tests" >&2; fi
}

summary() {
    local rc=$?
    stop_garages
    # Left mid-stage (e.g. killed by a signal): never report success.
    [[ -n "$CURRENT_STAGE" && $rc -eq 0 ]] && rc=1
    echo
    echo "==> summary"
    local i
    for i in "${!STAGE_NAMES[@]}"; do
        printf '    %-22s %5ss\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}"
    done
    if [[ -n "$CURRENT_STAGE" ]]; then
        printf '    %-22s FAILED after %ss\n' "$CURRENT_STAGE" "$((SECONDS - STAGE_T0))"
    fi
    printf '    %-22s %5ss\n' "total" "$((SECONDS - T0))"
    local entry suite p f k tp=0 tf=0 tk=0
    for entry in "${COUNTS[@]}"; do
        read -r suite p f k <<<"$entry"
        printf '    %-22s %d passed, %d failed, %d skipped/ignored\n' "$suite tests" "$p" "$f" "$k"
        tp=$((tp + p)) tf=$((tf + f)) tk=$((tk + k))
    done
    # Lazily: a process a failed test left behind may still hold a file in it.
    if [[ -n "$SCRATCH" ]]; then
        as_root umount -l "$SCRATCH" || true
        rmdir "$SCRATCH" 2>/dev/null || true
    fi
    rm -rf "$LOGS"
    if [[ $rc -eq 0 ]]; then
        echo "==> all stages passed"
    else
        echo "==> FAILED (exit $rc)" >&2
    fi
    # One plain closing line over every suite that ran.
    if [[ ${#COUNTS[@]} -gt 0 ]]; then
        echo "tests: $tp passed, $tf failed, $tk skipped"
    fi
    exit "$rc"
}
trap summary EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# stage NAME CMD...: run CMD with a header, record its wall time; set -e stops at a failure.
stage() {
    CURRENT_STAGE="$1"
    shift
    STAGE_T0=$SECONDS
    echo
    echo "==> $CURRENT_STAGE"
    "$@"
    local took=$((SECONDS - STAGE_T0))
    echo "==> $CURRENT_STAGE (${took}s)"
    STAGE_NAMES+=("$CURRENT_STAGE")
    STAGE_SECS+=("$took")
    CURRENT_STAGE=""
}

# selected NAME...: whether any of these stages runs (all of them without --only; release and
# cross-aarch64 not with --quick unless named with --only).
selected() {
    local n o
    for n in "$@"; do
        if [[ ${#ONLY[@]} -eq 0 ]]; then
            [[ $QUICK -eq 1 && ($n == release || $n == cross-aarch64) ]] || return 0
        else
            for o in "${ONLY[@]}"; do
                [[ "$o" == "$n" ]] && return 0
            done
        fi
    done
    return 1
}

# maybe_stage NAME CMD...: `stage` when NAME is selected.
maybe_stage() {
    if selected "$1"; then stage "$@"; fi
}

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "test.sh: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

# ---------------------------------------------------------------- installs (skip what is there)
install_apt() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    # `python3 -m venv` needs ensurepip, which Debian ships separately in python3-venv.
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        missing+=(python3-venv)
    fi
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "apt: all present (${APT_PACKAGES[*]})"
        return
    fi
    [[ $INSTALL -eq 1 ]] || { echo "missing Debian packages: ${missing[*]}" >&2; return 1; }
    echo "apt: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_rust() {
    if ! command -v rustup >/dev/null; then
        echo "test.sh: rustup not found; install Rust with rustup (https://rustup.rs)" >&2
        return 1
    fi
    local installed
    installed="$(rustup target list --installed)"
    if ! selected release cross-aarch64; then
        : # only the aarch64 stages build for the Jetson
    elif grep -qx "$TARGET_AARCH64" <<<"$installed"; then
        echo "rustup: target $TARGET_AARCH64 present"
    else
        [[ $INSTALL -eq 1 ]] || { echo "missing rustup target $TARGET_AARCH64" >&2; return 1; }
        rustup target add "$TARGET_AARCH64"
    fi
    installed="$(rustup component list --installed)"
    local c
    for c in rustfmt clippy; do
        if grep -q "^$c" <<<"$installed"; then
            echo "rustup: component $c present"
        else
            [[ $INSTALL -eq 1 ]] || { echo "missing rustup component $c" >&2; return 1; }
            rustup component add "$c"
        fi
    done
}

install_venv() {
    # The marker holds the hash of the requirements files: a changed pin rebuilds the venv.
    local want have=""
    want="$(cat "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
    [[ -f "$VENV/.requirements.sha256" ]] && have="$(cat "$VENV/.requirements.sha256")"
    if [[ -x "$VENV/bin/python" && "$want" == "$have" ]]; then
        echo "venv: $VENV up to date ($(cat "${REQUIREMENTS[@]}" | grep -v '^#' | xargs))"
        return
    fi
    [[ $INSTALL -eq 1 ]] || { echo "venv $VENV missing or stale" >&2; return 1; }
    echo "venv: creating $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    local r
    for r in "${REQUIREMENTS[@]}"; do
        "$VENV/bin/pip" install -q -r "$r"
    done
    echo "$want" >"$VENV/.requirements.sha256"
}

# Garage for the upload tests. Found (../shared, a cached build, RINGBAG_GARAGE_BIN): the tests
# get RINGBAG_GARAGE_SH and RINGBAG_UPLOAD_REQUIRED=1, so a test that cannot use it fails
# rather than skips. Not found: built once into the cache (~20 min on 2 cores; a later run
# finds it). CI has ../shared and never builds. RINGBAG_BUILD_GARAGE=0 (or --no-install) skips
# the build: the upload tests then skip and say why (they find no Garage), unless
# RINGBAG_UPLOAD_REQUIRED=1 was set by the caller.
install_garage() {
    # curl (garage.sh waits for the S3 API with it) and zstd (the shared Garage is compressed).
    local missing=() p
    for p in curl zstd; do
        command -v "$p" >/dev/null || missing+=("$p")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        [[ $INSTALL -eq 1 ]] || { echo "missing for Garage: ${missing[*]}" >&2; return 1; }
        echo "apt: installing ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
            { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; }
    fi
    # A caller's RINGBAG_GARAGE_SH (e.g. the shared script itself) is used as given.
    local sh="${RINGBAG_GARAGE_SH:-$ROOT/scripts/garage.sh}" bin
    if ! bin="$(bash "$sh" bin 2>"$LOGS/garage.err")"; then
        if [[ "${RINGBAG_BUILD_GARAGE:-1}" == 1 && $INSTALL -eq 1 ]]; then
            echo "garage: $(cat "$LOGS/garage.err")"
            echo "garage: building Garage 2.5.0 once into the cache (~20 min on 2 cores;" \
                "RINGBAG_BUILD_GARAGE=0 skips it and the upload tests)"
            bash "$ROOT/scripts/garage.sh" build
            sh="$ROOT/scripts/garage.sh"
            bin="$(bash "$sh" bin)"
        elif [[ "${RINGBAG_UPLOAD_REQUIRED:-0}" == 1 ]]; then
            cat "$LOGS/garage.err" >&2
            echo "test.sh: RINGBAG_UPLOAD_REQUIRED=1 but no Garage (RINGBAG_BUILD_GARAGE=0 or --no-install)" >&2
            return 1
        else
            echo "garage: none, the upload tests will skip: $(cat "$LOGS/garage.err")"
            echo "        (RINGBAG_BUILD_GARAGE=1 without --no-install builds it, ~20 min)"
            unset RINGBAG_GARAGE_SH
            return 0
        fi
    fi
    echo "garage: $bin"
    export RINGBAG_GARAGE_SH="$sh" RINGBAG_UPLOAD_REQUIRED=1
}

# What the selected stages need (the ROS 2 distros are installed by their own stages).
install_all() {
    # apt: the cross toolchain and qemu (release, cross-aarch64), systemd's tools (the install
    # test in `test`), python3-venv (docs, yocto, interop).
    if selected test docs yocto interop release cross-aarch64; then install_apt; fi
    install_rust
    if selected docs yocto interop; then install_venv; fi
    # Every stage that may run the upload tests (the host and aarch64 suites, interop's boto3
    # read-back, uploads across power cuts, the unit uploading under systemd).
    if selected test cross-aarch64 interop powercut systemd; then install_garage; fi
    # Installed (above, or already): a metrics test that cannot run promtool fails.
    if command -v promtool >/dev/null; then export RINGBAG_PROMTOOL_REQUIRED=1; fi
    if command -v prometheus >/dev/null && command -v prometheus-node-exporter >/dev/null; then
        export RINGBAG_PROMETHEUS_REQUIRED=1
    fi
}

# ---------------------------------------------------------------- stages
cargo_n() { "${NICE[@]}" cargo "$@"; }

# The suites' temporary files go to a tmpfs of their own. `ringbag record` keeps a free-space
# floor (1 GiB by default) and stops at it, as it must; on the host's disk every test that
# records would then pass or fail with whatever else fills that disk (CI once failed five
# tests with about 1 GiB free). On a tmpfs of known size the free space is the tests' own.
# RINGBAG_TEST_TMPFS sets its size (tmpfs syntax; default 6G, used only as filled), 0 turns it
# off; without root the host's TMPDIR is used and the run says so.
setup_scratch() {
    local size="${RINGBAG_TEST_TMPFS:-6G}" dir
    if [[ "$size" == 0 ]]; then
        echo "test.sh: RINGBAG_TEST_TMPFS=0: the tests use ${TMPDIR:-/tmp}"
        return 0
    fi
    # A short path: some tests build paths near the kernel's and SQLite's limits (a unix
    # socket's 108 bytes, SQLite's 512) on top of the temp dir, tuned for /tmp/.tmpXXXXXX.
    dir="$(mktemp -d /tmp/rb.XXXX)"
    if [[ $EUID -eq 0 ]] && mount -t tmpfs -o "size=$size,mode=1777" ringbag-scratch "$dir"; then
        SCRATCH="$dir"
        echo "test.sh: the tests' temporary files go to a $size tmpfs at $dir"
    else
        rmdir "$dir"
        echo "test.sh: no tmpfs for the tests (needs root): they use ${TMPDIR:-/tmp}, whose free" \
            "space must stay above ringbag's 1 GiB default floor"
    fi
}

# with_scratch CMD...: CMD with TMPDIR in the tests' scratch space, when there is one.
with_scratch() {
    if [[ -n "$SCRATCH" ]]; then
        TMPDIR="$SCRATCH" "$@"
    else
        "$@"
    fi
}

# The suites keep a copy of their output to count results, also when they fail.
run_host_tests() {
    local rc=0
    cargo_n test 2>&1 | tee "$LOGS/test.log" || rc=$?
    COUNTS+=("host $(cargo_counts "$LOGS/test.log")")
    return "$rc"
}

run_interop() {
    cargo_n build --bin ringbag
    local rc=0
    # -rs lists skipped tests with their reason (e.g. reference bags absent).
    RINGBAG_BIN="$TARGET_DIR/debug/ringbag" "$VENV/bin/pytest" tests/interop -q -rs 2>&1 |
        tee "$LOGS/interop.log" || rc=$?
    COUNTS+=("interop $(pytest_counts "$LOGS/interop.log")")
    return "$rc"
}

# run_root_script NAME SCRIPT APT_PACKAGES...: a root-only test script that prints
# `NAME: N passed, M failed` (or `NAME: SKIPPED: reason`) last. Its Debian packages are
# installed when running as root; without root the script itself skips with the reason.
run_root_script() {
    local name="$1" script="$2"
    shift 2
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [[ ${#missing[@]} -gt 0 && $EUID -eq 0 ]]; then
        [[ $INSTALL -eq 1 ]] || { echo "missing Debian packages: ${missing[*]}" >&2; return 1; }
        echo "apt: installing ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
            { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; }
    fi
    cargo_n build --bin ringbag
    local rc=0
    RINGBAG_BIN="$TARGET_DIR/debug/ringbag" bash "$script" 2>&1 | tee "$LOGS/$name.log" || rc=$?
    COUNTS+=("$name $(awk -v n="$name" '$1 == n":" && $3 == "passed," { print $2, $4, 0 }
        $1 == n":" && $2 == "SKIPPED:" { print 0, 0, 1 }' "$LOGS/$name.log" | tail -n1)")
    return "$rc"
}

# Power cuts (scripts/powercut-test.sh): needs root, loop devices, mkfs.xfs and mkfs.ext4;
# skips with the reason where loop devices cannot be used.
run_powercut() { run_root_script powercut scripts/powercut-test.sh xfsprogs e2fsprogs zstd; }

# The service under a real systemd (scripts/systemd-test.sh): boots systemd in a
# systemd-nspawn container; skips with the reason only where nspawn is impossible.
run_systemd() { run_root_script systemd scripts/systemd-test.sh systemd-container; }

# The live ROS 2 tests against a real distro (scripts/ros-test.sh): the prebuilt of
# ../shared/ros2-prebuilt is installed when missing; without it (a developer's checkout) and
# without /opt/ros/<distro>, the stage says why it skips. Its own target dir per distro:
# r2r's bindings depend on the distro.
run_ros() {
    local distro="$1" rc=0 args=()
    [[ $INSTALL -eq 1 ]] || args+=(--no-install)
    RINGBAG_NICE="${RINGBAG_NICE:-10}" CARGO_TARGET_DIR="$TARGET_DIR" \
        bash scripts/ros-test.sh "$distro" "${args[@]}" 2>&1 | tee "$LOGS/ros-$distro.log" || rc=$?
    if grep -q "^ros-$distro: SKIPPED:" "$LOGS/ros-$distro.log"; then
        COUNTS+=("ros-$distro 0 0 1")
    else
        COUNTS+=("ros-$distro $(cargo_counts "$LOGS/ros-$distro.log")")
    fi
    return "$rc"
}

# The Yocto layer: ringbag-crates.inc matches Cargo.lock, and oelint-adv finds nothing (no
# error, warning or info; the layer's .oelint.cfg lists each suppressed rule with its reason)
# for both releases the layer supports.
run_yocto() {
    local rc=0
    "$VENV/bin/pytest" tests/yocto -q -rs 2>&1 | tee "$LOGS/yocto.log" || rc=$?
    COUNTS+=("yocto $(pytest_counts "$LOGS/yocto.log")")
    [[ $rc -eq 0 ]] || return "$rc"
    python3 scripts/yocto-crates.py --check
    local layer=yocto/meta-ringbag release
    for release in kirkstone scarthgap; do
        echo "oelint-adv --release $release:"
        OELINT_CONFIG="$layer/.oelint.cfg" "$VENV/bin/oelint-adv" --quiet --mode all --release "$release" \
            "$layer"/conf/layer.conf "$layer"/recipes-*/*/*.bb "$layer"/recipes-*/*/*.inc
        echo "    no findings"
    done
}

# The docs (scripts/docs-check.py): every --help flag and config key documented, links and
# images resolving, the generated man pages free of groff and man warnings. Then the figures'
# script on its fixtures (tests/plots/check.py, with the venv's matplotlib), which also checks
# that docs/img/dataflow.svg is what Graphviz makes of docs/dataflow.dot. Seconds, after the
# debug build; needs man-db (and its groff) and graphviz, installed here when missing.
run_docs() {
    local pkg tool
    for pkg in man-db:man graphviz:dot; do
        tool="${pkg#*:}" pkg="${pkg%%:*}"
        command -v "$tool" >/dev/null && { [[ $tool != man ]] || command -v groff >/dev/null; } && continue
        [[ $INSTALL -eq 1 ]] || { echo "missing Debian package: $pkg" >&2; return 1; }
        echo "apt: installing $pkg"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" ||
            { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg"; }
    done
    cargo_n build --bin ringbag
    python3 scripts/docs-check.py --bin "$TARGET_DIR/debug/ringbag"
    "$VENV/bin/python" tests/plots/check.py
}

# Release binaries (scripts/build-release.sh): aarch64 and x86_64 against glibc 2.31, stripped,
# checked (GLIBC_ versions, --version and info under qemu), tarballs and SHA256SUMS.
run_release() { bash scripts/build-release.sh --out "$TARGET_DIR/dist"; }

run_cross() {
    local rc=0
    RINGBAG_NICE="${RINGBAG_NICE:-10}" bash scripts/cross-test.sh 2>&1 | tee "$LOGS/cross.log" || rc=$?
    COUNTS+=("aarch64 $(cargo_counts "$LOGS/cross.log")")
    return "$rc"
}

stage "install" install_all
setup_scratch
maybe_stage "fmt" cargo_n fmt --check
maybe_stage "clippy" cargo_n clippy --all-targets -- -D warnings
maybe_stage "docs" run_docs
maybe_stage "test" with_scratch run_host_tests
# r2r's doc-only feature uses the bindings shipped in the crate instead of a sourced ROS 2, so
# the `ros` code type-checks (and is linted) on machines without ROS; it cannot link or run.
# ROS_DISTRO is unset for it: doc-only bindings have Humble's layout (see build.rs).
maybe_stage "check-ros" env -u ROS_DISTRO -u AMENT_PREFIX_PATH "${NICE[@]}" cargo clippy --all-targets \
    --features ros,r2r/doc-only -- -D warnings
# Before interop: its message-definition check also reads the installed Jazzy's .msg files.
maybe_stage "ros-humble" with_scratch run_ros humble
maybe_stage "ros-jazzy" with_scratch run_ros jazzy
maybe_stage "yocto" run_yocto
# Before cross: it is fast and catches format regressions long before the qemu run ends.
maybe_stage "interop" with_scratch run_interop
# Power cuts on a loop-mounted ext4 (about a minute).
maybe_stage "powercut" run_powercut
# ringbag daemon under systemd 252 in a container (about a minute).
maybe_stage "systemd" run_systemd
maybe_stage "release" run_release
maybe_stage "cross-aarch64" with_scratch run_cross
if [[ $QUICK -eq 1 && ${#ONLY[@]} -eq 0 ]]; then
    echo
    echo "==> release and cross-aarch64 skipped (--quick)"
fi
