//! `ringbag play`: read a bag in time order and hand each message to a sink at the pace it
//! was recorded (scaled by `--rate`). The sink is a ROS publisher (feature `ros`) or `echo`,
//! which prints what it would publish: a field check that needs no ROS.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::bag::reader::{Bag, ReadFilter};
use crate::bag::{BagError, TopicInfo};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EchoFormat {
    /// One line per message: time, topic, type, size.
    Text,
    /// One JSON object per line, including the CDR bytes as hex.
    Jsonl,
}

#[derive(Debug, Clone)]
pub struct PlaySettings {
    pub bag: PathBuf,
    pub topics: Option<Vec<String>>,
    /// Playback speed factor; 2.0 plays twice as fast.
    pub rate: f64,
    /// Skip this much of the bag's start.
    pub start_offset_ns: i64,
    pub loop_playback: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error("sink: {0}")]
    Sink(String),
}

/// Why a sink did not take a message.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The consumer went away (`ringbag play --sink echo | head`): playing ends, and that is
    /// not a failure.
    #[error("output closed by its reader")]
    Closed,
    #[error("{0}")]
    Failed(String),
}

/// Where played messages go.
pub trait Sink {
    fn publish(&mut self, topic: &TopicInfo, timestamp: i64, data: &[u8]) -> Result<(), SinkError>;
}

/// Prints messages instead of publishing them.
pub struct EchoSink<W: Write> {
    pub out: W,
    pub format: EchoFormat,
}

impl<W: Write> Sink for EchoSink<W> {
    fn publish(&mut self, topic: &TopicInfo, timestamp: i64, data: &[u8]) -> Result<(), SinkError> {
        let r = match self.format {
            EchoFormat::Text => writeln!(
                self.out,
                "{timestamp} {} [{}] {} bytes",
                topic.name,
                topic.type_name,
                data.len()
            ),
            EchoFormat::Jsonl => {
                let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
                let line = serde_json::json!({
                    "topic": topic.name,
                    "type": topic.type_name,
                    "timestamp_ns": timestamp,
                    "size": data.len(),
                    "data_hex": hex,
                });
                writeln!(self.out, "{line}")
            }
        };
        r.map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => SinkError::Closed,
            _ => SinkError::Failed(format!("cannot write to output: {e}")),
        })
    }
}

/// Publishes on live ROS 2 topics with the QoS the recorded publishers offered.
#[cfg(feature = "ros")]
pub struct RosSink {
    inner: crate::source::ros::RosPublisherSink,
    declared: std::collections::HashSet<String>,
}

#[cfg(feature = "ros")]
impl RosSink {
    pub fn new(inner: crate::source::ros::RosPublisherSink) -> Self {
        RosSink {
            inner,
            declared: Default::default(),
        }
    }
}

#[cfg(feature = "ros")]
impl Sink for RosSink {
    fn publish(
        &mut self,
        topic: &TopicInfo,
        _timestamp: i64,
        data: &[u8],
    ) -> Result<(), SinkError> {
        if !self.declared.contains(&topic.name) {
            self.inner
                .declare_topic(&topic.name, &topic.offered_qos_profiles);
            self.declared.insert(topic.name.clone());
        }
        self.inner
            .publish(&topic.name, &topic.type_name, data)
            .map_err(|e| SinkError::Failed(e.to_string()))
    }
}

/// Counts of a play run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlayReport {
    pub published: u64,
    pub loops: u64,
}

/// Play `settings.bag` into `sink` until the end (or forever with loop), or `stop()` is true.
pub fn play(
    settings: &PlaySettings,
    sink: &mut dyn Sink,
    stop: &dyn Fn() -> bool,
) -> Result<PlayReport, PlayError> {
    let bag = Bag::open(&settings.bag)?;
    play_bag(&bag, settings, sink, stop)
}

/// Longest uninterrupted sleep while waiting for a message's time: `stop()` is checked at
/// least this often, so a gap of hours in a bag never delays a stop.
const STOP_POLL: Duration = Duration::from_millis(50);

/// [`play`] on a bag that is already open (`settings.bag` is not read).
pub fn play_bag(
    bag: &Bag,
    settings: &PlaySettings,
    sink: &mut dyn Sink,
    stop: &dyn Fn() -> bool,
) -> Result<PlayReport, PlayError> {
    let start = bag
        .metadata
        .starting_time_ns
        .saturating_add(settings.start_offset_ns);
    let filter = ReadFilter {
        topics: settings.topics.clone(),
        start_ns: Some(start),
        end_ns: None,
    };
    let mut report = PlayReport::default();
    loop {
        let wall0 = Instant::now();
        for m in bag.messages(&filter)? {
            if stop() {
                return Ok(report);
            }
            let m = m?;
            // Bag time → wall time; sleeping to an absolute target keeps errors from adding up.
            let offset = (m.timestamp.saturating_sub(start)).max(0) as f64 / settings.rate;
            let target = wall0.checked_add(Duration::from_nanos(offset as u64));
            loop {
                let now = Instant::now();
                let left = target.map_or(STOP_POLL, |t| t.saturating_duration_since(now));
                if left.is_zero() {
                    break;
                }
                if stop() {
                    return Ok(report);
                }
                std::thread::sleep(left.min(STOP_POLL));
            }
            match sink.publish(&bag.topics[m.topic], m.timestamp, &m.data) {
                Ok(()) => {}
                Err(SinkError::Closed) => return Ok(report),
                Err(SinkError::Failed(e)) => return Err(PlayError::Sink(e)),
            }
            report.published += 1;
        }
        report.loops += 1;
        if !settings.loop_playback || stop() {
            return Ok(report);
        }
    }
}
