//! info
