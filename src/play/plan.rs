//! Which of a bag's topics are played, under which names and with which QoS: the filters
//! (`--topics`, `--services`, `-e`, `-x`, `--exclude-topics`, `--exclude-services`), `--remap`, the recorded QoS with
//! `--qos-profile-overrides-path`, and `/clock`. Pure: decided before anything is read or
//! published, so every conflict is bad input (exit 2) before the first message.

use regex::Regex;

use crate::bag::qos::{Durability, History, Reliability};
use crate::bag::{QosProfile, TopicInfo};
use crate::source::select::{
    adapt_to_offers, is_service_event_topic, QosOverrides, SERVICE_EVENT_SUFFIX,
};

/// `/clock`'s name and type, as `ros2 bag play --clock` publishes it.
pub const CLOCK_TOPIC: &str = "/clock";
pub const CLOCK_TYPE: &str = "rosgraph_msgs/msg/Clock";

/// Topic selection, as Jazzy's `ros2 bag play` (rosbag2 0.26's `allow_topic` and its sqlite3
/// reader's filter, which agree): a service event topic (`S/_service_event` of type
/// `pkg/srv/X_Event`) answers to `services`, any other topic to `topics`. A topic plays when
/// its own kind's list is empty and there is no `regex`, or it is in that list, or `regex`
/// matches it; so `--topics` alone leaves every service playing and `--services` alone every
/// topic, as in rosbag2. Then the excluded ones are removed: `exclude_topics` (which rosbag2's
/// reader applies to both kinds), `exclude_services`, `exclude_regex`. Names are normalized
/// (leading `/`); `services` and `exclude_services` hold the event topics' names.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub topics: Vec<String>,
    pub services: Vec<String>,
    pub regex: Option<Regex>,
    pub exclude_regex: Option<Regex>,
    pub exclude_topics: Vec<String>,
    pub exclude_services: Vec<String>,
}

impl Selection {
    fn selects(&self, name: &str, type_name: &str) -> bool {
        let named = if is_service_event_topic(name, type_name) {
            &self.services
        } else {
            &self.topics
        };
        let included = (named.is_empty() && self.regex.is_none())
            || named.iter().any(|t| t == name)
            || self.regex.as_ref().is_some_and(|r| r.is_match(name));
        let excluded = self.exclude_topics.iter().any(|t| t == name)
            || self.exclude_services.iter().any(|t| t == name)
            || self
                .exclude_regex
                .as_ref()
                .is_some_and(|r| r.is_match(name));
        included && !excluded
    }

    /// True when any filter flag was given (for the wording of the no-match warning).
    pub fn is_filtering(&self) -> bool {
        !self.topics.is_empty()
            || !self.services.is_empty()
            || self.regex.is_some()
            || self.exclude_regex.is_some()
            || !self.exclude_topics.is_empty()
            || !self.exclude_services.is_empty()
    }
}

/// A topic the sink publishes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayTopic {
    /// The name published on (after `--remap`).
    pub name: String,
    pub type_name: String,
    /// The publisher's profile: adapted to what the recorded publishers offered, then the
    /// override file's entry for the bag's topic name.
    pub qos: QosProfile,
    /// The bag's topics published here (more than one when remapped onto one name).
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Index = the sink's topic index.
    pub topics: Vec<PlayTopic>,
    /// Bag topic index → sink topic index; `None` for topics not played.
    pub route: Vec<Option<usize>>,
    /// Sink index of `/clock` when `--clock` is on.
    pub clock: Option<usize>,
    /// `--topics` entries and `--remap` sources the bag does not have (one warning each).
    pub warnings: Vec<String>,
}

impl Plan {
    /// The bag's topic names to read; empty when nothing is played.
    pub fn read_topics(&self, bag_topics: &[TopicInfo]) -> Vec<String> {
        bag_topics
            .iter()
            .zip(&self.route)
            .filter(|(_, r)| r.is_some())
            .map(|(t, _)| t.name.clone())
            .collect()
    }

    /// True when no topic of the bag is played.
    pub fn plays_nothing(&self) -> bool {
        self.route.iter().all(Option::is_none)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("--remap: {first} [{first_type}] and {second} [{second_type}] would both be published as {name}; a topic has one type")]
    TypeConflict {
        name: String,
        first: String,
        first_type: String,
        second: String,
        second_type: String,
    },
    #[error("--clock: the bag's topic {topic} would be published as {CLOCK_TOPIC} too; exclude it (-x) or remap it (-m)")]
    ClockTaken { topic: String },
}

/// rclcpp's `ClockQoS`, which `ros2 bag play --clock` publishes with: keep last 1, best effort.
pub fn clock_qos() -> QosProfile {
    QosProfile {
        history: History::KeepLast,
        depth: 1,
        reliability: Reliability::BestEffort,
        durability: Durability::Volatile,
        ..QosProfile::default()
    }
}

/// Decide what is played. `remap` holds normalized (old, new) pairs.
pub fn plan(
    bag_topics: &[TopicInfo],
    selection: &Selection,
    remap: &[(String, String)],
    overrides: &QosOverrides,
    clock: bool,
) -> Result<Plan, PlanError> {
    let mut warnings = Vec::new();
    for t in &selection.topics {
        if !bag_topics.iter().any(|b| &b.name == t) {
            warnings.push(format!("--topics {t}: the bag has no such topic"));
        }
    }
    for t in &selection.services {
        if !bag_topics
            .iter()
            .any(|b| &b.name == t && is_service_event_topic(&b.name, &b.type_name))
        {
            let service = t.strip_suffix(SERVICE_EVENT_SUFFIX).unwrap_or(t);
            warnings.push(format!("--services {service}: the bag has no such service"));
        }
    }
    for (old, _) in remap {
        if !bag_topics.iter().any(|b| &b.name == old) {
            warnings.push(format!("--remap {old}: the bag has no such topic"));
        }
    }
    let mut topics: Vec<PlayTopic> = Vec::new();
    let mut route = Vec::with_capacity(bag_topics.len());
    for t in bag_topics {
        if !selection.selects(&t.name, &t.type_name) {
            route.push(None);
            continue;
        }
        let name = remap
            .iter()
            .find(|(old, _)| old == &t.name)
            .map_or_else(|| t.name.clone(), |(_, new)| new.clone());
        if clock && name == CLOCK_TOPIC {
            return Err(PlanError::ClockTaken {
                topic: t.name.clone(),
            });
        }
        match topics.iter().position(|p| p.name == name) {
            Some(i) if topics[i].type_name != t.type_name => {
                return Err(PlanError::TypeConflict {
                    name,
                    first: topics[i].sources[0].clone(),
                    first_type: topics[i].type_name.clone(),
                    second: t.name.clone(),
                    second_type: t.type_name.clone(),
                });
            }
            Some(i) => {
                topics[i].sources.push(t.name.clone());
                route.push(Some(i));
            }
            None => {
                topics.push(PlayTopic {
                    name,
                    type_name: t.type_name.clone(),
                    qos: QosProfile::default(),
                    sources: vec![t.name.clone()],
                });
                route.push(Some(topics.len() - 1));
            }
        }
    }
    // QoS once every source of a published name is known: reliable / transient_local only
    // if every recorded publisher offered it (ros2 bag play's rule), then the override.
    for p in &mut topics {
        let offers: Vec<QosProfile> = bag_topics
            .iter()
            .filter(|t| p.sources.contains(&t.name))
            .flat_map(|t| t.offered_qos_profiles.iter().cloned())
            .collect();
        p.qos = adapt_to_offers(&offers).qos;
        if let Some(o) = p.sources.iter().find_map(|s| overrides.get(s)) {
            p.qos = o.apply(p.qos.clone());
        }
    }
    let clock = if clock && !topics.is_empty() {
        topics.push(PlayTopic {
            name: CLOCK_TOPIC.into(),
            type_name: CLOCK_TYPE.into(),
            qos: clock_qos(),
            sources: Vec::new(),
        });
        Some(topics.len() - 1)
    } else {
        None
    };
    Ok(Plan {
        topics,
        route,
        clock,
        warnings,
    })
}

/// rosgraph_msgs/msg/Clock for `bag_ns` as CDR (little endian): encapsulation header, then
/// builtin_interfaces/Time { int32 sec, uint32 nanosec }.
pub fn clock_cdr(bag_ns: i64) -> [u8; 12] {
    let sec = bag_ns.div_euclid(1_000_000_000);
    let nanosec = bag_ns.rem_euclid(1_000_000_000) as u32;
    let sec = i32::try_from(sec).unwrap_or(if sec < 0 { i32::MIN } else { i32::MAX });
    let mut out = [0u8; 12];
    out[..4].copy_from_slice(&[0, 1, 0, 0]);
    out[4..8].copy_from_slice(&sec.to_le_bytes());
    out[8..].copy_from_slice(&nanosec.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::select::QosOverride;

    fn topic(name: &str, ty: &str, offers: Vec<QosProfile>) -> TopicInfo {
        let mut t = TopicInfo::new(name, ty);
        t.offered_qos_profiles = offers;
        t
    }

    fn bag() -> Vec<TopicInfo> {
        vec![
            topic("/a", "std_msgs/msg/String", vec![QosProfile::default()]),
            topic("/b", "std_msgs/msg/String", vec![]),
            topic("/imu", "sensor_msgs/msg/Imu", vec![]),
            topic("/cam/image", "sensor_msgs/msg/Image", vec![]),
        ]
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.topics.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn without_filters_every_topic_plays_under_its_own_name() {
        let p = plan(
            &bag(),
            &Selection::default(),
            &[],
            &QosOverrides::new(),
            false,
        )
        .unwrap();
        assert_eq!(names(&p), ["/a", "/b", "/imu", "/cam/image"]);
        assert_eq!(p.route, [Some(0), Some(1), Some(2), Some(3)]);
        assert!(p.warnings.is_empty() && p.clock.is_none());
    }

    #[test]
    fn named_or_matching_topics_play_minus_the_excluded_ones() {
        let sel = Selection {
            topics: vec!["/a".into(), "/nope".into()],
            regex: Some(Regex::new("^/cam/").unwrap()),
            ..Selection::default()
        };
        let p = plan(&bag(), &sel, &[], &QosOverrides::new(), false).unwrap();
        assert_eq!(names(&p), ["/a", "/cam/image"]);
        assert_eq!(p.warnings, ["--topics /nope: the bag has no such topic"]);
        let sel = Selection {
            exclude_regex: Some(Regex::new("^/(a|b)$").unwrap()),
            exclude_topics: vec!["/imu".into()],
            ..Selection::default()
        };
        let p = plan(&bag(), &sel, &[], &QosOverrides::new(), false).unwrap();
        assert_eq!(names(&p), ["/cam/image"]);
        assert_eq!(p.read_topics(&bag()), ["/cam/image"]);
    }

    /// Jazzy's rule, case by case against rosbag2 0.26's `allow_topic` and sqlite3 filter:
    /// each kind answers to its own list, -e and -x to both, --exclude-topics to both.
    #[test]
    fn services_and_topics_answer_to_their_own_lists_as_in_jazzy() {
        let mut with_services = bag();
        with_services.push(topic(
            "/set/_service_event",
            "std_srvs/srv/SetBool_Event",
            vec![],
        ));
        with_services.push(topic(
            "/add/_service_event",
            "ex/srv/AddTwoInts_Event",
            vec![],
        ));
        // Named like an event topic but not of an event type: a topic.
        with_services.push(topic("/fake/_service_event", "std_msgs/msg/String", vec![]));
        let ev = |s: &str| format!("/{s}/_service_event");
        let played = |sel: Selection| {
            let p = plan(&with_services, &sel, &[], &QosOverrides::new(), false).unwrap();
            (
                names(&p).into_iter().map(String::from).collect::<Vec<_>>(),
                p.warnings,
            )
        };
        let all = [
            "/a",
            "/b",
            "/imu",
            "/cam/image",
            "/set/_service_event",
            "/add/_service_event",
            "/fake/_service_event",
        ];
        assert_eq!(played(Selection::default()).0, all);
        // --topics alone: those topics and every service.
        let (names, _) = played(Selection {
            topics: vec!["/a".into(), "/fake/_service_event".into()],
            ..Selection::default()
        });
        assert_eq!(
            names,
            [
                "/a",
                "/set/_service_event",
                "/add/_service_event",
                "/fake/_service_event"
            ]
        );
        // --services alone: those services and every topic; a missing one is a warning.
        let (names, warnings) = played(Selection {
            services: vec![ev("set"), ev("nope"), ev("fake")],
            ..Selection::default()
        });
        assert_eq!(
            names,
            [
                "/a",
                "/b",
                "/imu",
                "/cam/image",
                "/set/_service_event",
                "/fake/_service_event"
            ]
        );
        assert_eq!(
            warnings,
            [
                "--services /nope: the bag has no such service",
                "--services /fake: the bag has no such service"
            ]
        );
        // Both: exactly the named ones.
        let (names, _) = played(Selection {
            topics: vec!["/imu".into()],
            services: vec![ev("add")],
            ..Selection::default()
        });
        assert_eq!(names, ["/imu", "/add/_service_event"]);
        // -e alone applies to both kinds; with --topics, services must match it.
        let (names, _) = played(Selection {
            topics: vec!["/a".into()],
            regex: Some(Regex::new("^/(b|set)").unwrap()),
            ..Selection::default()
        });
        assert_eq!(names, ["/a", "/b", "/set/_service_event"]);
        // Exclusions: --exclude-services, --exclude-topics (both kinds) and -x.
        let (names, _) = played(Selection {
            exclude_services: vec![ev("set")],
            exclude_topics: vec!["/add/_service_event".into(), "/b".into()],
            exclude_regex: Some(Regex::new("^/(imu|cam)").unwrap()),
            ..Selection::default()
        });
        assert_eq!(names, ["/a", "/fake/_service_event"]);
    }

    #[test]
    fn remapping_two_topics_of_one_type_onto_a_name_merges_them() {
        let remap = [("/a".into(), "/x".into()), ("/b".into(), "/x".into())];
        let p = plan(
            &bag(),
            &Selection::default(),
            &remap,
            &QosOverrides::new(),
            false,
        )
        .unwrap();
        assert_eq!(names(&p), ["/x", "/imu", "/cam/image"]);
        assert_eq!(p.route, [Some(0), Some(0), Some(1), Some(2)]);
        assert_eq!(p.topics[0].sources, ["/a", "/b"]);
    }

    #[test]
    fn remapping_topics_of_different_types_onto_one_name_is_refused() {
        let remap = [("/imu".into(), "/a".into())];
        let e = plan(
            &bag(),
            &Selection::default(),
            &remap,
            &QosOverrides::new(),
            false,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--remap: /a [std_msgs/msg/String] and /imu [sensor_msgs/msg/Imu] would both be published as /a; a topic has one type"
        );
        // Unless the other one is not played.
        let sel = Selection {
            exclude_topics: vec!["/a".into()],
            ..Selection::default()
        };
        assert!(plan(&bag(), &sel, &remap, &QosOverrides::new(), false).is_ok());
    }

    #[test]
    fn clock_is_one_more_topic_and_may_not_be_taken_by_the_bag() {
        let p = plan(
            &bag(),
            &Selection::default(),
            &[],
            &QosOverrides::new(),
            true,
        )
        .unwrap();
        assert_eq!(p.clock, Some(4));
        assert_eq!(p.topics[4].type_name, CLOCK_TYPE);
        assert_eq!(p.topics[4].qos.reliability, Reliability::BestEffort);
        let remap = [("/b".into(), "/clock".into())];
        let e = plan(
            &bag(),
            &Selection::default(),
            &remap,
            &QosOverrides::new(),
            true,
        )
        .unwrap_err();
        assert_eq!(e, PlanError::ClockTaken { topic: "/b".into() });
    }

    #[test]
    fn qos_follows_the_recorded_offers_then_the_override_by_bag_name() {
        let mut bag = bag();
        let tl = QosProfile {
            durability: Durability::TransientLocal,
            depth: 50,
            ..QosProfile::default()
        };
        bag[0].offered_qos_profiles = vec![tl.clone(), tl];
        let mut overrides = QosOverrides::new();
        overrides.insert(
            "/b".into(),
            QosOverride {
                reliability: Some(Reliability::BestEffort),
                ..QosOverride::default()
            },
        );
        let remap = [("/b".into(), "/renamed".into())];
        let p = plan(&bag, &Selection::default(), &remap, &overrides, false).unwrap();
        assert_eq!(p.topics[0].qos.durability, Durability::TransientLocal);
        assert_eq!(p.topics[0].qos.depth, 50);
        assert_eq!(p.topics[1].name, "/renamed");
        assert_eq!(p.topics[1].qos.reliability, Reliability::BestEffort);
        assert_eq!(p.topics[2].qos.reliability, Reliability::Reliable);
    }

    #[test]
    fn nothing_selected_plays_nothing() {
        let sel = Selection {
            regex: Some(Regex::new("^/none$").unwrap()),
            ..Selection::default()
        };
        let p = plan(&bag(), &sel, &[], &QosOverrides::new(), true).unwrap();
        assert!(p.plays_nothing() && p.topics.is_empty() && p.clock.is_none());
    }

    #[test]
    fn clock_cdr_is_seconds_and_nanoseconds_after_the_header() {
        let b = clock_cdr(1_700_000_001_250_000_000);
        assert_eq!(&b[..4], &[0, 1, 0, 0]);
        assert_eq!(
            i32::from_le_bytes(b[4..8].try_into().unwrap()),
            1_700_000_001
        );
        assert_eq!(u32::from_le_bytes(b[8..].try_into().unwrap()), 250_000_000);
    }
}
