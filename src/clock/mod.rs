//! Clocks that stamp messages. Owned by the PTP work (issue 6).
//!
//! Contract used by the rest of the crate: a `TimeSource` returns UTC nanoseconds since the
//! epoch, monotonic per source, cheaply (no syscall beyond a vDSO clock read).
//!
//! - [`phc`]: reading a PTP hardware clock (PHC) against the system clock.
//! - [`tracker`]: offset/drift estimation and the lock-free published snapshot.
//! - [`handle`]: [`start`] with the failure policy, the [`ClockHandle`] the recorder stamps
//!   with, and its `custom_data`.
//! - [`diagnose`](mod@diagnose): the `ringbag clock` report.

pub mod diagnose;
pub mod error;
pub mod handle;
pub mod phc;
pub mod sim;
pub mod tracker;

use std::path::PathBuf;
use std::time::Duration;

pub use diagnose::{diagnose, measure_stamp_costs, ClockReport, StampCosts};
pub use error::ClockError;
pub use handle::{start, start_with_device, ClockHandle};
pub use phc::{PhcDevice, PhcSample, PtpDevice, ReadMethod, MONOTONIC_RAW_STAND_IN};
pub use sim::SimClock;

/// Stamps messages with UTC nanoseconds since the Unix epoch.
pub trait TimeSource: Send + Sync {
    fn now_ns(&self) -> i64;
    /// What the bag's custom_data should record about this clock (read once, at finish).
    fn custom_data(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// CLOCK_REALTIME through the vDSO.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl TimeSource for SystemClock {
    fn now_ns(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_nanos() as i64
    }
}

/// `--clock`: which clock stamps messages.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ClockKind {
    /// CLOCK_REALTIME.
    System,
    /// The PTP hardware clock; refuse to start if it cannot be read.
    Ptp,
    /// The PTP hardware clock if it can be read, else the system clock (one warning).
    #[default]
    Auto,
}

impl ClockKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ClockKind::System => "system",
            ClockKind::Ptp => "ptp",
            ClockKind::Auto => "auto",
        }
    }
}

/// `--ptp-timescale`: what the PHC counts. ptp4l keeps it on TAI unless told otherwise.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Timescale {
    /// PHC counts TAI; stamps are PHC − TAI-UTC offset.
    #[default]
    Tai,
    /// PHC counts UTC; stamps are the PHC as is.
    Utc,
}

impl Timescale {
    pub fn as_str(&self) -> &'static str {
        match self {
            Timescale::Tai => "tai",
            Timescale::Utc => "utc",
        }
    }
}

pub const DEFAULT_PTP_DEVICE: &str = "/dev/ptp0";
/// TAI − UTC since 2017-01-01 (no leap second has been scheduled since).
pub const DEFAULT_TAI_UTC_OFFSET_S: i64 = 37;
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(1000);
pub const DEFAULT_STEP_THRESHOLD: Duration = Duration::from_micros(100);
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(60);

/// Everything the clock area needs; the CLI and the config file fill it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockSettings {
    pub kind: ClockKind,
    /// `--ptp-device`; `@monotonic-raw` selects the CLOCK_MONOTONIC_RAW stand-in.
    pub ptp_device: PathBuf,
    pub timescale: Timescale,
    /// `--tai-utc-offset`, seconds; only used with `Timescale::Tai`.
    pub tai_utc_offset_s: i64,
    /// How often the background thread measures the offset.
    pub poll_interval: Duration,
    /// A PHC jump against the system clock beyond this is logged and counted as a step.
    pub step_threshold: Duration,
}

impl Default for ClockSettings {
    fn default() -> Self {
        Self {
            kind: ClockKind::Auto,
            ptp_device: PathBuf::from(DEFAULT_PTP_DEVICE),
            timescale: Timescale::Tai,
            tai_utc_offset_s: DEFAULT_TAI_UTC_OFFSET_S,
            poll_interval: DEFAULT_POLL_INTERVAL,
            step_threshold: DEFAULT_STEP_THRESHOLD,
        }
    }
}

impl ClockSettings {
    pub fn validate(&self) -> Result<(), ClockError> {
        if self.poll_interval < MIN_POLL_INTERVAL || self.poll_interval > MAX_POLL_INTERVAL {
            return Err(ClockError::InvalidSettings(format!(
                "poll interval {} ms is outside {}..={} ms",
                self.poll_interval.as_millis(),
                MIN_POLL_INTERVAL.as_millis(),
                MAX_POLL_INTERVAL.as_millis()
            )));
        }
        if !(0..=100).contains(&self.tai_utc_offset_s) {
            return Err(ClockError::InvalidSettings(format!(
                "--tai-utc-offset {} s is outside 0..=100 s",
                self.tai_utc_offset_s
            )));
        }
        if self.step_threshold < Duration::from_micros(1)
            || self.step_threshold > Duration::from_secs(1)
        {
            return Err(ClockError::InvalidSettings(format!(
                "step threshold {} µs is outside 1 µs..=1 s",
                self.step_threshold.as_micros()
            )));
        }
        Ok(())
    }

    /// PHC time − UTC under these settings, ns: what to subtract from the PHC.
    pub fn phc_minus_utc_ns(&self) -> i64 {
        match self.timescale {
            Timescale::Tai => self.tai_utc_offset_s * 1_000_000_000,
            Timescale::Utc => 0,
        }
    }

    pub(crate) fn step_threshold_ns(&self) -> i64 {
        i64::try_from(self.step_threshold.as_nanos()).unwrap_or(i64::MAX)
    }
}
