//! The floor of a writer stall, for `scripts/bench.sh`'s robot rows: the bare loop's insert
//! (`bare_sqlite`'s schema, pragmas, 64 KiB pages and statement, the blob bound in place) of
//! one message of BYTES bytes in its own transaction, every PERIOD_MS, into a new bag file in
//! DIR, doing nothing else, over the seconds ringbag records; it reports the longest insert
//! with its commit. On this project's VM everything writing fresh page-cache or tmpfs pages
//! slows down together at times (the host faulting memory back in), so a long writer turn
//! beside a long probe insert of the same message is the machine's, not the recorder's. Its
//! load (one 2.76 MB camera frame every 200 ms in the bench, 14 MB/s) is small next to the
//! robot mix's 176 MB/s. Prints one JSON object; deletes its file.
//!
//! Usage: insert_probe DIR SECONDS BYTES PERIOD_MS

use std::time::{Duration, Instant};

use ringbag::bag::insert::MessageInsert;
use ringbag::bag::schema::StoragePreset;

#[path = "support/bench_db.rs"]
mod bench_db;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize| a.get(i).and_then(|s| s.parse::<f64>().ok());
    let (Some(dir), Some(secs), Some(bytes), Some(period_ms)) = (a.get(1), num(2), num(3), num(4))
    else {
        eprintln!("usage: insert_probe DIR SECONDS BYTES PERIOD_MS");
        std::process::exit(2);
    };
    if !std::path::Path::new(dir).is_dir() {
        eprintln!("insert_probe: {dir}: not a directory");
        std::process::exit(1);
    }
    let path = std::path::Path::new(dir).join(format!(".insert_probe.{}.db3", std::process::id()));
    let out = path.to_string_lossy().into_owned();
    let conn = bench_db::open(&out, StoragePreset::WriteOptimized, Some("65536"));
    let mut insert = MessageInsert::prepare(&conn).expect("prepare");
    let data = vec![0x5au8; bytes as usize];
    let period = Duration::from_secs_f64(period_ms / 1e3);
    let start = Instant::now();
    let mut next = start;
    let (mut inserts, mut longest, mut ts) = (0u64, Duration::ZERO, 0i64);
    while start.elapsed().as_secs_f64() < secs {
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        conn.execute_batch("BEGIN").expect("begin");
        insert.insert(1, ts, &data).expect("insert");
        conn.execute_batch("COMMIT").expect("commit");
        longest = longest.max(t.elapsed());
        inserts += 1;
        ts += 1;
        next += period;
    }
    drop(insert);
    drop(conn);
    let _ = std::fs::remove_file(&path);
    println!(
        "{{\"inserts\":{inserts},\"bytes\":{},\"longest_ms\":{:.3}}}",
        data.len(),
        longest.as_secs_f64() * 1e3
    );
}
