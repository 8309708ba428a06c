//! Hot-key lanes: at most `per_key` messages of one entity key applied at
//! once, and a small per-key breaker that parks a key whose row is locked.
//!
//! Pure logic, no I/O, time injected: the dispatcher asks [`Lanes::admit`]
//! for every claimed message and reports with [`Lanes::finish`].
//! Ordered maps, not hash maps: the same calls give the same answers in
//! every process, so a simulation seed (`breakwater-sim`) replays exactly.
//!
//! # Why
//!
//! A burst for one hot row (order 1042) must occupy one connection, not the
//! pool. So a message whose key is busy waits here, in memory, while
//! messages for other keys run. And when a message of that key fails on the
//! row's lock (lock timeout, deadlock), the key is *parked*: its messages
//! are handed back to the queue untried (no attempt counted) until the park
//! ends, then one message goes through as the key's probe. Parks grow
//! (base, 2x base, ... up to the cap) while the key keeps failing and reset
//! on its first success. One locked row thus costs at most one waiting
//! session at a time, the rest of the fleet keeps flowing, and the global
//! breaker is left for global trouble (a slow or unreachable database).
//!
//! # Invariants
//!
//! - at most `per_key` running messages per key;
//! - a parked key runs nothing until its park ends;
//! - at most `max_held` messages wait in memory, and at most
//!   `max_held_per_key` behind one key (so a held message's lease does not
//!   run out behind a long line); beyond that a message is released back
//!   to the queue with a short delay;
//! - every item handed to `admit` comes back exactly once: as `Run`, as
//!   `Release`, or later from `finish` / `drain`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// What to do with an admitted message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<T> {
    /// Apply it now.
    Run(T),
    /// Kept here until its key is free.
    Held,
    /// Hand it back to the queue untried, visible again after the delay.
    Release(T, Duration),
}

/// How a message of a key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneOutcome {
    Success,
    /// The row's lock: lock timeout, deadlock, busy.
    LockFailure,
    /// Anything else (other failures do not park the key).
    Other,
}

/// What `finish` decided: messages to run now and messages to release.
#[derive(Debug)]
pub struct Next<T> {
    pub run: Vec<T>,
    pub release: Vec<(T, Duration)>,
    /// Set when this outcome parked the key, for logging.
    pub parked_for: Option<Duration>,
    /// Set when this success ended a park of the key (its probe went
    /// through): a fleet tells the other nodes.
    pub unparked: bool,
    /// Set with `parked_for` when the park is this node's own to announce
    /// (false when another node of the fleet had parked the key already:
    /// that node keeps probing it).
    pub park_is_own: bool,
}

impl<T> Default for Next<T> {
    fn default() -> Self {
        Self {
            run: Vec::new(),
            release: Vec::new(),
            parked_for: None,
            unparked: false,
            park_is_own: false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Park {
    until: Instant,
    strikes: u32,
    /// Parked because another node of the fleet parked it: that node probes
    /// the key, this one waits for it to say the key is free again.
    elsewhere: bool,
}

/// Settings of the lanes.
#[derive(Debug, Clone, Copy)]
pub struct LaneSettings {
    /// Messages of one key applied at once; 0 disables lanes.
    pub per_key: u32,
    /// Messages waiting in memory, all keys together.
    pub max_held: usize,
    /// Messages waiting in memory behind one key.
    pub max_held_per_key: usize,
    /// First park of a key after a lock failure.
    pub park_base: Duration,
    /// Longest park.
    pub park_cap: Duration,
    /// Delay of a message released because too many are held.
    pub overflow_delay: Duration,
    /// Hold a parked key's messages in memory (within `max_held` and
    /// `max_held_per_key`) until its park ends, instead of handing them
    /// back: for a queue that cannot leave a key's messages queued, where
    /// handing them back only brings them back at the next claim.
    pub hold_parked: bool,
}

impl Default for LaneSettings {
    fn default() -> Self {
        Self {
            per_key: 1,
            max_held: 256,
            max_held_per_key: 8,
            park_base: Duration::from_millis(500),
            park_cap: Duration::from_secs(4),
            overflow_delay: Duration::from_millis(200),
            hold_parked: false,
        }
    }
}

/// A parked key, for status output (the admin API's type).
pub use breakwater_admin_api::ParkedKey;

/// The lanes of every key.
#[derive(Debug)]
pub struct Lanes<T> {
    settings: LaneSettings,
    running: BTreeMap<String, u32>,
    waiting: BTreeMap<String, VecDeque<T>>,
    held: usize,
    parked: BTreeMap<String, Park>,
}

impl<T> Lanes<T> {
    pub fn new(settings: LaneSettings) -> Self {
        Self {
            settings,
            running: BTreeMap::new(),
            waiting: BTreeMap::new(),
            held: 0,
            parked: BTreeMap::new(),
        }
    }

    /// Messages waiting in memory.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The messages waiting in memory, in no particular order.
    pub fn held_items(&self) -> impl Iterator<Item = &T> {
        self.waiting.values().flatten()
    }

    /// Whether a message of `key` would run now (not parked, lane free).
    pub fn can_run(&self, key: Option<&str>, now: Instant) -> bool {
        let Some(key) = key.filter(|_| self.settings.per_key > 0) else {
            return true;
        };
        let parked = self.parked.get(key).is_some_and(|p| p.until > now);
        !parked && self.running.get(key).copied().unwrap_or(0) < self.settings.per_key
    }

    /// Keys whose messages cannot be taken now: parked, or with a full
    /// line of held messages. The dispatcher leaves them in the queue.
    pub fn blocked_keys(&self, now: Instant) -> Vec<String> {
        if self.settings.per_key == 0 {
            return Vec::new();
        }
        let parked = self
            .parked
            .iter()
            .filter(|(_, p)| p.until > now)
            .map(|(k, _)| k.clone());
        let full = self
            .waiting
            .iter()
            .filter(|(_, q)| q.len() >= self.settings.max_held_per_key)
            .map(|(k, _)| k.clone());
        let mut keys: Vec<String> = parked.chain(full).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Decides what to do with a message of `key` (`None`: no lane).
    pub fn admit(&mut self, key: Option<&str>, item: T, now: Instant) -> Admit<T> {
        let Some(key) = key.filter(|_| self.settings.per_key > 0) else {
            return Admit::Run(item);
        };
        if let Some(park) = self.parked.get(key)
            && park.until > now
        {
            let remaining = park.until - now;
            return if self.settings.hold_parked && self.has_room(key) {
                self.hold(key, item)
            } else {
                Admit::Release(item, remaining)
            };
        }
        let running = self.running.get(key).copied().unwrap_or(0);
        if running < self.settings.per_key {
            *self.running.entry(key.to_owned()).or_insert(0) += 1;
            return Admit::Run(item);
        }
        if !self.has_room(key) {
            return Admit::Release(item, self.settings.overflow_delay);
        }
        self.hold(key, item)
    }

    /// Whether one more message of `key` may wait in memory.
    fn has_room(&self, key: &str) -> bool {
        let behind_key = self.waiting.get(key).map_or(0, VecDeque::len);
        self.held < self.settings.max_held && behind_key < self.settings.max_held_per_key
    }

    fn hold(&mut self, key: &str, item: T) -> Admit<T> {
        self.waiting
            .entry(key.to_owned())
            .or_default()
            .push_back(item);
        self.held += 1;
        Admit::Held
    }

    /// Up to `max` held messages that may run now: of keys whose park has
    /// ended and whose lane has room (with `hold_parked`, nothing else
    /// starts them). Each is counted as running.
    pub fn due(&mut self, now: Instant, max: usize) -> Vec<T> {
        let mut out = Vec::new();
        if max == 0 || self.held == 0 {
            return out;
        }
        let ready: Vec<String> = self
            .waiting
            .keys()
            .filter(|k| {
                let parked = self.parked.get(*k).is_some_and(|p| p.until > now);
                !parked && self.running.get(*k).copied().unwrap_or(0) < self.settings.per_key
            })
            .cloned()
            .collect();
        for key in ready {
            while out.len() < max
                && self.running.get(&key).copied().unwrap_or(0) < self.settings.per_key
            {
                let Some(queue) = self.waiting.get_mut(&key) else {
                    break;
                };
                let Some(item) = queue.pop_front() else {
                    break;
                };
                if queue.is_empty() {
                    self.waiting.remove(&key);
                }
                self.held -= 1;
                *self.running.entry(key.clone()).or_insert(0) += 1;
                out.push(item);
            }
        }
        out
    }

    /// A running message of `key` ended with `outcome`.
    pub fn finish(&mut self, key: Option<&str>, outcome: LaneOutcome, now: Instant) -> Next<T> {
        let mut next = Next::default();
        let Some(key) = key.filter(|_| self.settings.per_key > 0) else {
            return next;
        };
        if let Some(n) = self.running.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(key);
            }
        }
        match outcome {
            LaneOutcome::Success => {
                next.unparked = self.parked.remove(key).is_some_and(|p| !p.elsewhere);
            }
            LaneOutcome::LockFailure => {
                let before = self.parked.get(key).copied();
                let strikes = before.map_or(0, |p| p.strikes) + 1;
                let park = self
                    .settings
                    .park_base
                    .saturating_mul(1u32 << (strikes - 1).min(16))
                    .min(self.settings.park_cap);
                // A key another node parked meanwhile stays that node's to
                // probe: this failure (of an apply begun before the news)
                // only lengthens the wait here.
                let elsewhere = before.is_some_and(|p| p.elsewhere && p.until > now);
                let until = match before {
                    Some(p) if elsewhere => p.until.max(now + park),
                    _ => now + park,
                };
                self.parked.insert(
                    key.to_owned(),
                    Park {
                        until,
                        strikes,
                        elsewhere,
                    },
                );
                next.parked_for = Some(park);
                next.park_is_own = !elsewhere;
                // Everything waiting behind the locked row goes back
                // untried (or, with `hold_parked`, waits out the park).
                if !self.settings.hold_parked
                    && let Some(queue) = self.waiting.remove(key)
                {
                    self.held -= queue.len();
                    next.release.extend(queue.into_iter().map(|t| (t, park)));
                }
                return next;
            }
            LaneOutcome::Other => {}
        }
        // Start the next waiting message of the key, if any.
        let running = self.running.get(key).copied().unwrap_or(0);
        if running < self.settings.per_key
            && let Some(queue) = self.waiting.get_mut(key)
        {
            if let Some(item) = queue.pop_front() {
                self.held -= 1;
                *self.running.entry(key.to_owned()).or_insert(0) += 1;
                next.run.push(item);
            }
            if queue.is_empty() {
                self.waiting.remove(key);
            }
        }
        next
    }

    /// Another node of the fleet parked `key` for `park`: this node parks
    /// it too, for `park` and `grace` more (the other node probes the key
    /// meanwhile and says again if it parks it again), unless this node
    /// parked the key itself and keeps it (`keep_own`: of two nodes that
    /// parked one key at once, one keeps probing it, the other yields).
    /// Returns the messages to hand back, as a park of this node's own
    /// would.
    pub fn park_elsewhere(
        &mut self,
        key: &str,
        park: Duration,
        grace: Duration,
        keep_own: bool,
        now: Instant,
    ) -> Vec<(T, Duration)> {
        if self.settings.per_key == 0 {
            return Vec::new();
        }
        let own = self
            .parked
            .get(key)
            .filter(|p| p.until > now && !p.elsewhere);
        if own.is_some() && keep_own {
            return Vec::new();
        }
        let until = now + park + grace;
        let strikes = self.parked.get(key).map_or(0, |p| p.strikes);
        let until = self.parked.get(key).map_or(until, |p| p.until.max(until));
        self.parked.insert(
            key.to_owned(),
            Park {
                until,
                strikes,
                elsewhere: true,
            },
        );
        if self.settings.hold_parked {
            return Vec::new();
        }
        let left = until - now;
        match self.waiting.remove(key) {
            Some(queue) => {
                self.held -= queue.len();
                queue.into_iter().map(|t| (t, left)).collect()
            }
            None => Vec::new(),
        }
    }

    /// The node that parked `key` saw it succeed: a park this node took
    /// from it ends.
    pub fn unpark_elsewhere(&mut self, key: &str) {
        if self.parked.get(key).is_some_and(|p| p.elsewhere) {
            self.parked.remove(key);
        }
    }

    /// A message `finish` handed out to run will not run after all (the
    /// breaker closed the gate): give its slot back without starting the
    /// next one. The key's other messages stay held for [`Lanes::drain`].
    pub fn unstart(&mut self, key: Option<&str>) {
        let Some(key) = key.filter(|_| self.settings.per_key > 0) else {
            return;
        };
        if let Some(n) = self.running.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(key);
            }
        }
    }

    /// Takes every waiting message out (breaker opened, or shutdown).
    pub fn drain(&mut self) -> Vec<T> {
        self.held = 0;
        std::mem::take(&mut self.waiting)
            .into_values()
            .flatten()
            .collect()
    }

    /// Keys parked now.
    pub fn parked(&self, now: Instant) -> Vec<ParkedKey> {
        let mut keys: Vec<ParkedKey> = self
            .parked
            .iter()
            .filter(|(_, p)| p.until > now)
            .map(|(k, p)| ParkedKey {
                key: k.clone(),
                remaining_ms: u64::try_from((p.until - now).as_millis()).unwrap_or(u64::MAX),
                strikes: p.strikes,
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        keys
    }

    /// Forgets parks that ended long ago (bounded memory).
    pub fn forget_old_parks(&mut self, now: Instant) {
        let cap = self.settings.park_cap;
        self.parked.retain(|_, p| p.until + cap * 4 > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes() -> Lanes<u32> {
        Lanes::new(LaneSettings {
            max_held: 3,
            ..LaneSettings::default()
        })
    }

    #[test]
    fn one_at_a_time_per_key_others_flow() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("1042"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("1042"), 2, t), Admit::Held);
        assert_eq!(l.admit(Some("1043"), 3, t), Admit::Run(3));
        assert_eq!(l.admit(None, 4, t), Admit::Run(4));
        let next = l.finish(Some("1042"), LaneOutcome::Success, t);
        assert_eq!(next.run, vec![2]);
        assert!(next.release.is_empty());
        assert_eq!(l.held(), 0);
        let next = l.finish(Some("1042"), LaneOutcome::Success, t);
        assert!(next.run.is_empty());
    }

    #[test]
    fn overflow_is_released_not_dropped() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("k"), 0, t), Admit::Run(0));
        for i in 1..=3 {
            assert_eq!(l.admit(Some("k"), i, t), Admit::Held);
        }
        assert!(matches!(l.admit(Some("k"), 4, t), Admit::Release(4, _)));
        assert_eq!(l.held(), 3);
        // The total bound holds across keys.
        assert_eq!(l.admit(Some("other"), 5, t), Admit::Run(5));
        assert!(matches!(l.admit(Some("other"), 6, t), Admit::Release(6, _)));
    }

    #[test]
    fn per_key_bound_releases_the_excess_of_one_key() {
        let t = Instant::now();
        let mut l = Lanes::new(LaneSettings {
            max_held: 100,
            max_held_per_key: 2,
            ..LaneSettings::default()
        });
        assert_eq!(l.admit(Some("hot"), 0, t), Admit::Run(0));
        assert_eq!(l.admit(Some("hot"), 1, t), Admit::Held);
        assert_eq!(l.admit(Some("hot"), 2, t), Admit::Held);
        assert!(matches!(l.admit(Some("hot"), 3, t), Admit::Release(3, _)));
        assert_eq!(l.admit(Some("cold"), 4, t), Admit::Run(4));
        assert_eq!(l.admit(Some("cold"), 5, t), Admit::Held);
    }

    #[test]
    fn lock_failure_parks_key_and_releases_its_waiters() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("1042"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("1042"), 2, t), Admit::Held);
        let next = l.finish(Some("1042"), LaneOutcome::LockFailure, t);
        assert_eq!(next.parked_for, Some(Duration::from_millis(500)));
        assert_eq!(next.release, vec![(2, Duration::from_millis(500))]);
        assert_eq!(l.held(), 0);
        // Parked: released untried with the remaining park.
        let t1 = t + Duration::from_millis(100);
        assert_eq!(
            l.admit(Some("1042"), 3, t1),
            Admit::Release(3, Duration::from_millis(400))
        );
        // Other keys are unaffected.
        assert_eq!(l.admit(Some("1043"), 4, t1), Admit::Run(4));
        // After the park, one message probes the key.
        let t2 = t + Duration::from_millis(600);
        assert_eq!(l.admit(Some("1042"), 5, t2), Admit::Run(5));
        assert_eq!(l.admit(Some("1042"), 6, t2), Admit::Held);
        // It fails again: a longer park.
        let next = l.finish(Some("1042"), LaneOutcome::LockFailure, t2);
        assert_eq!(next.parked_for, Some(Duration::from_secs(1)));
        assert_eq!(l.parked(t2).len(), 1);
        assert_eq!(l.parked(t2)[0].strikes, 2);
    }

    #[test]
    fn parks_grow_to_the_cap_and_reset_on_success() {
        let mut t = Instant::now();
        let mut l = lanes();
        let mut parks = Vec::new();
        for i in 0..6 {
            assert_eq!(l.admit(Some("k"), i, t), Admit::Run(i));
            let next = l.finish(Some("k"), LaneOutcome::LockFailure, t);
            let park = next.parked_for.expect("parked");
            parks.push(park.as_millis());
            t += park;
        }
        assert_eq!(parks, vec![500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(l.admit(Some("k"), 9, t), Admit::Run(9));
        let _ = l.finish(Some("k"), LaneOutcome::Success, t);
        assert!(l.parked(t).is_empty());
        assert_eq!(l.admit(Some("k"), 10, t), Admit::Run(10));
        let next = l.finish(Some("k"), LaneOutcome::LockFailure, t);
        assert_eq!(next.parked_for, Some(Duration::from_millis(500)));
    }

    #[test]
    fn a_key_parked_elsewhere_waits_here_until_the_other_node_frees_it() {
        let t = Instant::now();
        let mut l = lanes();
        let (park, grace) = (Duration::from_millis(500), Duration::from_secs(4));
        assert!(l.park_elsewhere("k", park, grace, false, t).is_empty());
        assert!(!l.can_run(Some("k"), t));
        assert!(matches!(l.admit(Some("k"), 1, t), Admit::Release(1, _)));
        // Past the other node's park, still parked: it probes, not this one.
        assert!(!l.can_run(Some("k"), t + park + Duration::from_millis(1)));
        // It says the key is free.
        l.unpark_elsewhere("k");
        assert!(l.can_run(Some("k"), t));
        // If it goes silent, the park lapses after the grace.
        l.park_elsewhere("k", park, grace, false, t);
        assert!(l.can_run(Some("k"), t + park + grace));
    }

    #[test]
    fn a_lock_failure_on_a_key_parked_elsewhere_leaves_it_to_that_node() {
        let t = Instant::now();
        let mut l = lanes();
        // An apply began, then another node parked the key, then the apply
        // failed on the lock: the park stays the other node's.
        assert_eq!(l.admit(Some("k"), 1, t), Admit::Run(1));
        l.park_elsewhere(
            "k",
            Duration::from_millis(500),
            Duration::from_secs(4),
            false,
            t,
        );
        let next = l.finish(Some("k"), LaneOutcome::LockFailure, t);
        assert!(next.parked_for.is_some());
        assert!(!next.park_is_own, "not this node's to announce");
        l.unpark_elsewhere("k");
        assert!(
            l.can_run(Some("k"), t),
            "the other node's success frees it here"
        );
        // A failure of its own is announced.
        assert_eq!(l.admit(Some("k"), 2, t), Admit::Run(2));
        assert!(l.finish(Some("k"), LaneOutcome::LockFailure, t).park_is_own);
    }

    #[test]
    fn of_two_nodes_that_parked_one_key_one_keeps_probing() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("k"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("k"), 2, t), Admit::Held);
        let next = l.finish(Some("k"), LaneOutcome::LockFailure, t);
        assert!(next.parked_for.is_some());
        let grace = Duration::from_secs(4);
        // This node keeps its own park: nothing changes.
        assert!(
            l.park_elsewhere("k", Duration::from_secs(1), grace, true, t)
                .is_empty()
        );
        l.unpark_elsewhere("k");
        assert!(!l.can_run(Some("k"), t), "its own park stands");
        // It yields: the other node's park replaces it, and its own probe
        // no longer comes when its park would have ended.
        l.park_elsewhere("k", Duration::from_secs(1), grace, false, t);
        assert!(!l.can_run(Some("k"), t + Duration::from_secs(2)));
        // A success after its own park says so; after a park taken from
        // elsewhere it does not.
        let mut own = lanes();
        assert_eq!(own.admit(Some("j"), 1, t), Admit::Run(1));
        own.finish(Some("j"), LaneOutcome::LockFailure, t);
        let later = t + Duration::from_secs(5);
        assert_eq!(own.admit(Some("j"), 2, later), Admit::Run(2));
        assert!(own.finish(Some("j"), LaneOutcome::Success, later).unparked);
    }

    #[test]
    fn other_failures_do_not_park() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("k"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("k"), 2, t), Admit::Held);
        let next = l.finish(Some("k"), LaneOutcome::Other, t);
        assert_eq!(next.run, vec![2]);
        assert!(l.parked(t).is_empty());
    }

    #[test]
    fn drain_returns_every_held_message() {
        let t = Instant::now();
        let mut l = lanes();
        let _ = l.admit(Some("a"), 1, t);
        let _ = l.admit(Some("a"), 2, t);
        let _ = l.admit(Some("b"), 3, t);
        let _ = l.admit(Some("b"), 4, t);
        let mut drained = l.drain();
        drained.sort_unstable();
        assert_eq!(drained, vec![2, 4]);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn unstart_frees_the_slot_without_starting_the_next() {
        let t = Instant::now();
        let mut l = lanes();
        assert_eq!(l.admit(Some("k"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("k"), 2, t), Admit::Held);
        assert_eq!(l.admit(Some("k"), 3, t), Admit::Held);
        let next = l.finish(Some("k"), LaneOutcome::Success, t);
        assert_eq!(next.run, vec![2]);
        l.unstart(Some("k"));
        assert!(l.can_run(Some("k"), t));
        assert_eq!(l.held(), 1);
        assert_eq!(l.drain(), vec![3]);
    }

    #[test]
    fn blocked_keys_are_parked_or_full() {
        let t = Instant::now();
        let mut l = Lanes::new(LaneSettings {
            max_held_per_key: 1,
            ..LaneSettings::default()
        });
        assert_eq!(l.admit(Some("full"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("full"), 2, t), Admit::Held);
        assert_eq!(l.admit(Some("locked"), 3, t), Admit::Run(3));
        let _ = l.finish(Some("locked"), LaneOutcome::LockFailure, t);
        assert_eq!(l.admit(Some("free"), 4, t), Admit::Run(4));
        assert_eq!(
            l.blocked_keys(t),
            vec!["full".to_owned(), "locked".to_owned()]
        );
        assert_eq!(
            l.blocked_keys(t + Duration::from_secs(1)),
            vec!["full".to_owned()]
        );
    }

    #[test]
    fn disabled_lanes_run_everything() {
        let t = Instant::now();
        let mut l = Lanes::new(LaneSettings {
            per_key: 0,
            ..LaneSettings::default()
        });
        assert_eq!(l.admit(Some("k"), 1, t), Admit::Run(1));
        assert_eq!(l.admit(Some("k"), 2, t), Admit::Run(2));
    }

    #[test]
    fn held_through_a_park_and_started_when_it_ends() {
        let mut l = Lanes::new(LaneSettings {
            hold_parked: true,
            ..LaneSettings::default()
        });
        let t = Instant::now();
        assert!(matches!(l.admit(Some("hot"), 1, t), Admit::Run(1)));
        assert!(matches!(l.admit(Some("hot"), 2, t), Admit::Held));
        let next = l.finish(Some("hot"), LaneOutcome::LockFailure, t);
        assert!(next.release.is_empty(), "kept through the park");
        // Parked: a new one is held too, and nothing is due yet.
        assert!(matches!(l.admit(Some("hot"), 3, t), Admit::Held));
        assert!(l.due(t, 10).is_empty());
        assert_eq!(l.held(), 2);
        // The park ends: one at a time per key.
        let after = t + Duration::from_secs(1);
        assert_eq!(l.due(after, 10), vec![2]);
        assert!(l.due(after, 10).is_empty(), "the lane is busy");
        let next = l.finish(Some("hot"), LaneOutcome::Success, after);
        assert_eq!(next.run, vec![3]);
        assert_eq!(l.held(), 0);
    }
}
