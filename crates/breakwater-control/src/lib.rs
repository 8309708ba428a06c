//! Breakwater's control plane as pure logic: the ingestion circuit breaker,
//! its signals, rolling windows, ramp and retry backoff.
//!
//! No I/O, no async runtime, no clock: every method that needs the time takes
//! `now: Instant`, so tests drive time by hand (`base + Duration`) and the
//! same code runs on one node or behind a fleet store.
//!
//! # What the service calls
//!
//! ```
//! use std::time::{Duration, Instant};
//! use breakwater_control::{Breaker, BreakerConfig, Outcome, QueueSample};
//!
//! let t0 = Instant::now();
//! let mut breaker = Breaker::new(BreakerConfig::default(), t0)?;
//! let gate = breaker.shared_gate(); // Arc<SharedGate>: hand to every worker
//!
//! // Worker, before each poll: one atomic load.
//! let g = gate.load();
//! if g.may_poll && !g.probe_only {
//!     // poll up to g.limit at once; after each message:
//!     breaker.record_outcome(Outcome::success(Duration::from_millis(12)), t0);
//! }
//! // In half-open (g.probe_only): win a slot first, then report through it.
//! if let Some(ticket) = breaker.try_admit_probe(t0) {
//!     breaker.record_probe_outcome(ticket, Outcome::success(Duration::from_millis(9)), t0);
//! }
//!
//! // Samplers feed the other signals.
//! breaker.observe_queue(QueueSample { visible: 3, in_flight: 5, ..Default::default() }, t0);
//! breaker.observe_db_lock_waiters(0, t0);
//!
//! // Controller tick, every 100-250 ms: log each transition once.
//! if let Some(t) = breaker.evaluate(t0 + Duration::from_millis(250)) {
//!     println!("breaker {t}");
//! }
//! let status = breaker.status(t0); // serde::Serialize with the `serde` feature
//! assert_eq!(status.signals.len(), 6);
//! # Ok::<(), breakwater_control::ConfigError>(())
//! ```
//!
//! | module | what lives there |
//! |---|---|
//! | [`breaker`] | the state machine (design spec in its docs) |
//! | [`config`] | the `[breaker]` table, defaults and validation |
//! | [`signals`] | the six trip signals |
//! | [`gate`] | [`GateSnapshot`] and the lock-free [`SharedGate`] |
//! | [`limiter`] | the adaptive concurrency limit while closed |
//! | [`probe`] | half-open probe admission ([`ProbeAdmission`]) |
//! | [`contention`] | one hot key's lock trouble told from the database's |
//! | [`coordination`] | the async seams a fleet plugs into: the shared breaker record and fleet-wide probe slots, with one-node stores |
//! | [`retention`] | time left before the oldest queued message expires |
//! | [`ramp`] | ramp step limits and cool-down lengths |
//! | [`backoff`] | retry delays: full, equal, decorrelated or no jitter |
//! | [`status`] | what `breaker status` shows |
//!
//! Feature `serde`: `Deserialize`/`Serialize` for the config (unknown keys
//! rejected, missing keys defaulted) and `Serialize` for the status.

pub mod backoff;
pub mod breaker;
pub mod config;
pub mod contention;
pub mod coordination;
pub mod gate;
pub mod limiter;
pub mod probe;
pub mod ramp;
pub mod reason;
pub mod retention;
pub mod signals;
pub mod status;
mod window;

pub use backoff::{BackoffPolicy, Jitter};
pub use breaker::Breaker;
pub use config::{
    BreakerConfig, ConfigError, CoolDownConfig, DbLockWaitersConfig, DlqConfig, FailureRatioConfig,
    HalfOpenConfig, InFlightConfig, LimiterConfig, LockWaitConfig, RampConfig, SlowCallConfig,
};
pub use contention::KeyContention;
pub use coordination::{
    BreakerRecord, BreakerStore, CoordinationError, LocalBreakerStore, LocalProbeSlots, ProbeSlot,
    ProbeSlots, SharedBreaker, Version,
};
pub use gate::{GateSnapshot, SharedGate};
pub use limiter::{LimitChange, LimitReason, Limiter, LimiterStatus};
pub use probe::{LocalProbeAdmission, ProbeAdmission, ProbeTicket};
pub use reason::{Reason, State, Transition};
pub use retention::{RetentionStatus, RetentionWatch};
pub use signals::SignalKind;
pub use signals::heartbeats::{Heartbeat, MAX_WORKERS, WorkerState};
pub use signals::outcomes::{Outcome, OutcomeClass, OutcomeTally};
pub use signals::queue::QueueSample;
pub use status::{
    BreakerStatus, CoolDownStatus, HalfOpenStatus, OverrideKind, OverrideStatus, RampStatus,
    SignalStatus, TransitionRecord,
};
