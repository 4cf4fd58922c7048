//! Command line: clap definitions (`args`), raw → validated settings (`resolve`), dispatch.
//! Every failure becomes one line on stderr and an exit code: 2 for bad input (flags, bags),
//! 1 for a failure while working (I/O error, full disk).

pub mod args;
mod gen_docs;
mod logger;
pub mod resolve;
mod upload_cmd;
/// Sizes and durations live below both the CLI and the config; re-exported for old paths.
pub use crate::units;

use clap::Parser;

use crate::bag::info::{info_json, info_text};
use crate::bag::reader::Bag;
use crate::record;
use args::{Cli, Command};

/// Exit codes.
pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;

pub fn main_entry() -> i32 {
    // First, before anything can take time: SIGHUP, SIGUSR1 and SIGUSR2 must not end a
    // recorder that is starting (see `signals`). SIGINT/SIGTERM keep their default action.
    if let Err(e) = crate::signals::install_requests() {
        return fail(EXIT_FAILURE, format!("cannot install signal handlers: {e}"));
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return clap_failure(&e),
    };
    if !matches!(cli.command, Command::Record(_) | Command::Daemon(_)) {
        // Only `record` and `daemon` document these requests; elsewhere a hangup ends the
        // process as it always does.
        if let Err(e) = crate::signals::restore_request_defaults() {
            return fail(EXIT_FAILURE, format!("cannot install signal handlers: {e}"));
        }
    }
    let level = match log_level(cli.log_level, std::env::var_os(LOG_ENV)) {
        Ok(l) => l,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    logger::init(level.filter());
    match cli.command {
        Command::Info(a) => cmd_info(&a),
        Command::Record(a) => cmd_record(&a),
        Command::Play(a) => cmd_play(&a, None),
        Command::Burst(a) => cmd_play(&a.play, Some(a.num_messages)),
        Command::Clock(a) => cmd_clock(&a),
        Command::Reindex(a) => cmd_reindex(&a),
        Command::Daemon(a) => cmd_daemon(&a),
        Command::Status(a) => cmd_status(&a),
        Command::Trigger(a) => cmd_trigger(&a),
        Command::Pause(a) => cmd_pause(&a, true),
        Command::Resume(a) => cmd_pause(&a, false),
        Command::Upload(a) => upload_cmd::run(&a),
        Command::List(a) => cmd_list(&a),
        Command::Convert(a) => cmd_convert(&a),
        Command::GenDocs(a) => match gen_docs::write_all(&a.out) {
            Ok(()) => EXIT_OK,
            Err(e) => fail(EXIT_FAILURE, format!("gen-docs: {e}")),
        },
    }
}

/// `ringbag convert`: bad options, unreadable inputs or an existing output are refused
/// before anything is written (exit 2); a failure while writing is exit 1.
fn cmd_convert(a: &args::ConvertArgs) -> i32 {
    use crate::convert::{convert, parse_options, ConvertError};
    let path = &a.output_options;
    let text = match crate::config::read_small_regular_file(path, 1 << 20) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("{}: {e}", path.display())),
    };
    let flavour = a.bag_format.unwrap_or_else(crate::bag::Flavour::from_env);
    let outputs = match parse_options(&text, flavour) {
        Ok(o) => o,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("{}: {e}", path.display())),
    };
    match convert(&a.inputs, &outputs) {
        Ok(summaries) => {
            for s in summaries {
                eprintln!(
                    "ringbag: wrote {} ({} messages, {} files)",
                    s.dir.display(),
                    s.metadata.message_count,
                    s.metadata.relative_file_paths.len()
                );
            }
            EXIT_OK
        }
        Err(e @ ConvertError::BadInput(_)) => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

/// `ringbag list`: what `ros2 bag list` prints, for the plugins ringbag has: one name a line,
/// or with `-v` the same layout as rosbag2's verbose listing. ringbag has one storage
/// (sqlite3), converts nothing (it records and plays CDR as is), and its compressor is named
/// as rosbag2's (`zstd`), so scripts that check for it find it.
fn cmd_list(a: &args::ListArgs) -> i32 {
    use args::PluginKind;
    let (kind, plugins): (&str, &[(&str, &str)]) = match a.plugin_type {
        PluginKind::Storage => (
            "storage",
            &[(
                "sqlite3",
                "rosbag2-compatible SQLite3 bags (ringbag's writer and reader)",
            )],
        ),
        PluginKind::Converter => ("converter", &[]),
        PluginKind::Compressor => ("compressor", &[("zstd", "Zstd, rosbag2's file mode")]),
        PluginKind::Decompressor => ("decompressor", &[("zstd", "Zstd, rosbag2's file mode")]),
    };
    let mut out = String::new();
    if a.verbose {
        out.push_str(&format!("available {kind} plugins are:\n"));
        for (name, what) in plugins {
            out.push_str(&format!("name: {name}\n\t{what}\n"));
        }
    } else {
        for (name, _) in plugins {
            out.push_str(&format!("{name}\n"));
        }
    }
    match emit(&out) {
        Ok(()) => EXIT_OK,
        Err(code) => code,
    }
}

/// `ringbag trigger`: one request to the recorder's control socket; prints its answer.
fn cmd_trigger(a: &args::TriggerArgs) -> i32 {
    use crate::snapshot::control::{send_trigger, ControlError};
    use crate::snapshot::trigger::{Outcome, TriggerRequest};
    let req = TriggerRequest {
        reason: Some(a.reason.clone()),
        pre_s: a.pre,
        post_s: Some(a.post),
        sent_unix_ns: None,
        command: None,
    };
    if let Err(e) = req.check_reason().and_then(|()| req.windows()) {
        return fail(EXIT_BAD_INPUT, e);
    }
    match send_trigger(&a.control_socket, &req) {
        Ok(Outcome::Started { bag }) => {
            eprintln!("ringbag: snapshot started: {bag}");
            EXIT_OK
        }
        Ok(Outcome::Extended { bag }) => {
            eprintln!("ringbag: snapshot extended: {bag}");
            EXIT_OK
        }
        Ok(Outcome::RateLimited { suppressed }) => fail(
            EXIT_FAILURE,
            format!(
                "rate-limited: too many snapshots in a short time ({suppressed} refused in a row)"
            ),
        ),
        Ok(Outcome::Refused { why }) => fail(EXIT_FAILURE, format!("refused: {why}")),
        // As with no recorder at all: the request cannot succeed until the recorder is set up
        // otherwise, so exit 2 (bad input), not 1 (a refusal worth retrying).
        Ok(Outcome::NoRing) => fail(
            EXIT_BAD_INPUT,
            format!(
                "{}: the recorder has no black-box ring, so there is nothing to snapshot; \
                 start `ringbag record` with --snapshot-size, or set snapshot_size in the \
                 service's config and reload it (systemctl reload ringbag)",
                a.control_socket.display()
            ),
        ),
        Ok(other @ (Outcome::Paused { .. } | Outcome::Resumed { .. })) => fail(
            EXIT_FAILURE,
            format!("unexpected answer to a trigger: {other:?}"),
        ),
        Err(e @ ControlError::NoRecorder { .. }) => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

/// `ringbag pause` / `ringbag resume`: flip the recorder's pause switch over its control
/// socket; one line on stderr says what happened (already paused / running is not an error).
fn cmd_pause(a: &args::PauseArgs, pause: bool) -> i32 {
    use crate::snapshot::control::{send_trigger, ControlError};
    use crate::snapshot::trigger::{ControlCommand, Outcome, TriggerRequest};
    let req = TriggerRequest {
        command: Some(if pause {
            ControlCommand::Pause
        } else {
            ControlCommand::Resume
        }),
        ..Default::default()
    };
    match send_trigger(&a.control_socket, &req) {
        Ok(Outcome::Paused { changed }) if pause => {
            eprintln!(
                "ringbag: recording {}",
                if changed { "paused" } else { "was already paused" }
            );
            EXIT_OK
        }
        Ok(Outcome::Resumed { changed }) if !pause => {
            eprintln!(
                "ringbag: recording {}",
                if changed { "resumed" } else { "was not paused" }
            );
            EXIT_OK
        }
        Ok(Outcome::Refused { why }) => fail(EXIT_FAILURE, format!("refused: {why}")),
        Ok(other) => fail(
            EXIT_FAILURE,
            format!(
                "{}: the recorder does not know pause/resume (an older ringbag?); it answered {other:?}",
                a.control_socket.display()
            ),
        ),
        Err(e @ ControlError::NoRecorder { .. }) => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

/// `ringbag status`: the service is not recording (status file older than 5 s).
pub const EXIT_STALE: i32 = 3;

fn cmd_daemon(a: &args::DaemonArgs) -> i32 {
    if a.check_config {
        return match crate::service::check_config(&a.config) {
            Ok(c) => {
                eprintln!(
                    "ringbag: {}: valid; recording root {}, status file {}",
                    a.config.display(),
                    c.output_root.display(),
                    c.status_file.display()
                );
                EXIT_OK
            }
            Err(e) => fail(EXIT_BAD_INPUT, e),
        };
    }
    match crate::service::run(&a.config) {
        Ok(()) => EXIT_OK,
        Err(e) if e.is_bad_input() => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn cmd_status(a: &args::StatusArgs) -> i32 {
    use crate::service::status::{read, Read};
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| crate::config::DEFAULT_STATUS_FILE.into());
    let (status, age, stale) = match read(&path) {
        Ok(Read::Fresh(s, age)) => (s, age, false),
        Ok(Read::Stale(s, age)) => (s, age, true),
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    if a.json {
        match serde_json::to_string_pretty(&status) {
            Ok(s) => {
                if let Err(code) = emit(&format!("{s}\n")) {
                    return code;
                }
            }
            Err(e) => return fail(EXIT_FAILURE, e),
        }
    } else {
        if let Err(code) = emit(&status.human(age)) {
            return code;
        }
    }
    if stale {
        eprintln!(
            "ringbag: warning: {}: written {:.0} s ago; the service is not recording",
            path.display(),
            age.as_secs_f64()
        );
        return EXIT_STALE;
    }
    EXIT_OK
}

/// Environment variable that sets the log level when `--log-level` is not given.
pub const LOG_ENV: &str = "RINGBAG_LOG";

/// `--log-level` wins; else `RINGBAG_LOG` (empty counts as unset); else info. An invalid
/// `RINGBAG_LOG` is refused like an invalid flag, never silently replaced by a default.
pub fn log_level(
    flag: Option<args::LogLevel>,
    env: Option<std::ffi::OsString>,
) -> Result<args::LogLevel, String> {
    use clap::ValueEnum;
    if let Some(l) = flag {
        return Ok(l);
    }
    let Some(raw) = env.filter(|v| !v.is_empty()) else {
        return Ok(args::LogLevel::Info);
    };
    let valid = "valid levels: error, warn, info, debug, trace";
    let text = raw.to_str().ok_or_else(|| {
        format!(
            "{LOG_ENV}={}: not a log level ({valid})",
            raw.to_string_lossy()
        )
    })?;
    args::LogLevel::from_str(text.trim(), true)
        .map_err(|_| format!("{LOG_ENV}={text}: not a log level ({valid})"))
}

/// A clap error as this program reports errors: `--help` and `--version` print as clap
/// renders them (stdout, exit 0); every real error becomes one `ringbag: error:` line on
/// stderr with exit 2, keeping clap's reason, valid values and tip but not its usage block.
fn clap_failure(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            e.exit_code()
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => fail(
            EXIT_BAD_INPUT,
            "a command is required: record, info, play, clock, reindex, daemon, status, trigger or upload (see `ringbag --help`)",
        ),
        _ => fail(
            EXIT_BAD_INPUT,
            one_line_clap_message(&e.render().to_string()),
        ),
    }
}

/// Folds clap's rendered error into one line: `error: ` dropped, the usage block and the
/// "For more information" hint dropped, detail lines (valid values, tips) joined with `; `.
pub fn one_line_clap_message(rendered: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut lines = rendered.lines().map(str::trim).peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        if let Some(usage) = line.strip_prefix("Usage:") {
            // A usage block may continue on indented lines; one line of it is enough.
            parts.push(format!("usage: {}", usage.trim()));
            while lines.peek().is_some_and(|l| !l.is_empty()) {
                lines.next();
            }
            continue;
        }
        let line = line.strip_prefix("error:").map_or(line, str::trim);
        // "[possible values: a, b]" reads as a clause of the sentence without its brackets.
        let line = line
            .strip_prefix('[')
            .and_then(|l| l.strip_suffix(']'))
            .unwrap_or(line);
        match parts.last_mut() {
            // "the following required arguments were not provided:" lists them below.
            Some(prev) if prev.ends_with(':') => {
                prev.push(' ');
                prev.push_str(line);
            }
            _ => parts.push(line.to_string()),
        }
    }
    parts.join("; ")
}

fn cmd_reindex(a: &args::ReindexArgs) -> i32 {
    let opts = crate::bag::reindex::ReindexOptions {
        dry_run: a.dry_run,
        discard_damaged: a.discard_damaged,
    };
    match crate::bag::reindex::reindex(&a.bag, opts) {
        Ok(report) => {
            if a.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => {
                        if let Err(code) = emit(&format!("{s}\n")) {
                            return code;
                        }
                    }
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else {
                if let Err(code) = emit(&report.summary()) {
                    return code;
                }
            }
            EXIT_OK
        }
        // A live bag is refused like bad input: nothing was tried, nothing changed.
        Err(
            e @ (crate::bag::BagError::NotFound { .. }
            | crate::bag::BagError::Invalid { .. }
            | crate::bag::BagError::Busy { .. }),
        ) => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn cmd_clock(a: &args::ClockCmdArgs) -> i32 {
    let settings = a.clock.settings();
    if let Err(e) = settings.validate() {
        return fail(EXIT_BAD_INPUT, e);
    }
    match crate::clock::diagnose(&settings, a.samples.max(1)) {
        Ok(report) => {
            if let Err(code) = emit(&report.to_string()) {
                return code;
            }
            EXIT_OK
        }
        Err(e) => fail(EXIT_BAD_INPUT, e),
    }
}

/// `ringbag play`, or with `burst` set `ringbag burst` (the same reader, plan and sinks,
/// without the schedule).
fn cmd_play(a: &args::PlayArgs, burst: Option<u64>) -> i32 {
    let mut settings = match resolve::play_settings(a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    if burst.is_some() {
        if let Some(flag) = timing_flag(&settings) {
            return fail(
                EXIT_BAD_INPUT,
                format!("burst plays without timing: {flag} has no meaning there"),
            );
        }
        settings.burst = burst;
    }
    // Opening the bag (and the sink) happens under the default signal disposition: a SIGTERM
    // while a damaged bag is read ends the process at once. See `signals`.
    let (bag, skipped) = match Bag::open_tolerant(&settings.bag) {
        Ok(b) => b,
        Err(e) => return fail(bag_error_code(&e), e),
    };
    for s in &skipped {
        log::warn!("skipped {s}");
    }
    let sink_kind = a.sink.unwrap_or(if cfg!(feature = "ros") {
        args::SinkKind::Ros
    } else {
        args::SinkKind::Echo
    });
    let mut sink: Box<dyn crate::play::Sink> = match sink_kind {
        args::SinkKind::Echo => Box::new(
            crate::play::EchoSink::new(
                std::io::BufWriter::with_capacity(64 << 10, Stdout::new()),
                a.echo_format,
            )
            .named("stdout"),
        ),
        args::SinkKind::Ros => match ros_sink(a) {
            Ok(s) if a.wait_for_all_acked.is_some() => {
                // rclcpp's wait_for_all_acked has no counterpart in the publishers ringbag
                // uses; said once, so a script does not believe the acks were awaited.
                log::warn!(
                    "--wait-for-all-acked: the ros sink cannot see acknowledgements; \
                     playback ends without waiting for them"
                );
                s
            }
            Ok(s) => s,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        },
    };
    // Playing has nothing to save: a stop that takes longer than this (a sink blocked on a
    // full pipe or a stuck transport) ends by the signal.
    if let Err(e) = crate::signals::install_with_grace(PLAY_STOP_GRACE) {
        return fail(EXIT_FAILURE, format!("cannot install signal handlers: {e}"));
    }
    // Keys only on a terminal in the foreground; the terminal's mode is restored when this
    // is dropped, or by the signal handlers if a signal ends the process.
    // A burst is over before a key could matter; it never takes the terminal.
    let keyboard = if a.disable_keyboard_controls || burst.is_some() {
        None
    } else {
        crate::play::Keyboard::start()
    };
    let r = crate::play::play_bag(
        &bag,
        &crate::play::skipped_paths(&skipped),
        &settings,
        sink.as_mut(),
        &crate::signals::stop_requested,
        keyboard.as_ref().map(|k| k.commands()),
    );
    drop(keyboard);
    match r {
        Ok(r) => {
            drop(sink);
            eprintln!("ringbag: played {} messages", r.published);
            EXIT_OK
        }
        Err(e) if e.is_bad_input() => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

/// The first of play's timing flags `settings` sets, which `burst` refuses (it publishes
/// without a schedule, so a rate, a delay or a `/clock` would silently do nothing).
fn timing_flag(s: &crate::play::PlaySettings) -> Option<&'static str> {
    if s.rate != 1.0 {
        Some("--rate")
    } else if s.delay_ns != 0 {
        Some("--delay")
    } else if s.loop_playback {
        Some("--loop")
    } else if s.start_paused {
        Some("--start-paused")
    } else if s.clock_hz.is_some() {
        Some("--clock")
    } else if s.clock_before != crate::play::ClockBefore::Never {
        Some("--clock-topics")
    } else if s.rt_priority.is_some() {
        Some("--rt-priority")
    } else {
        None
    }
}

/// How long `play` may take to stop cleanly after SIGINT/SIGTERM before it ends anyway.
const PLAY_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(not(feature = "ros"))]
fn ros_sink(_a: &args::PlayArgs) -> Result<Box<dyn crate::play::Sink>, String> {
    Err("--sink ros: this ringbag was built without the `ros` feature (use --sink echo, or rebuild with --features ros)".into())
}

/// The ros sink; with `--publish-service-requests` (checked in resolve) it calls the services.
#[cfg(feature = "ros")]
fn ros_sink(a: &args::PlayArgs) -> Result<Box<dyn crate::play::Sink>, String> {
    use crate::source::ros::RequestsFrom;
    let mut sink =
        crate::source::ros::RosPublisherSink::new("ringbag_player").map_err(|e| e.to_string())?;
    if a.publish_service_requests {
        sink = sink.calling_services(match a.service_requests_source {
            Some(args::ServiceRequestsSource::ClientIntrospection) => RequestsFrom::Client,
            // ros2 bag's default: the requests as the servers received them.
            Some(args::ServiceRequestsSource::ServiceIntrospection) | None => RequestsFrom::Service,
        });
    }
    Ok(Box::new(crate::play::RosSink::new(sink)))
}

/// Set when descriptor 1 was closed when the process started (`ringbag info BAG >&-`).
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Note whether stdout is closed. Called by the binary before the Rust runtime starts (it
/// then opens /dev/null on a closed descriptor 0, 1 or 2, and the closed stdout could no
/// longer be told apart from `>/dev/null`).
pub fn note_closed_stdout() {
    // SAFETY: fcntl(F_GETFD) only asks whether descriptor 1 is open; it changes nothing.
    let closed = unsafe { libc::fcntl(1, libc::F_GETFD) } == -1;
    STDOUT_CLOSED.store(closed, std::sync::atomic::Ordering::Relaxed);
}

/// Standard output without the standard library's "a closed stdout is a sink" rule (it
/// turns EBADF into success, and its start-up puts /dev/null in place of a closed stdout, so
/// `ringbag info BAG >&-` printed nothing and exited 0): every write error is returned, and
/// a stdout that was closed at start fails with EBADF. Unbuffered; wrap it in a `BufWriter`.
pub struct Stdout(std::mem::ManuallyDrop<std::fs::File>);

impl Stdout {
    pub fn new() -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: descriptor 1 is open for the life of the process (the runtime puts
        // /dev/null there if it was closed; were it not, writes would fail with EBADF, which
        // is what we want to see). ManuallyDrop: this File never closes it.
        Stdout(std::mem::ManuallyDrop::new(unsafe {
            std::fs::File::from_raw_fd(1)
        }))
    }
}

impl Default for Stdout {
    fn default() -> Self {
        Self::new()
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        }
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Write `text` to stdout. A reader that went away early (`ringbag info BAG | head`) is no
/// failure of ours: the rest is dropped quietly, where `print!` would panic. Any other write
/// error (a full disk behind a redirection, a closed stdout) is one error line and exit 1.
fn emit(text: &str) -> Result<(), i32> {
    use std::io::Write;
    match Stdout::new().write_all(text.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(fail(EXIT_FAILURE, format!("stdout: {e}"))),
    }
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    eprintln!("ringbag: error: {msg}");
    code
}

fn cmd_info(a: &args::InfoArgs) -> i32 {
    match Bag::open(&a.bag) {
        Ok(bag) => {
            if a.json {
                match serde_json::to_string_pretty(&info_json(&bag)) {
                    Ok(s) => {
                        if let Err(code) = emit(&format!("{s}\n")) {
                            return code;
                        }
                    }
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else {
                if let Err(code) = emit(&info_text(&bag)) {
                    return code;
                }
            }
            EXIT_OK
        }
        Err(e) => fail(bag_error_code(&e), e),
    }
}

/// The exit code of a bag that could not be opened: bad input, unless the process ran out
/// of file descriptors (a failure of the machine, and the same bag may open next time).
fn bag_error_code(e: &crate::bag::BagError) -> i32 {
    if e.is_out_of_descriptors() {
        EXIT_FAILURE
    } else {
        EXIT_BAD_INPUT
    }
}

fn cmd_record(a: &args::RecordArgs) -> i32 {
    let settings = match resolve::record_settings(a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let metrics = match resolve::metrics_settings(a) {
        Ok(m) => m,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    // With --recover the output's parent is a recording root, budgeted and recovered as the
    // daemon does: it must not run beside a daemon there, so it takes the root's lock, shared
    // (held until the end; several `record --recover` may share a root, as before). A root
    // that does not exist yet has nobody in it. Plain `record` makes a bag of its own and
    // budgets only that, so it may record beside a daemon.
    let _root_lock = if settings.recover {
        let root = settings
            .output
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        match root.is_dir() {
            true => match crate::bag::lock::RootLock::acquire_shared(root) {
                Ok(l) => Some(l),
                Err(e) if e.is_bad_input() => return fail(EXIT_BAD_INPUT, e),
                Err(e) => return fail(EXIT_FAILURE, e),
            },
            false => None,
        }
    } else {
        None
    };
    let result = if metrics.textfile.is_some() || metrics.listen.is_some() {
        // Before anything is recorded: a taken port is bad input, said in one line.
        let mut hooks = match crate::metrics::RecordHooks::start(metrics) {
            Ok(h) => h,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        };
        record::run_with(settings, &mut hooks)
    } else {
        record::run(settings)
    };
    match result {
        Ok(out) => {
            eprint!("{}", out.summary);
            if let crate::pipeline::StopReason::MaxSplits(n) = out.stop {
                eprintln!("ringbag: stopped after --max-splits {n}");
            }
            EXIT_OK
        }
        Err(f) => {
            if let Some(s) = &f.summary {
                eprint!("{s}");
            }
            let e = f.error;
            let code = if e.is_bad_input() {
                EXIT_BAD_INPUT
            } else {
                EXIT_FAILURE
            };
            fail(code, e)
        }
    }
}
