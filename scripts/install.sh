#!/usr/bin/env bash
# Install ringbag as a systemd service, into the running system or into an image root.
#
#   install.sh [--root DIR] [--prefix DIR] [--bin FILE] [--no-enable]
#
#   --root DIR     the root file system to install into [default: /, the running system].
#                  Anything else is an image root (e.g. a Jetson rootfs before flashing).
#   --prefix DIR   installation prefix inside the root [default: /usr]. The binary goes to
#                  PREFIX/bin/ringbag and the unit's ExecStart names it.
#   --bin FILE     the ringbag binary [default: ./ringbag next to this script, as in the release
#                  tarball]. From a source checkout: --bin target/release/ringbag.
#   --no-enable    do not enable ringbag.service (it is enabled by default).
#
# Files (with --prefix /usr; another prefix puts the systemd, sysusers, tmpfiles and udev files
# under ROOT/etc instead, the directories systemd and udev read for local installs):
#   PREFIX/bin/ringbag                              0755
#   /usr/lib/systemd/system/ringbag.service         0644
#   /usr/lib/sysusers.d/ringbag.conf                0644  user ringbag, group ptp
#   /usr/lib/tmpfiles.d/ringbag.conf                0644  /var/lib/ringbag{,/bags}
#   /usr/lib/udev/rules.d/60-ringbag-ptp.rules      0644  group ptp reads /dev/ptp*
#   /etc/ringbag/ringbag.toml                       0644  the configuration
#   PREFIX/share/ringbag/ringbag.rules.yml          0644  Prometheus alerting rules, for the
#                                                         monitoring server's rule_files
# All owned by root when run as root. An existing ringbag.toml that differs from the default is
# never overwritten: the new default goes beside it as ringbag.toml.new.
#
# Then, on the running system: systemd-sysusers, systemd-tmpfiles --create, udevadm reload and
# trigger for ptp devices, systemctl daemon-reload and systemctl enable (not start: the
# configuration usually needs editing first). In an image root: systemctl --root=ROOT enable;
# users and directories are created at first boot by systemd-sysusers and systemd-tmpfiles.
#
# Idempotent: a file whose content and mode are already right is not touched, so a second run
# changes nothing. Each file is written to a temporary name and renamed into place, so an
# interrupted install never leaves a half-written binary or unit.
set -euo pipefail
# Directories and files are world-readable whatever the caller's umask: the service user must
# reach the binary and the unit's files.
umask 022

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=/
PREFIX=/usr
BIN=""
ENABLE=1

die() {
    echo "install.sh: $*" >&2
    exit 2
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --root | --prefix | --bin)
            [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
            case "$1" in
                --root) ROOT="$2" ;;
                --prefix) PREFIX="$2" ;;
                --bin) BIN="$2" ;;
            esac
            shift 2
            ;;
        --root=* | --prefix=* | --bin=*)
            v="${1#*=}"
            [[ -n "$v" ]] || die "${1%%=*} needs a value"
            case "$1" in
                --root=*) ROOT="$v" ;;
                --prefix=*) PREFIX="$v" ;;
                --bin=*) BIN="$v" ;;
            esac
            shift
            ;;
        --no-enable)
            ENABLE=0
            shift
            ;;
        -h | --help)
            sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done

[[ "$PREFIX" == /* ]] || die "--prefix must be an absolute path, got '$PREFIX'"
[[ -d "$ROOT" ]] || die "--root $ROOT is not a directory"
ROOT="$(cd "$ROOT" && pwd -P)"
LIVE=0
[[ "$ROOT" == / ]] && LIVE=1
PREFIX="${PREFIX%/}"
[[ -n "$PREFIX" ]] || PREFIX=/

# The packaged files: next to this script (release tarball) or in ../systemd (source checkout).
if [[ -d "$HERE/systemd" ]]; then
    SRC="$HERE/systemd"
elif [[ -d "$HERE/../systemd" ]]; then
    SRC="$(cd "$HERE/../systemd" && pwd)"
else
    die "no systemd/ directory next to $HERE or in its parent"
fi
for f in ringbag.service ringbag.sysusers ringbag.tmpfiles 60-ringbag-ptp.rules ringbag.toml ringbag.rules.yml; do
    [[ -f "$SRC/$f" ]] || die "$SRC/$f is missing"
done
[[ -n "$BIN" ]] || BIN="$HERE/ringbag"
[[ -f "$BIN" ]] || die "no ringbag binary at $BIN (pass --bin FILE)"
# A non-ELF file (a script, a truncated download) must not become the service's ExecStart.
[[ "$(head -c 4 "$BIN" | od -An -tx1 | tr -d ' \n')" == 7f454c46 ]] || die "$BIN is not an ELF executable"

# Where the systemd-side files go: the vendor directories for a /usr install, the admin ones
# (read by systemd and udev whatever the prefix) for any other prefix.
if [[ "$PREFIX" == /usr ]]; then
    LIBDIR=/usr/lib
    UNITDIR=/usr/lib/systemd/system
else
    LIBDIR=/etc
    UNITDIR=/etc/systemd/system
fi
BINPATH="$PREFIX/bin/ringbag"
BINPATH="${BINPATH//\/\//\/}"
RULESPATH="$PREFIX/share/ringbag/ringbag.rules.yml"
RULESPATH="${RULESPATH//\/\//\/}"

OWNER=()
[[ $EUID -eq 0 ]] && OWNER=(-o 0 -g 0)
CHANGED=0

# same FILE MODE SRC: the installed FILE already has SRC's bytes, the mode and (as root) owner.
same() {
    [[ -f "$1" ]] || return 1
    cmp -s "$1" "$3" || return 1
    [[ "$(stat -c %a "$1")" == "$2" ]] || return 1
    [[ $EUID -ne 0 || "$(stat -c %u:%g "$1")" == 0:0 ]]
}

# put SRC DEST MODE: install SRC at ROOT/DEST unless it is already there.
put() {
    local src="$1" dest="$ROOT${2}" mode="$3"
    dest="${dest//\/\//\/}"
    if same "$dest" "$mode" "$src"; then
        echo "unchanged  $2"
        return
    fi
    mkdir -p "$(dirname "$dest")" 2>/dev/null && [[ -w "$(dirname "$dest")" ]] ||
        die "cannot write $(dirname "$dest") (run as root?)"
    local tmp
    tmp="$(dirname "$dest")/.$(basename "$dest").install-$$"
    install -m "$mode" "${OWNER[@]}" "$src" "$tmp"
    mv -f "$tmp" "$dest"
    echo "installed  $2"
    CHANGED=1
}

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT

# The unit names the binary by its installed path.
sed "s|^ExecStart=/usr/bin/ringbag |ExecStart=$BINPATH |" "$SRC/ringbag.service" >"$STAGE/ringbag.service"
grep -q "^ExecStart=$BINPATH " "$STAGE/ringbag.service" || die "$SRC/ringbag.service has no 'ExecStart=/usr/bin/ringbag ' line"

put "$BIN" "$BINPATH" 755
put "$STAGE/ringbag.service" "$UNITDIR/ringbag.service" 644
put "$SRC/ringbag.sysusers" "$LIBDIR/sysusers.d/ringbag.conf" 644
put "$SRC/ringbag.tmpfiles" "$LIBDIR/tmpfiles.d/ringbag.conf" 644
put "$SRC/60-ringbag-ptp.rules" "$LIBDIR/udev/rules.d/60-ringbag-ptp.rules" 644
# Not read on the robot: copied to the Prometheus server (or read from an image) by whoever
# runs the monitoring.
put "$SRC/ringbag.rules.yml" "$RULESPATH" 644

# The configuration: an edited one (any content other than the default) stays; the default
# goes beside it, as a package manager would do with a conffile.
CONF=/etc/ringbag/ringbag.toml
if [[ -f "$ROOT$CONF" ]] && ! cmp -s "$ROOT$CONF" "$SRC/ringbag.toml"; then
    echo "kept       $CONF (edited)"
    put "$SRC/ringbag.toml" "$CONF.new" 644
else
    put "$SRC/ringbag.toml" "$CONF" 644
fi

if [[ $LIVE -eq 1 ]]; then
    command -v systemd-sysusers >/dev/null || die "systemd-sysusers not found: is this a systemd system?"
    systemd-sysusers "$LIBDIR/sysusers.d/ringbag.conf"
    systemd-tmpfiles --create "$LIBDIR/tmpfiles.d/ringbag.conf"
    # Give already present PTP clocks the group now, not only after the next boot.
    if command -v udevadm >/dev/null && [[ -S /run/udev/control ]]; then
        udevadm control --reload
        udevadm trigger --subsystem-match=ptp --action=change
    fi
    if [[ -d /run/systemd/system ]]; then
        systemctl daemon-reload
    else
        echo "note: systemd is not running here; skipped daemon-reload"
    fi
    if [[ $ENABLE -eq 1 ]]; then
        systemctl enable ringbag.service
    fi
elif [[ $ENABLE -eq 1 ]]; then
    command -v systemctl >/dev/null || die "systemctl not found: needed to enable the unit in $ROOT (or pass --no-enable)"
    systemctl --root="$ROOT" enable ringbag.service
fi

if [[ $CHANGED -eq 0 ]]; then
    echo "install.sh: nothing changed in $ROOT"
else
    echo "install.sh: installed into $ROOT (prefix $PREFIX)"
fi
