#!/usr/bin/env python3
"""What the uploader's journals count as uploaded is in the bucket: for the systemd and powercut
stages, which have no venv (boto3); the S3 reads go through curl's own SigV4 (--aws-sigv4), a
client independent of ringbag's.

    upload-verify.py ROOT [--min-content N] [--all-closed [--bags NAME,...]] [--journal-only]

For every bag directory ROOT/<bag> with a journal (.ringbag-upload.json), every file marked
`done` must be an object whose HEAD shows the journaled size and ETag; when the file on disk is
still the one the journal describes (same size, mtime and inode), the object's SHA-256 must also
equal the file's. --min-content N fails when fewer than N files were compared by content.
--all-closed also requires every split metadata.yaml lists and that exists to be `done` (the
backlog drained), in every bag or in the --bags named. --journal-only reads the journals alone,
no S3 (to poll for --all-closed cheaply before the full check). Prints one line per problem, then a summary; exit 0 when all is well, 1 on a
problem, 2 on bad input (no S3_ENDPOINT etc.).

Environment: S3_ENDPOINT, S3_BUCKET, S3_REGION (default "garage"), AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY. Path-style addressing. The key pair goes to curl on its standard input
(a config file), not on its command line.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.parse

JOURNAL = ".ringbag-upload.json"


def curl(env, key, head):
    """(status, headers dict, body sha256) of GET/HEAD key."""
    url = "%s/%s/%s" % (env["S3_ENDPOINT"].rstrip("/"), env["S3_BUCKET"], urllib.parse.quote(key))
    cfg = 'user = "%s:%s"\n' % (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    args = ["curl", "-sS", "--max-time", "60", "-K", "-",
            "--aws-sigv4", "aws:amz:%s:s3" % env["S3_REGION"],
            # Garage requires the header; curl 7.88 does not send it by itself.
            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            "-D", "/dev/stderr", "-o", "-"]
    if head:
        args.append("-I")
    args.append(url)
    p = subprocess.run(args, input=cfg.encode(), capture_output=True)
    if p.returncode != 0:
        raise SystemExit("upload-verify: curl %s: exit %d: %s" % (key, p.returncode, p.stderr.decode(errors="replace").strip()[-200:]))
    # With -I the headers also go to stdout; parse the ones in stderr (the -D dump).
    hdr_text = p.stderr.decode(errors="replace")
    blocks = [b for b in re.split(r"\r?\n\r?\n", hdr_text) if b.strip().startswith("HTTP/")]
    lines = blocks[-1].splitlines() if blocks else ["HTTP/1.1 0"]
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers, (None if head else hashlib.sha256(p.stdout).hexdigest())


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def listed_splits(bag):
    """The split names metadata.yaml lists (relative_file_paths), without a YAML parser."""
    try:
        text = open(os.path.join(bag, "metadata.yaml"), errors="replace").read()
    except OSError:
        return []
    m = re.search(r"relative_file_paths:\s*\n((?:\s*-\s*.*\n)*)", text)
    return re.findall(r"-\s*(\S+)", m.group(1)) if m else []


def main():
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        sys.exit(2)
    root = argv[0]
    min_content = int(argv[argv.index("--min-content") + 1]) if "--min-content" in argv else 0
    all_closed = "--all-closed" in argv
    journal_only = "--journal-only" in argv
    only = set(argv[argv.index("--bags") + 1].split(",")) if "--bags" in argv else None
    env = dict(os.environ)
    env.setdefault("S3_REGION", "garage")
    for k in ("S3_ENDPOINT", "S3_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if not env.get(k):
            print("upload-verify: %s is not set" % k, file=sys.stderr)
            sys.exit(2)
    problems, done, by_content, bags = [], 0, 0, 0
    for name in sorted(os.listdir(root)):
        bag = os.path.join(root, name)
        jpath = os.path.join(bag, JOURNAL)
        if not os.path.isdir(bag):
            continue
        bags += 1
        journal = {"files": {}}
        if os.path.exists(jpath):
            try:
                journal = json.load(open(jpath))
            except ValueError as e:
                problems.append("%s: journal unreadable: %s" % (name, e))
                continue
        for fname, e in sorted(journal.get("files", {}).items()):
            if not e.get("done"):
                continue
            done += 1
            if journal_only:
                continue
            key, ident = e["key"], e["identity"]
            status, headers, _ = curl(env, key, head=True)
            if status != 200:
                problems.append("%s/%s: counted as uploaded, HEAD %s is %d" % (name, fname, key, status))
                continue
            size = int(headers.get("content-length", "-1"))
            etag = headers.get("etag", "").strip('"')
            if size != ident["size"]:
                problems.append("%s/%s: journal size %d, object %d" % (name, fname, ident["size"], size))
            if e.get("etag") and etag != e["etag"].strip('"'):
                problems.append("%s/%s: journal ETag %s, object %s" % (name, fname, e["etag"], etag))
            path = os.path.join(bag, fname)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # deleted since (retention, delete_after_upload): HEAD is all there is
            if (st.st_size, st.st_mtime_ns, st.st_ino) != (ident["size"], ident["mtime_ns"], ident["inode"]):
                continue  # rewritten since (metadata.yaml): the next upload covers it
            status, _, digest = curl(env, key, head=False)
            by_content += 1
            local = sha256_file(path)
            if status != 200 or digest != local:
                problems.append("%s/%s: content differs (GET %d, sha256 %s, file %s)" % (name, fname, status, digest, local))
        if all_closed and (only is None or name in only):
            for split in listed_splits(bag):
                e = journal.get("files", {}).get(split)
                if os.path.exists(os.path.join(bag, split)) and not (e and e.get("done")):
                    problems.append("%s/%s: closed, still not uploaded" % (name, split))
    if by_content < min_content:
        problems.append("only %d files compared by content, want at least %d" % (by_content, min_content))
    for p in problems:
        print(p)
    if problems:
        print("%d bags, %d files counted as uploaded: %d problems" % (bags, done, len(problems)))
    else:
        print("%d bags, %d files counted as uploaded: all in the bucket with their size and ETag, %d of them byte-identical (sha256)"
              % (bags, done, by_content))
    sys.exit(1 if problems else 0)


main()
