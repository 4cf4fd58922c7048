#!/usr/bin/env bash
# The service under a real systemd: `ringbag daemon` with systemd/ringbag.service, in a container.
#
#   scripts/systemd-test.sh            (root; CI runs it from scripts/test.sh)
#
# Method: systemd-nspawn boots the host's own systemd (252 on Debian 12) on a throwaway tmpfs
# root that shares the host's /usr (`--volatile=yes`). A work directory with the binary, the
# unit and the config files, laid out as in the release tarball, is bound into it at
# /opt/ringbag-test. Commands run inside through `nsenter -t <container PID 1> -a`. The test
# installs with scripts/install.sh (--prefix /opt/ringbag: the container's /usr is the host's,
# read-only), over a site config with the synthetic source and a small budget. The unit is
# used unchanged except, for the watchdog check alone, WatchdogSec=3 and LimitCORE=0, and for
# the upload check alone, LoadCredential=s3:... (uploads to a Garage on the host's loopback).
#
# Each check is a function; a check that needs a daemon feature still missing fails with what
# it did not see. The container is always powered off and the work directory removed (trap).
#
# Environment: RINGBAG_BIN (default: target/debug/ringbag, built if missing),
# SYSTEMD_TEST_KEEP=1 keeps the work directory, RINGBAG_GARAGE_SH (default scripts/garage.sh):
# the Garage of the upload check, which skips without one unless RINGBAG_UPLOAD_REQUIRED=1.
# Skips, with the reason, only where nspawn is impossible (no root, no systemd-nspawn, or a
# container that cannot boot here).
# Prints timings, restart counts and recovered message counts, and closes with
# `systemd: N passed, M failed`; exit 1 on a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/free-port.sh"
RB="${RINGBAG_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ringbag}"
NAME="ringbag-test-$$"
IN=/opt/ringbag-test                  # the work directory, as the container sees it
BAGS=/var/lib/ringbag/bags            # output_root of the test config (inside the container)
STATUS_FILE=/run/ringbag/status.json  # status_file (the unit's RuntimeDirectory)
CONFIG=/etc/ringbag/ringbag.toml
# The budget the restarts must respect; the medium synthetic profile writes ~7 MB/s, so the
# budget is exceeded within seconds and retention works for real.
BUDGET_BYTES=$((8 * 1024 * 1024))

skip() {
    echo "systemd: SKIPPED: $*"
    exit 0
}

[[ $EUID -eq 0 ]] || skip "needs root to run systemd-nspawn"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn missing (apt-get install systemd-container)"
for t in nsenter python3 ps; do
    command -v "$t" >/dev/null || { echo "systemd: missing tool $t" >&2; exit 1; }
done
[[ -d /run/systemd/system ]] && echo "systemd: host runs systemd as PID 1" ||
    echo "systemd: host PID 1 is not systemd (fine: the container boots its own)"
if [[ ! -x "$RB" ]]; then
    (cd "$ROOT" && nice -n 10 cargo build --bin ringbag)
fi

WORK="$(mktemp -d /var/tmp/ringbag-systemd.XXXXXX)"
# The service user must reach the binary through the bind mount.
chmod 0755 "$WORK"
NSPAWN_PID=""
CPID=""

cleanup() {
    local rc=$?
    if [[ -n "$NSPAWN_PID" ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        # SIGTERM asks nspawn for an orderly poweroff of the container; SIGKILL if it hangs
        # (nspawn's child, the container's PID 1, dies with it: PR_SET_PDEATHSIG).
        kill -TERM "$NSPAWN_PID" 2>/dev/null || true
        local i
        for i in $(seq 1 100); do
            kill -0 "$NSPAWN_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$NSPAWN_PID" 2>/dev/null || true
        wait "$NSPAWN_PID" 2>/dev/null || true
    fi
    # check_upload's Garage, when the check failed before stopping it.
    if [[ -d "$WORK/garage" ]]; then
        bash "${RINGBAG_GARAGE_SH:-$ROOT/scripts/garage.sh}" stop "$WORK/garage" >/dev/null 2>&1 || true
    fi
    if [[ "${SYSTEMD_TEST_KEEP:-0}" == 1 ]]; then
        echo "systemd: kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- files
# The release tarball's layout: the binary, install.sh, systemd/ and doc/ side by side.
cp "$RB" "$WORK/ringbag"
cp "$ROOT/scripts/install.sh" "$ROOT/scripts/systemd-dds-probe.py" "$WORK/"
cp -r "$ROOT/systemd" "$WORK/systemd"
"$RB" gen-docs --out "$WORK/doc"
cp "$ROOT/systemd/ringbag.toml" "$WORK/shipped.toml"
# The synthetic source with a small budget. clock = auto with an absent PTP device: the
# fallback to the system clock must be logged once as a warning.
cat >"$WORK/ringbag.toml" <<EOF
# scripts/systemd-test.sh: synthetic source, small budget.
source = "synthetic"
synthetic_profile = "medium"
synthetic_rate = "realtime"
output_root = "$BAGS"
status_file = "$STATUS_FILE"
bag_format = "jazzy"
max_bag_size = "1MiB"
max_record_size = $BUDGET_BYTES
clock = "auto"
ptp_device = "/dev/ptp-ringbag-test-absent"
EOF
# A mistake on line 3 (an unknown key): exit 2, file:line in the journal, no restart loop.
cat >"$WORK/bad.toml" <<EOF
source = "synthetic"
output_root = "$BAGS"
max_bag_sise = "1MiB"
EOF

# ---------------------------------------------------------------- helpers
# Every command in the container is bounded (a start waits for READY at most TimeoutStartSec=90),
# so a hung daemon or container fails the check instead of hanging CI.
C() { timeout 120 nsenter -t "$CPID" -a "$@"; }
prop() { C systemctl show -p "$1" --value ringbag; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
note() { echo "    $*"; }
# Metrics survive the checks' subshells in this file and are printed at the end.
metric() { echo "$*" >>"$WORK/metrics"; note "$*"; }
die() {
    echo "    FAIL: $*"
    exit 1
}
# wait_for SECONDS DESCRIPTION CMD...: poll CMD until it succeeds, or fail with DESCRIPTION.
wait_for() {
    local secs="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "not within ${secs}s: $what"
        sleep 0.2
    done
}
# differs OLD CMD...: CMD's output is no longer OLD.
differs() { [[ "$("${@:2}")" != "$1" ]]; }
is_failed() { [[ "$(prop ActiveState)" == failed ]]; }
nrestarts_above() { (($(prop NRestarts) > $1)); }
running() { [[ "$(prop ActiveState)/$(prop SubState)" == active/running ]]; }
# newest_bag: the bag directory named last (UTC start time + sequence number sort in order).
bags() { C find "$BAGS" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort; }
newest_bag() { bags | tail -n1; }
root_bytes() { C du -sb "$BAGS" | cut -f1; }
journal_since() { C journalctl -q --no-pager -u ringbag --since "@$1" "${@:2}"; }
# A bag not being written: no lock file left behind, metadata.yaml present, `info` reads it.
# (A bag retention removed meanwhile is not a failure: see info_json.)
# The running daemon's retention takes an older bag's lock for the moment it deletes a split
# there (the lock file exists meanwhile), so a lock file counts as left behind only if it is
# still there 5 s later.
lock_released() { C test ! -e "$BAGS/$1/.ringbag.lock" || gone "$1"; }
bag_complete() {
    local bag="$BAGS/$1" deadline=$((SECONDS + 5))
    until lock_released "$1"; do
        ((SECONDS < deadline)) || die "$1: .ringbag.lock left behind ($(C cat "$bag/.ringbag.lock" 2>/dev/null | tr -d '\n'); MainPID $(prop MainPID); journal: $(journal_since "$(($(date +%s) - 60))" -o cat "RINGBAG_BAG=$bag" | tail -n3 | tr '\n' ' '))"
        sleep 0.1
    done
    C test -s "$bag/metadata.yaml" || gone "$1" || die "$1: no metadata.yaml"
    info_json "$1" >/dev/null || die "$1: ringbag info fails: $(C "$IN/ringbag" info "$bag" 2>&1 | tail -n1)"
}
gone() { ! C test -d "$BAGS/$1"; }
# info_json BAG: `ringbag info --json`. The running daemon's retention deletes the oldest splits
# of older bags (a file, then metadata.yaml rewritten); `info` reading between the two sees a
# listed file missing. So retry a few times: a bag that stays unreadable fails, one that
# retention removed entirely prints {"deleted": true}.
info_json() {
    local i out
    for i in 1 2 3 4 5; do
        if out="$(C "$IN/ringbag" info "$BAGS/$1" --json 2>/dev/null)"; then
            echo "$out"
            return 0
        fi
        C test -d "$BAGS/$1" || { echo '{"deleted": true, "message_count": 0}'; return 0; }
        sleep 0.1
    done
    return 1
}
messages_in() {
    info_json "$1" | python3 -c 'import json,sys; d = json.load(sys.stdin); print("deleted by retention" if d.get("deleted") else d["message_count"])'
}
budget_holds() {
    local used
    used="$(root_bytes)"
    ((used <= BUDGET_BYTES)) || die "recording root holds $used bytes, over the budget of $BUDGET_BYTES"
    echo "$used"
}

# ---------------------------------------------------------------- checks
check_boot() {
    C systemctl --version | head -n1 | sed 's/^/    /'
    # `degraded` is fine: the throwaway root has no machine setup (systemd-firstboot).
    local state
    state="$(C systemctl is-system-running --wait || true)"
    [[ "$state" == running || "$state" == degraded ]] || die "container state '$state'"
    # A trivial notify service proves the container's systemd runs and supervises units.
    C systemd-run --quiet --wait -p Type=notify -p NotifyAccess=all \
        /bin/sh -c 'systemd-notify --ready --status=trivial; exit 0' ||
        die "a trivial Type=notify unit does not run"
}

check_install() {
    # The site's configuration is in place before the install, as on a robot being upgraded:
    # install.sh must keep it and put the shipped default beside it.
    C install -D -m 0644 "$IN/ringbag.toml" "$CONFIG"
    # The optional ROS 2 environment file (EnvironmentFile=-/etc/ringbag/ros.env).
    echo "ROS_DOMAIN_ID=42" | C install -D -m 0644 /dev/stdin /etc/ringbag/ros.env
    # scripts/install.sh on the live system, as an operator runs it from the release tarball.
    # The container's /usr is the host's, read-only: prefix /opt/ringbag, which puts the unit,
    # sysusers, tmpfiles and udev files under /etc and names /opt/ringbag/bin/ringbag in
    # ExecStart. It runs systemd-sysusers, systemd-tmpfiles, daemon-reload and enable itself.
    C bash "$IN/install.sh" --root / --prefix /opt/ringbag 2>&1 | sed 's/^/    install: /'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || die "install.sh failed"
    C cmp -s "$IN/ringbag.toml" "$CONFIG" || die "install.sh overwrote the edited $CONFIG"
    C cmp -s "$IN/shipped.toml" "$CONFIG.new" || die "install.sh did not put the default at $CONFIG.new"
    [[ "$(prop ExecStart)" == *"path=/opt/ringbag/bin/ringbag "* ]] || die "ExecStart: $(prop ExecStart)"
    [[ "$(C systemctl is-enabled ringbag)" == enabled ]] || die "install.sh did not enable ringbag.service"
    C test -f /opt/ringbag/share/man/man1/ringbag-record.1 -a \
        -f /opt/ringbag/share/bash-completion/completions/ringbag ||
        die "install.sh did not install the tarball's man pages and completions"
    # Reinstalling changes nothing.
    C bash "$IN/install.sh" --root / --prefix /opt/ringbag | grep -q 'nothing changed' ||
        die "a second install.sh run changed files"
    C id ringbag | sed 's/^/    /'
    C id -nG ringbag | grep -qw ptp || die "user ringbag is not in group ptp"
    [[ "$(C stat -c %U:%a "$BAGS")" == ringbag:750 ]] ||
        die "tmpfiles: $BAGS is $(C stat -c %U:%a "$BAGS"), want ringbag:750"
    # systemd's own lint of the unit (with the drop-in, so the binary exists).
    C systemd-analyze verify ringbag.service 2>&1 | sed 's/^/    verify: /'
    C systemd-analyze security ringbag.service | tail -n1 | sed 's/^/    /'
}

# The exposure score docs/service.md quotes, from the unit file as shipped (offline: no systemd
# needed, so this runs on the host).
MAX_EXPOSURE=2.0
check_exposure() {
    local line score
    line="$(systemd-analyze security --offline=true "$ROOT/systemd/ringbag.service" 2>&1 | tail -n1)"
    score="$(sed -n 's/.*ringbag.service: \([0-9.]*\).*/\1/p' <<<"$line")"
    [[ -n "$score" ]] || die "no score in: $line"
    metric "exposure: $score (systemd-analyze security --offline=true, at most $MAX_EXPOSURE)"
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$score" "$MAX_EXPOSURE" ||
        die "exposure $score above $MAX_EXPOSURE"
}

# The unit's sandbox (same hardening, user, groups) with a probe of what DDS needs as its
# ExecStart: netlink, UDP unicast and multicast (looped back), a /dev/shm segment.
check_sandbox_dds() {
    C install -m 0644 "$IN/systemd/ringbag.service" /etc/systemd/system/ringbag-dds-probe.service
    printf '[Service]\nType=oneshot\nRestart=no\nWatchdogSec=0\nExecStart=\nExecStart=/usr/bin/python3 %s/systemd-dds-probe.py\n' "$IN" |
        C install -D -m 0644 /dev/stdin /etc/systemd/system/ringbag-dds-probe.service.d/10-probe.conf
    # The allowlist covers loopback, link-local, multicast and the private ranges. A robot
    # network elsewhere is added by a drop-in, as the unit's comment says; do the same for the
    # address this machine's default route leaves from, if it is outside them.
    local addr
    addr="$(ip -4 route get 192.0.2.254 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
    if [[ -n "$addr" ]] && ! python3 -c 'import ipaddress, sys
a = ipaddress.ip_address(sys.argv[1])
allowed = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"]
sys.exit(0 if any(a in ipaddress.ip_network(n) for n in allowed) else 1)' "$addr"; then
        note "host address $addr is outside the unit's IPAddressAllow: drop-in IPAddressAllow=$addr/32"
        printf '[Service]\nIPAddressAllow=%s/32\n' "$addr" |
            C install -D -m 0644 /dev/stdin /etc/systemd/system/ringbag-dds-probe.service.d/20-robot-network.conf
    fi
    C systemctl daemon-reload
    local t0 rc=0
    t0="$(date +%s)"
    C systemctl start ringbag-dds-probe || rc=$?
    C journalctl -q --no-pager -u ringbag-dds-probe --since "@$t0" -o cat | grep 'dds-probe' | sed 's/^/    /'
    [[ $rc -eq 0 ]] || die "a DDS primitive is refused under the unit's sandbox"
    # IPAddressDeny= and DevicePolicy= need cgroup v2 BPF (or a delegated v1 devices
    # controller); a container on a cgroup-v1 host runs units without them. Say so, rather than
    # let the probe above claim it passed the IP allowlist.
    if C systemd-run -q --wait --pipe -p IPAddressDeny=any \
        python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))' \
        >/dev/null 2>&1; then
        note "NOTE: this container's systemd does not enforce IPAddressDeny= (no cgroup v2 BPF here): the IP allowlist was not exercised"
    else
        note "IPAddressDeny= is enforced here: the probe ran inside the unit's IP allowlist"
    fi
}

# systemd/ringbag.toml as shipped is valid once the root exists (tmpfiles). A binary built
# without the `ros` feature refuses only its `source = "ros"`, and accepts it as "synthetic".
check_shipped_config() {
    local rc=0 out
    out="$(C "$IN/ringbag" daemon --config "$IN/shipped.toml" --check-config 2>&1)" || rc=$?
    note "$out"
    if [[ $rc -eq 2 && "$out" == *"shipped.toml:"*"source"*"without the \`ros\` feature"* ]]; then
        sed 's/^source = "ros"$/source = "synthetic"/' "$WORK/shipped.toml" >"$WORK/shipped-synthetic.toml"
        out="$(C "$IN/ringbag" daemon --config "$IN/shipped-synthetic.toml" --check-config 2>&1)" ||
            die "shipped config with source = \"synthetic\": $out"
        note "$out"
    elif [[ $rc -ne 0 ]]; then
        die "the shipped ringbag.toml is refused (exit $rc)"
    fi
}

check_config() {
    C "$IN/ringbag" daemon --config "$CONFIG" --check-config || die "--check-config refuses the test config"
    local rc=0 out
    out="$(C "$IN/ringbag" daemon --config "$IN/bad.toml" --check-config 2>&1)" || rc=$?
    note "bad config: $out"
    [[ $rc -eq 2 ]] || die "--check-config of a bad config exits $rc, want 2"
    [[ "$out" == *"$IN/bad.toml:3"* ]] || die "the error does not name $IN/bad.toml:3"
}

check_start_ready() {
    local t0 t1
    t0="$(now)"
    C systemctl start ringbag || die "systemctl start ringbag failed: $(C systemctl status --no-pager ringbag | tail -n5)"
    t1="$(now)"
    # Type=notify: start returned, so READY=1 arrived; the first split must already exist.
    running || die "after start: $(prop ActiveState)/$(prop SubState)"
    local bag
    bag="$(newest_bag)"
    [[ -n "$bag" ]] || die "start returned before any bag exists under $BAGS"
    C sh -c "ls $BAGS/$bag/*.db3" >/dev/null 2>&1 || die "start returned before the first split of $bag was open"
    C systemctl status --no-pager ringbag | grep -q 'active (running)' || die "systemctl status does not say active (running)"
    local exec_us ready_us
    exec_us="$(prop ExecMainStartTimestampMonotonic)"
    ready_us="$(prop ActiveEnterTimestampMonotonic)"
    # The unit's identity and priorities reached the process.
    local pid ident
    pid="$(prop MainPID)"
    ident="$(C ps -o user=,group=,supgrp=,nice= -p "$pid" | xargs)"
    note "main process $pid: user group supplementary nice = $ident; I/O $(C ionice -p "$pid")"
    [[ "$ident" == "ringbag ringbag ringbag,ptp 5" ]] || die "main process runs as '$ident', want 'ringbag ringbag ringbag,ptp 5'"
    local io
    io="$(C ionice -p "$pid")"
    [[ "$io" == "best-effort: prio 7" ]] || die "main process I/O class '$io', want 'best-effort: prio 7'"
    C cat "/proc/$pid/environ" | tr '\0' '\n' | grep -qx 'ROS_DOMAIN_ID=42' ||
        die "ROS_DOMAIN_ID from /etc/ringbag/ros.env is not in the main process's environment"
    metric "timing: systemctl start -> READY $(elapsed "$t0" "$t1") s (exec -> READY $(((ready_us - exec_us) / 1000)) ms), bag $bag"
}

check_status() {
    running || die "service not running"
    local line
    wait_for 5 "a STATUS= line" test -n "$(prop StatusText)"
    line="$(C systemctl status --no-pager ringbag | grep -m1 'Status:' || true)"
    [[ -n "$line" ]] || die "systemctl status shows no Status: line"
    note "systemctl status:${line#*Status:}"
    local s1 s2
    wait_for 5 "the status file $STATUS_FILE" C test -s "$STATUS_FILE"
    s1="$(C cat "$STATUS_FILE")"
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$s1" || die "status file is not JSON"
    # Rewritten every second: it must change (uptime, counters) within a few seconds.
    wait_for 5 "the status file to be rewritten" differs "$s1" C cat "$STATUS_FILE"
    s2="$(prop StatusText)"
    wait_for 5 "the STATUS= line to change" differs "$s2" prop StatusText
    note "STATUS= a few seconds later: $(prop StatusText)"
    C "$IN/ringbag" status --file "$STATUS_FILE" | sed 's/^/    status: /' || die "ringbag status failed"
    C "$IN/ringbag" status --file "$STATUS_FILE" --json | python3 -c 'import json,sys; json.load(sys.stdin)' ||
        die "ringbag status --json is not JSON"
}

# ptp_messages [PRIORITY]: the journal's ringbag entries about the PTP clock, as
# "PRIORITY<tab>MESSAGE" lines, optionally only those at PRIORITY exactly.
ptp_messages() {
    C journalctl -q --no-pager -u ringbag -o json | python3 -c '
import json, sys
want = sys.argv[1] if len(sys.argv) > 1 else None
for line in sys.stdin:
    e = json.loads(line)
    m = e.get("MESSAGE", "")
    if isinstance(m, list):
        m = bytes(m).decode(errors="replace")
    if ("ptp" in m.lower() or "phc" in m.lower()) and want in (None, e.get("PRIORITY")):
        print("%s\t%s" % (e.get("PRIORITY"), m))
' "$@"
}

check_ptp_warning() {
    # The fallback from the absent PHC to the system clock, at warning priority (4) exactly,
    # and shown by the operator's filter `-p warning`.
    local found
    found="$(ptp_messages 4 | head -n1)"
    if [[ -z "$found" ]]; then
        ptp_messages | head -n3 | sed 's/^/    seen at PRIORITY=/'
        die "no PTP fallback warning (PRIORITY=4) in journalctl -u ringbag"
    fi
    note "journal (PRIORITY=${found%%$'\t'*}): ${found#*$'\t'}"
    C journalctl -q --no-pager -u ringbag -p warning -o cat | grep -qiF "${found#*$'\t'}" ||
        die "journalctl -u ringbag -p warning does not show it"
}

# kill_and_restart ROUND: SIGKILL the main process, systemd restarts it, the killed bag is
# recovered by the next start, the budget holds.
kill_and_restart() {
    local round="$1" n0 pid0 killed t_kill
    n0="$(prop NRestarts)"
    pid0="$(prop MainPID)"
    killed="$(newest_bag)"
    # Let the bag get some messages (and rotate splits) before the kill, checking the budget
    # five times a second meanwhile.
    budget_during 2
    t_kill="$(date +%s)"
    C systemctl kill -s KILL ringbag
    wait_for 30 "restart after SIGKILL (NRestarts stays $n0)" \
        nrestarts_above "$n0"
    wait_for 30 "active (running) again after the restart" running
    local n1 pid1 newbag
    n1="$(prop NRestarts)"
    pid1="$(prop MainPID)"
    [[ "$pid1" != "$pid0" ]] || die "MainPID unchanged"
    newbag="$(newest_bag)"
    [[ "$newbag" != "$killed" ]] || die "no new bag after the restart"
    # The killed bag: recovered before READY (no lock left, info reads it) unless retention has
    # already deleted it entirely.
    local count="deleted by retention"
    if C test -d "$BAGS/$killed"; then
        bag_complete "$killed"
        count="$(messages_in "$killed") messages on disk now"
    fi
    local rec
    # Found by the entry's structured field, as an operator would filter for one bag.
    rec="$(journal_since "$t_kill" -o cat "RINGBAG_BAG=$BAGS/$killed" | grep -i 'recover' || true)"
    [[ -n "$rec" ]] || die "the restarted daemon logged no recovery of $killed (journalctl RINGBAG_BAG=$BAGS/$killed)"
    local exec_us ready_us
    exec_us="$(prop ExecMainStartTimestampMonotonic)"
    ready_us="$(prop ActiveEnterTimestampMonotonic)"
    metric "restart $round: exec -> READY $(((ready_us - exec_us) / 1000)) ms (recovery included)"
    local used
    used="$(budget_holds)"
    metric "restart $round: NRestarts $n0 -> $n1, killed bag $killed ($count); root $used/$BUDGET_BYTES bytes"
    while IFS= read -r l; do metric "  recovered: $l"; done <<<"$rec"
}

# budget_during SECONDS: sample the recording root's size 5 times a second; fail above the
# budget; remember the largest sample.
budget_during() {
    local until=$((SECONDS + $1)) used
    while ((SECONDS < until)); do
        used="$(budget_holds)"
        local max=0
        [[ -f "$WORK/budget_max" ]] && max="$(cat "$WORK/budget_max")"
        ((used > max)) && echo "$used" >"$WORK/budget_max"
        sleep 0.2
    done
}

check_kill_restart() {
    running || die "service not running"
    local i
    for i in 1 2 3; do
        kill_and_restart "$i"
    done
    # Every bag but the one being written is complete.
    local b cur
    cur="$(newest_bag)"
    for b in $(bags); do
        [[ "$b" == "$cur" ]] || bag_complete "$b"
    done
    budget_during 2
    metric "budget: largest sample of the root over the restarts $(cat "$WORK/budget_max") of $BUDGET_BYTES bytes"
}

# ExecReload: SIGHUP re-reads the config and starts a new bag; the service stays up.
check_reload() {
    running || die "service not running"
    local pid0 bag0
    pid0="$(prop MainPID)"
    bag0="$(newest_bag)"
    C systemctl reload ringbag
    wait_for 10 "a new bag after systemctl reload" differs "$bag0" newest_bag
    # The daemon sent RELOADING=1; the unit is `reloading` until its READY=1, which follows
    # the new bag's first split by a moment.
    wait_for 10 "active (running) after reload (READY=1 after RELOADING=1)" running
    [[ "$(prop MainPID)" == "$pid0" ]] || die "reload restarted the process"
    metric "reload: bag $bag0 -> $(newest_bag), same process"
}

check_watchdog() {
    C install -D -m 0644 /dev/stdin /etc/systemd/system/ringbag.service.d/20-test-watchdog.conf <<EOF
[Service]
WatchdogSec=3
# The watchdog's SIGABRT would dump a core of the test's process through the host's handler.
LimitCORE=0
EOF
    C systemctl daemon-reload
    C systemctl restart ringbag
    running || die "not running after restart with WatchdogSec=3"
    local n0 pid0 t0
    n0="$(prop NRestarts)"
    pid0="$(prop MainPID)"
    t0="$(date +%s)"
    local t_stop
    t_stop="$(now)"
    # A stopped process sends no WATCHDOG=1: systemd must kill it and restart it.
    C kill -STOP "$pid0"
    wait_for 30 "watchdog restart (NRestarts stays $n0)" \
        nrestarts_above "$n0"
    wait_for 30 "active (running) after the watchdog restart" running
    journal_since "$t0" -o cat | grep -qi 'watchdog timeout' || die "no 'Watchdog timeout' in the journal"
    metric "watchdog: SIGSTOP -> watchdog kill -> restart, NRestarts $n0 -> $(prop NRestarts), SIGSTOP -> running again $(elapsed "$t_stop" "$(now)") s"
    # While it runs normally the watchdog must not fire (the pings come while writing).
    local n1
    n1="$(prop NRestarts)"
    sleep 7
    [[ "$(prop NRestarts)" == "$n1" ]] || die "watchdog fired on a healthy writer (WatchdogSec=3)"
    C rm /etc/systemd/system/ringbag.service.d/20-test-watchdog.conf
    C systemctl daemon-reload
}

check_stop_clean() {
    running || C systemctl start ringbag
    local bag
    bag="$(newest_bag)"
    sleep 2
    local t0 t1
    t0="$(now)"
    C systemctl stop ringbag
    t1="$(now)"
    [[ "$(prop ActiveState)" == inactive ]] || die "after stop: $(prop ActiveState)/$(prop SubState)"
    [[ "$(prop ExecMainStatus)" == 0 ]] || die "exit status $(prop ExecMainStatus) after stop"
    [[ "$(prop Result)" == success ]] || die "Result=$(prop Result) after stop"
    bag_complete "$bag"
    metric "stop: systemctl stop took $(elapsed "$t0" "$t1") s; exit 0, bag $bag complete with $(messages_in "$bag") messages"
    C "$IN/ringbag" info "$BAGS/$bag" | grep -E '^(Duration|Messages|Bag size|Files)' | sed 's/^/    info: /'
    budget_holds >/dev/null
}

check_bad_config() {
    C install -m 0644 "$IN/bad.toml" "$CONFIG"
    C systemctl reset-failed ringbag 2>/dev/null || true
    local n0 t0 rc
    n0="$(prop NRestarts)"
    t0="$(date +%s)"
    if C systemctl start ringbag 2>/dev/null; then
        die "systemctl start succeeded with a bad config"
    fi
    wait_for 10 "state failed" is_failed
    [[ "$(prop ExecMainStatus)" == 2 ]] || die "exit status $(prop ExecMainStatus), want 2"
    local err
    err="$(journal_since "$t0" -o cat | grep -m1 "$CONFIG:3" || true)"
    [[ -n "$err" ]] || die "no '$CONFIG:3' error in the journal: $(journal_since "$t0" -o cat | tail -n3)"
    note "journal: $err"
    # No restart loop: RestartPreventExitStatus=2. Several RestartSec later it is still failed
    # and was not restarted (an assertion that nothing happens needs a bounded wait).
    sleep 6
    [[ "$(prop ActiveState)" == failed ]] || die "no longer failed: $(prop ActiveState)"
    [[ "$(prop NRestarts)" == "$n0" ]] || die "restarted with a bad config (NRestarts $n0 -> $(prop NRestarts))"
    metric "bad config: failed, exit 2, NRestarts stays $n0"
    # The last status file stays (RuntimeDirectoryPreserve=yes) and, older than 5 s now, says
    # the service is not recording: exit 3.
    rc=0
    C "$IN/ringbag" status --file "$STATUS_FILE" >/dev/null 2>&1 || rc=$?
    [[ $rc -eq 3 ]] || die "ringbag status on the stopped service's status file exits $rc, want 3"
    note "ringbag status after the stop: exit 3 (stale)"
    C install -m 0644 "$IN/ringbag.toml" "$CONFIG"
    C systemctl reset-failed ringbag
}

# Fleet offload under the hardened unit: the shipped unit plus one drop-in with
# LoadCredential=s3:... (the line the unit carries commented out), a config with [upload] to a
# Garage on the host's loopback. The container has no network namespace of its own
# (systemd-nspawn without --private-network), so 127.0.0.1 inside is the host's, and the unit's
# IPAddressAllow= admits `localhost`; an endpoint outside the private ranges needs a drop-in
# (docs/upload.md, "Fleet offload"). What the bags' journals count as uploaded is read back with curl's
# SigV4 (scripts/upload-verify.py): HEAD size and ETag, and SHA-256 against the file.
GARAGE_SH="${RINGBAG_GARAGE_SH:-$ROOT/scripts/garage.sh}"
check_upload() {
    if ! bash "$GARAGE_SH" bin >/dev/null 2>"$WORK/garage.err"; then
        [[ "${RINGBAG_UPLOAD_REQUIRED:-0}" != 1 ]] || die "RINGBAG_UPLOAD_REQUIRED=1 but no Garage: $(cat "$WORK/garage.err")"
        note "SKIPPED (no Garage: $(cat "$WORK/garage.err"))"
        return 0
    fi
    command -v curl >/dev/null || die "curl missing (upload-verify.py reads the bucket with it)"
    local port vars
    port="$(free_port)"
    vars="$(bash "$GARAGE_SH" start "$WORK/garage" "$port")" || die "garage.sh start failed"
    eval "$vars"
    export S3_ENDPOINT S3_BUCKET S3_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    [[ "$S3_ENDPOINT" == http://127.0.0.1:* ]] || die "Garage not on loopback: $S3_ENDPOINT"
    # root's, 0600, in AWS's format; systemd hands the service a copy only it can read.
    printf 'aws_access_key_id = %s\naws_secret_access_key = %s\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" |
        C install -m 0600 /dev/stdin /etc/ringbag/s3.credentials
    printf '[Service]\nLoadCredential=s3:/etc/ringbag/s3.credentials\n' |
        C install -D -m 0644 /dev/stdin /etc/systemd/system/ringbag.service.d/30-upload.conf
    # A larger budget than the other checks' (uploaded splits go first anyway), and splits
    # above part_size, so that some go multipart.
    sed 's/^max_bag_size = .*/max_bag_size = "6MiB"/; s/^max_record_size = .*/max_record_size = "48MiB"/' \
        "$WORK/ringbag.toml" >"$WORK/upload.toml"
    printf '[upload]\nendpoint = "%s"\nregion = "%s"\nbucket = "%s"\npath_style = true\nrobot_id = "systemd-test"\npart_size = "5MiB"\n' \
        "$S3_ENDPOINT" "$S3_REGION" "$S3_BUCKET" >>"$WORK/upload.toml"
    C install -m 0644 "$IN/upload.toml" "$CONFIG"
    C systemctl daemon-reload
    # (systemd 252's `show` prints LoadCredential= as [unprintable]: the drop-in's path instead.)
    [[ "$(prop DropInPaths)" == *30-upload.conf* ]] || die "the drop-in is not in effect: $(prop DropInPaths)"
    # The exposure with the drop-in, from the live unit (check_exposure scores the file alone).
    local line score
    line="$(C systemd-analyze security ringbag.service | tail -n1)"
    score="$(sed -n 's/.*ringbag.service: \([0-9.]*\).*/\1/p' <<<"$line")"
    [[ -n "$score" ]] || die "no score in: $line"
    metric "upload: exposure with the LoadCredential= drop-in $score (at most $MAX_EXPOSURE)"
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$score" "$MAX_EXPOSURE" ||
        die "exposure $score above $MAX_EXPOSURE with the drop-in"
    local t0 t1
    t0="$(date +%s)"
    t1="$(now)"
    C systemctl start ringbag || die "start with [upload] failed: $(C systemctl status --no-pager ringbag | tail -n5)"
    journal_since "$t0" -o cat | grep -qF 'credentials from $CREDENTIALS_DIRECTORY/s3' ||
        die "the daemon does not say its credentials came from \$CREDENTIALS_DIRECTORY/s3: $(journal_since "$t0" -o cat | grep -i upload | head -n3)"
    wait_for 60 "4 files uploaded with no error (status: $(C cat "$STATUS_FILE" 2>/dev/null | head -c 600))" uploaded_at_least 4
    local took
    took="$(elapsed "$t1" "$(now)")"
    [[ "$(prop StatusText)" == *upload* ]] || die "STATUS= does not mention upload: $(prop StatusText)"
    note "STATUS=: $(prop StatusText)"
    C systemctl stop ringbag
    [[ "$(prop Result)" == success ]] || die "Result=$(prop Result) after stop"
    # The container's files through its root as the host sees it (same inodes and mtimes).
    local out rc=0
    out="$(python3 "$ROOT/scripts/upload-verify.py" "/proc/$CPID/root$BAGS" --min-content 4)" || rc=$?
    sed 's/^/    verify: /' <<<"$out"
    [[ $rc -eq 0 ]] || die "what the journals count as uploaded is not all in the bucket"
    metric "upload: start -> 4 files uploaded ${took} s; $(tail -n1 <<<"$out")"
    # Neither half of the key pair, as the file holds it, reached the journal (of any unit).
    local v
    for v in "$AWS_SECRET_ACCESS_KEY" "$AWS_ACCESS_KEY_ID"; do
        ! C journalctl -q --no-pager -o cat | grep -qF -- "$v" || die "the credentials file's content appears in the journal"
        ! C journalctl -q --no-pager -u ringbag -o json | grep -qF -- "$v" || die "the credentials file's content appears in the journal's fields"
    done
    note "the key id and the secret appear nowhere in the journal"
    C rm -f /etc/systemd/system/ringbag.service.d/30-upload.conf /etc/ringbag/s3.credentials
    C install -m 0644 "$IN/ringbag.toml" "$CONFIG"
    C systemctl daemon-reload
    bash "$GARAGE_SH" stop "$WORK/garage" >/dev/null 2>&1 || true
}
# uploaded_at_least N: the status file counts N files uploaded, and no upload error.
uploaded_at_least() {
    C cat "$STATUS_FILE" 2>/dev/null | python3 -c 'import json, sys
u = json.load(sys.stdin).get("upload") or {}
sys.exit(0 if u.get("files_uploaded", 0) >= int(sys.argv[1]) and not u.get("last_error") else 1)' "$1"
}

# ---------------------------------------------------------------- boot
echo "systemd: booting a container (systemd-nspawn --volatile=yes), work dir $WORK"
# binfmt_misc is not namespaced on this kernel: the container's systemd-binfmt would register
# the host's binfmt.d entries at boot and, worse, `--unregister` every entry of the whole
# machine at shutdown (the aarch64 stage's qemu registration included). Masked.
systemd-nspawn -D / --volatile=yes --register=no --keep-unit -M "$NAME" \
    --bind="$WORK:$IN" -b --console=pipe -- \
    systemd.mask=systemd-binfmt.service \
    systemd.mask=proc-sys-fs-binfmt_misc.automount \
    systemd.mask=proc-sys-fs-binfmt_misc.mount \
    >"$WORK/console.log" 2>&1 </dev/null &
NSPAWN_PID=$!
T_BOOT="$(now)"
deadline=$((SECONDS + 60))
while [[ -z "$CPID" ]]; do
    if ! kill -0 "$NSPAWN_PID" 2>/dev/null; then
        skip "systemd-nspawn exited before booting: $(tail -n3 "$WORK/console.log" | tr '\n' ' ')"
    fi
    ((SECONDS < deadline)) || skip "no container PID 1 within 60s"
    # The container's PID 1 is nspawn's child running systemd.
    CPID="$(ps -o pid=,comm= --ppid "$NSPAWN_PID" | awk '$2 == "systemd" { print $1; exit }' || true)"
    [[ -n "$CPID" ]] || sleep 0.2
done
# systemd must be far enough to answer on its bus before the checks run.
until C systemctl is-system-running >/dev/null 2>&1 || [[ "$(C systemctl is-system-running 2>/dev/null)" =~ ^(starting|degraded|running)$ ]]; do
    ((SECONDS < deadline)) || { tail -n 20 "$WORK/console.log" >&2; skip "the container's systemd never answered"; }
    sleep 0.2
done
echo "systemd: container PID 1 is $CPID (nspawn $NSPAWN_PID), up after $(elapsed "$T_BOOT" "$(now)") s"

# ---------------------------------------------------------------- run
PASSED=0
FAILED=0
FAILED_NAMES=()
run_check() {
    local name="$1" rc
    echo "--- $name"
    # set -e inside the subshell: the first failing command fails the check. Not inside a
    # condition (`|| rc=$?` would turn set -e off in the subshell).
    set +e
    (
        set -e
        "check_$name"
    )
    rc=$?
    set -e
    if [[ $rc -eq 0 ]]; then
        echo "ok  $name"
        PASSED=$((PASSED + 1))
    else
        echo "FAIL $name"
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
        C journalctl -q --no-pager -u ringbag -n 8 2>/dev/null | sed 's/^/    journal: /' || true
    fi
}

run_check exposure
run_check boot
run_check install
run_check sandbox_dds
run_check shipped_config
run_check config
run_check start_ready
run_check status
run_check ptp_warning
run_check kill_restart
run_check reload
run_check watchdog
run_check stop_clean
run_check bad_config
run_check upload

echo
echo "systemd: summary"
[[ -f "$WORK/metrics" ]] && sed 's/^/    /' "$WORK/metrics"
[[ $FAILED -eq 0 ]] || echo "    failed: ${FAILED_NAMES[*]}"
echo "systemd: took $SECONDS s"
echo "systemd: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
