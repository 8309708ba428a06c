//! Worker heartbeats: how many live workers sit in a long database lock wait.
//!
//! Each worker reports its state now and then ([`Heartbeat`]); the latest
//! beat per worker is kept. A worker is live while its last beat is younger
//! than `heartbeat_ttl_ms`; older beats are dropped by the controller tick, so
//! memory follows the live fleet (and is capped at [`MAX_WORKERS`] against a
//! flood of made-up ids). A lock wait keeps growing between beats: a worker
//! that reported `waited = 1.5 s` one second ago has waited 2.5 s now.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Reading;
use crate::config::LockWaitConfig;
use crate::reason::Reason;
use crate::signals::SignalKind;

/// Most workers tracked at once; beats from further new ids are ignored.
pub const MAX_WORKERS: usize = 65_536;

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Waiting for work (or gated).
    Idle,
    /// Applying a message, not blocked.
    Applying,
    /// Blocked on a database lock for `waited` as of the heartbeat's `at`.
    LockWait {
        /// How long the worker had been waiting when it sent the beat.
        waited: Duration,
    },
}

/// One worker's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The worker's id, unique across the fleet.
    pub worker: u64,
    /// What it is doing.
    pub state: WorkerState,
    /// When it said so.
    pub at: Instant,
}

/// Latest beat per worker.
#[derive(Debug, Clone)]
pub(crate) struct LockWaitSignal {
    cfg: LockWaitConfig,
    ttl: Duration,
    wait: Duration,
    beats: BTreeMap<u64, (WorkerState, Instant)>,
}

impl LockWaitSignal {
    pub(crate) fn new(cfg: &LockWaitConfig) -> Self {
        Self {
            cfg: cfg.clone(),
            ttl: Duration::from_millis(cfg.heartbeat_ttl_ms),
            wait: Duration::from_millis(cfg.wait_ms),
            beats: BTreeMap::new(),
        }
    }

    pub(crate) fn observe(&mut self, hb: &Heartbeat) {
        let known = self.beats.contains_key(&hb.worker);
        if !known && self.beats.len() >= MAX_WORKERS {
            return;
        }
        let entry = self.beats.entry(hb.worker).or_insert((hb.state, hb.at));
        if hb.at >= entry.1 {
            *entry = (hb.state, hb.at);
        }
    }

    /// Forgets a worker that stopped cleanly.
    pub(crate) fn forget(&mut self, worker: u64) {
        self.beats.remove(&worker);
    }

    fn live(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) <= self.ttl
    }

    /// Drops stale beats.
    pub(crate) fn prune(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.beats
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= ttl);
    }

    pub(crate) fn reading(&self, now: Instant) -> Reading {
        let c = &self.cfg;
        let (mut live, mut waiting) = (0u32, 0u32);
        for (state, at) in self.beats.values() {
            if !self.live(*at, now) {
                continue;
            }
            live = live.saturating_add(1);
            let waited_now = |w: &Duration| w.saturating_add(now.saturating_duration_since(*at));
            if matches!(state, WorkerState::LockWait { waited } if waited_now(waited) > self.wait) {
                waiting = waiting.saturating_add(1);
            }
        }
        let judged = live > 0 && live >= c.min_workers;
        let fraction = if live == 0 {
            0.0
        } else {
            f64::from(waiting) / f64::from(live)
        };
        let trip = (c.enabled && judged && fraction > c.fraction).then_some(Reason::LockWait {
            waiting,
            live,
            threshold: c.fraction,
            wait_ms: c.wait_ms,
        });
        Reading {
            kind: SignalKind::LockWait,
            enabled: c.enabled,
            value: judged.then_some(fraction),
            threshold: c.fraction,
            detail: format!(
                "{waiting} of {live} live workers waiting on a lock > {} ms (min {} workers)",
                c.wait_ms, c.min_workers
            ),
            trip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(worker: u64, state: WorkerState, at: Instant) -> Heartbeat {
        Heartbeat { worker, state, at }
    }

    fn wait(ms: u64) -> WorkerState {
        WorkerState::LockWait {
            waited: Duration::from_millis(ms),
        }
    }

    #[test]
    fn trips_above_the_fraction_of_long_waits() {
        let t0 = Instant::now();
        let mut s = LockWaitSignal::new(&LockWaitConfig::default());
        for w in 0..7 {
            s.observe(&beat(w, WorkerState::Applying, t0));
        }
        for w in 7..10 {
            s.observe(&beat(w, wait(2_500), t0));
        }
        // 3 of 10 = 0.30, not above 0.30.
        let r = s.reading(t0);
        assert_eq!(r.value, Some(0.3));
        assert!(r.trip.is_none());
        s.observe(&beat(6, wait(2_001), t0));
        assert!(s.reading(t0).trip.is_some());
    }

    #[test]
    fn short_waits_grow_between_beats() {
        let t0 = Instant::now();
        let mut s = LockWaitSignal::new(&LockWaitConfig::default());
        s.observe(&beat(1, wait(1_500), t0));
        assert!(s.reading(t0).trip.is_none());
        assert!(s.reading(t0 + Duration::from_secs(1)).trip.is_some());
    }

    #[test]
    fn stale_beats_expire() {
        let t0 = Instant::now();
        let mut s = LockWaitSignal::new(&LockWaitConfig::default());
        s.observe(&beat(1, wait(5_000), t0));
        let later = t0 + Duration::from_millis(10_001);
        let r = s.reading(later);
        assert_eq!(r.value, None);
        assert!(r.trip.is_none());
        s.prune(later);
        assert!(s.beats.is_empty());
    }

    #[test]
    fn older_beats_do_not_overwrite_newer_ones() {
        let t0 = Instant::now();
        let mut s = LockWaitSignal::new(&LockWaitConfig::default());
        s.observe(&beat(1, WorkerState::Idle, t0 + Duration::from_secs(1)));
        s.observe(&beat(1, wait(9_000), t0));
        assert!(s.reading(t0 + Duration::from_secs(1)).trip.is_none());
        s.forget(1);
        assert_eq!(s.reading(t0).value, None);
    }
}
