//! The embedded queue's single writer thread and its group commit.
//!
//! SQLite allows one writer at a time, and the cost of durability is the
//! fsync at commit. So every mutation (enqueue, claim, ack, retry, release,
//! dead-letter, replay, purge) is sent to one thread, which takes whatever
//! has queued up (at most `max_batch`), runs it all in one transaction and
//! commits once: a hundred concurrent webhooks share one fsync. Replies are
//! sent only after the commit returned. Only batches holding an enqueue
//! pay for the fsync, so only an enqueue's "done" means "on disk"; every
//! other change is committed without one and becomes durable with the next
//! fsync'd commit or checkpoint (see [`Op::needs_fsync`] for why that is
//! enough), and only enqueues linger for company. If the commit fails,
//! every operation of the batch fails with it and nothing is acknowledged.

use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::dedup::{self, DedupIndex};
use super::store;
use breakwater_queue::{Delivery, Enqueued, Message, NewMessage, QueueError, Receipt};

use crate::LeaseToken;

/// The reply channel of an operation (the log backend's writer uses it
/// too).
pub type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

/// A message on its way to the writer, with the work that needs no store
/// (its headers as JSON, its dedup key) already done on the caller's
/// thread: the writer is the one thread every webhook waits for.
pub(crate) struct Incoming {
    pub message: NewMessage,
    pub headers_json: String,
    pub dedup_key: u64,
    /// When it was handed to the writer (for the enqueue-wait metric).
    pub queued_at: Instant,
    /// Its bytes in the budget of bytes waiting for the writer, given
    /// back when the writer is done with it.
    pub _reserved: crate::budget::Reserved,
}

impl Incoming {
    pub(crate) fn new(message: NewMessage, reserved: crate::budget::Reserved) -> Self {
        Self {
            queued_at: Instant::now(),
            headers_json: headers_json(&message),
            dedup_key: dedup::key(&message.source, &message.event_id),
            message,
            _reserved: reserved,
        }
    }
}

/// A message's headers as the store keeps them: a JSON array of pairs.
pub fn headers_json(message: &NewMessage) -> String {
    serde_json::to_string(&message.headers).unwrap_or_else(|_| "[]".to_owned())
}

/// A mutation for the writer thread.
pub(crate) enum Op {
    Enqueue(Box<Incoming>, Reply<Enqueued>),
    Claim {
        max: usize,
        lease_ms: i64,
        /// Entity keys to leave queued, as a JSON array.
        skip: Option<String>,
        reply: Reply<Vec<Delivery>>,
    },
    Ack {
        id: i64,
        lease: i64,
        reply: Reply<()>,
    },
    /// Push these leases out (claims still being worked on).
    Extend {
        leases: Vec<(i64, i64)>,
        lease_ms: i64,
        reply: Reply<usize>,
    },
    /// Retry (with an error, counts an attempt) or release (without).
    Unclaim {
        id: i64,
        lease: i64,
        delay_ms: i64,
        error: Option<String>,
        reply: Reply<()>,
    },
    DeadLetter {
        id: i64,
        lease: i64,
        class: String,
        error: String,
        reply: Reply<()>,
    },
    Replay {
        ids: Vec<i64>,
        max_replays: u32,
        limit: usize,
        reply: Reply<Vec<i64>>,
    },
    Purge {
        ids: Vec<i64>,
        reply: Reply<usize>,
    },
    /// From the checkpoint thread: finish a checkpoint after this batch, so
    /// the WAL can be rewound (see [`checkpoint_loop`]).
    FinishCheckpoint,
}

impl Op {
    /// Whether the batch holding this operation must be fsync'd before it
    /// is answered. Only enqueue: it is the one promise made to the
    /// outside (the ingress answers 2xx on it). Losing any other change to
    /// a power cut is harmless under at-least-once delivery with an
    /// idempotent sink: a lost claim, retry or release means the lease
    /// expires and the message is visible again; a lost ack means it is
    /// applied again and the inbox makes that a no-op; a lost dead-letter
    /// means it is tried and dead-lettered again; a lost replay or purge
    /// leaves it in the DLQ. Such batches commit with
    /// `synchronous = NORMAL` (WAL-consistent, no fsync) and become
    /// durable with the next fsync'd commit or checkpoint.
    fn needs_fsync(&self) -> bool {
        matches!(self, Op::Enqueue(..))
    }
}

/// Settings of the writer.
pub(crate) struct WriterSettings {
    pub max_batch: usize,
    /// Keep acked rows this long for dedup; zero deletes them at once.
    pub dedup_window_ms: i64,
    /// Most entries of the duplicate index.
    pub dedup_index_max: usize,
}

/// Sends the outcome of one operation once the batch's fate is known.
pub type Finish = Box<dyn FnOnce(Result<(), &str>) + Send>;

/// The reply of `value`, to be sent once the batch is committed (or
/// written): a failed commit fails it instead.
pub fn finish<T: Send + 'static>(reply: Reply<T>, value: Result<T, QueueError>) -> Finish {
    Box::new(move |commit: Result<(), &str>| {
        let outcome = match commit {
            Ok(()) => value,
            Err(e) => Err(QueueError::Storage(e.to_owned())),
        };
        // The caller may have given up waiting; that is its business.
        let _ = reply.send(outcome);
    })
}

fn lease_lost(id: i64) -> QueueError {
    QueueError::LeaseLost { id: id.to_string() }
}

pub(crate) use crate::clock::now_ms;

/// A group commit this slow is a warning: about 40 times a full-load
/// commit (0.5 ms). Rare stalls set the ingress's tail latency, and the
/// log line says when and for how long. A checkpoint pass this slow is
/// logged at debug level: passes of 20–30 ms are routine on a store that
/// grows into fresh memory (see docs/measurements.md, "Checkpoints and the WAL"), and they stall nobody
/// by themselves.
const SLOW: Duration = Duration::from_millis(20);

/// Batches smaller than this wait [`LINGER`] once for more operations.
pub const LINGER_BELOW: usize = 32;
/// Shorter than the WAL fsync it saves, so a small batch never waits
/// longer for company than its commit takes. Under `bench ingress` at half
/// the peak rate (four interleaved runs each, on a disk whose `fdatasync`
/// takes 0.14 ms): 250 us gave p50 0.92–1.13 ms and a handler mean of
/// 0.78–1.01 ms, 100 us gave 0.78–0.91 and 0.65–0.78, with p99 3.65–5.72
/// ms against 3.86–4.74 (and one 26 ms run with a stall). At full load
/// more batches now commit below [`LINGER_BELOW`] (27.8 operations per
/// commit on average against about 35), and the rate did not move.
pub const LINGER: Duration = Duration::from_micros(100);

/// Moves what has queued on `rx` into `batch`, up to `max` in all, without
/// waiting.
pub fn drain<T>(rx: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

/// Runs the writer until every sender is dropped.
pub(crate) fn run(mut conn: Connection, mut rx: mpsc::Receiver<Op>, settings: WriterSettings) {
    let forget = settings.dedup_window_ms == 0;
    let mut dedup = DedupIndex::new(settings.dedup_index_max);
    let mut next_prune = Instant::now() + PRUNE_EVERY;
    let mut fsyncing = true;
    let mut batch: Vec<Op> = Vec::with_capacity(settings.max_batch);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        drain(&mut rx, &mut batch, settings.max_batch);
        if batch.len() < LINGER_BELOW && batch.iter().any(Op::needs_fsync) {
            // A small batch under load wastes an fsync: give concurrent
            // requests a moment to join it (like Kafka's linger.ms).
            std::thread::sleep(LINGER);
            drain(&mut rx, &mut batch, settings.max_batch);
        }
        let finish_checkpoint = batch.iter().any(|op| matches!(op, Op::FinishCheckpoint));
        batch.retain(|op| !matches!(op, Op::FinishCheckpoint));
        let size = batch.len();
        let started = Instant::now();
        // Looked up per batch, like the other metrics here, so a recorder
        // installed after the queue opened still sees it.
        let enqueue_wait = metrics::histogram!(crate::telemetry::QUEUE_ENQUEUE_WAIT_SECONDS);
        for op in &batch {
            if let Op::Enqueue(incoming, _) = op {
                enqueue_wait.record(started.duration_since(incoming.queued_at).as_secs_f64());
            }
        }
        let durable = batch.iter().any(Op::needs_fsync);
        let mut finishes: Vec<Finish> = Vec::with_capacity(size);
        let mut result = Ok(());
        if durable != fsyncing {
            let mode = if durable { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", mode) {
                Ok(()) => fsyncing = durable,
                // Never answer an enqueue without the fsync it was promised.
                Err(e) if durable => result = Err(e),
                Err(e) => tracing::warn!(error = %e, mode, "cannot switch synchronous mode"),
            }
        }
        if result.is_ok() {
            result = run_batch(
                &mut conn,
                batch.drain(..),
                forget,
                &mut dedup,
                &mut finishes,
            );
        } else {
            finishes.extend(batch.drain(..).map(abandon));
        }
        match &result {
            Ok(()) => finishes.into_iter().for_each(|f| f(Ok(()))),
            Err(e) => {
                tracing::error!(error = %e, operations = size, "queue commit failed");
                let msg = e.to_string();
                finishes.into_iter().for_each(|f| f(Err(&msg)));
            }
        }
        if finish_checkpoint {
            // Between transactions, with no other writer: this one copies
            // the few frames the checkpoint thread could not reach and
            // completes, so the next commit starts the WAL over.
            if let Err(e) = store::checkpoint(&conn) {
                tracing::warn!(error = %e, "queue checkpoint failed");
            }
        }
        let took = started.elapsed();
        if took >= SLOW {
            tracing::warn!(
                ms = took.as_millis() as u64,
                operations = size,
                finished_checkpoint = finish_checkpoint,
                "slow group commit: every webhook in it waited this long"
            );
        }
        metrics::histogram!(crate::telemetry::QUEUE_COMMIT_SECONDS).record(took.as_secs_f64());
        metrics::histogram!(crate::telemetry::QUEUE_COMMIT_BATCH).record(size as f64);
        if !forget && Instant::now() >= next_prune {
            let pruned = prune(&mut conn, now_ms() - settings.dedup_window_ms, &mut dedup);
            next_prune = Instant::now() + prune_after(pruned);
        }
    }
}

/// Runs one batch in one transaction. Operations whose reply has to wait
/// for the commit push a [`Finish`]; on any storage error the whole batch
/// rolls back (the remaining operations are failed too).
fn run_batch(
    conn: &mut Connection,
    ops: impl Iterator<Item = Op>,
    forget: bool,
    dedup: &mut DedupIndex,
    finishes: &mut Vec<Finish>,
) -> rusqlite::Result<()> {
    // IMMEDIATE: take the write lock up front (waiting out another
    // process, e.g. `dlq replay`, through the busy timeout) instead of
    // failing when a read turns into a write.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let now = now_ms();
    let mut tally = Tally::default();
    let mut ops = ops;
    while let Some(op) = ops.next() {
        let step = run_op(&tx, op, now, forget, dedup, &mut tally);
        match step {
            Ok(f) => finishes.push(f),
            Err((e, f)) => {
                finishes.push(f);
                for rest in ops {
                    finishes.push(abandon(rest));
                }
                return Err(e);
            }
        }
    }
    store::bump(&tx, "acked_total", tally.acked)?;
    store::bump(&tx, "dead_total", tally.dead)?;
    store::bump(&tx, "pending", tally.pending)?;
    tx.commit()?;
    // Only now: had the commit failed, the rows would still be there, and
    // a redelivery of one of them must still answer "duplicate".
    forget_all(dedup, tally.forgotten);
    Ok(())
}

/// What a batch's operations did besides their replies: the counters it
/// bumps, and the rows it deleted, which leave the dedup index once it
/// commits.
#[derive(Default)]
struct Tally {
    acked: i64,
    dead: i64,
    /// Pending rows made (enqueue, replay) less those settled (ack,
    /// dead-letter).
    pending: i64,
    forgotten: Vec<store::Forgotten>,
}

type StepError = (rusqlite::Error, Finish);

fn run_op(
    tx: &rusqlite::Transaction<'_>,
    op: Op,
    now: i64,
    forget: bool,
    dedup: &mut DedupIndex,
    tally: &mut Tally,
) -> Result<Finish, StepError> {
    // Each arm returns the value to send after commit, or the error that
    // aborts the batch together with the reply to fail.
    macro_rules! attempt {
        ($reply:expr, $e:expr) => {
            match $e {
                Ok(v) => v,
                Err(err) => return Err((err, finish($reply, Err(QueueError::Closed)))),
            }
        };
    }
    Ok(match op {
        Op::Enqueue(incoming, reply) => {
            let Incoming {
                message: m,
                headers_json,
                dedup_key: key,
                queued_at: _,
                // Taken by the writer: its bytes leave the budget here.
                _reserved: _,
            } = *incoming;
            let index = attempt!(reply, dedup.loaded(tx));
            let known = match index.candidate(key) {
                Some(id) => {
                    attempt!(reply, store::holds(tx, id, &m.source, &m.event_id)).then_some(id)
                }
                None => None,
            };
            let (id, new) = match known {
                Some(id) => (id, false),
                None => attempt!(reply, store::enqueue(tx, &m, &headers_json)),
            };
            index.insert(key, id);
            tally.pending += i64::from(new);
            let id = id.to_string();
            finish(
                reply,
                Ok(if new {
                    Enqueued::New { id }
                } else {
                    Enqueued::Duplicate { id }
                }),
            )
        }
        Op::Claim {
            max,
            lease_ms,
            skip,
            reply,
        } => {
            let token: i64 = rand::random::<i64>() & i64::MAX;
            let rows: Vec<(i64, Message)> = attempt!(
                reply,
                store::claim(tx, max, now, lease_ms, token, skip.as_deref())
            );
            let deliveries = rows
                .into_iter()
                .map(|(id, message)| Delivery {
                    message,
                    receipt: Receipt::new(LeaseToken { id, lease: token }),
                })
                .collect();
            finish(reply, Ok(deliveries))
        }
        Op::Ack { id, lease, reply } => {
            let ok = match attempt!(reply, store::ack(tx, id, lease, now, forget)) {
                store::Acked::LeaseLost => false,
                store::Acked::Kept => true,
                store::Acked::Deleted(gone) => {
                    tally.forgotten.push(gone);
                    true
                }
            };
            tally.acked += i64::from(ok);
            tally.pending -= i64::from(ok);
            finish(reply, if ok { Ok(()) } else { Err(lease_lost(id)) })
        }
        Op::Extend {
            leases,
            lease_ms,
            reply,
        } => {
            let extended = attempt!(
                reply,
                store::extend(tx, &leases, now.saturating_add(lease_ms))
            );
            finish(reply, Ok(extended))
        }
        Op::Unclaim {
            id,
            lease,
            delay_ms,
            error,
            reply,
        } => {
            let ok = attempt!(
                reply,
                store::unclaim(
                    tx,
                    id,
                    lease,
                    now.saturating_add(delay_ms),
                    error.as_deref()
                )
            );
            finish(reply, if ok { Ok(()) } else { Err(lease_lost(id)) })
        }
        Op::DeadLetter {
            id,
            lease,
            class,
            error,
            reply,
        } => {
            let ok = attempt!(
                reply,
                store::dead_letter(tx, id, lease, now, &class, &error)
            );
            tally.dead += i64::from(ok);
            tally.pending -= i64::from(ok);
            finish(reply, if ok { Ok(()) } else { Err(lease_lost(id)) })
        }
        Op::Replay {
            ids,
            max_replays,
            limit,
            reply,
        } => {
            let done = attempt!(reply, store::replay(tx, &ids, now, max_replays, limit));
            tally.pending += i64::try_from(done.len()).unwrap_or(i64::MAX);
            finish(reply, Ok(done))
        }
        Op::Purge { ids, reply } => {
            let gone = attempt!(reply, store::purge(tx, &ids));
            let n = gone.len();
            tally.forgotten.extend(gone);
            finish(reply, Ok(n))
        }
        // Taken out of the batch before it runs.
        Op::FinishCheckpoint => Box::new(|_| {}),
    })
}

/// The reply of an operation that never ran because its batch failed.
fn abandon(op: Op) -> Finish {
    match op {
        Op::Enqueue(_, reply) => finish(reply, Err(QueueError::Closed)),
        Op::Claim { reply, .. } => finish(reply, Err(QueueError::Closed)),
        Op::Extend { reply, .. } => finish(reply, Err(QueueError::Closed)),
        Op::Ack { reply, .. } | Op::Unclaim { reply, .. } | Op::DeadLetter { reply, .. } => {
            finish(reply, Err(QueueError::Closed))
        }
        Op::Replay { reply, .. } => finish(reply, Err(QueueError::Closed)),
        Op::Purge { reply, .. } => finish(reply, Err(QueueError::Closed)),
        Op::FinishCheckpoint => Box::new(|_| {}),
    }
}

/// How often the WAL is copied into the main database file. Short, so each
/// pass (and the fsync after it) moves little.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// Checkpoints the WAL from its own connection until the queue is dropped,
/// then once more.
///
/// A checkpoint beside a busy writer never catches up with the last frames,
/// and SQLite rewinds the WAL only after one that did: left alone, the WAL
/// grows without bound (144 MB for 30,000 messages, and every append then
/// pays for fresh file pages). So once the WAL passes
/// [`store::WAL_RESTART_FRAMES`], right after a pass that copied nearly
/// everything, this thread asks the writer to finish the checkpoint
/// between two batches: a short stall of the commit path, rarely.
///
/// For the same reason SQLite never fsyncs the database file after these
/// passes (it does so only when a pass reaches the end of the WAL), so the
/// copied pages piled up dirty until the writer's finishing checkpoint
/// synced tens of megabytes at once: 50–110 ms with every commit waiting,
/// and the enqueue fsyncs queued behind it on the same disk. This thread
/// therefore `fdatasync`s `db_file` itself after every pass, so the pages
/// reach the disk a few at a time (under `bench ingress`: half-peak p99 from
/// 33–36 ms to 7–9 ms, slowest request from about 90 ms to under 20 ms).
pub(crate) fn checkpoint_loop(
    conn: Connection,
    db_file: std::fs::File,
    alive: mpsc::WeakSender<Op>,
) {
    loop {
        std::thread::sleep(CHECKPOINT_EVERY);
        let writer = alive.upgrade();
        let started = Instant::now();
        let pass = store::checkpoint(&conn);
        let copied = started.elapsed();
        if matches!(pass, Ok((frames, _)) if frames > 0) {
            // Extra syncs never weaken durability; a failure only means
            // the finishing checkpoint will sync more at once.
            if let Err(e) = db_file.sync_data() {
                tracing::warn!(error = %e, "cannot fsync the queue database after a checkpoint pass");
            }
        }
        let took = started.elapsed();
        if took >= SLOW {
            tracing::debug!(
                ms = took.as_millis() as u64,
                copy_ms = copied.as_millis() as u64,
                wal_frames = pass.as_ref().map_or(0, |p| p.0),
                "slow checkpoint pass"
            );
        }
        match pass {
            Ok((frames, _)) if frames > store::WAL_RESTART_FRAMES => {
                if let Some(writer) = &writer {
                    let _ = writer.try_send(Op::FinishCheckpoint);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "queue checkpoint failed"),
        }
        if writer.is_none() {
            break;
        }
    }
}

/// Acked messages past the dedup window are deleted this many at a time,
/// between batches: enqueues wait for a prune, so it must stay short.
const PRUNE_CHUNK: usize = 1000;
/// How often to look for acked messages past the dedup window.
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// How soon to prune again after a full chunk: up to 10k deletions a
/// second while acked messages are piling up past the window.
const PRUNE_AGAIN: Duration = Duration::from_millis(100);

/// When to prune next, after a prune that deleted `pruned` messages.
fn prune_after(pruned: usize) -> Duration {
    if pruned >= PRUNE_CHUNK {
        PRUNE_AGAIN
    } else {
        PRUNE_EVERY
    }
}

/// Deletes up to [`PRUNE_CHUNK`] acked messages settled before `before_ms`
/// and forgets them in `dedup`; returns how many.
fn prune(conn: &mut Connection, before_ms: i64, dedup: &mut DedupIndex) -> usize {
    let result = conn.transaction().and_then(|tx| {
        let gone = store::prune_acked(&tx, before_ms, PRUNE_CHUNK)?;
        tx.commit().map(|()| gone)
    });
    let pruned = match result {
        Ok(gone) => {
            let n = gone.len();
            forget_all(dedup, gone);
            if n > 0 {
                tracing::debug!(pruned = n, "forgot acked messages past the dedup window");
            }
            n
        }
        Err(e) => {
            tracing::warn!(error = %e, "pruning acked messages failed");
            0
        }
    };
    metrics::gauge!(crate::telemetry::QUEUE_DEDUP_ENTRIES).set(dedup.len() as f64);
    pruned
}

/// Takes deleted messages out of the dedup index, once their deletion has
/// committed.
fn forget_all(dedup: &mut DedupIndex, gone: impl IntoIterator<Item = store::Forgotten>) {
    for (id, source, event_id) in gone {
        dedup.remove(dedup::key(&source, &event_id), id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_deletes_a_chunk_at_a_time_and_only_past_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = store::open(&dir.path().join("q.db")).expect("store");
        let old = PRUNE_CHUNK + 500;
        // Acked long ago, acked recently, pending, dead.
        conn.execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {total})
             INSERT INTO messages (id, source, event_id, headers, received_at, visible_at,
                                   state, settled_at)
             SELECT i, 's', 'e' || i, '[]', 1, 1,
                    CASE WHEN i > {old} + 20 THEN i % 2 * 2 ELSE 1 END,
                    CASE WHEN i <= {old} THEN 1000 WHEN i <= {old} + 20 THEN 9000 ELSE 2000 END
             FROM n",
            total = old + 40
        ))
        .expect("rows");
        let mut dedup = DedupIndex::default();
        let index = dedup.loaded(&conn).expect("index");
        assert_eq!(index.candidate(dedup::key("s", "e1")), Some(1));

        assert_eq!(prune(&mut conn, 5000, &mut dedup), PRUNE_CHUNK);
        assert_eq!(prune_after(PRUNE_CHUNK), PRUNE_AGAIN);
        assert_eq!(prune(&mut conn, 5000, &mut dedup), 500);
        assert_eq!(prune_after(500), PRUNE_EVERY);
        assert_eq!(prune(&mut conn, 5000, &mut dedup), 0);

        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
            .expect("count");
        assert_eq!(left, 40, "the recent acks, the pending and the dead stay");
        let index = dedup.loaded(&conn).expect("index");
        assert_eq!(index.candidate(dedup::key("s", "e1")), None);
        assert_eq!(index.candidate(dedup::key("s", &format!("e{old}"))), None);
        let recent = format!("e{}", old + 1);
        assert_eq!(
            index.candidate(dedup::key("s", &recent)),
            Some(old as i64 + 1)
        );
    }
}
