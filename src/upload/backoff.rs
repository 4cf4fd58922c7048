//! Retry delays: exponential with full jitter (a uniform draw in [0, min(cap, base·2ⁿ)]),
//! from 1 s up to a 5 min cap. Full jitter spreads a fleet that lost its link together, so it
//! does not come back together. How many attempts is the caller's policy (`ringbag upload`:
//! a few; the daemon: forever, configuration errors at the cap).

use std::time::Duration;

pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    rng: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(BACKOFF_BASE, BACKOFF_CAP, seed())
    }
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, seed: u64) -> Backoff {
        Backoff {
            base,
            cap,
            failures: 0,
            rng: seed | 1,
        }
    }

    /// The ceiling of the next delay: base·2ⁿ after n failures, at most the cap.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.failures.min(20);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay after one more failure, with `unit` a uniform draw in [0, 1).
    pub fn next_with(&mut self, unit: f64) -> Duration {
        let d = self.ceiling().mul_f64(unit.clamp(0.0, 1.0));
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// The delay after one more failure, drawn from the internal generator.
    pub fn next_delay(&mut self) -> Duration {
        let u = self.draw();
        self.next_with(u)
    }

    /// A delay at the cap rate (full jitter over the cap), for configuration errors.
    pub fn at_cap(&mut self) -> Duration {
        let u = self.draw();
        self.cap.mul_f64(u)
    }

    /// After a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// xorshift64*: jitter needs spread, not cryptographic quality.
    fn draw(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (std::process::id() as u64).rotate_left(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_from_one_second_up_to_five_minutes() {
        let mut b = Backoff::new(BACKOFF_BASE, BACKOFF_CAP, 1);
        let mut ceilings = Vec::new();
        for _ in 0..12 {
            ceilings.push(b.ceiling().as_secs());
            b.next_with(0.5);
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        // Far past any shift width, still the cap.
        for _ in 0..100 {
            b.next_with(0.0);
        }
        assert_eq!(b.ceiling(), BACKOFF_CAP);
        b.reset();
        assert_eq!(b.ceiling(), BACKOFF_BASE);
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let mut b = Backoff::new(BACKOFF_BASE, BACKOFF_CAP, 1);
        assert_eq!(b.next_with(0.0), Duration::ZERO);
        assert_eq!(b.next_with(0.5), Duration::from_secs(1));
        assert_eq!(
            b.next_with(0.999_999),
            Duration::from_secs(4).mul_f64(0.999_999)
        );
        // Out-of-range draws are clamped, never beyond the ceiling.
        assert_eq!(b.next_with(7.0), Duration::from_secs(8));
    }

    #[test]
    fn drawn_delays_stay_within_bounds_and_spread() {
        let mut b = Backoff::new(BACKOFF_BASE, BACKOFF_CAP, 42);
        let mut distinct = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let ceiling = b.ceiling();
            let d = b.next_delay();
            assert!(d <= ceiling && d <= BACKOFF_CAP);
            distinct.insert(d.as_millis());
        }
        assert!(
            distinct.len() > 150,
            "jitter barely varies: {}",
            distinct.len()
        );
        let c = b.at_cap();
        assert!(c <= BACKOFF_CAP);
    }
}
