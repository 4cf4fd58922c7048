//! The service's TOML file. Keys are `ringbag record`'s long option names (underscores for
//! dashes) with the same units, so an operator learns one vocabulary. Unknown keys are errors:
//! a typo in a field config must not silently fall back to a default.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bag::schema::StoragePreset;
use crate::bag::Flavour;
use crate::units::{parse_bytes, parse_duration_ns};
use crate::clock::{ClockKind, ClockSettings, Timescale};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A size or duration written as a number or as a string with a unit.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Quantity {
    Number(u64),
    Text(String),
}

impl Quantity {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            // The same ceiling as a size written with units: a file size is signed 64-bit.
            Quantity::Number(n) if *n > crate::units::MAX_BYTES => Err(format!(
                "{n} is too large (at most {} bytes, 8 EiB)",
                crate::units::MAX_BYTES
            )),
            Quantity::Number(n) => Ok(*n),
            Quantity::Text(s) => parse_bytes(s),
        }
    }
    fn duration_ns(&self) -> Result<i64, String> {
        match self {
            Quantity::Number(n) => i64::try_from(*n)
                .ok()
                .and_then(|s| s.checked_mul(1_000_000_000))
                .ok_or_else(|| format!("{n} s is too long")),
            Quantity::Text(s) => parse_duration_ns(s),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub output_root: Option<PathBuf>,
    pub bag_format: Option<Flavour>,
    #[serde(default)]
    pub topics: Vec<String>,
    #[serde(default)]
    pub all: bool,
    pub regex: Option<String>,
    pub exclude_regex: Option<String>,
    #[serde(default)]
    pub exclude_topics: Vec<String>,
    #[serde(default)]
    pub include_hidden_topics: bool,
    pub max_bag_size: Option<Quantity>,
    pub max_bag_duration: Option<Quantity>,
    pub max_record_size: Option<Quantity>,
    pub max_record_duration: Option<Quantity>,
    pub max_bag_files: Option<u32>,
    pub min_free_space: Option<Quantity>,
    pub min_free_space_percent: Option<f64>,
    pub storage_preset_profile: Option<StoragePreset>,
    pub max_cache_size: Option<Quantity>,
    pub clock: Option<ClockKind>,
    pub ptp_device: Option<PathBuf>,
    pub ptp_timescale: Option<Timescale>,
    pub tai_utc_offset: Option<i64>,
    /// Milliseconds.
    pub ptp_poll_interval: Option<u64>,
    /// Microseconds.
    pub ptp_step_threshold: Option<u64>,
}

/// Sizes and durations resolved to bytes and nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budgets {
    pub max_bag_size: u64,
    pub max_bag_duration_ns: i64,
    pub max_record_size: Option<u64>,
    pub max_record_duration_ns: Option<i64>,
    pub min_free_space: Option<u64>,
    pub max_cache_size: Option<u64>,
}

impl ServiceConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            // toml's messages span several lines with a caret; keep the first for one-line errors.
            message: e
                .message()
                .lines()
                .next()
                .unwrap_or("invalid TOML")
                .to_string(),
        })
    }

    /// The clock settings, defaults as on the command line.
    pub fn clock_settings(&self) -> ClockSettings {
        let d = ClockSettings::default();
        ClockSettings {
            kind: self.clock.unwrap_or(d.kind),
            ptp_device: self.ptp_device.clone().unwrap_or(d.ptp_device),
            timescale: self.ptp_timescale.unwrap_or(d.timescale),
            tai_utc_offset_s: self.tai_utc_offset.unwrap_or(d.tai_utc_offset_s),
            poll_interval: self
                .ptp_poll_interval
                .map(std::time::Duration::from_millis)
                .unwrap_or(d.poll_interval),
            step_threshold: self
                .ptp_step_threshold
                .map(std::time::Duration::from_micros)
                .unwrap_or(d.step_threshold),
        }
    }

    pub fn budgets(&self, path: &Path) -> Result<Budgets, ConfigError> {
        let invalid = |key: &str, e: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: format!("{key}: {e}"),
        };
        let bytes = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.bytes().map_err(|e| invalid(key, e)))
                .transpose()
        };
        let dur = |key: &str, q: &Option<Quantity>| {
            q.as_ref()
                .map(|q| q.duration_ns().map_err(|e| invalid(key, e)))
                .transpose()
        };
        Ok(Budgets {
            max_bag_size: bytes("max_bag_size", &self.max_bag_size)?.unwrap_or(0),
            max_bag_duration_ns: dur("max_bag_duration", &self.max_bag_duration)?.unwrap_or(0),
            max_record_size: bytes("max_record_size", &self.max_record_size)?,
            max_record_duration_ns: dur("max_record_duration", &self.max_record_duration)?,
            min_free_space: bytes("min_free_space", &self.min_free_space)?,
            max_cache_size: bytes("max_cache_size", &self.max_cache_size)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../systemd/ringbag.toml.example");

    #[test]
    fn the_shipped_example_parses_with_the_documented_meaning() {
        let p = Path::new("ringbag.toml");
        let c = ServiceConfig::parse(EXAMPLE, p).unwrap();
        let clock = c.clock_settings();
        assert_eq!(clock.kind, ClockKind::Auto);
        assert_eq!(clock.ptp_device, PathBuf::from("/dev/ptp0"));
        assert_eq!(clock.timescale, Timescale::Tai);
        assert_eq!(clock.tai_utc_offset_s, 37);
        assert_eq!(clock.poll_interval, std::time::Duration::from_millis(1000));
        assert_eq!(clock.step_threshold, std::time::Duration::from_micros(100));
        clock.validate().unwrap();
        let b = c.budgets(p).unwrap();
        assert_eq!(b.max_bag_size, 512 << 20);
        assert_eq!(b.max_bag_duration_ns, 300_000_000_000);
        assert_eq!(b.max_record_size, Some(64 << 30));
        assert_eq!(b.max_record_duration_ns, Some(7 * 86_400_000_000_000));
        assert_eq!(c.bag_format, Some(Flavour::Humble));
        assert_eq!(
            c.storage_preset_profile,
            Some(StoragePreset::WriteOptimized)
        );
    }

    #[test]
    fn clock_settings_default_like_the_command_line() {
        let c = ServiceConfig::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c.clock_settings(), ClockSettings::default());
    }

    #[test]
    fn a_misspelt_key_is_an_error_naming_it() {
        let e = ServiceConfig::parse(
            "ptp_devcie = \"/dev/ptp1\"\n",
            Path::new("/etc/ringbag/ringbag.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("/etc/ringbag/ringbag.toml:"), "{e}");
        assert!(e.contains("ptp_devcie"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }

    #[test]
    fn bad_units_name_the_key() {
        let p = Path::new("c.toml");
        let c = ServiceConfig::parse("max_bag_size = \"12 parsecs\"\n", p).unwrap();
        let e = c.budgets(p).unwrap_err().to_string();
        assert!(e.contains("max_bag_size"), "{e}");
        let e = ServiceConfig::parse("clock = \"sundial\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sundial"), "{e}");
    }

    #[test]
    fn sizes_and_durations_beyond_64_bits_are_refused_in_the_config_too() {
        let p = Path::new("c.toml");
        for text in [
            "max_bag_size = 18446744073709551615\n",
            "max_bag_size = \"17179869184GiB\"\n",
            "max_bag_duration = 9223372037\n",
        ] {
            let c = ServiceConfig::parse(text, p).unwrap();
            let e = c.budgets(p).unwrap_err().to_string();
            assert!(
                e.contains("too large") || e.contains("too long"),
                "{text}: {e}"
            );
        }
    }
}
