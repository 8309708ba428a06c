//! The attempt history: what the workers of this process did with each
//! event lately (applied, retried with which error, released untried and
//! why, dead-lettered), kept in memory for the admin API's event lookup.
//!
//! Bounded three times: at most `capacity` events and at most `max_bytes`
//! bytes (`admin.event_history` and `admin.event_history_bytes`; the
//! oldest event first seen goes first), and at most [`ATTEMPTS_KEPT`]
//! attempts per event (the latest; the number dropped is counted). The
//! bytes are counted per event ([`event_bytes`]: its key, the text of its
//! attempts, a fixed share for the map and the records), so a few events
//! with very long ids or errors cannot hold more than the budget (an
//! event larger than the whole budget on its own is not kept). The key is
//! held once (shared by the map and the eviction order). It is a window
//! for operators, not a
//! record: a restart empties it, and each node of a fleet keeps its own.
//! What is durable about an event (its inbox row, its dead letter) is read
//! from the sink and the queue at lookup time.
//!
//! Pure: the caller passes the wall-clock time of each record.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use breakwater_admin_api::AttemptRecord;

/// Attempts kept per event; older ones are counted, not kept.
pub const ATTEMPTS_KEPT: usize = 32;

/// Longest error text kept per attempt, in bytes.
const ERROR_KEPT: usize = 512;

/// The byte budget of a journal made with [`EventJournal::new`] (the
/// default of `admin.event_history_bytes`): 32 MiB.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// What an event costs besides its key and its attempts' text: its slot
/// in the map and in the eviction order, the key's `Arc`, the attempts'
/// deque.
const EVENT_OVERHEAD: usize = 128;

/// What an attempt costs besides its text.
const ATTEMPT_OVERHEAD: usize = std::mem::size_of::<AttemptRecord>();

/// One event's attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempts {
    pub kept: VecDeque<AttemptRecord>,
    pub dropped: u32,
}

/// The attempt history of this process's workers.
#[derive(Debug)]
pub struct EventJournal {
    capacity: usize,
    max_bytes: usize,
    node: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: HashMap<Arc<str>, Attempts>,
    /// Keys in the order first seen, for eviction.
    order: VecDeque<Arc<str>>,
    /// What the events kept cost ([`event_bytes`]), summed.
    bytes: usize,
}

impl Inner {
    /// Forgets the oldest event; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        let Some(oldest) = self.order.pop_front() else {
            return false;
        };
        if let Some(gone) = self.events.remove(&oldest) {
            self.bytes = self.bytes.saturating_sub(event_bytes(&oldest, &gone));
        }
        true
    }
}

/// The bytes an attempt's text takes.
fn attempt_bytes(a: &AttemptRecord) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
    ATTEMPT_OVERHEAD
        + a.outcome.capacity()
        + text(&a.class)
        + text(&a.kind)
        + text(&a.error)
        + text(&a.note)
}

/// What the journal counts for one event: its key, its attempts, and a
/// fixed share for the structures that hold them.
pub fn event_bytes(key: &str, attempts: &Attempts) -> usize {
    EVENT_OVERHEAD + key.len() + attempts.kept.iter().map(attempt_bytes).sum::<usize>()
}

/// `source` and `event_id` as one map key (a NUL cannot be in a source
/// name, so two pairs never collide).
fn key(source: &str, event_id: &str) -> String {
    let mut k = String::with_capacity(source.len() + 1 + event_id.len());
    k.push_str(source);
    k.push('\0');
    k.push_str(event_id);
    k
}

impl EventJournal {
    /// Remembers up to `capacity` events (0: none) in up to
    /// [`DEFAULT_MAX_BYTES`] for the node `node`.
    pub fn new(capacity: usize, node: impl Into<String>) -> Self {
        Self {
            capacity,
            max_bytes: DEFAULT_MAX_BYTES,
            node: node.into(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The same journal holding at most `max_bytes` ([`event_bytes`]
    /// summed; 0: nothing).
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// A journal that keeps nothing.
    pub fn off() -> Self {
        Self::new(0, "")
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Events it may keep; 0 when it keeps nothing (no events or no
    /// bytes).
    pub fn capacity(&self) -> usize {
        if self.max_bytes == 0 {
            0
        } else {
            self.capacity
        }
    }

    /// Bytes it may hold ([`event_bytes`] summed).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Bytes it holds now ([`event_bytes`] summed).
    pub fn bytes(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.bytes)
    }

    /// Events remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.events.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds one attempt at `source`'s `event_id`, then forgets the oldest
    /// events until both bounds hold again.
    pub fn record(&self, source: &str, event_id: &str, mut attempt: AttemptRecord) {
        if self.capacity() == 0 {
            return;
        }
        if let Some(error) = &mut attempt.error {
            truncate_at_char(error, ERROR_KEPT);
        }
        // What is counted is what is held: no spare capacity (an error
        // text cut from 60 KB would otherwise keep its 60 KB).
        for text in [
            &mut attempt.class,
            &mut attempt.kind,
            &mut attempt.error,
            &mut attempt.note,
        ]
        .into_iter()
        .flatten()
        {
            text.shrink_to_fit();
        }
        attempt.outcome.shrink_to_fit();
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let inner = &mut *inner;
        let k = key(source, event_id);
        let k: Arc<str> = match inner.events.get_key_value(k.as_str()) {
            Some((known, _)) => Arc::clone(known),
            None => {
                while inner.events.len() >= self.capacity && inner.evict_oldest() {}
                let k: Arc<str> = Arc::from(k);
                inner.order.push_back(Arc::clone(&k));
                let attempts = Attempts::default();
                inner.bytes += event_bytes(&k, &attempts);
                inner.events.insert(Arc::clone(&k), attempts);
                k
            }
        };
        let added = attempt_bytes(&attempt);
        let Some(attempts) = inner.events.get_mut(&k) else {
            return;
        };
        if attempts.kept.len() == ATTEMPTS_KEPT
            && let Some(gone) = attempts.kept.pop_front()
        {
            attempts.dropped = attempts.dropped.saturating_add(1);
            inner.bytes = inner.bytes.saturating_sub(attempt_bytes(&gone));
        }
        attempts.kept.push_back(attempt);
        inner.bytes += added;
        // The oldest first seen goes first, this one too if it is the
        // oldest (or the only one, larger than the whole budget).
        while inner.bytes > self.max_bytes && inner.evict_oldest() {}
    }

    /// What this process did with `source`'s `event_id`, if it remembers.
    pub fn get(&self, source: &str, event_id: &str) -> Option<Attempts> {
        let inner = self.inner.lock().ok()?;
        inner.events.get(key(source, event_id).as_str()).cloned()
    }
}

fn truncate_at_char(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, outcome: &str) -> AttemptRecord {
        AttemptRecord {
            at_ms: i64::from(n),
            attempt: n,
            outcome: outcome.to_owned(),
            class: None,
            kind: None,
            error: None,
            note: None,
            apply_ms: 1,
            probe: false,
        }
    }

    #[test]
    fn attempts_are_kept_in_order_per_event_and_source() {
        let j = EventJournal::new(10, "node-a");
        j.record("stripe", "evt_1", attempt(1, "retried"));
        j.record("github", "evt_1", attempt(1, "applied"));
        j.record("stripe", "evt_1", attempt(2, "applied"));
        let stripe = j.get("stripe", "evt_1").expect("kept");
        let outcomes: Vec<_> = stripe.kept.iter().map(|a| a.outcome.as_str()).collect();
        assert_eq!(outcomes, ["retried", "applied"]);
        assert_eq!(j.get("github", "evt_1").expect("kept").kept.len(), 1);
        assert_eq!(j.get("stripe", "evt_2"), None);
        assert_eq!(j.len(), 2);
    }

    #[test]
    fn the_oldest_event_goes_first_when_full() {
        let j = EventJournal::new(3, "n");
        for i in 0..5 {
            j.record("s", &format!("evt_{i}"), attempt(1, "applied"));
            // A later attempt at an old event does not make it young.
            j.record("s", "evt_0", attempt(2, "retried"));
        }
        assert_eq!(j.len(), 3);
        assert!(j.get("s", "evt_4").is_some());
        assert!(j.get("s", "evt_3").is_some());
        assert!(j.get("s", "evt_1").is_none());
    }

    #[test]
    fn only_the_latest_attempts_are_kept_and_the_rest_counted() {
        let j = EventJournal::new(1, "n");
        for n in 1..=40 {
            j.record("s", "e", attempt(n, "released"));
        }
        let a = j.get("s", "e").expect("kept");
        assert_eq!(a.kept.len(), ATTEMPTS_KEPT);
        assert_eq!(a.dropped, 40 - ATTEMPTS_KEPT as u32);
        assert_eq!(a.kept.back().map(|a| a.attempt), Some(40));
    }

    #[test]
    fn a_journal_of_capacity_zero_keeps_nothing() {
        let j = EventJournal::off();
        j.record("s", "e", attempt(1, "applied"));
        assert!(j.is_empty());
    }

    /// 100 events with 900 KB ids (the probe of issue 49) held 180 MB
    /// when only the count was bounded; under a 1 MiB budget the journal
    /// holds at most 1 MiB, keeps the latest events that fit, and still
    /// keeps small events by the thousand.
    #[test]
    fn the_byte_budget_holds_whatever_the_ids_weigh() {
        const BUDGET: usize = 1 << 20;
        let j = EventJournal::new(50_000, "n").with_max_bytes(BUDGET);
        for i in 0..100 {
            let id = format!("{i:03}{}", "x".repeat(900_000));
            j.record("s", &id, attempt(1, "applied"));
            assert!(j.bytes() <= BUDGET, "after {i}: {} bytes", j.bytes());
        }
        assert_eq!(j.len(), 1, "one 900 KB event fits in 1 MiB, two do not");
        assert!(j.get("s", &format!("099{}", "x".repeat(900_000))).is_some());

        // An event larger than the whole budget is not kept at all.
        j.record("s", &"y".repeat(BUDGET), attempt(1, "applied"));
        assert!(j.bytes() <= BUDGET);
        assert!(j.is_empty());

        // Small events: as many as the budget holds, the latest.
        for i in 0..20_000 {
            j.record("s", &format!("evt_{i}"), attempt(1, "applied"));
            j.record("s", &format!("evt_{i}"), attempt(2, "retried"));
        }
        assert!(j.bytes() <= BUDGET, "{} bytes", j.bytes());
        assert!(j.len() > 1_000, "kept only {}", j.len());
        assert!(j.get("s", "evt_19999").is_some());
        assert!(j.get("s", "evt_0").is_none());
        // The count it reports is what it holds, to the byte.
        let inner = j.inner.lock().expect("lock");
        let held: usize = inner.events.iter().map(|(k, a)| event_bytes(k, a)).sum();
        assert_eq!(held, inner.bytes);
    }

    #[test]
    fn a_long_error_costs_what_is_kept_of_it() {
        let j = EventJournal::new(10, "n");
        let mut a = attempt(1, "retried");
        a.error = Some("e".repeat(60_000));
        j.record("s", "e", a);
        assert!(
            j.bytes() < 2_000,
            "{} bytes for a 512-byte error",
            j.bytes()
        );
    }

    #[test]
    fn a_journal_of_no_bytes_keeps_nothing() {
        let j = EventJournal::new(10, "n").with_max_bytes(0);
        assert_eq!(j.capacity(), 0);
        j.record("s", "e", attempt(1, "applied"));
        assert!(j.is_empty());
    }

    #[test]
    fn a_long_error_is_cut_on_a_character_boundary() {
        let j = EventJournal::new(1, "n");
        let mut a = attempt(1, "retried");
        a.error = Some("é".repeat(600));
        j.record("s", "e", a);
        let kept = j.get("s", "e").expect("kept").kept[0]
            .error
            .clone()
            .expect("error");
        assert!(kept.len() <= ERROR_KEPT + '…'.len_utf8());
        assert!(kept.ends_with('…'));
    }
}
