//! The lab's figures: per-sample time series, per-mode totals, the JSON
//! shape scripts read, and the side-by-side table people read.
//!
//! JSON: `{"scenario": "...", "params": {...}, "modes": {"naive": {...},
//! "breakwater": {...}}}`, each mode a [`ModeReport`] with its `series`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use breakwater_control::{State, TransitionRecord};
use serde::Serialize;

use super::{LabArgs, Mode, POISON_SHARE, Scenario};

/// One 250 ms sample of a mode's run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Since the load started.
    pub t_ms: u64,
    /// Webhooks the ingress accepted (2xx) so far.
    pub accepted: u64,
    /// Inbox rows for the hot order / for every other order.
    pub applied_hot: u64,
    pub applied_unrelated: u64,
    /// This mode's database sessions with `wait_event_type = 'Lock'`.
    pub lock_waiters: u64,
    /// This mode's database sessions not idle (active or in a transaction).
    pub connections_active: u64,
    /// Breaker state (in naive mode, what a dry-run breaker would be in).
    pub state: &'static str,
    /// Concurrency limit the workers obey.
    pub limit: u32,
    pub dead_lettered: u64,
    /// Visible + in flight + delayed in the queue.
    pub backlog: u64,
    /// Transactions the workers had started so far.
    pub applies: u64,
    /// Whether the fault was on.
    pub fault: bool,
    /// How long the lab's own small query took, straight to PostgreSQL
    /// (the database's latency for an unrelated client), milliseconds;
    /// none when it failed.
    pub probe_ms: Option<f64>,
}

/// A mode's totals.
#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mode: Mode,
    /// Answered 2xx by the ingress.
    pub accepted: u64,
    /// Accepted events that carried a poison payload (poison scenario).
    pub accepted_poison: u64,
    /// Not answered 2xx (the sender would retry them).
    pub refused: u64,
    /// Distinct events in the inbox at the end.
    pub applied: u64,
    pub dead_lettered: u64,
    /// Still in the queue when the run stopped (drain timeout): safe, not lost.
    pub pending: u64,
    /// Accepted but neither applied, dead-lettered nor still queued at the end.
    pub lost: u64,
    /// Apply lag (`applied_at - received_at`; `applied_at` is the start of
    /// the applying transaction) of unrelated events received during the
    /// fault, milliseconds. Events of that window never applied are not in
    /// it: see `unrelated_applied_during_fault`.
    pub unrelated_lag_p50_ms: Option<f64>,
    pub unrelated_lag_p99_ms: Option<f64>,
    pub unrelated_applied_during_fault: u64,
    /// Most sessions waiting on a lock at once (any sample).
    pub max_lock_waiters: u64,
    /// Most sessions in use at once (any sample); with `--sink http`, the
    /// most webhook requests the service held unanswered.
    pub max_connections_active: u64,
    /// Database sessions waiting on a lock, integrated over the run
    /// (sum of samples x 0.25 s): the lock-wait load put on the database.
    pub lock_wait_session_seconds: f64,
    /// Transactions started while the fault was on.
    pub statements_during_fault: u64,
    /// From the fault's end until the backlog is back within twice its
    /// pre-fault maximum (at least 10), seconds.
    pub drain_seconds: Option<f64>,
    /// Openings of the breaker after the fault ended.
    pub retrips: u64,
    /// Whether the breaker opened (and gated: dry-run openings of the
    /// naive mode's shadow breaker do not count; they are listed in
    /// `breaker_transitions`).
    pub breaker_opened: bool,
    /// Every breaker transition, oldest first.
    pub breaker_transitions: Vec<String>,
    /// Transitions to open, over the whole run.
    pub breaker_trips: u64,
    /// The lab's probe query with no load at all (median of 20 before the
    /// first webhook), before the fault (median of the samples) and
    /// during it (median and p95), milliseconds.
    pub db_probe_idle_ms: Option<f64>,
    pub db_probe_before_ms: Option<f64>,
    pub db_probe_fault_p50_ms: Option<f64>,
    pub db_probe_fault_p95_ms: Option<f64>,
    /// The adaptive limiter at the end of the run (its last move), if on.
    pub limiter: Option<breakwater_control::LimiterStatus>,
    /// The concurrency limit during the fault: lowest and highest sampled.
    pub fault_limit_range: Option<(u32, u32)>,
    pub elapsed_seconds: f64,
    pub series: Vec<Sample>,
}

/// The whole lab report.
#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    pub scenario: Scenario,
    pub params: LabArgs,
    pub modes: BTreeMap<String, ModeReport>,
}

impl LabReport {
    pub fn new(args: &LabArgs) -> Self {
        Self {
            scenario: args.scenario,
            params: args.clone(),
            modes: BTreeMap::new(),
        }
    }
}

/// What a mode's run measured, before summarizing.
pub(super) struct Inputs {
    pub mode: Mode,
    pub scenario: Scenario,
    pub accepted: u64,
    pub accepted_poison: u64,
    pub refused: u64,
    pub applied: u64,
    pub dead_lettered: u64,
    pub pending: u64,
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    pub lag_count: u64,
    pub statements_during_fault: u64,
    pub fault_start_ms: u64,
    pub fault_end_ms: u64,
    /// Breaker history and the run time at which it was read.
    pub history: Vec<TransitionRecord>,
    pub history_at: Duration,
    pub limiter: Option<breakwater_control::LimiterStatus>,
    pub idle_probes: Vec<f64>,
    pub elapsed: Duration,
    pub samples: Vec<Sample>,
}

/// The `q` quantile (0..=1) of `v`, nearest rank.
pub(super) fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((v.len() as f64 - 1.0) * q).round() as usize;
    v.get(rank).copied()
}

pub(super) fn summarize(i: Inputs) -> ModeReport {
    let probes = |during: bool| -> Vec<f64> {
        i.samples
            .iter()
            .filter(|s| {
                if during {
                    s.fault
                } else {
                    s.t_ms < i.fault_start_ms
                }
            })
            .filter_map(|s| s.probe_ms)
            .collect()
    };
    let fault_limits = i.samples.iter().filter(|s| s.fault).map(|s| s.limit);
    let fault_limit_range = fault_limits.clone().min().zip(fault_limits.max());
    let has_fault = i.scenario != Scenario::Poison;
    let baseline = i
        .samples
        .iter()
        .filter(|s| s.t_ms < i.fault_start_ms)
        .map(|s| s.backlog)
        .max()
        .unwrap_or(0);
    let caught_up = (2 * baseline).max(10);
    let drain_seconds = has_fault
        .then(|| {
            i.samples
                .iter()
                .find(|s| s.t_ms >= i.fault_end_ms && s.backlog <= caught_up)
                .map(|s| (s.t_ms - i.fault_end_ms) as f64 / 1000.0)
        })
        .flatten();
    let history_at_ms = i.history_at.as_millis() as u64;
    let retrips = i
        .history
        .iter()
        .filter(|t| t.to == State::Open && !t.dry_run)
        .filter(|t| history_at_ms.saturating_sub(t.ago_ms) > i.fault_end_ms)
        .count() as u64;
    ModeReport {
        mode: i.mode,
        accepted: i.accepted,
        accepted_poison: i.accepted_poison,
        refused: i.refused,
        applied: i.applied,
        dead_lettered: i.dead_lettered,
        pending: i.pending,
        lost: i
            .accepted
            .saturating_sub(i.applied + i.dead_lettered + i.pending),
        unrelated_lag_p50_ms: i.lag_p50_ms,
        unrelated_lag_p99_ms: i.lag_p99_ms,
        unrelated_applied_during_fault: i.lag_count,
        max_lock_waiters: i.samples.iter().map(|s| s.lock_waiters).max().unwrap_or(0),
        max_connections_active: i
            .samples
            .iter()
            .map(|s| s.connections_active)
            .max()
            .unwrap_or(0),
        lock_wait_session_seconds: i.samples.iter().map(|s| s.lock_waiters).sum::<u64>() as f64
            * super::SAMPLE_EVERY.as_secs_f64(),
        statements_during_fault: i.statements_during_fault,
        drain_seconds,
        retrips,
        breaker_opened: i.history.iter().any(|t| t.to == State::Open && !t.dry_run),
        breaker_transitions: i
            .history
            .iter()
            .map(|t| {
                format!(
                    "t={:.1}s {} -> {}: {}{}",
                    history_at_ms.saturating_sub(t.ago_ms) as f64 / 1000.0,
                    t.from,
                    t.to,
                    t.message,
                    if t.dry_run { " (dry run)" } else { "" }
                )
            })
            .collect(),
        breaker_trips: i
            .history
            .iter()
            .filter(|t| t.to == State::Open && !t.dry_run)
            .count() as u64,
        db_probe_idle_ms: quantile(i.idle_probes.clone(), 0.5),
        db_probe_before_ms: quantile(probes(false), 0.5),
        db_probe_fault_p50_ms: quantile(probes(true), 0.5),
        db_probe_fault_p95_ms: quantile(probes(true), 0.95),
        limiter: i.limiter,
        fault_limit_range,
        elapsed_seconds: i.elapsed.as_secs_f64(),
        series: i.samples,
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

impl LabReport {
    /// The scenario and its parameters in one line (the report's first
    /// line and the chart's title).
    pub fn headline(&self) -> String {
        let p = &self.params;
        let what = match self.scenario {
            // Poison needs no fault: a share of the webhooks is poison.
            Scenario::Poison => format!("{:.0}% poison", POISON_SHARE * 100.0),
            Scenario::HotRow => format!(
                "fault at {} s for {} s, {:.0}% for order 1042",
                p.fault_at,
                p.fault_secs,
                p.hot_share * 100.0
            ),
            _ => format!("fault at {} s for {} s", p.fault_at, p.fault_secs),
        };
        format!(
            "lab {:?} on {:?} into {}: {} webhooks/s for {} s, {what}",
            self.scenario,
            p.backend,
            match p.sink {
                super::LabSink::Db => "PostgreSQL",
                super::LabSink::Http => "an HTTP service (the probe: its GET /probe)",
            },
            p.rate,
            p.duration
        )
    }
}

impl fmt::Display for LabReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.headline())?;
        let modes: Vec<&ModeReport> = self.modes.values().collect();
        write!(f, "{:<34}", "")?;
        for m in &modes {
            write!(f, "{:>14}", m.mode.as_str())?;
        }
        writeln!(f)?;
        type Row = (&'static str, fn(&ModeReport) -> String);
        let rows: [Row; 21] = [
            ("accepted (2xx)", |m| m.accepted.to_string()),
            ("applied", |m| m.applied.to_string()),
            ("dead-lettered", |m| m.dead_lettered.to_string()),
            ("still queued at the end", |m| m.pending.to_string()),
            ("lost", |m| m.lost.to_string()),
            ("unrelated lag p50 in fault (ms)", |m| {
                opt(m.unrelated_lag_p50_ms)
            }),
            ("unrelated lag p99 in fault (ms)", |m| {
                opt(m.unrelated_lag_p99_ms)
            }),
            ("unrelated applied in fault", |m| {
                m.unrelated_applied_during_fault.to_string()
            }),
            ("max sessions waiting on a lock", |m| {
                m.max_lock_waiters.to_string()
            }),
            ("max sessions (requests) in use", |m| {
                m.max_connections_active.to_string()
            }),
            ("lock-wait session-seconds", |m| {
                format!("{:.1}", m.lock_wait_session_seconds)
            }),
            ("applies sent during fault", |m| {
                m.statements_during_fault.to_string()
            }),
            ("drain after fault (s)", |m| {
                m.drain_seconds
                    .map_or_else(|| "-".to_owned(), |d| format!("{d:.1}"))
            }),
            ("probe, no load (ms)", |m| {
                m.db_probe_idle_ms
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
            }),
            ("probe before the fault (ms)", |m| {
                m.db_probe_before_ms
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
            }),
            ("probe in fault p50/p95 (ms)", |m| {
                match (m.db_probe_fault_p50_ms, m.db_probe_fault_p95_ms) {
                    (Some(a), Some(b)) => format!("{a:.1}/{b:.1}"),
                    _ => "-".to_owned(),
                }
            }),
            ("concurrency limit in fault", |m| {
                m.fault_limit_range
                    .map_or_else(|| "-".to_owned(), |(a, b)| format!("{a}..{b}"))
            }),
            ("breaker opened", |m| m.breaker_opened.to_string()),
            ("breaker trips (whole run)", |m| m.breaker_trips.to_string()),
            ("re-trips after fault", |m| m.retrips.to_string()),
            ("run time (s)", |m| format!("{:.0}", m.elapsed_seconds)),
        ];
        for (name, value) in rows {
            write!(f, "{name:<34}")?;
            for m in &modes {
                write!(f, "{:>14}", value(m))?;
            }
            writeln!(f)?;
        }
        for m in &modes {
            if !m.breaker_transitions.is_empty() {
                writeln!(f, "{} breaker transitions:", m.mode.as_str())?;
                for t in m.breaker_transitions.iter().take(12) {
                    writeln!(f, "  {t}")?;
                }
                if m.breaker_transitions.len() > 12 {
                    writeln!(f, "  ... {} more", m.breaker_transitions.len() - 12)?;
                }
            }
        }
        if let (Some(n), Some(b)) = (self.modes.get("naive"), self.modes.get("breakwater"))
            && n.lock_wait_session_seconds > 0.0
        {
            writeln!(
                f,
                "breakwater put {:.1}% of naive's lock-wait load on the database",
                100.0 * b.lock_wait_session_seconds / n.lock_wait_session_seconds
            )?;
        }
        Ok(())
    }
}
