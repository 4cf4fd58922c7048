//! Where messages come from.
pub mod cdr;
pub mod generator;
pub mod synthetic;
#[cfg(feature = "ros")]
pub mod ros;
