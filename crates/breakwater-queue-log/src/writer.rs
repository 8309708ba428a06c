//! The log's one writer thread: it owns the [`Index`], the current
//! segment and the dead-letter store's writing connection, and turns each
//! group of operations (whatever has queued, no linger) into one
//! positioned write of their records and,
//! when the group holds an enqueue, a carry or a replay, one
//! `fdatasync`. Every reply waits for its group's write (and sync); an
//! enqueue's `New` therefore means on disk. Acks, retries and releases
//! ride along and become durable with the next synced group: losing one
//! to a power cut only delivers the message again (at-least-once, the
//! inbox applies it once).
//!
//! After each group it reclaims: while the oldest segment holds nothing
//! live, the dedup hashes of what was applied out of it are appended to
//! the dedup file (synced) and the segment is recycled as the next one
//! when there is no spare yet (renamed, a new header: no zeros written),
//! else kept as a free segment (`free-<index>.log`, up to
//! `free_segments` of them with the blank ones) for a later roll, else
//! deleted. While fewer are kept, blank segments are zero-filled ahead
//! while the writer idles ([`crate::blanks`]). A burst after a drain, or
//! after an idle moment, then writes no zeros until those run out. When
//! the oldest holds only a little (a quarter of a segment or less), its live
//! messages are copied forward as carry records into the current one, a
//! few hundred per group, so a parked or delayed straggler never pins a
//! segment.
//!
//! Without a recycled, free or blank one, the next segment is created
//! (zero-filled, synced) on a thread of its own while the current one
//! fills, so a roll costs the writer no more than a rename would; its
//! zeros are paced to end in about half the time the current segment
//! takes to fill ([`crate::pace`]), so they never crowd the group
//! commits' syncs.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use breakwater_queue::{Delivery, Enqueued, Message, QueueError, QueueStats, Receipt};
use breakwater_queue_embedded::budget::Reserved;
use breakwater_queue_embedded::clock::now_ms;
pub(crate) use breakwater_queue_embedded::writer::Reply;
use breakwater_queue_embedded::writer::{Finish, drain, finish};
use rusqlite::Connection;
use tokio::sync::mpsc;

use crate::blanks::Blanks;
use crate::cache::{CacheWindow, LetGo};
use crate::dedup_file::DedupFile;
use crate::disk::GroupDisk;
use crate::dlq::{self, NewDead};
use crate::index::{Index, Location, Seen};
use crate::migrate::{Imported, Migrated};
use crate::pace::{Pacer, WriterProgress};
use crate::record::{self, CarriedState, EncodedMessage, Record, StoredMessage};
use crate::segment::{self, HEADER_BYTES};
use crate::{LeaseToken, OpenReport, telemetry};

/// A webhook on its way to the writer, encoded and checksummed on the
/// caller's thread.
pub(crate) struct Incoming {
    pub hash: u64,
    pub entity_key: Option<String>,
    pub received_at_ms: i64,
    pub encoded: EncodedMessage,
    pub queued_at: Instant,
    /// Its bytes in the budget of bytes waiting for the writer.
    pub _reserved: Reserved,
}

/// A request to the writer.
pub(crate) enum Op {
    /// The reply hands the webhook back, so the caller's thread, which
    /// allocated it, frees it: freed on the writer, those cross-thread
    /// frees were half of the writer's samples.
    Enqueue(Box<Incoming>, Reply<(Enqueued, Box<Incoming>)>),
    Claim {
        max: usize,
        lease_ms: i64,
        skip: Vec<String>,
        reply: Reply<Vec<Delivery>>,
    },
    Ack {
        token: LeaseToken,
        reply: Reply<()>,
    },
    Extend {
        tokens: Vec<LeaseToken>,
        lease_ms: i64,
        reply: Reply<usize>,
    },
    /// Retry (`attempt`: counts one) or release.
    Unclaim {
        token: LeaseToken,
        delay_ms: i64,
        attempt: bool,
        reply: Reply<()>,
    },
    DeadLetter {
        token: LeaseToken,
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
    Stats {
        reply: Reply<QueueStats>,
    },
    /// Rows of an embedded SQLite store, moved in (`queue migrate`).
    Import {
        items: Vec<Imported>,
        reply: Reply<Migrated>,
    },
}

/// The writer's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub dir: PathBuf,
    /// Where group writes go.
    pub disk: Arc<dyn GroupDisk>,
    pub max_batch: usize,
    pub segment_bytes: u64,
    /// Most segments kept ready: settled ones kept free and blank ones.
    pub free_segments: usize,
    /// Most written bytes left in the page cache ([`CacheWindow`]); 0: no
    /// bound.
    pub cache_bytes: u64,
}

/// Copy forward the oldest segment's live messages when they fill at
/// most 1/`CARRY_BELOW` of a segment.
const CARRY_BELOW: u64 = 4;
/// Most live messages carried forward per group.
const CARRY_PER_GROUP: usize = 256;
/// Bytes of a group's buffer kept for the next group.
const KEEP_BUFFER: usize = 4 << 20;
/// How often applied ids past the dedup window are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(1);
/// A group this slow is logged, with where its time went: about 40 times
/// a full-load group (0.5 ms), as the embedded queue's writer does.
const SLOW: Duration = Duration::from_millis(20);

fn lease_lost(id: u64) -> QueueError {
    QueueError::LeaseLost { id: id.to_string() }
}

fn storage(e: impl std::fmt::Display) -> QueueError {
    QueueError::Storage(e.to_string())
}

/// The records of one group, on their way to the current segment.
#[derive(Default)]
struct Group {
    buf: Vec<u8>,
    /// Where `buf` goes in the current segment.
    start: u64,
    /// Holds something promised durable: sync after the write.
    sync: bool,
    /// Enqueued (or carried, replayed) in this group: undone if the write
    /// fails.
    inserted: Vec<u64>,
    /// Carried forward in this group, and where each lay before: moved
    /// back if the write fails, so a reclaim never deletes the only copy.
    moved: Vec<(u64, Location)>,
    replies: Vec<Finish>,
    /// Dead letters replayed into this group, deleted from the
    /// dead-letter store once it is on disk.
    replayed: Vec<i64>,
}

/// The group being applied: when the writer took it, and the histogram of
/// how long each webhook waited for that.
struct Batch {
    started: Instant,
    waits: metrics::Histogram,
}

/// The segment after the current one.
enum Spare {
    /// Being created on a thread of its own.
    Making(JoinHandle<io::Result<File>>),
    /// Found on disk at start, created (empty) before a restart.
    Ready(File),
}

/// The writer's state.
pub(crate) struct Writer {
    settings: Settings,
    index: Index,
    /// The segment appended to, its file and size.
    current: u64,
    size: u64,
    /// Every segment's file, for reading records back.
    files: HashMap<u64, File>,
    /// Segments of the first format, whose frames are not salted.
    unsalted: HashSet<u64>,
    group: Group,
    spare: Option<(u64, Spare)>,
    /// Settled segments kept for reuse, by their last index, oldest first.
    free: Vec<u64>,
    /// Blank segments made ahead while the writer idles.
    blanks: Blanks,
    /// What of the written data is left in the page cache.
    cache: CacheWindow,
    /// Where the writer is, for pacing the next segment's zeros.
    progress: Arc<WriterProgress>,
    dlq: Connection,
    dlq_count: u64,
    dedup_file: DedupFile,
    next_prune: Instant,
    /// Moves after each group that made new messages durable
    /// ([`breakwater_queue::Queue::arrivals`]).
    arrivals: tokio::sync::watch::Sender<u64>,
}

impl Writer {
    /// Opens the store in `settings.dir`: reads the dedup file and every
    /// segment, zeroes a torn tail, and readies the segment to append to.
    pub(crate) fn open(
        settings: Settings,
        dedup_window_ms: i64,
        dedup_max: usize,
        key_order: breakwater_queue::KeyOrder,
    ) -> Result<(Self, OpenReport), QueueError> {
        let dir = settings.dir.clone();
        let mut index = Index::new(dedup_window_ms, dedup_max, key_order);
        let loaded = crate::dedup_file::load(&dir).map_err(storage)?;
        let now = now_ms();
        let horizon = now.saturating_sub(dedup_window_ms);
        for &(hash, at) in &loaded.tombstones {
            if at >= horizon {
                index.remember_settled(hash, at);
            }
        }
        index.reserve_ids_below(loaded.next_id);
        let replayed = crate::recovery::replay_segments(&dir, &mut index, now, |_, _| {})?;
        let mut opened = OpenReport {
            segments: 0,
            queued: 0,
            corrupt_frames: replayed.corrupt_frames,
            torn_bytes: 0,
        };
        if let Some(s) = replayed.unfinished {
            tracing::warn!(
                segment = s,
                "deleting a queue segment whose creation a crash cut short (it held nothing)"
            );
            std::fs::remove_file(segment::path(&dir, s)).map_err(storage)?;
        }
        let (mut segments, mut last, mut previous) =
            (replayed.segments, replayed.last, replayed.previous);
        let mut files = HashMap::new();
        for &s in &segments {
            files.insert(s, segment::open(&dir, s).map_err(storage)?);
        }
        // A group cut by a crash (never acknowledged) is zeroed, so what is
        // appended after it never runs into its remains.
        for (s, scanned) in last.iter_mut().chain(previous.iter_mut()) {
            if scanned.torn_bytes > 0 {
                tracing::warn!(
                    segment = *s,
                    at = scanned.end,
                    bytes = scanned.torn_bytes,
                    "zeroing the torn tail of a queue segment (a group cut by a crash, never acknowledged)"
                );
                opened.torn_bytes += scanned.torn_bytes;
                let f = files.get(s).ok_or(QueueError::Closed)?;
                segment::zero(f, scanned.end, scanned.end + scanned.torn_bytes).map_err(storage)?;
                f.sync_data().map_err(storage)?;
                scanned.torn_bytes = 0;
            }
        }
        // An empty newest segment after one with room is the spare made
        // ahead of a restart: appends go on in the one before.
        let mut spare = None;
        if let (Some((s, newest)), Some((_, before))) = (&last, &previous) {
            let room = before.size.saturating_sub(before.end) > before.size / 16;
            if newest.end == HEADER_BYTES && room {
                spare = Some(*s);
                last = previous.take();
            }
        }
        let dlq = dlq::open(&dir).map_err(storage)?;
        for (source, event_id) in dlq::event_ids(&dlq).map_err(storage)? {
            index.remember_dead(crate::dedup_hash(&source, &event_id));
        }
        let dlq_count = dlq::count(&dlq).map_err(storage)?;
        index.acked_total = 0;
        index.dead_lettered_total = 0;
        let dedup_file =
            DedupFile::rewrite(&dir, &index.settled(), index.next_id()).map_err(storage)?;
        let (current, end, size) = match last {
            Some((s, scanned)) => (s, scanned.end, scanned.size),
            None => {
                let f = segment::create(&dir, 1, settings.segment_bytes).map_err(storage)?;
                files.insert(1, f);
                index.add_segment(1);
                segments.push(1);
                (1, HEADER_BYTES, settings.segment_bytes)
            }
        };
        opened.segments = segments.len();
        opened.queued = index.len();
        let spare = spare.and_then(|s| {
            files
                .get(&s)?
                .try_clone()
                .ok()
                .map(|f| (s, Spare::Ready(f)))
        });
        let free = keep_free(&settings, current);
        let blanks = Blanks::open(
            &settings.dir,
            settings.segment_bytes,
            settings.free_segments.saturating_sub(free.len()),
        );
        // What recovery read is in the page cache: the window starts with
        // it, oldest first, so a long backlog is let go of at once.
        let mut written: Vec<(u64, u64)> = segments
            .iter()
            .filter(|&&s| s < current)
            .map(|&s| {
                let len = files.get(&s).and_then(|f| f.metadata().ok());
                (s, len.map_or(settings.segment_bytes, |m| m.len()))
            })
            .collect();
        written.sort_unstable();
        let cache = CacheWindow::new(settings.cache_bytes);
        let mut writer = Self {
            settings,
            index,
            current,
            size,
            files,
            unsalted: replayed.unsalted,
            group: Group {
                start: end,
                ..Group::default()
            },
            spare,
            free,
            blanks,
            cache,
            progress: Arc::default(),
            dlq,
            dlq_count,
            dedup_file,
            next_prune: Instant::now() + PRUNE_EVERY,
            arrivals: tokio::sync::watch::channel(0).0,
        };
        for (s, end) in written {
            let behind = writer.cache.wrote(s, end);
            writer.let_go(&behind);
        }
        writer.let_go_behind();
        writer.progress.set(writer.group.start);
        writer.prepare_spare_when_due();
        Ok((writer, opened))
    }

    /// What moves when a group made new messages durable.
    pub(crate) fn arrivals(&self) -> breakwater_queue::Arrivals {
        self.arrivals.subscribe()
    }

    /// Runs until every sender is dropped.
    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        let max_batch = self.settings.max_batch;
        let mut batch: Vec<Op> = Vec::with_capacity(max_batch);
        self.top_up_blanks();
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            self.progress.begin_group();
            // Whatever has queued, no linger: a group costs one write and
            // one fdatasync and next to no CPU, so waiting for company
            // saves little and adds its length to every group. The
            // embedded store's 100 us linger, kept here until 2026-12-07,
            // held a closed loop of 32 connections to 36–48k webhooks/s
            // against 55–65k without it, on a disk whose fdatasync keeps
            // the lean floor at 91–102k (docs/measurements.md, "No linger
            // on the log"). Groups size themselves: what arrives during
            // one group's sync is the next group.
            drain(&mut rx, &mut batch, max_batch);
            let started = Instant::now();
            let ops = batch.len();
            let now = now_ms();
            // Looked up once a group, and each wait measured to the
            // group's start: per webhook, the lookup and a clock read were
            // 3.5% of this thread's samples.
            let batch_of = Batch {
                started,
                waits: metrics::histogram!(
                    breakwater_queue_embedded::telemetry::QUEUE_ENQUEUE_WAIT_SECONDS
                ),
            };
            self.dead_letters(&mut batch, now);
            for op in batch.drain(..) {
                self.apply(op, now, &batch_of);
            }
            self.carry();
            let applied = started.elapsed();
            self.commit();
            self.progress.set(self.group.start);
            let committed = started.elapsed();
            self.prepare_spare_when_due();
            self.reclaim();
            self.top_up_blanks();
            if Instant::now() >= self.next_prune {
                self.index.prune(now_ms());
                self.next_prune = Instant::now() + PRUNE_EVERY;
            }
            let took = started.elapsed();
            if took >= SLOW {
                tracing::warn!(
                    ops,
                    ms = took.as_secs_f64() * 1e3,
                    apply_ms = applied.as_secs_f64() * 1e3,
                    write_ms = (committed - applied).as_secs_f64() * 1e3,
                    reclaim_ms = (took - committed).as_secs_f64() * 1e3,
                    "slow queue group"
                );
            }
            metrics::histogram!(telemetry::QUEUE_COMMIT_SECONDS).record(took.as_secs_f64());
            metrics::histogram!(telemetry::QUEUE_COMMIT_BATCH).record(ops as f64);
        }
        self.commit();
        // The next owner may open the store once this thread lets go of
        // the lock: a segment still being made would look cut short to it.
        self.blanks.stop();
        if let Some((_, Spare::Making(handle))) = self.spare.take() {
            let _ = handle.join();
        }
    }

    /// Writes the dead letters of `batch` to the dead-letter store in one
    /// transaction and takes them out of the log; replies to each.
    fn dead_letters(&mut self, batch: &mut Vec<Op>, now: i64) {
        if !batch.iter().any(|op| matches!(op, Op::DeadLetter { .. })) {
            return;
        }
        let mut rows = Vec::new();
        let mut held = Vec::new();
        let mut rest = Vec::with_capacity(batch.len());
        for op in batch.drain(..) {
            let Op::DeadLetter {
                token,
                class,
                error,
                reply,
            } = op
            else {
                rest.push(op);
                continue;
            };
            let found = self
                .index
                .holding_location(token.id, token.lease)
                .and_then(|loc| self.read(loc).ok());
            match found {
                Some(Record::Enqueue(message) | Record::Carry(message, _)) => {
                    let state = self.index.carried_state(token.id);
                    rows.push(NewDead {
                        message,
                        attempts: state.as_ref().map_or(0, |s| s.attempts),
                        replays: state.as_ref().map_or(0, |s| s.replays),
                        class,
                        error,
                        dead_at_ms: now,
                    });
                    held.push((token, reply));
                }
                _ => drop(reply.send(Err(lease_lost(token.id)))),
            }
        }
        *batch = rest;
        if rows.is_empty() {
            return;
        }
        if let Err(e) = dlq::insert(&mut self.dlq, &rows) {
            tracing::error!(error = %e, "cannot write dead letters: they stay queued");
            for (_, reply) in held {
                drop(reply.send(Err(storage(&e))));
            }
            return;
        }
        self.dlq_count += rows.len() as u64;
        for (token, reply) in held {
            let outcome = self
                .index
                .take_dead(token.id, token.lease)
                .map(|_| ())
                .map_err(|_| lease_lost(token.id));
            if outcome.is_ok() {
                self.append(token.id, &Record::DeadLetter);
            }
            self.group.replies.push(finish(reply, outcome));
        }
    }

    fn apply(&mut self, op: Op, now: i64, batch: &Batch) {
        match op {
            Op::Enqueue(incoming, reply) => self.enqueue(incoming, reply, now, batch),
            Op::Claim {
                max,
                lease_ms,
                skip,
                reply,
            } => {
                let claimed = self.index.claim(max, lease_ms, &skip, now);
                let mut out = Vec::with_capacity(claimed.len());
                for c in claimed {
                    match self.read(c.loc) {
                        Ok(Record::Enqueue(m) | Record::Carry(m, _)) => out.push(Delivery {
                            message: Message {
                                id: c.id.to_string(),
                                source: m.source,
                                event_id: m.event_id,
                                entity_key: m.entity_key,
                                headers: m.headers,
                                body: m.body,
                                received_at_ms: m.received_at_ms,
                                attempts: c.attempts,
                                receives: c.receives,
                            },
                            receipt: Receipt::new(LeaseToken {
                                id: c.id,
                                lease: c.lease,
                            }),
                        }),
                        other => tracing::error!(
                            id = c.id,
                            segment = c.loc.segment,
                            offset = c.loc.offset,
                            found = ?other.map(|r| r.kind()),
                            "a queued message's record cannot be read back"
                        ),
                    }
                }
                self.group.replies.push(finish(reply, Ok(out)));
            }
            Op::Ack { token, reply } => {
                let outcome = self
                    .index
                    .ack(token.id, token.lease, now)
                    .map_err(|_| lease_lost(token.id));
                if outcome.is_ok() {
                    self.append(token.id, &Record::Ack);
                }
                self.group.replies.push(finish(reply, outcome));
            }
            Op::Extend {
                tokens,
                lease_ms,
                reply,
            } => {
                let until = now.saturating_add(lease_ms);
                let n = tokens
                    .iter()
                    .filter(|t| self.index.extend(t.id, t.lease, until))
                    .count();
                self.group.replies.push(finish(reply, Ok(n)));
            }
            Op::Unclaim {
                token,
                delay_ms,
                attempt,
                reply,
            } => {
                let visible_at_ms = now.saturating_add(delay_ms.max(0));
                let outcome = self
                    .index
                    .unclaim(token.id, token.lease, visible_at_ms, attempt)
                    .map_err(|_| lease_lost(token.id));
                if outcome.is_ok() {
                    let record = if attempt {
                        Record::Retry { visible_at_ms }
                    } else {
                        Record::Release { visible_at_ms }
                    };
                    self.append(token.id, &record);
                }
                self.group.replies.push(finish(reply, outcome));
            }
            Op::DeadLetter { token, reply, .. } => {
                // Taken out by `dead_letters` before the batch is applied.
                drop(reply.send(Err(lease_lost(token.id))));
            }
            Op::Replay {
                ids,
                max_replays,
                limit,
                reply,
            } => {
                let outcome = self.replay(&ids, max_replays, limit, now);
                self.group.replies.push(finish(reply, outcome));
            }
            Op::Purge { ids, reply } => {
                let outcome = dlq::delete(&mut self.dlq, &ids, ids.is_empty())
                    .map_err(storage)
                    .map(|gone| {
                        for (source, event_id) in &gone {
                            self.index.forget(crate::dedup_hash(source, event_id));
                        }
                        self.dlq_count = self.dlq_count.saturating_sub(gone.len() as u64);
                        gone.len()
                    });
                self.group.replies.push(finish(reply, outcome));
            }
            Op::Import { items, reply } => {
                let outcome = self.import(items, now);
                self.group.replies.push(finish(reply, outcome));
            }
            Op::Stats { reply } => {
                let mut stats = self.index.stats(now);
                stats.dead_lettered = Some(self.dlq_count);
                self.group.replies.push(finish(reply, Ok(stats)));
            }
        }
    }

    fn enqueue(
        &mut self,
        incoming: Box<Incoming>,
        reply: Reply<(Enqueued, Box<Incoming>)>,
        now: i64,
        batch: &Batch,
    ) {
        batch.waits.record(
            batch
                .started
                .saturating_duration_since(incoming.queued_at)
                .as_secs_f64(),
        );
        if let Some(seen) = self.index.seen(incoming.hash) {
            let id = match seen {
                Seen::Queued(id) => id,
                Seen::Dead | Seen::Settled(_) => 0,
            };
            let id = id.to_string();
            self.group
                .replies
                .push(finish(reply, Ok((Enqueued::Duplicate { id }, incoming))));
            return;
        }
        let len = incoming.encoded.frame_len();
        if let Err(e) = self.make_room(len) {
            drop(reply.send(Err(e)));
            return;
        }
        let id = self.index.take_id();
        let loc = self.location(len);
        let salt = self.salt_of(self.current);
        record::put_enqueue(&mut self.group.buf, id, &incoming.encoded, salt);
        let state = CarriedState {
            attempts: 0,
            replays: 0,
            visible_at_ms: now,
        };
        self.index.insert(
            id,
            loc,
            incoming.entity_key.as_deref(),
            incoming.received_at_ms,
            incoming.hash,
            &state,
        );
        self.group.sync = true;
        self.group.inserted.push(id);
        let id = id.to_string();
        self.group
            .replies
            .push(finish(reply, Ok((Enqueued::New { id }, incoming))));
    }

    fn replay(
        &mut self,
        ids: &[i64],
        max_replays: u32,
        limit: usize,
        now: i64,
    ) -> Result<Vec<i64>, QueueError> {
        let rows = dlq::replayable(&self.dlq, ids, max_replays, limit).map_err(storage)?;
        let mut done = Vec::with_capacity(rows.len());
        for row in rows {
            let state = CarriedState {
                attempts: 0,
                replays: row.replays + 1,
                visible_at_ms: now,
            };
            self.index.forget(row.message.dedup_hash());
            self.queue_carried(row.message, state)?;
            self.group.replayed.push(row.id);
            done.push(row.id);
        }
        Ok(done)
    }

    /// Queues `message` anew in `state` (a replay, an import): a carry
    /// record under a new id, synced with the group.
    fn queue_carried(
        &mut self,
        message: StoredMessage,
        state: CarriedState,
    ) -> Result<(), QueueError> {
        let hash = message.dedup_hash();
        let id = self.index.take_id();
        let record = Record::Carry(message, state);
        let loc = self.push(id, &record)?;
        if let Record::Carry(m, state) = &record {
            let key = m.entity_key.as_deref();
            self.index
                .insert(id, loc, key, m.received_at_ms, hash, state);
        }
        self.group.sync = true;
        self.group.inserted.push(id);
        Ok(())
    }

    /// Moves rows of an embedded store in; an event id already known here
    /// is skipped (a second run of a migration cut short).
    fn import(&mut self, items: Vec<Imported>, now: i64) -> Result<Migrated, QueueError> {
        let mut done = Migrated::default();
        let mut dead = Vec::new();
        let mut applied = Vec::new();
        for item in items {
            let hash = match &item {
                Imported::Queued(m, _) => m.dedup_hash(),
                Imported::Dead(d) => d.message.dedup_hash(),
                Imported::Applied(hash, _) => *hash,
            };
            if self.index.seen(hash).is_some() {
                done.skipped += 1;
                continue;
            }
            match item {
                Imported::Queued(m, state) => {
                    self.queue_carried(m, state)?;
                    done.queued += 1;
                }
                Imported::Dead(d) => dead.push((hash, d)),
                Imported::Applied(hash, at) => {
                    if at >= now.saturating_sub(self.index.dedup_window_ms()) {
                        applied.push((hash, at));
                    }
                }
            }
        }
        if !dead.is_empty() {
            let rows: Vec<NewDead> = dead.iter().map(|(_, d)| d.clone()).collect();
            dlq::insert(&mut self.dlq, &rows).map_err(storage)?;
            for (hash, _) in &dead {
                self.index.remember_dead(*hash);
            }
            self.dlq_count += rows.len() as u64;
            done.dead = rows.len() as u64;
        }
        if !applied.is_empty() {
            self.dedup_file
                .append(applied.clone(), self.index.next_id())
                .map_err(storage)?;
            done.applied_ids = applied.len() as u64;
            for (hash, at) in applied {
                self.index.remember_settled(hash, at);
            }
        }
        Ok(done)
    }

    /// Where a frame of `len` bytes appended now lands.
    fn location(&self, len: usize) -> Location {
        Location {
            segment: self.current,
            offset: self.group.start + self.group.buf.len() as u64,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        }
    }

    /// Appends `record` about `id` to the group (no sync needed for it).
    /// Without room for it, it is dropped: the message is delivered
    /// again, which at-least-once allows.
    fn append(&mut self, id: u64, record: &Record) {
        let _ = self.push(id, record);
    }

    /// Appends `record` about `id` to the group, salted for the segment
    /// it lands in (the next, if the current has no room): where it is.
    fn push(&mut self, id: u64, record: &Record) -> Result<Location, QueueError> {
        let mut frame = Vec::with_capacity(record::HEADER + 8);
        record::put_record(&mut frame, id, record, record::NO_SALT);
        self.make_room(frame.len())?;
        record::salt_frame(&mut frame, self.salt_of(self.current));
        let loc = self.location(frame.len());
        self.group.buf.extend_from_slice(&frame);
        Ok(loc)
    }

    /// The salt of `segment`'s frames.
    fn salt_of(&self, segment: u64) -> u32 {
        if self.unsalted.contains(&segment) {
            record::NO_SALT
        } else {
            record::salt(segment)
        }
    }

    /// Reads back the record at `loc`, from the group not yet written or
    /// from its segment.
    fn read(&self, loc: Location) -> Result<Record, QueueError> {
        let len = loc.len as usize;
        let frame = if loc.segment == self.current && loc.offset >= self.group.start {
            let at = usize::try_from(loc.offset - self.group.start).unwrap_or(usize::MAX);
            self.group
                .buf
                .get(at..at + len)
                .ok_or_else(|| storage("a record past the group's end"))?
                .to_vec()
        } else {
            let file = self
                .files
                .get(&loc.segment)
                .ok_or_else(|| storage(format!("segment {} is gone", loc.segment)))?;
            let mut frame = vec![0u8; len];
            file.read_exact_at(&mut frame, loc.offset)
                .map_err(storage)?;
            frame
        };
        record::decode(&frame, self.salt_of(loc.segment))
            .map(|(_, r, _)| r)
            .map_err(|e| {
                storage(format!(
                    "segment {} offset {}: {e}",
                    loc.segment, loc.offset
                ))
            })
    }

    /// Makes room for a frame of `len` bytes in the current segment:
    /// writes the group so far and moves to the next segment if it does
    /// not fit.
    fn make_room(&mut self, len: usize) -> Result<(), QueueError> {
        let end = self.group.start + self.group.buf.len() as u64 + len as u64;
        if end <= self.size {
            return Ok(());
        }
        self.commit();
        self.roll(len as u64).map_err(|e| {
            tracing::error!(error = %e, "cannot start the queue's next segment");
            QueueError::Storage(format!("cannot start the queue's next segment: {e}"))
        })
    }

    /// Starts creating the segment after the current one once a quarter of
    /// the current one is written: early enough to be ready at the roll
    /// (making 64 MiB takes well under the time 48 MiB of webhooks take to
    /// arrive), late enough that a fresh store's first webhooks do not
    /// sync behind 64 MiB of zeros (a first webhook took over 1 s so on a
    /// busy machine).
    ///
    /// A free segment, when there is one, becomes the spare instead, or
    /// else a blank one ([`crate::blanks`]): renamed and its header
    /// rewritten, no zeros written.
    fn prepare_spare_when_due(&mut self) {
        if self.spare.is_some() || self.group.start < self.size / 4 {
            return;
        }
        let (dir, next, size) = (
            self.settings.dir.clone(),
            self.current + 1,
            self.settings.segment_bytes,
        );
        while let Some(free) = self.free.pop() {
            if !segment::may_reuse(free, next) {
                let _ = std::fs::remove_file(segment::free_path(&dir, free));
                continue;
            }
            match segment::reuse_free(&dir, free, next) {
                Ok(f) => {
                    self.spare = Some((next, Spare::Ready(f)));
                    metrics::counter!(telemetry::QUEUE_SEGMENTS_RECYCLED).increment(1);
                    return;
                }
                // Renamed or not, the file goes: the roll makes the next
                // segment anew if nothing else does.
                Err(e) => {
                    tracing::warn!(error = %e, free, "cannot reuse a free queue segment; deleting it");
                    let _ = std::fs::remove_file(segment::path(&dir, next));
                    let _ = std::fs::remove_file(segment::free_path(&dir, free));
                }
            }
        }
        while let Some(blank) = self.blanks.take() {
            match segment::reuse_blank(&dir, blank, next) {
                Ok(f) => {
                    self.spare = Some((next, Spare::Ready(f)));
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, blank, "cannot use a blank queue segment; deleting it");
                    let _ = std::fs::remove_file(segment::path(&dir, next));
                    let _ = std::fs::remove_file(segment::blank_path(&dir, blank));
                }
            }
        }
        let mut pacer = Pacer::new(Arc::clone(&self.progress), self.size);
        let made = std::thread::Builder::new()
            .name("queue-segment".into())
            .spawn(move || {
                segment::create_paced(&dir, next, size, |took, left| pacer.delay(took, left))
            });
        match made {
            Ok(handle) => self.spare = Some((next, Spare::Making(handle))),
            Err(e) => tracing::warn!(error = %e, "cannot start the segment thread"),
        }
    }

    /// Moves on to the next segment, big enough for a frame of `len`.
    fn roll(&mut self, len: u64) -> io::Result<()> {
        let next = self.current + 1;
        let needed = HEADER_BYTES + len;
        self.progress.hurry();
        let spare = match self.spare.take() {
            Some((index, Spare::Making(handle))) if index == next => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the segment thread panicked"))),
            Some((index, Spare::Ready(file))) if index == next => Ok(file),
            _ => Err(io::Error::other("no spare segment")),
        };
        let (file, size) = match spare {
            Ok(f) if self.settings.segment_bytes >= needed => (f, self.settings.segment_bytes),
            other => {
                if other.is_ok() || segment::path(&self.settings.dir, next).exists() {
                    std::fs::remove_file(segment::path(&self.settings.dir, next))?;
                }
                let size = self.settings.segment_bytes.max(needed);
                (segment::create(&self.settings.dir, next, size)?, size)
            }
        };
        self.files.insert(next, file);
        self.index.add_segment(next);
        self.current = next;
        self.size = size;
        self.group.start = HEADER_BYTES;
        Ok(())
    }

    /// Copies a few of the oldest segment's live messages forward when
    /// little of it is live.
    fn carry(&mut self) {
        let Some((oldest, live, live_bytes)) = self
            .index
            .segments()
            .next()
            .map(|(s, u)| (s, u.live, u.live_bytes))
        else {
            return;
        };
        // An empty oldest is reclaim's; a full one is not worth copying.
        if oldest == self.current
            || live == 0
            || live_bytes * CARRY_BELOW > self.settings.segment_bytes
        {
            return;
        }
        for (id, loc) in self.index.live_in(oldest, CARRY_PER_GROUP) {
            let (Ok(Record::Enqueue(m) | Record::Carry(m, _)), Some(state)) =
                (self.read(loc), self.index.carried_state(id))
            else {
                continue;
            };
            let Ok(loc) = self.push(id, &Record::Carry(m, state)) else {
                return;
            };
            if let Some(before) = self.index.moved(id, loc) {
                self.group.moved.push((id, before));
            }
            self.group.sync = true;
        }
    }

    /// Writes the group (and syncs it when it must), then replies. The
    /// group's buffers are kept for the next one (up to [`KEEP_BUFFER`]).
    fn commit(&mut self) {
        let mut group = std::mem::take(&mut self.group);
        let mut outcome: Result<(), String> = Ok(());
        if !group.buf.is_empty() {
            let written = self
                .files
                .get(&self.current)
                .ok_or_else(|| io::Error::other("the current segment is not open"))
                .and_then(|f| {
                    let disk = &self.settings.disk;
                    disk.write_at(self.current, f, &group.buf, group.start)?;
                    if group.sync {
                        disk.sync_data(self.current, f)
                    } else {
                        Ok(())
                    }
                });
            if let Err(e) = written {
                tracing::error!(error = %e, segment = self.current, "the queue's group write failed");
                outcome = Err(format!("queue write failed: {e}"));
            }
        }
        let start = match &outcome {
            Ok(()) => group.start + group.buf.len() as u64,
            Err(_) => {
                for id in &group.inserted {
                    self.index.discard(*id);
                }
                for &(id, before) in group.moved.iter().rev() {
                    self.index.moved(id, before);
                }
                group.start
            }
        };
        if outcome.is_ok() && !group.replayed.is_empty() {
            match dlq::delete(&mut self.dlq, &group.replayed, false) {
                Ok(gone) => self.dlq_count = self.dlq_count.saturating_sub(gone.len() as u64),
                Err(e) => {
                    tracing::error!(error = %e, "replayed dead letters stay in the dead-letter store as well")
                }
            }
        }
        if outcome.is_ok() && !group.inserted.is_empty() {
            self.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        }
        let written = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for reply in group.replies.drain(..) {
            reply(written);
        }
        group.buf.clear();
        group.buf.shrink_to(KEEP_BUFFER);
        group.inserted.clear();
        group.moved.clear();
        group.replayed.clear();
        group.sync = false;
        group.start = start;
        self.group = group;
        self.let_go_behind();
    }

    /// Lets go of the page cache of what lies more than `cache_bytes`
    /// behind the head ([`CacheWindow`]).
    fn let_go_behind(&mut self) {
        let behind = self.cache.wrote(self.current, self.group.start);
        self.let_go(&behind);
    }

    fn let_go(&self, ranges: &[LetGo]) {
        for r in ranges {
            let Some(f) = self.files.get(&r.segment) else {
                continue;
            };
            if let Err(e) = segment::let_go(f, r.offset, r.len) {
                tracing::debug!(error = %e, segment = r.segment, "cannot let go of a queue segment's page cache");
            }
        }
    }

    /// Makes the settled segment `oldest` the next segment when none is
    /// ready or being made and it has the configured size: renamed, its
    /// header rewritten, no zeros written (its old frames read as the end
    /// of its data: [`segment::recycle`]). Else keeps it free for a later
    /// roll while fewer than `free_segments` are, else deletes it. One
    /// whose page cache was let go of is deleted: writing into it would
    /// read its pages back first ([`crate::cache`]).
    fn recycle_or_delete(&mut self, oldest: u64, file: Option<File>) {
        let dir = self.settings.dir.clone();
        let uncached = self.cache.forget(oldest);
        let full_size = !uncached
            && file
                .and_then(|f| f.metadata().ok())
                .is_some_and(|m| m.len() == self.settings.segment_bytes);
        self.unsalted.remove(&oldest);
        if self.spare.is_none() && full_size {
            let next = self.current + 1;
            match segment::recycle(&dir, oldest, next) {
                Ok(f) => {
                    self.spare = Some((next, Spare::Ready(f)));
                    metrics::counter!(telemetry::QUEUE_SEGMENTS_RECYCLED).increment(1);
                    return;
                }
                // Renamed or not, the roll makes the next segment anew.
                Err(e) => {
                    tracing::warn!(error = %e, segment = oldest, "cannot recycle a reclaimed segment; deleting it");
                }
            }
        } else if full_size && self.free.len() + self.blanks.len() < self.settings.free_segments {
            match segment::retire(&dir, oldest) {
                Ok(()) => {
                    // Newest last: the next roll takes the one whose
                    // earlier lives are the most recent.
                    self.free.push(oldest);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, segment = oldest, "cannot keep a reclaimed segment free; deleting it");
                }
            }
        }
        match std::fs::remove_file(segment::path(&dir, oldest)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(error = %e, segment = oldest, "cannot delete a reclaimed segment");
            }
            _ => {}
        }
    }

    /// Has blank segments made while the writer idles, so that free and
    /// blank ones together number `free_segments`.
    fn top_up_blanks(&mut self) {
        let want = self.settings.free_segments.saturating_sub(self.free.len());
        self.blanks.top_up(want, &self.progress);
    }

    /// Reclaims the oldest segments while nothing in them is live.
    fn reclaim(&mut self) {
        while let Some(oldest) = self.index.oldest_if_empty() {
            if oldest == self.current {
                return;
            }
            let tombstones = self.index.remove_segment(oldest);
            if let Err(e) = self
                .dedup_file
                .append(tombstones.clone(), self.index.next_id())
            {
                tracing::warn!(error = %e, segment = oldest, "cannot write the dedup file: the segment is kept");
                self.index.add_segment(oldest);
                self.index.restore_tombstones(oldest, tombstones);
                return;
            }
            let file = self.files.remove(&oldest);
            self.recycle_or_delete(oldest, file);
            metrics::counter!(telemetry::QUEUE_SEGMENTS_RECLAIMED).increment(1);
        }
        let settled = self.index.settled_len() as u64;
        if self.dedup_file.entries > 2 * settled + 100_000 {
            match DedupFile::rewrite(
                self.dedup_file.dir(),
                &self.index.settled(),
                self.index.next_id(),
            ) {
                Ok(f) => self.dedup_file = f,
                Err(e) => tracing::warn!(error = %e, "cannot rewrite the dedup file"),
            }
        }
    }
}

/// The free segments found in the store at start that may be reused after
/// segment `current`, newest last: the configured size, and last used
/// recently enough that their old frames read as an earlier life
/// ([`segment::may_reuse`]). The rest, and any past `free_segments`, are
/// deleted.
fn keep_free(settings: &Settings, current: u64) -> Vec<u64> {
    let dir = &settings.dir;
    let found = match segment::list_free(dir) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the queue's free segments");
            return Vec::new();
        }
    };
    let mut kept = Vec::new();
    for index in found.into_iter().rev() {
        let path = segment::free_path(dir, index);
        let usable = kept.len() < settings.free_segments
            && segment::may_reuse(index, current)
            && std::fs::metadata(&path).is_ok_and(|m| m.len() == settings.segment_bytes);
        if usable {
            kept.push(index);
        } else if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(error = %e, path = %path.display(), "cannot delete a free queue segment");
        }
    }
    kept.reverse();
    kept
}
