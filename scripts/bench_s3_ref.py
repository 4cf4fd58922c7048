"""The upload benchmark's reference client (scripts/bench.py runs it in a child process of its
own, with the interop venv's Python, so that its CPU time and peak RSS are its own): boto3's
`upload_file` for every file ROOT/<bag>/<file>, one file after another, to PREFIX/<bag>/<file>,
multipart above the part size with that part size and that many parts in flight.

    bench_s3_ref.py --root ROOT --prefix PREFIX [--part-size BYTES] [--concurrency N]

Endpoint, bucket, region and credentials come from S3_ENDPOINT, S3_BUCKET, S3_REGION and the
AWS_* variables (what scripts/garage.sh prints). Prints one JSON line: files and bytes sent."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--part-size", type=int, default=16 * 2**20)
    ap.add_argument("--concurrency", type=int, default=2)
    a = ap.parse_args()
    # boto3's defaults otherwise (its own retries, its default checksums): the reference is
    # what a user of upload_file gets, only addressed path-style as Garage needs.
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name=os.environ.get("S3_REGION", "garage"),
                      config=Config(s3={"addressing_style": "path"}))
    cfg = TransferConfig(multipart_threshold=a.part_size, multipart_chunksize=a.part_size,
                         max_concurrency=a.concurrency, use_threads=True)
    files = sorted(f for bag in Path(a.root).iterdir() if bag.is_dir() for f in bag.iterdir() if f.is_file())
    sent = 0
    for f in files:
        s3.upload_file(str(f), os.environ["S3_BUCKET"], f"{a.prefix}/{f.parent.name}/{f.name}", Config=cfg)
        sent += f.stat().st_size
    print(json.dumps({"files": len(files), "bytes": sent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
