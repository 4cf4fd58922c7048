//! Offset and drift tracking of a PHC against CLOCK_MONOTONIC, and the lock-free snapshot
//! that message stamping reads.
//!
//! Three layers, each testable alone:
//! - [`Estimator`]: weighted least squares over recent samples → offset, drift, uncertainty;
//!   detects steps (a jump confirmed by two consecutive samples) and rejects single outliers.
//! - [`TrackerCore`]: turns estimates into a published piecewise-linear UTC line that is
//!   continuous (small errors are slewed) and never goes backwards; records device loss.
//! - [`PublishedClock`]: a seqlock over atomics; readers never lock and never syscall
//!   beyond one vDSO clock read.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::ClockError;
use super::phc::{monotonic_now_ns, PhcSample};

/// Tuning of the estimator.
#[derive(Debug, Clone, Copy)]
pub struct EstimatorConfig {
    /// Samples in the least-squares window (at 1 s polling: 16 s of history).
    pub window: usize,
    /// A sample further than this from the prediction is an outlier, or a step when the next
    /// sample confirms it.
    pub step_threshold_ns: i64,
    /// Below this many samples the drift is not refitted (kept from before, or 0).
    pub min_samples_for_drift: usize,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        Self {
            window: 16,
            step_threshold_ns: 100_000,
            min_samples_for_drift: 3,
        }
    }
}

/// PHC as a function of CLOCK_MONOTONIC: phc(t) = t + offset + drift·(t − ref).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// CLOCK_MONOTONIC ns the offset refers to (the newest sample).
    pub ref_sys_ns: i64,
    /// PHC − CLOCK_MONOTONIC at `ref_sys_ns`, ns. Integer on purpose: the offset is
    /// epoch-sized (~1.8e18 ns), where an f64 only resolves 256 ns.
    pub offset_ns: i64,
    /// Rate of the PHC against CLOCK_MONOTONIC, parts per billion.
    pub drift_ppb: f64,
    /// Offset uncertainty at `ref_sys_ns`, ns: root-sum-square of the median half window
    /// and the fit's RMS residual.
    pub uncertainty_ns: f64,
    /// Standard error of the drift, ppb; grows the uncertainty when extrapolating.
    pub drift_sigma_ppb: f64,
}

impl Estimate {
    /// Predicted PHC reading at CLOCK_MONOTONIC `sys_ns`.
    pub fn phc_at(&self, sys_ns: i64) -> i64 {
        let dt = (sys_ns - self.ref_sys_ns) as f64;
        sys_ns + self.offset_ns + (dt * self.drift_ppb * 1e-9).round() as i64
    }

    /// Uncertainty at `sys_ns`, including extrapolation since the last sample.
    pub fn uncertainty_at(&self, sys_ns: i64) -> f64 {
        let dt = (sys_ns - self.ref_sys_ns).unsigned_abs() as f64;
        self.uncertainty_ns + dt * self.drift_sigma_ppb * 1e-9
    }
}

/// What the estimator made of one sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    Accepted,
    /// Far from the prediction; held until the next sample decides outlier vs step.
    Suspect {
        residual_ns: f64,
    },
    /// Two consecutive samples agreed on a jump of about `size_ns`; the window restarted.
    Step {
        size_ns: f64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Point {
    sys: i64,
    off: i64,
    half_width: f64,
}

impl Point {
    fn from_sample(s: &PhcSample) -> Self {
        Self {
            sys: s.sys_mid_ns(),
            off: s.offset_ns(),
            half_width: (s.window_ns().max(0) as f64) / 2.0,
        }
    }
}

/// Offset/drift estimator. Pure: no clock reads, no threads.
#[derive(Debug)]
pub struct Estimator {
    cfg: EstimatorConfig,
    window: VecDeque<Point>,
    suspect: Option<Point>,
    estimate: Option<Estimate>,
    steps: u64,
    outliers: u64,
}

impl Estimator {
    pub fn new(cfg: EstimatorConfig) -> Self {
        Self {
            window: VecDeque::with_capacity(cfg.window.max(2)),
            cfg,
            suspect: None,
            estimate: None,
            steps: 0,
            outliers: 0,
        }
    }

    pub fn estimate(&self) -> Option<Estimate> {
        self.estimate
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn outliers(&self) -> u64 {
        self.outliers
    }

    pub fn add(&mut self, sample: &PhcSample) -> Observation {
        let p = Point::from_sample(sample);
        let threshold = self.cfg.step_threshold_ns as f64;
        let Some(est) = self.estimate else {
            self.push(p);
            return Observation::Accepted;
        };
        let residual = (p.off - (est.phc_at(p.sys) - p.sys)) as f64;
        if residual.abs() <= threshold {
            if self.suspect.take().is_some() {
                self.outliers += 1;
            }
            self.push(p);
            return Observation::Accepted;
        }
        match self.suspect.take() {
            // Confirmed when the new sample agrees with the held one (drift applied).
            Some(prev)
                if ((p.off - prev.off) as f64
                    - (p.sys - prev.sys) as f64 * est.drift_ppb * 1e-9)
                    .abs()
                    <= threshold =>
            {
                self.steps += 1;
                self.window.clear();
                self.window.push_back(prev);
                self.push(p);
                Observation::Step { size_ns: residual }
            }
            Some(_) => {
                self.outliers += 1;
                self.suspect = Some(p);
                Observation::Suspect {
                    residual_ns: residual,
                }
            }
            None => {
                self.suspect = Some(p);
                Observation::Suspect {
                    residual_ns: residual,
                }
            }
        }
    }

    fn push(&mut self, p: Point) {
        while self.window.len() >= self.cfg.window.max(2) {
            self.window.pop_front();
        }
        self.window.push_back(p);
        self.refit();
    }

    fn refit(&mut self) {
        let Some(newest) = self.window.back().copied() else {
            return;
        };
        let ref_sys = newest.sys;
        // Offsets relative to the newest one keep the fit in f64's exact range.
        let ref_off = newest.off;
        // Weights 1/(half window² + 10 ns²): narrow windows carry more information; the floor
        // keeps a zero-width sample from owning the fit.
        let pts: Vec<(f64, f64, f64)> = self
            .window
            .iter()
            .map(|p| {
                let w = 1.0 / (p.half_width * p.half_width + 100.0);
                ((p.sys - ref_sys) as f64, (p.off - ref_off) as f64, w)
            })
            .collect();
        let sw: f64 = pts.iter().map(|p| p.2).sum();
        let xm = pts.iter().map(|p| p.0 * p.2).sum::<f64>() / sw;
        let ym = pts.iter().map(|p| p.1 * p.2).sum::<f64>() / sw;
        let sxx: f64 = pts.iter().map(|p| p.2 * (p.0 - xm).powi(2)).sum();
        let prev_drift = self.estimate.map_or(0.0, |e| e.drift_ppb);
        let prev_sigma = self.estimate.map_or(0.0, |e| e.drift_sigma_ppb);
        let fit_drift = pts.len() >= self.cfg.min_samples_for_drift && sxx > 0.0;
        let slope = if fit_drift {
            pts.iter()
                .map(|p| p.2 * (p.0 - xm) * (p.1 - ym))
                .sum::<f64>()
                / sxx
        } else {
            prev_drift * 1e-9
        };
        let offset = ym - slope * xm;
        let n = pts.len() as f64;
        let rss: f64 = pts
            .iter()
            .map(|p| (p.1 - (offset + slope * p.0)).powi(2))
            .sum();
        let dof = if fit_drift { n - 2.0 } else { n - 1.0 };
        let rms = if dof > 0.0 { (rss / dof).sqrt() } else { 0.0 };
        let mut hw: Vec<f64> = self.window.iter().map(|p| p.half_width).collect();
        hw.sort_by(f64::total_cmp);
        let median_hw = hw[hw.len() / 2];
        let uncertainty = (median_hw * median_hw + rms * rms).sqrt();
        // Unweighted spread is a fair stand-in for the slope's standard error here.
        let spread: f64 = pts.iter().map(|p| p.0 * p.0).sum::<f64>()
            - pts.iter().map(|p| p.0).sum::<f64>().powi(2) / n;
        let drift_sigma_ppb = if fit_drift && spread > 0.0 {
            uncertainty / spread.sqrt() * 1e9
        } else {
            prev_sigma.max(if fit_drift { 0.0 } else { 1_000.0 })
        };
        self.estimate = Some(Estimate {
            ref_sys_ns: ref_sys,
            offset_ns: ref_off + offset.round() as i64,
            drift_ppb: slope * 1e9,
            uncertainty_ns: uncertainty,
            drift_sigma_ppb,
        });
    }
}

// --- the published line -----------------------------------------------------------------

/// utc(t) = base_utc + (t − base_sys)·(1 + rate), t in CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub base_sys_ns: i64,
    pub base_utc_ns: i64,
    /// Dimensionless rate offset (50 ppm = 50e-6).
    pub rate: f64,
}

impl Line {
    #[inline]
    pub fn eval(&self, sys_ns: i64) -> i64 {
        let dt = sys_ns.wrapping_sub(self.base_sys_ns);
        self.base_utc_ns
            .wrapping_add(dt)
            .wrapping_add((dt as f64 * self.rate) as i64)
    }
}

/// The snapshot stamping reads: a seqlock over atomics (single writer: the tracker thread),
/// plus the per-source high-water mark that makes stamps never go backwards.
#[derive(Debug, Default)]
pub struct PublishedClock {
    seq: AtomicU64,
    base_sys: AtomicI64,
    base_utc: AtomicI64,
    rate_bits: AtomicU64,
    /// On its own cache line: every stamp writes it, and sharing a line with the read-mostly
    /// snapshot would make every reader miss on the snapshot too.
    last: CachePadded,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct CachePadded(AtomicI64);

impl PublishedClock {
    pub fn new(line: Line) -> Self {
        let c = Self::default();
        c.publish(line);
        c
    }

    /// Single writer only (the owner serialises calls).
    pub fn publish(&self, line: Line) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.base_sys.store(line.base_sys_ns, Ordering::Relaxed);
        self.base_utc.store(line.base_utc_ns, Ordering::Relaxed);
        self.rate_bits.store(line.rate.to_bits(), Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The current line; retries only while the writer is mid-update (a few ns, once a poll).
    #[inline]
    pub fn line(&self) -> Line {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let line = Line {
                base_sys_ns: self.base_sys.load(Ordering::Relaxed),
                base_utc_ns: self.base_utc.load(Ordering::Relaxed),
                rate: f64::from_bits(self.rate_bits.load(Ordering::Relaxed)),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return line;
            }
        }
    }

    /// UTC stamp for CLOCK_MONOTONIC `sys_ns`, never below any stamp handed out before.
    #[inline]
    pub fn stamp_at(&self, sys_ns: i64) -> i64 {
        let v = self.line().eval(sys_ns);
        // The line is continuous, but a reader holding the previous line a few µs after a
        // publish could still be ahead of the new one by a few ns; the high-water mark
        // closes that gap across threads.
        self.last.0.fetch_max(v, Ordering::Relaxed).max(v)
    }

    /// UTC stamp now: one vDSO clock read, a seqlock read, arithmetic, one atomic max.
    #[inline]
    pub fn now_ns(&self) -> i64 {
        // Snapshot first, clock second: a line published after we read the clock cannot be
        // applied to a time before its base.
        let line = self.line();
        let v = line.eval(monotonic_now_ns());
        self.last.0.fetch_max(v, Ordering::Relaxed).max(v)
    }
}

// --- the tracker core --------------------------------------------------------------------

/// Most loss/recovery/step events kept for custom_data; later ones are only counted.
pub const MAX_EVENTS: usize = 16;

/// Fastest slew for a backward correction: stamps then advance at 0.9× real time.
pub const MAX_SLEW: f64 = 0.1;

/// Something worth recording in the bag.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockEvent {
    /// UTC ns (from the tracked clock) when it happened.
    pub utc_ns: i64,
    pub what: String,
}

/// Counters and events, read by `custom_data()` and diagnostics (never on the stamp path).
#[derive(Debug, Clone, Default)]
pub struct TrackerStatus {
    pub uncertainty_start_ns: Option<f64>,
    pub uncertainty_now_ns: Option<f64>,
    pub drift_ppb: Option<f64>,
    pub steps: u64,
    pub outliers: u64,
    pub losses: u64,
    pub events: Vec<ClockEvent>,
    pub events_dropped: u64,
    pub device_lost: bool,
}

impl TrackerStatus {
    fn push_event(&mut self, utc_ns: i64, what: String) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(ClockEvent { utc_ns, what });
        } else {
            self.events_dropped += 1;
        }
    }
}

/// Estimator + slewing publisher + loss bookkeeping, driven with explicit times so tests can
/// simulate hours in microseconds.
#[derive(Debug)]
pub struct TrackerCore {
    estimator: Estimator,
    published: Arc<PublishedClock>,
    current: Option<Line>,
    /// Subtracted from PHC time to get UTC (37 s for a PHC on TAI).
    phc_minus_utc_ns: i64,
    poll_interval_ns: i64,
    step_threshold_ns: i64,
    device: String,
    status: Arc<Mutex<TrackerStatus>>,
}

impl TrackerCore {
    pub fn new(
        cfg: EstimatorConfig,
        phc_minus_utc_ns: i64,
        poll_interval: Duration,
        device: String,
    ) -> Self {
        Self {
            estimator: Estimator::new(cfg),
            published: Arc::new(PublishedClock::default()),
            current: None,
            phc_minus_utc_ns,
            poll_interval_ns: i64::try_from(poll_interval.as_nanos())
                .unwrap_or(i64::MAX)
                .max(1),
            step_threshold_ns: cfg.step_threshold_ns,
            device,
            status: Arc::new(Mutex::new(TrackerStatus::default())),
        }
    }

    pub fn published(&self) -> Arc<PublishedClock> {
        self.published.clone()
    }

    pub fn estimate(&self) -> Option<Estimate> {
        self.estimator.estimate()
    }

    pub fn has_line(&self) -> bool {
        self.current.is_some()
    }

    /// Shared view of the counters for readers on other threads.
    pub fn status_handle(&self) -> Arc<Mutex<TrackerStatus>> {
        self.status.clone()
    }

    pub fn status(&self) -> TrackerStatus {
        match self.status.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn with_status(&self, f: impl FnOnce(&mut TrackerStatus)) {
        match self.status.lock() {
            Ok(mut s) => f(&mut s),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Feeds one poll result and republishes the line at CLOCK_MONOTONIC `now_sys_ns`.
    pub fn poll(&mut self, result: Result<PhcSample, ClockError>, now_sys_ns: i64) {
        let stamp_now = self.current.map_or(0, |l| l.eval(now_sys_ns));
        match result {
            Ok(sample) => {
                let was_lost = self.status().device_lost;
                if was_lost {
                    log::info!("PTP device {} is back; tracking resumed", self.device);
                    self.with_status(|s| {
                        s.device_lost = false;
                        s.push_event(stamp_now, "device recovered".into());
                    });
                }
                if let Observation::Step { size_ns } = self.estimator.add(&sample) {
                    log::warn!(
                        "PTP clock {} stepped by {:.0} ns against the system clock (ptp4l resync?); smoothing stamps",
                        self.device,
                        size_ns
                    );
                    self.with_status(|s| {
                        s.push_event(stamp_now, format!("step of {size_ns:.0} ns"));
                    });
                }
            }
            Err(e) => {
                let first = !self.status().device_lost;
                if first {
                    // Once per loss: the device may stay away for hours.
                    log::warn!("{e}; stamping with the last offset and drift, retrying every poll");
                    self.with_status(|s| {
                        s.device_lost = true;
                        s.losses += 1;
                        s.push_event(stamp_now, format!("device lost: {e}"));
                    });
                }
            }
        }
        self.republish(now_sys_ns);
    }

    /// Builds the next line so it starts where the current one is at `now` (continuous),
    /// then steers towards the estimate: forward steps beyond the threshold at once,
    /// everything else slewed, never faster than `MAX_SLEW`.
    fn republish(&mut self, now: i64) {
        let Some(est) = self.estimator.estimate() else {
            return;
        };
        let target = est.phc_at(now) - self.phc_minus_utc_ns;
        let rate0 = est.drift_ppb * 1e-9;
        let line = match self.current {
            None => Line {
                base_sys_ns: now,
                base_utc_ns: target,
                rate: rate0,
            },
            Some(cur) => {
                let at = cur.eval(now);
                let err = (target - at) as f64;
                if err > self.step_threshold_ns as f64 {
                    Line {
                        base_sys_ns: now,
                        base_utc_ns: target,
                        rate: rate0,
                    }
                } else {
                    let span = (self.poll_interval_ns as f64).max(err.abs() / MAX_SLEW);
                    Line {
                        base_sys_ns: now,
                        base_utc_ns: at,
                        rate: (rate0 + err / span).clamp(-MAX_SLEW, MAX_SLEW),
                    }
                }
            }
        };
        self.current = Some(line);
        self.published.publish(line);
        let (steps, outliers) = (self.estimator.steps(), self.estimator.outliers());
        self.with_status(|s| {
            let u = est.uncertainty_at(now);
            s.uncertainty_start_ns.get_or_insert(u);
            s.uncertainty_now_ns = Some(u);
            s.drift_ppb = Some(est.drift_ppb);
            s.steps = steps;
            s.outliers = outliers;
        });
    }
}
