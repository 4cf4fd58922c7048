//! Prometheus metrics (issue 25): the daemon's textfile for node_exporter's textfile
//! collector, checked by `promtool check metrics` where Prometheus is installed, and the
//! metrics keys' `--check-config` errors.

use crate::common::SpawnExecd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{run, stderr, wait_for};

/// `promtool check metrics` on `text` (None: promtool not installed, see common::promtool).
fn promtool_check(text: &str) -> Option<(bool, String)> {
    crate::common::promtool(&["check", "metrics"], text)
}

#[test]
fn promtool_accepts_every_family_ringbag_writes() {
    let text = ringbag::metrics::render::render(
        &ringbag::metrics::render::sample_status(50),
        ringbag::metrics::render::State::Recording,
    );
    if let Some((ok, out)) = promtool_check(&text) {
        assert!(ok, "promtool check metrics: {out}\n{text}");
    }
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
        .spawn_execd()
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

/// `ringbag record` of a synthetic profile (`args`: the profile's flags) with
/// `--metrics-textfile` every second, to its end: (its output, the last textfile, the bag).
fn record_with_textfile(tmp: &Path, args: &[&str]) -> (std::process::Output, String, PathBuf) {
    let bag = tmp.join("bag");
    let prom = tmp.join("r.prom");
    let mut a = vec!["record", "--source", "synthetic"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", bag.to_str().unwrap(), "--metrics-textfile"]);
    a.extend_from_slice(&[prom.to_str().unwrap(), "--metrics-interval", "1"]);
    let o = run(&a);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(text.contains("ringbag_up 0\n"), "{text}");
    (o, text, bag)
}

#[test]
fn record_metrics_textfile_counts_every_drop_and_every_written_message_at_the_end() {
    // Camera frames and clouds (MBs) never fit a 1 MiB queue: each is dropped as queue full,
    // whatever the machine's speed; IMU and tf go through.
    let tmp = tempfile::tempdir().unwrap();
    let (o, text, bag) = record_with_textfile(
        tmp.path(),
        &[
            "--synthetic-profile",
            "robot",
            "--synthetic-count",
            "600",
            "--max-cache-size",
            "1MiB",
        ],
    );
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
    // And the bytes written per topic are the payloads the bag holds.
    let mut in_bag = std::collections::BTreeMap::<String, u64>::new();
    for m in b
        .messages(&ringbag::bag::reader::ReadFilter::default())
        .unwrap()
    {
        let m = m.unwrap();
        *in_bag.entry(b.topics[m.topic].name.clone()).or_default() += m.data.len() as u64;
    }
    assert!(!in_bag.is_empty());
    for (topic, bytes) in &in_bag {
        assert_eq!(
            sample(
                &text,
                &format!("ringbag_written_bytes_total{{topic=\"{topic}\"}}")
            ),
            Some(*bytes as f64),
            "{topic}: {text}"
        );
    }
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

/// A child whose stderr is read line by line as it comes (a full pipe would block it).
struct Logged {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Logged {
    fn spawn(args: &[&str]) -> Logged {
        let mut child = crate::common::ringbag()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn_execd()
            .unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let l = lines.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Logged {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The endpoint's address, from its start-up line.
    fn metrics_addr(&self) -> std::net::SocketAddr {
        let mut addr = None;
        assert!(
            wait_for(Duration::from_secs(30), || {
                addr = self.lines.lock().unwrap().iter().find_map(|l| {
                    l.split("serving GET /metrics on ")
                        .nth(1)?
                        .trim()
                        .parse()
                        .ok()
                });
                addr.is_some()
            }),
            "no endpoint line: {}",
            self.log()
        );
        addr.unwrap()
    }

    fn stop(mut self) -> (Option<i32>, String) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        let st = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (st.code(), self.log())
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GET /metrics: (status line, body, time from connect to the last byte).
fn scrape(addr: std::net::SocketAddr) -> (String, String, Duration) {
    try_scrape(addr).expect("a complete response")
}

/// [`scrape`], None when the endpoint is not there (or not yet).
fn try_scrape(addr: std::net::SocketAddr) -> Option<(String, String, Duration)> {
    use std::io::{Read, Write};
    let t0 = std::time::Instant::now();
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ringbag\r\n\r\n")
        .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let took = t0.elapsed();
    let text = String::from_utf8(out).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
        took,
    ))
}

#[test]
fn record_serves_metrics_that_promtool_accepts_and_hostile_clients_neither_block_a_scrape_nor_cost_a_message(
) {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    // 10 s of the small profile in real time: a recording that must lose nothing.
    let rec = Logged::spawn(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "-o",
        bag.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let addr = rec.metrics_addr();
    assert!(
        wait_for(Duration::from_secs(10), || try_scrape(addr)
            .is_some_and(|r| r.1.contains("ringbag_messages_written_total{"))),
        "no topic in the metrics: {}",
        rec.log()
    );
    let (status, body, _) = scrape(addr);
    assert_eq!(status, "HTTP/1.1 200 OK");
    if let Some((ok, out)) = promtool_check(&body) {
        assert!(ok, "promtool check metrics: {out}");
    }
    // The hostile clients: 200 connections that never send a byte, a 1 MB request, and one
    // that sends its request a byte at a time.
    let idle: Vec<_> = (0..200)
        .map(|_| std::net::TcpStream::connect(addr).expect("idle connect"))
        .collect();
    let mut big = std::net::TcpStream::connect(addr).unwrap();
    let big_writer = std::thread::spawn(move || {
        let mut req = b"GET /metrics HTTP/1.1\r\nX-Junk: ".to_vec();
        req.resize(1 << 20, b'a');
        // The server answers 431 and closes long before the end: the write then fails.
        let _ = big.write_all(&req);
    });
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    let _ = slow.write_all(b"GE");
    // Emulated (the aarch64 stage) everything runs ~10x slower; the bound scales with it.
    let limit = Duration::from_millis(100 * 100 / crate::common::stress_percent().max(1));
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let (status, body, took) = scrape(addr);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains("ringbag_up 1\n"));
        slowest = slowest.max(took);
    }
    eprintln!("slowest of 10 scrapes beside 202 hostile connections: {slowest:?}");
    assert!(slowest < limit, "a scrape took {slowest:?}");
    big_writer.join().unwrap();
    drop(idle);
    drop(slow);
    let (code, log) = rec.stop();
    assert_eq!(code, Some(0), "{log}");
    // Not one message lost to it.
    assert!(
        log.contains("dropped 0 (queue full 0, oversize 0, after the writer stopped 0)"),
        "{log}"
    );
    // And the endpoint is gone with the recorder.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn a_taken_metrics_port_is_one_line_and_exit_2_before_anything_is_recorded() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "-o",
        bag.to_str().unwrap(),
        "--metrics-listen",
        &addr,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.starts_with(&format!(
            "ringbag: error: metrics_listen {addr}: cannot bind: "
        )) && err.lines().count() == 1,
        "{err}"
    );
    assert!(!bag.exists());
}

#[test]
fn the_daemon_serves_its_metrics_and_a_reload_with_the_same_port_serves_them_again() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let config = tmp.path().join("ringbag.toml");
    // A fixed port, so that the reload must bind it again: the one a listener got from the
    // kernel a moment ago, free again.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        crate::common::small_daemon_config(
            &root,
            &status,
            &format!("metrics_listen = \"127.0.0.1:{port}\"\n"),
        ),
    )
    .unwrap();
    let d = Logged::spawn(&["daemon", "--config", config.to_str().unwrap()]);
    let addr = d.metrics_addr();
    assert_eq!(addr.port(), port);
    assert!(wait_for(Duration::from_secs(10), || try_scrape(addr)
        .is_some_and(|r| r.1.contains("ringbag_recording{bag="))));
    let first_bag = scrape(addr)
        .1
        .lines()
        .find(|l| l.starts_with("ringbag_recording{"))
        .unwrap()
        .to_string();
    // A reload that changes the interval restarts the endpoint on the same port.
    std::fs::write(
        &config,
        crate::common::small_daemon_config(
            &root,
            &status,
            &format!("metrics_listen = \"127.0.0.1:{port}\"\nmetrics_interval = 2\n"),
        ),
    )
    .unwrap();
    kill(Pid::from_raw(d.child.id() as i32), Signal::SIGHUP).unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || {
            let b = try_scrape(addr).map(|r| r.1).unwrap_or_default();
            b.lines()
                .any(|l| l.starts_with("ringbag_recording{") && l != first_bag)
        }),
        "the new bag is not served after the reload: {}",
        d.log()
    );
    assert!(!d.log().contains("cannot bind"), "{}", d.log());
    let (code, log) = d.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn record_metrics_textfile_has_the_batch_histogram_and_the_splits_retention_deleted() {
    // 20,000 small messages (~2 MB of payload) into 256 KiB splits under a 2 MiB budget:
    // retention deletes the oldest splits, and every batch lands in the histogram.
    let tmp = tempfile::tempdir().unwrap();
    let (o, text, _bag) = record_with_textfile(
        tmp.path(),
        &[
            "--synthetic-profile",
            "small",
            "--synthetic-rate",
            "max",
            "--synthetic-count",
            "20000",
            "-b",
            "256KiB",
            "--max-record-size",
            "2MiB",
        ],
    );
    assert!(
        text.contains("# TYPE ringbag_writer_batch_duration_seconds histogram\n"),
        "{text}"
    );
    // The cumulative buckets, in order: each bucket's increment over the one before is the
    // batches in it, and their sum (the +Inf bucket) is _count.
    let cumulative: Vec<(String, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ringbag_writer_batch_duration_seconds_bucket{le=\"")?;
            let (le, v) = rest.split_once("\"} ")?;
            Some((le.to_string(), v.parse().ok()?))
        })
        .collect();
    assert_eq!(cumulative.len(), 12, "{text}");
    assert_eq!(cumulative.last().unwrap().0, "+Inf");
    let mut before = 0.0;
    let mut increments = 0.0;
    for (le, v) in &cumulative {
        assert!(*v >= before, "bucket le={le} {v} below {before}:\n{text}");
        increments += v - before;
        before = *v;
    }
    let count = sample(&text, "ringbag_writer_batch_duration_seconds_count").expect("_count");
    assert!(count > 0.0, "{text}");
    assert_eq!(count, increments, "{text}");
    let sum = sample(&text, "ringbag_writer_batch_duration_seconds_sum").expect("_sum");
    assert!(sum > 0.0, "{text}");
    // The same deletions as the exit summary's "deleted by retention N".
    let summary = stderr(&o);
    let deleted: f64 = summary
        .lines()
        .find_map(|l| {
            l.split("deleted by retention ")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .expect("summary's deleted by retention");
    assert!(deleted > 0.0, "{summary}");
    assert_eq!(
        sample(&text, "ringbag_splits_deleted_total"),
        Some(deleted),
        "{text}\n{summary}"
    );
    // The writer's gauges are there and sane; the peak is at least the last value.
    let peak = sample(&text, "ringbag_queue_peak_bytes").expect("peak");
    let now = sample(&text, "ringbag_queue_bytes").expect("queue bytes");
    assert!(peak >= now && peak > 0.0, "{text}");
    let stall = sample(&text, "ringbag_writer_longest_stall_seconds").expect("stall");
    assert!(stall > 0.0 && stall <= sum, "{text}");
    assert!(
        sample(&text, "ringbag_fsync_longest_seconds").is_some(),
        "{text}"
    );
    if let Some((ok, out)) = promtool_check(&text) {
        assert!(ok, "promtool check metrics: {out}");
    }
}
