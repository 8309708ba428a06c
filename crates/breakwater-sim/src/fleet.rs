//! Fleet mode: the nodes of a seed share one breaker through a simulated
//! fleet store, the way `[fleet]` on Redis does (`breakwater::breaker::
//! fleet` and the controller's share and follow): a record changed only by
//! compare-and-set on its version, a controller lease whose holder
//! evaluates the fleet's signals from every node's beat, probe slots
//! counted fleet-wide (the control crate's own [`LocalProbeSlots`], on the
//! store's clock), a change feed every node follows at its next step.
//!
//! The faults it adds: the store lost (down for a span, back empty: a new
//! epoch, no lease, no slots), a lease holder that crashes or stalls (the
//! lease lapses, another node takes it), a prober that dies holding a
//! fleet slot (the slot lapses at its time to live), and nodes' wall
//! clocks jumping (records are aged by the wall clock; the breakers run on
//! the monotonic one).
//!
//! Not modelled: hot-key parks shared between nodes (each node's lanes
//! park on their own), observers (every node runs workers).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use breakwater::breaker::Standing;
use breakwater_control::{
    BreakerRecord, Heartbeat, LocalProbeSlots, OutcomeTally, ProbeSlot, ProbeSlots, SharedBreaker,
    Version, WorkerState,
};

use crate::schedule::Ms;

/// The fleet's beat and controller lease (`[fleet]` defaults).
pub const BEAT_MS: Ms = 1_000;
pub const LEASE_MS: Ms = 3_000;
/// A beat older than this is not live (`lock_wait.heartbeat_ttl_ms`).
const BEAT_TTL_MS: Ms = 10_000;
/// Wall-clock milliseconds at simulated time 0.
const WALL_BASE_MS: i64 = 1_800_000_000_000;

/// A node's beat as the store keeps it.
#[derive(Debug, Clone)]
struct Beat {
    at: Ms,
    tally: OutcomeTally,
    /// Its worker slots: what each is doing.
    slots: Vec<WorkerState>,
}

/// The fleet store (Redis).
pub struct Store {
    /// Whether it answers.
    pub up: bool,
    /// Bumped each time it comes back empty; a probe slot remembers the
    /// incarnation it was taken in.
    pub incarnation: u32,
    next_epoch: u64,
    record: Option<BreakerRecord>,
    /// The lease: holder, expiry (the store's clock).
    lease: Option<(usize, Ms)>,
    slots: LocalProbeSlots,
    beats: BTreeMap<usize, Beat>,
    base: Instant,
    /// Compare-and-sets that lost to another node's change.
    pub cas_lost: u64,
    pub leases_taken: u64,
}

/// Drives a future of the local stores, which never wait.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the local probe slots never wait"),
    }
}

impl Store {
    pub fn new(base: Instant) -> Self {
        Self {
            up: true,
            incarnation: 0,
            next_epoch: 1,
            record: None,
            lease: None,
            slots: LocalProbeSlots::default(),
            beats: BTreeMap::new(),
            base,
            cas_lost: 0,
            leases_taken: 0,
        }
    }

    /// Goes down (`up == false`) or comes back: back, it holds nothing.
    pub fn set_up(&mut self, up: bool) {
        if up && !self.up {
            self.record = None;
            self.lease = None;
            self.slots = LocalProbeSlots::default();
            self.beats.clear();
            self.incarnation += 1;
        }
        self.up = up;
    }

    fn at(&self, t: Ms) -> Instant {
        self.base + Duration::from_millis(t)
    }

    pub fn record(&self) -> Option<&BreakerRecord> {
        self.record.as_ref().filter(|_| self.up)
    }

    fn compare_and_set(&mut self, expected: Option<Version>, record: BreakerRecord) -> bool {
        if self.record.as_ref().map(BreakerRecord::version) != expected {
            self.cas_lost += 1;
            return false;
        }
        self.record = Some(record);
        true
    }

    fn new_epoch(&mut self) -> u64 {
        self.next_epoch += 1;
        self.next_epoch
    }

    /// Takes or renews the lease for `node`; whether it holds it.
    fn lease(&mut self, node: usize, now: Ms) -> bool {
        match self.lease {
            Some((holder, until)) if holder != node && until > now => false,
            Some((holder, _)) if holder == node => {
                self.lease = Some((node, now + LEASE_MS));
                true
            }
            _ => {
                self.lease = Some((node, now + LEASE_MS));
                self.leases_taken += 1;
                true
            }
        }
    }

    fn lease_expiry(&self) -> Option<Ms> {
        self.lease.map(|(_, until)| until)
    }

    /// A fleet probe slot of `period`, if fewer than `limit` are held.
    pub fn take_slot(&mut self, period: u64, limit: u32, ttl_ms: Ms, now: Ms) -> Option<ProbeSlot> {
        let at = self.at(now);
        ready(
            self.slots
                .try_take(period, limit, Duration::from_millis(ttl_ms), at),
        )
        .ok()
        .flatten()
    }

    pub fn give_back(&mut self, slot: ProbeSlot) {
        let _ = ready(self.slots.give_back(slot));
    }

    /// The period's successes, fleet-wide, with this one.
    pub fn succeeded(&mut self, slot: ProbeSlot) -> u32 {
        ready(self.slots.succeeded(slot)).unwrap_or(0)
    }
}

/// A node's part in the fleet.
#[derive(Debug)]
pub struct Member {
    pub standing: Standing,
    /// The record version this node follows.
    pub applied: Option<Version>,
    /// A local change not yet stored: the version it was made on, the view.
    pending: Option<(Option<Version>, SharedBreaker)>,
    /// Every outcome this node saw (its beat carries it).
    pub tally: OutcomeTally,
    /// The leader's baseline of each other node's tally.
    seen: BTreeMap<usize, OutcomeTally>,
    pub next_beat: Ms,
    /// How far this node's wall clock stands from true time.
    pub wall_offset_ms: i64,
}

/// What a beat tells the node.
pub struct BeatAnswer {
    pub standing: Standing,
    /// The record to follow, if newer.
    pub record: Option<BreakerRecord>,
    /// No record yet and this node leads: store the breaker as it stands.
    pub share_current: bool,
    /// The leader reads the other nodes: their new outcomes, their slots.
    pub fleet_outcomes: Vec<OutcomeTally>,
    pub fleet_heartbeats: Vec<Heartbeat>,
}

impl Member {
    pub fn new(now: Ms) -> Self {
        Self {
            standing: Standing::Follower,
            applied: None,
            pending: None,
            tally: OutcomeTally::default(),
            seen: BTreeMap::new(),
            next_beat: now,
            wall_offset_ms: 0,
        }
    }

    /// This node's wall clock at `now`, in Unix milliseconds.
    pub fn wall_ms(&self, now: Ms) -> u64 {
        let t = WALL_BASE_MS + i64::try_from(now).unwrap_or(i64::MAX) + self.wall_offset_ms;
        u64::try_from(t).unwrap_or(0)
    }

    /// A local transition's view, to be stored.
    pub fn changed(&mut self, view: SharedBreaker) {
        self.pending = Some((self.applied, view));
    }

    /// Whether `record` is newer than the one followed; if so it is the one
    /// followed from now on.
    pub fn takes(&mut self, record: &BreakerRecord) -> bool {
        if self
            .applied
            .is_some_and(|v| !v.is_superseded_by(record.version()))
        {
            return false;
        }
        self.applied = Some(record.version());
        true
    }

    /// Stores the pending change by compare-and-set on the version it was
    /// made on (the controller's `store_change`). Returns a newer record of
    /// another node to follow instead, when one moved first.
    pub fn share(&mut self, me: usize, store: &mut Store, now: Ms) -> Option<BreakerRecord> {
        if !store.up {
            return None;
        }
        let (based_on, view) = self.pending.take()?;
        let mut expected = based_on;
        for _ in 0..2 {
            let version = match expected {
                Some(v) => Version {
                    epoch: v.epoch,
                    generation: v.generation + 1,
                },
                None => Version {
                    epoch: store.new_epoch(),
                    generation: 1,
                },
            };
            let record = BreakerRecord {
                epoch: version.epoch,
                generation: version.generation,
                node: me.to_string(),
                written_at_ms: self.wall_ms(now),
                breaker: view.clone(),
            };
            if store.compare_and_set(expected, record) {
                if self.applied.is_none_or(|v| v.is_superseded_by(version)) {
                    self.applied = Some(version);
                }
                return None;
            }
            match store.record.clone() {
                Some(r) if r.node == me.to_string() && Some(r.version()) == self.applied => {
                    expected = Some(r.version());
                }
                Some(r) => return Some(r),
                None => expected = None,
            }
        }
        None
    }

    /// One beat: store this node's beat, take or renew the lease, read the
    /// record and (as leader) the other nodes' beats.
    pub fn beat(
        &mut self,
        me: usize,
        slots: Vec<WorkerState>,
        store: &mut Store,
        now: Ms,
    ) -> BeatAnswer {
        if !store.up {
            self.standing = Standing::Fallback;
            self.next_beat = now + BEAT_MS;
            return BeatAnswer {
                standing: self.standing,
                record: None,
                share_current: false,
                fleet_outcomes: Vec::new(),
                fleet_heartbeats: Vec::new(),
            };
        }
        store.beats.insert(
            me,
            Beat {
                at: now,
                tally: self.tally,
                slots,
            },
        );
        let leader = store.lease(me, now);
        self.standing = if leader {
            Standing::Leader
        } else {
            Standing::Follower
        };
        let record = store.record.clone();
        let share_current = record.is_none() && leader;
        let (mut fleet_outcomes, mut fleet_heartbeats) = (Vec::new(), Vec::new());
        if leader {
            for (&node, beat) in &store.beats {
                if node == me || now.saturating_sub(beat.at) > BEAT_TTL_MS {
                    continue;
                }
                // The first beat read is the baseline.
                if let Some(before) = self.seen.get(&node) {
                    fleet_outcomes.push(beat.tally.since(before));
                }
                self.seen.insert(node, beat.tally);
                let at = store.at(beat.at);
                for (slot, state) in beat.slots.iter().enumerate() {
                    fleet_heartbeats.push(Heartbeat {
                        worker: (node as u64 + 1) << 20 | slot as u64,
                        state: *state,
                        at,
                    });
                }
            }
        }
        // A follower beats again just after the lease would lapse.
        self.next_beat = match store.lease_expiry() {
            Some(until) if !leader => now + (until + 20).saturating_sub(now).clamp(20, BEAT_MS),
            _ => now + BEAT_MS,
        };
        BeatAnswer {
            standing: self.standing,
            record,
            share_current,
            fleet_outcomes,
            fleet_heartbeats,
        }
    }
}
