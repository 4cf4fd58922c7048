//! A real Prometheus (and node_exporter's textfile collector) watching a recording: what an
//! operator's fleet sees. Prometheus scrapes `record --metrics-listen` directly (job
//! `ringbag`) and node_exporter reads `--metrics-textfile` (job `node`); the test asks
//! Prometheus's HTTP API. Both run on loopback only, with their state in a temp dir.
//!
//! Skipped with a message where `prometheus` or `prometheus-node-exporter` is not installed,
//! unless RINGBAG_PROMETHEUS_REQUIRED is set (CI installs them; then a missing one fails).

use crate::common::SpawnExecd;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::wait_for;

/// A port free a moment ago (the servers under test take a port from their command line).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn installed(bin: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A child killed when dropped.
struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Server {
    let f = std::fs::File::create(log).unwrap();
    Server(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::from(f))
            .spawn_execd()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}")),
    )
}

/// GET `path` from `addr`: the body of a 200, else None.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then_some(())?;
    head.split(' ').nth(1).filter(|c| *c == "200")?;
    Some(body.to_string())
}

fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's single value, if the result has exactly one sample.
fn query(prom: SocketAddr, q: &str) -> Option<f64> {
    let body = get(prom, &format!("/api/v1/query?query={}", urlencode(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

/// Names of the alerts firing now.
fn firing(prom: SocketAddr) -> Vec<String> {
    let Some(body) = get(prom, "/api/v1/alerts") else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| x["state"] == "firing")
                .filter_map(|x| x["labels"]["alertname"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The shipped rules with every `for:` at 0s: their expressions are what is checked live
/// (the waits are `promtool test rules`' job, tests/it/alert_rules.rs).
fn rules_without_waits(dir: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/ringbag.rules.yml");
    let text = std::fs::read_to_string(&shipped).unwrap();
    let re = regex::Regex::new(r"(?m)^(\s*)for:.*$").unwrap();
    let path = dir.join("rules.yml");
    std::fs::write(&path, re.replace_all(&text, "${1}for: 0s").as_bytes()).unwrap();
    path
}

#[test]
fn prometheus_scrapes_the_endpoint_and_node_exporter_the_textfile_and_a_stopped_recorder_fires_its_alert(
) {
    if !installed("prometheus") || !installed("prometheus-node-exporter") {
        assert!(
            std::env::var_os("RINGBAG_PROMETHEUS_REQUIRED").is_none(),
            "prometheus or prometheus-node-exporter missing, and RINGBAG_PROMETHEUS_REQUIRED is set"
        );
        eprintln!("prometheus or prometheus-node-exporter not installed: skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let textdir = tmp.path().join("textfile_collector");
    std::fs::create_dir_all(&textdir).unwrap();
    let bag = tmp.path().join("bag");
    let (metrics_port, node_port, prom_port) = (free_port(), free_port(), free_port());
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    // The robot mix in real time with a 1 MiB queue: camera frames and clouds never fit it, so
    // they are dropped (queue full) however fast this machine is; IMU and tf are recorded.
    let mut rec = crate::common::ringbag()
        .args([
            "record",
            "--source",
            "synthetic",
            "--synthetic-profile",
            "robot",
            "--max-cache-size",
            "1MiB",
            "-o",
            bag.to_str().unwrap(),
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
            "--metrics-textfile",
            textdir.join("ringbag.prom").to_str().unwrap(),
            "--metrics-interval",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .unwrap();
    let _node = spawn(
        Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{node_port}"))
            .arg("--collector.disable-defaults")
            .arg("--collector.textfile")
            .arg(format!(
                "--collector.textfile.directory={}",
                textdir.display()
            )),
        &tmp.path().join("node.log"),
    );
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  \
             - job_name: ringbag\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n  \
             - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{node_port}']\n",
            rules_without_waits(tmp.path()).display()
        ),
    )
    .unwrap();
    let prom_log = tmp.path().join("prometheus.log");
    let _prometheus = spawn(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--web.enable-lifecycle"),
        &prom_log,
    );
    let log = || std::fs::read_to_string(&prom_log).unwrap_or_default();
    // Both ways in, live.
    for job in ["ringbag", "node"] {
        assert!(
            wait_for(Duration::from_secs(60), || query(
                prom,
                &format!("ringbag_recording{{job=\"{job}\"}}")
            ) == Some(1.0)),
            "job {job}: no ringbag_recording 1 in Prometheus: {}",
            log()
        );
    }
    // The forced drops show in the counter.
    assert!(
        wait_for(Duration::from_secs(30), || query(
            prom,
            "sum(ringbag_messages_dropped_total{job=\"ringbag\",cause=\"queue_full\"})"
        )
        .is_some_and(|v| v > 0.0)),
        "no queue_full drops in Prometheus"
    );
    assert!(
        !firing(prom).contains(&"RingbagNotRecording".to_string()),
        "not recording fired while recording: {:?}",
        firing(prom)
    );
    kill(Pid::from_raw(rec.id() as i32), Signal::SIGINT).unwrap();
    let out = {
        let st = rec.wait().unwrap();
        let mut err = String::new();
        rec.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (st, err)
    };
    assert_eq!(out.0.code(), Some(0), "{}", out.1);
    let count = ringbag::bag::reader::Bag::open(&bag)
        .expect("bag opens")
        .metadata
        .message_count as f64;
    assert!(count > 0.0);
    // The last textfile (written at the clean stop) reaches Prometheus: the messages written
    // summed over the topics are the bag's.
    assert!(
        wait_for(Duration::from_secs(30), || query(
            prom,
            "sum(ringbag_messages_written_total{job=\"node\"})"
        ) == Some(count)
            && query(prom, "ringbag_up{job=\"node\"}") == Some(0.0)),
        "Prometheus has {:?} written (and ringbag_up {:?}), the bag {count}",
        query(prom, "sum(ringbag_messages_written_total{job=\"node\"})"),
        query(prom, "ringbag_up{job=\"node\"}"),
    );
    // And the stopped recorder fires the alert, live.
    assert!(
        wait_for(Duration::from_secs(30), || firing(prom)
            .contains(&"RingbagNotRecording".to_string())),
        "RingbagNotRecording did not fire: {:?}; {}",
        firing(prom),
        log()
    );
}
