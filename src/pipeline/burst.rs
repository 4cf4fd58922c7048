//! Small messages cross to the writer in bursts.
//!
//! At 100 B a message, the per-message costs of the queue outweighed the message: a pooled
//! buffer taken and given back, a channel slot sent and received, two counters bumped, and
//! SQLite reading each payload from its own scattered buffer, last written by the other core.
//! A source thread that delivers many small messages ([`Bursts`], owned by that one thread)
//! instead appends them, each behind a 16-byte header, to one buffer of [`BURST_BYTES`], and
//! queues the whole buffer as one item: one channel operation, one budget reservation and one
//! counter update per topic for a few hundred messages, and the writer reads the payloads in
//! a line.
//!
//! The byte budget (`--max-cache-size`) counts a burst's message bytes, as it counts single
//! messages. Burst buffers have their own pool of at most [`BURST_BUFFERS`] buffers, so bursts
//! add at most that many times [`BURST_BYTES`] to memory, whatever the queue holds; when all
//! are in use, a source that must not wait sends its messages one by one instead.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::queue::{Item, Producer, Refusal, Shared, TopicHandle};
use super::stats::TopicStats;

/// Each message in a burst is preceded by its producer topic id (u32), its length (u32) and
/// its stamp (i64), in native byte order: the burst never leaves the process.
pub const BURST_HEADER_BYTES: usize = 16;
/// A burst buffer's size, headers included. At 100 B messages that is about 280 messages:
/// large enough that per-burst costs vanish, small enough that a writer batch (4,096
/// messages) is made of many and a source that flushes after every message wastes little.
pub const BURST_BYTES: usize = 32 << 10;
/// Messages up to this size go into bursts when the source delivers them with
/// [`Bursts::push`]; larger ones go alone, in their topic's pooled buffers, where a copy is
/// not repeated for every frame.
pub const BURST_MESSAGE_MAX: usize = 4 << 10;
/// Burst buffers that may exist at once (8 MiB): a quarter-second of 100 B messages at the
/// writer's full speed here, far more than the writer needs queued to stay busy.
pub const BURST_BUFFERS: usize = 256;

/// A queued burst: `count` messages, each a header and its bytes, back to back in `buf`.
#[derive(Debug)]
pub(crate) struct Burst {
    pub buf: Vec<u8>,
    /// Message bytes, headers not included: what the burst holds of the byte budget.
    pub payload: usize,
    pub count: usize,
}

/// The burst buffers: a bounded pool and the number that exist.
#[derive(Debug)]
pub(crate) struct BurstPool {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    /// Written only when a buffer is allocated or freed, never per message.
    live: AtomicUsize,
}

impl Default for BurstPool {
    fn default() -> Self {
        // As many places as buffers may exist, so a buffer given back always finds one.
        let (tx, rx) = crossbeam_channel::bounded(BURST_BUFFERS);
        BurstPool {
            tx,
            rx,
            live: AtomicUsize::new(0),
        }
    }
}

impl BurstPool {
    /// An empty buffer from the pool, or a new one while fewer than [`BURST_BUFFERS`] exist.
    fn take(&self) -> Option<Vec<u8>> {
        if let Ok(buf) = self.rx.try_recv() {
            return Some(buf);
        }
        if self.live.fetch_add(1, Relaxed) >= BURST_BUFFERS {
            self.live.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Vec::with_capacity(BURST_BYTES))
    }

    /// Buffers that exist now, pooled or in use.
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.live.load(Relaxed)
    }
}

/// Return a burst's buffer to the pool. One that grew past [`BURST_BYTES`] (a single message
/// larger than a burst, see [`Bursts::try_push_with`]) is freed instead, so the pool's
/// memory stays bounded.
pub(crate) fn give_back(shared: &Shared, mut buf: Vec<u8>) {
    let pool = &shared.bursts;
    if buf.capacity() > BURST_BYTES {
        pool.live.fetch_sub(1, Relaxed);
        return;
    }
    buf.clear();
    if pool.tx.try_send(buf).is_err() {
        pool.live.fetch_sub(1, Relaxed);
    }
}

pub(crate) fn read_header(h: &[u8; BURST_HEADER_BYTES]) -> (u32, usize, i64) {
    let [t0, t1, t2, t3, l0, l1, l2, l3, s @ ..] = *h;
    (
        u32::from_ne_bytes([t0, t1, t2, t3]),
        u32::from_ne_bytes([l0, l1, l2, l3]) as usize,
        i64::from_ne_bytes(s),
    )
}

fn header(topic: u32, len: u32, ts: i64) -> [u8; BURST_HEADER_BYTES] {
    let mut h = [0u8; BURST_HEADER_BYTES];
    h[..4].copy_from_slice(&topic.to_ne_bytes());
    h[4..8].copy_from_slice(&len.to_ne_bytes());
    h[8..].copy_from_slice(&ts.to_ne_bytes());
    h
}

/// The burst would not take the message: it is full and the queue refused it, or every
/// burst buffer is in use. Nothing was stamped; wait for the writer and try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

/// What the open burst holds of one topic, with the topic's counters.
struct Tally {
    stats: Arc<TopicStats>,
    count: u64,
    bytes: u64,
}

/// A source thread's burst in the making. Owned by one thread (it is not `Clone`): a
/// subscription's spin thread or a generator. Messages wait in it until it is full or
/// [`flush`](Self::flush)ed, so the source flushes whenever it is about to wait (the end of
/// a spin turn, a sleep). Dropping it flushes.
pub struct Bursts {
    producer: Producer,
    open: Option<Burst>,
    /// Per producer topic id: what the open burst holds of the topic.
    tally: Vec<Option<Tally>>,
    /// Topic ids with messages in the open burst.
    touched: Vec<u32>,
}

impl Bursts {
    pub fn new(producer: Producer) -> Bursts {
        Bursts {
            producer,
            open: None,
            tally: Vec::new(),
            touched: Vec::new(),
        }
    }

    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Stamp and queue a copy of `data`, in a burst if it is small. Never blocks; false when
    /// the message was dropped (and counted). A burst's messages are counted when it is
    /// queued (or dropped), so a message in the open burst returns true.
    pub fn push(&mut self, topic: &TopicHandle, data: &[u8]) -> bool {
        if data.len() > BURST_MESSAGE_MAX {
            // After the open burst, so the queue keeps the order messages arrived in.
            self.flush();
            return self.producer.push(topic, data);
        }
        self.push_small(topic, data.len(), |_, buf| buf.extend_from_slice(data))
    }

    /// As [`push`](Self::push) for a message of `len` bytes that `fill` appends to a buffer
    /// (the stamp given): a generator's message is written in place, with no copy.
    pub fn push_with(
        &mut self,
        topic: &TopicHandle,
        len: usize,
        fill: impl FnOnce(i64, &mut Vec<u8>),
    ) -> bool {
        if len > BURST_MESSAGE_MAX {
            self.flush();
            return self.producer.push_with(topic, fill);
        }
        self.push_small(topic, len, fill)
    }

    fn push_small(
        &mut self,
        topic: &TopicHandle,
        len: usize,
        fill: impl FnOnce(i64, &mut Vec<u8>),
    ) -> bool {
        if !self.has_room(len) {
            self.flush();
            if !self.open_burst() {
                // Every burst buffer is queued: go alone, as without bursts.
                return self.producer.push_with(topic, fill);
            }
        }
        self.append(topic, len, fill);
        true
    }

    /// For a source that may wait (a generator at full speed): append a message of `len`
    /// bytes that `fill` writes, or, when there is no room, do nothing and say so. The
    /// message is stamped only once it has a place, so a retried message carries the time it
    /// was made. A message larger than a burst gets a buffer of its own size, which is freed
    /// after writing; `len` is what `fill` writes, and a different length is still recorded
    /// as written.
    pub fn try_push_with(
        &mut self,
        topic: &TopicHandle,
        len: usize,
        fill: impl FnOnce(i64, &mut Vec<u8>),
    ) -> Result<(), NoRoom> {
        if !self.has_room(len) {
            if self.open.is_some() {
                self.try_flush()?;
            }
            if !self.open_burst() {
                return Err(NoRoom);
            }
        }
        self.append(topic, len, fill);
        Ok(())
    }

    /// Queue the open burst. A burst the queue has no room for is dropped, each of its
    /// messages counted per topic as a single message would be. False when it was dropped.
    pub fn flush(&mut self) -> bool {
        match self.send() {
            Ok(()) => true,
            Err((burst, refusal)) => {
                self.settle(|t| {
                    let counter = match refusal {
                        Refusal::Full => &t.stats.dropped,
                        Refusal::WriterGone => &t.stats.dropped_after_stop,
                    };
                    counter.fetch_add(t.count, Relaxed);
                });
                give_back(&self.producer.shared, burst.buf);
                false
            }
        }
    }

    /// Queue the open burst; when the queue has no room it stays open, to be tried again.
    pub fn try_flush(&mut self) -> Result<(), NoRoom> {
        match self.send() {
            Ok(()) => Ok(()),
            Err((burst, _)) => {
                self.open = Some(burst);
                Err(NoRoom)
            }
        }
    }

    /// Messages in the open burst, not yet queued.
    pub fn pending(&self) -> usize {
        self.open.as_ref().map_or(0, |b| b.count)
    }

    /// Offer the open burst to the queue (Ok when there is none or it has no message); on
    /// success its messages are counted as accepted.
    fn send(&mut self) -> Result<(), (Burst, Refusal)> {
        let Some(burst) = self.open.take() else {
            return Ok(());
        };
        if burst.count == 0 {
            self.open = Some(burst);
            return Ok(());
        }
        match self.producer.offer(Item::Burst(burst)) {
            Ok(()) => {
                self.settle(|t| {
                    t.stats.accepted.fetch_add(t.count, Relaxed);
                    t.stats.bytes.fetch_add(t.bytes, Relaxed);
                });
                Ok(())
            }
            Err((Item::Burst(b), refusal)) => Err((b, refusal)),
            Err((Item::One(_), _)) => unreachable!("offer hands back what it was given"),
        }
    }

    /// The burst that was open is queued or dropped: `count` each topic's part of it into
    /// the topic's counters, and start the next burst's tally from zero.
    fn settle(&mut self, count: impl Fn(&Tally)) {
        for id in self.touched.drain(..) {
            if let Some(t) = self.tally.get_mut(id as usize).and_then(Option::as_mut) {
                count(t);
                (t.count, t.bytes) = (0, 0);
            }
        }
    }

    /// Whether the open burst has room for a message of `len` bytes.
    fn has_room(&self, len: usize) -> bool {
        self.open
            .as_ref()
            .is_some_and(|b| b.count == 0 || b.buf.len() + BURST_HEADER_BYTES + len <= BURST_BYTES)
    }

    /// Make sure a burst is open (empty, when one is taken from the pool); false when every
    /// burst buffer is in use.
    fn open_burst(&mut self) -> bool {
        if self.open.is_some() {
            return true;
        }
        match self.producer.shared.bursts.take() {
            Some(buf) => {
                self.open = Some(Burst {
                    buf,
                    payload: 0,
                    count: 0,
                });
                true
            }
            None => false,
        }
    }

    /// Stamp and append one message to the open burst (there is one, with room).
    fn append(&mut self, topic: &TopicHandle, len: usize, fill: impl FnOnce(i64, &mut Vec<u8>)) {
        let burst = self.open.as_mut().expect("a burst is open");
        let ts = self.producer.clock.now_ns();
        let start = burst.buf.len();
        burst.buf.reserve(BURST_HEADER_BYTES + len);
        burst.buf.extend_from_slice(&[0; BURST_HEADER_BYTES]);
        fill(ts, &mut burst.buf);
        let written = burst.buf.len() - start - BURST_HEADER_BYTES;
        // Only `try_push_with` places a message over BURST_MESSAGE_MAX in a burst, and its
        // callers (the generator's small lanes) never pass one near 4 GiB.
        let len32 = u32::try_from(written).unwrap_or(u32::MAX);
        burst.buf[start..start + BURST_HEADER_BYTES].copy_from_slice(&header(
            topic.id(),
            len32,
            ts,
        ));
        burst.payload += written;
        burst.count += 1;
        let id = topic.id() as usize;
        if self.tally.len() <= id {
            self.tally.resize_with(id + 1, || None);
        }
        let t = self.tally[id].get_or_insert_with(|| Tally {
            stats: topic.stats_arc(),
            count: 0,
            bytes: 0,
        });
        if t.count == 0 {
            self.touched.push(topic.id());
        }
        t.count += 1;
        t.bytes += written as u64;
    }
}

impl Drop for Bursts {
    /// Whatever is still open is queued (or counted as dropped): a source that ends never
    /// leaves messages uncounted.
    fn drop(&mut self) {
        self.flush();
        // An empty burst stays open through a flush; its buffer goes back to the pool, or
        // the pool would count it as in use for good.
        if let Some(burst) = self.open.take() {
            give_back(&self.producer.shared, burst.buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::TopicInfo;
    use crate::pipeline::queue::tests::{one, stalled};
    use crossbeam_channel::Receiver;
    use std::sync::atomic::Ordering::Relaxed;

    /// A message as the writer sees it: producer topic id, stamp, bytes.
    type Unpacked = (u32, i64, Vec<u8>);

    /// Every message in what the queue holds, in order, with the queue items they came in.
    fn unpack(rx: &Receiver<Item>) -> (Vec<Unpacked>, Vec<Item>) {
        let items: Vec<Item> = rx.try_iter().collect();
        let msgs = items
            .iter()
            .flat_map(Item::messages)
            .map(|(t, ts, d)| (t, ts, d.to_vec()))
            .collect();
        (msgs, items)
    }

    fn msg(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i * 31 + j) as u8).collect()
    }

    #[test]
    fn small_messages_arrive_in_order_byte_for_byte_in_bursts_of_at_most_a_burst_buffer() {
        let (p, rx) = stalled(1 << 30, 1024);
        let a = p.add_topic(TopicInfo::new("/a", "t/msg/T"), None);
        let b = p.add_topic(TopicInfo::new("/b", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        let sent: Vec<(u32, Vec<u8>)> = (0..2000)
            .map(|i| (i as u32 % 2, msg(i, 1 + i % 200)))
            .collect();
        for (t, data) in &sent {
            assert!(bursts.push(if *t == 0 { &a } else { &b }, data));
        }
        // Nothing is counted before the burst it is in is queued.
        assert!(bursts.pending() > 0);
        let queued_before_flush = a.stats().accepted() + b.stats().accepted();
        assert!(bursts.flush());
        assert_eq!(bursts.pending(), 0);
        let (got, items) = unpack(&rx);
        assert_eq!(
            got.iter()
                .map(|(t, _, d)| (*t, d.clone()))
                .collect::<Vec<_>>(),
            sent
        );
        assert!(
            got.windows(2).all(|w| w[0].1 <= w[1].1),
            "stamps in push order"
        );
        assert!(
            items.len() > 1 && items.len() < 100,
            "{} items for 2000 messages",
            items.len()
        );
        for item in &items {
            let Item::Burst(b) = item else {
                panic!("a small message went alone")
            };
            assert!(b.buf.len() <= BURST_BYTES && b.buf.capacity() <= BURST_BYTES);
        }
        let payload: usize = sent.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(
            p.in_flight_bytes(),
            payload,
            "the budget counts message bytes"
        );
        assert_eq!(a.stats().accepted() + b.stats().accepted(), 2000);
        assert!(queued_before_flush < 2000);
        assert_eq!(
            a.stats().bytes() + b.stats().bytes(),
            payload as u64,
            "bytes counted per topic"
        );
    }

    #[test]
    fn a_large_message_goes_alone_after_the_small_ones_before_it() {
        let (p, rx) = stalled(1 << 30, 64);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        let big = msg(7, BURST_MESSAGE_MAX + 1);
        assert!(bursts.push(&t, b"one"));
        assert!(bursts.push(&t, &big));
        assert!(bursts.push(&t, b"two"));
        drop(bursts); // flushes
        let items: Vec<Item> = rx.try_iter().collect();
        assert_eq!(items.len(), 3);
        let datas: Vec<Vec<u8>> = items
            .iter()
            .flat_map(Item::messages)
            .map(|m| m.2.to_vec())
            .collect();
        assert_eq!(datas, [b"one".to_vec(), big, b"two".to_vec()]);
        assert!(matches!(items[1], Item::One(_)));
        assert_eq!(t.stats().accepted(), 3);
    }

    #[test]
    fn a_burst_refused_by_a_full_budget_is_dropped_and_counted_per_topic() {
        // 1000 bytes of budget, one of them already taken by a queued message.
        let (p, rx) = stalled(1000, 64);
        let a = p.add_topic(TopicInfo::new("/a", "t/msg/T"), None);
        let b = p.add_topic(TopicInfo::new("/b", "t/msg/T"), None);
        assert!(p.push(&a, b"x"));
        let mut bursts = Bursts::new(p.clone());
        for i in 0..10 {
            bursts.push(if i < 7 { &a } else { &b }, &[0u8; 100]);
        }
        assert!(!bursts.flush(), "1001 bytes do not fit in 1000");
        assert_eq!((a.stats().accepted(), a.stats().dropped()), (1, 7));
        assert_eq!((b.stats().accepted(), b.stats().dropped()), (0, 3));
        assert_eq!(
            p.in_flight_bytes(),
            1,
            "the refused burst's bytes are released"
        );
        assert_eq!(rx.len(), 1);
        assert_eq!(
            p.shared.bursts.rx.len(),
            1,
            "its buffer went back to the pool"
        );
        // Counted once: a later burst starts from zero.
        assert!(bursts.push(&b, &[0u8; 100]));
        one(rx.try_recv().unwrap());
        p.shared.in_flight.fetch_sub(1, Relaxed);
        assert!(bursts.flush());
        assert_eq!((b.stats().accepted(), b.stats().dropped()), (1, 3));
    }

    #[test]
    fn after_the_writer_stops_a_burst_counts_as_dropped_after_stop() {
        let (p, _rx) = stalled(1 << 20, 64);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        bursts.push(&t, b"late");
        bursts.push(&t, b"later");
        p.shared.writer_gone.store(true, Relaxed);
        assert!(!bursts.flush());
        assert_eq!(t.stats().dropped_after_stop(), 2);
        assert_eq!(t.stats().dropped(), 0);
    }

    #[test]
    fn a_waiting_source_keeps_its_burst_when_the_queue_is_full_and_stamps_only_what_is_placed() {
        // One slot: the first full burst takes it.
        let (p, rx) = stalled(1 << 30, 1);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        let per_burst = BURST_BYTES / (BURST_HEADER_BYTES + 100);
        let mut filled = 0;
        let mut push = |bursts: &mut Bursts, i: usize| {
            bursts.try_push_with(&t, 100, |_, buf| {
                filled += 1;
                buf.extend_from_slice(&msg(i, 100))
            })
        };
        for i in 0..2 * per_burst {
            push(&mut bursts, i).expect("room in the first two bursts");
        }
        // The second burst is full and the queue's one slot is taken.
        assert_eq!(push(&mut bursts, 2 * per_burst), Err(NoRoom));
        assert_eq!(bursts.pending(), per_burst, "the full burst stays open");
        assert_eq!(t.stats().dropped(), 0, "nothing dropped while waiting");
        // The writer takes the first burst; the retry now fits.
        let first = rx.try_recv().unwrap();
        p.shared.in_flight.fetch_sub(first.bytes(), Relaxed);
        push(&mut bursts, 2 * per_burst).expect("room now");
        let second = rx.try_recv().unwrap();
        drop(bursts);
        let third = rx.try_recv().unwrap();
        let got: Vec<Vec<u8>> = [&first, &second, &third]
            .into_iter()
            .flat_map(Item::messages)
            .map(|m| m.2.to_vec())
            .collect();
        let want: Vec<Vec<u8>> = (0..=2 * per_burst).map(|i| msg(i, 100)).collect();
        assert_eq!(got, want, "the refused message is recorded once, in order");
        assert_eq!(filled, 2 * per_burst + 1, "a refused message was not made");
        assert_eq!(t.stats().accepted() as usize, 2 * per_burst + 1);
    }

    #[test]
    fn burst_buffers_are_bounded_and_beyond_them_messages_go_alone_not_dropped() {
        let (p, rx) = stalled(1 << 30, 4 * BURST_BUFFERS);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        let per_burst = BURST_BYTES / (BURST_HEADER_BYTES + 1000);
        // Every buffer queued, and then some.
        let n = (BURST_BUFFERS + 1) * per_burst + 10;
        for i in 0..n {
            assert!(bursts.push(&t, &msg(i, 1000)));
        }
        bursts.flush();
        assert_eq!(p.shared.bursts.live(), BURST_BUFFERS);
        assert_eq!(t.stats().dropped(), 0);
        assert_eq!(t.stats().accepted() as usize, n);
        let (got, items) = unpack(&rx);
        assert_eq!(got.len(), n);
        assert!(got.iter().enumerate().all(|(i, m)| m.2 == msg(i, 1000)));
        let alone = items.iter().filter(|i| matches!(i, Item::One(_))).count();
        assert!(alone > 0, "with every buffer queued, messages went alone");
        // A written batch gives its buffers back; they are reused, not added to.
        let mut items = items;
        p.shared.in_flight.store(0, Relaxed);
        super::super::queue::give_back_batch(&p.shared, &[], &mut items);
        assert_eq!(p.shared.bursts.rx.len(), BURST_BUFFERS);
        bursts.push(&t, b"again");
        bursts.flush();
        assert_eq!(p.shared.bursts.live(), BURST_BUFFERS);
    }

    #[test]
    fn a_source_that_ends_gives_its_burst_buffer_back() {
        let (p, rx) = stalled(1 << 20, 8);
        let mut bursts = Bursts::new(p.clone());
        assert!(bursts.open_burst());
        assert!(bursts.flush(), "an empty burst queues nothing");
        drop(bursts);
        assert!(rx.is_empty());
        assert_eq!(p.shared.bursts.live(), 1);
        assert_eq!(
            p.shared.bursts.rx.len(),
            1,
            "back in the pool, not lost to it"
        );
    }

    #[test]
    fn a_buffer_grown_past_a_burst_is_freed_not_pooled() {
        let (p, rx) = stalled(1 << 30, 8);
        let t = p.add_topic(TopicInfo::new("/t", "t/msg/T"), None);
        let mut bursts = Bursts::new(p.clone());
        let big = msg(3, 2 * BURST_BYTES);
        bursts
            .try_push_with(&t, big.len(), |_, buf| buf.extend_from_slice(&big))
            .unwrap();
        bursts.flush();
        let mut items: Vec<Item> = rx.try_iter().collect();
        assert_eq!(items[0].messages().next().unwrap().2, &big[..]);
        assert_eq!(p.shared.bursts.live(), 1);
        super::super::queue::give_back_batch(&p.shared, &[], &mut items);
        assert_eq!(p.shared.bursts.live(), 0);
        assert!(p.shared.bursts.rx.is_empty());
    }
}
