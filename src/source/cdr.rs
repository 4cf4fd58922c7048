//! CDR encoding helpers for the synthetic source.
