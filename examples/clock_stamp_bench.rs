//! ns per stamp: tracked clock (PHC stand-in), system clock, direct device read, and the
//! tracked clock under two-thread contention. Also prints the `ringbag clock` report for the
//! CLOCK_MONOTONIC_RAW stand-in.
//!
//! cargo run --release --example clock_stamp_bench [-- /dev/ptp0]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use ringbag::clock::{
    diagnose, measure_stamp_costs, start, ClockKind, ClockSettings, PtpDevice, SystemClock,
    TimeSource, MONOTONIC_RAW_STAND_IN,
};

const ROUND: u32 = 20_000;
const ROUNDS: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from(MONOTONIC_RAW_STAND_IN), PathBuf::from);
    let settings = ClockSettings {
        kind: ClockKind::Ptp,
        ptp_device: device.clone(),
        ..ClockSettings::default()
    };

    println!("== ringbag clock --ptp-device {} ==", device.display());
    print!("{}", diagnose(&settings, 10)?);

    let handle = start(&settings)?;
    let dev = PtpDevice::open(&device)?;
    // Many short rounds, reporting the minimum and the median: the machine may be shared,
    // and a long single run mostly measures preemption.
    let _ = measure_stamp_costs(&handle, Some(&dev), ROUND);
    let rounds: Vec<_> = (0..ROUNDS)
        .map(|_| measure_stamp_costs(&handle, Some(&dev), ROUND))
        .collect();
    let stat = |f: &dyn Fn(&ringbag::clock::StampCosts) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    println!("\n== ns per stamp ({ROUNDS} rounds x {ROUND}; min / median) ==");
    let (a, b) = stat(&|c| c.tracked_ns);
    println!("tracked clock (ClockHandle::now_ns): {a:6.1} / {b:6.1} ns");
    let (a, b) = stat(&|c| c.system_ns);
    println!("system clock (CLOCK_REALTIME):       {a:6.1} / {b:6.1} ns");
    let (a, b) = stat(&|c| c.device_ns.unwrap_or(f64::NAN));
    println!("direct clock_gettime on the device:  {a:6.1} / {b:6.1} ns");

    // Two threads stamping at once: the monotonic high-water mark is a shared atomic, so
    // compare with the system clock under the same two-thread load.
    let two = |src: &(dyn TimeSource + Sync)| {
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        let mut acc = 0i64;
                        for _ in 0..ROUND {
                            acc = acc.wrapping_add(src.now_ns());
                        }
                        black_box(acc);
                    });
                }
            });
            best = best.min(t0.elapsed().as_nanos() as f64 / f64::from(ROUND));
        }
        best
    };
    println!(
        "2 threads at once, best of 20 rounds: tracked {:.1} ns, system {:.1} ns per stamp per thread",
        two(&handle),
        two(&SystemClock)
    );
    handle.stop();
    for (k, v) in handle.custom_data() {
        println!("custom_data {k} = {v}");
    }
    Ok(())
}
