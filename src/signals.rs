//! SIGINT / SIGTERM: the first asks for a clean stop; a second SIGINT within 2 s exits at
//! once (the operator means it). The handler only touches atomics and async-signal-safe calls.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering::SeqCst};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static SIGNALS: AtomicU32 = AtomicU32::new(0);
static FIRST_SIGINT_MS: AtomicI64 = AtomicI64::new(-1);
/// Exit status for the immediate exit, as a shell reports death by SIGINT.
const IMMEDIATE_EXIT: i32 = 130;

fn monotonic_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and `ts` is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALS.fetch_add(1, SeqCst);
    if sig == libc::SIGINT {
        let now = monotonic_ms();
        let first = FIRST_SIGINT_MS.load(SeqCst);
        if first >= 0 && now - first <= 2000 {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(IMMEDIATE_EXIT) };
        }
        if first < 0 {
            FIRST_SIGINT_MS.store(now, SeqCst);
        }
    }
}

/// Install the handlers. Safe to call more than once.
pub fn install() -> Result<(), nix::Error> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only performs async-signal-safe operations.
    unsafe {
        sigaction(Signal::SIGINT, &action)?;
        sigaction(Signal::SIGTERM, &action)?;
    }
    Ok(())
}

/// True once SIGINT or SIGTERM has arrived.
pub fn stop_requested() -> bool {
    SIGNALS.load(SeqCst) > 0
}
