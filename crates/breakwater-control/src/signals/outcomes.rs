//! Call outcomes: the dependency failure ratio and the slow-call ratio.
//!
//! Each outcome lands in two bucketed windows (one per signal, since their
//! lengths may differ): O(1) per outcome. Permanent failures (poison
//! messages) are counted apart: they are neither calls nor failures for the
//! ratios, so no amount of poison can trip the breaker.

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use super::Reading;
use crate::config::{FailureRatioConfig, SlowCallConfig};
use crate::reason::Reason;
use crate::signals::SignalKind;
use crate::window::{Bucket, RollingWindow};

/// How a call to the dependency ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(Serialize, Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OutcomeClass {
    /// Applied.
    Success,
    /// The dependency failed (lock timeout, statement timeout, deadlock,
    /// serialization failure, too many connections, pool timeout, lost
    /// connection): counts toward the breaker.
    Dependency,
    /// The message itself is bad (constraint violation, bad JSON): it goes to
    /// the DLQ and never counts toward the breaker.
    Permanent,
    /// The dependency refused this one entity key (a row lock), and the
    /// hot-key lanes set the key aside: the key's trouble, not the
    /// dependency's health, so neither a call nor a failure for the ratios
    /// (and no evidence either way for a probe). Global lock trouble still
    /// shows in the lock-wait and lock-waiter signals. Also one of several
    /// forward targets failing behind its own gate.
    KeyContention,
}

/// One finished call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub class: OutcomeClass,
    /// How long it took.
    pub latency: Duration,
}

impl Outcome {
    /// A success that took `latency`.
    pub fn success(latency: Duration) -> Self {
        Self {
            class: OutcomeClass::Success,
            latency,
        }
    }

    /// A dependency failure that took `latency`.
    pub fn dependency(latency: Duration) -> Self {
        Self {
            class: OutcomeClass::Dependency,
            latency,
        }
    }

    /// A permanent failure (poison message) that took `latency`.
    pub fn permanent(latency: Duration) -> Self {
        Self {
            class: OutcomeClass::Permanent,
            latency,
        }
    }
}

/// Outcomes counted by kind, as one node hands them to the fleet's
/// controller: cumulative since the node started, so a reading missed is
/// merged into the next, never lost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct OutcomeTally {
    /// Calls that reached the dependency (successes and dependency failures).
    pub calls: u64,
    /// Dependency failures among them.
    pub failures: u64,
    /// Calls slower than `slow_ms`.
    pub slow: u64,
    /// Permanent failures (poison): neither calls nor failures.
    pub permanent: u64,
    /// Keys set aside for contention: neither calls nor failures.
    pub contended: u64,
}

impl OutcomeTally {
    /// Counts one outcome; `slow_after` is the slow-call threshold.
    pub fn add(&mut self, o: Outcome, slow_after: Duration) {
        match o.class {
            OutcomeClass::Permanent => self.permanent += 1,
            OutcomeClass::KeyContention => self.contended += 1,
            class => {
                self.calls += 1;
                self.failures += u64::from(class == OutcomeClass::Dependency);
                self.slow += u64::from(o.latency > slow_after);
            }
        }
    }

    /// What `self` counted past `earlier` (a counter that went backwards,
    /// a node restarted, counts from zero).
    pub fn since(&self, earlier: &Self) -> Self {
        let d = |now: u64, then: u64| if now >= then { now - then } else { now };
        Self {
            calls: d(self.calls, earlier.calls),
            failures: d(self.failures, earlier.failures),
            slow: d(self.slow, earlier.slow),
            permanent: d(self.permanent, earlier.permanent),
            contended: d(self.contended, earlier.contended),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Calls {
    calls: u64,
    failures: u64,
    permanent: u64,
    contended: u64,
}

impl Bucket for Calls {
    fn merge(&mut self, o: &Self) {
        self.calls = self.calls.saturating_add(o.calls);
        self.failures = self.failures.saturating_add(o.failures);
        self.permanent = self.permanent.saturating_add(o.permanent);
        self.contended = self.contended.saturating_add(o.contended);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slow {
    calls: u64,
    slow: u64,
}

impl Bucket for Slow {
    fn merge(&mut self, o: &Self) {
        self.calls = self.calls.saturating_add(o.calls);
        self.slow = self.slow.saturating_add(o.slow);
    }
}

/// How many calls the failure ratio waits for before it judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// The configured `min_calls`: closed and half-open, where a few
    /// failures among few calls are noise.
    MinCalls,
    /// Any call: the ramp, a probation whose windows started empty, where
    /// a dependency failure among the first calls re-opens the breaker
    /// however little traffic there is (the design's "a failure in the
    /// ramp re-opens it").
    AnyCall,
}

/// Failure-ratio and slow-call windows.
#[derive(Debug, Clone)]
pub(crate) struct OutcomeSignals {
    failure_cfg: FailureRatioConfig,
    slow_cfg: SlowCallConfig,
    slow_after: Duration,
    failures: RollingWindow<Calls>,
    slow: RollingWindow<Slow>,
    /// This node's own calls over the failure window, kept apart once
    /// other nodes' tallies join `failures` (a lease holder's window mixes
    /// the fleet's outcomes, read a beat or two late).
    own: Option<RollingWindow<Calls>>,
    /// This node's latest calls that failed on the dependency in a row (a
    /// success ends the streak; poison and contention leave it).
    streak: u32,
    /// Since when the slow-call ratio has been above its threshold at
    /// every [`OutcomeSignals::judge_slow_calls`] (`None`: it is not).
    slow_over_since: Option<u64>,
}

impl OutcomeSignals {
    pub(crate) fn new(failure_cfg: &FailureRatioConfig, slow_cfg: &SlowCallConfig) -> Self {
        Self {
            failure_cfg: failure_cfg.clone(),
            slow_cfg: slow_cfg.clone(),
            slow_after: Duration::from_millis(slow_cfg.slow_ms),
            failures: RollingWindow::new(Duration::from_secs(failure_cfg.window_secs)),
            slow: RollingWindow::new(Duration::from_secs(slow_cfg.window_secs)),
            own: None,
            streak: 0,
            slow_over_since: None,
        }
    }

    pub(crate) fn record(&mut self, o: Outcome, now_ms: u64) {
        match o.class {
            OutcomeClass::Permanent => self.failures.record(now_ms, |b| b.permanent += 1),
            OutcomeClass::KeyContention => self.failures.record(now_ms, |b| b.contended += 1),
            class => {
                let failed = u64::from(class == OutcomeClass::Dependency);
                self.streak = if failed == 1 {
                    self.streak.saturating_add(1)
                } else {
                    0
                };
                let call = |b: &mut Calls| {
                    b.calls += 1;
                    b.failures += failed;
                };
                self.failures.record(now_ms, call);
                if let Some(own) = &mut self.own {
                    own.record(now_ms, call);
                }
                let slow = u64::from(o.latency > self.slow_after);
                self.slow.record(now_ms, |b| {
                    b.calls += 1;
                    b.slow += slow;
                });
            }
        }
    }

    /// Records outcomes another node counted, as of `now_ms`.
    pub(crate) fn record_tally(&mut self, t: &OutcomeTally, now_ms: u64) {
        if self.own.is_none() {
            // From here on the window is the fleet's: this node's own
            // calls are counted apart too (those before are in the fleet's
            // window only, and age out of it).
            self.own = Some(RollingWindow::new(Duration::from_secs(
                self.failure_cfg.window_secs,
            )));
        }
        self.failures.record(now_ms, |b| {
            b.calls += t.calls;
            b.failures += t.failures;
            b.permanent += t.permanent;
            b.contended += t.contended;
        });
        self.slow.record(now_ms, |b| {
            b.calls += t.calls;
            b.slow += t.slow;
        });
    }

    /// The slow-call threshold.
    pub(crate) fn slow_after(&self) -> Duration {
        self.slow_after
    }

    /// Forgets the past (on entering half-open and the ramp, so failures
    /// that caused the opening cannot re-open it).
    pub(crate) fn clear(&mut self) {
        self.failures.clear();
        self.slow.clear();
        self.streak = 0;
        self.slow_over_since = None;
        if let Some(own) = &mut self.own {
            own.clear();
        }
    }

    /// Dependency failures and calls over the failure window.
    pub(crate) fn failure_counts(&self, now_ms: u64) -> (u64, u64) {
        let b = self.failures.sum(now_ms);
        (b.failures, b.calls)
    }

    /// How many of this node's latest calls failed on the dependency in a
    /// row.
    pub(crate) fn failure_streak(&self) -> u32 {
        self.streak
    }

    /// This node's own dependency failures and calls over the failure
    /// window, once other nodes' tallies are counted in it (`None` before:
    /// the window holds this node's calls alone).
    pub(crate) fn own_failure_counts(&self, now_ms: u64) -> Option<(u64, u64)> {
        self.own.as_ref().map(|own| {
            let b = own.sum(now_ms);
            (b.failures, b.calls)
        })
    }

    /// The failure ratio over the window, judged once the window holds
    /// the calls `evidence` asks for.
    pub(crate) fn failure_ratio(&self, now_ms: u64, evidence: Evidence) -> Reading {
        let c = &self.failure_cfg;
        let b = self.failures.sum(now_ms);
        let ratio = ratio(b.failures, b.calls);
        let min_calls = match evidence {
            Evidence::MinCalls => c.min_calls,
            Evidence::AnyCall => 1,
        };
        let judged = b.calls >= min_calls && b.calls > 0;
        let trip = (c.enabled && judged && ratio > c.threshold).then_some(Reason::FailureRatio {
            ratio,
            threshold: c.threshold,
            window_secs: c.window_secs,
            calls: b.calls,
        });
        Reading {
            kind: SignalKind::FailureRatio,
            enabled: c.enabled,
            value: judged.then_some(ratio),
            threshold: c.threshold,
            detail: format!(
                "{} dependency failures / {} calls over {} s (min {}); {} permanent and {} \
                 contended keys apart",
                b.failures, b.calls, c.window_secs, min_calls, b.permanent, b.contended
            ),
            trip,
        }
    }

    /// Whether the slow-call ratio is above its threshold over the window
    /// (with the calls it needs), and the window's sums.
    fn slow_over(&self, now_ms: u64) -> (bool, Slow) {
        let c = &self.slow_cfg;
        let b = self.slow.sum(now_ms);
        let judged = b.calls >= c.min_calls && b.calls > 0;
        (judged && ratio(b.slow, b.calls) > c.threshold, b)
    }

    /// Notes, once per evaluation, whether the slow-call ratio is above its
    /// threshold: `slow_calls.sustain_ms` counts from the first such
    /// evaluation in an unbroken run of them.
    pub(crate) fn judge_slow_calls(&mut self, now_ms: u64) {
        let (over, _) = self.slow_over(now_ms);
        self.slow_over_since = if over {
            Some(self.slow_over_since.unwrap_or(now_ms))
        } else {
            None
        };
    }

    pub(crate) fn slow_calls(&self, now_ms: u64) -> Reading {
        let c = &self.slow_cfg;
        let (over, b) = self.slow_over(now_ms);
        let ratio = ratio(b.slow, b.calls);
        let judged = b.calls >= c.min_calls && b.calls > 0;
        // Held since the first judged evaluation above the threshold; a
        // reading taken before any (a status at start) counts from now.
        let held_ms = match (over, self.slow_over_since) {
            (true, Some(since)) => now_ms.saturating_sub(since),
            _ => 0,
        };
        let sustained = over && held_ms >= c.sustain_ms;
        let trip = (c.enabled && sustained).then_some(Reason::SlowCalls {
            ratio,
            threshold: c.threshold,
            slow_ms: c.slow_ms,
            window_secs: c.window_secs,
            calls: b.calls,
            held_ms,
        });
        let mut detail = format!(
            "{} of {} calls slower than {} ms over {} s (min {})",
            b.slow, b.calls, c.slow_ms, c.window_secs, c.min_calls
        );
        if over && !sustained {
            detail.push_str(&format!(
                "; above the threshold for {held_ms} of the {} ms that trip it",
                c.sustain_ms
            ));
        }
        Reading {
            kind: SignalKind::SlowCalls,
            enabled: c.enabled,
            value: judged.then_some(ratio),
            threshold: c.threshold,
            detail,
            trip,
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults with the failure window pinned at 60 s (the texts below name it).
    fn sig() -> OutcomeSignals {
        let failures = FailureRatioConfig {
            window_secs: 60,
            ..FailureRatioConfig::default()
        };
        OutcomeSignals::new(&failures, &SlowCallConfig::default())
    }

    const FAST: Duration = Duration::from_millis(5);

    #[test]
    fn failure_ratio_needs_min_calls() {
        let mut s = sig();
        for _ in 0..19 {
            s.record(Outcome::dependency(FAST), 0);
        }
        assert!(s.failure_ratio(0, Evidence::MinCalls).trip.is_none());
        assert_eq!(s.failure_ratio(0, Evidence::MinCalls).value, None);
        s.record(Outcome::dependency(FAST), 0);
        assert!(s.failure_ratio(0, Evidence::MinCalls).trip.is_some());
    }

    #[test]
    fn in_probation_the_failure_ratio_judges_from_the_first_call() {
        let mut s = sig();
        s.record(Outcome::success(FAST), 0);
        let r = s.failure_ratio(0, Evidence::AnyCall);
        assert_eq!((r.value, r.trip.is_some()), (Some(0.0), false));
        s.record(Outcome::dependency(FAST), 0);
        let r = s.failure_ratio(0, Evidence::AnyCall);
        assert_eq!(r.value, Some(0.5));
        assert!(r.trip.is_some(), "1 failure in 2 calls");
        assert!(r.detail.contains("(min 1)"), "{}", r.detail);
        let settled = s.failure_ratio(0, Evidence::MinCalls);
        assert_eq!((settled.value, settled.trip.is_some()), (None, false));
    }

    #[test]
    fn failure_ratio_trips_above_threshold_only() {
        let mut s = sig();
        for i in 0..100 {
            let o = if i < 15 {
                Outcome::dependency(FAST)
            } else {
                Outcome::success(FAST)
            };
            s.record(o, 1_000);
        }
        let r = s.failure_ratio(1_000, Evidence::MinCalls);
        assert_eq!(r.value, Some(0.15));
        assert!(r.trip.is_none(), "0.15 is not > 0.15");
        s.record(Outcome::dependency(FAST), 1_000);
        let r = s.failure_ratio(1_000, Evidence::MinCalls);
        assert_eq!(
            r.trip.map(|t| t.to_string()),
            Some("failure ratio 0.16 > 0.15 over 60 s, 101 calls".into())
        );
    }

    #[test]
    fn failures_age_out_of_the_window() {
        let mut s = sig();
        for _ in 0..30 {
            s.record(Outcome::dependency(FAST), 0);
        }
        assert!(s.failure_ratio(0, Evidence::MinCalls).trip.is_some());
        assert!(s.failure_ratio(61_000, Evidence::MinCalls).trip.is_none());
    }

    #[test]
    fn contended_keys_are_neither_calls_nor_failures() {
        let mut s = sig();
        for _ in 0..20 {
            s.record(Outcome::success(FAST), 0);
        }
        for _ in 0..100 {
            s.record(
                Outcome {
                    class: OutcomeClass::KeyContention,
                    latency: Duration::from_secs(1),
                },
                0,
            );
        }
        let r = s.failure_ratio(0, Evidence::AnyCall);
        assert_eq!(r.value, Some(0.0), "{r:?}");
        assert!(r.trip.is_none());
        assert!(s.slow_calls(0).trip.is_none());
    }

    #[test]
    fn a_thousand_poison_messages_never_trip() {
        let mut s = sig();
        for _ in 0..1000 {
            s.record(Outcome::permanent(Duration::from_secs(10)), 0);
        }
        assert!(s.failure_ratio(0, Evidence::MinCalls).trip.is_none());
        assert!(s.slow_calls(0).trip.is_none());
        // A few real calls with poison around them: ratio stays at 0.
        for _ in 0..20 {
            s.record(Outcome::success(FAST), 0);
        }
        assert_eq!(s.failure_ratio(0, Evidence::MinCalls).value, Some(0.0));
    }

    #[test]
    fn slow_call_ratio_trips() {
        let mut s = sig();
        for i in 0..20 {
            let latency = if i < 11 {
                Duration::from_millis(5_001)
            } else {
                FAST
            };
            s.record(Outcome::success(latency), 0);
        }
        s.judge_slow_calls(0);
        let r = s.slow_calls(0);
        assert_eq!(r.value, Some(0.55));
        assert!(r.trip.is_none(), "above the threshold, not yet for 2 s");
        assert!(r.detail.contains("for 0 of the 2000 ms"), "{}", r.detail);
        s.judge_slow_calls(1_000);
        let r = s.slow_calls(2_000);
        assert!(r.trip.is_some(), "held 2 s: {}", r.detail);
    }

    #[test]
    fn disabled_signals_report_but_never_trip() {
        let f = FailureRatioConfig {
            enabled: false,
            ..FailureRatioConfig::default()
        };
        let mut s = OutcomeSignals::new(&f, &SlowCallConfig::default());
        for _ in 0..50 {
            s.record(Outcome::dependency(FAST), 0);
        }
        let r = s.failure_ratio(0, Evidence::MinCalls);
        assert_eq!(r.value, Some(1.0));
        assert!(r.trip.is_none());
    }
}
