//! A forward target's own small breaker, for a process that forwards to
//! several services: one that fails is refused here, fast, while the
//! others (and the database) keep flowing under the process's breaker.
//!
//! Pure logic, time injected. Closed, it lets every request through and
//! counts consecutive dependency failures; `trip_after` of them open it for
//! a cool-down (`cool_down`, doubling while it keeps failing, up to
//! `cool_down_cap`); when the cool-down ends one request goes through as
//! the probe (the others are still refused): its success closes the gate,
//! its failure opens it again for longer.

use std::time::{Duration, Instant};

/// Settings of a target gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateSettings {
    pub(crate) trip_after: u32,
    pub(crate) cool_down: Duration,
    pub(crate) cool_down_cap: Duration,
}

impl Default for GateSettings {
    fn default() -> Self {
        Self {
            trip_after: 5,
            cool_down: Duration::from_secs(1),
            cool_down_cap: Duration::from_secs(30),
        }
    }
}

/// What the gate says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Send it.
    Go,
    /// Send it as the probe of a target that was failing.
    Probe,
    /// Do not send it; ask again after this long.
    Refused(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, strikes: u32 },
    Probing { strikes: u32 },
}

/// One target's gate.
#[derive(Debug, Clone)]
pub(crate) struct TargetGate {
    settings: GateSettings,
    state: State,
}

impl TargetGate {
    pub(crate) fn new(settings: GateSettings) -> Self {
        Self {
            settings,
            state: State::Closed { failures: 0 },
        }
    }

    /// Whether a request may go now.
    pub(crate) fn pass(&mut self, now: Instant) -> Pass {
        match self.state {
            State::Closed { .. } => Pass::Go,
            State::Open { until, strikes } if now >= until => {
                self.state = State::Probing { strikes };
                Pass::Probe
            }
            State::Open { until, .. } => Pass::Refused(until - now),
            // One probe at a time: the others wait a little.
            State::Probing { .. } => Pass::Refused(self.settings.cool_down),
        }
    }

    /// Whether the target is in trouble now (open, or probing): a failure
    /// then is the target's, not the message's.
    pub(crate) fn in_trouble(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }

    /// The outcome of a request that went. Returns whether this outcome
    /// opened the gate.
    pub(crate) fn record(&mut self, dependency_failure: bool, probe: bool, now: Instant) -> bool {
        match (self.state, dependency_failure) {
            (_, false) if probe || matches!(self.state, State::Closed { .. }) => {
                self.state = State::Closed { failures: 0 };
                false
            }
            (State::Closed { failures }, true) => {
                let failures = failures + 1;
                if failures >= self.settings.trip_after {
                    self.open(0, now);
                    true
                } else {
                    self.state = State::Closed { failures };
                    false
                }
            }
            (State::Probing { strikes }, true) if probe => {
                self.open(strikes + 1, now);
                true
            }
            // A request that went before the gate opened and answered
            // after: the gate already knows.
            _ => false,
        }
    }

    fn open(&mut self, strikes: u32, now: Instant) {
        let cool = self
            .settings
            .cool_down
            .saturating_mul(1 << strikes.min(16))
            .min(self.settings.cool_down_cap.max(self.settings.cool_down));
        self.state = State::Open {
            until: now + cool,
            strikes,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> TargetGate {
        TargetGate::new(GateSettings {
            trip_after: 3,
            cool_down: Duration::from_secs(1),
            cool_down_cap: Duration::from_secs(4),
        })
    }

    #[test]
    fn consecutive_failures_open_it_and_a_success_between_resets_the_count() {
        let t = Instant::now();
        let mut g = gate();
        assert!(!g.record(true, false, t));
        assert!(!g.record(false, false, t));
        assert!(!g.record(true, false, t));
        assert!(!g.record(true, false, t));
        assert_eq!(g.pass(t), Pass::Go);
        assert!(g.record(true, false, t), "the third in a row opens it");
        assert!(g.in_trouble());
        assert_eq!(g.pass(t), Pass::Refused(Duration::from_secs(1)));
    }

    #[test]
    fn one_probe_after_the_cool_down_closes_or_reopens_for_longer() {
        let t = Instant::now();
        let mut g = gate();
        for _ in 0..3 {
            g.record(true, false, t);
        }
        let later = t + Duration::from_secs(1);
        assert_eq!(g.pass(later), Pass::Probe);
        assert!(
            matches!(g.pass(later), Pass::Refused(_)),
            "one probe at a time"
        );
        assert!(g.record(true, true, later), "a failed probe reopens");
        assert_eq!(g.pass(later), Pass::Refused(Duration::from_secs(2)));
        let again = later + Duration::from_secs(2);
        assert_eq!(g.pass(again), Pass::Probe);
        g.record(true, true, again);
        assert_eq!(
            g.pass(again),
            Pass::Refused(Duration::from_secs(4)),
            "capped"
        );
        let last = again + Duration::from_secs(4);
        assert_eq!(g.pass(last), Pass::Probe);
        assert!(!g.record(false, true, last));
        assert!(!g.in_trouble());
        assert_eq!(g.pass(last), Pass::Go);
    }

    #[test]
    fn a_late_answer_from_before_the_trip_changes_nothing() {
        let t = Instant::now();
        let mut g = gate();
        for _ in 0..3 {
            g.record(true, false, t);
        }
        assert!(!g.record(false, false, t), "a late success");
        assert!(
            g.in_trouble(),
            "a request sent before the trip does not close it"
        );
    }
}
