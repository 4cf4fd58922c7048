#!/usr/bin/env bash
# Power-cut test: simulated power loss while recording, then recovery, checked bag by bag.
#
#   scripts/powercut-test.sh            (root; CI runs it from scripts/test.sh)
#
# Method: an ext4 filesystem on a loop device whose backing image lies on XFS (itself a
# loop-mounted image file). ringbag records into the ext4 with retention active. At a random
# moment an atomic `cp --reflink=always` of the ext4 image is taken: that copy is exactly what
# a power cut leaves (what only sat in the page cache is lost; everything fsynced is in it).
# Each copy is mounted (the ext4 journal replays, as at boot) and checked twice, on two
# copies of the cut:
#   A. `ringbag record --recover -o <root>/new` (short) must exit 0;
#   B. `ringbag reindex` of each bag must exit 0;
# then every bag must read fully (`info` and `play --sink echo` exit 0, and the number of
# messages played equals info's count), and every split the recorder logged as closed
# (fsynced) before the cut must be intact: quick_check ok and exactly the logged number of
# messages (a split retention deleted before the cut may be gone).
# The "window" cuts record in real time into one large open split (no split closes before
# the cut) and measure what the open split lost: the newest message that came back must be
# at most POWERCUT_MAX_LOSS_S (default 3) seconds older than the cut. The recorder writes the
# open split back every second (pipeline::syncer), so it is about one second; before that
# write-back existed the whole open split was lost.
#
# Two configurations record with `--compression-mode file --compression-format zstd`: there a
# split logged closed may be its `.db3`, its `.db3.zstd` or both at the cut, and every form
# present must hold all its messages (the `.zstd` decompressed with the zstd CLI); no
# compression's `.partial` may outlive recovery or reindex.
#
# Then the upload cuts (see "uploads across power cuts" below): the daemon uploading to Garage
# while the power goes.
#
# Environment: POWERCUT_CUTS (default 18), POWERCUT_UPLOAD_CUTS (default 2; Garage from
# RINGBAG_GARAGE_SH, default scripts/garage.sh), POWERCUT_SEED (default: time), RINGBAG_BIN
# (default: target/debug/ringbag, built if missing), POWERCUT_JSON (a file: also write a JSON
# summary there, one object per cut and the totals, for scripts/plot-bench.py). Skips, with the
# reason, only where loop devices cannot be used (no root, no /dev/loop-control, mounting refused).
# Prints one line per cut and closes with `powercut: N passed, M failed`; exit 1 on a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/free-port.sh"
CUTS="${POWERCUT_CUTS:-18}"
MAX_LOSS_S="${POWERCUT_MAX_LOSS_S:-3}"
SEED="${POWERCUT_SEED:-$(date +%s)}"
RANDOM=$((SEED % 32768))
RB="${RINGBAG_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ringbag}"
JSON_OUT="${POWERCUT_JSON:+$(realpath -m "$POWERCUT_JSON")}"

skip() {
    echo "powercut: SKIPPED: $*"
    exit 0
}

[[ $EUID -eq 0 ]] || skip "needs root to mount loop devices"
[[ -e /dev/loop-control ]] || skip "no /dev/loop-control (loop devices unavailable here)"
for t in losetup mkfs.xfs mkfs.ext4 mount umount python3 cp zstd; do
    command -v "$t" >/dev/null || {
        echo "powercut: missing tool $t (scripts/test.sh installs xfsprogs, e2fsprogs, zstd)" >&2
        exit 1
    }
done
if [[ ! -x "$RB" ]]; then
    (cd "$ROOT" && nice -n "${RINGBAG_NICE:-10}" cargo build -q --bin ringbag)
fi

W="$(mktemp -d /tmp/ringbag-powercut.XXXXXX)"
# What to undo, in the order it was done ("umount DIR" / "detach DEV"); unwound backwards, so
# a filesystem is unmounted before the loop device under it is detached, and the ext4's loop
# device (its image lies on the XFS) is detached before the XFS is unmounted.
UNDO=()
PASSED=0
FAILED=0
FINISHED=0
pid=""
cut=0
GARAGE_STATE=""

cleanup() {
    local rc=$? i what arg
    trap '' INT TERM
    # The recorder of the current cut, if we stopped in the middle of one.
    if [[ -n "$pid" ]]; then
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    # The upload cuts' Garage (its state is under $W, removed below).
    if [[ -n "${GARAGE_STATE:-}" ]]; then
        bash "$GARAGE_SH" stop "$GARAGE_STATE" >/dev/null 2>&1 || true
    fi
    for ((i = ${#UNDO[@]} - 1; i >= 0; i--)); do
        read -r what arg <<<"${UNDO[$i]}"
        case "$what" in
            umount) umount "$arg" 2>/dev/null || umount -l "$arg" 2>/dev/null || true ;;
            detach) losetup -d "$arg" 2>/dev/null || true ;;
        esac
    done
    rm -rf "$W"
    if [[ $FINISHED -eq 0 && $cut -gt 0 ]]; then
        echo "powercut: aborted in cut $cut (exit $rc); $PASSED passed, $((FAILED + 1)) failed"
        exit 1
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# attach IMAGE: set DEV to a new loop device backed by IMAGE.
attach() {
    DEV="$(losetup -f --show "$1")"
    UNDO+=("detach $DEV")
}
mount_at() { # DEV DIR
    mkdir -p "$2"
    mount "$1" "$2"
    UNDO+=("umount $2")
}
# undo_last "umount DIR" | "detach DEV": do it now and forget it (it must be the last entry).
undo_last() {
    local what arg
    read -r what arg <<<"$1"
    [[ "${UNDO[-1]}" == "$1" ]] || { echo "powercut: undo out of order: $1" >&2; return 1; }
    case "$what" in
        umount) umount "$arg" ;;
        detach) losetup -d "$arg" ;;
    esac
    unset 'UNDO[-1]'
}

# The XFS that holds the ext4 image (reflink makes the copy atomic and cheap).
truncate -s 2G "$W/xfs.img"
mkfs.xfs -q -m reflink=1 "$W/xfs.img"
attach "$W/xfs.img" || skip "losetup cannot attach a loop device here"
mount_at "$DEV" "$W/xfs" 2>/dev/null || skip "mounting a loop device is not permitted here"
truncate -s 512M "$W/xfs/ext4.img"
mkfs.ext4 -q -F "$W/xfs/ext4.img"
attach "$W/xfs/ext4.img"
LIVE_DEV="$DEV"
mount_at "$LIVE_DEV" "$W/live"
mkdir -p "$W/logs"

# Checks one recovered root: every bag reads fully, every split logged closed before the cut
# is intact. Prints problems (nothing when all is well) and a summary on the last line.
cat >"$W/check.py" <<'PY'
import json, os, re, sqlite3, subprocess, sys
rb, root, live_root, cut_ns, max_loss_s = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
logs = sys.argv[6:]
problems, bags, msgs = [], 0, 0
newest = None  # newest message stamp of the bag recorded at the cut ("b")
closed = {}  # path in the copy -> messages logged at close
pat = re.compile(r"closed split (\S+): (\d+) messages, fsynced")
for lg in logs:
    for line in open(lg, errors="replace"):
        m = pat.search(line)
        if m:
            closed[m.group(1).replace(live_root, root, 1)] = int(m.group(2))
for name in sorted(os.listdir(root)):
    bag = os.path.join(root, name)
    if not os.path.isdir(bag):
        continue
    bags += 1
    info = subprocess.run([rb, "info", bag, "--json"], capture_output=True, text=True)
    if info.returncode != 0:
        problems.append(f"{name}: info exit {info.returncode}: {info.stderr.strip()}")
        continue
    count = json.loads(info.stdout)["message_count"]
    play = subprocess.run([rb, "play", bag, "--sink", "echo", "-r", "1000000000"],
                          capture_output=True, text=True)
    played = play.stdout.count("\n")
    if play.returncode != 0:
        problems.append(f"{name}: play exit {play.returncode}: {play.stderr.strip()}")
    elif played != count:
        problems.append(f"{name}: info says {count} messages, play gave {played}")
    msgs += count
    if name == "b":
        for f in os.listdir(bag):
            if f.endswith(".db3"):
                c = sqlite3.connect(f"file:{os.path.join(bag, f)}?mode=ro", uri=True)
                t = c.execute("SELECT max(timestamp) FROM messages").fetchone()[0]
                c.close()
                if t is not None and (newest is None or t > newest):
                    newest = t
    if os.path.exists(os.path.join(bag, ".ringbag.lock")):
        problems.append(f"{name}: still marked unclean after recovery")
    for dirpath, _, files in os.walk(bag):
        for f in files:
            if f.endswith(".partial"):
                problems.append(f"{name}: a compression's {f} left behind")

def split_rows(path):
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute("PRAGMA quick_check").fetchone()[0], c.execute("SELECT count(*) FROM messages").fetchone()[0]
    finally:
        c.close()

kept = compressed = 0
for path, n in sorted(closed.items()):
    if os.path.exists(path + ".damaged"):
        problems.append(f"{os.path.basename(path)}: closed before the cut, yet salvaged")
    # With --compression-mode file a closed split is its .db3 until the .zstd is published
    # (fsynced, then renamed), then the .zstd alone, and for a moment both: each form there
    # must hold every message the split closed with.
    forms = [p for p in (path, path + ".zstd") if os.path.exists(p)]
    if not forms:
        continue  # deleted by retention before the cut
    kept += 1
    compressed += path + ".zstd" in forms
    for form in forms:
        try:
            if form.endswith(".zstd"):
                plain = form + ".check.db3"
                with open(plain, "wb") as out:
                    subprocess.run(["zstd", "-d", "-q", "-c", form], stdout=out, check=True)
                try:
                    qc, rows = split_rows(plain)
                finally:
                    os.remove(plain)
            else:
                qc, rows = split_rows(form)
        except Exception as e:
            problems.append(f"{os.path.basename(form)}: closed before the cut, unreadable: {e}")
            continue
        if qc != "ok" or rows != n:
            problems.append(f"{os.path.basename(form)}: closed with {n} messages, now {rows} ({qc})")
window = ""
if cut_ns > 0:
    # A window cut: the open split must give back all but its last moments.
    if newest is None:
        problems.append("window cut: nothing of the open split came back")
    else:
        lost_s = (cut_ns - newest) / 1e9
        window = f", newest message {lost_s:.2f} s before the cut"
        if lost_s > max_loss_s:
            problems.append(f"window cut: the open split lost its last {lost_s:.2f} s (more than {max_loss_s} s)")
for p in problems:
    print(p)
zst = f", {compressed} of them compressed" if compressed else ""
print(f"{bags} bags, {msgs} messages, {kept}/{len(closed)} closed splits present and intact{window}{zst}")
PY

# preset profile rate retention-flags (cycled over the cuts); rate "window" is a window cut
# (real time, one large open split, the cut 3 to 5 s in).
CONFIGS=(
    "write-optimized small max -b 86016 --max-record-size 1MiB"
    "resilient small max -b 86016 --max-bag-files 6"
    "none medium max -b 256KiB --max-record-size 3MiB"
    "write-optimized medium max -b 1MiB --max-bag-files 5"
    "resilient medium max -b 256KiB --max-record-size 3MiB"
    "none small max -b 86016 --max-bag-files 6"
    "write-optimized medium window -b 128MiB --max-record-size 300MiB"
    "write-optimized medium max -b 256KiB --max-record-size 4MiB --compression-mode file --compression-format zstd"
    "resilient medium max -b 1MiB --max-bag-files 5 --compression-mode file --compression-format zstd"
)

# One JSON line per cut into $W/cuts.jsonl (POWERCUT_JSON): the check's summary lines parsed
# into numbers (closed splits intact, and a window cut's loss), the lines themselves kept too.
json_cut() {
    [[ -n "$JSON_OUT" ]] || return 0
    python3 - "$@" >>"$W/cuts.jsonl" <<'PY'
import json, re, sys
cut, preset, profile, rate, flags, closed, salvaged, after_recover, after_reindex, result = sys.argv[1:]
def parse(line):
    m = re.search(r"(\d+) bags, (\d+) messages, (\d+)/(\d+) closed splits present and intact"
                  r"(?:, newest message ([\d.]+) s before the cut)?", line)
    if not m:
        return {"summary": line}
    return {"summary": line, "bags": int(m[1]), "messages": int(m[2]), "closed_intact": int(m[3]),
            "closed_logged": int(m[4]), "window_loss_s": float(m[5]) if m[5] else None}
print(json.dumps({"cut": int(cut), "preset": preset, "profile": profile, "rate": rate, "flags": flags,
                  "closed_before_cut": int(closed), "salvaged": int(salvaged),
                  "after_recover": parse(after_recover), "after_reindex": parse(after_reindex),
                  "result": result}))
PY
}

echo "powercut: $CUTS cuts, seed $SEED, binary $RB"
for ((cut = 1; cut <= CUTS; cut++)); do
    read -r preset profile rate flags <<<"${CONFIGS[$(((cut - 1) % ${#CONFIGS[@]}))]}"
    window=0
    if [[ $rate == window ]]; then
        window=1
        rate=realtime
    fi
    root="$W/live/c$cut"
    mkdir -p "$root"
    log_a="$W/logs/c$cut-a.log"
    log_b="$W/logs/c$cut-b.log"
    # --min-free-space 0: the retention flags alone bound the recording, as before `record`
    # had a default free-space floor (5 % of this 512 MiB filesystem would be 25.6 MiB).
    common=(--source synthetic --synthetic-profile "$profile"
        --storage-preset-profile "$preset" --clock system --log-level debug --min-free-space 0)
    # An older, cleanly finished bag under the same root: retention spans it too.
    # shellcheck disable=SC2086
    "$RB" record "${common[@]}" --synthetic-rate max $flags --synthetic-count 300 -o "$root/a" 2>"$log_a" >/dev/null
    # shellcheck disable=SC2086
    "$RB" record "${common[@]}" --synthetic-rate "$rate" $flags --recover -o "$root/b" 2>"$log_b" >/dev/null &
    pid=$!
    deadline=$((SECONDS + 20))
    until grep -q "recording into" "$log_b" 2>/dev/null || ((SECONDS > deadline)); do
        sleep 0.02
    done
    # The random moment of the cut: 0.2 .. 2.2 s into the recording (3 .. 5 s for a window cut).
    sleep "$((RANDOM % 2000 / 1000 + 0)).$(printf '%03d' $((RANDOM % 1000)))"
    sleep 0.2
    ((window)) && sleep 2.8
    # Only lines printed before the snapshot count: those splits were fsynced before it.
    head -c "$(stat -c %s "$log_b")" "$log_b" >"$log_b.before"
    cut_ns=0
    ((window)) && cut_ns="$(date +%s%N)"
    cp --reflink=always "$W/xfs/ext4.img" "$W/xfs/cut.img"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
    cp --reflink=always "$W/xfs/cut.img" "$W/xfs/cut2.img"
    closed_n=$(grep -c "closed split" "$log_b.before" || true)

    result=PASS
    notes=()
    # A: record --recover on the first copy.
    attach "$W/xfs/cut.img"
    dev_a="$DEV"
    mount_at "$dev_a" "$W/a"
    rec_rc=0
    "$RB" record --source synthetic --synthetic-profile small --synthetic-count 100 \
        --clock system --min-free-space 0 --recover -o "$W/a/c$cut/new" 2>"$W/logs/c$cut-recover.log" >/dev/null ||
        rec_rc=$?
    if ((rec_rc != 0)); then
        result=FAIL
        notes+=("record --recover exit $rec_rc: $(tail -n1 "$W/logs/c$cut-recover.log")")
    fi
    salvaged=$(grep -c ", kept [0-9]*, lost" "$W/logs/c$cut-recover.log" || true)
    out_a="$(python3 "$W/check.py" "$RB" "$W/a/c$cut" "$root" "$cut_ns" "$MAX_LOSS_S" "$log_a" "$log_b.before")"
    [[ $(wc -l <<<"$out_a") -gt 1 ]] && result=FAIL
    undo_last "umount $W/a"
    undo_last "detach $dev_a"
    # B: reindex of each bag on the second copy.
    attach "$W/xfs/cut2.img"
    dev_b="$DEV"
    mount_at "$dev_b" "$W/b"
    for bag in "$W/b/c$cut"/*/; do
        bag="${bag%/}"
        compgen -G "$bag/*.db3*" >/dev/null || continue
        rrc=0
        "$RB" reindex "$bag" >"$W/logs/c$cut-reindex.out" 2>&1 || rrc=$?
        if ((rrc != 0)); then
            result=FAIL
            notes+=("reindex $(basename "$bag") exit $rrc: $(tail -n1 "$W/logs/c$cut-reindex.out")")
        fi
    done
    out_b="$(python3 "$W/check.py" "$RB" "$W/b/c$cut" "$root" "$cut_ns" "$MAX_LOSS_S" "$log_a" "$log_b.before")"
    [[ $(wc -l <<<"$out_b") -gt 1 ]] && result=FAIL
    undo_last "umount $W/b"
    undo_last "detach $dev_b"
    rm -f "$W/xfs/cut.img" "$W/xfs/cut2.img"

    printf 'cut %2d/%d %-15s %-6s %-8s %-32s %3d splits closed before the cut | recover (%d splits salvaged): %s | reindex: %s -> %s\n' \
        "$cut" "$CUTS" "$preset" "$profile" "$rate" "$flags" "$closed_n" "$salvaged" \
        "$(tail -n1 <<<"$out_a")" "$(tail -n1 <<<"$out_b")" "$result"
    # shellcheck disable=SC2086
    json_cut "$cut" "$preset" "$profile" "$( ((window)) && echo window || echo "$rate")" "$flags" "$closed_n" \
        "$salvaged" "$(tail -n1 <<<"$out_a")" "$(tail -n1 <<<"$out_b")" "$result"
    if [[ $result == PASS ]]; then
        PASSED=$((PASSED + 1))
    else
        FAILED=$((FAILED + 1))
        for n in "${notes[@]}"; do echo "    $n"; done
        head -n -1 <<<"$out_a" | sed 's/^/    after recover: /'
        head -n -1 <<<"$out_b" | sed 's/^/    after reindex: /'
    fi
    # The live filesystem has room for every cut, but keep it small.
    rm -rf "$root"
done


# ---------------------------------------------------------------- uploads across power cuts
# `ringbag daemon` with [upload] records into the ext4 and uploads to a Garage that lives
# outside it (its state under $W, on the host's loopback): the cut takes the recording and the
# bags' upload journals (.ringbag-upload.json) down with it, never the bucket, as on a robot
# whose power fails while the server stays up. max_rate keeps multipart uploads in flight at
# the cut. After each cut, on the copy:
#   1. no file its journal counts as uploaded (`done`) is missing from the bucket or differs
#      from it: HEAD size and ETag, and SHA-256 against the file (scripts/upload-verify.py, reads
#      with curl's SigV4, a client independent of ringbag's);
#   2. a daemon started on the copy (it recovers the cut bag first) resumes: the backlog
#      reaches 0, then every split of the bags from before the cut is in the bucket and
#      byte-identical, and the uploads in flight at the cut were resumed.
# POWERCUT_UPLOAD_CUTS (default 2); skipped without Garage unless RINGBAG_UPLOAD_REQUIRED=1.
GARAGE_SH="${RINGBAG_GARAGE_SH:-$ROOT/scripts/garage.sh}"
UPLOAD_CUTS="${POWERCUT_UPLOAD_CUTS:-2}"

# status_upload FILE EXPR: EXPR (Python, over the status file's `upload` object `u`) holds.
status_upload() {
    python3 -c 'import json, sys
try:
    u = json.load(open(sys.argv[1])).get("upload") or {}
except (OSError, ValueError):
    sys.exit(1)
sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2"
}
# wait_status FILE SECONDS EXPR: poll status_upload; false when it did not hold in time, or
# when the daemon ($pid) is gone.
wait_status() {
    local deadline=$((SECONDS + $2))
    until status_upload "$1" "$3"; do
        ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
}
# daemon_config ROOT STATUS PROFILE MAX_BAG_SIZE ROBOT [UPLOAD_EXTRA]: a daemon config text.
daemon_config() {
    printf 'output_root = "%s"\nstatus_file = "%s"\nsource = "synthetic"\nsynthetic_profile = "%s"\nsynthetic_rate = "realtime"\nclock = "system"\nmax_bag_size = "%s"\nmax_record_size = "200MiB"\nmin_free_space = \"1MiB\"\n[upload]\nendpoint = "%s"\nregion = "%s"\nbucket = "%s"\npath_style = true\nrobot_id = "%s"\npart_size = "5MiB"\n%s' \
        "$1" "$2" "$3" "$4" "$S3_ENDPOINT" "$S3_REGION" "$S3_BUCKET" "$5" "${6:-}"
}
# in_flight JOURNAL...: "FILE UPLOAD_ID" of each multipart upload started, not done.
in_flight() {
    python3 -c 'import json, sys
for p in sys.argv[1:]:
    for f, e in json.load(open(p))["files"].items():
        if e.get("upload_id") and not e.get("done"):
            print(f, e["upload_id"], len(e.get("parts", {})))' "$@"
}

upload_cut() {
    local u="$1" root="$W/live/u$1" log="$W/logs/u$1.log" st="$W/u$1-status.json"
    local robot="powercut-$SEED-u$1"
    mkdir -p "$root"
    # 6 MiB splits of the medium profile (~7 MB/s), uploads capped at 4 MiB/s: the backlog
    # grows and a multipart upload (5 MiB parts) is nearly always in flight.
    daemon_config "$root" "$st" medium 6MiB "$robot" 'max_rate = "4MiB"' >"$W/u$u.toml"
    "$RB" daemon --config "$W/u$u.toml" 2>"$log" >/dev/null &
    pid=$!
    wait_status "$st" 30 'u.get("files_uploaded", 0) >= 1' || {
        echo "upload cut $u/$UPLOAD_CUTS: no file uploaded within 30 s: $(tail -n3 "$log") -> FAIL"
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
        rm -rf "$root"
        return 1
    }
    # The random moment of the cut: 0.5 .. 2.5 s after the first upload.
    sleep "$((RANDOM % 2000 / 1000)).$(printf '%03d' $((RANDOM % 1000)))"
    sleep 0.5
    cp --reflink=always "$W/xfs/ext4.img" "$W/xfs/cut.img"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
    attach "$W/xfs/cut.img"
    local dev="$DEV" copy="$W/a/u$u" out rc=0 ok=1
    mount_at "$dev" "$W/a"
    local before
    before="$(ls "$copy" | paste -sd, -)"
    # 1. what the journals on the cut copy count as uploaded is in the bucket.
    out="$(python3 "$ROOT/scripts/upload-verify.py" "$copy")" || rc=$?
    ((rc == 0)) || ok=0
    local flight
    flight="$(in_flight "$copy"/*/.ringbag-upload.json 2>/dev/null || true)"
    # 2. a daemon on the copy: small profile, splits that do not close meanwhile, no cap.
    daemon_config "$copy" "$W/u$u-rec-status.json" small 64MiB "$robot" >"$W/u$u-rec.toml"
    local t0=$SECONDS
    "$RB" daemon --config "$W/u$u-rec.toml" 2>"$log.rec" >/dev/null &
    pid=$!
    # Resumed: every split of the bags from before the cut gets `done` in its journal (polled
    # on the journals alone), then the status's backlog is 0. (Not the backlog alone: a pass
    # that began while the cut bag was being recovered does not count that bag's last split
    # yet, so the backlog can read 0 for a moment before that split is seen.)
    local drained=1 deadline=$((SECONDS + 60))
    until python3 "$ROOT/scripts/upload-verify.py" "$copy" --all-closed --bags "$before" --journal-only >/dev/null; do
        ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null || { drained=0; break; }
        sleep 0.2
    done
    ((drained)) && { wait_status "$W/u$u-rec-status.json" 10 \
        'u.get("files_uploaded", 0) >= 1 and u.get("backlog_files") == 0 and not u.get("last_error")' || drained=0; }
    local drain_s=$((SECONDS - t0))
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
    local out2 rc2=0
    if ((drained)); then
        out2="$(python3 "$ROOT/scripts/upload-verify.py" "$copy" --all-closed --bags "$before" --min-content 1)" || rc2=$?
        ((rc2 == 0)) || ok=0
    else
        ok=0
        out2="$(printf 'uploads did not resume: status %s; daemon: %s\n-' \
            "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("upload"))' "$W/u$u-rec-status.json" 2>&1)" \
            "$(grep -i upload "$log.rec" | tail -n4)")"
    fi
    # The uploads in flight at the cut: the same upload id completed them (no part sent twice
    # is the engine's own test, tests/it/upload.rs; here: resumed, not restarted).
    local resumed=0 n_flight=0 f id parts
    while read -r f id parts; do
        [[ -n "$f" ]] || continue
        n_flight=$((n_flight + 1))
        if python3 -c 'import json, sys
e = json.load(open(sys.argv[1]))["files"].get(sys.argv[2], {})
sys.exit(0 if e.get("done") and e.get("upload_id") == sys.argv[3] else 1)' "$(dirname "$(grep -l "$id" "$copy"/*/.ringbag-upload.json | head -n1)")/.ringbag-upload.json" "$f" "$id" 2>/dev/null; then
            resumed=$((resumed + 1))
        fi
    done <<<"$flight"
    undo_last "umount $W/a"
    undo_last "detach $dev"
    rm -f "$W/xfs/cut.img"
    rm -rf "$root"
    local result=PASS
    ((ok)) || result=FAIL
    printf 'upload cut %d/%d: at the cut %s; %d multipart uploads in flight | restarted on the copy: backlog 0 after %d s, %d resumed with their upload id; %s -> %s\n' \
        "$u" "$UPLOAD_CUTS" "$(tail -n1 <<<"$out")" "$n_flight" "$drain_s" "$resumed" "$(tail -n1 <<<"$out2")" "$result"
    if ((!ok)); then
        head -n -1 <<<"$out" | sed 's/^/    at the cut: /'
        head -n -1 <<<"$out2" | sed 's/^/    after the restart: /'
        return 1
    fi
}

if ((UPLOAD_CUTS > 0)); then
    if ! bash "$GARAGE_SH" bin >/dev/null 2>"$W/garage.err"; then
        if [[ "${RINGBAG_UPLOAD_REQUIRED:-0}" == 1 ]]; then
            echo "upload cuts: RINGBAG_UPLOAD_REQUIRED=1 but no Garage: $(cat "$W/garage.err")"
            FAILED=$((FAILED + 1))
        else
            echo "upload cuts: SKIPPED (no Garage: $(cat "$W/garage.err"))"
        fi
    else
        command -v curl >/dev/null || { echo "powercut: missing tool curl" >&2; exit 1; }
        port="$(free_port)"
        GARAGE_STATE="$W/garage"
        eval "$(bash "$GARAGE_SH" start "$GARAGE_STATE" "$port")"
        export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY S3_ENDPOINT S3_BUCKET S3_REGION
        for ((u = 1; u <= UPLOAD_CUTS; u++)); do
            cut=$((CUTS + u))
            if upload_cut "$u"; then
                PASSED=$((PASSED + 1))
            else
                FAILED=$((FAILED + 1))
            fi
        done
        bash "$GARAGE_SH" stop "$GARAGE_STATE" >/dev/null 2>&1 || true
        GARAGE_STATE=""
    fi
fi

FINISHED=1
echo "powercut: $PASSED passed, $FAILED failed"
if [[ -n "$JSON_OUT" ]]; then
    python3 - "$W/cuts.jsonl" "$JSON_OUT" "$SEED" "$PASSED" "$FAILED" "$RB" <<'PY'
import json, os, sys, time
src, dst, seed, passed, failed, rb = sys.argv[1:]
cuts = [json.loads(l) for l in open(src)] if os.path.exists(src) else []
meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": os.uname().machine,
        "seed": int(seed), "binary": rb}
with open(dst, "w") as f:
    json.dump({"meta": meta, "cuts": cuts, "passed": int(passed), "failed": int(failed)}, f, indent=2)
    f.write("\n")
PY
fi
((FAILED == 0))
