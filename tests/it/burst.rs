//! `ringbag burst`: play's reader, selection and sinks without the schedule, as `ros2 bag
//! burst`: everything (or `-n` messages) in bag order, as fast as the sink takes them.

use std::path::Path;
use std::process::Output;

use crate::common::{cdr_string, stderr, stdout};
use crate::play::{lines, timed_bag, Msg, MS, STRING, T0};

/// 20 messages one second apart, alternating /a and /b: a timed play takes 19 s.
fn slow_bag(dir: &Path) -> Vec<Msg> {
    let msgs: Vec<Msg> = (0..20)
        .map(|i| {
            let t = if i % 2 == 0 { "/a" } else { "/b" };
            (
                t,
                STRING,
                T0 + i * 1000 * MS,
                cdr_string(&format!("{t} {i}")),
            )
        })
        .collect();
    timed_bag(dir, &msgs, 7);
    msgs
}

fn burst(bag: &Path, args: &[&str]) -> Output {
    let mut all = vec!["burst", bag.to_str().unwrap(), "--sink", "echo"];
    all.extend_from_slice(args);
    crate::common::wait_deadline(crate::common::spawn(&all), 60)
        .unwrap_or_else(|| panic!("burst {args:?} ran past 60 s"))
}

fn played(o: &Output) -> Vec<(String, i64)> {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    lines(&stdout(o))
        .into_iter()
        .map(|l| (l.topic, l.bag_ns))
        .collect()
}

fn want(msgs: &[Msg], keep: impl Fn(&Msg) -> bool, n: usize) -> Vec<(String, i64)> {
    msgs.iter()
        .filter(|m| keep(m))
        .take(n)
        .map(|m| (m.0.to_string(), m.2))
        .collect()
}

#[test]
fn burst_publishes_without_timing_and_num_messages_and_selection_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    let msgs = slow_bag(&bag);

    let o = burst(&bag, &[]);
    assert_eq!(played(&o), want(&msgs, |_| true, 20), "all, in bag order");
    let l = lines(&stdout(&o));
    // Timed, the last message would go out 19 s after the first.
    let spread = l.last().unwrap().send_ns - l[0].send_ns;
    assert!(spread < 5_000_000_000, "burst took {spread} ns: it waited");
    assert!(stderr(&o).contains("played 20 messages"), "{}", stderr(&o));

    let o = burst(&bag, &["-n", "5"]);
    assert_eq!(played(&o), want(&msgs, |_| true, 5));
    let o = burst(&bag, &["--num-messages", "3", "--topics", "/b"]);
    assert_eq!(played(&o), want(&msgs, |m| m.0 == "/b", 3));
    let o = burst(&bag, &["--start-offset", "10.5", "-n", "0"]);
    assert_eq!(played(&o), want(&msgs, |m| m.2 >= T0 + 10_500 * MS, 20));
    let o = burst(&bag, &["-n", "100"]);
    assert_eq!(
        played(&o),
        want(&msgs, |_| true, 20),
        "more than the bag: all"
    );
}

#[test]
fn burst_refuses_timing_flags_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("bag");
    slow_bag(&bag);
    for (args, flag) in [
        (&["--rate", "2"][..], "--rate"),
        (&["--loop"][..], "--loop"),
        (&["--clock"][..], "--clock"),
        (&["--delay", "1"][..], "--delay"),
        (&["-n", "-1"][..], "-1"),
    ] {
        let o = burst(&bag, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("ringbag: error: ") && err.contains(flag),
            "{args:?}: {err}"
        );
        assert!(stdout(&o).is_empty(), "{args:?}: nothing played");
    }
}
