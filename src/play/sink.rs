//! Where played messages go: `echo` (a line per message on stdout) or `ros` (untyped
//! publishers, feature `ros`).

use std::io::Write;

use super::plan::PlayTopic;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EchoFormat {
    /// One line per message: `<send_ns> <bag_ns> <topic> <type> <bytes>`.
    Text,
    /// One JSON object per line: the same fields plus the CDR bytes as hex (`data_hex`).
    Jsonl,
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
    /// Writing the output failed (a full disk, a closed stdout): the message names it.
    #[error("{0}")]
    Output(String),
}

/// Where played messages go. Topics are indexes into the slice given to [`Sink::prepare`].
pub trait Sink {
    /// Called once before the first message with every topic that may be published
    /// (publishers are created here, so discovery runs during `--delay`).
    fn prepare(&mut self, topics: &[PlayTopic]) -> Result<(), SinkError>;
    /// Publish one message; `bag_ns` is its recorded timestamp (for `/clock`, the time sent).
    fn publish(&mut self, topic: usize, bag_ns: i64, data: &[u8]) -> Result<(), SinkError>;
    /// Push out anything buffered. The scheduler calls it before it sleeps, never while a
    /// message is due.
    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// CLOCK_MONOTONIC in ns: the scheduler's clock and the echo sink's `send_ns`.
pub fn monotonic_ns() -> i64 {
    use nix::time::{clock_gettime, ClockId};
    // CLOCK_MONOTONIC cannot fail on Linux (a valid clock id, a valid pointer); 0 would only
    // make one line's send_ns wrong, never playback.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
        .unwrap_or(0)
}

/// Prints what it would publish.
pub struct EchoSink<W: Write> {
    out: W,
    format: EchoFormat,
    /// (name, type) per topic index.
    topics: Vec<(String, String)>,
    /// Reused line buffer (a 6 MB image is a 12 MB hex line).
    line: Vec<u8>,
    /// What `out` is, for error messages.
    name: &'static str,
}

impl<W: Write> EchoSink<W> {
    pub fn new(out: W, format: EchoFormat) -> Self {
        EchoSink {
            out,
            format,
            topics: Vec::new(),
            line: Vec::new(),
            name: "output",
        }
    }

    /// Name the output in errors (`stdout: No space left on device`).
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    fn io(&self, e: std::io::Error) -> SinkError {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe => SinkError::Closed,
            _ => SinkError::Output(format!("{}: {e}", self.name)),
        }
    }
}

impl<W: Write> Sink for EchoSink<W> {
    fn prepare(&mut self, topics: &[PlayTopic]) -> Result<(), SinkError> {
        self.topics = topics
            .iter()
            .map(|t| (t.name.clone(), t.type_name.clone()))
            .collect();
        Ok(())
    }

    fn publish(&mut self, topic: usize, bag_ns: i64, data: &[u8]) -> Result<(), SinkError> {
        let send_ns = monotonic_ns();
        let Some((name, type_name)) = self.topics.get(topic) else {
            return Err(SinkError::Failed(format!("no topic {topic} was prepared")));
        };
        let line = &mut self.line;
        line.clear();
        match self.format {
            EchoFormat::Text => {
                // Writing into a Vec cannot fail.
                let _ = writeln!(line, "{send_ns} {bag_ns} {name} {type_name} {}", data.len());
            }
            EchoFormat::Jsonl => {
                let _ = write!(
                    line,
                    "{{\"send_ns\":{send_ns},\"bag_ns\":{bag_ns},\"topic\":"
                );
                let _ = serde_json::to_writer(&mut *line, name);
                line.extend_from_slice(b",\"type\":");
                let _ = serde_json::to_writer(&mut *line, type_name);
                let _ = write!(line, ",\"bytes\":{},\"data_hex\":\"", data.len());
                const HEX: &[u8; 16] = b"0123456789abcdef";
                line.reserve(data.len() * 2 + 3);
                for b in data {
                    line.push(HEX[usize::from(b >> 4)]);
                    line.push(HEX[usize::from(b & 15)]);
                }
                line.extend_from_slice(b"\"}\n");
            }
        }
        self.out.write_all(line).map_err(|e| self.io(e))
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|e| self.io(e))
    }
}

/// Publishes on live ROS 2 topics through untyped publishers, created in `prepare` with each
/// topic's profile (the recorded offers, adapted as ros2 bag play does, then overridden).
#[cfg(feature = "ros")]
pub struct RosSink {
    inner: crate::source::ros::RosPublisherSink,
    /// Publisher index per topic index.
    publishers: Vec<usize>,
}

#[cfg(feature = "ros")]
impl RosSink {
    pub fn new(inner: crate::source::ros::RosPublisherSink) -> Self {
        RosSink {
            inner,
            publishers: Vec::new(),
        }
    }
}

#[cfg(feature = "ros")]
impl Sink for RosSink {
    fn prepare(&mut self, topics: &[PlayTopic]) -> Result<(), SinkError> {
        self.publishers = topics
            .iter()
            .map(|t| self.inner.advertise(&t.name, &t.type_name, &t.qos))
            .collect::<Result<_, _>>()
            .map_err(|e| SinkError::Failed(e.to_string()))?;
        Ok(())
    }

    fn publish(&mut self, topic: usize, _bag_ns: i64, data: &[u8]) -> Result<(), SinkError> {
        let Some(&p) = self.publishers.get(topic) else {
            return Err(SinkError::Failed(format!("no topic {topic} was prepared")));
        };
        self.inner
            .publish(p, data)
            .map_err(|e| SinkError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::QosProfile;

    fn topics() -> Vec<PlayTopic> {
        vec![PlayTopic {
            name: "/a \"q\"".into(),
            type_name: "std_msgs/msg/String".into(),
            qos: QosProfile::default(),
            sources: vec!["/a".into()],
        }]
    }

    #[test]
    fn text_lines_carry_send_time_bag_time_topic_type_and_size() {
        let mut s = EchoSink::new(Vec::new(), EchoFormat::Text);
        s.prepare(&topics()).unwrap();
        let before = monotonic_ns();
        s.publish(0, 42, &[1, 2, 3]).unwrap();
        let line = String::from_utf8(s.out.clone()).unwrap();
        let f: Vec<&str> = line.trim_end().split(' ').collect();
        assert!(f[0].parse::<i64>().unwrap() >= before);
        assert_eq!(&f[1..], ["42", "/a", "\"q\"", "std_msgs/msg/String", "3"]);
    }

    #[test]
    fn jsonl_lines_add_the_bytes_as_hex_and_escape_names() {
        let mut s = EchoSink::new(Vec::new(), EchoFormat::Jsonl);
        s.prepare(&topics()).unwrap();
        s.publish(0, -5, &[0x00, 0xab, 0x7f]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&s.out).unwrap();
        assert_eq!(v["bag_ns"], -5);
        assert_eq!(v["topic"], "/a \"q\"");
        assert_eq!(v["type"], "std_msgs/msg/String");
        assert_eq!(v["bytes"], 3);
        assert_eq!(v["data_hex"], "00ab7f");
        assert!(v["send_ns"].as_i64().unwrap() > 0);
    }
}
