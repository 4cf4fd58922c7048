#!/usr/bin/env python3
"""The benchmark figures, drawn from the benchmarks' JSON (issue 27).

    scripts/plot-bench.py [--bench FILE] [--rosbag2 FILE] [--powercut FILE] [--out DIR]
    scripts/plot-bench.py --dataflow [--out DIR]

Inputs (defaults under docs/bench/; each is what one script writes):
  bench.json     scripts/bench.sh --json [--quick] --only plots   (or a full --json run)
  rosbag2.json   scripts/bench-rosbag2.sh --ringbag --json FILE     (inside a sourced ROS 2)
  powercut.json  POWERCUT_JSON=FILE scripts/powercut-test.sh        (root, loop devices)

Outputs in --out (default docs/img/), always the same five files:
  throughput-100B.png, throughput-1MiB.png  payload MB/s per program, median and min-max over
                                            the rounds: ringbag, the bare SQLite loop and dd
                                            (bench.sh, on its disk), rosbag2 with ringbag and
                                            the bare loop beside it (bench-rosbag2.sh, tmpfs)
  robot-stall.png                           the robot mix's writer, second by second
  play-timing.png                           play's send-time error against the bare sleep loop
  powercut.png                              each cut: splits closed before it, present and
                                            intact after recovery and after reindex
A missing input leaves its series out and says so in the title; it is not an error. A file
that is not JSON, or JSON without the expected shape, is one line on stderr and exit 2.

--dataflow renders docs/dataflow.dot into DIR/dataflow.svg with Graphviz's `dot`.

The PNGs are deterministic for a given input and matplotlib: fixed size and dpi, the Agg
backend, and no Software/date metadata in the files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DPI = 100
SIZE = (8.0, 4.5)
# No "Software: matplotlib vX" and no creation time in the PNG: a rerun on the same data gives
# the same bytes, so a commit shows only figures that changed.
PNG_META = {"Software": None}
OUTPUTS = ("throughput-100B.png", "throughput-1MiB.png", "robot-stall.png", "play-timing.png", "powercut.png")


class BadInput(Exception):
    """An input that cannot be drawn: one line, exit 2."""


def fail(msg: str, code: int = 2) -> None:
    print(f"plot-bench: error: {msg}", file=sys.stderr)
    sys.exit(code)


def load(path: Path | None, what: str, keys: tuple[str, ...]) -> dict | None:
    """The JSON at `path`, or None if the file is not there (that series is left out)."""
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read {what}: {e}") from e
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not JSON ({what}): {e.msg} at line {e.lineno} column {e.colno}") from e
    if not isinstance(data, dict):
        raise BadInput(f"{path}: {what}: expected a JSON object, found {type(data).__name__}")
    if not any(k in data for k in keys):
        raise BadInput(f"{path}: {what}: none of the keys {', '.join(keys)} (another script's output?)")
    return data


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


# ---------------------------------------------------------------- throughput
def bench_series(bench: dict | None, case: str) -> list[tuple[str, list[float], str]]:
    """(label, MB/s per round, filesystem) from bench.sh's per-round rows of one case."""
    if bench is None:
        return []
    fs = (bench.get("meta") or {}).get("fstype") or "disk"
    rows = [r for r in bench.get("rows") or [] if r.get("case") == case and "series" in r]
    out = []
    for series, label in (("ringbag", "ringbag"), ("floor", "bare SQLite loop"), ("dd", "dd + fdatasync")):
        v = [float(r["mb_s"]) for r in rows if r["series"] == series]
        if v:
            out.append((label, v, fs))
    return out


def rosbag2_series(r2: dict | None, case: str) -> list[tuple[str, list[float], str]]:
    if r2 is None:
        return []
    c = (r2.get("cases") or {}).get(case)
    if c is None:
        return []
    out = []
    for prog, runs in c["programs"].items():
        label = "rosbag2" if prog.startswith("rosbag2") else prog
        out.append((label, [x["payload"] / 1e6 / x["wall"] for x in runs], "tmpfs"))
    # rosbag2 first: it is what the tmpfs group is about.
    return sorted(out, key=lambda s: not s[0].startswith("rosbag2"))


def plot_throughput(plt, bench: dict | None, r2: dict | None, case: str, title: str, path: Path) -> None:
    series = bench_series(bench, case) + rosbag2_series(r2, case)
    notes = []
    if not bench_series(bench, case):
        notes.append("no bench.sh run")
    if not rosbag2_series(r2, case):
        notes.append("rosbag2: no run")
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    colors = {"ringbag": "#2e6fbd", "bare SQLite loop": "#7f7f7f", "dd + fdatasync": "#b7b7b7",
              "rosbag2": "#d1495b"}
    n_bench = len(bench_series(bench, case))
    for i, (label, v, fs) in enumerate(series):
        med, lo, hi = spread(v)
        ax.bar(i, med, color=colors.get(label, "#7f7f7f"), hatch="//" if i >= n_bench else None, edgecolor="black",
               linewidth=0.5)
        ax.errorbar(i, med, yerr=[[med - lo], [hi - med]], color="black", capsize=4, linewidth=1)
        ax.annotate(f"{med:,.0f}", (i, hi), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(range(len(series)))
    ax.set_xticklabels([f"{label}\n({fs}, n={len(v)})" for label, v, fs in series],
                       fontsize=8)
    ax.set_ylabel("payload MB/s (log scale)")
    if series:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title + (f" [{'; '.join(notes)}]" if notes else ""), fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.text(0.01, 0.01, "bars: median over rounds; whiskers: min-max. Plain: bench.sh; hatched: "
             "bench-rosbag2.sh (tmpfs). Below each bar: the filesystem and the number of rounds.",
             fontsize=7, color="#555555")
    save(fig, path)


# ---------------------------------------------------------------- robot stall
def plot_robot(plt, bench: dict | None, path: Path) -> None:
    rows = [r for r in (bench or {}).get("rows") or [] if r.get("stall_series")]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    title = "Robot mix (~176 MB/s, real time): the writer's stalls"
    if not rows:
        title += " [no robot run with a stall series]"
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for i, r in enumerate(rows):
        s = r["stall_series"]
        t = [float(p["t_s"]) for p in s]
        c = f"C{i}"
        le = [p["slowest_batch_le_ms"] for p in s]
        ax.step(t, [float("nan") if x is None else x for x in le], where="post", color=c, linewidth=1.2,
                label=f"{r['name']}: slowest batch of the second (bucket bound)")
        ax.plot(t, [float(p["longest_stall_ms"]) for p in s], color=c, linestyle="--", linewidth=1,
                label=f"longest stall so far (final {r.get('stall_ms', float('nan')):.0f} ms, drops {r.get('drops', '-')})")
    ax.set_xlabel("seconds into the recording")
    ax.set_ylabel("ms (log scale)")
    if rows:
        ax.set_yscale("log")
        top = max(max(p["longest_stall_ms"], p["slowest_batch_le_ms"] or 0) for r in rows for p in r["stall_series"])
        ax.set_ylim(top=max(top, 1) * 8)  # room for the legend above the lines
        ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=10)
    ax.grid(which="both", alpha=0.3)
    save(fig, path)


# ---------------------------------------------------------------- playback timing
def plot_play(plt, bench: dict | None, path: Path) -> None:
    rows = ((bench or {}).get("playback") or {}).get("rows") or []
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    title = "Playback: send time against the schedule, beside a bare sleep loop"
    drawn = 0
    # Each play row follows the bare loop measured right before it (bench.py: the limit first).
    for i, r in enumerate(rows):
        if not r["name"].startswith("ringbag play") or not r.get("quantiles_us"):
            continue
        bare = rows[i - 1] if i > 0 and rows[i - 1]["name"].startswith("bare loop") else None
        c = f"C{drawn}"
        pct = [100 * k / (len(r["quantiles_us"]) - 1) for k in range(len(r["quantiles_us"]))]
        ax.plot(pct, r["quantiles_us"], color=c, linewidth=1.4, label=f"{r['name']} ({r['messages']} msgs)")
        if bare is not None and bare.get("quantiles_us"):
            q = bare["quantiles_us"]
            ax.plot([100 * k / (len(q) - 1) for k in range(len(q))], q, color=c, linestyle=":", linewidth=1.2,
                    label=bare["name"])
        drawn += 1
    if not drawn:
        title += " [no playback run with distributions]"
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_yscale("symlog", linthresh=10)
        ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("percentile of messages (last point: the maximum)")
    ax.set_ylabel("error, us (late > 0; symlog)")
    ax.set_title(title, fontsize=10)
    ax.grid(which="both", alpha=0.3)
    save(fig, path)


# ---------------------------------------------------------------- power cuts
def plot_powercut(plt, pc: dict | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    cuts = (pc or {}).get("cuts") or []
    if pc is None:
        title = "Power cuts [no powercut-test.sh run]"
    else:
        title = f"Power cuts: {pc['passed']} passed, {pc['failed']} failed (seed {pc.get('meta', {}).get('seed', '?')})"
    if not cuts:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    w = 0.38
    for i, c in enumerate(cuts):
        # Per check (after `record --recover`, after `reindex`): the splits logged closed
        # (fsynced) before the cut, in the older bag and the cut one, split into those present
        # and intact and those gone; the check lets a split be gone only as retention's deletion
        # (a present one must be intact), so grey is retention at work, not loss.
        top = 0
        for dx, key, color, label in ((-w / 2, "after_recover", "#2e6fbd", "intact after record --recover"),
                                      (w / 2, "after_reindex", "#58a55c", "intact after reindex")):
            logged = c[key].get("closed_logged", c["closed_before_cut"])
            intact = c[key].get("closed_intact") or 0
            ax.bar(i + dx, intact, w, color=color, label=label if i == 0 else None)
            ax.bar(i + dx, logged - intact, w, bottom=intact, color="#d9d9d9",
                   label="gone: deleted by retention before the cut" if i == 0 and dx < 0 else None)
            top = max(top, logged)
        mark = "PASS" if c["result"] == "PASS" else "FAIL"
        loss = c["after_recover"].get("window_loss_s")
        ax.annotate(mark + (f"\nlost {loss:.2f} s" if loss is not None else ""), (i, top), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=7, color="#2e7d4f" if mark == "PASS" else "#b03a2e")
    ax.set_xticks(range(len(cuts)))
    ax.set_xticklabels([f"{c['cut']}\n{c['preset']}\n{c['profile']} {c['rate']}" for c in cuts], fontsize=6)
    ax.set_ylabel("splits closed before the cut (symlog)")
    ax.set_title(title, fontsize=10)
    if cuts:
        ax.legend(fontsize=7, loc="upper right")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(0, max(max(c["after_recover"].get("closed_logged", 1) or 1 for c in cuts), 10) * 3)
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def save(fig, path: Path) -> None:
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=DPI, metadata=PNG_META)
    import matplotlib.pyplot as plt
    plt.close(fig)


def shaped(path: Path, draw) -> None:
    """`draw()`, with a JSON of the wrong shape (a key missing, a string for a number) turned
    into one line naming `path`."""
    try:
        draw()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
        raise BadInput(f"{path}: not the shape its script writes ({type(e).__name__}: {e})") from e


def dataflow(out: Path) -> None:
    dot = shutil.which("dot")
    if dot is None:
        fail("`dot` not found: install Graphviz (apt-get install graphviz)", 1)
    src = ROOT / "docs/dataflow.dot"
    r = subprocess.run([dot, "-Tsvg", str(src), "-o", str(out / "dataflow.svg")], capture_output=True, text=True)
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or ["(no message)"])[0]
        fail(f"{src}: dot failed: {first}")
    print(f"plot-bench: wrote {out / 'dataflow.svg'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_dir = ROOT / "docs/bench"
    ap.add_argument("--bench", type=Path, default=bench_dir / "bench.json", help="scripts/bench.sh --json output")
    ap.add_argument("--rosbag2", type=Path, default=bench_dir / "rosbag2.json",
                    help="scripts/bench-rosbag2.sh --json output")
    ap.add_argument("--powercut", type=Path, default=bench_dir / "powercut.json",
                    help="scripts/powercut-test.sh POWERCUT_JSON output")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/img", help="where the figures go (default docs/img)")
    ap.add_argument("--dataflow", action="store_true", help="render docs/dataflow.dot to OUT/dataflow.svg")
    a = ap.parse_args()
    try:
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--out {a.out}: {e.strerror}")
    if a.dataflow:
        dataflow(a.out)
        return
    try:
        import matplotlib
    except ImportError:
        fail("matplotlib is not installed (scripts/test.sh puts it in .venv: use .venv/bin/python)", 1)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        bench = load(a.bench, "bench.sh --json", ("rows", "playback"))
        r2 = load(a.rosbag2, "bench-rosbag2.sh --json", ("cases",))
        pc = load(a.powercut, "powercut-test.sh POWERCUT_JSON", ("cuts",))
        # Each input's shape is tried alone first, so that the error names the file at fault.
        for case in ("small", "large"):
            shaped(a.bench, lambda: bench_series(bench, case))
            shaped(a.rosbag2, lambda: rosbag2_series(r2, case))
        plot_throughput(plt, bench, r2, "small", "Recording throughput, 100 B messages", a.out / OUTPUTS[0])
        plot_throughput(plt, bench, r2, "large", "Recording throughput, 1 MiB messages", a.out / OUTPUTS[1])
        shaped(a.bench, lambda: plot_robot(plt, bench, a.out / OUTPUTS[2]))
        shaped(a.bench, lambda: plot_play(plt, bench, a.out / OUTPUTS[3]))
        shaped(a.powercut, lambda: plot_powercut(plt, pc, a.out / OUTPUTS[4]))
    except BadInput as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename}: {e.strerror}")
    for f in OUTPUTS:
        print(f"plot-bench: wrote {a.out / f}")


if __name__ == "__main__":
    main()
