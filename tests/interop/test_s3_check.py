"""s3_check.py, the independent read-back of uploads, against a real Garage (scripts/garage.sh):
objects are put with boto3 here, and each subcommand must report exactly what is there."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GARAGE_SH = Path(os.environ.get("RINGBAG_GARAGE_SH", REPO_ROOT / "scripts" / "garage.sh"))
S3_CHECK = Path(__file__).resolve().parent / "s3_check.py"
MIB = 1 << 20


def _free_port() -> int:
    """A port P with P, P+1 and P+3 free (Garage's S3, RPC and admin ports)."""
    for _ in range(200):
        p = random.randrange(20000, 60000)
        socks = []
        try:
            for q in (p, p + 1, p + 3):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for Garage")


def _unavailable(reason: str):
    if os.environ.get("RINGBAG_UPLOAD_REQUIRED") == "1":
        pytest.fail(f"RINGBAG_UPLOAD_REQUIRED=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def garage(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A Garage node for this module: the environment s3_check.py and boto3 need."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        _unavailable("boto3 is not installed (tests/interop/requirements.txt)")
    probe = subprocess.run(["bash", str(GARAGE_SH), "bin"], capture_output=True, text=True)
    if probe.returncode != 0:
        _unavailable(f"no Garage: {probe.stderr.strip()}")
    d = tmp_path_factory.mktemp("garage")
    out = subprocess.run(["bash", str(GARAGE_SH), "start", str(d), str(_free_port())],
                         capture_output=True, text=True)
    if out.returncode != 0:
        subprocess.run(["bash", str(GARAGE_SH), "stop", str(d)])
        pytest.fail(f"garage.sh start failed: {out.stderr}")
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    try:
        yield env
    finally:
        subprocess.run(["bash", str(GARAGE_SH), "stop", str(d)], check=False)


@pytest.fixture
def s3(garage: dict):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=garage["S3_ENDPOINT"], region_name=garage["S3_REGION"],
                        aws_access_key_id=garage["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=garage["AWS_SECRET_ACCESS_KEY"],
                        config=Config(s3={"addressing_style": "path"},
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A prefix of this test's own, so the tests sharing one bucket never see each other."""
    return f"t/{request.node.name}"


def check(garage: dict, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **{k: v for k, v in garage.items() if k != "GARAGE_PID"}}
    return subprocess.run([sys.executable, str(S3_CHECK), *args], capture_output=True, text=True, env=env,
                          timeout=120)


def put(s3, garage: dict, key: str, body: bytes) -> None:
    s3.put_object(Bucket=garage["S3_BUCKET"], Key=key, Body=body)


def test_sha256_prints_the_digest_of_the_object(garage, s3, prefix):
    body = os.urandom(3 * MIB + 17)
    put(s3, garage, f"{prefix}/obj", body)
    r = check(garage, "sha256", "--key", f"{prefix}/obj")
    assert r.returncode == 0, r.stderr
    assert r.stdout == hashlib.sha256(body).hexdigest() + "\n"


def test_sha256_of_a_missing_object_is_one_line_and_exit_1(garage, prefix):
    r = check(garage, "sha256", "--key", f"{prefix}/nothing")
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"s3_check: s3://ringbag/{prefix}/nothing: no such object"]


def test_list_prints_each_key_under_the_prefix_with_its_size(garage, s3, prefix):
    put(s3, garage, f"{prefix}/a/x.db3", b"abc")
    put(s3, garage, f"{prefix}/a/y.db3", b"hello")
    put(s3, garage, f"{prefix}/b/z.db3", b"z")
    r = check(garage, "list", "--prefix", f"{prefix}/a/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{prefix}/a/x.db3 3", f"{prefix}/a/y.db3 5"]
    r = check(garage, "list", "--prefix", f"{prefix}/", "--json")
    assert [o["size"] for o in __import__("json").loads(r.stdout)] == [3, 5, 1]


def test_multipart_lists_unfinished_uploads_until_they_are_aborted(garage, s3, prefix):
    bucket, key = garage["S3_BUCKET"], f"{prefix}/big.db3"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=b"x" * (5 * MIB))
    r = check(garage, "multipart", "--prefix", f"{prefix}/")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].split()[:2] == [key, up], lines
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=up)
    r = check(garage, "multipart", "--prefix", f"{prefix}/")
    assert (r.returncode, r.stdout) == (0, "")


def _root(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A recording root: two bags, one file large enough to go multipart, a journal-like
    dotfile and a root-level lock file that are not compared."""
    files = {
        "bag_a/bag_a_0.db3": os.urandom(12 * MIB + 5),
        "bag_a/metadata.yaml": b"rosbag2_bagfile_information:\n  version: 5\n",
        "bag_b/bag_b_0.db3": os.urandom(70_000),
    }
    root = tmp_path / "root"
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    (root / "bag_a" / ".upload-journal").write_text("{}")
    (root / ".lock").write_text("")
    return root, files


def _upload_root(s3, garage: dict, root: Path, files: dict[str, bytes], prefix: str) -> None:
    from boto3.s3.transfer import TransferConfig

    # Multipart above 5 MiB: the large file's object gets a multipart ETag, which must not
    # matter to compare (it checks the bytes, not ETags).
    cfg = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    for rel in files:
        s3.upload_file(str(root / rel), garage["S3_BUCKET"], f"{prefix}/{rel}", Config=cfg)


def test_compare_passes_when_every_file_is_in_the_bucket_byte_for_byte(garage, s3, prefix, tmp_path):
    root, files = _root(tmp_path)
    _upload_root(s3, garage, root, files, prefix)
    r = check(garage, "compare", "--root", str(root), "--prefix", prefix)
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert "3 files identical" in r.stderr
    # A trailing slash on the prefix names the same keys.
    assert check(garage, "compare", "--root", str(root), "--prefix", prefix + "/").returncode == 0
    # An object with no file (deleted locally after upload) is fine, unless --no-extra.
    put(s3, garage, f"{prefix}/bag_b/bag_b_1.db3", b"gone locally")
    assert check(garage, "compare", "--root", str(root), "--prefix", prefix).returncode == 0
    r = check(garage, "compare", "--root", str(root), "--prefix", prefix, "--no-extra")
    assert (r.returncode, r.stdout) == (1, f"extra {prefix}/bag_b/bag_b_1.db3\n")


def test_compare_names_each_mismatch_on_a_line_and_exits_1(garage, s3, prefix, tmp_path):
    root, files = _root(tmp_path)
    _upload_root(s3, garage, root, files, prefix)
    bucket = garage["S3_BUCKET"]
    # Same size, one byte different; a truncated object; an object that never arrived.
    big = bytearray(files["bag_a/bag_a_0.db3"])
    big[7 * MIB] ^= 0xFF
    put(s3, garage, f"{prefix}/bag_a/bag_a_0.db3", bytes(big))
    put(s3, garage, f"{prefix}/bag_a/metadata.yaml", files["bag_a/metadata.yaml"][:-1])
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/bag_b/bag_b_0.db3")
    r = check(garage, "compare", "--root", str(root), "--prefix", prefix)
    assert r.returncode == 1, r.stderr
    local = hashlib.sha256(files["bag_a/bag_a_0.db3"]).hexdigest()
    remote = hashlib.sha256(bytes(big)).hexdigest()
    n = len(files["bag_a/metadata.yaml"])
    assert r.stdout.splitlines() == [
        f"content {prefix}/bag_a/bag_a_0.db3: sha256 {local}, object {remote}",
        f"size {prefix}/bag_a/metadata.yaml: file {n}, object {n - 1}",
        f"missing {prefix}/bag_b/bag_b_0.db3",
    ]
    # --exclude leaves a file out.
    r = check(garage, "compare", "--root", str(root), "--prefix", prefix, "--exclude", "bag_b/*",
              "--exclude", "*.db3", "--exclude", "metadata.yaml")
    assert (r.returncode, r.stdout) == (0, "")


def test_bad_input_is_one_line_and_exit_2(garage, tmp_path):
    r = check(garage, "compare", "--root", str(tmp_path / "absent"), "--prefix", "p")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"s3_check: --root {tmp_path / 'absent'}: not a directory"]
    # A bucket that does not exist: the store's own error code, one line.
    r = check(garage, "list", "--bucket", "no-such-bucket", "--prefix", "")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "NoSuchBucket" in r.stderr, r.stderr
    # Wrong credentials.
    env_bad = {**garage, "AWS_SECRET_ACCESS_KEY": "0" * 64}
    r = check(env_bad, "list", "--prefix", "")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # Nothing listening: one line, not a traceback.
    r = check({**garage, "S3_ENDPOINT": f"http://127.0.0.1:{_free_port()}"}, "list", "--prefix", "")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
