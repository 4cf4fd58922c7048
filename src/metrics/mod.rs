//! Prometheus metrics (issue 25): the recorder's status in the text exposition format 0.0.4,
//! written to a textfile for node_exporter's textfile collector and served at `GET /metrics`.
//!
//! Both ways out carry the same text, rendered once per interval by the status loop from the
//! same [`crate::service::status::Status`] the status file holds: a scrape never touches the
//! recording's threads, it only copies the last rendered text.

pub mod http;
