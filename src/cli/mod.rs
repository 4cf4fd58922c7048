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
                RecordError::Bag(crate::bag::BagError::AlreadyExists { .. }) => EXIT_BAD_INPUT,
                _ => EXIT_FAILURE,
            };
            fail(code, e)
        }
    }
}
