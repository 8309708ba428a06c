//! What `breaker status` shows: a serialisable picture of the breaker.
//!
//! Times are relative to the `now` passed to [`crate::Breaker::status`]
//! (`*_ms` ago or remaining), since `Instant`s mean nothing outside the
//! process. With the `serde` feature everything here derives `Serialize`.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::gate::GateSnapshot;
use crate::reason::{Reason, State};
use crate::signals::SignalKind;

/// A full picture of the breaker at one instant.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct BreakerStatus {
    /// The breaker's own state (in dry-run mode: what it would enforce).
    pub state: State,
    /// What workers are told (differs from `state` in dry-run mode).
    pub gate: GateSnapshot,
    /// The breaker's own concurrency limit.
    pub limit: u32,
    /// The adaptive limiter, when enabled.
    #[cfg_attr(feature = "serde", serde(default))]
    pub limiter: Option<crate::limiter::LimiterStatus>,
    /// Time in the current state (or ramp step), milliseconds.
    pub in_state_ms: u64,
    /// Why the breaker is in this state (the last transition's reason).
    pub reason: Option<Reason>,
    /// `reason` as one line of text.
    pub message: Option<String>,
    /// What the breaker waits for before it moves on, in words (`None`
    /// when closed).
    #[cfg_attr(feature = "serde", serde(default))]
    pub waiting_for: Option<String>,
    /// Ramp progress, while ramping.
    pub ramp: Option<RampStatus>,
    /// Cool-down progress, while open (not forced).
    pub cool_down: Option<CoolDownStatus>,
    /// Probe progress, while half-open.
    pub half_open: Option<HalfOpenStatus>,
    /// Every signal, in evaluation order.
    pub signals: Vec<SignalStatus>,
    /// Consecutive openings since the last full close (drives the cool-down).
    pub opens_since_close: u32,
    /// The learned baseline throughput, messages per second.
    pub baseline_throughput: Option<f64>,
    /// Latest transitions, oldest first.
    pub history: Vec<TransitionRecord>,
    /// The manual override in force, if any.
    #[cfg_attr(feature = "serde", serde(rename = "override"))]
    pub manual_override: Option<OverrideStatus>,
    /// Dry-run mode: evaluate and report, never gate.
    pub dry_run: bool,
}

/// One signal's reading.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct SignalStatus {
    /// Which signal.
    pub signal: SignalKind,
    /// Whether it may trip.
    pub enabled: bool,
    /// Current value; `None` while there is not enough data.
    pub value: Option<f64>,
    /// Configured threshold, in the value's unit.
    pub threshold: f64,
    /// Whether it would trip now (if enabled and judged in this state).
    pub tripping: bool,
    /// Counts behind the value, for humans.
    pub detail: String,
}

/// One past transition.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct TransitionRecord {
    /// State before.
    pub from: State,
    /// State after.
    pub to: State,
    /// Why, structured.
    pub reason: Reason,
    /// Why, as text.
    pub message: String,
    /// How long ago, milliseconds.
    pub ago_ms: u64,
    /// Limit after the transition.
    pub limit: u32,
    /// Made in dry-run mode (reported, not enforced).
    pub dry_run: bool,
}

/// Ramp progress.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct RampStatus {
    /// Current step, from 0.
    pub step: usize,
    /// Number of steps.
    pub steps: usize,
    /// Current step as a fraction of the maximum.
    pub fraction: f64,
    /// Time held on this step, milliseconds.
    pub held_ms: u64,
    /// Time each step must be held, milliseconds.
    pub hold_ms: u64,
}

/// Cool-down progress.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct CoolDownStatus {
    /// Length of this cool-down, milliseconds.
    pub total_ms: u64,
    /// Left before half-open, milliseconds.
    pub remaining_ms: u64,
}

/// Probe progress.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct HalfOpenStatus {
    /// Probes admitted and unanswered.
    pub outstanding: u32,
    /// Most probes at once.
    pub max_probes: u32,
    /// Consecutive successes so far.
    pub successes: u32,
    /// Successes needed to start the ramp.
    pub successes_to_close: u32,
}

/// Which way an operator forced the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(Serialize, Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OverrideKind {
    /// Forced open: no polling.
    Open,
    /// Forced closed: full concurrency, signals ignored.
    Closed,
}

/// The manual override in force.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct OverrideStatus {
    /// Which way.
    pub kind: OverrideKind,
    /// The operator's note (force open only).
    pub note: String,
    /// Left before automatic control resumes; `None` until cleared.
    pub remaining_ms: Option<u64>,
}
