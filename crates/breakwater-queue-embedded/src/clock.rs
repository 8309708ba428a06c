//! The embedded queue's clock. Leases, retry delays and the dedup window
//! are stored as Unix milliseconds (`visible_at`), so the store reads the
//! same after a restart. Read straight from the wall clock, a step of the
//! system clock while the process runs (NTP, an operator, a VM resumed)
//! would expire every lease at once (a step forward: every in-flight
//! message handed to a second worker) or hold them all for the step (a step
//! back).
//!
//! So the wall clock is read once per process, and time then advances by
//! the monotonic clock: a step while running moves nothing. Across a
//! restart it is the wall clock again, which is what the stored times mean.
//! The two drift apart only by what NTP slews (parts per million).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The wall-clock reading a process's queue time starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchor {
    wall_ms: i64,
    at: Instant,
}

impl Anchor {
    fn now() -> Self {
        Self {
            wall_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            at: Instant::now(),
        }
    }

    /// Queue time at `instant`: the anchor's wall time plus the monotonic
    /// time since.
    pub(crate) fn at(self, instant: Instant) -> i64 {
        let since = instant.saturating_duration_since(self.at).as_millis();
        self.wall_ms
            .saturating_add(i64::try_from(since).unwrap_or(i64::MAX))
    }
}

/// Milliseconds since the Unix epoch, as this process's queue counts them.
pub fn now_ms() -> i64 {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(Anchor::now).at(Instant::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn queue_time_follows_the_monotonic_clock_whatever_the_wall_clock_does() {
        let start = Instant::now();
        let anchor = Anchor {
            wall_ms: 1_700_000_000_000,
            at: start,
        };
        // A lease taken now for 30 s ends at this queue time...
        let lease_end = anchor.at(start) + 30_000;
        // ...and 10 s later it has not ended, whatever the wall clock was
        // stepped to meanwhile: the queue never reads it again.
        let later = start + Duration::from_secs(10);
        assert_eq!(anchor.at(later), 1_700_000_010_000);
        assert!(anchor.at(later) < lease_end);
        assert_eq!(
            anchor.at(start + Duration::from_secs(31)),
            lease_end + 1_000
        );
    }

    #[test]
    fn queue_time_starts_at_the_wall_clock_and_never_goes_back() {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let first = now_ms();
        assert!((first - wall).abs() < 60_000, "{first} vs wall {wall}");
        let mut last = first;
        for _ in 0..1000 {
            let t = now_ms();
            assert!(t >= last);
            last = t;
        }
    }
}
