//! Raw arguments → validated settings. Everything a user can get wrong is caught here,
//! before any file is created, with a message that names the flag.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::args::{RecordArgs, SourceKind, SyntheticRate};
use super::units::{parse_bytes, parse_duration_ns};
use crate::bag::writer::WriterOptions;
use crate::bag::Flavour;
use crate::pipeline::PipelineConfig;
use crate::record::{RecordSettings, SourceSettings};
use crate::retention::RetentionPolicy;
use crate::source::generator::{GeneratorConfig, Pace};

/// rosbag2's smallest split size (21 pages of 4 KiB).
pub const MIN_MAX_BAG_SIZE: u64 = 86016;

fn flag<T>(name: &str, r: Result<T, String>) -> Result<T, String> {
    r.map_err(|e| format!("{name}: {e}"))
}

pub fn default_output_name() -> PathBuf {
    PathBuf::from(
        chrono::Local::now()
            .format("rosbag2_%Y_%m_%d-%H_%M_%S")
            .to_string(),
    )
}

pub fn record_settings(a: &RecordArgs) -> Result<RecordSettings, String> {
    if a.storage != "sqlite3" {
        return Err(format!(
            "--storage {}: not supported; ringbag writes sqlite3 bags only",
            a.storage
        ));
    }
    let max_cache_size = flag("--max-cache-size", parse_bytes(&a.max_cache_size))?;
    if max_cache_size == 0 {
        return Err("--max-cache-size must be greater than 0".into());
    }
    let max_bag_size = flag("--max-bag-size", parse_bytes(&a.max_bag_size))?;
    if max_bag_size > 0 && max_bag_size < MIN_MAX_BAG_SIZE {
        return Err(format!(
            "--max-bag-size {max_bag_size}: below the minimum of {MIN_MAX_BAG_SIZE} bytes (as in rosbag2)"
        ));
    }
    let max_bag_duration_ns = flag("--max-bag-duration", parse_duration_ns(&a.max_bag_duration))?;
    let mut custom_data = BTreeMap::new();
    for kv in &a.custom_data {
        let (k, v) = kv
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("--custom-data {kv}: expected KEY=VALUE"))?;
        custom_data.insert(k.to_string(), v.to_string());
    }
    let source_kind = a.source.unwrap_or(if cfg!(feature = "ros") {
        SourceKind::Ros
    } else {
        SourceKind::Synthetic
    });
    let source = match source_kind {
        SourceKind::Synthetic => SourceSettings::Synthetic(GeneratorConfig {
            profile: a.synthetic_profile,
            pace: match a.synthetic_rate {
                SyntheticRate::Realtime => Pace::Realtime,
                SyntheticRate::Max => Pace::Max,
            },
            count: a.synthetic_count,
        }),
        SourceKind::Ros => ros_source(a)?,
    };
    let output = a.output.clone().unwrap_or_else(default_output_name);
    Ok(RecordSettings {
        output,
        writer: WriterOptions {
            flavour: a.bag_format.unwrap_or_else(Flavour::from_env),
            preset: a.storage_preset_profile,
            max_bag_size,
            max_bag_duration_ns,
            custom_data,
        },
        pipeline: PipelineConfig {
            max_cache_size: usize::try_from(max_cache_size).unwrap_or(usize::MAX),
            ..PipelineConfig::default()
        },
        retention: RetentionPolicy {
            max_splits: a.max_splits,
        },
        source,
    })
}

#[cfg(not(feature = "ros"))]
fn ros_source(_a: &RecordArgs) -> Result<SourceSettings, String> {
    Err("--source ros: this ringbag was built without the `ros` feature (rebuild with --features ros against a sourced ROS 2)".into())
}

#[cfg(feature = "ros")]
fn ros_source(_a: &RecordArgs) -> Result<SourceSettings, String> {
    Err("--source ros: not wired yet".into())
}
