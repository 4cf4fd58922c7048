//! The bandwidth cap: one token bucket shared by every part in flight, drawn from as bytes are
//! read into a request body, so the link sees `max_rate` however many parts run at once.
//!
//! The bucket holds at most one second of tokens: after an idle period (offline, nothing to
//! send) at most one second's worth goes out at once, never a flood. Tokens may go into debt
//! by one read's worth, so the long-run rate is exact and small reads are not starved.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time as the bucket sees it; a test injects a manual one.
pub trait Clock: Send + Sync {
    /// Monotonic time since some fixed point.
    fn now(&self) -> Duration;
    fn sleep(&self, d: Duration);
}

/// The real monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// A token bucket of `rate` bytes per second holding at most one second of tokens.
pub struct TokenBucket {
    rate: u64,
    state: Mutex<BucketState>,
    clock: Arc<dyn Clock>,
}

struct BucketState {
    /// May be negative: the debt of reads already granted.
    tokens: f64,
    last: Duration,
}

impl TokenBucket {
    /// A bucket that starts full (one second of tokens). `rate` must be > 0.
    pub fn new(rate: u64, clock: Arc<dyn Clock>) -> TokenBucket {
        let rate = rate.max(1);
        let last = clock.now();
        TokenBucket {
            rate,
            state: Mutex::new(BucketState {
                tokens: rate as f64,
                last,
            }),
            clock,
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The largest read worth asking for at once: a twentieth of a second (so concurrent
    /// parts interleave finely), between 1 KiB and 64 KiB.
    pub fn chunk(&self) -> usize {
        (self.rate / 20).clamp(1024, 64 * 1024) as usize
    }

    /// Take `n` bytes' worth of tokens; returns how long the caller must wait before sending
    /// them (zero when the bucket had them).
    pub fn reserve(&self, n: u64) -> Duration {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_sub(s.last).as_secs_f64();
        s.last = now;
        s.tokens = (s.tokens + elapsed * self.rate as f64).min(self.rate as f64);
        s.tokens -= n as f64;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.tokens / self.rate as f64)
        }
    }

    /// Sleep `d` in slices, returning early (false) once `cancel` is set.
    pub fn wait(&self, d: Duration, cancel: &AtomicBool) -> bool {
        let end = self.clock.now() + d;
        loop {
            if cancel.load(Ordering::Relaxed) {
                return false;
            }
            let now = self.clock.now();
            if now >= end {
                return true;
            }
            self.clock
                .sleep((end - now).min(Duration::from_millis(100)));
        }
    }
}

/// A request body: reads `inner`, drawing each read from the bucket (if any), counting what
/// was read into `sent`, and failing with `Interrupted`-free `Other("cancelled")` once
/// `cancel` is set, so a transfer stops within one chunk.
pub struct BodyReader<'a, R> {
    pub inner: R,
    pub bucket: Option<&'a TokenBucket>,
    pub cancel: &'a AtomicBool,
    pub sent: &'a std::sync::atomic::AtomicU64,
    /// A second counter (the uploader's total), also counted as bytes go.
    pub total: Option<&'a std::sync::atomic::AtomicU64>,
}

/// The message of the io error a cancelled body read returns.
pub const CANCELLED: &str = "upload cancelled";

impl<R: Read> Read for BodyReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(std::io::Error::other(CANCELLED));
        }
        let want = match self.bucket {
            Some(b) => buf.len().min(b.chunk()),
            None => buf.len(),
        };
        let n = self.inner.read(&mut buf[..want])?;
        if let Some(b) = self.bucket {
            let wait = b.reserve(n as u64);
            if !wait.is_zero() && !b.wait(wait, self.cancel) {
                return Err(std::io::Error::other(CANCELLED));
            }
        }
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(t) = self.total {
            t.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that moves only when told to (or when slept on).
    #[derive(Default)]
    struct ManualClock(Mutex<Duration>);

    impl ManualClock {
        fn advance(&self, d: Duration) {
            *self.0.lock().unwrap() += d;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Duration {
            *self.0.lock().unwrap()
        }
        fn sleep(&self, d: Duration) {
            self.advance(d)
        }
    }

    #[test]
    fn the_bucket_starts_with_one_second_and_then_refills_at_the_rate() {
        let clock = Arc::new(ManualClock::default());
        let b = TokenBucket::new(1000, clock.clone());
        assert_eq!(b.reserve(1000), Duration::ZERO);
        // Empty now: 500 bytes cost half a second.
        assert_eq!(b.reserve(500), Duration::from_millis(500));
        clock.advance(Duration::from_millis(500));
        // The debt is paid; the next 250 wait a quarter second.
        assert_eq!(b.reserve(250), Duration::from_millis(250));
    }

    #[test]
    fn after_a_long_idle_period_at_most_one_second_goes_at_once() {
        let clock = Arc::new(ManualClock::default());
        let b = TokenBucket::new(1000, clock.clone());
        clock.advance(Duration::from_secs(3600));
        assert_eq!(b.reserve(1000), Duration::ZERO);
        assert_eq!(b.reserve(1000), Duration::from_secs(1));
    }

    /// A reader of `data` held to `bucket`'s rate, counting into `sent` only.
    fn limited<'a>(
        data: &'a [u8],
        bucket: &'a TokenBucket,
        cancel: &'a AtomicBool,
        sent: &'a std::sync::atomic::AtomicU64,
    ) -> BodyReader<'a, &'a [u8]> {
        BodyReader {
            inner: data,
            bucket: Some(bucket),
            cancel,
            sent,
            total: None,
        }
    }

    #[test]
    fn a_body_reader_holds_the_rate_over_many_seconds() {
        let clock = Arc::new(ManualClock::default());
        let b = TokenBucket::new(100_000, clock.clone());
        let cancel = AtomicBool::new(false);
        let sent = std::sync::atomic::AtomicU64::new(0);
        let data = vec![7u8; 1_000_000];
        let mut r = limited(&data, &b, &cancel, &sent);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(sent.load(Ordering::Relaxed), 1_000_000);
        // 1 MB at 100 kB/s with one second of initial tokens: 9 s, within a chunk.
        let t = clock.now().as_secs_f64();
        assert!((8.9..=9.1).contains(&t), "took {t} s");
    }

    #[test]
    fn a_cancelled_body_stops_reading() {
        let clock = Arc::new(ManualClock::default());
        let b = TokenBucket::new(1000, clock);
        let cancel = AtomicBool::new(true);
        let sent = std::sync::atomic::AtomicU64::new(0);
        let data = [1u8; 10];
        let mut r = limited(&data, &b, &cancel, &sent);
        let e = r.read(&mut [0u8; 10]).unwrap_err();
        assert_eq!(e.to_string(), CANCELLED);
    }
}
