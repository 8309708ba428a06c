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
use crate::reason::Reason;
use crate::status::OverrideStatus;

/// The breaker's state as a fleet shares it: enough for another node's
/// breaker to take the same state ([`crate::Breaker::adopt`]). Times are
/// durations as of the moment the view was taken; a store carries them
/// with the wall-clock time it was written and ages them on reading.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SharedBreaker {
    pub state: State,
    /// Why it is in that state (the last transition's reason).
    pub reason: Reason,
    /// The concurrency limit the state allows each node's pool.
    pub limit: u32,
    /// How long it has been in that state.
    pub in_state_ms: u64,
    /// The half-open period (probe slots are counted per period).
    pub period: u64,
    /// The ramp step (index into `ramp.steps`).
    pub ramp_step: u32,
    /// The cool-down of the current opening.
    pub cool_down_ms: u64,
    /// Openings since the breaker was last fully closed (grows the
    /// cool-down).
    pub opens_since_close: u32,
    /// The manual override in force, if any.
    pub manual: Option<OverrideStatus>,
}

/// Which record a change was made on: the store's epoch (a store that lost
/// its data, a Redis restarted empty, starts a new one, so generations
/// counted from 1 again are not taken for old ones) and the generation
/// within it. Compare-and-set keys on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Version {
    pub epoch: u64,
    pub generation: u64,
}

impl Version {
    /// Whether `other` is a later record than `self`: another epoch (the
    /// store started anew), or a later generation of the same one.
    pub fn is_superseded_by(&self, other: Version) -> bool {
        other.epoch != self.epoch || other.generation > self.generation
    }
}

/// The breaker's record as the fleet stores it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerRecord {
    /// Set by the first record of a store (see [`Version`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub epoch: u64,
    /// Bumped by every change.
    pub generation: u64,
    /// The node that wrote it.
    pub node: String,
    /// Wall-clock milliseconds (Unix) when it was written.
    pub written_at_ms: u64,
    /// The state.
    pub breaker: SharedBreaker,
}

impl BreakerRecord {
    /// Its epoch and generation.
    pub fn version(&self) -> Version {
        Version {
            epoch: self.epoch,
            generation: self.generation,
        }
    }

    /// The view aged to `now_ms` (Unix milliseconds): time in state grows,
    /// an override's time left shrinks. A writer's clock ahead of the
    /// reader's ages nothing.
    pub fn aged(&self, now_ms: u64) -> SharedBreaker {
        let age = now_ms.saturating_sub(self.written_at_ms);
        let mut v = self.breaker.clone();
        v.in_state_ms = v.in_state_ms.saturating_add(age);
        if let Some(m) = &mut v.manual {
            m.remaining_ms = m.remaining_ms.map(|r| r.saturating_sub(age));
        }
        v
    }
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

    /// Stores `record` only if the stored record's version is still
    /// `expected` (`None`: no record yet). Returns whether it did; `false`
    /// means another node moved first, and the caller should load and
    /// follow.
    async fn compare_and_set(
        &self,
        expected: Option<Version>,
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

    /// Frees a slot whose probe succeeded and counts the success in its
    /// period; returns the period's successes so far, fleet-wide (the
    /// caller whose success reaches `successes_to_close` starts the ramp).
    async fn succeeded(&self, slot: ProbeSlot) -> Result<u32, CoordinationError>;
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
        expected: Option<Version>,
        record: BreakerRecord,
    ) -> Result<bool, CoordinationError> {
        let mut held = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().map(BreakerRecord::version) != expected {
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
    /// Successes of the latest period: (period, count).
    successes: (u64, u32),
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

    async fn succeeded(&self, slot: ProbeSlot) -> Result<u32, CoordinationError> {
        let mut s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        s.held.remove(&slot.id);
        if s.successes.0 != slot.period {
            s.successes = (slot.period, 0);
        }
        s.successes.1 = s.successes.1.saturating_add(1);
        Ok(s.successes.1)
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
            epoch: 7,
            generation,
            node: "a".into(),
            written_at_ms: 1_000,
            breaker: SharedBreaker {
                state,
                reason: Reason::OverrideCleared,
                limit: 4,
                in_state_ms: 500,
                period: 0,
                ramp_step: 0,
                cool_down_ms: 0,
                opens_since_close: 0,
                manual: Some(OverrideStatus {
                    kind: crate::OverrideKind::Open,
                    note: "test".into(),
                    remaining_ms: Some(2_000),
                }),
            },
        }
    }

    #[test]
    fn a_record_read_later_has_aged() {
        let v = record(1, State::Open).aged(1_300);
        assert_eq!(v.in_state_ms, 800);
        assert_eq!(v.manual.and_then(|m| m.remaining_ms), Some(1_700));
        // A writer whose clock runs ahead ages nothing.
        assert_eq!(record(1, State::Open).aged(900).in_state_ms, 500);
    }

    #[test]
    fn successes_are_counted_per_period() {
        let slots = LocalProbeSlots::default();
        let t = Instant::now();
        let ttl = Duration::from_secs(5);
        let a = now(slots.try_take(1, 3, ttl, t)).expect("ok").expect("a");
        let b = now(slots.try_take(1, 3, ttl, t)).expect("ok").expect("b");
        assert_eq!(now(slots.succeeded(a)), Ok(1));
        assert_eq!(now(slots.succeeded(b)), Ok(2));
        let c = now(slots.try_take(2, 3, ttl, t)).expect("ok").expect("c");
        assert_eq!(now(slots.succeeded(c)), Ok(1), "a new period counts anew");
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
        let v = |generation| Version {
            epoch: 7,
            generation,
        };
        assert_eq!(
            now(store.compare_and_set(Some(v(1)), record(2, State::HalfOpen))),
            Ok(true)
        );
        // The same generation of another epoch is another record.
        let other_epoch = Version {
            epoch: 8,
            generation: 2,
        };
        assert_eq!(
            now(store.compare_and_set(Some(other_epoch), record(3, State::Open))),
            Ok(false)
        );
        assert!(v(2).is_superseded_by(other_epoch));
        assert!(v(2).is_superseded_by(v(3)));
        assert!(!v(2).is_superseded_by(v(2)));
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
