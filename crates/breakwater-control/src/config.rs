//! The breaker's configuration: the `[breaker]` TOML table of the service.
//!
//! One struct per concern (cool-down, half-open, ramp, one per signal), all
//! with `Default` so a partial table fills in the rest. With the `serde`
//! feature every struct derives `Deserialize`/`Serialize` with
//! `deny_unknown_fields` (a typo is an error, not a silently ignored key) and
//! `default` (absent keys take the defaults below).
//!
//! Units are in the key names: `_ms` for milliseconds, `_secs` for seconds,
//! `_per_sec` for rates; ratios and fractions are in `0.0..=1.0`.
//!
//! [`BreakerConfig::validate`] checks every key and names the first bad one
//! (`breaker.ramp.steps: ...`) so the service can print it as is.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A key holds a value the breaker cannot work with.
    #[error("breaker.{key}: {problem}")]
    Invalid {
        /// Dotted path of the bad key below `[breaker]`, e.g. `ramp.steps`.
        key: &'static str,
        /// What is wrong and what would be accepted.
        problem: String,
    },
}

impl ConfigError {
    fn new(key: &'static str, problem: impl Into<String>) -> Self {
        Self::Invalid {
            key,
            problem: problem.into(),
        }
    }

    /// Dotted path of the bad key below `[breaker]`.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Invalid { key, .. } => key,
        }
    }
}

/// Everything the breaker needs to know; see the crate docs for the meaning
/// of each state and signal.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct BreakerConfig {
    /// Concurrency limit when fully closed; ramp steps are fractions of it.
    pub max_concurrency: u32,
    /// Evaluate and report, but never gate: the published gate stays fully
    /// open (manual overrides still apply).
    pub dry_run: bool,
    /// How many transitions [`crate::BreakerStatus::history`] keeps.
    pub history_len: usize,
    /// Time spent open before probing.
    pub cool_down: CoolDownConfig,
    /// Probing after the cool-down.
    pub half_open: HalfOpenConfig,
    /// Concurrency steps after the probes succeeded.
    pub ramp: RampConfig,
    /// Ratio of dependency failures.
    pub failure_ratio: FailureRatioConfig,
    /// Ratio of slow calls.
    pub slow_calls: SlowCallConfig,
    /// Dead-letter arrival velocity.
    pub dlq: DlqConfig,
    /// In-flight ratio together with a throughput drop.
    pub in_flight: InFlightConfig,
    /// Workers' lock-wait heartbeats.
    pub lock_wait: LockWaitConfig,
    /// Database lock waiters (`pg_stat_activity`).
    pub db_lock_waiters: DbLockWaitersConfig,
    /// The adaptive limit while closed.
    pub limiter: LimiterConfig,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            max_concurrency: 16,
            dry_run: false,
            history_len: 32,
            cool_down: CoolDownConfig::default(),
            half_open: HalfOpenConfig::default(),
            ramp: RampConfig::default(),
            failure_ratio: FailureRatioConfig::default(),
            slow_calls: SlowCallConfig::default(),
            dlq: DlqConfig::default(),
            in_flight: InFlightConfig::default(),
            lock_wait: LockWaitConfig::default(),
            db_lock_waiters: DbLockWaitersConfig::default(),
            limiter: LimiterConfig::default(),
        }
    }
}

/// Cool-down: `min(cap, base * 2^n)` for the `n`-th consecutive opening
/// since the last full close, shortened by up to `jitter` (a fraction) at
/// random so a fleet's nodes do not probe in lockstep. Never above `cap_ms`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct CoolDownConfig {
    /// First cool-down, milliseconds.
    pub base_ms: u64,
    /// Longest cool-down, milliseconds.
    pub cap_ms: u64,
    /// Fraction (`0.0..1.0`) by which a cool-down may be shortened at random.
    pub jitter: f64,
}

impl Default for CoolDownConfig {
    fn default() -> Self {
        Self {
            // Short enough that a database back after an outage is found
            // within half a minute (a long cap leaves a recovered database
            // idle while the backlog grows; measured with `breakwater lab
            // db-down`), long enough that probes stay rare while it is down.
            base_ms: 5_000,
            cap_ms: 30_000,
            jitter: 0.2,
        }
    }
}

/// Half-open: a few probes decide whether the dependency is back.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct HalfOpenConfig {
    /// Probes admitted at the same time (fleet-wide when admission is shared).
    pub max_probes: u32,
    /// Consecutive probe successes that close the breaker (start the ramp).
    pub successes_to_close: u32,
    /// Longest time a probe may stay unanswered in half-open; past it the
    /// probe counts as failed and the breaker re-opens. (Half-open with no
    /// probe outstanding waits for traffic: no evidence is no failure.)
    pub probe_timeout_ms: u64,
}

impl Default for HalfOpenConfig {
    fn default() -> Self {
        Self {
            max_probes: 1,
            successes_to_close: 3,
            probe_timeout_ms: 30_000,
        }
    }
}

/// The ramp: after half-open, concurrency comes back in steps.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct RampConfig {
    /// Strictly increasing fractions of `max_concurrency` in `(0, 1]`; empty
    /// means "close at once". Every step, the last included, is held healthy
    /// for `hold_ms` before the next one (or the full close).
    pub steps: Vec<f64>,
    /// How long each step must stay healthy, milliseconds.
    pub hold_ms: u64,
    /// A step ends sooner, after this long, once its calls show it in use
    /// and at the limiter's learned no-load latency, window after window
    /// (see [`crate::ramp`]); needs the limiter on. At or above `hold_ms`,
    /// every step waits out its hold.
    pub min_hold_ms: u64,
}

impl Default for RampConfig {
    fn default() -> Self {
        Self {
            steps: vec![0.10, 0.25, 0.50, 1.0],
            hold_ms: 30_000,
            min_hold_ms: 2_000,
        }
    }
}

/// Trips when dependency failures / (successes + dependency failures) is
/// above `threshold` over `window_secs`, once at least `min_calls` such calls
/// were seen (in the ramp, from the first call). Permanent (poison)
/// failures are counted apart and never trip.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct FailureRatioConfig {
    /// Whether this signal may trip.
    pub enabled: bool,
    /// Trip above this ratio.
    pub threshold: f64,
    /// Rolling window, seconds.
    pub window_secs: u64,
    /// No verdict below this many calls in the window (closed and
    /// half-open; the ramp judges from its first call).
    pub min_calls: u64,
}

impl Default for FailureRatioConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: 0.15,
            // 10 s, not 60: when the database goes away, a minute of healthy
            // history dilutes the failures and the breaker trips seconds
            // late, long enough for retries to exhaust messages into the DLQ
            // (measured with `breakwater lab db-down`).
            window_secs: 10,
            min_calls: 20,
        }
    }
}

/// Trips when the share of calls slower than `slow_ms` is above `threshold`
/// over `window_secs` (resilience4j's slow-call rate), and has stayed above
/// it for `sustain_ms`. Permanent failures are left out, like for the
/// failure ratio.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct SlowCallConfig {
    /// Whether this signal may trip.
    pub enabled: bool,
    /// A call taking longer than this is slow, milliseconds.
    pub slow_ms: u64,
    /// Trip above this ratio of slow calls.
    pub threshold: f64,
    /// Rolling window, seconds.
    pub window_secs: u64,
    /// No verdict below this many calls in the window.
    pub min_calls: u64,
    /// How long the ratio must stay above `threshold`, at every tick,
    /// before it trips, milliseconds; 0 = at once. Slowness is what the
    /// adaptive limiter answers first (it cuts within a window or two): the
    /// breaker trips on it only when the cuts did not bring the latency
    /// back. A call slower than `slow_ms` has already taken that long, so
    /// the wait adds little to a trip that real trouble earns. Failures
    /// (timeouts, lost connections) trip at once as before.
    pub sustain_ms: u64,
}

impl Default for SlowCallConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            slow_ms: 5_000,
            threshold: 0.5,
            window_secs: 60,
            min_calls: 20,
            sustain_ms: 2_000,
        }
    }
}

/// Trips when messages reach the dead-letter queue faster than
/// `max_per_sec` (arrivals over `window_secs` divided by `window_secs`).
///
/// **Disabled by default.** Most dead letters are poison messages (a
/// constraint violation, bad JSON), which say nothing about the database's
/// health; a burst of them must not pause the fleet. Dependency trouble is
/// already caught by the failure ratio. Turn this on as a backstop when the
/// deployment's DLQ normally stays near empty, with a threshold well above
/// its usual poison rate.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct DlqConfig {
    /// Whether this signal may trip (default: no, see above).
    pub enabled: bool,
    /// Trip above this many dead letters per second.
    pub max_per_sec: f64,
    /// Rolling window, seconds.
    pub window_secs: u64,
}

impl Default for DlqConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_per_sec: 5.0,
            window_secs: 60,
        }
    }
}

/// Trips when `in_flight / (in_flight + visible)` is above `ratio` **and**
/// throughput is below `throughput_fraction` of its learned baseline **and**
/// at least `min_in_flight` messages are in flight. Never the ratio alone: a
/// drained queue (visible = 0) has a ratio of 1.
///
/// Throughput is processed messages per second over `window_secs`; the
/// baseline is its moving average (half-life `baseline_half_life_secs`),
/// learned while fully closed and not in the trip zone. The signal is only
/// judged while fully closed, once a whole window lies in the closed period,
/// and once the baseline is at least `min_baseline_per_sec` (an idle system
/// has nothing to compare against).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct InFlightConfig {
    /// Whether this signal may trip.
    pub enabled: bool,
    /// In-flight ratio above which the queue counts as stuck.
    pub ratio: f64,
    /// Throughput below this fraction of the baseline counts as collapsed.
    pub throughput_fraction: f64,
    /// Throughput window, seconds.
    pub window_secs: u64,
    /// Half-life of the baseline's moving average, seconds.
    pub baseline_half_life_secs: u64,
    /// No verdict while the baseline is below this rate (messages/s).
    pub min_baseline_per_sec: f64,
    /// No verdict with fewer messages in flight: set it above what the
    /// workers (plus broker prefetch) hold when healthy, so only messages
    /// parked in retry push the count past it.
    pub min_in_flight: u64,
    /// A queue sample older than this is ignored, milliseconds.
    pub sample_ttl_ms: u64,
}

impl Default for InFlightConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ratio: 0.85,
            throughput_fraction: 0.20,
            window_secs: 30,
            baseline_half_life_secs: 600,
            min_baseline_per_sec: 1.0,
            min_in_flight: 32,
            sample_ttl_ms: 10_000,
        }
    }
}

/// Trips when more than `fraction` of the live workers have been waiting on
/// a database lock for longer than `wait_ms`. A worker is live while its
/// last heartbeat is younger than `heartbeat_ttl_ms`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct LockWaitConfig {
    /// Whether this signal may trip.
    pub enabled: bool,
    /// Trip above this fraction of live workers in a long lock wait.
    pub fraction: f64,
    /// A lock wait longer than this counts, milliseconds.
    pub wait_ms: u64,
    /// A heartbeat older than this is forgotten, milliseconds.
    pub heartbeat_ttl_ms: u64,
    /// No verdict with fewer live workers.
    pub min_workers: u32,
}

impl Default for LockWaitConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            fraction: 0.30,
            wait_ms: 2_000,
            heartbeat_ttl_ms: 10_000,
            min_workers: 1,
        }
    }
}

/// Trips when the database reports more than `max_waiters` sessions waiting
/// on a lock (`pg_stat_activity` with `wait_event_type = 'Lock'`).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct DbLockWaitersConfig {
    /// Whether this signal may trip.
    pub enabled: bool,
    /// Trip above this many lock waiters.
    pub max_waiters: u32,
    /// A sample older than this is ignored, milliseconds.
    pub sample_ttl_ms: u64,
}

impl Default for DbLockWaitersConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_waiters: 10,
            sample_ttl_ms: 10_000,
        }
    }
}

/// The adaptive concurrency limiter (see [`crate::limiter`]): while the
/// breaker is closed, the limit moves between `min_concurrency` and
/// `max_concurrency` with the applies' latencies, starting from
/// `initial_concurrency`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(Deserialize, Serialize),
    serde(deny_unknown_fields, default)
)]
pub struct LimiterConfig {
    /// Off: the closed limit is the breaker's `max_concurrency`, fixed.
    pub enabled: bool,
    /// The limit when the service starts, in slow start (doubling each
    /// window whose latency does not rise, up to the breaker's
    /// `max_concurrency`; eight calm windows in a row whose limit is not
    /// in use end it there at once), clamped into the floor and the
    /// ceiling; 0 (the default) = the breaker's `max_concurrency`, no slow
    /// start. A database already saturated at start then gets this many
    /// sessions while the first windows learn its latency, which keeps a
    /// tight `slow_calls.slow_ms` from tripping at start (`lab overload
    /// --slow-call-ms 100`: 0 trips from 4, 1 from 16). Not the default:
    /// a few sessions, one of them waiting on a locked hot row, lagged
    /// the fleet hot-row test's unrelated orders to a p99 of 4.7 s on a
    /// busy machine (68 ms from 16).
    pub initial_concurrency: u32,
    /// The floor.
    pub min_concurrency: u32,
    /// The ceiling; 0 = the breaker's `max_concurrency` (the limiter then
    /// only lowers it). The service reads 0 as the sink's pool and refuses
    /// a ceiling above it.
    pub max_concurrency: u32,
    /// A window is judged once it is this old, milliseconds...
    pub window_ms: u64,
    /// ...and holds this many finished calls.
    pub min_samples: u32,
    /// Mean latency may reach this multiple of the baseline (plus the
    /// slack) before the limit falls; at half the way it may rise.
    pub tolerance: f64,
    /// Latency differences this small are noise, milliseconds.
    pub latency_slack_ms: u64,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_concurrency: 0,
            min_concurrency: 1,
            max_concurrency: 0,
            window_ms: 250,
            min_samples: 10,
            tolerance: 2.0,
            latency_slack_ms: 5,
        }
    }
}

impl LimiterConfig {
    /// The limit at start, with 0 read as `breaker_max` (the limiter
    /// clamps it into its bounds).
    pub fn initial(&self, breaker_max: u32) -> u32 {
        if self.initial_concurrency == 0 {
            breaker_max
        } else {
            self.initial_concurrency
        }
    }

    /// The ceiling, with 0 read as `breaker_max`.
    pub fn ceiling(&self, breaker_max: u32) -> u32 {
        if self.max_concurrency == 0 {
            breaker_max
        } else {
            self.max_concurrency
        }
    }
}

fn ratio(key: &'static str, v: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!("{v} is not a ratio in 0.0..=1.0"),
        ))
    }
}

fn positive(key: &'static str, v: u64) -> Result<(), ConfigError> {
    if v > 0 {
        Ok(())
    } else {
        Err(ConfigError::new(key, "must be greater than 0"))
    }
}

impl BreakerConfig {
    /// Checks every key; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive("max_concurrency", u64::from(self.max_concurrency))?;
        positive("history_len", self.history_len as u64)?;

        let c = &self.cool_down;
        positive("cool_down.base_ms", c.base_ms)?;
        if c.cap_ms < c.base_ms {
            return Err(ConfigError::new(
                "cool_down.cap_ms",
                format!("{} is below cool_down.base_ms ({})", c.cap_ms, c.base_ms),
            ));
        }
        if !(0.0..1.0).contains(&c.jitter) {
            return Err(ConfigError::new(
                "cool_down.jitter",
                format!("{} is not a fraction in 0.0..1.0", c.jitter),
            ));
        }

        let h = &self.half_open;
        positive("half_open.max_probes", u64::from(h.max_probes))?;
        positive(
            "half_open.successes_to_close",
            u64::from(h.successes_to_close),
        )?;
        positive("half_open.probe_timeout_ms", h.probe_timeout_ms)?;

        let mut prev = 0.0;
        for &s in &self.ramp.steps {
            if !(s > prev && s <= 1.0) {
                return Err(ConfigError::new(
                    "ramp.steps",
                    format!("{s} breaks the rule: strictly increasing fractions in (0, 1]"),
                ));
            }
            prev = s;
        }
        if !self.ramp.steps.is_empty() {
            positive("ramp.hold_ms", self.ramp.hold_ms)?;
        }

        let f = &self.failure_ratio;
        ratio("failure_ratio.threshold", f.threshold)?;
        positive("failure_ratio.window_secs", f.window_secs)?;

        let s = &self.slow_calls;
        ratio("slow_calls.threshold", s.threshold)?;
        positive("slow_calls.window_secs", s.window_secs)?;

        let d = &self.dlq;
        if !(d.max_per_sec.is_finite() && d.max_per_sec >= 0.0) {
            return Err(ConfigError::new(
                "dlq.max_per_sec",
                format!("{} is not a rate >= 0", d.max_per_sec),
            ));
        }
        positive("dlq.window_secs", d.window_secs)?;

        let i = &self.in_flight;
        ratio("in_flight.ratio", i.ratio)?;
        ratio("in_flight.throughput_fraction", i.throughput_fraction)?;
        positive("in_flight.window_secs", i.window_secs)?;
        positive(
            "in_flight.baseline_half_life_secs",
            i.baseline_half_life_secs,
        )?;
        if !(i.min_baseline_per_sec.is_finite() && i.min_baseline_per_sec >= 0.0) {
            return Err(ConfigError::new(
                "in_flight.min_baseline_per_sec",
                format!("{} is not a rate >= 0", i.min_baseline_per_sec),
            ));
        }
        positive("in_flight.sample_ttl_ms", i.sample_ttl_ms)?;

        let l = &self.lock_wait;
        ratio("lock_wait.fraction", l.fraction)?;
        positive("lock_wait.heartbeat_ttl_ms", l.heartbeat_ttl_ms)?;

        positive(
            "db_lock_waiters.sample_ttl_ms",
            self.db_lock_waiters.sample_ttl_ms,
        )?;

        let m = &self.limiter;
        positive("limiter.min_concurrency", u64::from(m.min_concurrency))?;
        if m.min_concurrency > self.max_concurrency {
            return Err(ConfigError::new(
                "limiter.min_concurrency",
                format!(
                    "{} is above the concurrency the breaker starts from ({})",
                    m.min_concurrency, self.max_concurrency
                ),
            ));
        }
        if m.max_concurrency != 0 && m.max_concurrency < m.min_concurrency {
            return Err(ConfigError::new(
                "limiter.max_concurrency",
                format!(
                    "{} is below limiter.min_concurrency ({})",
                    m.max_concurrency, m.min_concurrency
                ),
            ));
        }
        positive("limiter.window_ms", m.window_ms)?;
        positive("limiter.min_samples", u64::from(m.min_samples))?;
        if !(m.tolerance.is_finite() && m.tolerance > 1.0) {
            return Err(ConfigError::new(
                "limiter.tolerance",
                format!("{} is not a multiple above 1.0", m.tolerance),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(BreakerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn validate_names_the_bad_key() {
        let mut c = BreakerConfig::default();
        c.ramp.steps = vec![0.5, 0.25];
        let e = c.validate().err().map(|e| e.key());
        assert_eq!(e, Some("ramp.steps"));

        let mut c = BreakerConfig::default();
        c.failure_ratio.threshold = 1.5;
        let e = c.validate().err();
        assert_eq!(e.as_ref().map(|e| e.key()), Some("failure_ratio.threshold"));
        assert!(
            e.map(|e| e.to_string())
                .unwrap_or_default()
                .starts_with("breaker.failure_ratio.threshold: 1.5")
        );

        let mut c = BreakerConfig::default();
        c.cool_down.cap_ms = 1;
        assert_eq!(
            c.validate().err().map(|e| e.key()),
            Some("cool_down.cap_ms")
        );

        let mut c = BreakerConfig::default();
        c.half_open.max_probes = 0;
        assert_eq!(
            c.validate().err().map(|e| e.key()),
            Some("half_open.max_probes")
        );

        let mut c = BreakerConfig::default();
        c.ramp.steps = vec![0.1, f64::NAN];
        assert_eq!(c.validate().err().map(|e| e.key()), Some("ramp.steps"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn partial_toml_table_fills_defaults_and_rejects_typos() {
        let c: BreakerConfig = toml::from_str(
            "max_concurrency = 32\n[ramp]\nsteps = [0.2, 1.0]\n[dlq]\nenabled = true\n",
        )
        .expect("valid table");
        assert_eq!(c.max_concurrency, 32);
        assert_eq!(c.ramp.steps, vec![0.2, 1.0]);
        assert_eq!(c.ramp.hold_ms, RampConfig::default().hold_ms);
        assert!(c.dlq.enabled);
        assert_eq!(c.failure_ratio, FailureRatioConfig::default());

        let typo = toml::from_str::<BreakerConfig>("[failure_ratio]\nthreshhold = 0.2\n");
        assert!(typo.is_err());
    }
}
