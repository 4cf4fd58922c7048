//! Per-topic counters shared between producers (writers of the atomics) and the writer
//! thread (reader). Relaxed ordering: they are statistics, not synchronisation.
//!
//! Every message offered to the recorder ends in exactly one place, so the counts add up:
//! `offered = written + ring_only + throttled + paused + dropped_queue_full +
//! dropped_after_stop + oversize + unwritten`, where `accepted = written + ring_only +
//! throttled + paused + oversize + unwritten` (accepted means it entered the queue).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct TopicStats {
    pub name: String,
    pub type_name: String,
    /// The first offered QoS profile, short (`reliable/volatile/keep_last(10)`); for status.
    pub qos: String,
    /// Entered the queue.
    pub accepted: AtomicU64,
    /// Refused at the queue: byte budget or slots full (`--max-cache-size`).
    pub dropped: AtomicU64,
    /// Refused at the queue because the writer had already stopped.
    pub dropped_after_stop: AtomicU64,
    /// Accepted, then dropped by the writer: it could never fit under `--max-record-size`.
    pub oversize: AtomicU64,
    /// Committed to the bag (counted after the commit returned).
    pub written: AtomicU64,
    /// Payload bytes accepted.
    pub bytes: AtomicU64,
    /// Payload bytes committed to the bag (with `written`, after the commit returned).
    pub written_bytes: AtomicU64,
    /// Never reached ringbag: lost inside the middleware, as it reported them (the
    /// subscription's message-lost event). Not part of `offered`: these were never offered.
    pub lost_in_middleware: AtomicU64,
    /// Accepted and kept in the snapshot ring only (`--snapshot-topics`): recorded, not lost.
    pub ring_only: AtomicU64,
    /// Accepted and left out of continuous recording by `--topic-rate`: by choice, not lost.
    pub throttled: AtomicU64,
    /// Accepted and left out of the bag because recording was paused: by request, not lost.
    pub paused: AtomicU64,
    /// Not a counter: the topic's own pool of large buffers (see `queue::LargePool`), kept
    /// here because this is the one per-topic object that producers and the writer share.
    pub(crate) large_buffers: super::queue::LargePool,
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
    /// Dropped at the queue because it was full (the rosbag2 sense of "dropped").
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
    pub fn dropped_after_stop(&self) -> u64 {
        self.dropped_after_stop.load(Relaxed)
    }
    pub fn oversize(&self) -> u64 {
        self.oversize.load(Relaxed)
    }
    pub fn written(&self) -> u64 {
        self.written.load(Relaxed)
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes.load(Relaxed)
    }
    pub fn lost_in_middleware(&self) -> u64 {
        self.lost_in_middleware.load(Relaxed)
    }
    pub fn ring_only(&self) -> u64 {
        self.ring_only.load(Relaxed)
    }
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Relaxed)
    }
    pub fn paused(&self) -> u64 {
        self.paused.load(Relaxed)
    }
    /// Accepted but neither written nor dropped as oversize: still queued, or discarded when
    /// the writer stopped (`--max-splits`, a full disk, an I/O error). Final once producers
    /// and the writer have stopped.
    pub fn unwritten(&self) -> u64 {
        // Read `written`/`oversize` before `accepted`: both only grow after `accepted` did,
        // so the difference never goes negative between the loads.
        let done =
            self.written() + self.oversize() + self.ring_only() + self.throttled() + self.paused();
        self.accepted().saturating_sub(done)
    }
    /// Everything offered and not recorded, whatever the cause.
    pub fn not_recorded(&self) -> u64 {
        self.dropped() + self.dropped_after_stop() + self.oversize() + self.unwritten()
    }
}

/// Upper bounds of [`DurationHistogram`]'s finite buckets, seconds (`le` in the metrics); a
/// last bucket, `+Inf`, takes the rest.
pub const BATCH_BUCKETS_S: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const BATCH_BUCKETS_NS: [u64; 11] = [
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// Durations counted into the fixed buckets [`BATCH_BUCKETS_S`] (plus `+Inf`), with their
/// count and sum: a Prometheus histogram kept by one writer with relaxed atomic adds (no
/// lock, no allocation), read by anyone.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    /// Per bucket, not cumulative: `buckets[i]` counts `BATCH_BUCKETS_S[i-1] < d <=
    /// BATCH_BUCKETS_S[i]`; the last counts `d > 2.5 s`.
    buckets: [AtomicU64; BATCH_BUCKETS_S.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    /// Count one duration of `ns` nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        let i = BATCH_BUCKETS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Per-bucket counts (not cumulative; the last is `+Inf`'s own), the count and the sum in
    /// ns. Read while being written, the three may disagree by the durations in flight.
    pub fn snapshot(&self) -> (Vec<u64>, u64, u64) {
        (
            self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            self.count.load(Relaxed),
            self.sum_ns.load(Relaxed),
        )
    }
}

/// One topic's line of the exit summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicSummary {
    pub name: String,
    pub accepted: u64,
    pub written: u64,
    pub dropped_queue_full: u64,
    pub dropped_after_stop: u64,
    pub oversize: u64,
    pub unwritten: u64,
    pub lost_in_middleware: u64,
    pub ring_only: u64,
    pub throttled: u64,
    /// Left out while recording was paused (not a loss).
    pub paused: u64,
}

impl TopicSummary {
    pub fn of(t: &TopicStats) -> Self {
        TopicSummary {
            name: t.name.clone(),
            accepted: t.accepted(),
            written: t.written(),
            dropped_queue_full: t.dropped(),
            dropped_after_stop: t.dropped_after_stop(),
            oversize: t.oversize(),
            unwritten: t.unwritten(),
            lost_in_middleware: t.lost_in_middleware(),
            ring_only: t.ring_only(),
            throttled: t.throttled(),
            paused: t.paused(),
        }
    }
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_after_stop + self.oversize
    }
}

/// What a recording did, printed at exit. Totals are sums of `per_topic`.
#[derive(Debug, Clone, Default)]
pub struct RecordSummary {
    pub accepted: u64,
    pub written: u64,
    pub dropped_queue_full: u64,
    pub dropped_after_stop: u64,
    pub oversize: u64,
    pub unwritten: u64,
    /// Reported lost by the middleware before reaching ringbag (live ROS 2 only).
    pub lost_in_middleware: u64,
    /// Kept in the snapshot ring only, and left out by `--topic-rate` (neither is a loss).
    pub ring_only: u64,
    pub throttled: u64,
    /// Left out while recording was paused (not a loss), and whether it was paused at the end.
    pub paused: u64,
    pub paused_at_end: bool,
    pub bytes_accepted: u64,
    pub per_topic: Vec<TopicSummary>,
    pub wall_time: Duration,
    /// Split files of this bag on disk at exit.
    pub splits_kept: u32,
    pub splits_deleted: u64,
    /// Bytes of this bag's split files on disk at exit.
    pub bag_size_bytes: u64,
    /// Longest time the writer was away from the queue at once (a batch with its retention
    /// and rotation), the most bytes queued at once, and the longest background fsync.
    pub longest_stall: Duration,
    /// How much of `longest_stall` the writer thread spent on a CPU.
    pub longest_stall_cpu: Duration,
    pub peak_queue_bytes: u64,
    pub longest_sync: Duration,
}

impl RecordSummary {
    pub fn dropped_total(&self) -> u64 {
        self.dropped_queue_full + self.dropped_after_stop + self.oversize
    }
    pub fn add_topic(&mut self, t: TopicSummary) {
        self.accepted += t.accepted;
        self.written += t.written;
        self.dropped_queue_full += t.dropped_queue_full;
        self.dropped_after_stop += t.dropped_after_stop;
        self.oversize += t.oversize;
        self.unwritten += t.unwritten;
        self.lost_in_middleware += t.lost_in_middleware;
        self.ring_only += t.ring_only;
        self.throttled += t.throttled;
        self.paused += t.paused;
        self.per_topic.push(t);
    }
}

impl std::fmt::Display for RecordSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.wall_time.as_secs_f64();
        writeln!(
            f,
            "accepted {} messages, {} bytes in {:.2} s ({:.0} msg/s, {:.1} MB/s); written {}, \
             unwritten {}",
            self.accepted,
            self.bytes_accepted,
            secs,
            self.accepted as f64 / secs.max(1e-9),
            self.bytes_accepted as f64 / 1e6 / secs.max(1e-9),
            self.written,
            self.unwritten,
        )?;
        writeln!(
            f,
            "dropped {} (queue full {}, oversize {}, after the writer stopped {})",
            self.dropped_total(),
            self.dropped_queue_full,
            self.oversize,
            self.dropped_after_stop
        )?;
        writeln!(
            f,
            "lost in the middleware before reaching ringbag {} (as the subscriptions' message-lost events reported)",
            self.lost_in_middleware
        )?;
        if self.ring_only + self.throttled > 0 {
            writeln!(
                f,
                "kept in the snapshot ring only {}, left out by --topic-rate {} (neither is a loss)",
                self.ring_only, self.throttled
            )?;
        }
        if self.paused > 0 || self.paused_at_end {
            writeln!(
                f,
                "left out while paused {} (not a loss){}",
                self.paused,
                if self.paused_at_end {
                    "; recording was paused at the end"
                } else {
                    ""
                }
            )?;
        }
        writeln!(
            f,
            "splits kept {}, deleted by retention {}, bag size now {} bytes",
            self.splits_kept, self.splits_deleted, self.bag_size_bytes
        )?;
        writeln!(
            f,
            "writer: longest stall {:.1} ms, peak queue {} bytes; longest background fsync {:.1} ms; \
             {:.1} ms of the longest stall on the CPU",
            self.longest_stall.as_secs_f64() * 1e3,
            self.peak_queue_bytes,
            self.longest_sync.as_secs_f64() * 1e3,
            self.longest_stall_cpu.as_secs_f64() * 1e3
        )?;
        for t in &self.per_topic {
            writeln!(
                f,
                "  {:<40} accepted {:>10}  written {:>10}  dropped {:>8}  unwritten {:>8}  lost in middleware {:>8}",
                t.name,
                t.accepted,
                t.written,
                t.dropped(),
                t.unwritten,
                t.lost_in_middleware
            )?;
            if t.ring_only + t.throttled > 0 {
                writeln!(
                    f,
                    "  {:<40} ring only {:>10}  throttled {:>10}",
                    "", t.ring_only, t.throttled
                )?;
            }
            if t.paused > 0 {
                writeln!(f, "  {:<40} paused {:>10}", "", t.paused)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod histogram_tests {
    use super::*;

    #[test]
    fn durations_fall_in_the_bucket_whose_bound_is_the_first_not_below_them() {
        let h = DurationHistogram::default();
        for ns in [
            0,
            1_000_000,
            1_000_001,
            2_500_000,
            7_000_000,
            2_500_000_000,
            3_000_000_000,
        ] {
            h.record_ns(ns);
        }
        let (b, count, sum) = h.snapshot();
        assert_eq!(b, vec![2, 2, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1]);
        assert_eq!(count, 7);
        assert_eq!(
            sum,
            1_000_000 + 1_000_001 + 2_500_000 + 7_000_000 + 2_500_000_000 + 3_000_000_000
        );
    }
}
