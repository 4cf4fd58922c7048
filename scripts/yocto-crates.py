#!/usr/bin/env python3
"""Regenerate yocto/meta-ringbag/recipes-support/ringbag/ringbag-crates.inc from Cargo.lock.

    scripts/yocto-crates.py            rewrite the .inc
    scripts/yocto-crates.py --check    exit 1 if the committed .inc differs (CI runs this)

The recipe builds offline: bitbake fetches every crate of Cargo.lock as a
`crate://crates.io/NAME/VERSION` entry of SRC_URI, checked against the sha256 that Cargo.lock
records, and cargo then builds `--frozen` from those. The file has the form OE-core's
`bitbake -c update_crates` (cargo-update-recipe-crates.bbclass) writes, except that the list
opens with `"\` rather than `" \` (oelint-adv's oelint.vars.inconspaces; the value is the same).
This script needs no bitbake. Every crates.io package of the lock file is listed,
including optional (`ros`) and other-platform dependencies: cargo --frozen wants them all
vendored. A package from anywhere else (git, a path) is refused: bitbake could not fetch it
offline through crate://.
"""

import argparse
import difflib
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "Cargo.lock"
INC = ROOT / "yocto/meta-ringbag/recipes-support/ringbag/ringbag-crates.inc"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def render(lock_path: Path) -> str:
    try:
        with lock_path.open("rb") as f:
            lock = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"yocto-crates.py: cannot read {lock_path}: {e}") from None
    uris, sums = [], []
    for pkg in lock.get("package", []):
        source = pkg.get("source")
        if source is None:
            continue  # the workspace's own package
        if source != CRATES_IO:
            raise SystemExit(
                f"yocto-crates.py: {pkg['name']} {pkg['version']} comes from {source}, "
                "not crates.io: the offline recipe cannot fetch it as crate://"
            )
        if "checksum" not in pkg:
            raise SystemExit(f"yocto-crates.py: {pkg['name']} {pkg['version']} has no checksum in Cargo.lock")
        key = f"{pkg['name']}-{pkg['version']}"
        uris.append(f"    crate://crates.io/{pkg['name']}/{pkg['version']};name={key} \\")
        sums.append(f'SRC_URI[{key}.sha256sum] = "{pkg["checksum"]}"')
    if not uris:
        raise SystemExit("yocto-crates.py: Cargo.lock lists no crates.io package")
    lines = [
        "# Generated from Cargo.lock by scripts/yocto-crates.py (the form of",
        "# `bitbake -c update_crates ringbag`). Do not edit: rerun the script after a",
        "# dependency change; CI fails while this file and Cargo.lock disagree.",
        f"# {len(uris)} crates.",
        "",
        "# from Cargo.lock",
        'SRC_URI += "\\',
        *uris,
        '"',
        "",
        *sums,
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed .inc is stale")
    ap.add_argument("--lock", type=Path, default=LOCK, help=f"the lock file [default: {LOCK}]")
    ap.add_argument("--inc", type=Path, default=INC, help=f"the .inc to write or check [default: {INC}]")
    args = ap.parse_args()
    want = render(args.lock)
    count = want.count("crate://crates.io/")
    if args.check:
        have = args.inc.read_text() if args.inc.exists() else ""
        if have != want:
            sys.stdout.writelines(
                difflib.unified_diff(
                    have.splitlines(True), want.splitlines(True), str(args.inc), f"from {args.lock}", n=1
                )
            )
            print(
                f"yocto-crates.py: {args.inc} is stale against {args.lock}; run scripts/yocto-crates.py",
                file=sys.stderr,
            )
            return 1
        print(f"yocto-crates.py: {args.inc} matches {args.lock} ({count} crates)")
        return 0
    args.inc.write_text(want)
    print(f"yocto-crates.py: wrote {args.inc} ({count} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
