#!/usr/bin/env bash
# Release build: stripped ringbag binaries for the Jetson (aarch64) and for x86_64 PCs, both
# linked against glibc 2.31 so they run on JetPack 5 (L4T R35, Ubuntu 20.04) and JetPack 6
# (Ubuntu 22.04, glibc 2.35) alike.
#
#   scripts/build-release.sh [--out DIR] [--target aarch64|x86_64|all] [-- cargo args...]
#
#   --out DIR      where the release goes [default: dist/]
#   --target T     aarch64, x86_64 or all [default: all]
#   cargo args     passed to cargo, e.g. -- --features ros (needs a ROS 2 for the target)
#
# For each target T (aarch64-unknown-linux-gnu, x86_64-unknown-linux-gnu), into DIR:
#   ringbag-VERSION-T            the stripped binary
#   ringbag-VERSION-T.debug      its debug info (gdb finds it through the binary's debuglink)
#   ringbag-VERSION-T.tar.gz     ringbag, install.sh, every file of systemd/ and doc/ (the man
#                                pages and completions of `ringbag gen-docs`), in a directory
#                                ringbag-VERSION-T/ (install with its install.sh)
#   SHA256SUMS                   sha256sum -c SHA256SUMS checks all of the above
#
# Checks, each fatal: the highest GLIBC_ symbol version a binary needs is <= 2.31 (read from the
# ELF with readelf); each binary starts (`--version`; aarch64 under qemu-aarch64-static) and
# reads a bag (`info` on a rosbag2 reference bag when ../shared/reference-bags exists, and on a
# bag the binary has just recorded); each tarball unpacks and its install.sh installs it into an
# image root, with man pages that `man -l` renders without a warning. Prints the sizes.
#
# A binary linked against the build host's glibc (Debian 12: 2.36) would refuse to start on
# JetPack 5 ("GLIBC_2.34 not found"). cargo-zigbuild links against glibc 2.31's symbol versions
# with zig's bundled libc stubs, so no Jetson sysroot is needed. zig and cargo-zigbuild come from
# PyPI (prebuilt) into a tools venv under the cargo target dir. Needs python3-venv, binutils,
# binutils-aarch64-linux-gnu (aarch64-linux-gnu-objcopy) and qemu-user-static; scripts/test.sh
# installs them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

OUT="$ROOT/dist"
WHICH=all
CARGO_ARGS=()
die() {
    echo "build-release.sh: $*" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out)
            [[ $# -ge 2 ]] || die "--out needs a directory"
            OUT="$2"
            shift 2
            ;;
        --target)
            [[ $# -ge 2 ]] || die "--target needs aarch64, x86_64 or all"
            WHICH="$2"
            shift 2
            ;;
        --)
            shift
            CARGO_ARGS=("$@")
            break
            ;;
        -h | --help)
            sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
case "$WHICH" in
    aarch64) TARGETS=(aarch64-unknown-linux-gnu) ;;
    x86_64) TARGETS=(x86_64-unknown-linux-gnu) ;;
    all) TARGETS=(aarch64-unknown-linux-gnu x86_64-unknown-linux-gnu) ;;
    *) die "--target must be aarch64, x86_64 or all, got '$WHICH'" ;;
esac

GLIBC=2.31
ZIGLANG_VERSION=0.15.2
CARGO_ZIGBUILD_VERSION=0.24.1
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
TOOLS="$TARGET_DIR/zigbuild-tools"
NICE=(nice -n "${RINGBAG_NICE:-10}")
export PIP_DISABLE_PIP_VERSION_CHECK=1

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[[ -n "$VERSION" ]] || die "no version in Cargo.toml"
# `ringbag --version` names the commit; an uncommitted tree says so.
if COMMIT="$(git rev-parse --short=12 HEAD 2>/dev/null)"; then
    [[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || COMMIT="$COMMIT-dirty"
else
    COMMIT=unknown
fi
export RINGBAG_GIT_COMMIT="$COMMIT"

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

# A reference bag recorded by the real `ros2 bag`, when this machine has them.
REF_BAGS="${RINGBAG_REFERENCE_BAGS:-$ROOT/../shared/reference-bags}"
REF_BAG=""
[[ -f "$REF_BAGS/jazzy/jazzy_ref/metadata.yaml" ]] && REF_BAG="$REF_BAGS/jazzy/jazzy_ref"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
# Reproducible tarballs: entries sorted, owned by root, dated by the commit.
EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"

SIZES=()
for T in "${TARGETS[@]}"; do
    rustup target list --installed | grep -qx "$T" || rustup target add "$T"
    echo "==> cargo zigbuild --release --locked --target $T.$GLIBC ${CARGO_ARGS[*]}"
    "${NICE[@]}" cargo zigbuild --release --locked --target "$T.$GLIBC" --bin ringbag "${CARGO_ARGS[@]}"
    BUILT="$TARGET_DIR/$T/release/ringbag"
    NAME="ringbag-$VERSION-$T"

    # Highest GLIBC_x.y symbol version the binary needs. readelf reads any ELF architecture.
    max="$(readelf -W --dyn-syms "$BUILT" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)"
    if [[ "$(printf '%s\n%s\n' "$max" "$GLIBC" | sort -V | tail -n1)" != "$GLIBC" ]]; then
        echo "build-release.sh: $T binary needs GLIBC_$max, newer than JetPack 5's $GLIBC:" >&2
        readelf -W --dyn-syms "$BUILT" | grep "GLIBC_$max" >&2
        exit 1
    fi
    echo "==> glibc check: $T needs GLIBC_$max at most (limit $GLIBC): ok"

    # Strip what ships; keep the debug info beside it for post-mortems (gdb, addr2line).
    case "$T" in
        aarch64-*) OBJCOPY=aarch64-linux-gnu-objcopy ;;
        *) OBJCOPY=objcopy ;;
    esac
    command -v "$OBJCOPY" >/dev/null || die "$OBJCOPY not found (Debian: binutils-aarch64-linux-gnu / binutils)"
    rm -f "$OUT/$NAME" "$OUT/$NAME.debug"
    "$OBJCOPY" --only-keep-debug "$BUILT" "$OUT/$NAME.debug"
    "$OBJCOPY" --strip-all "$BUILT" "$SCRATCH/$NAME.stripped"
    (cd "$OUT" && "$OBJCOPY" --add-gnu-debuglink="$NAME.debug" "$SCRATCH/$NAME.stripped" "$OUT/$NAME")
    chmod 0755 "$OUT/$NAME"
    chmod 0644 "$OUT/$NAME.debug"

    # It starts and reads bags on its own architecture.
    RUN=()
    if [[ "$T" == aarch64-* ]]; then
        command -v qemu-aarch64-static >/dev/null || die "qemu-aarch64-static not found (Debian: qemu-user-static)"
        RUN=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
    fi
    echo "==> $NAME --version"
    v="$("${RUN[@]}" "$OUT/$NAME" --version)"
    echo "    $v"
    [[ "$v" == "ringbag $VERSION (commit $COMMIT, "*", target $T)" ]] || die "$NAME --version says: $v"
    if [[ -n "$REF_BAG" ]]; then
        echo "==> $NAME info $REF_BAG"
        "${RUN[@]}" "$OUT/$NAME" info "$REF_BAG" | sed 's/^/    /'
    else
        echo "==> no reference bags at $REF_BAGS: info checked on a bag recorded here only"
    fi
    "${RUN[@]}" "$OUT/$NAME" record --source synthetic --synthetic-profile small --synthetic-count 200 \
        --clock system -o "$SCRATCH/bag-$T" >"$SCRATCH/record.log" 2>&1 ||
        { cat "$SCRATCH/record.log" >&2; die "$NAME record failed"; }
    n="$("${RUN[@]}" "$OUT/$NAME" info "$SCRATCH/bag-$T" | sed -n 's/^Messages: *//p')"
    [[ "$n" == 200 ]] || die "$NAME recorded a bag whose info says $n messages, want 200"
    echo "==> $NAME recorded and read back a bag of $n messages"

    # The tarball: what an operator copies to the robot and installs with install.sh.
    mkdir -p "$SCRATCH/$NAME"
    cp "$OUT/$NAME" "$SCRATCH/$NAME/ringbag"
    cp scripts/install.sh "$SCRATCH/$NAME/install.sh"
    cp -r systemd "$SCRATCH/$NAME/systemd"
    # Generated by the binary shipped (under qemu for aarch64): install.sh on the robot, or on
    # a PC filling an image root, then needs not run it.
    "${RUN[@]}" "$OUT/$NAME" gen-docs --out "$SCRATCH/$NAME/doc" || die "$NAME gen-docs failed"
    chmod 0755 "$SCRATCH/$NAME/install.sh"
    tar -C "$SCRATCH" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
        -cf - "$NAME" | gzip -n -9 >"$OUT/$NAME.tar.gz"
    # The tarball as an operator uses it: unpacked, its install.sh installs its binary.
    mkdir -p "$SCRATCH/unpack-$T" "$SCRATCH/image-$T"
    tar -C "$SCRATCH/unpack-$T" -xzf "$OUT/$NAME.tar.gz"
    bash "$SCRATCH/unpack-$T/$NAME/install.sh" --root "$SCRATCH/image-$T" --no-enable >/dev/null
    cmp -s "$OUT/$NAME" "$SCRATCH/image-$T/usr/bin/ringbag" || die "$NAME.tar.gz's install.sh did not install its binary"
    page="$SCRATCH/image-$T/usr/share/man/man1/ringbag-record.1"
    [[ -f "$page" && -f "$SCRATCH/image-$T/usr/share/bash-completion/completions/ringbag" ]] ||
        die "$NAME.tar.gz's install.sh did not install the man pages and completions"
    if command -v man >/dev/null; then
        warnings="$(MANWIDTH=80 man -l --warnings "$page" 2>&1 >/dev/null)" || die "man -l $page failed: $warnings"
        [[ -z "$warnings" ]] || die "man -l $page warns: $warnings"
    fi
    echo "==> $NAME.tar.gz unpacks and installs into an image root (man pages and completions too)"
    SIZES+=("$(stat -c %s "$BUILT") $(stat -c %s "$OUT/$NAME") $(stat -c %s "$OUT/$NAME.tar.gz") $T")
done

(cd "$OUT" && sha256sum -- ringbag-"$VERSION"-* >SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
echo "==> $OUT/SHA256SUMS"
sed 's/^/    /' "$OUT/SHA256SUMS"
echo "==> sizes (bytes): unstripped, stripped binary, tarball"
for s in "${SIZES[@]}"; do
    read -r full stripped tgz t <<<"$s"
    awk -v t="$t" -v f="$full" -v s="$stripped" -v g="$tgz" \
        'BEGIN { printf "    %-28s %10d %10d %10d  (%.1f MiB stripped)\n", t, f, s, g, s / 1048576 }'
done
echo "==> tarball contents ($(basename "$(ls "$OUT"/ringbag-"$VERSION"-*.tar.gz | head -n1)"))"
tar -tzvf "$(ls "$OUT"/ringbag-"$VERSION"-*.tar.gz | head -n1)" | sed 's/^/    /'
