//! SIGINT / SIGTERM. The promise: a signal always ends the process, cleanly when it can.
//!
//! * Until [`install`] runs, the default disposition stays: a signal ends the process at once.
//!   `record` and `play` call it only when their main loop is about to run (the bag writer
//!   exists, or the bag to play is open). So a phase that can be slow or stuck before that
//!   (opening a PHC, recovering sibling bags, reading a damaged bag, creating the output) can
//!   never swallow a SIGTERM: there is nothing accepted yet that a clean stop would save, and
//!   anything half-done there is what a crash leaves, which recovery handles anyway.
//! * After [`install`], the first SIGINT or SIGTERM only asks for a clean stop: the loop polls
//!   [`stop_requested`], writes what was accepted and finishes the bag.
//! * A second SIGINT or SIGTERM (at any time after the first) ends the process at once, by
//!   the same signal with its default action: the operator, or a supervisor, means it. Death by
//!   the signal (a shell shows 130 / 143) is also what systemd expects of its stop signal.
//!
//! * [`install_with_grace`] adds a deadline to the clean stop: if the process still runs that
//!   long after the first signal (`play` blocked writing to a full pipe), it ends by that
//!   signal. `record` has none: finishing may legitimately take long on a slow card, and its
//!   supervisor's stop timeout (systemd's TimeoutStopSec) bounds it.
//!
//! * SIGHUP, SIGUSR1 and SIGUSR2 (`record`, `daemon`) are requests, caught from the first
//!   instruction of `main_entry` by [`install_requests`]: they only set flags that the
//!   recording's main loop takes (or logs as ignored), so none of them can end the process at
//!   any moment, ring or no ring.
//!
//! The handlers only touch atomics and async-signal-safe calls.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static SIGNALS: AtomicU32 = AtomicU32::new(0);
/// The first stop signal, re-raised when the grace period runs out.
static FIRST: AtomicI32 = AtomicI32::new(0);
/// Seconds a clean stop may take before the process ends anyway; 0 = no limit.
static GRACE_S: AtomicU32 = AtomicU32::new(0);

/// A function run right before a signal ends the process (`play` puts the terminal back).
static DEATH_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Run `hook` when a signal is about to end the process (a second SIGINT/SIGTERM, the grace
/// period running out). It runs inside a signal handler: it must be async-signal-safe.
pub fn set_death_hook(hook: fn()) {
    DEATH_HOOK.store(hook as *mut (), SeqCst);
}

/// End the process by `sig` with its default action.
fn die_by(sig: libc::c_int) {
    let hook = DEATH_HOOK.load(SeqCst);
    if !hook.is_null() {
        // SAFETY: only `set_death_hook` stores here, and it stores a `fn()`.
        let hook: fn() = unsafe { std::mem::transmute::<*mut (), fn()>(hook) };
        hook();
    }
    // SAFETY: signal() and raise() are async-signal-safe. If `sig` is blocked (we are in its
    // own handler) it is delivered on return, with its default action now.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    if SIGNALS.fetch_add(1, SeqCst) > 0 {
        die_by(sig);
        return;
    }
    FIRST.store(sig, SeqCst);
    let grace = GRACE_S.load(SeqCst);
    if grace > 0 {
        // SAFETY: alarm() is async-signal-safe; SIGALRM's handler is `on_grace_over`.
        unsafe { libc::alarm(grace) };
    }
}

extern "C" fn on_grace_over(_: libc::c_int) {
    match FIRST.load(SeqCst) {
        0 => die_by(libc::SIGTERM),
        sig => die_by(sig),
    }
}

/// Install the handlers: from now on the first SIGINT/SIGTERM requests a clean stop and a
/// second one ends the process. Call it right before the loop that polls [`stop_requested`].
/// Safe to call more than once.
pub fn install() -> Result<(), nix::Error> {
    install_with_grace(Duration::ZERO)
}

/// [`install`], and if the clean stop has not ended the process `grace` (whole seconds,
/// at least 1) after the first signal, end it by that signal. `Duration::ZERO`: no limit.
pub fn install_with_grace(grace: Duration) -> Result<(), nix::Error> {
    let secs = match grace.as_secs() {
        0 if grace.is_zero() => 0,
        s => u32::try_from(s.max(1)).unwrap_or(u32::MAX),
    };
    GRACE_S.store(secs, SeqCst);
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let alarm = SigAction::new(
        SigHandler::Handler(on_grace_over),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handlers only perform async-signal-safe operations.
    unsafe {
        if secs > 0 {
            sigaction(Signal::SIGALRM, &alarm)?;
        }
        sigaction(Signal::SIGINT, &action)?;
        sigaction(Signal::SIGTERM, &action)?;
    }
    Ok(())
}

/// SIGHUP (reload), SIGUSR1 (close the split) and SIGUSR2 (take a snapshot) arrived and
/// were not yet taken.
static RELOAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static ROTATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SNAPSHOT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The requests ringbag documents for `record` and `daemon`. Their default action would end
/// the process (SIGUSR2 with exit 140), leaving the bag unfinished.
const REQUESTS: [Signal; 3] = [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2];

extern "C" fn on_request_signal(sig: libc::c_int) {
    match sig {
        libc::SIGHUP => RELOAD.store(true, SeqCst),
        libc::SIGUSR1 => ROTATE.store(true, SeqCst),
        libc::SIGUSR2 => SNAPSHOT.store(true, SeqCst),
        _ => {}
    }
}

/// From now on SIGHUP, SIGUSR1 and SIGUSR2 only set flags that [`take_reload`],
/// [`take_rotate`] and [`take_snapshot_trigger`] read. `main_entry` calls it first thing,
/// before the arguments are parsed: a request that arrives while the process starts (a
/// `systemctl reload` right after `start`, a SIGUSR2 before the ring exists, a recording
/// without a ring) must never end it. Whoever has no use for a request logs and drops it.
pub fn install_requests() -> Result<(), nix::Error> {
    let action = SigAction::new(
        SigHandler::Handler(on_request_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in REQUESTS {
        // SAFETY: the handler only stores to atomics.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// Give SIGHUP, SIGUSR1 and SIGUSR2 their default action back: for the commands that do not
/// document them (`play`, `info`, ...), a hangup still ends the process as usual.
pub fn restore_request_defaults() -> Result<(), nix::Error> {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in REQUESTS {
        // SAFETY: installing the default action runs no code of ours.
        unsafe { sigaction(sig, &default) }?;
    }
    Ok(())
}

/// True once for each SIGUSR2 burst since the last call.
pub fn take_snapshot_trigger() -> bool {
    SNAPSHOT.swap(false, SeqCst)
}

/// True once for each SIGHUP burst since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, SeqCst)
}

/// True once for each SIGUSR1 burst since the last call.
pub fn take_rotate() -> bool {
    ROTATE.swap(false, SeqCst)
}

/// True once SIGINT or SIGTERM has arrived (after [`install`]).
pub fn stop_requested() -> bool {
    SIGNALS.load(SeqCst) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    /// Run `body` in a forked child (signal state is per process) and return how it ended.
    /// The child only makes async-signal-safe calls, so forking a threaded test is sound.
    fn in_child(body: fn() -> i32) -> WaitStatus {
        // SAFETY: the child runs only sigaction/raise/_exit before exiting.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = body();
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => waitpid(child, None).expect("waitpid"),
        }
    }

    #[test]
    fn requests_only_set_flags_and_their_defaults_come_back_when_restored() {
        let status = in_child(|| {
            if install_requests().is_err() {
                return 1;
            }
            for sig in [Signal::SIGUSR2, Signal::SIGHUP, Signal::SIGUSR1] {
                let _ = nix::sys::signal::raise(sig);
            }
            if !(take_snapshot_trigger() && take_reload() && take_rotate()) {
                return 2;
            }
            if take_snapshot_trigger() || take_reload() || take_rotate() {
                return 3;
            }
            if restore_request_defaults().is_err() {
                return 4;
            }
            let _ = nix::sys::signal::raise(Signal::SIGUSR2);
            5 // not reached: the default action ends the process
        });
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGUSR2, _)),
            "{status:?}"
        );
    }

    #[test]
    fn before_install_a_sigterm_ends_the_process_at_once() {
        let status = in_child(|| {
            let _ = nix::sys::signal::raise(Signal::SIGTERM);
            3 // not reached: the default action ends the process
        });
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGTERM, _)),
            "{status:?}"
        );
    }

    #[test]
    fn first_sigterm_only_requests_a_clean_stop() {
        let status = in_child(|| {
            if install().is_err() || stop_requested() {
                return 1;
            }
            let _ = nix::sys::signal::raise(Signal::SIGTERM);
            if stop_requested() {
                0
            } else {
                2
            }
        });
        assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
    }

    /// Child body: install, `first` (must only request a stop), then `second` (must end us).
    fn two_signals(first: Signal, second: Signal) -> i32 {
        if install().is_err() {
            return 1;
        }
        let _ = nix::sys::signal::raise(first);
        if !stop_requested() {
            return 2;
        }
        let _ = nix::sys::signal::raise(second);
        3 // not reached
    }

    #[test]
    fn with_a_grace_period_a_stop_that_does_not_finish_ends_by_the_signal() {
        let status = in_child(|| {
            if install_with_grace(Duration::from_secs(1)).is_err() {
                return 1;
            }
            let _ = nix::sys::signal::raise(Signal::SIGTERM);
            if !stop_requested() {
                return 2;
            }
            // A stop that never completes (as if blocked in a write): pause() returns only
            // when a handled signal arrives, which the grace alarm is.
            loop {
                // SAFETY: pause() is async-signal-safe.
                unsafe { libc::pause() };
            }
        });
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGTERM, _)),
            "{status:?}"
        );
    }

    #[test]
    fn a_second_signal_ends_the_process_by_that_signal() {
        let cases: [(fn() -> i32, Signal); 3] = [
            (
                || two_signals(Signal::SIGINT, Signal::SIGINT),
                Signal::SIGINT,
            ),
            (
                || two_signals(Signal::SIGTERM, Signal::SIGTERM),
                Signal::SIGTERM,
            ),
            (
                || two_signals(Signal::SIGINT, Signal::SIGTERM),
                Signal::SIGTERM,
            ),
        ];
        for (body, second) in cases {
            let status = in_child(body);
            assert!(
                matches!(status, WaitStatus::Signaled(_, s, _) if s == second),
                "second {second:?}: {status:?}"
            );
        }
    }
}
