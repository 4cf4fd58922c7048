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

/// The metrics' ways out for a running recorder: the textfile every `interval`, and the
/// text `GET /metrics` serves, replaced with every status (once a second). Lives across
/// reloads (a reload that changes the keys gets a new one).
pub struct Publisher {
    settings: MetricsSettings,
    last_textfile: Option<Instant>,
    /// A failing write is logged once, and again when it works again.
    failing: bool,
    server: Option<(http::Server, std::sync::Arc<http::Body>)>,
}

impl Publisher {
    /// Metrics as `settings` ask, with the endpoint listening if `metrics_listen` is set.
    pub fn start(settings: MetricsSettings) -> Result<Self, http::HttpError> {
        let server = match settings.listen {
            Some(addr) => {
                let body = std::sync::Arc::new(http::Body::new());
                let server = http::Server::start(addr, body.clone())?;
                log::info!("metrics: serving GET /metrics on {}", server.local_addr());
                Some((server, body))
            }
            None => None,
        };
        Ok(Publisher {
            settings,
            last_textfile: None,
            failing: false,
            server,
        })
    }

    /// No metrics at all (the endpoint could not start, or none is configured).
    pub fn off() -> Self {
        Publisher {
            settings: MetricsSettings::default(),
            last_textfile: None,
            failing: false,
            server: None,
        }
    }

    pub fn settings(&self) -> &MetricsSettings {
        &self.settings
    }

    /// Where the endpoint listens (its port when `metrics_listen` asked for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(|(s, _)| s.local_addr())
    }

    /// Called with every status (once a second): renders only when a way out needs it, so
    /// with metrics off this is two branches.
    pub fn publish(&mut self, st: &Status, state: State) {
        let textfile = self.settings.textfile.clone().filter(|_| {
            state == State::Exiting
                || self
                    .last_textfile
                    .is_none_or(|t| t.elapsed() >= self.settings.interval)
        });
        if textfile.is_none() && self.server.is_none() {
            return;
        }
        let text = render::render(st, state);
        if let Some(path) = textfile {
            self.last_textfile = Some(Instant::now());
            match (textfile::write(&path, &text), self.failing) {
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
        if let Some((_, body)) = &self.server {
            body.set(text);
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
    /// Fails only when `--metrics-listen` cannot be bound.
    pub fn start(settings: MetricsSettings) -> Result<Self, http::HttpError> {
        Ok(RecordHooks {
            collector: crate::service::status::Collector::new(
                std::path::PathBuf::new(),
                Instant::now(),
            ),
            publisher: Publisher::start(settings)?,
            last: None,
        })
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
