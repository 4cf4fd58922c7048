//! `ringbag record` without budget flags keeps a default free-space floor (5 % of the
//! partition or 1 GiB, whichever is smaller), says so in one line at start, and
//! `--min-free-space 0` turns it off.

use std::path::Path;

use crate::common::{run, stderr};

const MIB: f64 = (1u64 << 20) as f64;

/// The default floor for the partition holding `dir`, as the line prints it (MiB, 1 decimal).
/// From the partition's size only, never its free space.
fn default_floor_line(dir: &Path) -> String {
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    #[allow(clippy::unnecessary_cast)]
    let total = st.blocks() as u64 * st.fragment_size() as u64;
    let floor = (total / 100 * 5).min(1 << 30);
    format!(
        "keeping {:.1} MiB free on the bag's partition (the default floor",
        floor as f64 / MIB
    )
}

fn record(out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "small",
        "--synthetic-count",
        "20",
        "--clock",
        "system",
        "-o",
        out.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn record_without_a_floor_flag_keeps_the_default_floor_and_says_so_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = record(&tmp.path().join("bag"), &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let want = default_floor_line(tmp.path());
    assert_eq!(
        err.lines().filter(|l| l.contains("keeping")).count(),
        1,
        "{err}"
    );
    assert!(err.contains(&want), "want {want:?} in: {err}");
    assert!(err.contains("--min-free-space 0 turns it off"), "{err}");
}

#[test]
fn min_free_space_0_turns_the_floor_off_and_an_explicit_floor_replaces_the_default() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = record(&tmp.path().join("off"), &["--min-free-space", "0"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("keeping"), "{err}");
    for flags in [
        ["--min-free-space", "1MiB"],
        ["--min-free-space-percent", "1"],
    ] {
        let out = record(&tmp.path().join(flags[0].trim_start_matches('-')), &flags);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {err}");
        assert!(!err.contains("the default floor"), "{flags:?}: {err}");
    }
}

#[test]
fn on_a_small_partition_record_stops_at_the_default_floor_instead_of_filling_it() {
    let Some(fs) = crate::retention::Tmpfs::mount("24m") else {
        return;
    };
    let out = fs.dir.join("bag");
    // No split limit: nothing can be deleted, so recording must stop at the floor.
    let o = run(&[
        "record",
        "--source",
        "synthetic",
        "--synthetic-profile",
        "medium",
        "--synthetic-rate",
        "max",
        "--clock",
        "system",
        "-o",
        out.to_str().expect("utf-8"),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ringbag: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("free-space floor"), "{err}");
    let st = nix::sys::statvfs::statvfs(&fs.dir).expect("statvfs");
    #[allow(clippy::unnecessary_cast)]
    let (free, total) = (
        st.blocks_available() as u64 * st.fragment_size() as u64,
        st.blocks() as u64 * st.fragment_size() as u64,
    );
    let floor = total / 100 * 5;
    assert!(
        free >= floor,
        "{free} bytes left free, the floor is {floor}: {err}"
    );
    let bag = ringbag::bag::reader::Bag::open(&out).expect("the bag reads");
    assert!(bag.metadata.message_count > 0, "{err}");
}
