//! States, transitions and their reasons.
//!
//! Every transition names why it happened with the numbers that decided it,
//! so one log line (or one row of `breaker status`) explains it:
//! `failure ratio 0.42 > 0.15 over 60 s, 57 calls`.

use std::fmt;
use std::time::{Duration, Instant};

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(Serialize, Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum State {
    /// Normal operation at the full concurrency limit.
    Closed,
    /// No polling; webhooks wait in the queue until the cool-down ends.
    Open,
    /// A few probes decide whether the dependency is back.
    HalfOpen,
    /// Closing: concurrency comes back in steps, each held while healthy.
    Ramping,
}

impl State {
    /// Lower-case name, as used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Ramping => "ramping",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transition happened, with the values that decided it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Serialize, Deserialize),
    serde(tag = "kind", rename_all = "snake_case")
)]
pub enum Reason {
    /// Dependency failure ratio above its threshold.
    FailureRatio {
        /// Observed ratio.
        ratio: f64,
        /// Configured threshold.
        threshold: f64,
        /// Window length, seconds.
        window_secs: u64,
        /// Calls in the window.
        calls: u64,
    },
    /// Slow-call ratio above its threshold.
    SlowCalls {
        /// Observed ratio.
        ratio: f64,
        /// Configured threshold.
        threshold: f64,
        /// Calls slower than this are slow, milliseconds.
        slow_ms: u64,
        /// Window length, seconds.
        window_secs: u64,
        /// Calls in the window.
        calls: u64,
        /// How long the ratio had stayed above the threshold,
        /// milliseconds (`slow_calls.sustain_ms` asks for this long).
        held_ms: u64,
    },
    /// Dead letters arriving faster than allowed.
    DlqVelocity {
        /// Observed arrivals per second.
        per_sec: f64,
        /// Configured limit per second.
        threshold: f64,
        /// Window length, seconds.
        window_secs: u64,
    },
    /// Queue stuck in flight while throughput collapsed.
    InFlight {
        /// Observed `in_flight / (in_flight + visible)`.
        ratio: f64,
        /// Configured ratio threshold.
        ratio_threshold: f64,
        /// Observed throughput, messages per second.
        throughput: f64,
        /// Learned baseline throughput, messages per second.
        baseline: f64,
        /// Configured fraction of the baseline.
        fraction: f64,
    },
    /// Too many workers in a long lock wait.
    LockWait {
        /// Workers waiting longer than `wait_ms`.
        waiting: u32,
        /// Live workers.
        live: u32,
        /// Configured fraction.
        threshold: f64,
        /// Configured wait, milliseconds.
        wait_ms: u64,
    },
    /// The database reports too many lock waiters.
    DbLockWaiters {
        /// Reported waiters.
        count: u32,
        /// Configured maximum.
        threshold: u32,
    },
    /// Open -> half-open.
    CoolDownElapsed {
        /// Length of the cool-down that ended, milliseconds.
        cool_down_ms: u64,
    },
    /// A half-open probe failed on the dependency.
    ProbeFailed,
    /// A probe was still unanswered when half-open ran out of time.
    ProbeTimedOut {
        /// How long the oldest unanswered probe had been out, milliseconds.
        waited_ms: u64,
    },
    /// Enough consecutive probe successes: the ramp starts.
    ProbesSucceeded {
        /// Consecutive successes.
        successes: u32,
    },
    /// A ramp step was held healthy; the next one starts.
    RampStep {
        /// Previous step, fraction of the maximum.
        from: f64,
        /// New step, fraction of the maximum.
        to: f64,
        /// How long the previous step was held, milliseconds.
        held_ms: u64,
    },
    /// The last ramp step was held healthy: fully closed.
    RampComplete {
        /// How long the last step was held, milliseconds.
        held_ms: u64,
    },
    /// An operator forced the breaker open.
    ForcedOpen {
        /// The operator's note.
        note: String,
        /// How long the override lasts; `None` until cleared.
        ttl_ms: Option<u64>,
    },
    /// An operator forced the breaker closed.
    ForcedClosed {
        /// How long the override lasts; `None` until cleared.
        ttl_ms: Option<u64>,
    },
    /// The manual override's TTL ran out.
    OverrideExpired,
    /// The manual override was cleared.
    OverrideCleared,
    /// The dependency cannot be reached at all (the service could not
    /// connect to it): held open until it answers.
    Unreachable {
        /// What the connection attempt said.
        detail: String,
    },
    /// The dependency answered again after being unreachable.
    Reachable,
    /// A forced open was cleared while the queue was empty: with nothing
    /// to probe with, half-open would only hold the pool at the probe count
    /// until traffic came back, so the breaker closes at once.
    OverrideClearedIdle,
}

impl Reason {
    /// The reason's kind in snake case, as serialized in `kind` (a metric
    /// label: no values).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::FailureRatio { .. } => "failure_ratio",
            Self::SlowCalls { .. } => "slow_calls",
            Self::DlqVelocity { .. } => "dlq_velocity",
            Self::InFlight { .. } => "in_flight",
            Self::LockWait { .. } => "lock_wait",
            Self::DbLockWaiters { .. } => "db_lock_waiters",
            Self::CoolDownElapsed { .. } => "cool_down_elapsed",
            Self::ProbeFailed => "probe_failed",
            Self::ProbeTimedOut { .. } => "probe_timed_out",
            Self::ProbesSucceeded { .. } => "probes_succeeded",
            Self::RampStep { .. } => "ramp_step",
            Self::RampComplete { .. } => "ramp_complete",
            Self::ForcedOpen { .. } => "forced_open",
            Self::ForcedClosed { .. } => "forced_closed",
            Self::OverrideExpired => "override_expired",
            Self::OverrideCleared => "override_cleared",
            Self::Unreachable { .. } => "unreachable",
            Self::Reachable => "reachable",
            Self::OverrideClearedIdle => "override_cleared_idle",
        }
    }
}

fn secs(ms: u64) -> f64 {
    Duration::from_millis(ms).as_secs_f64()
}

fn ttl(f: &mut fmt::Formatter<'_>, ttl_ms: Option<u64>) -> fmt::Result {
    match ttl_ms {
        Some(ms) => write!(f, " for {:.0} s", secs(ms)),
        None => f.write_str(" until cleared"),
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FailureRatio {
                ratio,
                threshold,
                window_secs,
                calls,
            } => write!(
                f,
                "failure ratio {ratio:.2} > {threshold:.2} over {window_secs} s, {calls} calls"
            ),
            Self::SlowCalls {
                ratio,
                threshold,
                slow_ms,
                window_secs,
                calls,
                held_ms,
            } => write!(
                f,
                "slow-call ratio {ratio:.2} > {threshold:.2} (calls > {slow_ms} ms) over \
                 {window_secs} s, {calls} calls, held {held_ms} ms"
            ),
            Self::DlqVelocity {
                per_sec,
                threshold,
                window_secs,
            } => write!(
                f,
                "DLQ velocity {per_sec:.2}/s > {threshold:.2}/s over {window_secs} s"
            ),
            Self::InFlight {
                ratio,
                ratio_threshold,
                throughput,
                baseline,
                fraction,
            } => write!(
                f,
                "in-flight ratio {ratio:.2} > {ratio_threshold:.2} and throughput \
                 {throughput:.2}/s < {:.0}% of baseline {baseline:.2}/s",
                fraction * 100.0
            ),
            Self::LockWait {
                waiting,
                live,
                threshold,
                wait_ms,
            } => write!(
                f,
                "lock waits: {waiting} of {live} live workers ({:.0}%) waiting > {wait_ms} ms, \
                 threshold {:.0}%",
                f64::from(*waiting) / f64::from((*live).max(1)) * 100.0,
                threshold * 100.0
            ),
            Self::DbLockWaiters { count, threshold } => {
                write!(f, "database lock waiters {count} > {threshold}")
            }
            Self::CoolDownElapsed { cool_down_ms } => {
                write!(f, "cool-down of {:.1} s elapsed", secs(*cool_down_ms))
            }
            Self::ProbeFailed => f.write_str("half-open probe failed on the dependency"),
            Self::ProbeTimedOut { waited_ms } => write!(
                f,
                "half-open probe unanswered after {:.1} s",
                secs(*waited_ms)
            ),
            Self::ProbesSucceeded { successes } => {
                write!(f, "{successes} consecutive probe successes")
            }
            Self::RampStep { from, to, held_ms } => write!(
                f,
                "ramp {:.0}% -> {:.0}% after {:.1} s healthy",
                from * 100.0,
                to * 100.0,
                secs(*held_ms)
            ),
            Self::RampComplete { held_ms } => write!(
                f,
                "ramp complete after {:.1} s healthy on the last step",
                secs(*held_ms)
            ),
            Self::ForcedOpen { note, ttl_ms } => {
                write!(f, "forced open by operator")?;
                if !note.is_empty() {
                    write!(f, " ({note})")?;
                }
                ttl(f, *ttl_ms)
            }
            Self::ForcedClosed { ttl_ms } => {
                write!(f, "forced closed by operator")?;
                ttl(f, *ttl_ms)
            }
            Self::OverrideExpired => {
                f.write_str("manual override expired; automatic control resumes")
            }
            Self::OverrideCleared => {
                f.write_str("manual override cleared; automatic control resumes")
            }
            Self::Unreachable { detail } => {
                write!(f, "the dependency cannot be reached: {detail}")
            }
            Self::Reachable => f.write_str("the dependency answers again; probing"),
            Self::OverrideClearedIdle => f.write_str(
                "manual override ended with an empty queue: nothing to probe, closed at \
                 once; automatic control resumes",
            ),
        }
    }
}

/// One change of state (or of ramp step), as returned by the breaker's
/// methods and kept in its history.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// State before.
    pub from: State,
    /// State after.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// When (the `now` passed to the call that caused it).
    pub at: Instant,
    /// Concurrency limit after the transition (0 when open; the probe count
    /// in half-open).
    pub limit: u32,
    /// Made in dry-run mode: reported, not enforced.
    pub dry_run: bool,
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.reason)?;
        if self.dry_run {
            f.write_str(" [dry run]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "serde")]
    #[test]
    fn kind_is_the_serialized_tag() {
        for r in [
            Reason::ProbeFailed,
            Reason::OverrideClearedIdle,
            Reason::RampComplete { held_ms: 1 },
            Reason::ForcedOpen {
                note: "x".into(),
                ttl_ms: None,
            },
        ] {
            let v = toml::Value::try_from(&r).expect("serializes");
            assert_eq!(
                v.get("kind").and_then(|k| k.as_str()),
                Some(r.kind()),
                "{r:?}"
            );
        }
    }

    #[test]
    fn failure_ratio_reads_like_the_spec() {
        let r = Reason::FailureRatio {
            ratio: 0.42,
            threshold: 0.15,
            window_secs: 60,
            calls: 57,
        };
        assert_eq!(
            r.to_string(),
            "failure ratio 0.42 > 0.15 over 60 s, 57 calls"
        );
    }

    #[test]
    fn other_reasons_name_value_and_threshold() {
        let r = Reason::LockWait {
            waiting: 5,
            live: 8,
            threshold: 0.3,
            wait_ms: 2000,
        };
        assert_eq!(
            r.to_string(),
            "lock waits: 5 of 8 live workers (62%) waiting > 2000 ms, threshold 30%"
        );
        let r = Reason::ForcedOpen {
            note: "migration".into(),
            ttl_ms: Some(60_000),
        };
        assert_eq!(
            r.to_string(),
            "forced open by operator (migration) for 60 s"
        );
        let r = Reason::DbLockWaiters {
            count: 14,
            threshold: 10,
        };
        assert_eq!(r.to_string(), "database lock waiters 14 > 10");
    }
}
