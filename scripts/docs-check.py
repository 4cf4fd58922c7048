#!/usr/bin/env python3
"""Docs that cannot rot: the `docs` stage of scripts/test.sh.

    scripts/docs-check.py [--bin target/debug/ringbag] [--root DIR]

--root: the tree whose README.md and docs/*.md are checked [default: this repository]
(tests/it/docs_check.rs checks altered copies).

Fails (exit 1, one line per problem, then a count) when:
  * a flag in `ringbag --help` or any command's `--help` appears nowhere in README.md or
    docs/*.md (as `--flag`);
  * a config key of ringbag.toml(5) has no row in the docs' config tables (Markdown tables
    headed `| key | default | meaning |`) whose first cell names it (`key`) and whose text
    holds its default. The keys and defaults are read from the
    man page `ringbag gen-docs` writes, which is generated from src/config/keys.rs, the list
    the parser's tests tie to the parser's structs;
  * a relative link or image in README.md or docs/*.md names a file that does not exist, or an
    anchor (#heading) that no heading of the target Markdown file makes;
  * the man pages do not build, or `groff -man -ww -z` or `MANWIDTH=80 man -l --warnings`
    prints a warning for one of them;
  * the bash completion does not complete `ringbag rec` to `record` and `ringbag record
    --max-bag-s` to `--max-bag-size`, or zsh -n / fish -n (where installed) reject theirs.

Needs the built binary, groff and man (Debian: man-db); the standard library only.
Exit 2 for bad usage or a binary that does not run.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# An option's own line: clap indents it 2 (`  -o, --output`) or 6 (`      --long-only`)
# spaces; a wrapped description line that starts with a flag is indented further.
FLAG_IN_HELP = re.compile(r"^ {2,6}(?:-[A-Za-z0-9], )?--([a-z0-9][a-z0-9-]*)")
# Flags every clap command has; the docs need not list them.
IMPLICIT = {"help", "version"}


def die(message: str) -> None:
    print(f"docs-check: {message}", file=sys.stderr)
    sys.exit(2)


def run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, **kw)


def doc_files(root: Path) -> list[Path]:
    docs = sorted((root / "docs").glob("**/*.md")) if (root / "docs").is_dir() else []
    return [root / "README.md", *docs]


def help_of(binary: str, *command: str) -> str:
    r = run([binary, *command, "--help"])
    if r.returncode != 0:
        die(f"`ringbag {' '.join(command)} --help` failed: {r.stderr.strip()}")
    return r.stdout


def commands(top_help: str) -> list[str]:
    """The names of the Commands: section (hidden ones are not listed, `help` is clap's)."""
    names, inside = [], False
    for line in top_help.splitlines():
        if line.startswith("Commands:"):
            inside = True
            continue
        if inside:
            if not line.startswith(" "):
                break
            m = re.match(r"^  ([a-z][a-z0-9-]*)\s", line)
            if m and m.group(1) != "help":
                names.append(m.group(1))
    return names


def check_flags(binary: str, text: str) -> list[str]:
    problems = []
    top = help_of(binary)
    for command in [None, *commands(top)]:
        page = top if command is None else help_of(binary, command)
        where = "ringbag" if command is None else f"ringbag {command}"
        for line in page.splitlines():
            m = FLAG_IN_HELP.match(line)
            if not m or m.group(1) in IMPLICIT:
                continue
            flag = m.group(1)
            if not re.search(rf"--{re.escape(flag)}(?![A-Za-z0-9-])", text):
                problems.append(f"{where}: --{flag} is in --help but not in README.md or docs/*.md")
    return problems


def unroff(s: str) -> str:
    s = re.sub(r"\\f[BIRP]", "", s)
    s = re.sub(r"\\\[u([0-9A-F]{4,6})\]", lambda m: chr(int(m.group(1), 16)), s)
    return s.replace("\\*(Aq", "'").replace("\\-", "-").replace("\\(aq", "'").replace("\\\\", "\\")


def config_keys(page: Path) -> list[tuple[str, str]]:
    """(key, default) of each `.TP` entry of ringbag.toml(5)."""
    keys = []
    for line in page.read_text().splitlines():
        m = re.match(r"^\\fB([a-z0-9_]+)\\fR \(default: (.*)\)$", line)
        if m:
            keys.append((m.group(1), unroff(m.group(2))))
    if not keys:
        die(f"{page}: no `key (default: ...)` entries: has gen-docs changed its layout?")
    return keys


def normalise(s: str) -> str:
    return " ".join(s.replace("`", "").split())


def check_keys(page: Path, files: list[Path]) -> list[str]:
    # The config tables are those headed `| key | default | meaning |` (convert's options
    # table, `| key | default | effect |`, shares key names such as `all` with other defaults).
    rows, in_config = [], False
    for f in files:
        for line in f.read_text().splitlines():
            if not line.startswith("|"):
                in_config = False
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[:3] == ["key", "default", "meaning"]:
                in_config = True
            elif in_config:
                rows.append((cells[0], normalise(line)))
    problems = []
    for key, default in config_keys(page):
        named = [text for first, text in rows if f"`{key}`" in first]
        if not named:
            problems.append(f"ringbag.toml: key `{key}` has no table row in README.md or docs/*.md")
        elif not any(normalise(default) in text for text in named):
            problems.append(
                f"ringbag.toml: key `{key}`: no table row naming it gives its default `{default}`"
            )
    return problems


def without_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)


def check_links(root: Path, files: list[Path]) -> list[str]:
    problems = []
    cache: dict[Path, set[str]] = {}
    for f in files:
        for n, line in without_code(f.read_text()):
            targets = LINK.findall(line) + HTML.findall(line)
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
            for t in targets:
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) or t.startswith("//"):
                    continue  # http:, https:, mailto:: not checked (no network in CI)
                path, _, anchor = t.partition("#")
                target = (f.parent / path).resolve() if path else f
                where = f"{f.relative_to(root)}:{n}"
                if not target.exists():
                    problems.append(f"{where}: link to {t}: {path} does not exist")
                    continue
                if anchor and target.suffix == ".md":
                    if target not in cache:
                        cache[target] = anchors(target)
                    if anchor not in cache[target]:
                        problems.append(f"{where}: link to {t}: no heading makes #{anchor}")
    return problems


def check_man(pages: list[Path]) -> list[str]:
    problems = []
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    for p in pages:
        for args in (["groff", "-man", "-ww", "-z", str(p)], ["man", "-l", "--warnings", str(p)]):
            r = run(args, env=env)
            warnings = r.stderr.strip()
            if r.returncode != 0 or warnings:
                first = warnings.splitlines()[0] if warnings else f"exit {r.returncode}"
                problems.append(f"{p.name}: `{' '.join(args[:-1])}` warns: {first}")
    return problems


BASH_COMPLETE = r'''
source "$1"
complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=()
    _ringbag ringbag "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    echo "${COMPREPLY[*]}"; }
complete_words ringbag rec
complete_words ringbag record --max-bag-s
'''


def check_completions(out: Path) -> list[str]:
    problems = []
    r = run(["bash", "-c", BASH_COMPLETE, "bash", str(out / "completions/ringbag.bash")])
    if r.stdout.splitlines() != ["record", "--max-bag-size"]:
        got = (r.stdout + r.stderr).strip().replace("\n", " | ")
        problems.append(f"completions/ringbag.bash: `ringbag rec`, `ringbag record --max-bag-s` complete to: {got}")
    for shell, name in (("zsh", "_ringbag"), ("fish", "ringbag.fish")):
        if run(["sh", "-c", f"command -v {shell}"]).returncode == 0:
            r = run([shell, "-n", str(out / "completions" / name)])
            if r.returncode != 0:
                problems.append(f"completions/{name}: {shell} -n: {r.stderr.strip()}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target/debug/ringbag"), help="the ringbag binary")
    ap.add_argument("--root", default=str(ROOT), help="the tree whose docs are checked")
    a = ap.parse_args()
    root = Path(a.root).resolve()
    if not (root / "README.md").is_file():
        die(f"no README.md in {root}")
    if not os.access(a.bin, os.X_OK):
        die(f"no ringbag binary at {a.bin} (cargo build --bin ringbag, or pass --bin)")
    for tool in ("groff", "man"):
        if run(["sh", "-c", f"command -v {tool}"]).returncode != 0:
            die(f"{tool} not found (Debian: man-db)")
    files = doc_files(root)
    text = "\n".join(f.read_text() for f in files)
    problems = check_flags(a.bin, text)
    with tempfile.TemporaryDirectory() as out:
        r = run([a.bin, "gen-docs", "--out", out])
        if r.returncode != 0:
            problems.append(f"ringbag gen-docs failed: {r.stderr.strip()}")
        else:
            out = Path(out)
            pages = sorted(out.glob("man1/*.1")) + sorted(out.glob("man5/*.5"))
            problems += check_keys(out / "man5/ringbag.toml.5", files)
            problems += check_man(pages)
            problems += check_completions(out)
    problems += check_links(root, files)
    for p in problems:
        print(f"docs-check: {p}")
    if problems:
        sys.stdout.flush()
        print(f"docs-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"docs-check: ok ({', '.join(str(f.relative_to(root)) for f in files)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
