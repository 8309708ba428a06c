//! The embedded queue: the single-node default, a SQLite database in WAL
//! mode under the data directory (`queue.db` in `[queue] path`), as a
//! backend of the queue contract ([`breakwater_queue::Queue`]).
//!
//! - [`store`] holds the schema and the SQL (the on-disk format is
//!   documented there).
//! - [`writer`] is the one thread that mutates the store, committing
//!   operations in groups so concurrent webhooks share an fsync.
//! - [`dedup`] is the writer's in-memory index of the event ids the store
//!   holds, which answers "duplicate" without a SQLite unique index.
//! - [`config`] is the backend's own keys of `[queue]`; [`EmbeddedBackend`]
//!   builds the queue from them.
//! - [`EmbeddedQueue`] is the [`Queue`] implementation: mutations go to the
//!   writer over a bounded channel (full: [`QueueError::Full`], which the
//!   ingress turns into 503 + `Retry-After`), reads (stats, DLQ listing) use
//!   a separate read connection, which WAL lets run beside the writer.
//!
//! Flow control is a pull backend's: while paused a claim hands out
//! nothing, and a claim hands out at most the flow's window.
//!
//! Several processes may open the same store: `breakwater queue stats` or
//! `dlq replay` while `serve` runs. SQLite's locking keeps them consistent;
//! a busy store waits up to 5 s. Each process has its own dedup index, so
//! only one of them should accept webhooks (two would not see each other's
//! duplicates; the sink's inbox still applies each event once).

pub mod budget;
pub mod clock;
pub mod config;
pub(crate) mod dedup;
pub(crate) mod store;
pub mod telemetry;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats, Receipt,
    StatKind,
};
use tokio::sync::{mpsc, oneshot};

pub use self::config::EmbeddedConfig;
use self::writer::{Incoming, Op, Reply, WriterSettings, now_ms};

/// File name of the store inside `[queue] path`.
pub const FILE_NAME: &str = "queue.db";

/// The token of an embedded receipt: the row and the lease it was claimed
/// under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseToken {
    pub id: i64,
    pub lease: i64,
}

/// The flow window when no flow was set: unbounded.
const UNBOUNDED: u32 = u32::MAX;

/// The embedded queue backend.
#[derive(Clone)]
pub struct EmbeddedQueue {
    ops: mpsc::Sender<Op>,
    reader: Arc<Mutex<rusqlite::Connection>>,
    path: PathBuf,
    /// Most messages one claim hands out ([`Flow::window`]); 0 while paused.
    window: Arc<AtomicU32>,
    /// Bytes of enqueues waiting for the writer (`max_pending_bytes`).
    budget: budget::ByteBudget,
}

impl std::fmt::Debug for EmbeddedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedQueue")
            .field("path", &self.path)
            .finish()
    }
}

fn storage(e: impl std::fmt::Display) -> QueueError {
    QueueError::Storage(e.to_string())
}

/// Why the writer's channel (of `capacity`) did not take an operation:
/// full (the caller should retry) or closed.
fn not_taken<T>(e: &mpsc::error::TrySendError<T>, capacity: usize) -> QueueError {
    match e {
        mpsc::error::TrySendError::Full(_) => QueueError::Full { pending: capacity },
        mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
    }
}

impl EmbeddedQueue {
    /// Opens (creating if needed) the store under `config.path` and starts
    /// its writer thread. The thread ends when the last clone is dropped.
    pub fn open(config: &EmbeddedConfig) -> Result<Self, QueueError> {
        std::fs::create_dir_all(&config.path).map_err(|e| {
            QueueError::Storage(format!("cannot create {}: {e}", config.path.display()))
        })?;
        Self::start(config)
    }

    /// Opens the store under `config.path` only if it exists
    /// ([`QueueError::Missing`] otherwise): what read-only commands use, so
    /// they never leave an empty store behind.
    pub fn open_existing(config: &EmbeddedConfig) -> Result<Self, QueueError> {
        let path = config.path.join(FILE_NAME);
        if !path.is_file() {
            return Err(QueueError::Missing {
                location: path.display().to_string(),
            });
        }
        Self::start(config)
    }

    fn start(config: &EmbeddedConfig) -> Result<Self, QueueError> {
        let path = config.path.join(FILE_NAME);
        let writer_conn = store::open(&path).map_err(storage)?;
        store::recount_pending(&writer_conn).map_err(storage)?;
        let reader = store::open(&path).map_err(storage)?;
        let (tx, rx) = mpsc::channel(config.max_pending.max(1));
        let settings = WriterSettings {
            max_batch: config.max_batch.max(1),
            dedup_window_ms: i64::try_from(config.dedup_window_secs)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
            dedup_index_max: config.dedup_index_max,
        };
        std::thread::Builder::new()
            .name("queue-writer".into())
            .spawn(move || writer::run(writer_conn, rx, settings))
            .map_err(storage)?;
        let checkpointer = store::open(&path).map_err(storage)?;
        // Opened only to fsync it (see `checkpoint_loop`); SQLite's locks
        // are on other descriptors and this one is never closed early.
        let db_file = std::fs::File::open(&path)
            .map_err(|e| QueueError::Storage(format!("cannot open {}: {e}", path.display())))?;
        let alive = tx.downgrade();
        std::thread::Builder::new()
            .name("queue-checkpoint".into())
            .spawn(move || writer::checkpoint_loop(checkpointer, db_file, alive))
            .map_err(storage)?;
        Ok(Self {
            ops: tx,
            reader: Arc::new(Mutex::new(reader)),
            path,
            window: Arc::new(AtomicU32::new(UNBOUNDED)),
            budget: budget::ByteBudget::new(config.max_pending_bytes),
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Op) -> Result<T, QueueError> {
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(make(tx))
            .await
            .map_err(|_| QueueError::Closed)?;
        rx.await.map_err(|_| QueueError::Closed)?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, QueueError> {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            let conn = reader.lock().map_err(|_| QueueError::Closed)?;
            f(&conn).map_err(storage)
        })
        .await
        .map_err(storage)?
    }
}

/// A dead letter's (or row's) id as the API gives it; not a number is not
/// found. Shared with the log backend, whose dead-letter ids are rows too.
pub fn parse_id(id: &str) -> Result<i64, QueueError> {
    id.parse()
        .map_err(|_| QueueError::NotFound { id: id.to_owned() })
}

/// [`parse_id`] of each.
pub fn parse_ids(ids: &[String]) -> Result<Vec<i64>, QueueError> {
    ids.iter().map(|s| parse_id(s)).collect()
}

fn lease_token(receipt: &Receipt) -> Result<LeaseToken, QueueError> {
    receipt
        .token::<LeaseToken>()
        .copied()
        .ok_or(QueueError::ForeignReceipt)
}

/// `d` in whole milliseconds, saturating.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Every stats field: the store (and the log backend) counts them all.
pub const ALL_STATS: &[StatKind] = &[
    StatKind::Visible,
    StatKind::InFlight,
    StatKind::Delayed,
    StatKind::DeadLettered,
    StatKind::OldestVisibleAge,
    StatKind::AckedTotal,
    StatKind::DeadLetteredTotal,
];

#[async_trait]
impl Queue for EmbeddedQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_delay: true,
            native_dedup: true,
            counts_attempts: true,
            counts_receives: true,
            filters_keys: true,
            push: false,
            stats: ALL_STATS,
        }
    }

    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        let bytes = message.body.len()
            + message.event_id.len()
            + message.source.len()
            + message
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        let reserved = self.budget.reserve(bytes).ok_or(QueueError::Full {
            pending: self.ops.max_capacity() - self.ops.capacity(),
        })?;
        let (tx, rx) = oneshot::channel();
        self.ops
            .try_send(Op::Enqueue(Box::new(Incoming::new(message, reserved)), tx))
            .map_err(|e| not_taken(&e, self.ops.max_capacity()))?;
        rx.await.map_err(|_| QueueError::Closed)?
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.claim_skipping(max, lease, &[]).await
    }

    async fn claim_skipping(
        &self,
        max: usize,
        lease: Duration,
        skip_keys: &[String],
    ) -> Result<Vec<Delivery>, QueueError> {
        let window = self.window.load(Ordering::Acquire) as usize;
        let max = max.min(window);
        if max == 0 {
            return Ok(Vec::new());
        }
        let lease_ms = millis(lease);
        let skip = (!skip_keys.is_empty())
            .then(|| serde_json::to_string(skip_keys).unwrap_or_else(|_| "[]".to_owned()));
        self.call(|reply| Op::Claim {
            max,
            lease_ms,
            skip,
            reply,
        })
        .await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let LeaseToken { id, lease } = lease_token(receipt)?;
        self.call(|reply| Op::Ack { id, lease, reply }).await
    }

    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        error: &str,
    ) -> Result<(), QueueError> {
        let LeaseToken { id, lease } = lease_token(receipt)?;
        let error = Some(error.to_owned());
        self.call(|reply| Op::Unclaim {
            id,
            lease,
            delay_ms: millis(delay),
            error,
            reply,
        })
        .await
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let leases = receipts
            .iter()
            .map(|r| lease_token(r).map(|t| (t.id, t.lease)))
            .collect::<Result<Vec<_>, _>>()?;
        let lease_ms = millis(lease);
        self.call(|reply| Op::Extend {
            leases,
            lease_ms,
            reply,
        })
        .await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        let LeaseToken { id, lease } = lease_token(receipt)?;
        self.call(|reply| Op::Unclaim {
            id,
            lease,
            delay_ms: millis(delay),
            error: None,
            reply,
        })
        .await
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        let LeaseToken { id, lease } = lease_token(receipt)?;
        let (class, error) = (reason.class.clone(), reason.error.clone());
        self.call(|reply| Op::DeadLetter {
            id,
            lease,
            class,
            error,
            reply,
        })
        .await
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        // A claim under way keeps the window it read; the dispatcher hands
        // back what comes of it when the gate moved meanwhile.
        self.window.store(flow.window(), Ordering::Release);
        Ok(())
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        self.read(|c| store::stats(c, now_ms())).await
    }

    async fn ready(&self) -> Result<(), QueueError> {
        if self.ops.is_closed() {
            Err(QueueError::Closed)
        } else if self.ops.capacity() == 0 {
            Err(QueueError::Full {
                pending: self.ops.max_capacity(),
            })
        } else {
            Ok(())
        }
    }

    async fn dlq_list(&self, page: &DlqPage) -> Result<Vec<DeadLetter>, QueueError> {
        let after = page.after.as_deref().map(parse_id).transpose()?;
        let limit = page.limit;
        self.read(move |c| store::dead_letters(c, limit, after, None))
            .await
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let n = parse_id(id)?;
        self.read(move |c| store::dead_letters(c, 1, None, Some(n)))
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| QueueError::NotFound { id: id.to_owned() })
    }

    async fn dlq_replay(
        &self,
        ids: &[String],
        max_replays: u32,
        limit: usize,
    ) -> Result<Vec<String>, QueueError> {
        let ids = parse_ids(ids)?;
        let done = self
            .call(|reply| Op::Replay {
                ids,
                max_replays,
                limit,
                reply,
            })
            .await?;
        Ok(done.into_iter().map(|i| i.to_string()).collect())
    }

    async fn dlq_purge(&self, ids: &[String]) -> Result<usize, QueueError> {
        let ids = parse_ids(ids)?;
        self.call(|reply| Op::Purge { ids, reply }).await
    }
}

/// Builds the embedded queue from `[queue]`: `backend = "embedded"`, with
/// the keys of [`EmbeddedConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EmbeddedBackend;

#[async_trait]
impl Backend for EmbeddedBackend {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn check(&self, section: &QueueSection) -> Result<toml::Table, ConfigProblem> {
        breakwater_queue::own_keys_table(&EmbeddedConfig::from_section(section)?)
    }

    async fn open(
        &self,
        section: &QueueSection,
        mode: OpenMode,
    ) -> Result<Arc<dyn Queue>, QueueError> {
        let config = EmbeddedConfig::from_section(section)
            .map_err(|e| QueueError::Storage(e.to_string()))?;
        let queue = match mode {
            OpenMode::Serve => EmbeddedQueue::open(&config)?,
            OpenMode::Inspect => EmbeddedQueue::open_existing(&config)?,
        };
        Ok(Arc::new(queue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count the embedded store always reports.
    fn n(v: Option<u64>) -> u64 {
        v.expect("the embedded store counts every field")
    }
    use bytes::Bytes;

    fn config(dir: &Path) -> EmbeddedConfig {
        EmbeddedConfig {
            path: dir.to_owned(),
            ..EmbeddedConfig::default()
        }
    }

    fn msg(event: &str, key: Option<&str>) -> NewMessage {
        NewMessage {
            source: "s".into(),
            event_id: event.into(),
            entity_key: key.map(str::to_owned),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(b"{\"a\":1}"),
            received_at_ms: now_ms(),
        }
    }

    const LEASE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn extending_keeps_a_live_lease_and_leaves_a_lost_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        q.enqueue(msg("e1", None)).await.expect("enqueue");
        q.enqueue(msg("e2", None)).await.expect("enqueue");
        let short = Duration::from_millis(200);
        let first = q.claim(2, short).await.expect("claim");
        assert_eq!(first.len(), 2);
        // e2's lease runs out and it is claimed again under a new lease.
        tokio::time::sleep(short * 2).await;
        let e1 = first
            .iter()
            .find(|d| d.message.event_id == "e1")
            .expect("e1");
        let e2 = first
            .iter()
            .find(|d| d.message.event_id == "e2")
            .expect("e2");
        let again = q.claim(1, LEASE).await.expect("claim");
        assert_eq!(again.len(), 1);
        let lost = if again[0].message.event_id == "e2" {
            e2
        } else {
            e1
        };
        let live = if lost.message.event_id == "e2" {
            e1
        } else {
            e2
        };
        // The live claim's lease had run out too, unclaimed: it is pushed out.
        let receipts = [live.receipt.clone(), lost.receipt.clone()];
        assert_eq!(q.extend_leases(&receipts, LEASE).await.expect("extend"), 1);
        tokio::time::sleep(short * 2).await;
        assert!(
            q.claim(2, LEASE).await.expect("claim").is_empty(),
            "both held"
        );
        assert_eq!(
            q.stats().await.expect("stats").in_flight.expect("counted"),
            2
        );
    }

    #[tokio::test]
    async fn enqueue_claim_ack_and_dedup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let first = q.enqueue(msg("e1", Some("k"))).await.expect("enqueue");
        assert!(matches!(first, Enqueued::New { .. }));
        let again = q.enqueue(msg("e1", Some("k"))).await.expect("enqueue");
        assert!(matches!(again, Enqueued::Duplicate { .. }));

        let got = q.claim(10, LEASE).await.expect("claim");
        assert_eq!(got.len(), 1);
        let d = &got[0];
        assert_eq!(d.message.event_id, "e1");
        assert_eq!(d.message.entity_key.as_deref(), Some("k"));
        assert_eq!(d.message.receives, 1);
        assert_eq!(&d.message.body[..], b"{\"a\":1}");
        assert_eq!(
            q.stats().await.expect("stats").in_flight.expect("counted"),
            1
        );
        assert!(q.claim(10, LEASE).await.expect("claim").is_empty());

        q.ack(&d.receipt).await.expect("ack");
        let s = q.stats().await.expect("stats");
        assert_eq!((n(s.visible), n(s.in_flight), n(s.acked_total)), (0, 0, 1));
        // An applied event id is still known.
        let after = q.enqueue(msg("e1", Some("k"))).await.expect("enqueue");
        assert!(matches!(after, Enqueued::Duplicate { .. }));
        // A second ack of the same receipt is refused.
        assert!(matches!(
            q.ack(&d.receipt).await,
            Err(QueueError::LeaseLost { .. })
        ));
    }

    #[tokio::test]
    async fn claim_skipping_leaves_those_keys_queued() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        q.enqueue(msg("hot1", Some("1042"))).await.expect("enqueue");
        q.enqueue(msg("cold", Some("7"))).await.expect("enqueue");
        q.enqueue(msg("nokey", None)).await.expect("enqueue");
        q.enqueue(msg("hot2", Some("1042"))).await.expect("enqueue");
        let got = q
            .claim_skipping(10, LEASE, &["1042".to_owned()])
            .await
            .expect("claim");
        let ids: Vec<&str> = got.iter().map(|d| d.message.event_id.as_str()).collect();
        assert_eq!(ids, vec!["cold", "nokey"]);
        let rest = q.claim(10, LEASE).await.expect("claim");
        assert_eq!(rest.len(), 2, "the skipped key's messages stayed queued");
    }

    #[tokio::test]
    async fn stats_count_each_state_and_age_the_oldest_visible() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let received = |event: &str, ago_ms: i64| NewMessage {
            received_at_ms: now_ms() - ago_ms,
            ..msg(event, None)
        };
        // Oldest first, as ids are given out.
        for (event, ago) in [("a", 90_000), ("b", 60_000), ("c", 30_000), ("d", 10_000)] {
            q.enqueue(received(event, ago)).await.expect("enqueue");
        }
        let s = q.stats().await.expect("stats");
        assert_eq!((n(s.visible), n(s.in_flight), n(s.delayed)), (4, 0, 0));
        assert!(
            (90_000..100_000).contains(&n(s.oldest_visible_age_ms)),
            "{s:?}"
        );

        // "a" in flight, "b" delayed, "c" dead: the oldest visible is "d".
        let a = q.claim(1, LEASE).await.expect("claim").remove(0);
        let b = q.claim(1, LEASE).await.expect("claim").remove(0);
        let c = q.claim(1, LEASE).await.expect("claim").remove(0);
        q.retry_later(&b.receipt, Duration::from_secs(60), "later")
            .await
            .expect("retry");
        let reason = DeadLetterReason {
            class: "permanent".into(),
            error: "bad payload".into(),
        };
        q.dead_letter(&c.receipt, &reason)
            .await
            .expect("dead-letter");
        let s = q.stats().await.expect("stats");
        assert_eq!(
            (n(s.visible), n(s.in_flight), n(s.delayed)),
            (1, 1, 1),
            "{s:?}"
        );
        assert_eq!((n(s.dead_lettered), n(s.dead_lettered_total)), (1, 1));
        assert!(
            (10_000..20_000).contains(&n(s.oldest_visible_age_ms)),
            "{s:?}"
        );

        q.ack(&a.receipt).await.expect("ack");
        let d = q.claim(1, LEASE).await.expect("claim").remove(0);
        let s = q.stats().await.expect("stats");
        assert_eq!(
            (n(s.visible), n(s.in_flight), n(s.acked_total)),
            (0, 1, 1),
            "{s:?}"
        );
        assert_eq!(n(s.oldest_visible_age_ms), 0, "nothing visible");
        assert_eq!(d.message.event_id, "d");
    }

    /// The counts as a query over every row would give them.
    fn counted(path: &Path) -> (u64, u64, u64, u64) {
        let conn = rusqlite::Connection::open(path).expect("open");
        conn.query_row(
            "SELECT COALESCE(SUM(state = 0 AND visible_at <= ?1), 0),
                    COALESCE(SUM(state = 0 AND visible_at > ?1 AND lease IS NOT NULL), 0),
                    COALESCE(SUM(state = 0 AND visible_at > ?1 AND lease IS NULL), 0),
                    COALESCE(SUM(state = 2), 0)
             FROM messages",
            [now_ms()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .expect("count")
    }

    #[tokio::test]
    async fn kept_counts_match_counting_every_row_through_every_operation() {
        // With acked rows kept for dedup, and deleted at once.
        for dedup_window_secs in [EmbeddedConfig::default().dedup_window_secs, 0] {
            counts_match_through_every_operation(dedup_window_secs).await;
        }
    }

    async fn counts_match_through_every_operation(dedup_window_secs: u64) {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        let config = |dir: &Path| EmbeddedConfig {
            dedup_window_secs,
            ..config(dir)
        };
        let mut q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut held: Vec<Delivery> = Vec::new();
        let reason = DeadLetterReason {
            class: "permanent".into(),
            error: "bad".into(),
        };
        for step in 0..400 {
            match rng.random_range(0..10) {
                // New events, and now and then one already known.
                0..=2 => {
                    let event = format!("e{}", rng.random_range(0..150));
                    q.enqueue(msg(&event, None)).await.expect("enqueue");
                }
                3 => held.extend(q.claim(3, LEASE).await.expect("claim")),
                4..=8 if !held.is_empty() => {
                    let d = held.swap_remove(rng.random_range(0..held.len()));
                    match rng.random_range(0..5) {
                        0 => q.ack(&d.receipt).await.expect("ack"),
                        1 => q
                            .retry_later(&d.receipt, Duration::from_secs(60), "later")
                            .await
                            .expect("retry"),
                        2 => q
                            .release(&d.receipt, Duration::ZERO)
                            .await
                            .expect("release"),
                        3 => q.dead_letter(&d.receipt, &reason).await.expect("dlq"),
                        _ => q
                            .retry_later(&d.receipt, Duration::ZERO, "now")
                            .await
                            .expect("retry"),
                    }
                }
                9 => {
                    if rng.random_bool(0.5) {
                        q.dlq_replay(&[], 3, 5).await.expect("replay");
                    } else {
                        q.dlq_purge(&[]).await.expect("purge");
                    }
                }
                _ => {}
            }
            if step == 200 {
                // The count survives a reopen (held receipts stay valid:
                // their leases are in the store).
                drop(q);
                q = EmbeddedQueue::open(&config(dir.path())).expect("reopen");
            }
            let s = q.stats().await.expect("stats");
            assert_eq!(
                (
                    n(s.visible),
                    n(s.in_flight),
                    n(s.delayed),
                    n(s.dead_lettered)
                ),
                counted(&path),
                "after step {step}"
            );
        }
    }

    #[tokio::test]
    async fn a_wrong_pending_count_is_counted_afresh_when_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        {
            let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
            for i in 0..5 {
                q.enqueue(msg(&format!("e{i}"), None))
                    .await
                    .expect("enqueue");
            }
            let d = q.claim(1, LEASE).await.expect("claim").remove(0);
            q.ack(&d.receipt).await.expect("ack");
        }
        // As a store written by a binary that did not keep the count.
        rusqlite::Connection::open(&path)
            .expect("open")
            .execute("UPDATE counters SET value = 99 WHERE name = 'pending'", [])
            .expect("spoil");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("reopen");
        assert_eq!(q.stats().await.expect("stats").visible.expect("counted"), 4);
        q.enqueue(msg("e9", None)).await.expect("enqueue");
        assert_eq!(q.stats().await.expect("stats").visible.expect("counted"), 5);
    }

    #[tokio::test]
    async fn retry_counts_attempts_release_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        q.enqueue(msg("e1", None)).await.expect("enqueue");
        let d = q.claim(1, LEASE).await.expect("claim").remove(0);
        q.retry_later(&d.receipt, Duration::ZERO, "lock timeout")
            .await
            .expect("retry");
        let d = q.claim(1, LEASE).await.expect("claim").remove(0);
        assert_eq!(d.message.attempts, 1);
        assert_eq!(d.message.receives, 2);
        q.release(&d.receipt, Duration::ZERO)
            .await
            .expect("release");
        let d = q.claim(1, LEASE).await.expect("claim").remove(0);
        assert_eq!(d.message.attempts, 1, "release does not count an attempt");
        assert_eq!(d.message.receives, 2, "release gives the receive back");
        // A delayed message is neither visible nor in flight.
        q.retry_later(&d.receipt, Duration::from_secs(60), "x")
            .await
            .expect("retry");
        let s = q.stats().await.expect("stats");
        assert_eq!((n(s.visible), n(s.in_flight), n(s.delayed)), (0, 0, 1));
        assert!(q.claim(1, LEASE).await.expect("claim").is_empty());
    }

    #[tokio::test]
    async fn expired_lease_makes_message_visible_and_voids_old_receipt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        q.enqueue(msg("e1", None)).await.expect("enqueue");
        let stale = q
            .claim(1, Duration::from_millis(1))
            .await
            .expect("claim")
            .remove(0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fresh = q.claim(1, LEASE).await.expect("claim").remove(0);
        assert_eq!(fresh.message.receives, 2);
        assert!(matches!(
            q.ack(&stale.receipt).await,
            Err(QueueError::LeaseLost { .. })
        ));
        q.ack(&fresh.receipt).await.expect("ack");
    }

    #[tokio::test]
    async fn dead_letter_list_replay_purge() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        q.enqueue(msg("bad", None)).await.expect("enqueue");
        q.enqueue(msg("bad2", None)).await.expect("enqueue");
        for d in q.claim(2, LEASE).await.expect("claim") {
            let reason = DeadLetterReason {
                class: "permanent".into(),
                error: "23505 unique violation".into(),
            };
            q.dead_letter(&d.receipt, &reason).await.expect("dlq");
        }
        let s = q.stats().await.expect("stats");
        assert_eq!((n(s.dead_lettered), n(s.dead_lettered_total)), (2, 2));
        let list = q.dlq_list(&DlqPage::first(10)).await.expect("list");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].class, "permanent");
        assert!(list[0].body.is_none());
        let detail = q.dlq_show(&list[0].id).await.expect("show");
        assert_eq!(detail.body.as_deref(), Some("{\"a\":1}"));

        let replayed = q
            .dlq_replay(&[list[0].id.clone()], 1, 100)
            .await
            .expect("replay");
        assert_eq!(replayed, vec![list[0].id.clone()]);
        let d = q.claim(1, LEASE).await.expect("claim").remove(0);
        assert_eq!(d.message.attempts, 0);
        let reason = DeadLetterReason {
            class: "permanent".into(),
            error: "again".into(),
        };
        q.dead_letter(&d.receipt, &reason).await.expect("dlq");
        // The replay limit stops a loop.
        let again = q.dlq_replay(&[], 1, 100).await.expect("replay");
        assert_eq!(again, vec![list[1].id.clone()], "only the unreplayed one");
        let purged = q.dlq_purge(&[]).await.expect("purge");
        assert_eq!(purged, 1);
    }

    #[tokio::test]
    async fn survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
            for i in 0..50 {
                q.enqueue(msg(&format!("e{i}"), None))
                    .await
                    .expect("enqueue");
            }
        }
        let q = EmbeddedQueue::open(&config(dir.path())).expect("reopen");
        assert_eq!(
            q.stats().await.expect("stats").visible.expect("counted"),
            50
        );
        // The dedup index is rebuilt from the store.
        let again = q.enqueue(msg("e7", None)).await.expect("enqueue");
        assert!(matches!(again, Enqueued::Duplicate { .. }), "{again:?}");
        let new = q.enqueue(msg("e50", None)).await.expect("enqueue");
        assert!(matches!(new, Enqueued::New { .. }), "{new:?}");
    }

    #[tokio::test]
    async fn a_purged_or_forgotten_event_id_is_new_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&EmbeddedConfig {
            // No dedup window: an ack deletes the row at once.
            dedup_window_secs: 0,
            ..config(dir.path())
        })
        .expect("open");
        q.enqueue(msg("acked", None)).await.expect("enqueue");
        q.enqueue(msg("dead", None)).await.expect("enqueue");
        for d in q.claim(10, LEASE).await.expect("claim") {
            if d.message.event_id == "acked" {
                q.ack(&d.receipt).await.expect("ack");
            } else {
                let reason = DeadLetterReason {
                    class: "permanent".into(),
                    error: "bad".into(),
                };
                q.dead_letter(&d.receipt, &reason).await.expect("dlq");
            }
        }
        let dead = q.enqueue(msg("dead", None)).await.expect("enqueue");
        assert!(
            matches!(dead, Enqueued::Duplicate { .. }),
            "in the DLQ: {dead:?}"
        );
        assert_eq!(q.dlq_purge(&[]).await.expect("purge"), 1);
        for event in ["acked", "dead"] {
            let again = q.enqueue(msg(event, None)).await.expect("enqueue");
            assert!(matches!(again, Enqueued::New { .. }), "{event}: {again:?}");
        }
        assert_eq!(q.stats().await.expect("stats").visible.expect("counted"), 2);
    }

    #[tokio::test]
    async fn a_store_with_the_old_unique_constraint_still_deduplicates() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            // The table as stores created before the in-memory index have it.
            let conn = rusqlite::Connection::open(dir.path().join(FILE_NAME)).expect("db");
            conn.execute_batch(
                "CREATE TABLE messages (
                    id INTEGER PRIMARY KEY, source TEXT NOT NULL, event_id TEXT NOT NULL,
                    entity_key TEXT, headers TEXT NOT NULL, body BLOB,
                    received_at INTEGER NOT NULL, state INTEGER NOT NULL DEFAULT 0,
                    visible_at INTEGER NOT NULL, lease INTEGER,
                    attempts INTEGER NOT NULL DEFAULT 0, receives INTEGER NOT NULL DEFAULT 0,
                    replays INTEGER NOT NULL DEFAULT 0, error_class TEXT, last_error TEXT,
                    settled_at INTEGER, UNIQUE (source, event_id));
                 INSERT INTO messages (source, event_id, headers, body, received_at, visible_at)
                    VALUES ('s', 'old', '[]', x'00', 1, 1);",
            )
            .expect("old schema");
        }
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let old = q.enqueue(msg("old", None)).await.expect("enqueue");
        assert!(matches!(old, Enqueued::Duplicate { .. }), "{old:?}");
        let new = q.enqueue(msg("new", None)).await.expect("enqueue");
        assert!(matches!(new, Enqueued::New { .. }), "{new:?}");
        assert_eq!(q.stats().await.expect("stats").visible.expect("counted"), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wal_stays_bounded_under_continuous_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let body = bytes::Bytes::from(vec![b'x'; 2048]);
        // 30,000 x 2 KiB: about 60 MB of frames if the WAL never restarted.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..30_000 {
            let (q, body) = (q.clone(), body.clone());
            tasks.spawn(async move {
                let mut m = msg(&format!("e{i}"), None);
                m.body = body;
                q.enqueue(m).await
            });
            if tasks.len() >= 64 {
                tasks
                    .join_next()
                    .await
                    .expect("task")
                    .expect("join")
                    .expect("enqueue");
            }
        }
        while let Some(t) = tasks.join_next().await {
            t.expect("join").expect("enqueue");
        }
        let wal = dir.path().join(format!("{FILE_NAME}-wal"));
        let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert!(size < 40 << 20, "the WAL grew to {} MB", size >> 20);
        assert_eq!(
            q.stats().await.expect("stats").visible.expect("counted"),
            30_000
        );
    }

    /// A full duplicate index misses duplicates (queued again, for the
    /// inbox to apply once) and never invents one.
    #[tokio::test]
    async fn a_full_dedup_index_misses_duplicates_and_never_invents_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&EmbeddedConfig {
            dedup_index_max: 256,
            ..config(dir.path())
        })
        .expect("open");
        for i in 0..2_000 {
            let r = q
                .enqueue(msg(&format!("e{i}"), None))
                .await
                .expect("enqueue");
            assert!(matches!(r, Enqueued::New { .. }), "e{i}: {r:?}");
        }
        let mut duplicates = 0;
        for i in 0..2_000 {
            if let Enqueued::Duplicate { .. } = q
                .enqueue(msg(&format!("e{i}"), None))
                .await
                .expect("enqueue")
            {
                duplicates += 1;
            }
        }
        assert!(
            (1..=256).contains(&duplicates),
            "{duplicates} recognised with an index of 256"
        );
    }

    #[tokio::test]
    async fn past_the_byte_ceiling_an_enqueue_is_refused_as_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&EmbeddedConfig {
            max_pending_bytes: 64,
            ..config(dir.path())
        })
        .expect("open");
        let mut big = msg("big", None);
        big.body = Bytes::from(vec![b'x'; 100]);
        assert!(matches!(q.enqueue(big).await, Err(QueueError::Full { .. })));
        // A small one fits, and the budget is given back once it is taken.
        q.enqueue(msg("small", None)).await.expect("fits");
        q.enqueue(msg("small2", None)).await.expect("fits again");
        assert_eq!(q.budget.used(), 0);
        assert_eq!(n(q.stats().await.expect("stats").visible), 2);
    }

    #[tokio::test]
    async fn concurrent_enqueues_share_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = EmbeddedQueue::open(&config(dir.path())).expect("open");
        let tasks: Vec<_> = (0..500)
            .map(|i| {
                let q = q.clone();
                tokio::spawn(async move { q.enqueue(msg(&format!("e{i}"), None)).await })
            })
            .collect();
        for t in tasks {
            assert!(matches!(
                t.await.expect("join").expect("enqueue"),
                Enqueued::New { .. }
            ));
        }
        assert_eq!(
            q.stats().await.expect("stats").visible.expect("counted"),
            500
        );
    }
}
