//! The reader thread and its bounded read-ahead queue. The reader walks the bag's
//! time-ordered merge and queues messages ahead of the scheduler, bounded both in messages
//! (`--read-ahead-queue-size`) and in bytes (`--read-ahead-queue-bytes`), so neither a slow
//! SQLite read nor a bag of large images reaches the timing path or memory without limit.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::bag::reader::{Bag, ReadFilter, ReadMessage};
use crate::bag::BagError;

/// What the reader hands the scheduler, in order.
#[derive(Debug)]
pub enum Item {
    Msg(ReadMessage),
    /// One pass over the bag is done and the next (`--loop`) starts.
    EndOfPass,
    /// Nothing more will come.
    Done,
    Failed(BagError),
}

#[derive(Default)]
struct State {
    items: VecDeque<Item>,
    /// Messages and their bytes in `items`.
    messages: usize,
    bytes: u64,
    /// The scheduler is gone: the reader stops.
    closed: bool,
}

/// A queue bounded in messages and bytes. One message is always admitted into an empty
/// queue, whatever its size, so a message larger than the byte bound still plays.
pub struct ReadAhead {
    state: Mutex<State>,
    has_items: Condvar,
    has_room: Condvar,
    max_messages: usize,
    max_bytes: u64,
}

impl ReadAhead {
    pub fn new(max_messages: usize, max_bytes: u64) -> Self {
        ReadAhead {
            state: Mutex::new(State::default()),
            has_items: Condvar::new(),
            has_room: Condvar::new(),
            max_messages: max_messages.max(1),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind; carry on with them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `item`, waiting for room; false once the consumer has closed the queue.
    pub fn push(&self, item: Item) -> bool {
        let size = match &item {
            Item::Msg(m) => m.data.len() as u64,
            _ => 0,
        };
        let is_msg = matches!(item, Item::Msg(_));
        let mut s = self.lock();
        while !s.closed
            && is_msg
            && s.messages > 0
            && (s.messages >= self.max_messages || s.bytes + size > self.max_bytes)
        {
            s = self.has_room.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.closed {
            return false;
        }
        if is_msg {
            s.messages += 1;
            s.bytes += size;
        }
        s.items.push_back(item);
        drop(s);
        self.has_items.notify_one();
        true
    }

    /// The next item, waiting at most `timeout` for one.
    pub fn pop(&self, timeout: Duration) -> Option<Item> {
        let mut s = self.lock();
        if s.items.is_empty() && !timeout.is_zero() {
            s = self
                .has_items
                .wait_timeout_while(s, timeout, |s| s.items.is_empty())
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let item = s.items.pop_front()?;
        if let Item::Msg(m) = &item {
            s.messages -= 1;
            s.bytes -= m.data.len() as u64;
        }
        drop(s);
        self.has_room.notify_one();
        Some(item)
    }

    /// Wait (at most `timeout`) until the queue holds `span_ns` of bag time, is full by either
    /// bound, or holds the end of a pass: the head start playback begins with.
    pub fn wait_ready(&self, span_ns: i64, timeout: Duration) {
        let ready = |s: &State| {
            let full = s.messages >= self.max_messages || s.bytes >= self.max_bytes;
            let ts = |i: Option<&Item>| match i {
                Some(Item::Msg(m)) => Some(m.timestamp),
                _ => None,
            };
            let ended = s.items.iter().any(|i| !matches!(i, Item::Msg(_)));
            let covered = match (ts(s.items.front()), ts(s.items.back())) {
                (Some(a), Some(b)) => b.saturating_sub(a) >= span_ns,
                _ => false,
            };
            full || ended || covered
        };
        let s = self.lock();
        let _ = self.has_items.wait_timeout_while(s, timeout, |s| !ready(s));
    }

    /// The consumer is done: wake and stop the reader.
    pub fn close(&self) {
        self.lock().closed = true;
        self.has_room.notify_all();
    }
}

/// How much nicer than the scheduler the reader thread runs.
const READER_NICE: libc::c_int = 5;

/// What the reader thread reads.
pub struct ReadJob<'a> {
    pub bag: &'a Bag,
    pub filter: ReadFilter,
    pub loop_playback: bool,
    /// Splits already reported skipped when the bag was opened.
    pub reported: HashSet<PathBuf>,
    /// `--rt-priority` of the scheduler: the reader then runs SCHED_FIFO one below it.
    pub rt_priority: Option<i32>,
}

/// The reader thread's body: pass after pass (`--loop`) until done or the queue is closed.
/// Damaged splits are left out with one warning each; everything readable plays.
pub fn read_into(job: ReadJob<'_>, queue: &ReadAhead) {
    // Below the scheduler: when both want a CPU, the scheduler's wake-up comes first. The
    // read-ahead queue lets the reader fall behind for a while without any message being late.
    // With --rt-priority the reader is real-time too, one below the scheduler, so a loaded
    // machine cannot starve it at high rates; at priority 1 it stays a normal thread (equal
    // FIFO priorities would not preempt each other).
    match job.rt_priority {
        Some(p) if p > 1 && super::schedule::realtime(p - 1).is_ok() => {}
        // SAFETY: nice() only changes this thread's priority (Linux threads have their own);
        // a failure leaves it as it was, which is harmless.
        _ => unsafe {
            libc::nice(READER_NICE);
        },
    }
    let mut reported = job.reported;
    let mut warn_skipped = |it: &mut crate::bag::reader::MessageIter| {
        for s in it.take_skipped() {
            if reported.insert(s.path.clone()) {
                match s.after {
                    None => log::warn!("skipped {}: {}", s.path.display(), s.reason),
                    Some((n, ts)) => log::warn!(
                        "skipped the rest of {} after {n} messages (the last at {ts} ns): {}",
                        s.path.display(),
                        s.reason
                    ),
                }
            }
        }
    };
    loop {
        let mut it = match job.bag.messages_tolerant(&job.filter) {
            Ok(it) => it,
            Err(e) => {
                queue.push(Item::Failed(e));
                return;
            }
        };
        warn_skipped(&mut it);
        let mut read = 0u64;
        while let Some(m) = it.next() {
            warn_skipped(&mut it);
            match m {
                Ok(m) => {
                    read += 1;
                    if !queue.push(Item::Msg(m)) {
                        return;
                    }
                }
                Err(e) => {
                    queue.push(Item::Failed(e));
                    return;
                }
            }
        }
        warn_skipped(&mut it);
        if it.undecodable() > 0 {
            log::warn!(
                "skipped {} messages whose data did not decompress (message compression mode)",
                it.undecodable()
            );
        }
        // A pass that found nothing would loop forever without playing anything.
        if !job.loop_playback || read == 0 {
            queue.push(Item::Done);
            return;
        }
        if !queue.push(Item::EndOfPass) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(len: usize) -> Item {
        Item::Msg(ReadMessage {
            topic: 0,
            timestamp: 0,
            data: vec![0; len],
        })
    }

    #[test]
    fn the_queue_holds_at_most_its_message_and_byte_bounds() {
        let q = ReadAhead::new(3, 1000);
        std::thread::scope(|s| {
            let producer = s.spawn(|| {
                for _ in 0..10 {
                    assert!(q.push(msg(400)));
                }
                q.push(Item::Done);
            });
            let mut got = 0;
            loop {
                {
                    let st = q.lock();
                    assert!(
                        st.messages <= 3 && st.bytes <= 1000,
                        "{} {}",
                        st.messages,
                        st.bytes
                    );
                }
                match q.pop(Duration::from_secs(5)).expect("an item within 5 s") {
                    Item::Msg(_) => got += 1,
                    Item::Done => break,
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(got, 10);
            producer.join().unwrap();
        });
    }

    #[test]
    fn a_message_larger_than_the_byte_bound_still_passes_alone() {
        let q = ReadAhead::new(10, 100);
        assert!(q.push(msg(5000)));
        assert!(matches!(q.pop(Duration::ZERO), Some(Item::Msg(m)) if m.data.len() == 5000));
        assert!(q.pop(Duration::ZERO).is_none());
    }

    #[test]
    fn closing_the_queue_releases_a_waiting_reader() {
        let q = ReadAhead::new(1, 100);
        assert!(q.push(msg(1)));
        std::thread::scope(|s| {
            let r = s.spawn(|| q.push(msg(1)));
            q.close();
            assert!(!r.join().unwrap());
        });
    }
}
