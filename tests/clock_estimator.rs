//! The tracker against simulated clocks: drift, noise, steps, outliers, device loss.
//! Time is simulated, so hours run in milliseconds and nothing depends on the machine.

use std::time::Duration;

use ringbag::clock::tracker::{EstimatorConfig, Line, PublishedClock, TrackerCore};
use ringbag::clock::{ClockError, PhcSample};

const S: i64 = 1_000_000_000;
const TAI_UTC: i64 = 37 * S;

/// xorshift64*: deterministic noise without a dependency.
struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A PHC on TAI drifting against CLOCK_MONOTONIC, read through noisy windows.
struct SimPhc {
    phc0: i64,
    drift: f64,
    /// (at sys ns, size ns): the PHC jumps by size from then on.
    steps: Vec<(i64, i64)>,
    /// [from, to) sys ns during which the device is gone.
    outage: Option<(i64, i64)>,
    /// sys ns of single-sample outliers and their error.
    outliers: Vec<(i64, i64)>,
    rng: Rng,
}

impl SimPhc {
    fn new(drift_ppm: f64) -> Self {
        Self {
            phc0: 1_764_620_000 * S + TAI_UTC,
            drift: drift_ppm * 1e-6,
            steps: vec![],
            outage: None,
            outliers: vec![],
            rng: Rng(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn phc(&self, t: i64) -> i64 {
        let stepped: i64 = self.steps.iter().filter(|s| t >= s.0).map(|s| s.1).sum();
        self.phc0 + t + (t as f64 * self.drift) as i64 + stepped
    }

    fn truth_utc(&self, t: i64) -> i64 {
        self.phc(t) - TAI_UTC
    }

    /// Window 200..2000 ns wide ending at `t`; the PHC is read anywhere inside it.
    fn sample(&mut self, t: i64) -> Result<PhcSample, ClockError> {
        if let Some((a, b)) = self.outage {
            if t >= a && t < b {
                return Err(ClockError::Lost {
                    device: "/dev/ptp-sim".into(),
                    reason: "No such device".into(),
                });
            }
        }
        let w = 200 + (self.rng.next_f64() * 1800.0) as i64;
        let at = t - w + (self.rng.next_f64() * w as f64) as i64;
        let glitch: i64 = self.outliers.iter().filter(|o| o.0 == t).map(|o| o.1).sum();
        Ok(PhcSample {
            sys_before_ns: t - w,
            phc_ns: self.phc(at) + glitch,
            sys_after_ns: t,
        })
    }
}

struct Run {
    /// (t, stamp − truth) every 50 ms of simulated time.
    errors: Vec<(i64, i64)>,
    /// Raw line values at the same points, to check monotonicity without the guard.
    values: Vec<i64>,
    core: TrackerCore,
}

fn simulate(sim: &mut SimPhc, seconds: i64) -> Run {
    let mut core = TrackerCore::new(
        EstimatorConfig::default(),
        TAI_UTC,
        Duration::from_secs(1),
        "/dev/ptp-sim".into(),
    );
    let published = core.published();
    let t0 = 10 * S;
    let mut errors = vec![];
    let mut values = vec![];
    for k in 0..seconds {
        let poll = t0 + k * S;
        let r = sim.sample(poll);
        core.poll(r, poll + 5_000);
        for j in 0..20 {
            let t = poll + 5_000 + j * 50_000_000;
            let v = published.line().eval(t);
            values.push(v);
            errors.push((t - t0, v - sim.truth_utc(t)));
        }
    }
    Run {
        errors,
        values,
        core,
    }
}

fn max_abs(errors: &[(i64, i64)], from_s: i64, to_s: i64) -> i64 {
    errors
        .iter()
        .filter(|e| e.0 >= from_s * S && e.0 < to_s * S)
        .map(|e| e.1.abs())
        .max()
        .unwrap_or(0)
}

fn rms(errors: &[(i64, i64)], from_s: i64, to_s: i64) -> f64 {
    let v: Vec<f64> = errors
        .iter()
        .filter(|e| e.0 >= from_s * S && e.0 < to_s * S)
        .map(|e| (e.1 as f64).powi(2))
        .collect();
    (v.iter().sum::<f64>() / v.len().max(1) as f64).sqrt()
}

fn assert_monotonic(values: &[i64]) {
    for w in values.windows(2) {
        assert!(w[1] >= w[0], "stamp went backwards: {} -> {}", w[0], w[1]);
    }
}

#[test]
fn tracks_a_50_ppm_drift_with_noisy_windows_within_600_ns() {
    let mut sim = SimPhc::new(50.0);
    let run = simulate(&mut sim, 600);
    let (max, r) = (max_abs(&run.errors, 20, 600), rms(&run.errors, 20, 600));
    let est = run.core.estimate().expect("estimate");
    println!(
        "50 ppm drift, 200-2000 ns windows: max |error| {max} ns, RMS {r:.0} ns, drift estimate {:.1} ppb (true 50000), uncertainty {:.0} ns",
        est.drift_ppb, est.uncertainty_ns
    );
    assert!(max < 600, "max error {max} ns");
    assert!(r < 200.0, "rms error {r} ns");
    assert!(
        (est.drift_ppb - 50_000.0).abs() < 50.0,
        "drift {}",
        est.drift_ppb
    );
    assert!(est.uncertainty_ns > 50.0 && est.uncertainty_ns < 2_000.0);
    assert_eq!(run.core.status().steps, 0);
    assert_monotonic(&run.values);
}

#[test]
fn tracks_a_negative_drift_as_well() {
    let mut sim = SimPhc::new(-80.0);
    let run = simulate(&mut sim, 300);
    let max = max_abs(&run.errors, 20, 300);
    println!("-80 ppm drift: max |error| {max} ns");
    assert!(max < 600, "max error {max} ns");
    assert_monotonic(&run.values);
}

#[test]
fn forward_step_is_counted_applied_and_stamps_stay_monotonic() {
    let mut sim = SimPhc::new(50.0);
    sim.steps.push((10 * S + 100 * S, 500_000));
    let run = simulate(&mut sim, 200);
    let st = run.core.status();
    let after = max_abs(&run.errors, 103, 200);
    println!(
        "+500 us step: steps {}, max |error| 3..100 s after {after} ns, worst during {} ns",
        st.steps,
        max_abs(&run.errors, 100, 103)
    );
    assert_eq!(st.steps, 1);
    assert!(st.events.iter().any(|e| e.what.starts_with("step of")));
    assert!(after < 1_000, "error after step {after} ns");
    assert_monotonic(&run.values);
}

#[test]
fn backward_step_is_slewed_never_stepping_stamps_back() {
    let mut sim = SimPhc::new(50.0);
    sim.steps.push((10 * S + 100 * S, -500_000));
    let run = simulate(&mut sim, 200);
    let st = run.core.status();
    let after = max_abs(&run.errors, 104, 200);
    println!(
        "-500 us step: steps {}, max |error| 4..100 s after {after} ns",
        st.steps
    );
    assert_eq!(st.steps, 1);
    assert!(after < 1_000, "error after step {after} ns");
    assert_monotonic(&run.values);
    // Slewing limits the rate: stamps keep advancing at no less than 0.9x real time.
    for w in run.values.windows(2) {
        assert!(
            w[1] - w[0] >= 45_000_000 - 1_000,
            "advanced only {} ns in 50 ms",
            w[1] - w[0]
        );
    }
}

#[test]
fn a_single_outlier_is_rejected_not_taken_as_a_step() {
    let mut sim = SimPhc::new(50.0);
    sim.outliers.push((10 * S + 50 * S, 2_000_000));
    let run = simulate(&mut sim, 120);
    let st = run.core.status();
    let max = max_abs(&run.errors, 20, 120);
    println!(
        "single 2 ms outlier: steps {}, outliers {}, max |error| {max} ns",
        st.steps, st.outliers
    );
    assert_eq!(st.steps, 0);
    assert_eq!(st.outliers, 1);
    assert!(max < 1_000, "max error {max} ns");
}

#[test]
fn device_loss_keeps_stamping_on_last_offset_and_drift_then_recovers() {
    let mut sim = SimPhc::new(50.0);
    sim.outage = Some((10 * S + 100 * S, 10 * S + 160 * S));
    let run = simulate(&mut sim, 300);
    let st = run.core.status();
    let during = max_abs(&run.errors, 100, 161);
    let after = max_abs(&run.errors, 163, 300);
    println!(
        "60 s outage: max |error| during {during} ns, after {after} ns; uncertainty now {:.0} ns",
        st.uncertainty_now_ns.unwrap_or(f64::NAN)
    );
    assert!(during < 3_000, "error during outage {during} ns");
    assert!(after < 1_000, "error after recovery {after} ns");
    assert_eq!(st.losses, 1, "one loss, warned once");
    let whats: Vec<&str> = st.events.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(whats.len(), 2, "{whats:?}");
    assert!(whats[0].starts_with("device lost"));
    assert_eq!(whats[1], "device recovered");
    assert!(!st.device_lost);
    assert_monotonic(&run.values);
}

#[test]
fn uncertainty_grows_while_the_device_is_gone() {
    let mut sim = SimPhc::new(50.0);
    sim.outage = Some((10 * S + 100 * S, i64::MAX));
    let mut core = TrackerCore::new(
        EstimatorConfig::default(),
        TAI_UTC,
        Duration::from_secs(1),
        "/dev/ptp-sim".into(),
    );
    let mut at_loss = None;
    for k in 0..400 {
        let t = 10 * S + k * S;
        core.poll(sim.sample(t), t);
        if k == 99 {
            at_loss = core.status().uncertainty_now_ns;
        }
    }
    let (before, after) = (
        at_loss.unwrap_or(f64::NAN),
        core.status().uncertainty_now_ns.unwrap_or(f64::NAN),
    );
    println!("uncertainty at loss {before:.0} ns, 300 s later {after:.0} ns");
    assert!(after > before);
}

#[test]
fn seqlock_readers_never_see_a_torn_line() {
    // Every published line satisfies base_utc = 3·base_sys and rate = base_sys·1e-12.
    let clock = PublishedClock::new(Line {
        base_sys_ns: 0,
        base_utc_ns: 0,
        rate: 0.0,
    });
    std::thread::scope(|s| {
        let c = &clock;
        s.spawn(move || {
            for i in 1..200_000i64 {
                c.publish(Line {
                    base_sys_ns: i,
                    base_utc_ns: 3 * i,
                    rate: i as f64 * 1e-12,
                });
            }
        });
        for _ in 0..2 {
            s.spawn(move || {
                for _ in 0..200_000 {
                    let l = c.line();
                    assert_eq!(l.base_utc_ns, 3 * l.base_sys_ns);
                    assert_eq!(l.rate, l.base_sys_ns as f64 * 1e-12);
                }
            });
        }
    });
}

#[test]
fn stamps_never_go_backwards_per_thread_while_lines_are_republished() {
    // The writer republishes lines that are each slightly behind the previous one; the
    // high-water mark must still keep every reader's sequence non-decreasing.
    let clock = PublishedClock::new(Line {
        base_sys_ns: 0,
        base_utc_ns: 1_000 * S,
        rate: 0.0,
    });
    std::thread::scope(|s| {
        let c = &clock;
        s.spawn(move || {
            for i in 1..20_000i64 {
                c.publish(Line {
                    base_sys_ns: 0,
                    base_utc_ns: 1_000 * S - i * 1_000,
                    rate: 0.0,
                });
            }
        });
        for _ in 0..2 {
            s.spawn(move || {
                let mut prev = i64::MIN;
                for _ in 0..200_000 {
                    let v = c.now_ns();
                    assert!(v >= prev, "{v} < {prev}");
                    prev = v;
                }
            });
        }
    });
}

#[test]
fn a_replugged_device_with_a_new_offset_is_taken_as_one_step() {
    // The NIC comes back after 30 s with its PHC 3 ms behind (a reset clock that ptp4l has
    // not yet corrected): one loss, one step, stamps slewed back without going backwards.
    let mut sim = SimPhc::new(50.0);
    sim.outage = Some((10 * S + 100 * S, 10 * S + 130 * S));
    sim.steps.push((10 * S + 115 * S, -3_000_000));
    let run = simulate(&mut sim, 250);
    let st = run.core.status();
    let after = max_abs(&run.errors, 140, 250);
    println!(
        "replug 3 ms behind: losses {}, steps {}, max |error| from 10 s after return {after} ns",
        st.losses, st.steps
    );
    assert_eq!(st.losses, 1);
    assert_eq!(st.steps, 1);
    assert!(after < 1_000, "error after replug {after} ns");
    assert_monotonic(&run.values);
}
