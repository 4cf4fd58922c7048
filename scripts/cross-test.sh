#!/usr/bin/env bash
# The whole test suite for aarch64 under user-mode qemu, without Docker: what
# `cross test --target aarch64-unknown-linux-gnu` does, using the host's cross toolchain.
#
#   scripts/cross-test.sh [cargo test args...]    e.g. scripts/cross-test.sh -- --nocapture
#
# Linker and runner come from .cargo/config.toml. Needs the Debian packages gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user-static and the rustup target (scripts/test.sh installs them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu
QEMU=qemu-aarch64-static

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=("aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu)")
[[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ]] || missing+=("$SYSROOT (libc6-dev-arm64-cross)")
command -v "$QEMU" >/dev/null || missing+=("$QEMU (qemu-user-static)")
rustup target list --installed 2>/dev/null | grep -qx "$TARGET" || missing+=("rustup target $TARGET")
if [[ ${#missing[@]} -gt 0 ]]; then
    printf 'cross-test.sh: missing %s\n' "${missing[@]}" >&2
    echo "cross-test.sh: run scripts/test.sh once to install them" >&2
    exit 1
fi

# Tests that spawn the `ringbag` binary (CARGO_BIN_EXE_ringbag) get an aarch64 ELF. Without a
# binfmt_misc registration for aarch64 the kernel cannot exec it, so the test helper prefixes
# this runner when it is set (cross's images run tests through `/linux-runner aarch64`; see
# Cross.toml). QEMU_LD_PREFIX lets a binfmt-launched qemu find the aarch64 loader as well.
export RINGBAG_TEST_RUNNER="$QEMU -L $SYSROOT"
export QEMU_LD_PREFIX="$SYSROOT"
# Emulation is ~10x slower: the randomized crash tests run fewer trials here (the host stage
# runs the full 30 kill -9 and 40 torn-write trials). Override to run more.
export RINGBAG_CRASH_TRIALS="${RINGBAG_CRASH_TRIALS:-10}"
export RINGBAG_TORN_TRIALS="${RINGBAG_TORN_TRIALS:-15}"
# The bounds stress tests (tests/it/bounds.rs) record a fifth of the messages.
export RINGBAG_STRESS_PERCENT="${RINGBAG_STRESS_PERCENT:-20}"

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT

set +e
# The daemon's uploader tests (tests/it/upload_daemon.rs) record the robot mix in real time
# while uploading to Garage and assert 0 drops and drain rates: under emulation that measures
# qemu, not ringbag. They run in full in the host stage; the upload engine's tests (TLS, SigV4,
# multipart, resume against Garage) run here too.
has_sep=0
for a in "$@"; do [[ "$a" == "--" ]] && has_sep=1; done
[[ $has_sep == 1 ]] || set -- "$@" --
nice -n "${RINGBAG_NICE:-10}" cargo test --target "$TARGET" "$@" --skip upload_daemon:: 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e

# One line with the totals over all test binaries (unit, integration, doc tests).
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/)  p += $(i - 1)
            if ($(i) ~ /^failed;?$/)  f += $(i - 1)
            if ($(i) ~ /^ignored;?$/) g += $(i - 1)
        }
        n++
     }
     END { printf "aarch64 (qemu): %d passed, %d failed, %d ignored in %d test binaries\n", p, f, g, n }' "$LOG"
exit "$rc"
