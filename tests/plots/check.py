"""scripts/plot-bench.py against the small fixtures beside this file (pytest-free: run by
scripts/test.sh's docs stage with the venv's python, which has matplotlib). Seconds.

Checks: every figure is written as a PNG and the run exits 0; a second run writes the same
bytes (deterministic output: no date or software version in the files); a missing input is
not an error and its plot says so in the title; a file that is not JSON, or JSON of the wrong
shape, is exit 2 with exactly one line on stderr naming the file; docs/img/dataflow.svg is
what `--dataflow` makes of docs/dataflow.dot (when Graphviz is installed)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = ROOT / "scripts/plot-bench.py"
OUTPUTS = ("throughput-100B.png", "throughput-1MiB.png", "robot-stall.png", "play-timing.png", "powercut.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
failures: list[str] = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)


def run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def digests(d: Path) -> dict[str, str]:
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in OUTPUTS if (d / f).exists()}


def fixtures(**over: Path) -> list[str | Path]:
    args: list[str | Path] = []
    for name in ("bench", "rosbag2", "powercut"):
        args += [f"--{name}", over.get(name, HERE / f"{name}.json")]
    return args


with tempfile.TemporaryDirectory(prefix="ringbag-plots-") as tmp:
    t = Path(tmp)
    a, b = t / "a", t / "b"
    r = run(*fixtures(), "--out", a)
    check(r.returncode == 0, f"fixtures: exit {r.returncode}, stderr {r.stderr!r}")
    for f in OUTPUTS:
        p = a / f
        check(p.exists() and p.read_bytes()[:8] == PNG_MAGIC, f"fixtures: {f} is not a PNG in {a}")
        if p.exists():
            check(b"matplotlib" not in p.read_bytes(), f"fixtures: {f} names its software")
    check(r.stderr == "", f"fixtures: stderr not empty: {r.stderr!r}")

    r2 = run(*fixtures(), "--out", b)
    check(r2.returncode == 0 and digests(a) == digests(b) and len(digests(a)) == len(OUTPUTS),
          "fixtures: a second run did not write the same bytes")

    # Missing inputs: no error, the same five files, each plot saying what it lacks.
    c = t / "c"
    r = run(*fixtures(rosbag2=t / "none.json", powercut=t / "none.json", bench=t / "none.json"), "--out", c)
    check(r.returncode == 0, f"missing inputs: exit {r.returncode}, stderr {r.stderr!r}")
    check(sorted(digests(c)) == sorted(OUTPUTS), f"missing inputs: wrote {sorted(digests(c))}")
    check(digests(c) != digests(a), "missing inputs: the figures did not change")

    # Bad input: exit 2, one line naming the file.
    bad = t / "bad.json"
    bad.write_text('{"rows": [')
    for label, args in (("not JSON", fixtures(bench=bad)),
                        ("wrong shape", fixtures(powercut=HERE / "rosbag2.json"))):
        d = t / label.replace(" ", "-")
        r = run(*args, "--out", d)
        lines = r.stderr.splitlines()
        check(r.returncode == 2, f"{label}: exit {r.returncode}, want 2 (stderr {r.stderr!r})")
        check(len(lines) == 1 and lines[0].startswith("plot-bench: error: "),
              f"{label}: stderr is not one error line: {r.stderr!r}")
    check(str(bad) in run(*fixtures(bench=bad), "--out", t / "x").stderr, "not JSON: the line does not name the file")

    # The data-flow picture is generated: the committed SVG is what the .dot gives.
    import shutil
    if shutil.which("dot"):
        d = t / "df"
        r = run("--dataflow", "--out", d)
        check(r.returncode == 0, f"--dataflow: exit {r.returncode}, stderr {r.stderr!r}")
        committed = ROOT / "docs/img/dataflow.svg"
        check((d / "dataflow.svg").exists() and committed.exists()
              and (d / "dataflow.svg").read_bytes() == committed.read_bytes(),
              "docs/img/dataflow.svg is not what scripts/plot-bench.py --dataflow makes of docs/dataflow.dot: "
              "rerun it and commit the SVG")
    else:
        print("plots check: no Graphviz `dot`: the data-flow SVG is not compared")

if failures:
    for f in failures:
        print(f"plots check: FAIL: {f}", file=sys.stderr)
    sys.exit(1)
print(f"plots check: ok ({len(OUTPUTS)} figures from the fixtures, deterministic; missing and bad inputs)")
