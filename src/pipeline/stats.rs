//! Per-topic counters shared between producers (writers of the atomics) and the writer
//! thread (reader). Relaxed ordering: they are statistics, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct TopicStats {
    pub name: String,
    pub type_name: String,
    pub accepted: AtomicU64,
    pub dropped: AtomicU64,
    pub bytes: AtomicU64,
}

impl TopicStats {
    pub fn new(name: &str, type_name: &str) -> Self {
        TopicStats {
            name: name.to_string(),
            type_name: type_name.to_string(),
            ..Default::default()
        }
    }
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Relaxed)
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
}

/// What a recording did, printed at exit and kept in the bag's custom_data.
#[derive(Debug, Clone, Default)]
pub struct RecordSummary {
    pub messages_written: u64,
    pub bytes_written: u64,
    pub dropped_total: u64,
    /// (topic, written, dropped)
    pub per_topic: Vec<(String, u64, u64)>,
    pub wall_time: Duration,
    pub splits_created: u32,
    pub splits_deleted: u64,
    pub bag_size_bytes: u64,
}

impl std::fmt::Display for RecordSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.wall_time.as_secs_f64();
        writeln!(
            f,
            "accepted {} messages, {} bytes in {:.2} s ({:.0} msg/s, {:.1} MB/s); dropped {}",
            self.messages_written,
            self.bytes_written,
            secs,
            self.messages_written as f64 / secs.max(1e-9),
            self.bytes_written as f64 / 1e6 / secs.max(1e-9),
            self.dropped_total
        )?;
        writeln!(
            f,
            "splits created {}, deleted by retention {}, bag size now {} bytes",
            self.splits_created, self.splits_deleted, self.bag_size_bytes
        )?;
        for (name, written, dropped) in &self.per_topic {
            writeln!(
                f,
                "  {name:<40} written {written:>10}  dropped {dropped:>8}"
            )?;
        }
        Ok(())
    }
}
