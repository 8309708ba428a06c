//! The adaptive concurrency limiter: how many applies run at once while the
//! breaker is closed.
//!
//! The breaker answers "may we call the database at all?"; between its
//! fixed limit and "open" it had nothing. The limiter moves the closed
//! limit with what the applies' latencies say, so a database that starts to
//! queue gets less work before the breaker has to trip, and a database that
//! is far away (every call slow, none waiting) gets more requests in
//! flight.
//!
//! # The rule, once per window
//!
//! A window closes when it is at least `window_ms` old and holds at least
//! `min_samples` finished calls (a quiet window that runs past ten times
//! `window_ms` is dropped unjudged). From its calls:
//!
//! - `baseline`: the learned no-load latency (what a call costs with
//!   nothing queued in front of it: the round trips and the work). A
//!   faster call than the baseline lowers it at once. A slower baseline is
//!   learned only in the window after a cut, and only if the cut did not
//!   lower the mean latency (it fell by less than half the cut's factor):
//!   then the calls are slow whatever the limit, the database moved far
//!   away, and this window's fastest call is the new baseline. If the cut
//!   did lower it, the latency was a queue of the limiter's own making
//!   (a database whose CPU the applies share makes every call alike
//!   slow, so the fastest call of a busy window is itself queued: taken
//!   as the baseline, it let the limit climb to the ceiling with the
//!   latency in tow, `lab overload` 4 -> 64 with the probe at 13 ms
//!   against 0.7);
//! - `latency`: the mean latency of the window's calls;
//! - `in use`: the mean number of calls running, by Little's law the sum of
//!   their latencies over the window's length.
//!
//! Then, in this order:
//!
//! | condition | new limit | reason |
//! |---|---|---|
//! | `in use` under half the limit | unchanged: the limit is not what bounds the work, so it says nothing about it (but see slow start) | - |
//! | dependency failures in the window | `limit x max(0.5, 1 - failure ratio)`, at most `limit x 0.9` | `failures` |
//! | `latency > tolerance x baseline + slack` | `limit x clamp((tolerance x baseline + slack) / latency, 0.5, 0.9)` | `latency_rising` |
//! | `latency <= (1 + (tolerance - 1) / 2) x baseline + slack` | `limit + max(1, sqrt(limit))` | `latency_at_baseline` |
//! | between the two | unchanged (the dead band that keeps a steady latency from flapping) | - |
//!
//! always within `[min_concurrency, max_concurrency]`.
//!
//! **Slow start.** From the service's start ([`Limiter::slow_start`]) until
//! the limit reaches the breaker's `max_concurrency`, a window whose
//! latency is under `tolerance x baseline + slack` (not rising) doubles
//! the limit instead (reason `slow_start`); the first window with
//! failures or a rising latency ends it, and the rule above takes over.
//! Eight calm windows in a row whose limit is not in use end it at its
//! target: a slow start the work does not reach protects nothing, and
//! would still hold the limit low when a load came (eight, because a
//! service's first window, begun before the load, says nothing).
//!
//! Why this shape (ARCHITECTURE.md has the longer comparison): it is
//! Vegas's question (is there a queue in the dependency?) asked the way
//! Gradient2 asks it (a latency ratio against a tolerance, moving the limit
//! by that ratio), with the baseline taken from the fastest calls rather
//! than a long average: a long average learns a far-away database only
//! after tens of seconds of backing off, and learns an overloaded one as
//! normal. Whether a slower latency is the database's new normal or a
//! queue the limit made is asked the way BBR asks it of a path's round
//! trip: by looking at fewer in flight. A cut is that look; a far-away
//! database answers it with the same latency, one the applies queue in
//! with a lower one. The `slack` keeps loopback jitter (1 ms against 3 ms)
//! from looking like a queue.
//!
//! # Hand-over with the breaker
//!
//! The service starts the limiter at the breaker's full limit or, with
//! `initial_concurrency` set, there in slow start: a database already
//! saturated at start gets a few sessions while the first windows learn
//! its latency; a healthy one has the full limit within a few windows (4,
//! 8, 16 under a backlog; after eight when the work does not use the
//! limit).
//!
//! The breaker owns the limit outside `Closed` (open: 0, half-open: the
//! probes, ramping: the ramp's steps). On reaching `Closed` it hands the
//! limiter the ramp's last limit ([`Limiter::resume`]); on leaving it the
//! limiter's window is dropped ([`Limiter::pause`]), so calls made under
//! the ramp or the probes are never judged as the limiter's own.

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::config::LimiterConfig;

/// Windows a quiet window may last, in `window_ms`, before it is dropped.
const QUIET_WINDOWS: u64 = 10;
/// Calm windows in a row whose limit is not in use that end a slow start
/// at its target (about 2 s at the default 250 ms: a service's first
/// window, begun before the load, is no evidence).
const IDLE_WINDOWS_END_SLOW_START: u32 = 8;
/// The most a window may cut the limit to, and the least.
const MOST_CUT: f64 = 0.5;
const LEAST_CUT: f64 = 0.9;

/// Why the limit last moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum LimitReason {
    /// Set from outside: the start, or the breaker's ramp handing over.
    Resumed,
    /// Dependency failures in the window.
    Failures,
    /// The window's mean latency rose past the tolerance over the baseline.
    LatencyRising,
    /// The limit was in use and latency stayed at the baseline.
    LatencyAtBaseline,
    /// Slow start: the limit was in use and latency did not rise.
    SlowStart,
}

impl LimitReason {
    /// The reason as a label (metrics, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resumed => "resumed",
            Self::Failures => "failures",
            Self::LatencyRising => "latency_rising",
            Self::LatencyAtBaseline => "latency_at_baseline",
            Self::SlowStart => "slow_start",
        }
    }
}

/// One move of the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LimitChange {
    /// The limit before.
    pub from: u32,
    /// The limit after.
    pub to: u32,
    /// Why.
    pub reason: LimitReason,
    /// The window's mean latency, milliseconds (none for `resumed`).
    pub latency_ms: Option<f64>,
    /// The baseline it was judged against, milliseconds.
    pub baseline_ms: Option<f64>,
    /// The window's dependency failures and calls.
    pub failures: u32,
    pub calls: u32,
}

impl std::fmt::Display for LimitChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "concurrency limit {} -> {}: ", self.from, self.to)?;
        match (self.reason, self.latency_ms, self.baseline_ms) {
            (LimitReason::Failures, ..) => write!(
                f,
                "{} of {} calls failed on the dependency",
                self.failures, self.calls
            ),
            (LimitReason::LatencyRising, Some(l), Some(b)) => {
                write!(f, "latency {l:.1} ms against a baseline of {b:.1} ms")
            }
            (LimitReason::LatencyAtBaseline, Some(l), Some(b)) => {
                write!(f, "in use, latency {l:.1} ms at the baseline of {b:.1} ms")
            }
            (LimitReason::SlowStart, Some(l), Some(b)) => write!(
                f,
                "slow start, in use, latency {l:.1} ms not rising over the baseline of {b:.1} ms"
            ),
            (reason, ..) => f.write_str(reason.as_str()),
        }
    }
}

/// What the limiter shows in `GET /breaker`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LimiterStatus {
    /// Whether the limiter sets the closed limit now (false outside
    /// `Closed`, where the breaker sets it).
    pub active: bool,
    /// The limit it holds.
    pub limit: u32,
    /// Its floor and ceiling.
    pub min: u32,
    pub max: u32,
    /// The learned no-load latency, milliseconds.
    pub baseline_ms: Option<f64>,
    /// The last judged window's mean latency, milliseconds.
    pub latency_ms: Option<f64>,
    /// The last move, and how long ago (milliseconds).
    pub last_change: Option<LimitChange>,
    pub last_change_ago_ms: Option<u64>,
}

/// The calls of the window being filled.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: u64,
    calls: u32,
    failures: u32,
    latency_sum: Duration,
    fastest: Option<Duration>,
}

impl Window {
    fn new(start_ms: u64) -> Self {
        Self {
            start_ms,
            calls: 0,
            failures: 0,
            latency_sum: Duration::ZERO,
            fastest: None,
        }
    }
}

/// The limiter; see the module docs for the rule.
#[derive(Debug, Clone)]
pub struct Limiter {
    cfg: LimiterConfig,
    /// Kept fractional so small steps add up; published rounded down.
    limit: f64,
    active: bool,
    window: Window,
    /// The learned no-load latency: the fastest call seen, raised only by
    /// a cut that did not lower the latency (see the module docs).
    baseline: Option<Duration>,
    /// After a cut: the cut window's mean latency and the cut's factor
    /// (new limit / old), for the next judged window to test.
    after_cut: Option<(Duration, f64)>,
    latency: Option<Duration>,
    last_change: Option<(u64, LimitChange)>,
    /// In slow start: the limit up to which it doubles.
    slow_start_to: Option<f64>,
    /// In slow start: calm windows in a row whose limit was not in use.
    idle_calm_windows: u32,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Limiter {
    /// A limiter holding `start` (clamped into its bounds), active.
    /// `cfg` must have passed [`crate::BreakerConfig::validate`].
    pub fn new(cfg: LimiterConfig, start: u32, now_ms: u64) -> Self {
        let mut l = Self {
            limit: 0.0,
            active: true,
            window: Window::new(now_ms),
            baseline: None,
            after_cut: None,
            latency: None,
            last_change: None,
            slow_start_to: None,
            idle_calm_windows: 0,
            cfg,
        };
        l.limit = l.clamp(f64::from(start));
        l
    }

    /// In slow start up to `up_to` (clamped into its bounds): each window
    /// whose latency does not rise doubles the limit until then.
    #[must_use]
    pub fn slow_start(mut self, up_to: u32) -> Self {
        let to = self.clamp(f64::from(up_to));
        self.slow_start_to = (to > self.limit).then_some(to);
        self
    }

    fn clamp(&self, limit: f64) -> f64 {
        limit.clamp(
            f64::from(self.cfg.min_concurrency),
            f64::from(self.cfg.max_concurrency.max(self.cfg.min_concurrency)),
        )
    }

    /// The limit to publish.
    pub fn limit(&self) -> u32 {
        // Within [min, max] of u32s, so it fits.
        self.limit.floor() as u32
    }

    /// Whether the limiter sets the limit now.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The breaker left `Closed`: the window is dropped and nothing is
    /// judged until [`Limiter::resume`].
    pub fn pause(&mut self) {
        self.active = false;
        self.slow_start_to = None;
    }

    /// The breaker is `Closed` again, at `limit` (the ramp's last step):
    /// the limiter takes over from there with an empty window.
    pub fn resume(&mut self, limit: u32, now_ms: u64) -> Option<LimitChange> {
        self.active = true;
        self.window = Window::new(now_ms);
        self.after_cut = None;
        let from = self.limit();
        self.limit = self.clamp(f64::from(limit));
        self.moved(
            LimitChange {
                from,
                to: self.limit(),
                reason: LimitReason::Resumed,
                latency_ms: None,
                baseline_ms: None,
                failures: 0,
                calls: 0,
            },
            now_ms,
        )
    }

    /// Counts one finished call (successes and dependency failures; not
    /// permanent failures or a hot key's lock timeouts, which say nothing
    /// about the database's capacity).
    pub fn record(&mut self, latency: Duration, failed: bool) {
        if !self.active {
            return;
        }
        let w = &mut self.window;
        w.calls = w.calls.saturating_add(1);
        w.failures = w.failures.saturating_add(u32::from(failed));
        w.latency_sum = w.latency_sum.saturating_add(latency);
        // A failure's latency is the timeout's, not the database's cost.
        if !failed {
            w.fastest = Some(w.fastest.map_or(latency, |f| f.min(latency)));
        }
    }

    /// Judges the window if it is complete: the limit's move, if it moved.
    pub fn judge(&mut self, now_ms: u64) -> Option<LimitChange> {
        if !self.active {
            return None;
        }
        let w = self.window;
        let age = now_ms.saturating_sub(w.start_ms);
        if age < self.cfg.window_ms || w.calls < self.cfg.min_samples {
            if age > self.cfg.window_ms.saturating_mul(QUIET_WINDOWS) {
                self.window = Window::new(now_ms);
            }
            return None;
        }
        self.window = Window::new(now_ms);
        let latency = w.latency_sum / w.calls;
        self.learn_baseline(w.fastest, latency);
        let baseline = self.baseline;
        self.latency = Some(latency);
        // Little's law: the mean number of calls running in the window.
        let in_use = w.latency_sum.as_secs_f64() / (age as f64 / 1000.0);
        let not_in_use = in_use < self.limit / 2.0;
        if not_in_use && (self.slow_start_to.is_none() || w.failures > 0) {
            self.idle_calm_windows = 0;
            return None;
        }
        let from = self.limit();
        let (limit, reason) = if w.failures > 0 {
            let ratio = f64::from(w.failures) / f64::from(w.calls);
            let cut = (1.0 - ratio).clamp(MOST_CUT, LEAST_CUT);
            (self.limit * cut, LimitReason::Failures)
        } else {
            let base = baseline?;
            let slack = ms(Duration::from_millis(self.cfg.latency_slack_ms));
            let high = self.rising_above(base);
            let low = (1.0 + (self.cfg.tolerance - 1.0) / 2.0) * ms(base) + slack;
            let mean = ms(latency);
            if not_in_use {
                if !self.idle_slow_start_ends(mean <= high) {
                    return None;
                }
            } else {
                self.idle_calm_windows = 0;
            }
            if let Some(to) = self.slow_start_to
                && mean <= high
            {
                let next = if not_in_use { to } else { self.limit * 2.0 };
                if next >= to {
                    self.slow_start_to = None;
                }
                (next.min(to), LimitReason::SlowStart)
            } else if mean > high {
                let cut = (high / mean).clamp(MOST_CUT, LEAST_CUT);
                (self.limit * cut, LimitReason::LatencyRising)
            } else if mean <= low {
                (
                    self.limit + self.limit.sqrt().max(1.0),
                    LimitReason::LatencyAtBaseline,
                )
            } else {
                return None;
            }
        };
        // A cut always takes at least one off, so a small limit still moves;
        // it also ends a slow start.
        let limit = if matches!(
            reason,
            LimitReason::LatencyAtBaseline | LimitReason::SlowStart
        ) {
            limit
        } else {
            self.slow_start_to = None;
            limit.min(self.limit - 1.0)
        };
        let limit = self.clamp(limit);
        if limit < self.limit {
            self.after_cut = Some((latency, limit / self.limit));
        }
        self.limit = limit;
        self.moved(
            LimitChange {
                from,
                to: self.limit(),
                reason,
                latency_ms: Some(ms(latency)),
                baseline_ms: baseline.map(ms),
                failures: w.failures,
                calls: w.calls,
            },
            now_ms,
        )
    }

    /// In slow start, a window whose limit the work did not use: counts
    /// the calm ones in a row, and says when there are enough to end the
    /// slow start at its target. A slow start the work does not reach
    /// protects nothing, and would still hold the limit low when a load
    /// came (a database moving away, whose first cut ends the slow start).
    fn idle_slow_start_ends(&mut self, calm: bool) -> bool {
        self.idle_calm_windows = if calm { self.idle_calm_windows + 1 } else { 0 };
        self.idle_calm_windows >= IDLE_WINDOWS_END_SLOW_START
    }

    /// Updates the baseline from a judged window's fastest call and mean
    /// latency: a faster call lowers it at once; a slower one raises it
    /// only in the window after a cut, and only if the cut did not lower
    /// the latency (the mean fell by less than half the cut's factor).
    fn learn_baseline(&mut self, fastest: Option<Duration>, latency: Duration) {
        let after_cut = self.after_cut.take();
        let Some(fastest) = fastest else { return };
        let slow_whatever_the_limit =
            after_cut.is_some_and(|(before, cut)| ms(latency) >= ms(before) * (1.0 + cut) / 2.0);
        self.baseline = Some(match self.baseline {
            Some(b) if !slow_whatever_the_limit => b.min(fastest),
            _ => fastest,
        });
    }

    /// `change`, remembered as the last move, if the published limit moved.
    fn moved(&mut self, change: LimitChange, now_ms: u64) -> Option<LimitChange> {
        (change.to != change.from).then(|| {
            self.last_change = Some((now_ms, change));
            change
        })
    }

    /// Whether a mean latency is at the learned baseline by the rule's
    /// "not rising" (`latency <= tolerance x baseline + slack`); `None`
    /// before a baseline is learned. Kept through a pause: the ramp asks it
    /// of its steps' calls.
    pub fn at_baseline(&self, latency: Duration) -> Option<bool> {
        Some(ms(latency) <= self.rising_above(self.baseline?))
    }

    /// The mean latency, in ms, above which calls count as rising against
    /// `base`: `tolerance x baseline + slack`.
    fn rising_above(&self, base: Duration) -> f64 {
        let slack = ms(Duration::from_millis(self.cfg.latency_slack_ms));
        self.cfg.tolerance * ms(base) + slack
    }

    /// What `GET /breaker` shows.
    pub fn status(&self, now_ms: u64) -> LimiterStatus {
        LimiterStatus {
            active: self.active,
            limit: self.limit(),
            min: self.cfg.min_concurrency,
            max: self.cfg.max_concurrency,
            baseline_ms: self.baseline.map(ms),
            latency_ms: self.latency.map(ms),
            last_change: self.last_change.map(|(_, c)| c),
            last_change_ago_ms: self.last_change.map(|(at, _)| now_ms.saturating_sub(at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LimiterConfig {
        LimiterConfig {
            enabled: true,
            initial_concurrency: 0,
            min_concurrency: 2,
            max_concurrency: 64,
            window_ms: 250,
            min_samples: 10,
            tolerance: 2.0,
            latency_slack_ms: 2,
        }
    }

    /// Runs one window of `calls` calls at `latency` each (`failures` of
    /// them failed), as many running at once as `in_use` says.
    fn window(l: &mut Limiter, t: &mut u64, calls: u32, latency: Duration, failed: u32) {
        for i in 0..calls {
            l.record(latency, i < failed);
        }
        *t += 250;
        let _ = l.judge(*t);
    }

    /// Calls whose latencies sum to `in_use` x 250 ms.
    fn calls_for(in_use: f64, latency: Duration) -> u32 {
        ((in_use * 250.0) / ms(latency)).ceil().max(10.0) as u32
    }

    /// The reason of the last move.
    fn last_reason(l: &Limiter, t: u64) -> Option<LimitReason> {
        l.status(t).last_change.map(|c| c.reason)
    }

    #[test]
    fn slow_start_doubles_up_to_its_end_then_the_rule_takes_over() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 4, t).slow_start(16);
        let calm = Duration::from_millis(10);
        for expected in [8, 16] {
            let n = calls_for(f64::from(l.limit()), calm);
            window(&mut l, &mut t, n, calm, 0);
            assert_eq!(l.limit(), expected);
            assert_eq!(last_reason(&l, t), Some(LimitReason::SlowStart));
        }
        let n = calls_for(16.0, calm);
        window(&mut l, &mut t, n, calm, 0);
        assert_eq!(l.limit(), 20, "16 + sqrt(16): slow start is over");
        assert_eq!(last_reason(&l, t), Some(LimitReason::LatencyAtBaseline));
    }

    #[test]
    fn a_slow_start_the_work_does_not_reach_ends_at_its_target() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 4, t).slow_start(16);
        // 150/s at 3 ms: under one call running on average, calm; held
        // for the first windows, ended after eight.
        for _ in 1..IDLE_WINDOWS_END_SLOW_START {
            window(&mut l, &mut t, 38, Duration::from_millis(3), 0);
            assert_eq!(l.limit(), 4);
        }
        window(&mut l, &mut t, 38, Duration::from_millis(3), 0);
        assert_eq!(l.limit(), 16);
        assert_eq!(last_reason(&l, t), Some(LimitReason::SlowStart));
        assert_eq!(l.slow_start_to, None);
        // Not in use and not calm (a queue, or failures): it holds.
        for failed in [0, 1] {
            let mut l = Limiter::new(cfg(), 4, t).slow_start(16);
            l.record(Duration::from_millis(1), false);
            for _ in 0..9 {
                l.record(Duration::from_millis(50), failed == 1);
            }
            t += 250;
            assert_eq!(l.judge(t), None);
            assert_eq!((l.limit(), l.slow_start_to), (4, Some(16.0)));
        }
    }

    #[test]
    fn a_rising_latency_ends_slow_start_with_a_cut() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 4, t).slow_start(16);
        let calm = Duration::from_millis(10);
        window(&mut l, &mut t, calls_for(4.0, calm), calm, 0);
        assert_eq!(l.limit(), 8);
        let queued = Duration::from_millis(40);
        window(&mut l, &mut t, calls_for(8.0, queued), queued, 0);
        assert!(l.limit() < 8, "{}", l.limit());
        assert_eq!(last_reason(&l, t), Some(LimitReason::LatencyRising));
        // Calm again: the rule's sqrt steps, no more doubling.
        let before = l.status(t).limit;
        window(&mut l, &mut t, calls_for(f64::from(before), calm), calm, 0);
        assert_eq!(last_reason(&l, t), Some(LimitReason::LatencyAtBaseline));
        assert!(l.limit() < before * 2, "{before} -> {}", l.limit());
    }

    #[test]
    fn a_slow_start_does_not_outlive_a_pause_nor_go_past_its_end() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 4, t).slow_start(16);
        l.pause();
        let _ = l.resume(4, t);
        let calm = Duration::from_millis(10);
        window(&mut l, &mut t, calls_for(4.0, calm), calm, 0);
        assert_eq!(last_reason(&l, t), Some(LimitReason::LatencyAtBaseline));
        assert_eq!(l.limit(), 6, "4 + sqrt(4)");

        let mut l = Limiter::new(cfg(), 12, t).slow_start(16);
        window(&mut l, &mut t, calls_for(12.0, calm), calm, 0);
        assert_eq!(l.limit(), 16, "doubling stops at the end");
        let no_slow_start = Limiter::new(cfg(), 16, t).slow_start(16);
        assert_eq!(no_slow_start.slow_start_to, None, "already there");
    }

    #[test]
    fn a_far_dependency_with_work_waiting_gets_more_in_flight() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 16, t);
        let far = Duration::from_millis(160);
        for _ in 0..20 {
            let n = calls_for(f64::from(l.limit()), far);
            window(&mut l, &mut t, n, far, 0);
        }
        assert_eq!(l.limit(), 64);
        let last = l.status(t).last_change.map(|c| c.reason);
        assert_eq!(last, Some(LimitReason::LatencyAtBaseline));
    }

    #[test]
    fn a_queue_in_the_dependency_cuts_the_limit_by_the_latency_ratio() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 20, t);
        // Fastest call 2 ms, mean 60 ms: the high mark is 2 x 2 + 2 = 6 ms.
        l.record(Duration::from_millis(2), false);
        for _ in 0..99 {
            l.record(Duration::from_micros(60_586), false);
        }
        t += 250;
        let c = l.judge(t).expect("the limit moves");
        assert_eq!(
            (c.from, c.to, c.reason),
            (20, 10, LimitReason::LatencyRising)
        );
        assert!(
            c.to_string().contains("against a baseline of 2.0 ms"),
            "{c}"
        );
    }

    /// A database whose CPU the applies share: each call takes 1 ms plus
    /// 3 ms for every call running beside it, all alike. The fastest call
    /// of a busy window is then itself queued; taken as the baseline, it
    /// would let the limit climb to the ceiling with the latency in tow.
    #[test]
    fn a_queue_of_its_own_making_does_not_teach_the_baseline() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 16, t);
        let alone = Duration::from_millis(1);
        window(&mut l, &mut t, 20, alone, 0);
        for _ in 0..40 {
            let limit = l.limit();
            let latency = alone + Duration::from_millis(3) * limit;
            let n = calls_for(f64::from(limit), latency);
            window(&mut l, &mut t, n, latency, 0);
        }
        assert_eq!(l.limit(), 2, "at the floor, where the queue is least");
        assert_eq!(l.status(t).baseline_ms, Some(1.0));
    }

    /// A database that moved far away makes every call slow alike, at any
    /// limit: the cut did not lower the latency, so the next window
    /// learns it as the baseline and the limit rises.
    #[test]
    fn a_dependency_that_moved_far_away_is_learned_after_one_cut() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 16, t);
        let near = Duration::from_millis(2);
        window(&mut l, &mut t, calls_for(16.0, near), near, 0);
        let before = l.limit();
        let far = Duration::from_millis(160);
        window(&mut l, &mut t, calls_for(f64::from(before), far), far, 0);
        assert_eq!(
            (l.limit(), last_reason(&l, t)),
            (before / 2, Some(LimitReason::LatencyRising))
        );
        let n = calls_for(f64::from(l.limit()), far);
        window(&mut l, &mut t, n, far, 0);
        assert_eq!(l.status(t).baseline_ms, Some(160.0));
        assert_eq!(last_reason(&l, t), Some(LimitReason::LatencyAtBaseline));
        for _ in 0..20 {
            let n = calls_for(f64::from(l.limit()), far);
            window(&mut l, &mut t, n, far, 0);
        }
        assert_eq!(l.limit(), 64);
    }

    #[test]
    fn failures_cut_by_their_ratio_and_at_least_one() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 20, t);
        window(&mut l, &mut t, 100, Duration::from_millis(60), 30);
        assert_eq!(l.limit(), 14);
        let mut l = Limiter::new(cfg(), 3, 0);
        let mut t = 0;
        window(&mut l, &mut t, 20, Duration::from_millis(60), 1);
        assert_eq!(l.limit(), 2, "0.9 x 3 rounds to 2, and a cut takes one off");
    }

    #[test]
    fn a_limit_not_in_use_says_nothing_and_does_not_move() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 16, t);
        // 150/s at 3 ms: under one call running on average.
        for _ in 0..40 {
            window(&mut l, &mut t, 38, Duration::from_millis(3), 5);
        }
        assert_eq!(l.limit(), 16);
        assert_eq!(l.status(t).last_change, None);
    }

    #[test]
    fn loopback_jitter_is_not_a_queue() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 8, t);
        for _ in 0..10 {
            // 1 ms fastest, 3.8 ms mean: over the low mark (1.5 x 1 + 2)
            // but not the high one (2 x 1 + 2): the dead band, held.
            l.record(Duration::from_millis(1), false);
            for _ in 0..600 {
                l.record(Duration::from_micros(3_800), false);
            }
            t += 250;
            assert_eq!(l.judge(t), None);
        }
        assert_eq!(l.limit(), 8);
    }

    #[test]
    fn a_quiet_window_is_dropped_unjudged() {
        let mut l = Limiter::new(cfg(), 16, 0);
        for _ in 0..9 {
            l.record(Duration::from_secs(1), true);
        }
        assert_eq!(l.judge(2_000), None);
        assert_eq!(l.judge(2_600), None, "dropped past 10 windows");
        l.record(Duration::from_secs(1), true);
        assert_eq!(l.judge(2_700), None, "one call in the new window");
        assert_eq!(l.limit(), 16);
    }

    #[test]
    fn paused_it_ignores_calls_and_resumes_where_the_ramp_ended() {
        let mut t = 0;
        let mut l = Limiter::new(cfg(), 40, t);
        l.pause();
        window(&mut l, &mut t, 200, Duration::from_millis(60), 200);
        assert_eq!(l.limit(), 40);
        let c = l.resume(16, t).expect("moved");
        assert_eq!((c.from, c.to, c.reason), (40, 16, LimitReason::Resumed));
        assert!(l.is_active());
        assert_eq!(l.resume(100, t).map(|c| c.to), Some(64), "clamped");
    }
}
