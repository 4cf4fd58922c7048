//! Room on the retention budget for a bag written beside the recording (a snapshot bag).
//!
//! The budget is enforced by the writer thread's retention, which owns the list of
//! deletable splits; the snapshot thread writes its bag concurrently. So that the root stays
//! within every bound at every moment, the snapshot thread asks before each batch it copies
//! for the bytes its bag may occupy after that batch (and after finishing), and writes only
//! once the writer thread has made room for them (deleting the oldest closed splits, keeping
//! room for the continuous recording's own next split) — or stops the snapshot short when
//! the budget or the free-space floor cannot hold more.
//!
//! One asker at a time (the snapshot thread asks and waits for the answer before asking
//! again), one answerer (the writer thread, at every turn of its loop: one atomic load when
//! nothing is asked).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// What the writer thread answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted,
    /// The budget or the free-space floor holds no more; why, for the warning.
    Refused(String),
    /// No writer thread answers any more (the recording is stopping).
    WriterGone,
}

#[derive(Debug, Default)]
pub struct Room {
    /// Bytes the other bag may occupy once its next write is done (0: no such bag).
    asked_bytes: AtomicU64,
    /// Of which it occupies now (the rest is growth, for the free-space floor).
    asked_on_disk: AtomicU64,
    /// Bumped (release) after `asked_*` are stored: a new question.
    asked_seq: AtomicU64,
    /// The writer's answer to `answered_seq`.
    granted: AtomicBool,
    refusal: std::sync::Mutex<String>,
    answered_seq: AtomicU64,
    writer_gone: AtomicBool,
    /// Whether the recording keeps a size budget or a free-space floor (set by the writer
    /// thread when it starts): without either, a snapshot needs no answer once it is gone.
    bounded: AtomicBool,
    /// Set by the writer thread when the recording ends and its last message is in the ring:
    /// the snapshot thread then finishes its open snapshot with what the ring holds, while
    /// the writer still answers (so it is finished within the budget, not cut short).
    winding_down: AtomicBool,
    /// What the bag occupies now, reported by the snapshot thread before each batch (it asks
    /// only when a batch goes beyond its grant): retention keeps the rest of the grant free
    /// above the floor (`Retention::with_beside_on_disk`).
    on_disk_now: std::sync::Arc<AtomicU64>,
}

impl Room {
    /// The snapshot thread: may the bag occupy `bytes` (now `on_disk`)? Waits for the answer,
    /// at most `limit`.
    pub fn ask(&self, bytes: u64, on_disk: u64, limit: Duration) -> Answer {
        self.asked_bytes.store(bytes, Relaxed);
        self.asked_on_disk.store(on_disk, Relaxed);
        let seq = self.asked_seq.fetch_add(1, Release) + 1;
        let end = Instant::now() + limit;
        loop {
            if self.answered_seq.load(Acquire) >= seq {
                return if self.granted.load(Relaxed) {
                    Answer::Granted
                } else {
                    Answer::Refused(self.refusal.lock().map(|r| r.clone()).unwrap_or_default())
                };
            }
            if self.writer_gone.load(Acquire) {
                return Answer::WriterGone;
            }
            if Instant::now() >= end {
                return Answer::Refused(format!(
                    "the recorder did not make room within {:.0} s",
                    limit.as_secs_f64()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The snapshot thread, before each batch: the bag occupies `bytes` now.
    pub fn report_on_disk(&self, bytes: u64) {
        self.on_disk_now.store(bytes, Relaxed);
    }

    /// Where [`Room::report_on_disk`] lands, for retention to read.
    pub fn on_disk_gauge(&self) -> std::sync::Arc<AtomicU64> {
        self.on_disk_now.clone()
    }

    /// The writer thread: the question not yet answered, as (seq, bytes, on_disk), if any.
    pub fn question(&self) -> Option<(u64, u64, u64)> {
        let seq = self.asked_seq.load(Acquire);
        if seq == self.answered_seq.load(Relaxed) {
            return None;
        }
        Some((
            seq,
            self.asked_bytes.load(Relaxed),
            self.asked_on_disk.load(Relaxed),
        ))
    }

    /// The writer thread: answer question `seq`.
    pub fn answer(&self, seq: u64, verdict: Result<(), String>) {
        match verdict {
            Ok(()) => self.granted.store(true, Relaxed),
            Err(why) => {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = why;
                }
                self.granted.store(false, Relaxed);
            }
        }
        self.answered_seq.store(seq, Release);
    }

    /// The writer thread, at start: whether it keeps a budget a snapshot must ask.
    pub fn set_bounded(&self, bounded: bool) {
        self.bounded.store(bounded, Release);
    }

    pub fn bounded(&self) -> bool {
        self.bounded.load(Acquire)
    }

    /// The writer thread, at the end of the recording: the ring holds every message; finish
    /// the open snapshot now. The writer goes on answering while [`Room::holding`].
    pub fn wind_down(&self) {
        self.winding_down.store(true, Release);
    }

    pub fn winding_down(&self) -> bool {
        self.winding_down.load(Acquire)
    }

    /// Whether a snapshot bag holds room (asked and not yet given back): one is open.
    pub fn holding(&self) -> bool {
        self.asked_bytes.load(Relaxed) > 0
    }

    /// When the last question was asked, as the number of questions so far (the writer
    /// compares it between turns to see whether the snapshot still makes progress).
    pub fn questions(&self) -> u64 {
        self.asked_seq.load(Acquire)
    }

    /// The writer thread is ending: nobody answers from now on.
    pub fn writer_gone(&self) {
        self.writer_gone.store(true, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_question_is_answered_once_and_a_gone_writer_answers_nothing() {
        let room = Arc::new(Room::default());
        let r2 = room.clone();
        let writer = std::thread::spawn(move || {
            let mut answered = 0;
            while answered < 2 {
                if let Some((seq, bytes, on_disk)) = r2.question() {
                    assert_eq!(on_disk, 10);
                    r2.answer(
                        seq,
                        if bytes <= 100 {
                            Ok(())
                        } else {
                            Err("full".into())
                        },
                    );
                    answered += 1;
                }
                std::thread::yield_now();
            }
        });
        assert_eq!(room.ask(50, 10, Duration::from_secs(10)), Answer::Granted);
        assert_eq!(
            room.ask(500, 10, Duration::from_secs(10)),
            Answer::Refused("full".into())
        );
        writer.join().unwrap();
        assert!(room.question().is_none());
        room.writer_gone();
        assert_eq!(room.ask(1, 0, Duration::from_secs(10)), Answer::WriterGone);
    }
}
