//! The snapshot options (ring size, window, file, ring-only topics, rates, trigger topic,
//! control socket) as written on the command line or in the config file → checked
//! [`SnapshotSettings`](super::SnapshotSettings). Shared by `cli::resolve` (flags) and
//! `config` (the service's keys), so it lives here, below both, next to the settings it builds.

use std::path::Path;

use crate::units::{parse_bytes, parse_duration_ns};

/// One line for each `--snapshot-topics` and `--topic-rate` topic that the topic selection
/// does not record: such an option can never act, since the topic reaches neither the ring
/// nor the bag. Warned about, not refused (the selection may be the deliberate part, as when
/// one config serves several robots). `prefix` as for [`snapshot_settings`]. A selection that
/// is itself invalid says nothing here; it is refused where it is read.
pub fn unrecorded_policy_topics(
    sel: &crate::source::select::RosSourceOptions,
    policy: &crate::snapshot::policy::TopicPolicy,
    prefix: &str,
) -> Vec<String> {
    use crate::source::select::{Decision, TopicSelector};
    let Ok(selector) = TopicSelector::all_by_default(sel) else {
        return Vec::new();
    };
    let named = policy
        .ring_only
        .iter()
        .map(|t| {
            (
                option_name(prefix, "snapshot-topics"),
                t.as_str(),
                "the ring",
            )
        })
        .chain(
            policy
                .rates
                .iter()
                .map(|(t, _)| (option_name(prefix, "topic-rate"), t.as_str(), "the bag")),
        );
    named
        .filter_map(|(option, topic, target)| {
            // Types are only known once the topic is seen: with --topic-types, a topic that
            // no name rule picks may still be picked by its type, so only certain cases warn.
            let why = match selector.decide(topic, &[]) {
                Decision::Record => return None,
                Decision::NotSelected if !sel.topic_types.is_empty() => return None,
                Decision::NotSelected => "not selected",
                Decision::Hidden => "hidden, and --include-hidden-topics is off",
                Decision::Excluded => "excluded",
            };
            Some(format!(
                "{option} names {topic}, which the topic selection does not record ({why}): \
                 it never reaches {target}"
            ))
        })
        .collect()
}

/// An option's name as the user wrote it: `--snapshot-size` on the command line (`prefix`
/// `--`), `snapshot_size` in the config file (empty prefix).
fn option_name(prefix: &str, n: &str) -> String {
    if prefix.is_empty() {
        n.replace('-', "_")
    } else {
        format!("{prefix}{n}")
    }
}

/// The snapshot options as written (command line or config file).
pub struct SnapshotOptions<'a> {
    pub size: Option<&'a str>,
    pub duration: Option<&'a str>,
    pub file: Option<&'a Path>,
    pub topics: &'a [String],
    pub regex: Option<&'a str>,
    pub rates: &'a [String],
    pub trigger_topic: Option<&'a str>,
    pub control_socket: Option<&'a Path>,
}

/// Check the snapshot options and the ring's room on its filesystem. `prefix` is `--` for
/// flags (messages then name `--snapshot-size`), empty for config keys (`snapshot_size`).
pub fn snapshot_settings(
    o: &SnapshotOptions,
    ring_dir: &Path,
    root: &Path,
    prefix: &str,
) -> Result<crate::snapshot::SnapshotSettings, String> {
    use crate::snapshot::{policy, ring::Ring, RingSettings, SnapshotSettings, TriggerTopic};
    let name = |n: &str| option_name(prefix, n);
    let rates = o
        .rates
        .iter()
        .map(|r| policy::parse_rate(r).map_err(|e| format!("{}: {e}", name("topic-rate"))))
        .collect::<Result<Vec<_>, _>>()?;
    let ring_only_regex = o
        .regex
        .map(|re| {
            regex::Regex::new(re).map_err(|e| {
                let last = e.to_string();
                let last = last.lines().last().unwrap_or("invalid").trim().to_string();
                format!(
                    "{} {re}: not a valid regular expression: {last}",
                    name("snapshot-regex")
                )
            })
        })
        .transpose()?;
    // The socket's path before the ring's room: neither is created here, and a bad socket
    // path must be refused before `record` or the service creates anything. A ring is not
    // needed: pause and resume work without one.
    if let Some(socket) = o.control_socket {
        crate::snapshot::control::check_socket_path(socket)
            .map_err(|e| format!("{}: {e}", name("control-socket")))?;
    }
    let control_socket = o.control_socket.map(Path::to_path_buf);
    let Some(size) = o.size else {
        let needs = [
            ("snapshot-duration", o.duration.is_some()),
            ("snapshot-file", o.file.is_some()),
            ("snapshot-topics", !o.topics.is_empty()),
            ("snapshot-regex", o.regex.is_some()),
            ("trigger-topic", o.trigger_topic.is_some()),
        ];
        if let Some((n, _)) = needs.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{} needs {} (the ring)",
                name(n),
                name("snapshot-size")
            ));
        }
        return Ok(SnapshotSettings {
            ring: None,
            policy: policy::TopicPolicy {
                rates,
                ..Default::default()
            },
            control_socket,
        });
    };
    let size = parse_bytes(size).map_err(|e| format!("{}: {e}", name("snapshot-size")))?;
    if size < 1 << 20 {
        return Err(format!("{} {size}: at least 1 MiB", name("snapshot-size")));
    }
    let window_ns = o
        .duration
        .map(|d| parse_duration_ns(d).map_err(|e| format!("{}: {e}", name("snapshot-duration"))))
        .transpose()?
        .unwrap_or(0);
    let trigger_topic = o
        .trigger_topic
        .map(|t| {
            TriggerTopic::parse(t)
                .map_err(|e| e.replacen("--trigger-topic", &name("trigger-topic"), 1))
        })
        .transpose()?;
    let ring = RingSettings {
        size,
        window_ns,
        file: o.file.map(Path::to_path_buf),
        dir: ring_dir.to_path_buf(),
        trigger_topic,
    };
    // Before anything is created: the ring's path must be free or hold a ring of ours.
    // Flags name the file (`<file>: <problem>`); a config names its key first.
    let path = ring.preflight(root).map_err(|e| match prefix {
        "" => format!("{}: {e}", name("snapshot-file")),
        _ => e.to_string(),
    })?;
    let capacity = Ring::capacity_for(size);
    crate::snapshot::ring::check_room(&path, Ring::file_size(capacity))
        .map_err(|e| e.to_string())?;
    Ok(SnapshotSettings {
        ring: Some(ring),
        policy: policy::TopicPolicy {
            ring: true,
            ring_only: o.topics.to_vec(),
            ring_only_regex,
            rates,
        },
        control_socket,
    })
}
