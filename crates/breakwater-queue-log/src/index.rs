//! The log's in-memory indexes: which messages are queued, where their
//! records lie, when each is visible, who holds its lease, which event ids
//! were seen, and how much of each segment is still live. Pure: no I/O,
//! and time is passed in (`now`, Unix milliseconds), so every transition
//! is tested without a disk or a clock.
//!
//! The writer thread owns the one [`Index`]; it changes it as it appends
//! each record, and rebuilds it at start by [`Index::replay`]ing every
//! record of every segment in order. Bodies are not held: a claim reads
//! them back from the segment at the entry's [`Location`].
//!
//! - Queued messages not leased wait in `waiting`, ordered by (visible
//!   at, id): a claim takes from the front what is visible, skipping the
//!   keys it is asked to skip.
//! - With `workers.order = "key"`, a keyed message is in `waiting` or
//!   `leased` only while it is the head of its key's line (`lines.rs`);
//!   the ones behind it sit in neither set until the head leaves the
//!   queue (applied or dead-lettered), so a claim hands one key's
//!   messages out in the order they were accepted.
//! - Leased ones sit in `leased`, ordered by lease expiry. A lease that
//!   ran out moves back to `waiting` at the next claim, keeping its token
//!   until another claim takes the message, so its holder may still
//!   settle or extend it meanwhile (as the SQLite store allows).
//! - The dedup index maps a 64-bit hash of (source, event id) to what was
//!   seen: queued, dead-lettered, or settled (applied) within the dedup
//!   window. It holds at most `dedup_max` entries; past that a new id is
//!   not indexed (a redelivery is queued again and the inbox applies it
//!   once). A hash match is taken as a duplicate: with 5 million ids
//!   indexed, a new event id collides with one of them with probability
//!   about 3 x 10^-13.
//! - No map is one big hash table: growing one rehashes it whole on the
//!   writer thread, and at half a million entries that held a group up for
//!   80 ms. Entries are a B-tree by id (ids rise, so inserts land at its
//!   right edge) and the dedup index is [`SEEN_SHARDS`] hash tables by the
//!   hash's top byte, each growing by itself.
//! - Each segment counts its live messages and their bytes, and keeps the
//!   dedup hashes of the messages settled out of it: the writer reclaims a
//!   segment once nothing in it is live, after writing those hashes to the
//!   dedup file, and copies the last few live ones forward first.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use breakwater_queue::QueueStats;

use breakwater_queue::KeyOrder;

use crate::lines::{Joined, KeyLines, line_of};
use crate::record::{CarriedState, Record, StoredMessage};

/// Where a message's record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

/// What the dedup index knows of an event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Queued as this message.
    Queued(u64),
    /// In the dead-letter store.
    Dead,
    /// Applied (acked) at this time.
    Settled(i64),
}

/// A queued message's index entry.
#[derive(Debug, Clone)]
struct Entry {
    loc: Location,
    key: Option<Box<str>>,
    dedup: u64,
    received_at_ms: i64,
    attempts: u32,
    receives: u32,
    replays: u32,
    /// When it is visible; while leased, when the lease runs out.
    visible_at_ms: i64,
    /// The token of its latest claim, while that claim may settle it.
    lease: Option<u64>,
    place: Place,
    /// Its key's line, when the index keeps key order.
    line: Option<u64>,
}

/// Which set holds a queued message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Waiting,
    Leased,
    /// Behind an earlier message of its key, in no set.
    Behind,
}

/// A claimed message, for the writer to read back and hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimed {
    pub id: u64,
    pub loc: Location,
    pub attempts: u32,
    pub receives: u32,
    pub lease: u64,
}

/// A message taken out of the log for the dead-letter store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub loc: Location,
    pub attempts: u32,
    pub replays: u32,
}

/// The receipt does not hold the message's current lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseLost;

/// A segment's live part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SegmentUse {
    pub live: u64,
    pub live_bytes: u64,
    /// Dedup hashes (and when settled) of messages applied out of it.
    pub tombstones: Vec<(u64, i64)>,
}

/// Hash tables of the dedup index.
pub(crate) const SEEN_SHARDS: usize = 256;

/// The dedup index: hash tables by the top byte of the (already uniform)
/// hash, so no single table is ever rehashed whole at once.
#[derive(Debug)]
struct SeenMap {
    shards: Vec<HashMap<u64, Seen>>,
    len: usize,
}

impl SeenMap {
    fn new() -> Self {
        Self {
            shards: (0..SEEN_SHARDS).map(|_| HashMap::new()).collect(),
            len: 0,
        }
    }

    fn shard(&self, hash: u64) -> usize {
        (hash >> 56) as usize % SEEN_SHARDS
    }

    fn get(&self, hash: &u64) -> Option<&Seen> {
        self.shards[self.shard(*hash)].get(hash)
    }

    fn contains_key(&self, hash: &u64) -> bool {
        self.get(hash).is_some()
    }

    fn insert(&mut self, hash: u64, seen: Seen) {
        let i = self.shard(hash);
        if self.shards[i].insert(hash, seen).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, hash: &u64) {
        let i = self.shard(*hash);
        if self.shards[i].remove(hash).is_some() {
            self.len -= 1;
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The indexes (see the module doc).
#[derive(Debug)]
pub(crate) struct Index {
    entries: BTreeMap<u64, Entry>,
    waiting: BTreeSet<(i64, u64)>,
    leased: BTreeSet<(i64, u64)>,
    /// Per entity key, its queued ids; `None` when key order is off.
    lines: Option<KeyLines>,
    seen: SeenMap,
    /// Settled entries of `seen` in the order they expire.
    expiry: VecDeque<(i64, u64)>,
    segments: BTreeMap<u64, SegmentUse>,
    dedup_window_ms: i64,
    dedup_max: usize,
    next_id: u64,
    next_lease: u64,
    pub acked_total: u64,
    pub dead_lettered_total: u64,
}

impl Index {
    /// An empty index remembering applied event ids for `dedup_window_ms`
    /// (0: not at all), at most `dedup_max` of them, keeping `order`.
    pub(crate) fn new(dedup_window_ms: i64, dedup_max: usize, order: KeyOrder) -> Self {
        Self {
            entries: BTreeMap::new(),
            waiting: BTreeSet::new(),
            leased: BTreeSet::new(),
            lines: (order == KeyOrder::Key).then(KeyLines::new),
            seen: SeenMap::new(),
            expiry: VecDeque::new(),
            segments: BTreeMap::new(),
            dedup_window_ms,
            dedup_max,
            next_id: 1,
            next_lease: 1,
            acked_total: 0,
            dead_lettered_total: 0,
        }
    }

    /// How long applied event ids are remembered.
    pub(crate) fn dedup_window_ms(&self) -> i64 {
        self.dedup_window_ms
    }

    /// Queued messages.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The queued messages' ids, in order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.keys().copied()
    }

    /// The id the next enqueue gets.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Ids below `id` are taken (by a store whose segments are gone).
    pub(crate) fn reserve_ids_below(&mut self, id: u64) {
        self.next_id = self.next_id.max(id);
    }

    /// Takes the next message id.
    pub(crate) fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// What is known of the event with dedup hash `hash`.
    pub(crate) fn seen(&self, hash: u64) -> Option<Seen> {
        self.seen.get(&hash).copied()
    }

    fn remember(&mut self, hash: u64, seen: Seen) {
        if self.seen.len() < self.dedup_max || self.seen.contains_key(&hash) {
            self.seen.insert(hash, seen);
        }
    }

    /// Marks `hash` as settled at `at` (from the dedup file, at start).
    pub(crate) fn remember_settled(&mut self, hash: u64, at: i64) {
        if self.dedup_window_ms > 0 && self.seen.get(&hash).is_none() {
            self.remember(hash, Seen::Settled(at));
            if self.seen.contains_key(&hash) {
                self.expiry.push_back((at, hash));
            }
        }
    }

    /// Marks `hash` as dead-lettered (from the dead-letter store).
    pub(crate) fn remember_dead(&mut self, hash: u64) {
        self.remember(hash, Seen::Dead);
    }

    /// Forgets `hash` (its dead letter was purged): the event is new again.
    pub(crate) fn forget(&mut self, hash: u64) {
        if self.seen.get(&hash) == Some(&Seen::Dead) {
            self.seen.remove(&hash);
        }
    }

    /// A segment now on disk, with nothing live in it yet.
    pub(crate) fn add_segment(&mut self, segment: u64) {
        self.segments.entry(segment).or_default();
    }

    /// The segments on disk, oldest first, with their live part.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (u64, &SegmentUse)> {
        self.segments.iter().map(|(&s, u)| (s, u))
    }

    /// The oldest segment, if it holds nothing live.
    pub(crate) fn oldest_if_empty(&self) -> Option<u64> {
        self.segments
            .iter()
            .next()
            .filter(|(_, u)| u.live == 0)
            .map(|(&s, _)| s)
    }

    /// Forgets the oldest segment (reclaimed), handing back its tombstones.
    pub(crate) fn remove_segment(&mut self, segment: u64) -> Vec<(u64, i64)> {
        self.segments
            .remove(&segment)
            .map(|u| u.tombstones)
            .unwrap_or_default()
    }

    /// The live messages whose records lie in `segment`, at most `max`.
    /// Entries are in id order and the oldest segment holds the oldest
    /// ids, so the walk stops soon after the first `max`.
    pub(crate) fn live_in(&self, segment: u64, max: usize) -> Vec<(u64, Location)> {
        self.entries
            .iter()
            .filter(|(_, e)| e.loc.segment == segment)
            .map(|(&id, e)| (id, e.loc))
            .take(max)
            .collect()
    }

    /// The state a carry record copies forward for message `id`. A lease
    /// lives in memory only, so a leased message is carried as visible at
    /// once: after a crash its lease has lapsed, as an enqueue record's
    /// would have (its `visible_at_ms` is the lease's end, not a delay).
    pub(crate) fn carried_state(&self, id: u64) -> Option<CarriedState> {
        self.entries.get(&id).map(|e| CarriedState {
            attempts: e.attempts,
            replays: e.replays,
            visible_at_ms: if e.place == Place::Leased {
                0
            } else {
                e.visible_at_ms
            },
        })
    }

    /// Message `id`'s record now lies at `loc` (a carry was written);
    /// returns where it lay before.
    pub(crate) fn moved(&mut self, id: u64, loc: Location) -> Option<Location> {
        let entry = self.entries.get_mut(&id)?;
        let old = std::mem::replace(&mut entry.loc, loc);
        if let Some(u) = self.segments.get_mut(&old.segment) {
            u.live = u.live.saturating_sub(1);
            u.live_bytes = u.live_bytes.saturating_sub(u64::from(old.len));
        }
        let u = self.segments.entry(loc.segment).or_default();
        u.live += 1;
        u.live_bytes += u64::from(loc.len);
        Some(old)
    }

    /// Queues message `id` (an enqueue, a carry, a replay), visible per
    /// `state`.
    pub(crate) fn insert(
        &mut self,
        id: u64,
        loc: Location,
        entity_key: Option<&str>,
        received_at_ms: i64,
        hash: u64,
        state: &CarriedState,
    ) {
        self.next_id = self.next_id.max(id + 1);
        if let Some(old) = self.entries.get(&id).cloned() {
            // A carry over its own earlier copy (replay of both).
            self.unlink(id, &old);
        }
        let line = self.lines.as_ref().and(entity_key).map(line_of);
        let joined = match (self.lines.as_mut(), line) {
            (Some(lines), Some(line)) => lines.join(line, id),
            _ => Joined::Head { displaced: None },
        };
        let entry = Entry {
            loc,
            key: entity_key.map(Box::from),
            dedup: hash,
            received_at_ms,
            attempts: state.attempts,
            receives: state.attempts,
            replays: state.replays,
            visible_at_ms: state.visible_at_ms,
            lease: None,
            place: match joined {
                Joined::Head { .. } => Place::Waiting,
                Joined::Behind => Place::Behind,
            },
            line,
        };
        if let Joined::Head {
            displaced: Some(displaced),
        } = joined
        {
            self.put_behind(displaced);
        }
        if entry.place == Place::Waiting {
            self.waiting.insert((entry.visible_at_ms, id));
        }
        let u = self.segments.entry(loc.segment).or_default();
        u.live += 1;
        u.live_bytes += u64::from(loc.len);
        self.entries.insert(id, entry);
        self.remember(hash, Seen::Queued(id));
    }

    /// Takes `id`'s entry out of the visibility sets, its key's line
    /// (the next of the line may be claimed now) and its segment's live
    /// count.
    fn unlink(&mut self, id: u64, entry: &Entry) {
        let key = (entry.visible_at_ms, id);
        match entry.place {
            Place::Leased => {
                self.leased.remove(&key);
            }
            Place::Waiting => {
                self.waiting.remove(&key);
            }
            Place::Behind => {}
        }
        if let Some(u) = self.segments.get_mut(&entry.loc.segment) {
            u.live = u.live.saturating_sub(1);
            u.live_bytes = u.live_bytes.saturating_sub(u64::from(entry.loc.len));
        }
        self.entries.remove(&id);
        let next = match (self.lines.as_mut(), entry.line) {
            (Some(lines), Some(line)) => lines.leave(line, id),
            _ => None,
        };
        if let Some(next) = next
            && let Some(e) = self.entries.get_mut(&next)
            && e.place == Place::Behind
        {
            e.place = Place::Waiting;
            self.waiting.insert((e.visible_at_ms, next));
        }
    }

    /// Takes `id`, a head that a lower id of its key displaced, out of
    /// `waiting`. A leased one keeps its lease: that happens only when
    /// records are read back at start, when nothing is leased.
    fn put_behind(&mut self, id: u64) {
        if let Some(e) = self.entries.get_mut(&id)
            && e.place == Place::Waiting
        {
            self.waiting.remove(&(e.visible_at_ms, id));
            e.place = Place::Behind;
        }
    }

    /// Moves every lease that ran out by `now` back to `waiting`.
    fn lapse_leases(&mut self, now: i64) {
        while let Some(&(at, id)) = self.leased.first() {
            if at > now {
                break;
            }
            self.leased.pop_first();
            if let Some(e) = self.entries.get_mut(&id) {
                e.place = Place::Waiting;
                self.waiting.insert((at, id));
            }
        }
    }

    /// Claims up to `max` visible messages whose key is not in `skip`,
    /// oldest visible first, under leases running out at `now + lease_ms`.
    pub(crate) fn claim(
        &mut self,
        max: usize,
        lease_ms: i64,
        skip: &[String],
        now: i64,
    ) -> Vec<Claimed> {
        self.lapse_leases(now);
        let picked: Vec<(i64, u64)> = self
            .waiting
            .iter()
            .take_while(|&&(at, _)| at <= now)
            .filter(|&&(_, id)| {
                skip.is_empty()
                    || self.entries.get(&id).is_some_and(|e| {
                        e.key
                            .as_deref()
                            .is_none_or(|k| !skip.iter().any(|s| s == k))
                    })
            })
            .take(max)
            .copied()
            .collect();
        let until = now.saturating_add(lease_ms);
        let mut claimed = Vec::with_capacity(picked.len());
        for key in picked {
            self.waiting.remove(&key);
            let id = key.1;
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            let lease = self.next_lease;
            self.next_lease += 1;
            e.lease = Some(lease);
            e.place = Place::Leased;
            e.receives += 1;
            e.visible_at_ms = until;
            self.leased.insert((until, id));
            claimed.push(Claimed {
                id,
                loc: e.loc,
                attempts: e.attempts,
                receives: e.receives,
                lease,
            });
        }
        claimed
    }

    fn holding(&self, id: u64, lease: u64) -> Result<&Entry, LeaseLost> {
        self.entries
            .get(&id)
            .filter(|e| e.lease == Some(lease))
            .ok_or(LeaseLost)
    }

    /// Pushes the lease of `id` out to `until`; false if it was lost.
    pub(crate) fn extend(&mut self, id: u64, lease: u64, until: i64) -> bool {
        let Ok(e) = self.holding(id, lease) else {
            return false;
        };
        let e = e.clone();
        self.set_visible(id, &e, until, true);
        true
    }

    /// Moves `id` to `at` in `waiting` (`leased` false) or `leased`; one
    /// behind the head of its line only takes the new time.
    fn set_visible(&mut self, id: u64, e: &Entry, at: i64, leased: bool) {
        let old = (e.visible_at_ms, id);
        let place = match e.place {
            Place::Behind => Place::Behind,
            Place::Leased | Place::Waiting => {
                if e.place == Place::Leased {
                    self.leased.remove(&old);
                } else {
                    self.waiting.remove(&old);
                }
                if leased {
                    self.leased.insert((at, id));
                    Place::Leased
                } else {
                    self.waiting.insert((at, id));
                    Place::Waiting
                }
            }
        };
        if let Some(e) = self.entries.get_mut(&id) {
            e.visible_at_ms = at;
            e.place = place;
        }
    }

    /// Settles `id` as applied; the caller logs an ack.
    pub(crate) fn ack(&mut self, id: u64, lease: u64, now: i64) -> Result<(), LeaseLost> {
        self.holding(id, lease)?;
        self.settle(id, now);
        Ok(())
    }

    fn settle(&mut self, id: u64, now: i64) {
        let Some(e) = self.entries.get(&id).cloned() else {
            return;
        };
        self.unlink(id, &e);
        self.acked_total += 1;
        if self.dedup_window_ms == 0 {
            if self.seen.get(&e.dedup) == Some(&Seen::Queued(id)) {
                self.seen.remove(&e.dedup);
            }
            return;
        }
        if self.seen.contains_key(&e.dedup) {
            self.seen.insert(e.dedup, Seen::Settled(now));
            self.expiry.push_back((now, e.dedup));
            if let Some(u) = self.segments.get_mut(&e.loc.segment) {
                u.tombstones.push((e.dedup, now));
            }
        }
    }

    /// Makes `id` visible again at `visible_at`, counting an attempt
    /// (`attempt`) or giving its receive back (a release).
    pub(crate) fn unclaim(
        &mut self,
        id: u64,
        lease: u64,
        visible_at: i64,
        attempt: bool,
    ) -> Result<(), LeaseLost> {
        let e = self.holding(id, lease)?.clone();
        self.set_visible(id, &e, visible_at, false);
        if let Some(e) = self.entries.get_mut(&id) {
            e.lease = None;
            if attempt {
                e.attempts += 1;
            } else {
                e.receives = e.receives.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Takes `id` out of the log for the dead-letter store.
    pub(crate) fn take_dead(&mut self, id: u64, lease: u64) -> Result<Taken, LeaseLost> {
        let e = self.holding(id, lease)?.clone();
        self.unlink(id, &e);
        self.dead_lettered_total += 1;
        self.remember(e.dedup, Seen::Dead);
        Ok(Taken {
            loc: e.loc,
            attempts: e.attempts,
            replays: e.replays,
        })
    }

    /// Applies a record read back at start (no leases exist then).
    pub(crate) fn replay(
        &mut self,
        id: u64,
        loc: Location,
        record: Record,
        hash_of: impl Fn(&StoredMessage) -> u64,
        now: i64,
    ) {
        match record {
            Record::Enqueue(m) => {
                let state = CarriedState {
                    attempts: 0,
                    replays: 0,
                    visible_at_ms: m.received_at_ms,
                };
                let key = m.entity_key.as_deref();
                self.insert(id, loc, key, m.received_at_ms, hash_of(&m), &state);
            }
            Record::Carry(m, state) => {
                let key = m.entity_key.as_deref();
                self.insert(id, loc, key, m.received_at_ms, hash_of(&m), &state);
            }
            Record::Ack => self.settle(id, now),
            Record::Retry { visible_at_ms } | Record::Release { visible_at_ms } => {
                let attempt = matches!(record, Record::Retry { .. });
                if let Some(e) = self.entries.get(&id).cloned() {
                    self.set_visible(id, &e, visible_at_ms, false);
                    if let Some(e) = self.entries.get_mut(&id)
                        && attempt
                    {
                        e.attempts += 1;
                        e.receives = e.attempts;
                    }
                }
            }
            Record::DeadLetter => {
                if let Some(e) = self.entries.get(&id).cloned() {
                    self.unlink(id, &e);
                    self.remember(e.dedup, Seen::Dead);
                }
            }
            // Only the dedup file holds these.
            Record::Tombstones(_) => {}
        }
    }

    /// Where the record of `id` lies, if `lease` still holds it.
    pub(crate) fn holding_location(&self, id: u64, lease: u64) -> Option<Location> {
        self.holding(id, lease).ok().map(|e| e.loc)
    }

    /// Undoes the insert of `id`, whose record never reached the disk.
    pub(crate) fn discard(&mut self, id: u64) {
        if let Some(e) = self.entries.get(&id).cloned() {
            self.unlink(id, &e);
            if self.seen.get(&e.dedup) == Some(&Seen::Queued(id)) {
                self.seen.remove(&e.dedup);
            }
        }
    }

    /// Puts back the tombstones of `segment` (its reclaim did not happen).
    pub(crate) fn restore_tombstones(&mut self, segment: u64, tombstones: Vec<(u64, i64)>) {
        self.segments.entry(segment).or_default().tombstones = tombstones;
    }

    /// How many applied event ids the index remembers.
    pub(crate) fn settled_len(&self) -> usize {
        self.expiry.len()
    }

    /// Forgets applied event ids settled before the dedup window.
    pub(crate) fn prune(&mut self, now: i64) {
        let horizon = now.saturating_sub(self.dedup_window_ms);
        while let Some(&(at, hash)) = self.expiry.front() {
            if at >= horizon {
                break;
            }
            self.expiry.pop_front();
            if self.seen.get(&hash) == Some(&Seen::Settled(at)) {
                self.seen.remove(&hash);
            }
        }
    }

    /// The applied event ids still within the window, for rewriting the
    /// dedup file.
    pub(crate) fn settled(&self) -> Vec<(u64, i64)> {
        self.expiry
            .iter()
            .filter(|&&(at, hash)| self.seen.get(&hash) == Some(&Seen::Settled(at)))
            .map(|&(at, hash)| (hash, at))
            .collect()
    }

    /// Counts, except `dead_lettered` (the dead-letter store's). The
    /// oldest visible message is the visible one with the lowest id: ids
    /// follow arrival, except for replayed and migrated messages, which
    /// get new ids and keep their arrival time. (The minimum over every
    /// visible entry cost a lookup per queued message, on the writer, at
    /// every reading.)
    pub(crate) fn stats(&self, now: i64) -> QueueStats {
        let delayed = self.waiting.range((now.saturating_add(1), 0)..).count() as u64;
        let visible_waiting = self.waiting.len() as u64 - delayed;
        let in_flight = self.leased.range((now.saturating_add(1), 0)..).count() as u64;
        let lapsed = self.leased.len() as u64 - in_flight;
        // Behind an earlier message of their key: ready once it leaves.
        let behind = (self.entries.len() - self.waiting.len() - self.leased.len()) as u64;
        let oldest = self
            .entries
            .values()
            .find(|e| e.visible_at_ms <= now)
            .map(|e| e.received_at_ms);
        QueueStats {
            visible: Some(visible_waiting + lapsed + behind),
            in_flight: Some(in_flight),
            delayed: Some(delayed),
            dead_lettered: None,
            oldest_visible_age_ms: Some(oldest.map_or(0, |r| u64::try_from(now - r).unwrap_or(0))),
            acked_total: Some(self.acked_total),
            dead_lettered_total: Some(self.dead_lettered_total),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::message;

    fn fresh(now: i64) -> CarriedState {
        CarriedState {
            attempts: 0,
            replays: 0,
            visible_at_ms: now,
        }
    }

    fn loc(segment: u64, offset: u64) -> Location {
        Location {
            segment,
            offset,
            len: 100,
        }
    }

    fn with(n: u64, now: i64) -> Index {
        let mut ix = Index::new(60_000, 1000, KeyOrder::None);
        for id in 1..=n {
            let mut m = message(&format!("e{id}"));
            m.entity_key = Some(format!("k{}", id % 2));
            let key = m.entity_key.as_deref();
            ix.insert(id, loc(1, id * 100), key, m.received_at_ms, id, &fresh(now));
        }
        ix
    }

    #[test]
    fn a_claim_takes_the_oldest_visible_and_skips_keys() {
        let mut ix = with(4, 10);
        let got: Vec<u64> = ix
            .claim(10, 1000, &["k1".to_owned()], 10)
            .iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(got, vec![2, 4]);
        assert!(ix.claim(10, 1000, &["k1".to_owned()], 10).is_empty());
        let s = ix.stats(10);
        assert_eq!(
            (s.visible, s.in_flight, s.delayed),
            (Some(2), Some(2), Some(0))
        );
    }

    #[test]
    fn a_lapsed_lease_is_claimed_again_and_its_old_token_is_void() {
        let mut ix = with(1, 0);
        let first = ix.claim(1, 100, &[], 0)[0];
        assert!(ix.claim(1, 100, &[], 50).is_empty());
        // Lapsed but not yet claimed again: its holder may still settle.
        assert_eq!(ix.stats(150).visible, Some(1));
        let second = ix.claim(1, 100, &[], 150)[0];
        assert_eq!(second.receives, 2);
        assert_eq!(ix.ack(1, first.lease, 150), Err(LeaseLost));
        assert_eq!(ix.ack(1, second.lease, 150), Ok(()));
        assert_eq!(ix.len(), 0);
        assert_eq!(ix.seen(1), Some(Seen::Settled(150)));
    }

    #[test]
    fn a_leased_message_is_carried_visible_at_once_a_delayed_one_keeps_its_delay() {
        let mut ix = with(2, 0);
        let claimed = ix.claim(2, 60_000, &[], 0);
        ix.unclaim(claimed[1].id, claimed[1].lease, 500, true)
            .expect("retry");
        let leased = ix.carried_state(claimed[0].id).expect("queued");
        assert_eq!(leased.visible_at_ms, 0, "a lease does not outlive a crash");
        let delayed = ix.carried_state(claimed[1].id).expect("queued");
        assert_eq!((delayed.visible_at_ms, delayed.attempts), (500, 1));
    }

    #[test]
    fn retry_counts_an_attempt_release_gives_the_receive_back() {
        let mut ix = with(1, 0);
        let c = ix.claim(1, 100, &[], 0)[0];
        ix.unclaim(1, c.lease, 500, true).expect("retry");
        assert!(ix.claim(1, 100, &[], 499).is_empty(), "delayed");
        assert_eq!(ix.stats(499).delayed, Some(1));
        let c = ix.claim(1, 100, &[], 500)[0];
        assert_eq!((c.attempts, c.receives), (1, 2));
        ix.unclaim(1, c.lease, 500, false).expect("release");
        let c = ix.claim(1, 100, &[], 500)[0];
        assert_eq!((c.attempts, c.receives), (1, 2));
        assert_eq!(ix.unclaim(1, c.lease + 1, 0, false), Err(LeaseLost));
    }

    #[test]
    fn segments_count_what_is_live_and_keep_tombstones_of_what_settled() {
        let mut ix = with(3, 0);
        ix.add_segment(2);
        let claimed = ix.claim(3, 100, &[], 0);
        ix.ack(claimed[0].id, claimed[0].lease, 7).expect("ack");
        ix.take_dead(claimed[1].id, claimed[1].lease).expect("dead");
        let u = ix.segments().next().expect("segment 1").1.clone();
        assert_eq!((u.live, u.live_bytes), (1, 100));
        assert_eq!(u.tombstones, vec![(claimed[0].id, 7)]);
        assert_eq!(ix.oldest_if_empty(), None);
        // The last one is carried forward into segment 2.
        let id = claimed[2].id;
        assert_eq!(ix.live_in(1, 10), vec![(id, loc(1, id * 100))]);
        ix.moved(id, loc(2, 16));
        assert_eq!(ix.oldest_if_empty(), Some(1));
        assert_eq!(ix.remove_segment(1), vec![(claimed[0].id, 7)]);
        assert_eq!(ix.segments().next().map(|(s, u)| (s, u.live)), Some((2, 1)));
        // Its lease survives the move.
        ix.ack(id, claimed[2].lease, 8).expect("ack after move");
    }

    #[test]
    fn applied_ids_are_forgotten_after_the_window_dead_ones_when_purged() {
        let mut ix = with(2, 0);
        let c = ix.claim(2, 100, &[], 0);
        ix.ack(c[0].id, c[0].lease, 1_000).expect("ack");
        ix.take_dead(c[1].id, c[1].lease).expect("dead");
        ix.prune(61_000);
        assert_eq!(ix.seen(c[0].id), Some(Seen::Settled(1_000)));
        ix.prune(61_001);
        assert_eq!(ix.seen(c[0].id), None);
        assert_eq!(ix.seen(c[1].id), Some(Seen::Dead));
        ix.forget(c[1].id);
        assert_eq!(ix.seen(c[1].id), None);
    }

    #[test]
    fn replaying_the_records_rebuilds_the_same_state() {
        let m = message("e1");
        let mut ix = Index::new(60_000, 10, KeyOrder::None);
        ix.replay(1, loc(1, 16), Record::Enqueue(m.clone()), |_| 77, 5);
        ix.replay(2, loc(1, 200), Record::Enqueue(message("e2")), |_| 78, 5);
        ix.replay(
            1,
            loc(1, 300),
            Record::Retry { visible_at_ms: 900 },
            |_| 0,
            5,
        );
        ix.replay(2, loc(1, 400), Record::Ack, |_| 0, 5);
        let s = ix.stats(899);
        assert_eq!((s.visible, s.delayed), (Some(0), Some(1)));
        let c = ix.claim(1, 10, &[], 900)[0];
        assert_eq!((c.id, c.attempts), (1, 1));
        assert_eq!(ix.seen(78), Some(Seen::Settled(5)));
        assert_eq!(ix.next_id(), 3);
    }

    #[test]
    fn a_full_dedup_index_indexes_no_new_id() {
        let mut ix = Index::new(60_000, 2, KeyOrder::None);
        for id in 1..=3 {
            ix.insert(id, loc(1, id), None, 0, id, &fresh(0));
        }
        assert_eq!(ix.seen(2), Some(Seen::Queued(2)));
        assert_eq!(ix.seen(3), None);
        assert_eq!(ix.len(), 3);
    }

    /// An index keeping key order, with `keys[i]` the key of message i + 1.
    fn ordered(keys: &[&str], now: i64) -> Index {
        let mut ix = Index::new(60_000, 1000, KeyOrder::Key);
        for (i, key) in keys.iter().enumerate() {
            let id = i as u64 + 1;
            ix.insert(id, loc(1, id * 100), Some(key), now, id, &fresh(now));
        }
        ix
    }

    fn ids(claimed: &[Claimed]) -> Vec<u64> {
        claimed.iter().map(|c| c.id).collect()
    }

    #[test]
    fn in_key_order_a_claim_takes_only_the_head_of_each_key() {
        let mut ix = ordered(&["a", "b", "a", "a", "b"], 0);
        let first = ix.claim(10, 1000, &[], 0);
        assert_eq!(ids(&first), vec![1, 2]);
        assert!(ix.claim(10, 1000, &[], 0).is_empty(), "the rest wait");
        let s = ix.stats(0);
        assert_eq!(
            (s.visible, s.in_flight),
            (Some(3), Some(2)),
            "behind = visible"
        );
        ix.ack(1, first[0].lease, 0).expect("ack");
        assert_eq!(ids(&ix.claim(10, 1000, &[], 0)), vec![3]);
    }

    /// A head retried later, handed back (a parked key) or whose lease
    /// ran out stays the head: its key's later messages wait behind it.
    #[test]
    fn a_retried_released_or_lapsed_head_keeps_its_place() {
        let mut ix = ordered(&["k", "k", "k"], 0);
        let c = ix.claim(10, 100, &[], 0)[0];
        ix.unclaim(c.id, c.lease, 500, true).expect("retry later");
        assert!(
            ix.claim(10, 100, &[], 499).is_empty(),
            "2 and 3 wait for 1's retry"
        );
        let c = ix.claim(10, 100, &[], 500)[0];
        assert_eq!(c.id, 1);
        ix.unclaim(c.id, c.lease, 500, false).expect("release");
        assert!(
            ix.claim(10, 100, &["k".to_owned()], 500).is_empty(),
            "parked"
        );
        let c = ix.claim(10, 100, &[], 500)[0];
        assert_eq!(c.id, 1);
        assert!(ix.claim(10, 100, &[], 550).is_empty(), "leased");
        let again = ix.claim(10, 100, &[], 600);
        assert_eq!(ids(&again), vec![1], "its lease lapsed: 1 again, not 2");
        ix.take_dead(1, again[0].lease).expect("dead-lettered");
        assert_eq!(
            ids(&ix.claim(10, 100, &[], 600)),
            vec![2],
            "the next goes on"
        );
    }

    /// At start the records are read back segment by segment; a message
    /// carried forward comes after later ids of its key and still goes
    /// first.
    #[test]
    fn records_read_back_out_of_id_order_rebuild_each_line_in_id_order() {
        let mut ix = Index::new(60_000, 100, KeyOrder::Key);
        let m = |id: u64| {
            let mut m = message(&format!("e{id}"));
            m.entity_key = Some("k".to_owned());
            m.received_at_ms = 100;
            m
        };
        ix.replay(5, loc(3, 16), Record::Enqueue(m(5)), |_| 5, 0);
        ix.replay(6, loc(3, 200), Record::Enqueue(m(6)), |_| 6, 0);
        let carried = CarriedState {
            attempts: 2,
            replays: 0,
            visible_at_ms: 900,
        };
        ix.replay(2, loc(3, 400), Record::Carry(m(2), carried), |_| 2, 0);
        assert!(
            ix.claim(10, 100, &[], 899).is_empty(),
            "2 is due at 900; 5 and 6 wait"
        );
        let c = ix.claim(10, 100, &[], 900);
        assert_eq!(ids(&c), vec![2]);
        ix.ack(2, c[0].lease, 900).expect("ack");
        assert_eq!(ids(&ix.claim(10, 100, &[], 900)), vec![5]);
    }

    #[test]
    fn messages_without_a_key_and_key_order_off_are_not_held() {
        let mut ix = Index::new(60_000, 100, KeyOrder::Key);
        for id in 1..=3 {
            ix.insert(id, loc(1, id), None, 0, id, &fresh(0));
        }
        assert_eq!(ids(&ix.claim(10, 100, &[], 0)), vec![1, 2, 3]);
        let mut ix = with(4, 0);
        assert_eq!(ids(&ix.claim(10, 100, &[], 0)), vec![1, 2, 3, 4]);
    }
}
