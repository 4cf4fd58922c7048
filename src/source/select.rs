//! Topic selection and QoS adaptation for the live ROS 2 source, as `ros2 bag record` does them.
//!
//! Everything here is pure and built without the `ros` feature: the CLI builds
//! [`RosSourceOptions`] on every machine, and the rules are unit-tested without ROS 2.
//! `source::ros` only feeds it names, types and offered profiles it got from r2r.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use crate::bag::qos::{Durability, History, Liveliness, QosDuration, Reliability};
use crate::bag::QosProfile as Qos;

/// Default discovery polling interval, as `ros2 bag record -p`.
pub const DEFAULT_POLLING_INTERVAL: Duration = Duration::from_millis(100);

/// Queue depth requested when no publisher keeps a deeper history (rclcpp's default depth).
pub const DEFAULT_SUBSCRIPTION_DEPTH: u64 = 10;

/// `--subscription-depth` default: 0, keep all. rosbag2 subscribes keep-last 10, and DDS then
/// replaces the oldest unread sample whenever the recorder's take loop falls 10 messages
/// behind, where no layer counts it (CycloneDDS raises no message-lost event for it). With a
/// keep-all reader the middleware hands over everything it received; the take loop never
/// blocks, so the reader history only grows while that thread is starved of CPU, and any loss
/// happens in ringbag's own bounded queue, where it is counted per topic.
pub const DEFAULT_SUBSCRIPTION_HISTORY: u64 = 0;

/// The recorder's node name when `--node-name` is not given, as `ros2 bag record`'s.
pub const DEFAULT_NODE_NAME: &str = "rosbag2_recorder";

/// What to record from a live ROS 2 graph; mirrors `ros2 bag record`'s selection flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosSourceOptions {
    /// Topics named on the command line; a missing leading `/` is added.
    pub topics: Vec<String>,
    /// `-a/--all`: every visible topic.
    pub all: bool,
    /// `-e/--regex`: topics whose name contains a match (ECMAScript-like `regex_search`).
    pub regex: Option<String>,
    /// `--exclude-regex`: drop topics whose name contains a match.
    pub exclude_regex: Option<String>,
    /// `--exclude-topics`: drop these exact names.
    pub exclude_topics: Vec<String>,
    /// `--topic-types`: topics of these exact type names (`pkg/msg/Type`), as named topics.
    pub topic_types: Vec<String>,
    /// `--exclude-topic-types`: drop topics of these exact type names.
    pub exclude_topic_types: Vec<String>,
    /// `--services`: services whose introspection events are recorded (service names, a
    /// missing leading `/` added; the selector turns them into `<name>/_service_event`).
    pub services: Vec<String>,
    /// `--all-services` (and Jazzy's `-a/--all`): every service event topic.
    pub all_services: bool,
    /// `--exclude-services`: services whose events are not recorded (service names).
    pub exclude_services: Vec<String>,
    /// `--include-unpublished-topics`: subscribe to selected topics that have no publisher
    /// yet (default QoS, or the override file's), instead of waiting for one.
    pub include_unpublished_topics: bool,
    /// `--ignore-leaf-topics`: skip a topic while nobody subscribes to it (re-asked at every
    /// discovery poll, so it is recorded once a subscriber appears).
    pub ignore_leaf_topics: bool,
    /// `--use-sim-time`: stamp with /clock's time (the recorder then runs the source with
    /// [`crate::clock::SimClock`]).
    pub use_sim_time: bool,
    /// `--node-name`: the recorder's node name.
    pub node_name: String,
    /// `-p/--polling-interval`: how often the graph is polled for new topics.
    pub polling_interval: Duration,
    /// `--no-discovery`: subscribe only to topics seen at start.
    pub no_discovery: bool,
    /// `--include-hidden-topics`: also record `-a`/regex matches with a token starting with `_`.
    pub include_hidden_topics: bool,
    /// `--qos-profile-overrides-path`: YAML map of topic → QoS, as ros2 bag reads it.
    pub qos_profile_overrides_path: Option<PathBuf>,
    /// `--subscription-depth`: 0 subscribes keep-all; N keep-last with a depth of at least N.
    /// An override file's history or depth for a topic still wins.
    pub subscription_depth: u64,
}

impl Default for RosSourceOptions {
    fn default() -> Self {
        RosSourceOptions {
            topics: Vec::new(),
            all: false,
            regex: None,
            exclude_regex: None,
            exclude_topics: Vec::new(),
            topic_types: Vec::new(),
            exclude_topic_types: Vec::new(),
            services: Vec::new(),
            all_services: false,
            exclude_services: Vec::new(),
            include_unpublished_topics: false,
            ignore_leaf_topics: false,
            use_sim_time: false,
            node_name: DEFAULT_NODE_NAME.to_string(),
            polling_interval: DEFAULT_POLLING_INTERVAL,
            no_discovery: false,
            include_hidden_topics: false,
            qos_profile_overrides_path: None,
            subscription_depth: DEFAULT_SUBSCRIPTION_HISTORY,
        }
    }
}

/// Why a selection or an override file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error(
        "no topics selected: name topics, or use -a/--all, -e/--regex, --topic-types, \
         --services or --all-services"
    )]
    NothingSelected,
    #[error("invalid {flag} pattern {pattern:?}: {}", regex_error_line(.source))]
    BadRegex {
        flag: &'static str,
        pattern: String,
        #[source]
        source: regex::Error,
    },
    #[error(
        "{flag} {name:?}: not a type name; expected the full name, such as sensor_msgs/msg/Imu"
    )]
    BadTypeName { flag: &'static str, name: String },
    #[error("invalid topic name {name:?}: {reason}")]
    BadTopicName { name: String, reason: &'static str },
    #[error("polling interval must be greater than zero")]
    ZeroPollingInterval,
    #[error("cannot read QoS overrides {path}: {source}")]
    OverridesRead {
        path: PathBuf,
        #[source]
        source: crate::config::SmallFileError,
    },
    #[error("QoS overrides {path}: {reason}")]
    OverridesParse { path: PathBuf, reason: String },
}

/// The regex crate draws its error over several lines (the pattern, a caret line, the
/// message); errors here are one line, so keep the lines that say something, joined.
pub fn regex_error_line(e: &regex::Error) -> String {
    let text = e.to_string();
    let said: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("error: "))
        .collect();
    if !said.is_empty() {
        return said.join("; ");
    }
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == '~'))
        .collect();
    parts.join("; ")
}

/// Adds the leading `/` a root-namespace node would resolve a relative name with.
pub fn normalize_topic_name(name: &str) -> Result<String, SelectError> {
    let trimmed = name.trim();
    let bad = |reason| SelectError::BadTopicName {
        name: name.to_string(),
        reason,
    };
    if trimmed.is_empty() || trimmed == "/" {
        return Err(bad("empty"));
    }
    if trimmed.contains("//") || trimmed.ends_with('/') {
        return Err(bad("empty token"));
    }
    if trimmed.contains('~') || trimmed.contains('{') {
        // Private and substitution names need a node context ros2 bag would supply; refuse them
        // rather than record an unexpected topic.
        return Err(bad("private or substitution names are not supported"));
    }
    if trimmed.starts_with('/') {
        Ok(trimmed.to_string())
    } else {
        Ok(format!("/{trimmed}"))
    }
}

/// A topic is hidden when any of its tokens starts with `_` (rcl's rule, e.g. `/a/_action/x`).
pub fn is_hidden_topic(name: &str) -> bool {
    name.split('/').any(|token| token.starts_with('_'))
}

/// The suffix of a service's introspection topic (`/add_two_ints/_service_event`).
pub const SERVICE_EVENT_SUFFIX: &str = "/_service_event";

/// rosbag2's test for a service event topic: the name ends with `/_service_event` and the
/// type is `pkg/srv/X_Event`. Such topics are selected by the service flags only: `-a`,
/// `--topics` and `--include-hidden-topics` never pick them as plain (hidden) topics.
pub fn is_service_event_topic(name: &str, type_name: &str) -> bool {
    name.ends_with(SERVICE_EVENT_SUFFIX) && service_of_event_type(type_name).is_some()
}

/// `pkg/srv/X` for a service event type `pkg/srv/X_Event`: whose definition the bag stores
/// (rosbag2 writes the `.srv`, not the generated event message).
pub fn service_of_event_type(type_name: &str) -> Option<&str> {
    let service = type_name.strip_suffix("_Event")?;
    let mut parts = service.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(p), Some("srv"), Some(x), None) if !p.is_empty() && !x.is_empty() => Some(service),
        _ => None,
    }
}

/// The type whose definition rosbag2 stores for topic `name` of type `type_name`: the
/// service `pkg/srv/X` for a service event topic (the `.srv` text, with its `SRV: ` header),
/// else the type itself.
pub fn definition_type<'a>(name: &str, type_name: &'a str) -> &'a str {
    match service_of_event_type(type_name) {
        Some(service) if name.ends_with(SERVICE_EVENT_SUFFIX) => service,
        _ => type_name,
    }
}

/// The event topic of service `name` (normalized as a topic name).
fn service_event_topic(name: &str) -> Result<String, SelectError> {
    Ok(normalize_topic_name(name)? + SERVICE_EVENT_SUFFIX)
}

/// The outcome of asking whether a discovered topic is to be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Record,
    /// Neither named, nor matched by `-a` or `-e`.
    NotSelected,
    /// Matched, but hidden and `--include-hidden-topics` is off.
    Hidden,
    /// Removed by `--exclude-topics`, `--exclude-regex` or `--exclude-topic-types`.
    Excluded,
}

/// Compiled selection rules.
#[derive(Debug)]
pub struct TopicSelector {
    topics: Vec<String>,
    all: bool,
    regex: Option<Regex>,
    exclude_regex: Option<Regex>,
    exclude_topics: Vec<String>,
    topic_types: Vec<String>,
    exclude_topic_types: Vec<String>,
    include_hidden: bool,
    /// Event topics (`<service>/_service_event`) of `--services` and `--exclude-services`.
    services: Vec<String>,
    all_services: bool,
    exclude_services: Vec<String>,
}

fn compile(flag: &'static str, pattern: &Option<String>) -> Result<Option<Regex>, SelectError> {
    match pattern {
        None => Ok(None),
        Some(p) => Regex::new(p)
            .map(Some)
            .map_err(|source| SelectError::BadRegex {
                flag,
                pattern: p.clone(),
                source,
            }),
    }
}

impl RosSourceOptions {
    /// Whether the options pick topics by themselves (a name, `-a`, `-e` or a type), rather
    /// than only excluding some or saying nothing.
    pub fn picks_topics(&self) -> bool {
        !self.topics.is_empty()
            || self.all
            || self.regex.is_some()
            || !self.topic_types.is_empty()
            || !self.services.is_empty()
            || self.all_services
    }
}

impl TopicSelector {
    /// The selection with "every topic" filled in when it picks none by itself (no topic
    /// named, no `-a`, no `-e`): how flags that only exclude, or none at all, read wherever
    /// the topics are known in advance (the synthetic profiles, the snapshot options).
    pub fn all_by_default(opts: &RosSourceOptions) -> Result<Self, SelectError> {
        TopicSelector::new(&RosSourceOptions {
            all: opts.all || !opts.picks_topics(),
            ..opts.clone()
        })
    }

    pub fn new(opts: &RosSourceOptions) -> Result<Self, SelectError> {
        if !opts.picks_topics() {
            return Err(SelectError::NothingSelected);
        }
        if opts.polling_interval.is_zero() && !opts.no_discovery {
            return Err(SelectError::ZeroPollingInterval);
        }
        let topics = opts
            .topics
            .iter()
            .map(|t| normalize_topic_name(t))
            .collect::<Result<Vec<_>, _>>()?;
        let events = |names: &[String]| -> Result<Vec<String>, SelectError> {
            names.iter().map(|s| service_event_topic(s)).collect()
        };
        let exclude_topics = opts
            .exclude_topics
            .iter()
            .map(|t| normalize_topic_name(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TopicSelector {
            topics,
            all: opts.all,
            regex: compile("-e/--regex", &opts.regex)?,
            exclude_regex: compile("--exclude-regex", &opts.exclude_regex)?,
            exclude_topics,
            topic_types: checked_types("--topic-types", &opts.topic_types)?,
            exclude_topic_types: checked_types("--exclude-topic-types", &opts.exclude_topic_types)?,
            include_hidden: opts.include_hidden_topics,
            services: events(&opts.services)?,
            all_services: opts.all_services,
            exclude_services: events(&opts.exclude_services)?,
        })
    }

    /// Topics named explicitly (normalized), which discovery keeps waiting for.
    pub fn named_topics(&self) -> &[String] {
        &self.topics
    }

    /// Whether the topic `name`, published with `types`, is recorded. rosbag2 compares type
    /// names exactly as the graph reports them (`pkg/msg/Type`), so does this. Where the
    /// types are not known yet (the snapshot options' warnings), `&[]`: the type rules then
    /// neither select nor exclude.
    pub fn decide(&self, name: &str, types: &[String]) -> Decision {
        if let [type_name] = types {
            if is_service_event_topic(name, type_name) {
                return self.decide_service(name);
            }
        }
        let typed = |list: &[String]| types.iter().any(|t| list.contains(t));
        if typed(&self.exclude_topic_types) {
            return Decision::Excluded;
        }
        if self.exclude_topics.iter().any(|t| t == name)
            || self
                .exclude_regex
                .as_ref()
                .is_some_and(|r| r.is_match(name))
        {
            return Decision::Excluded;
        }
        // A topic the user named is recorded even if hidden: they asked for it by name.
        if self.topics.iter().any(|t| t == name) {
            return Decision::Record;
        }
        let matched = self.all
            || typed(&self.topic_types)
            || self.regex.as_ref().is_some_and(|r| r.is_match(name));
        if !matched {
            return Decision::NotSelected;
        }
        if !self.include_hidden && is_hidden_topic(name) {
            return Decision::Hidden;
        }
        Decision::Record
    }
}

impl TopicSelector {
    /// rosbag2 Jazzy's service branch: `--exclude-services` and `--exclude-regex` drop the
    /// event topic; `--all-services`, `--services` or `-e` pick it. Event topics are hidden
    /// by name, but a service flag asks for them, so the hidden rule does not apply.
    fn decide_service(&self, event_topic: &str) -> Decision {
        if self.exclude_services.iter().any(|t| t == event_topic)
            || self
                .exclude_regex
                .as_ref()
                .is_some_and(|r| r.is_match(event_topic))
        {
            return Decision::Excluded;
        }
        if self.all_services
            || self.services.iter().any(|t| t == event_topic)
            || self.regex.as_ref().is_some_and(|r| r.is_match(event_topic))
        {
            Decision::Record
        } else {
            Decision::NotSelected
        }
    }
}

/// A type name as the graph reports it: `pkg/msg/Type` (also `pkg/srv/…`, `pkg/action/…`).
/// Anything else could never match, so a typo (`sensor_msgs/Imu`, ROS 1's spelling) is refused
/// rather than recording nothing.
fn checked_types(flag: &'static str, types: &[String]) -> Result<Vec<String>, SelectError> {
    for t in types {
        let parts: Vec<&str> = t.split('/').collect();
        let ok = parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !ok {
            return Err(SelectError::BadTypeName {
                flag,
                name: t.clone(),
            });
        }
    }
    Ok(types.to_vec())
}

// ---------------------------------------------------------------------------------------------
// QoS

/// rmw time → std, saturating: rmw's "infinite" does not fit every consumer's arithmetic.
pub fn duration_to_std(d: QosDuration) -> Duration {
    Duration::from_secs(d.sec).saturating_add(Duration::from_nanos(d.nsec))
}

pub fn duration_from_std(d: Duration) -> QosDuration {
    QosDuration {
        sec: d.as_secs(),
        nsec: u64::from(d.subsec_nanos()),
    }
}

/// Depth, reliability and durability are adapted; the other fields keep rclcpp's defaults.
fn base_request() -> Qos {
    Qos {
        depth: DEFAULT_SUBSCRIPTION_DEPTH,
        ..Qos::default()
    }
}

/// The profile to subscribe with, and whether the publishers disagreed (worth one warning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptedQos {
    pub qos: Qos,
    /// Some but not all publishers offer reliable: requesting best effort.
    pub mixed_reliability: bool,
    /// Some but not all publishers offer transient_local: requesting volatile.
    pub mixed_durability: bool,
}

/// rosbag2's `adapt_request_to_offers`: reliable only if every publisher offers reliable,
/// transient_local only if every publisher offers it; otherwise the weaker policy, which is
/// compatible with every offer. Depth is the deepest keep-last offer (at least 10), so a
/// transient_local publisher's whole history reaches the recorder. No offers: the default.
pub fn adapt_to_offers(offers: &[Qos]) -> AdaptedQos {
    let mut qos = base_request();
    if offers.is_empty() {
        return AdaptedQos {
            qos,
            mixed_reliability: false,
            mixed_durability: false,
        };
    }
    let reliable = offers
        .iter()
        .filter(|o| o.reliability == Reliability::Reliable)
        .count();
    let transient = offers
        .iter()
        .filter(|o| o.durability == Durability::TransientLocal)
        .count();
    qos.reliability = if reliable == offers.len() {
        Reliability::Reliable
    } else {
        Reliability::BestEffort
    };
    qos.durability = if transient == offers.len() {
        Durability::TransientLocal
    } else {
        Durability::Volatile
    };
    qos.depth = offers
        .iter()
        .filter(|o| o.history == History::KeepLast)
        .map(|o| o.depth)
        .fold(DEFAULT_SUBSCRIPTION_DEPTH, u64::max);
    AdaptedQos {
        qos,
        mixed_reliability: reliable != 0 && reliable != offers.len(),
        mixed_durability: transient != 0 && transient != offers.len(),
    }
}

/// A per-topic override from `--qos-profile-overrides-path`; unset fields keep the adapted value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QosOverride {
    pub history: Option<History>,
    pub depth: Option<u64>,
    pub reliability: Option<Reliability>,
    pub durability: Option<Durability>,
    pub deadline: Option<QosDuration>,
    pub lifespan: Option<QosDuration>,
    pub liveliness: Option<Liveliness>,
    pub liveliness_lease_duration: Option<QosDuration>,
    pub avoid_ros_namespace_conventions: Option<bool>,
}

impl QosOverride {
    pub fn apply(&self, base: Qos) -> Qos {
        Qos {
            history: self.history.unwrap_or(base.history),
            depth: self.depth.unwrap_or(base.depth),
            reliability: self.reliability.unwrap_or(base.reliability),
            durability: self.durability.unwrap_or(base.durability),
            deadline: self.deadline.unwrap_or(base.deadline),
            lifespan: self.lifespan.unwrap_or(base.lifespan),
            liveliness: self.liveliness.unwrap_or(base.liveliness),
            liveliness_lease_duration: self
                .liveliness_lease_duration
                .unwrap_or(base.liveliness_lease_duration),
            avoid_ros_namespace_conventions: self
                .avoid_ros_namespace_conventions
                .unwrap_or(base.avoid_ros_namespace_conventions),
        }
    }
}

/// Topic name (normalized) → override.
pub type QosOverrides = HashMap<String, QosOverride>;

/// A policy may be written as rmw's integer or as its name (`keep_last`, `best_effort`, ...).
#[derive(Deserialize)]
#[serde(untagged)]
enum RawPolicy {
    Int(i64),
    Name(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTime {
    sec: u64,
    nsec: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    history: Option<RawPolicy>,
    depth: Option<u64>,
    reliability: Option<RawPolicy>,
    durability: Option<RawPolicy>,
    deadline: Option<RawTime>,
    lifespan: Option<RawTime>,
    liveliness: Option<RawPolicy>,
    liveliness_lease_duration: Option<RawTime>,
    avoid_ros_namespace_conventions: Option<bool>,
}

/// Maps a policy written either way onto its enum (rmw integers and names, as rosbag2 does).
fn policy<T>(
    raw: &Option<RawPolicy>,
    field: &str,
    from_int: fn(i64) -> Option<T>,
    from_name: fn(&str) -> Option<T>,
) -> Result<Option<T>, String> {
    let Some(raw) = raw else { return Ok(None) };
    let found = match raw {
        RawPolicy::Int(i) => from_int(*i),
        RawPolicy::Name(s) => from_name(&s.trim().to_ascii_lowercase()),
    };
    match (found, raw) {
        (Some(v), _) => Ok(Some(v)),
        (None, RawPolicy::Int(i)) => Err(format!("{field}: unknown rmw value {i}")),
        (None, RawPolicy::Name(s)) => Err(format!(
            "{field}: unknown value {s:?} (e.g. system_default, keep_last, reliable, best_effort, transient_local, volatile, automatic)"
        )),
    }
}

fn time(raw: &Option<RawTime>) -> Option<QosDuration> {
    raw.as_ref().map(|t| QosDuration {
        sec: t.sec,
        nsec: t.nsec,
    })
}

/// Parses an overrides file's text (a YAML map of topic name → profile fields).
pub fn parse_qos_overrides(text: &str, path: &Path) -> Result<QosOverrides, SelectError> {
    let err = |reason: String| SelectError::OverridesParse {
        path: path.to_path_buf(),
        reason,
    };
    if text.trim().is_empty() {
        return Ok(QosOverrides::new());
    }
    let raw: HashMap<String, RawOverride> =
        serde_yaml_ng::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut out = QosOverrides::with_capacity(raw.len());
    for (topic, r) in raw {
        let name = normalize_topic_name(&topic).map_err(|e| err(e.to_string()))?;
        let ctx = |e: String| err(format!("topic {name}: {e}"));
        let o = QosOverride {
            history: policy(&r.history, "history", History::from_int, History::from_name)
                .map_err(ctx)?,
            depth: r.depth,
            reliability: policy(
                &r.reliability,
                "reliability",
                Reliability::from_int,
                Reliability::from_name,
            )
            .map_err(ctx)?,
            durability: policy(
                &r.durability,
                "durability",
                Durability::from_int,
                Durability::from_name,
            )
            .map_err(ctx)?,
            deadline: time(&r.deadline),
            lifespan: time(&r.lifespan),
            liveliness: policy(
                &r.liveliness,
                "liveliness",
                Liveliness::from_int,
                Liveliness::from_name,
            )
            .map_err(ctx)?,
            liveliness_lease_duration: time(&r.liveliness_lease_duration),
            avoid_ros_namespace_conventions: r.avoid_ros_namespace_conventions,
        };
        out.insert(name, o);
    }
    Ok(out)
}

/// Reads `--qos-profile-overrides-path`; `None` gives no overrides.
pub fn load_qos_overrides(path: Option<&Path>) -> Result<QosOverrides, SelectError> {
    let Some(path) = path else {
        return Ok(QosOverrides::new());
    };
    // Capped and never blocking (a FIFO or a device named as the file): as the config.
    let text = crate::config::read_small_regular_file(path, crate::config::MAX_CONFIG_BYTES)
        .map_err(|source| SelectError::OverridesRead {
            path: path.to_path_buf(),
            source,
        })?;
    parse_qos_overrides(&text, path)
}

/// The profile to subscribe to `topic` with: reliability and durability adapted to the offers
/// as rosbag2 does; history keep-all when `depth` is 0, else keep-last with at least `depth`
/// (and at least the deepest keep-last offer); then overridden per topic.
pub fn requested_qos(
    topic: &str,
    offers: &[Qos],
    overrides: &QosOverrides,
    depth: u64,
) -> AdaptedQos {
    let mut adapted = adapt_to_offers(offers);
    if depth == 0 {
        adapted.qos.history = History::KeepAll;
    } else {
        adapted.qos.history = History::KeepLast;
        adapted.qos.depth = adapted.qos.depth.max(depth);
    }
    if let Some(o) = overrides.get(topic) {
        adapted.qos = o.apply(adapted.qos);
    }
    adapted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RosSourceOptions {
        RosSourceOptions::default()
    }

    fn offer(reliability: Reliability, durability: Durability, depth: u64) -> Qos {
        Qos {
            reliability,
            durability,
            depth,
            ..Qos::default()
        }
    }

    #[test]
    fn refuses_a_selection_that_names_nothing() {
        let err = TopicSelector::new(&opts()).unwrap_err();
        assert!(matches!(err, SelectError::NothingSelected));
        assert!(err.to_string().contains("-a/--all"));
    }

    #[test]
    fn records_named_topics_only_with_a_leading_slash_added() {
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["imu".into(), "/tf".into()],
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.named_topics(), ["/imu", "/tf"]);
        assert_eq!(sel.decide("/imu", &[]), Decision::Record);
        assert_eq!(sel.decide("/tf", &[]), Decision::Record);
        assert_eq!(sel.decide("/camera", &[]), Decision::NotSelected);
        assert_eq!(sel.decide("/imu_raw", &[]), Decision::NotSelected);
    }

    #[test]
    fn all_skips_hidden_topics_unless_asked() {
        let mut o = RosSourceOptions {
            all: true,
            ..opts()
        };
        let sel = TopicSelector::new(&o).unwrap();
        assert_eq!(sel.decide("/rosout", &[]), Decision::Record);
        assert_eq!(sel.decide("/_hidden", &[]), Decision::Hidden);
        assert_eq!(sel.decide("/fib/_action/feedback", &[]), Decision::Hidden);
        assert_eq!(sel.decide("/a_b/c_", &[]), Decision::Record);
        o.include_hidden_topics = true;
        let sel = TopicSelector::new(&o).unwrap();
        assert_eq!(sel.decide("/fib/_action/feedback", &[]), Decision::Record);
    }

    #[test]
    fn service_event_topics_are_told_apart_by_name_and_type() {
        let ev = "std_srvs/srv/SetBool_Event";
        assert!(is_service_event_topic("/set/_service_event", ev));
        assert!(!is_service_event_topic(
            "/set/_service_event",
            "std_msgs/msg/Bool"
        ));
        assert!(!is_service_event_topic("/set/events", ev));
        assert!(!is_service_event_topic(
            "/set/_service_event",
            "std_srvs/msg/SetBool_Event"
        ));
        assert_eq!(service_of_event_type(ev), Some("std_srvs/srv/SetBool"));
        assert_eq!(service_of_event_type("std_srvs/srv/SetBool"), None);
        assert_eq!(service_of_event_type("a/b/srv/X_Event"), None);
        assert_eq!(
            definition_type("/set/_service_event", ev),
            "std_srvs/srv/SetBool"
        );
        assert_eq!(definition_type("/not_events", ev), ev);
        assert_eq!(
            definition_type("/imu", "sensor_msgs/msg/Imu"),
            "sensor_msgs/msg/Imu"
        );
    }

    #[test]
    fn services_are_picked_by_the_service_flags_only() {
        let ev = ["std_srvs/srv/SetBool_Event".to_string()];
        let decide =
            |o: RosSourceOptions, name: &str| TopicSelector::new(&o).unwrap().decide(name, &ev);
        // --services names the service; its event topic is recorded though hidden.
        let named = RosSourceOptions {
            services: vec!["set".into()],
            ..opts()
        };
        assert_eq!(
            decide(named.clone(), "/set/_service_event"),
            Decision::Record
        );
        assert_eq!(
            decide(named, "/other/_service_event"),
            Decision::NotSelected
        );
        // Topic flags never pick an event topic, hidden topics included.
        let topics = RosSourceOptions {
            all: true,
            include_hidden_topics: true,
            topics: vec!["/set/_service_event".into()],
            ..opts()
        };
        assert_eq!(decide(topics, "/set/_service_event"), Decision::NotSelected);
        // --all-services, minus --exclude-services and --exclude-regex.
        let all = RosSourceOptions {
            all_services: true,
            exclude_services: vec!["/skip".into()],
            exclude_regex: Some("private".into()),
            ..opts()
        };
        assert_eq!(decide(all.clone(), "/set/_service_event"), Decision::Record);
        assert_eq!(
            decide(all.clone(), "/skip/_service_event"),
            Decision::Excluded
        );
        assert_eq!(
            decide(all.clone(), "/private/x/_service_event"),
            Decision::Excluded
        );
        // --all-services alone picks no plain topic.
        let sel = TopicSelector::new(&all).unwrap();
        assert_eq!(
            sel.decide("/imu", &["sensor_msgs/msg/Imu".into()]),
            Decision::NotSelected
        );
        // -e matches the event topic's name.
        let re = RosSourceOptions {
            regex: Some("^/se".into()),
            ..opts()
        };
        assert_eq!(decide(re.clone(), "/set/_service_event"), Decision::Record);
        assert_eq!(decide(re, "/get/_service_event"), Decision::NotSelected);
    }

    #[test]
    fn a_hidden_topic_named_explicitly_is_recorded() {
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["/_secret".into()],
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.decide("/_secret", &[]), Decision::Record);
    }

    #[test]
    fn regex_matches_anywhere_in_the_name_and_unions_with_named_topics() {
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["/tf".into()],
            regex: Some("camera".into()),
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.decide("/front/camera/image", &[]), Decision::Record);
        assert_eq!(sel.decide("/tf", &[]), Decision::Record);
        assert_eq!(sel.decide("/imu", &[]), Decision::NotSelected);
    }

    #[test]
    fn exclusions_win_over_every_selection() {
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["/tf".into()],
            all: true,
            exclude_regex: Some("^/camera/".into()),
            exclude_topics: vec!["tf".into(), "/rosout".into()],
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.decide("/tf", &[]), Decision::Excluded);
        assert_eq!(sel.decide("/rosout", &[]), Decision::Excluded);
        assert_eq!(sel.decide("/camera/image", &[]), Decision::Excluded);
        assert_eq!(sel.decide("/front/camera/image", &[]), Decision::Record);
    }

    #[test]
    fn topic_types_select_by_exact_type_and_union_with_names() {
        let imu = ["sensor_msgs/msg/Imu".to_string()];
        let tf = ["tf2_msgs/msg/TFMessage".to_string()];
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["/tf".into()],
            topic_types: vec!["sensor_msgs/msg/Imu".into()],
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.decide("/imu", &imu), Decision::Record);
        assert_eq!(sel.decide("/tf", &tf), Decision::Record);
        assert_eq!(sel.decide("/rosout", &tf), Decision::NotSelected);
        // Exact names only: no prefix or package match.
        let img = ["sensor_msgs/msg/ImuRaw".to_string()];
        assert_eq!(sel.decide("/imu_raw", &img), Decision::NotSelected);
        // A type selection alone picks topics, as -a or -e do.
        assert!(RosSourceOptions {
            topic_types: vec!["a/msg/B".into()],
            ..opts()
        }
        .picks_topics());
    }

    #[test]
    fn excluded_types_win_over_names_types_and_all() {
        let imu = ["sensor_msgs/msg/Imu".to_string()];
        let sel = TopicSelector::new(&RosSourceOptions {
            topics: vec!["/imu".into()],
            all: true,
            topic_types: vec!["sensor_msgs/msg/Imu".into()],
            exclude_topic_types: vec!["sensor_msgs/msg/Imu".into()],
            ..opts()
        })
        .unwrap();
        assert_eq!(sel.decide("/imu", &imu), Decision::Excluded);
        assert_eq!(
            sel.decide("/tf", &["tf2_msgs/msg/TFMessage".to_string()]),
            Decision::Record
        );
        // Types not known yet: the type rules neither pick nor drop.
        assert_eq!(sel.decide("/imu", &[]), Decision::Record);
    }

    #[test]
    fn malformed_type_names_are_refused_with_their_flag() {
        for (flag, bad) in [
            ("--topic-types", "sensor_msgs/Imu"),
            ("--topic-types", "Imu"),
            ("--exclude-topic-types", "a//b"),
            ("--exclude-topic-types", "a/msg/B c"),
        ] {
            let mut o = RosSourceOptions {
                all: true,
                ..opts()
            };
            if flag == "--topic-types" {
                o.topic_types = vec![bad.into()];
            } else {
                o.exclude_topic_types = vec![bad.into()];
            }
            let e = TopicSelector::new(&o).unwrap_err().to_string();
            assert!(e.starts_with(flag) && e.contains(bad), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn reports_which_flag_has_an_invalid_regex() {
        let err = TopicSelector::new(&RosSourceOptions {
            all: true,
            exclude_regex: Some("(".into()),
            ..opts()
        })
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--exclude-regex"), "{text}");
        assert!(text.contains("\"(\""), "{text}");
    }

    #[test]
    fn rejects_empty_and_private_topic_names() {
        for bad in ["", "/", "a//b", "a/", "~/private", "{node}/x"] {
            assert!(
                normalize_topic_name(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        assert!(TopicSelector::new(&RosSourceOptions {
            topics: vec!["a//b".into()],
            ..opts()
        })
        .is_err());
    }

    #[test]
    fn refuses_a_zero_polling_interval_only_when_discovery_is_on() {
        let mut o = RosSourceOptions {
            all: true,
            polling_interval: Duration::ZERO,
            ..opts()
        };
        assert!(matches!(
            TopicSelector::new(&o),
            Err(SelectError::ZeroPollingInterval)
        ));
        o.no_discovery = true;
        assert!(TopicSelector::new(&o).is_ok());
    }

    #[test]
    fn requests_reliable_and_transient_local_when_every_publisher_offers_them() {
        let a = adapt_to_offers(&[
            offer(Reliability::Reliable, Durability::TransientLocal, 1),
            offer(Reliability::Reliable, Durability::TransientLocal, 50),
        ]);
        assert_eq!(a.qos.reliability, Reliability::Reliable);
        assert_eq!(a.qos.durability, Durability::TransientLocal);
        assert_eq!(a.qos.depth, 50);
        assert!(!a.mixed_reliability && !a.mixed_durability);
    }

    #[test]
    fn falls_back_to_best_effort_and_volatile_when_publishers_disagree() {
        let a = adapt_to_offers(&[
            offer(Reliability::Reliable, Durability::TransientLocal, 5),
            offer(Reliability::BestEffort, Durability::Volatile, 5),
        ]);
        assert_eq!(a.qos.reliability, Reliability::BestEffort);
        assert_eq!(a.qos.durability, Durability::Volatile);
        assert_eq!(a.qos.depth, DEFAULT_SUBSCRIPTION_DEPTH);
        assert!(a.mixed_reliability && a.mixed_durability);
    }

    #[test]
    fn best_effort_only_publishers_are_not_reported_as_mixed() {
        let a = adapt_to_offers(&[offer(Reliability::BestEffort, Durability::Volatile, 5)]);
        assert_eq!(a.qos.reliability, Reliability::BestEffort);
        assert!(!a.mixed_reliability);
    }

    #[test]
    fn no_offers_gives_the_default_profile() {
        assert_eq!(adapt_to_offers(&[]).qos, base_request());
    }

    #[test]
    fn parses_overrides_written_with_names_or_rmw_integers() {
        let yaml = "\
/camera:
  history: keep_last
  depth: 3
  reliability: best_effort
  durability: volatile
  deadline: {sec: 1, nsec: 500}
tf_static:
  reliability: 1
  durability: 1
  liveliness: automatic
";
        let o = parse_qos_overrides(yaml, Path::new("o.yaml")).unwrap();
        let cam = o["/camera"];
        assert_eq!(cam.history, Some(History::KeepLast));
        assert_eq!(cam.depth, Some(3));
        assert_eq!(cam.reliability, Some(Reliability::BestEffort));
        assert_eq!(cam.deadline, Some(QosDuration { sec: 1, nsec: 500 }));
        assert_eq!(cam.lifespan, None);
        let tf = o["/tf_static"];
        assert_eq!(tf.reliability, Some(Reliability::Reliable));
        assert_eq!(tf.durability, Some(Durability::TransientLocal));
        assert_eq!(tf.liveliness, Some(Liveliness::Automatic));
    }

    #[test]
    fn an_override_replaces_only_the_fields_it_sets() {
        let yaml = "/imu: {reliability: reliable}\n";
        let o = parse_qos_overrides(yaml, Path::new("o.yaml")).unwrap();
        let offers = [offer(
            Reliability::BestEffort,
            Durability::TransientLocal,
            20,
        )];
        let r = requested_qos("/imu", &offers, &o, 1);
        assert_eq!(r.qos.reliability, Reliability::Reliable);
        assert_eq!(r.qos.durability, Durability::TransientLocal);
        assert_eq!(r.qos.depth, 20);
        let other = requested_qos("/other", &offers, &o, 1);
        assert_eq!(other.qos.reliability, Reliability::BestEffort);
    }

    #[test]
    fn keep_all_by_default_a_depth_floor_on_request_and_an_override_still_wins() {
        let offers = [offer(Reliability::Reliable, Durability::Volatile, 10)];
        let none = QosOverrides::default();
        let r = requested_qos("/imu", &offers, &none, DEFAULT_SUBSCRIPTION_HISTORY);
        assert_eq!(r.qos.history, History::KeepAll);
        assert_eq!(r.qos.reliability, Reliability::Reliable);
        let r = requested_qos("/imu", &offers, &none, 1000);
        assert_eq!(r.qos.history, History::KeepLast);
        assert_eq!(r.qos.depth, 1000);
        // A transient_local publisher keeping more than the floor still gets all of it.
        let deep = [offer(
            Reliability::Reliable,
            Durability::TransientLocal,
            5000,
        )];
        assert_eq!(requested_qos("/map", &deep, &none, 1000).qos.depth, 5000);
        let o = parse_qos_overrides(
            "/camera: {history: keep_last, depth: 3}\n",
            Path::new("o.yaml"),
        )
        .unwrap();
        let cam = requested_qos("/camera", &offers, &o, DEFAULT_SUBSCRIPTION_HISTORY).qos;
        assert_eq!((cam.history, cam.depth), (History::KeepLast, 3));
    }

    #[test]
    fn override_errors_name_the_file_topic_and_field() {
        let err = parse_qos_overrides("/imu: {reliability: sometimes}\n", Path::new("q.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("q.yaml"), "{err}");
        assert!(err.contains("/imu"), "{err}");
        assert!(err.contains("reliability"), "{err}");
        assert!(err.contains("best_effort"), "{err}");
        let err = parse_qos_overrides("/imu: {relyability: reliable}\n", Path::new("q.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("relyability"), "{err}");
    }

    #[test]
    fn a_missing_overrides_file_is_an_error_naming_it() {
        let err = load_qos_overrides(Some(Path::new("/nonexistent/ringbag-qos.yaml")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ringbag-qos.yaml"), "{err}");
        assert!(load_qos_overrides(None).unwrap().is_empty());
    }

    #[test]
    fn infinite_rmw_durations_convert_without_overflow() {
        let inf = QosDuration {
            sec: i64::MAX as u64,
            nsec: 999_999_999,
        };
        assert!(duration_to_std(inf) >= Duration::from_secs(i64::MAX as u64));
        let d = Duration::new(3, 25);
        assert_eq!(duration_to_std(duration_from_std(d)), d);
    }

    #[test]
    fn qos_overrides_that_are_not_a_regular_file_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("overrides.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        for p in [fifo.as_path(), tmp.path()] {
            let e = load_qos_overrides(Some(p)).unwrap_err().to_string();
            let head = format!("cannot read QoS overrides {}: is ", p.display());
            assert!(
                e.starts_with(&head) && e.ends_with(", not a regular file; not read"),
                "{e}"
            );
        }
    }
}
