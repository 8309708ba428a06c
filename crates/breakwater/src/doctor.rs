//! `breakwater doctor`: a deployment audited against the checklist of the
//! article Breakwater answers (timeouts on the worker's role, a bounded
//! pool, jittered and capped retries, every breaker signal, bounded
//! probes and a ramp, an inbox keyed for idempotency, verified sources).
//!
//! [`audit`] is pure: the config, what was read from the live database
//! ([`Live`]) and what the operator declares ([`Assumptions`]: the longest
//! outage they find plausible) in, findings out, so every verdict is tested
//! without a database. [`gather`] reads the live facts.

use serde::Serialize;

use breakwater_fleet::FleetView;

use crate::config::{BackoffJitter, Config};
use crate::queue::SINGLE_NODE_BACKENDS;
use breakwater_sink::DatabaseAudit;

/// A finding's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
}

/// One item of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Short stable name, e.g. `role.lock_timeout`.
    pub check: &'static str,
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to do about it (absent on a pass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn pass(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        verdict: Verdict::Pass,
        detail: detail.into(),
        fix: None,
    }
}

fn flag(
    check: &'static str,
    verdict: Verdict,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        verdict,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// What the operator declares, not read from anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assumptions {
    /// The longest outage of the database (or forward target) the
    /// deployment must ride out without losing a message
    /// (`--plausible-outage`).
    pub plausible_outage: std::time::Duration,
}

impl Default for Assumptions {
    /// Six hours: a bad night, found in the morning.
    fn default() -> Self {
        Self {
            plausible_outage: std::time::Duration::from_secs(6 * 3600),
        }
    }
}

/// What was read from the running system.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    /// The sources' secrets resolved (env, files): the error when not.
    pub sources: Result<usize, String>,
    /// Sources whose `secrets_file` its group or others may read, one
    /// sentence each ([`crate::serve::exposed_secrets_files`]).
    pub exposed_secrets_files: Vec<String>,
    /// The sink's database: `Ok(None)` for SQLite, the error when it could
    /// not be read.
    pub database: Result<Option<DatabaseAudit>, String>,
    /// The queue's own redelivery limit (SQS `maxReceiveCount`): `Ok(None)`
    /// when the broker has none or the queue does not exist yet (then
    /// Breakwater makes it with its own), the error when it could not be
    /// opened.
    pub redelivery_limit: Result<Option<u32>, String>,
    /// With `[fleet]`: the fleet as Redis holds it, the error when Redis
    /// could not be read; `None` without a fleet.
    pub fleet: Option<Result<FleetView, String>>,
}

/// Reads the live facts `audit` needs.
pub async fn gather(config: &Config) -> Live {
    let sources = crate::source::compile_all(&config.sources)
        .map(|s| s.len())
        .map_err(|e| e.to_string());
    let database = breakwater_sink::audit_database(&crate::serve::sink_settings(config)).await;
    let redelivery_limit = crate::serve::open_existing_queue(config)
        .await
        .map(|queue| queue.and_then(|q| q.redelivery_limit()))
        .map_err(|e| e.to_string());
    let fleet = match &config.fleet {
        None => None,
        Some(f) => Some(
            match breakwater_fleet::RedisFleet::open(&f.redis_url, &f.prefix, "doctor") {
                Ok(store) => store.view().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
        ),
    };
    Live {
        sources,
        exposed_secrets_files: crate::serve::exposed_secrets_files(config),
        database,
        redelivery_limit,
        fleet,
    }
}

/// The checklist, item by item.
pub fn audit(config: &Config, live: &Live, assumed: &Assumptions) -> Vec<Finding> {
    let mut out = vec![sources(config, live)];
    out.extend(secrets_files(live));
    out.extend(role(config, live));
    out.push(pool(config));
    out.push(retries(config));
    out.push(signals(config));
    out.push(probes_and_ramp(config));
    out.push(redelivery(config, live));
    out.push(retention(config, assumed));
    out.extend(fleet(config, live));
    out
}

fn sources(config: &Config, live: &Live) -> Finding {
    const CHECK: &str = "sources.signatures";
    match &live.sources {
        Ok(0) => flag(
            CHECK,
            Verdict::Warn,
            "no [[source]]: every webhook is refused with 404",
            "add a [[source]] per sender, with its signature scheme and secrets",
        ),
        Ok(n) => pass(
            CHECK,
            format!(
                "{n} sources, each verifying its sender's signature ({})",
                config
                    .sources
                    .iter()
                    .map(|s| format!("{}: {}", s.name, s.scheme.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => flag(
            CHECK,
            Verdict::Fail,
            format!("a source's secrets cannot be loaded: {e}"),
            "set the secrets_env variable or secrets_file each source names",
        ),
    }
}

/// A `secrets_file` its group or others may read: said only when one is.
fn secrets_files(live: &Live) -> Option<Finding> {
    (!live.exposed_secrets_files.is_empty()).then(|| {
        flag(
            "sources.secrets_files",
            Verdict::Warn,
            live.exposed_secrets_files.join("; "),
            "chmod 600 each secrets_file, owned by the user Breakwater runs as",
        )
    })
}

fn role(config: &Config, live: &Live) -> Vec<Finding> {
    let sink = &config.sink;
    let db = match &live.database {
        Ok(Some(db)) => db,
        Ok(None) => {
            return vec![pass(
                "role.timeouts",
                format!(
                    "SQLite: Breakwater's own busy timeout ({} ms) and deadline ({} ms) apply",
                    sink.lock_timeout_ms, sink.statement_timeout_ms
                ),
            )];
        }
        Err(e) => {
            return vec![flag(
                "database.reachable",
                Verdict::Fail,
                format!("the sink's database cannot be read: {e}"),
                "check sink.url and that the database answers",
            )];
        }
    };
    let role = &db.role;
    let mut out = Vec::new();
    out.push(if db.lock_timeout_ms == 0 {
        flag(
            "role.lock_timeout",
            Verdict::Fail,
            format!(
                "role {role} has no lock_timeout: its sessions outside Breakwater's own \
                 transactions (Breakwater sets {} ms per transaction) wait on a locked row \
                 for ever",
                sink.lock_timeout_ms
            ),
            format!(
                "ALTER ROLE {role} SET lock_timeout = '{}ms'",
                sink.lock_timeout_ms
            ),
        )
    } else {
        pass(
            "role.lock_timeout",
            format!("role {role}: lock_timeout {} ms", db.lock_timeout_ms),
        )
    });
    out.push(
        if db.statement_timeout_ms != 0
            && db.lock_timeout_ms != 0
            && db.statement_timeout_ms <= db.lock_timeout_ms
        {
            flag(
                "role.statement_timeout",
                Verdict::Fail,
                format!(
                    "role {role}: statement_timeout {} ms is not larger than lock_timeout {} ms, \
                     so the statement timeout fires first and the lock timeout never does",
                    db.statement_timeout_ms, db.lock_timeout_ms
                ),
                format!(
                    "ALTER ROLE {role} SET statement_timeout = '{}ms'",
                    sink.statement_timeout_ms
                        .max(db.lock_timeout_ms.saturating_mul(5))
                ),
            )
        } else if db.statement_timeout_ms == 0 {
            flag(
                "role.statement_timeout",
                Verdict::Warn,
                format!("role {role} has no statement_timeout"),
                format!(
                    "ALTER ROLE {role} SET statement_timeout = '{}ms'",
                    sink.statement_timeout_ms
                ),
            )
        } else {
            pass(
                "role.statement_timeout",
                format!(
                    "role {role}: statement_timeout {} ms, above lock_timeout",
                    db.statement_timeout_ms
                ),
            )
        },
    );
    out.push(if db.idle_in_transaction_timeout_ms == 0 {
        flag(
            "role.idle_in_transaction_session_timeout",
            Verdict::Warn,
            format!(
                "role {role} has none (Breakwater sets {} ms on its own sessions): another \
                 client's forgotten transaction holds its locks for ever",
                sink.idle_in_transaction_timeout_ms
            ),
            format!(
                "ALTER ROLE {role} SET idle_in_transaction_session_timeout = '{}ms'",
                sink.idle_in_transaction_timeout_ms
            ),
        )
    } else {
        pass(
            "role.idle_in_transaction_session_timeout",
            format!("role {role}: {} ms", db.idle_in_transaction_timeout_ms),
        )
    });
    out.push(match &db.inbox_key {
        None => pass(
            "inbox.key",
            "no breakwater_inbox yet: the first serve creates it keyed on (source, event_id)",
        ),
        Some(key) if key.iter().map(String::as_str).eq(["source", "event_id"]) => pass(
            "inbox.key",
            "breakwater_inbox is keyed on (source, event_id): a redelivery has no second effect",
        ),
        Some(key) => flag(
            "inbox.key",
            Verdict::Fail,
            format!("breakwater_inbox is keyed on ({})", key.join(", ")),
            "rename the old table (ALTER TABLE breakwater_inbox RENAME TO \
             breakwater_inbox_old) and restart, so the inbox is made keyed on \
             (source, event_id)",
        ),
    });
    out
}

fn pool(config: &Config) -> Finding {
    let s = &config.sink;
    const CHECK: &str = "sink.pool";
    if s.acquire_timeout_ms > 5_000 {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "pool of {}, but a worker waits up to {} ms for a connection: saturation \
                 surfaces late",
                s.pool_max, s.acquire_timeout_ms
            ),
            "set sink.acquire_timeout_ms to 2000 or less",
        )
    } else {
        pass(
            CHECK,
            format!(
                "bounded pool of {} with a {} ms acquire timeout",
                s.pool_max, s.acquire_timeout_ms
            ),
        )
    }
}

fn retries(config: &Config) -> Finding {
    let w = &config.workers;
    const CHECK: &str = "workers.retries";
    if w.backoff_jitter != BackoffJitter::Full {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "retry backoff without full jitter ({:?}): retries of one burst come back \
                 together",
                w.backoff_jitter
            ),
            "set workers.backoff_jitter = \"full\"",
        )
    } else if w.max_attempts < 2 {
        flag(
            CHECK,
            Verdict::Warn,
            "one attempt: a transient failure dead-letters at once",
            "set workers.max_attempts to 5",
        )
    } else {
        pass(
            CHECK,
            format!(
                "{} attempts, full jitter from {} ms capped at {} ms",
                w.max_attempts, w.backoff_base_ms, w.backoff_cap_ms
            ),
        )
    }
}

fn signals(config: &Config) -> Finding {
    let b = &config.breaker;
    const CHECK: &str = "breaker.signals";
    let off: Vec<&str> = [
        ("failure_ratio", b.failure_ratio.enabled),
        ("slow_calls", b.slow_calls.enabled),
        ("dlq", b.dlq.enabled),
        ("in_flight", b.in_flight.enabled),
        ("lock_wait", b.lock_wait.enabled),
        ("db_lock_waiters", b.db_lock_waiters.enabled),
    ]
    .into_iter()
    .filter(|(_, on)| !on)
    .map(|(name, _)| name)
    .collect();
    if b.dry_run {
        flag(
            CHECK,
            Verdict::Warn,
            "the breaker is in dry-run: it reports, it protects nothing",
            "set breaker.dry_run = false once its decisions look right",
        )
    } else if !b.failure_ratio.enabled {
        flag(
            CHECK,
            Verdict::Fail,
            "the failure-ratio signal is off: a failing database is never noticed",
            "set breaker.failure_ratio.enabled = true",
        )
    } else if off.is_empty() {
        pass(CHECK, "every signal is on")
    } else {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "off: {}{}",
                off.join(", "),
                if off.contains(&"dlq") {
                    " (dlq is off by default, by design: a poison burst must not trip the \
                     breaker; it is a signal for a fleet whose poison is rare)"
                } else {
                    ""
                }
            ),
            "turn on what fits your traffic, or accept the gap knowingly",
        )
    }
}

fn probes_and_ramp(config: &Config) -> Finding {
    let b = &config.breaker;
    const CHECK: &str = "breaker.half_open";
    if b.half_open.max_probes > 5 {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "{} probes at once half-open: a database still down takes them all",
                b.half_open.max_probes
            ),
            "set breaker.half_open.max_probes to 1-3",
        )
    } else if b.ramp.steps.is_empty() {
        flag(
            CHECK,
            Verdict::Warn,
            "no ramp: after the probes the whole pool returns at once",
            "set breaker.ramp.steps, e.g. [0.1, 0.25, 0.5, 1.0]",
        )
    } else {
        pass(
            CHECK,
            format!(
                "{} probe(s), then a ramp through {:?} of the pool",
                b.half_open.max_probes, b.ramp.steps
            ),
        )
    }
}

fn redelivery(config: &Config, live: &Live) -> Finding {
    const CHECK: &str = "queue.redelivery";
    let max_attempts = config.workers.max_attempts;
    match &live.redelivery_limit {
        Err(e) => flag(
            CHECK,
            Verdict::Warn,
            format!("the queue could not be opened to read its own redelivery limit: {e}"),
            "check [queue] and that the broker is reachable from here",
        ),
        Ok(limit) => match crate::queue::redelivery_warning(*limit, max_attempts) {
            Some(warning) => flag(
                CHECK,
                Verdict::Warn,
                warning,
                "raise the queue's maxReceiveCount (its redrive policy), or drop the policy: \
                 Breakwater dead-letters failed messages itself, with their reason",
            ),
            None => pass(
                CHECK,
                format!(
                    "{} backend: attempts are counted apart from redeliveries and end in the \
                     DLQ after {max_attempts}; a release never counts one{}",
                    config.queue.backend,
                    limit.map_or_else(String::new, |l| format!(
                        "; the queue's own limit of {l} receives leaves room for releases"
                    )),
                ),
            ),
        },
    }
}

/// The queue keeps a message longer than the longest plausible outage,
/// with room to drain the backlog after it: a message the broker expires
/// is lost, whatever the breaker did.
fn retention(config: &Config, assumed: &Assumptions) -> Finding {
    const CHECK: &str = "queue.retention";
    let outage = assumed.plausible_outage.as_secs();
    let backend = config.queue.backend.as_str();
    let hours = |secs: u64| format!("{:.1} h", secs as f64 / 3600.0);
    let set_it = "set queue.retention_secs to the broker's retention (SQS \
                  MessageRetentionPeriod, Kafka retention.ms, a NATS max_age), so doctor and \
                  the retention-headroom alert can check it";
    match config.queue.retention_secs {
        Some(kept) if kept <= outage => flag(
            CHECK,
            Verdict::Fail,
            format!(
                "the queue keeps a message {} and an outage of {} is plausible: the oldest \
                 webhooks would expire before the database is back",
                hours(kept),
                hours(outage)
            ),
            format!(
                "raise the broker's retention well past {} (SQS allows 14 days), and \
                 queue.retention_secs with it",
                hours(outage)
            ),
        ),
        Some(kept) if kept < outage.saturating_mul(2) => flag(
            CHECK,
            Verdict::Warn,
            format!(
                "the queue keeps a message {}, under twice the plausible outage ({}): the \
                 backlog of such an outage must also drain before its oldest expire",
                hours(kept),
                hours(outage)
            ),
            format!(
                "raise the broker's retention to at least {}",
                hours(outage.saturating_mul(2))
            ),
        ),
        Some(kept) => pass(
            CHECK,
            format!(
                "the queue keeps a message {}, over twice the plausible outage ({}); \
                 breakwater_retention_headroom_seconds warns {} before the oldest expires",
                hours(kept),
                hours(outage),
                hours(config.queue.retention_warn_secs)
            ),
        ),
        None if SINGLE_NODE_BACKENDS.contains(&backend)
            || matches!(backend, "rabbitmq" | "nats") =>
        {
            pass(
                CHECK,
                format!(
                    "the {backend} queue keeps a message until it is applied or dead-lettered (no \
                 expiry here; a broker policy or max_age set outside Breakwater would change \
                 that: then {set_it})"
                ),
            )
        }
        None => flag(
            CHECK,
            Verdict::Warn,
            format!(
                "the {backend} broker drops messages after its retention (SQS: 4 days unless \
                 set; Kafka: the topic's retention.ms), and the config does not say how long \
                 it is, so nothing checks it against an outage of {}",
                hours(outage)
            ),
            set_it,
        ),
    }
}

/// With `[fleet]`: a broker every process can share, Redis reachable, a
/// lease holder, no node deciding alone. Without, nothing to say.
fn fleet(config: &Config, live: &Live) -> Option<Finding> {
    const CHECK: &str = "fleet";
    let fleet = config.fleet.as_ref()?;
    if SINGLE_NODE_BACKENDS.contains(&config.queue.backend.as_str()) {
        return Some(flag(
            CHECK,
            Verdict::Fail,
            format!(
                "[fleet] with the {} queue: its store belongs to one process, so the fleet's \
                 processes cannot share its webhooks",
                config.queue.backend
            ),
            "use a broker backend ([queue] backend = \"rabbitmq\", \"nats\", \"kafka\" or \
             \"sqs\") for a fleet, or drop [fleet] on a single node",
        ));
    }
    let redis = crate::config::redact_url(&fleet.redis_url);
    let view = match live.fleet.as_ref()? {
        Err(e) => {
            return Some(flag(
                CHECK,
                Verdict::Warn,
                format!(
                    "Redis at {redis} could not be read ({e}): every node decides alone \
                     (webhooks keep flowing)"
                ),
                "check fleet.redis_url and that Redis is reachable from the nodes",
            ));
        }
        Ok(v) => v,
    };
    let now_ms = breakwater_fleet::now_ms();
    let ttl_ms = config.breaker.lock_wait.heartbeat_ttl_ms;
    let live_nodes: Vec<&breakwater_fleet::NodeBeat> = view
        .beats
        .iter()
        .filter(|b| now_ms.saturating_sub(b.at_ms) <= ttl_ms)
        .collect();
    let alone: Vec<&str> = live_nodes
        .iter()
        .filter(|b| b.fallback)
        .map(|b| b.node.as_str())
        .collect();
    let workers = live_nodes.iter().filter(|b| b.role.runs_workers()).count();
    let holder = view.lease.as_ref().map(|l| l.holder.as_str());
    Some(if !alone.is_empty() {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "node(s) {} said they could not reach Redis and decided alone",
                alone.join(", ")
            ),
            "check those nodes' route to Redis; they rejoin by themselves once it answers",
        )
    } else if workers > 0 && holder.is_none() {
        flag(
            CHECK,
            Verdict::Warn,
            format!(
                "{workers} worker node(s) beating under prefix {}, none holds the controller lease",
                fleet.prefix
            ),
            "a worker takes a free lease at its next beat; if this stays, check the nodes' logs",
        )
    } else {
        pass(
            CHECK,
            format!(
                "Redis at {redis}, prefix {}: {} node(s) beating ({workers} with workers), \
                 lease held by {}",
                fleet.prefix,
                live_nodes.len(),
                holder.unwrap_or("nobody (no worker has started)")
            ),
        )
    })
}

/// Whether any finding failed.
pub fn failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.verdict == Verdict::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(lock: u64, statement: u64, idle: u64) -> DatabaseAudit {
        DatabaseAudit {
            role: "app".into(),
            lock_timeout_ms: lock,
            statement_timeout_ms: statement,
            idle_in_transaction_timeout_ms: idle,
            inbox_key: Some(vec!["source".into(), "event_id".into()]),
        }
    }

    fn verdict(findings: &[Finding], check: &str) -> Verdict {
        findings
            .iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check} in {findings:?}"))
            .verdict
    }

    fn live(database: DatabaseAudit) -> Live {
        Live {
            sources: Ok(1),
            exposed_secrets_files: Vec::new(),
            database: Ok(Some(database)),
            redelivery_limit: Ok(None),
            fleet: None,
        }
    }

    #[test]
    fn a_secrets_file_others_may_read_is_a_warning() {
        let config = Config::default();
        let mut l = live(db(1000, 5000, 60_000));
        let checks = |l: &Live| -> Vec<&'static str> {
            audit(&config, l, &Assumptions::default())
                .iter()
                .map(|f| f.check)
                .collect()
        };
        assert!(!checks(&l).contains(&"sources.secrets_files"));
        l.exposed_secrets_files = vec!["source \"a\": ... mode 644".into()];
        assert_eq!(
            verdict(
                &audit(&config, &l, &Assumptions::default()),
                "sources.secrets_files"
            ),
            Verdict::Warn
        );
    }

    #[test]
    fn a_fleet_needs_a_broker_redis_and_a_lease_holder() {
        use breakwater_fleet::{FleetView, Lease, NodeBeat, NodeRole};
        let mut config = Config::default();
        let mut l = live(db(1000, 5000, 60_000));
        assert!(
            audit(&config, &l, &Assumptions::default())
                .iter()
                .all(|f| f.check != "fleet"),
            "no fleet, nothing said"
        );
        config.fleet = Some(crate::config::FleetConfig {
            redis_url: "redis://127.0.0.1:6379".into(),
            prefix: "bw".into(),
            node_id: None,
            beat_ms: 1000,
            lease_ms: 3000,
        });
        l.fleet = Some(Ok(FleetView::default()));
        assert_eq!(
            verdict(&audit(&config, &l, &Assumptions::default()), "fleet"),
            Verdict::Fail,
            "embedded queue"
        );
        config.queue.backend = "rabbitmq".into();
        assert_eq!(
            verdict(&audit(&config, &l, &Assumptions::default()), "fleet"),
            Verdict::Pass,
            "nothing started yet"
        );
        let beat = |node: &str, fallback: bool| NodeBeat {
            node: node.into(),
            role: NodeRole::Worker,
            at_ms: breakwater_fleet::now_ms(),
            state: None,
            generation: 1,
            fallback,
            slots: Vec::new(),
            outcomes: Default::default(),
        };
        l.fleet = Some(Ok(FleetView {
            lease: None,
            record: None,
            beats: vec![beat("w1", false)],
        }));
        assert_eq!(
            verdict(&audit(&config, &l, &Assumptions::default()), "fleet"),
            Verdict::Warn,
            "no holder"
        );
        l.fleet = Some(Ok(FleetView {
            lease: Some(Lease {
                holder: "w1".into(),
                expires_at_ms: 0,
            }),
            record: None,
            beats: vec![beat("w1", false), beat("w2", true)],
        }));
        let f = audit(&config, &l, &Assumptions::default());
        assert_eq!(verdict(&f, "fleet"), Verdict::Warn, "w2 alone");
        l.fleet = Some(Ok(FleetView {
            lease: Some(Lease {
                holder: "w1".into(),
                expires_at_ms: 0,
            }),
            record: None,
            beats: vec![beat("w1", false)],
        }));
        assert_eq!(
            verdict(&audit(&config, &l, &Assumptions::default()), "fleet"),
            Verdict::Pass
        );
        l.fleet = Some(Err("connection refused".into()));
        let f = audit(&config, &l, &Assumptions::default());
        assert_eq!(verdict(&f, "fleet"), Verdict::Warn);
        assert!(!failed(&f));
    }

    #[test]
    fn retention_is_checked_against_the_plausible_outage() {
        let l = live(db(1000, 5000, 60_000));
        let assumed = Assumptions {
            plausible_outage: std::time::Duration::from_secs(3600),
        };
        let mut config = Config::default();
        assert_eq!(
            verdict(&audit(&config, &l, &assumed), "queue.retention"),
            Verdict::Pass,
            "the embedded queue expires nothing"
        );
        config.queue.backend = "sqs".to_owned();
        assert_eq!(
            verdict(&audit(&config, &l, &assumed), "queue.retention"),
            Verdict::Warn,
            "a broker retention nobody declared"
        );
        for (kept, expected) in [
            (3600, Verdict::Fail),
            (1800, Verdict::Fail),
            (5400, Verdict::Warn),
            (7200, Verdict::Pass),
            (345_600, Verdict::Pass),
        ] {
            config.queue.retention_secs = Some(kept);
            let findings = audit(&config, &l, &assumed);
            assert_eq!(verdict(&findings, "queue.retention"), expected, "{kept} s");
        }
        config.queue.retention_secs = Some(1800);
        let findings = audit(&config, &l, &assumed);
        let f = findings
            .iter()
            .find(|f| f.check == "queue.retention")
            .expect("finding");
        assert!(f.detail.contains("0.5 h"), "{}", f.detail);
        assert!(
            f.fix
                .as_deref()
                .is_some_and(|fix| fix.contains("retention"))
        );
        assert!(failed(&findings), "a fail fails the run");
    }

    #[test]
    fn a_broker_redelivery_limit_without_room_for_releases_is_a_warning() {
        let config = Config::default();
        let mut l = live(db(1000, 5000, 60_000));
        assert_eq!(
            verdict(
                &audit(&config, &l, &Assumptions::default()),
                "queue.redelivery"
            ),
            Verdict::Pass
        );
        l.redelivery_limit = Ok(Some(1000));
        assert_eq!(
            verdict(
                &audit(&config, &l, &Assumptions::default()),
                "queue.redelivery"
            ),
            Verdict::Pass
        );
        l.redelivery_limit = Ok(Some(5));
        let f = audit(&config, &l, &Assumptions::default());
        assert_eq!(verdict(&f, "queue.redelivery"), Verdict::Warn);
        assert!(!failed(&f), "a warning, not a failure");
        l.redelivery_limit = Err("unreachable".into());
        assert_eq!(
            verdict(
                &audit(&config, &l, &Assumptions::default()),
                "queue.redelivery"
            ),
            Verdict::Warn
        );
    }

    #[test]
    fn a_role_without_lock_timeout_or_with_inverted_timeouts_fails() {
        let config = Config::default();
        let f = audit(&config, &live(db(0, 0, 0)), &Assumptions::default());
        assert_eq!(verdict(&f, "role.lock_timeout"), Verdict::Fail);
        assert_eq!(verdict(&f, "role.statement_timeout"), Verdict::Warn);
        assert!(failed(&f));
        let f = audit(
            &config,
            &live(db(2_000, 1_000, 10_000)),
            &Assumptions::default(),
        );
        assert_eq!(verdict(&f, "role.statement_timeout"), Verdict::Fail);
        let fix = f
            .iter()
            .find(|x| x.check == "role.statement_timeout")
            .and_then(|x| x.fix.clone())
            .unwrap_or_default();
        assert!(
            fix.starts_with("ALTER ROLE app SET statement_timeout"),
            "{fix}"
        );
    }

    #[test]
    fn a_well_set_role_and_the_defaults_pass() {
        let f = audit(
            &Config::default(),
            &live(db(1_000, 5_000, 10_000)),
            &Assumptions::default(),
        );
        assert!(!failed(&f), "{f:#?}");
        for check in [
            "role.lock_timeout",
            "role.statement_timeout",
            "role.idle_in_transaction_session_timeout",
            "inbox.key",
            "sink.pool",
            "workers.retries",
            "breaker.half_open",
        ] {
            assert_eq!(verdict(&f, check), Verdict::Pass, "{check}: {f:#?}");
        }
    }

    #[test]
    fn an_inbox_on_the_old_key_and_unloadable_secrets_fail() {
        let mut d = db(1_000, 5_000, 10_000);
        d.inbox_key = Some(vec!["event_id".into()]);
        let mut l = live(d);
        l.sources = Err("STRIPE_SECRETS is not set".into());
        let f = audit(&Config::default(), &l, &Assumptions::default());
        assert_eq!(verdict(&f, "inbox.key"), Verdict::Fail);
        assert_eq!(verdict(&f, "sources.signatures"), Verdict::Fail);
    }

    #[test]
    fn a_breaker_that_cannot_see_failures_fails() {
        let mut config = Config::default();
        config.breaker.failure_ratio.enabled = false;
        let f = audit(
            &config,
            &live(db(1_000, 5_000, 10_000)),
            &Assumptions::default(),
        );
        assert_eq!(verdict(&f, "breaker.signals"), Verdict::Fail);
    }
}
