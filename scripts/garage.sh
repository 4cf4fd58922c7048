#!/usr/bin/env bash
# Garage 2.5.0 (an S3-compatible object store) as one node on loopback, for the upload tests and
# the upload benchmark. The same interface and output as ../shared/garage/garage.sh:
#
#   garage.sh start DIR [PORT]  start a node whose state lives in DIR (S3 API on 127.0.0.1:PORT,
#                               default 39900; RPC on PORT+1, admin on PORT+3) with a bucket
#                               "ringbag" and a key allowed on it; print shell assignments:
#                               S3_ENDPOINT S3_REGION S3_BUCKET AWS_ACCESS_KEY_ID
#                               AWS_SECRET_ACCESS_KEY GARAGE_PID. Started again on the same DIR
#                               (after a kill -9 too), it has its data, key and unfinished
#                               multipart uploads, and prints the same assignments.
#   garage.sh stop DIR          stop the node of DIR (SIGTERM, then SIGKILL after 5 s)
#   garage.sh bin               print the Garage binary's path; exit 1 with the reason if none
#   garage.sh build             build it once into the cache (cargo install, ~20 min on 2 cores)
#
# Which Garage:
#   1. $RINGBAG_GARAGE_BIN, a garage 2.5.0 binary: this script sets the node up itself;
#   2. else ../shared/garage/garage.sh next to the repository (or $RINGBAG_GARAGE_SHARED): every
#      command is handed to it;
#   3. else the build in ${XDG_CACHE_HOME:-~/.cache}/ringbag-garage (see `build`), set up here.
#
# With $RINGBAG_GARAGE_REGISTRY set to a file, every start appends "PID DIR" to it, so that
# scripts/test.sh can stop a node a failed test left running, even after its DIR was deleted.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=2.5.0
SHARED="${RINGBAG_GARAGE_SHARED:-$ROOT/../shared/garage/garage.sh}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/ringbag-garage"
CACHED_BIN="$CACHE/bin/garage"

usage() {
    echo "usage: garage.sh start DIR [PORT] | stop DIR | bin | build" >&2
    exit 2
}

# Which of the three Garages; "shared" hands everything to the shared script.
if [[ -n "${RINGBAG_GARAGE_BIN:-}" ]]; then
    MODE=own BIN="$RINGBAG_GARAGE_BIN"
elif [[ -f "$SHARED" ]]; then
    MODE=shared BIN=""
else
    MODE=own BIN="$CACHED_BIN"
fi

register() { # PID DIR
    # Best effort: a registry that cannot be written (e.g. inside a container that does not see
    # it) must not fail the start; the tests still stop their own nodes.
    if [[ -n "${RINGBAG_GARAGE_REGISTRY:-}" ]]; then
        { echo "$1 $2" >>"$RINGBAG_GARAGE_REGISTRY"; } 2>/dev/null || true
    fi
}

have_bin() {
    if [[ ! -x "$BIN" ]]; then
        if [[ -n "${RINGBAG_GARAGE_BIN:-}" ]]; then
            echo "garage.sh: RINGBAG_GARAGE_BIN=$BIN is not an executable" >&2
        else
            echo "garage.sh: no Garage: neither $SHARED nor a build in $CACHE (run \`scripts/garage.sh build\`, ~20 min)" >&2
        fi
        return 1
    fi
}

cmd="${1:-}"
case "$cmd" in
    start | stop) [[ $# -ge 2 && -n "$2" ]] || usage ;;
    bin | build) ;;
    *) usage ;;
esac

if [[ "$cmd" == build ]]; then
    if [[ -x "$CACHED_BIN" ]]; then
        echo "garage.sh: $CACHED_BIN already built"
        exit 0
    fi
    # sqlite: no LMDB to build; bundled-libs: no system libsodium/zstd needed. --locked: the
    # dependency versions Garage was released with.
    nice -n "${RINGBAG_NICE:-10}" cargo install garage --version "$VERSION" --locked \
        --no-default-features --features bundled-libs,sqlite --root "$CACHE"
    exit 0
fi

if [[ "$MODE" == shared ]]; then
    if [[ "$cmd" != start ]]; then
        exec bash "$SHARED" "$@"
    fi
    out="$(bash "$SHARED" "$@")"
    echo "$out"
    pid="$(sed -n 's/^GARAGE_PID=//p' <<<"$out")"
    [[ -z "$pid" ]] || register "$pid" "$(cd "$2" && pwd)"
    exit 0
fi

if [[ "$cmd" == bin ]]; then
    have_bin
    echo "$BIN"
    exit 0
fi

mkdir -p "$2"
dir="$(cd "$2" && pwd)"
pidfile="$dir/garage.pid"

# Whether PID is still the garage server of this DIR (a pid can be reused after a kill -9).
ours() {
    [[ -r "/proc/$1/cmdline" ]] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$dir/garage.toml"
}

if [[ "$cmd" == stop ]]; then
    [[ -f "$pidfile" ]] || exit 0
    pid="$(cat "$pidfile")"
    if ours "$pid"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            ours "$pid" || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    exit 0
fi

have_bin
port="${3:-39900}"
[[ "$port" =~ ^[0-9]+$ && $port -ge 1024 && $port -le 65532 ]] ||
    { echo "garage.sh: port '$port' is not in 1024..65532 (PORT+3 is used too)" >&2; exit 2; }
cfg="$dir/garage.toml"
if [[ -f "$cfg" ]]; then
    # A restart on the same DIR keeps its ports: the node's identity and layout name them.
    was="$(cat "$dir/port" 2>/dev/null || true)"
    if [[ -n "$was" && "$was" != "$port" ]]; then
        echo "garage.sh: $dir was started on port $was, not $port" >&2
        exit 2
    fi
else
    mkdir -p "$dir/meta" "$dir/data"
    secret="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
    (
        umask 077
        cat >"$cfg" <<EOF
# One node, one copy of each block, SQLite metadata: a test store, not a cluster.
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$((port + 1))"
rpc_public_addr = "127.0.0.1:$((port + 1))"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((port + 3))"
admin_token = "admin"
metrics_token = "metrics"
EOF
    )
    echo "$port" >"$dir/port"
fi

garage() { "$BIN" -c "$cfg" "$@"; }

# Poll CMD... every 100 ms for up to 10 s; true as soon as it succeeds.
poll() {
    local _
    for _ in $(seq 100); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

if [[ -f "$pidfile" ]] && ours "$(cat "$pidfile")"; then
    : # already running: print its assignments again
else
    # setsid: the server is not in the caller's process group, so a terminal's Ctrl-C aimed at
    # a test does not kill it half way through a write (the tests stop it themselves).
    setsid "$BIN" -c "$cfg" server >>"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    register "$!" "$dir"
    poll garage status || { echo "garage.sh: the node did not answer within 10 s; see $dir/server.log" >&2; exit 1; }
fi
pid="$(cat "$pidfile")"

# The one-time setup, in steps that each know whether they are done, so that a start
# interrupted half way (a test killed, a full disk) is finished by the next start.
if [[ ! -f "$dir/layout.done" ]]; then
    node="$(garage node id -q 2>/dev/null)"
    node="${node%%@*}"
    [[ -n "$node" ]] || { echo "garage.sh: no node id; see $dir/server.log" >&2; exit 1; }
    # One zone, one node; the capacity is a weight between nodes, not a quota.
    garage layout assign -z dc1 -c 1G "$node" >/dev/null
    garage layout apply --version 1 >/dev/null
    touch "$dir/layout.done"
fi
if [[ ! -f "$dir/key.env" ]]; then
    if [[ ! -f "$dir/key.env.new" ]]; then
        # The key is chosen here and imported, rather than parsed out of `key create`'s prose:
        # Garage's ids are "GK" + 12 bytes of hex, its secrets 32 bytes of hex.
        (
            umask 077
            printf 'AWS_ACCESS_KEY_ID=GK%s\nAWS_SECRET_ACCESS_KEY=%s\n' \
                "$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')" \
                "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" >"$dir/key.env.new"
        )
    fi
    id="$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$dir/key.env.new")"
    key="$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$dir/key.env.new")"
    garage bucket info ringbag >/dev/null 2>&1 || garage bucket create ringbag >/dev/null
    garage key info "$id" >/dev/null 2>&1 || garage key import --yes -n ringbag-test "$id" "$key" >/dev/null
    garage bucket allow --read --write --owner ringbag --key "$id" >/dev/null
    # Renamed last: a DIR with key.env is fully set up.
    mv "$dir/key.env.new" "$dir/key.env"
fi

# The S3 API answers a little after the layout settles; any HTTP status means it listens.
s3_up() {
    local code
    code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" || true
    [[ -n "$code" && "$code" != 000 ]]
}
poll s3_up || { echo "garage.sh: the S3 API on 127.0.0.1:$port did not answer; see $dir/server.log" >&2; exit 1; }

echo "S3_ENDPOINT=http://127.0.0.1:$port"
echo "S3_REGION=garage"
echo "S3_BUCKET=ringbag"
cat "$dir/key.env"
echo "GARAGE_PID=$pid"
