//! `ringbag gen-docs --out DIR` (hidden): the man pages and shell completions, generated from
//! the clap definitions and the config's key table, so they say what this binary does. The
//! packaging scripts (scripts/install.sh, scripts/build-release.sh, the Yocto recipe) run it
//! after the build (a target binary under qemu-user) rather than in a build.rs, so a cross
//! build itself runs nothing of the target's.
//!
//! Layout under DIR, as the installers copy it:
//! `man1/ringbag.1`, `man1/ringbag-<command>.1`, `man5/ringbag.toml.5`,
//! `completions/ringbag.bash`, `completions/_ringbag` (zsh), `completions/ringbag.fish`.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, roman, Roff};

use super::args::Cli;
use crate::config::keys::{KeyDoc, KEYS};

/// Write every page and completion under `out` (created if missing).
pub fn write_all(out: &Path) -> io::Result<()> {
    let man1 = out.join("man1");
    let man5 = out.join("man5");
    let completions = out.join("completions");
    for d in [&man1, &man5, &completions] {
        fs::create_dir_all(d).map_err(|e| at(d, e))?;
    }
    write_man1(&man1)?;
    write_file(&man5.join("ringbag.toml.5"), &ascii_roff(&config_page()))?;
    for (shell, name) in [
        (Shell::Bash, "ringbag.bash"),
        (Shell::Zsh, "_ringbag"),
        (Shell::Fish, "ringbag.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut docs_command(), "ringbag", &mut text);
        write_file(&completions.join(name), &text)?;
    }
    Ok(())
}

/// `ringbag.1` and a `ringbag-<command>.1` per subcommand of [`docs_command`], as
/// `clap_mangen::generate_to` names them, each through [`ascii_roff`].
fn write_man1(dir: &Path) -> io::Result<()> {
    let mut cmd = docs_command().disable_help_subcommand(true);
    // Built, so that each subcommand knows its display name (`ringbag-record`).
    cmd.build();
    let mut pages = vec![cmd.clone()];
    pages.extend(cmd.get_subcommands().cloned());
    for page in pages {
        let man = clap_mangen::Man::new(page);
        let mut text = Vec::new();
        man.render(&mut text)?;
        write_file(&dir.join(man.get_filename()), &ascii_roff(&text))?;
    }
    Ok(())
}

/// Every non-ASCII character as groff's `\[uXXXX]`: the help texts say `−` and `µ`, which
/// `groff -ww` warns about unless the page goes through preconv first (man does that, a
/// bare `groff -man` or another formatter does not).
fn ascii_roff(text: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", u32::from(c)));
        }
    }
    out.into_bytes()
}

/// The command as the pages and completions show it: without its hidden subcommands
/// (clap_complete would offer them; clap has no way to remove one, so the command is rebuilt
/// from its parts), and with the plain version (the long one names the build host's commit
/// and target, which a page shipped for another target should not claim).
fn docs_command() -> clap::Command {
    let cli = Cli::command();
    let mut cmd = clap::Command::new("ringbag")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(cli.is_subcommand_required_set())
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = cli.get_about() {
        cmd = cmd.about(about.clone());
    }
    cmd
}

/// `e` with the path it is about, for the one-line error.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::File::create(path).map_err(|e| at(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.flush())
        .map_err(|e| at(path, e))
}

/// `ringbag.toml(5)` from [`KEYS`].
fn config_page() -> Vec<u8> {
    let mut page = Roff::new();
    page.control(
        "TH",
        [
            "RINGBAG.TOML",
            "5",
            "",
            concat!("ringbag ", env!("CARGO_PKG_VERSION")),
        ],
    )
    .control("SH", ["NAME"])
    .text([roman("ringbag.toml - configuration of the ringbag recording service")])
    .control("SH", ["SYNOPSIS"])
    .text([italic("/etc/ringbag/ringbag.toml")])
    .control("SH", ["DESCRIPTION"])
    .text([
        bold("ringbag daemon"),
        roman(
            " reads this TOML file at start and again on SIGHUP. Keys are the long option names of ",
        ),
        bold("ringbag record"),
        roman(
            " with underscores for dashes, with the same units (sizes: bytes or KiB, MiB, GiB, \
             KB, MB, GB; durations: seconds or s, m, h, d). Unknown keys are errors. ",
        ),
        bold("ringbag daemon --config FILE --check-config"),
        roman(" checks a file and exits 0, or 2 with one line naming the place, the key and the problem."),
    ]);
    section(&mut page, "KEYS", KEYS.iter().filter(|k| k.table.is_none()));
    section(
        &mut page,
        "THE [upload] TABLE",
        KEYS.iter().filter(|k| k.table == Some("upload")),
    );
    page.text([roman(
        "Credentials are never in this file: they come from $CREDENTIALS_DIRECTORY/s3, \
         credentials_file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    )])
    .control("SH", ["SEE ALSO"])
    .text([
        bold("ringbag"),
        roman("(1), "),
        bold("ringbag-daemon"),
        roman("(1), "),
        bold("ringbag-record"),
        roman("(1)"),
    ]);
    page.render().into_bytes()
}

fn section<'a>(page: &mut Roff, title: &str, keys: impl Iterator<Item = &'a KeyDoc>) {
    page.control("SH", [title]);
    for k in keys {
        page.control("TP", [] as [&str; 0])
            .text([
                bold(k.key),
                roman(" (default: "),
                italic(k.default),
                roman(")"),
            ])
            .text([roman(k.meaning)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_page_per_visible_command_and_three_completions() {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path()).unwrap();
        let mut pages: Vec<String> = fs::read_dir(dir.path().join("man1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        pages.sort();
        let mut want: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| format!("ringbag-{}.1", c.get_name()))
            .chain(["ringbag.1".to_string()])
            .collect();
        want.sort();
        assert_eq!(pages, want);
        assert!(!pages.iter().any(|p| p.contains("gen-docs")));
        // Written again over itself: the same bytes (the packaging scripts compare them).
        let again = tempfile::tempdir().unwrap();
        write_all(again.path()).unwrap();
        for p in &pages {
            let a = fs::read(dir.path().join("man1").join(p)).unwrap();
            assert_eq!(
                a,
                fs::read(again.path().join("man1").join(p)).unwrap(),
                "{p}"
            );
        }
        let record = fs::read_to_string(dir.path().join("man1/ringbag-record.1")).unwrap();
        assert!(record.contains("max\\-bag\\-size"), "{record}");
        assert!(record.is_ascii());
        let toml = fs::read_to_string(dir.path().join("man5/ringbag.toml.5")).unwrap();
        for k in KEYS {
            assert!(toml.contains(k.key), "{}", k.key);
        }
        for c in ["ringbag.bash", "_ringbag", "ringbag.fish"] {
            let text = fs::read_to_string(dir.path().join("completions").join(c)).unwrap();
            assert!(text.contains("max-bag-size"), "{c}");
            assert!(!text.contains("gen-docs"), "{c}");
        }
    }

    #[test]
    fn an_output_that_cannot_be_made_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        fs::write(&file, "").unwrap();
        let e = write_all(&file).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}/man1: ", file.display())), "{e}");
    }
}
