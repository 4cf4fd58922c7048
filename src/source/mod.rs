//! Where messages come from.
pub mod cdr;
pub mod generator;
pub mod msgdef;
#[cfg(feature = "ros")]
mod rcl;
#[cfg(feature = "ros")]
pub mod ros;
#[cfg(all(feature = "ros", ringbag_rosbag2_iface))]
pub mod ros_iface;
pub mod select;
pub mod synthetic;
