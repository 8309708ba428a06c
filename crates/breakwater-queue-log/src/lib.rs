//! The segment-log queue: a single-node backend of the queue contract
//! ([`breakwater_queue::Queue`]) whose hot path costs about what the disk
//! does. `[queue] backend = "log"`.
//!
//! - [`record`]: the framing (`length | crc32c | type | id | payload |
//!   end`) and the records (enqueue, carry, ack, retry, release,
//!   dead-letter, and the dedup file's tombstones).
//! - [`segment`]: preallocated segment files and reading one back, torn
//!   tails and damaged frames included.
//! - [`index`]: what is queued, visible, leased and seen, in memory and
//!   pure (time passed in), rebuilt from the segments at start by
//!   [`recovery`].
//! - [`writer`]: the one thread that appends each group with one write and
//!   one `fdatasync`, replies after it, and reclaims segments.
//! - [`disk`]: the seam between the writer's group writes and the disk.
//! - [`dlq`]: dead letters, in a small SQLite store beside the segments.
//! - [`dedup_file`]: the applied event ids of reclaimed segments, so a
//!   restart still knows them within the dedup window.
//! - [`migrate`]: an embedded SQLite store moved in (`queue migrate`).
//! - [`private`]: every file the store creates is `0600`, every folder
//!   `0700`, whatever the umask; its own folder is made `0700` at open.
//!
//! One process owns a store at a time (a lock on `lock` in the
//! directory): while `serve` runs, the CLI reaches the queue through the
//! admin API. Work that needs no state (the dedup hash, the record's
//! encoding and checksum) is done on the caller's thread.

mod blanks;
mod cache;
pub mod config;
mod dedup_file;
pub mod disk;
mod dlq;
mod index;
mod lines;
mod migrate;
mod pace;
mod private;
mod record;
mod recovery;
mod segment;
pub mod telemetry;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use breakwater_queue::{
    Backend, Capabilities, ConfigProblem, DeadLetter, DeadLetterReason, Delivery, DlqPage,
    Enqueued, Flow, NewMessage, OpenMode, Queue, QueueError, QueueSection, QueueStats, Receipt,
};
use breakwater_queue_embedded::budget::ByteBudget;
use breakwater_queue_embedded::{ALL_STATS, millis, parse_id, parse_ids};
use tokio::sync::{mpsc, oneshot};

pub use self::config::LogConfig;
use self::disk::GroupDisk;
pub use self::migrate::Migrated;
use self::record::{EncodedMessage, StoredMessage};
/// Zero-fills a file's range a page at a time, so an `fdatasync` after a
/// small write into it writes back a page, not a large folio.
pub use self::segment::zero as zero_fill;
use self::writer::{Incoming, Op, Reply, Settings, Writer};

/// The name `[queue] backend` selects this backend by.
pub const BACKEND_NAME: &str = "log";

/// Added to `queue.db`'s name once [`LogQueue::adopt_embedded_store`] has
/// moved it into the log.
pub const MIGRATED_SUFFIX: &str = ".migrated";

/// File name of the lock that keeps a second process out.
const LOCK_FILE: &str = "lock";

/// The token of a receipt: the message and the lease it was claimed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseToken {
    pub id: u64,
    pub lease: u64,
}

/// The dedup hash of an event: stable across processes and versions
/// (XXH3, 64 bits), since the dedup file keeps it.
pub(crate) fn dedup_hash(source: &str, event_id: &str) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(source.as_bytes());
    h.update(&[0xff]);
    h.update(event_id.as_bytes());
    h.digest()
}

/// The flow window when no flow was set: unbounded.
const UNBOUNDED: u32 = u32::MAX;

/// What opening a store found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// Segment files read.
    pub segments: usize,
    /// Messages queued (not applied, not dead-lettered).
    pub queued: usize,
    /// Records skipped because their checksum failed (each logged).
    pub corrupt_frames: usize,
    /// Bytes after the last whole record of the newest segment, zeroed (a
    /// group cut by a crash before it was acknowledged).
    pub torn_bytes: u64,
}

/// What a store holds, read without its lock and without changing it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    /// (source, event id) of each queued message, by message id.
    pub queued: Vec<(String, String)>,
    /// (source, event id) of each dead letter.
    pub dead: Vec<(String, String)>,
    /// Records skipped because their checksum failed.
    pub corrupt_frames: usize,
}

/// Reads what the store in `dir` holds, for tests and diagnosis: the
/// segments are replayed as at start, but nothing is written and no lock
/// is taken, so it may run beside (or after the death of) its owner.
pub fn inspect(dir: &Path) -> Result<Contents, QueueError> {
    let mut index = index::Index::new(0, usize::MAX, breakwater_queue::KeyOrder::None);
    let mut events = std::collections::BTreeMap::new();
    let now = breakwater_queue_embedded::clock::now_ms();
    let replayed = recovery::replay_segments(dir, &mut index, now, |id, r| {
        if let record::Record::Enqueue(m) | record::Record::Carry(m, _) = r {
            events.insert(id, (m.source.clone(), m.event_id.clone()));
        }
    })?;
    let queued = index
        .ids()
        .filter_map(|id| events.get(&id).cloned())
        .collect();
    let dead = if dir.join(dlq::FILE_NAME).is_file() {
        let conn = rusqlite::Connection::open_with_flags(
            dir.join(dlq::FILE_NAME),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .map_err(storage)?;
        dlq::event_ids(&conn).map_err(storage)?
    } else {
        Vec::new()
    };
    Ok(Contents {
        queued,
        dead,
        corrupt_frames: replayed.corrupt_frames,
    })
}

/// The segment-log queue.
#[derive(Clone)]
pub struct LogQueue {
    report: OpenReport,
    ops: mpsc::Sender<Op>,
    reader: Arc<Mutex<rusqlite::Connection>>,
    path: PathBuf,
    window: Arc<AtomicU32>,
    budget: ByteBudget,
    arrivals: breakwater_queue::Arrivals,
}

impl std::fmt::Debug for LogQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogQueue")
            .field("path", &self.path)
            .finish()
    }
}

fn storage(e: impl std::fmt::Display) -> QueueError {
    QueueError::Storage(e.to_string())
}

impl LogQueue {
    /// Opens (creating if needed) the store under `config.path` and starts
    /// its writer thread; it ends when the last clone is dropped.
    pub fn open(config: &LogConfig) -> Result<Self, QueueError> {
        Self::open_on(config, Arc::new(disk::FileSystem))
    }

    /// [`LogQueue::open`] with the writer's group writes going to `disk`
    /// instead of straight to the file system: the seam a power-loss test
    /// puts a file layer into.
    pub fn open_on(config: &LogConfig, disk: Arc<dyn GroupDisk>) -> Result<Self, QueueError> {
        private::own_dir(&config.path).map_err(|e| {
            QueueError::Storage(format!("cannot create {}: {e}", config.path.display()))
        })?;
        Self::start(config, disk)
    }

    /// Opens the store only if it exists ([`QueueError::Missing`]
    /// otherwise), for read-only commands.
    pub fn open_existing(config: &LogConfig) -> Result<Self, QueueError> {
        let lock = config.path.join(LOCK_FILE);
        if !lock.is_file() {
            return Err(QueueError::Missing {
                location: config.path.display().to_string(),
            });
        }
        Self::start(config, Arc::new(disk::FileSystem))
    }

    fn start(config: &LogConfig, disk: Arc<dyn GroupDisk>) -> Result<Self, QueueError> {
        let dir = config.path.clone();
        let lock = lock(&dir)?;
        let settings = Settings {
            dir: dir.clone(),
            disk,
            max_batch: config.max_batch.max(1),
            segment_bytes: config.segment_bytes.max(config::MIN_SEGMENT_BYTES),
            free_segments: config.free_segments,
            cache_bytes: config.cache_bytes,
        };
        let window_ms = i64::try_from(config.dedup_window_secs)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000);
        let started = std::time::Instant::now();
        let (writer, report) = Writer::open(
            settings,
            window_ms,
            config.dedup_index_max,
            config.key_order,
        )?;
        tracing::info!(
            path = %dir.display(),
            segments = report.segments,
            queued = report.queued,
            corrupt_frames = report.corrupt_frames,
            torn_bytes = report.torn_bytes,
            ms = started.elapsed().as_millis() as u64,
            "queue log opened"
        );
        let reader = dlq::open(&dir).map_err(storage)?;
        let arrivals = writer.arrivals();
        let (tx, rx) = mpsc::channel(config.max_pending.max(1));
        std::thread::Builder::new()
            .name("queue-writer".into())
            .spawn(move || {
                // Held for as long as the writer runs.
                let _lock = lock;
                writer.run(rx);
            })
            .map_err(storage)?;
        Ok(Self {
            report,
            ops: tx,
            reader: Arc::new(Mutex::new(reader)),
            path: dir,
            window: Arc::new(AtomicU32::new(UNBOUNDED)),
            budget: ByteBudget::new(config.max_pending_bytes),
            arrivals,
        })
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What opening the store found.
    pub fn open_report(&self) -> OpenReport {
        self.report
    }

    /// Moves what the embedded SQLite store at `sqlite` (its `queue.db`)
    /// holds into this one (see [`migrate`]), calling `progress` with the
    /// running total after each chunk. The old store is only read.
    pub async fn migrate_from_embedded(
        &self,
        sqlite: &Path,
        mut progress: impl FnMut(&Migrated),
    ) -> Result<Migrated, QueueError> {
        let mut total = Migrated::default();
        let mut chunks = migrate::Chunks::open(sqlite)?;
        while let Some(items) = chunks.next_chunk()? {
            total.add(self.call(|reply| Op::Import { items, reply }).await?);
            progress(&total);
        }
        Ok(total)
    }

    /// Moves in an embedded SQLite store left in this store's directory
    /// (`queue.db`, the store of every release before the log was the
    /// default), then renames it `queue.db.migrated`, so an upgrade
    /// strands nothing and a restart does not move it twice. A migration
    /// cut short leaves `queue.db` in place and is finished at the next
    /// start (what is already in the log is skipped). `None`: nothing to
    /// move.
    pub async fn adopt_embedded_store(&self) -> Result<Option<Migrated>, QueueError> {
        // `queue.db` and its companions, before and after the rename.
        let file = |tail: &str| {
            self.path
                .join(format!("{}{tail}", breakwater_queue_embedded::FILE_NAME))
        };
        let old = file("");
        if !old.is_file() {
            return Ok(None);
        }
        tracing::warn!(
            from = %old.display(),
            "found an embedded SQLite store in the log's directory: moving what it holds into the log"
        );
        let moved = self
            .migrate_from_embedded(&old, |so_far| {
                tracing::info!(
                    queued = so_far.queued,
                    dead = so_far.dead,
                    applied_ids = so_far.applied_ids,
                    "moving the embedded store into the log"
                );
            })
            .await?;
        for suffix in ["", "-wal", "-shm"] {
            let (from, to) = (file(suffix), file(&format!("{MIGRATED_SUFFIX}{suffix}")));
            match std::fs::rename(&from, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !suffix.is_empty() => {}
                Err(e) => {
                    return Err(QueueError::Storage(format!(
                        "moved the embedded store into the log but cannot rename {} to {}: {e}",
                        from.display(),
                        to.display()
                    )));
                }
            }
        }
        tracing::warn!(
            queued = moved.queued,
            dead = moved.dead,
            applied_ids = moved.applied_ids,
            skipped = moved.skipped,
            kept_as = %file(MIGRATED_SUFFIX).display(),
            "the embedded store is in the log; the old file is kept, renamed, and may be deleted"
        );
        Ok(Some(moved))
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Op) -> Result<T, QueueError> {
        let (tx, rx) = oneshot::channel();
        self.ops
            .send(make(tx))
            .await
            .map_err(|_| QueueError::Closed)?;
        rx.await.map_err(|_| QueueError::Closed)?
    }

    /// Visible again after `delay`: a retry (`attempt`) or a release.
    async fn unclaim(
        &self,
        receipt: &Receipt,
        delay: Duration,
        attempt: bool,
    ) -> Result<(), QueueError> {
        let token = lease_token(receipt)?;
        self.call(|reply| Op::Unclaim {
            token,
            delay_ms: millis(delay),
            attempt,
            reply,
        })
        .await
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

/// Takes the store's lock, or says which process holds it.
fn lock(dir: &Path) -> Result<File, QueueError> {
    let path = dir.join(LOCK_FILE);
    let file = private::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| QueueError::Storage(format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(QueueError::Storage(format!(
            "the queue log at {} is open in another process (a running `breakwater serve`?): \
             reach it through the admin API instead",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(QueueError::Storage(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

fn lease_token(receipt: &Receipt) -> Result<LeaseToken, QueueError> {
    receipt
        .token::<LeaseToken>()
        .copied()
        .ok_or(QueueError::ForeignReceipt)
}

#[async_trait]
impl Queue for LogQueue {
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

    /// Moves after each group commit that made new messages durable.
    fn arrivals(&self) -> Option<breakwater_queue::Arrivals> {
        Some(self.arrivals.clone())
    }

    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        let hash = dedup_hash(&message.source, &message.event_id);
        let entity_key = message.entity_key.clone();
        let received_at_ms = message.received_at_ms;
        let stored = StoredMessage {
            source: message.source,
            event_id: message.event_id,
            entity_key: message.entity_key,
            headers: message.headers,
            body: message.body,
            received_at_ms,
        };
        let encoded = EncodedMessage::new(&stored);
        let reserved = self
            .budget
            .reserve(encoded.frame_len())
            .ok_or(QueueError::Full {
                pending: self.ops.max_capacity() - self.ops.capacity(),
            })?;
        let incoming = Incoming {
            hash,
            entity_key,
            received_at_ms,
            encoded,
            queued_at: std::time::Instant::now(),
            _reserved: reserved,
        };
        let (tx, rx) = oneshot::channel();
        self.ops
            .try_send(Op::Enqueue(Box::new(incoming), tx))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => QueueError::Full {
                    pending: self.ops.max_capacity(),
                },
                mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
            })?;
        // The webhook comes back to be freed here, where it was allocated.
        let (enqueued, _incoming) = rx.await.map_err(|_| QueueError::Closed)??;
        Ok(enqueued)
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
        let max = max.min(self.window.load(Ordering::Acquire) as usize);
        if max == 0 {
            return Ok(Vec::new());
        }
        let skip = skip_keys.to_vec();
        self.call(|reply| Op::Claim {
            max,
            lease_ms: millis(lease),
            skip,
            reply,
        })
        .await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), QueueError> {
        let token = lease_token(receipt)?;
        self.call(|reply| Op::Ack { token, reply }).await
    }

    async fn extend_leases(
        &self,
        receipts: &[Receipt],
        lease: Duration,
    ) -> Result<usize, QueueError> {
        let tokens = receipts
            .iter()
            .map(lease_token)
            .collect::<Result<Vec<_>, _>>()?;
        let lease_ms = millis(lease);
        self.call(|reply| Op::Extend {
            tokens,
            lease_ms,
            reply,
        })
        .await
    }

    async fn retry_later(
        &self,
        receipt: &Receipt,
        delay: Duration,
        _error: &str,
    ) -> Result<(), QueueError> {
        self.unclaim(receipt, delay, true).await
    }

    async fn release(&self, receipt: &Receipt, delay: Duration) -> Result<(), QueueError> {
        self.unclaim(receipt, delay, false).await
    }

    async fn dead_letter(
        &self,
        receipt: &Receipt,
        reason: &DeadLetterReason,
    ) -> Result<(), QueueError> {
        let token = lease_token(receipt)?;
        let (class, error) = (reason.class.clone(), reason.error.clone());
        self.call(|reply| Op::DeadLetter {
            token,
            class,
            error,
            reply,
        })
        .await
    }

    async fn set_flow(&self, flow: Flow) -> Result<(), QueueError> {
        self.window.store(flow.window(), Ordering::Release);
        Ok(())
    }

    async fn stats(&self) -> Result<QueueStats, QueueError> {
        self.call(|reply| Op::Stats { reply }).await
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
        self.read(move |c| dlq::list(c, limit, after)).await
    }

    async fn dlq_show(&self, id: &str) -> Result<DeadLetter, QueueError> {
        let n = parse_id(id)?;
        self.read(move |c| dlq::show(c, n))
            .await?
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

/// Builds the log queue from `[queue]`: `backend = "log"`, with the keys
/// of [`LogConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LogBackend;

#[async_trait]
impl Backend for LogBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn check(&self, section: &QueueSection) -> Result<toml::Table, ConfigProblem> {
        breakwater_queue::own_keys_table(&LogConfig::from_section(section)?)
    }

    /// One writer hands out every claim, and each key's line keeps its
    /// head until it is applied or dead-lettered (`lines.rs`).
    fn keeps_key_order(&self, _section: &QueueSection) -> Result<(), String> {
        Ok(())
    }

    async fn open(
        &self,
        section: &QueueSection,
        mode: OpenMode,
    ) -> Result<Arc<dyn Queue>, QueueError> {
        let mut config =
            LogConfig::from_section(section).map_err(|e| QueueError::Storage(e.to_string()))?;
        config.key_order = section.key_order;
        let queue = match mode {
            OpenMode::Serve => {
                let queue = LogQueue::open(&config)?;
                queue.adopt_embedded_store().await?;
                queue
            }
            OpenMode::Inspect => LogQueue::open_existing(&config)?,
        };
        Ok(Arc::new(queue))
    }
}
