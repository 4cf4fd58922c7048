//! Per-topic policy: which topics live only in the ring (`--snapshot-topics`,
//! `--snapshot-regex`), and which are throttled in continuous recording (`--topic-rate`).

use regex::Regex;

/// Where one topic's messages go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    /// Into the ring (every topic, when the ring is on: a snapshot bag is complete by itself).
    pub ring: bool,
    /// Into the continuous bag.
    pub continuous: bool,
    /// Continuous recording keeps at most one message per this many nanoseconds (0 = all).
    pub min_period_ns: i64,
}

/// The resolved per-topic options.
#[derive(Debug, Clone, Default)]
pub struct TopicPolicy {
    /// The ring is on (`--snapshot-size`).
    pub ring: bool,
    /// `--snapshot-topics`: exact names, ring only.
    pub ring_only: Vec<String>,
    /// `--snapshot-regex`: matching names, ring only.
    pub ring_only_regex: Option<Regex>,
    /// `--topic-rate TOPIC=HZ`.
    pub rates: Vec<(String, f64)>,
}

impl TopicPolicy {
    /// With the ring on and no selection, every topic is ring-only (a pure black box, like
    /// rosbag2's snapshot mode); with a selection, only the selected ones.
    pub fn route(&self, name: &str) -> Route {
        let selected = self.ring_only.iter().any(|t| t == name)
            || self
                .ring_only_regex
                .as_ref()
                .is_some_and(|re| re.is_match(name));
        let no_selection = self.ring_only.is_empty() && self.ring_only_regex.is_none();
        let ring_only = self.ring && (selected || no_selection);
        let min_period_ns = self
            .rates
            .iter()
            .find(|(t, _)| t == name)
            .map_or(0, |(_, hz)| (1e9 / hz).round() as i64);
        Route {
            ring: self.ring,
            continuous: !ring_only,
            min_period_ns,
        }
    }
}

/// Parse `TOPIC=HZ` (`--topic-rate`, the config's `topic_rate`).
pub fn parse_rate(s: &str) -> Result<(String, f64), String> {
    let (t, hz) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s}: expected TOPIC=HZ"))?;
    if !t.starts_with('/') {
        return Err(format!("{s}: the topic must start with '/'"));
    }
    let hz: f64 = hz
        .trim()
        .parse()
        .map_err(|_| format!("{s}: {hz} is not a number of Hz"))?;
    if !(hz.is_finite() && hz > 0.0 && hz <= 1e6) {
        return Err(format!(
            "{s}: the rate must be above 0 and at most 1000000 Hz"
        ));
    }
    Ok((t.to_string(), hz))
}

/// Throttle for one topic: keeps a message when its stamp reaches the next due time. The due
/// time advances by whole periods, so a 30 Hz camera at 2 Hz keeps every 15th frame without
/// drifting; after a gap longer than a period it restarts from the message kept. A message
/// up to 5 % of a period early counts as due: receive stamps jitter, and a rate that does not
/// divide the period exactly (30 Hz: 33.333… ms) must not slip by a frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Throttle {
    period_ns: i64,
    next_due: Option<i64>,
}

impl Throttle {
    pub fn new(period_ns: i64) -> Self {
        Throttle {
            period_ns,
            next_due: None,
        }
    }

    /// True when the message at `ts` is kept.
    pub fn keep(&mut self, ts: i64) -> bool {
        if self.period_ns <= 0 {
            return true;
        }
        let slack = self.period_ns / 20;
        match self.next_due {
            Some(due) if ts < due - slack => false,
            Some(due) if ts - due < self.period_ns => {
                self.next_due = Some(due + self.period_ns);
                true
            }
            _ => {
                self.next_due = Some(ts.saturating_add(self.period_ns));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_30_hz_topic_throttled_to_2_hz_keeps_every_fifteenth_message() {
        let mut t = Throttle::new(500_000_000);
        let period = 1_000_000_000 / 30;
        let kept: Vec<i64> = (0..300).filter(|i| t.keep(i * period)).collect();
        assert_eq!(kept.len(), 20, "10 s at 2 Hz");
        assert!(kept.windows(2).all(|w| w[1] - w[0] == 15), "{kept:?}");
    }

    #[test]
    fn ring_only_topics_skip_continuous_recording_and_others_keep_it() {
        let p = TopicPolicy {
            ring: true,
            ring_only: vec!["/points".into()],
            ring_only_regex: Some(Regex::new("^/camera/").unwrap()),
            rates: vec![("/imu".into(), 100.0)],
        };
        assert!(!p.route("/points").continuous);
        assert!(!p.route("/camera/front/image_raw").continuous);
        let imu = p.route("/imu");
        assert!(imu.continuous && imu.ring);
        assert_eq!(imu.min_period_ns, 10_000_000);
        // The ring on with no selection: everything ring-only.
        let all = TopicPolicy {
            ring: true,
            ..Default::default()
        };
        assert!(!all.route("/tf").continuous);
        // The ring off: everything continuous, nothing to the ring.
        let off = TopicPolicy::default();
        assert_eq!(
            off.route("/tf"),
            Route {
                ring: false,
                continuous: true,
                min_period_ns: 0
            }
        );
    }

    #[test]
    fn topic_rates_are_checked() {
        assert_eq!(parse_rate("/cam=2").unwrap(), ("/cam".into(), 2.0));
        assert!(parse_rate("/cam").is_err());
        assert!(parse_rate("/cam=0").is_err());
        assert!(parse_rate("cam=2").is_err());
        assert!(parse_rate("/cam=fast").is_err());
    }
}
