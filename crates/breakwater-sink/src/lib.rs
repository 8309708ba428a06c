//! Sinks: where workers apply webhooks, idempotently, and how their
//! failures are classified.
//!
//! A sink applies one event in one short transaction: insert the source
//! and event id into the inbox table (`breakwater_inbox`, keyed on
//! `(source, event_id)` like the queue's dedup, so two sources may carry
//! the same event id), and only if that insert was new, run the source's
//! configured statements with parameters bound from the event. A
//! redelivery finds the inbox row and has no second effect.
//!
//! **Stale events.** A source with a version (`version = "json:/created"`
//! or a header: [`SinkSettings::versions`], read and normalised to an
//! integer by the `version` module) has, per entity key, the newest version
//! applied kept in `breakwater_versions (source, entity_key, version,
//! event_id)`, in the same transaction. A new event of a key whose stored
//! version is higher is [`Applied::Superseded`]: its statements do not run,
//! its inbox row is kept with `superseded_by` naming the newer event, and
//! the transaction commits. An equal or higher version applies (and is
//! stored); an event without a key or a version applies as if there were
//! no guard. PostgreSQL does it in the inbox insert's own statement (an
//! `ON CONFLICT ... DO UPDATE ... WHERE` whose row lock orders two sessions
//! of one key), so it costs no round trip.
//!
//! [`connect`] creates the inbox table if it is missing and prepares every
//! configured statement once, so a statement naming an undefined table or
//! column, a syntax error or (PostgreSQL) a parameter whose type cannot be
//! inferred stops startup with a [`SinkSetupError::Statement`]. The tables
//! the statements write to must therefore exist when the sink connects:
//! create them (run the application's migrations) before starting the
//! service.
//!
//! Failures carry a [`FailureClass`]: *dependency* failures (the database
//! is slow, locked, saturated or unreachable) are retried and feed the
//! breaker; *permanent* failures (the payload violates a constraint, is not
//! JSON, lacks a field a statement needs) go to the DLQ at once and never
//! feed the breaker.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

pub mod codes;
mod forward;
mod inbox;
mod param;
mod postgres;
mod routed;
mod settings;
mod sqlite;
mod statement;
mod target_gate;
mod version;

pub use forward::{ForwardSpec, ForwardTarget};
pub use inbox::{InboxLookup, InboxRecord};
pub use postgres::DatabaseAudit;
pub use routed::RoutedSink;
pub use settings::{LockWaitersScope, SinkSettings, redact_http_url, redact_url};

/// One webhook to apply.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub entity_key: Option<&'a str>,
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
    /// Milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    /// This attempt's number: 1 the first time, 2 for the first retry.
    pub attempt: u32,
}

/// What applying did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// First time: the inbox row was inserted and the statements ran.
    New,
    /// This source's event id was already in the inbox: nothing ran.
    Duplicate,
    /// First time, but its entity key already holds a newer version
    /// (applied by event `by`): the inbox row was inserted (with
    /// `superseded_by`) and the statements did not run. Settled like a
    /// success.
    Superseded { by: String },
}

/// Whether a failure is the database's or the message's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// Lock/statement timeout, deadlock, serialization failure, too many
    /// connections, pool acquire timeout, connection refused or lost.
    Dependency,
    /// Constraint violation, invalid JSON, a data error caused by the
    /// payload, a missing parameter.
    Permanent,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dependency => "dependency",
            Self::Permanent => "permanent",
        }
    }
}

/// A failed apply.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct SinkError {
    pub class: FailureClass,
    /// Short stable name: `lock_timeout`, `statement_timeout`, `deadlock`,
    /// `serialization`, `too_many_connections`, `pool_timeout`,
    /// `connection`, `constraint`, `invalid_json`, `missing_param`,
    /// `data`, `sql` ...
    ///
    /// Also: `busy` (SQLite's lock timeout), `resources` (disk full, out of
    /// memory, I/O error: dependency), `database` (an unrecognised database
    /// error: dependency), `raised` (PostgreSQL `RAISE EXCEPTION`, e.g. a
    /// trigger rejecting the row: permanent), `invalid_version` (the
    /// source's version is present but not a version: permanent). `sql` (SQLSTATE class 42,
    /// SQLite `SQLITE_ERROR`) is a bug in the configured statement, not in
    /// the message; it is permanent so that it dead-letters instead of
    /// tripping the breaker.
    pub kind: &'static str,
    /// SQLSTATE (PostgreSQL), extended result code (SQLite) or HTTP
    /// status (forward), if any.
    pub code: Option<String>,
    pub message: String,
    /// How long the dependency asked to be left alone (an HTTP
    /// `Retry-After`): the retry waits at least this long, within the
    /// backoff cap.
    pub retry_after: Option<std::time::Duration>,
    /// Set when the failure is one forward target's, in a process that
    /// forwards to several (its own gate weighs it, not the process's
    /// breaker); `None` for the database's or a lone target's.
    pub target: Option<TargetFailure>,
}

/// A failure of one of several forward targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetFailure {
    /// The target's gate was open or probing, or this failure opened it:
    /// the target's fault, not the message's. The message goes back
    /// untried (no attempt counted) for `retry_after`.
    pub in_trouble: bool,
}

impl SinkError {
    /// A failure of the database (retried, feeds the breaker).
    /// The error as a log line may show it. A permanent failure's message
    /// can quote the payload (a constraint's DETAIL names the values, an
    /// invalid input is repeated): only its kind, code and constraint are
    /// kept here, and the whole message goes to the DLQ entry alone. A
    /// dependency failure's message is about the database, and is kept.
    pub fn log_summary(&self) -> String {
        if self.class == FailureClass::Dependency {
            return self.to_string();
        }
        let mut s = self.kind.to_owned();
        if let Some(code) = &self.code {
            s.push_str(&format!(" (SQLSTATE {code})"));
        }
        if let Some(constraint) = self
            .message
            .rsplit_once("[constraint ")
            .and_then(|(_, rest)| rest.strip_suffix(']'))
        {
            s.push_str(&format!(" on constraint {constraint}"));
        }
        s
    }

    pub fn dependency(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            class: FailureClass::Dependency,
            kind,
            code: None,
            message: message.into(),
            retry_after: None,
            target: None,
        }
    }

    /// A failure of this one message (dead-lettered at once).
    pub fn permanent(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            class: FailureClass::Permanent,
            kind,
            code: None,
            message: message.into(),
            retry_after: None,
            target: None,
        }
    }

    /// Sets the SQLSTATE or SQLite result code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn is_dependency(&self) -> bool {
        self.class == FailureClass::Dependency
    }

    pub fn is_permanent(&self) -> bool {
        self.class == FailureClass::Permanent
    }

    pub fn is_lock_related(&self) -> bool {
        matches!(self.kind, "lock_timeout" | "deadlock" | "busy")
    }

    /// The dependency could not be reached, or had no session to give:
    /// whatever the message, it was not tried, so the failure is never
    /// the message's own.
    pub fn is_unreachable(&self) -> bool {
        self.class == FailureClass::Dependency
            && matches!(
                self.kind,
                "connection" | "pool_timeout" | "too_many_connections"
            )
    }
}

/// Statements configured for one source: SQL with `$name` parameters, and
/// where each name's value comes from (`json:/pointer` or `header:Name`).
/// Built-in names need no entry: `$entity`, `$event_id`, `$source`,
/// `$payload` (the body as JSON), `$version` (the event's version as a
/// bigint, `NULL` when it carries none; only for a source with a version).
#[derive(Debug, Clone, Default)]
pub struct StatementSpec {
    pub sql: String,
    pub params: BTreeMap<String, String>,
}

/// Why a sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SinkSetupError {
    #[error("unsupported sink URL \"{0}\": expected postgres://... or sqlite://...")]
    UnsupportedUrl(String),
    #[error("source \"{source_name}\", statement {index}: {message}")]
    Statement {
        source_name: String,
        index: usize,
        message: String,
    },
    #[error("cannot connect to the sink: {0}")]
    Connect(String),
    /// The database did not answer (refused, timed out, full, starting
    /// up): unlike the other variants, trying again later may succeed.
    #[error("the sink's database does not answer: {0}")]
    Unreachable(String),
    #[error("cannot create the inbox table: {0}")]
    Migrate(String),
    #[error("invalid sink settings: {0}")]
    Settings(String),
}

/// The [`SinkSetupError::Migrate`] message for an inbox table whose primary
/// key is not `(source, event_id)`: `key` is what was found, in key order.
fn old_inbox_key(key: &[String]) -> String {
    let found = if key.is_empty() {
        "breakwater_inbox has no primary key".to_owned()
    } else {
        format!("breakwater_inbox has primary key ({})", key.join(", "))
    };
    format!(
        "{found}, but the inbox must be keyed on (source, event_id) and an older table is \
         not migrated: once no worker is applying, rename it (ALTER TABLE breakwater_inbox \
         RENAME TO breakwater_inbox_old) or drop it, and restart to create the new one; \
         events recorded only in the old table are then no longer recognised as duplicates"
    )
}

/// Sessions waiting on locks, as the database sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockSnapshot {
    /// Sessions whose `wait_event_type` is `Lock`.
    pub waiting: u32,
    /// Distinct pids blocking them (`pg_blocking_pids`).
    pub blockers: Vec<i32>,
}

/// Builds the sink `settings.url` names: PostgreSQL for `postgres://` and
/// `postgresql://`, SQLite for `sqlite://path` (the parent directory is
/// created) and `sqlite::memory:`.
///
/// Validates the settings, compiles every source's statements (an unknown
/// `$name` or a malformed `params` entry is a [`SinkSetupError::Statement`]),
/// connects, creates the inbox table if it is missing (an existing one not
/// keyed on `(source, event_id)` is a [`SinkSetupError::Migrate`]) and
/// prepares every statement once: one the database rejects is a
/// [`SinkSetupError::Statement`] with the database's message. The tables the
/// statements name must already exist.
pub async fn connect(
    settings: &SinkSettings,
    statements: &BTreeMap<String, Vec<StatementSpec>>,
) -> Result<Arc<dyn Sink>, SinkSetupError> {
    let dialect = dialect_of(settings)?;
    let compiled = statement::compile_all(statements, &settings.versions, dialect)?;
    Ok(match dialect {
        statement::Dialect::Postgres => {
            Arc::new(postgres::PgSink::connect(settings, compiled).await?)
        }
        statement::Dialect::Sqlite => Arc::new(sqlite::SqliteSink::open(settings, compiled).await?),
    })
}

/// Every check [`connect`] makes short of connecting: the settings, the
/// URL's scheme, and each statement compiled for that database (an
/// undeclared `$parameter`, a bad parameter spec). `config check` runs it.
pub fn check(
    settings: &SinkSettings,
    statements: &BTreeMap<String, Vec<StatementSpec>>,
) -> Result<(), SinkSetupError> {
    statement::compile_all(statements, &settings.versions, dialect_of(settings)?)?;
    Ok(())
}

/// What `breakwater doctor` reads from the sink's database: the role's
/// session defaults and the inbox's key (PostgreSQL; `Ok(None)` for
/// SQLite, which has neither).
pub async fn audit_database(settings: &SinkSettings) -> Result<Option<DatabaseAudit>, String> {
    match dialect_of(settings).map_err(|e| e.to_string())? {
        statement::Dialect::Postgres => postgres::audit::audit(
            &settings.url,
            settings
                .acquire_timeout
                .max(std::time::Duration::from_secs(5)),
        )
        .await
        .map(Some)
        .map_err(|e| format!("{}: {e}", redact_url(&settings.url))),
        statement::Dialect::Sqlite => Ok(None),
    }
}

/// The database `settings` name, once they are valid.
fn dialect_of(settings: &SinkSettings) -> Result<statement::Dialect, SinkSetupError> {
    settings.validate()?;
    let url = settings.url.trim();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(statement::Dialect::Postgres)
    } else if url.starts_with("sqlite:") {
        Ok(statement::Dialect::Sqlite)
    } else {
        Err(SinkSetupError::UnsupportedUrl(settings::redact_url(url)))
    }
}

/// A database that applies webhooks.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Applies one event idempotently in one transaction.
    async fn apply(&self, event: &Event<'_>) -> Result<Applied, SinkError>;
    /// The database's view of lock waits (PostgreSQL); `None` where the
    /// database has no such view.
    async fn lock_snapshot(&self) -> Option<LockSnapshot> {
        None
    }
    /// A cheap check that the dependency can be reached again (a TCP
    /// connect, nothing sent), for a breaker held open by connection
    /// failures; `None` where the sink has no such check (the database
    /// sinks: [`Sink::lock_snapshot`] answering says as much).
    async fn reachable(&self) -> Option<bool> {
        None
    }
    /// Connections in use and the pool's maximum.
    fn pool_usage(&self) -> (usize, usize);
    /// The inbox row of `source`'s event `event_id`, read on one pooled
    /// connection (the admin API's event lookup; never on the hot path).
    async fn inbox_lookup(&self, source: &str, event_id: &str) -> Result<InboxLookup, SinkError> {
        let _ = (source, event_id);
        Ok(InboxLookup::NotKept)
    }
    /// Where `source`'s events are applied, for people: the database (its
    /// URL without credentials) or the forward target.
    fn destination(&self, source: &str) -> String {
        let _ = source;
        "the database".to_owned()
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    #[test]
    fn a_permanent_failure_logs_no_payload_values() {
        let e = SinkError {
            class: FailureClass::Permanent,
            kind: "constraint",
            code: Some("23505".into()),
            retry_after: None,
            target: None,
            message: "duplicate key value violates unique constraint \"orders_pkey\" \
                      (Key (email)=(alice@example.com) already exists.) [constraint orders_pkey]"
                .into(),
        };
        let logged = e.log_summary();
        assert!(!logged.contains("alice"), "{logged}");
        assert_eq!(
            logged,
            "constraint (SQLSTATE 23505) on constraint orders_pkey"
        );
        assert!(e.to_string().contains("alice"), "the DLQ keeps the detail");
        let dep = SinkError::dependency("lock_timeout", "canceling statement due to lock timeout");
        assert_eq!(dep.log_summary(), dep.to_string());
    }
}
