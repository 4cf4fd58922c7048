//! The machine's own timing limit for `scripts/bench.sh`'s playback section: a bare loop
//! that waits for absolute CLOCK_MONOTONIC targets at a fixed rate, doing nothing else, and
//! reports how late it woke. `spin_us` 0: clock_nanosleep(TIMER_ABSTIME) to the target;
//! otherwise the same sleep to `spin_us` (at most half the wait) before it and a spin to the
//! target (what ringbag play's scheduler does). Prints one JSON object, with `quantiles_ns`
//! (the lateness at every half percent and the maximum) for scripts/plot-bench.py.
//!
//! Usage: sleep_jitter HZ SECONDS SPIN_US

use nix::sys::time::TimeSpec;
use nix::time::{clock_gettime, clock_nanosleep, ClockId, ClockNanosleepFlags};

fn now() -> i64 {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

fn sleep_until(t: i64) {
    let ts = TimeSpec::new(t / 1_000_000_000, t % 1_000_000_000);
    while clock_nanosleep(
        ClockId::CLOCK_MONOTONIC,
        ClockNanosleepFlags::TIMER_ABSTIME,
        &ts,
    )
    .is_err()
    {}
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let [hz, secs, spin_us] = [1, 2, 3].map(|i| a.get(i).and_then(|s| s.parse::<f64>().ok()));
    let (Some(hz), Some(secs), Some(spin_us)) = (hz, secs, spin_us) else {
        eprintln!("usage: sleep_jitter HZ SECONDS SPIN_US");
        std::process::exit(2);
    };
    // As the scheduler does: no timer slack.
    let _ = nix::sys::prctl::set_timerslack(1);
    let period = (1e9 / hz) as i64;
    let spin = (spin_us * 1e3) as i64;
    let n = (hz * secs) as i64;
    let t0 = now() + 10_000_000;
    let mut late: Vec<i64> = Vec::with_capacity(n as usize);
    for i in 0..n {
        let target = t0 + i * period;
        if spin > 0 {
            // As the scheduler: spin at most half the wait, so it sleeps at high rates too.
            let t = now();
            let spin = spin.min((target - t) / 2);
            if target - spin > t {
                sleep_until(target - spin);
            }
            while now() < target {
                std::hint::spin_loop();
            }
        } else {
            sleep_until(target);
        }
        late.push(now() - target);
    }
    late.sort_unstable();
    let q = |p: f64| late[((late.len() as f64 * p) as usize).min(late.len() - 1)];
    // The distribution for scripts/plot-bench.py, bounded whatever the run's length: the
    // lateness at every half percent (0, 0.5 .. 99.5 %) and the maximum, 201 numbers.
    let quantiles: Vec<String> = (0..200)
        .map(|i| q(i as f64 / 200.0).to_string())
        .chain(std::iter::once(late[late.len() - 1].to_string()))
        .collect();
    println!(
        "{{\"hz\": {hz}, \"seconds\": {secs}, \"spin_us\": {spin_us}, \"n\": {n}, \"p50_ns\": {}, \"p99_ns\": {}, \"max_ns\": {}, \"quantiles_ns\": [{}]}}",
        q(0.5),
        q(0.99),
        late[late.len() - 1],
        quantiles.join(", ")
    );
}
