//! Where messages come from.
pub mod cdr;
pub mod select;
pub mod synthetic;
#[cfg(feature = "ros")]
pub mod ros;
