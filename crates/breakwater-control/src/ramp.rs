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
//!
//! **An early step** ([`StepEvidence`]): a step ends before its `hold_ms`
//! once its calls have shown, for `min_hold_ms` of windows in a row, that
//! the step is in use (by Little's law at least half its limit running:
//! work is waiting for it) and that they run at the limiter's learned
//! no-load latency (the mean under `tolerance x baseline + slack`, the
//! limiter's own "not rising"). That is the evidence the hold waits for,
//! seen sooner: a database that is back takes the backlog at the rate it
//! can, instead of at 10% for 30 s while the backlog grows (a step of 2
//! sessions applies under 150 webhooks/s once an apply takes 15 ms). A
//! step whose calls are slow, fail, or do not use it waits out its hold.

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

/// Windows a quiet evidence window may last, in `window_ms`, before it is
/// dropped (and the streak with it).
const QUIET_WINDOWS: u64 = 10;

/// The calls of the current ramp step, judged in windows like the
/// limiter's: whether the step has earned an early end (module doc).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepEvidence {
    window_start_ms: u64,
    calls: u32,
    failed: bool,
    latency_sum: Duration,
    /// Start of the first window of the current run of proven windows.
    proven_since_ms: Option<u64>,
}

/// How [`StepEvidence`] judges its windows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EvidenceRule {
    pub window_ms: u64,
    pub min_samples: u32,
    /// How long windows must have been proven in a row.
    pub min_hold_ms: u64,
    /// The step's concurrency limit.
    pub limit: u32,
}

impl StepEvidence {
    pub(crate) fn new(now_ms: u64) -> Self {
        Self {
            window_start_ms: now_ms,
            calls: 0,
            failed: false,
            latency_sum: Duration::ZERO,
            proven_since_ms: None,
        }
    }

    /// A finished call of the step.
    pub(crate) fn record(&mut self, latency: Duration, failed: bool) {
        self.calls = self.calls.saturating_add(1);
        self.failed |= failed;
        self.latency_sum = self.latency_sum.saturating_add(latency);
    }

    /// Judges the window if it is complete, then says whether windows have
    /// been proven for `min_hold_ms` in a row. `at_baseline` says whether a
    /// mean latency is at the limiter's baseline (`None`: none learned, so
    /// nothing is proven).
    pub(crate) fn proven(
        &mut self,
        now_ms: u64,
        rule: EvidenceRule,
        at_baseline: impl Fn(Duration) -> Option<bool>,
    ) -> bool {
        let age = now_ms.saturating_sub(self.window_start_ms);
        if age >= rule.window_ms && self.calls >= rule.min_samples.max(1) {
            let mean = self.latency_sum / self.calls;
            // Little's law: the mean number of calls running.
            let in_use = self.latency_sum.as_secs_f64() / (age as f64 / 1000.0);
            let proven = !self.failed
                && in_use >= f64::from(rule.limit) / 2.0
                && at_baseline(mean) == Some(true);
            self.proven_since_ms = match (proven, self.proven_since_ms) {
                (true, Some(since)) => Some(since),
                (true, None) => Some(self.window_start_ms),
                (false, _) => None,
            };
            *self = Self {
                proven_since_ms: self.proven_since_ms,
                ..Self::new(now_ms)
            };
        } else if age > rule.window_ms.saturating_mul(QUIET_WINDOWS) {
            *self = Self::new(now_ms);
        }
        self.proven_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) >= rule.min_hold_ms)
    }
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

    const RULE: EvidenceRule = EvidenceRule {
        window_ms: 250,
        min_samples: 10,
        min_hold_ms: 2_000,
        limit: 2,
    };

    /// Feeds `windows` windows of 250 ms, each with 20 calls of `latency`
    /// (2 running at once when 25 ms), and says whether the step was proven
    /// after each.
    fn windows(e: &mut StepEvidence, now: &mut u64, windows: usize, latency_ms: u64) -> Vec<bool> {
        let at_baseline = |mean: Duration| Some(mean <= Duration::from_millis(39));
        (0..windows)
            .map(|_| {
                for _ in 0..20 {
                    e.record(Duration::from_millis(latency_ms), false);
                }
                *now += 250;
                e.proven(*now, RULE, at_baseline)
            })
            .collect()
    }

    #[test]
    fn a_step_in_use_at_the_baseline_is_proven_after_min_hold() {
        let (mut now, mut e) = (0, StepEvidence::new(0));
        let proven = windows(&mut e, &mut now, 8, 25);
        assert_eq!(
            proven,
            [false, false, false, false, false, false, false, true]
        );
    }

    #[test]
    fn slow_calls_a_failure_or_a_step_not_in_use_are_no_evidence() {
        let (mut now, mut e) = (0, StepEvidence::new(0));
        assert!(!windows(&mut e, &mut now, 20, 45).contains(&true), "slow");
        // 20 calls of 5 ms in 250 ms: 0.4 running, under half of 2.
        assert!(
            !windows(&mut e, &mut now, 20, 5).contains(&true),
            "not in use"
        );
        // Seven good windows, then one with a failure: the run starts over.
        windows(&mut e, &mut now, 7, 25);
        e.record(Duration::from_millis(25), true);
        assert!(!windows(&mut e, &mut now, 1, 25)[0]);
        assert_eq!(windows(&mut e, &mut now, 8, 25).last(), Some(&true));
        // No baseline learned: nothing is proven.
        let mut e = StepEvidence::new(now);
        for _ in 0..12 {
            for _ in 0..20 {
                e.record(Duration::from_millis(25), false);
            }
            now += 250;
            assert!(!e.proven(now, RULE, |_| None));
        }
    }

    #[test]
    fn a_quiet_window_drops_the_run() {
        let (mut now, mut e) = (0, StepEvidence::new(0));
        windows(&mut e, &mut now, 7, 25);
        now += 2_600;
        assert!(!e.proven(now, RULE, |_| Some(true)));
        assert!(!windows(&mut e, &mut now, 7, 25).contains(&true));
    }
}
