//! Clocks that stamp messages. Owned by the PTP work (issue 6).
//!
//! Contract used by the rest of the crate: a `TimeSource` returns UTC nanoseconds since the
//! epoch, monotonic per source, cheaply (no syscall beyond a vDSO clock read).

/// Stamps messages with UTC nanoseconds since the Unix epoch.
pub trait TimeSource: Send + Sync {
    fn now_ns(&self) -> i64;
}

/// CLOCK_REALTIME through the vDSO.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl TimeSource for SystemClock {
    fn now_ns(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_nanos() as i64
    }
}
