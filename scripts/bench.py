"""Driver for scripts/bench.sh (stdlib only). Each measured program runs as a child process so
its CPU time and peak RSS come from wait4(), per child."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RINGBAG = ROOT / "target/release/ringbag"
BARE = ROOT / "target/release/examples/bare_sqlite"
BARE_QUEUE = ROOT / "target/release/examples/bare_queue"
COPYCOUNT = ROOT / "target/release/copycount.so"
JITTER = ROOT / "target/release/examples/sleep_jitter"
INSERT_PROBE = ROOT / "target/release/examples/insert_probe"
METRICS_COST = ROOT / "target/release/examples/metrics_cost"
ZSTD_FILE = ROOT / "target/release/examples/zstd_file"
# The insert probe's load: one robot camera frame (1280 x 720 rgb8 with its header) every
# 200 ms, 14 MB/s beside the robot mix's 176 MB/s.
INSERT_PROBE_BYTES, INSERT_PROBE_PERIOD_MS = 2_764_872, 200


def run_child(cmd: list[str], env: dict | None = None) -> dict:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=None if env is None else {**os.environ, **env})
    # wait4 gives this child's own rusage (not the sum over all children).
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{err}")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_kib": ru.ru_maxrss, "out": out, "err": err}


def fsync_tree(d: Path) -> float:
    t0 = time.monotonic()
    for f in d.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return time.monotonic() - t0


def dd(dirpath: Path, mib: int, sync: bool) -> dict:
    target = dirpath / "dd.bin"
    args = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}"]
    if sync:
        args.append("conv=fdatasync")
    r = run_child(args)
    target.unlink()
    mb = mib * 1048576 / 1e6
    return {"name": f"dd {'+fdatasync' if sync else '(page cache)'}", "mb_s": mb / r["wall"], "wall": r["wall"]}


def copies(cmd: list[str], payload_bytes: int, dirpath: Path) -> dict:
    """Bytes memcpy/memmove moved (calls of 256 B or more) and bytes handed to write(2), per
    payload byte: the copies each message costs in user space and in the kernel."""
    if not COPYCOUNT.exists():
        return {}
    out = dirpath / "copycount.json"
    run_child(cmd, env={"LD_PRELOAD": str(COPYCOUNT), "COPYCOUNT_OUT": str(out)})
    j = json.loads(out.read_text())
    out.unlink()
    return {"copies_user": j["user_copy_bytes"] / payload_bytes, "copies_kernel": j["write_bytes"] / payload_bytes}


def imu_gap_ms(bag: Path) -> float | None:
    """Longest gap between consecutive /imu stamps (400 Hz: 2.5 ms apart) across the bag's
    splits: a message dropped or held up anywhere shows as a longer gap."""
    import sqlite3
    stamps = []
    for f in sorted(bag.glob("*.db3")):
        c = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        stamps += [t for (t,) in c.execute(
            "SELECT m.timestamp FROM messages m JOIN topics t ON m.topic_id = t.id WHERE t.name = '/imu'")]
        c.close()
    stamps.sort()
    if len(stamps) < 2:
        return None
    return max(b - a for a, b in zip(stamps, stamps[1:])) / 1e6


def bare(dirpath: Path, size: int, count: int, batch: int, preset: str, page: int | None = None,
         count_copies: bool = False) -> dict:
    db = dirpath / "bare.db3"
    cmd = [str(BARE), str(db), str(size), str(count), str(batch), preset] + ([str(page)] if page else [])
    r = run_child(cmd)
    j = json.loads(r["out"])
    db.unlink(missing_ok=True)
    extra = {}
    if count_copies:
        extra = copies(cmd, size * count, dirpath)
        db.unlink(missing_ok=True)
    return extra | {
        "name": f"bare SQLite {preset}" + (f" page {page // 1024}K" if page else ""), "size": size, "messages": count,
        "wall": j["seconds"],
        "msg_s": count / j["seconds"], "msg_s_sync": count / (j["seconds"] + j["sync_seconds"]),
        "mb_s": j["payload_bytes"] / 1e6 / j["seconds"],
        "mb_s_sync": j["payload_bytes"] / 1e6 / (j["seconds"] + j["sync_seconds"]),
        "cpu_s_per_gb": r["cpu"] / (j["payload_bytes"] / 1e9), "rss_mib": r["rss_kib"] / 1024,
        "proc_wall": r["wall"],
    }


def ringbag(dirpath: Path, profile: str, count: int, rate: str, extra: list[str] | None = None,
            count_copies: bool = False) -> dict:
    out = dirpath / f"rb_{profile}_{rate}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(RINGBAG), "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", profile,
           "--synthetic-rate", rate, "--synthetic-count", str(count), "--clock", "system", "-o", str(out)] + (extra or [])
    r = run_child(cmd)
    sync_s = fsync_tree(out)
    m = re.search(r"accepted (\d+) messages, (\d+) bytes in ([\d.]+) s.*?^dropped (\d+)", r["err"], re.S | re.M)
    msgs, payload, drops = int(m.group(1)), int(m.group(2)), int(m.group(4))
    # A compressed bag's splits are .db3.zstd: the /imu gaps cannot be read from them here
    # (stdlib only), but how many splits were compressed, and what is left plain, can.
    zstd_files = sorted(out.glob("*.zstd"))
    imu_gap = imu_gap_ms(out) if profile == "robot" and not zstd_files else None
    compressed = {"zstd_splits": len(zstd_files), "db3_left": len(list(out.glob("*.db3"))),
                  "zstd_bytes": sum(f.stat().st_size for f in zstd_files)} if zstd_files else {}
    shutil.rmtree(out, ignore_errors=True)
    # The writer's own figures (builds before the line existed print none).
    w = re.search(r"^writer: longest stall ([\d.]+) ms, peak queue (\d+) bytes; longest background fsync ([\d.]+) ms"
                  r"(?:; ([\d.]+) ms of the longest stall on the CPU)?", r["err"], re.M)
    extra_fields = {"stall_ms": float(w.group(1)), "peak_queue_mib": int(w.group(2)) / 2**20,
                    "fsync_ms": float(w.group(3))} if w else {}
    if w and w.group(4):
        # Near all of the stall on the CPU: the writer worked (SQLite, the kernel copying into
        # fresh pages); little of it: the writer waited (the disk, a lock, a stopped vCPU).
        extra_fields["stall_cpu_ms"] = float(w.group(4))
    if count_copies:
        extra_fields |= copies(cmd, payload, dirpath)
        shutil.rmtree(out, ignore_errors=True)
    if imu_gap is not None:
        extra_fields["imu_gap_ms"] = imu_gap
    return extra_fields | compressed | {
        "name": f"ringbag {profile} {rate}", "messages": msgs, "drops": drops, "payload_bytes": payload,
        "msg_s": msgs / r["wall"], "mb_s": payload / 1e6 / r["wall"],
        "mb_s_sync": payload / 1e6 / (r["wall"] + sync_s),
        "cpu_s_per_gb": r["cpu"] / max(payload / 1e9, 1e-9), "rss_mib": r["rss_kib"] / 1024, "wall": r["wall"],
    }


def bare_queue(dirpath: Path, count: int, name: str) -> dict:
    """The bare loop's inserts fed by a second thread through a crossbeam channel, 100 B
    messages by value in the slots (`examples/bare_queue.rs`): what any design whose callbacks
    never wait on SQLite pays for messages crossing cores, before any code of ringbag's own."""
    db = dirpath / "bare_queue.db3"
    r = run_child([str(BARE_QUEUE), str(db), str(count)])
    db.unlink(missing_ok=True)
    return {"name": name, "messages": count, "msg_s": count / r["wall"],
            "mb_s": count * 100 / 1e6 / r["wall"], "cpu_s_per_gb": r["cpu"] / (count * 100 / 1e9),
            "rss_mib": r["rss_kib"] / 1024, "wall": r["wall"]}


def floor_rounds(work: Path, q: int, rounds: int) -> tuple[list[dict], list[dict]]:
    """100 B, 1 MiB and 6 MiB (1080p rgb8) messages against the floor: the bare loop with the
    page size ringbag picks here (64 KiB: unbounded splits, and the first split before any
    message is seen) and blobs bound in place. Both are timed the same way, exec to exit as
    the parent sees it, so start-up, closing and the closing fsync count on both sides. The
    pair runs `rounds` times back to back, in alternating order, and each round gives one
    ratio: a load spike on this shared machine then costs one round, not the verdict; the
    median is reported with the range. Copies per message are counted once, in a separate run."""
    rows, ratios = [], []
    for profile, size, count, batch in (("small", 100, 2_000_000 // q, 4096),
                                        ("large", 1048576, 1024 // q, 8),
                                        ("camera", 6220868, 170 // q, 1)):
        per_round = []
        for i in range(rounds):
            # Who goes first alternates: on a VM guest that hands freed memory back to its host,
            # the run right after another one's files were deleted may find that memory gone
            # (see page_reporting) and pay a host fault per page.
            if i % 2 == 0:
                b = bare(work, size, count, batch, "write-optimized", 65536, count_copies=(i == 0))
                r = ringbag(work, profile, count, "max", count_copies=(i == 0))
            else:
                r = ringbag(work, profile, count, "max")
                b = bare(work, size, count, batch, "write-optimized", 65536)
            b["msg_s"] = count / b["proc_wall"]
            b["mb_s"] = size * count / 1e6 / b["proc_wall"]
            r["size"] = size
            b["name"] += f" (round {i + 1})"
            r["name"] += f" (round {i + 1})"
            # For scripts/plot-bench.py: which case, program and round each row is.
            b |= {"case": profile, "series": "floor", "round": i + 1}
            r |= {"case": profile, "series": "ringbag", "round": i + 1}
            rows += [b, r]
            # The disk's own streaming rate for the same payload, in the same round: the floor
            # under any SQLite writer.
            d = dd(work, max(1, size * count // 1048576), sync=True)
            d |= {"name": d["name"] + f" {size} B case (round {i + 1})", "case": profile, "series": "dd",
                  "round": i + 1, "size": size, "msg_s": count / d["wall"]}
            rows.append(d)
            # 100 B: also the least a queued design costs, so that the gap to the floor splits
            # into the price of the architecture and ringbag's own code.
            q = bare_queue(work, count, f"bare loop fed by a queue (round {i + 1})") if profile == "small" else None
            if q:
                q |= {"case": profile, "series": "queue", "round": i + 1, "size": size}
                rows.append(q)
            per_round.append((r["msg_s"] / b["msg_s"], r["cpu_s_per_gb"], b["cpu_s_per_gb"],
                              q["msg_s"] / b["msg_s"] if q else None, r["msg_s"] / q["msg_s"] if q else None))
        ratio = sorted(x[0] for x in per_round)
        ratios.append({"case": f"{profile} {size} B", "ringbag/floor median": ratio[len(ratio) // 2],
                       "min": ratio[0], "max": ratio[-1],
                       "CPU s/GB ringbag median": sorted(x[1] for x in per_round)[len(per_round) // 2],
                       "CPU s/GB floor median": sorted(x[2] for x in per_round)[len(per_round) // 2]})
        if per_round[0][3] is not None:
            ratios[-1]["queue/floor median"] = sorted(x[3] for x in per_round)[len(per_round) // 2]
            ratios[-1]["ringbag/queue median"] = sorted(x[4] for x in per_round)[len(per_round) // 2]
    return rows, ratios


def robot_realtime(work: Path, secs: int, rounds: int = 1) -> list[dict]:
    """The robot mix at its real rates (~176 MB/s: two 720p cameras at 30 Hz, a 1 MB cloud at
    10 Hz, IMU, tf) on the measured filesystem, with 64 MiB and 1 GiB splits: drops and the
    writer's longest stall (the queue absorbs it or drops)."""
    rows = []
    for i in range(rounds):
        for split in ("64MiB", "1GiB"):
            r = robot_probed(work, secs, split)
            r["name"] = f"ringbag robot realtime {secs}s, -b {split}" + (f" ({i + 1})" if rounds > 1 else "")
            rows.append(r)
    return rows


def robot_probed(work: Path, secs: int, split: str, extra: list[str] | None = None) -> dict:
    """One real-time robot recording, with the machine's own pauses over the same seconds."""
    # On each CPU, a bare thread pinned there, sleeping to absolute 10 ms targets (no spin, no
    # CPU to speak of), and how late it ever woke. A stall of the writer that a bare thread saw
    # too is the machine's (a VM's vCPU stopped by its host, here up to hundreds of ms), not
    # the recorder's.
    probes = [subprocess.Popen(["taskset", "-c", str(cpu), str(JITTER), "100", str(secs + 3), "0"],
                               stdout=subprocess.PIPE, text=True) for cpu in sorted(os.sched_getaffinity(0))]
    # And the floor of a writer turn over the same seconds, on the same filesystem: the bare
    # loop's longest insert of one camera frame (every long turn is one frame; on this VM
    # everything writing fresh pages slows down together at times, so a long turn beside a
    # long probe insert is the machine's).
    inserts = subprocess.Popen([str(INSERT_PROBE), str(work), str(secs + 3), str(INSERT_PROBE_BYTES),
                                str(INSERT_PROBE_PERIOD_MS)], stdout=subprocess.PIPE, text=True)
    prom = work / f"robot-{split}.prom"
    # An older build given with --ringbag may have no metrics: then no series, the row as before.
    metrics = "--metrics-textfile" in subprocess.run([str(RINGBAG), "record", "--help"], capture_output=True,
                                                     text=True).stdout
    sampler = MetricsSampler(prom)
    sampler.start()
    try:
        r = ringbag(work, "robot", 570 * secs, "realtime", ["-b", split] + (
            ["--metrics-textfile", str(prom), "--metrics-interval", "1"] if metrics else []) + (extra or []))
    finally:
        sampler.stop()
    if metrics:
        r["stall_series"] = sampler.series()
    prom.unlink(missing_ok=True)
    r["pause_ms"] = max(json.loads(p.communicate()[0])["max_ns"] for p in probes) / 1e6
    r["probe_insert_ms"] = json.loads(inserts.communicate()[0])["longest_ms"]
    return r


class MetricsSampler:
    """The writer's stalls second by second during one recording, from its metrics textfile
    (`--metrics-interval 1`), read every 50 ms for a new version. The recorder keeps no
    per-second stall of its own; the textfile has the batch-duration histogram (cumulative)
    and the longest stall so far, so each one-second step gives the batches it finished, the
    upper bound of the slowest one's bucket, and the running longest stall."""

    BUCKET = re.compile(r'^ringbag_writer_batch_duration_seconds_bucket\{le="([^"]+)"\} (\d+)', re.M)
    STALL = re.compile(r"^ringbag_writer_longest_stall_seconds ([\d.e+-]+)", re.M)

    def __init__(self, path: Path) -> None:
        import threading
        self.path, self.samples, self.done = path, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.read()  # the final rewrite at exit

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.read()

    def read(self) -> None:
        try:
            text = self.path.read_text()
        except OSError:
            return
        stall = self.STALL.search(text)
        buckets = [(float(le), int(n)) for le, n in self.BUCKET.findall(text)]
        if stall is None or not buckets:
            return
        if self.samples and self.samples[-1][2] == buckets and self.samples[-1][1] == float(stall.group(1)):
            return  # not rewritten yet
        self.samples.append((time.monotonic() - self.t0, float(stall.group(1)), buckets))

    def series(self) -> list[dict]:
        out, prev = [], None
        for t, stall, buckets in self.samples:
            counts = dict(buckets)
            if prev is None:
                step = counts
            else:
                step = {le: n - prev.get(le, 0) for le, n in counts.items()}
            # The smallest bucket holding all of the step's batches bounds its slowest one.
            total = step.get(float("inf"), 0)
            bound = next((le for le in sorted(step) if step[le] >= total), float("inf")) if total else 0.0
            out.append({"t_s": round(t, 3), "batches": total,
                        "slowest_batch_le_ms": None if bound == float("inf") else bound * 1e3,
                        "longest_stall_ms": stall * 1e3})
            prev = counts
        return out

# ---------------------------------------------------------------- compression (issue 26)
REALISTIC = ["--synthetic-payload", "realistic"]
FILE_MODE = ["--compression-mode", "file", "--compression-format", "zstd"]


def compress_levels(work: Path, name: str, args: list[str], count: int, rounds: int) -> list[dict]:
    """One plain split of `count` messages (`--synthetic-rate max`, no split size), compressed
    at zstd levels 1 and 3 by ringbag's own code (examples/zstd_file.rs: `compress_file`, what
    a compression thread runs, timed by that thread's CPU clock) `rounds` times, beside the
    floor, the same library at the same level compressing the file from memory into a byte
    counter (no file I/O, same thread clock), and once by the system's zstd CLI (`-T1`, to a
    file on the same filesystem; its CPU from wait4) as a reference. Ratio = .db3 bytes /
    .zstd bytes."""
    out = work / "compress_src"
    shutil.rmtree(out, ignore_errors=True)
    run_child([str(RINGBAG), "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", "robot",
               "--synthetic-rate", "max", "--synthetic-count", str(count), "--clock", "system", "-o", str(out)] + args)
    (db3,) = out.glob("*.db3")
    size = db3.stat().st_size
    rows = []
    try:
        for level in (1, 3):
            ours = [json.loads(run_child([str(ZSTD_FILE), str(db3), str(level)])["out"]) for _ in range(rounds)]
            cpu = statistics.median(o["cpu_s"] for o in ours)
            floor_cpu = statistics.median(o["floor_cpu_s"] for o in ours)
            floor_out = work / "floor.zst"
            cli = run_child(["zstd", "-q", "-f", "-T1", f"-{level}", str(db3), "-o", str(floor_out)])
            cli_bytes = floor_out.stat().st_size
            floor_out.unlink()
            gb = size / 1e9
            rows.append({"name": f"{name} zstd -{level}", "data": name, "level": level, "db3_bytes": size,
                         "zstd_bytes": ours[0]["out_bytes"], "ratio": size / ours[0]["out_bytes"],
                         "cpu_s_per_gb": cpu / gb, "cpu_s_per_gb_range": [min(o["cpu_s"] for o in ours) / gb,
                                                                          max(o["cpu_s"] for o in ours) / gb],
                         "mb_s_one_core": size / 1e6 / cpu, "rounds": rounds,
                         "floor_ratio": size / ours[0]["floor_out_bytes"], "floor_cpu_s_per_gb": floor_cpu / gb,
                         "cpu_vs_floor": cpu / floor_cpu,
                         "cli_ratio": size / cli_bytes, "cli_cpu_s_per_gb": cli["cpu"] / gb,
                         "cpu_vs_cli": cpu / cli["cpu"]})
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return rows


def compress_bench(work: Path, quick: bool, secs: int, rounds: int) -> dict:
    """Issue 26's compression figures: ratio and CPU per GB at levels 1 and 3 on the robot mix
    and on the lidar cloud alone, with realistic payloads (and the robot mix's template
    payloads, to show what they would claim); then the robot mix in real time with 64 MiB
    splits and realistic payloads, without and with `--compression-mode file`, in turn
    `rounds` times: drops, the writer's longest stall, the process's CPU per GB."""
    q = 2 if quick else 1
    zstd_version = subprocess.run(["zstd", "--version"], capture_output=True, text=True).stdout.strip()
    levels = []
    # The robot mix is ~176 MB/s at 570 messages/s: 3,240 messages are ~1 GB; a cloud is 1 MiB.
    for name, args, count in (("robot realistic", REALISTIC, 3240 // q),
                              ("lidar realistic", REALISTIC + ["/points"], 1000 // q),
                              ("robot template", [], 3240 // q)):
        levels += compress_levels(work, name, args, count, 3)
    realtime = []
    for i in range(rounds):
        for comp in (False, True):
            r = robot_probed(work, secs, "64MiB", REALISTIC + (FILE_MODE if comp else []))
            r["name"] = f"robot realtime {secs}s realistic, -b 64MiB, " + ("zstd file mode" if comp else "plain")
            r |= {"compression": comp, "round": i + 1}
            r.pop("stall_series", None)
            realtime.append(r)
    return {"levels": levels, "realtime": realtime, "zstd_cli": zstd_version}


def print_compress(c: dict) -> None:
    print(f"compression: ringbag's compress_file, thread CPU per GB of .db3, against the floor (the same zstd "
          f"library from memory) and the system CLI ({c['zstd_cli']}, -T1)")
    for r in c["levels"]:
        print(f"  {r['name']:26} {r['db3_bytes'] / 1e6:>7.0f} MB  ratio {r['ratio']:.3f} (floor {r['floor_ratio']:.3f}, "
              f"CLI {r['cli_ratio']:.3f})  {r['cpu_s_per_gb']:.2f} CPU s/GB [{r['cpu_s_per_gb_range'][0]:.2f}-"
              f"{r['cpu_s_per_gb_range'][1]:.2f}] = {r['mb_s_one_core']:.0f} MB/s per core  (floor "
              f"{r['floor_cpu_s_per_gb']:.2f}, ringbag/floor {r['cpu_vs_floor']:.2f}x; CLI {r['cli_cpu_s_per_gb']:.2f})")
    for r in c["realtime"]:
        z = (f"  {r['zstd_splits']} splits compressed, {r['db3_left']} left plain, ratio "
             f"{r['payload_bytes'] / r['zstd_bytes']:.3f} (payload / .zstd)") if r.get("compression") else ""
        print(f"  {r['name']:56} drops {r['drops']}  stall {r.get('stall_ms', float('nan')):.1f} ms "
              f"(on CPU {r.get('stall_cpu_ms', float('nan')):.1f})  pause {r['pause_ms']:.1f} ms  "
              f"bare frame {r['probe_insert_ms']:.1f} ms  {r['cpu_s_per_gb']:.2f} CPU s/GB{z}")
    for comp in (False, True):
        rows = [r for r in c["realtime"] if r["compression"] == comp]
        if rows:
            print(f"  median over {len(rows)} {'compressed' if comp else 'plain'}: stall "
                  f"{statistics.median(r.get('stall_ms', float('nan')) for r in rows):.1f} ms, drops "
                  f"{sum(r['drops'] for r in rows)}, {statistics.median(r['cpu_s_per_gb'] for r in rows):.2f} CPU s/GB")


# ---------------------------------------------------------------- upload (issue 24)
VENV_PY = ROOT / ".venv/bin/python"
GARAGE_SH = ROOT / "scripts/garage.sh"
S3_CHECK = ROOT / "tests/interop/s3_check.py"
S3_REF = ROOT / "scripts/bench_s3_ref.py"
# ringbag's defaults (src/upload: DEFAULT_PART_SIZE, DEFAULT_CONCURRENCY), given to both clients.
UPLOAD_PART = 16 * 2**20
UPLOAD_CONCURRENCY = 2


class UploadSkip(Exception):
    """A part of the upload benchmark that cannot run here, with the reason."""


def free_port_range() -> int:
    """A port P with P, P+1 and P+3 free: Garage's S3, RPC and admin ports."""
    import random
    import socket
    for _ in range(200):
        p = random.randrange(20000, 60000)
        socks = []
        try:
            for q in (p, p + 1, p + 3):
                sk = socket.socket()
                socks.append(sk)
                sk.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for sk in socks:
                sk.close()
    raise UploadSkip("no free port range for Garage")


def tree_bytes(root: Path) -> tuple[int, int]:
    files = [f for bag in root.iterdir() if bag.is_dir() for f in bag.iterdir() if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def link_copy(root: Path, dest: Path) -> Path:
    """The same files under another root, as hard links: another root for the uploader (its
    journal lives in the bag directories) without writing the bytes again."""
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["cp", "-al", str(root), str(dest)], check=True)
    return dest


def ringbag_upload_cmd(env: dict, key: str, root: Path, max_rate: str | None = None) -> list[str]:
    rate = ["--max-rate", max_rate] if max_rate else []
    return [str(RINGBAG), "--log-level", "warn", "upload", "--endpoint", env["S3_ENDPOINT"], "--bucket",
            env["S3_BUCKET"], "--region", env["S3_REGION"], "--key", key, "--path-style",
            "--part-size", str(UPLOAD_PART), "--concurrency", str(UPLOAD_CONCURRENCY), *rate, str(root)]


def upload_row(name: str, r: dict, nbytes: int) -> dict:
    return {"name": name, "bytes": nbytes, "wall": r["wall"], "mb_s": nbytes / 1e6 / r["wall"],
            "cpu_s": r["cpu"], "cpu_s_per_gb": r["cpu"] / (nbytes / 1e9), "rss_mib": r["rss_kib"] / 1024}


def verify(env: dict, root: Path, prefix: str) -> str:
    """s3_check.py compare: every file under root is in the bucket, byte for byte."""
    p = subprocess.run([str(VENV_PY), str(S3_CHECK), "compare", "--root", str(root), "--prefix", prefix],
                       capture_output=True, text=True, env={**os.environ, **env})
    if p.returncode != 0:
        return "MISMATCH: " + "; ".join((p.stdout + p.stderr).strip().splitlines()[:5])
    return "identical"


def upload_bench(work: Path, quick: bool, robot_secs: int, garage_dir: str | None = None,
                 link_rate: str | None = "25MiB", rounds: int = 1) -> dict:
    """2 GiB of closed 256 MiB splits (512 MiB with --quick) to Garage on loopback: boto3's
    upload_file (the reference) and `ringbag upload`, the same files, part size and parts in
    flight, each in a child process (wall time exec to exit, CPU user+sys, peak RSS); then the
    robot mix in real time without and with `ringbag upload` running on another root."""
    res: dict = {"rows": [], "ratios": {}, "notes": []}
    if not VENV_PY.exists() or subprocess.run([str(VENV_PY), "-c", "import boto3"], capture_output=True).returncode:
        res["skipped"] = f"no boto3: {VENV_PY} missing or without boto3 (scripts/test.sh --only interop creates it)"
        return res
    # Garage's state in the bench directory, or elsewhere (--garage-dir, e.g. /dev/shm: then
    # the store's writes stay off the disk the robot records to, as with a remote server).
    gdir = Path(tempfile.mkdtemp(prefix="ringbag-bench-garage-", dir=garage_dir)) if garage_dir else work / "garage"
    store = Store(gdir)
    try:
        store.start()
    except UploadSkip as e:
        res["skipped"] = f"no Garage: {e}"
        return res
    try:
        res.update(upload_runs(work, quick, robot_secs, store, res, link_rate, rounds))
    finally:
        store.stop()
        if garage_dir:
            shutil.rmtree(gdir, ignore_errors=True)
    res["garage_dir"] = str(gdir)
    return res


class Store:
    """Garage on loopback, with its state in `dir`."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.port = free_port_range()
        self.env: dict = {}
        self.pid = 0

    def start(self) -> None:
        start = subprocess.run(["bash", str(GARAGE_SH), "start", str(self.dir), str(self.port)],
                               capture_output=True, text=True)
        if start.returncode != 0:
            raise UploadSkip(start.stderr.strip())
        self.env = dict(l.split("=", 1) for l in start.stdout.splitlines() if "=" in l)
        self.pid = int(self.env.pop("GARAGE_PID"))

    def stop(self) -> None:
        subprocess.run(["bash", str(GARAGE_SH), "stop", str(self.dir)], capture_output=True)

    def restart_empty(self) -> None:
        """A new, empty store: what a row uploads stays in the store (in memory under
        /dev/shm), and gigabytes left by one row would squeeze the page cache of the next."""
        self.stop()
        for p in self.dir.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        self.start()


def upload_runs(work: Path, quick: bool, robot_secs: int, store: Store, res: dict,
                link_rate: str | None, rounds: int) -> dict:
    env = store.env
    root = work / "upload_root"
    count = 512 if quick else 2048  # 1 MiB messages: 0.5 or 2 GiB of payload
    run_child([str(RINGBAG), "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", "large",
               "--synthetic-rate", "max", "--synthetic-count", str(count), "--clock", "system", "-b", "256MiB",
               "-o", str(root / "bench_bag")])
    nfiles, nbytes = tree_bytes(root)
    res["data"] = {"files": nfiles, "bytes": nbytes, "split": "256MiB", "part_size": UPLOAD_PART,
                   "concurrency": UPLOAD_CONCURRENCY}
    # Both read the files from the page cache: they were just written and fit in memory here.
    ref = run_child([str(VENV_PY), str(S3_REF), "--root", str(root), "--prefix", "ref", "--part-size",
                     str(UPLOAD_PART), "--concurrency", str(UPLOAD_CONCURRENCY)], env=env)
    row = upload_row("boto3 upload_file (reference)", ref, nbytes)
    row["verified"] = verify(env, root, "ref")
    res["rows"].append(row)

    if subprocess.run([str(RINGBAG), "upload", "--help"], capture_output=True).returncode != 0:
        print("ringbag upload: not built", file=sys.stderr)
        res["notes"].append("ringbag upload: not built (its rows and the robot rows are skipped)")
        return res
    rb_root = link_copy(root, work / "upload_root_rb")
    try:
        rb = run_child(ringbag_upload_cmd(env, "bench/{bag}/{file}", rb_root), env=env)
    except SystemExit as e:
        # A failing uploader is a finding of this run, not a reason to lose the reference.
        res["notes"].append(f"ringbag upload failed, its rows are skipped: {e}")
        return res
    row = upload_row("ringbag upload", rb, nbytes)
    row["verified"] = verify(env, root, "bench")
    res["rows"].append(row)
    ref_row = res["rows"][0]
    res["ratios"] = {"throughput ringbag/reference": row["mb_s"] / ref_row["mb_s"],
                     "CPU s/GB ringbag/reference": row["cpu_s_per_gb"] / ref_row["cpu_s_per_gb"],
                     "peak RSS ringbag/reference": row["rss_mib"] / ref_row["rss_mib"]}
    res["rows"] += robot_with_uploads(work, root, store, robot_secs, link_rate, rounds)
    return res


def metrics_bench(work: Path, quick: bool, rounds: int) -> dict:
    """Issue 25: what a scrape costs (50 topics, every family: body size, render and scrape
    time through the real endpoint), and what metrics cost the recording: the medium profile at
    max rate with metrics off, then on (the endpoint scraped every 100 ms, ten times
    Prometheus's usual pace, and the textfile every second), `rounds` times in turn."""
    import threading
    import urllib.request
    cost = json.loads(subprocess.run([str(METRICS_COST), "200"], capture_output=True, text=True,
                                     check=True).stdout)
    rows = []
    count = 16_000 // (4 if quick else 1)
    for i in range(rounds):
        off = ringbag(work, "medium", count, "max")
        off["name"] = f"ringbag medium max, metrics off ({i + 1})"
        port = free_port_range()
        stop = threading.Event()
        scrapes = {"ok": 0, "failed": 0}

        def scraper() -> None:
            while not stop.wait(0.1):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        r.read()
                    scrapes["ok"] += 1
                except OSError:
                    scrapes["failed"] += 1
        t = threading.Thread(target=scraper)
        t.start()
        try:
            on = ringbag(work, "medium", count, "max", ["--metrics-listen", f"127.0.0.1:{port}", "--metrics-textfile",
                                                         str(work / "bench.prom"), "--metrics-interval", "1"])
        finally:
            stop.set()
            t.join()
        on["name"] = f"ringbag medium max, metrics on ({i + 1}; {scrapes['ok']} scrapes)"
        hostile = recording_beside_hostile_clients(work, count)
        hostile["name"] = f"ringbag medium max, 200 idle + slowloris + 1 MB clients ({i + 1})"
        rows += [off, on, hostile]
    offs, ons, hostiles = rows[0::3], rows[1::3], rows[2::3]

    def ratio(a: list[dict], b: list[dict], k: str) -> float:
        return statistics.median(r[k] for r in a) / statistics.median(r[k] for r in b)
    ratios = {"msg/s on/off (median)": ratio(ons, offs, "msg_s"),
              "CPU s/GB on/off (median)": ratio(ons, offs, "cpu_s_per_gb"),
              "longest writer stall on/off (median)": ratio(ons, offs, "stall_ms"),
              "longest writer stall with hostile clients/off (median)": ratio(hostiles, offs, "stall_ms"),
              "msg/s with hostile clients/off (median)": ratio(hostiles, offs, "msg_s")}
    return {"cost": cost, "rows": rows, "ratios": ratios}


def recording_beside_hostile_clients(work: Path, count: int) -> dict:
    """The metrics-on row while 200 connections sit idle, one sends its request a byte every
    100 ms and one sends 1 MB of request head, reconnecting as the server closes them."""
    import socket
    import threading
    port = free_port_range()
    stop = threading.Event()

    def hostile() -> None:
        socks: list[socket.socket] = []
        while not stop.is_set():
            try:
                while len(socks) < 200 and not stop.is_set():
                    socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                big = socket.create_connection(("127.0.0.1", port), timeout=1)
                try:
                    big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (1 << 20))
                except OSError:
                    pass
                big.close()
                socks[0].send(b"G")
            except OSError:
                # Not listening yet, or evicted: drop the dead ones and go on.
                for sk in socks:
                    sk.close()
                socks = []
            stop.wait(0.1)
        for sk in socks:
            sk.close()
    t = threading.Thread(target=hostile)
    t.start()
    try:
        return ringbag(work, "medium", count, "max", ["--metrics-listen", f"127.0.0.1:{port}"])
    finally:
        stop.set()
        t.join()


def print_metrics(m: dict) -> None:
    c = m["cost"]
    print(f"metrics, {c['topics']} topics, every family: body {c['body_bytes']} B ({c['samples']} samples; "
          f"goal < 65536 B), render {c['render_ms_p50']:.3f} ms p50 / {c['render_ms_max']:.3f} ms max (once a second), "
          f"scrape over loopback {c['scrape_ms_p50']:.3f} ms p50 / {c['scrape_ms_max']:.3f} ms max (goal < 5 ms), "
          f"{c['rounds']} rounds")
    for r in m["rows"]:
        print(f"  {r['name']:66} {r['msg_s']:>10.0f} msg/s {r['mb_s']:>8.1f} MB/s {r['cpu_s_per_gb']:>6.2f} CPU s/GB "
              f"stall {r.get('stall_ms', float('nan')):>6.1f} ms drops {r['drops']}")
    for k, v in m["ratios"].items():
        print(f"  {k}: {v:.3f}")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process so far (not a child of ours: from /proc)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# The service's upload threads run nice'd at the idle I/O class (issue 24); the CLI stands in
# for them here under the same priorities. Garage stands in for a server on another machine,
# so it gets them too while the robot records (it still shares the CPUs and the disk).
BACKGROUND = ["nice", "-n", "19", "ionice", "-c", "3"]


def background(pid: int) -> None:
    """BACKGROUND's priorities for every thread of a running process: Linux keeps nice and the
    I/O class per thread, and `renice -p PID` alone changes only the main one (Garage's worker
    threads would go on at nice 0 beside the recorder)."""
    try:
        tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        tids = [str(pid)]
    for tid in tids:
        subprocess.run(["renice", "-n", "19", "-p", tid], capture_output=True)
        subprocess.run(["ionice", "-c", "3", "-p", tid], capture_output=True)


def io_scheduler(path: Path) -> str:
    """The block device's I/O scheduler: the idle class only means something under bfq."""
    try:
        dev = os.stat(path).st_dev
        sched = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/scheduler")
        if not sched.exists():
            sched = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/../queue/scheduler")
        return re.search(r"\[(\w[\w-]*)\]", sched.read_text()).group(1)
    except (OSError, AttributeError):
        return "unknown"


def robot_with_uploads(work: Path, root: Path, store: Store, secs: int, link_rate: str | None,
                       rounds: int) -> list[dict]:
    """The robot mix in real time (64 MiB splits) alone, then again while `ringbag upload`
    sends the benchmark's files from another root, over and over (a fresh root and prefix each
    time) until the recording ends: capped at `link_rate` (a fast robot uplink), and unlimited
    (loopback, far above any robot's uplink). Garage runs on the same CPUs here, so the rows
    with uploads also pay for a server that a robot would not host: its CPU seconds are
    reported. Every row starts with an empty store. `rounds` times in turn: a longest stall
    is one sample of this VM's pauses, so the rows are compared by their medians."""
    rows = []
    for i in range(rounds):
        store.restart_empty()
        alone = robot_probed(work, secs, "64MiB")
        alone["name"] = f"ringbag robot realtime {secs}s, no uploads"
        batch = [alone]
        for rate in ([link_rate] if link_rate else []) + [None]:
            store.restart_empty()
            batch.append(robot_while_uploading(work, root, store.env, store.pid, secs, rate))
        if rounds > 1:
            for r in batch:
                r["round"] = i + 1
                r["name"] += f" ({i + 1})"
        rows += batch
    return rows


def stall_medians(rows: list[dict]) -> list[str]:
    """Per kind of robot row: the median of the longest stalls over the rounds, and its ratio
    to the rows without uploads."""
    kinds: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("stall_ms") is None or not r["name"].startswith("ringbag robot"):
            continue
        kinds.setdefault(re.sub(r" \(\d+\)$", "", r["name"]), []).append(r)
    if not kinds or max(len(v) for v in kinds.values()) < 2:
        return []
    out = []
    base = None
    for name, rs in kinds.items():
        med = statistics.median(r["stall_ms"] for r in rs)
        floor = statistics.median(r["probe_insert_ms"] for r in rs if r.get("probe_insert_ms") is not None) \
            if any(r.get("probe_insert_ms") is not None for r in rs) else None
        base = med if base is None else base
        drops = sum(r.get("drops", 0) for r in rs)
        fl = f", bare frame insert {floor:.1f} ms" if floor is not None else ""
        out.append(f"{name}: longest stall median {med:.1f} ms over {len(rs)} runs "
                   f"({min(r['stall_ms'] for r in rs):.1f}-{max(r['stall_ms'] for r in rs):.1f}), "
                   f"{med / base:.2f}x the rows without uploads, {drops} drops in all{fl}")
    return out


def robot_while_uploading(work: Path, root: Path, env: dict, gpid: int, secs: int,
                          max_rate: str | None) -> dict:
    import threading
    # Keys of this row's own: an object already in the bucket would only be verified, not sent.
    tag = f"r{max_rate}" if max_rate else "unlimited"
    stop = threading.Event()
    runs = {"done": 0, "failed": 0, "bytes": 0, "err": ""}
    _, per_run = tree_bytes(root)

    def uploads() -> None:
        i = 0
        while not stop.is_set():
            r = link_copy(root, work / f"upload_root_robot{i % 2}")
            p = subprocess.Popen(BACKGROUND + ringbag_upload_cmd(env, f"robot{tag}{i}/{{bag}}/{{file}}", r, max_rate),
                                 env={**os.environ, **env},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            while p.poll() is None:
                if stop.wait(0.1):
                    p.terminate()
                    p.wait()
                    return
            if p.returncode == 0:
                runs["done"] += 1
                runs["bytes"] += per_run
            else:
                runs["failed"] += 1
                last = (p.stderr.read() if p.stderr else "").strip().splitlines()
                runs["err"] = last[-1] if last else f"exit {p.returncode}"
                return
            i += 1

    background(gpid)
    g0 = cpu_seconds(gpid)
    t = threading.Thread(target=uploads)
    t.start()
    try:
        busy = robot_probed(work, secs, "64MiB")
    finally:
        stop.set()
        t.join()
    g1 = cpu_seconds(gpid)
    busy["name"] = f"ringbag robot realtime {secs}s, with ringbag upload" + (f" at {max_rate}/s" if max_rate else "")
    runs["garage_cpu_s"] = g1 - g0 if g0 is not None and g1 is not None else None
    runs["io_scheduler"] = io_scheduler(work)
    busy["uploads"] = runs
    for i in range(2):
        shutil.rmtree(work / f"upload_root_robot{i}", ignore_errors=True)
    return busy


def print_upload(up: dict) -> None:
    if "skipped" in up:
        print(f"upload: skipped ({up['skipped']})")
        return
    d = up.get("data", {})
    print(f"upload: {d.get('files')} files, {d.get('bytes', 0) / 2**30:.2f} GiB ({d.get('split')} splits) to Garage "
          f"on loopback ({up.get('garage_dir')}), part {UPLOAD_PART // 2**20} MiB, {UPLOAD_CONCURRENCY} in flight")
    hdr = (f"{'upload run':64} {'MB/s':>8} {'CPU s/GB':>9} {'peak RSS':>9} {'drops':>6} {'stall ms':>9} "
           f"{'on CPU':>7} {'pause ms':>9} {'bare frame ms':>13}  verified")
    print(hdr)
    print("-" * len(hdr))
    for r in up["rows"]:
        def f(k, fmt):
            return format(r[k], fmt) if r.get(k) is not None else "-"
        extra = r.get("verified", "")
        if "uploads" in r:
            u = r["uploads"]
            gc = f", Garage {u['garage_cpu_s']:.1f} CPU s" if u.get("garage_cpu_s") is not None else ""
            extra = (f"{u['done']} uploads done ({u['bytes'] / 2**30:.1f} GiB){gc}, {u['failed']} failed "
                     f"{u['err'] or ''}").strip()
        print(f"{r['name']:64} {f('mb_s', '.1f'):>8} {f('cpu_s_per_gb', '.2f'):>9} {r['rss_mib']:6.0f} MiB"
              f" {str(r.get('drops', '-')):>6} {f('stall_ms', '.1f'):>9} {f('stall_cpu_ms', '.1f'):>7}"
              f" {f('pause_ms', '.1f'):>9} {f('probe_insert_ms', '.1f'):>13}  {extra}")
    for line in stall_medians(up["rows"]):
        print(line)
    for k, v in up["ratios"].items():
        print(f"{k}: {v:.2f}")
    busy = next((r for r in up["rows"] if "uploads" in r), None)
    if busy:
        print(f"with uploads: the uploader and Garage at `{' '.join(BACKGROUND)}` (I/O scheduler "
              f"{busy['uploads']['io_scheduler']}: the idle class only counts under bfq)")
    for n in up["notes"]:
        print(n)


PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")


def page_reporting() -> dict | None:
    """A VM guest with free page reporting hands freed memory back to its host, and the next
    touch of that memory is a host page fault: writing fresh tmpfs or page-cache pages then
    runs 2-5x slower, and varies from run to run (here: dd into tmpfs 355 MB/s on first
    touch, 887 MB/s on the next). Reported with the figures so they can be read for what they are."""
    try:
        return {"order": int((PAGE_REPORTING / "page_reporting_order").read_text()),
                "reported_kib": int((PAGE_REPORTING / "reported_kib").read_text())}
    except (OSError, ValueError):
        return None
# ---------------------------------------------------------------- playback timing
# The timing bag: 1 kHz x 100 B and 30 Hz x 2 MB (`--synthetic-profile mixed`) for 20 s.
MIXED_PER_S = 1030
# SCHED_FIFO priority of the real-time rows (`--rt-priority`, `chrt -f`).
RT_PRIORITY = 10
MIXED_BYTES_PER_S = 1000 * 100 + 30 * 2_000_000
SCHEDULE = re.compile(r"schedule \(start\): bag (\d+) ns at monotonic (\d+) ns, rate ([\d.e+-]+)")


def quantile(v: list[int], p: float) -> int:
    return v[min(len(v) - 1, int(p * len(v)))]


def record_mixed(out: Path, count: int, rate: str, extra: list[str] | None = None) -> None:
    shutil.rmtree(out, ignore_errors=True)
    run_child([str(RINGBAG), "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", "mixed",
               "--synthetic-rate", rate, "--synthetic-count", str(count), "--clock", "system", "-o", str(out)]
              + (extra or []))


def evict(bag: Path) -> None:
    """Drop this bag's pages from the page cache (only its own: the machine is shared)."""
    for f in bag.glob("*.db3"):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def jitter(hz: float, secs: float, rt: bool) -> dict:
    """The machine's limit: a bare loop waking at absolute targets (sleep, then spin 200 us)."""
    r = run_child((["chrt", "-f", str(RT_PRIORITY)] if rt else []) + [str(JITTER), str(hz), str(secs), "200"])
    j = json.loads(r["out"])
    return {"name": f"bare loop {hz:g} Hz{', SCHED_FIFO' if rt else ''}", "p50_us": j["p50_ns"] / 1e3,
            "p99_us": j["p99_ns"] / 1e3, "max_us": j["max_ns"] / 1e3, "cpu_per_s": r["cpu"] / r["wall"],
            "rss_mib": r["rss_kib"] / 1024, "quantiles_us": [x / 1e3 for x in j.get("quantiles_ns", [])]}


def play_timing(bag: Path, rate: float, echo: Path, rt: bool = False) -> dict:
    """Play `bag` through the echo sink into a tmpfs file; error of send_ns against the schedule."""
    with open(echo, "w") as out:
        t0 = time.monotonic()
        p = subprocess.Popen([str(RINGBAG), "--log-level", "debug", "play", str(bag), "--sink", "echo", "-r", str(rate),
                              "--disable-keyboard-controls"] + (["--rt-priority", str(RT_PRIORITY)] if rt else []),
                             stdout=out, stderr=subprocess.PIPE, text=True)
        err = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: play failed:\n{err}")
    if rt and "--rt-priority" in err:
        sys.exit(f"bench: play could not run SCHED_FIFO:\n{err}")
    m = SCHEDULE.search(err)
    bag0, wall0, r = int(m.group(1)), int(m.group(2)), float(m.group(3))
    errs, n = [], 0
    with open(echo) as f:
        for line in f:
            send, bag_ns = line.split(" ", 2)[:2]
            errs.append(int(send) - (wall0 + int((int(bag_ns) - bag0) / r)))
            n += 1
    echo.unlink()
    errs.sort()
    cpu = ru.ru_utime + ru.ru_stime
    return {"name": f"ringbag play -r {rate:g}{f' --rt-priority {RT_PRIORITY}' if rt else ''}", "messages": n, "p50_us": quantile(errs, 0.5) / 1e3,
            "p99_us": quantile(errs, 0.99) / 1e3, "max_us": errs[-1] / 1e3, "early": sum(e < 0 for e in errs),
            "cpu_per_s": cpu / wall, "wall": wall, "rss_mib": ru.ru_maxrss / 1024,
            # The distribution for the plots, bounded: the error at every half percent and the
            # maximum (201 numbers), as examples/sleep_jitter prints for the bare loop.
            "quantiles_us": [errs[min(n - 1, i * n // 200)] / 1e3 for i in range(200)] + [errs[-1] / 1e3]}


def first_message_ms(bag: Path, offset_s: float, echo: Path) -> float:
    """From exec to the first message's send_ns (both CLOCK_MONOTONIC), with --start-offset."""
    with open(echo, "w") as out:
        t0 = time.monotonic_ns()
        p = subprocess.Popen([str(RINGBAG), "play", str(bag), "--sink", "echo", "--start-offset", f"{offset_s:.3f}",
                              "--playback-duration", "0.2", "--disable-keyboard-controls"],
                             stdout=out, stderr=subprocess.PIPE, text=True)
        err = p.stderr.read()
        if p.wait() != 0:
            sys.exit(f"bench: play failed:\n{err}")
    with open(echo) as f:
        first = int(f.readline().split(" ", 1)[0])
    echo.unlink()
    return (first - t0) / 1e6


def playback(work: Path, quick: bool) -> dict:
    load_start = os.getloadavg()[0]
    pb = playback_runs(work, quick)
    pb["load"] = [load_start, os.getloadavg()[0]]
    return pb


def playback_runs(work: Path, quick: bool) -> dict:
    secs = 5 if quick else 20
    tmpfs = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    echo = tmpfs / f"ringbag-bench-echo-{os.getpid()}.txt"
    timing_bag = work / "play_timing"
    record_mixed(timing_bag, MIXED_PER_S * secs, "realtime")
    rows = []
    # Real-time rows only where SCHED_FIFO is allowed (root, CAP_SYS_NICE or RLIMIT_RTPRIO).
    can_rt = shutil.which("chrt") is not None and subprocess.run(
        ["chrt", "-f", str(RT_PRIORITY), "true"], capture_output=True).returncode == 0
    for rate in (1.0, 10.0):
        for rt in (False, True) if can_rt else (False,):
            # The limit right before the run it bounds: the load on a shared machine drifts.
            rows.append(jitter(1000 * rate, secs / rate, rt))
            rows.append(play_timing(timing_bag, rate, echo, rt))
    shutil.rmtree(timing_bag, ignore_errors=True)
    # Large messages only: here the byte bound (128 MiB), not the 1000 messages, holds.
    large_bag = work / "play_large"
    run_child([str(RINGBAG), "--log-level", "warn", "record", "--source", "synthetic", "--synthetic-profile", "large",
               "--synthetic-rate", "max", "--synthetic-count", str(150 if quick else 600), "--clock", "system",
               "-o", str(large_bag)])
    r = play_timing(large_bag, 0.25, echo)
    r["name"] = f"ringbag play -r 0.25, {r['messages']} x 1 MiB"
    for k in ("p50_us", "p99_us", "max_us", "quantiles_us"):
        r[k] = None
    rows.append(r)
    shutil.rmtree(large_bag, ignore_errors=True)

    # A >= 5 GB bag (1 GiB splits), on disk under the work directory.
    big_gb = 1.2 if quick else 5.3
    need = big_gb * 1e9 * 1.15 + 2e9
    free = shutil.disk_usage(work).free
    big = {"size_gb": None}
    if free < need:
        big["skipped"] = f"needs {need / 1e9:.1f} GB free in {work}, has {free / 1e9:.1f} GB"
        return {"rows": rows, "big": big}
    big_bag = work / "play_big"
    try:
        count = int(big_gb * 1e9 / MIXED_BYTES_PER_S * MIXED_PER_S)
        record_mixed(big_bag, count, "max", ["-b", "1GiB"])
        info = json.loads(run_child([str(RINGBAG), "info", "--json", str(big_bag)])["out"])
        span = info["duration_ns"] / 1e9
        big.update(size_gb=info["size_bytes"] / 1e9, splits=len(info["files"]), span_s=span,
                   messages=info["message_count"])
        floor = [run_child([str(RINGBAG), "--version"])["wall"] * 1e3 for _ in range(5)]
        big["exec_floor_ms"] = sorted(floor)[2]
        cold, warm = [], []
        for _ in range(3):
            evict(big_bag)
            cold.append(first_message_ms(big_bag, span / 2, echo))
            warm.append(first_message_ms(big_bag, span / 2, echo))
        big["first_cold_ms"], big["first_warm_ms"] = sorted(cold)[1], sorted(warm)[1]
        big["first_cold_all"], big["first_warm_all"] = cold, warm
        # The whole bag, cold, at a rate the disk sustains (it was recorded as fast as the
        # disk took it): the read-ahead queue stays full, so this is its peak.
        evict(big_bag)
        whole = play_timing(big_bag, 0.25, echo)
        whole["name"] = f"ringbag play -r 0.25, whole {big['size_gb']:.1f} GB bag"
        # Its timing is the disk's: a bag recorded as fast as possible replays at that speed.
        for k in ("p50_us", "p99_us", "max_us", "quantiles_us"):
            whole[k] = None
        rows.append(whole)
        big["rss_mib"] = whole["rss_mib"]
    finally:
        shutil.rmtree(big_bag, ignore_errors=True)
        echo.unlink(missing_ok=True)
    return {"rows": rows, "big": big}


def print_playback(pb: dict) -> None:
    print(f"playback: load average {pb['load'][0]:.1f} at the start, {pb['load'][1]:.1f} at the end "
          f"(timing on a shared machine follows its load: compare each run with the bare loop above it)")
    hdr = f"{'playback run':48} {'msgs':>7} {'p50 us':>8} {'p99 us':>9} {'max us':>9} {'CPU s/s':>8} {'peak RSS':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in pb["rows"]:
        def us(k, w):
            return format(r[k], f"{w}.1f") if r.get(k) is not None else format("-", f">{w}")
        print(f"{r['name']:48} {str(r.get('messages', '-')):>7} {us('p50_us', 8)} {us('p99_us', 9)} "
              f"{us('max_us', 9)} {r['cpu_per_s']:8.3f} {r['rss_mib']:6.0f} MiB")
    b = pb["big"]
    if "skipped" in b:
        print(f"big bag: skipped ({b['skipped']})")
        return
    print(f"big bag: {b['size_gb']:.2f} GB, {b['splits']} splits, {b['messages']} messages over {b['span_s']:.1f} s")
    print(f"time to first message, --start-offset {b['span_s'] / 2:.1f} s: cold cache {b['first_cold_ms']:.1f} ms, "
          f"warm {b['first_warm_ms']:.1f} ms (median of 3; exec floor `ringbag --version` {b['exec_floor_ms']:.1f} ms)")
    print(f"peak RSS playing it: {b['rss_mib']:.0f} MiB (read-ahead bound 1000 messages / 128 MiB; "
          f"the timing bag at rate 1 and the 1 MiB bag above show the same bounds)")


def main() -> None:
    global RINGBAG
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", default=None, help="filesystem to measure (default: a temp dir under target/)")
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    ap.add_argument("--ringbag", default=None, help="the ringbag binary to measure (default: target/release/ringbag)")
    ap.add_argument("--only", choices=["all", "write", "large", "robot", "upload", "metrics", "plots", "compress"],
                    default="all",
                    help="write: the original table; large: 100 B, 1 MiB and 6 MiB against the floor, "
                         "--rounds times; robot: real-time robot mix; upload: ringbag upload against "
                         "boto3 to Garage on loopback, and the robot mix with and without uploads; "
                         "metrics: scrape cost with 50 topics, and metrics on against off; compress: zstd file-mode "
                         "ratio and CPU per GB at levels 1 and 3, and the robot mix in real time with and "
                         "without it (realistic payloads); plots: what "
                         "scripts/plot-bench.py draws (large, robot and the playback section)")
    ap.add_argument("--garage-dir", default=None,
                    help="upload: keep Garage's state under this directory (default: the bench directory)")
    ap.add_argument("--upload-link-rate", default="25MiB",
                    help="upload: the robot row's uploader is also run capped at this rate, a fast robot "
                         "uplink (default 25MiB, i.e. 210 Mbit/s; 'none': only the unlimited row)")
    ap.add_argument("--upload-rounds", type=int, default=3,
                    help="upload: runs of each robot row, in turn (default 3; compared by median)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the floor comparison (default 5)")
    ap.add_argument("--robot-rounds", type=int, default=1, help="runs of each robot real-time row (default 1)")
    ap.add_argument("--play-only", action="store_true", help="only the playback timing section")
    a = ap.parse_args()
    if a.upload_link_rate == "none":
        a.upload_link_rate = None
    if a.ringbag:
        RINGBAG = Path(a.ringbag).resolve()
    base = Path(a.dir) if a.dir else ROOT / "target"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.exit(f"bench: --dir {base}: {e.strerror}")
    work = Path(tempfile.mkdtemp(prefix="ringbag-bench-", dir=base))
    pr_start = page_reporting()
    # Where and when, for whoever reads the JSON (or a plot of it) later.
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": os.uname().machine,
            "cpus": os.cpu_count(), "load_start": os.getloadavg()[0], "quick": a.quick, "rounds": a.rounds,
            "only": "play" if a.play_only else a.only, "dir": str(base),
            "fstype": subprocess.run(["stat", "-f", "-c", "%T", str(base)], capture_output=True,
                                     text=True).stdout.strip()}
    q = 4 if a.quick else 1
    if a.play_only:
        try:
            pb = playback(work, a.quick)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if a.json:
            print(json.dumps({"playback": pb, "meta": meta | {"load_end": os.getloadavg()[0]}}, indent=2))
        else:
            print(f"filesystem: {base} ({os.uname().machine}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f})")
            print_playback(pb)
        return
    # (profile, size, count, batch as ringbag forms it: 4096 messages or 8 MiB)
    cases = [("small", 100, 2_000_000 // q, 4096), ("medium", 65536, 16_000 // q, 128), ("large", 1048576, 1000 // q, 8)]
    rows, ratios = [], []
    long_line = "long run: not measured"
    pb = None
    up = None
    try:
        if a.only == "metrics":
            mb = metrics_bench(work, a.quick, max(a.rounds, 1))
            print_metrics(mb)
            return
        if a.only == "compress":
            cb = compress_bench(work, a.quick, 30 // q, max(a.robot_rounds, 2))
            if a.json:
                print(json.dumps({"compress": cb, "meta": meta | {"load_end": os.getloadavg()[0]}}, indent=2))
            else:
                print(f"filesystem: {base} ({os.uname().machine}, {os.cpu_count()} cpus, "
                      f"load {os.getloadavg()[0]:.1f})")
                print_compress(cb)
            return
        if a.only in ("large", "robot", "upload", "plots"):
            if a.only == "plots":
                rows, ratios = floor_rounds(work, q, max(a.rounds, 1))
                rows += robot_realtime(work, 30 // q, max(a.robot_rounds, 1))
                pb = playback(work, a.quick)
            elif a.only == "large":
                rows, ratios = floor_rounds(work, q, max(a.rounds, 1))
            elif a.only == "upload":
                up = upload_bench(work, a.quick, 30 // q, a.garage_dir, a.upload_link_rate, max(a.upload_rounds, 1))
            else:
                rows = robot_realtime(work, 30 // q, max(a.robot_rounds, 1))
            raise _Done

        dd_cache = dd(work, 1024 // q, sync=False)
        dd_sync = dd(work, 1024 // q, sync=True)
        rows += [dd_cache, dd_sync]
        for profile, size, count, batch in cases:
            b = bare(work, size, count, batch, "write-optimized")
            bd = bare(work, size, count, batch, "none")
            r = ringbag(work, profile, count, "max")
            rows += [b, bd, r]
            # ringbag's own run ends with an fsync of the split (it closes the bag durably),
            # so the fair loop comparison is bare+fsync; the no-sync ratio is shown as well.
            ratios.append({
                "case": profile,
                "ringbag/bare(no sync)": r["msg_s"] / b["msg_s"],
                "ringbag/bare+fsync": r["msg_s"] / b["msg_s_sync"],
                "ringbag/bare(rosbag2 pragmas)+fsync": r["msg_s"] / bd["msg_s_sync"],
                "ringbag/dd+fdatasync": r["mb_s_sync"] / dd_sync["mb_s"],
            })
        # Durability costs: the same 64 KiB run under each storage preset.
        for preset in ("resilient", "none"):
            r = ringbag(work, "medium", 16_000 // q, "max", ["--storage-preset-profile", preset])
            r["name"] = f"ringbag medium max, preset {preset}"
            rows.append(r)
        robot_secs = 10 if not a.quick else 4
        rows.append(ringbag(work, "robot", 570 * robot_secs, "realtime"))
        rows.append(ringbag(work, "small", 2_000_000 // q, "max", ["-b", "86016", "--max-record-size", "1MiB"]))
        rows[-1]["name"] = "ringbag small, 86 KB splits, 1 MiB budget"
        # Page-size sweep behind the write-optimized preset's choice.
        for profile, size, count, batch in (cases[0], cases[2]):
            for page in (4096, 16384, 65536):
                rows.append(bare(work, size, count, batch, "write-optimized", page))
        if a.only == "all":
            lr, lratios = floor_rounds(work, q, max(a.rounds, 1))
            rows += lr
            ratios += lratios
            rows += robot_realtime(work, 30 // q, max(a.robot_rounds, 1))
            long_run = subprocess.run(
                ["cargo", "test", "--release", "--quiet", "--test", "it", "five_thousand_splits", "--", "--nocapture"],
                cwd=ROOT, capture_output=True, text=True)
            long_line = next((l for l in long_run.stderr.splitlines() if l.startswith("long run:")), long_line)
            up = upload_bench(work, a.quick, 30 // q, a.garage_dir, a.upload_link_rate, max(a.upload_rounds, 1))
            pb = playback(work, a.quick)
    except _Done:
        pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps({"rows": rows, "ratios": ratios, "long_run": long_line, "upload": up, "playback": pb,
                          "meta": meta | {"load_end": os.getloadavg()[0]}}, indent=2))
        return
    print(f"filesystem: {base} ({os.uname().machine}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f})")
    print(f"ringbag: {RINGBAG}")
    if a.only == "upload":
        print_upload(up)
        return
    pr_end = page_reporting()
    if pr_start and pr_end:
        print(f"free page reporting ON (order {pr_end['order']}): {(pr_end['reported_kib'] - pr_start['reported_kib']) / 2**20:.1f} GiB "
              "handed back to the host during this run; fresh memory costs a host fault here, so figures vary run to run")
    hdr = (f"{'run':46} {'msg/s':>12} {'MB/s':>9} {'MB/s+sync':>10} {'CPU s/GB':>9} {'drops':>6} {'peak RSS':>9}"
           f" {'stall ms':>9} {'on CPU':>7} {'peak queue':>10} {'copies u+k':>11} {'imu gap':>8} {'pause ms':>9}"
           f" {'bare frame ms':>13}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        def f(k, fmt):
            return format(r[k], fmt) if k in r else "-"
        rss = f"{r['rss_mib']:.0f} MiB" if "rss_mib" in r else "-"
        queue = f"{r['peak_queue_mib']:.0f} MiB" if "peak_queue_mib" in r else "-"
        cp = f"{r['copies_user']:.2f}+{r['copies_kernel']:.2f}" if "copies_user" in r else "-"
        print(f"{r['name'] + (' ' + str(r.get('size')) + ' B' if 'size' in r else ''):46} {f('msg_s', ',.0f'):>12} "
              f"{f('mb_s', '.1f'):>9} {f('mb_s_sync', '.1f'):>10} {f('cpu_s_per_gb', '.2f'):>9} {str(r.get('drops', '-')):>6} {rss:>9}"
              f" {f('stall_ms', '.1f'):>9} {f('stall_cpu_ms', '.1f'):>7} {queue:>10} {cp:>11} {f('imu_gap_ms', '.1f'):>8} {f('pause_ms', '.1f'):>9}"
              f" {f('probe_insert_ms', '.1f'):>13}")
    print()
    for r in ratios:
        print(f"{r['case']:15} " + "  ".join(f"{k} {v:.2f}" for k, v in r.items() if k != "case"))
    print()
    print(long_line)
    if up is not None:
        print()
        print_upload(up)
    if pb is not None:
        print()
        print_playback(pb)


class _Done(Exception):
    """A section-only run (--only) has what it came for."""


if __name__ == "__main__":
    main()
