//! The seams a fleet plugs into: where the breaker's record is shared and
//! where half-open probe slots are counted, as async traits, so a store
//! that talks to Redis drops in where the in-memory ones below serve a
//! single node.
//!
//! Still no I/O here: the traits are async so an implementation may wait
//! on the network, and every call that needs the time takes `now`.
//!
//! - [`BreakerStore`]: the breaker's record (state, reason, limit,
//!   generation), changed only by compare-and-set on the generation, so two
//!   nodes never apply conflicting transitions. [`LocalBreakerStore`] keeps
//!   it in memory.
//! - [`ProbeSlots`]: how many probes the whole fleet has outstanding in a
//!   half-open period, each slot with a time to live so a prober that died
//!   frees its slot. The breaker's own [`crate::ProbeAdmission`] still
//!   bounds a node's probes; a fleet slot is taken before it and given back
//!   with the probe's outcome. [`LocalProbeSlots`] is the one-node store.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::State;

/// The breaker's record as the fleet shares it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerRecord {
    pub state: State,
    /// Why it is in that state, in words.
    pub reason: String,
    /// The concurrency limit of the whole pool.
    pub limit: u32,
    /// Bumped by every change; compare-and-set keys on it.
    pub generation: u64,
}

/// Why a coordination store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinationError {
    /// The store cannot be reached: nodes fall back to local decisions.
    #[error("coordination store unavailable: {0}")]
    Unavailable(String),
}

/// Where the breaker's record is shared.
#[async_trait]
pub trait BreakerStore: Send + Sync {
    /// The record as the fleet sees it; `None` before the first.
    async fn load(&self) -> Result<Option<BreakerRecord>, CoordinationError>;

    /// Stores `record` only if the stored generation is still `expected`
    /// (`None`: no record yet). Returns whether it did; `false` means
    /// another node moved first, and the caller should load and follow.
    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: BreakerRecord,
    ) -> Result<bool, CoordinationError>;
}

/// A fleet-wide probe slot, given back with the probe's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeSlot {
    /// The half-open period it belongs to.
    pub period: u64,
    /// Unique within the store.
    pub id: u64,
}

/// Where the fleet counts half-open probes.
#[async_trait]
pub trait ProbeSlots: Send + Sync {
    /// Takes a slot of `period` if fewer than `limit` are held, for at most
    /// `ttl` (a holder that dies frees it then).
    async fn try_take(
        &self,
        period: u64,
        limit: u32,
        ttl: Duration,
        now: Instant,
    ) -> Result<Option<ProbeSlot>, CoordinationError>;

    /// Frees a slot (its probe answered, or was never sent).
    async fn give_back(&self, slot: ProbeSlot) -> Result<(), CoordinationError>;
}

/// The breaker's record in memory: the store of a single node.
#[derive(Debug, Default)]
pub struct LocalBreakerStore {
    record: Mutex<Option<BreakerRecord>>,
}

#[async_trait]
impl BreakerStore for LocalBreakerStore {
    async fn load(&self) -> Result<Option<BreakerRecord>, CoordinationError> {
        Ok(self
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: BreakerRecord,
    ) -> Result<bool, CoordinationError> {
        let mut held = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().map(|r| r.generation) != expected {
            return Ok(false);
        }
        *held = Some(record);
        Ok(true)
    }
}

/// Probe slots in memory: the store of a single node.
#[derive(Debug, Default)]
pub struct LocalProbeSlots {
    inner: Mutex<LocalSlots>,
}

#[derive(Debug, Default)]
struct LocalSlots {
    next_id: u64,
    /// Slot id -> (period, expiry).
    held: HashMap<u64, (u64, Instant)>,
}

#[async_trait]
impl ProbeSlots for LocalProbeSlots {
    async fn try_take(
        &self,
        period: u64,
        limit: u32,
        ttl: Duration,
        now: Instant,
    ) -> Result<Option<ProbeSlot>, CoordinationError> {
        let mut s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // Slots of other periods, and lapsed ones, free themselves.
        s.held.retain(|_, (p, until)| *p == period && *until > now);
        if s.held.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            return Ok(None);
        }
        let id = s.next_id;
        s.next_id = s.next_id.wrapping_add(1);
        s.held.insert(id, (period, now + ttl));
        Ok(Some(ProbeSlot { period, id }))
    }

    async fn give_back(&self, slot: ProbeSlot) -> Result<(), CoordinationError> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .held
            .remove(&slot.id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a future that never waits (the local stores never do).
    fn now<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("a local store waited"),
        }
    }

    fn record(generation: u64, state: State) -> BreakerRecord {
        BreakerRecord {
            state,
            reason: "test".into(),
            limit: 4,
            generation,
        }
    }

    #[test]
    fn a_record_changes_only_from_the_generation_it_was_read_at() {
        let store = LocalBreakerStore::default();
        assert_eq!(now(store.load()), Ok(None));
        assert_eq!(
            now(store.compare_and_set(None, record(1, State::Open))),
            Ok(true)
        );
        // A second node that read nothing loses the race.
        assert_eq!(
            now(store.compare_and_set(None, record(1, State::Closed))),
            Ok(false)
        );
        assert_eq!(
            now(store.compare_and_set(Some(1), record(2, State::HalfOpen))),
            Ok(true)
        );
        assert_eq!(now(store.load()), Ok(Some(record(2, State::HalfOpen))));
    }

    #[test]
    fn slots_are_bounded_per_period_and_lapse_after_their_ttl() {
        let slots = LocalProbeSlots::default();
        let t = Instant::now();
        let ttl = Duration::from_secs(5);
        let a = now(slots.try_take(1, 2, ttl, t))
            .expect("ok")
            .expect("first");
        let _b = now(slots.try_take(1, 2, ttl, t))
            .expect("ok")
            .expect("second");
        assert_eq!(now(slots.try_take(1, 2, ttl, t)), Ok(None), "limit of 2");
        now(slots.give_back(a)).expect("give back");
        assert!(now(slots.try_take(1, 2, ttl, t)).expect("ok").is_some());
        // A dead holder's slots lapse; a new period starts empty.
        let later = t + ttl + Duration::from_millis(1);
        assert!(now(slots.try_take(1, 2, ttl, later)).expect("ok").is_some());
        let other = now(slots.try_take(2, 1, ttl, t)).expect("ok");
        assert!(other.is_some(), "period 2 starts empty");
        assert_eq!(now(slots.try_take(2, 1, ttl, t)), Ok(None));
    }
}
