//! Hot-path costs: the workers' gate check before each poll, and recording
//! one outcome (plus, for scale, one controller tick).
//!
//! `cargo bench -p breakwater-control --bench gate`

use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_control::{Breaker, BreakerConfig, GateSnapshot, Outcome, SharedGate};
use divan::{Bencher, black_box};

fn main() {
    divan::main();
}

/// One lock-free read of the published gate.
#[divan::bench]
fn gate_load(b: Bencher) {
    let gate = Arc::new(SharedGate::new(GateSnapshot::closed(16)));
    b.bench(|| black_box(&gate).load());
}

/// What a worker does before each poll: read the gate, decide.
#[divan::bench]
fn gate_check(b: Bencher) {
    let breaker = Breaker::with_seed(BreakerConfig::default(), 1, Instant::now());
    let Ok(breaker) = breaker else { return };
    let gate = breaker.shared_gate();
    b.bench(|| {
        let g = black_box(&gate).load();
        g.admits(black_box(3)) && !g.probe_only
    });
}

/// Recording one outcome into the rolling windows, time moving forward.
#[divan::bench]
fn record_outcome(b: Bencher) {
    let t0 = Instant::now();
    let Ok(mut breaker) = Breaker::with_seed(BreakerConfig::default(), 1, t0) else {
        return;
    };
    let mut i: u64 = 0;
    b.bench_local(|| {
        i = i.wrapping_add(1);
        let now = t0 + Duration::from_micros(i % 10_000_000);
        let o = if i & 7 == 0 {
            Outcome::dependency(Duration::from_millis(3))
        } else {
            Outcome::success(Duration::from_millis(3))
        };
        black_box(breaker.record_outcome(o, now))
    });
}

/// One controller tick with every signal fed (not a hot path).
#[divan::bench]
fn evaluate_tick(b: Bencher) {
    let t0 = Instant::now();
    let Ok(mut breaker) = Breaker::with_seed(BreakerConfig::default(), 1, t0) else {
        return;
    };
    for i in 0..1000u64 {
        let now = t0 + Duration::from_millis(i * 50);
        breaker.record_outcome(Outcome::success(Duration::from_millis(3)), now);
    }
    breaker.observe_db_lock_waiters(1, t0 + Duration::from_secs(50));
    let now = t0 + Duration::from_secs(50);
    b.bench_local(|| black_box(breaker.evaluate(now)));
}
