//! One worker process in the simulation: the real breaker
//! (`breakwater_control::Breaker`, on simulated time), the real hot-key
//! lanes and the real settle decisions (`breakwater::worker::{lanes,
//! settle}`), driven the way the dispatcher and the controller drive them:
//! claim under the gate, admit probes half-open, settle each apply, tick
//! the breaker every 100 ms, sample the queue and the database every
//! second, extend leases, release what the lanes hold when the gate closes.
//! In fleet mode ([`crate::fleet`]) it also beats, follows the shared
//! record, shares its own transitions and takes fleet-wide probe slots.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use breakwater::worker::WorkerSettings;
use breakwater::worker::lanes::{Admit, LaneOutcome, Lanes, Next};
use breakwater::worker::settle::{self, Settle, SettleFacts};
use breakwater_control::{
    Breaker, BreakerConfig, BreakerRecord, Heartbeat, KeyContention, Outcome, OutcomeClass,
    ProbeSlot, ProbeTicket, QueueSample, State, Transition, WorkerState,
};
use breakwater_sink::{Applied, SinkError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::db::{self, Planned, SimDb, ms};
use crate::fleet::{Member, Store};
use crate::queue::{Delivery, SimQueue};
use crate::schedule::{Ms, Schedule};

/// A message id + 1 whose settles are printed (`--trace`); 0: none.
pub static TRACE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The controller's tick and the dispatcher's idle wait.
pub const TICK_MS: Ms = 100;
pub const POLL_MS: Ms = 50;
const SAMPLE_MS: Ms = 1_000;
/// Delay of a message that could not be a probe.
const PROBE_REFUSED_MS: Ms = 250;

/// A message on its way through this node.
#[derive(Debug)]
pub struct Job {
    pub delivery: Delivery,
    pub probe: Option<ProbeTicket>,
    /// A fleet-wide probe slot, with the store incarnation it was taken in.
    pub slot: Option<(u32, ProbeSlot)>,
    pub laned: bool,
}

impl Job {
    fn key(&self) -> Option<String> {
        self.delivery.key.map(|k| k.to_string())
    }
}

#[derive(Debug)]
struct Running {
    job: Job,
    started: Ms,
    done_at: Ms,
    planned: Planned,
}

/// Something a node did that breaks a promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub at: Ms,
    pub what: String,
}

/// A worker process.
pub struct Node {
    pub index: usize,
    base: Instant,
    config: BreakerConfig,
    settings: WorkerSettings,
    pub breaker: Breaker,
    lanes: Lanes<Job>,
    contention: KeyContention,
    /// The latest dependency failures: a connection failure or not.
    failure_kinds: VecDeque<bool>,
    early_half_open_used: bool,
    running: Vec<Running>,
    rng: SmallRng,
    next_tick: Ms,
    next_sample: Ms,
    next_extend: Ms,
    next_poll: Ms,
    /// When it last ran (a stall or crash leaves a gap).
    last_seen: Ms,
    /// Transitions, for the report.
    pub transitions: Vec<(Ms, State, State)>,
    pub probes_admitted: u64,
    /// Its part in the fleet, in fleet mode.
    pub fleet: Option<Member>,
    /// Hung probes of the schedule this node has started.
    pub hung: usize,
    /// Promises broken since the caller last took them.
    pub broken: Vec<Broken>,
}

impl Node {
    pub fn new(
        index: usize,
        base: Instant,
        config: &BreakerConfig,
        settings: &WorkerSettings,
        seed: u64,
        now: Ms,
        fleet: bool,
    ) -> Self {
        let at = base + Duration::from_millis(now);
        let breaker = Breaker::with_seed(config.clone(), seed, at)
            .unwrap_or_else(|e| panic!("the default breaker config is valid: {e}"));
        Self {
            index,
            base,
            config: config.clone(),
            settings: settings.clone(),
            breaker,
            lanes: Lanes::new(settings.lanes),
            contention: KeyContention::default(),
            failure_kinds: VecDeque::new(),
            early_half_open_used: false,
            running: Vec::new(),
            rng: SmallRng::seed_from_u64(seed ^ 0x5eed),
            next_tick: now,
            next_sample: now,
            next_extend: now,
            next_poll: now,
            last_seen: now,
            transitions: Vec::new(),
            probes_admitted: 0,
            fleet: fleet.then(|| Member::new(now)),
            hung: 0,
            broken: Vec::new(),
        }
    }

    fn at(&self, t: Ms) -> Instant {
        self.base + Duration::from_millis(t)
    }

    fn lease_ms(&self) -> Ms {
        ms(self.settings.lease)
    }

    /// The process was killed: what it ran is gone, its leases lapse in
    /// the queue. Of the applies in flight that were to succeed, half had
    /// committed already (killed after the commit, before the ack: the
    /// effect stays, and the redelivery must find it in the inbox). It
    /// starts again with a fresh breaker and lanes.
    pub fn crash(&mut self, db: &mut SimDb, rng: &mut SmallRng, seed: u64, now: Ms) {
        for r in self.running.drain(..) {
            if r.planned.result.is_ok() && rng.random_bool(0.5) {
                db.commit(r.job.delivery.id, now);
            }
        }
        let fresh = Node::new(
            self.index,
            self.base,
            &self.config,
            &self.settings,
            seed,
            now,
            self.fleet.is_some(),
        );
        let transitions = std::mem::take(&mut self.transitions);
        let probes = self.probes_admitted;
        let hung = self.hung;
        *self = fresh;
        self.hung = hung;
        self.transitions = transitions;
        self.probes_admitted = probes;
    }

    /// The next time this node has something to do.
    pub fn next_event(&self) -> Ms {
        let done = self
            .running
            .iter()
            .map(|r| r.done_at)
            .min()
            .unwrap_or(Ms::MAX);
        let beat = self.fleet.as_ref().map_or(Ms::MAX, |m| m.next_beat);
        done.min(self.next_tick)
            .min(self.next_poll)
            .min(self.next_sample)
            .min(beat)
    }

    /// Runs everything due at `now`; what it broke goes to `broken`.
    pub fn step(
        &mut self,
        now: Ms,
        schedule: &Schedule,
        queue: &mut SimQueue,
        db: &mut SimDb,
        store: &mut Option<Store>,
    ) {
        self.last_seen = now;
        if let (Some(m), Some(store)) = (self.fleet.as_mut(), store.as_mut()) {
            m.wall_offset_ms = schedule.wall_offset_ms(self.index, now);
            // The change feed (followed at once, as Redis publishes it).
            if let Some(r) = store.record().cloned() {
                self.follow(&r, now);
            }
            if self.fleet.as_ref().is_some_and(|m| now >= m.next_beat) {
                self.beat(store, now);
            }
        }
        // Applies that ended; the dispatcher, woken by them, claims again
        // at once.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].done_at <= now {
                let r = self.running.swap_remove(i);
                self.settle(r, now, schedule, queue, db, store);
                self.next_poll = now;
            } else {
                i += 1;
            }
        }
        if now >= self.next_tick {
            self.next_tick = now + TICK_MS;
            self.tick(now);
        }
        if now >= self.next_sample {
            self.next_sample = now + SAMPLE_MS;
            self.sample(now, schedule, queue);
        }
        if now >= self.next_extend {
            self.next_extend = now + self.lease_ms() / 3;
            let lease = self.lease_ms();
            for r in &self.running {
                queue.extend(r.job.delivery.id, r.job.delivery.token, lease, now);
            }
            for job in self.lanes.held_items() {
                queue.extend(job.delivery.id, job.delivery.token, lease, now);
            }
        }
        if now >= self.next_poll {
            self.next_poll = now + POLL_MS;
            self.dispatch(now, schedule, queue, store);
        }
        if let (Some(m), Some(store)) = (self.fleet.as_mut(), store.as_mut())
            && let Some(newer) = m.share(self.index, store, now)
        {
            self.follow(&newer, now);
        }
        self.check(now);
    }

    /// A transition this node made: recorded and, in a fleet, to be shared.
    fn note(&mut self, t: Option<Transition>, now: Ms) {
        let at = self.at(now);
        if t.is_some()
            && let Some(m) = self.fleet.as_mut()
        {
            m.changed(self.breaker.shared_view(at));
        }
        self.record_transition(t, now);
    }

    /// Takes `record` if it is newer than the one this node follows.
    fn follow(&mut self, record: &BreakerRecord, now: Ms) {
        let Some(m) = self.fleet.as_mut() else { return };
        if !m.takes(record) {
            return;
        }
        let view = record.aged(m.wall_ms(now));
        let t = self.breaker.adopt(&view, self.at(now));
        self.record_transition(t, now);
    }

    /// One fleet beat (see [`Member::beat`]).
    fn beat(&mut self, store: &mut Store, now: Ms) {
        let at = self.at(now);
        let slots = self.worker_states(now);
        let Some(m) = self.fleet.as_mut() else { return };
        let answer = m.beat(self.index, slots, store, now);
        if let Some(r) = answer.record {
            self.follow(&r, now);
        }
        if answer.share_current
            && let Some(m) = self.fleet.as_mut()
        {
            m.changed(self.breaker.shared_view(at));
        }
        for tally in &answer.fleet_outcomes {
            self.breaker.record_fleet_outcomes(tally, at);
        }
        self.breaker
            .observe_heartbeats(&answer.fleet_heartbeats, at);
    }

    /// What each worker slot is doing.
    fn worker_states(&self, now: Ms) -> Vec<WorkerState> {
        (0..self.settings.max_concurrency as usize)
            .map(|slot| match self.running.get(slot) {
                None => WorkerState::Idle,
                Some(r) if r.planned.lock_wait => WorkerState::LockWait {
                    waited: Duration::from_millis(now.saturating_sub(r.started)),
                },
                Some(_) => WorkerState::Applying,
            })
            .collect()
    }

    fn record_transition(&mut self, t: Option<Transition>, now: Ms) {
        if let Some(t) = t {
            self.transitions.push((now, t.from, t.to));
            if t.to == State::Closed {
                self.failure_kinds.clear();
                self.early_half_open_used = false;
            }
        }
    }

    /// The controller's tick: the limiter, the heartbeats, the rules.
    fn tick(&mut self, now: Ms) {
        let at = self.at(now);
        self.breaker.adjust_limit(at);
        if self.fleet.as_ref().is_some_and(|m| !m.standing.evaluates()) {
            // A follower times out its own probes, nothing else.
            let t = self.breaker.probe_timeout(at);
            self.note(t, now);
            return;
        }
        let beats: Vec<Heartbeat> = self
            .worker_states(now)
            .into_iter()
            .enumerate()
            .map(|(slot, state)| Heartbeat {
                worker: slot as u64,
                state,
                at,
            })
            .collect();
        self.breaker.observe_heartbeats(&beats, at);
        let t = self.breaker.evaluate(at);
        self.note(t, now);
    }

    /// The controller's sampler: the queue's counts, the database's lock
    /// waiters (its own session reaching the database also tells an open
    /// breaker that it answers again).
    fn sample(&mut self, now: Ms, schedule: &Schedule, queue: &SimQueue) {
        let at = self.at(now);
        let (visible, in_flight, delayed) = queue.counts(now);
        self.breaker.observe_queue(
            QueueSample {
                visible,
                in_flight,
                dead_lettered_total: queue.dead,
                processed_total: queue.acked + queue.dead,
                delayed,
            },
            at,
        );
        let reachable = match schedule.db_fault(now) {
            Some(crate::schedule::DbFault::Down | crate::schedule::DbFault::Blackhole) => false,
            Some(crate::schedule::DbFault::Flapping { period_ms }) => {
                !(now / period_ms).is_multiple_of(2)
            }
            _ => true,
        };
        if reachable {
            let waiters = self.running.iter().filter(|r| r.planned.lock_wait).count();
            self.breaker
                .observe_db_lock_waiters(u32::try_from(waiters).unwrap_or(u32::MAX), at);
            let connection = self.failure_kinds.iter().filter(|c| **c).count();
            let unreachable_cause =
                self.failure_kinds.len() >= 5 && connection * 5 >= self.failure_kinds.len() * 4;
            if self.breaker.state() == State::Open
                && unreachable_cause
                && !self.early_half_open_used
            {
                let t = self.breaker.dependency_answers(at);
                if t.is_some() {
                    self.early_half_open_used = true;
                }
                self.note(t, now);
            }
        }
    }

    fn dispatch(
        &mut self,
        now: Ms,
        schedule: &Schedule,
        queue: &mut SimQueue,
        store: &mut Option<Store>,
    ) {
        let at = self.at(now);
        let gate = self.breaker.gate();
        if !gate.may_poll {
            for job in self.lanes.drain() {
                queue.release(job.delivery.id, job.delivery.token, 0, now);
            }
            return;
        }
        let limit = gate.limit.min(self.settings.max_concurrency) as usize;
        let mut free = limit.saturating_sub(self.running.len());
        if free > 0 && !gate.probe_only {
            for job in self.lanes.due(at, free) {
                self.spawn(job, now, schedule);
            }
            free = limit.saturating_sub(self.running.len());
        }
        if free == 0 {
            return;
        }
        let want = if gate.probe_only { 1 } else { free };
        let skip: Vec<u32> = self
            .lanes
            .blocked_keys(at)
            .iter()
            .filter_map(|k| k.parse().ok())
            .collect();
        for delivery in queue.claim(want, self.lease_ms(), &skip, now) {
            self.admit(delivery, gate.probe_only, now, schedule, queue, store);
        }
    }

    fn admit(
        &mut self,
        delivery: Delivery,
        probe_only: bool,
        now: Ms,
        schedule: &Schedule,
        queue: &mut SimQueue,
        store: &mut Option<Store>,
    ) {
        let at = self.at(now);
        let key = delivery.key.map(|k| k.to_string());
        let mut probe = None;
        let mut slot = None;
        if probe_only {
            let ticket = if self.lanes.can_run(key.as_deref(), at) {
                self.admit_probe(store, now)
            } else {
                None
            };
            match ticket {
                Some((t, s)) => {
                    self.probes_admitted += 1;
                    probe = Some(t);
                    slot = s;
                }
                None => {
                    queue.release(delivery.id, delivery.token, PROBE_REFUSED_MS, now);
                    return;
                }
            }
        }
        let laned = key.is_some() && self.settings.lanes.per_key > 0;
        let job = Job {
            delivery,
            probe,
            slot,
            laned,
        };
        match self.lanes.admit(key.as_deref(), job, at) {
            Admit::Run(job) => self.spawn(job, now, schedule),
            Admit::Held => {}
            Admit::Release(job, delay) => {
                queue.release(job.delivery.id, job.delivery.token, ms(delay), now);
            }
        }
    }

    /// Half-open: a probe ticket, fleet-wide first (a slot of the store,
    /// while it answers), then in this node's breaker (the controller's
    /// `try_admit_probe`).
    fn admit_probe(
        &mut self,
        store: &mut Option<Store>,
        now: Ms,
    ) -> Option<(ProbeTicket, Option<(u32, ProbeSlot)>)> {
        let at = self.at(now);
        match store.as_mut() {
            Some(store) if store.up && self.fleet.is_some() => {
                let (period, limit) = self.breaker.probe_period()?;
                let timeout = self.config.half_open.probe_timeout_ms;
                let slot = store.take_slot(period, limit, timeout, now)?;
                match self.breaker.try_admit_probe_in(slot.period, at) {
                    Some(ticket) => Some((ticket, Some((store.incarnation, slot)))),
                    None => {
                        store.give_back(slot);
                        None
                    }
                }
            }
            _ => self.breaker.try_admit_probe(at).map(|t| (t, None)),
        }
    }

    fn spawn(&mut self, job: Job, now: Ms, schedule: &Schedule) {
        let gate = self.breaker.gate();
        if !gate.may_poll {
            self.broken.push(Broken {
                at: now,
                what: format!(
                    "node {} started message {} with the gate closed",
                    self.index, job.delivery.id
                ),
            });
        }
        if gate.probe_only && job.probe.is_none() {
            self.broken.push(Broken {
                at: now,
                what: format!(
                    "node {} started message {} half-open without a probe ticket",
                    self.index, job.delivery.id
                ),
            });
        }
        if self.running.len() >= self.settings.max_concurrency as usize {
            self.broken.push(Broken {
                at: now,
                what: format!(
                    "node {} ran more than its maximum of {}",
                    self.index, self.settings.max_concurrency
                ),
            });
        }
        let mut planned = db::plan(schedule, job.delivery.key, job.delivery.poison, now);
        let hangs_due = schedule
            .hung_probes
            .iter()
            .filter(|(at, n)| *n == self.index && *at <= now)
            .count();
        if job.probe.is_some() && self.hung < hangs_due {
            self.hung += 1;
            planned.took = crate::schedule::HANG_MS;
        }
        self.running.push(Running {
            done_at: now + planned.took.max(1),
            started: now,
            planned,
            job,
        });
    }

    fn settle(
        &mut self,
        r: Running,
        now: Ms,
        schedule: &Schedule,
        queue: &mut SimQueue,
        db: &mut SimDb,
        store: &mut Option<Store>,
    ) {
        let at = self.at(now);
        let Running {
            job,
            started,
            planned,
            ..
        } = r;
        let result: Result<Applied, SinkError> = match planned.result {
            Ok(_) => {
                if job.delivery.poison {
                    self.broken.push(Broken {
                        at: now,
                        what: format!("poison message {} was applied", job.delivery.id),
                    });
                }
                Ok(db.commit(job.delivery.id, now))
            }
            Err(e) => Err(e),
        };
        let key = job.key();
        let contention = &mut self.contention;
        let class = settle::breaker_class(&result, job.laned, job.probe.is_some(), || {
            key.as_deref()
                .is_some_and(|k| contention.is_one_keys_trouble(k, at))
        });
        if let (OutcomeClass::Dependency, Err(e)) = (class, &result) {
            if self.failure_kinds.len() == 32 {
                self.failure_kinds.pop_front();
            }
            self.failure_kinds.push_back(e.kind == "connection");
        }
        let outcome = Outcome {
            class,
            latency: Duration::from_millis(now.saturating_sub(started)),
        };
        if let Some(m) = self.fleet.as_mut() {
            m.tally.add(outcome, self.breaker.slow_after());
        }
        let t = match job.probe {
            Some(ticket) => self.breaker.record_probe_outcome(ticket, outcome, at),
            None => self.breaker.record_outcome(outcome, at),
        };
        let moved = t.is_some();
        self.note(t, now);
        // The fleet slot goes back with the outcome; a success counts
        // fleet-wide (a store that lost it since: the slot is gone).
        if let Some((incarnation, slot)) = job.slot
            && let Some(store) = store.as_mut()
            && store.up
            && store.incarnation == incarnation
        {
            if class == OutcomeClass::Success && !moved {
                let successes = store.succeeded(slot);
                let t = self
                    .breaker
                    .fleet_probes_succeeded(slot.period, successes, at);
                self.note(t, now);
            } else {
                store.give_back(slot);
            }
        }
        let lane_outcome = match &result {
            Ok(_) => LaneOutcome::Success,
            Err(e) if e.is_lock_related() => LaneOutcome::LockFailure,
            Err(_) => LaneOutcome::Other,
        };
        let next = self.lanes.finish(key.as_deref(), lane_outcome, at);
        let facts = SettleFacts {
            parked_for: next.parked_for,
            may_poll: self.breaker.gate().may_poll,
            probe: job.probe.is_some(),
            attempts: job.delivery.attempts,
            max_attempts: self.settings.max_attempts,
        };
        let breaker = &self.breaker;
        let d = job.delivery;
        let decision = settle::decide(&result, &facts, || breaker.dependency_trouble(at));
        if TRACE.load(std::sync::atomic::Ordering::Relaxed) == u64::from(d.id) + 1 {
            let status = breaker.status(at);
            let ratio = status
                .signals
                .iter()
                .find(|s| s.signal == breakwater_control::SignalKind::FailureRatio)
                .map(|s| (s.value, s.threshold));
            let standing = self
                .fleet
                .as_ref()
                .map_or(String::new(), |m| format!(", {:?}", m.standing));
            println!(
                "{now} ms node {}: message {} attempt {} {:?} -> {decision:?} (breaker {}, failure ratio {ratio:?}{standing})",
                self.index,
                d.id,
                d.attempts + 1,
                result.as_ref().map_err(|e| e.kind),
                status.state
            );
        }
        match decision {
            Settle::Ack(_) => {
                queue.ack(d.id, d.token, now);
            }
            Settle::DeadLetter { class, .. } => {
                queue.dead_letter(d.id, d.token, class, now);
            }
            Settle::Release { delay, .. } => {
                queue.release(d.id, d.token, ms(delay), now);
            }
            Settle::Retry => {
                let delay = self.settings.backoff.delay(d.attempts, None, &mut self.rng);
                queue.retry_later(d.id, d.token, ms(delay), now);
            }
        }
        let gate = self.breaker.gate();
        self.start_next(
            next,
            gate.may_poll && !gate.probe_only,
            now,
            schedule,
            queue,
        );
    }

    /// What a lane let go starts now (while the gate is open; else the
    /// lane is freed and the message goes back untried), and what it
    /// handed back is released.
    fn start_next(
        &mut self,
        next: Next<Job>,
        may_start: bool,
        now: Ms,
        schedule: &Schedule,
        queue: &mut SimQueue,
    ) {
        for job in next.run {
            if may_start {
                self.spawn(job, now, schedule);
            } else {
                self.lanes.unstart(job.key().as_deref());
                queue.release(job.delivery.id, job.delivery.token, 0, now);
            }
        }
        for (job, delay) in next.release {
            queue.release(job.delivery.id, job.delivery.token, ms(delay), now);
        }
    }

    /// Promises a node keeps at every step.
    fn check(&mut self, now: Ms) {
        let probes = self.breaker.outstanding_probes();
        if probes > self.config.half_open.max_probes {
            self.broken.push(Broken {
                at: now,
                what: format!(
                    "node {} has {probes} probes out, more than {}",
                    self.index, self.config.half_open.max_probes
                ),
            });
        }
        // The limiter may go past the workers' count up to its own
        // ceiling (the pool), never beyond.
        if self.breaker.limit() > self.settings.max_concurrency {
            self.broken.push(Broken {
                at: now,
                what: format!(
                    "node {} limit {} above its maximum {}",
                    self.index,
                    self.breaker.limit(),
                    self.settings.max_concurrency
                ),
            });
        }
        // A probe of an earlier period (timed out, or half-open again since)
        // no longer holds the breaker.
        if let Some((period, _)) = self.breaker.probe_period() {
            let timeout = self.config.half_open.probe_timeout_ms + 2 * TICK_MS;
            if let Some(r) = self.running.iter().find(|r| {
                r.job.probe.is_some_and(|t| t.period == period)
                    && now.saturating_sub(r.started) > timeout
            }) {
                self.broken.push(Broken {
                    at: now,
                    what: format!(
                        "node {} half-open with a probe out for {} ms, past its timeout",
                        self.index,
                        now - r.started
                    ),
                });
            }
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The probes running under a fleet slot: the store incarnation and
    /// half-open period of the slot, when the probe started.
    pub fn fleet_probes(&self) -> impl Iterator<Item = (u32, u64, Ms)> + '_ {
        self.running.iter().filter_map(|r| {
            r.job
                .slot
                .map(|(incarnation, slot)| (incarnation, slot.period, r.started))
        })
    }

    /// The running applies: message id, started, due to end.
    pub fn running_applies(&self) -> Vec<(u32, Ms, Ms)> {
        self.running
            .iter()
            .map(|r| (r.job.delivery.id, r.started, r.done_at))
            .collect()
    }

    pub fn held(&self) -> usize {
        self.lanes.held()
    }
}
