//! The Prometheus text exposition format, version 0.0.4, written by hand: a few rules (one
//! `# HELP` and `# TYPE` per family before its samples, escaped label values and help text,
//! a newline after every line) that do not justify a dependency.

use std::fmt::Write as _;

/// A metric family's type, as `# TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Written whole by [`Exposition::histogram`]: `_bucket{le}` (cumulative), `_sum`,
    /// `_count`.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Text being built, family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    /// The family whose samples are being written (a sample of another name is a bug).
    current: Option<&'static str>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start a family: its `# HELP` and `# TYPE` lines. Each name once per exposition.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &str) -> &mut Self {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} without _total"
        );
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
        self.current = Some(name);
        self
    }

    /// One sample of the current family. Labels are (name, value) pairs, in that order.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let name = self.current.expect("a sample before its family");
        self.line(name, "", labels, value)
    }

    /// One line: `name` + `suffix`, its labels, its value.
    fn line(&mut self, name: &str, suffix: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_label_name(k), "label name {k:?}");
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
        self
    }

    /// A whole unlabelled histogram family: `buckets` are per-bucket counts, not cumulative,
    /// one per bound in `bounds_s` (ascending upper bounds) and a last one for `+Inf`. Writes
    /// each `_bucket{le=..}` with the cumulative count, `le="+Inf"` with the total, then
    /// `_sum` and `_count` (the same total, as Prometheus requires).
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &str,
        bounds_s: &[f64],
        buckets: &[u64],
        sum: f64,
    ) -> &mut Self {
        debug_assert_eq!(
            buckets.len(),
            bounds_s.len() + 1,
            "{name}: one bucket per bound + Inf"
        );
        debug_assert!(
            bounds_s.windows(2).all(|w| w[0] < w[1]),
            "{name}: bounds ascend"
        );
        self.family(name, Kind::Histogram, help);
        let mut cumulative = 0u64;
        for (i, &b) in bounds_s.iter().enumerate() {
            cumulative += buckets.get(i).copied().unwrap_or(0);
            let mut le = String::new();
            push_value(&mut le, b);
            self.line(name, "_bucket", &[("le", &le)], cumulative as f64);
        }
        let total = cumulative + buckets.get(bounds_s.len()).copied().unwrap_or(0);
        self.line(name, "_bucket", &[("le", "+Inf")], total as f64);
        self.line(name, "_sum", &[], sum);
        self.line(name, "_count", &[], total as f64);
        self.current = None;
        self
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &'static str, kind: Kind, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(&[], value)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Values as Prometheus parses them: integers without a fraction (counters stay exact up to
/// 2^53), `NaN` and `+Inf`/`-Inf` by name.
fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Label values: backslash, double quote and newline escaped (0.0.4).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Help text: backslash and newline escaped (a double quote is literal there).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(n: &str) -> bool {
    !n.starts_with("__") && valid_name(n) && !n.contains(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_before_their_samples_and_values_are_exact() {
        let mut e = Exposition::new();
        e.family("ringbag_x_total", Kind::Counter, "Things.\nMore.")
            .sample(&[("topic", "/a")], 3.0)
            .sample(
                &[("topic", "/b"), ("cause", "queue_full")],
                9_007_199_254_740_991.0,
            );
        e.single("ringbag_y_seconds", Kind::Gauge, "A time.", 0.25);
        e.single("ringbag_z", Kind::Gauge, "Not known.", f64::NAN);
        assert_eq!(
            e.finish(),
            "# HELP ringbag_x_total Things.\\nMore.\n\
             # TYPE ringbag_x_total counter\n\
             ringbag_x_total{topic=\"/a\"} 3\n\
             ringbag_x_total{topic=\"/b\",cause=\"queue_full\"} 9007199254740991\n\
             # HELP ringbag_y_seconds A time.\n\
             # TYPE ringbag_y_seconds gauge\n\
             ringbag_y_seconds 0.25\n\
             # HELP ringbag_z Not known.\n\
             # TYPE ringbag_z gauge\n\
             ringbag_z NaN\n"
        );
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        let mut e = Exposition::new();
        e.family("ringbag_recording", Kind::Gauge, "h")
            .sample(&[("bag", "a\\b\"c\nd")], 1.0);
        assert!(e
            .finish()
            .contains("ringbag_recording{bag=\"a\\\\b\\\"c\\nd\"} 1\n"));
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_then_inf_sum_and_count_equal_to_the_total() {
        let mut e = Exposition::new();
        e.histogram(
            "ringbag_h_seconds",
            "Times.",
            &[0.001, 0.5, 1.0],
            &[2, 0, 3, 1],
            2.25,
        );
        assert_eq!(
            e.finish(),
            "# HELP ringbag_h_seconds Times.\n\
             # TYPE ringbag_h_seconds histogram\n\
             ringbag_h_seconds_bucket{le=\"0.001\"} 2\n\
             ringbag_h_seconds_bucket{le=\"0.5\"} 2\n\
             ringbag_h_seconds_bucket{le=\"1\"} 5\n\
             ringbag_h_seconds_bucket{le=\"+Inf\"} 6\n\
             ringbag_h_seconds_sum 2.25\n\
             ringbag_h_seconds_count 6\n"
        );
    }

    #[test]
    fn names_follow_the_data_model() {
        assert!(valid_name("ringbag_up") && valid_name("a:b_1"));
        assert!(!valid_name("1x") && !valid_name("a-b") && !valid_name(""));
        assert!(valid_label_name("topic") && !valid_label_name("__x") && !valid_label_name("a:b"));
    }
}
