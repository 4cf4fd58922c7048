//! `scripts/docs-check.py` (the `docs` stage) on altered copies of the README and docs/: it passes on
//! the docs as they are, and each kind of rot it exists for fails it with one line naming it.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::{stderr, stdout, RunOutput};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn docs_check(root: &Path) -> Output {
    Command::new("python3")
        .arg(repo().join("scripts/docs-check.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_ringbag")])
        .arg("--root")
        .arg(root)
        .run_output()
        .expect("python3 runs docs-check.py")
}

/// A tree holding copies of the repository's README.md and docs/ (every Markdown file passed
/// through `edit` with its path relative to the root), and links to the rest of the repository's
/// top level (the files the docs link to).
fn tree(edit: impl Fn(&str, String) -> String) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path, rel: &str, edit: &dyn Fn(&str, String) -> String) {
        if from.is_dir() {
            fs::create_dir(to).unwrap();
            for e in fs::read_dir(from).unwrap() {
                let name = e.unwrap().file_name();
                let name = name.to_str().unwrap();
                copy(
                    &from.join(name),
                    &to.join(name),
                    &format!("{rel}/{name}"),
                    edit,
                );
            }
        } else if rel.ends_with(".md") {
            fs::write(to, edit(rel, fs::read_to_string(from).unwrap())).unwrap();
        } else {
            fs::copy(from, to).unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for e in fs::read_dir(repo()).unwrap() {
        let name = e.unwrap().file_name();
        let name = name.to_str().unwrap();
        match name {
            "README.md" | "docs" => copy(&repo().join(name), &dir.path().join(name), name, &edit),
            "target" => {}
            _ => std::os::unix::fs::symlink(repo().join(name), dir.path().join(name)).unwrap(),
        }
    }
    dir
}

/// The ok line for the repository's docs, plus `extra` (a path under the root).
fn ok_line(extra: &[&str]) -> String {
    let mut files: Vec<String> = ["README.md"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    let mut docs = vec![];
    let mut stack = vec![repo().join("docs")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                docs.push(
                    p.strip_prefix(repo())
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_string(),
                );
            }
        }
    }
    files.extend(docs);
    // docs-check.py lists README.md, then docs/**/*.md sorted as paths.
    files[1..].sort_by_key(|f| std::path::PathBuf::from(f));
    format!("docs-check: ok ({})\n", files.join(", "))
}

/// Exit 1 with exactly `want` as the report, and the count on stderr.
fn fails_with(o: &Output, want: &[&str]) {
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(o), stderr(o));
    let got: Vec<String> = stdout(o).lines().map(str::to_string).collect();
    assert_eq!(got, want, "stderr: {}", stderr(o));
    assert_eq!(
        stderr(o),
        format!("docs-check: {} problem(s)\n", want.len())
    );
}

#[test]
fn docs_check_passes_on_the_docs_and_fails_on_each_kind_of_rot() {
    // The script is host tooling: it runs the binary itself, which under the aarch64 suite's
    // runner is not a program of this machine.
    if std::env::var("RINGBAG_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty()) {
        eprintln!("skipped under RINGBAG_TEST_RUNNER: docs-check runs the host's binary");
        return;
    }
    assert!(
        Command::new("man").arg("--version").run_output().is_ok(),
        "man is missing: scripts/test.sh installs the Debian package `man-db`"
    );

    let ok = tree(|_, r| r);
    let o = docs_check(ok.path());
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), ok_line(&[]));
    // The manual is in docs/: the README alone, with its links into docs/, is the front door.
    assert!(stdout(&o).contains(", docs/record.md, "), "{}", stdout(&o));

    // A flag the docs no longer name; then named again, in a new file of docs/.
    let undocumented = tree(|_, r| r.replace("--output-options", "--output-opts"));
    fails_with(
        &docs_check(undocumented.path()),
        &["docs-check: ringbag convert: --output-options is in --help but not in README.md or docs/*.md"],
    );
    fs::write(
        undocumented.path().join("docs/convert-options.md"),
        "# convert\n\n`-o`/`--output-options FILE`: the options YAML. Back to [the config](service.md#config).\n",
    )
    .unwrap();
    let o = docs_check(undocumented.path());
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), ok_line(&["docs/convert-options.md"]));

    // A config key whose documented default is not the one ringbag.toml(5) gives.
    let wrong_default = tree(|_, r| {
        r.replace(
            "| `ptp_poll_interval` | `1000` |",
            "| `ptp_poll_interval` | `500` |",
        )
    });
    fails_with(
        &docs_check(wrong_default.path()),
        &["docs-check: ringbag.toml: key `ptp_poll_interval`: no table row naming it gives its default `1000`"],
    );

    // Links and images to nothing, and an anchor no heading makes; a web link is not followed.
    let lines = fs::read_to_string(repo().join("README.md"))
        .unwrap()
        .lines()
        .count();
    let broken = tree(|path, r| {
        if path != "README.md" {
            return r;
        }
        format!(
            "{r}See [the manual](docs/manual.md), ![a plot](docs/img/plot.png), \
             [nowhere](#no-such-heading), [the licence](LICENSE), [web](https://example.invalid/x).\n"
        )
    });
    let n = lines + 1;
    fails_with(
        &docs_check(broken.path()),
        &[
            &format!("docs-check: README.md:{n}: link to docs/manual.md: docs/manual.md does not exist"),
            &format!("docs-check: README.md:{n}: link to docs/img/plot.png: docs/img/plot.png does not exist"),
            &format!("docs-check: README.md:{n}: link to #no-such-heading: no heading makes #no-such-heading"),
        ],
    );
}
