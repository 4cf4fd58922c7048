"""Driver for scripts/bench-ros.sh (stdlib only): `ringbag record --source ros` and
`ros2 bag record` record the same reliable publisher at the same time; per scenario it
prints the median kept counts, CPU and peak RSS of both, and whether ringbag's reported
losses account for what it did not keep.

The environment (ROS 2 sourced, DDS on loopback, a domain of its own) is set up by the .sh.
Each run:
1. start both recorders on one topic (each subscribes once the publisher appears);
2. start examples/ros_flood, which waits until both subscriptions match, says so on stderr
   (the CPU baseline of both recorders is read then, so start-up and discovery are not
   counted), publishes, prints its JSON line and holds its writer open (reliable
   retransmissions still served);
3. wait until both recorders are idle (ringbag's committed count and both CPU counters stop
   moving; a condition polled against a deadline, never a fixed sleep);
4. SIGINT both, reap them with wait4 (CPU and peak RSS of the whole process life; CPU is
   reported from the baseline to exit, which includes flushing at close), release the
   publisher;
5. count rows in each bag's `messages` tables; read ringbag's summary for its losses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")

# (label, type, size argument of ros_flood, count, rate)
SCENARIOS = [
    ("100,000 × 100 B String, as fast as possible", "std_msgs/msg/String", "100", 100_000, "max"),
    ("50,000 × 100 B String at 10 kHz", "std_msgs/msg/String", "100", 50_000, "10000"),
    ("150 × 6 MB Image (1920x1080 rgb8) at 30 Hz", "sensor_msgs/msg/Image", "1920x1080", 150, "30"),
    ("100 × 6 MB Image (1920x1080 rgb8), as fast as possible", "sensor_msgs/msg/Image", "1920x1080", 100, "max"),
]

# Both recorders are idle when, for this long, ringbag's committed count has not moved and
# neither process used more than IDLE_CPU_S of CPU.
QUIET_S = 2.0
IDLE_CPU_S = 0.1
# Upper bounds (a run that hits one is reported, not silently accepted).
MATCH_TIMEOUT_S = 60
SETTLE_DEADLINE_S = 120
EXIT_DEADLINE_S = 180


class BenchError(Exception):
    pass


def proc_cpu(pid: int) -> float | None:
    """utime+stime (+ reaped children) of a live process, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # rest[0] is field 3 (state); utime, stime, cutime, cstime are fields 14..17.
    return sum(int(x) for x in rest[11:15]) / CLK_TCK


def read_committed(status: Path) -> int | None:
    try:
        return int(json.loads(status.read_text())["committed"])
    except (OSError, ValueError, KeyError):
        return None


def count_rows(bag: Path) -> int:
    n = 0
    for db in sorted(bag.glob("*.db3")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            n += con.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            con.close()
    return n


def parse_summary(text: str) -> dict:
    """ringbag's exit summary (see RecordSummary's Display)."""
    out = {}
    m = re.search(r"^accepted (\d+) messages.*?written (\d+), unwritten (\d+)", text, re.M)
    if m:
        out["accepted"], out["written"], out["unwritten"] = map(int, m.groups())
    m = re.search(r"^dropped (\d+) \(queue full (\d+), oversize (\d+), after the writer stopped (\d+)\)", text, re.M)
    if m:
        out["dropped"], out["queue_full"], out["oversize"], out["after_stop"] = map(int, m.groups())
    m = re.search(r"^lost in the middleware before reaching ringbag (\d+)", text, re.M)
    if m:
        out["lost_in_middleware"] = int(m.group(1))
    return out


def custom_data_lost(bag: Path) -> int | None:
    """`ringbag.lost_in_middleware` from a Jazzy bag's metadata.yaml (absent: None)."""
    try:
        text = (bag / "metadata.yaml").read_text()
    except OSError:
        return None
    m = re.search(r"ringbag\.lost_in_middleware:\s*['\"]?(\d+)", text)
    return int(m.group(1)) if m else None


def reap(p: subprocess.Popen, deadline_s: float) -> tuple[int | None, object | None]:
    """wait4 with a deadline: (exit code, rusage) or (None, None) if still running."""
    end = time.monotonic() + deadline_s
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return p.returncode, ru
        if time.monotonic() >= end:
            return None, None
        time.sleep(0.05)


def stop_both(procs: list[tuple[str, subprocess.Popen]], notes: list[str]) -> list[tuple[int | None, object | None]]:
    """SIGINT each running recorder (once: a second SIGINT ends ringbag at once), then reap
    each with a deadline."""
    running = []
    for name, p in procs:
        if p.poll() is not None:
            # Already gone (crashed or refused to start): no rusage left to collect.
            notes.append(f"{name} exited early ({p.returncode})")
        else:
            p.send_signal(signal.SIGINT)
            running.append(name)
    out = []
    for name, p in procs:
        if name not in running:
            out.append((p.returncode, None))
            continue
        code, ru = reap(p, EXIT_DEADLINE_S)
        if code is None:
            notes.append(f"{name} did not exit {EXIT_DEADLINE_S} s after SIGINT; killed")
            p.kill()
            code, ru = reap(p, 30)
        out.append((code, ru))
    return out


class LineWatcher(threading.Thread):
    """Reads a pipe line by line; calls on_line for each and keeps the text."""

    def __init__(self, stream, on_line=None):
        super().__init__(daemon=True)
        self.stream, self.on_line, self.lines = stream, on_line, []

    def run(self):
        for line in self.stream:
            self.lines.append(line)
            if self.on_line:
                self.on_line(line)


def one_run(args, scenario: int, run: int, work: Path) -> dict:
    label, type_name, size, count, rate = SCENARIOS[scenario]
    d = work / f"s{scenario + 1}_r{run + 1}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    topic = f"/ringbag_bench/s{scenario + 1}"
    rb_bag, rs_bag, status = d / "ringbag", d / "rosbag2", d / "ringbag.status.json"
    res = {"scenario": scenario + 1, "run": run + 1, "label": label, "loadavg": open("/proc/loadavg").read().split()[0]}
    notes: list[str] = []

    rb_err = open(d / "ringbag.stderr", "w")
    rs_log = open(d / "rosbag2.log", "w")
    rb = subprocess.Popen(
        [args.ringbag, "record", "--source", "ros", topic, "-o", str(rb_bag), "--status-file", str(status)]
        + args.ringbag_args,
        stdin=subprocess.DEVNULL, stdout=rb_err, stderr=rb_err)
    rs = subprocess.Popen(
        # Humble takes topics as positional arguments only; later releases deprecate those
        # for --topics.
        ["ros2", "bag", "record", "-s", "sqlite3", "-o", str(rs_bag)]
        + ([topic] if os.environ.get("ROS_DISTRO") == "humble" else ["--topics", topic]),
        stdin=subprocess.DEVNULL, stdout=rs_log, stderr=rs_log)

    baseline: dict[str, float | None] = {}

    def on_pub_err(line: str):
        if line.startswith("ros_flood: matched"):
            # Read at once: the publisher starts sending right after this line.
            baseline["ringbag"], baseline["rosbag2"] = proc_cpu(rb.pid), proc_cpu(rs.pid)

    pub = subprocess.Popen(
        [args.flood, topic, type_name, size, str(count), rate, "--hold",
         "--subscribers", "2", "--wait-timeout", str(MATCH_TIMEOUT_S)] + args.flood_args,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub_err = LineWatcher(pub.stderr, on_pub_err)
    pub_err.start()
    line = pub.stdout.readline()
    published = None
    try:
        published = json.loads(line)
        res["published"] = published["published"]
        res["publish_s"] = published["seconds"]
    except (ValueError, KeyError, TypeError):
        notes.append("publisher failed: " + "".join(pub_err.lines).strip()[-300:])

    if published is not None:
        # Idle = nothing moved for QUIET_S; the deadline bounds a recorder that never settles.
        end = time.monotonic() + SETTLE_DEADLINE_S
        last = None
        quiet_since = time.monotonic()
        settled = False
        while time.monotonic() < end:
            now = (read_committed(status), proc_cpu(rb.pid), proc_cpu(rs.pid))
            if last is None or now[0] != last[0] or any(
                    n is None or o is None or n - o > IDLE_CPU_S for n, o in zip(now[1:], last[1:])):
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= QUIET_S:
                settled = True
                break
            time.sleep(0.2)
        if not settled:
            notes.append(f"recorders still busy {SETTLE_DEADLINE_S} s after publishing")
        res["settle_s"] = round(time.monotonic() - (end - SETTLE_DEADLINE_S), 2)

    # Stop both together: SIGINT to each before waiting for either.
    (rb_code, rb_ru), (rs_code, rs_ru) = stop_both([("ringbag", rb), ("ros2 bag record", rs)], notes)
    try:
        pub.stdin.close()
    except OSError:
        pass
    try:
        if pub.wait(timeout=60) != 0 and published is not None:
            notes.append(f"publisher exited {pub.returncode}")
    except subprocess.TimeoutExpired:
        notes.append("publisher still running 60 s after its stdin closed; killed")
        pub.kill()
        pub.wait()
    rb_err.close()
    rs_log.close()
    res["ringbag_exit"], res["rosbag2_exit"] = rb_code, rs_code

    for name, bag, ru in (("ringbag", rb_bag, rb_ru), ("rosbag2", rs_bag, rs_ru)):
        try:
            res[f"{name}_kept"] = count_rows(bag)
        except sqlite3.Error as e:
            notes.append(f"{name} bag unreadable: {e}")
        if ru is not None:
            total = ru.ru_utime + ru.ru_stime
            res[f"{name}_cpu_total_s"] = round(total, 3)
            b = baseline.get(name)
            if b is not None:
                res[f"{name}_cpu_s"] = round(total - b, 3)
            res[f"{name}_rss_mib"] = round(ru.ru_maxrss / 1024, 1)

    summary = parse_summary((d / "ringbag.stderr").read_text(errors="replace"))
    res["ringbag_summary"] = summary
    if "dropped" in summary and "lost_in_middleware" in summary:
        # Everything ringbag says it did not keep: refused at its queue (full, oversize,
        # after stop), left unwritten at stop, and reported lost by the middleware.
        res["ringbag_reported"] = summary["dropped"] + summary.get("unwritten", 0) + summary["lost_in_middleware"]
    else:
        notes.append("no summary in ringbag's output")
    cd = custom_data_lost(rb_bag)
    if cd is not None:
        res["ringbag_custom_data_lost"] = cd
    if "published" in res and "ringbag_kept" in res and "ringbag_reported" in res:
        res["ringbag_unaccounted"] = res["published"] - res["ringbag_kept"] - res["ringbag_reported"]
    if "published" in res and "rosbag2_kept" in res:
        res["rosbag2_missing"] = res["published"] - res["rosbag2_kept"]
    res["notes"] = notes
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
    return res


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=0):
    if x is None:
        return "–"
    if isinstance(x, float) and nd:
        return f"{x:,.{nd}f}"
    return f"{round(x):,}"


def table(results: list[dict], scenarios: list[int]) -> str:
    head = ("| scenario | runs | published (median) | kept, ringbag: median (runs) | kept, ros2 bag record: median (runs) "
            "| CPU s, ringbag / ros2 bag | CPU s per 1000 kept, ringbag / ros2 bag | peak RSS MiB, ringbag / ros2 bag "
            "| ringbag reported lost: queue + middleware (runs) | unaccounted (published − kept − reported), runs "
            "| accounted within 1 % |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for s in scenarios:
        rs = [r for r in results if r["scenario"] == s + 1]
        ok = [r for r in rs if "published" in r]

        def col(key):
            return [r.get(key) for r in ok]

        def per_k(name):
            return med([r[f"{name}_cpu_s"] / r[f"{name}_kept"] * 1000 if r.get(f"{name}_cpu_s") is not None
                        and r.get(f"{name}_kept") else None for r in ok])

        runs_list = lambda key: " · ".join(fmt(r.get(key)) for r in rs)
        unacc = [r.get("ringbag_unaccounted") for r in ok]
        within = [u is not None and abs(u) <= 0.01 * r["published"] for u, r in zip(unacc, ok)]
        rows.append(
            f"| {SCENARIOS[s][0]} | {len(ok)}/{len(rs)} | {fmt(med(col('published')))} "
            f"| **{fmt(med(col('ringbag_kept')))}** ({runs_list('ringbag_kept')}) "
            f"| **{fmt(med(col('rosbag2_kept')))}** ({runs_list('rosbag2_kept')}) "
            f"| {fmt(med(col('ringbag_cpu_s')), 2)} / {fmt(med(col('rosbag2_cpu_s')), 2)} "
            f"| {fmt(per_k('ringbag'), 3)} / {fmt(per_k('rosbag2'), 3)} "
            f"| {fmt(med(col('ringbag_rss_mib')), 1)} / {fmt(med(col('rosbag2_rss_mib')), 1)} "
            f"| {runs_list('ringbag_reported')} | {' · '.join(fmt(u) for u in unacc)} "
            f"| {'yes' if ok and all(within) else 'no'} ({sum(within)}/{len(ok)}) |")
    return head + "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ringbag", required=True)
    ap.add_argument("--flood", required=True)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "5")))
    ap.add_argument("--scenarios", default=os.environ.get("SCENARIOS", "1,2,3,4"),
                    help="comma-separated scenario numbers (1-4)")
    ap.add_argument("--out", default=os.environ.get("BENCH_ROS_OUT"), help="write the markdown table here")
    ap.add_argument("--dir", default=os.environ.get("BENCH_ROS_DIR"), help="where bags go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep every run's bags and logs")
    ap.add_argument("--ringbag-args", default=os.environ.get("RINGBAG_ARGS", ""),
                    help="extra arguments for `ringbag record` (one string, split as a shell would)")
    ap.add_argument("--flood-args", default=os.environ.get("FLOOD_ARGS", ""),
                    help="extra arguments for examples/ros_flood, e.g. --keep-all (a diagnostic)")
    args = ap.parse_args()
    args.ringbag_args = shlex.split(args.ringbag_args)
    args.flood_args = shlex.split(args.flood_args)
    try:
        scenarios = [int(x) - 1 for x in args.scenarios.split(",") if x.strip()]
        if not scenarios or any(not 0 <= s < len(SCENARIOS) for s in scenarios):
            raise ValueError
    except ValueError:
        print(f"bench-ros: --scenarios {args.scenarios!r}: expected numbers 1-{len(SCENARIOS)}", file=sys.stderr)
        return 2
    if args.runs < 1:
        print("bench-ros: --runs must be at least 1", file=sys.stderr)
        return 2
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-ros-"))
    work.mkdir(parents=True, exist_ok=True)
    # Private copies: a shared CARGO_TARGET_DIR may be rebuilt from another tree mid-run.
    (work / "bin").mkdir(exist_ok=True)
    for attr in ("ringbag", "flood"):
        dst = work / "bin" / Path(getattr(args, attr)).name
        shutil.copy2(getattr(args, attr), dst)
        setattr(args, attr, str(dst))
    distro = os.environ.get("ROS_DISTRO", "?")
    print(f"bench-ros: ROS {distro}, {os.environ.get('RMW_IMPLEMENTATION')}, domain {os.environ.get('ROS_DOMAIN_ID')}, "
          f"{args.runs} run(s) per scenario, bags in {work}"
          + (f", ringbag record {' '.join(args.ringbag_args)}" if args.ringbag_args else "")
          + (f", ros_flood {' '.join(args.flood_args)}" if args.flood_args else ""), flush=True)
    results = []
    jsonl = work / "runs.jsonl"
    for s in scenarios:
        for r in range(args.runs):
            res = one_run(args, s, r, work)
            results.append(res)
            with open(jsonl, "a") as f:
                f.write(json.dumps(res) + "\n")
            print(f"  s{s + 1} run {r + 1}: published {res.get('published')}, kept ringbag {res.get('ringbag_kept')} "
                  f"/ ros2 bag {res.get('rosbag2_kept')}, ringbag reported lost {res.get('ringbag_reported')} "
                  f"({res.get('ringbag_summary')}), cpu {res.get('ringbag_cpu_s')} / {res.get('rosbag2_cpu_s')} s, "
                  f"load {res['loadavg']}" + (f"; {'; '.join(res['notes'])}" if res["notes"] else ""), flush=True)
    t = table(results, scenarios)
    print()
    print(t)
    print(f"per-run records: {jsonl}")
    if args.out:
        Path(args.out).write_text(f"ROS {distro}, {args.runs} run(s) per scenario, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n" + t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
