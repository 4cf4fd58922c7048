//! Raw arguments → validated settings. Everything a user can get wrong is caught here,
//! before any file is created, with a message that names the flag.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::args::{RecordArgs, SourceKind, SyntheticRate};
use crate::bag::writer::WriterOptions;
use crate::bag::Flavour;
use crate::pipeline::PipelineConfig;
use crate::record::{RecordSettings, SourceSettings};
use crate::retention::RetentionPolicy;
use crate::snapshot::settings::{snapshot_settings, unrecorded_policy_topics, SnapshotOptions};
use crate::source::generator::{GeneratorConfig, Pace};
use crate::units::{parse_bytes, parse_duration_ns};

/// rosbag2's smallest split size (21 pages of 4 KiB).
pub const MIN_MAX_BAG_SIZE: u64 = 86016;

fn flag<T>(name: &str, r: Result<T, String>) -> Result<T, String> {
    r.map_err(|e| format!("{name}: {e}"))
}

pub fn default_output_name() -> PathBuf {
    PathBuf::from(
        chrono::Local::now()
            .format("rosbag2_%Y_%m_%d-%H_%M_%S")
            .to_string(),
    )
}

pub fn record_settings(a: &RecordArgs) -> Result<RecordSettings, String> {
    if a.storage != "sqlite3" {
        return Err(format!(
            "--storage {}: not supported; ringbag writes sqlite3 bags only",
            a.storage
        ));
    }
    let max_cache_size = flag("--max-cache-size", parse_bytes(&a.max_cache_size))?;
    if max_cache_size == 0 {
        return Err("--max-cache-size must be greater than 0".into());
    }
    let max_bag_size = flag("--max-bag-size", parse_bytes(&a.max_bag_size))?;
    if max_bag_size > 0 && max_bag_size < MIN_MAX_BAG_SIZE {
        return Err(format!(
            "--max-bag-size {max_bag_size}: below the minimum of {MIN_MAX_BAG_SIZE} bytes (as in rosbag2)"
        ));
    }
    let max_bag_duration_ns = flag("--max-bag-duration", parse_duration_ns(&a.max_bag_duration))?;
    let mut custom_data = BTreeMap::new();
    for kv in &a.custom_data {
        let (k, v) = kv
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("--custom-data {kv}: expected KEY=VALUE"))?;
        custom_data.insert(k.to_string(), v.to_string());
    }
    let source_kind = a.source.unwrap_or(if cfg!(feature = "ros") {
        SourceKind::Ros
    } else {
        SourceKind::Synthetic
    });
    let source = match source_kind {
        SourceKind::Synthetic => SourceSettings::Synthetic(GeneratorConfig {
            profile: a.synthetic_profile,
            pace: match a.synthetic_rate {
                SyntheticRate::Realtime => Pace::Realtime,
                SyntheticRate::Max => Pace::Max,
            },
            count: a.synthetic_count,
            topics: synthetic_topics(a)?,
        }),
        SourceKind::Ros => ros_source(a)?,
    };
    let clock = a.clock.settings();
    clock.validate().map_err(|e| e.to_string())?;
    let output = a.output.clone().unwrap_or_else(default_output_name);
    check_output_path(&output)?;
    let mut retention = retention_policy(a, max_bag_size, max_bag_duration_ns)?;
    let pipeline = PipelineConfig::for_limits(max_cache_size, max_bag_size, &retention);
    // Without a floor flag, a default floor keeps `record` from filling the disk. Set after
    // the pipeline's batch sizes, which stay as they were: the floor is checked before every
    // batch whatever its size, and benchmarks keep their batches.
    let default_free_floor = (a.min_free_space.is_none() && a.min_free_space_percent.is_none())
        .then(|| default_free_floor(&output))
        .flatten();
    if default_free_floor.is_some() {
        retention.min_free_space = default_free_floor;
    }
    let snapshot = snapshot_settings(
        &SnapshotOptions {
            size: a.snapshot_size.as_deref(),
            duration: a.snapshot_duration.as_deref(),
            file: a.snapshot_file.as_deref(),
            topics: &a.snapshot_topics,
            regex: a.snapshot_regex.as_deref(),
            rates: &a.topic_rate,
            trigger_topic: a.trigger_topic.as_deref(),
            control_socket: a.control_socket.as_deref(),
        },
        &crate::snapshot::default_ring_dir(),
        &recording_root(&output),
        "--",
    )?;
    // A recorder already listening there is refused now, before the status file, the ring
    // or the bag exist (the bind refuses it again, should one start meanwhile).
    if let Some(socket) = snapshot
        .ring
        .as_ref()
        .and_then(|r| r.control_socket.as_deref())
    {
        crate::snapshot::control::refuse_if_listening(socket)
            .map_err(|e| format!("--control-socket: {e}"))?;
    }
    // Before the status file is first written: its rename would replace the ring or the
    // socket at the same path.
    if let Some(ring) = &snapshot.ring {
        let file = ring.ring_file(&recording_root(&output));
        let mut named = vec![("--snapshot-file", file.as_path())];
        if let Some(socket) = ring.control_socket.as_deref() {
            named.push(("--control-socket", socket));
        }
        if let Some(status) = a.status_file.as_deref() {
            named.insert(0, ("--status-file", status));
        }
        if let Some((x, y)) = crate::config::shared_path(&named) {
            let path = named
                .iter()
                .find(|(k, _)| *k == x)
                .map_or(Path::new(""), |n| n.1);
            return Err(format!(
                "{x}: {}: the same file as {y}; each needs a path of its own",
                path.display()
            ));
        }
    }
    for line in unrecorded_policy_topics(&selection(a), &snapshot.policy, "--") {
        log::warn!("{line}");
    }
    Ok(RecordSettings {
        output,
        writer: WriterOptions {
            flavour: a.bag_format.unwrap_or_else(Flavour::from_env),
            preset: a.storage_preset_profile,
            max_bag_size,
            max_bag_duration_ns,
            custom_data,
        },
        pipeline,
        retention,
        source,
        clock,
        recover: a.recover,
        status_file: a.status_file.clone(),
        default_free_floor,
        snapshot,
        upload_retention: Default::default(),
    })
}

/// The default free-space floor for a bag at `output`, from the size of the partition of its
/// nearest existing ancestor (the bag's directories do not exist yet). None when that cannot
/// be read: the bag's creation then reports the problem.
fn default_free_floor(output: &Path) -> Option<u64> {
    let base = output
        .ancestors()
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find(|a| a.symlink_metadata().is_ok())?;
    let st = nix::sys::statvfs::statvfs(base).ok()?;
    #[allow(clippy::unnecessary_cast)] // fsblkcnt_t is 32-bit on some targets
    let total = (st.blocks() as u64).saturating_mul(st.fragment_size() as u64);
    (total > 0).then(|| crate::retention::default_min_free_space(total))
}

/// The recording root of a bag: its parent directory (`.` for a bare name).
pub fn recording_root(output: &Path) -> PathBuf {
    output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// The output path must be a new directory that this process can create: checked before the
/// clock, recovery or anything else touches the disk, so a bad path is bad input (exit 2)
/// with one line naming it. What only the attempt can tell (a pseudo filesystem such as
/// /proc accepts the permission check) is classified when `BagWriter::create` fails.
pub fn check_output_path(output: &Path) -> Result<(), String> {
    use crate::bag::BagError;
    let shown = output.display();
    if output.as_os_str().is_empty() {
        return Err("--output: empty path".into());
    }
    match output.file_name() {
        Some(name) if name.to_str().is_none() => {
            return Err(format!(
                "{shown}: the bag name is not valid UTF-8 (rosbag2 stores file names as text)"
            ))
        }
        _ => {}
    }
    match output.symlink_metadata() {
        Ok(m) if m.file_type().is_symlink() && !output.exists() => {
            return Err(format!(
                "{shown}: is a symbolic link to a missing target; choose another output"
            ))
        }
        Ok(_) => {
            return Err(BagError::AlreadyExists {
                path: output.to_path_buf(),
            }
            .to_string())
        }
        Err(_) => {} // absent (or unreachable: the ancestor walk below says why)
    }
    // The nearest existing ancestor must be a directory we may create entries in; missing
    // ancestors in between are created (as `mkdir -p`).
    for anc in output.ancestors().skip(1) {
        let anc = if anc.as_os_str().is_empty() {
            Path::new(".")
        } else {
            anc
        };
        let link = anc.symlink_metadata();
        match std::fs::metadata(anc) {
            Ok(m) if m.is_dir() => {
                use nix::unistd::{faccessat, AccessFlags};
                // /proc, /sys and the like: no storage behind them (root passes the access
                // check there, and mkdir fails with a misleading ENOENT).
                if nix::sys::statvfs::statvfs(anc).is_ok_and(|st| st.blocks() == 0) {
                    return Err(format!(
                        "{shown}: {} is on a filesystem without storage (such as /proc or /sys)",
                        anc.display()
                    ));
                }
                // AT_EACCESS: the effective ids decide, as they will for mkdir. EROFS is
                // reported here too.
                return faccessat(
                    nix::fcntl::AT_FDCWD,
                    anc,
                    AccessFlags::W_OK | AccessFlags::X_OK,
                    nix::fcntl::AtFlags::AT_EACCESS,
                )
                .map_err(|e| {
                    format!(
                        "{shown}: cannot create the bag directory in {}: {}",
                        anc.display(),
                        std::io::Error::from(e)
                    )
                });
            }
            Ok(_) => return Err(format!("{shown}: {} is not a directory", anc.display())),
            Err(_) if link.is_ok_and(|l| l.file_type().is_symlink()) => {
                return Err(format!(
                    "{shown}: {} is a symbolic link to a missing target",
                    anc.display()
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => continue,
            Err(e) => return Err(format!("{shown}: {}: {e}", anc.display())),
        }
    }
    Ok(())
}

fn retention_policy(
    a: &RecordArgs,
    max_bag_size: u64,
    max_bag_duration_ns: i64,
) -> Result<RetentionPolicy, String> {
    let bytes = |name: &str, v: &Option<String>| -> Result<Option<u64>, String> {
        v.as_deref().map(|s| flag(name, parse_bytes(s))).transpose()
    };
    let max_record_duration_ns = a
        .max_record_duration
        .as_deref()
        .map(|s| flag("--max-record-duration", parse_duration_ns(s)))
        .transpose()?;
    let min_free_space_percent = a
        .min_free_space_percent
        .as_deref()
        .map(|s| {
            s.trim()
                .trim_end_matches('%')
                .parse::<f64>()
                .map_err(|_| format!("--min-free-space-percent {s}: not a number"))
        })
        .transpose()?;
    let policy = RetentionPolicy {
        max_record_size: bytes("--max-record-size", &a.max_record_size)?,
        max_record_duration_ns,
        max_bag_files: a.max_bag_files,
        // 0 turns the floor off (the default one included).
        min_free_space: bytes("--min-free-space", &a.min_free_space)?.filter(|&b| b > 0),
        min_free_space_percent,
        max_splits: a.max_splits,
    };
    policy.validate(max_bag_size, max_bag_duration_ns)?;
    Ok(policy)
}

/// Topic selection for the ROS source, checked (patterns, override file) before anything starts.
#[cfg(feature = "ros")]
fn ros_options(a: &RecordArgs) -> Result<crate::source::select::RosSourceOptions, String> {
    use crate::source::select::{load_qos_overrides, RosSourceOptions, TopicSelector};
    let opts = RosSourceOptions {
        polling_interval: std::time::Duration::from_millis(a.polling_interval),
        no_discovery: a.no_discovery,
        qos_profile_overrides_path: a.qos_profile_overrides_path.clone(),
        subscription_depth: a.subscription_depth,
        ..selection(a)
    };
    TopicSelector::new(&opts).map_err(|e| e.to_string())?;
    load_qos_overrides(opts.qos_profile_overrides_path.as_deref()).map_err(|e| e.to_string())?;
    Ok(opts)
}

/// The selection flags (topics, -a, -e, exclusions, hidden), shared by both sources.
fn selection(a: &RecordArgs) -> crate::source::select::RosSourceOptions {
    crate::source::select::RosSourceOptions {
        topics: a.topics.clone(),
        all: a.all,
        regex: a.regex.clone(),
        exclude_regex: a.exclude_regex.clone(),
        exclude_topics: a.exclude_topics.clone(),
        include_hidden_topics: a.include_hidden_topics,
        ..Default::default()
    }
}

/// The synthetic profile's topics that the selection flags keep
/// ([`crate::source::generator::select_topics`]).
fn synthetic_topics(a: &RecordArgs) -> Result<u64, String> {
    crate::source::generator::select_topics(a.synthetic_profile, &selection(a)).map_err(|e| {
        if e.is_about_the_profile() {
            format!("--source synthetic: {e}")
        } else {
            e.to_string()
        }
    })
}

#[cfg(not(feature = "ros"))]
fn ros_source(_a: &RecordArgs) -> Result<SourceSettings, String> {
    Err("--source ros: this ringbag was built without the `ros` feature (rebuild with --features ros against a sourced ROS 2)".into())
}

#[cfg(feature = "ros")]
fn ros_source(a: &RecordArgs) -> Result<SourceSettings, String> {
    Ok(SourceSettings::Ros(ros_options(a)?))
}

pub fn play_settings(a: &super::args::PlayArgs) -> Result<crate::play::PlaySettings, String> {
    use crate::source::select::{load_qos_overrides, normalize_topic_name};
    if !(a.rate.is_finite() && a.rate > 0.0) {
        return Err(format!(
            "--rate {}: must be a number greater than 0",
            a.rate
        ));
    }
    let start_offset_ns = flag("--start-offset", parse_duration_ns(&a.start_offset))?;
    let delay_ns = flag("--delay", parse_duration_ns(&a.delay))?;
    let playback_duration_ns = a
        .playback_duration
        .as_deref()
        .map(|s| flag("--playback-duration", parse_duration_ns(s)))
        .transpose()?;
    let playback_until_ns = match (&a.playback_until_sec, a.playback_until_nsec) {
        (Some(s), _) => Some(flag("--playback-until-sec", parse_signed_seconds(s))?),
        (None, n) => n,
    };
    if a.read_ahead_queue_size == 0 {
        return Err("--read-ahead-queue-size 0: must be at least 1".into());
    }
    let read_ahead_bytes = flag(
        "--read-ahead-queue-bytes",
        parse_bytes(&a.read_ahead_queue_bytes),
    )?;
    if read_ahead_bytes == 0 {
        return Err("--read-ahead-queue-bytes 0: must be greater than 0".into());
    }
    if let Some(hz) = a.clock {
        if !(hz.is_finite() && hz > 0.0) {
            return Err(format!(
                "--clock {hz}: must be a number of Hz greater than 0"
            ));
        }
    }
    if let Some(p) = a.rt_priority {
        if !(1..=99).contains(&p) {
            return Err(format!(
                "--rt-priority {p}: must be 1 to 99 (SCHED_FIFO priorities)"
            ));
        }
    }
    let names = |what: &str, list: &[String]| -> Result<Vec<String>, String> {
        list.iter()
            .map(|t| normalize_topic_name(t).map_err(|e| format!("{what} {t}: {e}")))
            .collect()
    };
    let regex = |what: &str, re: &Option<String>| -> Result<Option<regex::Regex>, String> {
        re.as_deref()
            .map(|p| {
                regex::Regex::new(p).map_err(|e| {
                    format!(
                        "{what} {p:?}: invalid regular expression: {}",
                        crate::source::select::regex_error_line(&e)
                    )
                })
            })
            .transpose()
    };
    let mut remap: Vec<(String, String)> = Vec::new();
    for r in &a.remap {
        let bad = || format!("--remap {r}: expected OLD:=NEW (two topic names)");
        let (old, new) = r.split_once(":=").ok_or_else(bad)?;
        let old = normalize_topic_name(old).map_err(|e| format!("--remap {r}: {e}"))?;
        let new = normalize_topic_name(new).map_err(|e| format!("--remap {r}: {e}"))?;
        if let Some((_, other)) = remap.iter().find(|(o, _)| *o == old) {
            return Err(format!("--remap {r}: {old} is already remapped to {other}"));
        }
        remap.push((old, new));
    }
    let qos_overrides = load_qos_overrides(a.qos_profile_overrides_path.as_deref())
        .map_err(|e| format!("--qos-profile-overrides-path: {e}"))?;
    Ok(crate::play::PlaySettings {
        bag: a.bag.clone(),
        selection: crate::play::Selection {
            topics: names("--topics", &a.topics)?,
            regex: regex("-e/--regex", &a.regex)?,
            exclude_regex: regex("-x/--exclude-regex", &a.exclude_regex)?,
            exclude_topics: names("--exclude-topics", &a.exclude_topics)?,
        },
        remap,
        rate: a.rate,
        start_offset_ns,
        loop_playback: a.loop_playback,
        playback_duration_ns,
        playback_until_ns,
        delay_ns,
        start_paused: a.start_paused,
        read_ahead_messages: usize::try_from(a.read_ahead_queue_size).unwrap_or(usize::MAX),
        read_ahead_bytes,
        clock_hz: a.clock,
        qos_overrides,
        rt_priority: a.rt_priority,
    })
}

/// Seconds since the epoch, exact to the nanosecond; a leading `-` is allowed (a time before
/// 1970, which is before any bag and refused as such once the bag is open).
fn parse_signed_seconds(s: &str) -> Result<i64, String> {
    let t = s.trim();
    match t.strip_prefix('-') {
        Some(rest) => parse_duration_ns(rest).map(|ns| -ns),
        None => parse_duration_ns(t),
    }
}

/// The upload target, tuning and key template of `ringbag upload`'s flags: the one place
/// flags become these (the `[upload]` config and credential files resolve elsewhere).
/// Credentials come from `env` (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN);
/// the robot id from --robot-id, else `machine_id`.
pub fn upload_settings(
    a: &super::args::UploadArgs,
    env: &dyn Fn(&str) -> Option<String>,
    machine_id: &dyn Fn() -> Option<String>,
) -> Result<
    (
        crate::upload::Target,
        crate::upload::Tuning,
        crate::upload::KeyTemplate,
    ),
    String,
> {
    use crate::upload::parts::{MAX_PART_SIZE, MIN_PART_SIZE};
    use crate::upload::{Credentials, KeyTemplate, Target, Tuning};
    let endpoint = a.endpoint.trim_end_matches('/').to_string();
    let url: url::Url = endpoint
        .parse()
        .map_err(|e| format!("--endpoint {endpoint}: not a URL ({e})"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => return Err(format!("--endpoint {endpoint}: no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback || a.allow_http => {}
        "http" => {
            return Err(format!(
            "--endpoint {endpoint}: plain http is accepted only on loopback, or with --allow-http"
        ))
        }
        other => {
            return Err(format!(
                "--endpoint {endpoint}: scheme {other}: use https://"
            ))
        }
    }
    if url.path() != "/" || url.query().is_some() || !url.username().is_empty() {
        return Err(format!(
            "--endpoint {endpoint}: give scheme, host and port only (no path, query or user)"
        ));
    }
    if a.bucket.is_empty() {
        return Err("--bucket: empty".into());
    }
    let part_size = parse_bytes(&a.part_size).map_err(|e| format!("--part-size {e}"))?;
    if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&part_size) {
        return Err(format!(
            "--part-size {}: must be 5MiB..5GiB (S3's part limits)",
            a.part_size
        ));
    }
    if !(1..=64).contains(&a.concurrency) {
        return Err(format!("--concurrency {}: must be 1..64", a.concurrency));
    }
    let max_rate = match &a.max_rate {
        None => None,
        Some(r) => match parse_bytes(r).map_err(|e| format!("--max-rate {e}"))? {
            0 => return Err("--max-rate 0: would never send; leave it out for no cap".into()),
            n => Some(n),
        },
    };
    let var = |n: &str| env(n).filter(|v| !v.is_empty());
    let (Some(access_key_id), Some(secret_access_key)) =
        (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
    else {
        return Err("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into());
    };
    let robot = match &a.robot_id {
        Some(r) => r.clone(),
        None => machine_id()
            .ok_or("no robot id: /etc/machine-id is missing or empty; pass --robot-id")?,
    };
    let keys = KeyTemplate::new(&a.key_template, &robot).map_err(|e| match e {
        crate::upload::KeyTemplateError::BadRobot(_) => format!("--robot-id: {e}"),
        _ => format!("--key {}: {e}", a.key_template),
    })?;
    if let Some(ca) = &a.ca_file {
        if !ca.is_file() {
            return Err(format!("--ca-file {}: no such file", ca.display()));
        }
    }
    let target = Target {
        endpoint,
        region: a.region.clone(),
        bucket: a.bucket.clone(),
        path_style: a.path_style,
        ca_file: a.ca_file.clone(),
        credentials: Credentials {
            access_key_id,
            secret_access_key,
            session_token: var("AWS_SESSION_TOKEN"),
        },
    };
    let tuning = Tuning {
        part_size,
        concurrency: a.concurrency,
        max_rate,
        delete_after_upload: false,
    };
    Ok((target, tuning, keys))
}
