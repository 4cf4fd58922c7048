//! The one statement on the recording hot path: `INSERT INTO messages`, with the message bound
//! in place.
//!
//! rusqlite binds every blob as `SQLITE_TRANSIENT`, which makes SQLite copy the message into a
//! private buffer before the statement even runs: for a 1 MiB camera frame that is a whole
//! extra pass over the data (a `perf` profile of the 1 MiB benchmark had the writer thread in
//! `memmove` about half the time). Binding `SQLITE_STATIC` instead lets the VDBE read the
//! caller's bytes directly, as rosbag2 does. The price is a lifetime SQLite cannot check: the
//! bytes must stay put until the statement is reset, so [`MessageInsert::insert`] binds, steps
//! and resets (clearing the binding) inside one call, and nothing bound outlives it.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr::NonNull;

use rusqlite::{ffi, Connection};

const SQL: &CStr = c"INSERT INTO messages (topic_id, timestamp, data) VALUES (?1, ?2, ?3)";

/// A prepared insert into a split's `messages` table. Must be dropped before its connection
/// is closed (`OpenSplit` declares it first, and the close path drops it explicitly): SQLite
/// refuses to close a connection with live statements.
pub struct MessageInsert {
    stmt: NonNull<ffi::sqlite3_stmt>,
    db: NonNull<ffi::sqlite3>,
}

impl std::fmt::Debug for MessageInsert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageInsert")
    }
}

// The statement is used only by the thread that owns the split (and its connection, which is
// `Send`); SQLite is built threadsafe, and the connection is opened NO_MUTEX, so what matters
// is that one thread at a time uses both, which ownership of the split guarantees.
unsafe impl Send for MessageInsert {}

impl MessageInsert {
    pub fn prepare(conn: &Connection) -> rusqlite::Result<Self> {
        // SAFETY: `handle()` is the live connection's pointer; it stays valid while `conn`
        // lives, which outlives this statement (see the type's documentation).
        let db = unsafe { conn.handle() };
        let db = NonNull::new(db).ok_or(rusqlite::Error::InvalidQuery)?;
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `db` is a valid open connection; SQL is NUL-terminated (-1 length reads up
        // to the NUL); `stmt` receives the new statement or NULL.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                db.as_ptr(),
                SQL.as_ptr(),
                -1,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        check(db, rc)?;
        let stmt = NonNull::new(stmt).ok_or(rusqlite::Error::InvalidQuery)?;
        Ok(MessageInsert { stmt, db })
    }

    /// Insert one row. `data` is read by SQLite in place and released before this returns.
    pub fn insert(&mut self, topic_id: i64, ts: i64, data: &[u8]) -> rusqlite::Result<()> {
        let st = self.stmt.as_ptr();
        // SAFETY: `st` is a live prepared statement of this connection (finalized only in
        // Drop). The blob is bound SQLITE_STATIC: SQLite keeps the pointer, not a copy, until
        // the binding is cleared. `data` is borrowed for this whole call, and the statement
        // is reset and its bindings cleared below before returning, on success and on error,
        // so SQLite never holds the pointer past the borrow. An empty slice may dangle, so it
        // is bound as a zero-length blob (never NULL: the column is NOT NULL).
        let rc = unsafe {
            let mut rc = ffi::sqlite3_bind_int64(st, 1, topic_id);
            if rc == ffi::SQLITE_OK {
                rc = ffi::sqlite3_bind_int64(st, 2, ts);
            }
            if rc == ffi::SQLITE_OK {
                rc = if data.is_empty() {
                    ffi::sqlite3_bind_zeroblob(st, 3, 0)
                } else {
                    ffi::sqlite3_bind_blob64(
                        st,
                        3,
                        data.as_ptr().cast(),
                        data.len() as u64,
                        ffi::SQLITE_STATIC(),
                    )
                };
            }
            if rc == ffi::SQLITE_OK {
                rc = ffi::sqlite3_step(st);
            }
            // reset's own result repeats step's error; the step result is the one to report.
            ffi::sqlite3_reset(st);
            ffi::sqlite3_clear_bindings(st);
            rc
        };
        if rc == ffi::SQLITE_DONE {
            Ok(())
        } else {
            check(self.db, rc)
        }
    }
}

impl Drop for MessageInsert {
    fn drop(&mut self) {
        // SAFETY: the statement is live and finalized exactly once, here; its connection is
        // still open (the type's contract).
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// A result code as rusqlite's error, with the connection's message.
fn check(db: NonNull<ffi::sqlite3>, rc: c_int) -> rusqlite::Result<()> {
    if rc == ffi::SQLITE_OK {
        return Ok(());
    }
    // SAFETY: `db` is a live connection; sqlite3_errmsg returns a NUL-terminated string owned
    // by SQLite, valid until the next call on this connection, and copied out at once.
    let msg = unsafe {
        let p = ffi::sqlite3_errmsg(db.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::schema::create_tables;
    use crate::bag::Flavour;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        create_tables(&c, Flavour::Jazzy).unwrap();
        c
    }

    #[test]
    fn rows_hold_the_bytes_they_were_given_even_after_the_buffer_changes() {
        let c = db();
        let mut ins = MessageInsert::prepare(&c).unwrap();
        let mut buf = vec![1u8; 300_000];
        ins.insert(1, 10, &buf).unwrap();
        // Reusing the buffer (as the pipeline's pool does) must not touch the stored row.
        buf.fill(2);
        ins.insert(1, 20, &buf).unwrap();
        ins.insert(2, 30, &[]).unwrap();
        drop(ins);
        let rows: Vec<(i64, i64, Vec<u8>)> = c
            .prepare("SELECT topic_id, timestamp, data FROM messages ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[0].0, rows[0].1), (1, 10));
        assert!(rows[0].2.iter().all(|&b| b == 1) && rows[0].2.len() == 300_000);
        assert!(rows[1].2.iter().all(|&b| b == 2));
        assert_eq!((rows[2].0, rows[2].1, rows[2].2.len()), (2, 30, 0));
    }

    #[test]
    fn a_failing_insert_reports_sqlite_s_error_and_the_statement_stays_usable() {
        let c = db();
        c.execute_batch(
            "CREATE TRIGGER no_big BEFORE INSERT ON messages WHEN length(NEW.data) > 10 \
             BEGIN SELECT RAISE(ABORT, 'too big'); END;",
        )
        .unwrap();
        let mut ins = MessageInsert::prepare(&c).unwrap();
        let err = ins.insert(1, 1, &[0u8; 11]).unwrap_err().to_string();
        assert!(err.contains("too big"), "{err}");
        ins.insert(1, 2, &[0u8; 5]).unwrap();
        drop(ins);
        let n: i64 = c
            .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_connection_closes_once_the_statement_is_dropped() {
        let c = db();
        let ins = MessageInsert::prepare(&c).unwrap();
        drop(ins);
        c.close().map_err(|(_, e)| e).unwrap();
    }
}
