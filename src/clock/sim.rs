//! `record --use-sim-time`: ROS time from the `/clock` topic (rosgraph_msgs/msg/Clock), as
//! `ros2 bag record --use-sim-time` stamps. The ROS source's spin thread stores each /clock
//! message's time; every stamp is one relaxed atomic load, so the per-message path stays
//! lock-free. rosbag2 waits for the first /clock before it subscribes to anything, so
//! does the ROS source: nothing is stamped before [`SimClock::started`].

use std::sync::atomic::{AtomicI64, Ordering};

use super::TimeSource;

/// No /clock message yet (a real ROS time is never `i64::MIN` ns).
const NOT_STARTED: i64 = i64::MIN;

/// The latest `/clock` time, in ns since the ROS epoch of the simulation.
#[derive(Debug)]
pub struct SimClock {
    ns: AtomicI64,
}

impl Default for SimClock {
    fn default() -> Self {
        SimClock {
            ns: AtomicI64::new(NOT_STARTED),
        }
    }
}

impl SimClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores the time of a /clock message. A time that goes back (a simulation reset) is
    /// taken as it is, as rclcpp's ROS time is.
    pub fn set(&self, ns: i64) {
        // Relaxed: a single value with no data published alongside it.
        self.ns.store(ns, Ordering::Relaxed);
    }

    /// Whether a /clock message has been seen.
    pub fn started(&self) -> bool {
        self.ns.load(Ordering::Relaxed) != NOT_STARTED
    }

    /// A serialized rosgraph_msgs/msg/Clock (CDR, little- or big-endian): its time in ns,
    /// or None when it is too short to be one. The layout is the encapsulation header, then
    /// `builtin_interfaces/Time` (int32 sec, uint32 nanosec), aligned from the header's end.
    pub fn parse_clock_message(cdr: &[u8]) -> Option<i64> {
        let header: [u8; 4] = cdr.get(..4)?.try_into().ok()?;
        let sec: [u8; 4] = cdr.get(4..8)?.try_into().ok()?;
        let nsec: [u8; 4] = cdr.get(8..12)?.try_into().ok()?;
        // Representation id 0x0000/0x0002 are big-endian, 0x0001/0x0003 little-endian.
        let (sec, nsec) = if header[1] & 1 == 1 {
            (i32::from_le_bytes(sec), u32::from_le_bytes(nsec))
        } else {
            (i32::from_be_bytes(sec), u32::from_be_bytes(nsec))
        };
        Some(i64::from(sec) * 1_000_000_000 + i64::from(nsec))
    }
}

impl TimeSource for SimClock {
    fn now_ns(&self) -> i64 {
        // Before the first /clock nothing is recorded; 0 is what rclcpp's ROS time reads then.
        match self.ns.load(Ordering::Relaxed) {
            NOT_STARTED => 0,
            ns => ns,
        }
    }

    fn custom_data(&self) -> Vec<(String, String)> {
        vec![("ringbag.clock".to_string(), "ros_sim_time".to_string())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_with_the_latest_clock_message_and_reads_zero_before_the_first() {
        let c = SimClock::new();
        assert!(!c.started());
        assert_eq!(c.now_ns(), 0);
        c.set(1_000_000_000_000);
        assert!(c.started());
        assert_eq!(c.now_ns(), 1_000_000_000_000);
        c.set(5);
        assert_eq!(
            c.now_ns(),
            5,
            "a simulation reset goes back, as ROS time does"
        );
    }

    #[test]
    fn parses_a_serialized_clock_message_in_either_byte_order() {
        // sec 1000, nanosec 250: CDR_LE header, then the two 4-byte fields.
        let le = [0, 1, 0, 0, 0xe8, 0x03, 0, 0, 250, 0, 0, 0];
        assert_eq!(SimClock::parse_clock_message(&le), Some(1_000_000_000_250));
        let be = [0, 0, 0, 0, 0, 0, 0x03, 0xe8, 0, 0, 0, 250];
        assert_eq!(SimClock::parse_clock_message(&be), Some(1_000_000_000_250));
        assert_eq!(SimClock::parse_clock_message(&le[..11]), None);
    }
}
