//! The AWS Architecture Blog's "Exponential Backoff and Jitter" simulation,
//! driven by this crate's [`BackoffPolicy`].
//!
//! Model (as in the blog's simulator): one database row with a version
//! number. Each client reads the version, then writes with the version it
//! read; the write succeeds only if the version is unchanged (optimistic
//! concurrency control). On a conflict the client backs off and starts over.
//! Every message crosses a network with delay `|N(10 ms, 2 ms)|`. Backoff uses
//! base 5 ms and cap 2000 ms; as in the blog, the n-th retry (n from 1) uses
//! exponent n. `calls` counts writes (the work the database does); `time_ms`
//! is when the last client finished. Each point is the mean of 100 runs.
//!
//! It is a discrete-event simulation on virtual time: nothing sleeps, and
//! the whole table takes well under a second in release.
//!
//! `cargo run --release -p breakwater-control --example occ_backoff`

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

use breakwater_control::{BackoffPolicy, Jitter};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Normal};

const RUNS: u32 = 100;
const BASE: Duration = Duration::from_millis(5);
const CAP: Duration = Duration::from_millis(2000);

/// A backoff algorithm of the blog: one of the crate's policies, or none.
#[derive(Clone, Copy)]
enum Algo {
    NoBackoff,
    Policy(&'static str, Jitter),
}

impl Algo {
    fn name(self) -> &'static str {
        match self {
            Self::NoBackoff => "NoBackoff",
            Self::Policy(name, _) => name,
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    /// The read reaches the server.
    Read,
    /// The read's answer reaches the client.
    ReadResp(u64),
    /// The write (with the version read) reaches the server.
    Write(u64),
    /// The write's answer reaches the client.
    WriteResp(bool),
}

struct Event {
    at_ms: f64,
    seq: u64,
    client: usize,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed: `BinaryHeap` is a max-heap, we want the earliest event.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at_ms.total_cmp(&self.at_ms).then(o.seq.cmp(&self.seq))
    }
}

struct Client {
    attempt: u32,
    prev: Option<Duration>,
}

/// One run: returns (writes, completion time in ms).
fn run(clients: usize, algo: Algo, net: &Normal<f64>, rng: &mut SmallRng) -> (u64, f64) {
    let mut queue = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |q: &mut BinaryHeap<Event>, at_ms: f64, client: usize, kind: Kind| {
        seq += 1;
        q.push(Event {
            at_ms,
            seq,
            client,
            kind,
        });
    };
    let mut state: Vec<Client> = (0..clients)
        .map(|_| Client {
            attempt: 0,
            prev: None,
        })
        .collect();
    for c in 0..clients {
        let d = net.sample(rng).abs();
        push(&mut queue, d, c, Kind::Read);
    }
    let (mut version, mut calls, mut now) = (0u64, 0u64, 0.0f64);
    while let Some(ev) = queue.pop() {
        now = ev.at_ms;
        let delay = net.sample(rng).abs();
        match ev.kind {
            Kind::Read => push(&mut queue, now + delay, ev.client, Kind::ReadResp(version)),
            Kind::ReadResp(v) => push(&mut queue, now + delay, ev.client, Kind::Write(v)),
            Kind::Write(v) => {
                calls += 1;
                let ok = v == version;
                if ok {
                    version += 1;
                }
                push(&mut queue, now + delay, ev.client, Kind::WriteResp(ok));
            }
            Kind::WriteResp(true) => {}
            Kind::WriteResp(false) => {
                let Some(c) = state.get_mut(ev.client) else {
                    continue;
                };
                c.attempt += 1;
                let sleep = match algo {
                    Algo::NoBackoff => Duration::ZERO,
                    Algo::Policy(_, kind) => {
                        let p = BackoffPolicy {
                            kind,
                            base: BASE,
                            cap: CAP,
                        };
                        let d = p.delay(c.attempt, c.prev, rng);
                        c.prev = Some(d);
                        d
                    }
                };
                let at = now + delay + sleep.as_secs_f64() * 1000.0;
                push(&mut queue, at, ev.client, Kind::Read);
            }
        }
    }
    (calls, now)
}

fn main() {
    let algos = [
        Algo::Policy("Exponential", Jitter::None),
        Algo::Policy("Decorrelated", Jitter::Decorrelated),
        Algo::Policy("EqualJitter", Jitter::Equal),
        Algo::Policy("FullJitter", Jitter::Full),
        Algo::NoBackoff,
    ];
    let Ok(net) = Normal::new(10.0, 2.0) else {
        eprintln!("bad network model");
        return;
    };
    let mut rng = SmallRng::seed_from_u64(2015);
    println!("clients,algorithm,calls,time_ms");
    for clients in [10, 20, 30, 40, 50, 100] {
        for algo in algos {
            let (mut calls, mut time) = (0u64, 0.0f64);
            for _ in 0..RUNS {
                let (c, t) = run(clients, algo, &net, &mut rng);
                calls += c;
                time += t;
            }
            let runs = f64::from(RUNS);
            println!(
                "{clients},{},{:.1},{:.1}",
                algo.name(),
                calls as f64 / runs,
                time / runs
            );
        }
    }
}
