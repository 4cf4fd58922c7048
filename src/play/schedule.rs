//! The scheduler: publishes each message at `anchor_wall + (t − anchor_bag) / rate` on
//! CLOCK_MONOTONIC. It sleeps coarsely (waking early for a key, a `/clock` tick or a stop
//! request) until [`SPIN_NS`] before a message is due, then spins to the target. Pausing,
//! stepping, rate changes and loop restarts move the anchor, so the time spent paused is not
//! counted and errors never accumulate.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::keys::Command;
use super::plan::{clock_cdr, Plan};
use super::reader::{Item, ReadAhead};
use super::sink::{monotonic_ns, Sink, SinkError};
use super::{PlayError, PlayReport};

/// The last stretch before a message's time is spent spinning, not sleeping: a sleep's
/// wake-up is late by tens of microseconds on an idle machine and more under load. (Half the
/// wait when that is shorter: see `wait_for`.)
pub const SPIN_NS: i64 = 200_000;
/// Before the first message the scheduler waits until the read-ahead holds this much
/// playback (wall time at the rate), or the queue is full, or at most PREFILL_MAX_WAIT_NS.
const PREFILL_WALL_NS: i64 = 100_000_000;
const PREFILL_MAX_WAIT_NS: u64 = 25_000_000;
/// Longest uninterrupted wait: a stop request is noticed at least this often, so a gap of
/// hours in a bag never delays a stop.
const POLL_NS: i64 = 50_000_000;

/// Bag time ↔ monotonic time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeline {
    pub anchor_wall: i64,
    pub anchor_bag: i64,
    pub rate: f64,
    /// Bag time at which playback stands while paused.
    pub paused: Option<i64>,
}

impl Timeline {
    /// When the message recorded at `bag_ns` is due (monotonic ns).
    pub fn wall_for(&self, bag_ns: i64) -> i64 {
        let offset = bag_ns.saturating_sub(self.anchor_bag) as f64 / self.rate;
        self.anchor_wall.saturating_add(offset as i64)
    }

    /// The bag time playback stands at, at monotonic time `now`.
    pub fn bag_at(&self, now: i64) -> i64 {
        match self.paused {
            Some(p) => p,
            None => {
                let offset = now.saturating_sub(self.anchor_wall) as f64 * self.rate;
                self.anchor_bag.saturating_add(offset as i64)
            }
        }
    }

    pub fn pause(&mut self, now: i64, floor: i64) {
        if self.paused.is_none() {
            self.paused = Some(self.bag_at(now).max(floor));
        }
    }

    pub fn resume(&mut self, now: i64) {
        if let Some(p) = self.paused.take() {
            self.anchor_bag = p;
            self.anchor_wall = now;
        }
    }

    pub fn set_rate(&mut self, now: i64, rate: f64) {
        if self.paused.is_none() {
            self.anchor_bag = self.bag_at(now);
            self.anchor_wall = now;
        }
        self.rate = rate;
    }

    /// Start over at `bag_ns` now (a loop's next pass), keeping a pause.
    pub fn restart(&mut self, now: i64, bag_ns: i64) {
        self.anchor_wall = now;
        self.anchor_bag = bag_ns;
        if self.paused.is_some() {
            self.paused = Some(bag_ns);
        }
    }
}

/// Figures for the status lines.
pub struct Span {
    /// The bag's first timestamp: status lines give positions from it.
    pub bag_start: i64,
    pub bag_duration: i64,
    /// Where playback starts (bag start + `--start-offset`).
    pub play_start: i64,
    /// Where it ends: the bag's last message, or an earlier `--playback-*` end. `/clock`
    /// stays inside [play_start, play_end].
    pub play_end: i64,
}

pub struct Scheduler<'a> {
    pub sink: &'a mut dyn Sink,
    pub plan: &'a Plan,
    pub queue: &'a ReadAhead,
    pub commands: Option<Receiver<Command>>,
    pub stop: &'a dyn Fn() -> bool,
    pub timeline: Timeline,
    pub span: Span,
    /// `/clock` period in ns, when `--clock` is on.
    pub clock_period_ns: Option<i64>,
    /// `--rt-priority`.
    pub rt_priority: Option<i32>,
    /// Per topic of the bag: `/clock` is published with each of its messages' time just
    /// before the message (`--clock-topics`, `--clock-topics-all`); empty: never.
    pub clock_before: Vec<bool>,
    /// `ringbag burst`: no waiting for a message's time; stop after this many (0 = all).
    pub burst: Option<u64>,
    pub report: PlayReport,
    next_clock: i64,
    /// The last `/clock` published in this pass: `/clock` never goes back within a pass,
    /// also when the start is re-anchored once the first message is in hand (ticks sent
    /// while waiting for it ran on the provisional anchor).
    last_clock: i64,
    step: bool,
    flushed: bool,
}

enum Wait {
    Due,
    Stop,
}

impl<'a> Scheduler<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sink: &'a mut dyn Sink,
        plan: &'a Plan,
        queue: &'a ReadAhead,
        commands: Option<Receiver<Command>>,
        stop: &'a dyn Fn() -> bool,
        timeline: Timeline,
        span: Span,
        clock_period_ns: Option<i64>,
        rt_priority: Option<i32>,
    ) -> Self {
        Scheduler {
            sink,
            plan,
            queue,
            commands,
            stop,
            next_clock: timeline.anchor_wall.min(monotonic_ns()),
            last_clock: i64::MIN,
            timeline,
            span,
            clock_period_ns,
            rt_priority,
            clock_before: Vec::new(),
            burst: None,
            report: PlayReport::default(),
            step: false,
            flushed: true,
        }
    }

    fn sink_result(r: Result<(), SinkError>) -> Result<bool, PlayError> {
        match r {
            Ok(()) => Ok(true),
            Err(SinkError::Closed) => Ok(false),
            Err(SinkError::Failed(e)) => Err(PlayError::Sink(e)),
            Err(SinkError::Output(e)) => Err(PlayError::Output(e)),
        }
    }

    /// Play until the reader is done, a stop is requested or the sink's consumer is gone.
    pub fn run(mut self) -> Result<PlayReport, PlayError> {
        // Sleeps end as close to their deadline as the kernel allows (default slack: 50 µs).
        let _ = nix::sys::prctl::set_timerslack(1);
        if let Some(prio) = self.rt_priority {
            if let Err(e) = realtime(prio) {
                log::warn!(
                    "--rt-priority {prio}: cannot run SCHED_FIFO ({e}; needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least {prio}); playing with normal scheduling"
                );
            }
        }
        // The schedule starts when the first message is in hand (as ros2 bag play waits
        // for its queue): what opening the bag and the first read cost is not counted as
        // lateness of every message after it. `--delay` still counts from the start.
        // A head start of read-ahead first, so the reader is not on the timing path from
        // the very first message; bounded, so it never costs the first message much.
        self.queue.wait_ready(
            (PREFILL_WALL_NS as f64 * self.timeline.rate) as i64,
            Duration::from_nanos(PREFILL_MAX_WAIT_NS),
        );
        let mut first = Some(self.next_item()?);
        let now = monotonic_ns();
        if matches!(first, Some(Some(Item::Msg(_)))) && now > self.timeline.anchor_wall {
            self.timeline.anchor_wall = now;
        }
        self.log_anchor("start");
        loop {
            let item = match first.take() {
                Some(item) => item,
                None => self.next_item()?,
            };
            let m = match item {
                None => break,
                Some(Item::Msg(m)) => m,
                Some(Item::EndOfPass) => {
                    self.report.loops += 1;
                    self.timeline.restart(monotonic_ns(), self.span.play_start);
                    // A new pass starts the clock over, as ros2 bag play's loop does.
                    self.last_clock = i64::MIN;
                    self.log_anchor("loop");
                    continue;
                }
                Some(Item::Done) => {
                    self.report.loops += 1;
                    break;
                }
                Some(Item::Failed(e)) => return Err(PlayError::Read(e)),
            };
            let Some(Some(topic)) = self.plan.route.get(m.topic).copied() else {
                continue;
            };
            let wait = if self.burst.is_none() {
                self.wait_for(m.timestamp)?
            } else if self.service()? {
                // A burst skips the schedule, but still honours a stop request.
                Wait::Stop
            } else {
                Wait::Due
            };
            match wait {
                Wait::Stop => break,
                Wait::Due => {}
            }
            if let (Some(true), Some(clock)) =
                (self.clock_before.get(m.topic).copied(), self.plan.clock)
            {
                // The message's own time, never back within a pass (as the ticks).
                let t = m.timestamp.max(self.last_clock);
                self.last_clock = t;
                if !Self::sink_result(self.sink.publish(clock, t, &clock_cdr(t)))? {
                    return Ok(self.report);
                }
            }
            if !Self::sink_result(self.sink.publish(topic, m.timestamp, &m.data))? {
                return Ok(self.report);
            }
            self.flushed = false;
            self.report.published += 1;
            if self
                .burst
                .is_some_and(|n| n > 0 && self.report.published >= n)
            {
                break;
            }
            if self.step {
                self.step = false;
                self.timeline.paused = Some(m.timestamp);
                let name = &self.plan.topics[topic].name;
                self.status(&format!("next: {name}"));
            }
        }
        Self::sink_result(self.sink.flush())?;
        Ok(self.report)
    }

    /// The next item from the reader; `None` on a stop request. Keys and `/clock` are served
    /// while the reader catches up.
    fn next_item(&mut self) -> Result<Option<Item>, PlayError> {
        loop {
            if let Some(item) = self.queue.pop(Duration::ZERO) {
                return Ok(Some(item));
            }
            if self.service()? {
                return Ok(None);
            }
            self.flush()?;
            let now = monotonic_ns();
            let wait = self.deadline(now + POLL_NS) - now;
            if let Some(item) = self.queue.pop(Duration::from_nanos(wait.max(0) as u64)) {
                return Ok(Some(item));
            }
        }
    }

    /// Wait until a message recorded at `bag_ns` is due (or stepped to while paused).
    fn wait_for(&mut self, bag_ns: i64) -> Result<Wait, PlayError> {
        // How long before the target the spin starts: SPIN_NS, or half the wait when
        // messages come closer together than that (10 kHz), so the scheduler still sleeps
        // half the time: a thread that never sleeps is preempted by the kernel's fairness,
        // or, under --rt-priority, stopped for 50 ms a second by real-time throttling.
        let mut spin: Option<i64> = None;
        loop {
            if self.service()? {
                return Ok(Wait::Stop);
            }
            if self.step {
                return Ok(Wait::Due);
            }
            let now = monotonic_ns();
            if self.timeline.paused.is_some() {
                self.flush()?;
                self.idle(now, now + POLL_NS);
                continue;
            }
            let target = self.timeline.wall_for(bag_ns);
            if now >= target {
                return Ok(Wait::Due);
            }
            let spin = *spin.get_or_insert(SPIN_NS.min((target - now) / 2));
            if target - now > spin {
                self.flush()?;
                self.idle(now, target - spin);
                continue;
            }
            while monotonic_ns() < target {
                std::hint::spin_loop();
            }
            return Ok(Wait::Due);
        }
    }

    fn flush(&mut self) -> Result<(), PlayError> {
        if !self.flushed {
            self.flushed = true;
            if !Self::sink_result(self.sink.flush())? {
                // The consumer is gone; the next publish reports it and ends playback.
                return Ok(());
            }
        }
        Ok(())
    }

    /// `until`, or earlier for the next `/clock` tick.
    fn deadline(&self, until: i64) -> i64 {
        match self.clock_period_ns {
            Some(_) => until.min(self.next_clock),
            None => until,
        }
    }

    /// Sleep until `until` (or the next `/clock` tick, at most [`POLL_NS`]), waking at once
    /// for a key.
    fn idle(&mut self, now: i64, until: i64) {
        let until = self.deadline(until.min(now + POLL_NS));
        let Ok(wait) = u64::try_from(until - now) else {
            return;
        };
        let wait = Duration::from_nanos(wait);
        match &self.commands {
            Some(rx) => match rx.recv_timeout(wait) {
                Ok(c) => self.apply(c),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.commands = None,
            },
            None => std::thread::sleep(wait),
        }
    }

    /// Keys that arrived, a `/clock` tick that is due, and the stop request (true: stop).
    fn service(&mut self) -> Result<bool, PlayError> {
        while let Some(c) = self.commands.as_ref().and_then(|rx| rx.try_recv().ok()) {
            self.apply(c);
        }
        if let (Some(period), Some(clock)) = (self.clock_period_ns, self.plan.clock) {
            let now = monotonic_ns();
            if now >= self.next_clock {
                let t = self
                    .timeline
                    .bag_at(now)
                    .clamp(
                        self.span.play_start,
                        self.span.play_end.max(self.span.play_start),
                    )
                    .max(self.last_clock);
                self.last_clock = t;
                if !Self::sink_result(self.sink.publish(clock, t, &clock_cdr(t)))? {
                    return Ok(true);
                }
                self.flushed = false;
                self.next_clock += period;
                if self.next_clock <= now {
                    // Fell behind (suspended, overloaded): tick on from now, never in a burst.
                    self.next_clock = now + period;
                }
            }
        }
        Ok((self.stop)())
    }

    fn apply(&mut self, c: Command) {
        let now = monotonic_ns();
        match c {
            Command::TogglePause => {
                if self.timeline.paused.is_some() {
                    self.timeline.resume(now);
                    self.status_at("resumed", now);
                    self.log_anchor("resume");
                } else {
                    self.timeline.pause(now, self.span.play_start);
                    self.status_at("paused", now);
                }
            }
            Command::Next if self.timeline.paused.is_some() => self.step = true,
            Command::Next => self.status_at("next: only while paused (space pauses)", now),
            Command::Faster | Command::Slower => {
                let factor = if c == Command::Faster { 1.1 } else { 0.9 };
                self.timeline.set_rate(now, self.timeline.rate * factor);
                self.status_at(&format!("rate {:.3}", self.timeline.rate), now);
                self.log_anchor("rate");
            }
        }
    }

    /// One status line on stderr per key press.
    pub fn status(&self, what: &str) {
        self.status_at(what, monotonic_ns());
    }

    /// The status line for the playback position at monotonic time `now`: a key's line uses
    /// the moment the key took effect, so "resumed" names exactly where playback was paused,
    /// however long printing takes after it (under emulation, a millisecond or more).
    fn status_at(&self, what: &str, now: i64) {
        let at = self.timeline.bag_at(now).max(self.span.play_start);
        eprintln!(
            "ringbag: {what}; at {:.3} s of {:.3} s, rate {:.3}, {}",
            (at - self.span.bag_start) as f64 / 1e9,
            self.span.bag_duration as f64 / 1e9,
            self.timeline.rate,
            if self.timeline.paused.is_some() {
                "paused"
            } else {
                "playing"
            }
        );
    }

    /// The schedule's reference point, for checking timing from the echo output.
    fn log_anchor(&self, why: &str) {
        log::debug!(
            "schedule ({why}): bag {} ns at monotonic {} ns, rate {}",
            self.timeline.anchor_bag,
            self.timeline.anchor_wall,
            self.timeline.rate
        );
    }
}

/// Put the calling thread in SCHED_FIFO at `prio`: a waking scheduler then preempts every
/// normal task at once, instead of waiting out another task's time slice (milliseconds on a
/// loaded machine). Only the calling thread.
pub(super) fn realtime(prio: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pthread_self() is the calling thread's valid handle; `param` is a valid
    // sched_param that outlives the call.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl() -> Timeline {
        Timeline {
            anchor_wall: 1_000,
            anchor_bag: 5_000_000,
            rate: 2.0,
            paused: None,
        }
    }

    #[test]
    fn messages_are_due_at_the_anchor_plus_bag_offset_over_rate() {
        let t = tl();
        assert_eq!(t.wall_for(5_000_000), 1_000);
        assert_eq!(t.wall_for(7_000_000), 1_001_000);
        assert_eq!(t.bag_at(1_001_000), 7_000_000);
    }

    #[test]
    fn time_spent_paused_is_not_counted() {
        let mut t = tl();
        t.pause(501_000, 0); // 1 ms of bag time played
        assert_eq!(t.paused, Some(6_000_000));
        assert_eq!(t.bag_at(10_000_000_000), 6_000_000);
        t.resume(10_000_000_000);
        // The next message, 1 ms of bag time later, is due 0.5 ms after the resume.
        assert_eq!(t.wall_for(7_000_000), 10_000_500_000);
    }

    #[test]
    fn a_rate_change_keeps_the_current_position() {
        let mut t = tl();
        t.set_rate(1_001_000, 1.0);
        assert_eq!(t.bag_at(1_001_000), 7_000_000);
        assert_eq!(t.wall_for(8_000_000), 2_001_000);
        // While paused only the rate changes.
        t.pause(2_001_000, 0);
        t.set_rate(3_000_000, 4.0);
        assert_eq!(t.paused, Some(8_000_000));
        t.resume(5_000_000);
        assert_eq!(t.wall_for(12_000_000), 6_000_000);
    }

    #[test]
    fn a_pause_during_the_delay_stands_at_the_start() {
        // Anchored 1 s in the future (--delay 1).
        let mut t = Timeline {
            anchor_wall: 1_000_000_000,
            anchor_bag: 5_000,
            rate: 1.0,
            paused: None,
        };
        t.pause(0, 5_000);
        assert_eq!(t.paused, Some(5_000));
    }
}
