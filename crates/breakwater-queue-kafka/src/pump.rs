//! The workers' consumer and what it has fetched. One thread per process
//! polls the group consumer all the time, paused or not, so the consumer
//! stays a member of its group however long the breaker is open (no
//! handler ever blocks past `max.poll.interval.ms`), and it alone calls
//! `pause`, `resume` and `commit`. Claims take from its buffer.
//!
//! - **Fetched** records wait in [`State::buffered`] until claimed; a
//!   retry tier's record whose time has not come waits in
//!   [`State::waiting`] (its partition pauses past [`TIER_HOLD`] of them).
//! - **Flow**: after every batch of records, and whenever the breaker or
//!   an assignment changed, the [`Gate`] says which partitions flow, and
//!   the difference is applied.
//! - **Rebalance**: a revoked partition commits what it finished and drops
//!   what this process holds of it (its claims answer `LeaseLost`; the new
//!   owner reads from the commit); an assigned one starts paused or
//!   flowing as the gate says, so a partition assigned while the breaker is
//!   open never starts flowing.
//! - **Commits**, every `commit_interval_ms`, go up to the lowest
//!   unfinished offset of each partition ([`PartitionOffsets`]).

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A tier partition's records waiting for their time, by (due, offset).
pub(crate) type Waiting = BTreeMap<(i64, i64), Polled>;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use breakwater_queue::KeyOrder;
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{Notify, watch};

use crate::gate::{Gate, TIER_HOLD, Tp};
use crate::keys::KeyLines;
use crate::names::Names;
use crate::offsets::PartitionOffsets;
use crate::polled::Polled;
use crate::wire::{self, Foreign};

/// Longest one poll waits for a record.
const POLL_WAIT: Duration = Duration::from_millis(10);
/// Most records taken from the consumer under one lock.
const POLL_BATCH: usize = 256;
/// Records waiting behind their key's head weigh this much less in the
/// fetch window than records that may be claimed: a held key's backlog
/// does not pause the partitions (and the other keys on them) until it is
/// this many windows long.
const BEHIND_SHARE: usize = 16;

/// What a process holds of one partition and has not handed out, for the
/// stats.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Held {
    /// Fetched and claimable, or waiting behind its key's head.
    pub(crate) ready: u64,
    /// A tier's records waiting for their time.
    pub(crate) waiting: u64,
    /// Retries and delayed releases waiting here (key order).
    pub(crate) here: u64,
}

/// A claimed record.
pub(crate) struct Claimed {
    pub(crate) polled: Polled,
    pub(crate) deadline: Instant,
}

/// What the pump and the claims share.
pub(crate) struct State {
    pub(crate) gate: Gate,
    /// The assigned partitions, with their offsets.
    pub(crate) offsets: BTreeMap<Tp, PartitionOffsets>,
    /// Whether each partition is paused at the consumer, as last applied
    /// (absent: unknown, applied again).
    paused_at: HashMap<Tp, bool>,
    pub(crate) buffered: VecDeque<Polled>,
    /// Tier records whose time has not come, per partition, soonest first.
    pub(crate) waiting: HashMap<Tp, Waiting>,
    pub(crate) outstanding: HashMap<u64, Claimed>,
    /// With key order: the key lines ([`KeyLines`]).
    pub(crate) lines: Option<KeyLines>,
    /// With key order: retries and delayed releases of keyed records,
    /// waiting here (unfinished, their key held) by (due, claim).
    pub(crate) here: BTreeMap<(i64, u64), Polled>,
    pub(crate) next_claim: u64,
    /// The flow generation asked for; the pump publishes the one applied.
    pub(crate) wanted: u64,
    /// Something changed that the gate must look at again.
    pub(crate) dirty: bool,
}

impl State {
    pub(crate) fn new(max_fetched: usize, key_order: KeyOrder) -> Self {
        Self {
            gate: Gate::new(max_fetched),
            offsets: BTreeMap::new(),
            paused_at: HashMap::new(),
            buffered: VecDeque::new(),
            waiting: HashMap::new(),
            outstanding: HashMap::new(),
            lines: (key_order == KeyOrder::Key).then(KeyLines::default),
            here: BTreeMap::new(),
            next_claim: 1,
            wanted: 0,
            dirty: true,
        }
    }

    /// Messages fetched and not claimed: what the window bounds (those
    /// behind their key's head at [`BEHIND_SHARE`]). Claims are bounded by
    /// the workers (running, and held behind their key); retries waiting
    /// for their time by [`TIER_HOLD`] per tier partition, or here by the
    /// keys held.
    fn held(&self) -> usize {
        let behind = self.lines.as_ref().map_or(0, KeyLines::behind_len);
        self.buffered.len() + behind / BEHIND_SHARE
    }

    /// A record that may be handed out once its key lets it.
    fn buffer(&mut self, p: Polled) {
        let p = match self.lines.as_mut() {
            Some(lines) => lines.admit(p),
            None => Some(p),
        };
        if let Some(p) = p {
            self.buffered.push_back(p);
        }
    }

    /// A record from the consumer; false when it is dropped (a partition no
    /// longer assigned, a record taken already).
    fn accept(&mut self, polled: Polled, now_ms: i64) -> bool {
        let Some(offsets) = self.offsets.get_mut(&polled.tp) else {
            return false;
        };
        if !offsets.take(polled.offset) {
            return false;
        }
        let due = polled.due_at_ms();
        if polled.tp.0.is_tier() && due > now_ms {
            self.waiting
                .entry(polled.tp)
                .or_default()
                .insert((due, polled.offset), polled);
            self.dirty = true;
        } else {
            self.buffer(polled);
        }
        true
    }

    /// Moves the tier records, and the records held here, whose time has
    /// come to the buffer (those held here at its front: each is its key's
    /// head).
    fn release_due(&mut self, now_ms: i64) -> bool {
        let mut due = Vec::new();
        for waiting in self.waiting.values_mut() {
            while waiting
                .first_key_value()
                .is_some_and(|((due, _), _)| *due <= now_ms)
            {
                due.extend(waiting.pop_first().map(|(_, p)| p));
            }
        }
        let mut moved = !due.is_empty();
        for p in due {
            self.buffer(p);
        }
        while self
            .here
            .first_key_value()
            .is_some_and(|((due, _), _)| *due <= now_ms)
        {
            if let Some((_, p)) = self.here.pop_first() {
                self.buffered.push_front(p);
                moved = true;
            }
        }
        if moved {
            self.dirty = true;
        }
        moved
    }

    /// The record at `offset` of `tp` is done with.
    pub(crate) fn finish(&mut self, tp: Tp, offset: i64) {
        if let Some(o) = self.offsets.get_mut(&tp) {
            o.finish(offset);
        }
    }

    /// A claimed record is done with (applied, dead-lettered, moved to a
    /// retry tier): the next record of its key may be handed out.
    pub(crate) fn finish_claimed(&mut self, p: &Polled) {
        self.finish(p.tp, p.offset);
        if let Some(next) = self.lines.as_mut().and_then(|l| l.finish(p)) {
            self.buffered.push_front(next);
        }
        self.dirty = true;
    }

    /// With key order, whether `p` waits here for a retry or a delayed
    /// release rather than on a retry tier: it has a key, whose later
    /// records must wait for it.
    pub(crate) fn holds_here(&self, p: &Polled) -> bool {
        self.lines.is_some() && p.entity_key().is_some()
    }

    /// What this process holds of each partition, not claimed, counted in
    /// one pass (for the stats).
    pub(crate) fn held_by_partition(&self) -> HashMap<Tp, Held> {
        let mut held: HashMap<Tp, Held> = HashMap::new();
        let behind = self.lines.iter().flat_map(KeyLines::behind);
        for p in self.buffered.iter().chain(behind) {
            held.entry(p.tp).or_default().ready += 1;
        }
        for (tp, waiting) in &self.waiting {
            held.entry(*tp).or_default().waiting += waiting.len() as u64;
        }
        for p in self.here.values() {
            held.entry(p.tp).or_default().here += 1;
        }
        held
    }

    /// Drops what this process holds of `revoked`; returns the positions
    /// to commit for them.
    fn revoke(&mut self, revoked: &[Tp]) -> Vec<(Tp, i64)> {
        let commits = revoked
            .iter()
            .filter_map(|tp| {
                let position = self.offsets.remove(tp)?.position()?;
                Some((*tp, position))
            })
            .collect();
        for tp in revoked {
            self.paused_at.remove(tp);
            self.waiting.remove(tp);
        }
        self.buffered.retain(|p| !revoked.contains(&p.tp));
        self.outstanding
            .retain(|_, c| !revoked.contains(&c.polled.tp));
        self.here.retain(|_, p| !revoked.contains(&p.tp));
        let heads = self
            .lines
            .as_mut()
            .map(|l| l.revoke(revoked))
            .unwrap_or_default();
        self.buffered.extend(heads);
        self.dirty = true;
        commits
    }

    fn assign(&mut self, assigned: &[Tp]) {
        for tp in assigned {
            self.offsets.entry(*tp).or_default();
            // Pause state after an assignment is the client's: apply ours.
            self.paused_at.remove(tp);
        }
        self.dirty = true;
    }

    /// The partitions to pause and to resume so the consumer matches the
    /// gate.
    fn reconcile(&mut self) -> (Vec<Tp>, Vec<Tp>) {
        self.dirty = false;
        let assigned: Vec<Tp> = self.offsets.keys().copied().collect();
        let held = self.held();
        let waiting = &self.waiting;
        let flowing = self.gate.flowing(&assigned, held, |tp| {
            waiting.get(&tp).is_some_and(|w| w.len() >= TIER_HOLD)
        });
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for tp in assigned {
            let paused = flowing.binary_search(&tp).is_err();
            if self.paused_at.get(&tp) != Some(&paused) {
                if paused {
                    pause.push(tp);
                } else {
                    resume.push(tp);
                }
                self.paused_at.insert(tp, paused);
            }
        }
        (pause, resume)
    }

    fn to_commit(&self) -> Vec<(Tp, i64)> {
        self.offsets
            .iter()
            .filter_map(|(tp, o)| Some((*tp, o.to_commit()?)))
            .collect()
    }

    fn committed(&mut self, commits: &[(Tp, i64)]) {
        for (tp, position) in commits {
            if let Some(o) = self.offsets.get_mut(tp) {
                o.committed(*position);
            }
        }
    }
}

/// What the pump thread, the rebalance callbacks and the claims share.
pub(crate) struct Shared {
    pub(crate) names: Names,
    state: Mutex<State>,
    /// A record came into the buffer.
    pub(crate) arrived: Notify,
    /// Moves when records came into the buffer, for the workers'
    /// dispatcher ([`breakwater_queue::Queue::arrivals`]).
    pub(crate) arrivals: watch::Sender<u64>,
    /// A claim of this process was settled.
    pub(crate) settled: Notify,
    /// The flow generation the consumer's partitions follow.
    pub(crate) applied: watch::Sender<u64>,
    /// Records taken from the broker since the queue was opened.
    pub(crate) fetched: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    pub(crate) fn new(names: Names, max_fetched: usize, key_order: KeyOrder) -> Self {
        Self {
            names,
            state: Mutex::new(State::new(max_fetched, key_order)),
            arrived: Notify::new(),
            arrivals: watch::channel(0).0,
            settled: Notify::new(),
            applied: watch::channel(0).0,
            fetched: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn tps(&self, tpl: &TopicPartitionList) -> Vec<Tp> {
        tpl.elements()
            .iter()
            .filter_map(|e| Some((self.names.ix(e.topic())?, e.partition())))
            .collect()
    }

    fn tpl(&self, tps: &[Tp]) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (ix, p) in tps {
            tpl.add_partition(self.names.topic(*ix), *p);
        }
        tpl
    }

    fn commit_tpl(&self, commits: &[(Tp, i64)]) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for ((ix, p), position) in commits {
            let _ = tpl.add_partition_offset(self.names.topic(*ix), *p, Offset::Offset(*position));
        }
        tpl
    }

    /// Applies the gate to the consumer (pump thread only).
    fn apply_gate<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, st: &mut State) {
        let (pause, resume) = st.reconcile();
        for (tps, pausing) in [(pause, true), (resume, false)] {
            if tps.is_empty() {
                continue;
            }
            let tpl = self.tpl(&tps);
            let done = if pausing {
                consumer.pause(&tpl)
            } else {
                consumer.resume(&tpl)
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, pausing, "kafka: cannot pause or resume partitions; trying again");
                for tp in &tps {
                    st.paused_at.remove(tp);
                }
                st.dirty = true;
            }
        }
    }
}

/// The group consumer's context: the rebalance callbacks.
pub(crate) struct PumpContext {
    pub(crate) shared: Arc<Shared>,
}

impl ClientContext for PumpContext {}

impl ConsumerContext for PumpContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let revoked = self.shared.tps(tpl);
                let commits = self.shared.state().revoke(&revoked);
                tracing::info!(partitions = revoked.len(), "kafka: partitions revoked");
                if commits.is_empty() || consumer.assignment_lost() {
                    return;
                }
                if let Err(e) = consumer.commit(&self.shared.commit_tpl(&commits), CommitMode::Sync)
                {
                    tracing::warn!(error = %e, "kafka: cannot commit revoked partitions; their records will be read again");
                }
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "kafka: rebalance failed"),
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let assigned = self.shared.tps(tpl);
            tracing::info!(partitions = assigned.len(), "kafka: partitions assigned");
            let mut st = self.shared.state();
            st.assign(&assigned);
            // At once: a partition assigned while the breaker is open must
            // not start flowing.
            self.shared.apply_gate(consumer, &mut st);
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn polled(shared: &Shared, m: &rdkafka::message::BorrowedMessage<'_>) -> Option<Polled> {
    let ix = shared.names.ix(m.topic())?;
    let body = m.payload().unwrap_or_default();
    let read = match m.headers() {
        Some(h) => wire::read(h.iter().map(|h| (h.key, h.value)), body),
        None => Err(Foreign::NoMeta),
    };
    Some(Polled {
        tp: (ix, m.partition()),
        offset: m.offset(),
        read,
        body: Bytes::copy_from_slice(body),
        timestamp_ms: m.timestamp().to_millis(),
    })
}

/// The pump thread: polls until told to stop, then commits what is
/// finished and leaves the group.
pub(crate) fn run(
    consumer: BaseConsumer<PumpContext>,
    shared: Arc<Shared>,
    commit_every: Duration,
) {
    let mut last_commit = Instant::now();
    let mut batch = Vec::with_capacity(POLL_BATCH);
    while !shared.stopping() {
        let mut wait = POLL_WAIT;
        while batch.len() < POLL_BATCH {
            match consumer.poll(wait) {
                Some(Ok(m)) => batch.extend(polled(&shared, &m)),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "kafka: consumer error");
                    break;
                }
                None => break,
            }
            wait = Duration::ZERO;
        }
        let now = now_ms();
        let mut st = shared.state();
        let mut arrived = false;
        let mut taken = 0;
        for p in batch.drain(..) {
            if st.accept(p, now) {
                taken += 1;
            }
        }
        arrived |= taken > 0;
        shared.fetched.fetch_add(taken, Ordering::Relaxed);
        arrived |= st.release_due(now);
        let wanted = st.wanted;
        st.dirty |= arrived;
        if st.dirty {
            shared.apply_gate(&consumer, &mut st);
        }
        let commits = if last_commit.elapsed() >= commit_every {
            last_commit = Instant::now();
            st.to_commit()
        } else {
            Vec::new()
        };
        drop(st);
        shared.applied.send_replace(wanted);
        if arrived {
            shared.arrived.notify_waiters();
            shared.arrivals.send_modify(|n| *n = n.wrapping_add(1));
        }
        if !commits.is_empty() {
            match consumer.commit(&shared.commit_tpl(&commits), CommitMode::Async) {
                Ok(()) => shared.state().committed(&commits),
                Err(e) => tracing::warn!(error = %e, "kafka: cannot commit offsets"),
            }
        }
    }
    let commits = shared.state().to_commit();
    if !commits.is_empty() {
        let _ = consumer.commit(&shared.commit_tpl(&commits), CommitMode::Sync);
    }
    consumer.unsubscribe();
    // Dropping the consumer closes it: it leaves the group now rather
    // than at its session timeout.
}
