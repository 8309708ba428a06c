//! The breaker: a state machine that turns signals into a gate.
//!
//! # States
//!
//! ```text
//!            trip (any signal)                cool-down elapsed
//!  CLOSED ───────────────────────▶ OPEN ─────────────────────────▶ HALF_OPEN
//!    ▲                              ▲  ▲                               │
//!    │ last step held               │  └── probe failed / timed out ───┤
//!    │                              │      or a signal trips           │
//!  RAMPING ── trip (any signal) ────┘                                  │
//!    ▲  └─ step held ─▶ next step                                      │
//!    └─────────────── M consecutive probe successes ───────────────────┘
//! ```
//!
//! | state | gate | leaves on |
//! |---|---|---|
//! | `Closed` | poll, limit = the limiter's (`max_concurrency` with the limiter off) | any enabled signal trips |
//! | `Open` | no poll, limit 0 | cool-down elapsed (checked by `evaluate`) |
//! | `HalfOpen` | poll only with a probe slot, limit = `max_probes` | M successes; a dependency failure; a probe unanswered past `probe_timeout_ms`; a signal trips |
//! | `Ramping` | poll, limit = step × max | step held `hold_ms`, or `min_hold_ms` in use at the limiter's baseline (next step, or closed after the last); a signal trips |
//!
//! # Cool-down
//!
//! The n-th opening since the last full close (n from 0) waits
//! `min(cap, base * 2^n)` minus up to `jitter` of it (see [`crate::ramp`]).
//! So a failure in half-open or in the ramp re-opens with a longer cool-down;
//! reaching `Closed` (the ramp completed, or forced) resets n to 0.
//!
//! # Who calls what
//!
//! - The controller tick calls [`Breaker::evaluate`] every 100–250 ms: it
//!   judges the signals, ends cool-downs, times out probes, advances the ramp
//!   and expires manual overrides. At most one transition per call.
//! - Workers report each finished call with [`Breaker::record_outcome`]:
//!   O(1), and it never trips by itself in closed or ramping (the next tick
//!   does, so detection waits at most one tick, and recording stays cheap and
//!   predictable under a failure storm).
//! - In half-open, a worker first wins a slot with
//!   [`Breaker::try_admit_probe`], then reports with
//!   [`Breaker::record_probe_outcome`]: probe results act at once (a failure
//!   re-opens, the M-th success starts the ramp).
//! - Workers read the gate lock-free from [`Breaker::shared_gate`]; the
//!   breaker republishes it on every change.
//! - After each tick's `evaluate`, the controller calls
//!   [`Breaker::adjust_limit`]: while closed, the adaptive limiter
//!   ([`crate::limiter`]) moves the limit with the applies' latencies. It
//!   starts from `max_concurrency` (and from the ramp's last step after a
//!   trip), moves within `[limiter.min_concurrency,
//!   limiter.max_concurrency]`, and pauses outside `Closed`.
//!
//! # Signals per state
//!
//! All enabled signals are judged in closed, ramping and half-open; the
//! in-flight/throughput signal only when fully closed (throttled throughput is
//! not a collapse). Entering half-open and entering the ramp clear the outcome
//! and DLQ windows, so the evidence that opened the breaker cannot re-open it.
//! The ramp is a probation: there the failure ratio judges from the first
//! call instead of waiting for `min_calls`, so a dependency failure early in
//! the ramp re-opens the breaker even at a trickle of traffic (where
//! `min_calls` in a 10 s window would leave it blind below 2 calls/s), and
//! later ones do once they pass the threshold of the calls in the window
//! (the ramp's last `window_secs`). A call that began before the windows
//! were cleared (one still running when the breaker opened, finishing
//! late, or a probe of the half-open period that ended) is evidence about
//! that past and is not counted.
//! When several signals trip at once, the reason names the first in the order
//! of [`crate::SignalKind`]; `status` shows them all.
//!
//! # Manual override and dry run
//!
//! [`Breaker::force_open`] / [`Breaker::force_closed`] set the state and
//! suspend automatic transitions (signals are still read and reported) until
//! the TTL passes or [`Breaker::clear_override`]. Forced open resumes in
//! half-open (the hold served as the cool-down); forced closed resumes in
//! closed. In dry-run mode (`dry_run = true`) the breaker runs the same state
//! machine and records the same transitions, flagged `dry_run`, but the
//! published gate always allows full concurrency; outcomes reported while the
//! shadow state is half-open count as probes. Manual overrides are enforced
//! even in dry-run mode: an operator's explicit order wins.
//!
//! # Invariants (checked by the property tests)
//!
//! - The published gate never allows polling while the state is `Open`
//!   (outside dry-run mode).
//! - At most `max_probes` probes are outstanding in a half-open period.
//! - The limit never exceeds the larger of `max_concurrency` and the
//!   limiter's ceiling, and only grows through a ramp step, the end of the
//!   ramp, a manual override, or the limiter while closed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::config::{BreakerConfig, ConfigError};
use crate::coordination::SharedBreaker;
use crate::gate::{GateSnapshot, SharedGate};
use crate::limiter::{LimitChange, Limiter};
use crate::probe::{LocalProbeAdmission, ProbeAdmission, ProbeTicket};
use crate::ramp;
use crate::reason::{Reason, State, Transition};
use crate::signals::db_locks::DbLockSignal;
use crate::signals::heartbeats::{Heartbeat, LockWaitSignal};
use crate::signals::outcomes::{Evidence, Outcome, OutcomeClass, OutcomeSignals, OutcomeTally};
use crate::signals::queue::{QueueSample, QueueSignals};
use crate::signals::{Reading, SignalKind};
use crate::status::{
    BreakerStatus, CoolDownStatus, HalfOpenStatus, OverrideKind, OverrideStatus, RampStatus,
    SignalStatus, TransitionRecord,
};
use crate::window::millis_since;

/// A node whose latest this many calls all failed on the dependency sees
/// dependency trouble ([`Breaker::dependency_trouble`]): one message's
/// failures alone make at most as many as it has attempts, and a healthy
/// dependency's successes end a streak at once.
pub const TROUBLE_STREAK: u32 = 3;

#[derive(Debug, Clone)]
struct Override {
    kind: OverrideKind,
    note: String,
    until: Option<Instant>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The circuit breaker; see the module docs for the state machine.
///
/// Not thread-safe by itself: the service keeps it behind a mutex and lets
/// workers read [`Breaker::shared_gate`] without locking.
#[derive(Debug)]
pub struct Breaker<A: ProbeAdmission = LocalProbeAdmission> {
    cfg: BreakerConfig,
    origin: Instant,
    state: State,
    since: Instant,
    /// When the outcome windows were last cleared (entering half-open or
    /// the ramp): calls that began earlier are not counted.
    evidence_since: Option<Instant>,
    ramp_step: usize,
    /// The current ramp step's calls: whether it may end early.
    step_evidence: ramp::StepEvidence,
    cool_down: Duration,
    opens_since_close: u32,
    period: u64,
    successes: u32,
    admission: A,
    outcomes: OutcomeSignals,
    queue: QueueSignals,
    lock_wait: LockWaitSignal,
    db_locks: DbLockSignal,
    manual: Option<Override>,
    /// Held open because the dependency cannot be reached at all (the
    /// service could not connect): why, in words.
    unreachable: Option<String>,
    history: VecDeque<Transition>,
    /// The closed limit, when `limiter.enabled`.
    limiter: Limiter,
    rng: SmallRng,
    shared: Arc<SharedGate>,
    published: GateSnapshot,
}

impl Breaker<LocalProbeAdmission> {
    /// A closed breaker with local probe admission and an OS-seeded RNG for
    /// the cool-down jitter.
    pub fn new(config: BreakerConfig, now: Instant) -> Result<Self, ConfigError> {
        Self::build(
            config,
            LocalProbeAdmission::new(),
            SmallRng::from_os_rng(),
            now,
        )
    }

    /// Like [`Breaker::new`] with a fixed RNG seed (reproducible tests).
    pub fn with_seed(config: BreakerConfig, seed: u64, now: Instant) -> Result<Self, ConfigError> {
        Self::with_admission(config, LocalProbeAdmission::new(), seed, now)
    }
}

impl<A: ProbeAdmission> Breaker<A> {
    /// A closed breaker with the given probe admission (e.g. fleet-wide).
    pub fn with_admission(
        config: BreakerConfig,
        admission: A,
        seed: u64,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        Self::build(config, admission, SmallRng::seed_from_u64(seed), now)
    }

    fn build(
        config: BreakerConfig,
        admission: A,
        rng: SmallRng,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let limiter_cfg = crate::config::LimiterConfig {
            max_concurrency: config.limiter.ceiling(config.max_concurrency),
            ..config.limiter.clone()
        };
        let limiter = Limiter::new(
            limiter_cfg,
            config.limiter.initial(config.max_concurrency),
            0,
        )
        .slow_start(config.max_concurrency);
        // What `publish` would say: the limiter's start when it sets the
        // limit, else the fixed one.
        let initial = GateSnapshot::closed(if config.limiter.enabled && !config.dry_run {
            limiter.limit()
        } else {
            config.max_concurrency
        });
        Ok(Self {
            limiter,
            outcomes: OutcomeSignals::new(&config.failure_ratio, &config.slow_calls),
            queue: QueueSignals::new(&config.dlq, &config.in_flight),
            lock_wait: LockWaitSignal::new(&config.lock_wait),
            db_locks: DbLockSignal::new(&config.db_lock_waiters),
            history: VecDeque::with_capacity(config.history_len),
            cfg: config,
            origin: now,
            state: State::Closed,
            since: now,
            evidence_since: None,
            ramp_step: 0,
            step_evidence: ramp::StepEvidence::new(0),
            cool_down: Duration::ZERO,
            opens_since_close: 0,
            period: 0,
            successes: 0,
            admission,
            manual: None,
            unreachable: None,
            rng,
            shared: Arc::new(SharedGate::new(initial)),
            published: initial,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Whether the dependency looks like the trouble now, asked before a
    /// message that keeps failing on it is dead-lettered for running out
    /// of attempts (it is retried instead while this holds: the fault is
    /// not the message's). Yes when the breaker is not closed, or the
    /// failure ratio is at least half its threshold: judged as the signal
    /// judges it, or, with fewer calls than `min_calls` in the window (low
    /// traffic, or a node seeing a share of it), over the calls there are,
    /// given at least two failures (more than the one being settled).
    /// Without successes a database that is down cannot be told from a
    /// message that fails alone, so at low traffic such a message retries
    /// (at the backoff's cap) until other calls succeed around it. On a
    /// fleet's lease holder, whose window also holds the other nodes'
    /// outcomes a beat or two late (their successes before an outage
    /// dilute its first seconds), this node's own calls are judged the same
    /// way too, and either says trouble. And whatever the windows hold,
    /// when this node's last [`TROUBLE_STREAK`] calls all failed on the
    /// dependency: at an outage's start the window is still full of the
    /// minutes before it, and a message's first attempts follow each other
    /// within a second. Never in dry-run mode.
    pub fn dependency_trouble(&self, now: Instant) -> bool {
        if self.cfg.dry_run {
            return false;
        }
        if self.state != State::Closed {
            return true;
        }
        let now_ms = self.ms(now);
        let half = self.cfg.failure_ratio.threshold / 2.0;
        let min_calls = self.cfg.failure_ratio.min_calls;
        let trouble = |(failures, calls): (u64, u64)| {
            calls > 0
                && failures as f64 / calls as f64 >= half
                && (calls >= min_calls || failures >= 2)
        };
        self.outcomes.failure_streak() >= TROUBLE_STREAK
            || trouble(self.outcomes.failure_counts(now_ms))
            || self
                .outcomes
                .own_failure_counts(now_ms)
                .is_some_and(trouble)
    }

    /// The breaker's own state (the shadow state in dry-run mode).
    pub fn state(&self) -> State {
        self.state
    }

    /// The breaker's own concurrency limit for its state.
    pub fn limit(&self) -> u32 {
        let max = self.cfg.max_concurrency;
        match self.state {
            State::Closed if self.cfg.limiter.enabled && self.limiter.is_active() => {
                self.limiter.limit()
            }
            State::Closed => max,
            State::Open => 0,
            State::HalfOpen => self.cfg.half_open.max_probes.min(max),
            State::Ramping => self
                .cfg
                .ramp
                .steps
                .get(self.ramp_step)
                .map_or(max, |f| ramp::step_limit(max, *f)),
        }
    }

    /// What workers are told now (the last published snapshot).
    pub fn gate(&self) -> GateSnapshot {
        self.published
    }

    /// The lock-free gate to hand to workers.
    pub fn shared_gate(&self) -> Arc<SharedGate> {
        Arc::clone(&self.shared)
    }

    /// The latest transitions, oldest first.
    pub fn history(&self) -> impl ExactSizeIterator<Item = &Transition> {
        self.history.iter()
    }

    /// Probes outstanding in the current half-open period.
    pub fn outstanding_probes(&self) -> u32 {
        if self.state == State::HalfOpen {
            self.admission.outstanding(self.period)
        } else {
            0
        }
    }

    fn ms(&self, now: Instant) -> u64 {
        millis_since(self.origin, now)
    }

    fn enforcing(&self) -> bool {
        !self.cfg.dry_run || self.manual.is_some()
    }

    // ---- inputs -------------------------------------------------------

    /// Records a finished call. O(1). Never trips by itself, except in
    /// dry-run mode while the shadow state is half-open, where every outcome
    /// counts as a probe.
    pub fn record_outcome(&mut self, outcome: Outcome, now: Instant) -> Option<Transition> {
        if self.began_before_the_windows(outcome, now) {
            return None;
        }
        let now_ms = self.ms(now);
        self.outcomes.record(outcome, now_ms);
        let failed = match outcome.class {
            OutcomeClass::Success => false,
            OutcomeClass::Dependency => true,
            OutcomeClass::Permanent | OutcomeClass::KeyContention => {
                return self.dry_probe(outcome, now);
            }
        };
        self.limiter.record(outcome.latency, failed);
        if self.state == State::Ramping {
            self.step_evidence.record(outcome.latency, failed);
        }
        self.dry_probe(outcome, now)
    }

    /// In dry-run mode while the shadow state is half-open, every outcome
    /// counts as a probe.
    fn dry_probe(&mut self, outcome: Outcome, now: Instant) -> Option<Transition> {
        if self.cfg.dry_run && self.manual.is_none() && self.state == State::HalfOpen {
            return self.probe_result(outcome.class, now);
        }
        None
    }

    /// The half-open period and its probe limit, while probes may be
    /// admitted (half-open, no manual override, not dry run): what a fleet
    /// store's slots are counted against (see [`crate::ProbeSlots`]).
    pub fn probe_period(&self) -> Option<(u64, u32)> {
        (self.state == State::HalfOpen && self.manual.is_none() && !self.cfg.dry_run).then(|| {
            (
                self.period,
                self.cfg.half_open.max_probes.min(self.cfg.max_concurrency),
            )
        })
    }

    /// [`Breaker::try_admit_probe`] for the half-open `period` a fleet slot
    /// was taken in: `None` once the breaker has moved to another period
    /// (the slot must be given back).
    pub fn try_admit_probe_in(&mut self, period: u64, now: Instant) -> Option<ProbeTicket> {
        if period != self.period {
            return None;
        }
        self.try_admit_probe(now)
    }

    /// In half-open, takes a probe slot; `None` when not half-open, in
    /// dry-run mode, under a manual override, or when all slots are taken.
    pub fn try_admit_probe(&mut self, now: Instant) -> Option<ProbeTicket> {
        if self.state != State::HalfOpen || self.manual.is_some() || self.cfg.dry_run {
            return None;
        }
        let limit = self.cfg.half_open.max_probes.min(self.cfg.max_concurrency);
        self.admission.try_admit_probe(self.period, limit, now)
    }

    /// Records a probe's outcome: frees its slot and, if the ticket belongs to
    /// the current half-open period, acts on it at once (a dependency failure
    /// re-opens; the M-th consecutive success starts the ramp; a permanent
    /// failure is neutral). The outcome is recorded like any other too.
    pub fn record_probe_outcome(
        &mut self,
        ticket: ProbeTicket,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        if !self.began_before_the_windows(outcome, now) {
            let now_ms = self.ms(now);
            self.outcomes.record(outcome, now_ms);
        }
        let current = self.admission.complete_probe(ticket, now)
            && ticket.period == self.period
            && self.state == State::HalfOpen
            && self.manual.is_none();
        if current {
            self.probe_result(outcome.class, now)
        } else {
            None
        }
    }

    /// Records a look at the queue backend.
    pub fn observe_queue(&mut self, sample: QueueSample, now: Instant) {
        let now_ms = self.ms(now);
        self.queue.observe(sample, now_ms);
    }

    /// Records worker heartbeats (the latest per worker wins; beats already
    /// older than the heartbeat TTL are ignored).
    pub fn observe_heartbeats(&mut self, beats: &[Heartbeat], now: Instant) {
        let ttl = Duration::from_millis(self.cfg.lock_wait.heartbeat_ttl_ms);
        for hb in beats {
            if now.saturating_duration_since(hb.at) <= ttl {
                self.lock_wait.observe(hb);
            }
        }
    }

    /// Forgets a worker that stopped cleanly (otherwise it ages out).
    pub fn forget_worker(&mut self, worker: u64) {
        self.lock_wait.forget(worker);
    }

    /// Records the database's count of sessions waiting on a lock.
    pub fn observe_db_lock_waiters(&mut self, count: u32, now: Instant) {
        self.db_locks.observe(count, now);
    }

    /// Records outcomes other nodes of a fleet counted (this node's
    /// controller reads them from the fleet store), as of `now`.
    pub fn record_fleet_outcomes(&mut self, tally: &OutcomeTally, now: Instant) {
        let now_ms = self.ms(now);
        self.outcomes.record_tally(tally, now_ms);
    }

    /// The slow-call threshold, for counting outcomes into an
    /// [`OutcomeTally`].
    pub fn slow_after(&self) -> Duration {
        self.outcomes.slow_after()
    }

    /// The fleet counted `successes` probe successes in half-open `period`
    /// (its store counts them across nodes, so three nodes with one success
    /// each reach three): starts the ramp once they reach
    /// `successes_to_close`, like this node's own M-th success would.
    pub fn fleet_probes_succeeded(
        &mut self,
        period: u64,
        successes: u32,
        now: Instant,
    ) -> Option<Transition> {
        if self.state != State::HalfOpen || self.manual.is_some() || period != self.period {
            return None;
        }
        self.successes = self.successes.max(successes);
        self.ramp_if_enough_successes(now)
    }

    // ---- fleet --------------------------------------------------------

    /// The state as a fleet shares it: what another node's breaker needs to
    /// take it with [`Breaker::adopt`].
    pub fn shared_view(&self, now: Instant) -> SharedBreaker {
        SharedBreaker {
            state: self.state,
            reason: self
                .history
                .back()
                .map_or(Reason::OverrideCleared, |t| t.reason.clone()),
            limit: self.limit(),
            in_state_ms: millis(now.saturating_duration_since(self.since)),
            period: self.period,
            ramp_step: u32::try_from(self.ramp_step).unwrap_or(u32::MAX),
            cool_down_ms: millis(self.cool_down),
            opens_since_close: self.opens_since_close,
            manual: self.manual.as_ref().map(|m| OverrideStatus {
                kind: m.kind,
                note: m.note.clone(),
                remaining_ms: m.until.map(|u| millis(u.saturating_duration_since(now))),
            }),
        }
    }

    /// Takes the state another node of the fleet decided (read from the
    /// shared record, aged to `now`), with the entry actions of that state
    /// (a new half-open period starts with no probes out and empty outcome
    /// windows, as the ramp does). Returns the transition when the state,
    /// period or ramp step changed, `None` when it was already there.
    /// Signals and their windows stay this node's own.
    pub fn adopt(&mut self, v: &SharedBreaker, now: Instant) -> Option<Transition> {
        let from = self.state;
        let step = usize::try_from(v.ramp_step).unwrap_or(usize::MAX);
        let same = from == v.state
            && self.period == v.period
            && (v.state != State::Ramping || self.ramp_step == step)
            && self.manual.as_ref().map(|m| m.kind) == v.manual.as_ref().map(|m| m.kind);
        if v.state == State::HalfOpen && (from != State::HalfOpen || self.period != v.period) {
            self.admission.begin_period(v.period, now);
            self.successes = 0;
            self.clear_evidence(now);
        }
        if v.state == State::Ramping && from != State::Ramping {
            self.clear_evidence(now);
        }
        if v.state == State::Ramping && (from != State::Ramping || self.ramp_step != step) {
            // A new step proves itself from its own calls, should this node
            // come to judge the ramp (the lease moving to it).
            self.step_evidence = ramp::StepEvidence::new(self.ms(now));
        }
        self.period = v.period;
        self.ramp_step = step;
        self.cool_down = Duration::from_millis(v.cool_down_ms);
        self.opens_since_close = v.opens_since_close;
        self.manual = v.manual.as_ref().map(|m| Override {
            kind: m.kind,
            note: m.note.clone(),
            until: m
                .remaining_ms
                .and_then(|r| now.checked_add(Duration::from_millis(r))),
        });
        self.hand_over(from, v.state, now);
        self.state = v.state;
        self.since = now
            .checked_sub(Duration::from_millis(v.in_state_ms))
            .unwrap_or(now);
        if same {
            self.publish();
            return None;
        }
        let t = Transition {
            from,
            to: v.state,
            reason: v.reason.clone(),
            at: now,
            limit: self.limit(),
            dry_run: !self.enforcing(),
        };
        self.remember(t.clone());
        self.publish();
        Some(t)
    }

    /// Empties the outcome and DLQ windows: what came before is evidence
    /// about a past the new state left behind.
    fn clear_evidence(&mut self, now: Instant) {
        self.outcomes.clear();
        self.evidence_since = Some(now);
        self.queue.clear_dlq();
    }

    fn remember(&mut self, t: Transition) {
        if self.history.len() >= self.cfg.history_len {
            self.history.pop_front();
        }
        self.history.push_back(t);
    }

    // ---- the tick -----------------------------------------------------

    /// Judges the signals and timers; at most one transition per call.
    pub fn evaluate(&mut self, now: Instant) -> Option<Transition> {
        let now_ms = self.ms(now);
        self.lock_wait.prune(now);
        self.outcomes.judge_slow_calls(now_ms);
        let closed_since = self.closed_since_ms();
        self.queue.learn(now_ms, closed_since);

        if let Some(m) = &self.manual {
            if m.until.is_some_and(|u| now >= u) {
                return Some(self.end_override(Reason::OverrideExpired, now));
            }
            return None;
        }
        if self.unreachable.is_some() {
            return None;
        }

        let in_state = now.saturating_duration_since(self.since);
        match self.state {
            State::Open => (in_state >= self.cool_down).then(|| {
                let cool_down_ms = millis(self.cool_down);
                self.go(
                    State::HalfOpen,
                    Reason::CoolDownElapsed { cool_down_ms },
                    now,
                )
            }),
            State::HalfOpen => {
                if let Some(r) = self.first_trip(now) {
                    return Some(self.go(State::Open, r, now));
                }
                self.probe_timeout(now)
            }
            State::Ramping => {
                if let Some(r) = self.first_trip(now) {
                    return Some(self.go(State::Open, r, now));
                }
                let hold = Duration::from_millis(self.cfg.ramp.hold_ms);
                if in_state < hold && !self.step_proven(now) {
                    return None;
                }
                let held_ms = millis(in_state);
                let steps = &self.cfg.ramp.steps;
                match (steps.get(self.ramp_step), steps.get(self.ramp_step + 1)) {
                    (Some(&from), Some(&to)) => {
                        Some(self.go(State::Ramping, Reason::RampStep { from, to, held_ms }, now))
                    }
                    _ => Some(self.go(State::Closed, Reason::RampComplete { held_ms }, now)),
                }
            }
            State::Closed => self.first_trip(now).map(|r| self.go(State::Open, r, now)),
        }
    }

    /// Whether the current ramp step has earned an early end: in use and at
    /// the limiter's baseline for `ramp.min_hold_ms` (see [`crate::ramp`]).
    fn step_proven(&mut self, now: Instant) -> bool {
        if !self.cfg.limiter.enabled {
            return false;
        }
        let rule = ramp::EvidenceRule {
            window_ms: self.cfg.limiter.window_ms,
            min_samples: self.cfg.limiter.min_samples,
            min_hold_ms: self.cfg.ramp.min_hold_ms,
            limit: self.limit(),
        };
        let now_ms = self.ms(now);
        let limiter = &self.limiter;
        self.step_evidence
            .proven(now_ms, rule, |mean| limiter.at_baseline(mean))
    }

    /// Closed, with no manual override: lets the limiter judge its window
    /// and publishes the limit if it moved. The controller calls it on each
    /// tick after [`Breaker::evaluate`] (on every node of a fleet: each
    /// node's limit is its own).
    pub fn adjust_limit(&mut self, now: Instant) -> Option<LimitChange> {
        if !self.cfg.limiter.enabled || self.state != State::Closed || self.manual.is_some() {
            return None;
        }
        let change = self.limiter.judge(self.ms(now))?;
        self.publish();
        Some(change)
    }

    /// Half-open with a probe of this breaker's own unanswered past
    /// `probe_timeout_ms`: re-opens. Part of [`Breaker::evaluate`]; a fleet
    /// node that does not evaluate (a follower) calls it alone, since only
    /// it knows its probes.
    pub fn probe_timeout(&mut self, now: Instant) -> Option<Transition> {
        if self.state != State::HalfOpen || self.manual.is_some() {
            return None;
        }
        let timeout = Duration::from_millis(self.cfg.half_open.probe_timeout_ms);
        let oldest = self.admission.oldest_outstanding(self.period)?;
        let waited = now.saturating_duration_since(oldest);
        (waited >= timeout).then(|| {
            let waited_ms = millis(waited);
            self.go(State::Open, Reason::ProbeTimedOut { waited_ms }, now)
        })
    }

    // ---- manual override ----------------------------------------------

    /// Forces the breaker open (enforced even in dry-run mode) for `ttl`, or
    /// until [`Breaker::clear_override`] when `ttl` is `None`.
    pub fn force_open(
        &mut self,
        note: impl Into<String>,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Transition {
        let note = note.into();
        self.manual = Some(Override {
            kind: OverrideKind::Open,
            note: note.clone(),
            until: ttl.and_then(|t| now.checked_add(t)),
        });
        let ttl_ms = ttl.map(millis);
        self.go(State::Open, Reason::ForcedOpen { note, ttl_ms }, now)
    }

    /// Forces the breaker closed at full concurrency, signals ignored, for
    /// `ttl` or until cleared.
    pub fn force_closed(&mut self, ttl: Option<Duration>, now: Instant) -> Transition {
        self.manual = Some(Override {
            kind: OverrideKind::Closed,
            note: String::new(),
            until: ttl.and_then(|t| now.checked_add(t)),
        });
        let ttl_ms = ttl.map(millis);
        self.go(State::Closed, Reason::ForcedClosed { ttl_ms }, now)
    }

    /// Ends the manual override; automatic control resumes (from half-open
    /// after a forced open, from closed after a forced close).
    pub fn clear_override(&mut self, now: Instant) -> Option<Transition> {
        self.manual
            .is_some()
            .then(|| self.end_override(Reason::OverrideCleared, now))
    }

    fn end_override(&mut self, reason: Reason, now: Instant) -> Transition {
        if let Some(why) = &self.unreachable {
            // Held open for an unreachable dependency under the override:
            // that hold applies now.
            let detail = why.clone();
            self.manual = None;
            return self.go(State::Open, Reason::Unreachable { detail }, now);
        }
        let idle = self.queue.idle(self.ms(now));
        let (to, reason) = match self.manual.take().map(|m| m.kind) {
            // With nothing queued there is nothing to probe with: half-open
            // (and the ramp after it) would only throttle the pool until
            // traffic returned.
            Some(OverrideKind::Open) if idle => (State::Closed, Reason::OverrideClearedIdle),
            Some(OverrideKind::Open) => (State::HalfOpen, reason),
            _ => (State::Closed, reason),
        };
        self.go(to, reason, now)
    }

    // ---- status -------------------------------------------------------

    /// Every signal's current reading, in evaluation order.
    fn readings(&self, now: Instant) -> [Reading; 6] {
        let now_ms = self.ms(now);
        let evidence = if self.state == State::Ramping {
            Evidence::AnyCall
        } else {
            Evidence::MinCalls
        };
        [
            self.outcomes.failure_ratio(now_ms, evidence),
            self.outcomes.slow_calls(now_ms),
            self.queue.dlq_velocity(now_ms),
            self.queue.in_flight(now_ms, self.closed_since_ms()),
            self.lock_wait.reading(now),
            self.db_locks.reading(now),
        ]
    }

    /// Holds the breaker open because the dependency cannot be reached at
    /// all (`why`: refused, unresolvable name, ...), until
    /// [`Breaker::dependency_reachable`]. Nothing else moves it meanwhile,
    /// and `status` says so. Returns the transition if it was not open.
    pub fn dependency_unreachable(&mut self, why: &str, now: Instant) -> Option<Transition> {
        self.unreachable = Some(why.to_owned());
        // An operator's override wins; when it ends, the hold applies.
        (self.state != State::Open && self.manual.is_none()).then(|| {
            self.go(
                State::Open,
                Reason::Unreachable {
                    detail: why.to_owned(),
                },
                now,
            )
        })
    }

    /// The dependency answered a reachability check while the breaker is
    /// open for failures a check can clear (it could not be reached:
    /// refused, reset, unresolvable; the caller tells): the cool-down ends
    /// at once and probes confirm it, instead of a recovered database
    /// waiting out a cool-down that grew while it was away. A manual
    /// override or an unreachable hold keeps the breaker where it is.
    pub fn dependency_answers(&mut self, now: Instant) -> Option<Transition> {
        (self.state == State::Open && self.manual.is_none() && self.unreachable.is_none())
            .then(|| self.go(State::HalfOpen, Reason::Reachable, now))
    }

    /// Why the dependency cannot be reached, while the breaker is held open
    /// for it.
    pub fn unreachable(&self) -> Option<&str> {
        self.unreachable.as_deref()
    }

    /// The dependency answers again: half-open, so probes confirm it before
    /// the ramp (a manual override in force keeps the breaker where it is).
    pub fn dependency_reachable(&mut self, now: Instant) -> Option<Transition> {
        self.unreachable.take()?;
        (self.state == State::Open && self.manual.is_none())
            .then(|| self.go(State::HalfOpen, Reason::Reachable, now))
    }

    /// What the breaker waits for in its state, for `breaker status`.
    fn waiting_for(&self, in_state: Duration, now: Instant) -> Option<String> {
        let secs = |d: Duration| d.as_secs_f64();
        if let Some(why) = &self.unreachable {
            return Some(format!("the dependency to answer ({why})"));
        }
        if self.manual.is_some() && self.state != State::Closed {
            return Some("a manual reset (or the override's TTL)".to_owned());
        }
        match self.state {
            State::Closed => None,
            State::Open => Some(format!(
                "the cool-down: {:.1} s left, then half-open probes",
                secs(self.cool_down.saturating_sub(in_state))
            )),
            State::HalfOpen => {
                let needed = self
                    .cfg
                    .half_open
                    .successes_to_close
                    .saturating_sub(self.successes);
                let mut s = format!(
                    "{needed} more probe success(es) ({} of {} probes out)",
                    self.admission.outstanding(self.period),
                    self.cfg.half_open.max_probes
                );
                if self.queue.idle(self.ms(now)) {
                    s.push_str("; the queue is empty, so there is nothing to probe with yet");
                }
                Some(s)
            }
            State::Ramping => Some(format!(
                "step {} of {} held {:.0} of {:.0} s without a dependency failure",
                self.ramp_step + 1,
                self.cfg.ramp.steps.len(),
                secs(in_state),
                secs(Duration::from_millis(self.cfg.ramp.hold_ms))
            )),
        }
    }

    /// A full picture for the admin API and `breaker status`.
    pub fn status(&self, now: Instant) -> BreakerStatus {
        let in_state = now.saturating_duration_since(self.since);
        let last = self.history.back();
        let judged_now = self.state != State::Open;
        BreakerStatus {
            state: self.state,
            gate: self.published,
            limit: self.limit(),
            limiter: self
                .cfg
                .limiter
                .enabled
                .then(|| self.limiter.status(self.ms(now))),
            in_state_ms: millis(in_state),
            reason: last.map(|t| t.reason.clone()),
            message: last.map(|t| t.reason.to_string()),
            waiting_for: self.waiting_for(in_state, now),
            ramp: (self.state == State::Ramping).then(|| RampStatus {
                step: self.ramp_step,
                steps: self.cfg.ramp.steps.len(),
                fraction: self
                    .cfg
                    .ramp
                    .steps
                    .get(self.ramp_step)
                    .copied()
                    .unwrap_or(1.0),
                held_ms: millis(in_state),
                hold_ms: self.cfg.ramp.hold_ms,
            }),
            cool_down: (self.state == State::Open && self.manual.is_none()).then(|| {
                CoolDownStatus {
                    total_ms: millis(self.cool_down),
                    remaining_ms: millis(self.cool_down.saturating_sub(in_state)),
                }
            }),
            half_open: (self.state == State::HalfOpen).then(|| HalfOpenStatus {
                outstanding: self.admission.outstanding(self.period),
                max_probes: self.cfg.half_open.max_probes,
                successes: self.successes,
                successes_to_close: self.cfg.half_open.successes_to_close,
            }),
            signals: self
                .readings(now)
                .into_iter()
                .map(|r| SignalStatus {
                    tripping: judged_now && r.trip.is_some(),
                    signal: r.kind,
                    enabled: r.enabled,
                    value: r.value,
                    threshold: r.threshold,
                    detail: r.detail,
                })
                .collect(),
            opens_since_close: self.opens_since_close,
            baseline_throughput: self.queue.baseline(),
            history: self
                .history
                .iter()
                .map(|t| TransitionRecord {
                    from: t.from,
                    to: t.to,
                    message: t.reason.to_string(),
                    reason: t.reason.clone(),
                    ago_ms: millis(now.saturating_duration_since(t.at)),
                    limit: t.limit,
                    dry_run: t.dry_run,
                })
                .collect(),
            manual_override: self.manual.as_ref().map(|m| OverrideStatus {
                kind: m.kind,
                note: m.note.clone(),
                remaining_ms: m.until.map(|u| millis(u.saturating_duration_since(now))),
            }),
            dry_run: self.cfg.dry_run,
        }
    }

    // ---- internals ----------------------------------------------------

    /// Whether the call behind `outcome` began before the outcome windows
    /// were last cleared: evidence about a past they left behind.
    fn began_before_the_windows(&self, outcome: Outcome, now: Instant) -> bool {
        let began = now.checked_sub(outcome.latency);
        began.zip(self.evidence_since).is_some_and(|(b, e)| b < e)
    }

    fn closed_since_ms(&self) -> Option<u64> {
        (self.state == State::Closed).then(|| self.ms(self.since))
    }

    fn first_trip(&self, now: Instant) -> Option<Reason> {
        let closed = self.state == State::Closed;
        self.readings(now)
            .into_iter()
            .filter(|r| closed || r.kind != SignalKind::InFlight)
            .find_map(|r| r.trip)
    }

    fn probe_result(&mut self, class: OutcomeClass, now: Instant) -> Option<Transition> {
        match class {
            OutcomeClass::Success => {
                self.successes = self.successes.saturating_add(1);
                self.ramp_if_enough_successes(now)
            }
            OutcomeClass::Dependency => Some(self.go(State::Open, Reason::ProbeFailed, now)),
            OutcomeClass::Permanent | OutcomeClass::KeyContention => None,
        }
    }

    /// Half-open with `successes_to_close` successes: the ramp (or closed,
    /// with no ramp steps).
    fn ramp_if_enough_successes(&mut self, now: Instant) -> Option<Transition> {
        (self.successes >= self.cfg.half_open.successes_to_close).then(|| {
            let successes = self.successes;
            let reason = Reason::ProbesSucceeded { successes };
            if self.cfg.ramp.steps.is_empty() {
                self.go(State::Closed, reason, now)
            } else {
                self.go(State::Ramping, reason, now)
            }
        })
    }

    /// Performs a transition: entry actions, history, gate.
    fn go(&mut self, to: State, reason: Reason, now: Instant) -> Transition {
        let from = self.state;
        match to {
            State::Open => {
                if !matches!(reason, Reason::ForcedOpen { .. }) {
                    self.cool_down =
                        ramp::cool_down(&self.cfg.cool_down, self.opens_since_close, &mut self.rng);
                    self.opens_since_close = self.opens_since_close.saturating_add(1);
                }
            }
            State::HalfOpen => {
                self.period = self.period.wrapping_add(1);
                self.admission.begin_period(self.period, now);
                self.successes = 0;
                self.clear_evidence(now);
            }
            State::Ramping => {
                self.step_evidence = ramp::StepEvidence::new(self.ms(now));
                if from == State::Ramping {
                    self.ramp_step = self.ramp_step.saturating_add(1);
                } else {
                    self.ramp_step = 0;
                    self.clear_evidence(now);
                }
            }
            State::Closed => self.opens_since_close = 0,
        }
        self.hand_over(from, to, now);
        self.state = to;
        self.since = now;
        let t = Transition {
            from,
            to,
            reason,
            at: now,
            limit: self.limit(),
            dry_run: !self.enforcing(),
        };
        self.remember(t.clone());
        self.publish();
        t
    }

    /// The limit passes between the breaker and the limiter: closed, the
    /// limiter takes over from the ramp's last limit; elsewhere it pauses.
    fn hand_over(&mut self, from: State, to: State, now: Instant) {
        if to != State::Closed {
            self.limiter.pause();
        } else if from != State::Closed || !self.limiter.is_active() {
            let now_ms = self.ms(now);
            let _ = self.limiter.resume(self.cfg.max_concurrency, now_ms);
        }
    }

    fn publish(&mut self) {
        let mut g = if self.enforcing() {
            GateSnapshot {
                state: self.state,
                may_poll: self.state != State::Open,
                limit: self.limit(),
                probe_only: self.state == State::HalfOpen,
                generation: 0,
            }
        } else {
            GateSnapshot::closed(self.cfg.max_concurrency)
        };
        if !g.same_decision(&self.published) {
            g.generation = self.published.next_generation();
            self.published = g;
            self.shared.store(g);
        }
    }
}

#[cfg(test)]
mod tests;
