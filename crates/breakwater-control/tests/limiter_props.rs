//! Property tests of the adaptive limiter alone, over random windows:
//!
//! - the limit stays within its floor and ceiling, whatever the calls;
//! - under sustained dependency failure it falls to the floor;
//! - on a steady latency it never changes direction (no oscillation);
//! - against a dependency that queues (latency grows with the calls in
//!   flight) it settles, moving within a small band, below the ceiling.

use std::time::Duration;

use breakwater_control::{LimitReason, Limiter, LimiterConfig};
use proptest::prelude::*;

const WINDOW_MS: u64 = 250;

fn config() -> impl Strategy<Value = LimiterConfig> {
    (1u32..20, 1u32..200, 1.2f64..4.0, 0u64..10).prop_map(|(floor, span, tolerance, slack)| {
        LimiterConfig {
            enabled: true,
            initial_concurrency: 0,
            min_concurrency: floor,
            max_concurrency: floor + span,
            window_ms: WINDOW_MS,
            min_samples: 5,
            tolerance,
            latency_slack_ms: slack,
        }
    })
}

/// One window in which `in_use` calls ran at once on average, each taking
/// `latency` (the first `fastest`), `failed` of them failing.
fn run_window(
    l: &mut Limiter,
    t: &mut u64,
    in_use: f64,
    latency: Duration,
    fastest: Duration,
    failed: u32,
) {
    let per_call = latency.as_secs_f64() * 1000.0;
    let calls = ((in_use * WINDOW_MS as f64) / per_call)
        .round()
        .clamp(5.0, 5_000.0) as u32;
    for i in 0..calls {
        let this = if i == 0 { fastest } else { latency };
        l.record(this, i < failed);
    }
    *t += WINDOW_MS;
    let _ = l.judge(*t);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_limit_stays_within_bounds(
        cfg in config(),
        start in 0u32..400,
        windows in proptest::collection::vec(
            (0.0f64..500.0, 1u64..2_000, 0u64..2_000, 0u32..50, 0u64..1_000),
            1..80,
        ),
    ) {
        let mut t = 0;
        let mut l = Limiter::new(cfg.clone(), start, t);
        for (in_use, lat, fast, failed, extra) in windows {
            let latency = Duration::from_millis(lat);
            let fastest = Duration::from_millis(fast.min(lat));
            run_window(&mut l, &mut t, in_use, latency, fastest, failed);
            t += extra;
            let _ = l.judge(t);
            prop_assert!(l.limit() >= cfg.min_concurrency);
            prop_assert!(l.limit() <= cfg.max_concurrency);
        }
    }

    #[test]
    fn sustained_failure_brings_it_to_the_floor(cfg in config(), start in 1u32..400) {
        let mut t = 0;
        let mut l = Limiter::new(cfg.clone(), start, t);
        let timeout = Duration::from_secs(1);
        // Every call fails, and the failures hold every slot.
        for _ in 0..200 {
            let busy = f64::from(l.limit());
            run_window(&mut l, &mut t, busy, timeout, timeout, u32::MAX);
        }
        prop_assert_eq!(l.limit(), cfg.min_concurrency);
        if start.clamp(cfg.min_concurrency, cfg.max_concurrency) > cfg.min_concurrency {
            prop_assert_eq!(l.status(t).last_change.map(|c| c.reason), Some(LimitReason::Failures));
        }
    }

    #[test]
    fn a_steady_latency_never_makes_it_change_direction(
        cfg in config(),
        start in 1u32..400,
        lat in 1u64..2_000,
        demand in 0.0f64..600.0,
    ) {
        let mut t = 0;
        let mut l = Limiter::new(cfg.clone(), start, t);
        let latency = Duration::from_millis(lat);
        let mut direction = 0i64;
        let mut prev = l.limit();
        for _ in 0..200 {
            // The work waiting keeps min(demand, limit) calls running.
            let busy = demand.min(f64::from(l.limit()));
            run_window(&mut l, &mut t, busy, latency, latency, 0);
            let now = l.limit();
            let d = i64::from(now) - i64::from(prev);
            if d != 0 {
                prop_assert!(direction == 0 || d.signum() == direction, "{prev} -> {now} after moving {direction}");
                direction = d.signum();
            }
            prev = now;
        }
    }

    #[test]
    fn against_a_queueing_dependency_it_settles_below_the_ceiling(
        start in 1u32..100,
        service_ms in 2u64..20,
        servers in 1u32..8,
    ) {
        // A dependency with `servers` parallel servers: beyond them, calls
        // queue, and the mean latency grows with the calls in flight while
        // the fastest call still takes one service time.
        let cfg = LimiterConfig {
            enabled: true,
            initial_concurrency: 0,
            min_concurrency: 1,
            max_concurrency: 200,
            window_ms: WINDOW_MS,
            min_samples: 5,
            tolerance: 2.0,
            latency_slack_ms: 0,
        };
        let mut t = 0;
        let mut l = Limiter::new(cfg, start, t);
        let service = Duration::from_millis(service_ms);
        let mut late = Vec::new();
        for w in 0..300 {
            let n = l.limit();
            let queued = f64::from(n) / f64::from(servers);
            let mean = service.mul_f64(queued.max(1.0));
            run_window(&mut l, &mut t, f64::from(n), mean, service, 0);
            if w >= 200 {
                late.push(l.limit());
            }
        }
        let lo = late.iter().copied().min().unwrap_or(0);
        let hi = late.iter().copied().max().unwrap_or(0);
        // Settled: at most twice the servers, never the ceiling, and it
        // moves within a band no wider than the queue it allows.
        prop_assert!(hi <= 2 * servers + 2, "settled at {lo}..{hi} for {servers} servers");
        prop_assert!(hi - lo <= servers + 2, "swings {lo}..{hi} for {servers} servers");
    }
}
