//! `ringbag upload PATH…`: every bag under the paths into the bucket, once, for a field
//! engineer's laptop. Exit 0 when everything is verified in the bucket, 1 when something is
//! not (one line per failed file, then a summary), 2 on bad input.
//!
//! Retries are bounded (a few attempts with backoff) so a run always ends; a configuration
//! error (credentials, bucket, clock, TLS, DNS) ends the run at once, named as what it is.

use std::path::PathBuf;
use std::time::Instant;

use super::args::UploadArgs;
use super::{fail, EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK};
use crate::upload::backoff::Backoff;
use crate::upload::engine::{is_bag_dir, plan_bag, plan_root, FileReport, STALE_UPLOAD_AGE};
use crate::upload::{ErrorClass, FileOutcome, PlannedBag, Uploader};

/// Attempts at one file before `ringbag upload` gives up on it.
pub const ATTEMPTS: u32 = 5;

pub fn run(a: &UploadArgs) -> i32 {
    let resolved = match super::resolve::upload_settings(
        a,
        &crate::upload::settings::Environment::process(),
    ) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let mut bags: Vec<PlannedBag> = Vec::new();
    for p in &a.paths {
        if !p.is_dir() {
            return fail(
                EXIT_BAD_INPUT,
                format!(
                    "{}: not a directory (give a bag or a recording root)",
                    p.display()
                ),
            );
        }
        if is_bag_dir(p) {
            bags.push(plan_bag(p));
            continue;
        }
        match plan_root(p) {
            Ok(b) if b.is_empty() => {
                return fail(EXIT_BAD_INPUT, format!("{}: no bags in it", p.display()))
            }
            Ok(b) => bags.extend(b),
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        }
    }
    let uploader = match Uploader::new(&resolved.target, resolved.tuning, resolved.key) {
        Ok(u) => u,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    // One cheap signed GET first: a wrong key, bucket, clock or endpoint is named by the
    // server's own error code (a HEAD's answer has no body to name it).
    let mut backoff = Backoff::default();
    let mut attempt = 0;
    loop {
        match uploader.client().probe() {
            Ok(()) => break,
            Err(e) if e.class() == ErrorClass::Transient && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                let d = backoff.next_delay();
                log::warn!(
                    "{e}; attempt {} of {ATTEMPTS} in {:.1} s",
                    attempt + 1,
                    d.as_secs_f64()
                );
                std::thread::sleep(d);
            }
            Err(e) => return fail(EXIT_FAILURE, e),
        }
    }
    let started = Instant::now();
    let counters = uploader.counters();
    let mut sent_files = 0u64;
    let mut sent_bytes = 0u64;
    let mut present = 0u64;
    let mut failed: Vec<String> = Vec::new();
    let mut fatal = false;
    'bags: for bag in &bags {
        let mut retry = |name: &str, e: &crate::upload::UploadError, attempt: u32| {
            if e.class() != ErrorClass::Transient || attempt >= ATTEMPTS {
                return false;
            }
            if attempt == 1 {
                backoff.reset();
            }
            let d = backoff.next_delay();
            log::warn!(
                "{}/{name}: {e}; attempt {} of {ATTEMPTS} in {:.1} s",
                bag.dir.display(),
                attempt + 1,
                d.as_secs_f64()
            );
            std::thread::sleep(d);
            true
        };
        let mut show = |r: &FileReport| match &r.result {
            Ok(FileOutcome::AlreadyThere) => {
                present += 1;
                eprintln!("ringbag: {} {} bytes: already in the bucket", r.key, r.size);
            }
            Ok(FileOutcome::Uploaded {
                bytes_sent,
                parts_reused,
                ..
            }) => {
                sent_files += 1;
                sent_bytes += bytes_sent;
                let how = if *parts_reused > 0 {
                    format!("resumed ({parts_reused} parts were already there)")
                } else {
                    "done".into()
                };
                eprintln!("ringbag: {} {} bytes: {how}", r.key, r.size);
            }
            Err(_) => {}
        };
        let out = uploader.upload_bag(&bag.dir, &mut retry, &mut show);
        if let Some(why) = &out.skipped {
            failed.push(format!("{}: skipped: {why}", bag.dir.display()));
            eprintln!("ringbag: {}: skipped: {why}", bag.dir.display());
            continue;
        }
        for f in &out.files {
            if let Err(e) = &f.result {
                let line = match e.class() {
                    // Named as what it is; the key adds nothing.
                    ErrorClass::Configuration => e.to_string(),
                    _ => format!("{}: {e}", f.key),
                };
                eprintln!("ringbag: error: {line}");
                failed.push(line);
                if e.class() != ErrorClass::Permanent {
                    // The target or the link fails: every other file would fail alike.
                    fatal = true;
                    break 'bags;
                }
            }
        }
    }
    if !fatal {
        // Abandoned multipart uploads of ours (a file deleted meanwhile, or older than a
        // day and in no journal) are aborted, so nothing is left billing.
        let roots: Vec<PathBuf> = a.paths.clone();
        let refs: Vec<&std::path::Path> = roots.iter().map(PathBuf::as_path).collect();
        match uploader.abort_stale(&refs, STALE_UPLOAD_AGE, std::time::SystemTime::now()) {
            Ok(r) => {
                for k in r.file_gone.iter().chain(&r.unreferenced) {
                    eprintln!("ringbag: aborted an abandoned multipart upload of {k}");
                }
            }
            Err(e) => log::warn!("aborting abandoned uploads: {e}"),
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let total_sent = counters.snapshot().bytes_sent;
    eprintln!(
        "ringbag: uploaded {sent_files} files, {sent_bytes} bytes in {secs:.1} s ({:.1} MB/s); {present} files already in the bucket; {} failed; {total_sent} bytes sent in all",
        sent_bytes as f64 / 1e6 / secs,
        failed.len()
    );
    if failed.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILURE
    }
}
