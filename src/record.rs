//! `ringbag record`: wire clock, bag writer, retention, pipeline and source together, run
//! until the source ends, a signal arrives or a stop condition holds, then finish cleanly.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::bag::writer::{BagSummary, BagWriter, WriterOptions};
use crate::bag::BagError;
use crate::clock::TimeSource;
use crate::pipeline::{Pipeline, PipelineConfig, PipelineError, RecordSummary, StopReason};
use crate::retention::{Retention, RetentionPolicy};
use crate::signals;
use crate::source::generator::{self, GeneratorConfig};

/// Where messages come from, resolved.
#[derive(Debug, Clone)]
pub enum SourceSettings {
    Synthetic(GeneratorConfig),
    #[cfg(feature = "ros")]
    Ros(crate::source::select::RosSourceOptions),
}

#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub output: PathBuf,
    pub writer: WriterOptions,
    pub pipeline: PipelineConfig,
    pub retention: RetentionPolicy,
    pub source: SourceSettings,
    pub clock: crate::clock::ClockSettings,
    /// Reindex unfinished bags in the output's parent directory before recording.
    pub recover: bool,
    /// Where to write `{"committed": N, "splits": K}` every ~100 ms.
    pub status_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("source failed: {0}")]
    Source(String),
    #[error(transparent)]
    Clock(#[from] crate::clock::ClockError),
    #[error("cannot install signal handlers: {0}")]
    Signals(nix::Error),
}

pub struct RecordOutcome {
    pub bag: BagSummary,
    pub stop: StopReason,
    pub summary: RecordSummary,
}

/// Record until done. On a writer failure the bag is finished as far as possible and the
/// error is returned (with the summary, so the caller can still print what was kept).
/// A failed recording: the error, and what was recorded before it (if the pipeline ran).
pub struct RecordFailure {
    pub error: RecordError,
    pub summary: Option<RecordSummary>,
}

fn failure(error: RecordError, summary: Option<RecordSummary>) -> Box<RecordFailure> {
    Box::new(RecordFailure { error, summary })
}

pub fn run(settings: RecordSettings) -> Result<RecordOutcome, Box<RecordFailure>> {
    signals::install().map_err(|e| failure(RecordError::Signals(e), None))?;
    // The clock first: `--clock ptp` with an unreadable device must fail before any bag exists.
    let clock: Arc<dyn TimeSource> =
        Arc::new(crate::clock::start(&settings.clock).map_err(|e| failure(e.into(), None))?);
    let root = settings
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    if settings.recover {
        let root = root.as_path();
        // Best effort: bags it cannot recover are logged and skipped; recording goes on.
        let recovery = crate::bag::reindex::recover_root(root);
        for r in &recovery.reports {
            log::warn!(
                "recovered {}: {} messages kept, {}",
                r.bag.display(),
                r.message_count,
                r.lost_text()
            );
        }
    }
    // With --recover the parent directory is a recording root (as the service uses it): the
    // budget then spans the recovered bags too, oldest first. Otherwise only this bag counts.
    let retention = if settings.recover {
        Retention::open_root(&root, &settings.output, settings.retention.clone())
            .map_err(|e| failure(RecordError::Pipeline(e.into()), None))?
    } else {
        Retention::new(settings.retention.clone())
    };
    let writer = BagWriter::create(&settings.output, settings.writer.clone())
        .map_err(|e| failure(e.into(), None))?;
    log::info!("recording into {}", settings.output.display());
    let pipeline = Pipeline::start(writer, Some(retention), clock, settings.pipeline.clone());
    let producer = pipeline.producer();
    let source = {
        let producer = producer.clone();
        let src = settings.source.clone();
        std::thread::Builder::new()
            .name("ringbag-source".into())
            .spawn(move || -> Result<(), String> {
                match src {
                    SourceSettings::Synthetic(cfg) => {
                        generator::run(cfg, &producer);
                        Ok(())
                    }
                    #[cfg(feature = "ros")]
                    SourceSettings::Ros(opts) => {
                        crate::source::ros::run(&opts, producer).map_err(|e| e.to_string())
                    }
                }
            })
    };
    let source = match source {
        Ok(h) => h,
        Err(e) => {
            let (_, summary) = pipeline.finish();
            return Err(failure(
                RecordError::Source(format!("cannot start source thread: {e}")),
                Some(summary),
            ));
        }
    };
    // The main thread only watches: signals, the source ending, the writer stopping itself.
    let progress = pipeline.progress();
    let mut last_status = std::time::Instant::now() - STATUS_INTERVAL;
    while !source.is_finished() && !pipeline.stopping() {
        if signals::stop_requested() {
            log::info!("stop requested; writing what was accepted");
            break;
        }
        if let Some(path) = &settings.status_file {
            if last_status.elapsed() >= STATUS_INTERVAL {
                last_status = std::time::Instant::now();
                if let Err(e) = write_status(path, &progress) {
                    log::warn!("status file: {e}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    producer.request_stop();
    let source_result = source
        .join()
        .unwrap_or_else(|_| Err("source thread panicked".to_string()));
    let (result, summary) = pipeline.finish();
    if let Some(path) = &settings.status_file {
        if let Err(e) = write_status(path, &progress) {
            log::warn!("status file: {e}");
        }
    }
    match (result, source_result) {
        (Err(e), _) => Err(failure(e.into(), Some(summary))),
        (Ok(_), Err(e)) => Err(failure(RecordError::Source(e), Some(summary))),
        (Ok((bag, stop)), Ok(())) => Ok(RecordOutcome { bag, stop, summary }),
    }
}

const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// `--status-file`: replaced atomically, so a reader (or a test that kills us) always sees a
/// complete object whose count is already in the bag.
fn write_status(path: &std::path::Path, p: &crate::pipeline::Progress) -> Result<(), BagError> {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| BagError::invalid(path, "status file needs a file name"))?;
    let text = format!(
        "{{\"committed\": {}, \"splits\": {}}}\n",
        p.committed.load(Relaxed),
        p.splits.load(Relaxed)
    );
    crate::bag::metadata::write_file_atomic(dir, name, text.as_bytes())
}
