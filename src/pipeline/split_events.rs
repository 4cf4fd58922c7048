//! Split events for the ROS side (`events/write_split`, as rosbag2's recorder publishes
//! them): the writer thread hands each one over a bounded queue and never waits on ROS.
//!
//! rosbag2 sends one at every split (size, duration, the `~/split_bagfile` service) with the
//! closed and the opened file, and one at the final close with the last file closed and no
//! file opened. A reader that falls behind loses events, counted here, never the writer's
//! time: a split happens at most a few times a second, so the small queue only fills when
//! the ROS side is stuck.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Events held for the reader; beyond this the newest are dropped (and counted).
pub const SPLIT_EVENT_QUEUE: usize = 64;

/// One split close, as `rosbag2_interfaces/msg/WriteSplitEvent` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitEvent {
    /// The split just closed, as the writer named it (the bag directory joined with the
    /// file name, as rosbag2's `closed_file`).
    pub closed_file: String,
    /// The split opened next; empty at the final close, as rosbag2 sends it.
    pub opened_file: String,
}

/// The writer thread's end: cloned into the pipeline's configuration.
#[derive(Debug, Clone)]
pub struct SplitEventSender {
    tx: Sender<SplitEvent>,
    dropped: Arc<AtomicU64>,
}

/// The ROS side's end.
#[derive(Debug)]
pub struct SplitEventReceiver {
    rx: Receiver<SplitEvent>,
    dropped: Arc<AtomicU64>,
}

/// A bounded queue of [`SPLIT_EVENT_QUEUE`] events.
pub fn split_events() -> (SplitEventSender, SplitEventReceiver) {
    let (tx, rx) = crossbeam_channel::bounded(SPLIT_EVENT_QUEUE);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        SplitEventSender {
            tx,
            dropped: dropped.clone(),
        },
        SplitEventReceiver { rx, dropped },
    )
}

impl SplitEventSender {
    /// Hands one event over without waiting: a full queue (or a reader gone) drops it and
    /// counts the drop.
    pub fn send(&self, closed: &Path, opened: Option<&Path>) {
        let event = SplitEvent {
            closed_file: closed.to_string_lossy().into_owned(),
            opened_file: opened
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        match self.tx.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(e)) => {
                let n = self.dropped.fetch_add(1, Relaxed) + 1;
                log::warn!(
                    "events/write_split: the ROS side is behind, event for {} dropped ({n} so far)",
                    e.closed_file
                );
            }
            // No reader (the ROS side failed to start or has stopped): nobody to tell.
            Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

impl SplitEventReceiver {
    /// The next waiting event, if any.
    pub fn try_recv(&self) -> Option<SplitEvent> {
        self.rx.try_recv().ok()
    }

    /// Events dropped so far because the queue was full or nobody read it.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_arrive_in_order_and_a_full_queue_drops_and_counts() {
        let (tx, rx) = split_events();
        tx.send(Path::new("bag/b_0.db3"), Some(Path::new("bag/b_1.db3")));
        tx.send(Path::new("bag/b_1.db3"), None);
        assert_eq!(
            rx.try_recv(),
            Some(SplitEvent {
                closed_file: "bag/b_0.db3".into(),
                opened_file: "bag/b_1.db3".into(),
            })
        );
        assert_eq!(
            rx.try_recv(),
            Some(SplitEvent {
                closed_file: "bag/b_1.db3".into(),
                opened_file: String::new(),
            })
        );
        assert_eq!(rx.try_recv(), None);
        for i in 0..SPLIT_EVENT_QUEUE + 3 {
            tx.send(Path::new(&format!("bag/b_{i}.db3")), None);
        }
        assert_eq!(rx.dropped(), 3);
        // The oldest are kept: the first event after the backlog is the first sent.
        assert_eq!(rx.try_recv().unwrap().closed_file, "bag/b_0.db3");
        drop(rx);
        let (tx2, rx2) = split_events();
        drop(rx2);
        tx2.send(Path::new("x"), None);
        assert_eq!(tx2.dropped.load(Relaxed), 1);
        drop(tx);
    }
}
