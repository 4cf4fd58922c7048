//! Live ROS 2 source and play sink through r2r (cargo feature `ros`).
//!
//! The only file that calls r2r. Selection and QoS rules live in [`super::select`], pure and
//! tested without ROS 2; this file only asks the graph, subscribes and moves bytes.
//!
//! r2r's raw subscription stream is a bounded channel (10 messages) that drops silently when
//! nobody drains it, and `spin_once` takes at most one message per subscription. So one thread
//! (the caller's) alternates `spin_once` with draining every stream until it is empty; the
//! streams are polled with a no-op waker, which needs no async runtime.

use std::collections::{HashMap, HashSet};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use futures::stream::Stream;
use futures::StreamExt;
use r2r::qos::{DurabilityPolicy, HistoryPolicy, LivelinessPolicy, ReliabilityPolicy};

use super::select::{
    adapt_to_offers, duration_from_std, duration_to_std, load_qos_overrides, requested_qos,
    Decision, QosOverrides, RosSourceOptions, SelectError, TopicSelector,
};
use crate::bag::qos::{Durability, History, Liveliness, Reliability};
use crate::bag::{MessageDefinition, QosProfile, TopicInfo};
use crate::pipeline::{Producer, TopicHandle};

/// The recorder's node name, as `rosbag2_recorder` for ros2 bag.
pub const RECORDER_NODE_NAME: &str = "ringbag_recorder";

/// Longest `spin_once` wait: bounds how late a stop request or a discovery poll is noticed.
const SPIN_SLICE: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum RosSourceError {
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error("cannot initialise ROS 2 (is a ROS 2 environment sourced?): {0}")]
    Context(#[source] r2r::Error),
    #[error("cannot create ROS 2 node {name}: {source}")]
    Node {
        name: String,
        #[source]
        source: r2r::Error,
    },
    #[error("cannot create a publisher on {topic} [{type_name}]: {source}")]
    Publisher {
        topic: String,
        type_name: String,
        #[source]
        source: r2r::Error,
    },
    #[error("topic {topic} is published as {declared}, not {asked}")]
    TypeMismatch {
        topic: String,
        declared: String,
        asked: String,
    },
    #[error("cannot publish on {topic}: {source}")]
    Publish {
        topic: String,
        #[source]
        source: r2r::Error,
    },
}

/// Where the source delivers: the pipeline's [`Producer`], or a test's collector.
pub trait RecordTarget {
    type Topic;
    /// Registers a topic (once per subscription, not on the hot path).
    fn add_topic(&self, info: TopicInfo, definition: Option<MessageDefinition>) -> Self::Topic;
    /// Takes r2r's buffer as is; must never block. False means dropped (the target counts it).
    fn push_owned(&self, topic: &Self::Topic, data: Vec<u8>) -> bool;
    fn stop_requested(&self) -> bool;
}

impl RecordTarget for Producer {
    type Topic = TopicHandle;
    fn add_topic(&self, info: TopicInfo, definition: Option<MessageDefinition>) -> TopicHandle {
        Producer::add_topic(self, info, definition)
    }
    fn push_owned(&self, topic: &TopicHandle, data: Vec<u8>) -> bool {
        Producer::push_owned(self, topic, data)
    }
    fn stop_requested(&self) -> bool {
        Producer::stop_requested(self)
    }
}

/// Records the selected live topics into `producer` until it asks to stop.
pub fn run(opts: &RosSourceOptions, producer: Producer) -> Result<(), RosSourceError> {
    record(opts, &producer)
}

/// As [`run`], into any [`RecordTarget`]. Blocks the calling thread, which becomes the spin
/// thread.
pub fn record<T: RecordTarget>(opts: &RosSourceOptions, target: &T) -> Result<(), RosSourceError> {
    let selector = TopicSelector::new(opts)?;
    let overrides = load_qos_overrides(opts.qos_profile_overrides_path.as_deref())?;
    let ctx = r2r::Context::create().map_err(RosSourceError::Context)?;
    let node =
        r2r::Node::create(ctx, RECORDER_NODE_NAME, "").map_err(|source| RosSourceError::Node {
            name: RECORDER_NODE_NAME.into(),
            source,
        })?;
    let mut rec = Recorder {
        node,
        selector,
        overrides,
        target,
        subs: Vec::new(),
        done: HashSet::new(),
        warned: HashSet::new(),
    };
    let waker = futures::task::noop_waker_ref();
    let mut cx = TaskContext::from_waker(waker);

    rec.discover();
    let mut next_poll = Instant::now() + opts.polling_interval;
    while !target.stop_requested() {
        let now = Instant::now();
        if !opts.no_discovery && now >= next_poll {
            rec.discover();
            next_poll = now + opts.polling_interval;
        }
        let slice = if opts.no_discovery {
            SPIN_SLICE
        } else {
            SPIN_SLICE.min(next_poll.saturating_duration_since(now))
        };
        if rec.subs.is_empty() {
            // rcl_wait returns at once on an empty wait set; sleep instead of spinning hot.
            std::thread::sleep(slice);
        } else {
            rec.node.spin_once(slice);
        }
        rec.drain(&mut cx);
    }
    rec.drain(&mut cx);
    Ok(())
}

type RawStream = Box<dyn Stream<Item = Vec<u8>> + Unpin>;

struct Subscription<H> {
    name: String,
    handle: H,
    stream: RawStream,
    open: bool,
}

struct Recorder<'t, T: RecordTarget> {
    node: r2r::Node,
    selector: TopicSelector,
    overrides: QosOverrides,
    target: &'t T,
    subs: Vec<Subscription<T::Topic>>,
    /// Topics subscribed to or skipped for good (unknown type).
    done: HashSet<String>,
    /// Topics already warned about, so each warning appears once.
    warned: HashSet<String>,
}

impl<T: RecordTarget> Recorder<'_, T> {
    fn warn_once(&mut self, topic: &str, msg: impl FnOnce() -> String) {
        if self.warned.insert(topic.to_string()) {
            log::warn!("{}", msg());
        }
    }

    /// One discovery poll: subscribe to every newly visible selected topic with a publisher.
    fn discover(&mut self) {
        let topics = match self.node.get_topic_names_and_types() {
            Ok(t) => t,
            Err(e) => {
                log::warn!("topic discovery failed: {e}");
                return;
            }
        };
        let mut topics: Vec<(String, Vec<String>)> = topics
            .into_iter()
            .filter(|(name, _)| !self.done.contains(name))
            .collect();
        topics.sort();
        for (name, types) in topics {
            match self.selector.decide(&name) {
                Decision::Record => {}
                Decision::Hidden => {
                    self.warn_once(&name, || {
                        format!("{name}: hidden topic not recorded (use --include-hidden-topics)")
                    });
                    continue;
                }
                Decision::NotSelected | Decision::Excluded => continue,
            }
            let [type_name] = types.as_slice() else {
                // Not final: the graph may settle on one type once a stale endpoint leaves.
                self.warn_once(&name, || {
                    format!("{name}: published with several types {types:?}; not recorded")
                });
                continue;
            };
            let publishers = match self.node.get_publishers_info_by_topic(&name, false) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("{name}: cannot query its publishers: {e}");
                    continue;
                }
            };
            if publishers.is_empty() {
                // Subscribers only: wait for a publisher so its offered QoS can be matched.
                continue;
            }
            let offers: Vec<QosProfile> = publishers
                .iter()
                .map(|p| from_r2r_qos(&p.qos_profile))
                .collect();
            self.subscribe(&name, type_name, offers);
        }
    }

    fn subscribe(&mut self, name: &str, type_name: &str, offers: Vec<QosProfile>) {
        let req = requested_qos(name, &offers, &self.overrides);
        if req.mixed_reliability {
            log::warn!("{name}: some publishers offer best_effort; subscribing best_effort");
        }
        if req.mixed_durability {
            log::warn!("{name}: some publishers offer volatile; subscribing volatile");
        }
        match self
            .node
            .subscribe_raw(name, type_name, to_r2r_qos(&req.qos))
        {
            Ok(stream) => {
                let mut info = TopicInfo::new(name, type_name);
                info.offered_qos_profiles = offers;
                let handle = self.target.add_topic(info, None);
                log::info!(
                    "subscribed to {name} [{type_name}] ({:?}, {:?}, depth {})",
                    req.qos.reliability,
                    req.qos.durability,
                    req.qos.depth
                );
                self.subs.push(Subscription {
                    name: name.to_string(),
                    handle,
                    stream: Box::new(stream),
                    open: true,
                });
            }
            Err(e) => {
                // r2r only knows the types sourced when it was built; never abort for one topic.
                log::warn!(
                    "{name}: cannot subscribe to type {type_name} ({e}); topic skipped. \
                     Rebuild ringbag with the package providing it sourced."
                );
            }
        }
        self.done.insert(name.to_string());
    }

    /// Empties every stream, so r2r's 10-slot channels never overflow between spins.
    fn drain(&mut self, cx: &mut TaskContext<'_>) {
        for sub in self.subs.iter_mut().filter(|s| s.open) {
            loop {
                match sub.stream.poll_next_unpin(cx) {
                    Poll::Ready(Some(bytes)) => {
                        // A false return is a counted drop in the pipeline; nothing to do here.
                        let _ = self.target.push_owned(&sub.handle, bytes);
                    }
                    Poll::Ready(None) => {
                        log::warn!("{}: subscription closed by r2r", sub.name);
                        sub.open = false;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
        }
    }
}

/// Publishes raw CDR on live topics, for `ringbag play`.
pub struct RosPublisherSink {
    node: r2r::Node,
    publishers: HashMap<String, (String, r2r::PublisherUntyped)>,
    offers: HashMap<String, QosProfile>,
}

impl RosPublisherSink {
    pub fn new(node_name: &str) -> Result<Self, RosSourceError> {
        let ctx = r2r::Context::create().map_err(RosSourceError::Context)?;
        let node =
            r2r::Node::create(ctx, node_name, "").map_err(|source| RosSourceError::Node {
                name: node_name.into(),
                source,
            })?;
        Ok(RosPublisherSink {
            node,
            publishers: HashMap::new(),
            offers: HashMap::new(),
        })
    }

    /// Sets the profile a topic will be published with from what its publishers offered when
    /// it was recorded (ros2 bag play's rule: reliable / transient_local only if all were).
    /// Topics not declared get rclcpp's default profile.
    pub fn declare_topic(&mut self, topic: &str, recorded_offers: &[QosProfile]) {
        let qos = adapt_to_offers(recorded_offers).qos;
        self.offers.insert(topic.to_string(), qos);
    }

    pub fn publish(
        &mut self,
        topic: &str,
        type_name: &str,
        data: &[u8],
    ) -> Result<(), RosSourceError> {
        if !self.publishers.contains_key(topic) {
            let qos = self.offers.get(topic).cloned().unwrap_or_default();
            let publisher = self
                .node
                .create_publisher_untyped(topic, type_name, to_r2r_qos(&qos))
                .map_err(|source| RosSourceError::Publisher {
                    topic: topic.into(),
                    type_name: type_name.into(),
                    source,
                })?;
            self.publishers
                .insert(topic.to_string(), (type_name.to_string(), publisher));
        }
        let Some((declared, publisher)) = self.publishers.get(topic) else {
            return Ok(());
        };
        if declared != type_name {
            return Err(RosSourceError::TypeMismatch {
                topic: topic.into(),
                declared: declared.clone(),
                asked: type_name.into(),
            });
        }
        publisher
            .publish_raw(data)
            .map_err(|source| RosSourceError::Publish {
                topic: topic.into(),
                source,
            })
    }
}

// r2r's policy enums gain `BestAvailable` only for Iron and later (a cfg set by r2r's own build),
// so the matches below name the variants every distro has and send the rest to `Unknown`.

#[allow(unreachable_patterns)]
fn from_r2r_qos(q: &r2r::QosProfile) -> QosProfile {
    QosProfile {
        history: match q.history {
            HistoryPolicy::KeepAll => History::KeepAll,
            HistoryPolicy::KeepLast => History::KeepLast,
            HistoryPolicy::SystemDefault => History::SystemDefault,
            _ => History::Unknown,
        },
        depth: u64::try_from(q.depth).unwrap_or(u64::MAX),
        reliability: match q.reliability {
            ReliabilityPolicy::Reliable => Reliability::Reliable,
            ReliabilityPolicy::BestEffort => Reliability::BestEffort,
            ReliabilityPolicy::SystemDefault => Reliability::SystemDefault,
            _ => Reliability::Unknown,
        },
        durability: match q.durability {
            DurabilityPolicy::TransientLocal => Durability::TransientLocal,
            DurabilityPolicy::Volatile => Durability::Volatile,
            DurabilityPolicy::SystemDefault => Durability::SystemDefault,
            _ => Durability::Unknown,
        },
        deadline: duration_from_std(q.deadline),
        lifespan: duration_from_std(q.lifespan),
        liveliness: match q.liveliness {
            LivelinessPolicy::Automatic => Liveliness::Automatic,
            LivelinessPolicy::ManualByTopic => Liveliness::ManualByTopic,
            LivelinessPolicy::SystemDefault => Liveliness::SystemDefault,
            _ => Liveliness::Unknown,
        },
        liveliness_lease_duration: duration_from_std(q.liveliness_lease_duration),
        avoid_ros_namespace_conventions: q.avoid_ros_namespace_conventions,
    }
}

fn to_r2r_qos(q: &QosProfile) -> r2r::QosProfile {
    let mut out = r2r::QosProfile::default();
    out.history = match q.history {
        History::KeepAll => HistoryPolicy::KeepAll,
        History::KeepLast => HistoryPolicy::KeepLast,
        History::SystemDefault | History::Unknown => HistoryPolicy::SystemDefault,
    };
    out.depth = usize::try_from(q.depth).unwrap_or(usize::MAX);
    // best_available only comes from an override file; system_default is the closest policy
    // every distro's r2r can name.
    out.reliability = match q.reliability {
        Reliability::Reliable => ReliabilityPolicy::Reliable,
        Reliability::BestEffort => ReliabilityPolicy::BestEffort,
        _ => ReliabilityPolicy::SystemDefault,
    };
    out.durability = match q.durability {
        Durability::TransientLocal => DurabilityPolicy::TransientLocal,
        Durability::Volatile => DurabilityPolicy::Volatile,
        _ => DurabilityPolicy::SystemDefault,
    };
    out.deadline = duration_to_std(q.deadline);
    out.lifespan = duration_to_std(q.lifespan);
    // A request is compatible with any offer at least as strict; automatic is the loosest, so
    // deprecated manual_by_node maps there rather than to the stricter manual_by_topic.
    out.liveliness = match q.liveliness {
        Liveliness::Automatic | Liveliness::ManualByNode => LivelinessPolicy::Automatic,
        Liveliness::ManualByTopic => LivelinessPolicy::ManualByTopic,
        _ => LivelinessPolicy::SystemDefault,
    };
    out.liveliness_lease_duration = duration_to_std(q.liveliness_lease_duration);
    out.avoid_ros_namespace_conventions = q.avoid_ros_namespace_conventions;
    out
}
