//! A recording whose bag directory or recording root is deleted under it: the data would go
//! into unlinked files while every commit succeeds and the status looks healthy. The writer
//! notices within a second, says so (log, exit line, STATUS=) and stops with exit 1.

use crate::common::SpawnExecd;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::ringbag;

/// How long noticing may take: the writer checks every 250 ms; the rest is slack for a busy
/// machine (the suite also runs under qemu).
const NOTICE_WITHIN: Duration = Duration::from_millis(1500);

/// stderr lines with the moment each arrived, read on a thread so the child never blocks.
struct Lines(
    Arc<Mutex<Vec<(Instant, String)>>>,
    std::thread::JoinHandle<()>,
);

fn read_lines(child: &mut Child) -> Lines {
    let err = child.stderr.take().expect("piped stderr");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    let h = std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            l2.lock().unwrap().push((Instant::now(), line));
        }
    });
    Lines(lines, h)
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

fn first_split(bag: &Path) -> std::path::PathBuf {
    let name = bag.file_name().unwrap().to_string_lossy().into_owned();
    bag.join(format!("{name}_0.db3"))
}

/// Record into `root/bag`, delete `victim` once the first batch is committed, and check the
/// recorder notices in time, says what happened and exits 1.
fn record_then_delete(victim_is_root: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let bag = root.join("bag");
    let status = tmp.path().join("status.json");
    let mut child = ringbag()
        .args(["record", "--source", "synthetic", "--clock", "system"])
        .args(["--synthetic-profile", "small", "--log-level", "info"])
        .arg("-o")
        .arg(&bag)
        .arg("--status-file")
        .arg(&status)
        .env_remove("RINGBAG_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn_execd()
        .expect("record starts");
    let lines = read_lines(&mut child);
    assert!(
        wait_until(Duration::from_secs(20), || crate::common::status_committed(
            &status
        )
        .is_some_and(|n| n > 0)),
        "nothing committed"
    );
    assert!(first_split(&bag).is_file());
    let victim = if victim_is_root { &root } else { &bag };
    std::fs::remove_dir_all(victim).expect("delete");
    let deleted_at = Instant::now();
    let noticed = wait_until(Duration::from_secs(10), || {
        lines
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|(_, l)| l.contains("deleted"))
    });
    let st = crate::common::wait_deadline(child, 20).expect("record exits");
    lines.1.join().unwrap();
    let all = lines.0.lock().unwrap().clone();
    let text: Vec<&str> = all.iter().map(|(_, l)| l.as_str()).collect();
    let text = text.join("\n");
    assert!(noticed, "the deletion was never reported: {text}");
    let at = all
        .iter()
        .find(|(_, l)| l.contains("deleted"))
        .map(|(t, _)| t.duration_since(deleted_at))
        .unwrap();
    eprintln!("deletion noticed after {:.0} ms", at.as_secs_f64() * 1e3);
    assert!(at < NOTICE_WITHIN, "noticed only after {at:?}: {text}");
    assert_eq!(st.status.code(), Some(1), "{text}");
    let last = text.lines().last().unwrap_or_default();
    let what = if victim_is_root {
        format!(
            "the bag directory was deleted with its recording root {}",
            root.display()
        )
    } else {
        "the bag directory was deleted".to_string()
    };
    assert!(
        last.starts_with(&format!(
            "ringbag: error: {}: {what} while recording",
            bag.display()
        )),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}

#[test]
fn deleting_the_bag_directory_under_record_stops_it_within_a_second_with_exit_1() {
    record_then_delete(false);
}

#[test]
fn deleting_the_recording_root_under_record_stops_it_within_a_second_with_exit_1() {
    record_then_delete(true);
}
