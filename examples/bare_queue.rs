//! The least a queued recorder can cost, for `scripts/bench.sh`: the bare loop's inserts
//! (`bare_sqlite`, same schema, pragmas, batch and statement), fed by a second thread through
//! a bounded crossbeam channel, each message's bytes carried by value in the channel slot (no
//! pool, no stamping, no accounting). What it adds over `bare_sqlite` is the price of the
//! messages crossing between cores, which any design where callbacks never wait on SQLite
//! pays; what ringbag adds over it is its own code.
//!
//! usage: bare_queue OUT.db3 COUNT [BATCH]   (100-byte messages)
//! Prints one JSON line: {"messages":..,"seconds":..}

use std::time::Instant;

use ringbag::bag::insert::MessageInsert;
use ringbag::bag::schema::StoragePreset;

#[path = "support/bench_db.rs"]
mod bench_db;

const SIZE: usize = 100;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (Some(out), Some(Ok(count))) = (a.get(1), a.get(2).map(|c| c.parse::<u64>())) else {
        eprintln!("usage: bare_queue OUT.db3 COUNT [BATCH]");
        std::process::exit(2);
    };
    let batch = a
        .get(3)
        .and_then(|b| b.parse::<usize>().ok())
        .unwrap_or(4096)
        .max(1);
    let conn = bench_db::open(out, StoragePreset::WriteOptimized, Some("65536"));
    let mut insert = MessageInsert::prepare(&conn).expect("prepare");
    // As many slots as ringbag's queue.
    let (tx, rx) = crossbeam_channel::bounded::<(i64, [u8; SIZE])>(1 << 16);
    let t0 = Instant::now();
    let producer = std::thread::spawn(move || {
        let mut msg = [0x5au8; SIZE];
        let mut ts = 1_700_000_000_000_000_000i64;
        for i in 0..count {
            msg[SIZE / 2] = i as u8;
            // A full queue waits, never drops, by napping from 50 us to 1 ms as ringbag's
            // `max` pace does: a sender blocked in the channel would have the writer wake it
            // (a system call) at every message it takes.
            let mut item = (ts, msg);
            let mut nap = std::time::Duration::from_micros(50);
            loop {
                match tx.try_send(item) {
                    Ok(()) => break,
                    Err(crossbeam_channel::TrySendError::Full(back)) => {
                        item = back;
                        std::thread::sleep(nap);
                        nap = (nap * 2).min(std::time::Duration::from_millis(1));
                    }
                    Err(crossbeam_channel::TrySendError::Disconnected(_)) => return,
                }
            }
            ts += 1000;
        }
    });
    let mut rows: Vec<(i64, [u8; SIZE])> = Vec::with_capacity(batch);
    let mut written = 0u64;
    while written < count {
        // Wait for the first message of a batch, then take what is there, up to the batch.
        let Ok(first) = rx.recv() else { break };
        rows.push(first);
        while rows.len() < batch {
            match rx.try_recv() {
                Ok(m) => rows.push(m),
                Err(_) => break,
            }
        }
        conn.execute_batch("BEGIN").expect("begin");
        for (ts, msg) in &rows {
            insert.insert(1, *ts, msg).expect("insert");
        }
        conn.execute_batch("COMMIT").expect("commit");
        written += rows.len() as u64;
        rows.clear();
    }
    producer.join().expect("producer");
    let seconds = t0.elapsed().as_secs_f64();
    println!("{{\"messages\":{written},\"seconds\":{seconds}}}");
}
