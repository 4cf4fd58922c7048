//! `ringbag daemon`: the always-on service. One bag per start (and per SIGHUP) in the
//! recording root, the budget over every bag in it, systemd's notify protocol (READY,
//! STOPPING, STATUS, EXTEND_TIMEOUT_USEC, a progress-gated WATCHDOG), SIGUSR1 to close the
//! split at once, SIGHUP to reload, and the status file.
//!
//! It records through `record::run_with`, the same code path as `ringbag record`, with
//! [`Hooks`] for everything the service adds.

pub mod notify;
pub mod status;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use crate::bag::lock::{RootLock, RootLockError};
use crate::bag::schema::StoragePreset;
use crate::bag::writer::WriterOptions;
use crate::bag::Flavour;
use crate::config::{Checked, ConfigError, ServiceConfig, SourceChoice, SyntheticRate};
use crate::pipeline::PipelineConfig;
use crate::record::{self, RecordError, RecordSettings, Running, SourceSettings, Supervisor};
use crate::signals;
use crate::source::generator::{GeneratorConfig, Pace};
use crate::upload::agent::UploadAgent;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: cannot create the recording root: {source}", path.display())]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(nix::Error),
    /// Another daemon records into the root: refused before anything is touched.
    #[error(transparent)]
    RootLock(#[from] RootLockError),
    #[error("{0}")]
    Record(RecordError),
}

impl ServiceError {
    /// Bad input (exit 2, and systemd's RestartPreventExitStatus=2 stops a restart loop).
    pub fn is_bad_input(&self) -> bool {
        match self {
            ServiceError::Config(_) => true,
            ServiceError::RootLock(e) => e.is_bad_input(),
            ServiceError::Record(e) => e.is_bad_input(),
            _ => false,
        }
    }
}

/// The last warning or error logged, for the status file.
static LAST_PROBLEM: Mutex<Option<String>> = Mutex::new(None);

/// Called by the logger for every warning and error.
pub fn remember_problem(level: log::Level, message: &str) {
    if let Ok(mut last) = LAST_PROBLEM.lock() {
        *last = Some(format!(
            "{} {}: {message}",
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ"),
            level.as_str().to_lowercase()
        ));
    }
}

fn last_problem() -> Option<String> {
    LAST_PROBLEM.lock().ok().and_then(|l| l.clone())
}

/// `2026-12-02T03-04-05Z_0007`: UTC start time, then a sequence number one above the highest
/// in the root, so names never collide and sort by start even when the clock jumps back
/// (a cold boot without RTC).
pub fn next_bag_name(root: &Path, now: chrono::DateTime<chrono::Utc>) -> String {
    let highest = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(bag_sequence))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    format!(
        "{}_{:04}",
        now.format("%Y-%m-%dT%H-%M-%SZ"),
        highest.saturating_add(1)
    )
}

/// The sequence number of a name [`next_bag_name`] made.
fn bag_sequence(name: &str) -> Option<u64> {
    let (stamp, seq) = name.rsplit_once('_')?;
    let ours = stamp.len() == 20
        && stamp.ends_with('Z')
        && stamp.as_bytes().get(10) == Some(&b'T')
        && !seq.is_empty()
        && seq.bytes().all(|b| b.is_ascii_digit());
    ours.then(|| seq.parse().ok()).flatten()
}

/// The recording settings for one bag of a checked config.
pub fn record_settings(
    c: &Checked,
    bag: PathBuf,
    upload: Option<&crate::upload::agent::UploadAgent>,
) -> RecordSettings {
    let source = match c.source {
        SourceChoice::Synthetic => SourceSettings::Synthetic(GeneratorConfig {
            profile: c.synthetic_profile,
            pace: match c.synthetic_rate {
                SyntheticRate::Realtime => Pace::Realtime,
                SyntheticRate::Max => Pace::Max,
            },
            count: c.synthetic_count,
            topics: c.synthetic_topics,
            // A CLI-only benchmark flag (record --synthetic-payload); the service records
            // the default.
            payload: Default::default(),
        }),
        #[cfg(feature = "ros")]
        SourceChoice::Ros => {
            SourceSettings::Ros(Box::new(crate::source::select::RosSourceOptions {
                polling_interval: Duration::from_millis(100),
                no_discovery: false,
                ..c.config.selection()
            }))
        }
        // `ServiceConfig::check` refuses "ros" in a build without it.
        #[cfg(not(feature = "ros"))]
        SourceChoice::Ros => SourceSettings::Synthetic(GeneratorConfig {
            profile: c.synthetic_profile,
            pace: Pace::Realtime,
            count: c.synthetic_count,
            topics: crate::source::generator::ALL_TOPICS,
            payload: Default::default(),
        }),
    };
    RecordSettings {
        output: bag,
        writer: WriterOptions {
            flavour: c.config.bag_format.unwrap_or_else(Flavour::from_env),
            preset: c
                .config
                .storage_preset_profile
                .unwrap_or(StoragePreset::WriteOptimized),
            max_bag_size: c.budgets.max_bag_size,
            max_bag_duration_ns: c.budgets.max_bag_duration_ns,
            custom_data: BTreeMap::new(),
            extra_pragmas: String::new(),
            compression: c.compression,
        },
        pipeline: PipelineConfig::for_limits(
            c.max_cache_size,
            c.budgets.max_bag_size,
            &c.retention,
        ),
        retention: c.retention.clone(),
        source,
        clock: c.clock.clone(),
        // The root is a recording root: recover what a crash left, budget over every bag.
        recover: true,
        status_file: None,
        keyboard_controls: false,
        // The service's floor is its config's (`min_free_space`, off by default).
        default_free_floor: None,
        snapshot: c.snapshot.clone(),
        // Retention asks the uploader what is out, and deletes that first.
        upload_retention: crate::retention::UploadRetention {
            ledger: upload.map(|a| a.ledger()),
            delete_after_upload: upload.is_some_and(|a| a.delete_after_upload()),
        },
    }
}

/// `ringbag daemon --config FILE --check-config`: also refuses `[upload]` without
/// credentials, which the daemon itself only logs (it records without uploading), and says
/// where uploads go (`upload: to ENDPOINT/BUCKET as ROBOT, credentials from SOURCE`).
pub fn check_config(path: &Path) -> Result<Checked, ConfigError> {
    let checked = ServiceConfig::load_checked(path)?;
    if let Some(e) = checked.upload_problem() {
        return Err(e);
    }
    if let Some(s) = checked.upload_summary() {
        log::info!("upload: {s}");
    }
    Ok(checked)
}

/// Loads and checks the config for the daemon (at start and on SIGHUP): as
/// [`ServiceConfig::load_checked`], and says where uploads go or why they cannot run. Missing
/// credentials do not stop the recording: a recorder that refuses to start records nothing.
fn load_for_daemon(path: &Path) -> Result<Checked, ConfigError> {
    let checked = ServiceConfig::load_checked(path)?;
    if let Some(e) = checked.upload_problem() {
        log::error!(
            "{e}; recording goes on, nothing is uploaded until a reload (SIGHUP) finds credentials"
        );
    } else if let Some(s) = checked.upload_summary() {
        log::info!("upload: {s}");
    }
    Ok(checked)
}

/// How often STATUS= and the status file are refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// `ringbag daemon --config FILE`: record until SIGTERM/SIGINT (Ok), or until the writer
/// fails (Err: exit 1, and systemd restarts the service).
pub fn run(config_path: &Path) -> Result<(), ServiceError> {
    // SIGHUP, SIGUSR1 and SIGUSR2 are caught since `main_entry` began; again here for a
    // caller of the library that did not go through it.
    signals::install_requests().map_err(ServiceError::Signals)?;
    let mut checked = load_for_daemon(config_path)?;
    let started = Instant::now();
    let mut collector = status::Collector::new(config_path.to_path_buf(), started);
    let mut ready_sent = false;
    // Carried from a bag to the next across a SIGHUP: the black box's history, and when the
    // old bag stopped accepting messages (the start of the reload's unrecorded gap).
    let mut kept_ring = None;
    let mut reload_began = None;
    // The control socket, kept across reloads that leave its path alone: `ringbag pause` and
    // `resume` never find it missing while the daemon runs.
    let mut kept_control = None;
    // The root's lock for the daemon's whole life (a reload to another root swaps it), taken
    // before recovery, the ring, a bag or the status file are touched: a second daemon on the
    // same root stops here.
    let mut root_lock = lock_root(&checked.output_root)?;
    // Started before the recording (and its crash recovery, whose budget asks the uploader
    // what is out); kept across reloads that change neither the root nor `[upload]`.
    let mut uploader: Option<UploadAgent> = None;
    let mut metrics = crate::metrics::Publisher::off();
    let mut last_status = None;
    // Pause and resume (`ringbag pause` / `resume`) hold across reloads: a reload must not
    // start recording what the operator paused.
    let pause = std::sync::Arc::new(crate::pipeline::PauseSwitch::default());
    loop {
        if metrics.settings() != &checked.metrics {
            // The old endpoint closes first: the new one may listen on the same port.
            drop(std::mem::replace(
                &mut metrics,
                crate::metrics::Publisher::off(),
            ));
            metrics =
                crate::metrics::Publisher::start(checked.metrics.clone()).unwrap_or_else(|e| {
                    // Recording matters more than its metrics: go on without the endpoint.
                    log::error!("{e}; recording goes on without it until a reload (SIGHUP)");
                    crate::metrics::Publisher::start(crate::config::MetricsSettings {
                        listen: None,
                        ..checked.metrics.clone()
                    })
                    .unwrap_or_else(|_| crate::metrics::Publisher::off())
                });
        }
        let root = checked.output_root.clone();
        keep_uploader(&mut uploader, &checked);
        let bag = root.join(next_bag_name(&root, chrono::Utc::now()));
        let mut settings = record_settings(&checked, bag.clone(), uploader.as_ref());
        settings.pipeline.pause = pause.clone();
        collector.reset_rates();
        let mut hooks = Hooks {
            config_path,
            status_file: checked.status_file.clone(),
            collector: &mut collector,
            ready_sent: &mut ready_sent,
            extender: None,
            watchdog: None,
            last_status: None,
            status_failing: false,
            reload: None,
            ring: kept_ring.take(),
            control: kept_control.take(),
            reload_began: reload_began.take(),
            reload_lock: None,
            uploader: uploader.as_ref(),
            metrics: &mut metrics,
            last: None,
        };
        let result = record::run_with(settings, &mut hooks);
        last_status = hooks.last.take().or(last_status);
        let reload = hooks.reload.take();
        let ring = hooks.ring.take();
        let control = hooks.control.take();
        let began = hooks.reload_began.take();
        let reload_lock = hooks.reload_lock.take();
        match result {
            Ok(out) => log::info!(
                ringbag_bag:% = bag.display();
                "bag {} finished: {} messages written, {} dropped",
                bag.display(),
                out.summary.written,
                out.summary.dropped_total()
            ),
            Err(f) => {
                if let Some(s) = &f.summary {
                    log::info!(
                        "bag {}: {} messages written before the error",
                        bag.display(),
                        s.written
                    );
                }
                if let Some(st) = &last_status {
                    metrics.publish(st, crate::metrics::State::Exiting);
                }
                return Err(ServiceError::Record(f.error));
            }
        }
        match reload {
            Some(new) if !signals::stop_requested() => {
                checked = *new;
                kept_ring = ring;
                kept_control = control;
                reload_began = began;
                if let Some(l) = reload_lock {
                    // The new root's lock was taken when the reload was accepted.
                    root_lock = l;
                }
                log::info!("configuration reloaded; starting a new bag");
            }
            _ => break,
        }
    }
    if let Some(u) = uploader.take() {
        u.stop();
    }
    if let Some(st) = &last_status {
        // The last figures, saying the recorder is down: a scraper of the textfile sees the
        // stop at once instead of a file going stale.
        metrics.publish(st, crate::metrics::State::Exiting);
    }
    drop(root_lock);
    Ok(())
}

/// Start, keep, replace or stop the uploader to match `checked`'s `[upload]`. A config whose
/// credentials cannot be had (logged when it was loaded) or whose target cannot be set up
/// records without uploading until a reload fixes it.
fn keep_uploader(uploader: &mut Option<UploadAgent>, checked: &Checked) {
    let root = &checked.output_root;
    let wanted = checked
        .upload
        .as_ref()
        .and_then(|p| p.resolved.as_ref().ok());
    if let (Some(u), Some(r)) = (uploader.as_ref(), wanted) {
        if u.serves(r, root) {
            return;
        }
    }
    if let Some(u) = uploader.take() {
        u.stop();
    }
    if let Some(r) = wanted {
        match UploadAgent::start(r, root) {
            Ok(u) => *uploader = Some(u),
            Err(e) => log::error!(
                "upload: {e}; recording goes on, nothing is uploaded until a reload (SIGHUP) fixes it"
            ),
        }
    }
}

/// Create the recording root if needed and lock it ([`RootLock`]).
fn lock_root(root: &Path) -> Result<RootLock, ServiceError> {
    std::fs::create_dir_all(root).map_err(|source| ServiceError::Root {
        path: root.to_path_buf(),
        source,
    })?;
    Ok(RootLock::acquire(root)?)
}

/// The service's side of a recording.
struct Hooks<'a> {
    config_path: &'a Path,
    status_file: PathBuf,
    collector: &'a mut status::Collector,
    ready_sent: &'a mut bool,
    extender: Option<notify::Extender>,
    watchdog: Option<notify::Watchdog>,
    last_status: Option<Instant>,
    status_failing: bool,
    /// A valid new config read on SIGHUP: end this bag, start the next with it.
    reload: Option<Box<Checked>>,
    /// The snapshot ring, handed from the bag before a reload to the next.
    ring: Option<std::sync::Arc<crate::snapshot::ring::Ring>>,
    /// The control socket, handed from the bag before a reload to the next.
    control: Option<crate::snapshot::control::ControlServer>,
    /// When a reload made the bag before this one stop accepting messages (in the bag that
    /// reloads: when it decided to).
    reload_began: Option<Instant>,
    /// The new root's lock when the reload moves to another root.
    reload_lock: Option<RootLock>,
    uploader: Option<&'a UploadAgent>,
    metrics: &'a mut crate::metrics::Publisher,
    /// The last status published, for the metrics written at exit.
    last: Option<status::Status>,
}

impl Hooks<'_> {
    fn publish_status(&mut self, run: &Running<'_>) {
        let st = self.collector.collect(run, last_problem());
        self.publish(st);
    }

    fn publish(&mut self, mut st: status::Status) {
        st.upload = self.uploader.map(UploadAgent::status);
        let state = if st.stopped.is_none() {
            crate::metrics::State::Recording
        } else {
            crate::metrics::State::NotRecording
        };
        self.metrics.publish(&st, state);
        let st = &*self.last.insert(st);
        notify::send(&[NotifyState::Status(&st.line())]);
        match (status::write(&self.status_file, st), self.status_failing) {
            (Ok(()), true) => {
                self.status_failing = false;
                log::info!("status file {}: written again", self.status_file.display());
            }
            (Err(e), false) => {
                self.status_failing = true;
                log::warn!(
                    "status file {}: cannot write it: {e}; retrying quietly",
                    self.status_file.display()
                );
            }
            _ => {}
        }
        self.last_status = Some(Instant::now());
    }
}

impl Supervisor for Hooks<'_> {
    fn recovering(&mut self, active: bool) {
        if active && !*self.ready_sent {
            self.extender = Some(notify::Extender::start());
        } else if let Some(e) = self.extender.take() {
            e.stop();
        }
    }

    fn started(&mut self, run: &Running<'_>) {
        // READY only once the writer has turned once: the first split is open and the
        // budget over the root has been enforced (the writer does that before any message).
        let progress = run.pipeline.progress();
        while progress.loops.load(Relaxed) == 0 && !run.pipeline.stopping() {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(began) = self.reload_began.take() {
            // The sources stopped when the old bag began to finish; this one's runs now.
            let gap = began.elapsed();
            self.collector.note_reload(gap);
            log::info!(
                ringbag_bag:% = run.settings.output.display();
                "reload: recording into {}; {} ms were not recorded during the reload",
                run.settings.output.display(),
                gap.as_millis()
            );
        }
        self.publish_status(run);
        notify::send(&[NotifyState::Ready]);
        *self.ready_sent = true;
        self.watchdog = notify::Watchdog::from_env(progress.loops.load(Relaxed));
    }

    fn tick(&mut self, run: &Running<'_>) -> bool {
        let progress = run.pipeline.progress();
        if let Some(wd) = self.watchdog.as_mut() {
            wd.poll(progress.loops.load(Relaxed));
        }
        if signals::take_reload() {
            let loaded = load_for_daemon(self.config_path).map_err(|e| e.to_string());
            // Another root must be ours before this bag ends: a root another daemon holds
            // keeps the running configuration, as an invalid config does.
            let current = &run.settings.output;
            let loaded = loaded.and_then(|c| {
                let same = |a: &Path, b: &Path| {
                    a == b
                        || std::fs::canonicalize(a)
                            .ok()
                            .is_some_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
                };
                // A control socket moved to a path another recorder listens on would stop
                // this daemon at the new bag's start: refused now, as an invalid config is.
                let socket = c.snapshot.control_socket.as_deref();
                if let Some(new) = socket.filter(|n| {
                    run.settings
                        .snapshot
                        .control_socket
                        .as_deref()
                        .is_none_or(|old| !same(old, n))
                }) {
                    crate::snapshot::control::refuse_if_listening(new)
                        .map_err(|e| format!("control_socket: {e}"))?;
                }
                if current.parent().is_some_and(|r| same(r, &c.output_root)) {
                    return Ok(c);
                }
                let l = lock_root(&c.output_root).map_err(|e| e.to_string())?;
                self.reload_lock = Some(l);
                Ok(c)
            });
            match loaded {
                Ok(c) => {
                    log::info!("SIGHUP: configuration valid; finishing this bag");
                    notify::send(&[NotifyState::Reloading]);
                    self.reload = Some(Box::new(c));
                    self.reload_began = Some(Instant::now());
                    return true;
                }
                Err(e) => log::error!("SIGHUP: {e}; keeping the running configuration"),
            }
        }
        if self.last_status.is_none_or(|t| t.elapsed() >= STATUS_EVERY) {
            self.publish_status(run);
        }
        false
    }

    fn take_ring(&mut self) -> Option<std::sync::Arc<crate::snapshot::ring::Ring>> {
        self.ring.take()
    }

    fn keep_ring(&mut self, ring: std::sync::Arc<crate::snapshot::ring::Ring>) {
        // Only a reload goes on with it; a stop drops it (marked clean, as before).
        if self.reload.is_some() {
            self.ring = Some(ring);
        }
    }

    fn take_control(&mut self) -> Option<crate::snapshot::control::ControlServer> {
        self.control.take()
    }

    fn keep_control(&mut self, control: crate::snapshot::control::ControlServer) {
        // As the ring: only a reload goes on with it; a stop closes it now.
        if self.reload.is_some() {
            self.control = Some(control);
        }
    }

    fn finishing(&mut self, run: &Running<'_>) {
        if signals::stop_requested() {
            notify::send(&[NotifyState::Stopping]);
        }
        self.publish_status(run);
    }

    fn finished(&mut self, done: &record::Finished<'_>) {
        // The last word: the queue that `finishing` still saw is written (or counted lost)
        // now, and the file left after the service stops must say what the bag holds.
        let st = self.collector.collect_finished(done, last_problem());
        self.publish(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn bag_names_never_collide_when_the_clock_jumps_back() {
        let tmp = tempfile::tempdir().expect("tmp");
        let late = chrono::Utc.with_ymd_and_hms(2026, 12, 2, 3, 4, 5).unwrap();
        let early = chrono::Utc.with_ymd_and_hms(1970, 1, 1, 0, 0, 9).unwrap();
        let a = next_bag_name(tmp.path(), late);
        assert_eq!(a, "2026-12-02T03-04-05Z_0001");
        std::fs::create_dir(tmp.path().join(&a)).unwrap();
        std::fs::create_dir(tmp.path().join("not-a-bag_9999")).unwrap();
        let b = next_bag_name(tmp.path(), early);
        assert_eq!(b, "1970-01-01T00-00-09Z_0002");
        std::fs::create_dir(tmp.path().join(&b)).unwrap();
        // The same second twice: still distinct.
        assert_eq!(
            next_bag_name(tmp.path(), early),
            "1970-01-01T00-00-09Z_0003"
        );
    }
}
