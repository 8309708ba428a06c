//! Workers: take messages off the queue and apply them to the sink, under
//! the breaker's gate.
//!
//! One dispatcher task runs the loop; each apply runs as its own task.
//!
//! ```text
//!   gate closed? ── yes ──▶ release held messages, wait for a transition
//!        │ no
//!   free slots = gate.limit - running ── 0 ──▶ wait for an apply to end
//!        │ > 0
//!   claim up to free slots (half-open: 1, and only with a probe ticket);
//!   gate moved meanwhile? release them untried
//!        │
//!   lanes: run now / hold behind its key / release (key parked)
//!        │
//!   apply ──▶ settle:  ok ─────────────▶ ack
//!                      permanent ───────▶ dead-letter at once (never feeds the breaker)
//!                      lock failure ────▶ park the key, release untried
//!                      dependency ──────▶ breaker open now? release untried
//!                                         attempts left, or the database
//!                                         is the trouble?  retry later (full-jitter backoff)
//!                                         else            dead-letter (exhausted)
//! ```
//!
//! Retries are the queue's delayed visibility, never a sleep holding a
//! connection. Every third of a lease the dispatcher extends the leases of
//! what it holds (applying, or waiting in a lane), so a slow key's backlog
//! is never handed to a second worker. Shutdown stops claiming, lets
//! running applies finish (up to [`SHUTDOWN_GRACE`], then aborts them and
//! releases their messages) and releases what waits in the lanes.

pub mod apply_runtime;
pub mod lanes;
pub mod settle;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use breakwater_admin_api::AttemptRecord;
use breakwater_control::{BackoffPolicy, GateSnapshot, Outcome, OutcomeClass};
use breakwater_sink::{Applied, Event, Sink, SinkError};
use futures_util::FutureExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::watch;
use tokio::task::JoinSet;

use self::lanes::{Admit, LaneOutcome, LaneSettings, Lanes, ParkedKey};
use self::settle::{Settle, SettleFacts};
pub use crate::breaker::Controller;
use crate::breaker::Probe;
use crate::events::journal::EventJournal;
use crate::queue::{DeadLetterReason, Delivery, Flow, Queue, Receipt};
use crate::telemetry;

/// Longest wait for running applies at shutdown; those still running then
/// are aborted and their messages released.
pub const SHUTDOWN_GRACE: Duration = if cfg!(test) {
    Duration::from_secs(1)
} else {
    Duration::from_secs(20)
};
/// Lease extensions go out every third of a lease, but no more often than
/// this.
const EXTEND_AT_MOST_EVERY: Duration = Duration::from_millis(100);
/// Messages the lanes may hold in memory on a queue that cannot filter by
/// key (all of them may be behind one key): a hot key's backlog waits here,
/// leased, instead of coming back at every claim.
/// Kept well under a broker's default outstanding-message limit
/// (NATS `max_ack_pending`, 10,000), which held messages count against.
const HELD_WITHOUT_FILTER: usize = 1024;
/// Pause when the queue has nothing visible.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Delay of a message that could not be a probe (its key busy or parked,
/// or every probe slot taken).
const PROBE_REFUSED_DELAY: Duration = Duration::from_millis(250);
/// Pause after a queue error.
const ERROR_WAIT: Duration = Duration::from_millis(500);

/// How the workers behave.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub max_concurrency: u32,
    pub max_attempts: u32,
    pub backoff: BackoffPolicy,
    pub lease: Duration,
    pub lanes: LaneSettings,
    /// Where each settled attempt is remembered (shared with the admin
    /// API's event lookup).
    pub journal: Arc<EventJournal>,
}

/// A message on its way through a worker.
#[derive(Debug)]
struct Job {
    delivery: Delivery,
    probe: Option<Probe>,
    /// Whether a lane takes this message's key aside on a lock failure
    /// (it has a key, and lanes are on).
    laned: bool,
}

impl Job {
    fn key(&self) -> Option<&str> {
        self.delivery.message.entity_key.as_deref()
    }
}

/// What an apply task hands back.
struct Done {
    job: Job,
    result: Result<Applied, SinkError>,
    /// How long the apply took, for the settle log line.
    took: Duration,
}

/// [`apply_once`], turning a panic in the sink into a permanent failure,
/// so the message is settled (dead-lettered), its lane slot freed and a
/// probe answered, instead of all three waiting for the lease to run out.
async fn apply_guarded(
    sink: &dyn Sink,
    controller: &Controller,
    job: &Job,
) -> Result<Applied, SinkError> {
    match AssertUnwindSafe(apply_once(sink, controller, job))
        .catch_unwind()
        .await
    {
        Ok(result) => result,
        Err(_) => {
            // A panic is a bug that this message's data reached: the same
            // message would reach it again. So it is poison, not database
            // trouble: dead-lettered with its reason (replay it once the bug
            // is fixed), and never counted against the database.
            let m = &job.delivery.message;
            tracing::error!(source = %m.source, event_id = %m.event_id,
                "the sink panicked while applying; the message goes to the DLQ");
            controller.record(
                Outcome {
                    class: OutcomeClass::Permanent,
                    latency: Duration::ZERO,
                },
                job.probe,
            );
            Err(SinkError::permanent(
                "panic",
                "the sink panicked while applying this message",
            ))
        }
    }
}

/// Applies one message once and reports the outcome to the breaker.
async fn apply_once(
    sink: &dyn Sink,
    controller: &Controller,
    job: &Job,
) -> Result<Applied, SinkError> {
    let started = Instant::now();
    let result = {
        let m = &job.delivery.message;
        let _slot = controller.slots.begin(started, m.entity_key.as_deref());
        let event = Event {
            source: &m.source,
            event_id: &m.event_id,
            entity_key: m.entity_key.as_deref(),
            headers: &m.headers,
            body: &m.body,
            received_at_ms: m.received_at_ms,
            attempt: m.attempts.saturating_add(1),
        };
        sink.apply(&event).await
    };
    let latency = started.elapsed();
    metrics::histogram!(telemetry::SINK_APPLY_SECONDS).record(latency.as_secs_f64());
    let class = settle::breaker_class(&result, job.laned, job.probe.is_some(), || {
        job.key()
            .is_some_and(|key| controller.lock_timeout_class(key) == OutcomeClass::KeyContention)
    });
    let outcome = match class {
        OutcomeClass::Success => "success",
        OutcomeClass::Dependency => "dependency",
        OutcomeClass::Permanent => "permanent",
        OutcomeClass::KeyContention => "contention",
    };
    metrics::counter!(telemetry::APPLY_TOTAL,
        "source" => job.delivery.message.source.clone(), "outcome" => outcome)
    .increment(1);
    if let (OutcomeClass::Dependency, Err(e)) = (class, &result) {
        controller.note_dependency_failure(e.kind);
    }
    controller.record(Outcome { class, latency }, job.probe);
    result
}

/// The delay of a message a lane hands back (its key parked, or too many
/// held behind it) on a queue that cannot leave a key's messages queued:
/// doubled with each time it was handed out, up to `cap`. A hot key's
/// backlog then comes back less and less often instead of taking every
/// claim from the keys that can run (900 held-back messages released
/// every 200 ms would be 4,500 deliveries a second).
fn spread_release(delay: Duration, receives: u32, cap: Duration) -> Duration {
    let doublings = receives.saturating_sub(1).min(8);
    delay.saturating_mul(1 << doublings).min(cap.max(delay))
}

/// Parked keys, shared with the admin API.
pub type ParkedKeys = Arc<Mutex<Vec<ParkedKey>>>;

/// Now, in milliseconds since the Unix epoch.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A hot-key park another node of the fleet announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePark {
    pub key: String,
    /// How long that node parked it; zero: its probe went through, the key
    /// is free again.
    pub park: Duration,
    /// Whether this node keeps probing the key should it have parked the
    /// key itself too (of two nodes, one yields; see
    /// [`lanes::Lanes::park_elsewhere`]).
    pub keep_own: bool,
}

/// Hot-key parks shared with the fleet, for a broker that cannot route one
/// key's messages to one worker: what this node's lanes park goes out
/// (key, park; zero when a park ended in a success), what other nodes park
/// comes in, so a key parked on one node is parked on all.
#[derive(Debug)]
pub struct SharedParks {
    pub outgoing: tokio::sync::mpsc::UnboundedSender<(String, Duration)>,
    pub incoming: tokio::sync::mpsc::UnboundedReceiver<RemotePark>,
    /// This node's share, in `[0, 1)`, of a second `park_cap` added to the
    /// grace after another node's park (a different one per node): should
    /// the parking node go quiet, the other nodes' parks do not all lapse
    /// at once, so one of them probes the key first and, if it fails,
    /// parks it for all again.
    pub stagger: f64,
}

/// Running workers.
pub struct Workers {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Workers {
    /// Starts the dispatcher, recording parked keys in `parked` (which the
    /// admin API may already be showing).
    pub fn start(
        queue: Arc<dyn Queue>,
        sink: Arc<dyn Sink>,
        controller: Arc<Controller>,
        settings: WorkerSettings,
        parked: ParkedKeys,
    ) -> Self {
        let here = tokio::runtime::Handle::current();
        Self::start_in_fleet(queue, sink, controller, settings, parked, None, &here)
    }

    /// [`Workers::start`], sharing hot-key parks with a fleet, the
    /// dispatcher (and so every apply it spawns) on `runtime`.
    pub fn start_in_fleet(
        queue: Arc<dyn Queue>,
        sink: Arc<dyn Sink>,
        controller: Arc<Controller>,
        settings: WorkerSettings,
        parked: ParkedKeys,
        shared_parks: Option<SharedParks>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let capabilities = queue.capabilities();
        let filters_keys = capabilities.filters_keys;
        let mut settings = settings;
        if !filters_keys && !capabilities.push {
            // The queue cannot leave a hot key's messages queued: hold them
            // in memory (their leases extended) rather than hand them back
            // to come again at the next claim. Not on a push broker: what
            // is held counts against its prefetch, so a hot key's backlog
            // would stop every other key's deliveries; there a parked key's
            // messages wait in the broker's delay tiers instead.
            settings.lanes.hold_parked = true;
            settings.lanes.max_held = settings.lanes.max_held.max(HELD_WITHOUT_FILTER);
            // One hot key may take them all: it is the one that needs them.
            settings.lanes.max_held_per_key =
                settings.lanes.max_held_per_key.max(HELD_WITHOUT_FILTER);
        }
        let (stop, stop_rx) = watch::channel(false);
        let dispatcher = Dispatcher {
            arrivals: queue.arrivals(),
            queue,
            sink,
            controller,
            lanes: Lanes::new(settings.lanes),
            settings,
            running: JoinSet::new(),
            receipts: HashMap::new(),
            settling: JoinSet::new(),
            rng: SmallRng::from_os_rng(),
            parked: Arc::clone(&parked),
            flow_set_for: None,
            filters_keys,
            shared_parks,
        };
        let task = runtime.spawn(dispatcher.run(stop_rx));
        Self { stop, task }
    }

    /// Stops claiming, finishes or releases everything, and waits.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

struct Dispatcher {
    queue: Arc<dyn Queue>,
    sink: Arc<dyn Sink>,
    controller: Arc<Controller>,
    settings: WorkerSettings,
    lanes: Lanes<Job>,
    running: JoinSet<Done>,
    /// The receipt of each running apply, to hand its message back should
    /// the task end without settling it (aborted at shutdown, or panicked).
    receipts: HashMap<tokio::task::Id, (Receipt, Option<String>)>,
    settling: JoinSet<()>,
    rng: SmallRng,
    parked: ParkedKeys,
    /// The gate generation the queue's flow was last set for.
    flow_set_for: Option<u32>,
    /// Whether the queue leaves a skipped key's messages queued; if not,
    /// what a lane cannot run comes back, and comes back less often each
    /// time ([`spread_release`]).
    filters_keys: bool,
    /// Hot-key parks shared with the fleet, if any.
    shared_parks: Option<SharedParks>,
    /// Moves when the queue made messages durable (where it can tell): an
    /// idle dispatcher claims at once rather than at its next poll.
    arrivals: Option<crate::queue::Arrivals>,
}

/// Until `arrivals` moves; for ever where there are none (or the queue
/// is gone).
async fn arrival(arrivals: &mut Option<crate::queue::Arrivals>) {
    let moved = match arrivals {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !moved {
        std::future::pending::<()>().await;
    }
}

/// What may end a [`Dispatcher::wait`] besides an apply ending, a
/// settlement, a transition, its timeout or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WakeOn {
    /// Messages arriving: there is room to start them.
    Arrivals,
    /// Nothing else: no room, or no claiming now.
    Nothing,
}

impl Dispatcher {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut last_park_publish = Instant::now();
        let mut last_extend = Instant::now();
        while !*stop.borrow() {
            self.reap();
            self.take_remote_parks();
            if last_park_publish.elapsed() > Duration::from_millis(250) {
                last_park_publish = Instant::now();
                self.publish_parks();
            }
            if last_extend.elapsed() >= (self.settings.lease / 3).max(EXTEND_AT_MOST_EVERY) {
                last_extend = Instant::now();
                self.extend_leases();
            }
            let gate = self.controller.gate();
            self.follow_gate(gate).await;
            if !gate.may_poll {
                self.release_held(Duration::ZERO);
                self.wait(&mut stop, Duration::from_millis(250), WakeOn::Nothing)
                    .await;
                continue;
            }
            // Held messages do not count: a hot key's held messages must not
            // stop unrelated keys from being claimed. The lanes bound what
            // they hold (per key and in all) and release the rest, and a
            // claim that starts nothing waits before the next one.
            let limit = gate.limit.min(self.settings.max_concurrency) as usize;
            let mut free = limit.saturating_sub(self.running.len());
            if free > 0 && !gate.probe_only {
                // Held messages whose key's park ended go first.
                for job in self.lanes.due(Instant::now(), free) {
                    self.spawn_apply(job);
                }
                free = limit.saturating_sub(self.running.len());
            }
            if free == 0 {
                self.wait(&mut stop, IDLE_WAIT, WakeOn::Nothing).await;
                continue;
            }
            let want = if gate.probe_only { 1 } else { free };
            let skip = self.lanes.blocked_keys(Instant::now());
            let deliveries = match self
                .queue
                .claim_skipping(want, self.settings.lease, &skip)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed");
                    self.wait(&mut stop, ERROR_WAIT, WakeOn::Nothing).await;
                    continue;
                }
            };
            // The breaker may have moved while the claim was under way.
            let now_gate = self.controller.gate();
            if now_gate.generation != gate.generation
                && (!now_gate.may_poll || now_gate.probe_only != gate.probe_only)
            {
                for d in deliveries {
                    self.release(d.receipt, Duration::ZERO);
                }
                continue;
            }
            let started_before = self.running.len();
            for delivery in deliveries {
                self.admit(delivery, gate.probe_only).await;
            }
            if self.running.len() == started_before {
                // Nothing could start (empty queue, or only held, parked or
                // refused messages): do not spin; claim again when
                // something arrives.
                self.wait(&mut stop, IDLE_WAIT, WakeOn::Arrivals).await;
            }
        }
        self.shut_down().await;
    }

    /// Sets the queue's flow from the gate once per transition: a push
    /// broker stops delivering when the breaker opens, takes only the
    /// probes half-open, and its prefetch follows the ramp. A failure is
    /// tried again at the next turn of the loop.
    async fn follow_gate(&mut self, gate: GateSnapshot) {
        if self.flow_set_for == Some(gate.generation) {
            return;
        }
        let flow = if !gate.may_poll {
            Flow::Paused
        } else if gate.probe_only {
            Flow::Probing {
                probes: gate.limit.max(1),
            }
        } else {
            Flow::Flowing {
                limit: gate.limit.min(self.settings.max_concurrency).max(1),
            }
        };
        match self.queue.set_flow(flow).await {
            Ok(()) => self.flow_set_for = Some(gate.generation),
            Err(e) => {
                tracing::warn!(error = %e, ?flow, "cannot set the queue's flow; trying again")
            }
        }
    }

    /// Routes one claimed message through the lanes (and, half-open, the
    /// probe admission).
    async fn admit(&mut self, delivery: Delivery, probe_only: bool) {
        let now = Instant::now();
        let mut probe = None;
        if probe_only {
            let key = delivery.message.entity_key.as_deref();
            let ticket = if self.lanes.can_run(key, now) {
                self.controller.try_admit_probe().await
            } else {
                None
            };
            match ticket {
                Some(t) => probe = Some(t),
                None => {
                    self.release(delivery.receipt, PROBE_REFUSED_DELAY);
                    return;
                }
            }
        }
        let key = delivery.message.entity_key.clone();
        let laned = key.is_some() && self.settings.lanes.per_key > 0;
        let job = Job {
            delivery,
            probe,
            laned,
        };
        match self.lanes.admit(key.as_deref(), job, now) {
            Admit::Run(job) => self.spawn_apply(job),
            Admit::Held => {}
            Admit::Release(job, delay) => {
                metrics::counter!(telemetry::WORKER_MESSAGES, "outcome" => "released").increment(1);
                let delay = if self.filters_keys {
                    delay
                } else {
                    spread_release(
                        delay,
                        job.delivery.message.receives,
                        self.settings.lanes.park_cap,
                    )
                };
                self.release(job.delivery.receipt, delay);
            }
        }
    }

    fn spawn_apply(&mut self, job: Job) {
        let sink = Arc::clone(&self.sink);
        let controller = Arc::clone(&self.controller);
        let held = (job.delivery.receipt.clone(), job.key().map(str::to_owned));
        let task = self.running.spawn(async move {
            let started = Instant::now();
            let result = apply_guarded(sink.as_ref(), &controller, &job).await;
            Done {
                job,
                result,
                took: started.elapsed(),
            }
        });
        self.receipts.insert(task.id(), held);
    }

    /// Settles an apply task's end: its outcome, or, when the task ended
    /// without one, its message handed back at once.
    fn joined(&mut self, joined: Result<(tokio::task::Id, Done), tokio::task::JoinError>) {
        match joined {
            Ok((id, done)) => {
                self.receipts.remove(&id);
                self.settle(done);
            }
            Err(e) => {
                if e.is_panic() {
                    tracing::error!(error = %e, "an apply task panicked; its message is released");
                }
                if let Some((receipt, key)) = self.receipts.remove(&e.id()) {
                    self.release(receipt, Duration::ZERO);
                    // Its lane is freed and what waited behind it goes back
                    // too: nothing new starts from here, which may be the
                    // shutdown (a probe it held times out in the breaker).
                    let next =
                        self.lanes
                            .finish(key.as_deref(), LaneOutcome::Other, Instant::now());
                    self.start_next(next, false);
                }
            }
        }
    }

    /// Settles every finished apply without waiting.
    fn reap(&mut self) {
        while let Some(joined) = self.running.try_join_next_with_id() {
            self.joined(joined);
        }
        while self.settling.try_join_next().is_some() {}
    }

    fn settle(&mut self, done: Done) {
        let now = Instant::now();
        let Done { job, result, took } = done;
        let key = job.key().map(str::to_owned);
        let lane_outcome = match &result {
            Ok(_) => LaneOutcome::Success,
            Err(e) if e.is_lock_related() => LaneOutcome::LockFailure,
            Err(_) => LaneOutcome::Other,
        };
        let next = self.lanes.finish(key.as_deref(), lane_outcome, now);
        if let (Some(key), Some(shared)) = (&key, &self.shared_parks) {
            if let (Some(park), true) = (next.parked_for, next.park_is_own) {
                let _ = shared.outgoing.send((key.clone(), park));
            } else if next.unparked {
                let _ = shared.outgoing.send((key.clone(), Duration::ZERO));
            }
        }
        let m = &job.delivery.message;
        let receipt = job.delivery.receipt.clone();
        let journal = Arc::clone(&self.settings.journal);
        let failure = result.as_ref().err();
        let probe = job.probe.is_some();
        let count = |outcome: &'static str, note: Option<&str>| {
            metrics::counter!(telemetry::WORKER_MESSAGES, "outcome" => outcome).increment(1);
            let apply_ms = took.as_millis() as u64;
            // One line per event settled (no payload, no secret).
            tracing::debug!(source = %m.source, event_id = %m.event_id, outcome,
                attempt = m.attempts.saturating_add(1), apply_ms, "settled");
            if journal.capacity() == 0 {
                return;
            }
            journal.record(
                &m.source,
                &m.event_id,
                AttemptRecord {
                    at_ms: wall_clock_ms(),
                    attempt: m.attempts.saturating_add(1),
                    outcome: outcome.to_owned(),
                    class: failure.map(|e| e.class.as_str().to_owned()),
                    kind: failure.map(|e| e.kind.to_owned()),
                    error: failure.map(ToString::to_string),
                    note: note.map(str::to_owned),
                    apply_ms,
                    probe,
                },
            );
        };
        if let Err(e) = &result {
            metrics::counter!(telemetry::SINK_FAILURES,
                "class" => e.class.as_str(), "kind" => e.kind)
            .increment(1);
        }
        let facts = SettleFacts {
            parked_for: next.parked_for,
            may_poll: self.controller.gate().may_poll,
            probe: job.probe.is_some(),
            attempts: m.attempts,
            max_attempts: self.settings.max_attempts,
        };
        let decision = settle::decide(&result, &facts, || self.controller.dependency_trouble());
        match decision {
            Settle::Ack(outcome) => {
                match &result {
                    Ok(Applied::Superseded { by }) => {
                        metrics::counter!(telemetry::EVENTS_SUPERSEDED,
                            "source" => m.source.clone())
                        .increment(1);
                        count(outcome, Some(&format!("superseded by {by}")));
                    }
                    _ => count(outcome, None),
                }
                let queue = Arc::clone(&self.queue);
                self.settling.spawn(async move {
                    if let Err(e) = queue.ack(&receipt).await {
                        tracing::warn!(error = %e, "ack failed; the message will be applied again (idempotent)");
                    }
                });
            }
            Settle::DeadLetter { class, note } => {
                count("dead_lettered", Some(note));
                let error = match &result {
                    Err(e) if class == "exhausted" => {
                        tracing::warn!(source = %m.source, event_id = %m.event_id, error = %e,
                            attempts = m.attempts.saturating_add(1), "retries exhausted: dead-lettered");
                        format!("after {} attempts: {e}", m.attempts.saturating_add(1))
                    }
                    Err(e) => {
                        // Its message may quote the payload: the DLQ entry
                        // keeps it, the log keeps kind, code and constraint.
                        tracing::warn!(source = %m.source, event_id = %m.event_id,
                            error = %e.log_summary(), "permanent failure: dead-lettered");
                        e.to_string()
                    }
                    Ok(_) => String::new(),
                };
                self.dead_letter(receipt, class, error);
            }
            Settle::Release { delay, note } => {
                count("released", Some(note));
                if let (Some(park), Err(e)) = (next.parked_for, &result) {
                    tracing::info!(key = ?key, park_ms = park.as_millis() as u64, error = %e,
                        "row lock: key parked, message released untried");
                }
                self.release(receipt, delay);
            }
            Settle::Retry => {
                count("retried", None);
                let backoff = self.settings.backoff.delay(m.attempts, None, &mut self.rng);
                let asked = failure.and_then(|e| e.retry_after);
                // A dependency that said when to come back (Retry-After)
                // is not asked sooner, within the backoff's cap.
                let delay = asked.map_or(backoff, |asked| {
                    asked
                        .max(backoff)
                        .min(self.settings.backoff.cap.max(backoff))
                });
                let queue = Arc::clone(&self.queue);
                let error = failure.map(ToString::to_string).unwrap_or_default();
                self.settling.spawn(async move {
                    if let Err(e) = queue.retry_later(&receipt, delay, &error).await {
                        tracing::warn!(error = %e, "retry scheduling failed; the lease will expire");
                    }
                });
            }
        }
        // Half-open, only a probe may start (found by the simulator: a
        // lane's next message started behind its key's probe, without a
        // ticket); it goes back untried and may come again as a probe.
        let gate = self.controller.gate();
        self.start_next(next, gate.may_poll && !gate.probe_only);
    }

    /// Parks what other nodes of the fleet parked (their messages here go
    /// back untried, as for a park of this node's own), and frees what they
    /// freed.
    fn take_remote_parks(&mut self) {
        let mut parks = Vec::new();
        if let Some(shared) = &mut self.shared_parks {
            while let Ok(p) = shared.incoming.try_recv() {
                parks.push(p);
            }
        }
        let now = Instant::now();
        let stagger = self.shared_parks.as_ref().map_or(0.0, |s| s.stagger);
        let grace = self.settings.lanes.park_cap.mul_f64(1.0 + stagger);
        for p in parks {
            if p.park.is_zero() {
                self.lanes.unpark_elsewhere(&p.key);
                continue;
            }
            let release = self
                .lanes
                .park_elsewhere(&p.key, p.park, grace, p.keep_own, now);
            tracing::debug!(key = %p.key, park_ms = p.park.as_millis() as u64,
                released = release.len(), "key parked by another node of the fleet");
            self.start_next(
                lanes::Next {
                    release,
                    ..lanes::Next::default()
                },
                false,
            );
        }
    }

    /// Starts what a lane let go (with `may_start`; else frees the lane
    /// and releases it untried), and releases what the lane handed back.
    fn start_next(&mut self, next: lanes::Next<Job>, may_start: bool) {
        let count = |outcome: &'static str| {
            metrics::counter!(telemetry::WORKER_MESSAGES, "outcome" => outcome).increment(1);
        };
        for job in next.run {
            if may_start {
                self.spawn_apply(job);
            } else {
                // The next message of the key must not start against a
                // database the breaker is protecting (or at all, when its
                // predecessor ended without an outcome); the lane is freed.
                self.lanes.unstart(job.key());
                count("released");
                self.release(job.delivery.receipt, Duration::ZERO);
            }
        }
        for (job, delay) in next.release {
            count("released");
            self.release(job.delivery.receipt, delay);
        }
    }

    fn dead_letter(&mut self, receipt: Receipt, class: &str, error: String) {
        metrics::counter!(telemetry::DLQ_TOTAL, "class" => class.to_owned()).increment(1);
        let queue = Arc::clone(&self.queue);
        let reason = DeadLetterReason {
            class: class.to_owned(),
            error,
        };
        self.settling.spawn(async move {
            if let Err(e) = queue.dead_letter(&receipt, &reason).await {
                tracing::warn!(error = %e, "dead-lettering failed; the lease will expire");
            }
        });
    }

    fn release(&mut self, receipt: Receipt, delay: Duration) {
        let queue = Arc::clone(&self.queue);
        self.settling.spawn(async move {
            if let Err(e) = queue.release(&receipt, delay).await {
                tracing::warn!(error = %e, "release failed; the lease will expire");
            }
        });
    }

    fn release_held(&mut self, delay: Duration) {
        let held = self.lanes.drain();
        if !held.is_empty() {
            tracing::info!(
                count = held.len(),
                "breaker closed the gate: releasing held messages untried"
            );
        }
        for job in held {
            self.release(job.delivery.receipt, delay);
        }
    }

    /// Pushes out the lease of every message this dispatcher holds, applying
    /// or waiting behind its key, a third of a lease at a time: a message
    /// held longer than its lease (a slow key's backlog) is not handed to
    /// another worker meanwhile.
    fn extend_leases(&mut self) {
        let receipts: Vec<Receipt> = self
            .receipts
            .values()
            .map(|(receipt, _)| receipt.clone())
            .chain(
                self.lanes
                    .held_items()
                    .map(|job| job.delivery.receipt.clone()),
            )
            .collect();
        if receipts.is_empty() {
            return;
        }
        let queue = Arc::clone(&self.queue);
        let lease = self.settings.lease;
        self.settling.spawn(async move {
            match queue.extend_leases(&receipts, lease).await {
                // Most are settled meanwhile (an ack can reach the writer
                // first); a lease that ran out and was claimed again is
                // the rare other case.
                Ok(n) if n < receipts.len() => tracing::debug!(
                    not_extended = receipts.len() - n,
                    "leases not extended: settled meanwhile, or lost"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "extending leases failed"),
            }
        });
    }

    fn publish_parks(&mut self) {
        let now = Instant::now();
        self.lanes.forget_old_parks(now);
        let parks = self.lanes.parked(now);
        if let Ok(mut p) = self.parked.lock() {
            *p = parks;
        }
    }

    /// Waits for an apply to end, a settlement to reach the queue, a
    /// breaker transition, `timeout`, stop, or what `wake_on` adds.
    async fn wait(&mut self, stop: &mut watch::Receiver<bool>, timeout: Duration, wake_on: WakeOn) {
        let controller = Arc::clone(&self.controller);
        let arrivals = &mut self.arrivals;
        tokio::select! {
            () = arrival(arrivals), if wake_on == WakeOn::Arrivals => {}
            Some(joined) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                self.joined(joined);
            }
            // A settlement reached the queue: with key order, an ack or a
            // dead letter is what makes its key's next message claimable,
            // so a held key's backlog drains at the queue's pace, not one
            // message per idle wait.
            Some(_) = self.settling.join_next(), if !self.settling.is_empty() => {}
            () = controller.changed() => {}
            () = tokio::time::sleep(timeout) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }

    async fn shut_down(mut self) {
        tracing::info!(
            running = self.running.len(),
            held = self.lanes.held(),
            "workers stopping"
        );
        self.release_held(Duration::ZERO);
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while !self.running.is_empty() {
            match tokio::time::timeout_at(deadline, self.running.join_next_with_id()).await {
                Ok(Some(joined)) => self.joined(joined),
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        left = self.running.len(),
                        "applies still running at the end of the grace period: aborted, their \
                         messages released (an aborted transaction rolls back)"
                    );
                    self.running.abort_all();
                    while let Some(joined) = self.running.join_next_with_id().await {
                        self.joined(joined);
                    }
                    break;
                }
            }
        }
        // Messages that lanes started while settling go back too.
        self.release_held(Duration::ZERO);
        while self.settling.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::NewMessage;
    use breakwater_control::BreakerConfig;
    use breakwater_queue_embedded::{EmbeddedConfig, EmbeddedQueue};

    /// A sink whose apply always panics (a bug in a sink, at the unit level).
    struct PanickingSink;

    #[async_trait::async_trait]
    impl Sink for PanickingSink {
        async fn apply(&self, _event: &Event<'_>) -> Result<Applied, SinkError> {
            panic!("sink bug");
        }
        fn pool_usage(&self) -> (usize, usize) {
            (0, 1)
        }
    }

    /// A fresh embedded queue in `dir` holding one message per event id,
    /// all of entity key `key`.
    async fn queue_holding(
        dir: &std::path::Path,
        event_ids: &[&str],
        key: Option<&str>,
    ) -> Arc<EmbeddedQueue> {
        let queue = Arc::new(EmbeddedQueue::open(&EmbeddedConfig::at(dir)).expect("queue"));
        for event_id in event_ids {
            queue
                .enqueue(NewMessage {
                    source: "s".into(),
                    event_id: (*event_id).into(),
                    entity_key: key.map(str::to_owned),
                    headers: Vec::new(),
                    body: bytes::Bytes::from_static(b"{}"),
                    received_at_ms: crate::ingress::unix_now_ms(),
                })
                .await
                .expect("enqueue");
        }
        queue
    }

    /// Worker settings with fast backoff and no in-place retries.
    fn settings(max_concurrency: u32, max_attempts: u32, lease: Duration) -> WorkerSettings {
        WorkerSettings {
            max_concurrency,
            max_attempts,
            backoff: BackoffPolicy::full_jitter(Duration::from_millis(1), Duration::from_millis(5)),
            lease,
            lanes: LaneSettings::default(),
            journal: Arc::new(EventJournal::off()),
        }
    }

    /// A sink whose apply never ends (a hung database, at the unit level).
    struct HangingSink;

    #[async_trait::async_trait]
    impl Sink for HangingSink {
        async fn apply(&self, _event: &Event<'_>) -> Result<Applied, SinkError> {
            std::future::pending().await
        }
        fn pool_usage(&self) -> (usize, usize) {
            (1, 1)
        }
    }

    #[test]
    fn a_handed_back_message_comes_back_less_often_each_time() {
        let cap = Duration::from_secs(4);
        let base = Duration::from_millis(200);
        assert_eq!(spread_release(base, 1, cap), base);
        assert_eq!(spread_release(base, 2, cap), base * 2);
        assert_eq!(spread_release(base, 4, cap), base * 8);
        assert_eq!(spread_release(base, 40, cap), cap);
        // A park longer than the cap is kept as it is.
        let park = Duration::from_secs(6);
        assert_eq!(spread_release(park, 1, cap), park);
    }

    #[tokio::test]
    async fn shutdown_releases_the_message_of_an_apply_it_aborts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let queue = queue_holding(dir.path(), &["hung"], None).await;
        let controller = Controller::new(BreakerConfig::default(), 1).expect("controller");
        let settings = settings(1, 3, Duration::from_secs(600));
        let queue_dyn: Arc<dyn Queue> = queue.clone();
        let workers = Workers::start(
            queue_dyn,
            Arc::new(HangingSink),
            controller,
            settings,
            ParkedKeys::default(),
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while queue.stats().await.expect("stats").in_flight == Some(0) {
            assert!(Instant::now() < deadline, "the message was never claimed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        workers.shutdown().await;
        // Visible again at once, not after its 10-minute lease.
        let stats = queue.stats().await.expect("stats");
        assert_eq!(
            (stats.visible, stats.in_flight),
            (Some(1), Some(0)),
            "{stats:?}"
        );
        let again = queue.claim(1, Duration::from_secs(1)).await.expect("claim");
        assert_eq!(again.len(), 1);
        assert_eq!(
            again[0].message.attempts, 0,
            "released, not counted as a failure"
        );
    }

    #[tokio::test]
    async fn a_claim_held_longer_than_its_lease_keeps_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let queue = queue_holding(dir.path(), &["slow"], None).await;
        let controller = Controller::new(BreakerConfig::default(), 1).expect("controller");
        let lease = Duration::from_millis(300);
        let queue_dyn: Arc<dyn Queue> = queue.clone();
        let workers = Workers::start(
            queue_dyn,
            Arc::new(HangingSink),
            controller,
            settings(1, 3, lease),
            ParkedKeys::default(),
        );
        // Four leases long: without extensions it would be visible again
        // (and claimed by the next claim) after the first.
        tokio::time::sleep(lease * 4).await;
        let stats = queue.stats().await.expect("stats");
        assert_eq!(
            (stats.visible, stats.in_flight),
            (Some(0), Some(1)),
            "{stats:?}"
        );
        let second = queue.claim(1, lease).await.expect("claim");
        assert!(second.is_empty(), "claimed twice: {second:?}");
        workers.shutdown().await;
    }

    #[tokio::test]
    async fn a_panicking_sink_dead_letters_the_message_and_spares_the_breaker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let queue = queue_holding(dir.path(), &["a", "b"], Some("k")).await;
        let controller = Controller::new(BreakerConfig::default(), 2).expect("controller");
        let settings = settings(2, 100, Duration::from_secs(60));
        let queue_dyn: Arc<dyn Queue> = queue.clone();
        let workers = Workers::start(
            queue_dyn,
            Arc::new(PanickingSink),
            Arc::clone(&controller),
            settings,
            ParkedKeys::default(),
        );
        // Both messages of the key reach the DLQ: the lane is freed after
        // the first panic, and neither waits out its 60 s lease.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut dead = Vec::new();
        while Instant::now() < deadline && dead.len() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            dead = queue
                .dlq_list(&crate::queue::DlqPage::first(10))
                .await
                .expect("dead letters");
        }
        workers.shutdown().await;
        assert_eq!(dead.len(), 2, "both dead-lettered: {dead:?}");
        for d in &dead {
            assert_eq!(d.class, "permanent");
            assert!(d.error.contains("panic"), "{}", d.error);
            assert_eq!(d.attempts, 1, "dead-lettered on the first panic");
        }
        let status = controller.status();
        assert_eq!(status.state, breakwater_control::State::Closed);
        assert!(status.history.is_empty(), "{:?}", status.history);
    }
}
