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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    /// Run `body` in a forked child (signal state is per process) and return its exit code.
    /// The child only makes async-signal-safe calls, so forking a threaded test is sound.
    fn in_child(body: fn() -> i32) -> i32 {
        // SAFETY: the child runs only sigaction/raise/_exit before exiting.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = body();
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
                WaitStatus::Exited(_, code) => code,
                other => panic!("child ended with {other:?}"),
            },
        }
    }

    #[test]
    fn first_sigterm_only_requests_a_clean_stop() {
        let code = in_child(|| {
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
        assert_eq!(code, 0);
    }

    #[test]
    fn a_second_sigint_within_two_seconds_exits_at_once_with_130() {
        let code = in_child(|| {
            if install().is_err() {
                return 1;
            }
            let _ = nix::sys::signal::raise(Signal::SIGINT);
            if !stop_requested() {
                return 2;
            }
            let _ = nix::sys::signal::raise(Signal::SIGINT);
            3 // not reached: the handler exits
        });
        assert_eq!(code, IMMEDIATE_EXIT);
    }
}
