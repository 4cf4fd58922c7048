//! Where messages come from.
pub mod cdr;
pub mod synthetic;
#[cfg(feature = "ros")]
pub mod ros;
