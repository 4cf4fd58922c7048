//! Starting the recorder's clock with the failure policy, and the handle that stamps.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::ClockError;
use super::phc::{monotonic_now_ns, PhcDevice, PtpDevice, ReadMethod};
use super::tracker::{EstimatorConfig, PublishedClock, TrackerCore, TrackerStatus};
use super::{ClockKind, ClockSettings, SystemClock, TimeSource};

/// Samples taken before `start` returns, so the first stamp already has an offset and a
/// rough drift.
const INITIAL_SAMPLES: usize = 5;
const INITIAL_SPACING: Duration = Duration::from_millis(10);

/// The clock the recorder stamps with. Cheap to clone; the last clone dropped (or
/// [`ClockHandle::stop`]) stops and joins the tracking thread.
#[derive(Clone)]
pub struct ClockHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockHandle")
            .field("source", &self.source_name())
            .field("requested", &self.inner.settings.kind)
            .finish()
    }
}

enum Source {
    System(SystemClock),
    Ptp {
        published: Arc<PublishedClock>,
        status: Arc<Mutex<TrackerStatus>>,
        device: String,
        method: ReadMethod,
    },
}

struct Runner {
    stop_tx: mpsc::Sender<()>,
    join: JoinHandle<()>,
}

struct Inner {
    source: Source,
    settings: ClockSettings,
    fallback_reason: Option<String>,
    runner: Mutex<Option<Runner>>,
}

impl Inner {
    fn stop(&self) {
        let runner = match self.runner.lock() {
            Ok(mut r) => r.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(r) = runner {
            // A send error only means the thread already ended; join either way.
            let _ = r.stop_tx.send(());
            if r.join.join().is_err() {
                log::error!("clock tracking thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl TimeSource for ClockHandle {
    #[inline]
    fn now_ns(&self) -> i64 {
        match &self.inner.source {
            Source::System(s) => s.now_ns(),
            Source::Ptp { published, .. } => published.now_ns(),
        }
    }
    fn custom_data(&self) -> Vec<(String, String)> {
        ClockHandle::custom_data(self)
    }
}

/// Starts the clock the settings ask for.
///
/// - `system`: CLOCK_REALTIME.
/// - `ptp`: the device must open, be a PHC and give a sample, or this returns the error
///   (before any bag exists).
/// - `auto`: as `ptp`, but on any failure logs one warning and uses the system clock.
pub fn start(settings: &ClockSettings) -> Result<ClockHandle, ClockError> {
    settings.validate()?;
    match settings.kind {
        ClockKind::System => Ok(system_handle(settings, None)),
        ClockKind::Ptp => start_ptp(settings),
        ClockKind::Auto => match start_ptp(settings) {
            Ok(h) => Ok(h),
            Err(e) => {
                log::warn!("{e}; --clock auto: stamping with the system clock");
                Ok(system_handle(settings, Some(e.to_string())))
            }
        },
    }
}

fn start_ptp(settings: &ClockSettings) -> Result<ClockHandle, ClockError> {
    let device = PtpDevice::open(&settings.ptp_device)?;
    start_with_device(settings, Box::new(device))
}

fn system_handle(settings: &ClockSettings, fallback_reason: Option<String>) -> ClockHandle {
    ClockHandle {
        inner: Arc::new(Inner {
            source: Source::System(SystemClock),
            settings: settings.clone(),
            fallback_reason,
            runner: Mutex::new(None),
        }),
    }
}

/// Starts PHC tracking on an already opened device (a real one, the stand-in, or a
/// simulation in tests). Fails if none of the initial samples succeeds.
pub fn start_with_device(
    settings: &ClockSettings,
    mut device: Box<dyn PhcDevice>,
) -> Result<ClockHandle, ClockError> {
    settings.validate()?;
    let cfg = EstimatorConfig {
        step_threshold_ns: settings.step_threshold_ns(),
        ..EstimatorConfig::default()
    };
    let name = device.name();
    let mut core = TrackerCore::new(
        cfg,
        settings.phc_minus_utc_ns(),
        settings.poll_interval,
        name.clone(),
    );
    let mut last_err = None;
    for i in 0..INITIAL_SAMPLES {
        if i > 0 {
            std::thread::sleep(INITIAL_SPACING);
        }
        // Errors here are not "losses": the device never worked yet.
        match device.sample() {
            Ok(s) => core.poll(Ok(s), monotonic_now_ns()),
            Err(e) => last_err = Some(e),
        }
    }
    if !core.has_line() {
        return Err(last_err.unwrap_or_else(|| ClockError::Lost {
            device: name.clone().into(),
            reason: "no sample".into(),
        }));
    }
    let published = core.published();
    let status = core.status_handle();
    let method = device.method();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let interval = settings.poll_interval;
    let join = std::thread::Builder::new()
        .name("ringbag-clock".into())
        .spawn(move || {
            // Ends on the stop message or when the handle (the sender) is gone.
            while let Err(RecvTimeoutError::Timeout) = stop_rx.recv_timeout(interval) {
                let r = device.sample();
                core.poll(r, monotonic_now_ns());
            }
        })
        .map_err(ClockError::Spawn)?;
    Ok(ClockHandle {
        inner: Arc::new(Inner {
            source: Source::Ptp {
                published,
                status,
                device: name,
                method,
            },
            settings: settings.clone(),
            fallback_reason: None,
            runner: Mutex::new(Some(Runner { stop_tx, join })),
        }),
    })
}

fn format_utc(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

impl ClockHandle {
    /// "ptp" or "system": what actually stamps.
    pub fn source_name(&self) -> &'static str {
        match self.inner.source {
            Source::System(_) => "system",
            Source::Ptp { .. } => "ptp",
        }
    }

    /// Why `auto` fell back to the system clock, if it did.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback_reason.as_deref()
    }

    /// Tracker counters (None for the system clock).
    pub fn status(&self) -> Option<TrackerStatus> {
        match &self.inner.source {
            Source::System(_) => None,
            Source::Ptp { status, .. } => Some(match status.lock() {
                Ok(s) => s.clone(),
                Err(p) => p.into_inner().clone(),
            }),
        }
    }

    /// Stops and joins the tracking thread; stamping continues with the last offset and
    /// drift. Idempotent; also done when the last clone is dropped.
    pub fn stop(&self) {
        self.inner.stop();
    }

    /// Key/value pairs for the bag's `custom_data`: which clock stamped, the device, the time
    /// scale, offset uncertainty at start and now (call at the end of the bag), steps and
    /// device-loss events.
    pub fn custom_data(&self) -> Vec<(String, String)> {
        let s = &self.inner.settings;
        let mut kv = vec![
            ("ringbag.clock".to_string(), self.source_name().to_string()),
            (
                "ringbag.clock.requested".to_string(),
                s.kind.as_str().to_string(),
            ),
        ];
        if let Some(reason) = &self.inner.fallback_reason {
            kv.push((
                "ringbag.clock.device".into(),
                s.ptp_device.display().to_string(),
            ));
            kv.push(("ringbag.clock.fallback_reason".into(), reason.clone()));
        }
        if let Source::Ptp { device, method, .. } = &self.inner.source {
            kv.push(("ringbag.clock.device".into(), device.clone()));
            kv.push(("ringbag.clock.read_method".into(), method.to_string()));
            kv.push((
                "ringbag.clock.timescale".into(),
                s.timescale.as_str().into(),
            ));
            kv.push((
                "ringbag.clock.phc_minus_utc_s".into(),
                (s.phc_minus_utc_ns() / 1_000_000_000).to_string(),
            ));
        }
        if let Some(st) = self.status() {
            let fmt =
                |u: Option<f64>| u.map_or_else(|| "unknown".to_string(), |u| format!("{u:.0}"));
            kv.push((
                "ringbag.clock.uncertainty_start_ns".into(),
                fmt(st.uncertainty_start_ns),
            ));
            kv.push((
                "ringbag.clock.uncertainty_end_ns".into(),
                fmt(st.uncertainty_now_ns),
            ));
            if let Some(d) = st.drift_ppb {
                kv.push(("ringbag.clock.drift_ppb".into(), format!("{d:.1}")));
            }
            kv.push(("ringbag.clock.steps".into(), st.steps.to_string()));
            kv.push(("ringbag.clock.device_losses".into(), st.losses.to_string()));
            if !st.events.is_empty() {
                let mut ev: Vec<String> = st
                    .events
                    .iter()
                    .map(|e| format!("{} {}", format_utc(e.utc_ns), e.what))
                    .collect();
                if st.events_dropped > 0 {
                    ev.push(format!("… {} more", st.events_dropped));
                }
                kv.push(("ringbag.clock.events".into(), ev.join("; ")));
            }
        }
        kv
    }
}
