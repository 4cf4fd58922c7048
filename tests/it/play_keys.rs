//! `ringbag play`'s keyboard controls, driven through a pseudo-terminal: the child gets the
//! pty's slave as stdin and controlling terminal (its own session), the test types on the
//! master. Outputs are collected by threads and polled with a deadline.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::termios::{tcgetattr, LocalFlags};
use nix::unistd::Pid;

use crate::play::{lines, timed_bag, Msg, MS, STRING, T0};

const PATIENCE: Duration = Duration::from_secs(30);

/// Everything a reader thread has read from a pipe so far.
pub struct Collected {
    text: Arc<Mutex<String>>,
    thread: Option<JoinHandle<()>>,
}

impl Collected {
    pub fn from(mut r: impl Read + Send + 'static) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let t = text.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                t.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Collected {
            text,
            thread: Some(thread),
        }
    }

    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Poll until `cond` holds for what was read, or fail after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, cond: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if cond(&self.text()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; read so far:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Everything, once the writer has closed the pipe.
    pub fn finish(mut self) -> String {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.text()
    }
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `ringbag play --sink echo ARGS` on a pseudo-terminal, as a shell with job control runs
/// it: a session leader (the stand-in shell, forked from this test) owns the terminal, and
/// play runs in a process group of its own in the foreground. (Play as the session leader
/// would be an orphaned process group, where Ctrl-Z is ignored.)
pub(crate) struct OnPty {
    /// The stand-in shell.
    shell: Child,
    /// play, the shell's child.
    pid: Pid,
    master: OwnedFd,
    slave: OwnedFd,
    out: Option<Collected>,
    pub(crate) err: Collected,
    /// Closing it lets the shell exit once play has ended (the terminal stays readable until
    /// then: when a session leader exits, its terminal is hung up).
    release: Option<OwnedFd>,
}

impl OnPty {
    fn spawn(args: &[&str], read_stdout: bool) -> OnPty {
        let all: Vec<&str> = ["play", "--sink", "echo"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        OnPty::spawn_ringbag(&all, read_stdout)
    }

    /// `ringbag ARGS` (any command) on a pseudo-terminal, as [`OnPty::spawn`] runs play.
    pub(crate) fn spawn_ringbag(args: &[&str], read_stdout: bool) -> OnPty {
        use std::os::fd::AsRawFd;
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let stdin = pty.slave.try_clone().expect("dup slave");
        let (hold, release) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let hold_fd = hold.as_raw_fd();
        let mut cmd = crate::common::ringbag();
        cmd.args(args)
            .env_remove("RINGBAG_LOG")
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: between fork and exec only async-signal-safe calls are made (setsid, ioctl,
        // close_range, fork, setpgid, signal, tcsetpgrp, getpid, waitpid, read, kill, _exit); fd 0
        // is the pty's slave by the time this runs. The stand-in shell never returns from
        // the closure (it ends in _exit), so only play reaches exec.
        unsafe {
            cmd.pre_exec(move || {
                // The stand-in shell never execs: without this it would keep every
                // descriptor of this test process open (other tests' pipes and terminals).
                libc::syscall(libc::SYS_close_range, 3u32, hold_fd as u32 - 1, 0u32);
                libc::syscall(libc::SYS_close_range, hold_fd as u32 + 1, u32::MAX, 0u32);
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let pid = libc::fork();
                if pid < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if pid == 0 {
                    // play: its own process group, in the foreground (from the background,
                    // tcsetpgrp would raise SIGTTOU: ignored for the call).
                    libc::close(hold_fd);
                    libc::setpgid(0, 0);
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(0, libc::getpid());
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                    return Ok(());
                }
                // The shell: wait for play (through stops), keep the session until released,
                // then end as play ended.
                let mut status = 0;
                loop {
                    let r = libc::waitpid(pid, &mut status, libc::WUNTRACED);
                    if r == pid && !libc::WIFSTOPPED(status) {
                        break;
                    }
                    if r < 0 && *libc::__errno_location() != libc::EINTR {
                        libc::_exit(127);
                    }
                }
                let mut b = 0u8;
                while libc::read(hold_fd, (&mut b as *mut u8).cast(), 1) < 0 {}
                if libc::WIFSIGNALED(status) {
                    let sig = libc::WTERMSIG(status);
                    libc::signal(sig, libc::SIG_DFL);
                    libc::kill(libc::getpid(), sig);
                }
                libc::_exit(libc::WEXITSTATUS(status));
            });
        }
        // A plain spawn: the stand-in shell never execs, so waiting for its exec would never end.
        let mut shell = cmd.spawn().expect("ringbag starts");
        drop(hold);
        let children = format!("/proc/{0}/task/{0}/children", shell.id());
        let deadline = Instant::now() + PATIENCE;
        let pid = loop {
            let c = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(p) = c.split_whitespace().next() {
                break Pid::from_raw(p.parse().unwrap());
            }
            assert!(Instant::now() < deadline, "play never started");
            std::thread::sleep(Duration::from_millis(2));
        };
        let out = read_stdout.then(|| Collected::from(shell.stdout.take().unwrap()));
        let err = Collected::from(shell.stderr.take().unwrap());
        OnPty {
            shell,
            pid,
            master: pty.master,
            slave: pty.slave,
            out,
            err,
            release: Some(release),
        }
    }

    fn out(&self) -> &Collected {
        self.out.as_ref().expect("stdout is read")
    }

    pub(crate) fn type_keys(&self, keys: &[u8]) {
        assert_eq!(nix::unistd::write(&self.master, keys).unwrap(), keys.len());
    }

    fn lflags(&self) -> LocalFlags {
        tcgetattr(&self.slave).unwrap().local_flags
    }

    /// The terminal is in play's mode: no canonical input, no echo.
    pub(crate) fn raw(&self) -> bool {
        !self
            .lflags()
            .intersects(LocalFlags::ICANON | LocalFlags::ECHO)
    }

    /// The terminal is as a shell leaves it: canonical input with echo.
    fn cooked(&self) -> bool {
        self.lflags()
            .contains(LocalFlags::ICANON | LocalFlags::ECHO)
    }

    /// play's state letter from /proc (`T`: stopped), or `None` once it is gone.
    fn state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
    }

    /// Send `sig` to the child (not to the stand-in shell).
    pub(crate) fn signal(&self, sig: Signal) {
        kill(self.pid, sig).expect("signal the child");
    }

    fn out_lines(&self) -> usize {
        self.out().text().lines().count()
    }

    /// Wait for play to end; (exit status, stdout, stderr, whether the terminal was in its
    /// original mode after play ended).
    pub(crate) fn finish(mut self) -> (std::process::ExitStatus, String, String, bool) {
        wait_until("play to end", || self.state().is_none_or(|s| s == 'Z'));
        let cooked = self.cooked();
        drop(self.release.take());
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(s) = self.shell.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the stand-in shell did not end");
            std::thread::sleep(Duration::from_millis(5));
        };
        let out = self.out.take().map(Collected::finish).unwrap_or_default();
        let err = std::mem::replace(&mut self.err, Collected::from(std::io::empty())).finish();
        (status, out, err, cooked)
    }
}

impl Drop for OnPty {
    /// A failed test must not leave a paused play behind.
    fn drop(&mut self) {
        if self.state().is_some() {
            let _ = kill(self.pid, Signal::SIGKILL);
        }
        drop(self.release.take());
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// `n` messages on /a, `gap_ms` apart.
fn evenly(n: i64, gap_ms: i64) -> Vec<Msg> {
    (0..n)
        .map(|i| {
            (
                "/a",
                STRING,
                T0 + i * gap_ms * MS,
                crate::common::cdr_string(&format!("{i}")),
            )
        })
        .collect()
}

const KEYS_LINE: &str = "ringbag: keys: space pause/resume, right arrow next message (while paused), up/down rate +/-10%\n";

#[test]
fn keys_step_pause_resume_and_change_the_rate_with_one_status_line_each() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("k");
    // 30 messages 100 ms apart: 2.9 s.
    timed_bag(&bag, &evenly(30, 100), 0);
    let p = OnPty::spawn(&["-p", bag.to_str().unwrap()], true);
    let start_line =
        "ringbag: paused (--start-paused); at 0.000 s of 2.900 s, rate 1.000, paused\n";
    p.err
        .wait_for("the start paused", |s| s.contains(start_line));
    assert!(p.raw(), "the terminal is in play's mode while playing");
    assert_eq!(p.out_lines(), 0, "nothing plays while paused");

    // Right arrow: exactly the next message, then playback stands at it.
    p.type_keys(b"\x1b[C");
    p.err.wait_for("the first step", |s| {
        s.contains("ringbag: next: /a; at 0.000 s of 2.900 s, rate 1.000, paused\n")
    });
    p.out().wait_for("one message", |s| s.lines().count() == 1);
    p.type_keys(b"\x1b[C");
    p.err.wait_for("the second step", |s| {
        s.contains("ringbag: next: /a; at 0.100 s of 2.900 s, rate 1.000, paused\n")
    });
    p.out().wait_for("two messages", |s| s.lines().count() == 2);

    // Up and down: the rate by 10 %, the position kept.
    p.type_keys(b"\x1b[A");
    p.err.wait_for("faster", |s| {
        s.contains("ringbag: rate 1.100; at 0.100 s of 2.900 s, rate 1.100, paused\n")
    });
    p.type_keys(b"\x1b[B");
    p.err.wait_for("slower", |s| {
        s.contains("ringbag: rate 0.990; at 0.100 s of 2.900 s, rate 0.990, paused\n")
    });
    assert_eq!(
        p.out_lines(),
        2,
        "stepping and rate keys publish nothing else"
    );

    // Space: resume from where the steps left it; pause; resume.
    p.type_keys(b" ");
    p.err.wait_for("resumed", |s| {
        s.contains("ringbag: resumed; at 0.100 s of 2.900 s, rate 0.990, playing\n")
    });
    p.out()
        .wait_for("playing again", |s| s.lines().count() >= 4);
    p.type_keys(b" ");
    p.err
        .wait_for("paused again", |s| s.contains("ringbag: paused; at "));
    p.type_keys(b" ");
    p.err.wait_for("resumed again", |s| {
        s.matches("ringbag: resumed; at ").count() == 2
    });

    let (status, out, err, cooked) = p.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    let bag_times: Vec<i64> = lines(&out).iter().map(|l| l.bag_ns).collect();
    assert_eq!(
        bag_times,
        (0..30).map(|i| T0 + i * 100 * MS).collect::<Vec<_>>()
    );
    // One status line per key (7 keys) and the start line; the key help; the summary.
    let status_lines = err.lines().filter(|l| l.contains("; at ")).count();
    assert_eq!(status_lines, 8, "{err}");
    assert!(err.starts_with(KEYS_LINE), "{err}");
    assert!(err.ends_with("ringbag: played 30 messages\n"), "{err}");
    assert_eq!(err.lines().count(), 10, "{err}");
    assert!(cooked, "the terminal's mode is restored at the end");
}

#[test]
fn the_right_arrow_while_playing_only_says_it_works_while_paused() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("n");
    // 40 messages 100 ms apart: still playing when the key comes.
    timed_bag(&bag, &evenly(40, 100), 0);
    let p = OnPty::spawn(&[bag.to_str().unwrap()], true);
    p.out().wait_for("playing", |s| !s.is_empty());
    p.type_keys(b"\x1b[C");
    p.err.wait_for("the hint", |s| {
        s.contains("ringbag: next: only while paused (space pauses); at ")
    });
    let (status, out, err, cooked) = p.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(lines(&out).len(), 40, "nothing skipped or doubled");
    assert!(cooked);
}

#[test]
fn ctrl_c_on_the_terminal_stops_cleanly_and_restores_its_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("c");
    // 30 messages a second apart: still playing when Ctrl-C comes.
    timed_bag(&bag, &evenly(30, 1000), 0);
    let p = OnPty::spawn(&[bag.to_str().unwrap()], true);
    p.out().wait_for("the first message", |s| !s.is_empty());
    assert!(p.raw());
    p.type_keys(b"\x03");
    let (status, out, err, cooked) = p.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    let n = lines(&out).len();
    assert!(n < 30);
    assert_eq!(err, format!("{KEYS_LINE}ringbag: played {n} messages\n"));
    assert!(cooked);
}

#[test]
fn a_second_signal_ends_play_at_once_and_still_restores_the_terminal() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("s");
    // All at one instant, with nobody reading stdout: play blocks writing it, so the stop
    // the first signal asks for cannot complete and the second one ends the process.
    let msgs: Vec<Msg> = (0..20_000)
        .map(|i| ("/a", STRING, T0, crate::common::cdr_string(&format!("{i}"))))
        .collect();
    timed_bag(&bag, &msgs, 0);
    let p = OnPty::spawn(&[bag.to_str().unwrap()], false);
    p.err.wait_for("the keys", |s| s.contains(KEYS_LINE));
    let wchan = format!("/proc/{}/wchan", p.pid);
    wait_until("play blocked on its output", || {
        std::fs::read_to_string(&wchan).is_ok_and(|w| w.contains("pipe"))
    });
    assert!(p.raw(), "raw while playing");
    kill(p.pid, Signal::SIGTERM).unwrap();
    kill(p.pid, Signal::SIGTERM).unwrap();
    let (status, _, _, cooked) = p.finish();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(cooked, "the terminal's mode is restored by the signal path");
}

#[test]
fn ctrl_z_gives_the_terminal_back_while_stopped_and_takes_it_again_on_continue() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("z");
    timed_bag(&bag, &evenly(5, 10), 0);
    let p = OnPty::spawn(&["-p", bag.to_str().unwrap()], true);
    p.err.wait_for("the start paused", |s| {
        s.contains("paused (--start-paused)")
    });
    assert!(p.raw());
    p.type_keys(b"\x1a");
    wait_until("play stopped by Ctrl-Z", || p.state() == Some('T'));
    assert!(
        p.cooked(),
        "a stopped play leaves the terminal as it found it"
    );
    // `fg`: play's group is still the terminal's foreground group.
    kill(p.pid, Signal::SIGCONT).unwrap();
    wait_until("the raw mode again", || p.raw());
    p.type_keys(b" ");
    p.err
        .wait_for("resumed", |s| s.contains("ringbag: resumed; at 0.000 s"));
    let (status, out, err, cooked) = p.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(lines(&out).len(), 5);
    assert!(cooked);
}

#[test]
fn disable_keyboard_controls_leaves_the_terminal_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("d");
    timed_bag(&bag, &evenly(10, 50), 0);
    let p = OnPty::spawn(
        &["--disable-keyboard-controls", bag.to_str().unwrap()],
        true,
    );
    p.out().wait_for("the first message", |s| !s.is_empty());
    assert!(p.cooked(), "the terminal keeps its mode");
    // A space (and Enter, as canonical input needs it) would pause with keys on.
    p.type_keys(b" \n");
    let (status, out, err, cooked) = p.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(lines(&out).len(), 10);
    assert_eq!(err, "ringbag: played 10 messages\n");
    assert!(cooked);
}

#[test]
fn a_hangup_restores_the_terminal_and_ends_play_by_the_signal() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let bag = tmp.path().join("h");
    timed_bag(&bag, &evenly(5, 10), 0);
    let p = OnPty::spawn(&["-p", bag.to_str().unwrap()], true);
    p.err.wait_for("the start paused", |s| {
        s.contains("paused (--start-paused)")
    });
    assert!(p.raw());
    kill(p.pid, Signal::SIGHUP).unwrap();
    let (status, _, _, cooked) = p.finish();
    assert_eq!(status.signal(), Some(libc::SIGHUP));
    assert!(
        cooked,
        "the terminal's mode is restored before the hangup ends play"
    );
}
