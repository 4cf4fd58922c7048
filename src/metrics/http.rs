//! The `GET /metrics` endpoint: a minimal, strict HTTP/1.x server for Prometheus scrapes.
//!
//! The status loop renders the exposition text once per interval into a [`Body`]; the server
//! only hands out that text. It runs on ONE thread (`ringbag-metrics`) that polls the listener
//! and every open connection with non-blocking sockets, so a slow or hostile client can delay
//! neither another client nor the recorder (which never waits on this thread: it only swaps an
//! `Arc` in [`Body::set`]).
//!
//! Defences, each because a scrape port is reachable by whatever is on the robot's network:
//! - every connection has a deadline to send its head and take its response (slowloris, and
//!   clients that never read);
//! - open connections are capped, and at the cap the connection open longest *without a
//!   complete request* makes room for the new one: a real scraper sends its request at once,
//!   so idle connections cannot lock it out;
//! - at most [`MAX_HEAD`] bytes of request are kept per connection, and every response to
//!   `/metrics` shares the one rendered `Arc<String>`;
//! - one request per connection, no keep-alive: nothing to track between requests.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// The Content-Type of the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest request head (request line and headers, terminator included) that is read.
pub const MAX_HEAD: usize = 8 * 1024;
/// Open connections at most (one fd and at most [`MAX_HEAD`] bytes of buffer each).
const MAX_CONNS: usize = 64;
/// Time a connection has from its accept to send its head and take its whole response.
const DEADLINE: Duration = Duration::from_secs(10);
/// After the response, input is read and thrown away for at most this long or this many bytes
/// before the close: closing a socket with unread input makes the kernel send a reset, which
/// can destroy the response (a 431 or 400 in particular) before the client has read it.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;
/// The poll timeout: how late `finish()` and the deadlines may be seen.
const TICK: Duration = Duration::from_millis(50);
/// How long accepting pauses after an accept error such as EMFILE: the pending connection
/// stays in the backlog, so the listener stays readable and polling it again at once would
/// spin the CPU.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Accepts per poll round, so a connection flood cannot starve the open connections.
const ACCEPTS_PER_ROUND: usize = 256;

/// The text served at `/metrics`, replaced whole by the status loop once per interval.
///
/// The mutex is held only to clone or swap the `Arc`: a scrape never copies the text under it,
/// and a slow client keeps its own `Arc` of the text it was answered with.
#[derive(Debug, Default)]
pub struct Body {
    text: Mutex<Arc<String>>,
}

impl Body {
    /// An empty body (served as an empty 200 until the first [`Body::set`]).
    pub fn new() -> Body {
        Body::default()
    }

    /// Replaces the text served from the next request on.
    pub fn set(&self, text: String) {
        let text = Arc::new(text);
        let old = {
            // A panic elsewhere while holding this lock cannot leave the Arc half-written, so a
            // poisoned lock is as good as a clean one.
            let mut cur = self.text.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *cur, text)
        };
        // Freed (if no connection still holds it) outside the lock.
        drop(old);
    }

    /// The text being served.
    pub fn get(&self) -> Arc<String> {
        Arc::clone(&self.text.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Why the endpoint could not start. Each message names the `metrics_listen` address.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("metrics_listen {addr}: cannot bind: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("metrics_listen {addr}: cannot set up the listening socket: {source}")]
    Setup {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("metrics_listen {addr}: cannot start the ringbag-metrics thread: {source}")]
    Spawn {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// The server's counters since its start, for the recorder to export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HttpStats {
    /// `GET`/`HEAD /metrics` requests answered with 200.
    pub requests: u64,
    /// Requests answered with a 4xx: malformed (400), head too large (431), another path (404)
    /// or method (405).
    pub bad_requests: u64,
    /// New connections closed at once: the cap was reached and every open connection had sent
    /// a complete request and was still taking its response.
    pub refused: u64,
    /// Connections closed to make room for a new one before sending a complete request.
    pub evicted: u64,
    /// Connections closed at their deadline, before sending a complete request or before
    /// taking their whole response.
    pub timed_out: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    bad_requests: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    timed_out: AtomicU64,
    /// Bytes read from clients, kept for the tests: a huge request must not be read whole.
    read_bytes: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64, n: u64) {
        // Relaxed: independent counters, read only for export.
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The limits the thread enforces (the tests shorten the deadline and the cap).
#[derive(Debug, Clone, Copy)]
struct Limits {
    deadline: Duration,
    max_conns: usize,
}

const LIMITS: Limits = Limits {
    deadline: DEADLINE,
    max_conns: MAX_CONNS,
};

/// The running endpoint; stopped by [`Server::finish`] or on drop.
#[derive(Debug)]
pub struct Server {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and serves `body` at `/metrics` from the thread `ringbag-metrics`.
    pub fn start(addr: SocketAddr, body: Arc<Body>) -> Result<Server, HttpError> {
        Server::start_with(addr, body, LIMITS)
    }

    fn start_with(addr: SocketAddr, body: Arc<Body>, limits: Limits) -> Result<Server, HttpError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        let setup = |source| HttpError::Setup { addr, source };
        listener.set_nonblocking(true).map_err(setup)?;
        let local_addr = listener.local_addr().map_err(setup)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let mut event_loop = EventLoop {
            listener,
            body,
            counters: Arc::clone(&counters),
            limits,
            conns: Vec::new(),
            accept_paused_until: None,
            accepted: 0,
            accept_failing: false,
            scratch: vec![0; MAX_HEAD].into_boxed_slice(),
        };
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ringbag-metrics".into())
            .spawn(move || event_loop.run(&thread_stop))
            .map_err(|source| HttpError::Spawn { addr, source })?;
        Ok(Server {
            local_addr,
            stop,
            counters,
            thread: Some(thread),
        })
    }

    /// The bound address (the port chosen when `addr` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The counters so far.
    pub fn stats(&self) -> HttpStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HttpStats {
            requests: get(&c.requests),
            bad_requests: get(&c.bad_requests),
            refused: get(&c.refused),
            evicted: get(&c.evicted),
            timed_out: get(&c.timed_out),
        }
    }

    /// Stops the thread and waits for it: the listener and every connection are closed when
    /// this returns (within about one poll timeout, 50 ms).
    pub fn finish(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            if thread.join().is_err() {
                log::error!(
                    "metrics endpoint {}: the server thread panicked",
                    self.local_addr
                );
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The server thread's state; dropped (closing every socket) when the thread ends.
struct EventLoop {
    listener: TcpListener,
    body: Arc<Body>,
    counters: Arc<Counters>,
    limits: Limits,
    conns: Vec<Conn>,
    accept_paused_until: Option<Instant>,
    /// Connections accepted so far (their age order for eviction).
    accepted: u64,
    /// Accept errors are logged once per run of failures, not once per poll round.
    accept_failing: bool,
    /// Every read lands here first; a connection keeps only what it needs.
    scratch: Box<[u8]>,
}

impl EventLoop {
    fn run(&mut self, stop: &AtomicBool) {
        let timeout = PollTimeout::try_from(TICK).unwrap_or(PollTimeout::NONE);
        let mut ready: Vec<PollFlags> = Vec::with_capacity(self.limits.max_conns + 1);
        while !stop.load(Ordering::SeqCst) {
            let listen = self
                .accept_paused_until
                .is_none_or(|until| Instant::now() >= until);
            ready.clear();
            {
                let mut fds = Vec::with_capacity(self.conns.len() + 1);
                let listen_events = if listen {
                    PollFlags::POLLIN
                } else {
                    PollFlags::empty()
                };
                fds.push(PollFd::new(self.listener.as_fd(), listen_events));
                fds.extend(
                    self.conns
                        .iter()
                        .map(|c| PollFd::new(c.stream.as_fd(), c.interest())),
                );
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        // Only EINVAL/ENOMEM are possible here; neither is ours to fix, and
                        // retrying at once would spin.
                        log::warn!("metrics endpoint: poll failed: {e}");
                        std::thread::sleep(TICK);
                        continue;
                    }
                }
                ready.extend(
                    fds.iter()
                        .map(|f| f.revents().unwrap_or(PollFlags::empty())),
                );
            }
            let now = Instant::now();
            // `ready[1..]` lines up with `conns` as polled: no connection is added or removed
            // until every event has been handled.
            for (conn, flags) in self.conns.iter_mut().zip(ready.iter().skip(1)) {
                if !flags.is_empty() {
                    conn.on_ready(*flags, now, &mut self.scratch, &self.body, &self.counters);
                }
            }
            let counters = &self.counters;
            self.conns.retain(|c| c.keep(now, counters));
            if listen && ready.first().is_some_and(|f| !f.is_empty()) {
                self.accept(now);
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        for _ in 0..ACCEPTS_PER_ROUND {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.accept_failing {
                        self.accept_failing = false;
                        log::info!("metrics endpoint: accepting connections again");
                    }
                    // Accepted sockets do not inherit O_NONBLOCK; one that cannot be made
                    // non-blocking could block the thread, so it is dropped.
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    // The response goes out in one or a few writes followed by a FIN; Nagle
                    // could hold its tail back for a delayed ACK.
                    let _ = stream.set_nodelay(true);
                    if self.conns.len() >= self.limits.max_conns && !self.make_room() {
                        Counters::bump(&self.counters.refused, 1);
                        continue; // dropped: closed
                    }
                    self.accepted = self.accepted.wrapping_add(1);
                    let mut conn = Conn {
                        stream,
                        seq: self.accepted,
                        deadline: now + self.limits.deadline,
                        state: State::Reading { buf: Vec::new() },
                    };
                    // A scraper sends its request right after connecting: when it is already
                    // here, answer it now rather than one poll round later.
                    conn.on_ready(
                        PollFlags::POLLIN,
                        now,
                        &mut self.scratch,
                        &self.body,
                        &self.counters,
                    );
                    if conn.keep(now, &self.counters) {
                        self.conns.push(conn);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the process or the system is short of
                    // something this thread cannot free. Wait a little, keep serving the open
                    // connections, and say so once.
                    if !self.accept_failing {
                        self.accept_failing = true;
                        log::warn!(
                            "metrics endpoint {}: cannot accept connections: {e} (retrying every {} ms)",
                            self.listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
                            ACCEPT_BACKOFF.as_millis()
                        );
                    }
                    self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Closes one connection to make room for a new one: the one open longest without a
    /// complete request, else one that has its response and is only lingering. False when
    /// every connection is still taking its response (those finish or meet their deadline).
    fn make_room(&mut self) -> bool {
        let oldest = |want: fn(&State) -> bool| {
            self.conns
                .iter()
                .enumerate()
                .filter(|(_, c)| want(&c.state))
                .min_by_key(|(_, c)| c.seq)
                .map(|(i, _)| i)
        };
        let victim = oldest(|s| matches!(s, State::Reading { .. }))
            .map(|i| (i, true))
            .or_else(|| oldest(|s| matches!(s, State::Draining { .. })).map(|i| (i, false)));
        match victim {
            Some((i, incomplete)) => {
                self.conns.swap_remove(i);
                if incomplete {
                    Counters::bump(&self.counters.evicted, 1);
                }
                true
            }
            None => false,
        }
    }
}

struct Conn {
    stream: TcpStream,
    /// Accept order (not the accept Instant: connections accepted in one round share it).
    seq: u64,
    deadline: Instant,
    state: State,
}

enum State {
    /// Waiting for a complete head; `buf` holds at most [`MAX_HEAD`] bytes, allocated with
    /// the first byte (connections that send nothing cost no buffer).
    Reading {
        buf: Vec<u8>,
    },
    /// Sending `head` then `body`; `sent` counts the bytes of both written so far.
    Writing {
        head: Vec<u8>,
        body: Option<Arc<String>>,
        sent: usize,
    },
    /// Response sent and our side shut down; reading and discarding until the client closes
    /// (see [`LINGER`]).
    Draining {
        until: Instant,
        discarded: usize,
    },
    Closed,
}

impl Conn {
    fn interest(&self) -> PollFlags {
        match self.state {
            State::Reading { .. } | State::Draining { .. } => PollFlags::POLLIN,
            State::Writing { .. } => PollFlags::POLLOUT,
            State::Closed => PollFlags::empty(),
        }
    }

    fn on_ready(
        &mut self,
        flags: PollFlags,
        now: Instant,
        scratch: &mut [u8],
        body: &Body,
        counters: &Counters,
    ) {
        if flags.contains(PollFlags::POLLNVAL) {
            // Cannot happen with an owned fd; closing is what stops it from spinning the loop.
            self.state = State::Closed;
            return;
        }
        // Errors and hang-ups are left to the read or write below, which report them.
        if matches!(self.state, State::Reading { .. }) {
            self.read_head(scratch, body, counters);
        }
        if matches!(self.state, State::Writing { .. }) {
            self.write_response(now);
        }
        if matches!(self.state, State::Draining { .. }) {
            self.drain(scratch, counters);
        }
    }

    fn read_head(&mut self, scratch: &mut [u8], body: &Body, counters: &Counters) {
        let State::Reading { buf } = &mut self.state else {
            return;
        };
        loop {
            let room = MAX_HEAD.saturating_sub(buf.len());
            if room == 0 {
                self.state = respond(Reply::HeadTooLarge, false, body, counters);
                return;
            }
            let scratch = match scratch.get_mut(..room) {
                Some(s) => s,
                None => &mut scratch[..],
            };
            match self.stream.read(scratch) {
                Ok(0) => {
                    // The client gave up before a complete request: nothing to answer.
                    self.state = State::Closed;
                    return;
                }
                Ok(n) => {
                    Counters::bump(&counters.read_bytes, n as u64);
                    let n = n.min(scratch.len());
                    if buf.capacity() == 0 {
                        // Exactly the cap, once: growth by doubling could overshoot it.
                        buf.reserve_exact(MAX_HEAD);
                    }
                    let scanned = buf.len();
                    buf.extend_from_slice(&scratch[..n]);
                    match scan_head(buf, scanned) {
                        Scan::Incomplete => {}
                        Scan::Bad => {
                            self.state = respond(Reply::BadRequest, false, body, counters);
                            return;
                        }
                        Scan::Complete(len) => {
                            let head = buf.get(..len).unwrap_or(&[]);
                            let (reply, is_head) = route(head);
                            self.state = respond(reply, is_head, body, counters);
                            return;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.state = State::Closed;
                    return;
                }
            }
        }
    }

    fn write_response(&mut self, now: Instant) {
        let State::Writing { head, body, sent } = &mut self.state else {
            return;
        };
        let body: &[u8] = body.as_deref().map_or(&[], |b| b.as_bytes());
        loop {
            let result = if let Some(rest) = head.get(*sent..).filter(|r| !r.is_empty()) {
                // Head and body in one write: the common small response is one segment.
                self.stream
                    .write_vectored(&[IoSlice::new(rest), IoSlice::new(body)])
            } else {
                let rest = body.get(sent.saturating_sub(head.len())..).unwrap_or(&[]);
                if rest.is_empty() {
                    // All sent. The FIN tells the client the response is complete (as does
                    // Content-Length); the socket stays open to drain, see LINGER.
                    let _ = self.stream.shutdown(Shutdown::Write);
                    self.state = State::Draining {
                        until: now + LINGER,
                        discarded: 0,
                    };
                    return;
                }
                self.stream.write(rest)
            };
            match result {
                Ok(0) => {
                    self.state = State::Closed;
                    return;
                }
                Ok(n) => *sent = sent.saturating_add(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EPIPE or ECONNRESET: the client left. (SIGPIPE is ignored in Rust
                // programs, so EPIPE arrives as an error, not a signal.)
                Err(_) => {
                    self.state = State::Closed;
                    return;
                }
            }
        }
    }

    fn drain(&mut self, scratch: &mut [u8], counters: &Counters) {
        let State::Draining { discarded, .. } = &mut self.state else {
            return;
        };
        loop {
            match self.stream.read(scratch) {
                Ok(0) => {
                    self.state = State::Closed;
                    return;
                }
                Ok(n) => {
                    Counters::bump(&counters.read_bytes, n as u64);
                    *discarded = discarded.saturating_add(n);
                    if *discarded >= LINGER_BYTES {
                        // Still sending after its answer: not a client worth reading for.
                        self.state = State::Closed;
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.state = State::Closed;
                    return;
                }
            }
        }
    }

    /// False when the connection is to be closed (done, failed or past its deadline).
    fn keep(&self, now: Instant, counters: &Counters) -> bool {
        match self.state {
            State::Closed => false,
            State::Draining { until, .. } => now < until,
            State::Reading { .. } | State::Writing { .. } => {
                if now >= self.deadline {
                    Counters::bump(&counters.timed_out, 1);
                    false
                } else {
                    true
                }
            }
        }
    }
}

enum Scan {
    Incomplete,
    /// The head, terminator included, is this long.
    Complete(usize),
    /// Cannot become a valid request: answered at once rather than at the deadline.
    Bad,
}

/// Looks for the end of the head in `buf`, whose first `scanned` bytes were looked at before
/// (each byte is looked at about once, however slowly the head arrives).
fn scan_head(buf: &[u8], scanned: usize) -> Scan {
    // The request line: visible ASCII and spaces, ended by CRLF. Checked as it arrives so that
    // garbage gets its 400 without waiting for a terminator that may never come.
    let line_end = buf.iter().position(|&b| b == b'\n');
    let line = &buf[..line_end.unwrap_or(buf.len())];
    let fresh = line.get(scanned.min(line.len())..).unwrap_or(&[]);
    let last = line.len().saturating_sub(1);
    let fresh_start = scanned.min(line.len());
    for (i, &b) in fresh.iter().enumerate() {
        let ok = b == b' ' || b.is_ascii_graphic() || (b == b'\r' && fresh_start + i == last);
        if !ok {
            return Scan::Bad;
        }
    }
    match line_end {
        None => return Scan::Incomplete,
        // A bare LF ends no line in this server's HTTP.
        Some(end) if end == 0 || buf[end - 1] != b'\r' => return Scan::Bad,
        Some(_) => {}
    }
    let from = scanned.saturating_sub(3);
    match buf
        .get(from..)
        .and_then(|b| b.windows(4).position(|w| w == b"\r\n\r\n"))
    {
        Some(at) => Scan::Complete(from + at + 4),
        None => Scan::Incomplete,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Metrics,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    HeadTooLarge,
}

/// What to answer a complete head with, and whether it was a HEAD request (no body then).
fn route(head: &[u8]) -> (Reply, bool) {
    let Some((method, target)) = parse_head(head) else {
        return (Reply::BadRequest, false);
    };
    let is_head = method == b"HEAD";
    let path_end = target
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(target.len());
    if &target[..path_end] != b"/metrics" {
        return (Reply::NotFound, is_head);
    }
    match method {
        b"GET" | b"HEAD" => (Reply::Metrics, is_head),
        _ => (Reply::MethodNotAllowed, is_head),
    }
}

/// Method and request target of a well-formed HTTP/1.x head (terminator included), else None.
fn parse_head(head: &[u8]) -> Option<(&[u8], &[u8])> {
    // Without the final empty line, every line ends in CRLF; a bare LF is malformed.
    let head = head.strip_suffix(b"\r\n\r\n")?;
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    // (The last line lost its CR with the terminator; every other must have one.)
    if head
        .split(|&b| b == b'\n')
        .rev()
        .skip(1)
        .any(|l| !l.ends_with(b"\r"))
    {
        return None;
    }
    let request_line = lines.next()?;
    let mut parts = request_line.split(|&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.iter().all(|&b| is_tchar(b))
        || !target.starts_with(b"/")
        || !is_http1(version)
    {
        return None;
    }
    for line in lines {
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        // An empty name, or whitespace before the colon, or a folded line (leading space):
        // each is rejected by RFC 9112 for what it lets requests smuggle.
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return None;
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return None;
        }
    }
    Some((method, target))
}

fn is_http1(version: &[u8]) -> bool {
    matches!(version, [b'H', b'T', b'T', b'P', b'/', b'1', b'.', d] if d.is_ascii_digit())
}

/// RFC 9110 token characters (methods, header names).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The response state for `reply`, counted.
fn respond(reply: Reply, is_head: bool, body: &Body, counters: &Counters) -> State {
    if reply == Reply::Metrics {
        Counters::bump(&counters.requests, 1);
        let text = body.get();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            text.len()
        );
        return State::Writing {
            head: head.into_bytes(),
            body: (!is_head).then_some(text),
            sent: 0,
        };
    }
    Counters::bump(&counters.bad_requests, 1);
    let (status, extra) = match reply {
        Reply::BadRequest => ("400 Bad Request", ""),
        Reply::NotFound => ("404 Not Found", ""),
        Reply::MethodNotAllowed => ("405 Method Not Allowed", "Allow: GET, HEAD\r\n"),
        Reply::HeadTooLarge | Reply::Metrics => ("431 Request Header Fields Too Large", ""),
    };
    // The reason phrase, minus the code, is the body: enough for a human with curl.
    let text = status.split_once(' ').map_or(status, |(_, r)| r);
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        text.len() + 1
    );
    if !is_head {
        head.push_str(text);
        head.push('\n');
    }
    State::Writing {
        head: head.into_bytes(),
        body: None,
        sent: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::sync::atomic::AtomicBool;
    use std::thread;

    fn localhost() -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
    }

    fn serve(text: &str, limits: Limits) -> (Server, Arc<Body>) {
        let body = Arc::new(Body::new());
        body.set(text.to_owned());
        let server = Server::start_with(localhost(), Arc::clone(&body), limits).unwrap();
        (server, body)
    }

    /// Reads until EOF or an error (a reset after the response counts as its end).
    fn read_all(stream: &mut TcpStream) -> Vec<u8> {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("read: {e} after {} bytes", out.len()),
            }
        }
    }

    fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        read_all(&mut s)
    }

    struct Response {
        status: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Response {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    fn parse(raw: &[u8]) -> Response {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(raw)));
        let head = std::str::from_utf8(&raw[..end]).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().to_owned();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(": ").unwrap();
                (n.to_owned(), v.to_owned())
            })
            .collect();
        Response {
            status,
            headers,
            body: raw[end + 4..].to_vec(),
        }
    }

    fn get(addr: SocketAddr, request: &str) -> Response {
        parse(&exchange(addr, request.as_bytes()))
    }

    /// Waits for `cond`, failing after `limit`.
    fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(2));
        }
    }

    const TEXT: &str =
        "# HELP ringbag_up 1 when recording\n# TYPE ringbag_up gauge\nringbag_up 1\n";

    #[test]
    fn get_metrics_serves_the_body_with_its_headers() {
        let (server, _body) = serve(TEXT, LIMITS);
        let r = get(
            server.local_addr(),
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(r.status, "HTTP/1.1 200 OK");
        assert_eq!(r.header("Content-Type"), Some(CONTENT_TYPE));
        assert_eq!(r.header("Content-Length"), Some(&*TEXT.len().to_string()));
        assert_eq!(r.header("Connection"), Some("close"));
        assert_eq!(r.body, TEXT.as_bytes());
        // The query string is ignored, and HTTP/1.0 is served too.
        let r = get(
            server.local_addr(),
            "GET /metrics?name[]=x HTTP/1.0\r\n\r\n",
        );
        assert_eq!(r.status, "HTTP/1.1 200 OK");
        assert_eq!(r.body, TEXT.as_bytes());
        assert_eq!(server.stats().requests, 2);
        assert_eq!(server.stats().bad_requests, 0);
    }

    #[test]
    fn head_has_the_headers_and_no_body() {
        let (server, _body) = serve(TEXT, LIMITS);
        let r = get(
            server.local_addr(),
            "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(r.status, "HTTP/1.1 200 OK");
        assert_eq!(r.header("Content-Type"), Some(CONTENT_TYPE));
        assert_eq!(r.header("Content-Length"), Some(&*TEXT.len().to_string()));
        assert!(r.body.is_empty());
    }

    #[test]
    fn a_replaced_body_is_served_on_the_next_request() {
        let (server, body) = serve("", LIMITS);
        let r = get(server.local_addr(), "GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(r.header("Content-Length"), Some("0"));
        assert!(r.body.is_empty());
        body.set(TEXT.to_owned());
        let r = get(server.local_addr(), "GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(r.body, TEXT.as_bytes());
        body.set("ringbag_up 0\n".to_owned());
        let r = get(server.local_addr(), "GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(r.body, b"ringbag_up 0\n");
    }

    #[test]
    fn another_path_is_404() {
        let (server, _body) = serve(TEXT, LIMITS);
        for path in ["/", "/metricsx", "/metrics/", "/favicon.ico"] {
            let r = get(server.local_addr(), &format!("GET {path} HTTP/1.1\r\n\r\n"));
            assert_eq!(r.status, "HTTP/1.1 404 Not Found", "{path}");
            assert_eq!(r.body, b"Not Found\n");
        }
        assert_eq!(server.stats().bad_requests, 4);
        assert_eq!(server.stats().requests, 0);
    }

    #[test]
    fn another_method_is_405_with_allow() {
        let (server, _body) = serve(TEXT, LIMITS);
        for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
            let r = get(
                server.local_addr(),
                &format!("{method} /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            );
            assert_eq!(r.status, "HTTP/1.1 405 Method Not Allowed", "{method}");
            assert_eq!(r.header("Allow"), Some("GET, HEAD"));
        }
    }

    #[test]
    fn garbage_is_400() {
        let (server, _body) = serve(TEXT, LIMITS);
        let garbage: &[&[u8]] = &[
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", // a TLS ClientHello
            b"GET /metrics HTTP/1.1\n\n",                    // bare LF
            b"GET /metrics\r\n\r\n",                         // HTTP/0.9
            b"GET /metrics HTTP/2.0\r\n\r\n",                // not HTTP/1.x
            b"GET  /metrics HTTP/1.1\r\n\r\n",               // two spaces
            b"GET metrics HTTP/1.1\r\n\r\n",                 // not origin-form
            b"G(T /metrics HTTP/1.1\r\n\r\n",                // not a token
            b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",      // no colon
            b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",    // space before colon
            b"GET /metrics HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", // obs-fold
            b"GET /metrics HTTP/1.1\r\nA: b\nB: c\r\n\r\n",  // bare LF in a header
            b"GET /metrics HTTP/1.1\r\nA: b\x00c\r\n\r\n",   // NUL in a value
            b"\r\n\r\n",                                     // empty request line
        ];
        for (i, g) in garbage.iter().enumerate() {
            let r = parse(&exchange(server.local_addr(), g));
            assert_eq!(r.status, "HTTP/1.1 400 Bad Request", "garbage {i}: {g:?}");
            assert_eq!(r.header("Connection"), Some("close"));
        }
        assert_eq!(server.stats().bad_requests, garbage.len() as u64);
        assert_eq!(server.stats().requests, 0);
    }

    #[test]
    fn a_head_over_8_kib_is_431() {
        let (server, _body) = serve(TEXT, LIMITS);
        // Exactly MAX_HEAD bytes is still served...
        let mut head = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        head.resize(MAX_HEAD - 4, b'a');
        head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(head.len(), MAX_HEAD);
        assert_eq!(
            parse(&exchange(server.local_addr(), &head)).body,
            TEXT.as_bytes()
        );
        // ...one byte more is not.
        head.insert(30, b'a');
        let r = parse(&exchange(server.local_addr(), &head));
        assert_eq!(r.status, "HTTP/1.1 431 Request Header Fields Too Large");
        assert_eq!(server.stats().bad_requests, 1);
    }

    #[test]
    fn a_1_mb_request_is_refused_without_being_read_whole() {
        let (server, _body) = serve(TEXT, LIMITS);
        let mut s = TcpStream::connect(server.local_addr()).unwrap();
        let mut big = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        big.resize(1 << 20, b'a');
        let mut w = s.try_clone().unwrap();
        // The write fails once the server closes; the response is read meanwhile.
        let writer = thread::spawn(move || w.write_all(&big).is_ok());
        let raw = read_all(&mut s);
        let r = parse(&raw);
        assert_eq!(r.status, "HTTP/1.1 431 Request Header Fields Too Large");
        drop(s);
        let _ = writer.join().unwrap();
        wait_for("the 431", Duration::from_secs(5), || {
            server.stats().bad_requests == 1
        });
        let read = server.counters.read_bytes.load(Ordering::Relaxed);
        assert!(
            read <= (MAX_HEAD * 2 + LINGER_BYTES) as u64,
            "the server read {read} bytes of a 1 MiB request"
        );
    }

    /// Opens `n` connections that never send anything.
    fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
    }

    /// Sends a request one byte per 100 ms, never finishing it, until `stop`.
    fn slowloris(addr: SocketAddr, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
        let mut s = TcpStream::connect(addr).unwrap();
        thread::spawn(move || {
            let prefix = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
            for i in 0.. {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let b = prefix.get(i).copied().unwrap_or(b'a');
                if s.write_all(&[b]).is_err() {
                    return; // evicted or timed out: what the server is for
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    }

    #[test]
    fn a_scrape_is_fast_despite_200_idle_connections_and_a_slowloris() {
        let (server, _body) = serve(TEXT, LIMITS);
        let addr = server.local_addr();
        let _idle = idle_connections(addr, 200);
        let stop = Arc::new(AtomicBool::new(false));
        let slow = slowloris(addr, Arc::clone(&stop));
        // Every hostile connection accepted: all but the cap's worth evicted.
        wait_for("the hostile connections", Duration::from_secs(10), || {
            server.stats().evicted >= 201 - MAX_CONNS as u64
        });
        let mut took = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            let raw = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            took.push(t0.elapsed());
            assert_eq!(parse(&raw).body, TEXT.as_bytes());
        }
        eprintln!("scrape latency (connect to last byte) under 200 idle + slowloris: {took:?}");
        for t in &took {
            assert!(
                *t < Duration::from_millis(100),
                "a scrape took {t:?}: {took:?}"
            );
        }
        assert_eq!(server.stats().requests, 5);
        stop.store(true, Ordering::SeqCst);
        slow.join().unwrap();
    }

    #[test]
    fn a_client_that_does_not_read_does_not_block_another_scrape() {
        // Far more than the socket buffers of both ends take, so the server's write to the
        // client that does not read stops part-way.
        let text = "x".repeat(16 << 20);
        let (server, _body) = serve(&text, LIMITS);
        let addr = server.local_addr();
        let mut stuck = TcpStream::connect(addr).unwrap();
        stuck.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        wait_for("the stuck request", Duration::from_secs(5), || {
            server.stats().requests == 1
        });
        let t0 = Instant::now();
        let r = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        let took = t0.elapsed();
        assert_eq!(r.body.len(), text.len());
        assert!(took < Duration::from_secs(5), "{took:?}");
        // The stuck client's response was written in parts and is still whole.
        let r = parse(&read_all(&mut stuck));
        assert_eq!(r.body.len(), text.len());
        assert!(r.body.iter().all(|&b| b == b'x'));
        assert_eq!(server.stats().requests, 2);
        assert_eq!(server.stats().timed_out, 0);
    }

    #[test]
    fn connections_past_their_deadline_are_closed() {
        let text = "x".repeat(16 << 20);
        let limits = Limits {
            deadline: Duration::from_millis(300),
            max_conns: MAX_CONNS,
        };
        let (server, _body) = serve(&text, limits);
        let addr = server.local_addr();
        let mut idle = TcpStream::connect(addr).unwrap();
        let mut stuck = TcpStream::connect(addr).unwrap();
        stuck.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        wait_for("both deadlines", Duration::from_secs(5), || {
            server.stats().timed_out == 2
        });
        assert!(read_all(&mut idle).is_empty());
        assert!(read_all(&mut stuck).len() < text.len());
    }

    #[test]
    fn at_the_cap_the_oldest_incomplete_connection_is_evicted() {
        let limits = Limits {
            deadline: DEADLINE,
            max_conns: 4,
        };
        let (server, _body) = serve(TEXT, limits);
        let addr = server.local_addr();
        let mut idle = idle_connections(addr, 4);
        // No wait needed: the server accepts in connection order, so the scrape comes after
        // the four idle connections and finds the cap reached.
        let r = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(r.body, TEXT.as_bytes());
        assert_eq!(server.stats().evicted, 1);
        // The oldest one went: it sees EOF, the newest does not.
        assert!(read_all(&mut idle[0]).is_empty());
        idle[3].set_nonblocking(true).unwrap();
        let mut probe = [0u8; 1];
        let r = idle[3].read(&mut probe);
        assert_eq!(r.map_err(|e| e.kind()).unwrap_err(), ErrorKind::WouldBlock);
        assert_eq!(server.stats().refused, 0);
    }

    #[test]
    fn finish_is_prompt_with_hostile_connections_and_closes_the_port() {
        let text = "x".repeat(16 << 20);
        let (server, _body) = serve(&text, LIMITS);
        let addr = server.local_addr();
        let mut idle = idle_connections(addr, 30);
        let mut stuck = TcpStream::connect(addr).unwrap();
        stuck.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let slow = slowloris(addr, Arc::clone(&stop));
        wait_for("the stuck request", Duration::from_secs(5), || {
            server.stats().requests == 1
        });
        let t0 = Instant::now();
        server.finish();
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(300), "finish took {took:?}");
        let refused = TcpStream::connect(addr).map_err(|e| e.kind()).unwrap_err();
        assert_eq!(refused, ErrorKind::ConnectionRefused);
        // Every connection was closed with the thread.
        assert!(read_all(&mut idle[0]).is_empty());
        assert!(read_all(&mut stuck).len() < text.len());
        stop.store(true, Ordering::SeqCst);
        slow.join().unwrap();
        idle.clear();
    }

    #[test]
    fn a_taken_port_names_the_address() {
        let (server, _body) = serve(TEXT, LIMITS);
        let addr = server.local_addr();
        let err = Server::start(addr, Arc::new(Body::new())).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("metrics_listen {addr}: cannot bind: ")),
            "{msg}"
        );
        assert!(matches!(err, HttpError::Bind { .. }));
    }

    #[test]
    fn the_server_thread_is_named() {
        let (server, _body) = serve(TEXT, LIMITS);
        let name = server
            .thread
            .as_ref()
            .and_then(|t| t.thread().name().map(str::to_owned));
        assert_eq!(name.as_deref(), Some("ringbag-metrics"));
    }

    #[test]
    fn scan_and_parse_do_not_panic_on_any_prefix() {
        let reqs: &[&[u8]] = &[
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\r",
            b"\n",
            b"\r\n",
            b"G\r\r\n\r\n",
            b":\r\n\r\n",
            b"GET / HTTP/1.1\r\n:\r\n\r\n",
        ];
        for r in reqs {
            for end in 0..=r.len() {
                for scanned in 0..=end {
                    let _ = scan_head(&r[..end], scanned);
                }
                let _ = route(&r[..end]);
            }
        }
    }
}
