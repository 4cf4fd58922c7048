//! The machine's SQLite ceiling for `scripts/bench.sh`: a bare loop inserting the same rows
//! (size, batch, schema, pragmas) as ringbag, with no queue, threads or clock. Its blob is
//! bound in place (`SQLITE_STATIC`, through the same `MessageInsert` ringbag uses), so it is
//! the true floor: SQLite's own copies and the kernel's, nothing else.
//!
//! usage: bare_sqlite OUT.db3 MESSAGE_BYTES COUNT BATCH PRESET [PAGE_SIZE]
//!   PRESET: write-optimized | none (rosbag2's defaults) | resilient
//! Prints one JSON line: {"messages":..,"bytes":..,"seconds":..,"sync_seconds":..}

use std::time::Instant;

use ringbag::bag::insert::MessageInsert;
use ringbag::bag::schema::StoragePreset;

#[path = "support/bench_db.rs"]
mod bench_db;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 6 {
        eprintln!("usage: bare_sqlite OUT MESSAGE_BYTES COUNT BATCH PRESET");
        std::process::exit(2);
    }
    let (out, size, count, batch) = (
        &a[1],
        a[2].parse::<usize>().expect("MESSAGE_BYTES"),
        a[3].parse::<u64>().expect("COUNT"),
        a[4].parse::<u64>().expect("BATCH").max(1),
    );
    let preset = match a[5].as_str() {
        "write-optimized" => StoragePreset::WriteOptimized,
        "resilient" => StoragePreset::Resilient,
        "none" => StoragePreset::None,
        other => panic!("unknown preset {other}"),
    };
    let conn = bench_db::open(out, preset, a.get(6).map(String::as_str));
    let mut payload = vec![0x5au8; size];
    let mut insert = MessageInsert::prepare(&conn).expect("prepare");
    // BARE_BLOB_IO=1: insert zeroblob(n), then write the payload with incremental blob I/O
    // (the alternative the write-path issue asked to measure).
    let blob_io = std::env::var_os("BARE_BLOB_IO").is_some();
    let mut zero = conn
        .prepare("INSERT INTO messages (topic_id, timestamp, data) VALUES (?1, ?2, zeroblob(?3))")
        .expect("prepare zeroblob");
    let t0 = Instant::now();
    let mut ts = 1_700_000_000_000_000_000i64;
    let mut written = 0u64;
    while written < count {
        conn.execute_batch("BEGIN").expect("begin");
        for _ in 0..batch.min(count - written) {
            payload[size / 2] = written as u8;
            if blob_io {
                zero.execute(rusqlite::params![1, ts, size as i64])
                    .expect("insert zeroblob");
                let rowid = conn.last_insert_rowid();
                let mut b = conn
                    .blob_open(rusqlite::MAIN_DB, "messages", "data", rowid, false)
                    .expect("blob_open");
                b.write_all_at(&payload, 0).expect("blob write");
            } else {
                insert.insert(1, ts, &payload).expect("insert");
            }
            ts += 1000;
            written += 1;
        }
        conn.execute_batch("COMMIT").expect("commit");
    }
    let seconds = t0.elapsed().as_secs_f64();
    drop(insert);
    drop(zero);
    drop(conn);
    let t1 = Instant::now();
    std::fs::File::open(out)
        .and_then(|f| f.sync_all())
        .expect("fsync");
    let sync_seconds = t1.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    println!(
        "{{\"messages\":{written},\"payload_bytes\":{},\"file_bytes\":{bytes},\"seconds\":{seconds},\"sync_seconds\":{sync_seconds}}}",
        written * size as u64
    );
}
