//! The page walker under random damage: truncation, zeroed and garbage pages, byte flips,
//! garbage files. For every trial: no panic, bounded time, no invented or altered rows
//! (except rows whose own bytes were flipped, which no format without checksums can detect).
mod pagewalk_common;

use std::collections::BTreeMap;
use std::time::Duration;

use pagewalk_common::Rng;
use pagewalk_common::*;
use proptest::prelude::*;

#[derive(Default)]
struct Stats {
    trials: u64,
    kept: u64,
    lost: u64,
    max_time: Duration,
}

fn record(
    stats: &mut BTreeMap<&'static str, Stats>,
    kind: &'static str,
    orig: &Original,
    out: &Outcome,
) {
    assert!(out.elapsed < TIME_BOUND, "{kind}: took {:?}", out.elapsed);
    let s = stats.entry(kind).or_default();
    s.trials += 1;
    s.kept += out.messages.len() as u64;
    s.lost += (orig.messages.len() - out.messages.len().min(orig.messages.len())) as u64;
    s.max_time = s.max_time.max(out.elapsed);
}

/// Recovered rows all exist; at most `budget` of them differ from their original.
fn assert_at_most_altered(orig: &Original, out: &Outcome, budget: usize, what: &str) -> usize {
    let mut altered = 0;
    let mut seen = std::collections::HashSet::new();
    for m in &out.messages {
        assert!(seen.insert(m.id), "{what}: message {} returned twice", m.id);
        // A flipped rowid varint is an altered row too.
        let Some((topic_id, ts, data)) = orig.messages.get(&m.id) else {
            altered += 1;
            continue;
        };
        if (m.topic_id, m.timestamp, &m.data) != (*topic_id, *ts, data) {
            altered += 1;
        }
    }
    assert!(
        altered <= budget,
        "{what}: {altered} rows altered by {budget} flipped bytes"
    );
    altered
}

#[test]
fn random_damage_never_invents_or_alters_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bases = [
        build(dir.path(), Flavour::Jazzy, 4096, 200, 1001, None),
        build(dir.path(), Flavour::Humble, 8192, 150, 1002, Some(7)),
        build(dir.path(), Flavour::Jazzy, 65536, 80, 1003, None),
    ];
    let trials_per_kind = std::env::var("PAGEWALK_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60u64);
    let mut stats = BTreeMap::new();
    let mut rng = Rng::new(4242);
    let mut altered_by_flips = 0;
    for orig in &bases {
        let len = orig.bytes.len() as u64;
        let npages = len / orig.page_size as u64;
        for t in 0..trials_per_kind {
            // Truncation at a random offset.
            let cut = rng.below(len) as usize;
            let out = run(&orig.bytes[..cut]);
            assert_all_genuine(orig, &out, &format!("truncated at {cut}"));
            record(&mut stats, "truncate", orig, &out);

            // Zero 1..4 random pages (power-loss holes).
            let mut bytes = orig.bytes.clone();
            let mut zeroed = Vec::new();
            for _ in 0..rng.range(1, 4) {
                let p = rng.range(1, npages) as u32;
                bytes[page_range(orig, p)].fill(0);
                zeroed.push(p);
            }
            let out = run(&bytes);
            assert_all_genuine(orig, &out, &format!("pages {zeroed:?} zeroed"));
            record(&mut stats, "zero pages", orig, &out);

            // Overwrite 1..3 random pages with random bytes (misdirected writes).
            let mut bytes = orig.bytes.clone();
            for _ in 0..rng.range(1, 3) {
                let p = rng.range(1, npages) as u32;
                rng.fill(&mut bytes[page_range(orig, p)]);
            }
            let out = run(&bytes);
            assert_all_genuine(orig, &out, "garbage pages");
            record(&mut stats, "garbage pages", orig, &out);

            // Torn tail: a cut plus zeroed pages before it, as a power loss leaves it.
            let cut = rng.range(len / 2, len) as usize;
            let mut bytes = orig.bytes[..cut].to_vec();
            let tail_pages = cut as u64 / orig.page_size as u64;
            for _ in 0..rng.range(1, 3) {
                let p = rng.range(tail_pages.saturating_sub(8).max(1), tail_pages.max(1)) as u32;
                let r = page_range(orig, p);
                if r.end <= bytes.len() {
                    bytes[r].fill(0);
                }
            }
            let out = run(&bytes);
            assert_all_genuine(orig, &out, "torn tail");
            record(&mut stats, "torn tail", orig, &out);

            // Byte flips in the last 100 KiB.
            let mut bytes = orig.bytes.clone();
            let from = bytes.len().saturating_sub(100 * 1024);
            let flips = rng.range(1, 64) as usize;
            for _ in 0..flips {
                let at = from + rng.below((bytes.len() - from) as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            let out = run(&bytes);
            altered_by_flips +=
                assert_at_most_altered(orig, &out, flips, &format!("trial {t}: {flips} flips"));
            record(&mut stats, "flip tail bytes", orig, &out);
        }
    }
    println!("rows returned altered by tail byte flips (undetectable without checksums): {altered_by_flips}");
    let total: u64 = bases.iter().map(|b| b.messages.len() as u64).sum::<u64>() * trials_per_kind;
    println!("damage kind        trials  kept      lost    lost%  max time  (messages per trial set: {total})");
    for (kind, s) in &stats {
        println!(
            "{kind:<18} {:>6}  {:>8}  {:>6}  {:>5.1}%  {:?}",
            s.trials,
            s.kept,
            s.lost,
            100.0 * s.lost as f64 / (s.kept + s.lost).max(1) as f64,
            s.max_time
        );
    }
}

fn small_base() -> &'static Original {
    static BASE: std::sync::OnceLock<(tempfile::TempDir, Original)> = std::sync::OnceLock::new();
    &BASE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let orig = build(dir.path(), Flavour::Jazzy, 1024, 40, 77, None);
            (dir, orig)
        })
        .1
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_or_yield_rows(bytes in proptest::collection::vec(any::<u8>(), 0..70_000)) {
        let out = run(&bytes);
        prop_assert!(out.elapsed < TIME_BOUND);
        prop_assert_eq!(out.messages.len(), 0);
    }

    #[test]
    fn garbage_behind_a_valid_header_never_panics_or_yields_rows(
        size_log in 9u32..=16,
        pages in 1usize..24,
        seed in any::<u64>(),
    ) {
        let ps = 1usize << size_log;
        let mut bytes = vec![0u8; ps * pages];
        Rng::new(seed).fill(&mut bytes);
        bytes[..16].copy_from_slice(b"SQLite format 3\0");
        let raw = if ps == 65536 { 1u16 } else { ps as u16 };
        bytes[16..18].copy_from_slice(&raw.to_be_bytes());
        bytes[20] = 0;
        let out = run(&bytes);
        prop_assert!(out.elapsed < TIME_BOUND);
        prop_assert_eq!(out.messages.len(), 0);
    }

    #[test]
    fn arbitrary_writes_into_a_real_bag_alter_at_most_the_rows_they_touch(
        writes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..40),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let orig = small_base();
        let mut bytes = orig.bytes.clone();
        for (at, v) in &writes {
            let i = at.index(bytes.len());
            bytes[i] = *v;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        let out = run(&bytes);
        prop_assert!(out.elapsed < TIME_BOUND);
        assert_at_most_altered(orig, &out, writes.len(), "arbitrary writes");
    }
}

/// Row by row through SQLite: the ids whose row SQLite still returns unchanged.
fn sqlite_readable(orig: &Original, bytes: &[u8], dir: &std::path::Path) -> Vec<i64> {
    let path = dir.join("damaged.db3");
    std::fs::write(&path, bytes).expect("write damaged copy");
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return Vec::new();
    };
    let Ok(mut stmt) = conn.prepare("SELECT topic_id, timestamp, data FROM messages WHERE id = ?1")
    else {
        return Vec::new();
    };
    orig.messages
        .iter()
        .filter(|(id, (topic_id, ts, data))| {
            stmt.query_row([**id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            })
            .is_ok_and(|row| row == (*topic_id, *ts, data.clone()))
        })
        .map(|(id, _)| *id)
        .collect()
}

#[test]
fn keeps_at_least_every_row_sqlite_can_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Jazzy, 4096, 150, 3003, None);
    let len = orig.bytes.len() as u64;
    let npages = len / orig.page_size as u64;
    let mut rng = Rng::new(99);
    let (mut walker_kept, mut sqlite_kept, mut trials) = (0usize, 0usize, 0);
    for t in 0..80 {
        let mut bytes = orig.bytes.clone();
        if t % 2 == 0 {
            bytes.truncate(rng.below(len) as usize);
        } else {
            for _ in 0..rng.range(1, 3) {
                let p = rng.range(2, npages) as u32;
                bytes[page_range(&orig, p)].fill(0);
            }
        }
        let out = run(&bytes);
        assert_all_genuine(&orig, &out, "cross-check");
        let ours: std::collections::HashSet<i64> = out.messages.iter().map(|m| m.id).collect();
        let theirs = sqlite_readable(&orig, &bytes, dir.path());
        let missed: Vec<i64> = theirs
            .iter()
            .copied()
            .filter(|id| !ours.contains(id))
            .collect();
        assert!(
            missed.is_empty(),
            "trial {t}: SQLite still reads {missed:?}, the walk lost them"
        );
        walker_kept += ours.len();
        sqlite_kept += theirs.len();
        trials += 1;
    }
    println!("cross-check: {trials} trials, walk kept {walker_kept}, SQLite row-by-row kept {sqlite_kept}");
}

/// Run with `cargo test --release --test pagewalk_damage -- --ignored --nocapture`.
#[test]
#[ignore = "builds a 100 MB bag; a timing figure, not a check"]
fn walks_a_100_mb_bag_in_bounded_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orig = build(dir.path(), Flavour::Jazzy, 4096, 3_800, 5005, None);
    let mb = orig.bytes.len() as f64 / 1e6;
    let path = dir.path().join("big.db3");
    std::fs::write(&path, &orig.bytes).expect("write");
    let start = std::time::Instant::now();
    let mut n = 0usize;
    let w = ringbag::bag::pagewalk::walk(&path, |m| {
        n += usize::from(orig.messages[&m.id].2 == m.data);
        std::ops::ControlFlow::Continue(())
    })
    .expect("walk");
    let intact = start.elapsed();
    assert_eq!(n, orig.messages.len());
    let mut bytes = orig.bytes.clone();
    bytes[..4096].fill(0);
    let start = std::time::Instant::now();
    let out = run(&bytes);
    let guessed = start.elapsed();
    assert_eq!(out.messages.len(), orig.messages.len());
    println!(
        "{mb:.1} MB, {} messages: intact walk {intact:?}, page-1-zeroed walk {guessed:?}, report {:?}",
        orig.messages.len(),
        w.report
    );
}
