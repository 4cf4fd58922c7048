//! systemd's notify protocol through the `sd-notify` crate: READY, STOPPING, STATUS,
//! EXTEND_TIMEOUT_USEC, and a watchdog gated on the writer's progress.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) every call is a no-op.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// Send `states`; a failure is logged once per kind, never fatal (systemd may be gone
/// while we finish a bag).
pub fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        log::debug!("sd_notify: {e}");
    }
}

/// WATCHDOG=1, only while the writer makes progress.
///
/// The writer thread bumps `Progress::loops` on every turn of its loop, at least every 5 ms
/// even when idle. [`Watchdog::poll`] pings at half of WATCHDOG_USEC, and only if that
/// counter moved since the last ping. A writer stuck in an fsync, a full pipe or a deadlock
/// stops the counter, the pings stop, and systemd kills and restarts the service.
#[derive(Debug)]
pub struct Watchdog {
    every: Duration,
    last_ping: Option<Instant>,
    seen: u64,
}

impl Watchdog {
    /// From the environment systemd gives (`WATCHDOG_USEC`, `WATCHDOG_PID`); None when the
    /// unit has no `WatchdogSec`.
    pub fn from_env(loops_now: u64) -> Option<Self> {
        sd_notify::watchdog_enabled().map(|t| Watchdog::new(t / 2, loops_now))
    }

    /// Ping at most every `every` (half the watchdog timeout), and only once the counter
    /// has moved past `loops_now`.
    pub fn new(every: Duration, loops_now: u64) -> Self {
        Watchdog {
            every: every.max(Duration::from_millis(1)),
            last_ping: None,
            seen: loops_now,
        }
    }

    /// Call often (the daemon does every ~20 ms) with the writer's loop counter. Returns
    /// true when it pinged.
    pub fn poll(&mut self, loops: u64) -> bool {
        if self.last_ping.is_some_and(|t| t.elapsed() < self.every) {
            return false;
        }
        if loops == self.seen {
            // The writer has not turned since the last ping: say nothing, let systemd judge.
            return false;
        }
        self.seen = loops;
        self.last_ping = Some(Instant::now());
        send(&[NotifyState::Watchdog]);
        true
    }
}

/// EXTEND_TIMEOUT_USEC every few seconds while a long phase (recovery) runs, so that
/// recovering a large damaged split does not outlast TimeoutStartSec.
pub struct Extender {
    done: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Each extension asks for this much more time; sent every third of it.
const EXTEND_BY: Duration = Duration::from_secs(30);

impl Extender {
    pub fn start() -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let usec = u32::try_from(EXTEND_BY.as_micros()).unwrap_or(u32::MAX);
        let extend = move || {
            send(&[
                NotifyState::ExtendTimeoutUsec(usec),
                NotifyState::Status("recovering unfinished bags"),
            ])
        };
        // The first extension is sent here, before the phase starts, not by the thread: a
        // thread that is scheduled late (a loaded board, qemu) would otherwise find a short
        // recovery already over and never say that one ran.
        extend();
        let handle = std::thread::Builder::new()
            .name("ringbag-extend".into())
            .spawn(move || {
                let mut last = Instant::now();
                while !flag.load(Relaxed) {
                    if last.elapsed() >= EXTEND_BY / 3 {
                        extend();
                        last = Instant::now();
                    }
                    std::thread::park_timeout(Duration::from_millis(100));
                }
            })
            .ok();
        Extender { done, handle }
    }

    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.done.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::writer::{BagWriter, StorageOps, WriterOptions};
    use crate::bag::Flavour;
    use crate::pipeline::{Pipeline, PipelineConfig};
    use std::os::unix::net::UnixDatagram;
    use std::path::Path;
    use std::sync::{Condvar, Mutex};

    /// Storage whose fsync blocks until released: a writer stuck in I/O.
    struct Gate(Arc<(Mutex<bool>, Condvar)>);
    impl StorageOps for Gate {
        fn sync_file(&self, path: &Path) -> std::io::Result<()> {
            let (open, cv) = &*self.0;
            let mut g = open.lock().expect("gate");
            while !*g {
                g = cv.wait(g).expect("gate");
            }
            crate::bag::writer::RealStorage.sync_file(path)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            crate::bag::writer::RealStorage.sync_dir(dir)
        }
        fn remove_file(&self, path: &Path) -> std::io::Result<()> {
            crate::bag::writer::RealStorage.remove_file(path)
        }
    }

    /// Everything queued on `sock` now (the queue of a datagram socket is short: a sender
    /// blocks when it is full, so the test drains it as it goes).
    fn drain(sock: &UnixDatagram, into: &mut Vec<String>) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            into.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }

    /// Drive a watchdog over a real pipeline for `window`; count the WATCHDOG=1 received.
    fn watch(pipeline: &Pipeline, sock: &UnixDatagram, window: Duration) -> usize {
        let progress = pipeline.progress();
        let mut wd = Watchdog::new(Duration::from_millis(20), progress.loops.load(Relaxed));
        let mut got = Vec::new();
        let end = Instant::now() + window;
        while Instant::now() < end {
            wd.poll(progress.loops.load(Relaxed));
            drain(sock, &mut got);
            std::thread::sleep(Duration::from_millis(5));
        }
        drain(sock, &mut got);
        got.iter()
            .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
            .count()
    }

    #[test]
    fn a_writer_stalled_in_storage_sends_no_watchdog_ping_while_a_healthy_one_does() {
        let tmp = tempfile::tempdir().expect("tmp");
        let sock_path = tmp.path().join("notify.sock");
        let sock = UnixDatagram::bind(&sock_path).expect("bind");
        sock.set_nonblocking(true).expect("nonblocking");
        // The only test in this binary that sets NOTIFY_SOCKET (process-wide).
        std::env::set_var("NOTIFY_SOCKET", &sock_path);
        let clock: Arc<dyn crate::clock::TimeSource> = Arc::new(crate::clock::SystemClock);

        // Healthy: the writer loop turns, pings arrive.
        let w = BagWriter::create(
            &tmp.path().join("healthy"),
            WriterOptions::new(Flavour::Jazzy),
        )
        .expect("create");
        let p = Pipeline::start(w, None, clock.clone(), PipelineConfig::default());
        let healthy = watch(&p, &sock, Duration::from_millis(300));
        let _ = p.finish();
        assert!(healthy >= 3, "healthy writer: only {healthy} pings");

        // Stalled: closing the split blocks in fsync; the loop counter stops, so do pings.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let mut w = BagWriter::create(
            &tmp.path().join("stalled"),
            WriterOptions::new(Flavour::Jazzy),
        )
        .expect("create");
        w.set_storage_ops(Box::new(Gate(gate.clone())));
        let p = Pipeline::start(w, None, clock, PipelineConfig::default());
        p.request_rotate();
        // Wait until the writer is inside the blocked fsync (its counter stays still).
        let progress = p.progress();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = progress.loops.load(Relaxed);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let now = progress.loops.load(Relaxed);
            if now == last && !progress.rotate_requested.load(Relaxed) {
                break;
            }
            last = now;
            assert!(Instant::now() < deadline, "writer never stalled");
        }
        drain(&sock, &mut Vec::new()); // anything earlier
        let stalled = watch(&p, &sock, Duration::from_millis(300));
        // Release the writer and let it finish.
        *gate.0.lock().expect("gate") = true;
        gate.1.notify_all();
        let _ = p.finish();
        assert_eq!(stalled, 0, "a stalled writer must not ping the watchdog");

        // A recovery over before the extender's thread first runs still asked for the time:
        // the first extension is sent by `start` itself.
        drain(&sock, &mut Vec::new());
        Extender::start().stop();
        let mut got = Vec::new();
        drain(&sock, &mut got);
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(
            got.iter()
                .any(|m| m.lines().any(|l| l == "EXTEND_TIMEOUT_USEC=30000000")),
            "{got:?}"
        );
    }
}
