//! Recording end to end through the binary.

use crate::common::RunOutput;
use crate::common::SpawnExecd;
use ringbag::bag::reader::{Bag, ReadFilter};

use crate::common::{run, stderr};

#[test]
fn synthetic_robot_recording_gives_a_complete_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("robot");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "500",
        "--bag-format",
        "humble",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bag = Bag::open(&out).unwrap();
    assert_eq!(bag.metadata.message_count, 500);
    assert_eq!(bag.metadata.version, 5);
    let names: Vec<&str> = bag.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "/imu",
            "/tf",
            "/camera/front/image_raw",
            "/camera/rear/image_raw",
            "/points"
        ]
    );
    let n = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len();
    assert_eq!(n, 500);
    assert_eq!(
        bag.metadata.custom_data.len(),
        0,
        "humble metadata has no custom_data"
    );
}

#[test]
fn the_exit_summary_says_how_much_of_the_longest_stall_was_on_the_cpu() {
    // The writer line: the longest turn away from the queue, and the writer thread's CPU time
    // within that same turn, which a single thread cannot make longer than the turn itself.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b");
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "300",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("writer: longest stall "))
        .unwrap_or_else(|| panic!("no writer line in:\n{err}"));
    let ms_before = |marker: &str| -> f64 {
        let head = &line[..line
            .find(marker)
            .unwrap_or_else(|| panic!("{marker}: {line}"))];
        head.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let stall = ms_before(" ms, peak queue");
    let cpu = ms_before(" ms of the longest stall on the CPU");
    assert!(stall > 0.0, "{line}");
    // Both are printed to 0.1 ms.
    assert!((0.0..=stall + 0.1).contains(&cpu), "{line}");
}

/// Poll `cond` until it holds or `secs` pass; the deadline only bounds a hang.
fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

fn db3_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".db3"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// "accepted N messages" from the summary on stderr.
fn accepted(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("accepted "))
        .expect("summary line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn sigterm_mid_recording_finishes_a_complete_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("term");
    let child = crate::common::ringbag()
        .args([
            "record",
            "-o",
            out.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-rate",
            "realtime",
            "-b",
            "4MiB",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn_execd()
        .unwrap();
    // Wait until several splits' worth of data is on disk, then stop it as systemd would.
    assert!(
        wait_for(60, || db3_bytes(&out) > 12 << 20),
        "recording never got going"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let bag = Bag::open(&out).expect("metadata.yaml complete after SIGTERM");
    assert!(bag.splits.len() >= 3, "{} splits", bag.splits.len());
    let n = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len() as u64;
    assert_eq!(
        n, bag.metadata.message_count,
        "metadata agrees with the rows"
    );
    assert_eq!(
        n,
        accepted(&err),
        "every accepted message was written: {err}"
    );
    let per_file: u64 = bag.metadata.files.iter().map(|f| f.message_count).sum();
    assert_eq!(per_file, n);
}

#[test]
fn full_disk_stops_cleanly_with_one_error_and_a_readable_bag() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small-fs");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=48m",
            "tmpfs",
            mnt.to_str().unwrap(),
        ])
        .run_output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!(
            "SKIP: cannot mount a size-limited tmpfs here (needs root); full-disk test not run"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let out = mnt.join("bag");
    let start = std::time::Instant::now();
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--synthetic-profile",
        "large",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "200",
        // The full disk itself is the subject: without this the default free-space floor
        // (5 % of the partition) stops recording first (free_floor.rs tests that).
        "--min-free-space",
        "0",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "no retry loop"
    );
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ringbag: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("stopped before the disk filled") || errors[0].contains("disk is full"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // What was committed is intact and described.
    let bag = Bag::open(&out).expect("bag readable after a full disk");
    assert!(
        bag.metadata.message_count >= 10,
        "kept {} messages",
        bag.metadata.message_count
    );
    let n = bag
        .messages(&ReadFilter::default())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len() as u64;
    assert_eq!(n, bag.metadata.message_count);
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn record_max(out: &std::path::Path, profile: &str, count: &str, max_bag_size: &str) -> Bag {
    let o = run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--synthetic-profile",
        profile,
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        count,
        "-b",
        max_bag_size,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    Bag::open(out).unwrap()
}

#[test]
fn splits_stay_within_max_bag_size_and_hold_many_messages() {
    let tmp = tempfile::tempdir().unwrap();
    for (profile, count, max) in [("small", "3000", 86016u64), ("medium", "200", 1 << 20)] {
        let bag = record_max(&tmp.path().join(profile), profile, count, &max.to_string());
        let n: u64 = count.parse().unwrap();
        assert_eq!(bag.metadata.message_count, n);
        for s in &bag.splits {
            assert!(s.size_bytes <= max, "{} is {} > {max}", s.rel, s.size_bytes);
        }
        let per_split = n / bag.splits.len() as u64;
        assert!(
            per_split >= 10,
            "{profile}: only {per_split} messages per split"
        );
    }
}

#[test]
fn a_message_larger_than_the_split_size_gets_a_split_of_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = record_max(&tmp.path().join("large"), "large", "6", "86016");
    assert_eq!(bag.metadata.message_count, 6, "none lost");
    let counts: Vec<u64> = bag.metadata.files.iter().map(|f| f.message_count).collect();
    assert!(counts[..6].iter().all(|&c| c == 1), "{counts:?}");
}

/// Whether `pid` has a handler for SIGTERM (from /proc: `SigCgt` bit 14). `record` and
/// `play` install theirs right before their main loop.
fn sigterm_caught(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

/// What the main thread of `pid` waits in (kernel function name), e.g. `wait_for_partner`
/// while opening a FIFO nobody writes.
fn wchan(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

fn sigterm(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

#[test]
fn sigterm_ends_record_even_while_recovery_is_stuck_before_the_loop() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("old")).unwrap();
    // A FIFO where a split should be: opening it blocked `--recover` forever.
    nix::unistd::mkfifo(
        &root.join("old/old_0.db3"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let out = root.join("new");
    let child = crate::common::spawn(&[
        "record",
        "--recover",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "system",
        "--synthetic-rate",
        "realtime",
    ]);
    let pid = child.id();
    // Either stuck on the FIFO before the loop, or (once recovery skips FIFOs) recording.
    assert!(
        wait_for(30, || wchan(pid) == "wait_for_partner"
            || sigterm_caught(pid)),
        "ringbag neither blocked nor started recording"
    );
    sigterm(pid);
    let o = crate::common::wait_deadline(child, 10).expect("SIGTERM did not end ringbag");
    // A clean stop once the recording loop runs; before it, the default action. Which one
    // depends on how far it got (and under qemu-user /proc shows the emulator's signal
    // dispositions, not ringbag's), so either is right; hanging or another end is not.
    assert!(
        o.status.code() == Some(0) || o.status.signal() == Some(libc::SIGTERM),
        "{:?}: {}",
        o.status,
        stderr(&o)
    );
    if o.status.code() == Some(0) {
        assert!(
            out.join("metadata.yaml").is_file(),
            "a clean stop finishes the bag"
        );
    }
}

#[test]
fn sigterm_ends_play_during_a_long_gap_between_messages() {
    use ringbag::bag::writer::{BagWriter, WriterOptions};
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("gap");
    let mut w = BagWriter::create(&bag, WriterOptions::new(ringbag::bag::Flavour::Humble)).unwrap();
    let t = w
        .add_topic(crate::common::topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let data = crate::common::cdr_string("x");
    let t0 = 1_700_000_000_000_000_000i64;
    // One hour between the two messages: play sleeps through it at rate 1.
    w.write_batch([
        (t, t0, data.as_slice()),
        (t, t0 + 3_600_000_000_000, data.as_slice()),
    ])
    .unwrap();
    w.finish().unwrap();
    let child = crate::common::spawn(&["play", bag.to_str().unwrap(), "--sink", "echo"]);
    let pid = child.id();
    // In the loop (handler installed) and sleeping: the first message is out, the gap began.
    assert!(
        wait_for(30, || sigterm_caught(pid)
            && wchan(pid).contains("nanosleep")),
        "play never reached the gap (wchan {})",
        wchan(pid)
    );
    sigterm(pid);
    let o = crate::common::wait_deadline(child, 5).expect("SIGTERM did not end play in a gap");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "ringbag: played 1 messages\n");
    assert_eq!(crate::common::stdout(&o).lines().count(), 1);
}

#[test]
fn an_unwritable_status_file_warns_once_then_once_on_recovery_and_again_on_a_new_failure() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let status = dir.join("status.json");
    let out = tmp.path().join("bag");
    let mut child = crate::common::spawn(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "system",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "realtime",
        "--status-file",
        status.to_str().unwrap(),
    ]);
    let pid = child.id();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let count = |needle: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    let warning = format!(
        "ringbag: warn: status file {}: cannot write it",
        status.display()
    );
    let recovered = format!(
        "ringbag: info: status file {}: written again",
        status.display()
    );
    let committed = || crate::common::status_committed(&status);
    assert!(
        wait_for(30, || committed().is_some_and(|n| n > 0)),
        "no status written"
    );

    // Unwritable (its directory is gone) for about 1.5 s: ~15 failed writes, one warning.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(wait_for(30, || count(&warning) == 1), "no warning");
    let failing_since = std::time::Instant::now();
    while failing_since.elapsed() < std::time::Duration::from_millis(1500) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(count(&warning), 1, "{:?}", lines.lock().unwrap());

    // Writable again: written, and said once.
    std::fs::create_dir(&dir).unwrap();
    assert!(wait_for(30, || committed().is_some() && count(&recovered) == 1));
    // A new failure warns again, once.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(wait_for(30, || count(&warning) == 2), "no second warning");
    let since = std::time::Instant::now();
    while since.elapsed() < std::time::Duration::from_millis(500) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    sigterm(pid);
    let o = crate::common::wait_deadline(child, 30).expect("record ends on SIGTERM");
    reader.join().unwrap();
    assert_eq!(o.status.code(), Some(0), "{:?}", lines.lock().unwrap());
    assert_eq!(count(&warning), 2, "{:?}", lines.lock().unwrap());
    assert_eq!(count(&recovered), 1, "{:?}", lines.lock().unwrap());
    assert_eq!(count("status file"), 3, "{:?}", lines.lock().unwrap());
}

/// A size- or inode-limited tmpfs at `mnt`, unmounted on drop; None (test skipped) where
/// mounting is not allowed (not root).
struct Tmpfs(std::path::PathBuf);
impl Tmpfs {
    fn mount(mnt: &std::path::Path, opts: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(mnt).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs", mnt.to_str().unwrap()])
            .run_output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("SKIP: cannot mount a limited tmpfs here (needs root)");
        }
        ok.then(|| Tmpfs(mnt.to_path_buf()))
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn record_five(out: &std::path::Path) -> std::process::Output {
    run(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--clock",
        "system",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "max",
        "--synthetic-count",
        "5",
    ])
}

#[test]
fn a_full_disk_at_start_creates_no_bag_directory() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("full");
    let Some(_fs) = Tmpfs::mount(&mnt, "size=1m") else {
        return;
    };
    // Fill it to the last byte.
    let mut f = std::fs::File::create(mnt.join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    drop(f);
    for out in [mnt.join("bag"), mnt.join("a/b/bag")] {
        let o = record_five(&out);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(
            err,
            format!(
                "ringbag: error: {}: no space for a new bag: 0 bytes free on its partition, 131072 needed\n",
                out.display()
            )
        );
    }
    let left: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["filler"], "nothing was created");
}

#[test]
fn a_bag_that_cannot_be_created_completely_is_removed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("few-inodes");
    let Some(_fs) = Tmpfs::mount(&mnt, "size=64m,nr_inodes=64") else {
        return;
    };
    // Use up every inode, then free `k` of them: enough for the directory and some of its
    // files (lock, split, metadata), not all. Bytes are plentiful, so only the part-way
    // cleanup can keep the partition clean.
    let fill = mnt.join("fill");
    std::fs::create_dir(&fill).unwrap();
    let mut n = 0;
    while std::fs::File::create(fill.join(n.to_string())).is_ok() {
        n += 1;
    }
    // k = 1: the lock file fails; 2: the split; 3: the first metadata.yaml.
    let mut freed = 0;
    for k in 1..=3 {
        while freed < k {
            freed += 1;
            std::fs::remove_file(fill.join((n - freed).to_string())).unwrap();
        }
        let out = mnt.join(format!("bag{k}"));
        let o = record_five(&out);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "k={k}: {err}");
        assert_eq!(err.lines().count(), 1, "k={k}: one line: {err}");
        assert!(
            err.starts_with(&format!("ringbag: error: {}", out.display())),
            "k={k}: {err}"
        );
        assert!(!out.exists(), "k={k}: a half-created bag was left: {err}");
    }
}

#[test]
fn sigterm_ends_play_even_while_its_output_pipe_is_full() {
    use ringbag::bag::writer::{BagWriter, WriterOptions};
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("many");
    let mut w = BagWriter::create(&bag, WriterOptions::new(ringbag::bag::Flavour::Humble)).unwrap();
    let t = w
        .add_topic(crate::common::topic("/a", "std_msgs/msg/String"), None)
        .unwrap();
    let data = crate::common::cdr_string("x");
    let t0 = 1_700_000_000_000_000_000i64;
    // All at one instant: play writes them as fast as it can, far more than a pipe holds.
    w.write_batch((0..20_000).map(|_| (t, t0, data.as_slice())))
        .unwrap();
    w.finish().unwrap();
    // stdout is a pipe nobody reads: the echo sink blocks in write(2) once it is full. The
    // read end is held here, unread, until the process has ended.
    let mut child = crate::common::spawn(&["play", bag.to_str().unwrap(), "--sink", "echo"]);
    let _unread = child.stdout.take();
    let pid = child.id();
    assert!(
        wait_for(30, || sigterm_caught(pid) && wchan(pid).contains("pipe")),
        "play never blocked on its output (wchan {})",
        wchan(pid)
    );
    let sent = std::time::Instant::now();
    sigterm(pid);
    let o = crate::common::wait_deadline(child, 10).expect("SIGTERM did not end a blocked play");
    // The clean stop cannot finish (the write never returns): after the grace period the
    // process ends by the signal.
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{}", stderr(&o));
    assert!(
        sent.elapsed() >= std::time::Duration::from_secs(1),
        "grace honoured"
    );
}

#[test]
fn the_open_split_stays_locked_against_readers_for_its_whole_life() {
    // SQLite's locks are POSIX record locks: closing any other descriptor of the file in the
    // recorder drops them. Readers in other processes must find the open split locked, also
    // after a rotation (each new split is fsynced when it is created).
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("locked");
    let mut child = crate::common::spawn(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-rate",
        "realtime",
        "-b",
        "86016",
        "--clock",
        "system",
    ]);
    let split = |n: u32| out.join(format!("locked_{n}.db3"));
    let size = |n: u32| std::fs::metadata(split(n)).map_or(0, |m| m.len());
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let signal = |s| nix::sys::signal::kill(pid, s).expect("signal the recorder");
    // Two rotations done, and rows committed into the newest split since it was created (its
    // creation takes a moment, unlocked between steps; rows are written under the lock that
    // write-optimized's exclusive locking mode then keeps). The recorder is frozen for each
    // look, so that no rotation can close the split between the look and the lock test; a
    // look that catches it between closing one split and creating the next tries the next
    // split (five tries: a split that is never locked fails all of them).
    let mut looks = Vec::new();
    let mut n = 2;
    let locked = loop {
        let rotated = wait_for(30, || split(n).exists());
        let created = size(n);
        let written = rotated && wait_for(30, || size(n) > created + 8192 || split(n + 1).exists());
        assert!(rotated && written, "no rotation and rows within 30 s");
        crate::common::freeze(pid.as_raw());
        let newer = split(n + 1).exists();
        let locked = !newer && ringbag::bag::reindex::locked_by_another_process(&split(n));
        signal(nix::sys::signal::Signal::SIGCONT);
        looks.push((n, newer, locked));
        if locked || looks.len() == 5 {
            break locked;
        }
        n += 1;
    };
    signal(nix::sys::signal::Signal::SIGINT);
    let status = child.wait().unwrap();
    assert!(
        locked,
        "no open split was found locked; (split, a newer one existed, locked): {looks:?}"
    );
    assert!(status.success());
}

/// A pipeline writing a new Jazzy bag at `dir`, split every `max_bag_size` bytes (0: never),
/// on the system clock with no retention: for tests that feed a producer by hand.
fn pipeline_into(dir: &std::path::Path, max_bag_size: u64) -> ringbag::pipeline::Pipeline {
    use ringbag::bag::writer::{BagWriter, WriterOptions};
    let mut opts = WriterOptions::new(ringbag::bag::Flavour::Jazzy);
    opts.max_bag_size = max_bag_size;
    ringbag::pipeline::Pipeline::start(
        BagWriter::create(dir, opts).unwrap(),
        None,
        std::sync::Arc::new(ringbag::clock::SystemClock),
        ringbag::pipeline::PipelineConfig::default(),
    )
}

/// Losses the middleware reports (live ROS 2 source) reach the summary, its text and the
/// bag's custom_data, per topic and in total, apart from ringbag's own drops.
#[test]
fn middleware_losses_are_reported_in_the_summary_and_the_bag() {
    use ringbag::bag::TopicInfo;
    use std::sync::atomic::Ordering::Relaxed;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    let pipeline = pipeline_into(&dir, 0);
    let producer = pipeline.producer();
    let cam = producer.add_topic(TopicInfo::new("/cam", "std_msgs/msg/String"), None);
    let imu = producer.add_topic(TopicInfo::new("/imu", "std_msgs/msg/String"), None);
    for _ in 0..3 {
        assert!(producer.push(&cam, &crate::common::cdr_string("frame")));
    }
    // What the source adds when the message-lost event fires.
    cam.stats().lost_in_middleware.fetch_add(7, Relaxed);
    imu.stats().lost_in_middleware.fetch_add(2, Relaxed);
    let (result, summary) = pipeline.finish();
    result.unwrap();
    assert_eq!(summary.lost_in_middleware, 9);
    assert_eq!(summary.written, 3);
    assert_eq!(summary.dropped_total(), 0, "not ringbag's own drops");
    let text = summary.to_string();
    assert!(
        text.contains("lost in the middleware before reaching ringbag 9"),
        "{text}"
    );
    let cd = ringbag::bag::reader::Bag::open(&dir)
        .unwrap()
        .metadata
        .custom_data;
    assert_eq!(
        cd.get("ringbag.lost_in_middleware").map(String::as_str),
        Some("9")
    );
    assert_eq!(
        cd.get("ringbag.lost_in_middleware./cam")
            .map(String::as_str),
        Some("7")
    );
    assert_eq!(
        cd.get("ringbag.lost_in_middleware./imu")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        cd.get("ringbag.dropped_messages").map(String::as_str),
        Some("0")
    );
}

/// Small messages cross to the writer in bursts (`pipeline::Bursts`): what a source thread
/// pushes, of every size on both sides of the burst limit and interleaved across topics,
/// reaches the bag byte for byte with the stamp it was pushed with, through split rotations
/// that fall inside bursts, and the counts add up.
#[test]
fn messages_sent_in_bursts_reach_the_bag_byte_for_byte_across_splits() {
    use ringbag::bag::TopicInfo;
    use ringbag::pipeline::{Bursts, BURST_MESSAGE_MAX};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bag");
    let pipeline = pipeline_into(&dir, 256 << 10);
    let producer = pipeline.producer();
    let topics = [
        producer.add_topic(TopicInfo::new("/imu", "std_msgs/msg/String"), None),
        producer.add_topic(TopicInfo::new("/scan", "std_msgs/msg/String"), None),
    ];
    // Message i of the run: its topic and bytes (sizes 1 B to past the burst limit).
    let message = |i: usize| {
        let len = 1 + (i * 97) % (BURST_MESSAGE_MAX + 2000);
        let data: Vec<u8> = (0..len).map(|j| (i ^ j) as u8).collect();
        (i % 3 % 2, data)
    };
    const N: usize = 3000;
    let source = std::thread::spawn({
        let topics = topics.clone();
        move || {
            let mut bursts = Bursts::new(producer);
            let mut stamps = Vec::with_capacity(N);
            for i in 0..N {
                let (t, data) = message(i);
                let before = bursts.producer().now_ns();
                assert!(bursts.push(&topics[t], &data), "message {i} dropped");
                stamps.push(before);
                if i % 500 == 499 {
                    bursts.flush(); // as a spin thread does before it waits
                }
            }
            stamps
        } // dropping `bursts` flushes the last one
    });
    let pushed_at = source.join().unwrap();
    let (result, summary) = pipeline.finish();
    result.unwrap();
    assert_eq!((summary.accepted, summary.written), (N as u64, N as u64));
    assert_eq!(summary.dropped_total(), 0);
    let bag = Bag::open(&dir).unwrap();
    assert!(
        bag.metadata.relative_file_paths.len() > 3,
        "rotations happened"
    );
    let names: Vec<String> = ["/imu", "/scan"].map(String::from).to_vec();
    let mut got: Vec<Vec<(i64, Vec<u8>)>> = vec![Vec::new(), Vec::new()];
    for m in bag.messages(&ReadFilter::default()).unwrap() {
        let m = m.unwrap();
        let t = names
            .iter()
            .position(|n| *n == bag.topics[m.topic].name)
            .unwrap();
        got[t].push((m.timestamp, m.data));
    }
    for (t, got) in got.iter_mut().enumerate() {
        // The bag reads back in stamp order; push order within a topic is the same order.
        let want: Vec<(usize, Vec<u8>)> = (0..N)
            .map(message)
            .enumerate()
            .filter(|(_, (tt, _))| *tt == t)
            .map(|(i, (_, d))| (i, d))
            .collect();
        assert_eq!(got.len(), want.len(), "topic {t}");
        for ((ts, data), (i, want)) in got.iter().zip(&want) {
            assert_eq!(data, want, "message {i} of topic {t}");
            assert!(
                *ts >= pushed_at[*i] && (*i + 1 == N || *ts <= pushed_at[*i + 1]),
                "message {i} stamped when it was pushed"
            );
        }
    }
}

/// `--synthetic-payload realistic` through the CLI: the camera frames keep the template's
/// size but each is a fresh noisy frame, and a run of them compresses as real frames do
/// (1.2-2x with zstd-1), where the template payload's barely-changing frames shrink far more.
#[test]
fn realistic_synthetic_payloads_are_noisy_frames_that_compress_like_real_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = |payload: &str| -> Vec<Vec<u8>> {
        let out = tmp.path().join(payload);
        let o = run(&[
            "record",
            "-o",
            out.to_str().unwrap(),
            "--source",
            "synthetic",
            "--synthetic-rate",
            "max",
            "--synthetic-count",
            "6",
            "--synthetic-payload",
            payload,
            "/camera/front/image_raw",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let db = rusqlite::Connection::open(out.join(format!("{payload}_0.db3"))).unwrap();
        let mut st = db
            .prepare("SELECT data FROM messages ORDER BY timestamp")
            .unwrap();
        let rows = st.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    };
    let (real, tpl) = (frames("realistic"), frames("template"));
    assert_eq!(real.len(), 6);
    assert!(real.iter().zip(&tpl).all(|(r, t)| r.len() == t.len()));
    for pair in real.windows(2) {
        let differ = pair[0].iter().zip(&pair[1]).filter(|(a, b)| a != b).count();
        assert!(differ > pair[0].len() / 2, "only {differ} bytes differ");
    }
    let ratio = |f: &[Vec<u8>]| {
        let all = f.concat();
        all.len() as f64 / zstd::bulk::compress(&all, 1).unwrap().len() as f64
    };
    let (r, t) = (ratio(&real), ratio(&tpl));
    assert!((1.1..2.0).contains(&r), "realistic frames compress {r:.2}x");
    assert!(t > 5.0, "template frames compress {t:.2}x");
    // A payload that is not one of the two is bad input: exit 2.
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-payload",
        "noisy",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
