//! The real device path on real files, the start policy, the stand-in device, and
//! `ringbag clock` diagnostics. There is no PHC here: failures are tested on real files and
//! the success path on the CLOCK_MONOTONIC_RAW stand-in.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringbag::clock::{
    diagnose, start, start_with_device, ClockError, ClockKind, ClockSettings, PhcDevice, PhcSample,
    PtpDevice, ReadMethod, SystemClock, TimeSource, Timescale, MONOTONIC_RAW_STAND_IN,
};

fn settings(kind: ClockKind, device: &str) -> ClockSettings {
    ClockSettings {
        kind,
        ptp_device: PathBuf::from(device),
        ..ClockSettings::default()
    }
}

#[test]
fn rejects_dev_null_as_not_a_phc() {
    let err = PtpDevice::open(Path::new("/dev/null")).expect_err("/dev/null opened as a PHC");
    assert!(matches!(err, ClockError::NotAPhc { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("/dev/null is not a PTP hardware clock (PTP_CLOCK_GETCAPS: "),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
}

#[test]
fn rejects_a_regular_file_as_not_a_phc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ptp0");
    std::fs::write(&path, b"not a clock").expect("write");
    let err = PtpDevice::open(&path).expect_err("regular file opened as a PHC");
    assert!(matches!(err, ClockError::NotAPhc { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()));
}

#[test]
fn rejects_a_fifo_and_a_directory_without_blocking_or_ioctl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("ptp-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
    // Opening a FIFO without O_NONBLOCK waits for a writer forever; this must return at once.
    for (path, kind) in [(fifo.as_path(), "a FIFO"), (dir.path(), "a directory")] {
        let err = PtpDevice::open(path).expect_err("opened as a PHC");
        assert!(matches!(err, ClockError::NotAPhc { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "{} is not a PTP hardware clock (not a character device but {kind})",
                path.display()
            )
        );
    }
    // With --clock auto the recorder falls back to the system clock and says why.
    let h = start(&settings(ClockKind::Auto, fifo.to_str().unwrap())).expect("auto starts");
    assert!(
        h.custom_data()
            .iter()
            .any(|(k, v)| k == "ringbag.clock.fallback_reason" && v.contains("a FIFO")),
        "{:?}",
        h.custom_data()
    );
}

#[test]
fn reports_a_missing_device_by_path() {
    let err = PtpDevice::open(Path::new("/dev/ptp-does-not-exist")).expect_err("opened");
    assert!(matches!(err, ClockError::DeviceMissing { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("PTP device /dev/ptp-does-not-exist: no such file"),
        "{err}"
    );
}

const CHILD_VAR: &str = "RINGBAG_CLOCK_TEST_UNREADABLE";

#[test]
fn reports_permission_denied_for_an_unreadable_device_file() {
    // Child mode: re-run of this very test under an unprivileged uid.
    if let Ok(path) = std::env::var(CHILD_VAR) {
        let err = PtpDevice::open(Path::new(&path)).expect_err("opened an unreadable file");
        assert!(
            matches!(err, ClockError::PermissionDenied { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("PTP device {path}: permission denied (run as root or give the service user read access to the device)")
        );
        println!("CHILD-OK: {err}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = dir.path().join("ptp-unreadable");
    std::fs::write(&path, b"").expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).expect("chmod");

    if !nix::unistd::geteuid().is_root() {
        let err = PtpDevice::open(&path).expect_err("opened an unreadable file");
        assert!(
            matches!(err, ClockError::PermissionDenied { .. }),
            "{err:?}"
        );
        return;
    }
    // Root reads anything: drop to nobody in a subprocess that re-runs this test.
    let exe = std::env::current_exe().expect("test binary path");
    let mut setpriv = Command::new("setpriv");
    setpriv.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
    // Under cross testing this binary is for another architecture: run it through the same
    // emulator the test runner uses, never relying on a binfmt_misc registration.
    if let Some(runner) = std::env::var("RINGBAG_TEST_RUNNER")
        .ok()
        .filter(|r| !r.trim().is_empty())
    {
        setpriv.args(runner.split_whitespace());
    }
    let out = setpriv
        .arg(&exe)
        .args([
            "--exact",
            "reports_permission_denied_for_an_unreadable_device_file",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, &path)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED permission test: cannot run setpriv as nobody: {e}");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("Permission denied") && !stdout.contains("running")
    {
        eprintln!("SKIPPED permission test: nobody cannot execute the test binary: {stderr}");
        return;
    }
    assert!(
        out.status.success() && stdout.contains("CHILD-OK: PTP device"),
        "child as nobody failed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn ptp_policy_fails_at_start_with_the_device_error() {
    let err = start(&settings(ClockKind::Ptp, "/dev/null")).expect_err("ptp started on /dev/null");
    assert!(matches!(err, ClockError::NotAPhc { .. }), "{err:?}");
    let err = start(&settings(ClockKind::Ptp, "/dev/ptp-missing")).expect_err("started");
    assert!(matches!(err, ClockError::DeviceMissing { .. }), "{err:?}");
}

#[test]
fn auto_policy_falls_back_to_the_system_clock_and_says_why() {
    let h = start(&settings(ClockKind::Auto, "/dev/ptp-missing")).expect("auto must not fail");
    assert_eq!(h.source_name(), "system");
    assert!(h
        .fallback_reason()
        .is_some_and(|r| r.contains("/dev/ptp-missing")));
    let kv = h.custom_data();
    let get = |k: &str| kv.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str());
    assert_eq!(get("ringbag.clock"), Some("system"));
    assert_eq!(get("ringbag.clock.requested"), Some("auto"));
    assert_eq!(get("ringbag.clock.device"), Some("/dev/ptp-missing"));
    let sys = SystemClock.now_ns();
    assert!((h.now_ns() - sys).abs() < 1_000_000_000);
}

#[test]
fn system_policy_never_touches_the_device() {
    let h = start(&settings(ClockKind::System, "/dev/null")).expect("system");
    assert_eq!(h.source_name(), "system");
    assert!(h.fallback_reason().is_none());
}

#[test]
fn rejects_out_of_range_settings() {
    let mut s = settings(ClockKind::System, "/dev/ptp0");
    s.poll_interval = Duration::from_millis(1);
    assert!(matches!(start(&s), Err(ClockError::InvalidSettings(_))));
    let mut s = settings(ClockKind::System, "/dev/ptp0");
    s.tai_utc_offset_s = -1;
    assert!(matches!(start(&s), Err(ClockError::InvalidSettings(_))));
}

#[test]
fn stand_in_device_stamps_utc_on_tai_and_stops_cleanly() {
    let h = start(&settings(ClockKind::Ptp, MONOTONIC_RAW_STAND_IN)).expect("stand-in");
    assert_eq!(h.source_name(), "ptp");
    // The stand-in runs 37 s ahead (TAI); with the default tai/37 the stamps are UTC.
    let diff = h.now_ns() - SystemClock.now_ns();
    assert!(diff.abs() < 5_000_000, "stamp - system = {diff} ns");
    let mut prev = h.now_ns();
    for _ in 0..100_000 {
        let v = h.now_ns();
        assert!(v >= prev);
        prev = v;
    }
    let clone = h.clone();
    h.stop();
    // Stamping continues on the last line after the thread is gone.
    assert!(clone.now_ns() >= prev);
    let kv = clone.custom_data();
    let get = |k: &str| kv.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
    assert_eq!(get("ringbag.clock").as_deref(), Some("ptp"));
    assert_eq!(
        get("ringbag.clock.device").as_deref(),
        Some(MONOTONIC_RAW_STAND_IN)
    );
    assert_eq!(get("ringbag.clock.timescale").as_deref(), Some("tai"));
    assert_eq!(get("ringbag.clock.steps").as_deref(), Some("0"));
    let u: f64 = get("ringbag.clock.uncertainty_start_ns")
        .and_then(|v| v.parse().ok())
        .expect("uncertainty_start_ns");
    assert!(u < 100_000.0, "uncertainty {u} ns");
    assert!(get("ringbag.clock.uncertainty_end_ns").is_some());
}

/// A device that works until `fail` is set.
struct Flaky {
    fail: Arc<AtomicBool>,
    inner: PtpDevice,
}

impl PhcDevice for Flaky {
    fn sample(&mut self) -> Result<PhcSample, ClockError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(ClockError::Lost {
                device: "/dev/ptp-flaky".into(),
                reason: "No such device".into(),
            });
        }
        self.inner.sample()
    }
    fn name(&self) -> String {
        "/dev/ptp-flaky".into()
    }
    fn method(&self) -> ReadMethod {
        ReadMethod::Bracketing
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn losing_the_device_mid_recording_is_recorded_and_stamping_continues() {
    let fail = Arc::new(AtomicBool::new(false));
    let dev = Flaky {
        fail: fail.clone(),
        inner: PtpDevice::monotonic_raw_stand_in(),
    };
    let mut s = settings(ClockKind::Ptp, "/dev/ptp-flaky");
    s.poll_interval = Duration::from_millis(10);
    let h = start_with_device(&s, Box::new(dev)).expect("start");
    fail.store(true, Ordering::SeqCst);
    wait_for("the loss", || h.status().is_some_and(|st| st.device_lost));
    let during = h.now_ns();
    assert!((during - SystemClock.now_ns()).abs() < 5_000_000);
    fail.store(false, Ordering::SeqCst);
    wait_for("the recovery", || {
        h.status().is_some_and(|st| !st.device_lost)
    });
    assert!(h.now_ns() >= during);
    h.stop();
    let kv = h.custom_data();
    let get = |k: &str| kv.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
    assert_eq!(get("ringbag.clock.device_losses").as_deref(), Some("1"));
    let events = get("ringbag.clock.events").expect("events");
    assert!(
        events.contains("device lost: PTP device /dev/ptp-flaky"),
        "{events}"
    );
    assert!(events.contains("device recovered"), "{events}");
}

#[test]
fn diagnose_shows_the_37_second_tai_difference_of_the_stand_in() {
    let r = diagnose(&settings(ClockKind::Ptp, MONOTONIC_RAW_STAND_IN), 3).expect("diagnose");
    let d = r.phc_minus_utc_ns.expect("PHC - UTC");
    assert!((d - 37_000_000_000).abs() < 5_000_000, "PHC - UTC = {d} ns");
    assert!(r.offset_ns.is_some_and(|o| o.abs() < 5_000_000));
    assert!(r.hint.is_none(), "{:?}", r.hint);
    assert_eq!(r.samples.len(), 3);
    let text = r.to_string();
    assert!(text.contains("PHC - UTC:        +37.0"), "{text}");
    assert!(text.contains("cost per stamp:"), "{text}");
    assert!(text.contains("direct device read"), "{text}");
}

#[test]
fn diagnose_warns_when_the_timescale_setting_is_wrong() {
    let mut s = settings(ClockKind::Ptp, MONOTONIC_RAW_STAND_IN);
    s.timescale = Timescale::Utc;
    let r = diagnose(&s, 2).expect("diagnose");
    let hint = r.hint.clone().expect("a hint");
    assert!(hint.contains("--ptp-timescale tai"), "{hint}");
    assert!(r
        .offset_ns
        .is_some_and(|o| (o - 37_000_000_000).abs() < 5_000_000));
    assert!(r.to_string().contains("WARNING:"));
}

#[test]
fn diagnose_with_auto_reports_the_fallback() {
    let r = diagnose(&settings(ClockKind::Auto, "/dev/null"), 2).expect("diagnose");
    assert_eq!(r.source, "system");
    assert!(r
        .fallback_reason
        .is_some_and(|f| f.contains("not a PTP hardware clock")));
}

#[test]
fn diagnose_with_ptp_fails_on_a_missing_device() {
    let err = diagnose(&settings(ClockKind::Ptp, "/dev/ptp-missing"), 2).expect_err("diagnosed");
    assert!(matches!(err, ClockError::DeviceMissing { .. }));
}
