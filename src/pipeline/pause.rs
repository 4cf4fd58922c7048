//! Pause and resume of the continuous recording (`record --start-paused`, the space bar,
//! `ringbag pause` / `resume` over the control socket), as `ros2 bag record` has them.
//!
//! A message that reaches the writer while paused is not written to the bag and is counted
//! as `paused` (per topic and in total), never as a drop: it was left out on request. The
//! decision is made on the writer thread, once per batch, with one relaxed load: producers
//! (the subscription callbacks) are not touched at all, so the hot path is what it was. It
//! is made after the snapshot ring's tap, so **the black box keeps recording while paused**:
//! a snapshot taken during or after a pause still holds the history around it. The cost is
//! that paused messages go through the queue like recorded ones (they hold its byte budget
//! until the next batch), and that the switch takes effect at batch granularity: a message
//! accepted just before a pause and written just after it counts as paused (and the other
//! way round), within one batch (`batch_max_delay`, 50 ms).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The switch, shared by whoever pauses (keyboard, control socket) and the writer thread.
#[derive(Debug, Default)]
pub struct PauseSwitch {
    paused: AtomicBool,
    /// Messages left out while paused, in total (the per-topic counts are in `TopicStats`).
    messages: AtomicU64,
}

impl PauseSwitch {
    pub fn new(paused: bool) -> PauseSwitch {
        PauseSwitch {
            paused: AtomicBool::new(paused),
            messages: AtomicU64::new(0),
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    /// Pause (`true`) or resume; returns whether the state changed (false: it already was).
    /// Logged once per change, as `ros2 bag record` prints "Pausing recording." /
    /// "Resuming recording.".
    pub fn set(&self, paused: bool, by: &str) -> bool {
        let changed = self.paused.swap(paused, Relaxed) != paused;
        if changed {
            if paused {
                log::info!("Pausing recording. ({by})");
            } else {
                log::info!("Resuming recording. ({by})");
            }
        }
        changed
    }

    /// Flip the state (the space bar); returns the new state.
    pub fn toggle(&self, by: &str) -> bool {
        let now = !self.paused.fetch_xor(true, Relaxed);
        if now {
            log::info!("Pausing recording. ({by})");
        } else {
            log::info!("Resuming recording. ({by})");
        }
        now
    }

    /// Messages left out while paused so far.
    pub fn messages(&self) -> u64 {
        self.messages.load(Relaxed)
    }

    pub(crate) fn add_messages(&self, n: u64) {
        if n > 0 {
            self.messages.fetch_add(n, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_reports_a_change_only_once_and_toggle_flips() {
        let p = PauseSwitch::new(true);
        assert!(p.is_paused());
        assert!(!p.set(true, "test"));
        assert!(p.set(false, "test"));
        assert!(!p.is_paused());
        assert!(p.toggle("test"));
        assert!(!p.toggle("test"));
        p.add_messages(3);
        p.add_messages(0);
        assert_eq!(p.messages(), 3);
    }
}
