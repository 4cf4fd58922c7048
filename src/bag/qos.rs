//! QoS profiles as rosbag2 stores them in `offered_qos_profiles`.
//!
//! Humble (metadata v4..8) writes each policy as its rmw integer inside a YAML *string*;
//! Jazzy (v9) writes a YAML list with policy names. The reader accepts either form in any
//! version, because third-party writers (rosbags) are not always consistent.

use serde_yaml_ng::{Mapping, Value};

/// One rmw policy value with its integer (Humble) and name (Jazzy) spellings.
macro_rules! policy {
    ($name:ident { $($variant:ident = $int:literal, $text:literal;)* }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),* }
        impl $name {
            pub fn as_int(self) -> i64 { match self { $($name::$variant => $int),* } }
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text),* } }
            pub fn from_int(v: i64) -> Option<Self> { match v { $($int => Some($name::$variant),)* _ => None } }
            pub fn from_name(v: &str) -> Option<Self> { match v { $($text => Some($name::$variant),)* _ => None } }
            fn parse(v: &Value) -> Option<Self> {
                match v {
                    Value::Number(n) => n.as_i64().and_then(Self::from_int),
                    Value::String(s) => Self::from_name(s).or_else(|| s.parse().ok().and_then(Self::from_int)),
                    _ => None,
                }
            }
        }
    };
}

// Values from rmw/types.h (Humble and later; BEST_AVAILABLE exists from Iron on).
policy!(History {
    SystemDefault = 0, "system_default";
    KeepLast = 1, "keep_last";
    KeepAll = 2, "keep_all";
    Unknown = 3, "unknown";
});
policy!(Reliability {
    SystemDefault = 0, "system_default";
    Reliable = 1, "reliable";
    BestEffort = 2, "best_effort";
    Unknown = 3, "unknown";
    BestAvailable = 4, "best_available";
});
policy!(Durability {
    SystemDefault = 0, "system_default";
    TransientLocal = 1, "transient_local";
    Volatile = 2, "volatile";
    Unknown = 3, "unknown";
    BestAvailable = 4, "best_available";
});
policy!(Liveliness {
    SystemDefault = 0, "system_default";
    Automatic = 1, "automatic";
    ManualByNode = 2, "manual_by_node";
    ManualByTopic = 3, "manual_by_topic";
    Unknown = 4, "unknown";
    BestAvailable = 5, "best_available";
});

/// rmw_time_t as rosbag2 writes it. `INFINITE` is RMW_DURATION_INFINITE (i64::MAX ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosDuration {
    pub sec: u64,
    pub nsec: u64,
}

impl QosDuration {
    pub const INFINITE: QosDuration = QosDuration {
        sec: 9_223_372_036,
        nsec: 854_775_807,
    };
    pub const ZERO: QosDuration = QosDuration { sec: 0, nsec: 0 };
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosProfile {
    pub history: History,
    pub depth: u64,
    pub reliability: Reliability,
    pub durability: Durability,
    pub deadline: QosDuration,
    pub lifespan: QosDuration,
    pub liveliness: Liveliness,
    pub liveliness_lease_duration: QosDuration,
    pub avoid_ros_namespace_conventions: bool,
}

impl Default for QosProfile {
    /// rclcpp's default publisher profile: keep_last 10, reliable, volatile, infinite times
    /// (what the reference bags' publishers offered).
    fn default() -> Self {
        QosProfile {
            history: History::KeepLast,
            depth: 10,
            reliability: Reliability::Reliable,
            durability: Durability::Volatile,
            deadline: QosDuration::INFINITE,
            lifespan: QosDuration::INFINITE,
            liveliness: Liveliness::Automatic,
            liveliness_lease_duration: QosDuration::INFINITE,
            avoid_ros_namespace_conventions: false,
        }
    }
}

/// How policies are spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyStyle {
    Integer,
    Name,
}

fn duration_value(d: QosDuration) -> Value {
    let mut m = Mapping::new();
    m.insert("sec".into(), d.sec.into());
    m.insert("nsec".into(), d.nsec.into());
    Value::Mapping(m)
}

impl QosProfile {
    /// The profile as a YAML mapping in rosbag2's key order.
    pub fn to_value(&self, style: PolicyStyle) -> Value {
        let p = |int: i64, name: &'static str| -> Value {
            match style {
                PolicyStyle::Integer => int.into(),
                PolicyStyle::Name => name.into(),
            }
        };
        let mut m = Mapping::new();
        m.insert(
            "history".into(),
            p(self.history.as_int(), self.history.as_str()),
        );
        m.insert("depth".into(), self.depth.into());
        m.insert(
            "reliability".into(),
            p(self.reliability.as_int(), self.reliability.as_str()),
        );
        m.insert(
            "durability".into(),
            p(self.durability.as_int(), self.durability.as_str()),
        );
        m.insert("deadline".into(), duration_value(self.deadline));
        m.insert("lifespan".into(), duration_value(self.lifespan));
        m.insert(
            "liveliness".into(),
            p(self.liveliness.as_int(), self.liveliness.as_str()),
        );
        m.insert(
            "liveliness_lease_duration".into(),
            duration_value(self.liveliness_lease_duration),
        );
        m.insert(
            "avoid_ros_namespace_conventions".into(),
            self.avoid_ros_namespace_conventions.into(),
        );
        Value::Mapping(m)
    }

    fn from_value(v: &Value) -> Result<Self, String> {
        let m = v.as_mapping().ok_or("QoS profile is not a mapping")?;
        let get = |k: &str| m.get(k);
        fn dur(v: Option<&Value>, key: &str) -> Result<QosDuration, String> {
            match v {
                None => Ok(QosDuration::ZERO),
                Some(v) => {
                    let sec = v.get("sec").and_then(Value::as_u64);
                    let nsec = v.get("nsec").and_then(Value::as_u64);
                    match (sec, nsec) {
                        (Some(sec), Some(nsec)) => Ok(QosDuration { sec, nsec }),
                        _ => Err(format!("QoS `{key}` needs integer sec and nsec")),
                    }
                }
            }
        }
        fn pol<T>(
            v: Option<&Value>,
            key: &str,
            parse: fn(&Value) -> Option<T>,
            d: T,
        ) -> Result<T, String> {
            match v {
                None => Ok(d),
                Some(v) => {
                    parse(v).ok_or_else(|| format!("QoS `{key}` has an unknown value {v:?}"))
                }
            }
        }
        Ok(QosProfile {
            history: pol(
                get("history"),
                "history",
                History::parse,
                History::SystemDefault,
            )?,
            depth: get("depth").and_then(Value::as_u64).unwrap_or(0),
            reliability: pol(
                get("reliability"),
                "reliability",
                Reliability::parse,
                Reliability::SystemDefault,
            )?,
            durability: pol(
                get("durability"),
                "durability",
                Durability::parse,
                Durability::SystemDefault,
            )?,
            deadline: dur(get("deadline"), "deadline")?,
            lifespan: dur(get("lifespan"), "lifespan")?,
            liveliness: pol(
                get("liveliness"),
                "liveliness",
                Liveliness::parse,
                Liveliness::SystemDefault,
            )?,
            liveliness_lease_duration: dur(
                get("liveliness_lease_duration"),
                "liveliness_lease_duration",
            )?,
            avoid_ros_namespace_conventions: get("avoid_ros_namespace_conventions")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }
}

/// Profiles as a YAML list value (Jazzy's in-place form).
pub fn profiles_to_value(profiles: &[QosProfile], style: PolicyStyle) -> Value {
    Value::Sequence(profiles.iter().map(|p| p.to_value(style)).collect())
}

/// Profiles serialized as a YAML document, as stored in the `topics` table and in Humble's
/// metadata.yaml. An empty list is the empty string, as rosbag2 writes it.
pub fn profiles_to_yaml_string(profiles: &[QosProfile], style: PolicyStyle) -> String {
    if profiles.is_empty() {
        return String::new();
    }
    let s = serde_yaml_ng::to_string(&profiles_to_value(profiles, style)).unwrap_or_default();
    // rosbag2 stores the document without a trailing newline.
    s.trim_end_matches('\n').to_string()
}

/// Parse `offered_qos_profiles`, either a YAML string holding a list (Humble, `topics` table)
/// or an inline list (Jazzy metadata.yaml). Empty or null means no profiles.
pub fn parse_profiles(v: &Value) -> Result<Vec<QosProfile>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => parse_profiles_str(s),
        Value::Sequence(items) => items.iter().map(QosProfile::from_value).collect(),
        other => Err(format!(
            "offered_qos_profiles has unexpected form {other:?}"
        )),
    }
}

pub fn parse_profiles_str(s: &str) -> Result<Vec<QosProfile>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    // A split's topics row is input: nesting makes the YAML parser's time grow steeply.
    super::yamlguard::check_depth(s, super::yamlguard::MAX_DEPTH)
        .map_err(|e| format!("offered_qos_profiles is {e}"))?;
    let v: Value =
        serde_yaml_ng::from_str(s).map_err(|e| format!("offered_qos_profiles is not YAML: {e}"))?;
    match v {
        Value::String(_) => Err("offered_qos_profiles string does not hold a list".into()),
        v => parse_profiles(&v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUMBLE_REF: &str = "- history: 1\n  depth: 10\n  reliability: 1\n  durability: 2\n  deadline:\n    sec: 9223372036\n    nsec: 854775807\n  lifespan:\n    sec: 9223372036\n    nsec: 854775807\n  liveliness: 1\n  liveliness_lease_duration:\n    sec: 9223372036\n    nsec: 854775807\n  avoid_ros_namespace_conventions: false";

    #[test]
    fn humble_integer_string_round_trips_byte_for_byte() {
        let parsed = parse_profiles_str(HUMBLE_REF).unwrap();
        assert_eq!(parsed, vec![QosProfile::default()]);
        assert_eq!(
            profiles_to_yaml_string(&parsed, PolicyStyle::Integer),
            HUMBLE_REF
        );
    }

    #[test]
    fn jazzy_names_parse_to_the_same_profile() {
        let named = profiles_to_yaml_string(&[QosProfile::default()], PolicyStyle::Name);
        assert!(named.contains("reliability: reliable"));
        assert_eq!(
            parse_profiles_str(&named).unwrap(),
            vec![QosProfile::default()]
        );
    }

    #[test]
    fn unknown_policy_value_is_an_error_not_a_default() {
        let bad = HUMBLE_REF.replace("reliability: 1", "reliability: 42");
        let err = parse_profiles_str(&bad).unwrap_err();
        assert!(err.contains("reliability"), "{err}");
    }

    #[test]
    fn empty_string_means_no_profiles() {
        assert!(parse_profiles_str("").unwrap().is_empty());
        assert_eq!(profiles_to_yaml_string(&[], PolicyStyle::Integer), "");
    }
}
