//! Prometheus metrics (issue 25): the daemon's textfile for node_exporter's textfile
//! collector, checked by `promtool check metrics` where Prometheus is installed, and the
//! metrics keys' `--check-config` errors.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{run, stderr, wait_for};

/// `promtool check metrics` on `text`: None when promtool is not installed (and
/// RINGBAG_PROMTOOL_REQUIRED is not set: then its absence fails the test).
fn promtool_check(text: &str) -> Option<(bool, String)> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("RINGBAG_PROMTOOL_REQUIRED").is_none(),
                "promtool: {e}, and RINGBAG_PROMTOOL_REQUIRED is set"
            );
            eprintln!("promtool not installed: `promtool check metrics` skipped");
            return None;
        }
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    Some((
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    ))
}

/// The value of the sample named exactly `name` (with its labels), if present.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Sum over every sample of family `family`.
fn family_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(family))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn status_time(text: &str) -> Option<f64> {
    sample(text, "ringbag_status_time_seconds")
}

#[test]
fn the_daemon_rewrites_the_textfile_each_interval_and_its_last_one_says_down_and_counts_the_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let collector = tmp.path().join("textfile_collector");
    std::fs::create_dir_all(&collector).unwrap();
    let prom = collector.join("ringbag.prom");
    let config = tmp.path().join("ringbag.toml");
    std::fs::write(
        &config,
        crate::common::small_daemon_config(
            &root,
            &status,
            &format!(
                "metrics_textfile = \"{}\"\nmetrics_interval = \"1s\"\n",
                prom.display()
            ),
        ),
    )
    .unwrap();
    let mut child = crate::common::ringbag()
        .args(["daemon", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&prom).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(20), || read()
            .contains("ringbag_up 1\n")),
        "no textfile with ringbag_up 1"
    );
    let first = read();
    assert!(first.contains("# TYPE ringbag_messages_written_total counter\n"));
    let bag_line = first
        .lines()
        .find(|l| l.starts_with("ringbag_recording{bag="))
        .expect("ringbag_recording")
        .to_string();
    assert!(bag_line.ends_with("} 1"), "{bag_line}");
    // Rewritten every interval: a later file carries a later status time.
    let t0 = status_time(&first).expect("status time");
    assert!(
        wait_for(Duration::from_secs(10), || status_time(&read())
            .is_some_and(|t| t > t0)),
        "the textfile was not rewritten within 10 s"
    );
    if let Some((ok, out)) = promtool_check(&read()) {
        assert!(ok, "promtool check metrics: {out}");
    }
    // Only the one file is there: the temporary file is never left for the collector.
    assert_eq!(std::fs::read_dir(&collector).unwrap().count(), 1);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = {
        let st = child.wait().unwrap();
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (st, err)
    };
    assert_eq!(out.0.code(), Some(0), "{}", out.1);
    let last = read();
    assert!(last.contains("ringbag_up 0\n"), "{last}");
    assert!(last.contains(&bag_line.replace("} 1", "} 0")), "{last}");
    if let Some((ok, out)) = promtool_check(&last) {
        assert!(ok, "promtool check metrics: {out}");
    }
    // After a clean stop, the messages written are the bag's.
    let bags = crate::common::bag_dirs(&root);
    assert_eq!(bags.len(), 1);
    let bag = ringbag::bag::reader::Bag::open(&bags[0]).expect("bag opens");
    assert!(bag.metadata.message_count > 0);
    assert_eq!(
        family_sum(&last, "ringbag_messages_written_total"),
        bag.metadata.message_count as f64,
        "{last}"
    );
}

#[test]
fn check_config_names_the_metrics_key_and_its_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let head = format!(
        "output_root = \"{}\"\nsource = \"synthetic\"\n",
        root.display()
    );
    let prom_dir = tmp.path().join("tc");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let cases = [
        (
            format!("{head}metrics_textfile = \"{}/ringbag.txt\"\n", prom_dir.display()),
            format!(
                "3:20: metrics_textfile: {}/ringbag.txt: must end in .prom (node_exporter's textfile collector reads only *.prom files)",
                prom_dir.display()
            ),
        ),
        (
            format!("{head}metrics_textfile = \"ringbag.prom\"\n"),
            "3:20: metrics_textfile: ringbag.prom: must be an absolute path".to_string(),
        ),
        (
            format!("{head}metrics_textfile = \"{}\"\n", prom_dir.display()),
            format!(
                "3:20: metrics_textfile: {}: exists and is a directory; the status file needs a file name",
                prom_dir.display()
            ),
        ),
        (
            format!("{head}metrics_interval = \"0s\"\n"),
            "3:20: metrics_interval: must be from 1 s to 1 h".to_string(),
        ),
        (
            format!("{head}metrics_interval = \"soon\"\n"),
            "3:20: metrics_interval: ".to_string(),
        ),
        (
            format!("{head}metrics_listen = \"localhost:9466\"\n"),
            "3:18: metrics_listen: \"localhost:9466\" is not an address and port like \"127.0.0.1:9466\" or \"[::1]:9466\"".to_string(),
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = tmp.path().join(format!("m{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = run(&[
            "daemon",
            "--config",
            path.to_str().unwrap(),
            "--check-config",
        ]);
        assert_eq!(o.status.code(), Some(2), "{text}: {}", stderr(&o));
        let got = stderr(&o);
        let prefix = format!("ringbag: error: {}:{want}", path.display());
        assert!(
            got.starts_with(&prefix) && got.lines().count() == 1,
            "{text}\n got:  {got}\n want: {prefix}"
        );
    }
    assert!(!root.exists(), "a refused config created the root");
}

#[test]
fn the_shipped_config_has_the_node_exporter_textfile_path_commented_in() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/ringbag.toml"))
            .unwrap();
    assert!(
        text.lines().any(|l| l.trim_start().starts_with(
            "# metrics_textfile = \"/var/lib/node_exporter/textfile_collector/ringbag.prom\""
        )),
        "{text}"
    );
}

#[test]
fn record_metrics_textfile_counts_every_drop_and_every_written_message_at_the_end() {
    // Camera frames and clouds (MBs) never fit a 1 MiB queue: each is dropped as queue full,
    // whatever the machine's speed; IMU and tf go through.
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    let prom = tmp.path().join("r.prom");
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "robot",
        "--synthetic-count",
        "600",
        "--max-cache-size",
        "1MiB",
        "-o",
        bag.to_str().unwrap(),
        "--metrics-textfile",
        prom.to_str().unwrap(),
        "--metrics-interval",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(text.contains("ringbag_up 0\n"), "{text}");
    let dropped = sample(
        &text,
        "ringbag_messages_dropped_total{topic=\"/camera/front/image_raw\",cause=\"queue_full\"}",
    )
    .expect("camera drops");
    assert!(dropped > 0.0, "{text}");
    // The same totals as the summary on stderr and the bag.
    let summary = stderr(&o);
    let queue_full: f64 = summary
        .lines()
        .find_map(|l| {
            l.split("(queue full ")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .expect("summary's queue full count");
    let total_queue_full: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("ringbag_messages_dropped_total{") && l.contains("cause=\"queue_full\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total_queue_full, queue_full, "{text}\n{summary}");
    let b = ringbag::bag::reader::Bag::open(&bag).expect("bag opens");
    assert_eq!(
        family_sum(&text, "ringbag_messages_written_total"),
        b.metadata.message_count as f64
    );
    if let Some((ok, out)) = promtool_check(&text) {
        assert!(ok, "promtool check metrics: {out}");
    }
}

#[test]
fn record_refuses_bad_metrics_flags_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("bag");
    let o = o.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--metrics-textfile", "metrics.txt"],
            "ringbag: error: --metrics-textfile metrics.txt: must end in .prom (node_exporter's textfile collector reads only *.prom files)\n",
        ),
        (
            vec!["--metrics-interval", "0.5"],
            "ringbag: error: --metrics-interval 0.5: must be from 1 s to 1 h\n",
        ),
    ] {
        let mut a = vec!["record", "-o", o, "--source", "synthetic"];
        a.extend(args.iter());
        let out = run(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), want, "{a:?}");
    }
    assert!(!Path::new(o).exists());
}
