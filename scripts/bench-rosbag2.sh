#!/usr/bin/env bash
# ringbag's SQLite write path against the real rosbag2 writer (issue 15), on tmpfs so that the
# disk is out of the picture. scripts/bench/rosbag2_writer.cpp drives rosbag2_cpp::Writer
# (sqlite3 plugin, rosbag2's default preset, a cache that drops nothing) as fast as it takes
# messages; with --ringbag the same run also measures `ringbag record --source synthetic` and
# the bare SQLite loop (examples/bare_sqlite) on the same cases, interleaved run by run in an
# order that rotates each run, so that the machine's load falls on all three alike, and prints
# the median of the per-run rosbag2/ringbag ratios of wall time and CPU.
#
# Cases: 1 MiB x 1024 and 100 B x 2,000,000 on one topic. Per program and case: the median of
# RUNS runs of wall time and CPU (user+sys of the whole process, from wait4), CPU s per GB of
# payload, the program's own timed seconds (rosbag2: write loop + close; bare loop: its insert
# loop; ringbag: the seconds its summary reports), peak RSS, and the range of the 1-minute load
# average before each run. Every rosbag2 bag is checked to hold all COUNT rows (rosbag2's cache
# drops messages once full and only logs it), and ringbag must report 0 dropped.
#
# Usage: scripts/bench-rosbag2.sh [--runs N] [--dir DIR] [--ringbag] [--fresh] [--only large|small]
#                                 [--json FILE]
#   --runs N    runs per program and case (default 3)
#   --dir DIR   where the bags go (default /dev/shm/ringbag-bench-rosbag2, removed after)
#   --ringbag   also build (cargo --release) and run ringbag and the bare loop
#   --fresh     also a rosbag2 row with a new payload buffer allocated and filled per message
#               (as a subscription hands it over); by default all messages share one buffer,
#               as ringbag's synthetic source reuses its buffers and the bare loop its one
#   --only C    one case: large (1 MiB x 1024) or small (100 B x 2,000,000)
#   --json FILE also write every run (wall, CPU, timed s, payload, count, peak RSS, load) per
#               case and program as JSON to FILE, for scripts/plot-bench.py
# Needs a sourced ROS 2 with rosbag2_cpp and the sqlite3 storage plugin (e.g.
# `source /work/ros-env-humble.sh`); without one it says so and exits 0: a manual benchmark,
# not a CI stage. The writer is built with CMake into target/rosbag2-writer-$ROS_DISTRO.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3 dir=/dev/shm/ringbag-bench-rosbag2 with_ringbag=0 fresh=0 only= json_out=
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --ringbag) with_ringbag=1; shift ;;
        --fresh) fresh=1; shift ;;
        --only) only="$2"; shift 2 ;;
        --json) json_out="$(realpath -m "$2")"; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--dir DIR] [--ringbag] [--fresh] [--only large|small] [--json FILE]" >&2; exit 2 ;;
    esac
done
case "$only" in ''|large|small) ;; *) echo "bench-rosbag2: --only large|small, got '$only'" >&2; exit 2 ;; esac

if [ -z "${AMENT_PREFIX_PATH:-}" ] || ! ament_prefix=$(
    IFS=:; for p in $AMENT_PREFIX_PATH; do
        [ -e "$p/share/ament_index/resource_index/packages/rosbag2_cpp" ] && { echo "$p"; break; }
    done) || [ -z "$ament_prefix" ]; then
    echo "bench-rosbag2: skipped: no sourced ROS 2 with rosbag2_cpp (source e.g. /opt/ros/humble/setup.bash)"
    exit 0
fi
distro="${ROS_DISTRO:-unknown}"
r2_version=$(sed -n 's:.*<version>\(.*\)</version>.*:\1:p' "$ament_prefix/share/rosbag2_cpp/package.xml" | head -n1)

mkdir -p target
build="target/rosbag2-writer-$distro"
echo "bench-rosbag2: building $build/rosbag2_writer against ROS 2 $distro (rosbag2_cpp $r2_version, $ament_prefix)"
nice -n 10 cmake -S scripts/bench -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build.cmake.log" 2>&1 \
    || { cat "$build.cmake.log" >&2; exit 1; }
nice -n 10 cmake --build "$build" >>"$build.cmake.log" 2>&1 || { cat "$build.cmake.log" >&2; exit 1; }
writer="$PWD/$build/rosbag2_writer"
if [ "$with_ringbag" = 1 ]; then
    echo "bench-rosbag2: building ringbag and examples/bare_sqlite (--release)"
    nice -n 10 cargo build --release --quiet --bin ringbag --example bare_sqlite
fi

mkdir -p "$dir"
work=$(mktemp -d "$dir/run.XXXXXX")
trap 'rm -rf "$work"; rmdir "$dir" 2>/dev/null || true' EXIT

# The driver: one child at a time, wall from a monotonic clock around it, CPU (user+sys) and
# peak RSS from wait4 on that child alone, the 1-minute load average read just before it.
WORK="$work" RUNS="$runs" ONLY="$only" WITH_RINGBAG="$with_ringbag" FRESH="$fresh" WRITER="$writer" \
    DISTRO="$distro" R2_VERSION="$r2_version" JSON_OUT="$json_out" python3 - <<'PY'
import json, os, re, sqlite3, statistics, subprocess, sys, time
from pathlib import Path

work, runs = Path(os.environ["WORK"]), int(os.environ["RUNS"])
with_ringbag, fresh = os.environ["WITH_RINGBAG"] == "1", os.environ["FRESH"] == "1"
writer = os.environ["WRITER"]
ringbag, bare = "target/release/ringbag", "target/release/examples/bare_sqlite"
rosbag2_name = f"rosbag2 {os.environ['DISTRO']} ({os.environ['R2_VERSION']})"
# name, message bytes, count, bare loop batch and page size, ringbag synthetic profile: the
# bare loop's settings are those of scripts/bench.py's floor rows (64 KiB pages, the page size
# ringbag picks for a bag without a split size).
cases = [("1 MiB x 1024", "large", 1048576, 1024, 8, 65536),
         ("100 B x 2,000,000", "small", 100, 2_000_000, 4096, 65536)]
cases = [c for c in cases if os.environ["ONLY"] in ("", c[1])]


def run(cmd: list[str]) -> dict:
    load = float(Path("/proc/loadavg").read_text().split()[0])
    with open(work / "stdout", "wb") as o, open(work / "stderr", "wb") as e:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=o, stderr=e)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = (work / "stdout").read_text(), (work / "stderr").read_text()
    if p.returncode != 0:
        sys.exit(f"bench-rosbag2: {' '.join(cmd)} exited {p.returncode}:\n{err[-2000:]}")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024,
            "load": load, "out": out, "err": err}


def fail(what: str) -> None:
    sys.exit(f"bench-rosbag2: {what}")


def rosbag2(size: int, count: int, fresh: bool = False) -> dict:
    out = work / "r2"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    r = run([writer, str(out), str(size), str(count)] + (["--fresh"] if fresh else []))
    j = json.loads(r["out"].strip().splitlines()[-1])
    dbs = sorted(out.glob("*.db3"))
    rows = sum(sqlite3.connect(db).execute("SELECT count(*) FROM messages").fetchone()[0] for db in dbs)
    if rows != count:
        fail(f"rosbag2 wrote {rows} of {count} messages (cache {j['cache_bytes']} bytes dropped the rest)")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return r | {"timed": j["seconds"], "payload": j["payload_bytes"]}


def ringbag_run(profile: str, count: int) -> dict:
    out = work / "rb"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    r = run([ringbag, "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", profile,
             "--synthetic-rate", "max", "--synthetic-count", str(count), "--clock", "system", "-o", str(out)])
    m = re.search(r"accepted (\d+) messages, (\d+) bytes in ([\d.]+) s.*?^dropped (\d+)", r["err"], re.S | re.M)
    if not m:
        fail(f"no summary from ringbag:\n{r['err'][-2000:]}")
    if int(m.group(1)) != count or int(m.group(4)) != 0:
        fail(f"ringbag accepted {m.group(1)} of {count}, dropped {m.group(4)}")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return r | {"timed": float(m.group(3)), "payload": int(m.group(2))}


def bare_run(size: int, count: int, batch: int, page: int) -> dict:
    db = work / "bare.db3"
    r = run([bare, str(db), str(size), str(count), str(batch), "write-optimized", str(page)])
    j = json.loads(r["out"].strip().splitlines()[-1])
    if j["messages"] != count:
        fail(f"bare loop wrote {j['messages']} of {count}")
    db.unlink()
    return r | {"timed": j["seconds"], "payload": j["payload_bytes"]}


rows, leads, dump = [], [], {}
for name, profile, size, count, batch, page in cases:
    progs = [(rosbag2_name, lambda: rosbag2(size, count))]
    if fresh:
        progs.append((rosbag2_name + " fresh", lambda: rosbag2(size, count, fresh=True)))
    if with_ringbag:
        progs += [("ringbag", lambda: ringbag_run(profile, count)),
                  ("bare SQLite loop", lambda: bare_run(size, count, batch, page))]
    samples = {p: [] for p, _ in progs}
    for i in range(runs):
        # Rotate the order each run: a program that follows one which freed hundreds of MiB runs
        # while the VM hands those pages back to its host, and a fixed order would pin that cost
        # on the same program every time.
        for prog, fn in progs[i % len(progs):] + progs[:i % len(progs)]:
            r = fn()
            samples[prog].append(r)
            print(f"  {name:18} {prog:34} run {i + 1}: wall {r['wall']:.3f} s, CPU {r['cpu']:.3f} s, "
                  f"load {r['load']:.2f}", file=sys.stderr, flush=True)
    dump[profile] = {"name": name, "size": size, "count": count, "programs": {
        prog: [{k: x[k] for k in ("wall", "cpu", "timed", "payload", "rss_mib", "load")} for x in s]
        for prog, s in samples.items()}}
    for prog, _ in progs:
        s = samples[prog]
        wall, cpu = statistics.median(x["wall"] for x in s), statistics.median(x["cpu"] for x in s)
        timed = [x["timed"] for x in s if x["timed"] is not None]
        loads = [x["load"] for x in s]
        rows.append([name, prog, f"{wall:.3f}", f"{cpu:.3f}", f"{cpu / (s[0]['payload'] / 1e9):.2f}",
                     f"{statistics.median(timed):.3f}" if timed else "-",
                     f"{max(x['rss_mib'] for x in s):.0f}", f"{min(loads):.1f}-{max(loads):.1f}"])

    if with_ringbag:
        # The lead is a ratio of two programs run seconds apart; the median of per-run ratios keeps
        # one slow minute from counting for one program and not the other.
        for key in ("wall", "cpu"):
            ratios = [a[key] / b[key] for a, b in zip(samples[rosbag2_name], samples["ringbag"])]
            leads.append(f"{name}: rosbag2/ringbag {key} median {statistics.median(ratios):.2f} "
                         f"(range {min(ratios):.2f}-{max(ratios):.2f})")

head = ["case", "program", "wall s", "CPU s", "CPU s/GB", "timed s", "peak RSS MiB", "load 1 min"]
print(f"\nmedian of {runs} runs; wall and CPU (user+sys) of the whole process; timed s: the program's own "
      "figure (rosbag2: write loop + close; ringbag: its summary; bare loop: its insert loop)")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for r in rows:
    print("| " + " | ".join(r) + " |")
for line in leads:
    print(line)
if os.environ["JSON_OUT"]:
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": os.uname().machine,
            "cpus": os.cpu_count(), "runs": runs, "filesystem": str(work), "rosbag2": rosbag2_name}
    Path(os.environ["JSON_OUT"]).write_text(json.dumps({"meta": meta, "cases": dump}, indent=2) + "\n")
PY
