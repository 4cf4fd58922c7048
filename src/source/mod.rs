//! Where messages come from.
pub mod cdr;
pub mod generator;
pub mod msgdef;
#[cfg(feature = "ros")]
mod rcl;
#[cfg(feature = "ros")]
pub mod ros;
pub mod select;
pub mod synthetic;
