//! Drives the synthetic profiles through a `Producer`, in real time or as fast as the writer
//! accepts.

use std::time::{Duration, Instant};

use crate::bag::QosProfile;
use crate::pipeline::{Bursts, Producer, TopicHandle, BURST_MESSAGE_MAX};
use crate::source::select::{Decision, RosSourceOptions, TopicSelector};
use crate::source::synthetic::{Encoder, Payload, SyntheticProfile};

/// `Pace::Max` waits while this much is queued: sixteen of the writer's default 2 MiB batches.
const MAX_PACE_QUEUED_BYTES: usize = 32 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Each topic at its nominal rate; never waits for the queue, so overload shows as drops.
    Realtime,
    /// Same topic mix, no sleeping; waits when the queue is full (measures throughput).
    Max,
}

#[derive(Debug, Clone, Copy)]
pub struct GeneratorConfig {
    pub profile: SyntheticProfile,
    pub pace: Pace,
    /// Total messages to generate; 0 = until the producer is asked to stop.
    pub count: u64,
    /// Which of the profile's topics are generated: bit i for the i-th of
    /// `SyntheticProfile::topics` (the record command's selection flags); [`ALL_TOPICS`].
    pub topics: u64,
    /// Template bytes (the default) or modelled sensor data (`--synthetic-payload`).
    pub payload: Payload,
}

/// `GeneratorConfig::topics` for every topic of the profile.
pub const ALL_TOPICS: u64 = u64::MAX;

/// Why a selection cannot be used with a synthetic profile.
#[derive(Debug, thiserror::Error)]
pub enum TopicChoiceError {
    /// The selection itself is bad (a pattern, a name), whatever the source.
    #[error(transparent)]
    Selection(#[from] crate::source::select::SelectError),
    #[error("the selection keeps none of the {profile} profile's topics ({names})")]
    NoneKept { profile: String, names: String },
}

impl TopicChoiceError {
    /// True when the message only makes sense with the synthetic source named beside it.
    pub fn is_about_the_profile(&self) -> bool {
        !matches!(self, TopicChoiceError::Selection(_))
    }
}

/// Which of `profile`'s topics a selection keeps, as `GeneratorConfig::topics`: the rules
/// of live recording applied to the profile's fixed names. No selection keeps them all, and
/// exclusions alone start from all of them. A named topic the profile does not have is
/// warned about; a selection that keeps none is refused, as is an invalid pattern.
pub fn select_topics(
    profile: SyntheticProfile,
    sel: &RosSourceOptions,
) -> Result<u64, TopicChoiceError> {
    let (names, types): (Vec<String>, Vec<String>) = profile
        .topics()
        .into_iter()
        .map(|t| (t.info.name, t.info.type_name))
        .unzip();
    if !sel.picks_topics()
        && sel.exclude_regex.is_none()
        && sel.exclude_topics.is_empty()
        && sel.exclude_topic_types.is_empty()
        && !sel.include_hidden_topics
    {
        return Ok(ALL_TOPICS);
    }
    let selector = TopicSelector::all_by_default(sel)?;
    let profile = format!("{profile:?}").to_lowercase();
    let mask = names
        .iter()
        .enumerate()
        .filter(|&(i, n)| selector.decide(n, std::slice::from_ref(&types[i])) == Decision::Record)
        .fold(0u64, |m, (i, _)| {
            m | 1u64.checked_shl(i as u32).unwrap_or(0)
        });
    if mask == 0 {
        return Err(TopicChoiceError::NoneKept {
            profile,
            names: names.join(", "),
        });
    }
    // As live recording waits for a named topic that never appears, a name the profile lacks
    // is not an error (a config written for the robot's real topics still runs on the
    // synthetic source); it is said once.
    let absent: Vec<&str> = selector
        .named_topics()
        .iter()
        .filter(|t| !names.contains(t))
        .map(String::as_str)
        .collect();
    if !absent.is_empty() {
        log::warn!(
            "the {profile} synthetic profile has no {} (its topics: {}); recording the others",
            absent.join(", "),
            names.join(", ")
        );
    }
    Ok(mask)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GeneratorReport {
    /// Messages made; the topics' counters say which were recorded or dropped.
    pub generated: u64,
}

struct Lane {
    /// Tags this lane's pooled buffers (`Encoder::encode_reusing`); never 0.
    key: u16,
    handle: TopicHandle,
    encoder: Encoder,
    /// Its messages are small enough to travel in bursts ([`Bursts`]).
    small: bool,
    period_ns: u64,
    /// Next due time, ns since generator start (virtual time in `Max`).
    due_ns: u64,
    seq: u64,
}

/// Register the profile's topics and generate until `count` or a stop request.
pub fn run(cfg: GeneratorConfig, producer: &Producer) -> GeneratorReport {
    let mut lanes: Vec<Lane> = cfg
        .profile
        .topics()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| {
            1u64.checked_shl(*i as u32)
                .is_some_and(|bit| cfg.topics & bit != 0)
        })
        .map(|(i, t)| {
            let mut info = t.info.clone();
            info.offered_qos_profiles = vec![QosProfile::default()];
            let encoder = t.encoder_with(cfg.payload);
            Lane {
                key: i as u16 + 1,
                small: encoder.size_hint() <= BURST_MESSAGE_MAX,
                encoder,
                handle: producer.add_topic(info, Some(t.definition.clone())),
                period_ns: (1e9 / t.rate_hz).max(1.0) as u64,
                due_ns: 0,
                seq: 0,
            }
        })
        .collect();
    let mut report = GeneratorReport::default();
    if lanes.is_empty() {
        return report;
    }
    let mut bursts = Bursts::new(producer.clone());
    let start = Instant::now();
    let mut spare: Option<(Vec<u8>, u64)> = None;
    while !producer.stop_requested() && (cfg.count == 0 || report.generated < cfg.count) {
        // The lane due first; ties go to the earlier lane, which keeps the mix deterministic.
        let lane = lanes
            .iter_mut()
            .min_by_key(|l| l.due_ns)
            .expect("at least one lane");
        if cfg.pace == Pace::Realtime {
            let now = start.elapsed().as_nanos() as u64;
            if lane.due_ns > now {
                // About to wait: what is in the burst goes now, not after the nap.
                bursts.flush();
                std::thread::sleep(Duration::from_nanos(lane.due_ns - now));
            } else if now - lane.due_ns > 1_000_000_000 {
                // Far behind (suspended, overloaded): skip ahead rather than burst.
                lane.due_ns = now;
            }
        }
        if cfg.pace == Pace::Max {
            // As fast as the writer accepts, but no faster: a few batches queued keep it busy.
            // Filling the whole cache budget first would only add first-touch page faults
            // for buffers the writer never needed in advance (~12 % of a 1 GiB run).
            wait_while(producer, || {
                producer.in_flight_bytes() > MAX_PACE_QUEUED_BYTES
            });
        }
        let (seq, key, len) = (lane.seq, lane.key, lane.encoder.size_hint());
        let encoder = &mut lane.encoder;
        match (cfg.pace, lane.small) {
            (Pace::Realtime, true) => {
                bursts.push_with(&lane.handle, len, |ts, buf| encoder.encode(seq, ts, buf));
            }
            (Pace::Max, true) => {
                // No room: the writer is behind; give it the CPU rather than drop.
                wait_while(producer, || {
                    let fill = |ts, buf: &mut Vec<u8>| encoder.encode(seq, ts, buf);
                    bursts.try_push_with(&lane.handle, len, fill).is_err()
                });
            }
            (Pace::Realtime, false) => {
                // Large messages travel alone, after the small ones made before them.
                bursts.flush();
                // Buffers come back from the writer still holding a message: the encoder
                // rewrites only what differs when the message was its own (see
                // `Encoder::encode_reusing`).
                let fill =
                    |ts, buf: &mut Vec<u8>, old| encoder.encode_reusing(key, seq, ts, buf, old);
                let _ = producer.try_push_reusing(&lane.handle, None, false, fill);
            }
            (Pace::Max, false) => {
                wait_while(producer, || bursts.try_flush().is_err());
                let fill =
                    |ts, buf: &mut Vec<u8>, old| encoder.encode_reusing(key, seq, ts, buf, old);
                let mut r = producer.try_push_reusing(&lane.handle, spare.take(), true, fill);
                let mut backoff = Backoff::new();
                while let Err(Some(pending)) = r {
                    if producer.stop_requested() {
                        spare = Some(pending.into_tagged());
                        break;
                    }
                    // Queue full: give the writer the CPU rather than drop.
                    backoff.nap();
                    r = producer.retry(&lane.handle, pending).map_err(Some);
                }
            }
        }
        report.generated += 1;
        lane.seq += 1;
        lane.due_ns += lane.period_ns;
    }
    // The last burst: at full speed it waits for room, as every message did.
    if cfg.pace == Pace::Max {
        wait_while(producer, || bursts.try_flush().is_err());
    }
    report
}

/// Naps from 50 us doubling to 1 ms. The queue holds ~100 ms of work at full speed, so the
/// writer never waits for a napping generator, and the generator does not wake a few
/// thousand times per message (that was 8,000 context switches per GiB).
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_micros(50))
    }

    fn nap(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_millis(1));
    }
}

/// Call `busy` until it returns false or a stop is requested, napping in between.
fn wait_while(producer: &Producer, mut busy: impl FnMut() -> bool) {
    let mut backoff = Backoff::new();
    while busy() && !producer.stop_requested() {
        backoff.nap();
    }
}
