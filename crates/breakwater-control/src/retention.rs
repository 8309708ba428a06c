//! Retention headroom: how long before the oldest queued webhook expires
//! on a broker that drops old messages (SQS's retention period, Kafka's
//! `retention.ms`, a NATS stream's `max_age`), and how long the backlog
//! would take to drain at the rate it is draining now.
//!
//! Pure: the service feeds it the queue's backlog and oldest age once a
//! second with the time in milliseconds. While the breaker is open nothing
//! drains and the oldest message ages one second per second, so the
//! headroom is the time an outage may still last before webhooks are lost
//! on the broker.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// Weight of the newest drain-rate sample in its moving average.
const RATE_WEIGHT: f64 = 0.2;

/// What `GET /breaker` shows under `retention`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct RetentionStatus {
    /// The queue's retention, seconds (none: not configured, so no
    /// headroom; the drain figures still are).
    pub retention_secs: Option<u64>,
    /// Age of the oldest visible message, seconds (0 when the queue is
    /// empty; none when the backend cannot tell).
    pub oldest_age_secs: Option<f64>,
    /// Time left before the oldest message expires, seconds.
    pub headroom_secs: Option<f64>,
    /// Messages waiting (visible and delayed).
    pub backlog: u64,
    /// How fast the backlog shrinks, messages per second (negative: it
    /// grows), averaged over the last samples.
    pub net_drain_per_sec: Option<f64>,
    /// Seconds to drain the backlog at that rate (none while it does not
    /// shrink, or when it is empty).
    pub drain_secs: Option<f64>,
    /// The headroom is under the warning threshold.
    pub at_risk: bool,
    /// The threshold, seconds.
    pub warn_secs: u64,
}

/// Follows the backlog against a retention.
#[derive(Debug, Clone)]
pub struct RetentionWatch {
    retention_secs: Option<u64>,
    warn_secs: u64,
    last: Option<(u64, u64)>,
    net_drain_per_sec: Option<f64>,
}

impl RetentionWatch {
    /// A watch of a queue that keeps messages `retention_secs` (none: as
    /// long as it likes), warning when less than `warn_secs` is left.
    pub fn new(retention_secs: Option<u64>, warn_secs: u64) -> Self {
        Self {
            retention_secs,
            warn_secs,
            last: None,
            net_drain_per_sec: None,
        }
    }

    /// One sample: the backlog and the oldest message's age at `now_ms`.
    pub fn observe(
        &mut self,
        now_ms: u64,
        backlog: u64,
        oldest_age_ms: Option<u64>,
    ) -> RetentionStatus {
        if let Some((at, before)) = self.last {
            let secs = now_ms.saturating_sub(at) as f64 / 1000.0;
            if secs > 0.0 {
                let rate = (before as f64 - backlog as f64) / secs;
                self.net_drain_per_sec = Some(match self.net_drain_per_sec {
                    Some(avg) => avg + RATE_WEIGHT * (rate - avg),
                    None => rate,
                });
            }
        }
        self.last = Some((now_ms, backlog));
        let oldest_age_secs = oldest_age_ms.map(|ms| ms as f64 / 1000.0);
        let headroom_secs = self
            .retention_secs
            .zip(oldest_age_secs)
            .map(|(retention, age)| retention as f64 - age);
        let drain_secs = self
            .net_drain_per_sec
            .filter(|r| *r > 0.0 && backlog > 0)
            .map(|r| backlog as f64 / r);
        RetentionStatus {
            retention_secs: self.retention_secs,
            oldest_age_secs,
            headroom_secs,
            backlog,
            net_drain_per_sec: self.net_drain_per_sec,
            drain_secs,
            at_risk: headroom_secs.is_some_and(|h| h < self.warn_secs as f64),
            warn_secs: self.warn_secs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_eats_the_headroom_and_a_drain_gives_its_time() {
        // Four days' retention, warn with a day left.
        let mut w = RetentionWatch::new(Some(4 * 86_400), 86_400);
        let s = w.observe(0, 0, Some(0));
        assert_eq!(
            (s.headroom_secs, s.at_risk, s.drain_secs),
            (Some(345_600.0), false, None)
        );
        // The breaker open for three days and a bit: 100 arrive a second.
        let t = 3 * 86_400 * 1000 + 1_000;
        let s = w.observe(t, 100 * 259_201, Some(t));
        assert!(s.at_risk, "{s:?}");
        assert!(s.headroom_secs.is_some_and(|h| h < 86_400.0));
        assert!(s.net_drain_per_sec.is_some_and(|r| r < 0.0), "it grew");
        assert_eq!(s.drain_secs, None, "not shrinking");
        // Back: it shrinks by 500 a second for a while.
        let mut backlog = 100 * 259_201u64;
        let mut now = t;
        for _ in 0..30 {
            now += 1_000;
            backlog -= 500;
            w.observe(now, backlog, Some(now - t));
        }
        let s = w.observe(now + 1_000, backlog - 500, Some(now + 1_000 - t));
        let rate = s.net_drain_per_sec.expect("a rate");
        assert!((rate - 500.0).abs() < 1.0, "{rate}");
        let drain = s.drain_secs.expect("shrinking");
        assert!((drain - (backlog - 500) as f64 / rate).abs() < 1e-6);
        assert!(!s.at_risk, "the oldest is young again");
    }

    #[test]
    fn a_backend_that_cannot_tell_the_age_is_never_at_risk() {
        let mut w = RetentionWatch::new(Some(60), 30);
        let s = w.observe(0, 10, None);
        assert_eq!((s.headroom_secs, s.at_risk), (None, false));
    }

    #[test]
    fn without_a_retention_only_the_drain_is_followed() {
        let mut w = RetentionWatch::new(None, 30);
        w.observe(0, 100, Some(90_000));
        let s = w.observe(1_000, 80, Some(91_000));
        assert_eq!((s.headroom_secs, s.at_risk), (None, false));
        assert_eq!(s.net_drain_per_sec, Some(20.0));
        assert_eq!(s.drain_secs, Some(4.0));
    }
}
