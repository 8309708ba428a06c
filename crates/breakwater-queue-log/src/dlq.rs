//! The dead-letter store: a small SQLite database (`dlq.db`) beside the
//! segments. Dead letters are rare and are listed, searched, shown,
//! replayed and purged by the operator long after they came, so they live
//! off the log, where they would pin segments and be copied forward again
//! and again. A message is written here (committed with a full fsync)
//! before the log records that it left; a crash between the two leaves it
//! in both, and it is delivered again (the inbox applies it once).
//!
//! The writer thread holds the one writing connection; the queue reads
//! listings on a connection of its own (WAL lets the two run side by side).

use std::path::Path;

use breakwater_queue::DeadLetter;
use rusqlite::{Connection, OptionalExtension, params};

use crate::private;
use crate::record::{self, StoredMessage};

/// File name of the store inside `[queue] path`.
pub(crate) const FILE_NAME: &str = "dlq.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    entity_key TEXT,
    message BLOB NOT NULL,
    received_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    replays INTEGER NOT NULL,
    class TEXT NOT NULL,
    error TEXT NOT NULL,
    dead_at INTEGER NOT NULL
);";

/// Opens (creating) the store in `dir`.
/// The file is created `0600` before SQLite opens it ([`crate::private`]):
/// SQLite gives its `-wal` and `-shm` the main file's mode.
pub(crate) fn open(dir: &Path) -> rusqlite::Result<Connection> {
    let path = dir.join(FILE_NAME);
    private::create_file(&path).map_err(|e| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot create {}: {e}", path.display())),
        )
    })?;
    let conn = Connection::open(&path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // A dead letter must be durable before the log forgets the message.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// A message on its way into the store.
#[derive(Debug, Clone)]
pub(crate) struct NewDead {
    pub message: StoredMessage,
    pub attempts: u32,
    pub replays: u32,
    pub class: String,
    pub error: String,
    pub dead_at_ms: i64,
}

/// Writes `dead` in one transaction; returns their ids.
pub(crate) fn insert(conn: &mut Connection, dead: &[NewDead]) -> rusqlite::Result<Vec<i64>> {
    let tx = conn.transaction()?;
    let mut ids = Vec::with_capacity(dead.len());
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO dead_letters (source, event_id, entity_key, message, received_at,
                attempts, replays, class, error, dead_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for d in dead {
            let m = &d.message;
            st.execute(params![
                m.source,
                m.event_id,
                m.entity_key,
                record::encode_message(m),
                m.received_at_ms,
                d.attempts,
                d.replays,
                d.class,
                d.error,
                d.dead_at_ms
            ])?;
            ids.push(tx.last_insert_rowid());
        }
    }
    tx.commit()?;
    Ok(ids)
}

/// How many dead letters there are.
pub(crate) fn count(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))
}

/// Every dead letter's (source, event id), for the dedup index.
pub(crate) fn event_ids(conn: &Connection) -> rusqlite::Result<Vec<(String, String)>> {
    let mut st = conn.prepare("SELECT source, event_id FROM dead_letters")?;
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
}

/// A dead letter taken back for a replay.
#[derive(Debug, Clone)]
pub(crate) struct Replayable {
    pub id: i64,
    pub message: StoredMessage,
    pub replays: u32,
}

/// The dead letters a replay would put back: those of `ids` (all when
/// empty) replayed fewer than `max_replays` times, oldest first, at most
/// `limit`.
pub(crate) fn replayable(
    conn: &Connection,
    ids: &[i64],
    max_replays: u32,
    limit: usize,
) -> rusqlite::Result<Vec<Replayable>> {
    let mut st = conn.prepare_cached(
        "SELECT id, message, replays FROM dead_letters
         WHERE replays < ?1 AND (?2 IS NULL OR id IN (SELECT value FROM json_each(?2)))
         ORDER BY id LIMIT ?3",
    )?;
    let filter = (!ids.is_empty()).then(|| format!("{ids:?}"));
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = st.query_map(params![max_replays, filter, limit], |r| {
        let blob: Vec<u8> = r.get(1)?;
        Ok((r.get::<_, i64>(0)?, blob, r.get::<_, u32>(2)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, blob, replays) = row?;
        // A row that does not decode stays where it is, for an operator.
        if let Ok(message) = record::decode_message(&blob) {
            out.push(Replayable {
                id,
                message,
                replays,
            });
        }
    }
    Ok(out)
}

/// Deletes the dead letters `ids` (all when `all`); returns the (source,
/// event id) of each one deleted.
pub(crate) fn delete(
    conn: &mut Connection,
    ids: &[i64],
    all: bool,
) -> rusqlite::Result<Vec<(String, String)>> {
    let tx = conn.transaction()?;
    let gone = {
        let mut st = tx.prepare_cached(
            "DELETE FROM dead_letters WHERE ?1 OR id IN (SELECT value FROM json_each(?2))
             RETURNING source, event_id",
        )?;
        st.query_map(params![all, format!("{ids:?}")], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
    };
    tx.commit()?;
    Ok(gone)
}

/// Dead letters oldest first after `after`, at most `limit`; with a body
/// only for `with_body_of`.
pub(crate) fn list(
    conn: &Connection,
    limit: usize,
    after: Option<i64>,
) -> rusqlite::Result<Vec<DeadLetter>> {
    let mut st = conn.prepare_cached(
        "SELECT id, source, event_id, entity_key, attempts, replays, class, error,
                received_at, dead_at
         FROM dead_letters WHERE id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    st.query_map(params![after.unwrap_or(0), limit], |r| {
        Ok(DeadLetter {
            id: r.get::<_, i64>(0)?.to_string(),
            source: r.get(1)?,
            event_id: r.get(2)?,
            entity_key: r.get(3)?,
            attempts: r.get(4)?,
            replays: r.get(5)?,
            class: r.get(6)?,
            error: r.get(7)?,
            received_at_ms: r.get(8)?,
            dead_at_ms: r.get(9)?,
            body: None,
        })
    })?
    .collect()
}

/// One dead letter with its body.
pub(crate) fn show(conn: &Connection, id: i64) -> rusqlite::Result<Option<DeadLetter>> {
    let row = conn
        .query_row(
            "SELECT message, attempts, replays, class, error, dead_at
             FROM dead_letters WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            },
        )
        .optional()?;
    Ok(
        row.and_then(|(blob, attempts, replays, class, error, dead_at_ms)| {
            let m = record::decode_message(&blob).ok()?;
            Some(DeadLetter {
                id: id.to_string(),
                body: Some(String::from_utf8_lossy(&m.body).into_owned()),
                source: m.source,
                event_id: m.event_id,
                entity_key: m.entity_key,
                attempts,
                replays,
                class,
                error,
                received_at_ms: m.received_at_ms,
                dead_at_ms,
            })
        }),
    )
}
