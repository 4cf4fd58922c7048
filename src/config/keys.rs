//! Every key of ringbag.toml, with its default and meaning: the one list that `ringbag.toml(5)`
//! is generated from (`ringbag gen-docs`) and that scripts/docs-check.py holds the docs to.
//! The tests below tie it to the parser's own structs ([`ServiceConfig`], [`RawUpload`] and
//! `upload::settings::KEYS`): a key added to the parser and not here fails them, so the man
//! page cannot fall behind the file format.
//!
//! [`ServiceConfig`]: super::ServiceConfig
//! [`RawUpload`]: crate::upload::settings::RawUpload

use crate::clock::DEFAULT_PTP_DEVICE;
use crate::snapshot::control::DEFAULT_CONTROL_SOCKET;
use crate::upload::settings::DEFAULT_REGION;
use crate::upload::DEFAULT_KEY_TEMPLATE;

/// One key: where it lives, its default as the docs write it, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    /// `None` for the top level, `Some("upload")` for `[upload]`.
    pub table: Option<&'static str>,
    pub key: &'static str,
    /// The default as text (`none`, `off`, `required`, a value with its unit).
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn top(key: &'static str, default: &'static str, meaning: &'static str) -> KeyDoc {
    KeyDoc {
        table: None,
        key,
        default,
        meaning,
    }
}

const fn upload(key: &'static str, default: &'static str, meaning: &'static str) -> KeyDoc {
    KeyDoc {
        table: Some("upload"),
        key,
        default,
        meaning,
    }
}

/// In the order the config tables of docs/service.md list them.
pub const KEYS: &[KeyDoc] = &[
    top("output_root", super::DEFAULT_OUTPUT_ROOT, "recording root: absolute, created if missing, must be writable"),
    top("status_file", super::DEFAULT_STATUS_FILE, "status file (absolute), rewritten atomically every second and once more with a bag's final counts"),
    top("metrics_textfile", "none", "Prometheus metrics for node_exporter's textfile collector (absolute, ending in .prom), replaced every metrics_interval"),
    top("metrics_interval", "10", "seconds (or \"30s\", \"1m\") between textfile rewrites, 1 s to 1 h"),
    top("metrics_listen", "none", "\"127.0.0.1:9466\": serve GET /metrics there (an IP address, not a host name)"),
    top("source", "ros in builds with the ros feature, else synthetic", "\"ros\" or \"synthetic\""),
    top("synthetic_profile", "robot", "robot, small, medium, large or mixed (only with source = \"synthetic\")"),
    top("synthetic_rate", "realtime", "realtime or max"),
    top("synthetic_count", "0", "stop cleanly after this many synthetic messages; 0 = until stopped"),
    top("topics", "none", "topics to record, as record's positional TOPICS"),
    top("all", "false", "record every topic, as record --all"),
    top("regex", "none", "record topics matching this regular expression, as record --regex"),
    top("exclude_regex", "none", "leave out topics matching this regular expression"),
    top("exclude_topics", "none", "leave out these topics"),
    top("topic_types", "none", "record topics of these message types"),
    top("exclude_topic_types", "none", "leave out topics of these message types"),
    top("include_hidden_topics", "false", "also record hidden topics"),
    top("bag_format", "from ROS_DISTRO (humble, else jazzy)", "files as this rosbag2 release writes them: humble or jazzy"),
    top("storage_preset_profile", "write-optimized", "write-optimized, resilient or none"),
    top("compression_mode", "none", "none, file (each closed split compressed into <split>.db3.zstd, as rosbag2's file mode) or message (each message one zstd frame in plain splits, as rosbag2's message mode)"),
    top("compression_format", "none", "zstd, with compression_mode = \"file\"; refused otherwise"),
    top("compression_threads", "0", "threads compressing closed splits at nice 19; 0 = one per core"),
    top("compression_queue_size", "1", "closed splits waiting for a compression thread (0 = no limit); a split that finds it full waits, the writer never does"),
    top("max_cache_size", "100MiB", "byte budget of queued messages (> 0)"),
    top("max_bag_size", "0", "split size (0 = off), at least 86016 bytes"),
    top("max_bag_duration", "0", "split duration (0 = off)"),
    top("max_record_size", "off", "total bytes of every split in the root; needs max_bag_size, at least twice it"),
    top("max_record_duration", "off", "span kept; needs a split limit, at least twice max_bag_duration"),
    top("max_bag_files", "off", "split files kept in the root (at least 2); needs a split limit"),
    top("min_free_space", "off", "free-space floor on the root's partition (a size)"),
    top("min_free_space_percent", "off", "free-space floor on the root's partition (percent)"),
    top("clock", "auto", "timestamp source: auto, system or ptp"),
    top("ptp_device", DEFAULT_PTP_DEVICE, "the PTP hardware clock to read"),
    top("ptp_timescale", "tai", "the PHC's timescale: tai or utc"),
    top("tai_utc_offset", "37", "seconds between TAI and UTC"),
    top("ptp_poll_interval", "1000", "ms between PHC offset measurements, 10 to 60000"),
    top("ptp_step_threshold", "100", "µs of offset change taken as a clock step, 1 to 1000000"),
    top("snapshot_size", "off", "byte size of the black box's memory ring"),
    top("snapshot_duration", "off", "time window the ring keeps"),
    top("snapshot_file", "/run/ringbag/ringbag-<root>-<crc>.ring", "the ring's file"),
    top("snapshot_topics", "none", "topics kept in the ring only"),
    top("snapshot_regex", "none", "topics matching this regular expression kept in the ring only"),
    top("topic_rate", "none", "[\"/camera/front/image_raw=2\"]: at most HZ of a topic in continuous recording"),
    top("trigger_topic", "none", "\"/estop\" or \"/estop:std_msgs/msg/Bool\": a message there triggers a snapshot"),
    top("control_socket", DEFAULT_CONTROL_SOCKET, "where ringbag pause, resume and trigger reach the service (absolute, at most 107 bytes)"),
    upload("enabled", "true", "false keeps the table (still checked) but uploads nothing"),
    upload("endpoint", "required", "https://host[:port]; plain http:// only to a loopback host or with allow_http"),
    upload("allow_http", "false", "allow http:// to any host; there is no key to skip TLS verification"),
    upload("region", DEFAULT_REGION, "the region requests are signed for"),
    upload("bucket", "required", "the bucket, by S3's naming rules"),
    upload("key", DEFAULT_KEY_TEMPLATE, "object key template; {bag} and {file} required, {robot} optional"),
    upload("robot_id", "content of /etc/machine-id", "{robot}: letters, digits, '.', '_', '-'"),
    upload("path_style", "false", "endpoint/bucket/key rather than bucket.endpoint/key"),
    upload("ca_file", "none", "absolute path of a PEM file trusted beside the system's CAs"),
    upload("max_rate", "unlimited", "bytes/s over all transfers (\"2MiB\", \"2MiB/s\" or an integer)"),
    upload("part_size", "16MiB", "multipart part size, 5MiB to 5GiB"),
    upload("concurrency", "2", "parts in flight, 1 to 16"),
    upload("delete_after_upload", "false", "delete a file as soon as it is verified in the bucket (the service only)"),
    upload("credentials_file", "none", "absolute path of an AWS shared-credentials file, mode 0600 or stricter"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServiceConfig;
    use crate::upload::settings::RawUpload;

    fn top_level() -> impl Iterator<Item = &'static KeyDoc> {
        KEYS.iter().filter(|k| k.table.is_none())
    }

    /// The field names of a struct's `Debug` of its default: every field is None, false or
    /// empty there, so no value holds a comma.
    fn fields(debug: &str) -> Vec<String> {
        let inner = debug.split_once(" { ").unwrap().1.trim_end_matches(" }");
        inner
            .split(", ")
            .map(|f| f.split_once(':').unwrap().0.to_string())
            .collect()
    }

    #[test]
    fn every_top_level_field_is_listed_once() {
        let mut want = fields(&format!("{:?}", ServiceConfig::default()));
        // `upload` is a table, listed by its keys.
        want.retain(|f| f != "upload");
        let mut have: Vec<String> = top_level().map(|k| k.key.to_string()).collect();
        want.sort();
        have.sort();
        assert_eq!(have, want);
    }

    #[test]
    fn every_listed_top_level_key_is_known_to_the_parser() {
        // A value of no type any key takes fails on the type, not as an unknown key.
        for k in top_level() {
            let e = toml::from_str::<ServiceConfig>(&format!("{} = [[]]\n", k.key)).unwrap_err();
            assert!(!e.message().contains("unknown field"), "{}: {e}", k.key);
        }
    }

    #[test]
    fn upload_keys_are_the_parsers() {
        let have: Vec<&str> = KEYS
            .iter()
            .filter(|k| k.table == Some("upload"))
            .map(|k| k.key)
            .collect();
        assert_eq!(have, crate::upload::settings::KEYS);
        assert_eq!(
            fields(&format!("{:?}", RawUpload::default())).len(),
            have.len()
        );
    }

    #[test]
    fn defaults_and_meanings_are_one_line() {
        for k in KEYS {
            assert!(!k.default.is_empty() && !k.meaning.is_empty(), "{}", k.key);
            assert!(
                !k.default.contains('\n') && !k.meaning.contains('\n'),
                "{}",
                k.key
            );
        }
    }

    #[test]
    fn defaults_the_code_holds_are_the_codes() {
        let default = |key: &str| KEYS.iter().find(|k| k.key == key).unwrap().default;
        let bytes = |key: &str| crate::units::parse_bytes(default(key)).unwrap();
        assert_eq!(
            default("metrics_interval"),
            crate::config::DEFAULT_METRICS_INTERVAL
                .as_secs()
                .to_string()
        );
        assert_eq!(
            bytes("max_cache_size"),
            crate::config::DEFAULT_MAX_CACHE_SIZE
        );
        assert_eq!(
            default("tai_utc_offset"),
            crate::clock::DEFAULT_TAI_UTC_OFFSET_S.to_string()
        );
        assert_eq!(
            default("ptp_poll_interval"),
            crate::clock::DEFAULT_POLL_INTERVAL.as_millis().to_string()
        );
        assert_eq!(
            default("ptp_step_threshold"),
            crate::clock::DEFAULT_STEP_THRESHOLD.as_micros().to_string()
        );
        assert_eq!(bytes("part_size"), crate::upload::DEFAULT_PART_SIZE);
        assert_eq!(
            default("concurrency"),
            crate::upload::DEFAULT_CONCURRENCY.to_string()
        );
        let clock = crate::clock::ClockSettings::default();
        assert_eq!(default("clock"), format!("{:?}", clock.kind).to_lowercase());
        assert_eq!(
            default("ptp_timescale"),
            format!("{:?}", clock.timescale).to_lowercase()
        );
    }
}
