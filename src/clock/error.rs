//! Errors of the clock area. Every variant names the device so the one-line message is
//! enough to act on in the field.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("PTP device {}: no such file (is the NIC's PTP driver loaded? see `ls /dev/ptp*`)", device.display())]
    DeviceMissing { device: PathBuf },

    #[error("PTP device {}: permission denied (run as root or give the service user read access to the device)", device.display())]
    PermissionDenied { device: PathBuf },

    #[error("{} is not a PTP hardware clock ({reason})", device.display())]
    NotAPhc { device: PathBuf, reason: String },

    #[error("PTP device {}: cannot open: {source}", device.display())]
    Open {
        device: PathBuf,
        #[source]
        source: nix::Error,
    },

    #[error("PTP device {}: reading the clock failed: {source}", device.display())]
    Read {
        device: PathBuf,
        #[source]
        source: nix::Error,
    },

    #[error("PTP device {}: device lost, reopening failed: {reason}", device.display())]
    Lost { device: PathBuf, reason: String },

    #[error("invalid clock setting: {0}")]
    InvalidSettings(String),

    #[error("cannot start the clock tracking thread: {0}")]
    Spawn(#[source] std::io::Error),
}
