//! The trip signals, one module each, and the common shape of a reading.
//!
//! Every signal turns its inputs into a `Reading`: current value, the
//! configured threshold, a short human detail, and, when it would trip, the
//! [`Reason`] naming value and threshold. Recording inputs is cheap (O(1) or
//! O(log workers)); computing readings is done by the controller tick and by
//! `status`.
//!
//! | signal | module | judged in |
//! |---|---|---|
//! | dependency failure ratio | [`outcomes`] | closed, ramp, half-open |
//! | slow-call ratio | [`outcomes`] | closed, ramp, half-open |
//! | DLQ velocity | [`queue`] | closed, ramp, half-open |
//! | in-flight ratio + throughput | [`queue`] | closed only (full window) |
//! | lock-wait heartbeats | [`heartbeats`] | closed, ramp, half-open |
//! | database lock waiters | [`db_locks`] | closed, ramp, half-open |
//!
//! Windows of the outcome and DLQ signals are cleared on entering half-open
//! and the ramp, so the evidence that opened the breaker cannot re-open it.

use std::fmt;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::reason::Reason;

pub mod db_locks;
pub mod heartbeats;
pub mod outcomes;
pub mod queue;

/// Which signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(Serialize, Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum SignalKind {
    /// Dependency failure ratio.
    FailureRatio,
    /// Slow-call ratio.
    SlowCalls,
    /// Dead-letter arrivals per second.
    DlqVelocity,
    /// In-flight ratio with a throughput collapse.
    InFlight,
    /// Share of live workers in a long lock wait.
    LockWait,
    /// Database sessions waiting on a lock.
    DbLockWaiters,
}

impl SignalKind {
    /// Lower-case name, as used in logs, metrics and the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailureRatio => "failure_ratio",
            Self::SlowCalls => "slow_calls",
            Self::DlqVelocity => "dlq",
            Self::InFlight => "in_flight",
            Self::LockWait => "lock_wait",
            Self::DbLockWaiters => "db_lock_waiters",
        }
    }
}

impl fmt::Display for SignalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One signal's current reading.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reading {
    pub(crate) kind: SignalKind,
    pub(crate) enabled: bool,
    /// `None` while there is not enough data for a verdict.
    pub(crate) value: Option<f64>,
    pub(crate) threshold: f64,
    pub(crate) detail: String,
    /// `Some` when this signal would trip now.
    pub(crate) trip: Option<Reason>,
}
