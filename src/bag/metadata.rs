//! metadata.yaml: read every version rosbag2 has written (1..=9), write Humble (v5) or
//! Jazzy (v9), atomically.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use super::qos::{self, PolicyStyle};
use super::{BagError, Flavour, TopicInfo};

pub const METADATA_FILE: &str = "metadata.yaml";
pub const MAX_METADATA_VERSION: u32 = 9;
/// The largest metadata.yaml read, in bytes. One of a bag of 100,000 splits with
/// rosbag2-style names is 23.2 MB (see the test
/// `a_metadata_yaml_of_100k_splits_fits_well_inside_the_cap`); anything larger is refused
/// before it is read or parsed, as the parser's memory and time grow with it.
pub const MAX_METADATA_BYTES: u64 = 128 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicWithCount {
    pub topic: TopicInfo,
    pub message_count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Relative to the bag directory, e.g. `mybag_0.db3`.
    pub path: String,
    pub starting_time_ns: i64,
    pub duration_ns: i64,
    pub message_count: u64,
}

impl FileInfo {
    /// True when this entry describes the split file `rel`. rosbag2's file compression lists
    /// `<split>.db3.zstd` in `relative_file_paths` but keeps `<split>.db3` in `files[].path`
    /// (Humble and Jazzy alike), so either name matches a compressed split.
    pub fn describes(&self, rel: &str) -> bool {
        self.path == rel
            || rel.strip_suffix(super::compressed::ZSTD_SUFFIX) == Some(self.path.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagMetadata {
    pub version: u32,
    pub storage_identifier: String,
    pub duration_ns: i64,
    pub starting_time_ns: i64,
    pub message_count: u64,
    pub topics: Vec<TopicWithCount>,
    pub compression_format: String,
    pub compression_mode: String,
    pub relative_file_paths: Vec<String>,
    pub files: Vec<FileInfo>,
    pub custom_data: BTreeMap<String, String>,
    pub ros_distro: String,
}

/// rosbag2 writes `time_point::max()` as the start of a bag with no messages.
pub const NO_START: i64 = i64::MAX;

impl BagMetadata {
    pub fn empty(flavour: Flavour) -> Self {
        BagMetadata {
            version: flavour.metadata_version(),
            storage_identifier: "sqlite3".into(),
            duration_ns: 0,
            starting_time_ns: NO_START,
            message_count: 0,
            topics: Vec::new(),
            compression_format: String::new(),
            compression_mode: String::new(),
            relative_file_paths: Vec::new(),
            files: Vec::new(),
            custom_data: BTreeMap::new(),
            ros_distro: match flavour {
                Flavour::Humble => String::new(),
                Flavour::Jazzy => "jazzy".into(),
            },
        }
    }

    /// The flavour whose conventions this metadata follows (v9 and later are Jazzy-style).
    pub fn flavour(&self) -> Flavour {
        if self.version >= 9 {
            Flavour::Jazzy
        } else {
            Flavour::Humble
        }
    }

    pub fn end_time_ns(&self) -> i64 {
        if self.starting_time_ns == NO_START {
            NO_START
        } else {
            self.starting_time_ns.saturating_add(self.duration_ns)
        }
    }

    /// The mapping under `rosbag2_bagfile_information`, in rosbag2's key order, written as
    /// `flavour`. The same text (without the outer key) goes into Jazzy's `metadata` table.
    pub fn to_value(&self, flavour: Flavour) -> Value {
        let jazzy = flavour == Flavour::Jazzy;
        let mut m = Mapping::new();
        m.insert("version".into(), flavour.metadata_version().into());
        m.insert(
            "storage_identifier".into(),
            self.storage_identifier.clone().into(),
        );
        m.insert("duration".into(), ns_map("nanoseconds", self.duration_ns));
        m.insert(
            "starting_time".into(),
            ns_map("nanoseconds_since_epoch", self.starting_time_ns),
        );
        m.insert("message_count".into(), self.message_count.into());
        let topics = self
            .topics
            .iter()
            .map(|t| {
                let mut tm = Mapping::new();
                tm.insert("name".into(), t.topic.name.clone().into());
                tm.insert("type".into(), t.topic.type_name.clone().into());
                tm.insert(
                    "serialization_format".into(),
                    t.topic.serialization_format.clone().into(),
                );
                let qos = if jazzy {
                    qos::profiles_to_value(&t.topic.offered_qos_profiles, PolicyStyle::Name)
                } else {
                    qos::profiles_to_yaml_string(
                        &t.topic.offered_qos_profiles,
                        PolicyStyle::Integer,
                    )
                    .into()
                };
                tm.insert("offered_qos_profiles".into(), qos);
                if jazzy {
                    tm.insert(
                        "type_description_hash".into(),
                        t.topic.type_description_hash.clone().into(),
                    );
                }
                let mut entry = Mapping::new();
                entry.insert("topic_metadata".into(), Value::Mapping(tm));
                entry.insert("message_count".into(), t.message_count.into());
                Value::Mapping(entry)
            })
            .collect();
        m.insert("topics_with_message_count".into(), Value::Sequence(topics));
        m.insert(
            "compression_format".into(),
            self.compression_format.clone().into(),
        );
        m.insert(
            "compression_mode".into(),
            self.compression_mode.clone().into(),
        );
        m.insert(
            "relative_file_paths".into(),
            Value::Sequence(
                self.relative_file_paths
                    .iter()
                    .map(|p| p.clone().into())
                    .collect(),
            ),
        );
        let files = self
            .files
            .iter()
            .map(|f| {
                let mut fm = Mapping::new();
                fm.insert("path".into(), f.path.clone().into());
                fm.insert(
                    "starting_time".into(),
                    ns_map("nanoseconds_since_epoch", f.starting_time_ns),
                );
                fm.insert("duration".into(), ns_map("nanoseconds", f.duration_ns));
                fm.insert("message_count".into(), f.message_count.into());
                Value::Mapping(fm)
            })
            .collect();
        m.insert("files".into(), Value::Sequence(files));
        if jazzy {
            let custom = if self.custom_data.is_empty() {
                Value::Null
            } else {
                Value::Mapping(
                    self.custom_data
                        .iter()
                        .map(|(k, v)| (Value::from(k.clone()), Value::from(v.clone())))
                        .collect(),
                )
            };
            m.insert("custom_data".into(), custom);
            m.insert("ros_distro".into(), "jazzy".into());
        }
        Value::Mapping(m)
    }

    /// The full metadata.yaml text.
    pub fn to_yaml(&self, flavour: Flavour) -> String {
        let mut top = Mapping::new();
        top.insert("rosbag2_bagfile_information".into(), self.to_value(flavour));
        serde_yaml_ng::to_string(&Value::Mapping(top)).unwrap_or_default()
    }

    /// The text Jazzy stores in each split's `metadata` table.
    pub fn to_table_yaml(&self, flavour: Flavour) -> String {
        serde_yaml_ng::to_string(&self.to_value(flavour)).unwrap_or_default()
    }

    /// Parse metadata.yaml text. `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, BagError> {
        let invalid = |message: String| BagError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        if text.len() as u64 > MAX_METADATA_BYTES {
            return Err(invalid(too_large(text.len() as u64)));
        }
        // Before the parser sees it: deep nesting stalls it (100,000 `[` took over 30 s).
        super::yamlguard::check_depth(text, super::yamlguard::MAX_DEPTH)
            .map_err(|e| invalid(format!("not a rosbag2 metadata.yaml: {e}")))?;
        let root: Value =
            serde_yaml_ng::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
        let info = root
            .get("rosbag2_bagfile_information")
            .ok_or_else(|| invalid("missing `rosbag2_bagfile_information`".into()))?;
        Self::from_value(info).map_err(invalid)
    }

    /// Parse the mapping under `rosbag2_bagfile_information` (or a `metadata` table row).
    pub fn from_value(info: &Value) -> Result<Self, String> {
        if !info.is_mapping() {
            return Err("`rosbag2_bagfile_information` is not a mapping".into());
        }
        let version = info
            .get("version")
            .and_then(Value::as_u64)
            .ok_or("missing or non-integer `version`")?;
        if !(1..=MAX_METADATA_VERSION as u64).contains(&version) {
            return Err(format!(
                "unsupported metadata version {version} (this build reads 1 to {MAX_METADATA_VERSION})"
            ));
        }
        let version = version as u32;
        let text = |k: &str| -> Result<String, String> {
            match info.get(k) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!("`{k}` is not a string: {other:?}")),
            }
        };
        let int = |v: Option<&Value>, k: &str| -> Result<i64, String> {
            match v {
                None => Ok(0),
                Some(v) => v
                    .as_i64()
                    .or_else(|| v.as_u64().map(|u| u.min(i64::MAX as u64) as i64))
                    .ok_or_else(|| format!("`{k}` is not an integer")),
            }
        };
        let ns = |k: &str, inner: &str| -> Result<i64, String> {
            int(
                info.get(k).and_then(|v| v.get(inner)),
                &format!("{k}.{inner}"),
            )
        };
        // Counts, durations and start times are refused when they cannot be true, rather
        // than printed or clamped: a negative count or duration, a start before the epoch,
        // or a span whose end does not fit in a timestamp means the file is damaged or
        // forged.
        let count = |v: Option<&Value>, k: &str| -> Result<u64, String> {
            let n = int(v, k)?;
            u64::try_from(n).map_err(|_| format!("`{k}` is negative ({n})"))
        };
        let span = |start: i64, dur: i64, what: &str| -> Result<(), String> {
            if dur < 0 {
                return Err(format!("{what}duration is negative ({dur} ns)"));
            }
            if start < 0 {
                return Err(format!(
                    "{what}starting time is before 1970 ({start} ns since the epoch)"
                ));
            }
            // `NO_START` marks "no messages"; any other start must leave room for its span.
            if start != NO_START && start.checked_add(dur).is_none() {
                return Err(format!(
                    "{what}starting time {start} ns plus duration {dur} ns overflows"
                ));
            }
            Ok(())
        };
        let storage_identifier = text("storage_identifier")?;
        let duration_ns = ns("duration", "nanoseconds")?;
        let starting_time_ns = ns("starting_time", "nanoseconds_since_epoch")?;
        span(starting_time_ns, duration_ns, "")?;
        let message_count = count(info.get("message_count"), "message_count")?;
        let mut topics = Vec::new();
        if let Some(list) = info.get("topics_with_message_count") {
            let list = match list {
                Value::Null => &[][..],
                Value::Sequence(s) => &s[..],
                _ => return Err("`topics_with_message_count` is not a list".into()),
            };
            for entry in list {
                let tm = entry
                    .get("topic_metadata")
                    .ok_or("a topic entry lacks `topic_metadata`")?;
                let field = |k: &str| -> Result<String, String> {
                    match tm.get(k) {
                        None | Some(Value::Null) => Ok(String::new()),
                        Some(Value::String(s)) => Ok(s.clone()),
                        Some(other) => Err(format!("topic `{k}` is not a string: {other:?}")),
                    }
                };
                let name = field("name")?;
                if name.is_empty() {
                    return Err("a topic has no name".into());
                }
                let offered_qos_profiles = match tm.get("offered_qos_profiles") {
                    None => Vec::new(),
                    Some(v) => qos::parse_profiles(v).map_err(|e| format!("topic {name}: {e}"))?,
                };
                let message_count = count(
                    entry.get("message_count"),
                    &format!("topic {name}: message_count"),
                )?;
                topics.push(TopicWithCount {
                    topic: TopicInfo {
                        type_name: field("type")?,
                        serialization_format: field("serialization_format")?,
                        offered_qos_profiles,
                        type_description_hash: field("type_description_hash")?,
                        name,
                    },
                    message_count,
                });
            }
        }
        let relative_file_paths = match info.get("relative_file_paths") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Sequence(s)) => s
                .iter()
                .map(|p| {
                    p.as_str()
                        .map(str::to_string)
                        .ok_or("a relative file path is not a string")
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`relative_file_paths` is not a list".into()),
        };
        let mut files = Vec::new();
        if let Some(Value::Sequence(list)) = info.get("files") {
            for f in list {
                let path = f
                    .get("path")
                    .and_then(Value::as_str)
                    .ok_or("a `files` entry has no path")?
                    .to_string();
                let starting_time_ns = int(
                    f.get("starting_time")
                        .and_then(|v| v.get("nanoseconds_since_epoch")),
                    "files.starting_time",
                )?;
                let duration_ns = int(
                    f.get("duration").and_then(|v| v.get("nanoseconds")),
                    "files.duration",
                )?;
                span(starting_time_ns, duration_ns, &format!("file {path}: "))?;
                files.push(FileInfo {
                    starting_time_ns,
                    duration_ns,
                    message_count: count(
                        f.get("message_count"),
                        &format!("file {path}: message_count"),
                    )?,
                    path,
                });
            }
        }
        let mut custom_data = BTreeMap::new();
        if let Some(Value::Mapping(m)) = info.get("custom_data") {
            for (k, v) in m {
                let k = k.as_str().ok_or("custom_data key is not a string")?;
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                custom_data.insert(k.to_string(), v);
            }
        }
        Ok(BagMetadata {
            version,
            storage_identifier,
            duration_ns,
            starting_time_ns,
            message_count,
            topics,
            compression_format: text("compression_format")?,
            compression_mode: text("compression_mode")?,
            relative_file_paths,
            files,
            custom_data,
            ros_distro: text("ros_distro")?,
        })
    }

    /// Read `<dir>/metadata.yaml`.
    pub fn read(dir: &Path) -> Result<Self, BagError> {
        let path = dir.join(METADATA_FILE);
        // Never blocks: a FIFO or directory under this name is an error naming it.
        let text =
            super::fsguard::read_regular_text(&path, MAX_METADATA_BYTES).map_err(|e| match e {
                super::fsguard::TextError::Bag(e) => e,
                super::fsguard::TextError::TooLarge(n) => BagError::invalid(&path, too_large(n)),
            })?;
        Self::parse(&text, &path)
    }

    /// Write `<dir>/metadata.yaml` atomically: temp file, fsync, rename, fsync the directory.
    /// A reader sees the old file or the new one, never a torn one, even after power loss.
    pub fn write_atomic(&self, dir: &Path, flavour: Flavour) -> Result<(), BagError> {
        write_file_atomic(dir, METADATA_FILE, self.to_yaml(flavour).as_bytes())
    }
}

fn too_large(bytes: u64) -> String {
    format!(
        "is {:.1} MiB, more than the {} MiB a metadata.yaml may be; not read",
        bytes as f64 / (1u64 << 20) as f64,
        MAX_METADATA_BYTES >> 20
    )
}

fn ns_map(key: &str, v: i64) -> Value {
    let mut m = Mapping::new();
    m.insert(key.into(), v.into());
    Value::Mapping(m)
}

/// Replace `dir/name` with `bytes` so that a crash at any point leaves either the old or the
/// new content.
pub fn write_file_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), BagError> {
    let target = dir.join(name);
    // A unique temp name: two processes rewriting the same bag (a recorder and a reindex
    // refused a moment later, or two reindexes) must never share one temp file.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| BagError::Io { path, source }
    };
    let written = fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        // Don't leave a half-written temp file behind (a full disk is the usual cause).
        let _ = fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    if let Err(e) = fs::rename(&tmp, &target) {
        // The target is a directory, or the directory vanished: leave no temp file behind.
        let _ = fs::remove_file(&tmp);
        return Err(io(&target)(e));
    }
    sync_dir(dir)
}

/// fsync a directory so that renames, creations and deletions in it survive power loss.
pub fn sync_dir(dir: &Path) -> Result<(), BagError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| BagError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::QosProfile;

    #[test]
    fn a_metadata_yaml_of_100k_splits_fits_well_inside_the_cap() {
        let mut m = sample(Flavour::Jazzy);
        for k in 0..100_000i64 {
            let path = format!("rosbag2_2026_12_03-21_46_01_{k}.db3");
            m.relative_file_paths.push(path.clone());
            m.files.push(FileInfo {
                path,
                starting_time_ns: 1_796_000_000_000_000_000 + k * 60_000_000_000,
                duration_ns: 59_999_999_999,
                message_count: 1_234_567,
            });
        }
        let len = m.to_yaml(Flavour::Jazzy).len() as u64;
        assert!(len * 4 < MAX_METADATA_BYTES, "{len} bytes");
    }

    #[test]
    fn a_deeply_nested_or_oversized_metadata_yaml_is_refused_before_parsing() {
        let p = Path::new("m/metadata.yaml");
        let deep = format!("rosbag2_bagfile_information: {}", "[".repeat(100_000));
        let t = std::time::Instant::now();
        let e = BagMetadata::parse(&deep, p).unwrap_err().to_string();
        assert!(e.contains("nested more than 64 levels deep"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        let big = " ".repeat(MAX_METADATA_BYTES as usize + 1);
        let e = BagMetadata::parse(&big, p).unwrap_err().to_string();
        assert!(e.contains("more than the 128 MiB"), "{e}");
    }

    fn sample(flavour: Flavour) -> BagMetadata {
        let mut m = BagMetadata::empty(flavour);
        let mut t = TopicInfo::new("/chatter", "std_msgs/msg/String");
        t.offered_qos_profiles = vec![QosProfile::default()];
        if flavour == Flavour::Jazzy {
            t.type_description_hash = "RIHS01_abc".into();
        }
        m.topics.push(TopicWithCount {
            topic: t,
            message_count: 3,
        });
        m.message_count = 3;
        m.starting_time_ns = 1_000;
        m.duration_ns = 20;
        m.relative_file_paths = vec!["b_0.db3".into()];
        m.files = vec![FileInfo {
            path: "b_0.db3".into(),
            starting_time_ns: 1_000,
            duration_ns: 20,
            message_count: 3,
        }];
        m
    }

    #[test]
    fn both_flavours_round_trip_through_yaml() {
        for f in [Flavour::Humble, Flavour::Jazzy] {
            let m = sample(f);
            let back = BagMetadata::parse(&m.to_yaml(f), Path::new("x")).unwrap();
            assert_eq!(back, m, "{f:?}");
        }
    }

    #[test]
    fn humble_writes_qos_as_a_string_and_jazzy_as_a_list() {
        let h: Value =
            serde_yaml_ng::from_str(&sample(Flavour::Humble).to_yaml(Flavour::Humble)).unwrap();
        let q = &h["rosbag2_bagfile_information"]["topics_with_message_count"][0]["topic_metadata"]
            ["offered_qos_profiles"];
        assert!(q.is_string());
        let j: Value =
            serde_yaml_ng::from_str(&sample(Flavour::Jazzy).to_yaml(Flavour::Jazzy)).unwrap();
        let q = &j["rosbag2_bagfile_information"]["topics_with_message_count"][0]["topic_metadata"]
            ["offered_qos_profiles"];
        assert_eq!(q[0]["history"], Value::from("keep_last"));
    }

    #[test]
    fn rejects_versions_outside_one_to_nine() {
        for v in [0, 10, 99] {
            let text = format!("rosbag2_bagfile_information:\n  version: {v}\n");
            let err = BagMetadata::parse(&text, Path::new("m.yaml"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("unsupported metadata version"), "{err}");
            assert!(err.starts_with("m.yaml:"), "{err}");
        }
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        sample(Flavour::Jazzy)
            .write_atomic(dir.path(), Flavour::Jazzy)
            .unwrap();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![METADATA_FILE.to_string()]);
        assert_eq!(
            BagMetadata::read(dir.path()).unwrap(),
            sample(Flavour::Jazzy)
        );
    }
}
