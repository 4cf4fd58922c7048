//! Black-box snapshots: a crash-surviving memory ring of the heavy topics (`ring`), event
//! triggers (`trigger`, `control`, SIGUSR2, a trigger topic), the thread that cuts windows out
//! of the ring into new bags and recovers a ring a crash left (`snapshotter`), and the
//! per-topic policy of what is recorded continuously (`policy`).
//!
//! Data flow: the pipeline's writer thread hands every message to [`SnapshotTap`] (a
//! `pipeline::Tap`), which appends it to the ring, watches the trigger topic, and tells the
//! writer whether the continuous bag writes it too. Producers are untouched: their push stays
//! lock-free. The snapshot thread reads the ring concurrently and writes bags with the same
//! bag writer as the continuous recording.

pub mod control;
pub mod policy;
pub mod ring;
#[cfg(all(feature = "ros", ringbag_std_srvs))]
pub mod ros_service;
pub mod settings;
pub mod snapshotter;
pub mod trigger;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use crate::bag::{MessageDefinition, TopicInfo};
use crate::pipeline::{Continuous, Room, Tap};
use policy::{Route, Throttle, TopicPolicy};
use ring::{AppendError, Ring, RingTopic, RingWriter};
use snapshotter::Cmd;
use trigger::{Origin, TriggerRequest};

/// The tmpfs under which `record` keeps its rings when `--snapshot-file` is not given, in a
/// directory of the user's own: see [`default_ring_dir`].
pub const DEFAULT_RING_DIR: &str = "/dev/shm";
/// The service's ring directory (systemd's `RuntimeDirectory=ringbag`, tmpfs).
pub const SERVICE_RING_DIR: &str = "/run/ringbag";

/// `record`'s ring directory: `/dev/shm/ringbag-<euid>`, created 0700 and checked before use
/// ([`ring::ensure_private_dir`]). Not /dev/shm itself: anyone can create files there, and the
/// ring's name is predictable, so another user could plant a link or a ring of their own under
/// it. Not `$XDG_RUNTIME_DIR`: it is often absent (sudo, services, ssh without a session) and
/// small (10 % of RAM), and a ring must be found again by the next run into the same root.
pub fn default_ring_dir() -> PathBuf {
    Path::new(DEFAULT_RING_DIR).join(format!("ringbag-{}", nix::unistd::geteuid().as_raw()))
}

/// `--trigger-topic TOPIC[:TYPE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerTopic {
    pub topic: String,
    /// None: any type (a `std_msgs/msg/Bool` still triggers on true only).
    pub type_name: Option<String>,
}

/// Types a trigger topic may declare.
pub const TRIGGER_TYPES: [&str; 2] = ["std_msgs/msg/Bool", "std_msgs/msg/Empty"];

impl TriggerTopic {
    /// Parse `TOPIC[:TYPE]`; TYPE is `std_msgs/msg/Bool`, `std_msgs/msg/Empty` (or the
    /// short `std_msgs/Bool`), or `any`.
    pub fn parse(s: &str) -> Result<TriggerTopic, String> {
        let (topic, ty) = match s.split_once(':') {
            Some((t, ty)) => (t, Some(ty.trim())),
            None => (s, None),
        };
        if !topic.starts_with('/') || topic.len() < 2 {
            return Err(format!(
                "--trigger-topic {s}: the topic must be a name starting with '/'"
            ));
        }
        let type_name = match ty {
            None | Some("any") => None,
            Some(t) => {
                let full = match t.split('/').collect::<Vec<_>>().as_slice() {
                    [pkg, name] => format!("{pkg}/msg/{name}"),
                    _ => t.to_string(),
                };
                if !TRIGGER_TYPES.contains(&full.as_str()) {
                    return Err(format!(
                        "--trigger-topic {s}: unknown trigger topic type {t} (known: any, {})",
                        TRIGGER_TYPES.join(", ")
                    ));
                }
                Some(full)
            }
        };
        Ok(TriggerTopic {
            topic: topic.to_string(),
            type_name,
        })
    }
}

/// The ring's settings, resolved.
#[derive(Debug, Clone)]
pub struct RingSettings {
    /// The whole ring file's size (`--snapshot-size`).
    pub size: u64,
    /// `--snapshot-duration`; 0 = bounded by size only.
    pub window_ns: i64,
    /// `--snapshot-file`; None = derived from the recording root in `dir`.
    pub file: Option<PathBuf>,
    /// Where a derived ring file goes: a directory of our own ([`ring::ensure_private_dir`]).
    pub dir: PathBuf,
    pub trigger_topic: Option<TriggerTopic>,
}

impl RingSettings {
    /// The ring file for recordings under `root`: `--snapshot-file`, else
    /// `<dir>/ringbag-<root, as a name>-<crc32 of root>.ring`, so the next run into the same
    /// root finds the ring a crashed run left.
    pub fn ring_file(&self, root: &Path) -> PathBuf {
        if let Some(f) = &self.file {
            return f.clone();
        }
        let abs = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
        let text = abs.to_string_lossy();
        let name: String = text
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let name = name.trim_matches('_');
        let tail: String = name
            .chars()
            .rev()
            .take(64)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        self.dir.join(format!(
            "ringbag-{tail}-{:08x}.ring",
            crc32fast::hash(text.as_bytes())
        ))
    }
}

impl RingSettings {
    /// Check, changing nothing, that the ring for `root` can be used: its directory (when
    /// derived) is ours alone, and the path holds nothing or a ring of ours
    /// ([`ring::preflight`]). Returns the ring's path.
    pub fn preflight(&self, root: &Path) -> Result<PathBuf, ring::RingError> {
        if self.file.is_none() {
            ring::check_private_dir(&self.dir)?;
        }
        let path = self.ring_file(root);
        ring::preflight(&path)?;
        Ok(path)
    }

    /// Before recovery and [`Ring::create`]: [`RingSettings::preflight`], after creating a
    /// derived ring's directory 0700 when it is missing. Returns the ring's path.
    pub fn prepare(&self, root: &Path) -> Result<PathBuf, ring::RingError> {
        if self.file.is_none() {
            ring::ensure_private_dir(&self.dir)?;
        }
        self.preflight(root)
    }
}

/// Everything snapshot-related a recording needs.
#[derive(Debug, Clone, Default)]
pub struct SnapshotSettings {
    /// The ring (`--snapshot-size`); None = no ring, no triggers.
    pub ring: Option<RingSettings>,
    /// Ring-only topics and throttles (throttles apply without a ring too).
    pub policy: TopicPolicy,
    /// `--control-socket` / `control_socket`: where `ringbag trigger`, `pause` and `resume`
    /// reach the recorder. Not part of the ring: pause and resume need no ring, and a trigger
    /// on a recorder without one gets a clear answer instead of "no recorder is listening".
    pub control_socket: Option<PathBuf>,
}

impl SnapshotSettings {
    /// Whether the writer needs a tap at all.
    pub fn active(&self) -> bool {
        self.ring.is_some() || !self.policy.rates.is_empty()
    }
}

/// How a trigger topic fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fires {
    Any,
    /// `std_msgs/msg/Bool`: when `data` is true.
    BoolTrue,
}

struct TapTopic {
    name: String,
    ring_id: Option<u32>,
    route: Route,
    throttle: Throttle,
    fires: Option<Fires>,
    ring_refused: bool,
}

/// The writer thread's side: ring appends, trigger topic, ring-only and throttled topics.
pub struct SnapshotTap {
    ring: Option<RingWriter>,
    policy: TopicPolicy,
    trigger_topic: Option<TriggerTopic>,
    triggers: Option<Sender<Cmd>>,
    finished: Option<crossbeam_channel::Receiver<PathBuf>>,
    room: Option<Arc<Room>>,
    topics: Vec<Option<TapTopic>>,
}

impl SnapshotTap {
    pub fn new(
        ring: Option<RingWriter>,
        policy: TopicPolicy,
        trigger_topic: Option<TriggerTopic>,
        triggers: Option<Sender<Cmd>>,
        finished: Option<crossbeam_channel::Receiver<PathBuf>>,
        room: Option<Arc<Room>>,
    ) -> Self {
        SnapshotTap {
            ring,
            policy,
            trigger_topic,
            triggers,
            finished,
            room,
            topics: Vec::new(),
        }
    }
}

impl Tap for SnapshotTap {
    fn topic(&mut self, id: u32, info: &TopicInfo, definition: Option<&MessageDefinition>) {
        let route = self.policy.route(&info.name);
        let ring_id = match (&mut self.ring, route.ring) {
            (Some(r), true) => match r.add_topic(RingTopic::new(info, definition)) {
                Ok(i) => Some(i),
                Err(e) => {
                    log::warn!(
                        ringbag_topic = info.name.as_str();
                        "{}: not kept in the snapshot ring: {e:?}",
                        info.name
                    );
                    None
                }
            },
            _ => None,
        };
        let fires = self
            .trigger_topic
            .as_ref()
            .filter(|t| t.topic == info.name)
            .map(|t| {
                if let Some(declared) = &t.type_name {
                    if *declared != info.type_name {
                        log::warn!(
                            "--trigger-topic {}: declared {declared}, but the topic is {}; any message triggers",
                            t.topic,
                            info.type_name
                        );
                    }
                }
                if info.type_name == "std_msgs/msg/Bool" {
                    Fires::BoolTrue
                } else {
                    Fires::Any
                }
            });
        let idx = id as usize;
        if self.topics.len() <= idx {
            self.topics.resize_with(idx + 1, || None);
        }
        self.topics[idx] = Some(TapTopic {
            name: info.name.clone(),
            ring_id,
            route,
            throttle: Throttle::new(route.min_period_ns),
            fires,
            ring_refused: false,
        });
    }

    fn message(&mut self, id: u32, ts: i64, data: &[u8]) -> Continuous {
        let Some(Some(t)) = self.topics.get_mut(id as usize) else {
            return Continuous::Write;
        };
        if let (Some(ring), Some(rid)) = (self.ring.as_mut(), t.ring_id) {
            if let Err(e) = ring.append(rid, ts, data) {
                if !t.ring_refused {
                    t.ring_refused = true;
                    let why = match e {
                        AppendError::TooLarge => {
                            "larger than the whole ring (raise --snapshot-size)"
                        }
                        AppendError::TopicTableFull => "the ring's topic table is full",
                    };
                    log::warn!(
                        ringbag_topic = t.name.as_str();
                        "{}: a {} byte message is not kept in the snapshot ring: {why}",
                        t.name,
                        data.len()
                    );
                }
            }
        }
        if let Some(fires) = t.fires {
            // CDR: 4 bytes of encapsulation header, then the bool.
            let fired = match fires {
                Fires::Any => true,
                Fires::BoolTrue => data.get(4).is_some_and(|b| *b != 0),
            };
            if let (true, Some(tx)) = (fired, &self.triggers) {
                let _ = tx.send(Cmd::Trigger {
                    req: TriggerRequest {
                        reason: Some(format!("topic {}", t.name)),
                        ..Default::default()
                    },
                    origin: Origin::Topic,
                    at_ns: Some(ts),
                    reply: None,
                    ticket: None,
                });
            }
        }
        if !t.route.continuous {
            return Continuous::RingOnly;
        }
        if !t.throttle.keep(ts) {
            return Continuous::Throttled;
        }
        Continuous::Write
    }

    fn finished_bags(&mut self) -> Vec<PathBuf> {
        self.finished
            .as_ref()
            .map(|rx| rx.try_iter().collect())
            .unwrap_or_default()
    }

    fn room(&self) -> Option<Arc<Room>> {
        self.room.clone()
    }
}

/// The running snapshot machinery of one recording: the ring and the snapshot thread. (The
/// control socket is the recording's, ring or not: `record::run_with` starts it with
/// [`Snapshots::sender`].)
pub struct Snapshots {
    pub ring: Arc<Ring>,
    tx: Option<Sender<Cmd>>,
    thread: Option<JoinHandle<Vec<PathBuf>>>,
    finished: Option<crossbeam_channel::Receiver<PathBuf>>,
    room: Arc<Room>,
}

impl Snapshots {
    /// Start the snapshot thread over `ring`.
    pub fn start(
        ring: Arc<Ring>,
        mut cfg: snapshotter::Config,
    ) -> Result<Snapshots, SnapshotError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ftx, frx) = crossbeam_channel::unbounded();
        cfg.finished = Some(ftx);
        let room = Arc::new(Room::default());
        cfg.room = Some(room.clone());
        let worker = snapshotter::Snapshotter::new(ring.clone(), cfg);
        let thread = std::thread::Builder::new()
            .name("ringbag-snapshot".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| SnapshotError::Thread(e.to_string()))?;
        Ok(Snapshots {
            ring,
            tx: Some(tx),
            thread: Some(thread),
            finished: Some(frx),
            room,
        })
    }

    /// Where the snapshot bag being written asks the writer thread for room on the budget.
    pub fn room(&self) -> Arc<Room> {
        self.room.clone()
    }

    /// Finished snapshot bags, once (for the writer thread's retention, through the tap).
    pub fn take_finished(&mut self) -> Option<crossbeam_channel::Receiver<PathBuf>> {
        self.finished.take()
    }

    /// A sender for triggers (the tap's trigger topic).
    pub fn sender(&self) -> Option<Sender<Cmd>> {
        self.tx.clone()
    }

    /// A trigger from this process (SIGUSR2, the ROS service).
    pub fn trigger(&self, reason: &str, origin: Origin) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Cmd::Trigger {
                req: TriggerRequest {
                    reason: Some(reason.to_string()),
                    ..Default::default()
                },
                origin,
                at_ns: None,
                reply: None,
                ticket: None,
            });
        }
    }

    /// After the writer thread has finished (and dropped its sender): finish the open
    /// snapshot with what the ring holds, mark the ring clean. Returns the snapshot bags.
    pub fn finish(mut self) -> Vec<PathBuf> {
        self.tx = None;
        let bags = self
            .thread
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        self.ring.mark_clean();
        bags
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Ring(#[from] ring::RingError),
    #[error(transparent)]
    Control(#[from] control::ControlError),
    #[error("cannot start the snapshot thread: {0}")]
    Thread(String),
    #[error(transparent)]
    Bag(#[from] crate::bag::BagError),
}

impl SnapshotError {
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            SnapshotError::Ring(ring::RingError::NoRoom { .. })
                | SnapshotError::Ring(ring::RingError::Invalid { .. })
                | SnapshotError::Ring(ring::RingError::Refused { .. })
                | SnapshotError::Ring(ring::RingError::InUse { .. })
                | SnapshotError::Control(control::ControlError::InUse { .. })
                | SnapshotError::Control(control::ControlError::BadPath { .. })
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_topics_parse_with_known_types_only() {
        assert_eq!(
            TriggerTopic::parse("/estop").unwrap(),
            TriggerTopic {
                topic: "/estop".into(),
                type_name: None
            }
        );
        assert_eq!(
            TriggerTopic::parse("/estop:std_msgs/Bool")
                .unwrap()
                .type_name
                .as_deref(),
            Some("std_msgs/msg/Bool")
        );
        let e = TriggerTopic::parse("/estop:geometry_msgs/msg/Twist").unwrap_err();
        assert!(e.contains("unknown trigger topic type"), "{e}");
        assert!(TriggerTopic::parse("estop").is_err());
    }

    fn bool_msg(v: bool) -> Vec<u8> {
        vec![0, 1, 0, 0, u8::from(v)]
    }

    #[test]
    fn the_tap_splits_ring_and_continuous_throttles_and_fires_on_bool_true() {
        let dir = tempfile::tempdir().unwrap();
        let ring = Arc::new(Ring::create(&dir.path().join("r"), 1 << 20, 0).unwrap());
        let (tx, rx) = crossbeam_channel::unbounded();
        let policy = TopicPolicy {
            ring: true,
            ring_only: vec!["/cam".into()],
            ring_only_regex: None,
            rates: vec![("/imu".into(), 10.0)],
        };
        let mut tap = SnapshotTap::new(
            Some(RingWriter::new(ring.clone())),
            policy,
            Some(TriggerTopic::parse("/estop").unwrap()),
            Some(tx),
            None,
            None,
        );
        tap.topic(0, &TopicInfo::new("/cam", "sensor_msgs/msg/Image"), None);
        tap.topic(1, &TopicInfo::new("/imu", "sensor_msgs/msg/Imu"), None);
        tap.topic(2, &TopicInfo::new("/estop", "std_msgs/msg/Bool"), None);
        let ms = 1_000_000;
        let mut cam = Vec::new();
        let mut imu = Vec::new();
        for i in 0..100i64 {
            cam.push(tap.message(0, i * 10 * ms, b"img"));
            imu.push(tap.message(1, i * 10 * ms, b"imu"));
        }
        assert!(cam.iter().all(|c| *c == Continuous::RingOnly));
        // 1 s of a 100 Hz IMU at 10 Hz: 10 written, 90 throttled.
        assert_eq!(imu.iter().filter(|c| **c == Continuous::Write).count(), 10);
        assert_eq!(
            imu.iter().filter(|c| **c == Continuous::Throttled).count(),
            90
        );
        assert_eq!(tap.message(2, 5, &bool_msg(false)), Continuous::Write);
        assert!(rx.try_recv().is_err(), "false does not fire");
        tap.message(2, 6, &bool_msg(true));
        let Ok(Cmd::Trigger { origin, at_ns, .. }) = rx.try_recv() else {
            panic!("true fires")
        };
        assert_eq!((origin, at_ns), (Origin::Topic, Some(6)));
        // Every message went into the ring, continuous or not.
        let (n, _) = ring::scan(&ring, |_, _| {});
        assert_eq!(n, 202);
    }
}
