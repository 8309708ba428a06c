//! Deterministic simulation of Breakwater's pipeline: the **real** control
//! code (the breaker with its signals, ramp and adaptive limiter; the
//! hot-key lanes; the settle decisions; probe admission) on simulated time,
//! against a simulated queue with the contract's semantics and a simulated
//! database whose outages, slowness, locked rows and poison follow a
//! schedule drawn from a seed. One seed is one run; a failing seed replays
//! exactly (`breakwater-sim --seed N`).
//!
//! | module | what lives there |
//! |---|---|
//! | [`schedule`] | the fault schedule a seed draws |
//! | [`queue`] | the simulated queue, with the segment log's key lines (order per entity key) |
//! | [`db`] | the simulated database and its inbox |
//! | [`node`] | one worker process: the real control code driven as the dispatcher and controller drive it, and the promises checked at every step |
//! | [`fleet`] | fleet mode: the shared record, the controller lease, fleet-wide probe slots, a store that is lost |
//!
//! Promises checked (a run that breaks one fails, with the time and what):
//! - at every step: nothing starts while the gate is closed, nothing
//!   starts half-open without a probe ticket, no node runs more than its
//!   maximum, no more probes out than `max_probes`, no probe out past its
//!   timeout while half-open, the limit never above the maximum; in fleet
//!   mode, no more probes out fleet-wide than `max_probes` under the
//!   store's slots;
//! - at the end: every accepted message is applied (its effect exactly
//!   once) or dead-lettered, none is lost; poison is never applied and
//!   always dead-lettered; nothing healthy is dead-lettered
//!   as `permanent`; a schedule of poison alone never opens a breaker;
//!   every node's breaker is closed within [`recovery_bound_ms`] of the
//!   last fault's end;
//! - at the end, with key order (`workers.order = "key"`, the default, as
//!   on the segment log; [`run_with`] takes `none`): per entity key, the
//!   statements that ran (first commits, not duplicates) ran in acceptance
//!   order. A dead-lettered message drops out (the next of its key goes
//!   on without it); messages without a key are unordered. With
//!   `none` the check still counts what came out of order
//!   ([`Report::reorders`]) but breaks no promise.

pub mod db;
pub mod fleet;
pub mod node;
pub mod queue;
pub mod schedule;

use std::time::Instant;

use breakwater::config::Config;
use breakwater_control::{BreakerConfig, State};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use fleet::Store;
use node::{Broken, Node};
use queue::{KeyOrder, QState, SimQueue};
use schedule::{Ms, Schedule, TRAFFIC_MS};

/// A run ends once everything is settled, or at this time at the latest.
pub const END_MS: Ms = TRAFFIC_MS + 120_000;

/// How long after the last fault every breaker must be closed again: the
/// longest cool-down, a probe timeout, the ramp, and 10 s of slack; in a
/// fleet, a lease time more (a dead holder replaced).
pub fn recovery_bound_ms(config: &BreakerConfig, fleet: bool) -> Ms {
    config.cool_down.cap_ms
        + config.half_open.probe_timeout_ms
        + config.ramp.hold_ms * config.ramp.steps.len() as u64
        + 10_000
        + if fleet { fleet::LEASE_MS } else { 0 }
}

/// What one seed did.
#[derive(Debug)]
pub struct Report {
    pub schedule: Schedule,
    pub accepted: usize,
    pub applied: usize,
    pub dead_permanent: usize,
    pub dead_exhausted: usize,
    /// The first messages dead-lettered as exhausted (for `--trace`).
    pub exhausted_ids: Vec<u32>,
    /// Applies that committed on an event already in the inbox (no effect).
    pub duplicates: u64,
    pub transitions: usize,
    pub probes: u64,
    /// Probes that hung past every deadline (the schedule's `hung_probes`).
    pub hung_probes: usize,
    /// Fleet mode: controller leases taken, compare-and-sets lost.
    pub leases_taken: u64,
    pub cas_lost: u64,
    pub ended_ms: Ms,
    /// Each node at the end: state, limit, applies running, messages held.
    pub nodes: Vec<(State, u32, usize, usize)>,
    /// Applies running at the end: message id, started, due to end.
    pub running: Vec<(u32, Ms, Ms)>,
    /// The order the queue kept.
    pub order: KeyOrder,
    /// Applies of keyed messages checked for order (acked ones).
    pub ordered_applies: usize,
    /// Of those, applies that ran after a later-accepted message of their
    /// key had run.
    pub reorders: usize,
    pub violations: Vec<Broken>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What a batch of seeds did.
#[derive(Debug, Default)]
pub struct Batch {
    pub seeds: u64,
    pub accepted: usize,
    pub dead_permanent: usize,
    pub dead_exhausted: usize,
    pub duplicates: u64,
    pub transitions: usize,
    /// Seeds run in fleet mode, and the controller leases taken in them.
    pub fleet_seeds: u64,
    pub leases_taken: u64,
    /// Probes that hung past every deadline.
    pub hung_probes: usize,
    /// Keyed applies checked for order; those out of acceptance order, and
    /// the seeds that had any.
    pub ordered_applies: usize,
    pub reorders: usize,
    pub reordered_seeds: u64,
    /// Seeds that broke a promise, with the first one broken.
    pub failed: Vec<(u64, Broken)>,
}

/// The order the simulated queue keeps by default: the service's default
/// (`key`, on the segment log).
pub fn default_order() -> KeyOrder {
    Config::default().key_order()
}

/// Runs seeds `start..start + count` on `threads` threads, with the
/// default order.
pub fn run_many(start: u64, count: u64, threads: usize) -> Batch {
    run_many_with(start, count, threads, default_order())
}

/// Runs seeds `start..start + count` on `threads` threads, the queue
/// keeping `order`.
pub fn run_many_with(start: u64, count: u64, threads: usize, order: KeyOrder) -> Batch {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(start);
    let end = start.saturating_add(count);
    let batch = Mutex::new(Batch {
        seeds: end - start,
        ..Batch::default()
    });
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let r = run_with(seed, order);
                    let mut b = batch
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    b.accepted += r.accepted;
                    b.dead_permanent += r.dead_permanent;
                    b.dead_exhausted += r.dead_exhausted;
                    b.duplicates += r.duplicates;
                    b.transitions += r.transitions;
                    b.fleet_seeds += u64::from(r.schedule.fleet);
                    b.leases_taken += r.leases_taken;
                    b.hung_probes += r.hung_probes;
                    b.ordered_applies += r.ordered_applies;
                    b.reorders += r.reorders;
                    b.reordered_seeds += u64::from(r.reorders > 0);
                    if let Some(first) = r.violations.into_iter().next() {
                        b.failed.push((seed, first));
                    }
                }
            });
        }
    });
    let mut batch = batch
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    batch.failed.sort_by_key(|(seed, _)| *seed);
    batch
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} seeds: {} webhooks accepted, {} dead-lettered as poison, {} exhausted, {} duplicate \
             applies (no effect), {} breaker transitions; {} seeds in fleet mode ({} controller \
             leases taken); {} probes hung past every deadline; {} keyed applies checked for \
             order, {} out of acceptance order (in {} seeds); {} seed(s) broke a promise",
            self.seeds,
            self.accepted,
            self.dead_permanent,
            self.dead_exhausted,
            self.duplicates,
            self.transitions,
            self.fleet_seeds,
            self.leases_taken,
            self.hung_probes,
            self.ordered_applies,
            self.reorders,
            self.reordered_seeds,
            self.failed.len()
        )?;
        for (seed, broken) in self.failed.iter().take(20) {
            write!(
                f,
                "\n  seed {seed} at {} ms: {}\n    replay: cargo run -p breakwater-sim --release -- --seed {seed}",
                broken.at, broken.what
            )?;
        }
        Ok(())
    }
}

/// Runs `seed` with the default order.
pub fn run(seed: u64) -> Report {
    run_with(seed, default_order())
}

/// Runs `seed`, the queue keeping `order`.
pub fn run_with(seed: u64, order: KeyOrder) -> Report {
    let mut rng = SmallRng::seed_from_u64(seed);
    let schedule = Schedule::draw(seed, &mut rng);
    let config = Config::default();
    let breaker_config = config.breaker_config();
    let settings = breakwater::serve::worker_settings(&config);
    let base = Instant::now();
    let mut nodes: Vec<Node> = (0..schedule.nodes)
        .map(|i| {
            Node::new(
                i,
                base,
                &breaker_config,
                &settings,
                seed ^ (i as u64 + 1),
                0,
                schedule.fleet,
            )
        })
        .collect();
    let mut queue = SimQueue::new(order);
    let mut db = db::SimDb::default();
    let mut store = schedule.fleet.then(|| Store::new(base));
    let mut violations = Vec::new();
    let mut next_arrival: Ms = 0;
    let mut last_step = vec![0; schedule.nodes];
    let mut now: Ms = 0;
    loop {
        if let Some(store) = store.as_mut() {
            store.set_up(!schedule.store_down(now));
        }
        while next_arrival <= now && next_arrival < TRAFFIC_MS {
            let key = rng
                .random_bool(0.8)
                .then(|| rng.random_range(0..schedule.keys));
            let poison = schedule.poison > 0.0 && rng.random_bool(schedule.poison);
            queue.enqueue(key, poison, next_arrival);
            let rate = if schedule.in_burst(next_arrival) {
                schedule.rate * 10
            } else {
                schedule.rate
            };
            next_arrival += (1_000 / u64::from(rate)).max(1);
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            if schedule.crashed_between(i, last_step[i], now) {
                let restart = rng.random();
                node.crash(&mut db, &mut rng, restart, now);
            }
            if schedule.node_runs(i, now) && node.next_event() <= now {
                node.step(now, &schedule, &mut queue, &mut db, &mut store);
                violations.append(&mut node.broken);
                last_step[i] = now;
            }
        }
        if let Some(store) = &store {
            check_fleet_probes(store, &breaker_config, &nodes, now, &mut violations);
        }
        if !violations.is_empty() {
            break;
        }
        let idle = nodes.iter().all(|n| n.running() == 0 && n.held() == 0);
        if (now >= TRAFFIC_MS && queue.unsettled() == 0 && idle) || now >= END_MS {
            break;
        }
        let next_node = nodes.iter().map(Node::next_event).min().unwrap_or(Ms::MAX);
        let arrival = if next_arrival < TRAFFIC_MS {
            next_arrival
        } else {
            Ms::MAX
        };
        now = next_node.min(arrival).max(now + 1);
    }
    let mut report = finish(
        schedule,
        &breaker_config,
        &nodes,
        &queue,
        &db,
        violations,
        now,
    );
    if let Some(store) = store {
        report.leases_taken = store.leases_taken;
        report.cas_lost = store.cas_lost;
    }
    report
}

/// Fleet-wide, no more probes out in one half-open period than
/// `max_probes`, counting those under a slot of the store as it is now
/// (a store that lost its data forgot its slots) and younger than a slot's
/// time to live (a stalled prober's slot lapses, and another may probe).
fn check_fleet_probes(
    store: &Store,
    config: &BreakerConfig,
    nodes: &[Node],
    now: Ms,
    violations: &mut Vec<Broken>,
) {
    if !store.up {
        return;
    }
    let ttl = config.half_open.probe_timeout_ms;
    let mut per_period = std::collections::BTreeMap::<u64, u32>::new();
    for (incarnation, period, started) in nodes.iter().flat_map(Node::fleet_probes) {
        if incarnation == store.incarnation && now.saturating_sub(started) < ttl {
            *per_period.entry(period).or_default() += 1;
        }
    }
    let max = config.half_open.max_probes;
    if let Some((period, n)) = per_period.into_iter().find(|(_, n)| *n > max) {
        violations.push(Broken {
            at: now,
            what: format!(
                "{n} probes out fleet-wide in half-open period {period}, more than {max}"
            ),
        });
    }
}

/// The end-of-run promises.
fn finish(
    schedule: Schedule,
    config: &BreakerConfig,
    nodes: &[Node],
    queue: &SimQueue,
    db: &db::SimDb,
    mut violations: Vec<Broken>,
    now: Ms,
) -> Report {
    let mut report = Report {
        accepted: queue.msgs.len(),
        applied: 0,
        dead_permanent: 0,
        dead_exhausted: 0,
        exhausted_ids: Vec::new(),
        duplicates: 0,
        transitions: nodes.iter().map(|n| n.transitions.len()).sum(),
        probes: nodes.iter().map(|n| n.probes_admitted).sum(),
        hung_probes: nodes.iter().map(|n| n.hung).sum(),
        leases_taken: 0,
        cas_lost: 0,
        ended_ms: now,
        nodes: nodes
            .iter()
            .map(|n| (n.breaker.state(), n.breaker.limit(), n.running(), n.held()))
            .collect(),
        running: nodes.iter().flat_map(Node::running_applies).collect(),
        order: queue.order(),
        ordered_applies: 0,
        reorders: 0,
        violations: Vec::new(),
        schedule,
    };
    if !violations.is_empty() {
        // The run stopped at its first broken promise.
        report.violations = violations;
        return report;
    }
    let mut broke = |what: String| violations.push(Broken { at: now, what });
    for m in &queue.msgs {
        let effects = db.effects.get(m.id as usize).copied().unwrap_or(0);
        match m.state {
            QState::Queued => broke(format!(
                "message {} not settled {} s after the traffic ended (lost or stuck; attempts {}, receives {})",
                m.id,
                (now.saturating_sub(TRAFFIC_MS)) / 1000,
                m.attempts,
                m.receives
            )),
            QState::Acked => {
                report.applied += 1;
                if effects != 1 {
                    broke(format!("message {} acked with {effects} effects", m.id));
                }
            }
            QState::Dead(class) => {
                if class == "permanent" {
                    report.dead_permanent += 1;
                    if !m.poison {
                        broke(format!(
                            "healthy message {} dead-lettered as permanent",
                            m.id
                        ));
                    }
                } else {
                    report.dead_exhausted += 1;
                    if report.exhausted_ids.len() < 10 {
                        report.exhausted_ids.push(m.id);
                    }
                }
            }
        }
        // Poison that never reached the database (every attempt failed on
        // the dependency first) may end exhausted; never applied.
        if m.poison && !matches!(m.state, QState::Dead(_)) {
            broke(format!("poison message {} ended {:?}", m.id, m.state));
        }
    }
    report.duplicates = db.commits - db.effects.iter().map(|&e| u64::from(e)).sum::<u64>();
    if report.schedule.poison_only() {
        for n in nodes {
            if let Some((at, ..)) = n.transitions.iter().find(|(_, _, to)| *to == State::Open) {
                broke(format!(
                    "node {} opened at {at} ms on poison alone",
                    n.index
                ));
            }
        }
    }
    let bound = recovery_bound_ms(config, report.schedule.fleet);
    let deadline = report.schedule.faults_end() + bound;
    if deadline < now {
        for n in nodes {
            let state = n
                .transitions
                .iter()
                .rev()
                .find(|(at, ..)| *at <= deadline)
                .map_or(State::Closed, |(_, _, to)| *to);
            if state != State::Closed {
                broke(format!(
                    "node {} still {state} at {deadline} ms, {} ms after the last fault ended",
                    n.index, bound
                ));
            }
        }
    }
    let order = check_order(queue, db);
    report.ordered_applies = order.checked;
    report.reorders = order.reorders;
    if let (KeyOrder::Key, Some((at, what))) = (report.order, order.first) {
        violations.push(Broken {
            at,
            what: format!(
                "{what}; {} of {} keyed applies out of acceptance order",
                order.reorders, order.checked
            ),
        });
    }
    report.violations = violations;
    report
}

/// What [`check_order`] found.
struct OrderCheck {
    checked: usize,
    reorders: usize,
    /// The first apply out of order: when, and what.
    first: Option<(Ms, String)>,
}

/// Per entity key, the statements that ran (first commits, in commit
/// order) must follow acceptance (message ids). Dead-lettered messages
/// drop out, and messages without a key are unordered. An apply that runs
/// after a later-accepted message of its key has run is out of order.
fn check_order(queue: &SimQueue, db: &db::SimDb) -> OrderCheck {
    let mut newest = std::collections::BTreeMap::<u32, u32>::new();
    let mut found = OrderCheck {
        checked: 0,
        reorders: 0,
        first: None,
    };
    for &(at, id) in &db.applies {
        let Some(m) = queue.msgs.get(id as usize) else {
            continue;
        };
        let Some(key) = m.key else { continue };
        if matches!(m.state, QState::Dead(_)) {
            continue;
        }
        found.checked += 1;
        let last = newest.entry(key).or_insert(id);
        if *last > id {
            found.reorders += 1;
            if found.first.is_none() {
                found.first = Some((
                    at,
                    format!(
                        "key {key}: message {id} applied at {at} ms, after message {} accepted later",
                        *last
                    ),
                ));
            }
        } else {
            *last = id;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key 5: messages 0, 1, 3 (2 has no key, 4 of key 5 is dead-lettered
    /// after it ran). Applies 0, 3, 2, 4, 1: message 1 ran after 3; the
    /// dead-lettered 4 and the keyless 2 drop out.
    #[test]
    fn the_order_check_counts_applies_after_a_later_accepted_one() {
        let mut queue = SimQueue::new(KeyOrder::None);
        for key in [Some(5), Some(5), None, Some(5), Some(5)] {
            queue.enqueue(key, false, 0);
        }
        let mut db = db::SimDb::default();
        for (at, id) in [(10, 0), (20, 3), (30, 2), (40, 4), (50, 1)] {
            db.commit(id, at);
        }
        for d in queue.claim(10, 1_000, &[], 60) {
            if d.id == 4 {
                queue.dead_letter(d.id, d.token, "exhausted", 60);
            } else {
                queue.ack(d.id, d.token, 60);
            }
        }
        let found = check_order(&queue, &db);
        assert_eq!((found.checked, found.reorders), (3, 1));
        let (at, what) = found.first.unwrap_or_default();
        assert_eq!(at, 50);
        assert!(
            what.contains("message 1 applied at 50 ms, after message 3"),
            "{what}"
        );
    }
}
