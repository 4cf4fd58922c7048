//! Keyboard controls of `ringbag play` on a terminal, as `ros2 bag play` has them: space
//! pauses and resumes, the right arrow publishes the next message while paused, up and down
//! change the rate by 10 %. `ringbag record` uses the same machinery for its space bar
//! (pause and resume recording).
//!
//! Only when stdin is a terminal and play runs in its foreground. The terminal is put in
//! non-canonical mode without echo (signals stay on: Ctrl-C is still SIGINT) and put back on
//! every way out: the normal end and errors (Drop), a panic (unwinding drops), a signal that
//! ends the process (`signals`' death hook, SIGQUIT and SIGHUP here), and Ctrl-Z (put back
//! while stopped, re-applied on SIGCONT when play is in the foreground again).
//!
//! Everything the signal handlers touch is in statics set before they are installed, and
//! they only call async-signal-safe functions (tcsetattr, tcgetpgrp, getpgrp, signal,
//! pthread_sigmask, raise).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// What a key asks of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Space.
    TogglePause,
    /// Right arrow: publish the next message now (only while paused).
    Next,
    /// Up arrow: rate × 1.1.
    Faster,
    /// Down arrow: rate × 0.9.
    Slower,
}

/// Decodes key presses byte by byte: arrows arrive as `ESC [ X` (or `ESC O X` in a
/// terminal's application mode, with `1;5` style modifiers in between).
#[derive(Debug, Default)]
pub struct KeyDecoder {
    /// 0: idle, 1: after ESC, 2: inside `ESC [` or `ESC O`.
    state: u8,
}

impl KeyDecoder {
    pub fn feed(&mut self, b: u8) -> Option<Command> {
        let (next, cmd) = match (self.state, b) {
            (_, 0x1b) => (1, None),
            (0 | 1, b' ') => (0, Some(Command::TogglePause)),
            (0, _) => (0, None),
            (1, b'[' | b'O') => (2, None),
            (1, _) => (0, None),
            (_, b'A') => (0, Some(Command::Faster)),
            (_, b'B') => (0, Some(Command::Slower)),
            (_, b'C') => (0, Some(Command::Next)),
            (_, b'0'..=b'9' | b';') => (2, None),
            _ => (0, None),
        };
        self.state = next;
        cmd
    }
}

/// The terminal's mode before play changed it, and the mode play uses.
static SAVED: OnceLock<libc::termios> = OnceLock::new();
static RAW: OnceLock<libc::termios> = OnceLock::new();
/// Keyboard controls are running (SIGCONT re-applies the raw mode).
static WANTED: AtomicBool = AtomicBool::new(false);
/// The raw mode is on the terminal now (so there is something to put back).
static APPLIED: AtomicBool = AtomicBool::new(false);

/// Put the terminal back as it was. Async-signal-safe.
fn restore() {
    if APPLIED.swap(false, SeqCst) {
        if let Some(t) = SAVED.get() {
            // SAFETY: tcsetattr is async-signal-safe; `t` is a valid termios read by tcgetattr.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
    }
}

/// True unless stdin is our controlling terminal and another process group has it: from the
/// background, changing its mode would stop us with SIGTTOU. A terminal that is not our
/// controlling one (tcgetpgrp fails) has no job control. Async-signal-safe.
fn in_foreground() -> bool {
    // SAFETY: tcgetpgrp and getpgrp are async-signal-safe and take no pointers.
    let (fg, own) = unsafe { (libc::tcgetpgrp(libc::STDIN_FILENO), libc::getpgrp()) };
    fg < 0 || fg == own
}

/// Put the raw mode on, if controls are wanted and play is in the foreground.
/// Async-signal-safe.
fn apply_raw() {
    if !WANTED.load(SeqCst) || !in_foreground() {
        return;
    }
    if let Some(t) = RAW.get() {
        // SAFETY: as in `restore`.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) } == 0 {
            APPLIED.store(true, SeqCst);
        }
    }
}

/// Keep errno across a handler: the interrupted code may be about to read it.
fn preserving_errno(f: impl FnOnce()) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: `slot` is valid (above).
    let saved = unsafe { *slot };
    f();
    // SAFETY: `slot` is valid (above).
    unsafe { *slot = saved };
}

/// Ctrl-Z: put the terminal back, stop, and on continuing take it again.
extern "C" fn on_terminal_stop(_: libc::c_int) {
    preserving_errno(|| {
        restore();
        // SAFETY: signal, sigemptyset, sigaddset, pthread_sigmask and raise are
        // async-signal-safe; `set` is a local initialised by sigemptyset before use.
        unsafe {
            libc::signal(libc::SIGTSTP, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTSTP);
            // SIGTSTP is blocked inside its own handler: unblock it so raise stops us here.
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(libc::SIGTSTP);
            // Continued.
            libc::signal(
                libc::SIGTSTP,
                on_terminal_stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
        apply_raw();
    });
}

extern "C" fn on_continue(_: libc::c_int) {
    preserving_errno(apply_raw);
}

/// SIGQUIT, SIGHUP: put the terminal back, then end by the signal as its default would.
extern "C" fn on_fatal(sig: libc::c_int) {
    restore();
    // SAFETY: signal and raise are async-signal-safe; `sig` is blocked in its own handler,
    // so it is delivered with the default action as the handler returns.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

type Handled = &'static [(Signal, extern "C" fn(libc::c_int))];

const HANDLED: Handled = &[
    (Signal::SIGTSTP, on_terminal_stop),
    (Signal::SIGCONT, on_continue),
    (Signal::SIGQUIT, on_fatal),
    (Signal::SIGHUP, on_fatal),
];

/// `record`'s: SIGHUP stays a request there (`signals`), caught and logged, never fatal.
const HANDLED_KEEPING_SIGHUP: Handled = &[
    (Signal::SIGTSTP, on_terminal_stop),
    (Signal::SIGCONT, on_continue),
    (Signal::SIGQUIT, on_fatal),
];

/// Keyboard controls while alive: a thread reading stdin, the terminal in raw mode.
pub struct Keyboard {
    handled: Handled,
    commands: Receiver<Command>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Keyboard {
    /// Starts the controls, or returns `None` when stdin is not a terminal (or not ours now:
    /// play runs in the background): then the keys are off without being asked.
    pub fn start() -> Option<Keyboard> {
        Self::start_handling(HANDLED)
    }

    /// [`Keyboard::start`] for `record`, whose SIGHUP is a request (see `signals`): the
    /// terminal is put back on SIGQUIT, Ctrl-Z and every normal way out, and SIGHUP keeps
    /// the handler it has.
    pub fn start_keeping_sighup() -> Option<Keyboard> {
        Self::start_handling(HANDLED_KEEPING_SIGHUP)
    }

    fn start_handling(handled: Handled) -> Option<Keyboard> {
        use nix::sys::termios::tcgetattr;
        let stdin = std::io::stdin();
        if !nix::unistd::isatty(stdin.as_fd()).unwrap_or(false) {
            return None;
        }
        if !in_foreground() {
            log::debug!("stdin is a terminal of another process group: keyboard controls off");
            return None;
        }
        let saved: libc::termios = tcgetattr(stdin.as_fd()).ok()?.into();
        // Changed on the libc struct: nix's `From<Termios>` returns its inner copy without
        // the edits made through its public fields.
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // Set once per process: a second start finds the same terminal's original mode.
        let _ = SAVED.set(saved);
        let _ = RAW.set(raw);
        crate::signals::set_death_hook(restore);
        for &(sig, handler) in handled {
            let action = SigAction::new(
                SigHandler::Handler(handler),
                SaFlags::SA_RESTART,
                SigSet::empty(),
            );
            // SAFETY: the handlers only call async-signal-safe functions on statics that
            // are set above, before this.
            if let Err(e) = unsafe { sigaction(sig, &action) } {
                log::warn!("keyboard controls off: cannot handle {sig}: {e}");
                Self::reset_handlers(handled);
                return None;
            }
        }
        WANTED.store(true, SeqCst);
        apply_raw();
        if !APPLIED.load(SeqCst) {
            WANTED.store(false, SeqCst);
            Self::reset_handlers(handled);
            return None;
        }
        let (tx, commands) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringbag-keys".into())
            .spawn(move || read_keys(&tx, &s))
            .ok();
        if thread.is_none() {
            WANTED.store(false, SeqCst);
            restore();
            Self::reset_handlers(handled);
            return None;
        }
        Some(Keyboard {
            handled,
            commands,
            stop,
            thread,
        })
    }

    pub fn commands(&self) -> Receiver<Command> {
        self.commands.clone()
    }

    fn reset_handlers(handled: Handled) {
        for &(sig, _) in handled {
            let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            // SAFETY: restoring the default disposition.
            let _ = unsafe { sigaction(sig, &dfl) };
        }
    }
}

impl Drop for Keyboard {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        WANTED.store(false, SeqCst);
        restore();
        Self::reset_handlers(self.handled);
    }
}

/// How often the key thread looks at its stop flag.
const KEY_POLL: Duration = Duration::from_millis(100);

fn read_keys(tx: &Sender<Command>, stop: &AtomicBool) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let mut decoder = KeyDecoder::default();
    let mut buf = [0u8; 64];
    let timeout = PollTimeout::try_from(KEY_POLL).unwrap_or(PollTimeout::NONE);
    while !stop.load(SeqCst) {
        if !APPLIED.load(SeqCst) {
            // Stopped and continued in the background: reading would stop us (SIGTTIN).
            std::thread::sleep(KEY_POLL);
            continue;
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return, // the terminal went away
            Ok(n) => {
                for &b in &buf[..n] {
                    if let Some(c) = decoder.feed(b) {
                        if tx.send(c).is_err() {
                            return;
                        }
                    }
                }
            }
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Vec<Command> {
        let mut d = KeyDecoder::default();
        bytes.iter().filter_map(|&b| d.feed(b)).collect()
    }

    #[test]
    fn space_and_arrows_in_both_cursor_modes_decode_to_commands() {
        use Command::*;
        assert_eq!(
            decode(b" \x1b[C\x1b[A\x1b[B\x1bOC\x1bOA\x1bOB"),
            [TogglePause, Next, Faster, Slower, Next, Faster, Slower]
        );
    }

    #[test]
    fn other_keys_and_broken_sequences_are_ignored() {
        use Command::*;
        // Left arrow, letters, a modified arrow, a lone ESC before a space, Enter.
        assert_eq!(decode(b"\x1b[Dabc\x1b[1;5C\x1b x\n"), [Next, TogglePause]);
        // A space inside an unfinished sequence is a space.
        assert_eq!(decode(b"\x1b "), [TogglePause]);
    }
}
