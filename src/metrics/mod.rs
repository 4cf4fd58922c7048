//! Prometheus metrics (issue 25): the recorder's status in the text exposition format 0.0.4,
//! written to a textfile for node_exporter's textfile collector and served at `GET /metrics`.
//!
//! Both ways out carry the same text, rendered once per interval by the status loop from the
//! same [`crate::service::status::Status`] the status file holds: a scrape never touches the
//! recording's threads, it only copies the last rendered text.

pub mod exposition;
pub mod http;
pub mod render;
pub mod textfile;

use std::time::Instant;

use crate::config::MetricsSettings;
use crate::service::status::Status;
pub use render::State;

/// The metrics' way out for a running service: the textfile every `interval`. Lives across
/// reloads (a reload that changes the keys gets a new one).
#[derive(Debug)]
pub struct Publisher {
    settings: MetricsSettings,
    last_textfile: Option<Instant>,
    /// A failing write is logged once, and again when it works again.
    failing: bool,
}

impl Publisher {
    pub fn new(settings: MetricsSettings) -> Self {
        Publisher {
            settings,
            last_textfile: None,
            failing: false,
        }
    }

    pub fn settings(&self) -> &MetricsSettings {
        &self.settings
    }

    /// Called with every status (once a second): renders and writes only what is due, so
    /// with metrics off this is one branch.
    pub fn publish(&mut self, st: &Status, state: State) {
        let Some(path) = self.settings.textfile.clone() else {
            return;
        };
        let due = state == State::Exiting
            || self
                .last_textfile
                .is_none_or(|t| t.elapsed() >= self.settings.interval);
        if !due {
            return;
        }
        self.last_textfile = Some(Instant::now());
        match (
            textfile::write(&path, &render::render(st, state)),
            self.failing,
        ) {
            (Ok(()), true) => {
                self.failing = false;
                log::info!("{}: written again", path.display());
            }
            (Err(e), false) => {
                self.failing = true;
                log::warn!("{e}; retrying every metrics_interval, quietly");
            }
            _ => {}
        }
    }
}

/// `ringbag record`'s side of the metrics: a status every second from the running
/// recording (as the daemon's), the last one from the finished pipeline.
pub struct RecordHooks {
    collector: crate::service::status::Collector,
    publisher: Publisher,
    last: Option<Instant>,
}

impl RecordHooks {
    pub fn new(settings: MetricsSettings) -> Self {
        RecordHooks {
            collector: crate::service::status::Collector::new(
                std::path::PathBuf::new(),
                Instant::now(),
            ),
            publisher: Publisher::new(settings),
            last: None,
        }
    }
}

/// As the daemon's status: once a second.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl crate::record::Supervisor for RecordHooks {
    fn started(&mut self, run: &crate::record::Running<'_>) {
        let st = self.collector.collect(run, None);
        self.publisher.publish(&st, State::Recording);
        self.last = Some(Instant::now());
    }

    fn tick(&mut self, run: &crate::record::Running<'_>) -> bool {
        if self.last.is_none_or(|t| t.elapsed() >= COLLECT_EVERY) {
            self.last = Some(Instant::now());
            let st = self.collector.collect(run, None);
            self.publisher.publish(&st, State::Recording);
        }
        crate::record::Unsupervised.tick(run)
    }

    fn finished(&mut self, done: &crate::record::Finished<'_>) {
        let st = self.collector.collect_finished(done, None);
        self.publisher.publish(&st, State::Exiting);
    }
}
