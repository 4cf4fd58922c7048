//! Live recordings under attack from their neighbours: `reindex` loops and `record --recover`
//! loops run against recordings in the same root, at several split sizes and presets. The
//! recorders must never fail, every `reindex` of a live bag must be refused in one line, and
//! every bag must read afterwards with no stray salvage or damaged files.
//!
//! Bounded: the attack runs for `RINGBAG_RACE_SECS` (default 12) seconds.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringbag::bag::reader::{Bag, ReadFilter};

use crate::common::{ringbag, stderr};

fn committed(status: &Path) -> u64 {
    crate::common::status_committed(status).unwrap_or(0)
}

fn read_all(bag: &Path) -> u64 {
    let b = Bag::open(bag).unwrap_or_else(|e| panic!("{}: open: {e}", bag.display()));
    let mut n = 0;
    for m in b.messages(&ReadFilter::default()).expect("messages") {
        m.unwrap_or_else(|e| panic!("{}: read: {e}", bag.display()));
        n += 1;
    }
    assert_eq!(n, b.metadata.message_count, "{}", bag.display());
    n
}

struct Live {
    bag: PathBuf,
    status: PathBuf,
    child: Child,
    what: String,
}

#[test]
fn reindex_and_recover_loops_never_disturb_live_recordings() {
    let secs: u64 = std::env::var("RINGBAG_RACE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().to_path_buf();
    // (name, preset, profile, rate, retention flags)
    let configs: [(&str, &str, &str, &str, &[&str]); 3] = [
        (
            "wo86k",
            "write-optimized",
            "small",
            "max",
            &["-b", "86016", "--max-record-size", "344064"],
        ),
        (
            "none86k",
            "none",
            "small",
            "max",
            &["-b", "86016", "--max-bag-files", "3"],
        ),
        (
            "res20m",
            "resilient",
            "medium",
            "realtime",
            &["-b", "20MiB", "--max-record-size", "60MiB"],
        ),
    ];
    let mut live = Vec::new();
    for (name, preset, profile, rate, flags) in configs {
        let bag = root.join(name);
        let status = root.join(format!("{name}.status"));
        // The live recorders start with --recover too: they race each other at start.
        let child = ringbag()
            .args([
                "record",
                "--source",
                "synthetic",
                "--synthetic-profile",
                profile,
            ])
            .args(["--synthetic-rate", rate, "--storage-preset-profile", preset])
            .args(["--clock", "system", "--log-level", "warn", "--recover"])
            .args(flags)
            .arg("--status-file")
            .arg(&status)
            .arg("-o")
            .arg(&bag)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn_execd()
            .expect("spawn recorder");
        live.push(Live {
            bag,
            status,
            child,
            what: format!("{preset} {profile} {}", flags.join(" ")),
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for l in &live {
        while committed(&l.status) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(committed(&l.status) > 0, "{}: recording started", l.what);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let reindexes = Arc::new(AtomicU64::new(0));
    let recoveries = Arc::new(AtomicU64::new(0));
    let bags: Vec<PathBuf> = live.iter().map(|l| l.bag.clone()).collect();
    let mut threads = Vec::new();
    // Two reindex loops (real and dry run) over every live bag.
    for dry in [false, true] {
        let (stop, failures, reindexes, bags) = (
            stop.clone(),
            failures.clone(),
            reindexes.clone(),
            bags.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let bag = &bags[i % bags.len()];
                i += 1;
                let mut c = ringbag();
                c.arg("reindex").arg(bag);
                if dry {
                    c.arg("--dry-run");
                }
                let out = c.run_output().expect("reindex runs");
                let want = format!(
                    "ringbag: error: {}: another ringbag process is writing this bag (its lock is held); left alone\n",
                    bag.display()
                );
                if out.status.code() != Some(2) || stderr(&out) != want {
                    failures.lock().expect("failures").push(format!(
                        "reindex{} {}: exit {:?}: {}",
                        if dry { " --dry-run" } else { "" },
                        bag.display(),
                        out.status.code(),
                        stderr(&out)
                    ));
                }
                reindexes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Two `record --recover` loops: short recordings with retention over the same root.
    for loop_id in 0..2 {
        let (stop, failures, recoveries, root) = (
            stop.clone(),
            failures.clone(),
            recoveries.clone(),
            root.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let out_dir = root.join(format!("short{loop_id}_{n}"));
                n += 1;
                let out = ringbag()
                    .args([
                        "record",
                        "--source",
                        "synthetic",
                        "--synthetic-profile",
                        "small",
                    ])
                    .args(["--synthetic-rate", "max", "--synthetic-count", "3000"])
                    .args(["--clock", "system", "--log-level", "warn", "--recover"])
                    .args(["-b", "86016", "--max-record-size", "344064"])
                    .arg("-o")
                    .arg(&out_dir)
                    .run_output()
                    .expect("record runs");
                if out.status.code() != Some(0) {
                    failures.lock().expect("failures").push(format!(
                        "record --recover -o {}: exit {:?}: {}",
                        out_dir.display(),
                        out.status.code(),
                        stderr(&out)
                    ));
                }
                recoveries.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        // A recorder that dies ends the attack early; it is reported below.
        if live
            .iter_mut()
            .any(|l| matches!(l.child.try_wait(), Ok(Some(_))))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("attack thread");
    }
    let mut outcomes = Vec::new();
    for mut l in live {
        let alive = matches!(l.child.try_wait(), Ok(None));
        if alive {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(l.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .expect("SIGTERM");
        }
        let out = l.child.wait_with_output().expect("recorder output");
        outcomes.push((l.what, l.bag, alive, out));
    }
    let failures = failures.lock().expect("failures").clone();
    assert!(failures.is_empty(), "{failures:#?}");
    for (what, bag, alive, out) in &outcomes {
        assert!(
            *alive && out.status.code() == Some(0),
            "{what}: the recorder failed (alive until the end: {alive}, exit {:?}): {}",
            out.status.code(),
            stderr(out)
        );
        assert!(read_all(bag) > 0, "{what}: bag reads");
    }
    let (reindexes, recoveries) = (
        reindexes.load(Ordering::Relaxed),
        recoveries.load(Ordering::Relaxed),
    );
    eprintln!("race: {reindexes} reindex runs and {recoveries} record --recover runs in {secs} s");
    assert!(
        reindexes >= 10 && recoveries >= 2,
        "too few attacks to mean anything"
    );
    // Nothing stray anywhere: no salvage, no damaged copies, no temp files, no marker.
    for e in fs::read_dir(&root).expect("root").flatten() {
        let p = e.path();
        if !p.is_dir() {
            continue;
        }
        for f in fs::read_dir(&p).expect("bag").flatten() {
            let n = f.file_name().to_string_lossy().into_owned();
            assert!(
                !n.ends_with(".tmp") && !n.ends_with(".damaged") && n != ".ringbag.lock",
                "{}: stray {n}",
                p.display()
            );
        }
        if ringbag::bag::reader::find_split_files(&p).is_ok_and(|f| !f.is_empty()) {
            read_all(&p);
        }
    }
}
