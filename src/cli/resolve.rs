//! Raw arguments → validated settings. Everything a user can get wrong is caught here,
//! before any file is created, with a message that names the flag.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::args::{RecordArgs, SourceKind, SyntheticRate, UploadArgs};
use crate::bag::filemode::FileCompression;
use crate::bag::writer::WriterOptions;
use crate::bag::Flavour;
use crate::config::Quantity;
use crate::pipeline::PipelineConfig;
use crate::record::{RecordSettings, SourceSettings};
use crate::retention::RetentionPolicy;
use crate::snapshot::settings::{snapshot_settings, unrecorded_policy_topics, SnapshotOptions};
use crate::source::generator::{GeneratorConfig, Pace};
use crate::units::{parse_bytes, parse_duration_ns};
use crate::upload::settings::{
    CredentialSource, CredentialsError, Environment, RawUpload, ResolvedUpload,
};

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
    source_only_flags(a, source_kind)?;
    let compression = compression_flags(a)?;
    let source = match source_kind {
        SourceKind::Synthetic => SourceSettings::Synthetic(GeneratorConfig {
            profile: a.synthetic_profile,
            pace: match a.synthetic_rate {
                SyntheticRate::Realtime => Pace::Realtime,
                SyntheticRate::Max => Pace::Max,
            },
            count: a.synthetic_count,
            topics: synthetic_topics(a)?,
            payload: a.synthetic_payload,
        }),
        SourceKind::Ros => ros_source(a)?,
    };
    let clock = a.clock.settings();
    clock.validate().map_err(|e| e.to_string())?;
    let output = a.output.clone().unwrap_or_else(default_output_name);
    check_output_path(&output)?;
    let mut retention = retention_policy(a, max_bag_size, max_bag_duration_ns)?;
    let mut pipeline = PipelineConfig::for_limits(max_cache_size, max_bag_size, &retention);
    pipeline.pause = std::sync::Arc::new(crate::pipeline::PauseSwitch::new(a.start_paused));
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
    if let Some(socket) = snapshot.control_socket.as_deref() {
        crate::snapshot::control::refuse_if_listening(socket)
            .map_err(|e| format!("--control-socket: {e}"))?;
    }
    // Before the status file is first written: its rename would replace the ring or the
    // socket at the same path.
    let ring_file = snapshot
        .ring
        .as_ref()
        .map(|r| r.ring_file(&recording_root(&output)));
    {
        let mut named = Vec::new();
        if let Some(file) = ring_file.as_deref() {
            named.push(("--snapshot-file", file));
        }
        if let Some(socket) = snapshot.control_socket.as_deref() {
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
    let extra_pragmas = match a.storage_config_file.as_deref() {
        Some(f) => {
            crate::bag::storage_config::load(f, a.storage_preset_profile)
                .map_err(|e| format!("--storage-config-file {e}"))?
                .write_pragmas
        }
        None => String::new(),
    };
    Ok(RecordSettings {
        output,
        writer: WriterOptions {
            flavour: a.bag_format.unwrap_or_else(Flavour::from_env),
            preset: a.storage_preset_profile,
            max_bag_size,
            max_bag_duration_ns,
            custom_data,
            extra_pragmas,
            compression,
        },
        pipeline,
        retention,
        source,
        clock,
        recover: a.recover,
        status_file: a.status_file.clone(),
        keyboard_controls: !a.disable_keyboard_controls,
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

/// The selection flags (topics, -a, -e, types, exclusions, hidden), shared by both sources.
/// The positional topics (Humble) and `--topics` (Jazzy) are one list, as in ros2 bag.
fn selection(a: &RecordArgs) -> crate::source::select::RosSourceOptions {
    crate::source::select::RosSourceOptions {
        topics: a.topics.iter().chain(&a.topics_flag).cloned().collect(),
        // Jazzy's -a/--all is topics and services; --all-topics and --all-services split it.
        all: a.all || a.all_topics,
        all_services: a.all || a.all_services,
        services: a.services.clone(),
        exclude_services: a.exclude_services.clone(),
        regex: a.regex.clone(),
        exclude_regex: a.exclude_regex.clone(),
        exclude_topics: a.exclude_topics.clone(),
        topic_types: a.topic_types.clone(),
        exclude_topic_types: a.exclude_topic_types.clone(),
        include_hidden_topics: a.include_hidden_topics,
        include_unpublished_topics: a.include_unpublished_topics,
        ignore_leaf_topics: a.ignore_leaf_topics,
        use_sim_time: a.use_sim_time,
        node_name: a
            .node_name
            .clone()
            .unwrap_or_else(|| crate::source::select::DEFAULT_NODE_NAME.to_string()),
        ..Default::default()
    }
}

/// ros2 bag's compression flags ([`FileCompression::from_flags`]).
fn compression_flags(a: &RecordArgs) -> Result<Option<FileCompression>, String> {
    FileCompression::from_flags(
        &a.compression_mode,
        &a.compression_format,
        a.compression_threads,
        a.compression_queue_size,
    )
}

/// The service flags: recorded from the introspection topics of a live Jazzy graph only.
/// Humble has no service introspection, and its ros2 bag no such flags: refused there, as on
/// the synthetic source (which has no services). `-a` stays usable everywhere: where there are
/// no service event topics its service half matches nothing.
fn service_flags(a: &RecordArgs, source: SourceKind) -> Result<(), String> {
    let flag = if !a.services.is_empty() {
        "--services"
    } else if a.all_services {
        "--all-services"
    } else if !a.exclude_services.is_empty() {
        "--exclude-services"
    } else {
        return Ok(());
    };
    if source == SourceKind::Synthetic {
        return Err(format!(
            "{flag}: the synthetic source has no services (--source ros only)"
        ));
    }
    if !SERVICE_INTROSPECTION {
        return Err(format!(
            "{flag}: this build's ROS 2 distro has no service introspection (Iron or later; \
             ros2 bag on Humble has no such flag)"
        ));
    }
    // ros2 bag's own check: an exclusion needs something it can take away from.
    let excludes = !a.exclude_services.is_empty();
    if excludes && !(a.all || a.all_services || a.regex.is_some()) {
        return Err(
            "--exclude-services needs -a/--all, --all-services or -e/--regex \
                    (as in ros2 bag)"
                .into(),
        );
    }
    Ok(())
}

/// Whether the services' introspection topics exist where this binary records: built with
/// the `ros` feature against Iron or later (build.rs sets the cfg from `ROS_DISTRO`).
const SERVICE_INTROSPECTION: bool = cfg!(all(feature = "ros", ringbag_service_introspection));

/// ros2 bag's flags that only a live graph gives a meaning to, or that ringbag does not do
/// yet: refused with one line rather than accepted and ignored (a script relying on one
/// would record something else than it asked for).
fn source_only_flags(a: &RecordArgs, source: SourceKind) -> Result<(), String> {
    if a.use_sim_time {
        let refusal = match source {
            SourceKind::Synthetic => Some(
                "--use-sim-time: the synthetic source has no /clock to follow (--source ros only)",
            ),
            SourceKind::Ros if a.no_discovery => Some(
                "--use-sim-time: /clock has to be discovered, and --no-discovery forbids it \
                 (as in ros2 bag)",
            ),
            // PTP time and /clock time are two time bases; one bag has one.
            SourceKind::Ros if a.clock.clock == crate::clock::ClockKind::Ptp => {
                Some("--use-sim-time: stamps come from /clock, so --clock ptp cannot apply too")
            }
            SourceKind::Ros => None,
        };
        if let Some(e) = refusal {
            return Err(e.into());
        }
    }
    if a.ignore_leaf_topics && source == SourceKind::Synthetic {
        return Err(
            "--ignore-leaf-topics: the synthetic source's topics have no \
                    subscribers, so it would record nothing"
                .into(),
        );
    }
    service_flags(a, source)?;
    if let Some(name) = a.node_name.as_deref() {
        if source == SourceKind::Synthetic {
            return Err(format!(
                "--node-name {name}: the synthetic source has no ROS node (--source ros only)"
            ));
        }
        check_node_name(name)?;
    }
    Ok(())
}

/// rcl's rule for a node's base name: letters, digits and `_`, not starting with a digit.
/// Checked here so that a bad name is bad input, not a failure of the node's creation.
fn check_node_name(name: &str) -> Result<(), String> {
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--node-name {name:?}: not a node name (letters, digits and _, not starting with a digit)"
        ))
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
    Ok(SourceSettings::Ros(Box::new(ros_options(a)?)))
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
    if let Some(id) = a.storage.as_deref().filter(|&id| id != "sqlite3") {
        return Err(format!(
            "--storage {id}: not supported; ringbag reads sqlite3 bags only"
        ));
    }
    if let Some(f) = a.storage_config_file.as_deref() {
        crate::bag::storage_config::load_for_play(f)
            .map_err(|e| format!("--storage-config-file {e}"))?;
    }
    play_service_flags(a)?;
    if let Some(ms) = a.wait_for_all_acked {
        if ms < 0 {
            return Err(format!(
                "--wait-for-all-acked {ms}: must be 0 (wait forever) or a timeout in ms"
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
    // A service is selected by its event topic, as ros2 bag play turns `--services S` into
    // `S/_service_event` (ros2bag's convert_service_to_service_event_topic).
    let event_topics = |what: &str, list: &[String]| -> Result<Vec<String>, String> {
        Ok(names(what, list)?
            .into_iter()
            .map(|s| s + crate::source::select::SERVICE_EVENT_SUFFIX)
            .collect())
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
            services: event_topics("--services", &a.services)?,
            regex: regex("-e/--regex", &a.regex)?,
            exclude_regex: regex("-x/--exclude-regex", &a.exclude_regex)?,
            exclude_topics: names("--exclude-topics", &a.exclude_topics)?,
            exclude_services: event_topics("--exclude-services", &a.exclude_services)?,
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
        clock_before: if a.clock_topics_all {
            crate::play::ClockBefore::All
        } else if a.clock_topics.is_empty() {
            crate::play::ClockBefore::Never
        } else {
            crate::play::ClockBefore::Topics(names("--clock-topics", &a.clock_topics)?)
        },
        qos_overrides,
        rt_priority: a.rt_priority,
        burst: None,
    })
}

/// `--publish-service-requests` calls services: only the ros sink can, and only where the
/// distro has service introspection (Jazzy's events hold the requests). Refused elsewhere
/// rather than ignored: a script asking for calls would otherwise get no calls. The source
/// without the calls has no meaning: refused too (ros2 bag ignores it).
fn play_service_flags(a: &super::args::PlayArgs) -> Result<(), String> {
    if !a.publish_service_requests {
        if a.service_requests_source.is_some() {
            return Err("--service-requests-source: only with --publish-service-requests".into());
        }
        return Ok(());
    }
    let sink = a.sink.unwrap_or(if cfg!(feature = "ros") {
        super::args::SinkKind::Ros
    } else {
        super::args::SinkKind::Echo
    });
    if sink != super::args::SinkKind::Ros {
        return Err(
            "--publish-service-requests: the echo sink calls no services (--sink ros only)".into(),
        );
    }
    if cfg!(feature = "ros") && !SERVICE_INTROSPECTION {
        return Err(
            "--publish-service-requests: this build's ROS 2 distro has no service \
             introspection (Iron or later), so its bags hold no requests to send"
                .into(),
        );
    }
    Ok(())
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

/// `ringbag upload`'s flag for `[upload]` key `key` (`robot_id` → `--robot-id`): every key
/// but `enabled` and `delete_after_upload` has one of the same name.
pub fn upload_flag(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// What `ringbag upload` was given for `[upload]` key `key`: `None` when the flag is absent,
/// `Some(None)` for a switch given, `Some(Some(value))` for a value as written.
fn upload_flag_given(a: &UploadArgs, key: &str) -> Option<Option<String>> {
    let value = |v: &Option<String>| v.clone().map(Some);
    let path = |v: &Option<PathBuf>| v.as_ref().map(|p| Some(p.display().to_string()));
    let switch = |on: bool| on.then_some(None);
    match key {
        "endpoint" => value(&a.endpoint),
        "allow_http" => switch(a.allow_http),
        "region" => value(&a.region),
        "bucket" => value(&a.bucket),
        "key" => value(&a.key_template),
        "robot_id" => value(&a.robot_id),
        "path_style" => switch(a.path_style),
        "ca_file" => path(&a.ca_file),
        "max_rate" => value(&a.max_rate),
        "part_size" => value(&a.part_size),
        "concurrency" => value(&a.concurrency),
        "credentials_file" => path(&a.credentials_file),
        _ => None,
    }
}

/// `ringbag upload`'s flags as an `[upload]` table: only what was given is set, so that laid
/// over a `--config` table ([`overlay_upload`]) a flag overrides its key and leaves the rest.
/// The one place flags become settings; every rule is `RawUpload::check`'s.
pub fn upload_flags_raw(a: &UploadArgs) -> Result<RawUpload, String> {
    let concurrency = a
        .concurrency
        .as_deref()
        .map(|c| {
            c.trim().parse::<u64>().map_err(|_| {
                format!(
                    "--concurrency {c}: not a whole number (1..={})",
                    crate::upload::settings::MAX_CONCURRENCY
                )
            })
        })
        .transpose()?;
    // The service runs in `/` and wants absolute paths; a command runs where its user is,
    // so a relative path means the one under the current directory.
    let absolute = |flag: &str, p: &Option<PathBuf>| {
        p.as_deref()
            .map(|p| std::path::absolute(p).map_err(|e| format!("{flag} {}: {e}", p.display())))
            .transpose()
    };
    Ok(RawUpload {
        // Running the command is the intent: a table's `enabled = false` does not stop it.
        enabled: None,
        endpoint: a.endpoint.clone(),
        allow_http: a.allow_http.then_some(true),
        region: a.region.clone(),
        bucket: a.bucket.clone(),
        key: a.key_template.clone(),
        robot_id: a.robot_id.clone(),
        path_style: a.path_style.then_some(true),
        ca_file: absolute("--ca-file", &a.ca_file)?,
        max_rate: a.max_rate.clone().map(Quantity::Text),
        part_size: a.part_size.clone().map(Quantity::Text),
        concurrency,
        // Never from the command line: a laptop's copy must never be deleted.
        delete_after_upload: None,
        credentials_file: absolute("--credentials-file", &a.credentials_file)?,
    })
}

/// `table` with every key `flags` sets replaced by the flag's value.
pub fn overlay_upload(table: RawUpload, flags: RawUpload) -> RawUpload {
    RawUpload {
        enabled: flags.enabled.or(table.enabled),
        endpoint: flags.endpoint.or(table.endpoint),
        allow_http: flags.allow_http.or(table.allow_http),
        region: flags.region.or(table.region),
        bucket: flags.bucket.or(table.bucket),
        key: flags.key.or(table.key),
        robot_id: flags.robot_id.or(table.robot_id),
        path_style: flags.path_style.or(table.path_style),
        ca_file: flags.ca_file.or(table.ca_file),
        max_rate: flags.max_rate.or(table.max_rate),
        part_size: flags.part_size.or(table.part_size),
        concurrency: flags.concurrency.or(table.concurrency),
        delete_after_upload: flags.delete_after_upload.or(table.delete_after_upload),
        credentials_file: flags.credentials_file.or(table.credentials_file),
    }
}

/// A refused setting as `ringbag upload` says it: `--flag VALUE: reason` when the flag was
/// given, `file:line:col: upload.key: reason` when the value came from the `--config` table,
/// `--flag: reason` when it is missing or a default.
fn upload_setting_message(
    a: &UploadArgs,
    table: Option<&crate::config::UploadTable>,
    key: &str,
    message: &str,
) -> String {
    let given = upload_flag_given(a, key);
    if let (None, Some(t)) = (&given, table) {
        // From the table, or missing from it: the table is where to fix it.
        return t.locate(key, message.to_string()).to_string();
    }
    // The shared messages name config keys; on the command line the flag is the way.
    let message = message
        .replace("set allow_http = true", "pass --allow-http")
        .replace(": set robot_id", ": pass --robot-id");
    let flag = upload_flag(key);
    match given.flatten() {
        // An endpoint with user info may hold a password: never echoed (as in the config).
        Some(v) if key == "endpoint" && v.contains('@') => format!("{flag}: {message}"),
        Some(v) => {
            // The shared message often starts with the value itself: not said twice.
            let reason = message
                .strip_prefix(&format!("`{v}`: "))
                .or_else(|| message.strip_prefix(&format!("{v}: ")))
                .unwrap_or(&message);
            format!("{flag} {v}: {reason}")
        }
        None => format!("{flag}: {message}"),
    }
}

/// `ringbag upload`'s settings: its flags laid over the `--config` table (if any), checked
/// by [`RawUpload::check`] and resolved (credentials) exactly as the service's `[upload]`
/// table is, so that the two never disagree on what is valid. Nothing is ever deleted:
/// `delete_after_upload` is forced off whatever the table says.
pub fn upload_settings(a: &UploadArgs, env: &Environment<'_>) -> Result<ResolvedUpload, String> {
    let flags = upload_flags_raw(a)?;
    let table = match &a.config {
        Some(path) => {
            Some(crate::config::ServiceConfig::load_upload_table(path).map_err(|e| e.to_string())?)
        }
        None => {
            let missing: Vec<&str> = [("--endpoint", &a.endpoint), ("--bucket", &a.bucket)]
                .into_iter()
                .filter(|(_, v)| v.is_none())
                .map(|(f, _)| f)
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "{} {} required (or --config FILE, a ringbag.toml with an [upload] table)",
                    missing.join(" and "),
                    if missing.len() == 1 { "is" } else { "are" }
                ));
            }
            None
        }
    };
    let raw = match &table {
        Some(t) => overlay_upload(t.raw.clone(), flags),
        None => flags,
    };
    let mut settings = raw
        .check(env)
        .map_err(|e| upload_setting_message(a, table.as_ref(), e.key, &e.message))?;
    if settings.tuning.delete_after_upload {
        if let Some(t) = &table {
            log::info!(
                "{}: delete_after_upload is ignored by ringbag upload: nothing is deleted",
                t.path().display()
            );
        }
    }
    settings.tuning.delete_after_upload = false;
    settings.resolve(env).map_err(|e| match e {
        CredentialsError::Bad {
            from: CredentialSource::File(_),
            ref problem,
        } => match (&a.credentials_file, &table) {
            (Some(p), _) => format!("--credentials-file {}: {problem}", p.display()),
            (None, Some(t)) => t.locate("credentials_file", e.to_string()).to_string(),
            (None, None) => e.to_string(),
        },
        CredentialsError::None { directory } => format!(
            "no credentials: CREDENTIALS_DIRECTORY {directory}, no --credentials-file{}, and \
             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set",
            if table.is_some() {
                " or upload.credentials_file"
            } else {
                ""
            }
        ),
        other => other.to_string(),
    })
}

/// `record`'s metrics flags, checked as the daemon's keys are (a relative path is taken from
/// the working directory).
pub fn metrics_settings(a: &RecordArgs) -> Result<crate::config::MetricsSettings, String> {
    let interval = crate::units::parse_duration_ns(&a.metrics_interval)
        .and_then(crate::config::parse_metrics_interval)
        .map_err(|m| format!("--metrics-interval {}: {m}", a.metrics_interval))?;
    let textfile = match &a.metrics_textfile {
        Some(p) => {
            let abs = std::path::absolute(p)
                .map_err(|e| format!("--metrics-textfile {}: {e}", p.display()))?;
            crate::config::check_metrics_textfile(&abs)
                .map_err(|m| format!("--metrics-textfile {}: {m}", p.display()))?;
            if a.status_file
                .as_deref()
                .and_then(|s| std::path::absolute(s).ok())
                == Some(abs.clone())
            {
                return Err(format!(
                    "--metrics-textfile {}: the same file as --status-file; each needs a path of its own",
                    p.display()
                ));
            }
            Some(abs)
        }
        None => None,
    };
    let listen = match &a.metrics_listen {
        Some(t) => Some(
            crate::config::parse_metrics_listen(t).map_err(|m| format!("--metrics-listen: {m}"))?,
        ),
        None => None,
    };
    Ok(crate::config::MetricsSettings {
        textfile,
        interval,
        listen,
    })
}

#[cfg(test)]
mod record_flag_tests {
    use super::*;
    use clap::Parser;

    fn record(flags: &[&str]) -> RecordArgs {
        let mut argv = vec!["ringbag", "record"];
        argv.extend_from_slice(flags);
        match super::super::args::Cli::try_parse_from(argv) {
            Ok(c) => match c.command {
                super::super::args::Command::Record(a) => *a,
                other => panic!("{other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    fn play(flags: &[&str]) -> Result<crate::play::PlaySettings, String> {
        let mut argv = vec!["ringbag", "play", "bag"];
        argv.extend_from_slice(flags);
        match super::super::args::Cli::try_parse_from(argv) {
            Ok(c) => match c.command {
                super::super::args::Command::Play(a) => play_settings(&a),
                other => panic!("{other:?}"),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn jazzy_and_humble_spellings_of_the_topic_list_are_one_list() {
        let a = record(&["/imu", "--topics", "/tf", "points", "--all-topics"]);
        let sel = selection(&a);
        assert_eq!(sel.topics, ["/imu", "/tf", "points"]);
        assert!(sel.all, "--all-topics records every topic");
        assert!(!sel.all_services, "--all-topics records no service");
        for all in ["-a", "--all"] {
            let sel = selection(&record(&[all]));
            assert!(
                sel.all && sel.all_services,
                "{all} is topics and services, as Jazzy's"
            );
        }
    }

    #[test]
    fn type_flags_take_several_values_and_reach_the_selection() {
        let a = record(&[
            "--topic-types",
            "sensor_msgs/msg/Imu",
            "tf2_msgs/msg/TFMessage",
            "--exclude-topic-types",
            "sensor_msgs/msg/Image",
            "--include-unpublished-topics",
        ]);
        let sel = selection(&a);
        assert_eq!(
            sel.topic_types,
            ["sensor_msgs/msg/Imu", "tf2_msgs/msg/TFMessage"]
        );
        assert_eq!(sel.exclude_topic_types, ["sensor_msgs/msg/Image"]);
        assert!(sel.include_unpublished_topics);
    }

    #[test]
    fn service_flags_reach_the_selection_and_are_refused_where_there_are_no_services() {
        let a = record(&["--services", "/set", "get", "--all-services"]);
        let sel = selection(&a);
        assert_eq!(sel.services, ["/set", "get"]);
        assert!(sel.all_services && !sel.all);
        for flags in [
            &["--services", "/set"][..],
            &["--all-services"],
            &["-a", "--exclude-services", "/set"],
        ] {
            let e = source_only_flags(&record(flags), SourceKind::Synthetic).unwrap_err();
            assert!(e.starts_with("--"), "{e}");
            assert!(e.contains("synthetic source has no services"), "{e}");
            let ros = source_only_flags(&record(flags), SourceKind::Ros);
            if SERVICE_INTROSPECTION {
                assert!(ros.is_ok(), "{flags:?}: {ros:?}");
            } else {
                assert!(ros.unwrap_err().contains("no service introspection"));
            }
        }
        // -a alone works on every source and distro.
        assert!(source_only_flags(&record(&["-a"]), SourceKind::Synthetic).is_ok());
        if SERVICE_INTROSPECTION {
            let e = source_only_flags(&record(&["--exclude-services", "/set"]), SourceKind::Ros)
                .unwrap_err();
            assert!(
                e.contains("needs -a/--all, --all-services or -e/--regex"),
                "{e}"
            );
            let ok = source_only_flags(
                &record(&["-e", "s", "--exclude-services", "/x"]),
                SourceKind::Ros,
            );
            assert!(ok.is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn node_name_defaults_to_rosbag2s_and_is_checked() {
        assert_eq!(selection(&record(&[])).node_name, "rosbag2_recorder");
        let a = record(&["--node-name", "my_rec"]);
        assert_eq!(selection(&a).node_name, "my_rec");
        assert!(source_only_flags(&a, SourceKind::Ros).is_ok());
        let e = source_only_flags(&a, SourceKind::Synthetic).unwrap_err();
        assert!(
            e.starts_with("--node-name my_rec: the synthetic source"),
            "{e}"
        );
        for bad in ["1rec", "a-b", "a/b", ""] {
            let e = source_only_flags(&record(&["--node-name", bad]), SourceKind::Ros).unwrap_err();
            assert!(e.starts_with("--node-name"), "{bad}: {e}");
        }
    }

    #[test]
    fn compression_is_none_by_default_file_and_message_modes_take_zstd() {
        assert_eq!(compression_flags(&record(&[])), Ok(None));
        let m = compression_flags(&record(&[
            "--compression-mode",
            "message",
            "--compression-format",
            "zstd",
        ]))
        .unwrap()
        .expect("message mode");
        assert!(m.per_message && !m.whole_splits());
        assert_eq!(
            compression_flags(&record(&["--compression-mode", "none"])),
            Ok(None)
        );
        for (flags, says) in [
            (
                &["--compression-mode", "message"][..],
                "--compression-mode message needs a --compression-format",
            ),
            (
                &["--compression-format", "zstd"][..],
                "--compression-format needs a --compression-mode",
            ),
            (
                &["--compression-mode", "file"][..],
                "--compression-mode file needs a --compression-format",
            ),
            (
                &["--compression-mode", "file", "--compression-format", "lz4"][..],
                "--compression-format lz4: unknown",
            ),
        ] {
            let e = compression_flags(&record(flags)).unwrap_err();
            assert!(e.starts_with(says), "{flags:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let file = ["--compression-mode", "file", "--compression-format", "zstd"];
        let c = compression_flags(&record(&file)).unwrap().unwrap();
        assert!(c.threads >= 1);
        assert_eq!((c.queue_size, c.level), (1, 1), "rosbag2's defaults");
        let a = record(
            &[
                &file[..],
                &[
                    "--compression-threads",
                    "4",
                    "--compression-queue-size",
                    "8",
                ],
            ]
            .concat(),
        );
        let c = compression_flags(&a).unwrap().unwrap();
        assert_eq!((c.threads, c.queue_size), (4, 8));
    }

    #[test]
    fn flags_without_a_meaning_on_a_source_are_refused_not_ignored() {
        for (flag, source, says) in [
            ("--use-sim-time", SourceKind::Synthetic, "no /clock"),
            (
                "--ignore-leaf-topics",
                SourceKind::Synthetic,
                "no subscribers",
            ),
        ] {
            let e = source_only_flags(&record(&[flag]), source).unwrap_err();
            assert!(e.starts_with(flag) && e.contains(says), "{flag}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn use_sim_time_reaches_the_ros_source_and_refuses_ptp_and_no_discovery() {
        let a = record(&["--use-sim-time"]);
        assert!(source_only_flags(&a, SourceKind::Ros).is_ok());
        assert!(selection(&a).use_sim_time);
        assert!(!selection(&record(&[])).use_sim_time);
        for (flags, says) in [
            (&["--use-sim-time", "--clock", "ptp"][..], "--clock ptp"),
            (&["--use-sim-time", "--no-discovery"][..], "--no-discovery"),
        ] {
            let e = source_only_flags(&record(flags), SourceKind::Ros).unwrap_err();
            assert!(e.starts_with("--use-sim-time: ") && e.contains(says), "{e}");
        }
        assert!(source_only_flags(
            &record(&["--use-sim-time", "--clock", "system"]),
            SourceKind::Ros
        )
        .is_ok());
    }

    #[test]
    fn ignore_leaf_topics_reaches_the_ros_source() {
        let a = record(&["--ignore-leaf-topics"]);
        assert!(source_only_flags(&a, SourceKind::Ros).is_ok());
        assert!(selection(&a).ignore_leaf_topics);
        assert!(!selection(&record(&[])).ignore_leaf_topics);
    }

    #[test]
    fn play_parity_flags() {
        assert!(play(&["--disable-loan-message", "--wait-for-all-acked", "0"]).is_ok());
        assert!(play(&["--wait-for-all-acked", "1500"]).is_ok());
        let e = play(&["--wait-for-all-acked", "-1"]).err().unwrap();
        assert!(e.starts_with("--wait-for-all-acked -1: must be 0"), "{e}");
        let s = play(&["--clock-topics", "tf", "/imu"]).unwrap();
        assert_eq!(
            s.clock_before,
            crate::play::ClockBefore::Topics(vec!["/tf".into(), "/imu".into()])
        );
        let s = play(&["--clock-topics-all"]).unwrap();
        assert_eq!(s.clock_before, crate::play::ClockBefore::All);
        assert_eq!(
            play(&[]).unwrap().clock_before,
            crate::play::ClockBefore::Never
        );
        let e = play(&["--clock-topics", "a//b"]).err().unwrap();
        assert!(e.starts_with("--clock-topics a//b"), "{e}");
        // As ros2 bag: --clock, --clock-topics and --clock-topics-all exclude each other.
        assert!(play(&["--clock", "--clock-topics-all"]).is_err());
        assert!(play(&["-s", "sqlite3"]).is_ok());
        let e = play(&["--storage", "mcap"]).err().unwrap();
        assert!(e.starts_with("--storage mcap: not supported"), "{e}");
    }
}

#[cfg(test)]
mod upload_tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use std::os::unix::fs::PermissionsExt;

    fn args(flags: &[&str]) -> UploadArgs {
        let mut argv = vec!["ringbag", "upload"];
        argv.extend_from_slice(flags);
        argv.push("bag");
        match super::super::args::Cli::try_parse_from(argv) {
            Ok(c) => match c.command {
                super::super::args::Command::Upload(a) => *a,
                other => panic!("{other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    const KEYS_ENV: [(&str, &str); 2] = [
        ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
        ("AWS_SECRET_ACCESS_KEY", "tEsTsEcReT"),
    ];

    /// Endpoint, bucket and robot id: the flags an upload needs when no config is given.
    const MINIMAL_FLAGS: [&str; 6] = [
        "--endpoint",
        "https://s3.example.com",
        "--bucket",
        "fleet",
        "--robot-id",
        "r1",
    ];

    fn settings(flags: &[&str], vars: &[(&str, &str)]) -> Result<ResolvedUpload, String> {
        let env = Environment::from_vars(vars, Path::new("/nonexistent/machine-id"));
        upload_settings(&args(flags), &env)
    }

    fn table(dir: &Path, body: &str) -> String {
        let p = dir.join("ringbag.toml");
        std::fs::write(&p, format!("output_root = \"/nowhere\"\n[upload]\n{body}")).unwrap();
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn every_upload_key_but_enabled_and_delete_after_upload_has_its_flag() {
        let cmd = super::super::args::Cli::command();
        let upload = cmd.find_subcommand("upload").expect("upload");
        let longs: Vec<&str> = upload
            .get_arguments()
            .filter_map(|a| a.get_long())
            .collect();
        for key in crate::upload::settings::KEYS {
            let flag = upload_flag(key);
            let has = longs.contains(&&flag[2..]);
            assert_eq!(
                has,
                !matches!(*key, "enabled" | "delete_after_upload"),
                "{key} → {flag}"
            );
            if has {
                // And the flag is read back as that key.
                assert!(upload_flag_given(&args(&[]), key).is_none(), "{key}");
            }
        }
    }

    #[test]
    fn flags_alone_go_through_the_shared_rules_and_name_the_flag() {
        let base = MINIMAL_FLAGS;
        let r = settings(&base, &KEYS_ENV).unwrap();
        assert_eq!(r.target.endpoint, "https://s3.example.com");
        assert_eq!(r.target.region, crate::upload::settings::DEFAULT_REGION);
        assert_eq!(r.tuning, crate::upload::Tuning::default());
        for (extra, want) in [
            (
                vec!["--concurrency", "17"],
                "--concurrency 17: 17 is outside 1..=16 (parts in flight)",
            ),
            (
                vec!["--concurrency", "two"],
                "--concurrency two: not a whole number (1..=16)",
            ),
            (
                vec!["--part-size", "1MiB"],
                "--part-size 1MiB: 1048576 bytes is outside 5 MiB..=5 GiB (S3's part sizes; AWS \
                 refuses smaller parts with EntityTooSmall)",
            ),
            (
                vec!["--bucket", "Fleet"],
                "--bucket Fleet: a bucket name has 3 to 63 lowercase letters, digits, '.' and \
                 '-', starting and ending with a letter or digit",
            ),
            (
                vec!["--endpoint", "http://192.0.2.1:9000"],
                "--endpoint http://192.0.2.1:9000: plain http:// to 192.0.2.1, which is not \
                 loopback: data and signatures would cross the network unencrypted; use \
                 https://, or pass --allow-http",
            ),
            (
                vec!["--endpoint", "https://id:pw@s3.example.com"],
                "--endpoint: holds a user name or password; credentials never go in \
                 ringbag.toml: use systemd's LoadCredential=s3:FILE, a file named by \
                 upload.credentials_file (mode 0600), or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            ),
            (
                vec!["--key", "x/{file}"],
                "--key x/{file}: must contain {bag}, or files of different bags would \
                 overwrite each other",
            ),
        ] {
            // `extra`'s flag replaces the same one of `base` (clap refuses one given twice).
            let mut flags: Vec<&str> = base
                .chunks(2)
                .filter(|p| !extra.contains(&p[0]))
                .flatten()
                .copied()
                .collect();
            flags.extend_from_slice(&extra);
            let e = settings(&flags, &KEYS_ENV).unwrap_err();
            assert_eq!(e, want, "{extra:?}");
        }
        // No robot id anywhere: named as the flag.
        let e = settings(&base[..4], &KEYS_ENV).unwrap_err();
        assert_eq!(
            e,
            "--robot-id: not set, and /nonexistent/machine-id is missing, empty or \
             uninitialized: pass --robot-id"
        );
    }

    #[test]
    fn without_config_endpoint_and_bucket_are_required_and_named() {
        for (flags, want) in [
            (vec![], "--endpoint and --bucket are required"),
            (vec!["--bucket", "fleet"], "--endpoint is required"),
            (
                vec!["--endpoint", "https://s3.example.com"],
                "--bucket is required",
            ),
        ] {
            assert_eq!(
                settings(&flags, &KEYS_ENV).unwrap_err(),
                format!("{want} (or --config FILE, a ringbag.toml with an [upload] table)")
            );
        }
        let e = settings(&MINIMAL_FLAGS, &[]).unwrap_err();
        assert_eq!(
            e,
            "no credentials: CREDENTIALS_DIRECTORY is not set, no --credentials-file, and \
             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set"
        );
    }

    #[test]
    fn a_config_table_is_read_flags_override_it_and_it_never_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = table(
            dir.path(),
            "endpoint = \"https://s3.example.com\"\nbucket = \"fleet\"\nrobot_id = \"r1\"\n\
             concurrency = 4\ndelete_after_upload = true\nenabled = false\n",
        );
        let r = settings(&["--config", &cfg], &KEYS_ENV).unwrap();
        assert_eq!(r.target.bucket, "fleet");
        assert_eq!(r.tuning.concurrency, 4);
        assert!(
            !r.tuning.delete_after_upload,
            "ringbag upload never deletes"
        );
        let r = settings(
            &["--config", &cfg, "--bucket", "other", "--concurrency", "1"],
            &KEYS_ENV,
        )
        .unwrap();
        assert_eq!(
            (r.target.bucket.as_str(), r.tuning.concurrency),
            ("other", 1)
        );
        assert_eq!(r.robot_id, "r1");
        // A bad value in the table: file:line:col of its value; given as a flag: the flag.
        let bad = table(
            dir.path(),
            "endpoint = \"https://s3.example.com\"\nbucket = \"fleet\"\nrobot_id = \"r1\"\n\
             concurrency = 40\n",
        );
        assert_eq!(
            settings(&["--config", &bad], &KEYS_ENV).unwrap_err(),
            format!("{bad}:6:15: upload.concurrency: 40 is outside 1..=16 (parts in flight)")
        );
        assert!(settings(&["--config", &bad, "--concurrency", "2"], &KEYS_ENV).is_ok());
        // Missing from the table and not given: at the table's header.
        let no_bucket = table(dir.path(), "endpoint = \"https://s3.example.com\"\n");
        assert_eq!(
            settings(&["--config", &no_bucket], &KEYS_ENV).unwrap_err(),
            format!("{no_bucket}:2:2: upload.bucket: is required: the bucket objects go to")
        );
        // A file without the table, and an unknown key, as --check-config says them.
        let p = dir.path().join("none.toml");
        std::fs::write(&p, "output_root = \"/x\"\n").unwrap();
        let none = p.to_str().unwrap();
        assert_eq!(
            settings(&["--config", none], &KEYS_ENV).unwrap_err(),
            format!("{none}: has no [upload] table")
        );
        let typo = table(dir.path(), "endpiont = \"https://s3.example.com\"\n");
        assert_eq!(
            settings(&["--config", &typo], &KEYS_ENV).unwrap_err(),
            format!("{typo}:3:1: upload.endpiont: unknown key")
        );
    }

    #[test]
    fn a_credentials_file_flag_follows_the_config_keys_rules() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "wJalrXUtnFEMI/K7MDENG";
        let file = dir.path().join("s3.credentials");
        std::fs::write(
            &file,
            format!("aws_access_key_id = AKIDFILE\naws_secret_access_key = {secret}\n"),
        )
        .unwrap();
        let base = MINIMAL_FLAGS;
        let f = file.to_str().unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let r = settings(&[&base[..], &["--credentials-file", f]].concat(), &KEYS_ENV).unwrap();
        assert_eq!(r.target.credentials.access_key_id, "AKIDFILE");
        assert_eq!(r.credentials_from, CredentialSource::File(file.clone()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = settings(&[&base[..], &["--credentials-file", f]].concat(), &KEYS_ENV).unwrap_err();
        assert_eq!(
            e,
            format!(
                "--credentials-file {f}: mode 0644 lets group or others read it; chmod 600 it \
                 (0600 or stricter)"
            )
        );
        assert!(!e.contains(secret));
        // From the table: placed at its value.
        let cfg = table(
            dir.path(),
            &format!(
                "endpoint = \"https://s3.example.com\"\nbucket = \"fleet\"\nrobot_id = \"r\"\n\
                 credentials_file = \"{f}\"\n"
            ),
        );
        assert_eq!(
            settings(&["--config", &cfg], &[]).unwrap_err(),
            format!(
                "{cfg}:6:20: upload.credentials_file: credentials from credentials_file {f}: \
                 mode 0644 lets group or others read it; chmod 600 it (0600 or stricter)"
            )
        );
    }
}
