//! Plain `ringbag: level: message` lines on stderr; journald adds its own timestamps.
//! When stderr *is* the journal (`JOURNAL_STREAM` names stderr's device and inode, as systemd
//! sets it for a service), entries go to journald natively instead: each with its priority
//! and the structured fields the log call carries (`RINGBAG_BAG`, `RINGBAG_SPLIT`,
//! `RINGBAG_TOPIC`).

use std::path::Path;

/// journald's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if r.level() <= log::Level::Warn {
            crate::service::remember_problem(r.level(), &r.args().to_string());
        }
        if self.enabled(r.metadata()) {
            eprintln!(
                "ringbag: {}: {}",
                r.level().as_str().to_lowercase(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

struct JournalLogger(systemd_journal_logger::JournalLog);

impl log::Log for JournalLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if r.level() <= log::Level::Warn {
            crate::service::remember_problem(r.level(), &r.args().to_string());
        }
        if self.enabled(r.metadata()) {
            self.0.log(r);
        }
    }
    fn flush(&self) {}
}

/// True when stderr is connected to the journal and journald's socket is there to take
/// native entries (else the stderr lines still reach it through the stream).
pub fn stderr_is_journal() -> bool {
    systemd_journal_logger::connected_to_journal() && Path::new(JOURNAL_SOCKET).exists()
}

pub fn init(filter: log::LevelFilter) {
    if stderr_is_journal() {
        if let Ok(j) = systemd_journal_logger::JournalLog::new() {
            let j = j.with_syslog_identifier("ringbag".to_string());
            if log::set_boxed_logger(Box::new(JournalLogger(j))).is_ok() {
                log::set_max_level(filter);
                return;
            }
        }
    }
    // A second init (tests) keeps the first logger.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(filter);
}
