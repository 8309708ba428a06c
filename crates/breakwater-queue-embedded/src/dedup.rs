//! The embedded queue's duplicate index: which event ids the store holds,
//! kept in memory by the writer.
//!
//! A `UNIQUE (source, event_id)` index in SQLite answered this before, and
//! cost most of the queue's writes: event ids are random, so every insert
//! lands on its own leaf of that B-tree and dirties a whole 4 KiB page,
//! which the WAL writes and the checkpoint writes again (a SQLite test with
//! 100k stored ids: 7.4 KB of WAL per insert with random ids, 2.8 KB with
//! sequential ones). Without it the ingress bench went from 8.8–10.8k to
//! 13.0–13.8k webhooks/s on 2 cores.
//!
//! Each entry maps a 64-bit hash of (source, event id) to a message id. A
//! hit is confirmed by reading that row by its id (cheap: the table is
//! keyed by it), and a mismatch (a hash collision, a row deleted by another
//! process) counts as new. So the index can miss a duplicate, never invent
//! one: a missed duplicate is queued twice and the sink's inbox applies it
//! once, while an invented one would drop a webhook.
//!
//! It holds every event id the store holds (queued, dead-lettered, and
//! acked within the dedup window), up to `dedup_index_max` (about 30 bytes
//! each: 5 million by default, ~150 MiB): past it a new event id is not
//! indexed, which is the same as a missed duplicate (queued twice, applied
//! once), so memory has a ceiling whatever rate x window comes. It is
//! built from the store by the first enqueue, so processes that never
//! enqueue (the CLI, `--role worker`) neither scan for it nor hold it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use rusqlite::Connection;

/// The hash of an event in the index.
pub(crate) fn key(source: &str, event_id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    source.hash(&mut h);
    event_id.hash(&mut h);
    h.finish()
}

/// The index: empty until the first enqueue loads it.
#[derive(Debug)]
pub(crate) struct DedupIndex {
    loaded: Option<Loaded>,
    max: usize,
}

impl Default for DedupIndex {
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

impl DedupIndex {
    /// An index of at most `max` entries.
    pub(crate) fn new(max: usize) -> Self {
        Self { loaded: None, max }
    }

    /// The index, built from every message in the store on first use.
    pub(crate) fn loaded(&mut self, conn: &Connection) -> rusqlite::Result<&mut Loaded> {
        let index = match self.loaded.take() {
            Some(index) => index,
            None => {
                let index = Loaded::load(conn, self.max)?;
                metrics::gauge!(crate::telemetry::QUEUE_DEDUP_ENTRIES).set(index.len() as f64);
                index
            }
        };
        Ok(self.loaded.insert(index))
    }

    /// Forgets `id` under `key` (and nothing a later message put there).
    /// Nothing to do before the index is loaded: loading reads the store as
    /// it is then.
    pub(crate) fn remove(&mut self, key: u64, id: i64) {
        if let Some(loaded) = &mut self.loaded {
            loaded.remove(key, id);
        }
    }

    /// Entries held (0 before loading).
    pub(crate) fn len(&self) -> usize {
        self.loaded.as_ref().map_or(0, Loaded::len)
    }
}

/// Shards of [`Loaded`]; a power of two.
const SHARDS: usize = 256;

/// Event hashes to message ids, in [`SHARDS`] maps picked by the hash's
/// top bits.
///
/// One map stalls the writer each time it grows: it rehashes every entry
/// inside one batch, and every enqueue of the batch waits. Under `bench
/// ingress` a batch of 14 enqueues took 20 ms with its commit under 2 ms,
/// at about 600k entries; inserting 2M random keys, the slowest insert took
/// 51 ms in one map (at 1.8M entries), 0.9 ms in 64 shards and 0.34 ms in
/// 256. Each shard grows at 1/256 of the size, and at its own moment.
#[derive(Debug)]
pub(crate) struct Loaded {
    shards: Vec<HashMap<u64, i64>>,
    /// Most entries of one shard (the index's most over [`SHARDS`]).
    per_shard: usize,
    /// Whether an id was left out for the cap (said once in the log).
    capped: bool,
}

impl Default for Loaded {
    fn default() -> Self {
        Self::with_max(usize::MAX)
    }
}

impl Loaded {
    fn with_max(max: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| HashMap::new()).collect(),
            per_shard: (max / SHARDS).max(1),
            capped: false,
        }
    }

    fn load(conn: &Connection, max: usize) -> rusqlite::Result<Self> {
        let mut st = conn.prepare("SELECT id, source, event_id FROM messages")?;
        let mut rows = st.query([])?;
        let mut index = Self::with_max(max);
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            let source: String = row.get(1)?;
            let event_id: String = row.get(2)?;
            index.insert(key(&source, &event_id), id);
        }
        Ok(index)
    }

    fn shard(&self, key: u64) -> &HashMap<u64, i64> {
        &self.shards[shard_of(key)]
    }

    fn shard_mut(&mut self, key: u64) -> &mut HashMap<u64, i64> {
        &mut self.shards[shard_of(key)]
    }

    /// The message id last recorded for this hash, to be confirmed.
    pub(crate) fn candidate(&self, key: u64) -> Option<i64> {
        self.shard(key).get(&key).copied()
    }

    /// Records `id` under `key`; past the cap a new key is left out (its
    /// duplicates are then missed, never invented).
    pub(crate) fn insert(&mut self, key: u64, id: i64) {
        let per_shard = self.per_shard;
        let shard = self.shard_mut(key);
        if shard.len() < per_shard || shard.contains_key(&key) {
            shard.insert(key, id);
            return;
        }
        metrics::counter!(crate::telemetry::QUEUE_DEDUP_UNINDEXED).increment(1);
        if !self.capped {
            self.capped = true;
            tracing::warn!(
                max = per_shard * SHARDS,
                "the duplicate index is full (queue.dedup_index_max): new event ids are not \
                 indexed, so their redeliveries are queued again and the sink's inbox applies \
                 them once"
            );
        }
    }

    fn remove(&mut self, key: u64, id: i64) {
        let shard = self.shard_mut(key);
        if shard.get(&key) == Some(&id) {
            shard.remove(&key);
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }
}

/// The shard of a key: its top bits (the map hashes the key again, so
/// shards and buckets do not correlate).
fn shard_of(key: u64) -> usize {
    (key >> (u64::BITS - SHARDS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_source_and_event_id() {
        assert_eq!(key("stripe", "evt_1"), key("stripe", "evt_1"));
        assert_ne!(key("stripe", "evt_1"), key("stripe", "evt_2"));
        assert_ne!(key("stripe", "evt_1"), key("github", "evt_1"));
        // The length prefix of `str::hash` keeps the split unambiguous.
        assert_ne!(key("ab", "c"), key("a", "bc"));
    }

    #[test]
    fn loads_on_first_use_and_remove_leaves_a_newer_id_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::store::open(&dir.path().join("q.db")).expect("store");
        conn.execute(
            "INSERT INTO messages (id, source, event_id, headers, received_at, visible_at)
             VALUES (7, 's', 'stored', '[]', 1, 1)",
            [],
        )
        .expect("row");
        let mut index = DedupIndex::default();
        assert_eq!(index.len(), 0, "nothing loaded before the first use");
        let loaded = index.loaded(&conn).expect("load");
        assert_eq!(loaded.candidate(key("s", "stored")), Some(7));
        let k = key("s", "e");
        loaded.insert(k, 1);
        loaded.insert(k, 2);
        index.remove(k, 1);
        assert_eq!(index.loaded(&conn).expect("loaded").candidate(k), Some(2));
        index.remove(k, 2);
        assert_eq!(index.loaded(&conn).expect("loaded").candidate(k), None);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn past_its_cap_a_new_key_is_left_out_and_a_known_one_still_moves() {
        let mut loaded = Loaded::with_max(SHARDS * 2);
        let keys: Vec<u64> = (0..10_000).map(|i| key("s", &format!("evt_{i}"))).collect();
        for (id, k) in (1..).zip(&keys) {
            loaded.insert(*k, id);
        }
        assert_eq!(loaded.len(), SHARDS * 2, "held to the cap");
        let known = keys
            .iter()
            .copied()
            .find(|k| loaded.candidate(*k).is_some())
            .expect("an indexed key");
        loaded.insert(known, 99_999);
        assert_eq!(
            loaded.candidate(known),
            Some(99_999),
            "a known key is updated"
        );
        assert_eq!(loaded.len(), SHARDS * 2);
        assert!(loaded.capped);
    }

    #[test]
    fn every_shard_is_used_and_each_key_found_in_its_own() {
        assert_eq!(shard_of(0), 0);
        assert_eq!(shard_of(u64::MAX), SHARDS - 1);
        let mut loaded = Loaded::default();
        let keys: Vec<u64> = (0..10_000).map(|i| key("s", &format!("evt_{i}"))).collect();
        for (id, k) in (1..).zip(&keys) {
            loaded.insert(*k, id);
        }
        assert_eq!(loaded.len(), keys.len());
        assert!(loaded.shards.iter().all(|shard| !shard.is_empty()));
        for (id, k) in (1..).zip(&keys) {
            assert_eq!(loaded.candidate(*k), Some(id));
        }
        for (id, k) in (1..).zip(&keys).step_by(2) {
            loaded.remove(*k, id);
        }
        assert_eq!(loaded.len(), keys.len() / 2);
        assert_eq!(loaded.candidate(keys[0]), None);
        assert_eq!(loaded.candidate(keys[1]), Some(2));
    }
}
