//! `--storage-config-file`: rosbag2's sqlite3 storage configuration YAML,
//!
//! ```yaml
//! write:
//!   pragmas: ["synchronous = NORMAL", "cache_size = -65536"]
//! read:
//!   pragmas: [...]
//! ```
//!
//! as far as it is safe for ringbag. The storage preset owns the pragmas that its crash and
//! power-cut guarantees rest on (the journal, the locking mode, the page size, how often
//! SQLite syncs), so a pragma that would weaken them is refused with the reason, never
//! applied and never ignored. What is left is tuning: the page cache, temporary storage,
//! memory mapping, and a `synchronous` at least as strict as the preset's.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::schema::StoragePreset;

/// Why a storage config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: crate::config::SmallFileError,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    write: Option<RawSection>,
    #[serde(default)]
    read: Option<RawSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSection {
    #[serde(default)]
    pragmas: Vec<String>,
}

/// A storage config as ringbag uses it: the statements to run on each write connection after
/// the preset's own, and the read pragmas found (which play refuses; see [`load_for_play`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageConfig {
    /// `PRAGMA name=value;` statements, validated.
    pub write_pragmas: String,
    /// The `read:` pragmas as written.
    pub read_pragmas: Vec<String>,
}

/// SQLite's `synchronous` levels, weakest first.
const SYNC_LEVELS: [&str; 4] = ["off", "normal", "full", "extra"];

fn sync_level(value: &str) -> Option<usize> {
    let v = value.to_ascii_lowercase();
    SYNC_LEVELS
        .iter()
        .position(|l| *l == v)
        .or_else(|| v.parse::<usize>().ok().filter(|&n| n < SYNC_LEVELS.len()))
}

/// The `synchronous` level a preset sets, read from its own pragmas
/// (`StoragePreset::write_pragmas`), so that the two cannot disagree.
fn preset_sync_level(preset: StoragePreset) -> usize {
    preset
        .write_pragmas()
        .split(';')
        .filter_map(|st| st.trim().strip_prefix("PRAGMA synchronous="))
        .find_map(sync_level)
        .unwrap_or(0)
}

/// One pragma of the file, `[schema.]name = value`, split and checked for shape: the value is
/// a word or an integer, so nothing but that one pragma can reach SQLite.
fn split_pragma(p: &str) -> Result<(String, String), String> {
    let (name, value) = p
        .split_once('=')
        .ok_or_else(|| format!("pragma {p:?}: expected NAME = VALUE"))?;
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("main.").unwrap_or(&name).to_string();
    let value = value.trim().to_string();
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphanumeric() || c == '_' || (i == 0 && c == '-'))
    };
    if !word(&name) || name.starts_with('-') || !word(&value) {
        return Err(format!(
            "pragma {p:?}: expected NAME = VALUE (a word or an integer)"
        ));
    }
    Ok((name, value))
}

/// The write pragma `p` as a statement, or why ringbag refuses it under `preset`.
fn write_pragma(p: &str, preset: StoragePreset) -> Result<String, String> {
    let (name, value) = split_pragma(p)?;
    let int = |v: &str| v.parse::<i64>().is_ok();
    let ok = match name.as_str() {
        "cache_size" | "mmap_size" => int(&value),
        "temp_store" => matches!(
            value.to_ascii_lowercase().as_str(),
            "default" | "file" | "memory" | "0" | "1" | "2"
        ),
        "synchronous" => {
            let Some(level) = sync_level(&value) else {
                return Err(format!(
                    "pragma {p:?}: synchronous is OFF, NORMAL, FULL or EXTRA"
                ));
            };
            let floor = preset_sync_level(preset);
            if level < floor {
                return Err(format!(
                    "pragma {p:?}: weaker than the {} preset's synchronous={}; a power cut \
                     could then lose batches that ringbag reports as committed",
                    preset.name(),
                    SYNC_LEVELS[floor].to_uppercase()
                ));
            }
            true
        }
        "journal_mode" => {
            return Err(format!(
                "pragma {p:?}: the journal is the storage preset's (crash salvage by reindex, \
                 the guard journal of a split's first commits and closed splits without -wal \
                 files rest on it); choose --storage-preset-profile instead"
            ))
        }
        "locking_mode" => {
            return Err(format!(
                "pragma {p:?}: the locking mode is the storage preset's (readers such as \
                 `ringbag info` rely on it while a split is written)"
            ))
        }
        "page_size" => {
            return Err(format!(
                "pragma {p:?}: ringbag chooses each split's page size (the size budget's \
                 bound on what a message adds to a split depends on it)"
            ))
        }
        _ => {
            return Err(format!(
                "pragma {p:?}: not one ringbag knows to be safe for its guarantees; it applies \
                 cache_size, mmap_size, temp_store, and synchronous no weaker than the preset's"
            ))
        }
    };
    if !ok {
        return Err(format!("pragma {p:?}: invalid value for {name}"));
    }
    Ok(format!("PRAGMA {name}={value};"))
}

/// Parses a storage config file's text for a recorder using `preset`.
pub fn parse(
    text: &str,
    path: &Path,
    preset: StoragePreset,
) -> Result<StorageConfig, StorageConfigError> {
    let invalid = |reason: String| StorageConfigError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let raw: RawFile = if text.trim().is_empty() {
        RawFile::default()
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| {
            invalid(format!(
                "not a rosbag2 sqlite3 storage config (write:/read: with pragmas: [..]): {}",
                e.to_string().lines().next().unwrap_or_default()
            ))
        })?
    };
    let mut write_pragmas = String::new();
    for p in raw.write.unwrap_or_default().pragmas {
        write_pragmas
            .push_str(&write_pragma(&p, preset).map_err(|e| invalid(format!("write: {e}")))?);
    }
    let read_pragmas = raw.read.unwrap_or_default().pragmas;
    for p in &read_pragmas {
        split_pragma(p).map_err(|e| invalid(format!("read: {e}")))?;
    }
    Ok(StorageConfig {
        write_pragmas,
        read_pragmas,
    })
}

/// Reads and parses `path` (a regular file; a FIFO is refused without blocking).
pub fn load(path: &Path, preset: StoragePreset) -> Result<StorageConfig, StorageConfigError> {
    // Capped and never blocking (a FIFO or a device named as the file): as the config.
    let text = crate::config::read_small_regular_file(path, crate::config::MAX_CONFIG_BYTES)
        .map_err(|source| StorageConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    parse(&text, path, preset)
}

/// For `play`, which only reads (as rosbag2's reader, it does not use `write:`): the file is
/// checked, and read pragmas are refused: ringbag's reader hardens each connection against
/// hostile bags (`sqlguard`: work budgets, memory limits), and those settings are not open
/// to a config file.
pub fn load_for_play(path: &Path) -> Result<(), StorageConfigError> {
    let c = load(path, StoragePreset::None).or_else(|e| match e {
        // The write section is the recorder's business; play checks only that the file reads.
        StorageConfigError::Invalid { ref reason, .. } if reason.starts_with("write: ") => {
            Ok(StorageConfig::default())
        }
        e => Err(e),
    })?;
    if let Some(p) = c.read_pragmas.first() {
        return Err(StorageConfigError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "read: pragma {p:?}: not applied by ringbag's reader, which hardens its \
                 connections against hostile bags itself"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_w(text: &str, preset: StoragePreset) -> Result<String, String> {
        parse(text, Path::new("cfg.yaml"), preset)
            .map(|c| c.write_pragmas)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn applies_tuning_and_stricter_syncs() {
        let got = parse_w(
            "write:\n  pragmas: [\"synchronous = NORMAL\", \"cache_size=-65536\", \"main.temp_store = MEMORY\", \"mmap_size = 0\"]\n",
            StoragePreset::WriteOptimized,
        )
        .unwrap();
        assert_eq!(
            got,
            "PRAGMA synchronous=NORMAL;PRAGMA cache_size=-65536;PRAGMA temp_store=MEMORY;PRAGMA mmap_size=0;"
        );
        assert_eq!(
            parse_w(
                "write:\n  pragmas: [\"synchronous = FULL\"]\n",
                StoragePreset::Resilient
            )
            .unwrap(),
            "PRAGMA synchronous=FULL;"
        );
        // Empty, or only a read section: nothing for the writer.
        assert_eq!(parse_w("", StoragePreset::Resilient).unwrap(), "");
        assert_eq!(
            parse_w("read:\n  pragmas: []\n", StoragePreset::Resilient).unwrap(),
            ""
        );
    }

    #[test]
    fn refuses_what_the_preset_owns_with_the_reason() {
        for (text, preset, says) in [
            (
                "synchronous = OFF",
                StoragePreset::Resilient,
                "weaker than the resilient preset's synchronous=NORMAL",
            ),
            (
                "journal_mode = MEMORY",
                StoragePreset::WriteOptimized,
                "the journal is the storage preset's",
            ),
            (
                "locking_mode = NORMAL",
                StoragePreset::WriteOptimized,
                "the locking mode",
            ),
            (
                "page_size = 8192",
                StoragePreset::Resilient,
                "chooses each split's page size",
            ),
            (
                "auto_vacuum = FULL",
                StoragePreset::Resilient,
                "not one ringbag knows to be safe",
            ),
            (
                "cache_size = 1; DROP TABLE messages",
                StoragePreset::Resilient,
                "expected NAME = VALUE",
            ),
            (
                "cache_size = big",
                StoragePreset::Resilient,
                "invalid value for cache_size",
            ),
            ("synchronous = 7", StoragePreset::Resilient, "OFF, NORMAL"),
        ] {
            let e = parse_w(&format!("write:\n  pragmas: [\"{text}\"]\n"), preset).unwrap_err();
            assert!(e.starts_with("cfg.yaml: write: pragma"), "{e}");
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = parse_w("writ:\n  pragmas: []\n", StoragePreset::Resilient).unwrap_err();
        assert!(e.contains("not a rosbag2 sqlite3 storage config"), "{e}");
    }

    #[test]
    fn play_refuses_read_pragmas_and_leaves_the_write_section_to_the_recorder() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, "write:\n  pragmas: [\"journal_mode = OFF\"]\n").unwrap();
        load_for_play(&f).unwrap();
        std::fs::write(&f, "read:\n  pragmas: [\"cache_size = 10\"]\n").unwrap();
        let e = load_for_play(&f).unwrap_err().to_string();
        assert!(
            e.contains("read: pragma \"cache_size = 10\": not applied"),
            "{e}"
        );
        let e = load_for_play(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
