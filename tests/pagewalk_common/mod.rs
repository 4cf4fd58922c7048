//! Shared helpers of the page-walk tests: build a real rosbag2 `.db3` with rusqlite and
//! walk damaged copies of its bytes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use ringbag::bag::pagewalk::{walk_bytes, RecoveredMessage, Walk, WalkOptions};

/// Deterministic xorshift64*: the tests need reproducible damage, not a crypto RNG.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Humble,
    Jazzy,
}

pub struct Original {
    pub page_size: usize,
    pub bytes: Vec<u8>,
    /// id -> (topic_id, timestamp, data)
    pub messages: BTreeMap<i64, (i64, i64, Vec<u8>)>,
    /// id -> name
    pub topics: BTreeMap<i64, String>,
    /// dbstat rows: (table name, pageno, pagetype, ncell)
    pub pages: Vec<(String, u32, String, u32)>,
}

pub const TOPICS: [(&str, &str); 3] = [
    ("/camera/image_raw", "sensor_msgs/msg/Image"),
    ("/imu", "sensor_msgs/msg/Imu"),
    ("/tf", "tf2_msgs/msg/TFMessage"),
];

/// Sizes from 10 B to 300 KB, most small, some spanning many overflow pages.
pub fn message_size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0..=3 => rng.range(10, 200) as usize,
        4..=6 => rng.range(1_000, 8_000) as usize,
        7..=8 => rng.range(8_000, 64_000) as usize,
        _ => rng.range(64_000, 300_000) as usize,
    }
}

/// Build a bag file with exactly rosbag2's schema; `target_bytes` of message data at least
/// `n` messages. `delete_every` deletes every k-th message afterwards (to make a freelist).
pub fn build(
    dir: &Path,
    flavour: Flavour,
    page_size: usize,
    n: usize,
    seed: u64,
    delete_every: Option<i64>,
) -> Original {
    let path = dir.join(format!("bag_{flavour:?}_{page_size}_{seed}.db3"));
    let conn = rusqlite::Connection::open(&path).expect("open test db");
    conn.execute_batch(&format!(
        "PRAGMA page_size={page_size}; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
    ))
    .expect("pragmas");
    let (distro, version) = match flavour {
        Flavour::Humble => ("humble", 3),
        Flavour::Jazzy => ("jazzy", 4),
    };
    conn.execute_batch(
        "CREATE TABLE schema(schema_version INTEGER PRIMARY KEY,ros_distro TEXT NOT NULL);
         CREATE TABLE metadata(id INTEGER PRIMARY KEY,metadata_version INTEGER NOT NULL,metadata TEXT NOT NULL);",
    )
    .expect("schema tables");
    match flavour {
        Flavour::Humble => conn.execute_batch(
            "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL);",
        ),
        Flavour::Jazzy => conn.execute_batch(
            "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL,type_description_hash TEXT NOT NULL);
             CREATE TABLE message_definitions(id INTEGER PRIMARY KEY,topic_type TEXT NOT NULL,encoding TEXT NOT NULL,encoded_message_definition TEXT NOT NULL,type_description_hash TEXT NOT NULL);",
        ),
    }
    .expect("topics table");
    conn.execute_batch(
        "CREATE TABLE messages(id INTEGER PRIMARY KEY,topic_id INTEGER NOT NULL,timestamp INTEGER NOT NULL, data BLOB NOT NULL);
         CREATE INDEX timestamp_idx ON messages (timestamp ASC);",
    )
    .expect("messages table");
    conn.execute(
        "INSERT INTO schema(schema_version, ros_distro) VALUES (?1, ?2)",
        rusqlite::params![version, distro],
    )
    .expect("schema row");
    let mut topics = BTreeMap::new();
    for (i, (name, ty)) in TOPICS.iter().enumerate() {
        let id = i as i64 + 1;
        let qos = "- history: 3\n  depth: 0\n  reliability: 1\n  durability: 2\n";
        match flavour {
            Flavour::Humble => conn.execute(
                "INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr', ?4)",
                rusqlite::params![id, name, ty, qos],
            ),
            Flavour::Jazzy => {
                conn.execute(
                    "INSERT INTO message_definitions VALUES (?1, ?2, 'ros2msg', ?3, ?4)",
                    rusqlite::params![
                        id,
                        ty,
                        "uint32 height\n".repeat(300),
                        format!("RIHS01_{id:064}")
                    ],
                )
                .expect("definition row");
                conn.execute(
                    "INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr', ?4, ?5)",
                    rusqlite::params![id, name, ty, qos, format!("RIHS01_{id:064}")],
                )
            }
        }
        .expect("topic row");
        topics.insert(id, name.to_string());
    }
    let mut rng = Rng::new(seed);
    let mut messages = BTreeMap::new();
    conn.execute_batch("BEGIN").expect("begin");
    {
        let mut stmt = conn
            .prepare("INSERT INTO messages (topic_id, timestamp, data) VALUES (?1, ?2, ?3)")
            .expect("prepare");
        let mut ts: i64 = 1_700_000_000_000_000_000;
        for _ in 0..n {
            let topic_id = rng.range(1, TOPICS.len() as u64) as i64;
            ts += rng.range(1, 10_000_000) as i64;
            let mut data = vec![0u8; message_size(&mut rng)];
            rng.fill(&mut data);
            data[..4].copy_from_slice(&[0, 1, 0, 0]); // CDR little-endian encapsulation
            stmt.execute(rusqlite::params![topic_id, ts, data])
                .expect("insert");
            messages.insert(conn.last_insert_rowid(), (topic_id, ts, data));
        }
    }
    conn.execute_batch("COMMIT").expect("commit");
    if let Some(k) = delete_every {
        conn.execute("DELETE FROM messages WHERE id % ?1 = 0", [k])
            .expect("delete");
        messages.retain(|id, _| id % k != 0);
    }
    let pages = {
        let mut stmt = conn
            .prepare("SELECT name, pageno, pagetype, ncell FROM dbstat")
            .expect("dbstat");
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    r.get::<_, u32>(3)?,
                ))
            })
            .expect("dbstat query");
        rows.collect::<Result<Vec<_>, _>>().expect("dbstat rows")
    };
    drop(conn);
    let bytes = std::fs::read(&path).expect("read test db");
    Original {
        page_size,
        bytes,
        messages,
        topics,
        pages,
    }
}

pub struct Outcome {
    pub walk: Walk,
    pub messages: Vec<RecoveredMessage>,
    pub elapsed: Duration,
}

pub fn run(bytes: &[u8]) -> Outcome {
    run_with(bytes, WalkOptions::default())
}

pub fn run_with(bytes: &[u8], opts: WalkOptions) -> Outcome {
    let start = Instant::now();
    let mut messages = Vec::new();
    let walk = walk_bytes(bytes, opts, |m| {
        messages.push(m);
        ControlFlow::Continue(())
    });
    Outcome {
        walk,
        messages,
        elapsed: start.elapsed(),
    }
}

/// Every recovered message is an original row, unchanged, and appears once.
pub fn assert_all_genuine(orig: &Original, out: &Outcome, what: &str) {
    let mut seen = std::collections::HashSet::new();
    for m in &out.messages {
        assert!(seen.insert(m.id), "{what}: message {} returned twice", m.id);
        let Some((topic_id, ts, data)) = orig.messages.get(&m.id) else {
            panic!("{what}: message id {} is not an original row", m.id);
        };
        assert_eq!(
            (m.topic_id, m.timestamp, m.data.len()),
            (*topic_id, *ts, data.len()),
            "{what}: message {} differs",
            m.id
        );
        assert!(m.data == *data, "{what}: message {} bytes differ", m.id);
    }
    for t in &out.walk.topics {
        assert_eq!(
            orig.topics.get(&t.id),
            Some(&t.name),
            "{what}: topic {} differs",
            t.id
        );
    }
}

/// Generous for a debug build; a hang or quadratic blow-up would exceed it by far.
pub const TIME_BOUND: Duration = Duration::from_secs(20);

pub fn page_range(orig: &Original, pgno: u32) -> std::ops::Range<usize> {
    let start = (pgno as usize - 1) * orig.page_size;
    start..start + orig.page_size
}
