//! QoS profiles as rosbag2 stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosProfile;
