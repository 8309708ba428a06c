//! The attempt history: what the workers of this process did with each
//! event lately (applied, retried with which error, released untried and
//! why, dead-lettered), kept in memory for the admin API's event lookup.
//!
//! Bounded twice: at most `capacity` events (the oldest first seen goes
//! first) and at most [`ATTEMPTS_KEPT`] attempts per event (the latest;
//! the number dropped is counted). It is a window for operators, not a
//! record: a restart empties it, and each node of a fleet keeps its own.
//! What is durable about an event (its inbox row, its dead letter) is read
//! from the sink and the queue at lookup time.
//!
//! Pure: the caller passes the wall-clock time of each record.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use breakwater_admin_api::AttemptRecord;

/// Attempts kept per event; older ones are counted, not kept.
pub const ATTEMPTS_KEPT: usize = 32;

/// Longest error text kept per attempt, in bytes.
const ERROR_KEPT: usize = 512;

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
    node: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: HashMap<String, Attempts>,
    /// Keys in the order first seen, for eviction.
    order: VecDeque<String>,
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
    /// Remembers up to `capacity` events (0: none) for the node `node`.
    pub fn new(capacity: usize, node: impl Into<String>) -> Self {
        Self {
            capacity,
            node: node.into(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// A journal that keeps nothing.
    pub fn off() -> Self {
        Self::new(0, "")
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Events remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.events.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds one attempt at `source`'s `event_id`.
    pub fn record(&self, source: &str, event_id: &str, mut attempt: AttemptRecord) {
        if self.capacity == 0 {
            return;
        }
        if let Some(error) = &mut attempt.error {
            truncate_at_char(error, ERROR_KEPT);
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let k = key(source, event_id);
        let Inner { events, order } = &mut *inner;
        let attempts = match events.get_mut(&k) {
            Some(a) => a,
            None => {
                while events.len() >= self.capacity {
                    match order.pop_front() {
                        Some(oldest) => {
                            events.remove(&oldest);
                        }
                        None => break,
                    }
                }
                order.push_back(k.clone());
                events.entry(k).or_default()
            }
        };
        if attempts.kept.len() == ATTEMPTS_KEPT {
            attempts.kept.pop_front();
            attempts.dropped = attempts.dropped.saturating_add(1);
        }
        attempts.kept.push_back(attempt);
    }

    /// What this process did with `source`'s `event_id`, if it remembers.
    pub fn get(&self, source: &str, event_id: &str) -> Option<Attempts> {
        let inner = self.inner.lock().ok()?;
        inner.events.get(&key(source, event_id)).cloned()
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
