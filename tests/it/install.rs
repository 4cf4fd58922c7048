//! `scripts/install.sh` into a temporary image root: the files, their modes and owners, the
//! enabled unit, idempotence, a locally edited configuration that survives reinstalling, and
//! the man pages and completions (`ringbag gen-docs`) where man and the shells look for them.

use crate::common::RunOutput;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::CommandFactory;
use ringbag::cli::args::Cli;

use crate::common::{stderr, stdout, with_runner};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn install(root: &Path, extra: &[&str]) -> Output {
    assert!(
        Command::new("systemctl")
            .arg("--version")
            .run_output()
            .is_ok(),
        "systemctl is missing: scripts/test.sh installs the Debian package `systemd`"
    );
    Command::new("bash")
        .arg(repo().join("scripts/install.sh"))
        .arg("--root")
        .arg(root)
        .args(["--bin", env!("CARGO_BIN_EXE_ringbag")])
        .args(
            runner_docs()
                .iter()
                .flat_map(|d| [Path::new("--docs"), d.as_path()]),
        )
        .args(extra)
        .run_output()
        .expect("bash runs install.sh")
}

/// `ringbag gen-docs` into a fresh directory, the binary run as the tests run it.
fn gen_docs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let o = with_runner(Path::new(env!("CARGO_BIN_EXE_ringbag")))
        .arg("gen-docs")
        .arg("--out")
        .arg(dir.path())
        .run_output()
        .unwrap();
    assert!(o.status.success(), "gen-docs: {}", stderr(&o));
    dir
}

/// Under a test runner (qemu for the aarch64 suite) install.sh cannot run the binary itself
/// to generate the man pages: they are generated through the runner and passed with --docs.
fn runner_docs() -> Option<PathBuf> {
    static DOCS: std::sync::OnceLock<Option<tempfile::TempDir>> = std::sync::OnceLock::new();
    DOCS.get_or_init(|| {
        std::env::var("RINGBAG_TEST_RUNNER")
            .is_ok_and(|r| !r.trim().is_empty())
            .then(gen_docs)
    })
    .as_ref()
    .map(|d| d.path().to_path_buf())
}

/// The man pages install.sh puts in man1: one for ringbag and one per visible command.
fn man1_pages() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| format!("ringbag-{}.1", c.get_name()))
        .chain(["ringbag.1".to_string()])
        .collect()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "install.sh failed: {}{}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Every entry under `root`: relative path -> "TYPE MODE UID:GID [-> TARGET]".
fn listing(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            let kind = if m.file_type().is_symlink() {
                "l"
            } else if m.is_dir() {
                "d"
            } else {
                "f"
            };
            let mut v = format!(
                "{kind} {:o} {}:{}",
                m.permissions().mode() & 0o7777,
                m.uid(),
                m.gid()
            );
            if m.file_type().is_symlink() {
                v.push_str(&format!(" -> {}", fs::read_link(&p).unwrap().display()));
            }
            out.insert(rel, v);
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// What a second run must not change: listing plus each file's inode, mtime and bytes.
fn snapshot(root: &Path) -> BTreeMap<String, (String, u64, i64, i64, Vec<u8>)> {
    listing(root)
        .into_iter()
        .map(|(rel, v)| {
            let p = root.join(rel.trim_start_matches('/'));
            let m = fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            (rel, (v, m.ino(), m.mtime(), m.mtime_nsec(), bytes))
        })
        .collect()
}

fn owner() -> String {
    format!("{}:{}", nix::unistd::geteuid(), nix::unistd::getegid())
}

fn expected_usr_listing() -> BTreeMap<String, String> {
    let o = owner();
    let d = |p: &str| (p.to_string(), format!("d 755 {o}"));
    let f = |p: &str, mode: &str| (p.to_string(), format!("f {mode} {o}"));
    [
        d("/etc"),
        d("/etc/ringbag"),
        f("/etc/ringbag/ringbag.toml", "644"),
        d("/etc/systemd"),
        d("/etc/systemd/system"),
        d("/etc/systemd/system/multi-user.target.wants"),
        (
            "/etc/systemd/system/multi-user.target.wants/ringbag.service".to_string(),
            format!("l 777 {o} -> /usr/lib/systemd/system/ringbag.service"),
        ),
        d("/usr"),
        d("/usr/bin"),
        f("/usr/bin/ringbag", "755"),
        d("/usr/lib"),
        d("/usr/lib/systemd"),
        d("/usr/lib/systemd/system"),
        f("/usr/lib/systemd/system/ringbag.service", "644"),
        d("/usr/lib/sysusers.d"),
        f("/usr/lib/sysusers.d/ringbag.conf", "644"),
        d("/usr/lib/tmpfiles.d"),
        f("/usr/lib/tmpfiles.d/ringbag.conf", "644"),
        d("/usr/lib/udev"),
        d("/usr/lib/udev/rules.d"),
        f("/usr/lib/udev/rules.d/60-ringbag-ptp.rules", "644"),
        d("/usr/share"),
        d("/usr/share/ringbag"),
        f("/usr/share/ringbag/ringbag.rules.yml", "644"),
        d("/usr/share/man"),
        d("/usr/share/man/man1"),
        d("/usr/share/man/man5"),
        f("/usr/share/man/man5/ringbag.toml.5", "644"),
        d("/usr/share/bash-completion"),
        d("/usr/share/bash-completion/completions"),
        f("/usr/share/bash-completion/completions/ringbag", "644"),
        d("/usr/share/zsh"),
        d("/usr/share/zsh/site-functions"),
        f("/usr/share/zsh/site-functions/_ringbag", "644"),
        d("/usr/share/fish"),
        d("/usr/share/fish/vendor_completions.d"),
        f("/usr/share/fish/vendor_completions.d/ringbag.fish", "644"),
    ]
    .into_iter()
    .chain(
        man1_pages()
            .iter()
            .map(|p| f(&format!("/usr/share/man/man1/{p}"), "644")),
    )
    .collect()
}

/// `man` finds and renders the installed pages from the image root, without a warning.
fn man_renders(root: &Path) {
    assert!(
        Command::new("man").arg("--version").run_output().is_ok(),
        "man is missing: scripts/test.sh installs the Debian package `man-db`"
    );
    let man = root.join("usr/share/man");
    for (page, title) in [
        ("man1/ringbag-record.1", "ringbag-record(1)"),
        ("man1/ringbag.1", "ringbag(1)"),
        ("man5/ringbag.toml.5", "RINGBAG.TOML(5)"),
    ] {
        let o = Command::new("man")
            .env("MANWIDTH", "80")
            .args(["-l", "--warnings"])
            .arg(man.join(page))
            .run_output()
            .unwrap();
        assert!(o.status.success(), "man -l {page}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "man -l {page} warned");
        assert!(stdout(&o).starts_with(title), "{page}: {}", stdout(&o));
    }
    // As `man ringbag-record` on the robot: found through MANPATH in the image root.
    let o = Command::new("man")
        .env("MANPATH", &man)
        .args(["-w", "ringbag-record", "ringbag.toml"])
        .run_output()
        .unwrap();
    assert!(o.status.success(), "man -w: {}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "{}\n{}\n",
            man.join("man1/ringbag-record.1").display(),
            man.join("man5/ringbag.toml.5").display()
        )
    );
}

#[test]
fn install_into_an_image_root_writes_the_files_enables_the_unit_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let out = ok(&install(root, &[]));
    assert!(out.contains("installed  /usr/bin/ringbag"), "{out}");

    let got = listing(root);
    assert_eq!(got, expected_usr_listing(), "install.sh file list");
    eprintln!("installed files:");
    for (p, v) in &got {
        eprintln!("  {v:<40} {p}");
    }

    // The installed files are the packaged ones, byte for byte.
    let sys = repo().join("systemd");
    for (installed, shipped) in [
        ("usr/lib/systemd/system/ringbag.service", "ringbag.service"),
        ("usr/lib/sysusers.d/ringbag.conf", "ringbag.sysusers"),
        ("usr/lib/tmpfiles.d/ringbag.conf", "ringbag.tmpfiles"),
        (
            "usr/lib/udev/rules.d/60-ringbag-ptp.rules",
            "60-ringbag-ptp.rules",
        ),
        ("etc/ringbag/ringbag.toml", "ringbag.toml"),
        ("usr/share/ringbag/ringbag.rules.yml", "ringbag.rules.yml"),
    ] {
        assert_eq!(
            fs::read(root.join(installed)).unwrap(),
            fs::read(sys.join(shipped)).unwrap(),
            "{installed}"
        );
    }
    assert_eq!(
        fs::read(root.join("usr/bin/ringbag")).unwrap(),
        fs::read(env!("CARGO_BIN_EXE_ringbag")).unwrap()
    );
    // The man pages and completions are the binary's own `gen-docs`, byte for byte.
    let docs = gen_docs();
    let mut generated: Vec<(String, String)> = man1_pages()
        .into_iter()
        .map(|p| (format!("usr/share/man/man1/{p}"), format!("man1/{p}")))
        .collect();
    generated.extend(
        [
            ("usr/share/man/man5/ringbag.toml.5", "man5/ringbag.toml.5"),
            (
                "usr/share/bash-completion/completions/ringbag",
                "completions/ringbag.bash",
            ),
            (
                "usr/share/zsh/site-functions/_ringbag",
                "completions/_ringbag",
            ),
            (
                "usr/share/fish/vendor_completions.d/ringbag.fish",
                "completions/ringbag.fish",
            ),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
    );
    for (installed, made) in generated {
        assert_eq!(
            fs::read(root.join(&installed)).unwrap(),
            fs::read(docs.path().join(made)).unwrap(),
            "{installed}"
        );
    }
    man_renders(root);
    // The installed binary runs.
    let v = with_runner(&root.join("usr/bin/ringbag"))
        .arg("--version")
        .run_output()
        .unwrap();
    assert!(
        v.status.success() && stdout(&v).starts_with("ringbag "),
        "{}",
        stdout(&v)
    );

    // A second run changes nothing: same inodes, mtimes, bytes, modes, owners, links.
    let before = snapshot(root);
    let out = ok(&install(root, &[]));
    assert!(out.contains("nothing changed"), "{out}");
    assert!(!out.contains("installed "), "{out}");
    assert_eq!(
        snapshot(root),
        before,
        "a second install.sh changed the root"
    );
}

#[test]
fn install_keeps_an_edited_config_and_puts_the_new_default_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    ok(&install(root, &[]));
    let conf = root.join("etc/ringbag/ringbag.toml");
    let edited = b"# edited on the robot\nsource = \"synthetic\"\noutput_root = \"/data/bags\"\n";
    fs::write(&conf, edited).unwrap();

    let out = ok(&install(root, &[]));
    assert!(
        out.contains("kept       /etc/ringbag/ringbag.toml (edited)"),
        "{out}"
    );
    assert_eq!(
        fs::read(&conf).unwrap(),
        edited,
        "the edited config was overwritten"
    );
    assert_eq!(
        fs::read(root.join("etc/ringbag/ringbag.toml.new")).unwrap(),
        fs::read(repo().join("systemd/ringbag.toml")).unwrap()
    );
    // Still idempotent with the edit in place.
    let before = snapshot(root);
    let out = ok(&install(root, &[]));
    assert!(out.contains("nothing changed"), "{out}");
    assert_eq!(snapshot(root), before);
}

#[test]
fn install_with_another_prefix_names_it_in_the_unit_and_uses_the_admin_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    ok(&install(root, &["--prefix", "/opt/ringbag", "--no-enable"]));
    let unit = fs::read_to_string(root.join("etc/systemd/system/ringbag.service")).unwrap();
    assert!(
        unit.lines()
            .any(|l| l
                == "ExecStart=/opt/ringbag/bin/ringbag daemon --config /etc/ringbag/ringbag.toml"),
        "{unit}"
    );
    for f in [
        "opt/ringbag/bin/ringbag",
        "etc/sysusers.d/ringbag.conf",
        "etc/tmpfiles.d/ringbag.conf",
        "etc/udev/rules.d/60-ringbag-ptp.rules",
        "etc/ringbag/ringbag.toml",
        "opt/ringbag/share/ringbag/ringbag.rules.yml",
        "opt/ringbag/share/man/man1/ringbag-record.1",
        "opt/ringbag/share/man/man5/ringbag.toml.5",
        "opt/ringbag/share/bash-completion/completions/ringbag",
        "opt/ringbag/share/zsh/site-functions/_ringbag",
        "opt/ringbag/share/fish/vendor_completions.d/ringbag.fish",
    ] {
        assert!(root.join(f).is_file(), "{f} missing");
    }
    assert!(
        !root.join("usr").exists(),
        "nothing goes under /usr with --prefix /opt/ringbag"
    );
    assert!(
        !root
            .join("etc/systemd/system/multi-user.target.wants")
            .exists(),
        "--no-enable enabled"
    );
}

#[test]
fn install_refuses_bad_input_with_one_line_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let not_elf = root.join("ringbag.sh");
    fs::write(&not_elf, "#!/bin/sh\n").unwrap();
    let missing: PathBuf = root.join("no-such-dir");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--bin".into(), not_elf.display().to_string()],
            "is not an ELF executable",
        ),
        (
            vec!["--prefix".into(), "usr".into()],
            "--prefix must be an absolute path",
        ),
        (vec!["--frobnicate".into()], "unknown option '--frobnicate'"),
        (
            vec!["--root".into(), missing.display().to_string()],
            "is not a directory",
        ),
        (vec!["--prefix".into()], "--prefix needs a value"),
        (
            vec!["--docs".into(), missing.display().to_string()],
            "--docs",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = install(root, &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("install.sh: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
    let left: Vec<_> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("ringbag.sh")],
        "a refused install wrote files"
    );
}
