//! `ringbag clock`: what the recorder would stamp with, measured on the spot.

use std::fmt;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::ClockError;
use super::phc::{realtime_minus_monotonic_ns, PhcDevice, PtpDevice, ReadMethod};
use super::tracker::{EstimatorConfig, PublishedClock, TrackerCore};
use super::{ClockKind, ClockSettings, SystemClock, TimeSource};

/// Spacing of diagnostic samples: short so `ringbag clock` answers in about a second, long
/// enough for the drift to show above the per-sample noise.
pub const DIAGNOSE_SPACING: Duration = Duration::from_millis(100);

const COST_ITERATIONS: u32 = 200_000;
const DEVICE_COST_ITERATIONS: u32 = 20_000;

/// One diagnostic measurement.
#[derive(Debug, Clone, Copy)]
pub struct SampleReport {
    /// System window of the PHC read; the offset's error is at most half of it.
    pub window_ns: i64,
    /// Raw PHC − system UTC (CLOCK_REALTIME), before any time-scale correction.
    pub phc_minus_utc_ns: i64,
    /// Distance from the final fit, ns.
    pub residual_ns: f64,
}

/// ns per call of each way to get a timestamp.
#[derive(Debug, Clone, Copy)]
pub struct StampCosts {
    pub tracked_ns: f64,
    pub system_ns: f64,
    /// Direct clock_gettime on the device clock (None without a device).
    pub device_ns: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct ClockReport {
    pub requested: ClockKind,
    /// "ptp" or "system".
    pub source: &'static str,
    pub device: Option<PathBuf>,
    pub method: Option<ReadMethod>,
    pub fallback_reason: Option<String>,
    pub settings: ClockSettings,
    pub samples: Vec<SampleReport>,
    /// Median raw PHC − system UTC, ns.
    pub phc_minus_utc_ns: Option<i64>,
    /// Recorder stamp − system UTC after the time-scale correction, ns (≈ 0 when PTP,
    /// phc2sys and the settings agree).
    pub offset_ns: Option<i64>,
    pub drift_ppb: Option<f64>,
    pub uncertainty_ns: Option<f64>,
    pub hint: Option<String>,
    pub costs: StampCosts,
}

fn per_call(iterations: u32, mut f: impl FnMut() -> i64) -> f64 {
    let t0 = Instant::now();
    let mut acc = 0i64;
    for _ in 0..iterations {
        acc = acc.wrapping_add(f());
    }
    black_box(acc);
    t0.elapsed().as_nanos() as f64 / f64::from(iterations.max(1))
}

/// Measures ns per stamp of the tracked clock, the system clock, and a direct read of the
/// device clock.
pub fn measure_stamp_costs(
    tracked: &dyn TimeSource,
    device: Option<&PtpDevice>,
    iterations: u32,
) -> StampCosts {
    let tracked_ns = per_call(iterations, || tracked.now_ns());
    let system_ns = per_call(iterations, || SystemClock.now_ns());
    let device_ns = device.map(|d| per_call(iterations, || d.read_phc_ns().unwrap_or(0)));
    StampCosts {
        tracked_ns,
        system_ns,
        device_ns,
    }
}

/// Measures the configured clock with `samples` samples `DIAGNOSE_SPACING` apart. `ptp`
/// propagates device errors; `auto` reports the fallback instead.
pub fn diagnose(settings: &ClockSettings, samples: usize) -> Result<ClockReport, ClockError> {
    settings.validate()?;
    let mut report = ClockReport {
        requested: settings.kind,
        source: "system",
        device: None,
        method: None,
        fallback_reason: None,
        settings: settings.clone(),
        samples: Vec::new(),
        phc_minus_utc_ns: None,
        offset_ns: None,
        drift_ppb: None,
        uncertainty_ns: None,
        hint: None,
        costs: measure_stamp_costs(&SystemClock, None, COST_ITERATIONS),
    };
    let device = match settings.kind {
        ClockKind::System => return Ok(report),
        ClockKind::Ptp => PtpDevice::open(&settings.ptp_device)?,
        ClockKind::Auto => match PtpDevice::open(&settings.ptp_device) {
            Ok(d) => d,
            Err(e) => {
                report.device = Some(settings.ptp_device.clone());
                report.fallback_reason = Some(e.to_string());
                return Ok(report);
            }
        },
    };
    let mut device = device;
    let cfg = EstimatorConfig {
        step_threshold_ns: settings.step_threshold_ns(),
        ..EstimatorConfig::default()
    };
    let mut core = TrackerCore::new(
        cfg,
        settings.phc_minus_utc_ns(),
        DIAGNOSE_SPACING,
        device.name(),
    );
    let n = samples.clamp(2, 1000);
    let mut raw = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 {
            std::thread::sleep(DIAGNOSE_SPACING);
        }
        let s = device.sample()?;
        let rt_minus_mono = realtime_minus_monotonic_ns();
        raw.push((s, rt_minus_mono));
        core.poll(Ok(s), s.sys_after_ns);
    }
    let est = core.estimate();
    report.source = "ptp";
    report.device = Some(device.path().to_path_buf());
    report.method = Some(device.method());
    report.samples = raw
        .iter()
        .map(|(s, rtm)| SampleReport {
            window_ns: s.window_ns(),
            phc_minus_utc_ns: s.phc_ns - (s.sys_mid_ns() + rtm),
            residual_ns: est.map_or(0.0, |e| (s.phc_ns - e.phc_at(s.sys_mid_ns())) as f64),
        })
        .collect();
    let mut diffs: Vec<i64> = report.samples.iter().map(|s| s.phc_minus_utc_ns).collect();
    diffs.sort_unstable();
    let phc_minus_utc = diffs.get(diffs.len() / 2).copied();
    report.phc_minus_utc_ns = phc_minus_utc;
    if let (Some(e), Some((last, rtm))) = (est, raw.last()) {
        let mid = last.sys_mid_ns();
        report.offset_ns = Some(e.phc_at(mid) - settings.phc_minus_utc_ns() - (mid + rtm));
        report.drift_ppb = Some(e.drift_ppb);
        report.uncertainty_ns = Some(e.uncertainty_ns);
    }
    report.hint = phc_minus_utc.and_then(|d| timescale_hint(settings, d));
    report.costs = measure_stamp_costs(
        &PublishedTimeSource(core.published()),
        Some(&device),
        DEVICE_COST_ITERATIONS,
    );
    Ok(report)
}

struct PublishedTimeSource(std::sync::Arc<PublishedClock>);

impl TimeSource for PublishedTimeSource {
    fn now_ns(&self) -> i64 {
        self.0.now_ns()
    }
}

/// Spots the field's classic mistakes from the raw PHC − UTC difference.
fn timescale_hint(settings: &ClockSettings, phc_minus_utc_ns: i64) -> Option<String> {
    const S: f64 = 1e9;
    let d = phc_minus_utc_ns as f64 / S;
    let tai = settings.tai_utc_offset_s as f64;
    let expected = settings.phc_minus_utc_ns() as f64 / S;
    if (d - expected).abs() < 0.5 {
        return None;
    }
    Some(if d.abs() < 0.5 {
        "the PHC looks like it runs on UTC: use --ptp-timescale utc, or stamps will be off by the TAI-UTC offset".to_string()
    } else if (d - tai).abs() < 0.5 || (d - 37.0).abs() < 0.5 {
        "the PHC looks like it runs on TAI: use --ptp-timescale tai (and --tai-utc-offset 37), or stamps will be 37 s ahead".to_string()
    } else {
        format!(
            "the PHC and the system clock disagree by {d:.3} s: is ptp4l synchronised and phc2sys (or NTP) setting the system clock?"
        )
    })
}

fn signed_s(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:09} s", a / 1_000_000_000, a % 1_000_000_000)
}

impl fmt::Display for ClockReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "requested:        --clock {}", self.requested.as_str())?;
        match (&self.device, self.method) {
            (Some(dev), Some(m)) => {
                writeln!(f, "clock source:     ptp, {} via {m}", dev.display())?
            }
            _ => writeln!(f, "clock source:     system (CLOCK_REALTIME)")?,
        }
        if let Some(r) = &self.fallback_reason {
            writeln!(f, "fallback:         {r}")?;
        }
        if self.source == "ptp" {
            let s = &self.settings;
            writeln!(
                f,
                "time scale:       {} (stamps = PHC {})",
                s.timescale.as_str(),
                match s.timescale {
                    super::Timescale::Tai => format!("- {} s", s.tai_utc_offset_s),
                    super::Timescale::Utc => "as is".into(),
                }
            )?;
        }
        if let Some(d) = self.phc_minus_utc_ns {
            writeln!(
                f,
                "PHC - UTC:        {} (raw PHC minus system clock)",
                signed_s(d)
            )?;
        }
        if let Some(o) = self.offset_ns {
            writeln!(
                f,
                "offset:           {:+.3} us (recorder stamp minus system clock)",
                o as f64 / 1e3
            )?;
        }
        if let Some(d) = self.drift_ppb {
            writeln!(f, "drift:            {d:+.1} ppb (PHC vs CLOCK_MONOTONIC)")?;
        }
        if let Some(u) = self.uncertainty_ns {
            writeln!(f, "uncertainty:      {u:.0} ns (offset estimate)")?;
        }
        if let Some(h) = &self.hint {
            writeln!(f, "WARNING:          {h}")?;
        }
        if !self.samples.is_empty() {
            writeln!(
                f,
                "samples ({} ms apart): uncertainty = half the window",
                DIAGNOSE_SPACING.as_millis()
            )?;
            writeln!(
                f,
                "  {:>3}  {:>10}  {:>13}  {:>22}  {:>11}",
                "#", "window ns", "uncertainty ns", "PHC - UTC", "residual ns"
            )?;
            for (i, s) in self.samples.iter().enumerate() {
                writeln!(
                    f,
                    "  {:>3}  {:>10}  {:>13}  {:>22}  {:>11.0}",
                    i + 1,
                    s.window_ns,
                    s.window_ns / 2,
                    signed_s(s.phc_minus_utc_ns),
                    s.residual_ns
                )?;
            }
        }
        write!(
            f,
            "cost per stamp:   {:.1} ns ({}), system clock {:.1} ns",
            self.costs.tracked_ns, self.source, self.costs.system_ns
        )?;
        if let Some(d) = self.costs.device_ns {
            write!(f, ", direct device read {d:.1} ns")?;
        }
        writeln!(f)
    }
}
