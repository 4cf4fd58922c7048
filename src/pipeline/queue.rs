//! The producer side: what subscription callbacks and generators hold.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use crossbeam_utils::CachePadded;

use super::burst::{self, Burst, BURST_HEADER_BYTES};
use super::stats::TopicStats;
use crate::bag::{MessageDefinition, TopicInfo};
use crate::clock::TimeSource;

/// One queue slot: a message alone, or a burst of small ones.
#[derive(Debug)]
pub(crate) enum Item {
    One(Message),
    Burst(Burst),
}

/// One queued message. `data` is a pooled buffer that the writer hands back.
#[derive(Debug)]
pub(crate) struct Message {
    pub topic: u32,
    pub ts: i64,
    pub data: Vec<u8>,
    /// What `data` holds, for a producer that can reuse it: returned to the pool with the
    /// buffer (see [`Producer::try_push_reusing`]); [`NO_TAG`] otherwise.
    pub tag: u64,
}

impl Item {
    /// Message bytes it carries: what it holds of the queue's byte budget.
    pub fn bytes(&self) -> usize {
        match self {
            Item::One(m) => m.data.len(),
            Item::Burst(b) => b.payload,
        }
    }

    /// Messages it carries.
    pub fn count(&self) -> usize {
        match self {
            Item::One(_) => 1,
            Item::Burst(b) => b.count,
        }
    }

    /// Its messages in queue order: (producer topic id, stamp, bytes).
    pub fn messages(&self) -> Messages<'_> {
        match self {
            Item::One(m) => Messages::One(Some((m.topic, m.ts, &m.data))),
            Item::Burst(b) => Messages::Burst(&b.buf),
        }
    }
}

/// See [`Item::messages`].
pub(crate) enum Messages<'a> {
    One(Option<(u32, i64, &'a [u8])>),
    Burst(&'a [u8]),
}

impl<'a> Iterator for Messages<'a> {
    type Item = (u32, i64, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Messages::One(m) => m.take(),
            Messages::Burst(rest) => {
                let (head, body) = rest.split_first_chunk::<BURST_HEADER_BYTES>()?;
                let (topic, len, ts) = burst::read_header(head);
                // The producer wrote `len` bytes after every header; a short burst would be a
                // bug there, and ends the iteration rather than reading past the buffer.
                let (data, after) = body.split_at_checked(len)?;
                *rest = after;
                Some((topic, ts, data))
            }
        }
    }
}

/// A pooled buffer's tag when its content means nothing to anyone.
pub const NO_TAG: u64 = 0;

/// A buffer in the pool, with the tag of the message it last held.
#[derive(Debug)]
pub(crate) struct Pooled {
    pub buf: Vec<u8>,
    pub tag: u64,
}

/// Buffers at least this large go back to their own topic's pool ([`LargePool`]), smaller
/// ones to the shared pool.
pub const LARGE_BUFFER_BYTES: usize = 64 << 10;
/// Places in each topic's pool of large buffers: a 30 Hz camera has two or three frames
/// queued or in the writer's batch at a time.
const LARGE_POOL_SLOTS: usize = 4;

/// One topic's own pool of large buffers. In the shared pool a camera frame's buffer was
/// as likely to be taken by an IMU message as by the next frame, and the next frame then got
/// a small buffer to grow: a fresh multi-megabyte allocation, page faults on every page, and
/// the whole frame to write again. On this project's VM, where fresh memory costs a host
/// fault, such a push took 111 ms, stalling everything the source publishes behind it. A
/// topic's messages are about the same size, so its own buffers fit its next message.
#[derive(Debug)]
pub(crate) struct LargePool {
    tx: Sender<Pooled>,
    rx: Receiver<Pooled>,
}

impl Default for LargePool {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(LARGE_POOL_SLOTS);
        LargePool { tx, rx }
    }
}

/// Topic registration travels on its own channel; the writer drains it before every batch
/// and again whenever it meets a topic id it does not know yet.
#[derive(Debug)]
pub(crate) struct Register {
    pub id: u32,
    pub info: TopicInfo,
    pub definition: Option<MessageDefinition>,
    /// The topic's counters; the writer adds what it wrote and dropped as oversize.
    pub stats: Arc<TopicStats>,
}

/// State shared by producers and the writer thread.
pub(crate) struct Shared {
    /// Bytes queued or in the writer's current batch; bounded by `budget`. Padded, like
    /// `pool_bytes`, onto a cache line of its own: producers and the writer both write it,
    /// and the read-mostly fields around it (`stop`, `budget`, the channels) must not move
    /// between cores with it.
    pub in_flight: CachePadded<AtomicUsize>,
    pub budget: usize,
    /// Set when recording must end (signal, max-splits, writer failure).
    pub stop: AtomicBool,
    /// Set when the writer can take no more (failed); producers then drop without queueing.
    pub writer_gone: AtomicBool,
    /// Set by `Pipeline::finish` once no source pushes any more; the writer waits for it
    /// before it writes the final counts into the bag.
    pub sources_done: AtomicBool,
    pub next_topic: AtomicU32,
    /// Registered topics' counters. Locked only at registration and by the writer's
    /// once-a-second report, never on the push path.
    pub topics: Mutex<Vec<Arc<TopicStats>>>,
    pub pool_tx: Sender<Pooled>,
    pub pool_rx: Receiver<Pooled>,
    /// Capacity held by pooled buffers; bounded by `pool_budget` so the pool cannot hoard.
    pub pool_bytes: CachePadded<AtomicUsize>,
    pub pool_budget: usize,
    /// Burst buffers: their pool, and how many exist ([`burst`]).
    pub bursts: burst::BurstPool,
}

impl Shared {
    /// A snapshot of the registered topics' counters (locks briefly; never on the push path).
    pub fn topic_stats(&self) -> Vec<Arc<TopicStats>> {
        self.topics.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

/// Cheap to clone; hand one to each callback or generator thread.
#[derive(Clone)]
pub struct Producer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: Sender<Item>,
    pub(crate) reg_tx: Sender<Register>,
    pub(crate) clock: Arc<dyn TimeSource>,
}

/// A message the queue had no room for, handed back with its stamp.
#[derive(Debug)]
pub struct Pending {
    ts: i64,
    buf: Vec<u8>,
    tag: u64,
}

impl Pending {
    /// The buffer, for reuse.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }
    /// The buffer and the tag of the message it holds, for [`Producer::try_push_reusing`].
    pub fn into_tagged(self) -> (Vec<u8>, u64) {
        (self.buf, self.tag)
    }
}

/// A registered topic: its id and its counters.
#[derive(Clone, Debug)]
pub struct TopicHandle {
    id: u32,
    stats: Arc<TopicStats>,
}

impl TopicHandle {
    pub fn stats(&self) -> &TopicStats {
        &self.stats
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn stats_arc(&self) -> Arc<TopicStats> {
        self.stats.clone()
    }
}

impl Producer {
    /// Register a topic with the writer. Not for the hot path (it allocates and locks once).
    pub fn add_topic(&self, info: TopicInfo, definition: Option<MessageDefinition>) -> TopicHandle {
        let id = self.shared.next_topic.fetch_add(1, Relaxed);
        let mut stats = TopicStats::new(&info.name, &info.type_name);
        if let Some(q) = info.offered_qos_profiles.first() {
            stats.qos = format!(
                "{}/{}/{}({})",
                q.reliability.as_str(),
                q.durability.as_str(),
                q.history.as_str(),
                q.depth
            );
        }
        let stats = Arc::new(stats);
        if let Ok(mut t) = self.shared.topics.lock() {
            t.push(stats.clone());
        }
        // The writer owns the receiver until it exits; after that nothing is recorded anyway.
        let _ = self.reg_tx.send(Register {
            id,
            info,
            definition,
            stats: stats.clone(),
        });
        TopicHandle { id, stats }
    }

    /// Stamp with the recorder's clock and enqueue a copy of `data`. Never blocks; returns
    /// false when the message was dropped (and counted).
    pub fn push(&self, topic: &TopicHandle, data: &[u8]) -> bool {
        let ts = self.clock.now_ns();
        let mut buf = self.take_buffer(topic, data.len() >= LARGE_BUFFER_BYTES);
        buf.extend_from_slice(data);
        self.enqueue(topic, ts, buf, NO_TAG, true).is_ok()
    }

    /// As `push`, taking ownership of a buffer the middleware already allocated (r2r hands
    /// over a `Vec<u8>`), so nothing is copied.
    pub fn push_owned(&self, topic: &TopicHandle, data: Vec<u8>) -> bool {
        let ts = self.clock.now_ns();
        self.enqueue(topic, ts, data, NO_TAG, true).is_ok()
    }

    /// Stamp, let `fill` write the message straight into a pooled buffer, enqueue. Used by
    /// the synthetic source so generating costs no extra copy.
    pub fn push_with(&self, topic: &TopicHandle, fill: impl FnOnce(i64, &mut Vec<u8>)) -> bool {
        let ts = self.clock.now_ns();
        let mut buf = self.take_buffer(topic, true);
        fill(ts, &mut buf);
        self.enqueue(topic, ts, buf, NO_TAG, true).is_ok()
    }

    /// Like `push_with`, for producers that can update a buffer in place: `fill` gets a pooled
    /// buffer *with its old content* and the tag that content was queued with, and returns the
    /// tag of what it wrote. A producer that recognises its own earlier message (the
    /// synthetic camera: same template, another frame number) rewrites only what differs,
    /// instead of the whole megabyte; any other tag means unknown bytes, to be cleared first.
    /// `wait` as in [`try_push_with`](Self::try_push_with): with `false` a full queue counts a
    /// drop; with `true` the message comes back as [`Pending`].
    pub fn try_push_reusing(
        &self,
        topic: &TopicHandle,
        spare: Option<(Vec<u8>, u64)>,
        wait: bool,
        fill: impl FnOnce(i64, &mut Vec<u8>, u64) -> u64,
    ) -> Result<(), Option<Pending>> {
        let ts = self.clock.now_ns();
        let (mut buf, old_tag) = spare.unwrap_or_else(|| self.take_tagged(topic, true));
        let tag = fill(ts, &mut buf, old_tag);
        self.enqueue(topic, ts, buf, tag, !wait).map_err(|buf| {
            // A counted drop handed its buffer to the pool already (`buf` is empty then).
            wait.then_some(Pending { ts, buf, tag })
        })
    }

    /// Like `push_with`, but when the queue is full it hands the message back instead of
    /// counting a drop: for sources that may wait (the synthetic generator in `max` mode).
    pub fn try_push_with(
        &self,
        topic: &TopicHandle,
        buf: Option<Vec<u8>>,
        fill: impl FnOnce(i64, &mut Vec<u8>),
    ) -> Result<(), Pending> {
        let ts = self.clock.now_ns();
        let mut buf = buf.unwrap_or_else(|| self.take_buffer(topic, true));
        buf.clear();
        fill(ts, &mut buf);
        self.enqueue(topic, ts, buf, NO_TAG, false)
            .map_err(|buf| Pending {
                ts,
                buf,
                tag: NO_TAG,
            })
    }

    /// Re-offer a message that `try_push_with` handed back. It keeps its original stamp: the
    /// message was "received" when it was made, and its header says so.
    pub fn retry(&self, topic: &TopicHandle, pending: Pending) -> Result<(), Pending> {
        let Pending { ts, buf, tag } = pending;
        self.enqueue(topic, ts, buf, tag, false)
            .map_err(|buf| Pending { ts, buf, tag })
    }

    pub fn stop_requested(&self) -> bool {
        self.shared.stop.load(Relaxed)
    }

    /// Ask the recording to end (used by signal handling and by sources that are done).
    pub fn request_stop(&self) {
        self.shared.stop.store(true, Relaxed);
    }

    /// Bytes currently queued or being written.
    pub fn in_flight_bytes(&self) -> usize {
        self.shared.in_flight.load(Relaxed)
    }

    pub fn now_ns(&self) -> i64 {
        self.clock.now_ns()
    }

    fn take_buffer(&self, topic: &TopicHandle, large: bool) -> Vec<u8> {
        let (mut b, _) = self.take_tagged(topic, large);
        b.clear();
        b
    }

    /// A pooled buffer as it came back, content and tag included: from the topic's own pool
    /// of large buffers first when the message may be large (`large`: known to be, or of
    /// unknown size; a topic of small messages has nothing there), else from the shared pool.
    fn take_tagged(&self, topic: &TopicHandle, large: bool) -> (Vec<u8>, u64) {
        let own = || topic.stats.large_buffers.rx.try_recv();
        let shared = || self.shared.pool_rx.try_recv();
        let taken = if large {
            own().or_else(|_| shared())
        } else {
            shared()
        };
        match taken {
            Ok(p) => {
                self.shared.pool_bytes.fetch_sub(p.buf.capacity(), Relaxed);
                (p.buf, p.tag)
            }
            Err(_) => (Vec::new(), NO_TAG),
        }
    }

    fn enqueue(
        &self,
        topic: &TopicHandle,
        ts: i64,
        data: Vec<u8>,
        tag: u64,
        count_drop: bool,
    ) -> Result<(), Vec<u8>> {
        let len = data.len();
        let item = Item::One(Message {
            topic: topic.id,
            ts,
            data,
            tag,
        });
        match self.offer(item) {
            Ok(()) => {
                topic.stats.accepted.fetch_add(1, Relaxed);
                topic.stats.bytes.fetch_add(len as u64, Relaxed);
                Ok(())
            }
            Err((Item::One(m), _)) if !count_drop => Err(m.data),
            Err((Item::One(m), refusal)) => {
                let counter = match refusal {
                    // Not a full queue: the recording is over (max-splits, a failure).
                    // Counted apart so the summary says why.
                    Refusal::WriterGone => &topic.stats.dropped_after_stop,
                    Refusal::Full => &topic.stats.dropped,
                };
                counter.fetch_add(1, Relaxed);
                give_back(&self.shared, Some(&topic.stats), m.data, tag);
                Err(Vec::new())
            }
            Err((Item::Burst(_), _)) => unreachable!("offer hands back what it was given"),
        }
    }

    /// Reserve `item`'s bytes in the budget and queue it; never blocks. A refused item comes
    /// back with the reason, its bytes released, for the caller to count or keep.
    pub(crate) fn offer(&self, item: Item) -> Result<(), (Item, Refusal)> {
        let shared = &self.shared;
        if shared.writer_gone.load(Relaxed) {
            return Err((item, Refusal::WriterGone));
        }
        // Reserve bytes first so the budget holds even with many producers racing.
        let len = item.bytes();
        let before = shared.in_flight.fetch_add(len, Relaxed);
        if before + len > shared.budget && before > 0 {
            shared.in_flight.fetch_sub(len, Relaxed);
            return Err((item, Refusal::Full));
        }
        self.tx.try_send(item).map_err(|e| {
            shared.in_flight.fetch_sub(len, Relaxed);
            let refusal = match e {
                TrySendError::Full(_) => Refusal::Full,
                TrySendError::Disconnected(_) => Refusal::WriterGone,
            };
            (e.into_inner(), refusal)
        })
    }
}

/// Why [`Producer::offer`] did not queue an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No room: the byte budget or the queue's slots are used up.
    Full,
    /// The writer has stopped; nothing more will be written.
    WriterGone,
}

/// The pool a buffer of capacity `cap` goes back to: its topic's own when it is large,
/// else the shared one.
fn pool_for<'a>(
    shared: &'a Shared,
    topic: Option<&'a TopicStats>,
    cap: usize,
) -> &'a Sender<Pooled> {
    match topic {
        Some(t) if cap >= LARGE_BUFFER_BYTES => &t.large_buffers.tx,
        _ => &shared.pool_tx,
    }
}

/// Return a written batch's buffers to the pools, with one update of the pools' byte count
/// for the whole batch instead of one per message: that counter is also written by the
/// producer, so each update moves its cache line between cores (at 100 B messages the writer
/// spent ~3 % of its time here). When the batch does not fit the budget as a whole, each
/// buffer is judged alone, as [`give_back`] does. `topics` is indexed by the items' topic ids.
pub(crate) fn give_back_batch(
    shared: &Shared,
    topics: &[Option<Arc<TopicStats>>],
    items: &mut Vec<Item>,
) {
    let topic = |id: u32| topics.get(id as usize).and_then(|t| t.as_deref());
    let total: usize = items
        .iter()
        .map(|i| match i {
            Item::One(m) => m.data.capacity(),
            Item::Burst(_) => 0,
        })
        .sum();
    let fits = shared.pool_bytes.fetch_add(total, Relaxed) + total <= shared.pool_budget;
    if !fits {
        shared.pool_bytes.fetch_sub(total, Relaxed);
    }
    let mut refused = 0;
    for item in items.drain(..) {
        let m = match item {
            // Bursts have their own pool, outside the byte budget: a fixed number of buffers
            // of a fixed size.
            Item::Burst(b) => {
                burst::give_back(shared, b.buf);
                continue;
            }
            Item::One(m) if !fits => {
                give_back(shared, topic(m.topic), m.data, m.tag);
                continue;
            }
            Item::One(m) => m,
        };
        let cap = m.data.capacity();
        if cap == 0 {
            continue;
        }
        let pooled = Pooled {
            buf: m.data,
            tag: m.tag,
        };
        if pool_for(shared, topic(m.topic), cap)
            .try_send(pooled)
            .is_err()
        {
            refused += cap;
        }
    }
    if refused > 0 {
        shared.pool_bytes.fetch_sub(refused, Relaxed);
    }
}

/// Return a buffer (with the tag of what it holds) to its pool if the pools' budget has room
/// for its capacity and the pool a free place; otherwise free it.
pub(crate) fn give_back(shared: &Shared, topic: Option<&TopicStats>, buf: Vec<u8>, tag: u64) {
    let cap = buf.capacity();
    if cap == 0 {
        return;
    }
    if shared.pool_bytes.fetch_add(cap, Relaxed) + cap > shared.pool_budget {
        shared.pool_bytes.fetch_sub(cap, Relaxed);
        return;
    }
    if let Err(e) = pool_for(shared, topic, cap).try_send(Pooled { buf, tag }) {
        shared
            .pool_bytes
            .fetch_sub(e.into_inner().buf.capacity(), Relaxed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::SystemClock;

    /// A producer whose queue nobody drains: the state a stalled writer leaves.
    pub(crate) fn stalled(budget: usize, slots: usize) -> (Producer, Receiver<Item>) {
        let (tx, rx) = crossbeam_channel::bounded(slots);
        let (reg_tx, _reg_rx) = crossbeam_channel::unbounded();
        let (pool_tx, pool_rx) = crossbeam_channel::bounded(16);
        let shared = Arc::new(Shared {
            in_flight: CachePadded::new(AtomicUsize::new(0)),
            budget,
            stop: AtomicBool::new(false),
            writer_gone: AtomicBool::new(false),
            sources_done: AtomicBool::new(false),
            next_topic: AtomicU32::new(0),
            topics: Mutex::new(Vec::new()),
            pool_tx,
            pool_rx,
            pool_bytes: CachePadded::new(AtomicUsize::new(0)),
            pool_budget: 1 << 20,
            bursts: burst::BurstPool::default(),
        });
        let p = Producer {
            shared,
            tx,
            reg_tx,
            clock: Arc::new(SystemClock),
        };
        (p, rx)
    }

    #[test]
    fn a_full_byte_budget_drops_and_counts_per_topic() {
        let (p, rx) = stalled(1000, 1024);
        let a = p.add_topic(TopicInfo::new("/a", "t/msg/T"), None);
        let b = p.add_topic(TopicInfo::new("/b", "t/msg/T"), None);
        let msg = [7u8; 300];
        let results: Vec<bool> = (0..5).map(|_| p.push(&a, &msg)).collect();
        assert_eq!(
            results,
            [true, true, true, false, false],
            "3 × 300 B fit in 1000 B"
        );
        assert!(!p.push(&b, &msg));
        assert_eq!((a.stats().accepted(), a.stats().dropped()), (3, 2));
        assert_eq!((b.stats().accepted(), b.stats().dropped()), (0, 1));
        assert_eq!(p.in_flight_bytes(), 900, "rejected bytes are released");
        assert_eq!(rx.len(), 3);
    }

    #[test]
    fn a_full_slot_queue_drops_even_with_bytes_to_spare() {
        let (p, rx) = stalled(1 << 30, 4);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let ok = (0..10).filter(|_| p.push(&t, b"x")).count();
        assert_eq!(ok, 4);
        assert_eq!(t.stats().dropped(), 6);
        assert_eq!(p.in_flight_bytes(), 4);
        drop(rx);
    }

    #[test]
    fn one_message_larger_than_the_budget_is_still_accepted_into_an_empty_queue() {
        // Otherwise a 2 MB image could never be recorded with a 1 MB cache.
        let (p, _rx) = stalled(100, 8);
        let t = p.add_topic(TopicInfo::new("/img", "t/msg/T"), None);
        assert!(p.push(&t, &[0u8; 500]));
        assert!(!p.push(&t, &[0u8; 10]));
    }

    #[test]
    fn a_retried_message_keeps_the_stamp_it_was_made_with() {
        let (p, rx) = stalled(1 << 20, 1);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        assert!(p.push(&t, b"first"));
        let mut made_at = 0;
        let pending = p
            .try_push_with(&t, None, |ts, buf| {
                made_at = ts;
                buf.extend_from_slice(&ts.to_le_bytes());
            })
            .expect_err("queue is full");
        assert_eq!(t.stats().dropped(), 0, "handed back, not dropped");
        let first = one(rx.try_recv().unwrap());
        p.shared.in_flight.fetch_sub(first.data.len(), Relaxed);
        p.retry(&t, pending).expect("room now");
        let item = one(rx.try_recv().unwrap());
        assert_eq!(
            item.ts, made_at,
            "stored stamp equals the stamp inside the message"
        );
        assert_eq!(item.data, made_at.to_le_bytes());
    }

    #[test]
    fn pooled_buffers_are_reused_not_reallocated() {
        let (p, rx) = stalled(1 << 20, 8);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        assert!(p.push(&t, &[1u8; 4096]));
        let item = one(rx.try_recv().unwrap());
        let ptr = item.data.as_ptr();
        p.shared.in_flight.fetch_sub(item.data.len(), Relaxed);
        give_back(&p.shared, Some(t.stats()), item.data, item.tag);
        assert!(p.push(&t, &[2u8; 1000]));
        let again = one(rx.try_recv().unwrap());
        assert_eq!(again.data.as_ptr(), ptr, "the pooled allocation came back");
        assert_eq!(again.data, vec![2u8; 1000]);
    }

    #[test]
    fn a_large_buffer_goes_back_to_its_own_topic_and_a_small_one_to_the_shared_pool() {
        let (p, rx) = stalled(1 << 30, 16);
        let cam = p.add_topic(TopicInfo::new("/cam", "t/msg/T"), None);
        let imu = p.add_topic(TopicInfo::new("/imu", "t/msg/T"), None);
        let topics = vec![Some(cam.stats.clone()), Some(imu.stats.clone())];
        let frame = vec![3u8; 2 * LARGE_BUFFER_BYTES];
        assert!(p.push(&cam, &frame));
        assert!(p.push(&imu, &[1u8; 300]));
        let mut batch: Vec<Item> = rx.try_iter().collect();
        let ptrs: Vec<*const u8> = batch
            .iter()
            .map(|i| i.messages().next().unwrap().2.as_ptr())
            .collect();
        let (frame_ptr, small_ptr) = (ptrs[0], ptrs[1]);
        p.shared.in_flight.fetch_sub(frame.len() + 300, Relaxed);
        give_back_batch(&p.shared, &topics, &mut batch);
        // The IMU comes first and must not take the camera's frame buffer; it gets the
        // small one back from the shared pool.
        assert!(p.push(&imu, &[2u8; 300]));
        assert!(p.push(&cam, &frame));
        let again: Vec<Message> = rx.try_iter().map(one).collect();
        assert_eq!(again[0].data.as_ptr(), small_ptr);
        assert_eq!(
            again[1].data.as_ptr(),
            frame_ptr,
            "the camera's own buffer came back"
        );
        assert_eq!(again[1].data, frame);
    }

    fn item(cap: usize) -> Item {
        Item::One(Message {
            topic: 0,
            ts: 0,
            data: Vec::with_capacity(cap),
            tag: NO_TAG,
        })
    }

    /// The single message a queue item carries (the tests here push no bursts).
    pub(crate) fn one(item: Item) -> Message {
        match item {
            Item::One(m) => m,
            Item::Burst(b) => panic!("a burst of {} where one message was expected", b.count),
        }
    }

    /// Take every buffer out of the pool, as producers would; returns how many there were and
    /// the pool's byte count before, which must equal their capacity. Empty afterwards.
    fn pooled(p: &Producer) -> (usize, usize) {
        let counted = p.shared.pool_bytes.load(Relaxed);
        let (mut n, mut cap) = (0, 0);
        while let Ok(b) = p.shared.pool_rx.try_recv() {
            n += 1;
            cap += b.buf.capacity();
            p.shared.pool_bytes.fetch_sub(b.buf.capacity(), Relaxed);
        }
        assert_eq!(cap, counted, "the count matches what the pool holds");
        (n, counted)
    }

    #[test]
    fn a_batch_given_back_keeps_the_pool_within_its_byte_and_slot_bounds() {
        // Within budget: the whole batch is pooled with one count update.
        let (p, _rx) = stalled(1 << 20, 8);
        let mut batch: Vec<Item> = (0..10).map(|_| item(1000)).collect();
        give_back_batch(&p.shared, &[], &mut batch);
        assert!(batch.is_empty());
        assert_eq!(pooled(&p), (10, 10_000));
        // More buffers than the pool's 16 slots: the refused ones are freed and uncounted.
        let mut batch: Vec<Item> = (0..20).map(|_| item(1000)).collect();
        give_back_batch(&p.shared, &[], &mut batch);
        assert_eq!(pooled(&p), (16, 16_000));
        // Over the 1 MiB byte budget as a whole: judged one by one, and the pool holds
        // whatever fits, never more.
        let mut batch: Vec<Item> = vec![item(600 << 10), item(300 << 10), item(600 << 10)];
        give_back_batch(&p.shared, &[], &mut batch);
        assert!(batch.is_empty());
        assert_eq!(pooled(&p), (2, (600 << 10) + (300 << 10)));
    }
}
