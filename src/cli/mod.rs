//! Command line: clap definitions (`args`), raw → validated settings (`resolve`), dispatch.
//! Every failure becomes one line on stderr and an exit code: 2 for bad input (flags, bags),
//! 1 for a failure while working (I/O error, full disk).

pub mod args;
mod logger;
pub mod resolve;
pub mod units;

use clap::Parser;

use crate::bag::info::{info_json, info_text};
use crate::bag::reader::Bag;
use crate::record::{self, RecordError};
use args::{Cli, Command};

/// Exit codes.
pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;

pub fn main_entry() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return e.exit_code();
        }
    };
    logger::init(&cli.log_level);
    match cli.command {
        Command::Info(a) => cmd_info(&a),
        Command::Record(a) => cmd_record(&a),
        Command::Play(a) => cmd_play(&a),
        Command::Clock(a) => cmd_clock(&a),
        Command::Reindex(a) => cmd_reindex(&a),
    }
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
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else {
                print!("{}", report.summary());
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
            print!("{report}");
            EXIT_OK
        }
        Err(e) => fail(EXIT_BAD_INPUT, e),
    }
}

fn cmd_play(a: &args::PlayArgs) -> i32 {
    let settings = match resolve::play_settings(a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    if let Err(e) = crate::signals::install() {
        return fail(EXIT_FAILURE, format!("cannot install signal handlers: {e}"));
    }
    let sink_kind = a.sink.unwrap_or(if cfg!(feature = "ros") {
        args::SinkKind::Ros
    } else {
        args::SinkKind::Echo
    });
    let mut sink: Box<dyn crate::play::Sink> = match sink_kind {
        args::SinkKind::Echo => Box::new(crate::play::EchoSink {
            out: std::io::BufWriter::new(std::io::stdout().lock()),
            format: a.echo_format,
        }),
        args::SinkKind::Ros => match ros_sink() {
            Ok(s) => s,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        },
    };
    match crate::play::play(&settings, sink.as_mut(), &crate::signals::stop_requested) {
        Ok(r) => {
            drop(sink);
            eprintln!("ringbag: played {} messages", r.published);
            EXIT_OK
        }
        Err(crate::play::PlayError::Bag(e)) => fail(EXIT_BAD_INPUT, e),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

#[cfg(not(feature = "ros"))]
fn ros_sink() -> Result<Box<dyn crate::play::Sink>, String> {
    Err("--sink ros: this ringbag was built without the `ros` feature (use --sink echo, or rebuild with --features ros)".into())
}

#[cfg(feature = "ros")]
fn ros_sink() -> Result<Box<dyn crate::play::Sink>, String> {
    crate::source::ros::RosPublisherSink::new("ringbag_player")
        .map(|s| Box::new(crate::play::RosSink::new(s)) as Box<dyn crate::play::Sink>)
        .map_err(|e| e.to_string())
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
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else {
                print!("{}", info_text(&bag));
            }
            EXIT_OK
        }
        Err(e) => fail(EXIT_BAD_INPUT, e),
    }
}

fn cmd_record(a: &args::RecordArgs) -> i32 {
    let settings = match resolve::record_settings(a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    match record::run(settings) {
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
            let code = match &e {
                RecordError::Bag(crate::bag::BagError::AlreadyExists { .. })
                | RecordError::Clock(_) => EXIT_BAD_INPUT,
                _ => EXIT_FAILURE,
            };
            fail(code, e)
        }
    }
}
