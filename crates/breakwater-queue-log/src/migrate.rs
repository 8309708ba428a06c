//! Moving an embedded SQLite store (`queue.db`) into a log store:
//! `breakwater queue migrate`. Queued messages keep their attempts,
//! replays and due time; dead letters keep their reason; applied event ids
//! still within the dedup window go to the dedup file, so redeliveries are
//! still answered 200. Leases are not moved: whatever was claimed is
//! visible again (at-least-once). Rows are read 1,000 at a time by id and
//! each chunk is durable in the log before the next is read; an event id
//! the log already knows is skipped, so a migration cut short is simply
//! run again.

use std::path::Path;

use breakwater_queue::QueueError;
use rusqlite::{Connection, OpenFlags, params};

use crate::dlq::NewDead;
use crate::record::{CarriedState, StoredMessage};

/// What one row of the old store becomes.
#[derive(Debug, Clone)]
pub(crate) enum Imported {
    Queued(StoredMessage, CarriedState),
    Dead(NewDead),
    /// An applied event id (its dedup hash) and when it was applied.
    Applied(u64, i64),
}

/// What a migration moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    pub queued: u64,
    pub dead: u64,
    pub applied_ids: u64,
    /// Rows whose event id the log already knew (a second run).
    pub skipped: u64,
}

impl Migrated {
    pub(crate) fn add(&mut self, other: Migrated) {
        self.queued += other.queued;
        self.dead += other.dead;
        self.applied_ids += other.applied_ids;
        self.skipped += other.skipped;
    }
}

const CHUNK: i64 = 1_000;

/// Row states of the embedded store (its `store.rs`).
const PENDING: i64 = 0;
const ACKED: i64 = 1;

/// The embedded store at a path, read chunk by chunk, oldest first.
pub(crate) struct Chunks {
    conn: Connection,
    path: std::path::PathBuf,
    after: i64,
}

impl Chunks {
    pub(crate) fn open(path: &Path) -> Result<Self, QueueError> {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| QueueError::Storage(format!("{}: {e}", path.display())))?;
        Ok(Self {
            conn,
            path: path.to_owned(),
            after: 0,
        })
    }

    /// The next chunk, or `None` after the last.
    pub(crate) fn next_chunk(&mut self) -> Result<Option<Vec<Imported>>, QueueError> {
        let rows = chunk(&self.conn, self.after)
            .map_err(|e| QueueError::Storage(format!("{}: {e}", self.path.display())))?;
        let Some(&(last, _)) = rows.last() else {
            return Ok(None);
        };
        self.after = last;
        Ok(Some(rows.into_iter().map(|(_, r)| r).collect()))
    }
}

fn chunk(conn: &Connection, after: i64) -> rusqlite::Result<Vec<(i64, Imported)>> {
    let mut st = conn.prepare_cached(
        "SELECT id, source, event_id, entity_key, headers, body, received_at, state,
                visible_at, attempts, replays, error_class, last_error, settled_at
         FROM messages WHERE id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let rows = st.query_map(params![after, CHUNK], |r| {
        let headers: String = r.get(4)?;
        let message = StoredMessage {
            source: r.get(1)?,
            event_id: r.get(2)?,
            entity_key: r.get(3)?,
            // A row whose headers do not parse keeps its body, headerless.
            headers: serde_json::from_str(&headers).unwrap_or_default(),
            body: r.get::<_, Option<Vec<u8>>>(5)?.unwrap_or_default().into(),
            received_at_ms: r.get(6)?,
        };
        let state: i64 = r.get(7)?;
        let settled_at: Option<i64> = r.get(13)?;
        let imported = match state {
            PENDING => Imported::Queued(
                message,
                CarriedState {
                    attempts: r.get(9)?,
                    replays: r.get(10)?,
                    visible_at_ms: r.get(8)?,
                },
            ),
            ACKED => Imported::Applied(
                message.dedup_hash(),
                settled_at.unwrap_or(message.received_at_ms),
            ),
            _ => Imported::Dead(NewDead {
                attempts: r.get(9)?,
                replays: r.get(10)?,
                class: r.get::<_, Option<String>>(11)?.unwrap_or_default(),
                error: r.get::<_, Option<String>>(12)?.unwrap_or_default(),
                dead_at_ms: settled_at.unwrap_or(message.received_at_ms),
                message,
            }),
        };
        Ok((r.get::<_, i64>(0)?, imported))
    })?;
    rows.collect()
}
