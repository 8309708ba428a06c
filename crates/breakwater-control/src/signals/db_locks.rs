//! The database's own view: sessions waiting on a lock.
//!
//! The service counts rows of `pg_stat_activity` with
//! `wait_event_type = 'Lock'` and reports the number; the latest sample
//! counts while younger than `sample_ttl_ms`, so a monitor that stopped
//! reporting cannot hold the breaker open forever.

use std::time::{Duration, Instant};

use super::Reading;
use crate::config::DbLockWaitersConfig;
use crate::reason::Reason;
use crate::signals::SignalKind;

/// Latest lock-waiter count.
#[derive(Debug, Clone)]
pub(crate) struct DbLockSignal {
    cfg: DbLockWaitersConfig,
    ttl: Duration,
    last: Option<(u32, Instant)>,
}

impl DbLockSignal {
    pub(crate) fn new(cfg: &DbLockWaitersConfig) -> Self {
        Self {
            cfg: cfg.clone(),
            ttl: Duration::from_millis(cfg.sample_ttl_ms),
            last: None,
        }
    }

    pub(crate) fn observe(&mut self, count: u32, now: Instant) {
        if self.last.is_none_or(|(_, at)| now >= at) {
            self.last = Some((count, now));
        }
    }

    pub(crate) fn reading(&self, now: Instant) -> Reading {
        let c = &self.cfg;
        let fresh = self
            .last
            .filter(|(_, at)| now.saturating_duration_since(*at) <= self.ttl)
            .map(|(n, _)| n);
        let trip = fresh
            .filter(|n| c.enabled && *n > c.max_waiters)
            .map(|count| Reason::DbLockWaiters {
                count,
                threshold: c.max_waiters,
            });
        Reading {
            kind: SignalKind::DbLockWaiters,
            enabled: c.enabled,
            value: fresh.map(f64::from),
            threshold: f64::from(c.max_waiters),
            detail: match fresh {
                Some(n) => format!("{n} sessions waiting on a lock"),
                None => "no fresh sample".to_owned(),
            },
            trip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_above_threshold_and_expires() {
        let t0 = Instant::now();
        let mut s = DbLockSignal::new(&DbLockWaitersConfig::default());
        assert_eq!(s.reading(t0).value, None);
        s.observe(10, t0);
        assert!(s.reading(t0).trip.is_none());
        s.observe(11, t0);
        assert_eq!(
            s.reading(t0).trip.map(|r| r.to_string()),
            Some("database lock waiters 11 > 10".into())
        );
        assert!(s.reading(t0 + Duration::from_secs(11)).trip.is_none());
    }
}
