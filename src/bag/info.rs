//! `ringbag info`: what `ros2 bag info` prints, plus per-split sizes, or one JSON object.

use std::fmt::Write;

use serde::Serialize;

use super::metadata::NO_START;
use super::reader::Bag;

#[derive(Debug, Serialize)]
pub struct InfoJson {
    pub path: String,
    pub storage_identifier: String,
    pub version: u32,
    pub size_bytes: u64,
    pub message_count: u64,
    pub starting_time_ns: i64,
    pub duration_ns: i64,
    pub files: Vec<FileJson>,
    pub topics: Vec<TopicJson>,
}

#[derive(Debug, Serialize)]
pub struct FileJson {
    pub path: String,
    pub starting_time_ns: i64,
    pub duration_ns: i64,
    pub message_count: u64,
    pub size_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TopicJson {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub serialization_format: String,
    pub message_count: u64,
}

pub fn info_json(bag: &Bag) -> InfoJson {
    let m = &bag.metadata;
    let files = bag
        .splits
        .iter()
        .map(|s| {
            let f = m.files.iter().find(|f| f.describes(&s.rel));
            FileJson {
                path: s.rel.clone(),
                starting_time_ns: f.map_or(NO_START, |f| f.starting_time_ns),
                duration_ns: f.map_or(0, |f| f.duration_ns),
                message_count: f.map_or(0, |f| f.message_count),
                size_bytes: s.size_bytes,
            }
        })
        .collect();
    InfoJson {
        path: bag.path.display().to_string(),
        storage_identifier: m.storage_identifier.clone(),
        version: m.version,
        size_bytes: bag.size_bytes(),
        message_count: m.message_count,
        starting_time_ns: m.starting_time_ns,
        duration_ns: m.duration_ns,
        files,
        topics: m
            .topics
            .iter()
            .map(|t| TopicJson {
                name: t.topic.name.clone(),
                type_name: t.topic.type_name.clone(),
                serialization_format: t.topic.serialization_format.clone(),
                message_count: t.message_count,
            })
            .collect(),
    }
}

/// Sizes as ros2 bag prints them: 1 decimal, binary units.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// `Dec  1 2026 19:47:23.123 (1796152926.600927875)`, local time like ros2 bag info.
fn human_time(ns: i64) -> String {
    if ns == NO_START {
        return "none".into();
    }
    let secs = ns.div_euclid(1_000_000_000);
    let sub = ns.rem_euclid(1_000_000_000);
    let local = chrono::DateTime::from_timestamp(secs, sub as u32)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%b %e %Y %H:%M:%S%.3f")
                .to_string()
        })
        .unwrap_or_else(|| "out of range".into());
    format!("{local} ({secs}.{sub:09})")
}

pub fn info_text(bag: &Bag) -> String {
    let m = &bag.metadata;
    let mut out = String::new();
    let pad = "                   ";
    let files: Vec<&str> = bag.splits.iter().map(|s| s.rel.as_str()).collect();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Files:             {}",
        files.join(&format!("\n{pad}"))
    );
    let _ = writeln!(out, "Bag size:          {}", human_bytes(bag.size_bytes()));
    let _ = writeln!(out, "Storage id:        {}", m.storage_identifier);
    if !m.ros_distro.is_empty() {
        let _ = writeln!(out, "ROS Distro:        {}", m.ros_distro);
    }
    let _ = writeln!(out, "Duration:          {:.3}s", m.duration_ns as f64 / 1e9);
    let _ = writeln!(out, "Start:             {}", human_time(m.starting_time_ns));
    let _ = writeln!(out, "End:               {}", human_time(m.end_time_ns()));
    // Jazzy's ros2 bag info lists service event topics apart, as services, and leaves their
    // events out of `Messages:`.
    let (services, topics): (Vec<_>, Vec<_>) = m.topics.iter().partition(|t| {
        crate::source::select::is_service_event_topic(&t.topic.name, &t.topic.type_name)
    });
    let events: u64 = services.iter().map(|t| t.message_count).sum();
    let _ = writeln!(
        out,
        "Messages:          {}",
        m.message_count.saturating_sub(events)
    );
    let topics: Vec<String> = topics
        .iter()
        .map(|t| {
            format!(
                "Topic: {} | Type: {} | Count: {} | Serialization Format: {}",
                t.topic.name, t.topic.type_name, t.message_count, t.topic.serialization_format
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "Topic information: {}",
        topics.join(&format!("\n{pad}"))
    );
    if !services.is_empty() {
        let services: Vec<String> = services
            .iter()
            .map(|t| {
                let name = &t.topic.name;
                let ty = &t.topic.type_name;
                format!(
                    "Service: {} | Type: {} | Event Count: {} | Serialization Format: {}",
                    name.strip_suffix(crate::source::select::SERVICE_EVENT_SUFFIX)
                        .unwrap_or(name),
                    crate::source::select::service_of_event_type(ty).unwrap_or(ty),
                    t.message_count,
                    t.topic.serialization_format
                )
            })
            .collect();
        let _ = writeln!(out, "Service:           {}", services.len());
        let _ = writeln!(
            out,
            "Service information: {}",
            services.join(&format!("\n{pad}"))
        );
    }
    let _ = writeln!(out, "Splits:");
    for s in &bag.splits {
        let count = m
            .files
            .iter()
            .find(|f| f.describes(&s.rel))
            .map(|f| f.message_count);
        let count = count.map_or_else(|| "?".to_string(), |c| c.to_string());
        let _ = writeln!(
            out,
            "  {:<32} {:>12}  {count} messages",
            s.rel,
            human_bytes(s.size_bytes)
        );
    }
    if bag.derived {
        let _ = writeln!(out, "(no metadata.yaml: derived from the .db3 files)");
    }
    if !m.custom_data.is_empty() {
        let _ = writeln!(out, "Custom data:");
        for (k, v) in &m.custom_data {
            let _ = writeln!(out, "  {k}: {v}");
        }
    }
    out
}
