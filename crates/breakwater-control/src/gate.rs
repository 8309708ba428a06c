//! The gate workers read before each poll, lock-free.
//!
//! The breaker lives behind a mutex in the service; workers must not take
//! that mutex on every poll. Instead the breaker publishes a
//! [`GateSnapshot`] into a [`SharedGate`] whenever what workers should do
//! changes, and workers read it with one atomic load.
//!
//! Layout of the packed `u64` (one `AtomicU64`, Release on store, Acquire on
//! load, so a worker never sees a half-written snapshot):
//!
//! | bits | field |
//! |---|---|
//! | 0..32 | `limit` |
//! | 32..34 | `state` (0 closed, 1 open, 2 half-open, 3 ramping) |
//! | 34 | `may_poll` |
//! | 35 | `probe_only` |
//! | 40..64 | `generation` (24 bits, wrapping), bumped on every change |
//!
//! A worker that cached a snapshot can compare generations to notice that
//! the breaker moved (e.g. re-opened) between its check and its poll.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::reason::State;

/// What workers should do right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct GateSnapshot {
    /// The state workers obey (in dry-run mode: always `Closed`).
    pub state: State,
    /// Whether a worker may poll at all.
    pub may_poll: bool,
    /// Concurrency limit for the whole pool (0 when open; the probe count
    /// when half-open).
    pub limit: u32,
    /// Half-open: every poll must first win a probe slot
    /// ([`crate::Breaker::try_admit_probe`]).
    pub probe_only: bool,
    /// Bumped (mod 2^24) each time the published snapshot changes.
    pub generation: u32,
}

const GEN_MASK: u32 = (1 << 24) - 1;

impl GateSnapshot {
    /// The snapshot of a fully closed breaker.
    pub fn closed(limit: u32) -> Self {
        Self {
            state: State::Closed,
            may_poll: true,
            limit,
            probe_only: false,
            generation: 0,
        }
    }

    /// Whether a worker holding `in_use` slots may start one more (not
    /// counting the probe check in half-open).
    pub fn admits(&self, in_use: u32) -> bool {
        self.may_poll && in_use < self.limit
    }

    fn pack(self) -> u64 {
        let state = match self.state {
            State::Closed => 0u64,
            State::Open => 1,
            State::HalfOpen => 2,
            State::Ramping => 3,
        };
        u64::from(self.limit)
            | state << 32
            | u64::from(self.may_poll) << 34
            | u64::from(self.probe_only) << 35
            | u64::from(self.generation & GEN_MASK) << 40
    }

    fn unpack(v: u64) -> Self {
        let state = match (v >> 32) & 0b11 {
            0 => State::Closed,
            1 => State::Open,
            2 => State::HalfOpen,
            _ => State::Ramping,
        };
        Self {
            state,
            may_poll: (v >> 34) & 1 == 1,
            limit: (v & 0xffff_ffff) as u32,
            probe_only: (v >> 35) & 1 == 1,
            generation: ((v >> 40) as u32) & GEN_MASK,
        }
    }

    /// Same decision for workers (everything but the generation).
    pub(crate) fn same_decision(&self, other: &Self) -> bool {
        Self {
            generation: 0,
            ..*self
        } == Self {
            generation: 0,
            ..*other
        }
    }

    pub(crate) fn next_generation(&self) -> u32 {
        self.generation.wrapping_add(1) & GEN_MASK
    }
}

/// A [`GateSnapshot`] shared between the breaker (writer) and the workers
/// (readers); put it in an `Arc`.
#[derive(Debug)]
pub struct SharedGate(AtomicU64);

impl SharedGate {
    /// A gate showing `initial`.
    pub fn new(initial: GateSnapshot) -> Self {
        Self(AtomicU64::new(initial.pack()))
    }

    /// The current snapshot: one atomic load.
    #[inline]
    pub fn load(&self) -> GateSnapshot {
        GateSnapshot::unpack(self.0.load(Ordering::Acquire))
    }

    /// Replaces the snapshot (the breaker does this; tests may too).
    pub fn store(&self, snapshot: GateSnapshot) {
        self.0.store(snapshot.pack(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for state in [State::Closed, State::Open, State::HalfOpen, State::Ramping] {
            for (may_poll, probe_only) in [(true, false), (false, false), (true, true)] {
                let s = GateSnapshot {
                    state,
                    may_poll,
                    limit: u32::MAX - 3,
                    probe_only,
                    generation: GEN_MASK,
                };
                let g = SharedGate::new(s);
                assert_eq!(g.load(), s);
            }
        }
    }

    #[test]
    fn generation_wraps_in_24_bits() {
        let s = GateSnapshot {
            generation: GEN_MASK,
            ..GateSnapshot::closed(4)
        };
        assert_eq!(s.next_generation(), 0);
        assert!(s.admits(3));
        assert!(!s.admits(4));
    }
}
