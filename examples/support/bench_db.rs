//! The bag file the bare loops write into (`bare_sqlite`, `bare_queue`): ringbag's own schema,
//! pragmas and topic row, so that they measure the same inserts as the recorder.

use rusqlite::Connection;

use ringbag::bag::schema::{create_tables, StoragePreset, SMALL_PAGE_SIZE};
use ringbag::bag::writer::apply_pragmas;
use ringbag::bag::Flavour;

/// Create `out` afresh with `preset`'s pragmas, the page size given (else the preset's own,
/// with ringbag's small pages), the Jazzy schema and one topic, id 1.
pub fn open(out: &str, preset: StoragePreset, page_size: Option<&str>) -> Connection {
    let _ = std::fs::remove_file(out);
    let conn = Connection::open(out).expect("open");
    match page_size {
        Some(page) => conn
            .execute_batch(&format!("PRAGMA page_size={page};"))
            .expect("page size"),
        None => conn
            .execute_batch(&preset.create_pragmas(SMALL_PAGE_SIZE))
            .expect("page size"),
    }
    apply_pragmas(&conn, &preset.write_pragmas()).expect("pragmas");
    create_tables(&conn, Flavour::Jazzy).expect("schema");
    conn.execute(
        "INSERT INTO topics (id, name, type, serialization_format, offered_qos_profiles, type_description_hash) VALUES (1, '/bench', 'std_msgs/msg/String', 'cdr', '', '')",
        [],
    )
    .expect("topic");
    conn
}
