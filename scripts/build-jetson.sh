#!/usr/bin/env bash
# Release build for NVIDIA Jetson on JetPack 5 (L4T R35, Ubuntu 20.04, glibc 2.31).
#
#   scripts/build-jetson.sh [extra cargo args...]     e.g. --features ros is NOT possible here
#
# A binary linked against the build host's glibc (Debian 12: 2.36) would refuse to start on the
# Jetson ("GLIBC_2.34 not found"). cargo-zigbuild links against glibc 2.31's symbol versions
# using zig's bundled libc stubs, so no Jetson sysroot is needed. zig and cargo-zigbuild come
# from PyPI (prebuilt) into a tools venv under the cargo target dir.
#
# Output: <target-dir>/aarch64-unknown-linux-gnu/release/ringbag, checked to need glibc <= 2.31
# and to start (`--help`) under qemu.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TARGET=aarch64-unknown-linux-gnu
GLIBC=2.31
ZIGLANG_VERSION=0.15.2
CARGO_ZIGBUILD_VERSION=0.24.1
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
TOOLS="$TARGET_DIR/zigbuild-tools"
NICE=(nice -n "${RINGBAG_NICE:-10}")
export PIP_DISABLE_PIP_VERSION_CHECK=1

rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"

# Tools venv: its python3 carries the `ziglang` module, which cargo-zigbuild runs as
# `python3 -m ziglang` when no `zig` is on PATH.
want="ziglang==$ZIGLANG_VERSION cargo-zigbuild==$CARGO_ZIGBUILD_VERSION"
if [[ "$(cat "$TOOLS/.installed" 2>/dev/null)" != "$want" ]]; then
    echo "==> installing $want into $TOOLS"
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    # shellcheck disable=SC2086
    "$TOOLS/bin/pip" install -q $want
    echo "$want" >"$TOOLS/.installed"
fi
export PATH="$TOOLS/bin:$PATH"

echo "==> cargo zigbuild --release --target $TARGET.$GLIBC"
"${NICE[@]}" cargo zigbuild --release --target "$TARGET.$GLIBC" --bin ringbag "$@"
BIN="$TARGET_DIR/$TARGET/release/ringbag"

# Highest GLIBC_x.y symbol version the binary needs. readelf reads any ELF architecture, so the
# check needs no aarch64 binutils.
max="$(readelf -W --dyn-syms "$BIN" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)"
echo "==> $BIN needs glibc $max (JetPack 5 has $GLIBC)"
if [[ "$(printf '%s\n%s\n' "$max" "$GLIBC" | sort -V | tail -n1)" != "$GLIBC" ]]; then
    echo "build-jetson.sh: $BIN needs GLIBC_$max, newer than JetPack 5's $GLIBC" >&2
    readelf -W --dyn-syms "$BIN" | grep "GLIBC_$max" >&2
    exit 1
fi

# Smoke run under user-mode qemu when it is installed (scripts/test.sh installs it).
if command -v qemu-aarch64-static >/dev/null && [[ -d /usr/aarch64-linux-gnu ]]; then
    echo "==> $BIN --help under qemu"
    qemu-aarch64-static -L /usr/aarch64-linux-gnu "$BIN" --help
    echo "==> runs under qemu"
else
    echo "==> qemu-aarch64-static not installed: skipped the smoke run"
fi
file "$BIN" 2>/dev/null || true
ls -l "$BIN"
