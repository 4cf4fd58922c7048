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
    e.family(
        "ringbag_messages_dropped_total",
        Kind::Counter,
        "Messages lost, per topic and cause: queue_full (the writer fell behind), oversize \
         (larger than any split may hold), after_stop (arrived while stopping), unwritten \
         (accepted but not committed at the end), middleware (lost before reaching ringbag).",
    );
    for t in &st.topics {
        for (cause, n) in [
            ("queue_full", t.dropped_queue_full),
            ("oversize", t.dropped_oversize),
            ("after_stop", t.dropped_after_stop),
            ("unwritten", t.unwritten),
            ("middleware", t.lost_in_middleware),
        ] {
            e.sample(&[("topic", &t.name), ("cause", cause)], n as f64);
        }
    }
    e.single(
        "ringbag_splits_created_total",
        Kind::Counter,
        "Split files this bag opened.",
        st.splits_created as f64,
    );
}

fn storage(e: &mut Exposition, st: &Status) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::status::{BudgetStatus, TopicStatus};

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
        // No upload, no ring: their families are left out.
        assert!(!text.contains("ringbag_upload_") && !text.contains("ringbag_ring_"));
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
                assert_eq!(name, current, "{line}");
            }
        }
        assert!(seen.len() > 20, "{}", seen.len());
    }
}
