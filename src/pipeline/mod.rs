//! The recording pipeline: subscription callbacks push into a bounded lock-free queue; one
//! writer thread drains it in batches into the bag.
//!
//! Hot path (`Producer::push*`): one clock read, one pooled buffer, one `try_send`, a few
//! relaxed atomics. It never blocks, never takes a lock, never allocates once the pool is
//! warm, and never touches SQLite. When the byte budget (`--max-cache-size`) or the queue's
//! slots are exhausted the message is dropped and counted per topic, as rosbag2 does.
//! A source thread's small messages (up to 4 KiB) go through its [`Bursts`] instead: a clock
//! read and a copy into the open burst per message, and the `try_send` and counters once per
//! burst of a few hundred (`burst`).

mod burst;
pub(crate) mod compress;
mod pause;
mod queue;
mod room;
mod split_events;
mod stats;
mod syncer;
mod writer_thread;

pub use burst::{Bursts, NoRoom, BURST_MESSAGE_MAX};
pub use pause::PauseSwitch;
pub use queue::{Pending, Producer, TopicHandle, NO_TAG};
pub use room::{Answer, Room};
pub use split_events::{
    split_events, SplitEvent, SplitEventReceiver, SplitEventSender, SPLIT_EVENT_QUEUE,
};
pub use stats::{DurationHistogram, RecordSummary, TopicStats, BATCH_BUCKETS_S};
pub use syncer::{SyncHealth, WRITEBACK_BYTES, WRITEBACK_INTERVAL};
pub use writer_thread::{
    Continuous, Pipeline, PipelineConfig, PipelineError, Progress, StopReason, Tap,
    DISK_RESERVE_BYTES,
};
