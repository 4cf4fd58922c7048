//! The Prometheus alerting rules shipped in systemd/ringbag.rules.yml: `promtool check rules`
//! accepts them, their unit tests (tests/prometheus/ringbag.rules.test.yml) pass under
//! `promtool test rules`, and every `ringbag_*` metric they name is one ringbag exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rules() -> PathBuf {
    repo().join("systemd/ringbag.rules.yml")
}

fn rules_test() -> PathBuf {
    repo().join("tests/prometheus/ringbag.rules.test.yml")
}

/// `promtool ARGS`: its success and output, or None when promtool is not installed (and
/// RINGBAG_PROMTOOL_REQUIRED is not set: then its absence fails the test).
fn promtool(sub: &[&str], file: &Path) -> Option<(bool, String)> {
    let file = file.to_str().expect("UTF-8 path");
    crate::common::promtool(&[sub, &[file]].concat(), "")
}

#[test]
fn promtool_check_rules_accepts_the_shipped_rules() {
    let Some((ok, out)) = promtool(&["check", "rules"], &rules()) else {
        return;
    };
    assert!(ok, "promtool check rules {}:\n{out}", rules().display());
    assert!(out.contains("SUCCESS: 8 rules found"), "{out}");
}

#[test]
fn promtool_test_rules_passes_the_unit_tests_of_every_alert() {
    let Some((ok, out)) = promtool(&["test", "rules"], &rules_test()) else {
        return;
    };
    assert!(ok, "promtool test rules {}:\n{out}", rules_test().display());
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert of the rules file has a unit test that makes it fire and one that expects it
/// silent.
#[test]
fn every_alert_has_a_firing_and_a_silent_unit_test() {
    let text = std::fs::read_to_string(rules()).unwrap();
    let tests = std::fs::read_to_string(rules_test()).unwrap();
    let alerts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for a in alerts {
        // Each `alertname:` line is followed by its `exp_alerts:` (empty or a list).
        let mut fired = false;
        let mut silent = false;
        let lines: Vec<&str> = tests.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            if *l == format!("alertname: {a}") {
                match lines.get(i + 1) {
                    Some(&"exp_alerts: []") => silent = true,
                    Some(&"exp_alerts:") => fired = true,
                    other => panic!("{a}: unexpected {other:?} after alertname"),
                }
            }
        }
        assert!(fired && silent, "{a}: fired {fired}, silent {silent}");
    }
}

/// The `ringbag_*` names in `text`, with histogram suffixes stripped to the family name.
fn metric_names(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"ringbag_[a-z_]+").unwrap();
    re.find_iter(text)
        .map(|m| {
            let n = m.as_str().trim_end_matches('_');
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_string()
        })
        .collect()
}

#[test]
fn every_metric_the_rules_and_their_tests_name_is_one_ringbag_exports() {
    let render = std::fs::read_to_string(repo().join("src/metrics/render.rs")).unwrap();
    let rules_text = std::fs::read_to_string(rules()).unwrap();
    let used = metric_names(&rules_text);
    assert!(used.len() >= 10, "{used:?}");
    let mut unknown = BTreeSet::new();
    for text in [rules_text, std::fs::read_to_string(rules_test()).unwrap()] {
        for name in metric_names(&text) {
            if !render.contains(&format!("\"{name}\"")) {
                unknown.insert(name);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the alert rules name metrics src/metrics/render.rs does not export: {unknown:?}"
    );
}

#[test]
fn the_metric_name_scan_finds_names_and_strips_histogram_suffixes() {
    let names = metric_names(
        "expr: rate(ringbag_x_seconds_bucket[5m]) > ringbag_up and ringbag_y_total{a=\"b\"}",
    );
    let want: BTreeSet<String> = ["ringbag_x_seconds", "ringbag_up", "ringbag_y_total"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(names, want);
}
