#!/usr/bin/env python3
"""Read an S3 bucket back with an independent client (boto3), for the upload tests and the
upload benchmark: what ringbag says it uploaded must be there, byte for byte.

    s3_check.py sha256    --key K        the object's SHA-256 (hex), streamed
    s3_check.py list      --prefix P     "KEY SIZE" per object under P, sorted by key
    s3_check.py multipart --prefix P     "KEY UPLOAD_ID INITIATED" per unfinished multipart upload
    s3_check.py compare   --root DIR --prefix P [--exclude GLOB]... [--no-extra]
        every file DIR/<bag>/<file> has a byte-identical object P/<bag>/<file>; one line per
        mismatch ("missing KEY", "size KEY: file N, object M", "content KEY: sha256 A, object B";
        with --no-extra also "extra KEY"); exit 0 when all match, 1 otherwise. Files directly
        in DIR (not in a bag) and names starting with "." (e.g. journals) are not compared.

Common options: --endpoint (default $S3_ENDPOINT), --bucket ($S3_BUCKET), --region ($S3_REGION,
else $AWS_REGION, else "garage"), --json (machine-readable output for list and multipart).
Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally
AWS_SESSION_TOKEN), as boto3 reads them. Path-style addressing (Garage, MinIO on an IP).
Exit codes: 0 done, 1 a mismatch or a missing object, 2 bad input or S3 unreachable/refusing.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
from pathlib import Path

CHUNK = 1 << 20


class Fail(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


def client(a: argparse.Namespace):
    import boto3
    from botocore.config import Config

    if not a.endpoint:
        raise Fail("no endpoint: pass --endpoint or set S3_ENDPOINT")
    if not a.bucket:
        raise Fail("no bucket: pass --bucket or set S3_BUCKET")
    if not os.environ.get("AWS_ACCESS_KEY_ID") or not os.environ.get("AWS_SECRET_ACCESS_KEY"):
        raise Fail("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    cfg = Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        # Checksums only where the API requires them: Garage and other non-AWS stores do not
        # all accept the CRC trailers newer botocore sends by default.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.client("s3", endpoint_url=a.endpoint, region_name=a.region, config=cfg)


def s3_error(e: Exception, what: str) -> Fail:
    """botocore's exceptions as one line: a missing key is a mismatch (1), the rest exit 2."""
    from botocore.exceptions import ClientError

    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "?")
        if code in ("NoSuchKey", "404", "NotFound"):
            return Fail(f"{what}: no such object", 1)
        return Fail(f"{what}: {code}: {e.response.get('Error', {}).get('Message', '')}".rstrip(": "))
    return Fail(f"{what}: {type(e).__name__}: {e}")


def objects(s3, bucket: str, prefix: str) -> dict[str, int]:
    """Every object under `prefix`, key -> size (all pages)."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def object_sha256(s3, bucket: str, key: str) -> str:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    h = hashlib.sha256()
    for chunk in body.iter_chunks(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def join_key(prefix: str, *parts: str) -> str:
    """P/<bag>/<file>, with or without a trailing slash on P."""
    return "/".join([prefix.rstrip("/")] + list(parts)) if prefix else "/".join(parts)


def cmd_sha256(a, s3) -> int:
    try:
        print(object_sha256(s3, a.bucket, a.key))
    except Exception as e:  # noqa: BLE001 - every S3 failure becomes one line
        raise s3_error(e, f"s3://{a.bucket}/{a.key}") from None
    return 0


def cmd_list(a, s3) -> int:
    try:
        objs = objects(s3, a.bucket, a.prefix)
    except Exception as e:  # noqa: BLE001
        raise s3_error(e, f"list s3://{a.bucket}/{a.prefix}") from None
    if a.json:
        print(json.dumps([{"key": k, "size": objs[k]} for k in sorted(objs)]))
    else:
        for k in sorted(objs):
            print(f"{k} {objs[k]}")
    return 0


def cmd_multipart(a, s3) -> int:
    ups = []
    try:
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=a.bucket, Prefix=a.prefix):
            for u in page.get("Uploads", []):
                ups.append({"key": u["Key"], "upload_id": u["UploadId"], "initiated": u["Initiated"].isoformat()})
    except Exception as e:  # noqa: BLE001
        raise s3_error(e, f"multipart uploads under s3://{a.bucket}/{a.prefix}") from None
    ups.sort(key=lambda u: (u["key"], u["initiated"]))
    if a.json:
        print(json.dumps(ups))
    else:
        for u in ups:
            print(f"{u['key']} {u['upload_id']} {u['initiated']}")
    return 0


def local_files(root: Path, exclude: list[str]) -> dict[str, Path]:
    """DIR/<bag>/<file> as "<bag>/<file>" -> path, regular files only."""
    out = {}
    for bag in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for f in sorted(bag.iterdir()):
            if not f.is_file() or f.name.startswith("."):
                continue
            rel = f"{bag.name}/{f.name}"
            if any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(f.name, g) for g in exclude):
                continue
            out[rel] = f
    return out


def cmd_compare(a, s3) -> int:
    root = Path(a.root)
    if not root.is_dir():
        raise Fail(f"--root {root}: not a directory")
    files = local_files(root, a.exclude)
    try:
        objs = objects(s3, a.bucket, a.prefix)
    except Exception as e:  # noqa: BLE001
        raise s3_error(e, f"list s3://{a.bucket}/{a.prefix}") from None
    bad = []
    for rel, path in files.items():
        key = join_key(a.prefix, rel)
        if key not in objs:
            bad.append(f"missing {key}")
            continue
        size = path.stat().st_size
        if objs[key] != size:
            bad.append(f"size {key}: file {size}, object {objs[key]}")
            continue
        try:
            remote = object_sha256(s3, a.bucket, key)
        except Exception as e:  # noqa: BLE001
            raise s3_error(e, f"s3://{a.bucket}/{key}") from None
        local = file_sha256(path)
        if remote != local:
            bad.append(f"content {key}: sha256 {local}, object {remote}")
    if a.no_extra:
        wanted = {join_key(a.prefix, rel) for rel in files}
        bad += [f"extra {k}" for k in sorted(objs) if k not in wanted]
    for line in bad:
        print(line)
    if not bad:
        print(f"ok: {len(files)} files identical under s3://{a.bucket}/{a.prefix}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint", default=os.environ.get("S3_ENDPOINT"))
    common.add_argument("--bucket", default=os.environ.get("S3_BUCKET"))
    common.add_argument("--region", default=os.environ.get("S3_REGION") or os.environ.get("AWS_REGION") or "garage")
    common.add_argument("--json", action="store_true", help="JSON output (list, multipart)")
    ap = argparse.ArgumentParser(prog="s3_check.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sha256", parents=[common], help="SHA-256 of one object")
    p.add_argument("--key", required=True)
    p = sub.add_parser("list", parents=[common], help="objects under a prefix, with sizes")
    p.add_argument("--prefix", default="")
    p = sub.add_parser("multipart", parents=[common], help="unfinished multipart uploads under a prefix")
    p.add_argument("--prefix", default="")
    p = sub.add_parser("compare", parents=[common], help="a recording root against the bucket")
    p.add_argument("--root", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--exclude", action="append", default=[], help="glob over BAG/FILE or FILE (repeatable)")
    p.add_argument("--no-extra", action="store_true", help="objects under P with no file are mismatches too")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:  # argparse: 2 on bad usage, 0 on --help
        return int(e.code or 0)
    try:
        s3 = client(a)
        return {"sha256": cmd_sha256, "list": cmd_list, "multipart": cmd_multipart, "compare": cmd_compare}[a.cmd](a, s3)
    except Fail as e:
        print(f"s3_check: {e}", file=sys.stderr)
        return e.code
    except ImportError as e:
        print(f"s3_check: {e} (run it with the interop venv: .venv/bin/python)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
