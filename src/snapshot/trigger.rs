//! Triggers: what asks for a snapshot, and the rules that decide what a trigger does when
//! snapshots overlap or arrive in a storm. The rules are pure (times passed in) so they are
//! tested exactly.

use serde::{Deserialize, Serialize};

/// Default post-window: what a trigger adds after its own time.
pub const DEFAULT_POST_NS: i64 = 10_000_000_000;
/// An open snapshot is extended by overlapping triggers up to this long after its first
/// trigger, so a topic that keeps firing cannot hold one bag open forever.
pub const MAX_EXTENSION_NS: i64 = 300_000_000_000;
/// Storm limit: at most `STORM_BURST` new snapshots at once, then one per `STORM_REFILL_NS`.
pub const STORM_BURST: u32 = 5;
pub const STORM_REFILL_NS: i64 = 60_000_000_000;

/// The longest reason a trigger may carry, in bytes of UTF-8. The pending-trigger record
/// that survives a kill -9 (4 KiB in the ring) must hold the reason with the time window even
/// when every byte of it is a control character that JSON escapes to six bytes.
pub const MAX_REASON_BYTES: usize = 512;

/// Where a trigger came from (logged, and stored in the bag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Socket,
    Signal,
    Topic,
    Service,
}

impl Origin {
    /// Every origin, in [`Origin::index`] order.
    pub const ALL: [Origin; 4] = [
        Origin::Socket,
        Origin::Signal,
        Origin::Topic,
        Origin::Service,
    ];

    /// Its place in [`Origin::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// As serialized (`socket`, `signal`, …): the metrics' `source` label.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Socket => "socket",
            Origin::Signal => "signal",
            Origin::Topic => "topic",
            Origin::Service => "service",
        }
    }
}

/// One trigger as sent over the control socket (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TriggerRequest {
    #[serde(default)]
    pub reason: Option<String>,
    /// Seconds before the trigger to keep (default: all of the ring).
    #[serde(default)]
    pub pre_s: Option<f64>,
    /// Seconds after the trigger to keep (default 10).
    #[serde(default)]
    pub post_s: Option<f64>,
    /// When the client sent the request, ns since the epoch (CLOCK_REALTIME). Optional (an
    /// older client leaves it out): the recorder computes the request's age from it, drops a
    /// request its client has given up on, and stamps the trigger with the send time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_unix_ns: Option<i64>,
    /// What is asked: absent (`ringbag trigger`, or an older client) is a snapshot trigger;
    /// `pause` / `resume` pause and resume the continuous recording, the other fields then
    /// ignored. An older recorder ignores the unknown field and would take the request as a
    /// trigger: `ringbag pause` / `resume` accept only a `paused` / `resumed` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<ControlCommand>,
}

/// A control socket request other than a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlCommand {
    Pause,
    Resume,
}

/// What the recorder did with a trigger (the control socket's one-line reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// A new snapshot bag is being written.
    Started { bag: String },
    /// An open snapshot now ends later.
    Extended { bag: String },
    /// Refused: too many snapshots in a short time.
    RateLimited { suppressed: u64 },
    /// Recording is paused now; `changed` false when it already was.
    Paused { changed: bool },
    /// Recording is running now; `changed` false when it already was.
    Resumed { changed: bool },
    /// Refused: the request was invalid, or the recorder is stopping.
    Refused { why: String },
    /// A trigger to a recorder without a black-box ring (no `--snapshot-size` /
    /// `snapshot_size`): there is nothing to snapshot, and trying again will not change that.
    NoRing,
}

/// A reason as it goes into a bag name: letters, digits and `-`, at most 40 characters.
pub fn reason_for_name(reason: &str) -> String {
    let s: String = reason
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let s = s.trim_matches('-').to_string();
    if s.is_empty() {
        "trigger".into()
    } else {
        s
    }
}

/// A reason as it goes into a log line or the status file: one line, no terminal escape
/// sequences. Control characters (newlines, ESC, DEL, C1), the Unicode line and paragraph
/// separators and the bidirectional overrides are written as `\n`, `\t`, `\r` or
/// `\u{1b}`; a backslash as `\\`, so the escaped text is unambiguous.
pub fn escape_reason(reason: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(reason.len());
    for c in reason.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control()
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `reason` cut to at most [`MAX_REASON_BYTES`] on a character boundary (for reasons made
/// inside the recorder, such as a trigger topic's name, which are never refused).
pub fn bounded_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

impl TriggerRequest {
    /// The reason is at most [`MAX_REASON_BYTES`] long (the CLI's `--reason`, the control
    /// socket's `reason`): a longer one is refused, never cut silently.
    pub fn check_reason(&self) -> Result<(), String> {
        match &self.reason {
            Some(r) if r.len() > MAX_REASON_BYTES => Err(format!(
                "--reason: {} bytes long; at most {MAX_REASON_BYTES}",
                r.len()
            )),
            _ => Ok(()),
        }
    }

    /// Checked windows in nanoseconds: (pre, post); `pre` None = all of the ring.
    pub fn windows(&self) -> Result<(Option<i64>, i64), String> {
        let ns = |name: &str, s: f64| -> Result<i64, String> {
            if !(s.is_finite() && (0.0..=86_400.0).contains(&s)) {
                return Err(format!("--{name} {s}: must be between 0 and 86400 seconds"));
            }
            Ok((s * 1e9).round() as i64)
        };
        let pre = self.pre_s.map(|s| ns("pre", s)).transpose()?;
        let post = self.post_s.map(|s| ns("post", s)).transpose()?;
        Ok((pre, post.unwrap_or(DEFAULT_POST_NS)))
    }
}

/// The open snapshot, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub first_trigger_ns: i64,
    pub start_ns: i64,
    pub end_ns: i64,
}

/// What to do with a trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Start(Window),
    /// Extend the open snapshot to this end.
    Extend {
        end_ns: i64,
    },
    RateLimited {
        suppressed: u64,
    },
}

/// Overlap and storm rules.
#[derive(Debug, Clone)]
pub struct Planner {
    tokens: u32,
    refilled_at: i64,
    /// End of the last snapshot: a new one starts after it, so bags never repeat messages.
    last_end_ns: Option<i64>,
    suppressed_in_row: u64,
    pub suppressed_total: u64,
}

impl Default for Planner {
    fn default() -> Self {
        Planner {
            tokens: STORM_BURST,
            refilled_at: i64::MIN,
            last_end_ns: None,
            suppressed_in_row: 0,
            suppressed_total: 0,
        }
    }
}

impl Planner {
    /// A trigger at `now` with windows `pre`/`post`, while `open` is the snapshot being
    /// written (if any).
    pub fn decide(
        &mut self,
        now: i64,
        pre: Option<i64>,
        post: i64,
        open: Option<&Window>,
    ) -> Decision {
        if let Some(w) = open {
            let cap = w.first_trigger_ns.saturating_add(MAX_EXTENSION_NS);
            let end = w.end_ns.max(now.saturating_add(post).min(cap));
            return Decision::Extend { end_ns: end };
        }
        if self.refilled_at == i64::MIN {
            self.refilled_at = now;
        }
        let refills = (now.saturating_sub(self.refilled_at) / STORM_REFILL_NS).max(0);
        if refills > 0 {
            self.tokens = (self.tokens as i64 + refills).min(STORM_BURST as i64) as u32;
            self.refilled_at += refills * STORM_REFILL_NS;
        }
        if self.tokens == 0 {
            self.suppressed_in_row += 1;
            self.suppressed_total += 1;
            return Decision::RateLimited {
                suppressed: self.suppressed_in_row,
            };
        }
        if self.tokens == STORM_BURST {
            // A full bucket starts its refill clock now.
            self.refilled_at = now;
        }
        self.tokens -= 1;
        self.suppressed_in_row = 0;
        let mut start = pre.map_or(i64::MIN, |p| now.saturating_sub(p));
        if let Some(last) = self.last_end_ns {
            start = start.max(last.saturating_add(1));
        }
        Decision::Start(Window {
            first_trigger_ns: now,
            start_ns: start,
            end_ns: now.saturating_add(post),
        })
    }

    /// The open snapshot ended at `end_ns`.
    pub fn closed(&mut self, end_ns: i64) {
        self.last_end_ns = Some(self.last_end_ns.map_or(end_ns, |l| l.max(end_ns)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn an_overlapping_trigger_extends_the_open_snapshot_instead_of_starting_another() {
        let mut p = Planner::default();
        let Decision::Start(w) = p.decide(100 * S, None, 10 * S, None) else {
            panic!()
        };
        assert_eq!((w.start_ns, w.end_ns), (i64::MIN, 110 * S));
        assert_eq!(
            p.decide(105 * S, None, 10 * S, Some(&w)),
            Decision::Extend { end_ns: 115 * S }
        );
        // A shorter post-window never shortens it.
        assert_eq!(
            p.decide(106 * S, None, S, Some(&w)),
            Decision::Extend { end_ns: 110 * S }
        );
        // Extension is capped.
        assert_eq!(
            p.decide(1_000 * S, None, 10 * S, Some(&w)),
            Decision::Extend {
                end_ns: 100 * S + MAX_EXTENSION_NS
            }
        );
    }

    #[test]
    fn a_storm_gets_five_snapshots_then_one_a_minute() {
        let mut p = Planner::default();
        let mut started = 0;
        let mut limited = 0;
        // 1000 triggers, 10 ms apart, each snapshot closed at once (post 0).
        for i in 0..1000 {
            let now = 100 * S + i * S / 100;
            match p.decide(now, Some(S), 0, None) {
                Decision::Start(w) => {
                    started += 1;
                    p.closed(w.end_ns);
                }
                Decision::RateLimited { .. } => limited += 1,
                Decision::Extend { .. } => panic!(),
            }
        }
        assert_eq!((started, limited), (5, 995));
        assert_eq!(p.suppressed_total, 995);
        // A minute after the first: one more.
        assert!(matches!(
            p.decide(160 * S + 1, Some(S), 0, None),
            Decision::Start(_)
        ));
        assert!(matches!(
            p.decide(160 * S + 2, Some(S), 0, None),
            Decision::RateLimited { suppressed: 1 }
        ));
    }

    #[test]
    fn a_new_snapshot_starts_after_the_previous_one_so_bags_never_repeat_messages() {
        let mut p = Planner::default();
        let Decision::Start(w) = p.decide(100 * S, None, 10 * S, None) else {
            panic!()
        };
        p.closed(w.end_ns);
        let Decision::Start(w2) = p.decide(200 * S, None, 10 * S, None) else {
            panic!()
        };
        assert_eq!(w2.start_ns, 110 * S + 1);
        let Decision::Start(w3) = p.decide(300 * S, Some(5 * S), 10 * S, None) else {
            panic!()
        };
        assert_eq!(w3.start_ns, 295 * S);
    }

    #[test]
    fn reasons_become_safe_bag_names() {
        assert_eq!(reason_for_name("e-stop pressed!"), "e-stop-pressed");
        assert_eq!(reason_for_name("../../etc"), "etc");
        assert_eq!(reason_for_name(""), "trigger");
        assert_eq!(reason_for_name(&"x".repeat(100)).len(), 40);
    }

    #[test]
    fn reasons_are_logged_on_one_line_without_escape_sequences() {
        assert_eq!(
            escape_reason("e-stop\nringbag: error: fake\x1b[31m\\ \u{202e}x"),
            "e-stop\\nringbag: error: fake\\u{1b}[31m\\\\ \\u{202e}x"
        );
        assert_eq!(escape_reason("plain reason, ä"), "plain reason, ä");
    }

    #[test]
    fn a_reason_over_the_bound_is_refused_and_an_inner_one_is_cut_on_a_char_boundary() {
        let at = TriggerRequest {
            reason: Some("x".repeat(MAX_REASON_BYTES)),
            ..Default::default()
        };
        assert!(at.check_reason().is_ok());
        let over = TriggerRequest {
            reason: Some("x".repeat(MAX_REASON_BYTES + 1)),
            ..Default::default()
        };
        assert_eq!(
            over.check_reason().unwrap_err(),
            format!(
                "--reason: {} bytes long; at most {MAX_REASON_BYTES}",
                MAX_REASON_BYTES + 1
            )
        );
        let long = "ä".repeat(MAX_REASON_BYTES);
        let cut = bounded_reason(&long);
        assert!(cut.len() <= MAX_REASON_BYTES && cut.len() >= MAX_REASON_BYTES - 1);
    }

    #[test]
    fn windows_are_checked() {
        let r = TriggerRequest {
            pre_s: Some(-1.0),
            ..Default::default()
        };
        assert!(r.windows().is_err());
        let r = TriggerRequest {
            pre_s: Some(2.5),
            post_s: None,
            ..Default::default()
        };
        assert_eq!(r.windows().unwrap(), (Some(2_500_000_000), DEFAULT_POST_NS));
    }
}
