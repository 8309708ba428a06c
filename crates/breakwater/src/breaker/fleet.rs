//! The link between a node and its fleet (`[fleet]`): the tasks that keep
//! the node's [`Controller`] in step with the fleet store on Redis.
//!
//! - **The beat**, every `beat_ms`: one round trip stores this node's
//!   heartbeat (slots in the article's shape, its outcome tally), takes or
//!   renews the controller lease (nodes that run workers), and reads the
//!   breaker record as a backstop to the change feed; the lease holder also
//!   reads every node's beat and feeds the fleet's outcomes and lock waits
//!   into its breaker. A follower beats again just after the lease would
//!   lapse, so a dead holder is replaced within the lease time.
//! - **The change feed**: every record stored is published; each node
//!   follows it at once (the per-message gate reads only the local copy).
//! - **Hot-key parks**: a key the lanes park after a lock failure is
//!   announced, and every other node parks it too until the parking node
//!   says its probe went through (or a grace of one to two `park_cap`,
//!   different per node, after the park passes), so on a broker that
//!   spreads one key's messages over the workers only one node probes a
//!   locked row.
//! - **Fallback**: a beat that fails puts the node on its own breaker, said
//!   once in the log, in `breakwater_fleet_fallback` and in `GET /breaker`;
//!   webhooks keep flowing. The first beat that succeeds rejoins.
//!
//! The store's calls and the beat's cost are in `breakwater_fleet`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use breakwater_admin_api::{FleetInfo, FleetNode};
use breakwater_fleet::{FleetView, KeyPark, Lease, NodeBeat, NodeRole, RedisFleet, SlotState};
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::controller::{Controller, Standing, lock};
use crate::telemetry;
use crate::worker::{RemotePark, SharedParks};

/// A beat with nothing new is stored at least this often (the holder
/// counts a node live for `lock_wait.heartbeat_ttl_ms`, 10 s by default).
const STORE_AT_LEAST_EVERY: Duration = Duration::from_secs(3);
/// A node that runs no workers (holds no lease, has no slots) beats this
/// many times more slowly.
const OBSERVER_SLOWER: u32 = 3;

/// A node's beat older than this is removed from the store.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Pause before subscribing again after the change feed failed.
const FEED_RETRY: Duration = Duration::from_secs(1);
/// How long `GET /breaker` reuses the nodes' beats it read (the lease
/// holder refreshes them at every beat for free): however often the admin
/// API is asked, a node adds at most 3 Redis commands per this.
const VIEW_REUSE: Duration = Duration::from_secs(5);

/// This node's place in the fleet: the store, its role, its timing.
pub struct FleetLink {
    store: Arc<RedisFleet>,
    role: NodeRole,
    beat_every: Duration,
    lease: Duration,
    /// The lease as the last beat saw it.
    last_lease: Mutex<Option<Lease>>,
    /// The latest fleet view read for the admin API, and when.
    view: Mutex<Option<(Instant, FleetView)>>,
    /// The last beat stored, and when.
    stored: Mutex<Option<(Instant, NodeBeat)>>,
}

impl std::fmt::Debug for FleetLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLink")
            .field("store", &self.store)
            .field("role", &self.role)
            .finish()
    }
}

impl FleetLink {
    pub fn new(
        store: Arc<RedisFleet>,
        role: NodeRole,
        beat_every: Duration,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            role,
            beat_every,
            lease,
            last_lease: Mutex::new(None),
            view: Mutex::new(None),
            stored: Mutex::new(None),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<RedisFleet> {
        &self.store
    }

    /// Who holds the controller lease, as the last beat saw it.
    pub fn lease_holder(&self) -> Option<String> {
        lock(&self.last_lease).as_ref().map(|l| l.holder.clone())
    }

    /// The fleet as it stands (every node's beat), read at most once per
    /// [`VIEW_REUSE`] however often the admin API asks; on fallback, only
    /// what was read before (the store does not answer).
    async fn view(&self, fallback: bool) -> Option<FleetView> {
        if let Some((at, v)) = lock(&self.view).as_ref()
            && (fallback || at.elapsed() < VIEW_REUSE)
        {
            return Some(v.clone());
        }
        if fallback {
            return None;
        }
        let v = self.store.view().await.ok()?;
        *lock(&self.view) = Some((Instant::now(), v.clone()));
        Some(v)
    }

    /// The fleet as this node shows it in `GET /breaker`: the nodes from
    /// their beats (see `FleetLink::view`), and fresh from this node
    /// itself, with no Redis call: its standing, the lease holder its last
    /// beat saw, the state and record generation it follows.
    pub async fn info(&self, controller: &Controller) -> FleetInfo {
        let standing = controller.standing();
        let fallback = standing == Standing::Fallback;
        let prefix = self.store.keys().prefix();
        let mut info = match self.view(fallback).await {
            Some(v) => fleet_info(&v, prefix),
            None => fleet_info(&FleetView::default(), prefix),
        };
        info.node = Some(self.store.node().to_owned());
        info.standing = Some(standing.as_str().to_owned());
        info.fallback = fallback;
        info.lease_holder = if fallback { None } else { self.lease_holder() };
        for n in &mut info.nodes {
            n.leader = info.lease_holder.as_deref() == Some(n.node.as_str());
        }
        info.state = Some(controller.status().state);
        info.generation = controller.applied_generation();
        info
    }

    /// Runs the beat and the change feed until `stop`; gives the lease up
    /// on the way out.
    pub async fn run(self: Arc<Self>, controller: Arc<Controller>, stop: watch::Receiver<bool>) {
        let feed = tokio::spawn(Self::follow_changes(
            Arc::clone(&self.store),
            Arc::clone(&controller),
            stop.clone(),
        ));
        self.beat_loop(&controller, stop).await;
        let _ = feed.await;
        if let Err(e) = self.store.release_lease().await {
            tracing::debug!(error = %e, "the controller lease was not given up; it lapses");
        }
    }

    async fn beat_loop(&self, controller: &Controller, mut stop: watch::Receiver<bool>) {
        let wants_lease = self.role.runs_workers();
        loop {
            let next = self.beat(controller, wants_lease).await;
            tokio::select! {
                () = tokio::time::sleep(next) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
    }

    /// One beat; returns when to beat again.
    async fn beat(&self, controller: &Controller, wants_lease: bool) -> Duration {
        let beat = controller.beat(self.role);
        let store_beat = worth_storing(lock(&self.stored).as_ref(), &beat, Instant::now());
        let lease_ttl = wants_lease.then_some(self.lease);
        match self.store.sync(&beat, store_beat, lease_ttl).await {
            Ok(answer) => {
                if store_beat {
                    *lock(&self.stored) = Some((Instant::now(), beat));
                }
                let standing = if !wants_lease {
                    Standing::Observer
                } else if answer.leader {
                    Standing::Leader
                } else {
                    Standing::Follower
                };
                let before = controller.set_standing(standing);
                self.say_standing(before, standing, &answer.lease);
                match &answer.record {
                    Some(record) => controller.follow(record),
                    // A new deployment (or a Redis that lost its data): the
                    // holder stores the breaker as it stands.
                    None if answer.leader => controller.share_current(),
                    None => {}
                }
                if answer.leader {
                    let gone = controller.observe_fleet(&answer.beats, FORGET_AFTER);
                    if !gone.is_empty() {
                        let _ = self.store.forget_nodes(&gone).await;
                    }
                    // The holder read every beat anyway: the admin API's
                    // view costs it nothing.
                    *lock(&self.view) = Some((
                        Instant::now(),
                        FleetView {
                            lease: answer.lease.clone(),
                            record: answer.record.clone(),
                            beats: answer.beats.clone(),
                        },
                    ));
                }
                let next = self.next_beat(answer.leader, answer.lease.as_ref());
                *lock(&self.last_lease) = answer.lease;
                next
            }
            Err(e) => {
                let before = controller.set_standing(Standing::Fallback);
                if before != Standing::Fallback {
                    tracing::warn!(error = %e,
                        "the fleet store cannot be reached: this node decides alone until it can \
                         (webhooks keep flowing)");
                    metrics::gauge!(telemetry::FLEET_FALLBACK).set(1.0);
                    metrics::gauge!(telemetry::FLEET_LEADER).set(0.0);
                }
                *lock(&self.last_lease) = None;
                self.beat_every
            }
        }
    }

    /// A follower beats again just after the lease would lapse, if that is
    /// sooner than its next beat: a dead holder is replaced within the
    /// lease time.
    fn next_beat(&self, leader: bool, lease: Option<&Lease>) -> Duration {
        if !self.role.runs_workers() {
            return self.beat_every * OBSERVER_SLOWER;
        }
        if leader {
            return self.beat_every;
        }
        let Some(lease) = lease else {
            return self.beat_every;
        };
        let left = lease
            .expires_at_ms
            .saturating_sub(breakwater_fleet::now_ms());
        Duration::from_millis(left.saturating_add(20))
            .clamp(Duration::from_millis(20), self.beat_every)
    }

    fn say_standing(&self, before: Standing, now: Standing, lease: &Option<Lease>) {
        if before == now {
            return;
        }
        if before == Standing::Fallback {
            tracing::info!(
                standing = now.as_str(),
                "the fleet store answers again: this node rejoins the fleet"
            );
            metrics::gauge!(telemetry::FLEET_FALLBACK).set(0.0);
        }
        match now {
            Standing::Leader => {
                tracing::info!(node = %self.store.node(), "this node holds the controller lease: it evaluates the fleet's signals");
            }
            Standing::Follower if before == Standing::Leader => {
                tracing::info!(holder = ?lease.as_ref().map(|l| &l.holder), "this node no longer holds the controller lease");
            }
            _ => {}
        }
        metrics::gauge!(telemetry::FLEET_LEADER).set(if now == Standing::Leader {
            1.0
        } else {
            0.0
        });
    }

    /// Shares this node's hot-key parks with the fleet and takes the other
    /// nodes' (for the dispatcher), until `stop`: a key parked on one node
    /// is parked on all, and of nodes that parked one key at once, the one
    /// with the smallest id keeps probing it. Returns the dispatcher's end
    /// and the two tasks.
    pub fn share_parks(
        self: &Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> (SharedParks, [JoinHandle<()>; 2]) {
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<(String, Duration)>();
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let store = Arc::clone(&self.store);
        let mut stop_publishing = stop.clone();
        let publisher = tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = out_rx.recv() => next,
                    _ = stop_publishing.wait_for(|s| *s) => None,
                };
                let Some((key, park)) = next else { break };
                let park = KeyPark {
                    node: store.node().to_owned(),
                    key,
                    park_ms: u64::try_from(park.as_millis()).unwrap_or(u64::MAX),
                };
                if let Err(e) = store.publish_key_park(&park).await {
                    tracing::debug!(error = %e, "a key park was not shared with the fleet");
                }
            }
        });
        let store = Arc::clone(&self.store);
        let subscriber = tokio::spawn(async move {
            let me = store.node().to_owned();
            loop {
                match store.key_parks().await {
                    Ok(mut parks) => loop {
                        tokio::select! {
                            next = parks.next() => match next {
                                Some(p) if p.node != me => {
                                    let remote = RemotePark {
                                        keep_own: me < p.node,
                                        park: Duration::from_millis(p.park_ms),
                                        key: p.key,
                                    };
                                    if in_tx.send(remote).is_err() {
                                        return;
                                    }
                                }
                                Some(_) => {}
                                None => break,
                            },
                            _ = stop.wait_for(|s| *s) => return,
                        }
                    },
                    Err(e) => {
                        tracing::debug!(error = %e, "the fleet's key parks feed is down; retrying")
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(FEED_RETRY) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        (
            SharedParks {
                outgoing: out_tx,
                incoming: in_rx,
                stagger: stagger(self.store.node()),
            },
            [publisher, subscriber],
        )
    }

    /// Follows every record published, until `stop`; subscribes again when
    /// the feed breaks (the beat's read covers the gap).
    async fn follow_changes(
        store: Arc<RedisFleet>,
        controller: Arc<Controller>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            match store.changes().await {
                Ok(mut changes) => loop {
                    tokio::select! {
                        next = changes.next() => match next {
                            Some(record) => controller.follow(&record),
                            None => break,
                        },
                        _ = stop.wait_for(|s| *s) => return,
                    }
                },
                Err(e) => tracing::debug!(error = %e, "the fleet's change feed is down; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(FEED_RETRY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// Whether a beat tells the fleet something the last one stored did not:
/// the first, one every [`STORE_AT_LEAST_EVERY`], and any with new
/// dependency failures, slots in a lock wait, another breaker state or
/// record, or a change of fallback. Steady successes wait for the next
/// one: they only move the failure ratio's denominator.
fn worth_storing(last: Option<&(Instant, NodeBeat)>, beat: &NodeBeat, now: Instant) -> bool {
    let Some((at, last)) = last else {
        return true;
    };
    now.saturating_duration_since(*at) >= STORE_AT_LEAST_EVERY
        || beat.outcomes.failures != last.outcomes.failures
        || beat.outcomes.slow != last.outcomes.slow
        || beat.lock_waits() > 0
        || last.lock_waits() > 0
        || beat.state != last.state
        || beat.generation != last.generation
        || beat.fallback != last.fallback
}

/// A node's fixed share in `[0, 1)`, from its id: spreads when different
/// nodes' waits end (see [`SharedParks::stagger`]).
fn stagger(node: &str) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    (h.finish() % 1_000) as f64 / 1_000.0
}

/// The fleet as `GET /breaker` and `breakwater fleet status` show it: the
/// lease holder, the shared record, every node from its latest beat
/// (newest first).
pub fn fleet_info(view: &FleetView, prefix: &str) -> FleetInfo {
    let now_ms = breakwater_fleet::now_ms();
    let holder = view.lease.as_ref().map(|l| l.holder.clone());
    let mut nodes: Vec<FleetNode> = view
        .beats
        .iter()
        .map(|b| FleetNode {
            node: b.node.clone(),
            role: match b.role {
                NodeRole::Ingress => "ingress",
                NodeRole::Worker => "worker",
                NodeRole::All => "all",
            }
            .to_owned(),
            state: b.state,
            last_beat_ms_ago: now_ms.saturating_sub(b.at_ms),
            slots: b.slots.len(),
            lock_waits: b.lock_waits(),
            lock_targets: b
                .slots
                .iter()
                .filter(|s| s.state == SlotState::DbLockWait)
                .filter_map(|s| s.lock_target.clone())
                .collect(),
            fallback: b.fallback,
            leader: holder.as_deref() == Some(b.node.as_str()),
        })
        .collect();
    nodes.sort_by(|a, b| {
        a.last_beat_ms_ago
            .cmp(&b.last_beat_ms_ago)
            .then_with(|| a.node.cmp(&b.node))
    });
    FleetInfo {
        node: None,
        standing: None,
        fallback: false,
        prefix: prefix.to_owned(),
        lease_holder: holder,
        state: view.record.as_ref().map(|r| r.breaker.state),
        generation: view.record.as_ref().map(|r| r.generation),
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use breakwater_control::{OutcomeTally, State};
    use breakwater_fleet::SlotBeat;

    fn beat() -> NodeBeat {
        NodeBeat {
            node: "w1".into(),
            role: NodeRole::Worker,
            at_ms: 0,
            state: Some(State::Closed),
            generation: 3,
            fallback: false,
            slots: Vec::new(),
            outcomes: OutcomeTally::default(),
        }
    }

    #[test]
    fn a_beat_is_stored_when_it_has_news_or_has_waited_long_enough() {
        let t = Instant::now();
        assert!(worth_storing(None, &beat(), t), "the first");
        let last = (t, beat());
        let mut steady = beat();
        steady.outcomes.calls = 500;
        assert!(!worth_storing(
            Some(&last),
            &steady,
            t + Duration::from_secs(1)
        ));
        assert!(worth_storing(
            Some(&last),
            &steady,
            t + STORE_AT_LEAST_EVERY
        ));
        let mut failing = steady.clone();
        failing.outcomes.failures = 1;
        assert!(worth_storing(
            Some(&last),
            &failing,
            t + Duration::from_secs(1)
        ));
        let mut waiting = beat();
        waiting.slots.push(SlotBeat {
            slot: 0,
            state: SlotState::DbLockWait,
            lock_target: Some("1042".into()),
            waited_ms: 400,
        });
        assert!(worth_storing(
            Some(&last),
            &waiting,
            t + Duration::from_secs(1)
        ));
        // The wait ended: that is news too.
        let was_waiting = (t, waiting);
        assert!(worth_storing(
            Some(&was_waiting),
            &beat(),
            t + Duration::from_secs(1)
        ));
        let mut opened = beat();
        opened.state = Some(State::Open);
        assert!(worth_storing(
            Some(&last),
            &opened,
            t + Duration::from_secs(1)
        ));
    }

    #[test]
    fn staggers_differ_between_nodes_and_stay_below_one() {
        let s: Vec<f64> = ["w1", "w2", "w3"].iter().map(|n| stagger(n)).collect();
        assert!(s.iter().all(|x| (0.0..1.0).contains(x)), "{s:?}");
        assert_eq!(stagger("w1"), s[0], "fixed per node");
        assert!(s[0] != s[1] || s[1] != s[2], "{s:?}");
    }
}
