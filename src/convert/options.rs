//! The `ros2 bag convert` output options file: `output_bags:`, a list of entries, each a
//! rosbag2 `StorageOptions` plus `RecordOptions` (the keys `ros2 bag convert` reads). Humble
//! and Jazzy name some keys differently (`all` / `all_topics`, `exclude` / `exclude_regex`);
//! both spellings are read, whatever the flavour written. Unlike rosbag2, which ignores a key
//! it does not know, an unknown key or a value of the wrong kind is an error: a typo must not
//! silently write a different bag.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_yaml_ng::Value;

use crate::bag::filemode::FileCompression;
use crate::bag::schema::StoragePreset;
use crate::bag::Flavour;
use crate::source::select::{RosSourceOptions, TopicSelector};

/// One entry of `output_bags`, checked.
#[derive(Debug)]
pub struct OutputBag {
    pub uri: PathBuf,
    pub flavour: Flavour,
    pub preset: StoragePreset,
    /// `max_bagfile_size`, bytes; 0 = no size split.
    pub max_bag_size: u64,
    /// `max_bagfile_duration` (seconds in the file), ns; 0 = no duration split.
    pub max_bag_duration_ns: i64,
    /// `start_time_ns` / `end_time_ns`, inclusive; -1 in the file = open.
    pub start_ns: Option<i64>,
    pub end_ns: Option<i64>,
    pub custom_data: BTreeMap<String, String>,
    pub selector: TopicSelector,
    /// `compression_mode: file` + `compression_format: zstd`: every split of the output
    /// compressed whole, as `record --compression-mode file` writes it; None = plain.
    pub compression: Option<FileCompression>,
}

/// Keys rosbag2 reads that change nothing in an offline rewrite (cache and discovery
/// settings, recorder behaviour); accepted so that files written for `ros2 bag convert` work.
const NO_EFFECT_KEYS: &[&str] = &[
    "max_cache_size",
    // The compression threads run at nice 19 whatever this says (as the recorder's).
    "compression_threads_priority",
    "include_unpublished_topics",
    "ignore_leaf_topics",
    "is_discovery_disabled",
    "start_paused",
    "use_sim_time",
    "disable_keyboard_controls",
    "node_prefix",
    "topic_polling_interval",
];

/// Parse and check an options file's text; `Err` is one line.
pub fn parse_options(text: &str, default_flavour: Flavour) -> Result<Vec<OutputBag>, String> {
    crate::bag::yamlguard::check_depth(text, crate::bag::yamlguard::MAX_DEPTH)?;
    let v: Value = serde_yaml_ng::from_str(text).map_err(|e| {
        format!(
            "not YAML: {}",
            e.to_string().lines().next().unwrap_or_default()
        )
    })?;
    let Value::Mapping(top) = v else {
        return Err("expected a mapping with the key output_bags".into());
    };
    let mut entries = None;
    for (k, v) in &top {
        match k.as_str() {
            Some("output_bags") => entries = Some(v),
            Some(k) => return Err(format!("unknown key {k:?}; expected output_bags")),
            None => return Err("a key is not a string".into()),
        }
    }
    let Some(Value::Sequence(entries)) = entries else {
        return Err("output_bags: expected a list of output bags".into());
    };
    if entries.is_empty() {
        return Err("output_bags is empty".into());
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| parse_entry(e, default_flavour).map_err(|m| format!("output_bags[{i}]: {m}")))
        .collect()
}

fn string(k: &str, v: &Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{k}: expected a string"))
}

fn boolean(k: &str, v: &Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("{k}: expected true or false"))
}

fn uint(k: &str, v: &Value) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{k}: expected a whole number >= 0"))
}

fn int(k: &str, v: &Value) -> Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| format!("{k}: expected a whole number"))
}

fn list(k: &str, v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Sequence(s) => s
            .iter()
            .map(|x| string(k, x))
            .collect::<Result<Vec<_>, _>>(),
        _ => Err(format!("{k}: expected a list of strings")),
    }
}

/// An empty string is rosbag2's "not set".
fn opt_string(k: &str, v: &Value) -> Result<Option<String>, String> {
    Ok(Some(string(k, v)?).filter(|s| !s.is_empty()))
}

fn parse_entry(e: &Value, default_flavour: Flavour) -> Result<OutputBag, String> {
    let Value::Mapping(m) = e else {
        return Err("expected a mapping (uri: ..., topics: ...)".into());
    };
    let mut uri = None;
    let mut flavour = default_flavour;
    let mut preset = StoragePreset::WriteOptimized;
    let (mut max_bag_size, mut max_dur_s) = (0u64, 0u64);
    let (mut start, mut end) = (-1i64, -1i64);
    let mut custom_data = BTreeMap::new();
    let mut sel = RosSourceOptions::default();
    let (mut comp_mode, mut comp_format) = (String::new(), String::new());
    // rosbag2's defaults (`RecordOptions`): one thread per core, a queue of one split.
    let (mut comp_threads, mut comp_queue) = (0u64, 1u64);
    for (k, v) in m {
        let k = k.as_str().ok_or("a key is not a string")?;
        match k {
            "uri" => uri = Some(string(k, v)?),
            "storage_id" => match string(k, v)?.as_str() {
                "" | "sqlite3" => {}
                other => return Err(format!("storage_id {other:?}: ringbag writes sqlite3 only")),
            },
            "bag_format" => {
                flavour = match string(k, v)?.as_str() {
                    "humble" => Flavour::Humble,
                    "jazzy" => Flavour::Jazzy,
                    other => return Err(format!("bag_format {other:?}: expected humble or jazzy")),
                }
            }
            "storage_preset_profile" => {
                preset = match string(k, v)?.as_str() {
                    "" | "write-optimized" => StoragePreset::WriteOptimized,
                    "resilient" => StoragePreset::Resilient,
                    "none" => StoragePreset::None,
                    other => {
                        return Err(format!(
                    "storage_preset_profile {other:?}: expected resilient, none or write-optimized"
                ))
                    }
                }
            }
            "storage_config_uri" => {
                if opt_string(k, v)?.is_some() {
                    return Err("storage_config_uri is not supported by convert".into());
                }
            }
            "snapshot_mode" => {
                if boolean(k, v)? {
                    return Err("snapshot_mode: true makes no sense for convert".into());
                }
            }
            "max_bagfile_size" => max_bag_size = uint(k, v)?,
            "max_bagfile_duration" => max_dur_s = uint(k, v)?,
            "start_time_ns" => start = int(k, v)?,
            "end_time_ns" => end = int(k, v)?,
            "custom_data" => match v {
                Value::Null => {}
                Value::Mapping(cm) => {
                    for (ck, cv) in cm {
                        let ck = ck.as_str().ok_or("custom_data: a key is not a string")?;
                        let cv = match cv {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            Value::Bool(b) => b.to_string(),
                            _ => return Err(format!("custom_data.{ck}: expected a scalar")),
                        };
                        custom_data.insert(ck.to_string(), cv);
                    }
                }
                _ => return Err("custom_data: expected a mapping".into()),
            },
            "all" | "all_topics" => sel.all |= boolean(k, v)?,
            "all_services" => {
                if boolean(k, v)? {
                    return Err("all_services: ringbag records no service events".into());
                }
            }
            "services" | "exclude_service_events" => {
                if !list(k, v)?.is_empty() {
                    return Err(format!("{k}: ringbag records no service events"));
                }
            }
            "topics" => sel.topics = list(k, v)?,
            "topic_types" => sel.topic_types = list(k, v)?,
            "exclude_topics" => sel.exclude_topics = list(k, v)?,
            "exclude_topic_types" => sel.exclude_topic_types = list(k, v)?,
            "regex" => sel.regex = opt_string(k, v)?,
            "exclude" | "exclude_regex" => sel.exclude_regex = opt_string(k, v)?,
            "include_hidden_topics" => sel.include_hidden_topics = boolean(k, v)?,
            "rmw_serialization_format" => match string(k, v)?.as_str() {
                "" | "cdr" => {}
                other => {
                    return Err(format!(
                        "rmw_serialization_format {other:?}: ringbag copies cdr as stored"
                    ))
                }
            },
            "compression_mode" => comp_mode = string(k, v)?,
            "compression_format" => comp_format = string(k, v)?,
            "compression_threads" => comp_threads = uint(k, v)?,
            "compression_queue_size" => comp_queue = uint(k, v)?,
            "topic_qos_profile_overrides" => match v {
                Value::Null => {}
                Value::Mapping(o) if o.is_empty() => {}
                _ => {
                    return Err(
                        "topic_qos_profile_overrides: convert keeps the recorded QoS".into(),
                    )
                }
            },
            k if NO_EFFECT_KEYS.contains(&k) => {}
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    let uri = uri
        .filter(|u| !u.is_empty())
        .ok_or("uri: missing (the output bag's directory)")?;
    if start < -1 || end < -1 {
        return Err("start_time_ns / end_time_ns: -1 (open) or a time in ns".into());
    }
    let start_ns = (start >= 0).then_some(start);
    let end_ns = (end >= 0).then_some(end);
    if let (Some(s), Some(e)) = (start_ns, end_ns) {
        if e < s {
            return Err(format!("end_time_ns {e} is before start_time_ns {s}"));
        }
    }
    if max_bag_size > 0 && max_bag_size < crate::cli::resolve::MIN_MAX_BAG_SIZE {
        return Err(format!(
            "max_bagfile_size {max_bag_size}: below rosbag2's minimum of {} bytes (0 = no split)",
            crate::cli::resolve::MIN_MAX_BAG_SIZE
        ));
    }
    let max_bag_duration_ns = i64::try_from(max_dur_s)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000_000))
        .ok_or("max_bagfile_duration: too large")?;
    let compression = compression(&comp_mode, &comp_format, comp_threads, comp_queue)?;
    // No selection at all writes every topic, as Humble's `ros2 bag convert` does.
    let selector = TopicSelector::all_by_default(&sel).map_err(|e| e.to_string())?;
    Ok(OutputBag {
        uri: PathBuf::from(uri),
        flavour,
        preset,
        max_bag_size,
        max_bag_duration_ns,
        start_ns,
        end_ns,
        custom_data,
        selector,
        compression,
    })
}

/// The compression keys, checked as `record`'s flags are ([`FileCompression::from_flags`])
/// but with messages naming the keys. rosbag2 reads the mode in any case (`FILE`, `file`)
/// and compresses nothing for a format without a mode; ringbag refuses that rather than
/// write plain splits a file asked compressed (exit 2).
fn compression(
    mode: &str,
    format: &str,
    threads: u64,
    queue: u64,
) -> Result<Option<FileCompression>, String> {
    use crate::bag::compressed::ZSTD_FORMAT;
    if !format.is_empty() && format != ZSTD_FORMAT {
        return Err(format!(
            "compression_format {format:?}: unknown; ringbag compresses with zstd only"
        ));
    }
    let lower = mode.to_ascii_lowercase();
    let mode = match lower.as_str() {
        "" | "none" => None,
        m @ ("file" | "message") => Some(m),
        _ => {
            return Err(format!(
                "compression_mode {mode:?}: expected none, file or message"
            ))
        }
    };
    match (mode, format.is_empty()) {
        (None, true) => Ok(None),
        (None, false) => Err(format!(
            "compression_format {format:?} needs compression_mode: file or message"
        )),
        (Some(m), true) => Err(format!(
            "compression_mode {m} needs compression_format: zstd"
        )),
        (Some(m), false) => {
            let n = |k: &str, v: u64| u32::try_from(v).map_err(|_| format!("{k}: too large"));
            FileCompression::from_flags(
                m,
                ZSTD_FORMAT,
                n("compression_threads", threads)?,
                n("compression_queue_size", queue)?,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(body: &str) -> Result<OutputBag, String> {
        parse_options(
            &format!("output_bags:\n- uri: o\n  {body}\n"),
            Flavour::Jazzy,
        )
        .map(|mut v| v.remove(0))
    }

    /// rosbag2's defaults when only the mode and format are given: one thread per core, a
    /// queue of one split, zstd level 1; the other keys as given; `none` and empty are plain.
    #[test]
    fn compression_keys_take_rosbag2_defaults_and_values() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c = one("compression_mode: file\n  compression_format: zstd")
            .unwrap()
            .compression
            .expect("file mode");
        assert_eq!((c.threads, c.queue_size, c.level), (cores, 1, 1));
        let c = one("compression_mode: FILE\n  compression_format: zstd\n  compression_threads: 3\n  compression_queue_size: 0")
            .unwrap()
            .compression
            .expect("file mode");
        assert_eq!((c.threads, c.queue_size), (3, 0));
        assert!(!c.per_message);
        for mode in ["message", "MESSAGE"] {
            let c = one(&format!(
                "compression_mode: {mode}\n  compression_format: zstd"
            ))
            .unwrap()
            .compression
            .expect("message mode");
            assert!(c.per_message, "{mode}");
        }
        assert_eq!(
            one("compression_mode: message").unwrap_err(),
            "output_bags[0]: compression_mode message needs compression_format: zstd"
        );
        for plain in [
            "compression_mode: none",
            "compression_mode: ''",
            "storage_id: sqlite3",
        ] {
            assert!(one(plain).unwrap().compression.is_none(), "{plain}");
        }
        let e = one(
            "compression_mode: file\n  compression_format: zstd\n  compression_threads: 5000000000",
        )
        .unwrap_err();
        assert_eq!(e, "output_bags[0]: compression_threads: too large");
    }
}
