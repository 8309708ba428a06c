//! Half-open probe admission: at most N probes outstanding per half-open
//! period.
//!
//! Admission is a trait so a fleet can share it: the Redis store implements
//! [`ProbeAdmission`] with a counter or `SET NX PX` slots keyed by the
//! period, so HALF_OPEN admits exactly N probes fleet-wide. The breaker owns
//! one and calls it from [`crate::Breaker::try_admit_probe`] and
//! [`crate::Breaker::record_probe_outcome`]; [`LocalProbeAdmission`] is the
//! in-memory one for a single node.
//!
//! A *period* is one stay in half-open (the breaker numbers them); a ticket
//! from an earlier period is stale and frees nothing, so a probe answered
//! after the breaker moved on cannot open a slot in the next half-open.

use std::time::Instant;

/// Proof that a probe was admitted; hand it back with the probe's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeTicket {
    /// The half-open period that admitted it.
    pub period: u64,
    /// Unique within the period.
    pub id: u64,
}

/// Who may send a probe while half-open.
pub trait ProbeAdmission {
    /// A new half-open period starts: forget every slot of earlier ones.
    fn begin_period(&mut self, period: u64, now: Instant);

    /// Takes a slot of `period` if fewer than `limit` probes are outstanding.
    fn try_admit_probe(&mut self, period: u64, limit: u32, now: Instant) -> Option<ProbeTicket>;

    /// Frees the ticket's slot. `false` when the ticket is unknown or from
    /// another period (its outcome must not count as a probe result).
    fn complete_probe(&mut self, ticket: ProbeTicket, now: Instant) -> bool;

    /// Probes of `period` admitted and not completed.
    fn outstanding(&self, period: u64) -> u32;

    /// When the oldest outstanding probe of `period` was admitted.
    fn oldest_outstanding(&self, period: u64) -> Option<Instant>;
}

/// In-memory admission for one node.
#[derive(Debug, Clone, Default)]
pub struct LocalProbeAdmission {
    period: u64,
    next_id: u64,
    outstanding: Vec<(u64, Instant)>,
}

impl LocalProbeAdmission {
    /// No period open yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ProbeAdmission for LocalProbeAdmission {
    fn begin_period(&mut self, period: u64, _now: Instant) {
        self.period = period;
        self.outstanding.clear();
    }

    fn try_admit_probe(&mut self, period: u64, limit: u32, now: Instant) -> Option<ProbeTicket> {
        if period != self.period {
            return None;
        }
        if self.outstanding.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            return None;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.outstanding.push((id, now));
        Some(ProbeTicket { period, id })
    }

    fn complete_probe(&mut self, ticket: ProbeTicket, _now: Instant) -> bool {
        if ticket.period != self.period {
            return false;
        }
        match self.outstanding.iter().position(|(id, _)| *id == ticket.id) {
            Some(i) => {
                self.outstanding.swap_remove(i);
                true
            }
            None => false,
        }
    }

    fn outstanding(&self, period: u64) -> u32 {
        if period == self.period {
            u32::try_from(self.outstanding.len()).unwrap_or(u32::MAX)
        } else {
            0
        }
    }

    fn oldest_outstanding(&self, period: u64) -> Option<Instant> {
        if period != self.period {
            return None;
        }
        self.outstanding.iter().map(|(_, at)| *at).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_at_most_limit_and_frees_on_completion() {
        let now = Instant::now();
        let mut a = LocalProbeAdmission::new();
        a.begin_period(1, now);
        let t1 = a.try_admit_probe(1, 2, now);
        let t2 = a.try_admit_probe(1, 2, now);
        assert!(t1.is_some() && t2.is_some());
        assert_eq!(a.try_admit_probe(1, 2, now), None);
        assert_eq!(a.outstanding(1), 2);
        assert!(t1.is_some_and(|t| a.complete_probe(t, now)));
        assert!(
            t1.is_some_and(|t| !a.complete_probe(t, now)),
            "double completion"
        );
        assert!(a.try_admit_probe(1, 2, now).is_some());
        assert_eq!(a.oldest_outstanding(1), Some(now));
        assert_eq!(a.oldest_outstanding(2), None);
    }

    #[test]
    fn stale_tickets_free_nothing() {
        let now = Instant::now();
        let mut a = LocalProbeAdmission::new();
        a.begin_period(1, now);
        let old = a.try_admit_probe(1, 1, now);
        a.begin_period(2, now);
        assert_eq!(a.try_admit_probe(1, 1, now), None, "old period closed");
        let cur = a.try_admit_probe(2, 1, now);
        assert!(cur.is_some());
        assert!(old.is_some_and(|t| !a.complete_probe(t, now)));
        assert_eq!(a.outstanding(2), 1);
    }
}
