//! Live ROS 2 source and play sink (cargo feature `ros`).
//!
//! Selection and QoS rules live in [`super::select`], pure and tested without ROS 2; the rcl
//! calls (every `unsafe` block of the live path) live in [`super::rcl`]. This file decides
//! what to subscribe to and moves bytes.
//!
//! Ingest: the caller's thread owns one rcl node and one wait set. It waits for any ready
//! subscription, then takes from each ready one until rmw reports it empty, handing each
//! message to the target (a copy into a pooled buffer; the take buffer is reused). Nothing
//! sits between rmw's reader history and ringbag's queue, so a message is either in the bag,
//! counted as dropped by ringbag, or reported lost by the middleware's message-lost event.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use r2r::qos::{DurabilityPolicy, HistoryPolicy, LivelinessPolicy, ReliabilityPolicy};

use super::msgdef::{AmentPrefixPath, DefinitionCache};
pub use super::rcl::RequestsFrom;
use super::rcl::{Call, RclError, RclNode, Ready, SubId};
use super::select::{
    definition_type, duration_from_std, duration_to_std, is_service_event_topic,
    load_qos_overrides, requested_qos, Decision, QosOverrides, RosSourceOptions, SelectError,
    TopicSelector, SERVICE_EVENT_SUFFIX,
};
use crate::bag::qos::{Durability, History, Liveliness, Reliability};
use crate::bag::{MessageDefinition, QosProfile, TopicInfo};
use crate::clock::SimClock;
use crate::pipeline::{Bursts, Producer, TopicHandle};

/// The recorder's node name without `--node-name`: ros2 bag's `rosbag2_recorder`, so that
/// fleet tools find `/rosbag2_recorder/snapshot` where they would find rosbag2's.
pub const RECORDER_NODE_NAME: &str = super::select::DEFAULT_NODE_NAME;

/// Longest wait: bounds how late a stop request or a discovery poll is noticed.
const SPIN_SLICE: Duration = Duration::from_millis(20);

/// Messages taken from one subscription before the others get their turn. Each ready
/// subscription is still emptied before the next wait; the cap only interleaves them, so a
/// flooded topic cannot starve a quiet one into overflowing its reader history.
const TAKE_BURST: usize = 256;

/// Longest the stop waits for what the reader histories still hold.
const FINAL_DRAIN: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum RosSourceError {
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error("cannot initialise ROS 2 (is a ROS 2 environment sourced?): {0}")]
    Init(#[source] RclError),
    #[error("ROS 2 wait failed while recording: {0}")]
    Wait(#[source] RclError),
    #[error("--use-sim-time: cannot subscribe to /clock: {0}")]
    SimClock(#[source] RclError),
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
    #[error("cannot publish on {topic}: {source}")]
    Publish {
        topic: String,
        #[source]
        source: r2r::Error,
    },
    #[error("cannot create a publisher on {topic} [{type_name}]: {source}")]
    EventPublisher {
        topic: String,
        type_name: String,
        #[source]
        source: RclError,
    },
    #[error("cannot publish on {topic}: {source}")]
    EventPublish {
        topic: String,
        #[source]
        source: RclError,
    },
    #[error(
        "--publish-service-requests: cannot create a client of {service} [{type_name}]: {source}"
    )]
    ServiceClient {
        service: String,
        type_name: String,
        #[source]
        source: RclError,
    },
    #[error("--publish-service-requests: cannot call {service}: {source}")]
    ServiceCall {
        service: String,
        #[source]
        source: RclError,
    },
}

/// Where the source delivers: the pipeline's [`Producer`], or a test's collector.
pub trait RecordTarget {
    type Topic;
    /// Registers a topic (once per subscription, not on the hot path).
    fn add_topic(&self, info: TopicInfo, definition: Option<MessageDefinition>) -> Self::Topic;
    /// Copies one message in; must never block. False means dropped (the target counts it).
    fn push(&self, topic: &Self::Topic, data: &[u8]) -> bool;
    /// `n` messages of `topic` the middleware reported lost before they reached ringbag.
    fn lost(&self, topic: &Self::Topic, n: u64);
    /// Whether the middleware gives `topic`'s subscription a message-lost event at all
    /// (called once, when subscribing).
    fn loss_events(&self, _topic: &Self::Topic, _available: bool) {}
    fn stop_requested(&self) -> bool;
    /// Deliver what `push` may still hold back (a burst in the making). Called at the end
    /// of every spin turn, before the source waits again.
    fn flush(&self) {}
}

/// The recorder's own target: the pipeline, with small messages gathered into bursts
/// ([`Bursts`]) that go to the writer at the end of every spin turn, or sooner when full.
/// The spin thread is the only user, so the burst sits in a `RefCell`, not behind a lock.
pub struct Bursting(RefCell<Bursts>);

impl Bursting {
    pub fn new(producer: Producer) -> Bursting {
        Bursting(RefCell::new(Bursts::new(producer)))
    }
}

impl RecordTarget for Bursting {
    type Topic = TopicHandle;
    fn add_topic(&self, info: TopicInfo, definition: Option<MessageDefinition>) -> TopicHandle {
        self.0.borrow().producer().add_topic(info, definition)
    }
    fn push(&self, topic: &TopicHandle, data: &[u8]) -> bool {
        self.0.borrow_mut().push(topic, data)
    }
    fn flush(&self) {
        self.0.borrow_mut().flush();
    }
    fn lost(&self, topic: &TopicHandle, n: u64) {
        topic
            .stats()
            .lost_in_middleware
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    fn stop_requested(&self) -> bool {
        self.0.borrow().producer().stop_requested()
    }
}

/// Records the selected live topics into `producer` until it asks to stop.
pub fn run(opts: &RosSourceOptions, producer: Producer) -> Result<(), RosSourceError> {
    record(opts, &Bursting::new(producer))
}

/// As [`run`], stamping with ROS time (`--use-sim-time`): the source subscribes to /clock,
/// stores its time in `sim` (the pipeline's time source) and, as rosbag2 does, subscribes to
/// nothing else until the first /clock message has arrived.
pub fn run_with_sim_time(
    opts: &RosSourceOptions,
    producer: Producer,
    sim: &SimClock,
) -> Result<(), RosSourceError> {
    record_inner(opts, &Bursting::new(producer), Some(sim))
}

/// As [`run`], into any [`RecordTarget`]. Blocks the calling thread, which becomes the spin
/// thread.
pub fn record<T: RecordTarget>(opts: &RosSourceOptions, target: &T) -> Result<(), RosSourceError> {
    record_inner(opts, target, None)
}

fn record_inner<T: RecordTarget>(
    opts: &RosSourceOptions,
    target: &T,
    sim: Option<&SimClock>,
) -> Result<(), RosSourceError> {
    let selector = TopicSelector::new(opts)?;
    let overrides = load_qos_overrides(opts.qos_profile_overrides_path.as_deref())?;
    let node = RclNode::new(&opts.node_name).map_err(RosSourceError::Init)?;
    let mut rec = Recorder {
        node,
        selector,
        overrides,
        subscription_depth: opts.subscription_depth,
        include_unpublished: opts.include_unpublished_topics,
        ignore_leaf: opts.ignore_leaf_topics,
        // rosbag2 Jazzy reads definitions from the sourced environment's share/ directories
        // at subscription time; so does ringbag (each type's text is built once).
        definitions: DefinitionCache::new(AmentPrefixPath::from_env()),
        target,
        subs: Vec::new(),
        done: HashSet::new(),
        warned: HashSet::new(),
        hot: Vec::new(),
        clock: None,
        first_topic_id: 0,
    };
    let mut ready = Ready::default();
    if let Some(sim) = sim {
        // Best effort, keep last 1: matches a reliable or a best-effort /clock publisher,
        // and only the latest time matters.
        let qos = r2r::QosProfile::default().keep_last(1).best_effort();
        let id = rec
            .node
            .subscribe("/clock", "rosgraph_msgs/msg/Clock", qos)
            .map_err(RosSourceError::SimClock)?;
        rec.clock = Some((id, sim));
        rec.first_topic_id = id + 1;
        log::info!("--use-sim-time: waiting for /clock before recording");
        while !sim.started() {
            if target.stop_requested() {
                return Ok(());
            }
            rec.node
                .wait(SPIN_SLICE, &mut ready)
                .map_err(RosSourceError::Wait)?;
            rec.take_lost(&ready.lost_events);
            rec.take_clock();
        }
        log::info!("--use-sim-time: /clock found, recording");
    }
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
        rec.node
            .wait(slice, &mut ready)
            .map_err(RosSourceError::Wait)?;
        rec.take_lost(&ready.lost_events);
        rec.drain(&ready.messages, None);
    }
    // What already sits in the reader histories arrived before the stop: take it, but for
    // at most FINAL_DRAIN, so a publisher that keeps flooding cannot hold the stop up.
    let all: Vec<SubId> = (rec.first_topic_id..rec.first_topic_id + rec.subs.len()).collect();
    rec.drain(&all, Some(Instant::now() + FINAL_DRAIN));
    rec.take_lost(&all);
    Ok(())
}

/// One subscription, at the index the node gave it.
struct Subscription<H> {
    name: String,
    handle: H,
    /// A take failed; warned once, then skipped.
    failed: bool,
}

struct Recorder<'t, T: RecordTarget> {
    node: RclNode,
    selector: TopicSelector,
    overrides: QosOverrides,
    /// `--subscription-depth`: 0 keep-all, else the least keep-last depth.
    subscription_depth: u64,
    /// `--include-unpublished-topics`: subscribe without waiting for a publisher.
    include_unpublished: bool,
    /// `--ignore-leaf-topics`: subscribe only to topics something already subscribes to.
    ignore_leaf: bool,
    definitions: DefinitionCache<AmentPrefixPath>,
    target: &'t T,
    /// Indexed by the node's `SubId`.
    subs: Vec<Subscription<T::Topic>>,
    /// Topics subscribed to or skipped for good (unknown type).
    done: HashSet<String>,
    /// Topics already warned about, so each warning appears once.
    warned: HashSet<String>,
    /// Subscriptions that still had messages after their last burst (reused).
    hot: Vec<SubId>,
    /// `--use-sim-time`: the /clock subscription (not a recorded topic) and where its time goes.
    clock: Option<(SubId, &'t SimClock)>,
    /// The node's id of `subs[0]`: the /clock subscription, when there is one, comes first.
    first_topic_id: SubId,
}

impl<T: RecordTarget> Recorder<'_, T> {
    fn warn_once(&mut self, topic: &str, msg: impl FnOnce() -> String) {
        if self.warned.insert(topic.to_string()) {
            log::warn!("{}", msg());
        }
    }

    /// One discovery poll: subscribe to every newly visible selected topic with a publisher.
    fn discover(&mut self) {
        let topics = match self.node.topic_names_and_types() {
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
            match self.selector.decide(&name, &types) {
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
            let publishers = match self.node.publishers(&name) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("{name}: cannot query its publishers: {e}");
                    continue;
                }
            };
            if publishers.is_empty() && !self.include_unpublished {
                // Subscribers only: wait for a publisher so its offered QoS can be matched.
                continue;
            }
            // rosbag2's TopicFilter: a topic without any subscription is a leaf and not taken
            // now; it is not `done`, so a later poll takes it once a subscriber shows up.
            // Asked before this node subscribes, so its own subscription never counts.
            if self.ignore_leaf {
                match self.node.subscriber_count(&name) {
                    Ok(0) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        log::warn!("{name}: cannot count its subscribers: {e}");
                        continue;
                    }
                }
            }
            // With --include-unpublished-topics and no publisher, no offers: the request is
            // the default profile (or the override file's), as rosbag2 subscribes then.
            let offers: Vec<QosProfile> = publishers.iter().map(|p| from_r2r_qos(&p.qos)).collect();
            let type_hash = publishers
                .iter()
                .map(|p| p.type_hash.as_str())
                .find(|h| !h.is_empty())
                .unwrap_or_default()
                .to_string();
            self.subscribe(&name, type_name, offers, type_hash);
        }
    }

    fn subscribe(&mut self, name: &str, type_name: &str, offers: Vec<QosProfile>, hash: String) {
        let req = requested_qos(name, &offers, &self.overrides, self.subscription_depth);
        if req.mixed_reliability {
            log::warn!("{name}: some publishers offer best_effort; subscribing best_effort");
        }
        if req.mixed_durability {
            log::warn!("{name}: some publishers offer volatile; subscribing volatile");
        }
        match self.node.subscribe(name, type_name, to_r2r_qos(&req.qos)) {
            Ok(id) => {
                let mut info = TopicInfo::new(name, type_name);
                info.offered_qos_profiles = offers;
                // A service event topic stores its service's `.srv` definition, as rosbag2's.
                let definition = self
                    .definitions
                    .definition(definition_type(name, type_name), &hash);
                // Jazzy's rosbag2 writes the hash twice, in `topics` (and metadata.yaml's
                // topic_metadata) and in `message_definitions`; readers look in either.
                info.type_description_hash = hash;
                let handle = self.target.add_topic(info, Some(definition));
                let events = self.node.has_lost_event(id);
                self.target.loss_events(&handle, events);
                log::info!(
                    "subscribed to {name} [{type_name}] ({:?}, {:?}, {}{})",
                    req.qos.reliability,
                    req.qos.durability,
                    match req.qos.history {
                        History::KeepAll => "keep all".to_string(),
                        _ => format!("keep last {}", req.qos.depth),
                    },
                    if events {
                        ", message-lost events on"
                    } else {
                        ", no message-lost events from this middleware"
                    }
                );
                debug_assert_eq!(id, self.first_topic_id + self.subs.len());
                self.subs.push(Subscription {
                    name: name.to_string(),
                    handle,
                    failed: false,
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

    /// Takes from each of `ready` until rmw reports it empty, interleaving them a burst at a
    /// time. While recording (`until` None) it gives up early only on a stop request; the
    /// final drain gives up at `until`.
    fn drain(&mut self, ready: &[SubId], until: Option<Instant>) {
        let mut hot = std::mem::take(&mut self.hot);
        hot.clear();
        hot.extend_from_slice(ready);
        while !hot.is_empty() {
            hot.retain(|&id| self.take_burst(id));
            let give_up = match until {
                None => self.target.stop_requested(),
                Some(t) => Instant::now() >= t,
            };
            if give_up {
                break;
            }
        }
        self.hot = hot;
        // The source is about to wait: nothing it took may wait with it.
        self.target.flush();
    }

    /// Up to `TAKE_BURST` messages of one subscription; true if it may hold more.
    fn take_burst(&mut self, id: SubId) -> bool {
        if self.clock.is_some_and(|(c, _)| c == id) {
            self.take_clock();
            return false;
        }
        let Some(sub) = id
            .checked_sub(self.first_topic_id)
            .and_then(|i| self.subs.get_mut(i))
        else {
            return false;
        };
        if sub.failed {
            return false;
        }
        for _ in 0..TAKE_BURST {
            match self.node.take(id) {
                Ok(Some(bytes)) => {
                    // A false return is a counted drop in the target; nothing to do here.
                    let _ = self.target.push(&sub.handle, bytes);
                }
                Ok(None) => return false,
                Err(e) => {
                    log::warn!(
                        "{}: taking a message failed, topic no longer read: {e}",
                        sub.name
                    );
                    sub.failed = true;
                    return false;
                }
            }
        }
        true
    }

    /// Every /clock message waiting, in order: the last one's time is the clock's.
    fn take_clock(&mut self) {
        let Some((id, sim)) = self.clock else {
            return;
        };
        loop {
            match self.node.take(id) {
                Ok(Some(bytes)) => match SimClock::parse_clock_message(bytes) {
                    Some(ns) => sim.set(ns),
                    None => self.warn_once("bad:/clock", || {
                        "/clock: a message too short for a rosgraph_msgs/msg/Clock; ignored"
                            .to_string()
                    }),
                },
                Ok(None) => return,
                Err(e) => {
                    self.warn_once("take:/clock", || format!("/clock: taking failed: {e}"));
                    return;
                }
            }
        }
    }

    fn take_lost(&mut self, ids: &[SubId]) {
        for &id in ids {
            if self.clock.is_some_and(|(c, _)| c == id) {
                // Consumed so the event does not keep waking the wait; a lost /clock sample
                // only means a later one sets the time.
                let _ = self.node.take_lost(id);
                continue;
            }
            let Some(sub) = id
                .checked_sub(self.first_topic_id)
                .and_then(|i| self.subs.get(i))
            else {
                continue;
            };
            match self.node.take_lost(id) {
                Ok(0) => {}
                Ok(n) => {
                    self.target.lost(&sub.handle, n);
                    let name = sub.name.clone();
                    self.warn_once(&format!("lost:{name}"), || {
                        format!(
                            "{name}: the middleware reports {n} messages lost before they \
                             reached ringbag (counted; further losses are only counted)"
                        )
                    });
                }
                Err(e) => log::debug!("{}: reading the message-lost event failed: {e}", sub.name),
            }
        }
    }
}

/// Publishes raw CDR on live topics, for `ringbag play`.
pub struct RosPublisherSink {
    node: r2r::Node,
    node_name: String,
    /// (topic, publisher) in the order they were advertised.
    publishers: Vec<(String, Publisher)>,
    /// rcl's own node for the service event topics, made at the first one (see
    /// [`RosPublisherSink::advertise`]).
    events: Option<RclNode>,
    /// `--publish-service-requests`: call the services instead of publishing their events.
    service_requests: Option<RequestsFrom>,
}

enum Publisher {
    R2r(r2r::PublisherUntyped),
    /// On `events`.
    Rcl(super::rcl::PubId),
    /// A service client on `events`, with whether each kind of skipped request was said.
    Client {
        id: super::rcl::ClientId,
        service: String,
        warned_no_server: bool,
        warned_metadata: bool,
    },
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
            node_name: node_name.to_string(),
            publishers: Vec::new(),
            events: None,
            service_requests: None,
        })
    }

    /// Calls the services of the service event topics advertised from now on with their
    /// recorded requests, taken from the events `from` names (`--publish-service-requests`).
    pub fn calling_services(mut self, from: RequestsFrom) -> Self {
        self.service_requests = Some(from);
        self
    }

    /// Creates the publisher of `topic` with `qos` and returns its index for [`Self::publish`].
    /// Done before playing starts, as ros2 bag play does, so subscribers can match while
    /// `--delay` runs.
    pub fn advertise(
        &mut self,
        topic: &str,
        type_name: &str,
        qos: &QosProfile,
    ) -> Result<usize, RosSourceError> {
        let publisher = if is_service_event_topic(topic, type_name) {
            // r2r cannot name `pkg/srv/X_Event` types: rosbag2 plays a service's events as a
            // topic, so these go through rcl, on a node of ringbag's own next to r2r's
            // (`<node>_service_events`: the two share no handle to one rcl node).
            let events = match &mut self.events {
                Some(n) => n,
                None => self.events.insert(
                    RclNode::new(&format!("{}_service_events", self.node_name))
                        .map_err(RosSourceError::Init)?,
                ),
            };
            if self.service_requests.is_some() {
                // rosbag2's player: a generic client of the service, named by the topic.
                let service = topic.strip_suffix(SERVICE_EVENT_SUFFIX).unwrap_or(topic);
                let id = events
                    .service_client(service, type_name)
                    .map_err(|source| RosSourceError::ServiceClient {
                        service: service.into(),
                        type_name: type_name.into(),
                        source,
                    })?;
                Publisher::Client {
                    id,
                    service: service.to_string(),
                    warned_no_server: false,
                    warned_metadata: false,
                }
            } else {
                let id = events
                    .advertise(topic, type_name, to_r2r_qos(qos))
                    .map_err(|source| RosSourceError::EventPublisher {
                        topic: topic.into(),
                        type_name: type_name.into(),
                        source,
                    })?;
                Publisher::Rcl(id)
            }
        } else {
            Publisher::R2r(
                self.node
                    .create_publisher_untyped(topic, type_name, to_r2r_qos(qos))
                    .map_err(|source| RosSourceError::Publisher {
                        topic: topic.into(),
                        type_name: type_name.into(),
                        source,
                    })?,
            )
        };
        self.publishers.push((topic.to_string(), publisher));
        Ok(self.publishers.len() - 1)
    }

    /// Publishes CDR bytes (encapsulation header included) on an advertised publisher; on a
    /// service client, calls the service with the event's request (when it is one to send).
    pub fn publish(&mut self, publisher: usize, data: &[u8]) -> Result<(), RosSourceError> {
        let from = self.service_requests;
        let Some((topic, p)) = self.publishers.get_mut(publisher) else {
            return Ok(());
        };
        match (p, &mut self.events) {
            (Publisher::R2r(p), _) => {
                p.publish_raw(data)
                    .map_err(|source| RosSourceError::Publish {
                        topic: topic.clone(),
                        source,
                    })
            }
            (Publisher::Rcl(id), Some(events)) => {
                events
                    .publish(*id, data)
                    .map_err(|source| RosSourceError::EventPublish {
                        topic: topic.clone(),
                        source,
                    })
            }
            (
                Publisher::Client {
                    id,
                    service,
                    warned_no_server,
                    warned_metadata,
                },
                Some(events),
            ) => {
                let from = from.unwrap_or(RequestsFrom::Service);
                let call =
                    events
                        .call(*id, data, from)
                        .map_err(|source| RosSourceError::ServiceCall {
                            service: service.clone(),
                            source,
                        })?;
                // As rosbag2's player: a request with no server matched is dropped, with a
                // warning (here once per service, then at debug level).
                match call {
                    Call::NoServer if !*warned_no_server => {
                        *warned_no_server = true;
                        log::warn!(
                            "{service}: no server of the service: recorded requests are not \
                             sent while there is none"
                        );
                    }
                    Call::NoServer => log::debug!("{service}: no server; a request dropped"),
                    Call::NoRequestRecorded if !*warned_metadata => {
                        *warned_metadata = true;
                        log::warn!(
                            "{service}: a request event was recorded without its request \
                             (introspection metadata only): nothing to send"
                        );
                    }
                    Call::Undecodable => {
                        log::warn!("{service}: a recorded event does not decode; skipped")
                    }
                    Call::Sent | Call::NotARequest | Call::NoRequestRecorded => {}
                }
                Ok(())
            }
            // Rcl publishers and clients exist only once `events` does.
            (Publisher::Rcl(_) | Publisher::Client { .. }, None) => Ok(()),
        }
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
