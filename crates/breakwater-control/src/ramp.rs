//! Ramp steps and cool-down lengths: how concurrency comes back, and how
//! long the breaker stays open.
//!
//! A step is a fraction of `max_concurrency`; its limit is
//! `ceil(max * fraction)`, at least 1 and at most `max` (with max 100 the
//! default steps give 10, 25, 50, 100). The cool-down of the `n`-th opening
//! since the last full close (n from 0) is `min(cap, base * 2^n)` shortened
//! by a random fraction up to `jitter`, so it never exceeds the cap and, with
//! `jitter < 0.5`, each re-opening waits longer than the one before until
//! the cap is reached (from then on each waits between `cap * (1 - jitter)`
//! and `cap`).

use std::time::Duration;

use rand::Rng;

use crate::config::CoolDownConfig;

/// Concurrency limit of a ramp step.
pub fn step_limit(max: u32, fraction: f64) -> u32 {
    // Guard against 0.1 * 100 = 10.000000000000002 rounding up to 11.
    let raw = (f64::from(max) * fraction - 1e-9).ceil();
    if raw.is_nan() || raw < 1.0 {
        1.min(max)
    } else if raw >= f64::from(max) {
        max
    } else {
        // In 1.0..max, so it fits a u32.
        raw as u32
    }
}

/// Cool-down for the `opens`-th consecutive opening (0 for the first).
pub fn cool_down<R: Rng + ?Sized>(cfg: &CoolDownConfig, opens: u32, rng: &mut R) -> Duration {
    let full = cfg
        .base_ms
        .checked_shl(opens.min(63))
        .filter(|v| v >> opens.min(63) == cfg.base_ms)
        .unwrap_or(u64::MAX)
        .min(cfg.cap_ms);
    let cut = if cfg.jitter > 0.0 {
        rng.random_range(0.0..cfg.jitter)
    } else {
        0.0
    };
    let ms = (full as f64 * (1.0 - cut)).round();
    // `ms` lies in 0..=full, which is a u64.
    Duration::from_millis(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn default_steps_on_100() {
        let limits: Vec<u32> = [0.10, 0.25, 0.50, 1.0]
            .iter()
            .map(|f| step_limit(100, *f))
            .collect();
        assert_eq!(limits, vec![10, 25, 50, 100]);
        assert_eq!(step_limit(16, 0.10), 2);
        assert_eq!(step_limit(3, 0.10), 1);
        assert_eq!(step_limit(7, 0.07), 1);
        assert_eq!(step_limit(100, 0.07), 7);
    }

    #[test]
    fn cool_down_doubles_caps_and_jitters_down() {
        let cfg = CoolDownConfig {
            base_ms: 1_000,
            cap_ms: 10_000,
            jitter: 0.2,
        };
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..100 {
            let d0 = cool_down(&cfg, 0, &mut rng).as_millis();
            let d1 = cool_down(&cfg, 1, &mut rng).as_millis();
            let d9 = cool_down(&cfg, 9, &mut rng).as_millis();
            let d99 = cool_down(&cfg, 99, &mut rng).as_millis();
            assert!((800..=1_000).contains(&d0), "{d0}");
            assert!((1_600..=2_000).contains(&d1), "{d1}");
            assert!((8_000..=10_000).contains(&d9), "{d9}");
            assert!((8_000..=10_000).contains(&d99), "{d99}");
        }
        let exact = CoolDownConfig { jitter: 0.0, ..cfg };
        assert_eq!(cool_down(&exact, 2, &mut rng), Duration::from_secs(4));
    }
}
