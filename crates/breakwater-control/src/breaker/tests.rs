//! Unit tests of the state machine: every transition and every signal,
//! driven through the public methods with a hand-made clock.

use std::time::{Duration, Instant};

use super::*;
use crate::signals::heartbeats::WorkerState;

const FAST: Duration = Duration::from_millis(5);

/// The defaults with a pinned cool-down (10 s, doubling, cap 300 s) and a
/// 60 s failure window, so the timing assertions below do not move when the
/// defaults are tuned.
fn cfg() -> BreakerConfig {
    BreakerConfig {
        max_concurrency: 100,
        failure_ratio: crate::config::FailureRatioConfig {
            window_secs: 60,
            ..crate::config::FailureRatioConfig::default()
        },
        cool_down: crate::config::CoolDownConfig {
            base_ms: 10_000,
            cap_ms: 300_000,
            jitter: 0.2,
        },
        // At the full limit from the start, no slow start: the tests of
        // the start say otherwise where they need to.
        limiter: crate::config::LimiterConfig {
            initial_concurrency: 0,
            ..crate::config::LimiterConfig::default()
        },
        ..BreakerConfig::default()
    }
}

/// A breaker plus a clock.
struct H {
    b: Breaker,
    now: Instant,
}

impl H {
    fn new(cfg: BreakerConfig) -> Self {
        let now = Instant::now();
        let b = Breaker::with_seed(cfg, 42, now).expect("valid config");
        Self { b, now }
    }

    fn advance(&mut self, ms: u64) -> Instant {
        self.now += Duration::from_millis(ms);
        self.now
    }

    fn tick(&mut self, ms: u64) -> Option<Transition> {
        let now = self.advance(ms);
        self.b.evaluate(now)
    }

    /// `n` calls that ran side by side, each taking `o.latency`, starting
    /// now: the clock moves on by that latency.
    fn outcomes(&mut self, n: usize, o: Outcome) {
        let now = self.advance(u64::try_from(o.latency.as_millis()).expect("ms"));
        for _ in 0..n {
            self.b.record_outcome(o, now);
        }
    }

    /// Closed/ramping -> open through the failure ratio.
    fn trip(&mut self) -> Transition {
        self.outcomes(30, Outcome::dependency(FAST));
        self.tick(100).expect("trips")
    }

    /// Open -> half-open, ticking each 100 ms; returns how long it took.
    fn wait_half_open(&mut self) -> Duration {
        let start = self.now;
        for _ in 0..100_000 {
            if let Some(t) = self.tick(100) {
                assert_eq!((t.from, t.to), (State::Open, State::HalfOpen));
                return self.now - start;
            }
        }
        panic!("never left open");
    }

    /// Half-open -> ramping with successful probes.
    fn probes_succeed(&mut self) -> Transition {
        for _ in 0..self.b.config().half_open.successes_to_close {
            let ticket = self.b.try_admit_probe(self.now).expect("slot");
            if let Some(t) = self
                .b
                .record_probe_outcome(ticket, Outcome::success(FAST), self.now)
            {
                return t;
            }
        }
        panic!("probes did not close");
    }

    /// A breaker that tripped, cooled down and passed its probes: at the
    /// first step of the ramp, with clean windows.
    fn ramping(cfg: BreakerConfig) -> Self {
        let mut h = Self::new(cfg);
        h.trip();
        h.wait_half_open();
        h.probes_succeed();
        assert_eq!(h.b.state(), State::Ramping);
        h
    }

    fn cool_down_ms(&self) -> u64 {
        self.b.status(self.now).cool_down.map_or(0, |c| c.total_ms)
    }
}

#[test]
fn starts_closed_at_the_limiters_initial_limit() {
    let mut c = cfg();
    c.limiter.initial_concurrency = 4;
    let h = H::new(c);
    let g = h.b.gate();
    assert_eq!(g, GateSnapshot::closed(4), "limiter.initial_concurrency");
    assert_eq!(h.b.shared_gate().load(), g);
    assert_eq!(h.b.state(), State::Closed);
    assert_eq!(h.b.status(h.now).limiter.map(|l| l.limit), Some(4));
}

#[test]
fn starts_at_full_limit_with_no_initial_limit_the_limiter_off_or_in_dry_run() {
    let mut off = cfg();
    off.limiter.enabled = false;
    off.limiter.initial_concurrency = 4;
    let mut dry = cfg();
    dry.dry_run = true;
    dry.limiter.initial_concurrency = 4;
    for c in [cfg(), off, dry] {
        let h = H::new(c);
        assert_eq!(h.b.gate(), GateSnapshot::closed(100));
        assert_eq!(h.b.shared_gate().load(), h.b.gate());
    }
}

#[test]
fn invalid_config_is_refused() {
    let mut c = cfg();
    c.max_concurrency = 0;
    let e = Breaker::new(c, Instant::now()).err();
    assert_eq!(e.map(|e| e.key()), Some("max_concurrency"));
}

#[test]
fn failure_ratio_opens_with_a_reason_naming_value_and_threshold() {
    let mut h = H::new(cfg());
    h.outcomes(33, Outcome::success(FAST));
    h.outcomes(24, Outcome::dependency(FAST));
    let t = h.tick(100).expect("trips");
    assert_eq!((t.from, t.to), (State::Closed, State::Open));
    assert_eq!(
        t.reason.to_string(),
        "failure ratio 0.42 > 0.15 over 60 s, 57 calls"
    );
    assert_eq!(t.limit, 0);
    assert!(!t.dry_run);
    let g = h.b.shared_gate().load();
    assert!(!g.may_poll);
    assert_eq!(g.state, State::Open);
    assert_eq!(g.limit, 0);
    assert_eq!(g.generation, 1);
}

#[test]
fn recording_alone_does_not_trip_the_tick_does() {
    let mut h = H::new(cfg());
    for _ in 0..50 {
        assert_eq!(h.b.record_outcome(Outcome::dependency(FAST), h.now), None);
    }
    assert_eq!(h.b.state(), State::Closed);
    assert!(h.tick(100).is_some());
}

#[test]
fn a_thousand_poison_messages_do_not_trip() {
    let mut h = H::new(cfg());
    let mut total = 0;
    for i in 0..1000 {
        h.b.record_outcome(Outcome::permanent(FAST), h.now);
        if i % 100 == 0 {
            h.b.observe_queue(
                QueueSample {
                    visible: 0,
                    in_flight: 1,
                    dead_lettered_total: total,
                    processed_total: total,
                    delayed: 0,
                },
                h.now,
            );
            assert_eq!(h.tick(100), None);
        }
        total += 1;
    }
    h.b.observe_queue(
        QueueSample {
            dead_lettered_total: total,
            processed_total: total,
            ..QueueSample::default()
        },
        h.now,
    );
    assert_eq!(h.tick(100), None);
    let s = h.b.status(h.now);
    assert_eq!(s.state, State::Closed);
    // The DLQ signal sees them (1000 / 60 s) but is disabled by default.
    let dlq = s
        .signals
        .iter()
        .find(|x| x.signal == SignalKind::DlqVelocity);
    assert!(dlq.is_some_and(|d| !d.enabled && d.value.is_some_and(|v| v > 16.0)));
}

#[test]
fn cool_down_then_half_open() {
    let mut h = H::new(cfg());
    h.trip();
    let cd = h.cool_down_ms();
    assert!((8_000..=10_000).contains(&cd), "{cd}");
    let waited = h.wait_half_open();
    assert!(waited >= Duration::from_millis(cd));
    assert!(waited < Duration::from_millis(cd + 200));
    let g = h.b.gate();
    assert!(g.may_poll && g.probe_only);
    assert_eq!(g.limit, 1);
    let last = h.b.history().last().map(|t| t.reason.to_string());
    assert!(last.is_some_and(|r| r.starts_with("cool-down of ")));
}

#[test]
fn half_open_never_admits_more_than_n_probes() {
    let mut c = cfg();
    c.half_open.max_probes = 2;
    c.half_open.successes_to_close = 5;
    let mut h = H::new(c);
    assert_eq!(h.b.try_admit_probe(h.now), None, "closed: no probes");
    h.trip();
    assert_eq!(h.b.try_admit_probe(h.now), None, "open: no probes");
    h.wait_half_open();
    let a = h.b.try_admit_probe(h.now);
    let b = h.b.try_admit_probe(h.now);
    assert!(a.is_some() && b.is_some());
    assert_eq!(h.b.try_admit_probe(h.now), None);
    assert_eq!(h.b.outstanding_probes(), 2);
    let a = a.expect("admitted");
    assert_eq!(
        h.b.record_probe_outcome(a, Outcome::success(FAST), h.now),
        None
    );
    // Reporting the same ticket twice frees nothing and counts nothing.
    assert_eq!(
        h.b.record_probe_outcome(a, Outcome::success(FAST), h.now),
        None
    );
    assert_eq!(h.b.status(h.now).half_open.map(|x| x.successes), Some(1));
    assert!(h.b.try_admit_probe(h.now).is_some());
    assert_eq!(h.b.try_admit_probe(h.now), None);
}

#[test]
fn probe_successes_start_the_ramp_which_walks_10_25_50_100_then_closes() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    let t = h.probes_succeed();
    assert_eq!((t.from, t.to), (State::HalfOpen, State::Ramping));
    assert_eq!(t.reason.to_string(), "3 consecutive probe successes");
    let mut limits = vec![h.b.gate().limit];
    let mut reasons = vec![];
    loop {
        // A second a round: the calls' 5 ms and the tick's 995.
        h.outcomes(5, Outcome::success(FAST));
        match h.tick(995) {
            None => continue,
            Some(t) => {
                reasons.push(t.reason.to_string());
                limits.push(h.b.gate().limit);
                if t.to == State::Closed {
                    break;
                }
                assert_eq!((t.from, t.to), (State::Ramping, State::Ramping));
            }
        }
    }
    assert_eq!(limits, vec![10, 25, 50, 100, 100]);
    assert_eq!(reasons[0], "ramp 10% -> 25% after 30.0 s healthy");
    assert_eq!(
        reasons[3],
        "ramp complete after 30.0 s healthy on the last step"
    );
    let s = h.b.status(h.now);
    assert_eq!(s.state, State::Closed);
    assert_eq!(s.opens_since_close, 0);
    assert!(!h.b.gate().probe_only);
}

/// A breaker whose limiter learned a no-load latency of `base` while
/// closed, then tripped and passed its probes: at the ramp's first step.
fn ramping_after_learning(base: Duration) -> H {
    let mut h = H::new(cfg());
    for _ in 0..3 {
        h.outcomes(20, Outcome::success(base));
        h.advance(250);
        h.b.adjust_limit(h.now);
    }
    h.trip();
    h.wait_half_open();
    h.probes_succeed();
    assert_eq!(h.b.gate().limit, 10);
    h
}

/// Every 100 ms, 10 calls of `latency` for each 100 ms of it running (the
/// step's whole limit of 10 in use) until the ramp moves: the transition
/// and how long the step was held.
fn run_step(h: &mut H, latency: Duration) -> (Transition, Duration) {
    let start = h.now;
    let n = usize::try_from(1_000 / latency.as_millis().max(1)).expect("fits");
    loop {
        h.outcomes(n, Outcome::success(latency));
        let rest = 100u64.saturating_sub(u64::try_from(latency.as_millis()).expect("ms"));
        if let Some(t) = h.tick(rest.max(1)) {
            return (t, h.now - start);
        }
        assert!(
            h.now - start < Duration::from_secs(60),
            "the step never ended"
        );
    }
}

#[test]
fn a_ramp_step_in_use_at_the_learned_latency_ends_after_min_hold() {
    let base = Duration::from_millis(20);
    let mut h = ramping_after_learning(base);
    let (t, held) = run_step(&mut h, base);
    assert_eq!((t.from, t.to), (State::Ramping, State::Ramping), "{t:?}");
    assert!(
        held >= Duration::from_secs(2) && held < Duration::from_secs(3),
        "held {held:?}, min_hold_ms 2000"
    );
    assert_eq!(h.b.gate().limit, 25);
    // The next step proves itself afresh: 25 running now.
    let (_, held) = run_step(&mut h, base);
    assert!(held >= Duration::from_secs(2), "held {held:?}");
    assert_eq!(h.b.gate().limit, 50);
}

#[test]
fn a_ramp_step_whose_calls_are_slow_waits_out_its_hold() {
    let mut h = ramping_after_learning(Duration::from_millis(20));
    // 50 ms against a 20 ms baseline: over 2 x 20 + 5.
    let (t, held) = run_step(&mut h, Duration::from_millis(50));
    assert_eq!((t.from, t.to), (State::Ramping, State::Ramping), "{t:?}");
    assert!(held >= Duration::from_secs(30), "held {held:?}");
}

#[test]
fn with_min_hold_at_the_hold_every_step_waits_it_out() {
    let mut c = cfg();
    c.ramp.min_hold_ms = c.ramp.hold_ms;
    let mut h = H::new(c);
    for _ in 0..3 {
        h.outcomes(20, Outcome::success(Duration::from_millis(20)));
        h.advance(250);
        h.b.adjust_limit(h.now);
    }
    h.trip();
    h.wait_half_open();
    h.probes_succeed();
    let (_, held) = run_step(&mut h, Duration::from_millis(20));
    assert!(held >= Duration::from_secs(30), "held {held:?}");
}

#[test]
fn failure_in_ramp_reopens_with_a_longer_cool_down() {
    let mut h = H::new(cfg());
    h.trip();
    let first = h.cool_down_ms();
    h.wait_half_open();
    h.probes_succeed();
    h.tick(10_000);
    assert_eq!(h.b.state(), State::Ramping);
    let t = h.trip();
    assert_eq!((t.from, t.to), (State::Ramping, State::Open));
    let second = h.cool_down_ms();
    assert!((16_000..=20_000).contains(&second), "{second}");
    assert!(second > first);
    // Third opening: longer again.
    h.wait_half_open();
    h.probes_succeed();
    h.trip();
    let third = h.cool_down_ms();
    assert!((32_000..=40_000).contains(&third), "{third}");
}

#[test]
fn a_failure_among_the_ramps_first_calls_reopens_at_a_trickle_of_traffic() {
    let mut h = H::ramping(cfg());
    // One call a second: far below the 20 calls the window wants in closed.
    for _ in 0..3 {
        h.outcomes(1, Outcome::success(FAST));
        assert_eq!(h.tick(1_000), None);
    }
    h.outcomes(1, Outcome::dependency(FAST));
    let t = h
        .tick(1_000)
        .expect("1 failure in 4 calls re-opens the ramp");
    assert_eq!((t.from, t.to), (State::Ramping, State::Open));
    assert!(t.reason.to_string().contains("4 calls"), "{}", t.reason);
}

#[test]
fn in_the_ramp_one_failure_is_judged_as_a_ratio_not_alone() {
    let mut h = H::ramping(cfg());
    h.outcomes(9, Outcome::success(FAST));
    h.outcomes(1, Outcome::dependency(FAST));
    assert_eq!(h.tick(100), None, "1 failure in 10 calls is 10%");
    assert_eq!(h.b.state(), State::Ramping);
    h.outcomes(1, Outcome::dependency(FAST));
    let t = h.tick(100).expect("2 in 11 is 18%");
    assert_eq!((t.from, t.to), (State::Ramping, State::Open));
}

#[test]
fn a_call_that_began_before_the_ramp_does_not_reopen_it() {
    let mut h = H::ramping(cfg());
    // Still running when the breaker opened, a minute ago.
    let now = h.now;
    h.b.record_outcome(Outcome::dependency(Duration::from_secs(60)), now);
    assert_eq!(h.tick(100), None);
    assert_eq!(h.b.state(), State::Ramping);
    // One that began in the ramp does.
    h.outcomes(1, Outcome::dependency(FAST));
    let t = h.tick(100).expect("re-opens");
    assert_eq!((t.from, t.to), (State::Ramping, State::Open));
}

#[test]
fn a_late_probe_of_the_ended_half_open_does_not_reopen_the_ramp() {
    let mut c = cfg();
    c.half_open.max_probes = 4;
    c.half_open.successes_to_close = 3;
    let mut h = H::new(c);
    h.trip();
    h.wait_half_open();
    let late = h.b.try_admit_probe(h.now).expect("slot");
    h.advance(5);
    h.probes_succeed();
    assert_eq!(h.b.state(), State::Ramping);
    let now = h.advance(5);
    assert_eq!(
        h.b.record_probe_outcome(late, Outcome::dependency(Duration::from_millis(10)), now),
        None
    );
    assert_eq!(h.tick(100), None, "it began before the ramp");
    assert_eq!(h.b.state(), State::Ramping);
}

#[test]
fn closed_still_waits_for_min_calls() {
    let mut h = H::new(cfg());
    h.outcomes(3, Outcome::success(FAST));
    h.outcomes(1, Outcome::dependency(FAST));
    assert_eq!(h.tick(100), None, "4 calls are below min_calls in closed");
    assert_eq!(h.b.state(), State::Closed);
}

#[test]
fn cool_down_is_capped_and_reset_after_a_full_close() {
    let mut c = cfg();
    c.cool_down.cap_ms = 25_000;
    let mut h = H::new(c);
    h.trip();
    for _ in 0..5 {
        h.wait_half_open();
        let ticket = h.b.try_admit_probe(h.now).expect("slot");
        let t =
            h.b.record_probe_outcome(ticket, Outcome::dependency(FAST), h.now);
        assert_eq!(t.map(|t| t.reason), Some(Reason::ProbeFailed));
        assert!(h.cool_down_ms() <= 25_000);
    }
    assert!(h.cool_down_ms() >= 20_000);
    // Full close, then a new trip starts from the base again.
    h.wait_half_open();
    h.probes_succeed();
    while h.b.state() != State::Closed {
        h.tick(1_000);
    }
    h.tick(61_000);
    h.trip();
    assert!(h.cool_down_ms() <= 10_000);
}

#[test]
fn probe_failure_reopens_at_once() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    let ticket = h.b.try_admit_probe(h.now).expect("slot");
    let t =
        h.b.record_probe_outcome(ticket, Outcome::dependency(FAST), h.now)
            .expect("re-opens");
    assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
    assert!(!h.b.gate().may_poll);
    assert!(h.cool_down_ms() >= 16_000);
}

#[test]
fn permanent_probe_outcome_is_neutral() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    let ticket = h.b.try_admit_probe(h.now).expect("slot");
    let t =
        h.b.record_probe_outcome(ticket, Outcome::permanent(FAST), h.now);
    assert_eq!(t, None);
    assert_eq!(h.b.state(), State::HalfOpen);
    assert_eq!(h.b.outstanding_probes(), 0);
    assert_eq!(h.b.status(h.now).half_open.map(|x| x.successes), Some(0));
}

#[test]
fn unanswered_probe_times_out_as_failed() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    // No probe outstanding: half-open waits for traffic as long as needed.
    assert_eq!(h.tick(60_000), None);
    let ticket = h.b.try_admit_probe(h.now).expect("slot");
    assert_eq!(h.tick(29_900), None);
    let t = h.tick(100).expect("times out");
    assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
    assert_eq!(
        t.reason.to_string(),
        "half-open probe unanswered after 30.0 s"
    );
    // The late answer of that probe changes nothing.
    let late =
        h.b.record_probe_outcome(ticket, Outcome::success(FAST), h.now);
    assert_eq!(late, None);
    assert_eq!(h.b.state(), State::Open);
}

#[test]
fn stale_ticket_from_an_earlier_half_open_is_ignored() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    let old = h.b.try_admit_probe(h.now).expect("slot");
    h.b.observe_db_lock_waiters(50, h.now);
    let t = h.tick(100).expect("signal re-opens half-open");
    assert_eq!(t.reason.to_string(), "database lock waiters 50 > 10");
    h.advance(20_000); // the sample goes stale
    h.wait_half_open();
    assert_eq!(
        h.b.record_probe_outcome(old, Outcome::dependency(FAST), h.now),
        None
    );
    assert_eq!(h.b.state(), State::HalfOpen);
    assert!(h.b.try_admit_probe(h.now).is_some());
}

#[test]
fn evidence_that_opened_the_breaker_does_not_reopen_it() {
    let mut h = H::new(cfg());
    h.trip(); // 30 failures sit in the 60 s window
    h.wait_half_open();
    assert_eq!(h.tick(100), None);
    h.probes_succeed();
    assert_eq!(h.tick(100), None, "ramp starts with clean windows");
    assert_eq!(h.b.state(), State::Ramping);
}

#[test]
fn empty_ramp_closes_at_once() {
    let mut c = cfg();
    c.ramp.steps.clear();
    let mut h = H::new(c);
    h.trip();
    h.wait_half_open();
    let t = h.probes_succeed();
    assert_eq!((t.from, t.to), (State::HalfOpen, State::Closed));
    assert_eq!(h.b.gate().limit, 100);
}

#[test]
fn slow_calls_trip_once_the_ratio_has_held_for_sustain_ms() {
    let mut h = H::new(cfg());
    h.outcomes(10, Outcome::success(Duration::from_millis(6_000)));
    h.outcomes(10, Outcome::success(FAST));
    assert_eq!(h.tick(100), None, "0.5 is not > 0.5");
    h.outcomes(1, Outcome::success(Duration::from_millis(6_000)));
    assert_eq!(h.tick(100), None, "above the threshold, not yet for 2 s");
    assert_eq!(h.tick(1_999), None, "1,999 ms of 2,000");
    let t = h.tick(1).expect("trips after 2 s above the threshold");
    assert_eq!(
        t.reason.to_string(),
        "slow-call ratio 0.52 > 0.50 (calls > 5000 ms) over 60 s, 21 calls, held 2000 ms"
    );
}

#[test]
fn a_slow_call_ratio_that_falls_back_before_sustain_ms_does_not_trip() {
    // The limiter's cut brought the calls back: the run above the
    // threshold ends, and a later one counts from its own start.
    let mut h = H::new(cfg());
    h.outcomes(11, Outcome::success(Duration::from_millis(6_000)));
    h.outcomes(10, Outcome::success(FAST));
    assert_eq!(h.tick(100), None);
    assert_eq!(h.tick(1_500), None, "held 1.5 s");
    h.outcomes(2, Outcome::success(FAST));
    assert_eq!(h.tick(100), None, "11 of 23: back under");
    h.outcomes(3, Outcome::success(Duration::from_millis(6_000)));
    assert_eq!(h.tick(100), None, "14 of 26: above again, from now");
    assert_eq!(h.tick(1_900), None, "held 1.9 s of the new run");
    assert!(h.tick(100).is_some(), "held 2 s");
}

#[test]
fn a_sustain_of_zero_trips_on_the_first_tick_above_the_threshold() {
    let mut c = cfg();
    c.slow_calls.sustain_ms = 0;
    let mut h = H::new(c);
    h.outcomes(11, Outcome::success(Duration::from_millis(6_000)));
    h.outcomes(10, Outcome::success(FAST));
    let t = h.tick(100).expect("trips at once");
    assert!(t.reason.to_string().ends_with("held 0 ms"), "{}", t.reason);
}

#[test]
fn dlq_velocity_trips_when_enabled() {
    let mut c = cfg();
    c.dlq.enabled = true;
    let mut h = H::new(c);
    h.b.observe_queue(QueueSample::default(), h.now);
    h.advance(1_000);
    h.b.observe_queue(
        QueueSample {
            dead_lettered_total: 301,
            processed_total: 301,
            ..QueueSample::default()
        },
        h.now,
    );
    let t = h.tick(100).expect("trips");
    assert_eq!(
        t.reason.to_string(),
        "DLQ velocity 5.02/s > 5.00/s over 60 s"
    );
}

/// Feeds one queue sample per second and ticks.
fn queue_run(h: &mut H, secs: u64, rate: u64, visible: u64, in_flight: u64, total: &mut u64) {
    for _ in 0..secs {
        *total += rate;
        h.b.observe_queue(
            QueueSample {
                visible,
                in_flight,
                dead_lettered_total: 0,
                processed_total: *total,
                delayed: 0,
            },
            h.now,
        );
        if let Some(t) = h.tick(1_000) {
            panic!("unexpected {t}");
        }
    }
}

#[test]
fn drained_queue_with_high_in_flight_ratio_does_not_trip() {
    let mut h = H::new(cfg());
    let mut total = 0;
    queue_run(&mut h, 120, 40, 0, 10, &mut total);
    queue_run(&mut h, 60, 1, 0, 2, &mut total); // quiet night, still drained
    let s = h.b.status(h.now);
    let sig = s.signals.iter().find(|x| x.signal == SignalKind::InFlight);
    assert!(sig.is_some_and(|x| x.value == Some(1.0) && !x.tripping));
    assert_eq!(s.state, State::Closed);
}

#[test]
fn in_flight_pile_up_with_collapsed_throughput_trips() {
    let mut h = H::new(cfg());
    let mut total = 0;
    queue_run(&mut h, 120, 40, 20, 10, &mut total);
    let mut tripped = None;
    for _ in 0..60 {
        total += 1;
        h.b.observe_queue(
            QueueSample {
                visible: 20,
                in_flight: 500,
                dead_lettered_total: 0,
                processed_total: total,
                delayed: 0,
            },
            h.now,
        );
        if let Some(t) = h.tick(1_000) {
            tripped = Some(t);
            break;
        }
    }
    let t = tripped.expect("trips");
    assert!(matches!(t.reason, Reason::InFlight { .. }), "{}", t.reason);
    assert!(
        t.reason
            .to_string()
            .starts_with("in-flight ratio 0.96 > 0.85")
    );
}

fn lock_wait(ms: u64) -> WorkerState {
    WorkerState::LockWait {
        waited: Duration::from_millis(ms),
    }
}

#[test]
fn lock_wait_heartbeats_trip_and_stale_ones_expire() {
    let mut h = H::new(cfg());
    let now = h.now;
    let beats: Vec<Heartbeat> = (0..10)
        .map(|w| Heartbeat {
            worker: w,
            state: if w < 4 {
                lock_wait(2_500)
            } else {
                WorkerState::Applying
            },
            at: now,
        })
        .collect();
    h.b.observe_heartbeats(&beats, now);
    let t = h.tick(100).expect("4 of 10 > 30%");
    assert_eq!(
        t.reason.to_string(),
        "lock waits: 4 of 10 live workers (40%) waiting > 2000 ms, threshold 30%"
    );

    // Fresh breaker: the same beats, but 11 s old, are ignored on arrival;
    // beats that age out later stop counting.
    let mut h = H::new(cfg());
    let old = h.now;
    h.advance(11_000);
    h.b.observe_heartbeats(
        &beats
            .iter()
            .map(|b| Heartbeat { at: old, ..*b })
            .collect::<Vec<_>>(),
        h.now,
    );
    assert_eq!(h.tick(100), None);
    let now = h.now;
    h.b.observe_heartbeats(
        &beats
            .iter()
            .map(|b| Heartbeat { at: now, ..*b })
            .collect::<Vec<_>>(),
        now,
    );
    h.advance(10_001);
    assert_eq!(h.b.evaluate(h.now), None);
    let s = h.b.status(h.now);
    let sig = s.signals.iter().find(|x| x.signal == SignalKind::LockWait);
    assert!(sig.is_some_and(|x| x.value.is_none()));
}

#[test]
fn db_lock_waiters_trip() {
    let mut h = H::new(cfg());
    h.b.observe_db_lock_waiters(10, h.now);
    assert_eq!(h.tick(100), None);
    h.b.observe_db_lock_waiters(11, h.now);
    let t = h.tick(100).expect("trips");
    assert_eq!(t.reason.to_string(), "database lock waiters 11 > 10");
}

#[test]
fn force_open_with_ttl_expires_into_half_open() {
    let mut h = H::new(cfg());
    let t =
        h.b.force_open("migration", Some(Duration::from_secs(60)), h.now);
    assert_eq!((t.from, t.to), (State::Closed, State::Open));
    assert_eq!(
        t.reason.to_string(),
        "forced open by operator (migration) for 60 s"
    );
    assert!(!h.b.shared_gate().load().may_poll);
    // Nothing automatic happens while forced, even past the cool-down.
    assert_eq!(h.tick(59_000), None);
    assert_eq!(h.b.try_admit_probe(h.now), None);
    let s = h.b.status(h.now);
    assert_eq!(
        s.manual_override.map(|o| (o.kind, o.remaining_ms)),
        Some((OverrideKind::Open, Some(1_000)))
    );
    let t = h.tick(1_000).expect("expires");
    assert_eq!(
        (t.from, t.to, t.reason),
        (State::Open, State::HalfOpen, Reason::OverrideExpired)
    );
    assert!(h.b.status(h.now).manual_override.is_none());
    assert!(h.b.try_admit_probe(h.now).is_some());
}

#[test]
fn force_closed_ignores_signals_until_it_expires() {
    let mut h = H::new(cfg());
    h.trip();
    let t = h.b.force_closed(Some(Duration::from_secs(30)), h.now);
    assert_eq!((t.from, t.to), (State::Open, State::Closed));
    assert_eq!(h.b.gate().limit, 100);
    h.outcomes(50, Outcome::dependency(FAST));
    assert_eq!(
        h.tick(100),
        None,
        "forced closed: signals reported, not acted on"
    );
    let s = h.b.status(h.now);
    assert!(
        s.signals
            .iter()
            .any(|x| x.signal == SignalKind::FailureRatio && x.tripping)
    );
    let t = h.tick(29_900).expect("expires");
    assert_eq!((t.to, t.reason), (State::Closed, Reason::OverrideExpired));
    let t = h.tick(100).expect("automatic control trips");
    assert_eq!(t.to, State::Open);
}

#[test]
fn clear_override_resumes_at_once() {
    let mut h = H::new(cfg());
    assert_eq!(h.b.clear_override(h.now), None);
    h.b.force_open("", None, h.now);
    assert_eq!(h.tick(3_600_000), None, "no TTL: held until cleared");
    let t = h.b.clear_override(h.now).expect("cleared");
    assert_eq!((t.to, t.reason), (State::HalfOpen, Reason::OverrideCleared));
    assert_eq!(
        h.b.history().next().map(|t| t.reason.to_string()),
        Some("forced open by operator until cleared".into())
    );
}

#[test]
fn clearing_a_forced_open_with_an_empty_queue_closes_at_once() {
    let mut h = H::new(cfg());
    h.b.force_open("maintenance", None, h.now);
    // Nothing queued, nothing in flight: there is nothing to probe with.
    h.b.observe_queue(QueueSample::default(), h.now);
    let t = h.b.clear_override(h.now).expect("cleared");
    assert_eq!(
        (t.to, t.reason),
        (State::Closed, Reason::OverrideClearedIdle)
    );
    assert_eq!(h.b.status(h.now).waiting_for, None);

    // With a backlog it probes first, and says what it waits for.
    let mut h = H::new(cfg());
    h.b.force_open("maintenance", None, h.now);
    h.b.observe_queue(
        QueueSample {
            visible: 40,
            ..QueueSample::default()
        },
        h.now,
    );
    let t = h.b.clear_override(h.now).expect("cleared");
    assert_eq!(t.to, State::HalfOpen);
    let waiting = h.b.status(h.now).waiting_for.expect("waiting");
    assert!(waiting.contains("probe success"), "{waiting}");
}

#[test]
fn messages_waiting_for_a_delay_are_not_an_empty_queue() {
    let mut h = H::new(cfg());
    h.b.force_open("maintenance", None, h.now);
    h.b.observe_queue(
        QueueSample {
            delayed: 12,
            ..QueueSample::default()
        },
        h.now,
    );
    let t = h.b.clear_override(h.now).expect("cleared");
    assert_eq!(
        t.to,
        State::HalfOpen,
        "retries are coming back: probe first"
    );
}

#[test]
fn an_unreachable_dependency_holds_it_open_and_an_override_wins_meanwhile() {
    let mut h = H::new(cfg());
    let t = h.b.dependency_unreachable("refused", h.now).expect("opens");
    assert_eq!(t.to, State::Open);
    assert_eq!(h.tick(3_600_000), None, "held while unreachable");
    assert!(
        h.b.status(h.now)
            .waiting_for
            .expect("waiting")
            .contains("refused")
    );
    let t = h.b.dependency_reachable(h.now).expect("reachable");
    assert_eq!((t.to, t.reason), (State::HalfOpen, Reason::Reachable));

    // Under a forced close the operator wins; when it ends, the hold applies.
    let mut h = H::new(cfg());
    h.b.force_closed(None, h.now);
    assert_eq!(h.b.dependency_unreachable("refused", h.now), None);
    assert_eq!(h.b.state(), State::Closed);
    let t = h.b.clear_override(h.now).expect("cleared");
    assert_eq!(t.to, State::Open);
    assert!(
        matches!(t.reason, Reason::Unreachable { .. }),
        "{:?}",
        t.reason
    );
}

#[test]
fn a_fleet_slot_of_another_period_admits_no_probe() {
    let mut h = H::new(cfg());
    h.trip();
    h.wait_half_open();
    let (period, _) = h.b.probe_period().expect("half-open");
    assert_eq!(h.b.try_admit_probe_in(period + 1, h.now), None);
    assert!(h.b.try_admit_probe_in(period, h.now).is_some());
}

#[test]
fn dry_run_reports_but_never_gates() {
    let mut c = cfg();
    c.dry_run = true;
    let mut h = H::new(c);
    let gate = h.b.shared_gate();
    let t = h.trip();
    assert!(t.dry_run);
    assert_eq!(t.to_string().split(": ").next(), Some("closed -> open"));
    assert!(t.to_string().ends_with("[dry run]"));
    assert_eq!(h.b.state(), State::Open);
    assert_eq!(gate.load(), GateSnapshot::closed(100));
    assert_eq!(h.b.status(h.now).gate, GateSnapshot::closed(100));
    h.wait_half_open();
    assert_eq!(h.b.try_admit_probe(h.now), None, "workers are not gated");
    // Ordinary outcomes count as the shadow probes.
    h.outcomes(2, Outcome::success(FAST));
    let t =
        h.b.record_outcome(Outcome::success(FAST), h.now)
            .expect("would ramp");
    assert_eq!((t.to, t.dry_run), (State::Ramping, true));
    assert_eq!(gate.load(), GateSnapshot::closed(100));
    // A manual trip is enforced even in dry-run mode.
    let t = h.b.force_open("incident", None, h.now);
    assert!(!t.dry_run);
    assert!(!gate.load().may_poll);
    h.b.clear_override(h.now);
    assert!(gate.load().may_poll);
    assert_eq!(gate.load().limit, 100);
}

#[test]
fn history_is_bounded() {
    let mut c = cfg();
    c.history_len = 3;
    let mut h = H::new(c);
    for _ in 0..5 {
        h.b.force_open("x", None, h.now);
        h.b.clear_override(h.now);
    }
    assert_eq!(h.b.history().len(), 3);
    let s = h.b.status(h.now);
    assert_eq!(s.history.len(), 3);
    assert_eq!(
        s.message.as_deref(),
        Some("manual override cleared; automatic control resumes")
    );
}

#[test]
fn status_shows_every_signal_with_value_and_threshold() {
    let mut h = H::new(cfg());
    h.outcomes(20, Outcome::success(FAST));
    h.b.observe_db_lock_waiters(3, h.now);
    let s = h.b.status(h.now);
    let kinds: Vec<_> = s.signals.iter().map(|x| x.signal).collect();
    assert_eq!(
        kinds,
        vec![
            SignalKind::FailureRatio,
            SignalKind::SlowCalls,
            SignalKind::DlqVelocity,
            SignalKind::InFlight,
            SignalKind::LockWait,
            SignalKind::DbLockWaiters
        ]
    );
    let fr = &s.signals[0];
    assert_eq!((fr.value, fr.threshold), (Some(0.0), 0.15));
    let db = &s.signals[5];
    assert_eq!((db.value, db.threshold), (Some(3.0), 10.0));
    assert!(s.signals.iter().all(|x| !x.tripping));
    assert_eq!((s.state, s.limit, s.dry_run), (State::Closed, 100, false));
}

#[cfg(feature = "serde")]
#[test]
fn status_is_serializable() {
    fn assert_serialize<T: serde::Serialize>(_: &T) {}
    let h = H::new(cfg());
    assert_serialize(&h.b.status(h.now));
    assert_serialize(h.b.config());
}

// ---- fleet: one node's breaker takes another's state -------------------

/// A breaker driven open by failures, then to half-open.
fn opened_then_half_open(b: &mut Breaker, mut now: Instant) -> Instant {
    for _ in 0..30 {
        b.record_outcome(Outcome::dependency(FAST), now);
    }
    let t = b.evaluate(now).expect("trips");
    assert_eq!(t.to, State::Open);
    now += Duration::from_secs(301);
    assert_eq!(b.evaluate(now).map(|t| t.to), Some(State::HalfOpen));
    now
}

#[test]
fn a_follower_takes_the_leaders_state_with_its_timers() {
    let t0 = Instant::now();
    let mut leader = Breaker::with_seed(cfg(), 1, t0).expect("config");
    let mut follower = Breaker::with_seed(cfg(), 2, t0).expect("config");
    for _ in 0..30 {
        leader.record_outcome(Outcome::dependency(FAST), t0);
    }
    let trip = leader.evaluate(t0).expect("trips");
    let view = leader.shared_view(t0 + Duration::from_millis(400));
    assert_eq!(view.in_state_ms, 400);

    let now = t0 + Duration::from_millis(500);
    let t = follower.adopt(&view, now).expect("a transition");
    assert_eq!((t.from, t.to), (State::Closed, State::Open));
    assert_eq!(t.reason, trip.reason, "the leader's reason");
    assert!(!follower.gate().may_poll, "the follower's gate closed");
    // Same view again: nothing moves.
    assert_eq!(follower.adopt(&view, now), None);
    // The cool-down is the leader's, counted from when the leader opened.
    let status = follower.status(now);
    let cd = status.cool_down.expect("cool-down");
    assert_eq!(cd.total_ms, view.cool_down_ms);
    assert_eq!(cd.remaining_ms, view.cool_down_ms - 400);
    assert_eq!(status.opens_since_close, 1);

    // Half-open: the period is the leader's, and a probe is admitted in it.
    let now = t0 + Duration::from_secs(301);
    assert_eq!(leader.evaluate(now).map(|t| t.to), Some(State::HalfOpen));
    let view = leader.shared_view(now);
    let t = follower.adopt(&view, now).expect("half-open");
    assert_eq!(t.to, State::HalfOpen);
    assert_eq!(follower.probe_period(), leader.probe_period());
    assert!(follower.try_admit_probe(now).is_some());
}

#[test]
fn a_manual_override_travels_with_the_view() {
    let t0 = Instant::now();
    let mut a = Breaker::with_seed(cfg(), 1, t0).expect("config");
    let mut b = Breaker::with_seed(cfg(), 2, t0).expect("config");
    a.force_open("maintenance", Some(Duration::from_secs(60)), t0);
    let later = t0 + Duration::from_secs(1);
    b.adopt(&a.shared_view(later), later).expect("opened");
    let o = b.status(later).manual_override.expect("override");
    assert_eq!(o.note, "maintenance");
    assert_eq!(o.remaining_ms, Some(59_000));
    // The override expires on the follower's own clock too.
    let t = b.evaluate(t0 + Duration::from_secs(61)).expect("expired");
    assert_eq!(t.reason, Reason::OverrideExpired);
}

#[test]
fn probe_successes_are_counted_across_the_fleet() {
    let mut h = H::new(cfg());
    let now = opened_then_half_open(&mut h.b, h.now);
    let (period, _) = h.b.probe_period().expect("half-open");
    let needed = h.b.config().half_open.successes_to_close;
    assert!(needed > 1);
    // Another node's successes bring the count to one short: no ramp.
    assert_eq!(h.b.fleet_probes_succeeded(period, needed - 1, now), None);
    assert_eq!(
        h.b.fleet_probes_succeeded(period + 1, needed, now),
        None,
        "stale"
    );
    let t =
        h.b.fleet_probes_succeeded(period, needed, now)
            .expect("ramp");
    assert_eq!(t.to, State::Ramping);
}

#[test]
fn other_nodes_outcomes_feed_the_failure_ratio() {
    let mut h = H::new(cfg());
    let tally = OutcomeTally {
        calls: 100,
        failures: 60,
        ..OutcomeTally::default()
    };
    assert_eq!(h.b.evaluate(h.now), None);
    h.b.record_fleet_outcomes(&tally, h.now);
    let t = h.b.evaluate(h.now).expect("the fleet's ratio trips");
    assert!(
        matches!(t.reason, Reason::FailureRatio { calls: 100, .. }),
        "{t:?}"
    );
}

/// A lease holder whose window is full of the fleet's successes from
/// before an outage (the others' failures reach it a beat or two late)
/// still holds a failing message back from the DLQ when its own calls
/// fail: its own calls are judged apart.
#[test]
fn a_lease_holders_own_failures_hold_the_dlq_back_under_the_fleets_successes() {
    let mut h = H::new(cfg());
    h.outcomes(30, Outcome::success(Duration::from_millis(5)));
    let before = OutcomeTally {
        calls: 600,
        ..OutcomeTally::default()
    };
    h.b.record_fleet_outcomes(&before, h.now);
    // Failures among successes, never TROUBLE_STREAK in a row.
    for _ in 0..20 {
        h.outcomes(1, Outcome::success(Duration::from_millis(5)));
        h.outcomes(1, Outcome::dependency(Duration::from_millis(5)));
    }
    // The fleet's window: 20 failures in 670 calls, under half the
    // threshold; this node's own since the tallies came: 20 in 40.
    let (failures, calls) = h.b.outcomes.failure_counts(h.b.ms(h.now));
    assert!((failures as f64 / calls as f64) < cfg().failure_ratio.threshold / 2.0);
    assert!(h.b.dependency_trouble(h.now));
}

/// A few failures among many successes are no trouble; the same few in a
/// row, with nothing succeeding since, are (an outage's first second,
/// while the window still holds the minutes before it).
#[test]
fn a_streak_of_failures_is_trouble_a_few_among_successes_are_not() {
    let mut h = H::new(cfg());
    let ok = Outcome::success(Duration::from_millis(5));
    let failed = Outcome::dependency(Duration::from_millis(5));
    h.outcomes(200, ok);
    for _ in 0..TROUBLE_STREAK {
        h.outcomes(1, failed);
        h.outcomes(1, ok);
    }
    assert!(!h.b.dependency_trouble(h.now), "failures among successes");
    h.outcomes(usize::try_from(TROUBLE_STREAK - 1).expect("small"), failed);
    assert!(!h.b.dependency_trouble(h.now), "one short of the streak");
    h.outcomes(1, failed);
    assert!(h.b.dependency_trouble(h.now), "a streak");
    h.outcomes(1, Outcome::permanent(Duration::from_millis(5)));
    assert!(h.b.dependency_trouble(h.now), "poison leaves the streak");
    h.outcomes(1, ok);
    assert!(!h.b.dependency_trouble(h.now), "a success ends it");
}

#[test]
fn the_limiter_sets_the_closed_limit_and_hands_over_to_the_ramp() {
    let mut c = cfg();
    c.limiter.max_concurrency = 160;
    let mut h = H::new(c);
    // A far dependency: every call 200 ms, 100 of them running at once.
    let far = Duration::from_millis(200);
    let mut limit = h.b.gate().limit;
    assert_eq!(limit, 100);
    for _ in 0..3 {
        h.outcomes(usize::try_from(limit).expect("fits"), Outcome::success(far));
        h.advance(60);
        let change = h.b.adjust_limit(h.now).expect("the limit moves up");
        assert_eq!(change.reason, crate::LimitReason::LatencyAtBaseline);
        assert_eq!(h.b.gate().limit, change.to, "published at once");
        limit = change.to;
    }
    assert!(limit > 100, "{limit}");
    assert_eq!(h.b.status(h.now).limiter.map(|l| l.limit), Some(limit));
    // A trip: the breaker owns the limit until the ramp completes.
    h.outcomes(2_000, Outcome::dependency(FAST));
    assert_eq!(h.tick(100).map(|t| t.to), Some(State::Open));
    assert_eq!(h.b.adjust_limit(h.now), None);
    h.wait_half_open();
    h.probes_succeed();
    h.outcomes(50, Outcome::success(far));
    assert_eq!(h.b.adjust_limit(h.now), None, "not while ramping");
    assert_eq!(h.b.gate().limit, 10, "the ramp's first step");
    while h.tick(1_000).is_none_or(|t| t.to != State::Closed) {}
    // Back to the ramp's last limit, not the limiter's old one.
    assert_eq!(h.b.gate().limit, 100);
    let s = h.b.status(h.now).limiter.expect("enabled");
    assert!(s.active);
    assert_eq!(
        s.last_change.map(|c| c.reason),
        Some(crate::LimitReason::Resumed)
    );
}

#[test]
fn with_the_limiter_off_the_closed_limit_is_fixed() {
    let mut c = cfg();
    c.limiter.enabled = false;
    let mut h = H::new(c);
    h.outcomes(100, Outcome::success(Duration::from_millis(200)));
    h.advance(60);
    assert_eq!(h.b.adjust_limit(h.now), None);
    assert_eq!(h.b.gate().limit, 100);
    assert_eq!(h.b.status(h.now).limiter, None);
}
