//! Retry backoff: capped exponential with a choice of jitter.
//!
//! With `t = min(cap, base * 2^attempt)`:
//!
//! | [`Jitter`] | delay |
//! |---|---|
//! | `Full` (default) | `random(0, t)` |
//! | `Equal` | `t/2 + random(0, t/2)` |
//! | `Decorrelated` | `min(cap, random(base, 3 * prev))`, `prev` = the last delay, `base` at first |
//! | `None` | `t` |
//!
//! These are the algorithms of the AWS Architecture Blog's "Exponential
//! Backoff and Jitter"; `examples/occ_backoff.rs` reproduces its simulation.
//! Full jitter does the least work for the same completion time, which is
//! why the workers use it. The RNG is passed in, so tests seed it.
//!
//! Arithmetic saturates: a huge `attempt` or `base` gives `cap`, never a
//! panic.

use std::time::Duration;

use rand::Rng;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// How the exponential delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(rename_all = "snake_case")
)]
pub enum Jitter {
    /// `random(0, t)`.
    #[default]
    Full,
    /// `t/2 + random(0, t/2)`.
    Equal,
    /// `min(cap, random(base, 3 * prev))`.
    Decorrelated,
    /// `t`, no randomness.
    None,
}

/// A capped exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Jitter flavour.
    pub kind: Jitter,
    /// Delay scale (and the minimum of decorrelated jitter).
    pub base: Duration,
    /// Longest delay.
    pub cap: Duration,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BackoffPolicy {
    /// Full jitter between `base` and `cap`.
    pub fn full_jitter(base: Duration, cap: Duration) -> Self {
        Self {
            kind: Jitter::Full,
            base,
            cap,
        }
    }

    /// `min(cap, base * 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let base = nanos(self.base);
        let cap = nanos(self.cap);
        let t = if attempt >= 64 {
            u64::MAX
        } else {
            base.saturating_mul(1u64 << attempt)
        };
        Duration::from_nanos(t.min(cap))
    }

    /// The delay before retry number `attempt` (0 for the first retry).
    /// `prev` is the previous delay, used by decorrelated jitter only.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        prev: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        match self.kind {
            Jitter::None => self.ceiling(attempt),
            Jitter::Full => {
                let t = nanos(self.ceiling(attempt));
                Duration::from_nanos(rng.random_range(0..=t))
            }
            Jitter::Equal => {
                let t = nanos(self.ceiling(attempt));
                let half = t / 2;
                Duration::from_nanos(t - half + rng.random_range(0..=half))
            }
            Jitter::Decorrelated => {
                let base = nanos(self.base);
                let cap = nanos(self.cap);
                let prev = prev.map_or(base, nanos);
                let hi = prev.saturating_mul(3).max(base);
                Duration::from_nanos(rng.random_range(base..=hi).min(cap))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const MS: Duration = Duration::from_millis(1);

    fn policy(kind: Jitter) -> BackoffPolicy {
        BackoffPolicy {
            kind,
            base: 5 * MS,
            cap: 2000 * MS,
        }
    }

    #[test]
    fn no_jitter_doubles_and_caps() {
        let p = policy(Jitter::None);
        let mut rng = SmallRng::seed_from_u64(1);
        let d: Vec<_> = (0..4).map(|a| p.delay(a, None, &mut rng)).collect();
        assert_eq!(d, vec![5 * MS, 10 * MS, 20 * MS, 40 * MS]);
        assert_eq!(p.delay(20, None, &mut rng), 2000 * MS);
        assert_eq!(p.delay(u32::MAX, None, &mut rng), 2000 * MS);
    }

    #[test]
    fn full_and_equal_stay_in_their_ranges() {
        let mut rng = SmallRng::seed_from_u64(2);
        for attempt in 0..40 {
            let t = policy(Jitter::None).ceiling(attempt);
            for _ in 0..50 {
                let f = policy(Jitter::Full).delay(attempt, None, &mut rng);
                assert!(f <= t);
                let e = policy(Jitter::Equal).delay(attempt, None, &mut rng);
                assert!(e >= t / 2 && e <= t, "{e:?} vs {t:?}");
            }
        }
    }

    #[test]
    fn full_jitter_spreads_over_the_range() {
        let mut rng = SmallRng::seed_from_u64(3);
        let p = policy(Jitter::Full);
        let n = 10_000;
        let mean: f64 = (0..n)
            .map(|_| p.delay(8, None, &mut rng).as_secs_f64())
            .sum::<f64>()
            / f64::from(n);
        // Uniform on [0, 1.28 s]: mean 0.64 s.
        assert!((mean - 0.64).abs() < 0.03, "{mean}");
    }

    #[test]
    fn decorrelated_grows_from_prev_and_caps() {
        let mut rng = SmallRng::seed_from_u64(4);
        let p = policy(Jitter::Decorrelated);
        let mut prev = None;
        for attempt in 0..200 {
            let d = p.delay(attempt, prev, &mut rng);
            assert!(d >= 5 * MS && d <= 2000 * MS);
            if let Some(pv) = prev {
                assert!(d <= (pv * 3).max(5 * MS));
            }
            prev = Some(d);
        }
    }

    #[test]
    fn seeded_rng_is_reproducible() {
        let p = policy(Jitter::Full);
        let a: Vec<_> = {
            let mut r = SmallRng::seed_from_u64(9);
            (0..10).map(|i| p.delay(i, None, &mut r)).collect()
        };
        let b: Vec<_> = {
            let mut r = SmallRng::seed_from_u64(9);
            (0..10).map(|i| p.delay(i, None, &mut r)).collect()
        };
        assert_eq!(a, b);
    }
}
