//! Queue samples: dead-letter velocity, and the in-flight ratio together
//! with throughput against a learned baseline.
//!
//! The service samples its queue backend now and then ([`QueueSample`]);
//! the two counters in a sample are cumulative (`dead_lettered_total`,
//! `processed_total`), so the difference between two samples is what
//! happened in between, and goes into a bucketed window. A counter that goes
//! *down* (a restart, a DLQ purge or replay) is taken as a reset: that
//! interval contributes nothing and counting resumes from the new value.
//!
//! Why the in-flight ratio never trips alone: a healthy, drained queue has
//! `visible = 0` and a ratio of 1. The signal needs three things at once: a
//! high ratio, at least `min_in_flight` messages in flight (more than the
//! workers hold when healthy, i.e. messages parked in retry), and a
//! throughput collapse against the baseline. The baseline is an
//! exponentially weighted average of throughput, learned only while fully
//! closed and outside the trip zone, so an outage does not teach it that
//! zero is normal.

use std::time::Duration;

use super::Reading;
use crate::config::{DlqConfig, InFlightConfig};
use crate::reason::Reason;
use crate::signals::SignalKind;
use crate::window::{Count, RollingWindow};

/// One look at the queue backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueSample {
    /// Messages waiting to be claimed.
    pub visible: u64,
    /// Messages claimed and not yet acked (including those parked in retry,
    /// where the backend counts them so, like SQS).
    pub in_flight: u64,
    /// Cumulative count of messages ever dead-lettered (arrivals, not depth).
    pub dead_lettered_total: u64,
    /// Cumulative count of messages processed (acked or dead-lettered).
    pub processed_total: u64,
    /// Messages waiting for a retry delay (or a parked key's release) to
    /// pass, where the backend counts them apart from `in_flight`.
    pub delayed: u64,
}

impl QueueSample {
    /// `in_flight / (in_flight + visible)`, 0 for an empty queue.
    pub fn in_flight_ratio(&self) -> f64 {
        let all = self.in_flight.saturating_add(self.visible);
        if all == 0 {
            0.0
        } else {
            self.in_flight as f64 / all as f64
        }
    }
}

/// DLQ-velocity and in-flight/throughput state.
#[derive(Debug, Clone)]
pub(crate) struct QueueSignals {
    dlq_cfg: DlqConfig,
    cfg: InFlightConfig,
    last: Option<(QueueSample, u64)>,
    first_ms: Option<u64>,
    dlq: RollingWindow<Count>,
    processed: RollingWindow<Count>,
    baseline: Option<f64>,
    baseline_at_ms: u64,
    learned_ms: u64,
}

/// Throughput facts for one evaluation.
struct Flow {
    ratio: f64,
    sample: QueueSample,
    throughput: Option<f64>,
    baseline: Option<f64>,
}

impl QueueSignals {
    pub(crate) fn new(dlq_cfg: &DlqConfig, cfg: &InFlightConfig) -> Self {
        Self {
            dlq_cfg: dlq_cfg.clone(),
            cfg: cfg.clone(),
            last: None,
            first_ms: None,
            dlq: RollingWindow::new(Duration::from_secs(dlq_cfg.window_secs)),
            processed: RollingWindow::new(Duration::from_secs(cfg.window_secs)),
            baseline: None,
            baseline_at_ms: 0,
            learned_ms: 0,
        }
    }

    pub(crate) fn observe(&mut self, s: QueueSample, now_ms: u64) {
        if let Some((prev, _)) = self.last {
            // A counter going down is a reset: contributes nothing.
            let dead = s.dead_lettered_total.checked_sub(prev.dead_lettered_total);
            let done = s.processed_total.checked_sub(prev.processed_total);
            if let Some(d) = dead.filter(|d| *d > 0) {
                self.dlq.record(now_ms, |c| c.0 = c.0.saturating_add(d));
            }
            if let Some(d) = done.filter(|d| *d > 0) {
                self.processed
                    .record(now_ms, |c| c.0 = c.0.saturating_add(d));
            }
        } else {
            self.first_ms = Some(now_ms);
        }
        self.last = Some((s, now_ms));
    }

    /// Forgets dead letters seen so far (entering half-open and the ramp).
    /// Whether the latest sample, no older than its TTL, showed nothing
    /// visible, in flight or waiting for a delay: no work to probe with,
    /// now or soon.
    pub(crate) fn idle(&self, now_ms: u64) -> bool {
        self.last.is_some_and(|(s, at)| {
            now_ms.saturating_sub(at) <= self.cfg.sample_ttl_ms
                && s.visible == 0
                && s.in_flight == 0
                && s.delayed == 0
        })
    }

    pub(crate) fn clear_dlq(&mut self) {
        self.dlq.clear();
    }

    pub(crate) fn dlq_velocity(&self, now_ms: u64) -> Reading {
        let c = &self.dlq_cfg;
        let per_sec = self.dlq.sum(now_ms).0 as f64 / c.window_secs as f64;
        let seen = self.last.is_some();
        let trip = (c.enabled && seen && per_sec > c.max_per_sec).then_some(Reason::DlqVelocity {
            per_sec,
            threshold: c.max_per_sec,
            window_secs: c.window_secs,
        });
        Reading {
            kind: SignalKind::DlqVelocity,
            enabled: c.enabled,
            value: seen.then_some(per_sec),
            threshold: c.max_per_sec,
            detail: format!("dead letters per second over {} s", c.window_secs),
            trip,
        }
    }

    fn window_ms(&self) -> u64 {
        self.cfg.window_secs.saturating_mul(1000)
    }

    fn flow(&self, now_ms: u64) -> Option<Flow> {
        let (sample, at) = self.last?;
        if now_ms.saturating_sub(at) > self.cfg.sample_ttl_ms {
            return None;
        }
        let full = self
            .first_ms
            .is_some_and(|f| now_ms.saturating_sub(f) >= self.window_ms());
        let throughput =
            full.then(|| self.processed.sum(now_ms).0 as f64 / self.cfg.window_secs as f64);
        let baseline = self
            .baseline
            .filter(|b| self.learned_ms >= self.window_ms() && *b >= self.cfg.min_baseline_per_sec);
        Some(Flow {
            ratio: sample.in_flight_ratio(),
            sample,
            throughput,
            baseline,
        })
    }

    fn in_trip_zone(&self, f: &Flow) -> Option<Reason> {
        let c = &self.cfg;
        let (throughput, baseline) = (f.throughput?, f.baseline?);
        (f.ratio > c.ratio
            && f.sample.in_flight >= c.min_in_flight
            && throughput < c.throughput_fraction * baseline)
            .then_some(Reason::InFlight {
                ratio: f.ratio,
                ratio_threshold: c.ratio,
                throughput,
                baseline,
                fraction: c.throughput_fraction,
            })
    }

    /// Whether a whole throughput window lies in the current closed period.
    fn closed_long_enough(&self, now_ms: u64, closed_since_ms: Option<u64>) -> bool {
        closed_since_ms.is_some_and(|c| now_ms.saturating_sub(c) >= self.window_ms())
    }

    /// Updates the baseline; called by the controller tick.
    pub(crate) fn learn(&mut self, now_ms: u64, closed_since_ms: Option<u64>) {
        if !self.closed_long_enough(now_ms, closed_since_ms) {
            // Not learning: restart the clock so a gap is not averaged in.
            self.baseline_at_ms = now_ms;
            return;
        }
        let Some(flow) = self.flow(now_ms) else {
            self.baseline_at_ms = now_ms;
            return;
        };
        let Some(tp) = flow.throughput else { return };
        if self.in_trip_zone(&flow).is_some() {
            self.baseline_at_ms = now_ms;
            return;
        }
        let dt = now_ms.saturating_sub(self.baseline_at_ms);
        self.baseline_at_ms = now_ms;
        self.baseline = Some(match self.baseline {
            None => tp,
            Some(b) => {
                let half_life = self.cfg.baseline_half_life_secs as f64 * 1000.0;
                let keep = 0.5f64.powf(dt as f64 / half_life);
                b * keep + tp * (1.0 - keep)
            }
        });
        self.learned_ms = self.learned_ms.saturating_add(dt);
    }

    pub(crate) fn in_flight(&self, now_ms: u64, closed_since_ms: Option<u64>) -> Reading {
        let c = &self.cfg;
        let flow = self.flow(now_ms);
        let judged = self.closed_long_enough(now_ms, closed_since_ms);
        let trip = flow
            .as_ref()
            .filter(|_| c.enabled && judged)
            .and_then(|f| self.in_trip_zone(f));
        let fmt_rate = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}/s"));
        let detail = match &flow {
            None => "no fresh queue sample".to_owned(),
            Some(f) => format!(
                "visible {}, in flight {} (min {}); throughput {} vs {:.0}% of baseline {}{}",
                f.sample.visible,
                f.sample.in_flight,
                c.min_in_flight,
                fmt_rate(f.throughput),
                c.throughput_fraction * 100.0,
                fmt_rate(f.baseline),
                if judged {
                    ""
                } else {
                    "; not judged outside a full closed window"
                }
            ),
        };
        Reading {
            kind: SignalKind::InFlight,
            enabled: c.enabled,
            value: flow.as_ref().map(|f| f.ratio),
            threshold: c.ratio,
            detail,
            trip,
        }
    }

    /// The learned baseline throughput (messages/s), if any.
    pub(crate) fn baseline(&self) -> Option<f64> {
        self.baseline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(dlq_enabled: bool) -> QueueSignals {
        let d = DlqConfig {
            enabled: dlq_enabled,
            ..DlqConfig::default()
        };
        QueueSignals::new(&d, &InFlightConfig::default())
    }

    /// Feeds one sample per second for `secs` seconds at `rate` msgs/s,
    /// calling `learn` as the tick would. Returns the new time and totals.
    fn run(
        s: &mut QueueSignals,
        from_s: u64,
        secs: u64,
        rate: u64,
        visible: u64,
        in_flight: u64,
        processed: &mut u64,
    ) -> u64 {
        for t in from_s..from_s + secs {
            *processed += rate;
            s.observe(
                QueueSample {
                    visible,
                    in_flight,
                    dead_lettered_total: 0,
                    processed_total: *processed,
                    delayed: 0,
                },
                t * 1000,
            );
            s.learn(t * 1000, Some(0));
        }
        from_s + secs
    }

    #[test]
    fn drained_queue_with_high_ratio_does_not_trip() {
        let mut s = sig(false);
        let mut p = 0;
        // Healthy and drained: visible 0, a few in flight, 50 msg/s.
        let t = run(&mut s, 0, 120, 50, 0, 8, &mut p);
        let r = s.in_flight(t * 1000, Some(0));
        assert_eq!(r.value, Some(1.0));
        assert!(r.trip.is_none());
        // Traffic drops at night: throughput collapses against the baseline,
        // the queue is still drained, the ratio still 1: no trip.
        let t = run(&mut s, t, 40, 1, 0, 2, &mut p);
        let r = s.in_flight(t * 1000, Some(0));
        assert_eq!(r.value, Some(1.0));
        assert!(r.trip.is_none(), "{}", r.detail);
    }

    #[test]
    fn stuck_in_flight_with_collapsed_throughput_trips() {
        let mut s = sig(false);
        let mut p = 0;
        let t = run(&mut s, 0, 120, 50, 10, 8, &mut p);
        let base = s.baseline().unwrap_or_default();
        assert!((base - 50.0).abs() < 1.0, "baseline {base}");
        // Messages pile up in retry (in flight), throughput collapses.
        let t = run(&mut s, t, 40, 2, 10, 400, &mut p);
        let r = s.in_flight(t * 1000, Some(0));
        let trip = r.trip.map(|t| t.to_string()).unwrap_or_default();
        assert!(
            trip.starts_with("in-flight ratio 0.98 > 0.85 and throughput 1.93/s < 20% of baseline"),
            "{trip}"
        );
        // The baseline did not learn the outage.
        assert!(s.baseline().unwrap_or_default() > 40.0);
    }

    #[test]
    fn ratio_alone_never_trips() {
        let mut s = sig(false);
        let mut p = 0;
        let t = run(&mut s, 0, 120, 50, 10, 400, &mut p);
        assert!(s.in_flight(t * 1000, Some(0)).trip.is_none());
    }

    #[test]
    fn not_judged_until_a_whole_window_is_closed() {
        let mut s = sig(false);
        let mut p = 0;
        let t = run(&mut s, 0, 120, 50, 10, 8, &mut p);
        let t = run(&mut s, t, 40, 0, 10, 400, &mut p);
        // Closed only 10 s ago (e.g. the ramp just finished).
        let r = s.in_flight(t * 1000, Some((t - 10) * 1000));
        assert!(r.trip.is_none());
        assert!(r.detail.contains("not judged"));
    }

    #[test]
    fn dlq_velocity_counts_arrivals_and_survives_resets() {
        let mut s = sig(true);
        let mut sample = QueueSample::default();
        s.observe(sample, 0);
        sample.dead_lettered_total = 600; // 600 in 60 s = 10/s
        s.observe(sample, 1_000);
        let r = s.dlq_velocity(1_000);
        assert_eq!(r.value, Some(10.0));
        assert!(r.trip.is_some());
        // A purge resets the counter: nothing counted for it.
        sample.dead_lettered_total = 0;
        s.observe(sample, 2_000);
        assert_eq!(s.dlq_velocity(2_000).value, Some(10.0));
        assert!(s.dlq_velocity(70_000).trip.is_none());
    }

    #[test]
    fn dlq_disabled_by_default_never_trips() {
        let mut s = sig(false);
        s.observe(QueueSample::default(), 0);
        s.observe(
            QueueSample {
                dead_lettered_total: 1000,
                ..QueueSample::default()
            },
            1_000,
        );
        let r = s.dlq_velocity(1_000);
        assert!(r.value.is_some_and(|v| v > 16.0));
        assert!(r.trip.is_none());
    }
}
