"""scripts/yocto-crates.py: the Yocto recipe's crate list follows Cargo.lock exactly.

Run by scripts/test.sh (stage "yocto") with the repository's .venv.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/yocto-crates.py"
LOCK = REPO / "Cargo.lock"
INC = REPO / "yocto/meta-ringbag/recipes-support/ringbag/ringbag-crates.inc"
RECIPE = REPO / "yocto/meta-ringbag/recipes-support/ringbag/ringbag_0.1.0.bb"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_the_committed_inc_lists_every_crates_io_package_of_the_lock_with_its_checksum():
    r = run("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    lock = tomllib.loads(LOCK.read_text())
    want = {
        (p["name"], p["version"], p["checksum"])
        for p in lock["package"]
        if p.get("source", "").startswith("registry+https://github.com/rust-lang/crates.io-index")
    }
    inc = INC.read_text()
    uris = set(re.findall(r"crate://crates\.io/([^/\s]+)/([^;\s]+);name=(\S+) \\", inc))
    sums = dict(re.findall(r'SRC_URI\[(\S+)\.sha256sum\] = "([0-9a-f]{64})"', inc))
    assert {(n, v) for n, v, _ in uris} == {(n, v) for n, v, _ in want}
    assert all(key == f"{n}-{v}" for n, v, key in uris)
    assert {(n, v, sums[f"{n}-{v}"]) for n, v, _ in uris} == want
    assert len(want) > 100, "the lock file should hold the whole dependency tree"
    print(f"{len(want)} crates")


def test_a_dependency_bump_makes_the_check_fail_until_the_inc_is_regenerated(tmp_path):
    lock = tmp_path / "Cargo.lock"
    text = LOCK.read_text()
    # Bump one crate: a new version and checksum, as `cargo update -p` would write.
    bumped, n = re.subn(
        r'(name = "memmap2"\nversion = ")[^"]+("\nsource = "[^"]+"\nchecksum = ")[0-9a-f]{64}',
        r"\g<1>9.9.9\g<2>" + "ab" * 32,
        text,
    )
    assert n == 1
    lock.write_text(bumped)
    inc = tmp_path / "ringbag-crates.inc"
    inc.write_text(INC.read_text())

    r = run("--check", "--lock", str(lock), "--inc", str(inc))
    assert r.returncode == 1
    assert "is stale" in r.stderr and "run scripts/yocto-crates.py" in r.stderr
    assert "+    crate://crates.io/memmap2/9.9.9;name=memmap2-9.9.9 \\" in r.stdout
    assert f'+SRC_URI[memmap2-9.9.9.sha256sum] = "{"ab" * 32}"' in r.stdout

    assert run("--lock", str(lock), "--inc", str(inc)).returncode == 0
    r = run("--check", "--lock", str(lock), "--inc", str(inc))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_git_dependency_is_refused_with_one_line(tmp_path):
    lock = tmp_path / "Cargo.lock"
    lock.write_text(
        'version = 4\n\n[[package]]\nname = "r2r"\nversion = "0.9.5"\n'
        'source = "git+https://github.com/sequenceplanner/r2r#0123456789abcdef"\n'
    )
    r = run("--lock", str(lock), "--inc", str(tmp_path / "x.inc"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "r2r 0.9.5 comes from git+https://" in r.stderr
    assert not (tmp_path / "x.inc").exists()


def test_a_missing_or_broken_lock_is_one_line(tmp_path):
    for content in (None, "[[package]\nname = "):
        lock = tmp_path / "Cargo.lock"
        if content is not None:
            lock.write_text(content)
        r = run("--check", "--lock", str(lock), "--inc", str(INC))
        assert r.returncode == 1
        assert r.stderr.startswith("yocto-crates.py: cannot read ") and r.stderr.count("\n") == 1


def test_the_recipe_builds_offline_from_the_inc_with_the_cargo_and_systemd_classes():
    recipe = RECIPE.read_text()
    assert "require ringbag-crates.inc" in recipe
    assert re.search(r"^inherit cargo systemd useradd qemu$", recipe, re.M)
    # No task may reach the network: the cargo class builds --frozen from the vendored crates.
    assert "[network]" not in recipe
    assert re.search(r"^PACKAGECONFIG\[ros\] = \",,clang-native ", recipe, re.M)
    assert 'SYSTEMD_AUTO_ENABLE:${PN} = "enable"' in recipe
    # The accounts are those of the sysusers file.
    sysusers = (REPO / "systemd/ringbag.sysusers").read_text()
    assert re.search(r"^g ptp ", sysusers, re.M) and re.search(r"^u ringbag ", sysusers, re.M)
    assert re.search(r"^m ringbag ptp$", sysusers, re.M)
    assert 'GROUPADD_PARAM:${PN} = "--system ptp"' in recipe
    assert "--user-group --groups ptp" in recipe and "ringbag\"" in recipe
    layer = (REPO / "yocto/meta-ringbag/conf/layer.conf").read_text()
    assert re.search(r'^LAYERSERIES_COMPAT_ringbag = "kirkstone scarthgap"$', layer, re.M)


def test_the_recipe_installs_and_packages_every_shipped_systemd_file():
    recipe = RECIPE.read_text()
    do_install = recipe.split("do_install:append() {", 1)[1].split("\n}\n", 1)[0]
    files = recipe.split('FILES:${PN} += "', 1)[1].split('"', 1)[0].split()
    for shipped, installed in [
        ("ringbag.sysusers", "${nonarch_libdir}/sysusers.d/ringbag.conf"),
        ("ringbag.tmpfiles", "${nonarch_libdir}/tmpfiles.d/ringbag.conf"),
        ("60-ringbag-ptp.rules", "${nonarch_base_libdir}/udev/rules.d/60-ringbag-ptp.rules"),
        ("ringbag.rules.yml", "${datadir}/ringbag/ringbag.rules.yml"),
    ]:
        assert (REPO / "systemd" / shipped).is_file(), shipped
        line = f"install -D -m 0644 ${{S}}/systemd/{shipped}"
        joined = do_install.replace("\\\n", " ")
        assert re.search(re.escape(line) + r"\s+\$\{D\}" + re.escape(installed), joined), shipped
        assert installed in files, installed
    assert "${sysconfdir}/ringbag/ringbag.toml" in do_install


def test_the_recipe_installs_the_generated_man_pages_and_completions():
    # Where install.sh puts them (tests/it/install.rs), from the same `ringbag gen-docs` layout.
    recipe = RECIPE.read_text()
    do_install = recipe.split("do_install:append() {", 1)[1].split("\n}\n", 1)[0]
    joined = re.sub(r"\\\n\s*", "", do_install)
    files = recipe.split('FILES:${PN} += "', 1)[1].split('"', 1)[0].split()
    assert 'DEPENDS += "qemu-native"' in recipe
    assert "')} gen-docs --out ${B}/gen-docs" in joined
    assert "${B}/gen-docs/man1/*.1 ${D}${mandir}/man1/" in joined
    assert "${B}/gen-docs/man5/ringbag.toml.5 ${D}${mandir}/man5/" in joined
    for made, installed in [
        ("ringbag.bash", "${datadir}/bash-completion/completions/ringbag"),
        ("_ringbag", "${datadir}/zsh/site-functions/_ringbag"),
        ("ringbag.fish", "${datadir}/fish/vendor_completions.d/ringbag.fish"),
    ]:
        assert f"${{B}}/gen-docs/completions/{made} ${{D}}{installed}" in joined, made
        assert installed in files, installed
