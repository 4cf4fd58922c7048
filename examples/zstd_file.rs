//! What ringbag's file-mode compression costs, for `scripts/bench.sh --only compress`: one
//! split compressed by the recorder's own code (`bag::compressed::compress_file`, what each
//! `ringbag-zstd` thread runs: a streaming zstd encoder fed a MiB at a time, the `.partial`
//! fsynced, renamed) at LEVEL, timed by this thread's CPU clock (user + system, so the shared
//! machine's other load does not count, as wall time would). The `.zstd` is deleted after;
//! the input is left as it was. Then the floor: the same library (the zstd crate, same level)
//! streaming the file from memory into a byte counter, no file I/O, no fsync, on the same
//! thread clock.
//!
//! Usage: zstd_file SPLIT.db3 LEVEL
//!
//! Prints JSON: input and output bytes, the thread's CPU seconds, the wall seconds, and the
//! floor's output bytes and CPU seconds.

use std::path::Path;
use std::time::Instant;

fn thread_cpu_s() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("CLOCK_THREAD_CPUTIME_ID");
    t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (Some(src), Some(Ok(level))) = (a.get(1), a.get(2).map(|l| l.parse::<i32>())) else {
        eprintln!("usage: zstd_file SPLIT.db3 LEVEL");
        std::process::exit(2);
    };
    let src = Path::new(src);
    let in_bytes = match std::fs::metadata(src) {
        Ok(m) => m.len(),
        Err(e) => {
            eprintln!("zstd_file: {}: {e}", src.display());
            std::process::exit(2);
        }
    };
    let (cpu0, t0) = (thread_cpu_s(), Instant::now());
    let dst = match ringbag::bag::compressed::compress_file(src, level) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("zstd_file: {e}");
            std::process::exit(1);
        }
    };
    let (cpu, wall) = (thread_cpu_s() - cpu0, t0.elapsed().as_secs_f64());
    let out_bytes = std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&dst);
    let data = match std::fs::read(src) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("zstd_file: {}: {e}", src.display());
            std::process::exit(1);
        }
    };
    let mut counter = Counter(0);
    let cpu0 = thread_cpu_s();
    if let Err(e) = zstd::stream::copy_encode(&data[..], &mut counter, level) {
        eprintln!("zstd_file: in memory: {e}");
        std::process::exit(1);
    }
    let floor_cpu = thread_cpu_s() - cpu0;
    println!(
        "{{\"in_bytes\": {in_bytes}, \"out_bytes\": {out_bytes}, \"cpu_s\": {cpu:.6}, \"wall_s\": {wall:.6}, \"floor_out_bytes\": {}, \"floor_cpu_s\": {floor_cpu:.6}}}",
        counter.0
    );
}

/// Counts what the encoder writes, keeping none of it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
