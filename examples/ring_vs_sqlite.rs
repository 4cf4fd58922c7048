//! The snapshot ring's write cost against the bag writer's (SQLite), for the README: the same
//! messages appended to a ring on tmpfs and written to a bag through `BagWriter` in batches
//! of 4096 (as the pipeline does), on this thread, with the thread's CPU clock.
//!
//! usage: ring_vs_sqlite RING_FILE BAG_DIR MESSAGE_BYTES TOTAL_BYTES
//! Prints one JSON line per target: {"target":..,"messages":..,"msg_per_s":..,"cpu_s_per_gb":..}

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ringbag::bag::writer::{BagWriter, WriterOptions};
use ringbag::bag::{Flavour, TopicInfo};
use ringbag::snapshot::ring::{Ring, RingWriter};

/// CPU seconds (user + system) of this thread so far.
fn thread_cpu_s() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("thread CPU clock");
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

fn report(target: &str, size: usize, n: u64, wall: f64, cpu: f64) {
    let gb = (n as f64 * size as f64) / 1e9;
    println!(
        "{{\"target\":\"{target}\",\"message_bytes\":{size},\"messages\":{n},\"seconds\":{wall:.3},\"msg_per_s\":{:.0},\"mb_per_s\":{:.1},\"cpu_s\":{cpu:.3},\"cpu_s_per_gb\":{:.3}}}",
        n as f64 / wall,
        gb * 1e3 / wall,
        cpu / gb
    );
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: ring_vs_sqlite RING_FILE BAG_DIR MESSAGE_BYTES TOTAL_BYTES");
        std::process::exit(2);
    }
    let size: usize = a[3].parse().expect("MESSAGE_BYTES");
    let total: u64 = a[4].parse().expect("TOTAL_BYTES");
    let n = (total / size as u64).max(1);
    let data = vec![0x5au8; size];

    // The ring: 1 GiB, so it wraps when TOTAL_BYTES is larger (eviction is part of the cost).
    let ring = Arc::new(Ring::create(Path::new(&a[1]), 1 << 30, 0).expect("ring"));
    let mut w = RingWriter::new(ring);
    let topic = w
        .add_topic(ringbag::snapshot::ring::RingTopic::new(
            &TopicInfo::new("/bench", "std_msgs/msg/String"),
            None,
        ))
        .expect("topic");
    // Touch every page once first: the first lap's page faults are a one-off at start.
    for i in 0..((1u64 << 30) / size as u64).min(n) {
        w.append(topic, i as i64, &data).expect("append");
    }
    let (c0, t0) = (thread_cpu_s(), Instant::now());
    for i in 0..n {
        w.append(topic, i as i64, &data).expect("append");
    }
    report(
        "ring",
        size,
        n,
        t0.elapsed().as_secs_f64(),
        thread_cpu_s() - c0,
    );

    let dir = Path::new(&a[2]);
    let _ = std::fs::remove_dir_all(dir);
    let mut bag = BagWriter::create(dir, WriterOptions::new(Flavour::Jazzy)).expect("bag");
    let idx = bag
        .add_topic(TopicInfo::new("/bench", "std_msgs/msg/String"), None)
        .expect("topic");
    let batch = 4096u64.min((8u64 << 20) / size as u64).max(1);
    let (c0, t0) = (thread_cpu_s(), Instant::now());
    let mut i = 0;
    while i < n {
        let k = batch.min(n - i);
        bag.write_batch((i..i + k).map(|j| (idx, j as i64, data.as_slice())))
            .expect("write");
        i += k;
    }
    bag.finish().expect("finish");
    report(
        "sqlite",
        size,
        n,
        t0.elapsed().as_secs_f64(),
        thread_cpu_s() - c0,
    );
    let _ = std::fs::remove_dir_all(dir);
}
