//! Plain `ringbag: level: message` lines on stderr; journald adds its own timestamps.

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

pub fn init(filter: log::LevelFilter) {
    // A second init (tests) keeps the first logger.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(filter);
}
