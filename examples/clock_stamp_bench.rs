//! ns per stamp: tracked clock (PHC stand-in), system clock, direct device read, and the
//! tracked clock under two-thread contention. Also prints the `ringbag clock` report for the
//! CLOCK_MONOTONIC_RAW stand-in.
//!
//! cargo run --release --example clock_stamp_bench [-- /dev/ptp0]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use ringbag::clock::{
    diagnose, measure_stamp_costs, start, ClockKind, ClockSettings, PtpDevice, TimeSource,
    MONOTONIC_RAW_STAND_IN,
};

const N: u32 = 2_000_000;

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
    // Warm up, then measure three rounds and keep the best (the machine is shared).
    let _ = measure_stamp_costs(&handle, Some(&dev), N / 10);
    let best = (0..3)
        .map(|_| measure_stamp_costs(&handle, Some(&dev), N))
        .min_by(|a, b| a.tracked_ns.total_cmp(&b.tracked_ns))
        .ok_or("no rounds")?;
    println!("\n== ns per stamp (best of 3 x {N}) ==");
    println!(
        "tracked clock (ClockHandle::now_ns): {:6.1} ns",
        best.tracked_ns
    );
    println!(
        "system clock (CLOCK_REALTIME):       {:6.1} ns",
        best.system_ns
    );
    if let Some(d) = best.device_ns {
        println!("direct clock_gettime on the device:  {d:6.1} ns");
    }

    // Two threads stamping at once: the monotonic high-water mark is a shared atomic.
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            let h = handle.clone();
            s.spawn(move || {
                let mut acc = 0i64;
                for _ in 0..N {
                    acc = acc.wrapping_add(h.now_ns());
                }
                black_box(acc);
            });
        }
    });
    println!(
        "tracked clock, 2 threads at once:    {:6.1} ns per stamp per thread",
        t0.elapsed().as_nanos() as f64 / f64::from(N)
    );
    handle.stop();
    for (k, v) in handle.custom_data() {
        println!("custom_data {k} = {v}");
    }
    Ok(())
}
