//! The PostgreSQL sink: a bounded deadpool of tokio-postgres sessions, one
//! short transaction per event under `SET LOCAL lock_timeout` and
//! `statement_timeout`, parameters converted to the types PostgreSQL infers
//! for them and encoded before `BEGIN` (`values`), and a dedicated sampler
//! session for `pg_stat_activity`.
//!
//! Round trips per new event: two, pipelined. `BEGIN; SET LOCAL ...; SET
//! LOCAL ...` (one simple-query batch) with the inbox insert (which also
//! sets `applied_at`: `now()` is the transaction's timestamp, so a later
//! `UPDATE` would write the same value); then every configured statement
//! with `COMMIT`. A duplicate costs the first and a `COMMIT`. An event
//! under the stale-event guard (its source has a version, and it carries
//! one and an entity key) is inserted by [`INSERT_VERSIONED`] instead,
//! which also keeps its key's newest version in the same statement; a
//! superseded one's second round trip marks its inbox row and commits,
//! running no statement. Statements
//! are prepared once per connection (`prepare_cached`), and once more at
//! [`PgSink::connect`] to check them; an apply prepares before its `BEGIN`,
//! so sessions get `lock_timeout` as a startup option too (parsing locks
//! the tables a statement names), with `idle_in_transaction_session_timeout`,
//! which costs no round trip. `SET LOCAL` still sets both timeouts for each
//! transaction.
//!
//! A failed apply sends `ROLLBACK` only when its transaction may still be
//! open (it failed between `BEGIN` and `COMMIT`, `COMMIT` got no answer,
//! or the link failed while preparing): a statement's error aborts the transaction and the pipelined
//! `COMMIT` behind it rolls back, so a lock timeout costs no third round
//! trip. A transaction that does not end cleanly (the apply future is
//! dropped, a client-side deadline passes, `ROLLBACK` fails) takes its
//! connection out of the pool and closes it, so no pooled session is ever
//! handed out inside an open transaction; the server rolls back when the
//! socket closes.

pub(crate) mod audit;
pub use self::audit::DatabaseAudit;
mod classify;
mod values;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures_util::future::{join, join_all};
use serde_json::Value;
use tokio::sync::Mutex;
use tokio_postgres::{Config, NoTls};

use self::classify::{classify, classify_pool};
use self::values::bind_param;
use crate::param::ParamValue;
use crate::settings::{LockWaitersScope, SinkSettings, millis};
use crate::statement::{Bound, Compiled, CompiledStatement, bind};
use crate::{
    Applied, Event, FailureClass, InboxLookup, InboxRecord, LockSnapshot, Sink, SinkError,
    SinkSetupError,
};

/// Run at every start. `client_min_messages` keeps the server's NOTICE
/// that the table already exists (every start but the first) out of the
/// log.
const MIGRATION: &str = "\
BEGIN;
SET LOCAL client_min_messages = warning;
SELECT pg_advisory_xact_lock(7306115632147616117);
CREATE TABLE IF NOT EXISTS breakwater_inbox (
    event_id    text NOT NULL,
    source      text NOT NULL,
    entity_key  text,
    payload     jsonb,
    received_at timestamptz NOT NULL,
    applied_at  timestamptz,
    superseded_by text,
    PRIMARY KEY (source, event_id)
);
DO $$
BEGIN
    -- An inbox made before the stale-event guard: added once. Checked
    -- first, since ALTER TABLE locks the inbox even when it does nothing.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'breakwater_inbox'::regclass
                     AND attname = 'superseded_by' AND NOT attisdropped) THEN
        ALTER TABLE breakwater_inbox ADD COLUMN IF NOT EXISTS superseded_by text;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS breakwater_versions (
    source     text NOT NULL,
    entity_key text NOT NULL,
    version    bigint NOT NULL,
    event_id   text NOT NULL,
    PRIMARY KEY (source, entity_key)
);
COMMIT;";

/// The inbox's primary key columns, in key order (empty without one).
const INBOX_KEY: &str = "\
SELECT coalesce(array_agg(a.attname::text ORDER BY array_position(c.conkey, a.attnum)), '{}')
FROM pg_constraint c
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
WHERE c.conrelid = 'breakwater_inbox'::regclass AND c.contype = 'p'";

const INSERT_INBOX: &str = "\
INSERT INTO breakwater_inbox (event_id, source, entity_key, payload, received_at, applied_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (source, event_id) DO NOTHING";

/// [`INSERT_INBOX`] for an event under the stale-event guard (`$6` its
/// version), in one statement: only if the inbox row is new, its key's
/// version row is inserted, or updated when it is not newer than this
/// event's. Answers whether the inbox row is new and whether the version
/// was stored: new and not stored is superseded. The conflict's row lock
/// (taken even when the `WHERE` refuses the update) holds a second session
/// of the same key until this transaction ends, which then compares with
/// what this one committed.
const INSERT_VERSIONED: &str = "\
WITH inbox AS (
    INSERT INTO breakwater_inbox (event_id, source, entity_key, payload, received_at, applied_at)
    VALUES ($1, $2, $3, $4, $5, now())
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING event_id
), newest AS (
    INSERT INTO breakwater_versions AS v (source, entity_key, version, event_id)
    SELECT $2, $3, $6::int8, event_id FROM inbox
    ON CONFLICT (source, entity_key) DO UPDATE
        SET version = EXCLUDED.version, event_id = EXCLUDED.event_id
        WHERE v.version <= EXCLUDED.version
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM inbox), EXISTS (SELECT 1 FROM newest)";

/// Marks a superseded event's inbox row with the event that holds its
/// key's newer version (locked by [`INSERT_VERSIONED`], so it is the one
/// that was compared), and names it.
const SUPERSEDE: &str = "\
UPDATE breakwater_inbox AS i SET superseded_by = v.event_id
FROM breakwater_versions AS v
WHERE i.source = $1 AND i.event_id = $2 AND v.source = $1 AND v.entity_key = $3
RETURNING v.event_id";

/// One event's inbox row, times as milliseconds since the Unix epoch.
const SELECT_INBOX: &str = "\
SELECT (extract(epoch FROM received_at) * 1000)::int8,
       (extract(epoch FROM applied_at) * 1000)::int8,
       entity_key, superseded_by
FROM breakwater_inbox WHERE source = $1 AND event_id = $2";

/// Sessions waiting on a lock, and who blocks them. Breakwater's sessions
/// are those with the sampler's own `application_name` (the apply pool's:
/// read from the session, so a name PostgreSQL truncated still matches);
/// `$1` counts every waiter of the database instead of those that concern
/// Breakwater (see [`LockWaitersScope`]).
const LOCK_SNAPSHOT: &str = "\
WITH ours AS (
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database()
      AND pid <> pg_backend_pid()
      AND application_name = current_setting('application_name')
), touched AS (
    SELECT DISTINCT relation FROM pg_locks
    WHERE relation IS NOT NULL AND pid IN (SELECT pid FROM ours)
), waiting AS (
    SELECT a.pid FROM pg_stat_activity a
    WHERE a.datname = current_database()
      AND a.pid <> pg_backend_pid()
      AND a.wait_event_type = 'Lock'
      AND ($1
           OR a.pid IN (SELECT pid FROM ours)
           OR pg_blocking_pids(a.pid) && ARRAY(SELECT pid FROM ours)
           OR EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.pid = a.pid AND NOT l.granted
                        AND l.relation IN (SELECT relation FROM touched)))
)
SELECT (SELECT count(*) FROM waiting)::int4,
       coalesce((SELECT array_agg(DISTINCT b ORDER BY b)
                 FROM waiting, unnest(pg_blocking_pids(waiting.pid)) AS b),
                '{}')::int4[]";

/// Whether a JSON body spells a NUL character (`\u0000`), which a jsonb
/// value cannot hold.
fn holds_nul_escape(body: &[u8]) -> bool {
    body.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000"))
}

/// The PostgreSQL sink.
pub(crate) struct PgSink {
    pool: Pool,
    statements: Compiled,
    /// `BEGIN; SET LOCAL lock_timeout ...; SET LOCAL statement_timeout ...`.
    begin: String,
    statement_timeout: Duration,
    sampler: Sampler,
    /// The database, for people (`destination`): its URL, no password.
    described: String,
}

impl PgSink {
    pub(crate) async fn connect(
        settings: &SinkSettings,
        statements: Compiled,
    ) -> Result<Self, SinkSetupError> {
        let (config, sampler_config) = session_configs(settings)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_max)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.acquire_timeout))
            .create_timeout(Some(settings.acquire_timeout))
            .recycle_timeout(Some(settings.acquire_timeout))
            .build()
            .map_err(|e| SinkSetupError::Connect(e.to_string()))?;

        let client = pool
            .get()
            .await
            .map_err(|e| setup_error(classify_pool(e), SinkSetupError::Connect))?;
        if let Err(e) = client.batch_execute(MIGRATION).await {
            // The session may be inside the migration's transaction.
            drop(Object::take(client));
            return Err(setup_error(classify(&e), SinkSetupError::Migrate));
        }
        let key: Vec<String> = client
            .query_one(INBOX_KEY, &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| setup_error(classify(&e), SinkSetupError::Migrate))?;
        check_inbox_key(&key)?;

        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = '{}ms'",
            millis(settings.lock_timeout),
            millis(settings.statement_timeout)
        );
        // Prepare every statement once, so a typo (an undefined table or
        // column, a syntax error, a parameter whose type cannot be inferred)
        // stops the service here instead of dead-lettering the backlog.
        // Inside a transaction only for its lock and statement timeouts:
        // parsing locks the tables a statement names. A failure returns
        // before the pool is used, and dropping the pool closes the session.
        client
            .batch_execute(&begin)
            .await
            .map_err(|e| setup_error(classify(&e), SinkSetupError::Connect))?;
        let mut sources: Vec<_> = statements.iter().collect();
        sources.sort_by(|a, b| a.0.cmp(b.0));
        for (source, compiled) in sources {
            for (index, statement) in compiled.iter().enumerate() {
                client
                    .prepare(&statement.sql)
                    .await
                    .map_err(|e| SinkSetupError::Statement {
                        source_name: source.clone(),
                        index,
                        message: statement_error(&e),
                    })?;
            }
        }
        if client.batch_execute("ROLLBACK").await.is_err() {
            drop(Object::take(client));
        } else {
            drop(client);
        }

        Ok(Self {
            described: format!("PostgreSQL {}", crate::redact_url(&settings.url)),
            pool,
            statements,
            begin,
            statement_timeout: settings.statement_timeout,
            sampler: Sampler {
                whole_database: settings.lock_waiters_scope == LockWaitersScope::Database,
                config: sampler_config,
                client: Mutex::new(None),
                timeout: settings.acquire_timeout.max(Duration::from_secs(1)),
            },
        })
    }

    /// Runs the transaction; on success it is committed. Two round trips,
    /// pipelined (tokio-postgres sends requests polled together without
    /// waiting for each answer, and the server runs them in order):
    /// `BEGIN` with its `SET LOCAL`s and the inbox insert (with `version`
    /// and a key: [`INSERT_VERSIONED`]); then, for a new event, every
    /// statement and `COMMIT`, or for a superseded one [`SUPERSEDE`] and
    /// `COMMIT`. A statement that fails aborts
    /// the transaction, so the `COMMIT` behind it rolls back, and its own
    /// error is the one reported; the transaction has then ended, and no
    /// `ROLLBACK` follows (it would cost a round trip, and the server's
    /// warning that no transaction is in progress).
    async fn transaction(
        &self,
        client: &Object,
        event: &Event<'_>,
        payload: Option<&Value>,
        statements: &[CompiledStatement],
        values: &[Vec<ParamValue>],
        version: Option<i64>,
    ) -> Result<Applied, TxFailed> {
        // Under the guard: an event with a version and a key.
        let guarded = version.zip(event.entity_key);
        // Prepared once per connection, bound before anything is sent.
        let insert = client
            .prepare_cached(if guarded.is_some() {
                INSERT_VERSIONED
            } else {
                INSERT_INBOX
            })
            .await
            .map_err(|e| TxFailed::preparing(&e))?;
        let supersede = match guarded {
            Some(_) => Some(
                client
                    .prepare_cached(SUPERSEDE)
                    .await
                    .map_err(|e| TxFailed::preparing(&e))?,
            ),
            None => None,
        };
        let mut runs = Vec::with_capacity(statements.len());
        let mut scratch = bytes::BytesMut::new();
        for (statement, values) in statements.iter().zip(values) {
            let prepared = client
                .prepare_cached(&statement.sql)
                .await
                .map_err(|e| TxFailed::preparing(&e))?;
            let types = prepared.params();
            if types.len() != values.len() {
                return Err(TxFailed::before_begin(SinkError::permanent(
                    "sql",
                    format!(
                        "statement expects {} parameters, {} were bound",
                        types.len(),
                        values.len()
                    ),
                )));
            }
            let mut bound = Vec::with_capacity(values.len());
            for ((value, ty), param) in values.iter().zip(types).zip(&statement.params) {
                bound.push(
                    bind_param(value, ty, &param.name, &mut scratch)
                        .map_err(TxFailed::before_begin)?,
                );
            }
            runs.push((prepared, bound));
        }
        let received_at = system_time(event.received_at_ms);
        let inbox_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &event.event_id,
            &event.source,
            &event.entity_key,
            &payload,
            &received_at,
        ];
        // Whether the inbox row is new, and (under the guard) whether its
        // version was stored.
        let inserted = async {
            match guarded {
                None => client
                    .execute(&insert, &inbox_params)
                    .await
                    .map(|n| (n > 0, true)),
                Some((version, _)) => {
                    let mut params = inbox_params.to_vec();
                    params.push(&version);
                    let row = client.query_one(&insert, &params).await?;
                    Ok((row.try_get(0)?, row.try_get(1)?))
                }
            }
        };
        let (begun, inserted) = join(client.batch_execute(&self.begin), inserted).await;
        // BEGIN cannot fail while the insert behind it succeeds: a failed
        // SET LOCAL aborts the transaction BEGIN opened (the insert then
        // fails too), and a broken connection fails both.
        let open = |e: &tokio_postgres::Error| TxFailed::in_transaction(classify(e));
        begun.map_err(|e| open(&e))?;
        let (new, stored) = inserted.map_err(|e| open(&e))?;
        if let (true, false, Some(supersede), Some((_, key))) = (new, stored, &supersede, guarded) {
            let (by, committed) = join(
                client.query_opt(supersede, &[&event.source, &event.event_id, &key]),
                client.batch_execute("COMMIT"),
            )
            .await;
            let by = match by {
                Ok(row) => row.and_then(|r| r.try_get::<_, String>(0).ok()),
                Err(e) => return Err(TxFailed::after_commit(classify(&e), &committed)),
            };
            if let Err(e) = &committed {
                return Err(TxFailed::after_commit(classify(e), &committed));
            }
            return Ok(Applied::Superseded {
                by: by.unwrap_or_default(),
            });
        }
        if !new {
            let committed = client.batch_execute("COMMIT").await;
            if let Err(e) = &committed {
                return Err(TxFailed::after_commit(classify(e), &committed));
            }
            return Ok(Applied::Duplicate);
        }
        let executes = join_all(
            runs.iter()
                .map(|(prepared, bound)| client.execute_raw(prepared, bound.iter())),
        );
        let (executed, committed) = join(executes, client.batch_execute("COMMIT")).await;
        for result in executed {
            if let Err(e) = result {
                return Err(TxFailed::after_commit(classify(&e), &committed));
            }
        }
        if let Err(e) = &committed {
            return Err(TxFailed::after_commit(classify(e), &committed));
        }
        Ok(Applied::New)
    }
}

/// A setup error: [`SinkSetupError::Unreachable`] when waiting could cure
/// it (the server refused, dropped or timed out the connection, is
/// starting up, shutting down or full), else the error `permanent` makes of
/// its message: a refused password (28P01) or a missing database (3D000)
/// will not cure itself.
fn setup_error(e: SinkError, permanent: fn(String) -> SinkSetupError) -> SinkSetupError {
    match (e.class, e.kind) {
        (FailureClass::Dependency, "connection" | "pool_timeout" | "too_many_connections") => {
            SinkSetupError::Unreachable(e.message)
        }
        _ => permanent(e.message),
    }
}

/// Fails setup unless the inbox is keyed on `(source, event_id)`.
fn check_inbox_key(key: &[String]) -> Result<(), SinkSetupError> {
    if key == ["source", "event_id"] {
        return Ok(());
    }
    Err(SinkSetupError::Migrate(crate::old_inbox_key(key)))
}

/// The database's message for a statement that failed to prepare, with its
/// SQLSTATE.
fn statement_error(err: &tokio_postgres::Error) -> String {
    let classified = classify(err);
    match classified.code {
        Some(code) => format!("{} (SQLSTATE {code})", classified.message),
        None => classified.message,
    }
}

/// The apply pool's session config (with
/// `idle_in_transaction_session_timeout` as a startup option) and the
/// sampler's (without: it never opens a transaction).
fn session_configs(settings: &SinkSettings) -> Result<(Config, Config), SinkSetupError> {
    let mut config: Config = settings
        .url
        .trim()
        .parse()
        .map_err(|e| SinkSetupError::Connect(format!("invalid PostgreSQL URL: {e}")))?;
    config.connect_timeout(settings.acquire_timeout);
    if config.get_application_name().is_none() {
        config.application_name("breakwater-sink");
    }
    let sampler = config.clone();
    let mut options = config.get_options().unwrap_or_default().to_owned();
    if !options.is_empty() {
        options.push(' ');
    }
    // lock_timeout for the session too: an apply prepares a statement it
    // has not cached before its BEGIN (so the steady state pipelines), and
    // parsing takes locks on the tables a statement names.
    options.push_str(&format!(
        "-c idle_in_transaction_session_timeout={} -c lock_timeout={}",
        millis(settings.idle_in_transaction_timeout),
        millis(settings.lock_timeout)
    ));
    config.options(&options);
    Ok((config, sampler))
}

/// An apply's transaction that failed: the error, and whether the
/// transaction may still be open on the connection (a `ROLLBACK` is then
/// owed before the connection goes back to the pool).
struct TxFailed {
    error: SinkError,
    open: bool,
}

impl TxFailed {
    /// Failed before `BEGIN` was sent (binding): nothing to end.
    fn before_begin(error: SinkError) -> Self {
        Self { error, open: false }
    }

    /// Preparing failed before `BEGIN`: the server's error leaves nothing
    /// to end; any other (the link) leaves the connection's state unknown,
    /// so it is treated as open, and a failing `ROLLBACK` then takes the
    /// connection out of the pool.
    fn preparing(e: &tokio_postgres::Error) -> Self {
        Self {
            error: classify(e),
            open: e.as_db_error().is_none(),
        }
    }

    /// Failed after `BEGIN` and before `COMMIT` was sent.
    fn in_transaction(error: SinkError) -> Self {
        Self { error, open: true }
    }

    /// Failed with `COMMIT` sent, which answered `committed`: a server's
    /// answer (success, or an error such as a deferred constraint) ended
    /// the transaction (in an aborted one `COMMIT` rolls back); no answer
    /// (the link failed) leaves it unknown, so still owed a `ROLLBACK`.
    fn after_commit(error: SinkError, committed: &Result<(), tokio_postgres::Error>) -> Self {
        let ended = match committed {
            Ok(()) => true,
            Err(e) => e.as_db_error().is_some(),
        };
        Self {
            error,
            open: !ended,
        }
    }
}

/// A pooled connection inside a transaction that has not ended cleanly yet:
/// dropped in that state, it leaves the pool for good (see the module doc).
struct TxGuard {
    client: Option<Object>,
    open: bool,
}

impl Drop for TxGuard {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}

#[async_trait]
impl Sink for PgSink {
    async fn apply(&self, event: &Event<'_>) -> Result<Applied, SinkError> {
        let Bound {
            statements,
            json,
            values,
            version,
        } = bind(&self.statements, event)?;

        let client = self.pool.get().await.map_err(classify_pool)?;
        let mut guard = TxGuard {
            client: Some(client),
            open: true,
        };
        let Some(client) = guard.client.as_ref() else {
            return Err(SinkError::dependency("connection", "no pooled connection"));
        };
        // A client-side deadline in case the server stops answering without
        // closing the socket: every statement is bounded by
        // statement_timeout on the server, so this only fires when the link
        // is gone.
        let rounds = u32::try_from(statements.len())
            .unwrap_or(u32::MAX)
            .saturating_add(3);
        let deadline = self
            .statement_timeout
            .checked_mul(rounds)
            .unwrap_or(Duration::from_secs(3600))
            .saturating_add(Duration::from_secs(1));
        // A body that is not JSON is kept as a JSON string, never as NULL;
        // so is one holding `\u0000`, which jsonb refuses although the
        // issuer signed it (statements still get the parsed JSON).
        let raw;
        let payload = match json.as_ref() {
            Some(doc) if !holds_nul_escape(event.body) => doc,
            _ => {
                raw = crate::statement::body_as_json_string(event.body);
                &raw
            }
        };
        let outcome = tokio::time::timeout(
            deadline,
            self.transaction(client, event, Some(payload), statements, &values, version),
        )
        .await;
        match outcome {
            Ok(Ok(applied)) => {
                guard.open = false;
                Ok(applied)
            }
            Ok(Err(TxFailed { error, open: false })) => {
                guard.open = false;
                Err(error)
            }
            Ok(Err(TxFailed { error, open: true })) => {
                let rolled_back =
                    tokio::time::timeout(self.statement_timeout, client.batch_execute("ROLLBACK"))
                        .await;
                if matches!(rolled_back, Ok(Ok(()))) {
                    guard.open = false;
                }
                Err(error)
            }
            Err(_) => Err(SinkError::dependency(
                "statement_timeout",
                format!("no answer from the database within {deadline:?}"),
            )),
        }
    }

    async fn lock_snapshot(&self) -> Option<LockSnapshot> {
        self.sampler.sample().await
    }

    fn pool_usage(&self) -> (usize, usize) {
        let status = self.pool.status();
        (
            status.size.saturating_sub(status.available),
            status.max_size,
        )
    }

    async fn inbox_lookup(&self, source: &str, event_id: &str) -> Result<InboxLookup, SinkError> {
        let client = self.pool.get().await.map_err(classify_pool)?;
        let row = tokio::time::timeout(
            self.statement_timeout,
            client.query_opt(SELECT_INBOX, &[&source, &event_id]),
        )
        .await
        .map_err(|_| {
            SinkError::dependency(
                "statement_timeout",
                "the inbox lookup got no answer in time",
            )
        })?
        .map_err(|e| classify(&e))?;
        let Some(row) = row else {
            return Ok(InboxLookup::Absent);
        };
        let record = (|| {
            Ok::<_, tokio_postgres::Error>(InboxRecord {
                received_at_ms: row.try_get::<_, Option<i64>>(0)?.unwrap_or_default(),
                applied_at_ms: row.try_get(1)?,
                entity_key: row.try_get(2)?,
                superseded_by: row.try_get(3)?,
            })
        })()
        .map_err(|e| classify(&e))?;
        Ok(InboxLookup::Found(record))
    }

    fn destination(&self, _source: &str) -> String {
        self.described.clone()
    }
}

/// One session of its own for `pg_stat_activity`, opened lazily and
/// reopened after any failure, so a saturated apply pool cannot starve the
/// breaker of the database's view.
struct Sampler {
    config: Config,
    whole_database: bool,
    client: Mutex<Option<tokio_postgres::Client>>,
    timeout: Duration,
}

impl Sampler {
    async fn sample(&self) -> Option<LockSnapshot> {
        let mut slot = self.client.lock().await;
        let result = tokio::time::timeout(self.timeout, async {
            if slot.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
                let (client, connection) = self.config.connect(NoTls).await.ok()?;
                tokio::spawn(connection);
                *slot = Some(client);
            }
            let client = slot.as_ref()?;
            let row = client
                .query_one(LOCK_SNAPSHOT, &[&self.whole_database])
                .await
                .ok()?;
            let waiting: i32 = row.try_get(0).ok()?;
            let blockers: Vec<i32> = row.try_get(1).ok()?;
            Some(LockSnapshot {
                waiting: u32::try_from(waiting).unwrap_or(0),
                blockers,
            })
        })
        .await;
        match result {
            Ok(Some(snapshot)) => Some(snapshot),
            _ => {
                *slot = None;
                None
            }
        }
    }
}

fn system_time(ms: i64) -> SystemTime {
    let offset = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    }
    .unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs the PostgreSQL of the integration tests.
    #[tokio::test]
    async fn pooled_sessions_get_the_idle_in_transaction_timeout() {
        let mut settings = SinkSettings::new("postgres://postgres@127.0.0.1:5432/test");
        settings.idle_in_transaction_timeout = Duration::from_millis(7500);
        let (config, _) = session_configs(&settings).expect("configs");
        let (client, connection) = config
            .connect(NoTls)
            .await
            .expect("PostgreSQL is reachable");
        tokio::spawn(connection);
        let shown: String = client
            .query_one("SHOW idle_in_transaction_session_timeout", &[])
            .await
            .expect("show")
            .get(0);
        assert_eq!(shown, "7500ms");
    }

    #[test]
    fn negative_and_positive_receive_times() {
        assert_eq!(system_time(1500), UNIX_EPOCH + Duration::from_millis(1500));
        assert_eq!(system_time(-1500), UNIX_EPOCH - Duration::from_millis(1500));
    }
}
