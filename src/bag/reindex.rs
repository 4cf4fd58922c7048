//! `ringbag reindex`: rebuild metadata.yaml from a bag's `.db3` files, salvaging damaged
//! splits, and `recover_root`, which finds and reindexes unfinished bags after a crash.
//!
//! Per split:
//! 1. Side files. A `-wal` holds committed transactions (resilient preset): the split is
//!    opened read-write so SQLite replays it, then checkpointed into the file and removed. A
//!    hot `-journal` (presets `none`, or a foreign writer) is rolled back by SQLite on that same
//!    read-write open. Write-optimized splits run with journaling off, except for their
//!    first commits (`StoragePreset::commits_can_tear`): a recorder killed inside one of
//!    those leaves a hot `-journal`, rolled back the same way. A `-shm` without a `-wal` is
//!    only an index and is removed.
//! 2. `PRAGMA quick_check`, then the tables are read. Any failure marks the split damaged.
//! 3. A damaged split is salvaged into `<name>.db3.salvage.tmp`: rows are read through SQLite in
//!    rowid ranges, a failing range is bisected down to single rows and those are skipped.
//!    When rows were skipped or SQLite cannot read the tables at all, the page walker
//!    (`pagewalk`) adds every row it finds whose id SQLite did not return.
//! 4. The fresh file is fsynced, the damaged one is kept as `<name>.db3.damaged` (a hard
//!    link, so `<name>.db3` exists at every instant) unless `--discard-damaged`, the fresh
//!    one is renamed into place and the directory fsynced.
//!
//! `--dry-run` does all of this on scratch copies in a temporary directory, so the bag's
//! files are not touched, and reports what would happen.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;

use super::lock::{self, BagLock, LockState};
use super::metadata::{sync_dir, BagMetadata, FileInfo, TopicWithCount, METADATA_FILE, NO_START};
use super::pagewalk::{self, RecoveredDefinition, RecoveredTopic};
use super::qos::parse_profiles_str;
use super::reader::{find_splits, split_number};
use super::schema::create_tables;
use super::sqlguard::{bounded, check_len, MAX_TOPICS, MAX_TOPIC_FIELD, MAX_TOPIC_TEXT};
use super::{BagError, Flavour, TopicInfo};

/// How `reindex` treats the bag.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReindexOptions {
    /// Report only; change nothing in the bag directory.
    pub dry_run: bool,
    /// Delete a damaged split after salvage instead of keeping it as `<name>.db3.damaged`.
    pub discard_damaged: bool,
}

/// How a split's messages were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitMethod {
    /// quick_check passed; the file is used as it is.
    Intact,
    /// Damaged; every row came back through SQLite's rowid ranges.
    Sqlite,
    /// Damaged; SQLite ranges plus rows found by walking the pages.
    SqlitePagewalk,
    /// Damaged so badly that SQLite read nothing; all rows from the page walk.
    Pagewalk,
    /// Not recognisably a rosbag2 split (no rosbag2 table, no rosbag2 row found by the page
    /// walk): another program's file under a split's name. Left untouched, never deleted,
    /// and not listed in metadata.yaml.
    NotASplit,
}

impl SplitMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMethod::Intact => "intact",
            SplitMethod::Sqlite => "salvaged through SQLite",
            SplitMethod::SqlitePagewalk => "salvaged through SQLite and the page walk",
            SplitMethod::Pagewalk => "salvaged by the page walk",
            SplitMethod::NotASplit => "not a rosbag2 split, left untouched",
        }
    }
}

/// What a split's loss estimate is based on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossBasis {
    /// Nothing was lost (intact split).
    None,
    /// The count in the split's own `metadata` row (Jazzy writes it when the split closes).
    SplitMetadataRow,
    /// The split's entry in the previous metadata.yaml.
    MetadataYaml,
    /// The largest message rowid seen (rows are numbered 1, 2, ... and never deleted).
    MaxRowid,
    /// Nothing bounds the loss: the split was still open (no count recorded at close) and
    /// the part of the file that held its newest rows is missing or damaged. Only a lower
    /// bound is known (`messages_lost_at_least`); `loss_unknown_reason` says why.
    Unknown,
}

impl LossBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            LossBasis::None => "none",
            LossBasis::SplitMetadataRow => "the split's metadata row",
            LossBasis::MetadataYaml => "the previous metadata.yaml",
            LossBasis::MaxRowid => "the largest rowid",
            LossBasis::Unknown => "nothing that bounds it",
        }
    }
}

/// The outcome for one split.
#[derive(Debug, Clone, Serialize)]
pub struct SplitReport {
    pub file: String,
    /// `ok`, or the first problem quick_check or reading reported.
    pub check: String,
    pub method: SplitMethod,
    pub messages_kept: u64,
    /// Best estimate of messages that were in the file but could not be salvaged; `None`
    /// (JSON `null`) when the evidence cannot bound it (`loss_basis` is `unknown`).
    pub messages_lost: Option<u64>,
    /// What is certainly lost (equal to `messages_lost` when that is known).
    pub messages_lost_at_least: u64,
    pub loss_basis: LossBasis,
    /// Why the loss is unknown, when it is.
    pub loss_unknown_reason: Option<String>,
    /// What was done about `-wal`, `-journal`, `-shm` files next to the split.
    pub side_files: Vec<String>,
    /// Where the damaged original was kept (`None`: intact, discarded, or dry run).
    pub damaged_kept_as: Option<String>,
    pub start_ns: i64,
    pub duration_ns: i64,
}

/// The outcome for a bag.
#[derive(Debug, Clone, Serialize)]
pub struct ReindexReport {
    pub bag: PathBuf,
    pub dry_run: bool,
    pub flavour: Flavour,
    pub splits: Vec<SplitReport>,
    pub topics: usize,
    pub message_count: u64,
    /// Sum over splits; `None` (JSON `null`) when any split's loss is unknown.
    pub messages_lost: Option<u64>,
    /// What is certainly lost, summed over splits.
    pub messages_lost_at_least: u64,
    /// True when metadata.yaml was (or, in a dry run, would be) rewritten.
    pub metadata_written: bool,
}

impl ReindexReport {
    /// A few lines for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}{}: {} splits, {} topics, {} messages ({} flavour)\n",
            if self.dry_run { "[dry run] " } else { "" },
            self.bag.display(),
            self.splits.len(),
            self.topics,
            self.message_count,
            self.flavour.distro(),
        );
        for sp in &self.splits {
            if sp.method == SplitMethod::Intact && sp.side_files.is_empty() {
                continue;
            }
            let lost = match (sp.messages_lost, &sp.loss_unknown_reason) {
                (Some(n), _) => format!("lost {n} (estimated from {})", sp.loss_basis.as_str()),
                (None, why) => format!(
                    "lost unknown ({}{})",
                    match sp.messages_lost_at_least {
                        0 => String::new(),
                        n => format!("at least {n}; "),
                    },
                    why.as_deref().unwrap_or("nothing bounds it")
                ),
            };
            s.push_str(&format!(
                "  {}: {}, kept {}, {lost}; {}{}\n",
                sp.file,
                sp.method.as_str(),
                sp.messages_kept,
                sp.check,
                if sp.side_files.is_empty() {
                    String::new()
                } else {
                    format!("; {}", sp.side_files.join("; "))
                }
            ));
        }
        s.push_str(&format!(
            "{} metadata.yaml; {}\n",
            if self.dry_run {
                "would rewrite"
            } else {
                "rewrote"
            },
            self.lost_text()
        ));
        s
    }

    /// `N messages lost in total`, or `an unknown number of messages lost (at least N)`.
    pub fn lost_text(&self) -> String {
        match self.messages_lost {
            Some(n) => format!("{n} messages lost in total"),
            None => format!(
                "an unknown number of messages lost in total ({}see the splits above)",
                match self.messages_lost_at_least {
                    0 => String::new(),
                    n => format!("at least {n}; "),
                }
            ),
        }
    }
}

/// Suffix of the fresh file a salvage writes before swapping it in.
pub const SALVAGE_TMP_SUFFIX: &str = ".salvage.tmp";
/// Suffix of a damaged split kept after salvage.
pub const DAMAGED_SUFFIX: &str = ".damaged";
/// Rows per SQLite salvage range; a failing range is bisected.
const SALVAGE_RANGE: i64 = 256;

/// What one split contributes to metadata.yaml.
struct SplitContent {
    rel: String,
    topics: Vec<RecoveredTopic>,
    schema_version: Option<i64>,
    count: u64,
    start_ns: i64,
    end_ns: i64,
    per_topic_id: BTreeMap<i64, u64>,
}

/// Rebuild `bag`'s metadata.yaml from its splits, salvaging damaged ones.
pub fn reindex(bag: &Path, opts: ReindexOptions) -> Result<ReindexReport, BagError> {
    if !bag.exists() {
        return Err(BagError::NotFound {
            path: bag.to_path_buf(),
        });
    }
    if !bag.is_dir() {
        return Err(BagError::invalid(
            bag,
            "not a bag directory (reindex works on the directory holding the .db3 files)",
        ));
    }
    let files = find_splits(bag)?;
    if files.is_empty() {
        return Err(BagError::invalid(bag, "not a bag: no .db3 files"));
    }
    // Never touch a bag a live writer holds (its open split looks damaged, its -wal is in
    // use, and it rewrites metadata.yaml at will). The recorder holds the bag lock for its
    // whole life; a real reindex takes it too (below), so two reindexes never overlap.
    if lock::state(bag) == LockState::Held {
        return Err(BagError::Busy {
            path: bag.to_path_buf(),
        });
    }
    // A writer that is not ringbag (ros2 bag record) holds no bag lock; SQLite's own file
    // locks show it while it has a split open.
    if let Some(busy) = files
        .iter()
        .find(|f| locked_by_another_process(&bag.join(f)))
    {
        return Err(BagError::invalid(
            bag.join(busy),
            "in use by another process (a recording is writing it); not touched",
        ));
    }
    // A FIFO, socket or directory named metadata.yaml is not a damaged metadata.yaml that
    // the rebuild may replace: something else put it there. Refuse, naming it.
    let meta_path = bag.join(METADATA_FILE);
    if let Ok(m) = fs::symlink_metadata(&meta_path) {
        if !m.is_file() && !m.file_type().is_symlink() {
            return Err(BagError::invalid(
                &meta_path,
                format!(
                    "is {}, not a regular file; not opened",
                    super::fsguard::kind(&m.file_type())
                ),
            ));
        }
    }
    // A dry run only probes; a real one holds the lock until the bag is clean again (a
    // recorder starting in between makes this fail with `Busy`).
    let was_clean = lock::state(bag) == LockState::Clean;
    let lock = if opts.dry_run {
        None
    } else {
        Some(BagLock::acquire(bag)?)
    };
    let held = lock.is_some();
    let result = reindex_locked(bag, opts, files, held);
    if let Some(l) = lock {
        match &result {
            // Every split is fsynced (salvaged ones before their rename, intact ones below)
            // and metadata.yaml is durable: the bag now counts as cleanly finished.
            Ok(r) => {
                sync_intact_splits(bag, &r.splits)?;
                l.release_clean()?;
            }
            // Each step of a reindex is atomic, so a failed one leaves the bag no worse than
            // it found it: a bag that was clean (or no bag at all) gets no marker from us,
            // one that was unclean keeps its marker for the next try.
            Err(_) if was_clean => {
                if let Err(e) = l.release_clean() {
                    log::warn!("{}: {e}", bag.display());
                }
            }
            Err(_) => {}
        }
    }
    result
}

/// The body of [`reindex`], run under the bag lock unless it is a dry run.
fn reindex_locked(
    bag: &Path,
    opts: ReindexOptions,
    files: Vec<String>,
    held: bool,
) -> Result<ReindexReport, BagError> {
    // Listed again under the lock: a writer that held it until a moment ago may have
    // added or removed splits.
    let files = if held {
        remove_stale_temp_files(bag)?;
        find_splits(bag)?
    } else {
        files
    };
    if files.is_empty() {
        return Err(BagError::invalid(bag, "not a bag: no .db3 files"));
    }
    let old = BagMetadata::read(bag).ok();
    let scratch = if opts.dry_run {
        Some(Scratch::new(bag)?)
    } else {
        None
    };

    // Pass 1: side files and checks. Topics and flavour of the readable splits are the
    // fallback for a damaged split that lost its own.
    let mut checked = Vec::new();
    let mut foreign: Vec<(String, String)> = Vec::new();
    // Only the newest split can have been open when a recorder stopped; every other one was
    // closed, so its count in metadata.yaml is exact.
    let newest = files.iter().filter_map(|f| split_number(f)).max();
    for rel in &files {
        let original = bag.join(rel);
        // SQLite and the dry run's copy open the side files: never one that could block.
        super::fsguard::check_side_files(&original)?;
        if super::compressed::is_zstd(&original) {
            // A compressed split was closed and complete when it was compressed: it is read
            // (through a private copy) but never rewritten. One that does not decompress or
            // check is left untouched like another program's file, its loss reported.
            match check_compressed(&original, rel) {
                Ok(c) => checked.push((rel.clone(), original.clone(), original, Vec::new(), Ok(c))),
                Err(why) => foreign.push((rel.clone(), why)),
            }
            continue;
        }
        // Recognise the file before anything (SQLite replaying side files included) can
        // touch it: another program's file under a split's name is not ours to rewrite.
        match recognise(&original) {
            Recognition::Rosbag2 | Recognition::Blank => {}
            Recognition::Foreign(why) => {
                foreign.push((rel.clone(), why));
                continue;
            }
            Recognition::TornSqlite(why) => {
                // A split torn inside its first page (with 64 KiB pages the schema's cells
                // sit at the end of page 1, and a write cut short by a power cut, or by
                // kill -9 between the 4 KiB pieces of one write, loses them) has lost all
                // that shows it is rosbag2. It is this bag's if metadata.yaml lists it, or
                // if it is the newest split of a bag with a metadata.yaml: the recorder lists
                // a split only once it is durable, so that is the one it was creating when it
                // died. Its loss is then reported, the bag not refused; the original is kept.
                let ours = old.as_ref().is_some_and(|m| {
                    m.relative_file_paths.iter().any(|p| p == rel) || split_number(rel) == newest
                });
                if !ours {
                    foreign.push((rel.clone(), why));
                    continue;
                }
            }
        }
        let work = match &scratch {
            Some(s) => s.copy_split(&original)?,
            None => original.clone(),
        };
        let side_files = settle_side_files(&work)?;
        // A split whose `topics` or `messages` is a view (or computed) would make every
        // query below hang or use gigabytes: refused before anything is written. Checked
        // after the side files, which may hold schema changes of their own.
        super::sqlguard::refuse_hostile(&work)?;
        let check = check_split(&work);
        checked.push((rel.clone(), original, work, side_files, check));
    }
    if checked.is_empty() {
        let (rel, why) = &foreign[0];
        return Err(BagError::invalid(
            bag.join(rel),
            format!("{why}; no .db3 file here is a rosbag2 split, nothing changed"),
        ));
    }
    let mut known_topics: Vec<RecoveredTopic> = Vec::new();
    let mut known_defs: Vec<RecoveredDefinition> = Vec::new();
    let mut flavour: Option<Flavour> = None;
    for (_, _, _, _, c) in &checked {
        if let Ok(c) = c {
            merge_topics(&mut known_topics, &c.topics);
            for d in &c.definitions {
                if !known_defs.iter().any(|k| k.topic_type == d.topic_type) {
                    known_defs.push(d.clone());
                }
            }
            if let Some(v) = c.content.schema_version {
                flavour = Some(flavour_of_schema(v).max_with(flavour));
            }
        }
    }
    if known_topics.is_empty() {
        if let Some(m) = &old {
            known_topics = m
                .topics
                .iter()
                .enumerate()
                .map(|(i, t)| topic_from_info(i as i64 + 1, &t.topic))
                .collect();
        }
    }
    let fallback_flavour = flavour
        .or(old.as_ref().map(|m| m.flavour()))
        .unwrap_or(Flavour::Jazzy);

    // Pass 2: salvage what is damaged.
    let mut reports = Vec::new();
    let mut contents = Vec::new();
    for (rel, original, work, side_files, check) in checked {
        match check {
            Ok(c) => {
                reports.push(SplitReport {
                    file: rel.clone(),
                    check: "ok".into(),
                    method: SplitMethod::Intact,
                    messages_kept: c.content.count,
                    messages_lost: Some(0),
                    messages_lost_at_least: 0,
                    loss_basis: LossBasis::None,
                    loss_unknown_reason: None,
                    side_files,
                    damaged_kept_as: None,
                    start_ns: c.content.start_ns,
                    duration_ns: duration(&c.content),
                });
                contents.push(c.content);
            }
            Err(problem) => {
                let fallback = Fallback {
                    topics: &known_topics,
                    definitions: &known_defs,
                    flavour: fallback_flavour,
                    yaml_count: old
                        .as_ref()
                        .and_then(|m| m.files.iter().find(|f| f.describes(&rel)))
                        .map(|f| f.message_count),
                    may_have_been_open: split_number(&rel) == newest,
                };
                let tmp = TempFile(tmp_path(&work));
                let salvaged = salvage(&work, &tmp.0, &rel, &fallback)?;
                if salvaged.content.schema_version.is_some() && flavour.is_none() {
                    flavour = salvaged.content.schema_version.map(flavour_of_schema);
                }
                let damaged_kept_as = if opts.dry_run {
                    None
                } else {
                    swap_in(&original, &tmp.0, opts.discard_damaged)?
                };
                drop(tmp);
                let at_least = salvaged.expected.saturating_sub(salvaged.content.count);
                reports.push(SplitReport {
                    file: rel.clone(),
                    check: problem,
                    method: salvaged.method,
                    messages_kept: salvaged.content.count,
                    messages_lost: salvaged.unknown.is_none().then_some(at_least),
                    messages_lost_at_least: at_least,
                    loss_basis: if salvaged.unknown.is_some() {
                        LossBasis::Unknown
                    } else {
                        salvaged.basis
                    },
                    loss_unknown_reason: salvaged.unknown,
                    side_files,
                    damaged_kept_as,
                    start_ns: salvaged.content.start_ns,
                    duration_ns: duration(&salvaged.content),
                });
                contents.push(salvaged.content);
            }
        }
    }
    for (rel, why) in foreign {
        // Its messages are not in the rebuilt bag. Only metadata.yaml can say whether it
        // ever was a split of this bag, and with how many messages.
        let listed = old
            .as_ref()
            .and_then(|m| m.files.iter().find(|f| f.describes(&rel)))
            .map(|f| f.message_count)
            .filter(|n| *n > 0);
        let open = split_number(&rel) == newest;
        let (lost, basis, reason) = match listed {
            None => (Some(0), LossBasis::None, None),
            Some(n) if !open => (Some(n), LossBasis::MetadataYaml, None),
            Some(_) => (
                None,
                LossBasis::Unknown,
                Some("metadata.yaml listed it with a count taken while it was still open".into()),
            ),
        };
        log::warn!("{}: {why}; left untouched", bag.join(&rel).display());
        reports.push(SplitReport {
            file: rel,
            check: why,
            method: SplitMethod::NotASplit,
            messages_kept: 0,
            messages_lost: lost,
            messages_lost_at_least: listed.unwrap_or(0),
            loss_basis: basis,
            loss_unknown_reason: reason,
            side_files: Vec::new(),
            damaged_kept_as: None,
            start_ns: NO_START,
            duration_ns: 0,
        });
    }
    let flavour = flavour.unwrap_or(fallback_flavour);
    let metadata = build_metadata(flavour, &contents, old.as_ref());
    if !opts.dry_run {
        metadata.write_atomic(bag, flavour)?;
    }
    drop(scratch);
    Ok(ReindexReport {
        bag: bag.to_path_buf(),
        dry_run: opts.dry_run,
        flavour,
        topics: metadata.topics.len(),
        message_count: metadata.message_count,
        messages_lost: reports.iter().map(|r| r.messages_lost).sum(),
        messages_lost_at_least: reports.iter().map(|r| r.messages_lost_at_least).sum(),
        splits: reports,
        metadata_written: true,
    })
}

/// Why a bag under a recording root counts as unfinished (see [`unfinished_reason`]).
pub fn unfinished_reason(dir: &Path) -> Option<String> {
    // Compressed splits (`.db3.zstd`) are splits: a bag of only those is a bag.
    let files = find_splits(dir).ok()?;
    if files.is_empty() {
        return None;
    }
    if let Some(partial) = stale_partial(dir) {
        // Only called on a bag no live process holds: the compression that wrote it died,
        // and the file takes room until reindex removes it.
        return Some(format!("{partial} is left from a compression cut short"));
    }
    let meta = dir.join(METADATA_FILE);
    let Ok(meta_m) = fs::metadata(&meta) else {
        return Some("no metadata.yaml".into());
    };
    let newest_split = files
        .iter()
        .filter_map(|f| fs::metadata(dir.join(f)).and_then(|m| m.modified()).ok())
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if meta_m.modified().is_ok_and(|t| t < newest_split) {
        return Some("metadata.yaml is older than the newest split".into());
    }
    let Ok(m) = BagMetadata::read(dir) else {
        return Some("metadata.yaml is unreadable".into());
    };
    let listed: Vec<&str> = if m.relative_file_paths.is_empty() {
        m.files.iter().map(|f| f.path.as_str()).collect()
    } else {
        m.relative_file_paths.iter().map(String::as_str).collect()
    };
    if listed.len() < files.len() {
        return Some(format!(
            "metadata.yaml lists {} of {} splits",
            listed.len(),
            files.len()
        ));
    }
    if let Some(missing) = listed.iter().find(|l| !dir.join(l).exists()) {
        return Some(format!("metadata.yaml lists {missing}, which is gone"));
    }
    None
}

/// The name of a hidden `.<split>.db3.zstd.partial` in `dir`, if there is one.
fn stale_partial(dir: &Path) -> Option<String> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with('.') && n.ends_with(super::compressed::PARTIAL_SUFFIX))
}

/// What [`recover_root`] did: bags reindexed, and bags it left alone with the reason.
#[derive(Debug, Default)]
pub struct Recovery {
    pub reports: Vec<ReindexReport>,
    /// Bags not recovered (live, or recovery failed), each with why. Recording goes on.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Reindex every unfinished bag directly under `root` (the parent of recordings): the
/// recorder and the service call this at start, before they open a new bag.
///
/// Best effort per bag: a bag that is being recorded is left alone, and one that cannot be
/// recovered (no permission, not a bag, damaged beyond salvage) is logged with the reason
/// and skipped; neither stops the others or the recording that follows.
pub fn recover_root(root: &Path) -> Recovery {
    let mut out = Recovery::default();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            log::warn!(
                "recovery: cannot list {}: {e}; nothing recovered",
                root.display()
            );
            out.skipped.push((root.to_path_buf(), e.to_string()));
            return out;
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let reason = match lock::state(&dir) {
            LockState::Held => {
                log::info!(
                    "{}: being recorded by another process (its lock is held); left alone",
                    dir.display()
                );
                out.skipped
                    .push((dir, "being recorded by another process".into()));
                continue;
            }
            // The marker only a clean finish removes: timestamps and listings cannot tell
            // a clean stop from a power cut, this can.
            LockState::Unclean if !find_splits(&dir).unwrap_or_default().is_empty() => {
                "the last writer did not finish cleanly".to_string()
            }
            _ => match unfinished_reason(&dir) {
                Some(r) => r,
                None => continue,
            },
        };
        log::warn!("{}: unfinished bag ({reason}); reindexing", dir.display());
        match reindex(&dir, ReindexOptions::default()) {
            Ok(r) => {
                for sp in r.splits.iter().filter(|s| s.method != SplitMethod::Intact) {
                    let lost = sp
                        .messages_lost
                        .map_or_else(|| "an unknown number".to_string(), |n| n.to_string());
                    log::warn!(
                        "{}: {}: {} ({}), kept {}, lost {lost}",
                        dir.display(),
                        sp.file,
                        sp.method.as_str(),
                        sp.check,
                        sp.messages_kept,
                    );
                }
                out.reports.push(r);
            }
            Err(e) => {
                log::warn!("recovery: {}: not recovered: {e}", dir.display());
                out.skipped.push((dir, e.to_string()));
            }
        }
    }
    out
}

/// True when another process holds an SQLite lock on `split`: on the database file's lock
/// bytes (rollback journal and exclusive modes) or on the `-shm` dead-man-switch bytes that
/// every WAL connection holds for its lifetime. Locks of this process are not seen (POSIX
/// semantics), so call it with no connection of our own open on the file.
pub fn locked_by_another_process(split: &Path) -> bool {
    /// SQLite's PENDING_BYTE, followed by RESERVED and the 510-byte SHARED range.
    const DB_LOCK_START: i64 = 0x4000_0000;
    const DB_LOCK_LEN: i64 = 512;
    /// WAL index locks (write, checkpoint, recover, 5 read marks) and the DMS byte.
    const SHM_LOCK_START: i64 = 120;
    const SHM_LOCK_LEN: i64 = 9;
    let probe = |path: &Path, start: i64, len: i64| -> bool {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: a FIFO under a split's or -shm's name must not block the probe.
        let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
        else {
            return false;
        };
        // SAFETY: a zeroed flock is a valid value; F_GETLK only reads the fd and fills `fl`.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = start as _;
        fl.l_len = len as _;
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
        r == 0 && i32::from(fl.l_type) != libc::F_UNLCK
    };
    probe(split, DB_LOCK_START, DB_LOCK_LEN)
        || probe(&side_path(split, "-shm"), SHM_LOCK_START, SHM_LOCK_LEN)
}

// ---- checks -------------------------------------------------------------------------

struct Checked {
    content: SplitContent,
    topics: Vec<RecoveredTopic>,
    definitions: Vec<RecoveredDefinition>,
}

/// [`check_split`] of a compressed split (`.db3.zstd`), through a private decompressed copy
/// (removed on return); the content keeps the split's own name.
fn check_compressed(path: &Path, rel: &str) -> Result<Checked, String> {
    // The problem alone: the copy's path means nothing to the user.
    let why = |e: BagError| match e {
        BagError::Invalid { message, .. } => message,
        e => e.to_string(),
    };
    let copy = super::compressed::decompress(path).map_err(why)?;
    super::sqlguard::refuse_hostile(&copy.path).map_err(why)?;
    let mut c = check_split(&copy.path)?;
    c.content.rel = rel.to_string();
    Ok(c)
}

/// Run quick_check and read everything metadata.yaml needs. `Err` carries the problem.
fn check_split(path: &Path) -> Result<Checked, String> {
    let rel = file_name(path);
    // SQLite reads a page cut short by truncation as zeros and quick_check does not look at
    // payload bytes, so a file torn inside its last pages can pass it; the length decides.
    if let Some(what) = missing_part(path, None) {
        return Err(what);
    }
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open: {e}"))?;
    // Bounded like every reader's connection (the tables were checked by refuse_hostile).
    super::sqlguard::limit(&mut conn, path, true).map_err(|e| format!("cannot open: {e}"))?;
    let problems: Vec<String> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(0))?.collect())
        .map_err(|e| format!("quick_check failed: {e}"))?;
    if problems.first().map(String::as_str) != Some("ok") {
        return Err(format!(
            "quick_check: {}",
            problems.first().cloned().unwrap_or_default()
        ));
    }
    let topics = raw_topics(&conn).map_err(|e| format!("topics unreadable: {e}"))?;
    let definitions = raw_definitions(&conn).unwrap_or_default();
    let schema_version = schema_version(&conn);
    let (count, start, end): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT count(*), min(timestamp), max(timestamp) FROM messages",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| format!("messages unreadable: {e}"))?;
    // A timestamp before 1970 is a damaged row that quick_check cannot see (it does not look
    // inside records); salvage drops it, as metadata.yaml could not describe it.
    if let Some(t) = start.filter(|t| *t < 0) {
        return Err(format!("a message is stamped before 1970 ({t} ns)"));
    }
    let per_topic_id: BTreeMap<i64, u64> = conn
        .prepare("SELECT topic_id, count(*) FROM messages GROUP BY topic_id")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
            })?
            .collect()
        })
        .map_err(|e| format!("messages unreadable: {e}"))?;
    if let Some(id) = per_topic_id
        .keys()
        .find(|id| !topics.iter().any(|t| t.id == **id))
    {
        return Err(format!("messages name unknown topic id {id}"));
    }
    for t in &topics {
        parse_profiles_str(&t.offered_qos_profiles)
            .map_err(|e| format!("topic {}: {e}", t.name))?;
    }
    Ok(Checked {
        content: SplitContent {
            rel,
            topics: topics.clone(),
            schema_version,
            count: count as u64,
            start_ns: start.unwrap_or(NO_START),
            end_ns: end.unwrap_or(NO_START),
            per_topic_id,
        },
        topics,
        definitions,
    })
}

fn raw_topics(conn: &Connection) -> rusqlite::Result<Vec<RecoveredTopic>> {
    let cols: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('topics')")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let has_hash = cols.iter().any(|c| c == "type_description_hash");
    let has_qos = cols.iter().any(|c| c == "offered_qos_profiles");
    // Each value, the row count and the total bounded as by the reader (sqlguard).
    let sql = format!(
        "SELECT id, {}, {}, {}, {}, {} FROM topics ORDER BY id LIMIT {}",
        bounded("name", MAX_TOPIC_FIELD),
        bounded("type", MAX_TOPIC_FIELD),
        bounded("serialization_format", MAX_TOPIC_FIELD),
        if has_qos {
            bounded("offered_qos_profiles", MAX_TOPIC_TEXT)
        } else {
            "''".into()
        },
        if has_hash {
            bounded("type_description_hash", MAX_TOPIC_FIELD)
        } else {
            "NULL".into()
        },
        MAX_TOPICS + 1,
    );
    let mut st = conn.prepare(&sql)?;
    let rows = st.query_map([], |r| {
        Ok(RecoveredTopic {
            id: r.get(0)?,
            name: r.get(1)?,
            type_name: r.get(2)?,
            serialization_format: r.get(3)?,
            offered_qos_profiles: r.get(4)?,
            type_description_hash: r.get(5)?,
        })
    })?;
    let topics: Vec<RecoveredTopic> = rows.collect::<rusqlite::Result<_>>()?;
    let mut total = 0;
    let too_long = topics.len() > MAX_TOPICS
        || topics.iter().any(|t| {
            [
                (&t.name, MAX_TOPIC_FIELD),
                (&t.type_name, MAX_TOPIC_FIELD),
                (&t.serialization_format, MAX_TOPIC_FIELD),
                (&t.offered_qos_profiles, MAX_TOPIC_TEXT),
                (
                    t.type_description_hash.as_ref().unwrap_or(&String::new()),
                    MAX_TOPIC_FIELD,
                ),
            ]
            .into_iter()
            .any(|(v, max)| check_len(Path::new(""), "", v, max, &mut total).is_err())
        });
    if too_long {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_TOOBIG),
            Some("topics hold values longer than a rosbag2 split can (hostile?)".into()),
        ));
    }
    Ok(topics)
}

fn raw_definitions(conn: &Connection) -> rusqlite::Result<Vec<RecoveredDefinition>> {
    let mut st = conn.prepare(&format!(
        "SELECT id, {}, {}, {}, {} FROM message_definitions ORDER BY id LIMIT {MAX_TOPICS}",
        bounded("topic_type", MAX_TOPIC_FIELD),
        bounded("encoding", MAX_TOPIC_FIELD),
        bounded("encoded_message_definition", MAX_TOPIC_TEXT),
        bounded("type_description_hash", MAX_TOPIC_FIELD),
    ))?;
    let rows = st.query_map([], |r| {
        Ok(RecoveredDefinition {
            id: r.get(0)?,
            topic_type: r.get(1)?,
            encoding: r.get(2)?,
            encoded_message_definition: r.get(3)?,
            type_description_hash: r.get(4)?,
        })
    })?;
    rows.collect()
}

fn schema_version(conn: &Connection) -> Option<i64> {
    conn.query_row("SELECT schema_version FROM schema", [], |r| r.get(0))
        .optional()
        .ok()
        .flatten()
}

/// The message count the split's own `metadata` table recorded at close (Jazzy), if any.
fn split_metadata_count(conn: &Connection) -> Option<u64> {
    let text: String = conn
        .query_row(
            "SELECT metadata FROM metadata ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .ok()?;
    count_from_metadata_text(&text)
}

fn count_from_metadata_text(text: &str) -> Option<u64> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    v.get("message_count")?.as_u64().filter(|n| *n > 0)
}

// ---- side files ---------------------------------------------------------------------

fn side_path(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Bring `-wal` / `-journal` into the split the way SQLite itself would, and say what was
/// done. Failure to do so is not fatal: the split then goes through the normal check.
fn settle_side_files(path: &Path) -> Result<Vec<String>, BagError> {
    let wal = side_path(path, "-wal");
    let journal = side_path(path, "-journal");
    let shm = side_path(path, "-shm");
    let mut done = Vec::new();
    let had_wal = wal.exists();
    let had_journal = journal.exists();
    if had_wal || had_journal {
        let r = (|| -> rusqlite::Result<()> {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            // The first read replays a WAL's committed frames or rolls back a hot journal.
            conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })?;
            if had_wal {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                conn.query_row("PRAGMA journal_mode=DELETE", [], |_| Ok(()))?;
            }
            conn.close().map_err(|(_, e)| e)
        })();
        match r {
            Ok(()) => {
                if had_wal {
                    done.push("-wal checkpointed into the split".to_string());
                }
                if had_journal {
                    done.push("hot -journal rolled back by SQLite".to_string());
                }
            }
            Err(e) => done.push(format!("side files could not be applied ({e})")),
        }
    }
    // Whatever SQLite left behind belongs to a finished connection: a WAL it could not
    // apply is unusable without its file, and a journal it did not treat as hot is stale.
    for (p, what) in [(&wal, "-wal"), (&journal, "-journal"), (&shm, "-shm")] {
        if p.exists() {
            fs::remove_file(p).map_err(BagError::io(p))?;
            done.push(format!("stale {what} removed"));
        }
    }
    Ok(done)
}

// ---- salvage ------------------------------------------------------------------------

struct Fallback<'a> {
    topics: &'a [RecoveredTopic],
    definitions: &'a [RecoveredDefinition],
    flavour: Flavour,
    yaml_count: Option<u64>,
    /// The split is the bag's newest, so a recorder may have had it open: its count in
    /// metadata.yaml (if any) is then only a lower bound.
    may_have_been_open: bool,
}

struct Salvaged {
    content: SplitContent,
    method: SplitMethod,
    expected: u64,
    basis: LossBasis,
    /// Why nothing bounds the loss (then `expected` is only a lower bound).
    unknown: Option<String>,
}

/// A fresh salvage file name, unique per process and call: `<split>.<pid>-<n>.salvage.tmp`.
fn tmp_path(work: &Path) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    side_path(
        work,
        &format!(".{}-{seq}{SALVAGE_TMP_SUFFIX}", std::process::id()),
    )
}

/// Removes a salvage file on every path that does not rename it into place (errors and
/// dry runs included), so a failed reindex never leaves one behind.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        match fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("{}: cannot remove: {e}", self.0.display()),
        }
    }
}

/// Under the bag lock, temp files of this bag belong to no live process: remove salvage
/// files, metadata.yaml temp files and partial `.zstd` files left by a reindex or writer that
/// died.
fn remove_stale_temp_files(bag: &Path) -> Result<(), BagError> {
    let Ok(entries) = fs::read_dir(bag) else {
        return Ok(());
    };
    let mut removed = false;
    for e in entries.flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let stale = name.ends_with(SALVAGE_TMP_SUFFIX)
            || (name.starts_with(&format!(".{METADATA_FILE}")) && name.ends_with(".tmp"))
            // A compression cut short; its `.db3` is still there (removed only after the
            // `.zstd` is complete and listed).
            || (name.starts_with('.') && name.ends_with(super::compressed::PARTIAL_SUFFIX));
        if stale && e.file_type().is_ok_and(|t| t.is_file()) {
            let p = e.path();
            fs::remove_file(&p).map_err(BagError::io(&p))?;
            log::info!("{}: removed a stale temp file", p.display());
            removed = true;
        }
    }
    if removed {
        sync_dir(bag)?;
    }
    Ok(())
}

/// fsync splits reindex kept as they were: after a crash their last writes may still be
/// only in the page cache, and the lock marker must not go before they are durable.
fn sync_intact_splits(bag: &Path, reports: &[SplitReport]) -> Result<(), BagError> {
    for r in reports.iter().filter(|r| r.method == SplitMethod::Intact) {
        let p = bag.join(&r.file);
        fs::File::open(&p)
            .and_then(|f| f.sync_all())
            .map_err(BagError::io(&p))?;
    }
    Ok(())
}

/// Copy every readable row of `src` into a fresh split at `dst`.
fn salvage(src: &Path, dst: &Path, rel: &str, fb: &Fallback) -> Result<Salvaged, BagError> {
    // What SQLite can still read.
    let mut conn = Connection::open_with_flags(
        src,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .ok();
    // Bounded like every reader's connection; recharged for each range below.
    let sql_budget = conn
        .as_mut()
        .and_then(|c| super::sqlguard::limit(c, src, true).ok());
    let sql_topics = conn.as_ref().and_then(|c| raw_topics(c).ok());
    let sql_defs = conn.as_ref().and_then(|c| raw_definitions(c).ok());
    let sql_schema = conn.as_ref().and_then(schema_version);
    let sql_meta_count = conn.as_ref().and_then(split_metadata_count);
    let max_rowid: Option<i64> = conn.as_ref().and_then(|c| {
        c.query_row("SELECT max(id) FROM messages", [], |r| r.get(0))
            .ok()
            .flatten()
    });

    let _ = fs::remove_file(dst);
    let out = Connection::open(dst).map_err(BagError::sqlite(dst))?;
    out.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;")
        .map_err(BagError::sqlite(dst))?;
    let mut writer = SalvageWriter::new(&out, dst)?;

    // SQLite ranges.
    let mut sqlite_rows = 0u64;
    let mut skipped = true;
    if let (Some(c), Some(max)) = (&conn, max_rowid) {
        skipped = false;
        // Damaged files can claim absurd rowids; the work is bounded by the file's size, and
        // whatever the budget does not reach is left to the page walk.
        let file_len = fs::metadata(src).map(|m| m.len()).unwrap_or(0);
        let mut budget = 64 + 4 * (file_len / 512);
        let mut lo = i64::MIN;
        loop {
            // Seek to the next row that exists, through the b-tree, so gaps cost nothing.
            let next = c.query_row("SELECT min(id) FROM messages WHERE id >= ?1", [lo], |r| {
                r.get::<_, Option<i64>>(0)
            });
            match next {
                Ok(Some(n)) => lo = n,
                Ok(None) => break,
                Err(_) => skipped = true, // cannot seek here: step over the range
            }
            if lo > max {
                break;
            }
            let hi = lo.saturating_add(SALVAGE_RANGE - 1).min(max);
            if let Some(b) = &sql_budget {
                b.recharge(c, src);
            }
            skipped |= copy_range(c, lo, hi, &mut writer, &mut budget)?;
            if budget == 0 {
                skipped = true;
                break;
            }
            match hi.checked_add(1) {
                Some(n) => lo = n,
                None => break,
            }
        }
        sqlite_rows = writer.rows;
    } else if conn.is_some() && max_rowid.is_none() && sql_topics.is_some() {
        // `max(id)` answered NULL: an empty, readable messages table.
        let empty = conn
            .as_ref()
            .and_then(|c| {
                c.query_row("SELECT count(*) FROM messages", [], |r| r.get::<_, i64>(0))
                    .ok()
            })
            .is_some_and(|n| n == 0);
        skipped = !empty;
    }

    // The page walk, for what SQLite could not read.
    let mut walk_max_id = 0i64;
    let mut walked = None;
    if skipped || sql_topics.is_none() {
        let seen = writer.ids.clone();
        let mut err = None;
        let w = pagewalk::walk(src, |m| {
            walk_max_id = walk_max_id.max(m.id);
            if !seen.contains(&m.id) {
                if let Err(e) = writer.insert(m.id, m.topic_id, m.timestamp, &m.data) {
                    err = Some(e);
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
        if let Some(e) = err {
            return Err(e);
        }
        walked = w.ok();
    }

    let walk_meta_count = walked.as_ref().and_then(|w| {
        w.metadata
            .iter()
            .rev()
            .find_map(|m| count_from_metadata_text(&m.metadata))
    });
    let topics = sql_topics
        .filter(|t| !t.is_empty())
        .or_else(|| {
            walked
                .as_ref()
                .map(|w| w.topics.clone())
                .filter(|t| !t.is_empty())
        })
        .unwrap_or_else(|| fb.topics.to_vec());
    // A topic row can come back with a torn QoS text; readers refuse those, so take the
    // profiles another split has for the same topic, or none.
    let topics: Vec<RecoveredTopic> = topics
        .into_iter()
        .map(|mut t| {
            if parse_profiles_str(&t.offered_qos_profiles).is_err() {
                t.offered_qos_profiles = fb
                    .topics
                    .iter()
                    .find(|k| k.name == t.name)
                    .map(|k| k.offered_qos_profiles.clone())
                    .filter(|q| parse_profiles_str(q).is_ok())
                    .unwrap_or_default();
            }
            t
        })
        .collect();
    let definitions = sql_defs
        .filter(|d| !d.is_empty())
        .or_else(|| {
            walked
                .as_ref()
                .map(|w| w.definitions.clone())
                .filter(|d| !d.is_empty())
        })
        .unwrap_or_else(|| fb.definitions.to_vec());
    let schema = sql_schema
        .or_else(|| walked.as_ref().and_then(|w| w.report.schema_version))
        .filter(|v| (3..=4).contains(v));
    let flavour = schema.map(flavour_of_schema).unwrap_or(fb.flavour);

    let content = writer.finish(rel, flavour, &topics, &definitions)?;
    drop(out);
    fs::File::open(dst)
        .and_then(|f| f.sync_all())
        .map_err(BagError::io(dst))?;

    let method = match (sqlite_rows > 0 || !skipped, walked.is_some()) {
        (_, false) => SplitMethod::Sqlite,
        (true, true) => SplitMethod::SqlitePagewalk,
        (false, true) => SplitMethod::Pagewalk,
    };
    // The best estimate of what the file held: the largest of the counts we can see.
    let mut expected = (content.count, LossBasis::None);
    let candidates = [
        (
            sql_meta_count.or(walk_meta_count),
            LossBasis::SplitMetadataRow,
        ),
        (fb.yaml_count, LossBasis::MetadataYaml),
        (
            Some(max_rowid.unwrap_or(0).max(walk_max_id).max(0) as u64),
            LossBasis::MaxRowid,
        ),
    ];
    for (n, basis) in candidates {
        if let Some(n) = n {
            if n > expected.0 {
                expected = (n, basis);
            }
        }
    }
    if expected.1 == LossBasis::None {
        expected.1 = LossBasis::MaxRowid;
    }
    // Those counts bound the loss only when one of them is a true total: the count the
    // split recorded when it was closed, metadata.yaml's count for a split that was closed,
    // or the largest rowid answered by SQLite's b-tree (rows are numbered 1, 2, ... and
    // never deleted, and the b-tree reached its rightmost leaf). Otherwise the largest rowid
    // the page walk saw is only a lower bound when part of the file is missing or damaged:
    // the newest rows of an open split are at its end, exactly what a torn write loses.
    let total_known = sql_meta_count.or(walk_meta_count).is_some()
        || (fb.yaml_count.is_some() && !fb.may_have_been_open)
        || max_rowid.is_some();
    let unknown = if total_known {
        None
    } else {
        missing_part(src, walked.as_ref().map(|w| &w.report)).map(|what| {
            format!(
                "{what}, and no total was recorded for this split (it was {}), so rows in the \
                 missing part cannot be counted",
                if fb.may_have_been_open {
                    "the newest split, possibly still open"
                } else {
                    "not counted in metadata.yaml"
                }
            )
        })
    };
    Ok(Salvaged {
        content: SplitContent {
            schema_version: Some(flavour.schema_version()),
            ..content
        },
        method,
        expected: expected.0,
        basis: expected.1,
        unknown,
    })
}

/// What part of `path` is missing or damaged, as far as its header and the page walk tell,
/// or `None` when the file is whole.
fn missing_part(path: &Path, walk: Option<&pagewalk::WalkReport>) -> Option<String> {
    use std::io::Read;
    let len = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut h = [0u8; 100];
    let header_ok = fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut h))
        .is_ok()
        && h.starts_with(b"SQLite format 3\0");
    if !header_ok {
        return Some(format!(
            "the file's database header is missing or damaged ({len} bytes left)"
        ));
    }
    let page_size = match u16::from_be_bytes([h[16], h[17]]) {
        1 => 65536u64,
        n => u64::from(n),
    };
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Some("the file's database header is damaged (page size)".into());
    }
    // The in-header page count is valid when the change counter matches the
    // version-valid-for number (SQLite >= 3.7.0 keeps both).
    let header_pages = u32::from_be_bytes([h[28], h[29], h[30], h[31]]);
    let valid = h[24..28] == h[92..96] && header_pages > 0;
    let have = len / page_size;
    if valid && have < u64::from(header_pages) {
        return Some(format!(
            "the file is truncated ({have} of {header_pages} pages present)"
        ));
    }
    if !len.is_multiple_of(page_size) {
        return Some(format!(
            "the file is truncated ({} bytes after its last whole page)",
            len % page_size
        ));
    }
    let w = walk?;
    if w.pages_zero > 0 {
        return Some(format!("{} pages are all zeros", w.pages_zero));
    }
    if w.tree_links_broken > 0 {
        return Some(format!(
            "{} b-tree links lead to missing or invalid pages",
            w.tree_links_broken
        ));
    }
    if w.pages_unaccounted > 0 {
        return Some(format!("{} pages are unreadable", w.pages_unaccounted));
    }
    None
}

/// Whether a `.db3` file is something reindex may rewrite.
enum Recognition {
    /// Has rosbag2 tables, or the page walk finds rosbag2 rows in it.
    Rosbag2,
    /// Holds no data at all: empty, all zeros (a split created but never written before a
    /// power cut), or a database without tables. Rebuilt as an empty split.
    Blank,
    /// Starts as a SQLite file but cannot be read as one, and holds no rosbag2 row the page
    /// walk can find: a split torn inside its first page, or another program's damaged
    /// database. The caller decides which from the bag's listing.
    TornSqlite(String),
    /// Anything else: another program's file. The reason, for the report.
    Foreign(String),
}

/// The file begins with SQLite's 16-byte magic string.
fn starts_as_sqlite(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 16];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"SQLite format 3\0")
}

/// Look at a file without writing it or its side files: SQLite opened `immutable` (no
/// locks, no journal or WAL looked at), then the page walk, which only maps it read-only.
fn recognise(path: &Path) -> Recognition {
    const ROSBAG2_TABLES: &str =
        "('messages', 'topics', 'schema', 'metadata', 'message_definitions')";
    let tables = Connection::open_with_flags(
        super::fsguard::sqlite_ro_uri(path, true),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| {
        c.query_row(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE name IN {ROSBAG2_TABLES}) \
                 FROM sqlite_master WHERE type = 'table'"
            ),
            [],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
    });
    match tables {
        Ok((_, ours)) if ours > 0 => return Recognition::Rosbag2,
        Ok((0, _)) => return Recognition::Blank,
        _ => {}
    }
    // Not readable as a database with our tables: all zeros, or rows of ours in its pages?
    let blank = (|| -> std::io::Result<bool> {
        use std::io::Read;
        let mut f = fs::File::open(path)?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match f.read(&mut buf)? {
                0 => return Ok(true),
                n if buf[..n].iter().any(|&x| x != 0) => return Ok(false),
                _ => {}
            }
        }
    })()
    .unwrap_or(false);
    if blank {
        return Recognition::Blank;
    }
    match pagewalk::walk(path, |_| ControlFlow::Break(())) {
        Ok(w)
            if w.report.schema_page_readable
                || !w.topics.is_empty()
                || w.report.messages_recovered > 0
                || w.report.stopped_early =>
        {
            Recognition::Rosbag2
        }
        _ => match tables {
            Ok(_) => Recognition::Foreign(
                "a SQLite database without rosbag2 tables or rows: not a rosbag2 split".into(),
            ),
            Err(_) if starts_as_sqlite(path) => Recognition::TornSqlite(
                "a SQLite file that cannot be read as a database and holds no rosbag2 rows: \
                 not a rosbag2 split"
                    .into(),
            ),
            Err(_) => Recognition::Foreign(
                "neither a rosbag2 database nor a file holding rosbag2 rows: not a rosbag2 split"
                    .into(),
            ),
        },
    }
}

/// (id, topic_id, timestamp, data) of a `messages` row.
type RawRow = (i64, i64, i64, Vec<u8>);

/// Copy rows `lo..=hi`; on failure bisect, skipping single rows that fail. Each query costs
/// one unit of `budget`. Returns true if anything was skipped.
fn copy_range(
    c: &Connection,
    lo: i64,
    hi: i64,
    w: &mut SalvageWriter,
    budget: &mut u64,
) -> Result<bool, BagError> {
    if *budget == 0 {
        return Ok(true);
    }
    *budget -= 1;
    let read = || -> rusqlite::Result<Vec<RawRow>> {
        let mut st = c.prepare_cached(
            "SELECT id, topic_id, timestamp, data FROM messages WHERE id BETWEEN ?1 AND ?2",
        )?;
        let rows = st.query_map(params![lo, hi], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
        rows.collect()
    };
    match read() {
        Ok(rows) => {
            for (id, topic, ts, data) in rows {
                w.insert(id, topic, ts, &data)?;
            }
            Ok(false)
        }
        Err(_) if lo == hi => Ok(true),
        Err(_) => {
            let mid = lo + (hi - lo) / 2;
            let a = copy_range(c, lo, mid, w, budget)?;
            let b = copy_range(c, mid + 1, hi, w, budget)?;
            Ok(a || b)
        }
    }
}

/// Collects salvaged rows into the fresh file: messages go in as they come (one
/// transaction), tables and indexes are completed by `finish`.
struct SalvageWriter<'c> {
    conn: &'c Connection,
    path: PathBuf,
    ids: HashSet<i64>,
    rows: u64,
}

impl<'c> SalvageWriter<'c> {
    fn new(conn: &'c Connection, path: &Path) -> Result<Self, BagError> {
        // Messages first into a plain table; the real tables need the flavour, known later.
        conn.execute_batch(
            "CREATE TEMP TABLE salvaged(id INTEGER PRIMARY KEY, topic_id INTEGER NOT NULL, \
             timestamp INTEGER NOT NULL, data BLOB NOT NULL); BEGIN;",
        )
        .map_err(BagError::sqlite(path))?;
        Ok(SalvageWriter {
            conn,
            path: path.to_path_buf(),
            ids: HashSet::new(),
            rows: 0,
        })
    }

    fn insert(&mut self, id: i64, topic: i64, ts: i64, data: &[u8]) -> Result<(), BagError> {
        if !self.ids.insert(id) {
            return Ok(());
        }
        self.conn
            .prepare_cached("INSERT INTO temp.salvaged VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![id, topic, ts, data]))
            .map_err(BagError::sqlite(&self.path))?;
        self.rows += 1;
        Ok(())
    }

    fn finish(
        self,
        rel: &str,
        flavour: Flavour,
        topics: &[RecoveredTopic],
        definitions: &[RecoveredDefinition],
    ) -> Result<SplitContent, BagError> {
        let c = self.conn;
        let err = BagError::sqlite(&self.path);
        let r = (|| -> rusqlite::Result<SplitContent> {
            create_tables(c, flavour)?;
            for t in topics {
                match flavour {
                    Flavour::Humble => c.execute(
                        "INSERT INTO topics (id, name, type, serialization_format, offered_qos_profiles) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![t.id, t.name, t.type_name, t.serialization_format, t.offered_qos_profiles],
                    )?,
                    Flavour::Jazzy => c.execute(
                        "INSERT INTO topics (id, name, type, serialization_format, offered_qos_profiles, type_description_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        params![t.id, t.name, t.type_name, t.serialization_format, t.offered_qos_profiles, t.type_description_hash.clone().unwrap_or_default()],
                    )?,
                };
            }
            if flavour == Flavour::Jazzy {
                for d in definitions {
                    c.execute(
                        "INSERT INTO message_definitions (topic_type, encoding, encoded_message_definition, type_description_hash) VALUES (?1, ?2, ?3, ?4)",
                        params![d.topic_type, d.encoding, d.encoded_message_definition, d.type_description_hash],
                    )?;
                }
            }
            // Rows naming a topic nobody knows cannot be read back, and a row stamped before
            // 1970 is damage (metadata.yaml could not hold its start): both count as lost.
            c.execute(
                "INSERT INTO messages (id, topic_id, timestamp, data) \
                 SELECT id, topic_id, timestamp, data FROM temp.salvaged \
                 WHERE topic_id IN (SELECT id FROM topics) AND timestamp >= 0 ORDER BY id",
                [],
            )?;
            let (count, start, end): (i64, Option<i64>, Option<i64>) = c.query_row(
                "SELECT count(*), min(timestamp), max(timestamp) FROM messages",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let per_topic_id: BTreeMap<i64, u64> = c
                .prepare("SELECT topic_id, count(*) FROM messages GROUP BY topic_id")?
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
                })?
                .collect::<Result<_, _>>()?;
            let content = SplitContent {
                rel: rel.to_string(),
                topics: topics.to_vec(),
                schema_version: Some(flavour.schema_version()),
                count: count as u64,
                start_ns: start.unwrap_or(NO_START),
                end_ns: end.unwrap_or(NO_START),
                per_topic_id,
            };
            if flavour == Flavour::Jazzy {
                let text = build_metadata(flavour, std::slice::from_ref(&content), None)
                    .to_table_yaml(flavour);
                c.execute(
                    "INSERT INTO metadata (metadata_version, metadata) VALUES (?1, ?2)",
                    params![flavour.metadata_version(), text],
                )?;
            }
            c.execute_batch("DROP TABLE temp.salvaged; COMMIT;")?;
            Ok(content)
        })();
        r.map_err(err)
    }
}

/// Put the salvaged file in place of the damaged one. `<name>.db3` names a complete file at
/// every instant: the damaged one is hard-linked aside first, then replaced by rename.
fn swap_in(original: &Path, tmp: &Path, discard: bool) -> Result<Option<String>, BagError> {
    let dir = original.parent().unwrap_or(Path::new("."));
    let kept = if discard {
        None
    } else {
        let damaged = side_path(original, DAMAGED_SUFFIX);
        let _ = fs::remove_file(&damaged);
        if fs::hard_link(original, &damaged).is_err() {
            // Filesystems without hard links (FAT on removable media): a copy, made durable.
            fs::copy(original, &damaged)
                .and_then(|_| fs::File::open(&damaged)?.sync_all())
                .map_err(BagError::io(&damaged))?;
        }
        Some(file_name(&damaged))
    };
    fs::rename(tmp, original).map_err(BagError::io(original))?;
    sync_dir(dir)?;
    Ok(kept)
}

// ---- metadata -----------------------------------------------------------------------

fn build_metadata(
    flavour: Flavour,
    contents: &[SplitContent],
    old: Option<&BagMetadata>,
) -> BagMetadata {
    let mut m = BagMetadata::empty(flavour);
    let mut topics: Vec<RecoveredTopic> = Vec::new();
    for c in contents {
        merge_topics(&mut topics, &c.topics);
    }
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for c in contents {
        for (id, n) in &c.per_topic_id {
            if let Some(t) = c.topics.iter().find(|t| t.id == *id) {
                *counts.entry(t.name.clone()).or_default() += n;
            }
        }
    }
    m.topics = topics
        .iter()
        .map(|t| TopicWithCount {
            topic: TopicInfo {
                name: t.name.clone(),
                type_name: t.type_name.clone(),
                serialization_format: t.serialization_format.clone(),
                offered_qos_profiles: parse_profiles_str(&t.offered_qos_profiles)
                    .unwrap_or_default(),
                type_description_hash: t.type_description_hash.clone().unwrap_or_default(),
            },
            message_count: counts.get(&t.name).copied().unwrap_or(0),
        })
        .collect();
    m.files = contents
        .iter()
        .map(|c| FileInfo {
            // rosbag2's file compression names the `.db3` here, the `.db3.zstd` only in
            // `relative_file_paths` (below).
            path: c
                .rel
                .strip_suffix(super::compressed::ZSTD_SUFFIX)
                .unwrap_or(&c.rel)
                .to_string(),
            starting_time_ns: c.start_ns,
            duration_ns: duration(c),
            message_count: c.count,
        })
        .collect();
    let with = m.files.iter().filter(|f| f.message_count > 0);
    if let (Some(s), Some(e)) = (
        with.clone().map(|f| f.starting_time_ns).min(),
        with.map(|f| f.starting_time_ns + f.duration_ns).max(),
    ) {
        m.starting_time_ns = s;
        m.duration_ns = e - s;
    }
    m.message_count = m.files.iter().map(|f| f.message_count).sum();
    m.relative_file_paths = contents.iter().map(|c| c.rel.clone()).collect();
    if contents.iter().any(|c| c.rel.ends_with(".db3.zstd")) {
        // rosbag2 reads a bag in file mode only with these set.
        m.compression_format = super::compressed::ZSTD_FORMAT.into();
        m.compression_mode = "FILE".into();
    }
    if let Some(old) = old {
        m.custom_data = old.custom_data.clone();
        // Message mode is not visible in the file names: only the old metadata.yaml says the
        // rows hold zstd frames, and without it the bag would read back compressed.
        if super::compressed::is_message_mode(&old.compression_mode) {
            m.compression_format = old.compression_format.clone();
            m.compression_mode = old.compression_mode.clone();
        }
    }
    m
}

fn merge_topics(into: &mut Vec<RecoveredTopic>, from: &[RecoveredTopic]) {
    for t in from {
        if !into.iter().any(|k| k.name == t.name) {
            into.push(t.clone());
        }
    }
}

fn topic_from_info(id: i64, t: &TopicInfo) -> RecoveredTopic {
    RecoveredTopic {
        id,
        name: t.name.clone(),
        type_name: t.type_name.clone(),
        serialization_format: t.serialization_format.clone(),
        offered_qos_profiles: super::qos::profiles_to_yaml_string(
            &t.offered_qos_profiles,
            super::qos::PolicyStyle::Integer,
        ),
        type_description_hash: Some(t.type_description_hash.clone()),
    }
}

fn duration(c: &SplitContent) -> i64 {
    if c.count > 0 {
        c.end_ns.saturating_sub(c.start_ns)
    } else {
        0
    }
}

fn flavour_of_schema(v: i64) -> Flavour {
    if v >= 4 {
        Flavour::Jazzy
    } else {
        Flavour::Humble
    }
}

trait MaxWith {
    fn max_with(self, other: Option<Flavour>) -> Flavour;
}
impl MaxWith for Flavour {
    /// Any Jazzy split makes the bag Jazzy (the writer uses one flavour per bag).
    fn max_with(self, other: Option<Flavour>) -> Flavour {
        if self == Flavour::Jazzy || other == Some(Flavour::Jazzy) {
            Flavour::Jazzy
        } else {
            Flavour::Humble
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

/// A temporary directory for dry runs, removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(bag: &Path) -> Result<Self, BagError> {
        let dir = std::env::temp_dir().join(format!(
            "ringbag-reindex-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        fs::create_dir_all(&dir).map_err(BagError::io(&dir))?;
        let _ = bag;
        Ok(Scratch { dir })
    }

    /// Copy a split and its side files into the scratch directory.
    fn copy_split(&self, original: &Path) -> Result<PathBuf, BagError> {
        let name = file_name(original);
        let dst = self.dir.join(&name);
        fs::copy(original, &dst).map_err(BagError::io(original))?;
        for suffix in ["-wal", "-journal", "-shm"] {
            let side = side_path(original, suffix);
            if side.exists() {
                let to = side_path(&dst, suffix);
                fs::copy(&side, &to).map_err(BagError::io(&side))?;
            }
        }
        Ok(dst)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
