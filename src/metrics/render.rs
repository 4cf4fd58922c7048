//! The metrics, rendered from a [`Status`]: what the status file says, in Prometheus's terms
//! (`ringbag_` prefix, base units, `_total` counters).
//!
//! Label sets are bounded: `topic` by the topics the recording subscribes to (its selection),
//! `cause` by the fixed drop causes below, `bag` by the one bag being recorded, and the build
//! labels by the binary. No label ever carries a message's content or a timestamp.

use super::exposition::{Exposition, Kind};
use crate::service::status::Status;

/// Build facts (from build.rs), as `ringbag --version` prints them.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("RINGBAG_BUILD_COMMIT");
pub const FEATURES: &str = env!("RINGBAG_BUILD_FEATURES");
pub const TARGET: &str = env!("RINGBAG_BUILD_TARGET");

/// Whether the process is up and recording, for `ringbag_up` and `ringbag_recording`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Recording,
    /// Up, but the recording stopped (an error) or is between bags.
    NotRecording,
    /// The process is exiting: the last figures, with `ringbag_up 0`.
    Exiting,
}

/// The whole exposition for `st`.
pub fn render(st: &Status, state: State) -> String {
    let mut e = Exposition::new();
    build_and_state(&mut e, st, state);
    topics(&mut e, st);
    writer(&mut e, st);
    storage(&mut e, st);
    clock(&mut e, st);
    ring(&mut e, st);
    upload(&mut e, st);
    e.finish()
}

fn build_and_state(e: &mut Exposition, st: &Status, state: State) {
    let recording = state == State::Recording;
    e.family(
        "ringbag_build_info",
        Kind::Gauge,
        "The running binary: version, commit, cargo features and target (always 1).",
    )
    .sample(
        &[
            ("version", VERSION),
            ("commit", COMMIT),
            ("features", FEATURES),
            ("target", TARGET),
        ],
        1.0,
    );
    e.single(
        "ringbag_up",
        Kind::Gauge,
        "1 while the ringbag process runs and publishes metrics; 0 in the last figures it \
         wrote before exiting.",
        f64::from(u8::from(state != State::Exiting)),
    );
    let bag = st.bag.display().to_string();
    e.family(
        "ringbag_recording",
        Kind::Gauge,
        "1 while the named bag is being recorded; 0 once recording stopped on an error.",
    )
    .sample(&[("bag", &bag)], f64::from(u8::from(recording)));
    e.single(
        "ringbag_start_time_seconds",
        Kind::Gauge,
        "When the process started, seconds since the Unix epoch.",
        (st.updated_unix_ms as f64 / 1000.0 - st.uptime_s).round(),
    );
    e.single(
        "ringbag_status_time_seconds",
        Kind::Gauge,
        "When these figures were taken, seconds since the Unix epoch (a stale value: the \
         recorder stopped publishing).",
        st.updated_unix_ms as f64 / 1000.0,
    );
    e.single(
        "ringbag_reloads_total",
        Kind::Counter,
        "SIGHUP reloads since the process started.",
        st.reloads as f64,
    );
    e.single(
        "ringbag_reload_gap_seconds_total",
        Kind::Counter,
        "Time not recorded across those reloads, seconds.",
        st.reload_gap_ms as f64 / 1000.0,
    );
}

fn topics(e: &mut Exposition, st: &Status) {
    let per_topic = |e: &mut Exposition, name, help: &str, f: &dyn Fn(&_) -> u64| {
        e.family(name, Kind::Counter, help);
        for t in &st.topics {
            e.sample(&[("topic", &t.name)], f(t) as f64);
        }
    };
    per_topic(
        e,
        "ringbag_messages_accepted_total",
        "Messages accepted into the queue, per topic (this bag; reset at a reload).",
        &|t: &crate::service::status::TopicStatus| t.accepted,
    );
    per_topic(
        e,
        "ringbag_messages_written_total",
        "Messages committed to the bag, per topic (this bag).",
        &|t: &crate::service::status::TopicStatus| t.written,
    );
    per_topic(
        e,
        "ringbag_accepted_bytes_total",
        "Payload bytes accepted, per topic (this bag).",
        &|t: &crate::service::status::TopicStatus| t.bytes,
    );
    per_topic(
        e,
        "ringbag_written_bytes_total",
        "Payload bytes committed to the bag, per topic (this bag).",
        &|t: &crate::service::status::TopicStatus| t.written_bytes,
    );
    e.family(
        "ringbag_messages_dropped_total",
        Kind::Counter,
        "Messages lost, per topic and cause: queue_full (the writer fell behind), oversize \
         (larger than any split may hold), after_stop (arrived while stopping), unwritten \
         (accepted but not committed at the end), middleware (lost before reaching ringbag), \
         throttled (left out of continuous recording by --topic-rate, by choice).",
    );
    for t in &st.topics {
        for (cause, n) in [
            ("queue_full", t.dropped_queue_full),
            ("oversize", t.dropped_oversize),
            ("after_stop", t.dropped_after_stop),
            ("unwritten", t.unwritten),
            ("middleware", t.lost_in_middleware),
            ("throttled", t.throttled),
        ] {
            e.sample(&[("topic", &t.name), ("cause", cause)], n as f64);
        }
    }
    per_topic(
        e,
        "ringbag_ring_only_messages_total",
        "Messages kept in the snapshot ring only, not recorded continuously \
         (--snapshot-topics), per topic (this bag).",
        &|t: &crate::service::status::TopicStatus| t.ring_only,
    );
    per_topic(
        e,
        "ringbag_paused_messages_total",
        "Messages left out of the bag while recording was paused (ringbag pause, \
         --start-paused, the space bar; not a loss), per topic (this bag).",
        &|t: &crate::service::status::TopicStatus| t.paused,
    );
    e.single(
        "ringbag_paused",
        Kind::Gauge,
        "1 while recording is paused (the snapshot ring, if any, still records).",
        f64::from(u8::from(st.paused)),
    );
    e.single(
        "ringbag_splits_created_total",
        Kind::Counter,
        "Split files this bag opened.",
        st.splits_created as f64,
    );
}

fn writer(e: &mut Exposition, st: &Status) {
    let w = &st.writer;
    let h = &w.batch_duration;
    let (bounds, buckets) = if h.buckets.len() == h.bounds_s.len() + 1 {
        (&h.bounds_s[..], &h.buckets[..])
    } else {
        // A status file without the histogram (an older version): an empty one.
        (&crate::pipeline::BATCH_BUCKETS_S[..], &[0; 12][..])
    };
    e.histogram(
        "ringbag_writer_batch_duration_seconds",
        "Time the writer thread spent away from the queue per turn that wrote a batch or \
         rotated (the batch, its retention and rotations), seconds (this bag).",
        bounds,
        buckets,
        h.sum_s,
    );
    e.single(
        "ringbag_writer_longest_stall_seconds",
        Kind::Gauge,
        "The longest of those turns, seconds: the longest the queue alone absorbed producers.",
        w.longest_stall_s,
    );
    e.single(
        "ringbag_queue_bytes",
        Kind::Gauge,
        "Bytes of messages queued for the writer now.",
        w.queue_bytes as f64,
    );
    e.single(
        "ringbag_queue_peak_bytes",
        Kind::Gauge,
        "The most bytes seen queued at once (this bag).",
        w.peak_queue_bytes as f64,
    );
    e.single(
        "ringbag_fsync_longest_seconds",
        Kind::Gauge,
        "The longest single background fsync or fdatasync of a split, seconds (this bag).",
        w.fsync_longest_s,
    );
    e.single(
        "ringbag_fsyncs_total",
        Kind::Counter,
        "Background fsyncs and fdatasyncs of splits completed (this bag).",
        w.fsyncs as f64,
    );
}

fn storage(e: &mut Exposition, st: &Status) {
    e.single(
        "ringbag_splits_deleted_total",
        Kind::Counter,
        "Split files retention deleted to keep the budget (this bag's recording).",
        st.splits_deleted as f64,
    );
    let b = &st.budget;
    e.family(
        "ringbag_budget_used",
        Kind::Gauge,
        "What the recording root holds against each budget kind: bytes (size), seconds \
         (duration), files.",
    )
    .sample(&[("kind", "size")], b.bytes as f64)
    .sample(&[("kind", "duration")], b.span_s)
    .sample(&[("kind", "files")], b.files as f64);
    e.family(
        "ringbag_budget_limit",
        Kind::Gauge,
        "Each budget's limit, in the same units; absent when that limit is off.",
    );
    if let Some(m) = b.max_record_size {
        e.sample(&[("kind", "size")], m as f64);
    }
    if let Some(m) = b.max_record_duration_s {
        e.sample(&[("kind", "duration")], m);
    }
    if let Some(m) = b.max_bag_files {
        e.sample(&[("kind", "files")], f64::from(m));
    }
    if let Some(free) = b.free_bytes {
        e.single(
            "ringbag_free_bytes",
            Kind::Gauge,
            "Bytes free on the recording root's partition (for unprivileged users).",
            free as f64,
        );
    }
    if let Some(total) = b.partition_bytes {
        e.single(
            "ringbag_partition_bytes",
            Kind::Gauge,
            "Size of the recording root's partition, bytes.",
            total as f64,
        );
    }
    let floor = match (
        b.min_free_space,
        b.min_free_space_percent,
        b.partition_bytes,
    ) {
        (a, Some(p), Some(total)) => Some(a.unwrap_or(0).max((total as f64 * p / 100.0) as u64)),
        (a, _, _) => a,
    };
    if let Some(f) = floor {
        e.single(
            "ringbag_min_free_bytes",
            Kind::Gauge,
            "The free-space floor retention keeps, bytes (--min-free-space, \
             --min-free-space-percent).",
            f as f64,
        );
    }
}

fn clock(e: &mut Exposition, st: &Status) {
    let c = &st.clock;
    e.family(
        "ringbag_clock_source",
        Kind::Gauge,
        "1 for the clock that stamps messages now (ptp or system), with the one configured.",
    )
    .sample(&[("source", &c.source), ("requested", &c.requested)], 1.0);
    e.single(
        "ringbag_clock_fallback",
        Kind::Gauge,
        "1 when the configured clock could not be used and another stamps instead.",
        f64::from(u8::from(c.fallback_reason.is_some())),
    );
    e.single(
        "ringbag_clock_offset_seconds",
        Kind::Gauge,
        "Stamping clock minus the system's wall clock, seconds.",
        c.offset_ns as f64 / 1e9,
    );
    e.single(
        "ringbag_clock_steps_total",
        Kind::Counter,
        "Times the stamping clock stepped.",
        c.steps as f64,
    );
}

fn ring(e: &mut Exposition, st: &Status) {
    let Some(r) = &st.ring else {
        return;
    };
    e.single(
        "ringbag_ring_capacity_bytes",
        Kind::Gauge,
        "The snapshot ring's data area, bytes.",
        r.capacity_bytes as f64,
    );
    e.single(
        "ringbag_ring_used_bytes",
        Kind::Gauge,
        "Bytes of the snapshot ring holding messages now.",
        r.used_bytes as f64,
    );
    if let Some(age) = r.oldest_age_s {
        e.single(
            "ringbag_ring_oldest_age_seconds",
            Kind::Gauge,
            "Age of the oldest message in the ring: how far back a trigger now reaches.",
            age,
        );
    }
    e.single(
        "ringbag_ring_appended_total",
        Kind::Counter,
        "Messages appended to the ring since it was created.",
        r.appended as f64,
    );
    e.single(
        "ringbag_snapshot_open",
        Kind::Gauge,
        "1 while a snapshot is being written.",
        f64::from(u8::from(r.pending_trigger.is_some())),
    );
    let Some(n) = &st.snapshots else {
        return;
    };
    e.family(
        "ringbag_snapshot_triggers_total",
        Kind::Counter,
        "Snapshot triggers received, by source (socket, signal, topic, service), those \
         refused, rate-limited or extending an open snapshot included.",
    );
    for o in crate::snapshot::trigger::Origin::ALL {
        let v = n.triggers.get(o.name()).copied().unwrap_or(0);
        e.sample(&[("source", o.name())], v as f64);
    }
    e.single(
        "ringbag_snapshots_written_total",
        Kind::Counter,
        "Snapshot bags finished and kept.",
        n.written as f64,
    );
    e.single(
        "ringbag_snapshots_failed_total",
        Kind::Counter,
        "Snapshots that could not be started or were removed unfinished.",
        n.failed as f64,
    );
}

fn upload(e: &mut Exposition, st: &Status) {
    if let Some(d) = &st.deleted_before_upload {
        e.single(
            "ringbag_deleted_before_upload_files_total",
            Kind::Counter,
            "Closed files retention deleted before they were uploaded.",
            d.files as f64,
        );
        e.single(
            "ringbag_deleted_before_upload_bytes_total",
            Kind::Counter,
            "Bytes of those files.",
            d.bytes as f64,
        );
    }
    let Some(u) = &st.upload else {
        return;
    };
    e.single(
        "ringbag_upload_backlog_files",
        Kind::Gauge,
        "Closed files not yet verified in the bucket.",
        u.backlog_files as f64,
    );
    e.single(
        "ringbag_upload_backlog_bytes",
        Kind::Gauge,
        "Bytes of those files.",
        u.backlog_bytes as f64,
    );
    e.single(
        "ringbag_upload_backlog_oldest_age_seconds",
        Kind::Gauge,
        "Age of the oldest file not yet uploaded, seconds (0 when none waits).",
        u.oldest_backlog_age_s.unwrap_or(0.0),
    );
    e.single(
        "ringbag_upload_sent_bytes_total",
        Kind::Counter,
        "Body bytes sent to the object store, retries included.",
        u.bytes_sent as f64,
    );
    e.single(
        "ringbag_upload_files_total",
        Kind::Counter,
        "Files uploaded and verified in the bucket.",
        u.files_uploaded as f64,
    );
    if let Some(ms) = u.last_success_unix_ms {
        e.single(
            "ringbag_upload_last_success_time_seconds",
            Kind::Gauge,
            "When the last file was verified in the bucket, seconds since the Unix epoch.",
            ms as f64 / 1000.0,
        );
    }
    e.single(
        "ringbag_upload_failing",
        Kind::Gauge,
        "1 while the last upload attempt failed.",
        f64::from(u8::from(u.last_error.is_some())),
    );
    e.family(
        "ringbag_upload_errors_total",
        Kind::Counter,
        "Failed upload attempts, by kind: configuration (credentials, bucket, clock, TLS, \
         DNS), network, server (5xx or an unreadable answer), refused (4xx), verify (the \
         object did not match), file (changed, unreadable, too large), journal, \
         metadata_withheld.",
    );
    for kind in crate::upload::error::ERROR_KINDS {
        let v = u.errors.get(kind).copied().unwrap_or(0);
        e.sample(&[("kind", kind)], v as f64);
    }
}

/// A status with every family present and a plausible robot's figures (`topics` topics, a
/// ring, uploads, snapshots, a batch histogram): the input of `examples/metrics_cost` (the
/// scrape cost) and of the test that `promtool check metrics` accepts every family.
pub fn sample_status(topics: usize) -> Status {
    use crate::pipeline::BATCH_BUCKETS_S;
    use crate::service::status::{
        BudgetStatus, DeletedBeforeUploadStatus, HistogramStatus, RingStatus, SnapshotCountsStatus,
        TopicStatus, WriterStatus,
    };
    let counts = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    // Halving from bucket to bucket: every bucket holds something.
    let buckets: Vec<u64> = (0..=BATCH_BUCKETS_S.len() as u32)
        .map(|i| 4096 >> i)
        .collect();
    Status {
        updated_unix_ms: 1_700_000_000_000,
        uptime_s: 86_400.0,
        bag: "/var/lib/ringbag/bags/2026-12-04T10-00-00Z_0001".into(),
        splits_created: 1234,
        splits_deleted: 1200,
        budget: BudgetStatus {
            bytes: 200 << 30,
            max_record_size: Some(256 << 30),
            files: 3000,
            max_bag_files: Some(4000),
            span_s: 36_000.0,
            max_record_duration_s: Some(86_400.0),
            free_bytes: Some(40 << 30),
            partition_bytes: Some(512 << 30),
            min_free_space: Some(1 << 30),
            ..Default::default()
        },
        topics: (0..topics)
            .map(|i| TopicStatus {
                name: format!("/robot/subsystem_{i:02}/sensor/data_raw"),
                type_name: "sensor_msgs/msg/Image".into(),
                accepted: 123_456_789 + i as u64,
                written: 123_456_700 + i as u64,
                bytes: 987_654_321_000,
                dropped_queue_full: 12,
                throttled: 3,
                ..Default::default()
            })
            .collect(),
        writer: WriterStatus {
            batch_duration: HistogramStatus {
                bounds_s: BATCH_BUCKETS_S.to_vec(),
                count: buckets.iter().sum(),
                buckets,
                sum_s: 12.5,
            },
            longest_stall_s: 0.25,
            queue_bytes: 1 << 20,
            peak_queue_bytes: 64 << 20,
            fsync_longest_s: 0.05,
            fsyncs: 1234,
        },
        ring: Some(RingStatus {
            capacity_bytes: 2 << 30,
            used_bytes: 1 << 30,
            oldest_age_s: Some(30.0),
            appended: 99_999_999,
            ..Default::default()
        }),
        snapshots: Some(SnapshotCountsStatus {
            triggers: counts(&[("socket", 5), ("signal", 1), ("topic", 2), ("service", 0)]),
            written: 7,
            failed: 1,
        }),
        deleted_before_upload: Some(DeletedBeforeUploadStatus {
            files: 2,
            bytes: 1 << 30,
            bags: vec![],
        }),
        upload: Some(crate::upload::agent::UploadStatus {
            backlog_files: 12,
            backlog_bytes: 3 << 30,
            oldest_backlog_age_s: Some(600.0),
            bytes_sent: 1 << 40,
            files_uploaded: 5000,
            last_success_unix_ms: Some(1_700_000_000_000),
            errors: counts(&[("network", 3), ("server", 1)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::status::{
        BudgetStatus, DeletedBeforeUploadStatus, HistogramStatus, PendingStatus, RingStatus,
        SnapshotCountsStatus, TopicStatus, WriterStatus,
    };

    fn status() -> Status {
        Status {
            updated_unix_ms: 1_700_000_010_500,
            uptime_s: 10.5,
            bag: "/var/lib/ringbag/robot \"1\"".into(),
            splits_created: 3,
            budget: BudgetStatus {
                bytes: 1 << 30,
                max_record_size: Some(4 << 30),
                min_free_space_percent: Some(5.0),
                min_free_space: Some(1 << 20),
                partition_bytes: Some(100 << 30),
                free_bytes: Some(50 << 30),
                ..Default::default()
            },
            topics: vec![
                TopicStatus {
                    name: "/camera/image".into(),
                    accepted: 100,
                    written: 98,
                    dropped_queue_full: 2,
                    bytes: 1 << 20,
                    ..Default::default()
                },
                TopicStatus {
                    name: "/imu".into(),
                    accepted: 5,
                    written: 5,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_status_renders_as_named_counters_and_gauges_in_base_units() {
        let text = render(&status(), State::Recording);
        for line in [
            "ringbag_up 1\n",
            "ringbag_recording{bag=\"/var/lib/ringbag/robot \\\"1\\\"\"} 1\n",
            "ringbag_start_time_seconds 1700000000\n",
            "ringbag_messages_written_total{topic=\"/camera/image\"} 98\n",
            "ringbag_messages_written_total{topic=\"/imu\"} 5\n",
            "ringbag_messages_dropped_total{topic=\"/camera/image\",cause=\"queue_full\"} 2\n",
            "ringbag_budget_used{kind=\"size\"} 1073741824\n",
            "ringbag_budget_limit{kind=\"size\"} 4294967296\n",
            "ringbag_min_free_bytes 5368709120\n",
            "# TYPE ringbag_splits_created_total counter\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        // Limits that are off are absent, not zero.
        assert!(!text.contains("ringbag_budget_limit{kind=\"files\"}"));
        // No upload, no ring: their families are left out (ringbag_ring_only_messages_total
        // is per topic, always there).
        assert!(!text.contains("ringbag_upload_") && !text.contains("ringbag_ring_used_bytes"));
        assert!(
            !text.contains("ringbag_ring_capacity_bytes") && !text.contains("ringbag_snapshot")
        );
        let down = render(&status(), State::Exiting);
        assert!(down.contains("robot \\\"1\\\"\"} 0\n") && down.contains("ringbag_up 0\n"));
    }

    #[test]
    fn every_family_is_declared_once_and_every_sample_follows_its_own() {
        let text = render(&status(), State::Recording);
        let mut seen = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} declared twice");
                current = name;
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                // A histogram's samples carry its name with a suffix.
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| *b == current))
                    .unwrap_or(name);
                assert_eq!(base, current, "{line}");
            }
        }
        assert!(seen.len() > 20, "{}", seen.len());
    }

    /// [`status`] with every optional part present: ring, snapshots, upload, histogram.
    fn full_status() -> Status {
        let mut st = status();
        st.splits_deleted = 7;
        st.topics[0].throttled = 4;
        st.topics[1].ring_only = 11;
        st.topics[0].paused = 4;
        st.paused = true;
        st.writer = WriterStatus {
            batch_duration: HistogramStatus {
                bounds_s: crate::pipeline::BATCH_BUCKETS_S.to_vec(),
                // 3 under 1 ms, 2 in (2.5, 5] ms, 1 in (0.25, 0.5] s, 1 over 2.5 s.
                buckets: vec![3, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 1],
                sum_s: 3.5,
                count: 7,
            },
            longest_stall_s: 2.75,
            queue_bytes: 4096,
            peak_queue_bytes: 1 << 20,
            fsync_longest_s: 0.125,
            fsyncs: 9,
        };
        st.ring = Some(RingStatus {
            path: "/run/ringbag/r.ring".into(),
            capacity_bytes: 1 << 26,
            used_bytes: 1 << 20,
            appended: 50,
            oldest_age_s: Some(3.0),
            pending_trigger: Some(PendingStatus {
                reason: "estop".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        st.snapshots = Some(SnapshotCountsStatus {
            triggers: [("socket", 5), ("signal", 1), ("topic", 0), ("service", 2)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            written: 6,
            failed: 1,
        });
        st.deleted_before_upload = Some(DeletedBeforeUploadStatus {
            files: 1,
            bytes: 10,
            bags: vec![],
        });
        st.upload = Some(crate::upload::agent::UploadStatus {
            target: "http://s3/b".into(),
            last_error: Some("down".into()),
            last_success_unix_ms: Some(1_700_000_000_000),
            errors: [("network", 3), ("configuration", 2)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ..Default::default()
        });
        st
    }

    #[test]
    fn the_writer_storage_snapshot_topic_and_upload_additions_render_with_their_values() {
        let text = render(&full_status(), State::Recording);
        for line in [
            "# TYPE ringbag_writer_batch_duration_seconds histogram\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"0.001\"} 3\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"0.0025\"} 3\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"0.005\"} 5\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"0.25\"} 5\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"0.5\"} 6\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"2.5\"} 6\n",
            "ringbag_writer_batch_duration_seconds_bucket{le=\"+Inf\"} 7\n",
            "ringbag_writer_batch_duration_seconds_sum 3.5\n",
            "ringbag_writer_batch_duration_seconds_count 7\n",
            "# TYPE ringbag_writer_longest_stall_seconds gauge\n",
            "ringbag_writer_longest_stall_seconds 2.75\n",
            "# TYPE ringbag_queue_bytes gauge\n",
            "ringbag_queue_bytes 4096\n",
            "ringbag_queue_peak_bytes 1048576\n",
            "ringbag_fsync_longest_seconds 0.125\n",
            "ringbag_fsyncs_total 9\n",
            "# TYPE ringbag_splits_deleted_total counter\n",
            "ringbag_splits_deleted_total 7\n",
            "ringbag_messages_dropped_total{topic=\"/camera/image\",cause=\"throttled\"} 4\n",
            "ringbag_messages_dropped_total{topic=\"/imu\",cause=\"throttled\"} 0\n",
            "# TYPE ringbag_ring_only_messages_total counter\n",
            "ringbag_ring_only_messages_total{topic=\"/imu\"} 11\n",
            "ringbag_ring_only_messages_total{topic=\"/camera/image\"} 0\n",
            "# TYPE ringbag_paused_messages_total counter\n",
            "ringbag_paused_messages_total{topic=\"/camera/image\"} 4\n",
            "# TYPE ringbag_paused gauge\n",
            "ringbag_paused 1\n",
            "# TYPE ringbag_snapshot_triggers_total counter\n",
            "ringbag_snapshot_triggers_total{source=\"socket\"} 5\n",
            "ringbag_snapshot_triggers_total{source=\"signal\"} 1\n",
            "ringbag_snapshot_triggers_total{source=\"topic\"} 0\n",
            "ringbag_snapshot_triggers_total{source=\"service\"} 2\n",
            "ringbag_snapshots_written_total 6\n",
            "ringbag_snapshots_failed_total 1\n",
            "# TYPE ringbag_upload_errors_total counter\n",
            "ringbag_upload_errors_total{kind=\"network\"} 3\n",
            "ringbag_upload_errors_total{kind=\"configuration\"} 2\n",
            "ringbag_upload_errors_total{kind=\"server\"} 0\n",
            "ringbag_upload_errors_total{kind=\"metadata_withheld\"} 0\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        // Every kind the agent can count is listed, and only those.
        assert_eq!(
            text.matches("ringbag_upload_errors_total{").count(),
            crate::upload::error::ERROR_KINDS.len()
        );
        // Buckets are cumulative: never decreasing, the last (+Inf) equal to _count.
        let buckets: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("ringbag_writer_batch_duration_seconds_bucket{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(buckets.len(), 12);
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
        assert_eq!(buckets[11], 7.0);
        // Without a ring there are no snapshot counts; a status file of an older version
        // (no histogram) still renders an empty, valid one.
        let mut old = full_status();
        old.snapshots = None;
        old.writer = WriterStatus::default();
        let text = render(&old, State::Recording);
        assert!(!text.contains("ringbag_snapshot_triggers_total"));
        assert!(text.contains("ringbag_writer_batch_duration_seconds_bucket{le=\"+Inf\"} 0\n"));
        assert!(text.contains("ringbag_writer_batch_duration_seconds_count 0\n"));
    }

    #[test]
    fn older_status_files_without_the_new_fields_still_read() {
        let st = full_status();
        let mut v = serde_json::to_value(&st).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["splits_deleted", "writer", "snapshots"] {
            o.remove(k);
        }
        for t in o["topics"].as_array_mut().unwrap() {
            let t = t.as_object_mut().unwrap();
            t.remove("throttled");
            t.remove("ring_only");
        }
        o["upload"].as_object_mut().unwrap().remove("errors");
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back.splits_deleted, 0);
        assert_eq!(back.writer, WriterStatus::default());
        assert_eq!(back.snapshots, None);
        assert_eq!(back.topics[0].throttled, 0);
        assert!(back.upload.unwrap().errors.is_empty());
    }

    #[test]
    fn the_sample_status_has_every_family() {
        let text = render(&sample_status(3), State::Recording);
        // Every family this module writes is in the text.
        for family in [
            "ringbag_writer_batch_duration_seconds",
            "ringbag_splits_deleted_total",
            "ringbag_snapshot_triggers_total",
            "ringbag_snapshots_written_total",
            "ringbag_snapshots_failed_total",
            "ringbag_ring_only_messages_total",
            "ringbag_paused_messages_total",
            "ringbag_paused",
            "ringbag_upload_errors_total",
            "ringbag_ring_used_bytes",
            "ringbag_upload_last_success_time_seconds",
            "ringbag_deleted_before_upload_files_total",
        ] {
            assert!(text.contains(&format!("# TYPE {family} ")), "{family}");
        }
    }
}
