#!/usr/bin/env python3
"""Device bytes written by one `ringbag record` of the synthetic robot mix, for docs/snapshots.md's
Black-box snapshots table. usage: snapshot-device-writes.py RINGBAG continuous|snapshot|trigger SECONDS ROOT

Counts ru_oublock of the child: the same task I/O accounting as /proc/<pid>/io write_bytes,
read after it exited, so the final commit is included."""
import json, os, signal, subprocess, sys, time, shutil, glob

rb, mode, secs, root = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)
args = [rb, "record", "--source", "synthetic", "--clock", "system", "--bag-format", "jazzy",
        "--log-level", "warn", "-o", f"{root}/cont"]
sock = f"{root}.sock"
if mode != "continuous":
    args += ["--snapshot-size", "2GiB", "--snapshot-regex", "^/camera/", "--snapshot-topics",
             "/points", "--snapshot-file", f"/dev/shm/devwrites.ring", "--control-socket", sock]
p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
t0 = time.time()
if mode == "trigger":
    time.sleep(secs / 2)
    subprocess.run([rb, "trigger", "--control-socket", sock, "--reason", "bench"], check=True)
time.sleep(max(0, secs - (time.time() - t0)))
wall = time.time() - t0
p.send_signal(signal.SIGINT)
_, status, ru = os.wait4(p.pid, 0)
err = p.stderr.read()
written = ru.ru_oublock * 512
def size(pattern):
    return sum(os.path.getsize(f) for f in glob.glob(pattern))
cont = size(f"{root}/cont/*.db3")
snap = size(f"{root}/*_snapshot_*/*.db3")
print(json.dumps({"mode": mode, "seconds": round(wall, 1), "device_bytes_written": written,
                  "per_hour_GB": round(written / wall * 3600 / 1e9, 1),
                  "continuous_bag_bytes": cont, "snapshot_bag_bytes": snap}))
if status != 0:
    print(err, file=sys.stderr)
