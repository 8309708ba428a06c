//! The embedded queue's storage: schema and the SQL of every operation.
//!
//! Everything here is synchronous and takes a connection or transaction;
//! the [`writer`](super::writer) thread decides when to run it and when to
//! commit. Keeping the SQL in one place makes the on-disk format reviewable
//! at a glance.
//!
//! # Format
//!
//! One table, `messages`, one row per accepted webhook, keyed by an integer
//! id. Redeliveries of one `(source, event_id)` are caught by the writer's
//! in-memory [`dedup`](super::dedup) index rather than by a SQLite unique
//! index, whose random-key inserts cost most of the queue's writes. That
//! catch is best effort, not a constraint: the index does not see another
//! process's enqueues and takes a hash collision for a new event (see
//! [`dedup`](super::dedup)), so two rows for one event are possible, and
//! the sink's inbox is what applies it once. (Stores
//! created before that still carry the UNIQUE constraint, which stays
//! correct.)
//!
//! | state | meaning | `visible_at` | `lease` |
//! |---|---|---|---|
//! | 0 pending | visible when `visible_at <= now` | when it may be claimed | token of the live claim, or NULL |
//! | 1 acked | applied; kept (body dropped) to answer redeliveries until the dedup window passes | - | NULL |
//! | 2 dead | in the DLQ with `error_class` and `last_error`; body kept for replay | - | NULL |
//!
//! A pending row with a lease and `visible_at > now` is in flight; with no
//! lease and `visible_at > now` it is delayed (waiting for a retry); once
//! `visible_at <= now` it is visible whatever its lease, so a crashed
//! worker's claim simply expires. Settling a claim requires the lease token
//! to match: a worker whose lease expired and whose message was claimed
//! again cannot ack or fail it.
//!
//! Totals that survive pruning live in `counters`, beside `pending`, the
//! number of pending rows, which the writer keeps in the transaction that
//! changes it so `stats` need not count the backlog.
//!
//! # Indexes are partial: repeat their condition
//!
//! Pending rows are found through `messages_ready_keyed` (`WHERE state =
//! 0`), settled ones through `messages_settled` (`WHERE state <> 0`), so an
//! enqueue touches one index and an ack moves a row from one to the other.
//! SQLite uses a partial index only for a query whose WHERE clause holds the
//! index's condition as written: it does not infer `state <> 0` from `state
//! = 2`. So every query on settled rows says `state <> 0 AND state = ...`;
//! without it, the periodic ones read the whole table: on a store of 500k
//! pending messages (697 MB) the writer's prune (every 30 s) took 1,153 ms
//! cold and 370 ms warm, stalling every enqueue behind it, and the DLQ count
//! of every `stats` (each second, for the breaker) 381–453 ms; with the
//! condition repeated, 0.01–0.08 ms. A test checks the plans.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use breakwater_queue::{DeadLetter, Message, NewMessage, QueueStats};

/// Row states.
pub(crate) const PENDING: i64 = 0;
pub(crate) const ACKED: i64 = 1;
pub(crate) const DEAD: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS messages (
    id          INTEGER PRIMARY KEY,
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    entity_key  TEXT,
    headers     TEXT    NOT NULL,
    body        BLOB,
    received_at INTEGER NOT NULL,
    state       INTEGER NOT NULL DEFAULT 0,
    visible_at  INTEGER NOT NULL,
    lease       INTEGER,
    attempts    INTEGER NOT NULL DEFAULT 0,
    receives    INTEGER NOT NULL DEFAULT 0,
    replays     INTEGER NOT NULL DEFAULT 0,
    error_class TEXT,
    last_error  TEXT,
    settled_at  INTEGER
);
DROP INDEX IF EXISTS messages_ready;
CREATE INDEX IF NOT EXISTS messages_ready_keyed ON messages (visible_at, id, entity_key) WHERE state = 0;
CREATE INDEX IF NOT EXISTS messages_settled ON messages (state, settled_at) WHERE state <> 0;
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters (name, value) VALUES ('acked_total', 0), ('dead_total', 0);
-- Pending messages, kept by every change that makes or settles one, and
-- counted afresh when a queue opens (`recount_pending`).
INSERT OR IGNORE INTO counters (name, value) VALUES ('pending', 0);
";

// The queries on settled rows (see "Indexes are partial" above).
const REPLAY_CANDIDATES: &str = "SELECT id FROM messages WHERE state <> 0 AND state = 2
    AND replays < ?1 ORDER BY settled_at, id LIMIT ?2";
const PURGE_DEAD: &str =
    "DELETE FROM messages WHERE state <> 0 AND state = 2 RETURNING id, source, event_id";
const PRUNE_ACKED: &str = "DELETE FROM messages WHERE id IN (
    SELECT id FROM messages WHERE state <> 0 AND state = 1 AND settled_at < ?1 LIMIT ?2)
    RETURNING id, source, event_id";
const COUNT_DEAD: &str = "SELECT COUNT(*) FROM messages WHERE state <> 0 AND state = 2";
const DEAD_LETTERS: &str = "SELECT id, source, event_id, entity_key, attempts, replays,
    error_class, last_error, received_at, settled_at, body
    FROM messages WHERE state <> 0 AND state = 2 AND (?1 IS NULL OR id = ?1)
    AND (?3 IS NULL OR (settled_at, id) >
        (SELECT settled_at, id FROM messages WHERE id = ?3))
    ORDER BY settled_at, id LIMIT ?2";

/// Opens (creating if needed) the queue database with durable settings:
/// WAL, and `synchronous = FULL` so every commit fsyncs the WAL.
pub(crate) fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Checkpoints run from their own thread and connection (`checkpoint`);
    // the writer finishes one when that thread asks (`writer::checkpoint_loop`).
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "cache_size", -65536)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Frames in the WAL (4 KiB each) past which the checkpoint thread asks
/// the writer to finish a checkpoint, so the WAL can be rewound.
pub(crate) const WAL_RESTART_FRAMES: i64 = if cfg!(test) { 1000 } else { 8192 };

/// Copies the WAL into the main file as far as readers allow (PASSIVE:
/// never blocks the writer). Returns the frames in the WAL and checkpointed.
pub(crate) fn checkpoint(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(1)?, r.get(2)?))
    })
}

/// Whether message `id` is the event `(source, event_id)`: confirms a hit
/// of the dedup index.
pub(crate) fn holds(
    tx: &Transaction<'_>,
    id: i64,
    source: &str,
    event_id: &str,
) -> rusqlite::Result<bool> {
    tx.prepare_cached("SELECT source = ?2 AND event_id = ?3 FROM messages WHERE id = ?1")?
        .query_row(params![id, source, event_id], |r| r.get(0))
        .optional()
        .map(|same| same.unwrap_or(false))
}

/// Inserts a message the dedup index found new (`headers_json`: its
/// headers as a JSON array of pairs); returns the row id and whether it was
/// new. Only a store created with the old UNIQUE constraint can still
/// refuse it (when the index missed a duplicate); then the known row's id
/// is returned.
///
/// `OR IGNORE` and `changes()` rather than `ON CONFLICT … RETURNING`:
/// SQLite runs `RETURNING` through a temporary table and a statement
/// journal (they showed in the writer's profile). With the headers
/// serialized by the caller too, the writer's CPU per webhook under `bench
/// ingress` went from 23.6 to 20.3–21.9 µs.
pub(crate) fn enqueue(
    tx: &Transaction<'_>,
    m: &NewMessage,
    headers_json: &str,
) -> rusqlite::Result<(i64, bool)> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO messages
                 (source, event_id, entity_key, headers, body, received_at, visible_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
        )?
        .execute(params![
            m.source,
            m.event_id,
            m.entity_key,
            headers_json,
            &m.body[..],
            m.received_at_ms
        ])?;
    if inserted == 1 {
        return Ok((tx.last_insert_rowid(), true));
    }
    let mut find =
        tx.prepare_cached("SELECT id FROM messages WHERE source = ?1 AND event_id = ?2")?;
    let id = find.query_row(params![m.source, m.event_id], |r| r.get(0))?;
    Ok((id, false))
}

/// Claims up to `max` visible messages, leasing them until `now + lease_ms`,
/// leaving those whose entity key is in `skip_keys_json` (a JSON array)
/// queued. The ready index carries the entity key, so skipping a hot key's
/// backlog reads index entries only.
pub(crate) fn claim(
    tx: &Transaction<'_>,
    max: usize,
    now_ms: i64,
    lease_ms: i64,
    token: i64,
    skip_keys_json: Option<&str>,
) -> rusqlite::Result<Vec<(i64, Message)>> {
    let mut select = tx.prepare_cached(
        "SELECT id, source, event_id, entity_key, headers, body, received_at, attempts, receives
         FROM messages WHERE state = 0 AND visible_at <= ?1
           AND (?3 IS NULL OR entity_key IS NULL
                OR entity_key NOT IN (SELECT value FROM json_each(?3)))
         ORDER BY visible_at, id LIMIT ?2",
    )?;
    let rows = select.query_map(params![now_ms, max as i64, skip_keys_json], |r| {
        let headers: String = r.get(4)?;
        let body: Option<Vec<u8>> = r.get(5)?;
        let id: i64 = r.get(0)?;
        Ok((
            id,
            Message {
                id: id.to_string(),
                source: r.get(1)?,
                event_id: r.get(2)?,
                entity_key: r.get(3)?,
                headers: serde_json::from_str(&headers).unwrap_or_default(),
                body: body.unwrap_or_default().into(),
                received_at_ms: r.get(6)?,
                attempts: r.get(7)?,
                receives: r.get::<_, u32>(8)? + 1,
            },
        ))
    })?;
    let messages = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    let mut lease = tx.prepare_cached(
        "UPDATE messages SET lease = ?2, visible_at = ?3, receives = receives + 1 WHERE id = ?1",
    )?;
    for (id, _) in &messages {
        lease.execute(params![id, token, now_ms.saturating_add(lease_ms)])?;
    }
    Ok(messages)
}

/// Acks a claim; `forget` deletes the row instead of keeping it for dedup.
/// Returns false when the lease did not match.
pub(crate) fn ack(
    tx: &Transaction<'_>,
    id: i64,
    lease: i64,
    now_ms: i64,
    forget: bool,
) -> rusqlite::Result<Acked> {
    if forget {
        let gone = tx
            .prepare_cached(
                "DELETE FROM messages WHERE id = ?1 AND lease = ?2 AND state = 0
                 RETURNING id, source, event_id",
            )?
            .query_row(params![id, lease], forgotten)
            .optional()?;
        return Ok(gone.map_or(Acked::LeaseLost, Acked::Deleted));
    }
    let n = tx
        .prepare_cached(
            "UPDATE messages SET state = 1, body = NULL, headers = '[]', lease = NULL,
                 settled_at = ?3
             WHERE id = ?1 AND lease = ?2 AND state = 0",
        )?
        .execute(params![id, lease, now_ms])?;
    Ok(if n == 1 {
        Acked::Kept
    } else {
        Acked::LeaseLost
    })
}

/// What an ack did.
pub(crate) enum Acked {
    /// The receipt's lease was no longer the message's.
    LeaseLost,
    /// Marked applied, kept for the dedup window.
    Kept,
    /// Deleted at once (no dedup window).
    Deleted(Forgotten),
}

/// Pushes the lease of each `(id, lease)` still held out to `until_ms`;
/// returns how many were. A lease that ran out and was claimed again, or a
/// message settled meanwhile, is left alone.
pub(crate) fn extend(
    tx: &Transaction<'_>,
    leases: &[(i64, i64)],
    until_ms: i64,
) -> rusqlite::Result<usize> {
    let mut update = tx.prepare_cached(
        "UPDATE messages SET visible_at = ?3 WHERE id = ?1 AND lease = ?2 AND state = 0",
    )?;
    let mut extended = 0;
    for (id, lease) in leases {
        extended += update.execute(params![id, lease, until_ms])?;
    }
    Ok(extended)
}

/// Makes a claimed message visible again at `visible_at`; `counts` adds a
/// failed attempt (retry) or gives back the receive (release).
pub(crate) fn unclaim(
    tx: &Transaction<'_>,
    id: i64,
    lease: i64,
    visible_at: i64,
    error: Option<&str>,
) -> rusqlite::Result<bool> {
    let n = match error {
        Some(error) => tx
            .prepare_cached(
                "UPDATE messages SET lease = NULL, visible_at = ?3, attempts = attempts + 1,
                     last_error = ?4
                 WHERE id = ?1 AND lease = ?2 AND state = 0",
            )?
            .execute(params![id, lease, visible_at, error])?,
        None => tx
            .prepare_cached(
                "UPDATE messages SET lease = NULL, visible_at = ?3,
                     receives = MAX(receives - 1, 0)
                 WHERE id = ?1 AND lease = ?2 AND state = 0",
            )?
            .execute(params![id, lease, visible_at])?,
    };
    Ok(n == 1)
}

/// Moves a claimed message to the DLQ.
pub(crate) fn dead_letter(
    tx: &Transaction<'_>,
    id: i64,
    lease: i64,
    now_ms: i64,
    class: &str,
    error: &str,
) -> rusqlite::Result<bool> {
    let n = tx
        .prepare_cached(
            "UPDATE messages SET state = 2, lease = NULL, settled_at = ?3, error_class = ?4,
                 last_error = ?5, attempts = attempts + 1
             WHERE id = ?1 AND lease = ?2 AND state = 0",
        )?
        .execute(params![id, lease, now_ms, class, error])?;
    Ok(n == 1)
}

/// Puts dead-lettered messages back in the queue (all when `ids` is empty),
/// skipping those replayed `max_replays` times already. Returns the ids replayed.
pub(crate) fn replay(
    tx: &Transaction<'_>,
    ids: &[i64],
    now_ms: i64,
    max_replays: u32,
    limit: usize,
) -> rusqlite::Result<Vec<i64>> {
    let candidates: Vec<i64> = if ids.is_empty() {
        let mut st = tx.prepare_cached(REPLAY_CANDIDATES)?;
        st.query_map(params![max_replays, limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?
    } else {
        ids.to_vec()
    };
    let mut update = tx.prepare_cached(
        "UPDATE messages SET state = 0, visible_at = ?2, lease = NULL, attempts = 0, receives = 0,
             replays = replays + 1, settled_at = NULL
         WHERE id = ?1 AND state = 2 AND replays < ?3",
    )?;
    let mut done = Vec::new();
    for id in candidates {
        if update.execute(params![id, now_ms, max_replays])? == 1 {
            done.push(id);
        }
    }
    Ok(done)
}

/// Deletes dead-lettered messages (all when `ids` is empty).
pub(crate) fn purge(tx: &Transaction<'_>, ids: &[i64]) -> rusqlite::Result<Vec<Forgotten>> {
    if ids.is_empty() {
        return tx.prepare(PURGE_DEAD)?.query_map([], forgotten)?.collect();
    }
    let mut st = tx.prepare_cached(
        "DELETE FROM messages WHERE id = ?1 AND state = 2 RETURNING id, source, event_id",
    )?;
    let mut gone = Vec::new();
    for id in ids {
        if let Some(row) = st.query_row(params![id], forgotten).optional()? {
            gone.push(row);
        }
    }
    Ok(gone)
}

/// A deleted message, for the dedup index to forget: id, source, event id.
pub(crate) type Forgotten = (i64, String, String);

fn forgotten(r: &rusqlite::Row<'_>) -> rusqlite::Result<Forgotten> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

/// Adds to a persistent counter.
pub(crate) fn bump(tx: &Transaction<'_>, name: &str, by: i64) -> rusqlite::Result<()> {
    if by != 0 {
        tx.prepare_cached("UPDATE counters SET value = value + ?2 WHERE name = ?1")?
            .execute(params![name, by])?;
    }
    Ok(())
}

/// Forgets acked messages settled before `before_ms`, at most `limit`.
pub(crate) fn prune_acked(
    tx: &Transaction<'_>,
    before_ms: i64,
    limit: usize,
) -> rusqlite::Result<Vec<Forgotten>> {
    tx.prepare_cached(PRUNE_ACKED)?
        .query_map(params![before_ms, limit as i64], forgotten)?
        .collect()
}

/// In flight and delayed: the ready index past `now`.
const NOT_YET_VISIBLE: &str =
    "SELECT COALESCE(SUM(lease IS NOT NULL), 0), COALESCE(SUM(lease IS NULL), 0)
     FROM messages WHERE state = 0 AND visible_at > ?1";
/// When the next message a worker takes was received: the first visible
/// entry of the ready index, in claim order.
const HEAD_OF_QUEUE: &str = "SELECT received_at FROM messages WHERE id = (
    SELECT id FROM messages WHERE state = 0 AND visible_at <= ?1
    ORDER BY visible_at, id LIMIT 1)";

/// Counts the pending rows afresh into the `pending` counter, in one
/// statement under the write lock: a store written by a binary from
/// before the counter, or one that kept it wrong, is right again from the
/// next open on (one pass over the pending part of the ready index, once
/// per process: a whole `queue stats` on 500k pending took 0.03 s).
pub(crate) fn recount_pending(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE counters SET value = (SELECT COUNT(*) FROM messages WHERE state = 0)
         WHERE name = 'pending'",
        [],
    )
    .map(drop)
}

/// Counts for `queue stats`.
///
/// Read every second by the breaker's sampler, and largest exactly when
/// the breaker has let a backlog build, so nothing here walks the backlog:
/// the pending rows are a counter kept by the writer, the not-yet-visible
/// ones (in flight or waiting for a retry: few, bounded by the workers and
/// the retries) are read as the part of the ready index past `now`, the
/// visible ones are the difference, and the oldest visible is the head of
/// the ready index, the next message a worker takes (see
/// [`QueueStats::oldest_visible_age_ms`]). Counting the visible range
/// instead took 50–65 ms a second on a backlog of 500k and grew with it.
pub(crate) fn stats(conn: &Connection, now_ms: i64) -> rusqlite::Result<QueueStats> {
    // One snapshot: a commit between the counter and the index would
    // skew the difference.
    let conn = conn.unchecked_transaction()?;
    let pending: i64 = conn
        .prepare_cached("SELECT value FROM counters WHERE name = 'pending'")?
        .query_row([], |r| r.get(0))?;
    let (in_flight, delayed): (i64, i64) = conn
        .prepare_cached(NOT_YET_VISIBLE)?
        .query_row(params![now_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let oldest: Option<i64> = conn
        .prepare_cached(HEAD_OF_QUEUE)?
        .query_row(params![now_ms], |r| r.get(0))
        .optional()?;
    let dead: i64 = conn
        .prepare_cached(COUNT_DEAD)?
        .query_row([], |r| r.get(0))?;
    let counter = |name: &str| -> rusqlite::Result<i64> {
        conn.prepare_cached("SELECT value FROM counters WHERE name = ?1")?
            .query_row(params![name], |r| r.get(0))
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(QueueStats {
        visible: Some(count(pending - in_flight - delayed)),
        in_flight: Some(count(in_flight)),
        delayed: Some(count(delayed)),
        dead_lettered: Some(count(dead)),
        oldest_visible_age_ms: Some(oldest.map_or(0, |t| count(now_ms - t))),
        acked_total: Some(count(counter("acked_total")?)),
        dead_lettered_total: Some(count(counter("dead_total")?)),
    })
}

/// Dead-lettered messages, oldest first, after the one of id `after`
/// (bodies left out); or only the one `with_body_of`, with its body.
pub(crate) fn dead_letters(
    conn: &Connection,
    limit: usize,
    after: Option<i64>,
    with_body_of: Option<i64>,
) -> rusqlite::Result<Vec<DeadLetter>> {
    let mut st = conn.prepare_cached(DEAD_LETTERS)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = st.query_map(params![with_body_of, limit, after], |r| {
        let body: Option<Vec<u8>> = r.get(10)?;
        Ok(DeadLetter {
            id: r.get::<_, i64>(0)?.to_string(),
            source: r.get(1)?,
            event_id: r.get(2)?,
            entity_key: r.get(3)?,
            attempts: r.get(4)?,
            replays: r.get(5)?,
            class: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            error: r.get::<_, Option<String>>(7)?.unwrap_or_default(),
            received_at_ms: r.get(8)?,
            dead_at_ms: r.get::<_, Option<i64>>(9)?.unwrap_or_default(),
            body: with_body_of
                .is_some()
                .then(|| String::from_utf8_lossy(&body.unwrap_or_default()).into_owned()),
        })
    })?;
    rows.collect()
}

const _: () = {
    // Keep the documented states in step with the SQL above.
    assert!(PENDING == 0 && ACKED == 1 && DEAD == 2);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps of `sql`'s query plan, as `EXPLAIN QUERY PLAN` words them.
    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut st = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let nulls = std::iter::repeat_n(rusqlite::types::Null, st.parameter_count());
        st.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .expect("plan")
            .collect::<rusqlite::Result<_>>()
            .expect("plan rows")
    }

    #[test]
    fn queries_use_their_partial_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("q.db")).expect("open");
        for sql in [
            REPLAY_CANDIDATES,
            PURGE_DEAD,
            PRUNE_ACKED,
            COUNT_DEAD,
            DEAD_LETTERS,
        ] {
            let steps = plan(&conn, sql);
            assert!(
                steps.iter().any(|s| s.contains("messages_settled")),
                "{sql}: {steps:?}"
            );
            assert!(
                !steps.iter().any(|s| s == "SCAN messages"),
                "{sql} reads the whole table: {steps:?}"
            );
        }
        // The stats read the ready index, in its own order.
        for sql in [NOT_YET_VISIBLE, HEAD_OF_QUEUE] {
            let steps = plan(&conn, sql);
            assert!(
                steps.iter().any(|s| s.contains("messages_ready_keyed")),
                "{sql}: {steps:?}"
            );
            assert!(
                !steps
                    .iter()
                    .any(|s| s == "SCAN messages" || s.contains("TEMP B-TREE")),
                "{sql}: {steps:?}"
            );
        }
        // Without the index's own condition SQLite falls back to a scan:
        // the reason the queries above repeat it.
        let bare = plan(&conn, "SELECT COUNT(*) FROM messages WHERE state = 2");
        assert!(bare.iter().any(|s| s == "SCAN messages"), "{bare:?}");
    }
}
