//! A fault schedule drawn from a seed: traffic, the database's faults
//! (down, slow, flapping, hot rows), poison, worker crashes and stalls,
//! bursts; in fleet mode the fleet store lost and wall clocks jumping. Everything random in a run comes from the seed, so a failing
//! seed replays exactly.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Milliseconds of simulated time.
pub type Ms = u64;

/// Webhooks arrive from 0 to this.
pub const TRAFFIC_MS: Ms = 40_000;
/// Faults start after this and end by [`FAULTS_END_MS`].
const FAULTS_START_MS: Ms = 2_000;
const FAULTS_END_MS: Ms = 32_000;

/// A window of simulated time, `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub from: Ms,
    pub to: Ms,
}

impl Span {
    pub fn holds(&self, t: Ms) -> bool {
        self.from <= t && t < self.to
    }
}

/// What the database does in a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFault {
    /// Connections refused.
    Down,
    /// Every call takes this much longer (past the statement timeout, it
    /// times out).
    Slow { extra_ms: Ms },
    /// Down and up by turns, `period_ms` each.
    Flapping { period_ms: Ms },
    /// Connections accepted, nothing answered (a network blackhole): a
    /// call ends at the sink's client-side deadline.
    Blackhole,
}

/// One fault schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub seed: u64,
    /// Worker processes sharing the queue and the database (each its own
    /// breaker, unless they are a `fleet`).
    pub nodes: usize,
    /// Webhooks per second.
    pub rate: u32,
    /// Entity keys; `None` for some messages (no key).
    pub keys: u32,
    /// Share of messages that are poison (a constraint violation).
    pub poison: f64,
    pub db: Vec<(Span, DbFault)>,
    /// A key's row locked by someone else.
    pub hot_rows: Vec<(Span, u32)>,
    /// Bursts of ten times the rate.
    pub bursts: Vec<Span>,
    /// A node's process killed (applies in flight lost, leases lapse) and
    /// started again at `to`.
    pub crashes: Vec<(Span, usize)>,
    /// A node's process paused (a VM pause, a GC): nothing of it runs.
    pub stalls: Vec<(Span, usize)>,
    /// Fleet mode: the nodes share one breaker through a fleet store
    /// ([`crate::fleet`]); only with two nodes or more.
    pub fleet: bool,
    /// Fleet mode: the store down (it comes back empty).
    pub store_down: Vec<Span>,
    /// Fleet mode: a node's wall clock jumps by this many ms at this time.
    pub clock_jumps: Vec<(Ms, usize, i64)>,
    /// From this time, the next probe a node starts hangs for
    /// [`HANG_MS`], past every deadline (a driver that never gives up):
    /// only the breaker's probe timeout ends its half-open period.
    pub hung_probes: Vec<(Ms, usize)>,
}

/// How long a hung probe hangs.
pub const HANG_MS: Ms = 60_000;

fn span(rng: &mut SmallRng, min_ms: Ms, max_ms: Ms) -> Span {
    let len = rng.random_range(min_ms..=max_ms);
    let from = rng
        .random_range(FAULTS_START_MS..FAULTS_END_MS.saturating_sub(len).max(FAULTS_START_MS + 1));
    Span {
        from,
        to: from + len,
    }
}

impl Schedule {
    /// The schedule of `seed`.
    pub fn draw(seed: u64, rng: &mut SmallRng) -> Self {
        let nodes = if rng.random_bool(0.3) {
            rng.random_range(2..=3)
        } else {
            1
        };
        let poison = match rng.random_range(0..5) {
            0 | 1 => 0.0,
            2 => 0.01,
            3 => 0.1,
            _ => 0.5,
        };
        let mut db = Vec::new();
        for _ in 0..rng.random_range(0..=2) {
            let fault = match rng.random_range(0..4) {
                0 => DbFault::Down,
                3 => DbFault::Blackhole,
                1 => DbFault::Slow {
                    extra_ms: *[20, 200, 1_000, 4_000]
                        .get(rng.random_range(0..4))
                        .unwrap_or(&200),
                },
                _ => DbFault::Flapping {
                    period_ms: rng.random_range(200..=3_000),
                },
            };
            db.push((span(rng, 1_000, 20_000), fault));
        }
        let keys = rng.random_range(1..=20);
        let hot_rows = (0..rng.random_range(0..=2))
            .map(|_| (span(rng, 500, 20_000), rng.random_range(0..keys)))
            .collect();
        let bursts = (0..rng.random_range(0..=2))
            .map(|_| span(rng, 200, 2_000))
            .collect();
        let crashes = (0..usize::from(rng.random_bool(0.2)))
            .map(|_| (span(rng, 100, 3_000), rng.random_range(0..nodes)))
            .collect();
        let stalls = (0..usize::from(rng.random_bool(0.2)))
            .map(|_| (span(rng, 100, 35_000), rng.random_range(0..nodes)))
            .collect();
        let mut schedule = Self {
            seed,
            nodes,
            rate: rng.random_range(5..=60),
            keys,
            poison,
            db,
            hot_rows,
            bursts,
            crashes,
            stalls,
            fleet: false,
            store_down: Vec::new(),
            clock_jumps: Vec::new(),
            hung_probes: Vec::new(),
        };
        // Also from a generator of its own (see below).
        let mut hang = SmallRng::seed_from_u64(seed ^ 0x4a46);
        if !schedule.db.is_empty() && hang.random_bool(0.1) {
            let at = hang.random_range(FAULTS_START_MS..FAULTS_END_MS);
            schedule.hung_probes = vec![(at, hang.random_range(0..nodes))];
        }
        if nodes > 1 {
            // From a generator of their own, so the draws above (and the
            // seeds found before fleet mode) stay what they were.
            schedule.draw_fleet(&mut SmallRng::seed_from_u64(seed ^ 0xf1ee7));
        }
        schedule
    }

    fn draw_fleet(&mut self, rng: &mut SmallRng) {
        self.fleet = rng.random_bool(0.6);
        if !self.fleet {
            return;
        }
        self.store_down = (0..usize::from(rng.random_bool(0.3)))
            .map(|_| span(rng, 500, 10_000))
            .collect();
        self.clock_jumps = (0..rng.random_range(0..=2))
            .map(|_| {
                let at = rng.random_range(FAULTS_START_MS..FAULTS_END_MS);
                let by =
                    rng.random_range(1_000..=60_000) * if rng.random_bool(0.5) { 1 } else { -1 };
                (at, rng.random_range(0..self.nodes), by)
            })
            .collect();
    }

    /// When the last fault of the database, a node or the traffic ends.
    pub fn faults_end(&self) -> Ms {
        let ends = self.db.iter().map(|(s, _)| s.to);
        let ends = ends.chain(self.hot_rows.iter().map(|(s, _)| s.to));
        let ends = ends.chain(self.bursts.iter().map(|s| s.to));
        let ends = ends.chain(self.crashes.iter().map(|(s, _)| s.to));
        let ends = ends.chain(self.store_down.iter().map(|s| s.to));
        let ends = ends.chain(self.clock_jumps.iter().map(|(at, ..)| *at));
        // A hung probe ends by HANG_MS after its start, which is after
        // its time; the traffic's end bounds when it can start.
        let ends = ends.chain(self.hung_probes.iter().map(|_| TRAFFIC_MS + HANG_MS));
        ends.chain(self.stalls.iter().map(|(s, _)| s.to))
            .max()
            .unwrap_or(0)
    }

    /// Only poison: the database, the nodes and the rows are fine.
    pub fn poison_only(&self) -> bool {
        self.db.is_empty()
            && self.hot_rows.is_empty()
            && self.crashes.is_empty()
            && self.stalls.is_empty()
            && self.store_down.is_empty()
            && self.clock_jumps.is_empty()
            && self.hung_probes.is_empty()
    }

    /// Whether the fleet store is down at `t`.
    pub fn store_down(&self, t: Ms) -> bool {
        self.store_down.iter().any(|s| s.holds(t))
    }

    /// How far `node`'s wall clock has jumped by `t`.
    pub fn wall_offset_ms(&self, node: usize, t: Ms) -> i64 {
        self.clock_jumps
            .iter()
            .filter(|(at, n, _)| *n == node && *at <= t)
            .map(|(_, _, by)| by)
            .sum()
    }

    pub fn db_fault(&self, t: Ms) -> Option<DbFault> {
        self.db.iter().find(|(s, _)| s.holds(t)).map(|(_, f)| *f)
    }

    /// Until when `key`'s row is locked at `t`, if it is.
    pub fn row_locked_until(&self, key: u32, t: Ms) -> Option<Ms> {
        self.hot_rows
            .iter()
            .filter(|(s, k)| *k == key && s.holds(t))
            .map(|(s, _)| s.to)
            .max()
    }

    /// Whether `node` runs at `t` (not crashed, not stalled).
    pub fn node_runs(&self, node: usize, t: Ms) -> bool {
        !self.crashes.iter().any(|(s, n)| *n == node && s.holds(t))
            && !self.stalls.iter().any(|(s, n)| *n == node && s.holds(t))
    }

    /// Whether `node` crashed at some time in `(after, t]`.
    pub fn crashed_between(&self, node: usize, after: Ms, t: Ms) -> bool {
        self.crashes
            .iter()
            .any(|(s, n)| *n == node && s.from > after && s.from <= t)
    }

    pub fn in_burst(&self, t: Ms) -> bool {
        self.bursts.iter().any(|s| s.holds(t))
    }
}
