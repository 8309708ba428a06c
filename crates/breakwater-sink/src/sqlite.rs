//! The SQLite sink: one connection in WAL mode behind an async mutex, used
//! from `spawn_blocking`; the applies waiting for it commit together, each
//! event in a `SAVEPOINT` of one `BEGIN IMMEDIATE` transaction.
//!
//! SQLite has a single writer, so a pool would only add lock contention:
//! the mutex is the pool (size 1), and waiting for it longer than the
//! acquire timeout is a `pool_timeout`, like an exhausted PostgreSQL pool.
//! `busy_timeout` is the lock timeout: another process holding the write
//! lock longer than that is a dependency failure of kind `busy`.
//! `BEGIN IMMEDIATE` takes the write lock up front, so a transaction never
//! fails half-way on an upgrade from a read lock.
//!
//! **Group commit.** Each commit fsyncs the WAL (`synchronous = FULL`, so
//! an applied event survives a power cut before its message is acked),
//! and one fsync per event bounded the applies (about 1–2k/s beside a
//! flood of webhooks, 2.1k/s draining, `docs/measurements.md`). An apply
//! joins a list and waits for the connection; whoever gets it runs the
//! whole list ([`run_group`]): one transaction, each event in its own savepoint (a
//! failed event rolls back to it, the others stay), one commit. An error
//! after which SQLite has rolled the whole transaction back itself (an
//! interrupted write, a full disk) fails its own event and runs the
//! events before it again in a new transaction. Each event still gets
//! its own outcome, and duplicates within a group are told by the inbox
//! as before (the first one's row is visible to the second).
//!
//! The acquire timeout bounds an apply's wait for its turn, in a group as
//! for the connection: an event whose turn comes later than that after it
//! joined the list (the events before it in its group were slow) fails as
//! `pool_timeout` and is not started. So an apply is answered within about
//! twice the acquire timeout plus one `statement_timeout` and a commit,
//! however large its group.
//!
//! `statement_timeout` bounds each event's statements (the group's lock
//! wait is bounded by `busy_timeout`, shorter): the connection's progress handler
//! ([`Limits`], consulted every few thousand VM steps on the thread running
//! the statement) stops a statement past the apply's deadline, which then
//! fails with `SQLITE_INTERRUPT`; the transaction rolls back and the apply
//! is a dependency failure of kind `statement_timeout`, like PostgreSQL's
//! `57014`. SQLite has no per-statement timer of its own, and a runaway
//! statement (a scan the source's SQL did not mean) would otherwise hold
//! the only connection, and with it every worker, for as long as it runs.
//! An apply whose future is dropped (aborted at shutdown) is stopped the
//! same way, so it rolls back as a PostgreSQL one does (or, still waiting
//! in the list, is never started). Each apply has a stop flag of its own,
//! so a late stop never reaches the apply after it.
//!
//! **Who may read it.** The inbox holds whole payloads: a database the
//! sink creates is `0600` (and so its `-wal` and `-shm`, which SQLite
//! makes with the main file's mode), the folders it creates on the way
//! `0700`, whatever the umask ([`create_private`]). An existing database
//! or folder keeps its mode.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::DateTime;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, ErrorCode};
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use crate::param::ParamValue;
use crate::settings::SinkSettings;
use crate::statement::{Bound, Compiled, bind};
use crate::{
    Applied, Event, FailureClass, InboxLookup, InboxRecord, Sink, SinkError, SinkSetupError,
};

const MIGRATION: &str = "\
CREATE TABLE IF NOT EXISTS breakwater_inbox (
    event_id    TEXT NOT NULL,
    source      TEXT NOT NULL,
    entity_key  TEXT,
    payload     TEXT,
    received_at TEXT NOT NULL,
    applied_at  TEXT,
    superseded_by TEXT,
    PRIMARY KEY (source, event_id)
);
CREATE TABLE IF NOT EXISTS breakwater_versions (
    source     TEXT NOT NULL,
    entity_key TEXT NOT NULL,
    version    INTEGER NOT NULL,
    event_id   TEXT NOT NULL,
    PRIMARY KEY (source, entity_key)
);";

const INSERT_INBOX: &str = "\
INSERT INTO breakwater_inbox (event_id, source, entity_key, payload, received_at, applied_at)
VALUES (?1, ?2, ?3, ?4, ?5, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ON CONFLICT (source, event_id) DO NOTHING";

/// One event's inbox row, times as milliseconds since the Unix epoch.
const SELECT_INBOX: &str = "\
SELECT CAST(round((julianday(received_at) - 2440587.5) * 86400000.0) AS INTEGER),
       CAST(round((julianday(applied_at) - 2440587.5) * 86400000.0) AS INTEGER),
       entity_key, superseded_by
FROM breakwater_inbox WHERE source = ?1 AND event_id = ?2";

/// The newest version applied for an entity key, and by which event.
const SELECT_VERSION: &str = "\
SELECT version, event_id FROM breakwater_versions WHERE source = ?1 AND entity_key = ?2";

const STORE_VERSION: &str = "\
INSERT INTO breakwater_versions (source, entity_key, version, event_id) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (source, entity_key) DO UPDATE
    SET version = excluded.version, event_id = excluded.event_id";

const SUPERSEDE: &str = "\
UPDATE breakwater_inbox SET superseded_by = ?3 WHERE source = ?1 AND event_id = ?2";

/// Where a `sqlite:` URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Memory,
    File(PathBuf),
}

/// `sqlite://path`, `sqlite:path`, `sqlite::memory:`; a `?query` is
/// ignored.
pub(crate) fn parse_url(url: &str) -> Option<Location> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or_default();
    match path {
        "" => None,
        ":memory:" => Some(Location::Memory),
        path => Some(Location::File(PathBuf::from(path))),
    }
}

/// The SQLite sink.
pub(crate) struct SqliteSink {
    conn: Arc<Mutex<Connection>>,
    /// What the connection's progress handler enforces.
    limits: Arc<Limits>,
    statements: Arc<Compiled>,
    /// Applies waiting to be run by whoever next holds the connection.
    waiting: Arc<std::sync::Mutex<Vec<Waiting>>>,
    next_apply: AtomicU64,
    acquire_timeout: Duration,
    statement_timeout: Duration,
    in_use: Arc<AtomicUsize>,
    /// The database file, for people (`destination`).
    described: String,
}

/// An apply in the waiting list.
struct Waiting {
    /// Its number, so an apply that gave up waiting can take itself out.
    number: u64,
    job: Job,
    /// Set when its caller goes away (the worker aborted at shutdown): it
    /// is not started, or its statement stops ([`Limits`]).
    stop: Arc<AtomicBool>,
    /// The acquire timeout, from when it joined the list: not started
    /// after it (`pool_timeout`), in a group or alone (`None`: a timeout
    /// past what a clock can count).
    turn_by: Option<Instant>,
    outcome: oneshot::Sender<Result<Applied, SinkError>>,
}

impl Waiting {
    fn answer(self, outcome: Result<Applied, SinkError>) {
        // Its caller may have gone: then nobody waits for the outcome.
        let _ = self.outcome.send(outcome);
    }
}

impl SqliteSink {
    pub(crate) async fn open(
        settings: &SinkSettings,
        statements: Compiled,
    ) -> Result<Self, SinkSetupError> {
        let location = parse_url(settings.url.trim())
            .ok_or_else(|| SinkSetupError::UnsupportedUrl(settings.url.clone()))?;
        let busy_timeout = settings.lock_timeout;
        let statements = Arc::new(statements);
        let to_check = Arc::clone(&statements);
        let limits = Arc::new(Limits::default());
        let checked = Arc::clone(&limits);
        let conn = tokio::task::spawn_blocking(move || {
            let conn = open_connection(&location, busy_timeout)?;
            check_statements(&conn, &to_check)?;
            conn.progress_handler(PROGRESS_EVERY, Some(move || checked.should_stop()));
            Ok::<_, SinkSetupError>(conn)
        })
        .await
        .map_err(|e| SinkSetupError::Connect(e.to_string()))??;
        Ok(Self {
            limits,
            conn: Arc::new(Mutex::new(conn)),
            statements,
            waiting: Arc::default(),
            next_apply: AtomicU64::new(0),
            acquire_timeout: settings.acquire_timeout,
            statement_timeout: settings.statement_timeout,
            in_use: Arc::new(AtomicUsize::new(0)),
            described: format!("SQLite {}", settings.url.trim()),
        })
    }
}

fn open_connection(
    location: &Location,
    busy_timeout: Duration,
) -> Result<Connection, SinkSetupError> {
    let connect = |e: &dyn std::fmt::Display| SinkSetupError::Connect(e.to_string());
    let conn = match location {
        Location::Memory => Connection::open_in_memory().map_err(|e| connect(&e))?,
        Location::File(path) => {
            create_private(path)?;
            Connection::open(Path::new(path)).map_err(|e| connect(&e))?
        }
    };
    conn.busy_timeout(busy_timeout).map_err(|e| connect(&e))?;
    if let Location::File(_) = location {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| connect(&e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(SinkSetupError::Connect(format!(
                "cannot switch to WAL (journal_mode is {mode})"
            )));
        }
    }
    conn.execute_batch("PRAGMA foreign_keys = ON")
        .map_err(|e| connect(&e))?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.execute_batch(MIGRATION)
        .map_err(|e| SinkSetupError::Migrate(e.to_string()))?;
    add_superseded_by(&conn)?;
    check_inbox_key(&conn)?;
    Ok(conn)
}

/// Creates the database at `path` readable by its owner only, unless it
/// exists: the folders missing on the way `0700`, the file `0600` (empty;
/// SQLite makes it a database), whatever the umask. SQLite gives the
/// `-wal` and `-shm` files beside it the main file's mode. A folder or a
/// database that already exists keeps the mode its owner gave it (the
/// database may be shared with another program on purpose).
fn create_private(path: &Path) -> Result<(), SinkSetupError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let cannot = |what: &Path, e: std::io::Error| {
        SinkSetupError::Connect(format!("cannot create {}: {e}", what.display()))
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| cannot(parent, e))?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(cannot(path, e)),
    }
}

/// Adds `superseded_by` to an inbox made before the stale-event guard
/// (SQLite has no `ADD COLUMN IF NOT EXISTS`).
fn add_superseded_by(conn: &Connection) -> Result<(), SinkSetupError> {
    let migrate = |e: rusqlite::Error| SinkSetupError::Migrate(e.to_string());
    let has: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('breakwater_inbox') \
             WHERE name = 'superseded_by'",
            [],
            |row| row.get(0),
        )
        .map_err(migrate)?;
    if !has {
        conn.execute_batch("ALTER TABLE breakwater_inbox ADD COLUMN superseded_by TEXT")
            .map_err(migrate)?;
    }
    Ok(())
}

/// Fails setup unless the inbox is keyed on `(source, event_id)`.
fn check_inbox_key(conn: &Connection) -> Result<(), SinkSetupError> {
    let migrate = |e: rusqlite::Error| SinkSetupError::Migrate(e.to_string());
    let mut info = conn
        .prepare("SELECT name, pk FROM pragma_table_info('breakwater_inbox') WHERE pk > 0")
        .map_err(migrate)?;
    let mut key = info
        .query_map([], |row| {
            Ok((row.get::<_, i64>(1)?, row.get::<_, String>(0)?))
        })
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(migrate)?;
    key.sort();
    let key: Vec<String> = key.into_iter().map(|(_, name)| name).collect();
    if key == ["source", "event_id"] {
        Ok(())
    } else {
        Err(SinkSetupError::Migrate(crate::old_inbox_key(&key)))
    }
}

/// Prepares every statement once, so a typo (an undefined table or column,
/// a syntax error) stops the service at startup instead of dead-lettering
/// the backlog.
fn check_statements(conn: &Connection, statements: &Compiled) -> Result<(), SinkSetupError> {
    let mut sources: Vec<_> = statements.iter().collect();
    sources.sort_by(|a, b| a.0.cmp(b.0));
    for (source, compiled) in sources {
        for (index, statement) in compiled.iter().enumerate() {
            conn.prepare(&statement.sql)
                .map_err(|e| SinkSetupError::Statement {
                    source_name: source.clone(),
                    index,
                    message: e.to_string(),
                })?;
        }
    }
    Ok(())
}

/// What the blocking side needs, owned.
struct Job {
    event_id: String,
    source: String,
    entity_key: Option<String>,
    payload: String,
    received_at: String,
    values: Vec<Vec<ParamValue>>,
    /// Its version, if its source has one and it carries one.
    version: Option<i64>,
}

impl SqliteSink {
    /// The one connection, waited for up to the acquire timeout.
    async fn connection(&self) -> Result<OwnedMutexGuard<Connection>, SinkError> {
        tokio::time::timeout(self.acquire_timeout, self.conn.clone().lock_owned())
            .await
            .map_err(|_| {
                SinkError::dependency(
                    "pool_timeout",
                    "timed out waiting for the SQLite connection",
                )
            })
    }
}

#[async_trait]
impl Sink for SqliteSink {
    async fn apply(&self, event: &Event<'_>) -> Result<Applied, SinkError> {
        let Bound {
            json,
            values,
            version,
            ..
        } = bind(&self.statements, event)?;
        // The body as it came when it is JSON; else as a JSON string, never
        // as NULL.
        let payload = match (&json, std::str::from_utf8(event.body)) {
            (Some(_), Ok(text)) => text.to_owned(),
            _ => crate::statement::body_as_json_string(event.body).to_string(),
        };
        let received_at = DateTime::from_timestamp_millis(event.received_at_ms)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string();
        let job = Job {
            event_id: event.event_id.to_owned(),
            source: event.source.to_owned(),
            entity_key: event.entity_key.map(str::to_owned),
            payload,
            received_at,
            values,
            version,
        };

        let stop = Arc::new(AtomicBool::new(false));
        // Should this future be dropped (the worker aborted at shutdown),
        // its event is not started, or its statement stops, rather than
        // running on.
        let _stop_if_dropped = StopOnDrop(Arc::clone(&stop));
        let number = self.next_apply.fetch_add(1, Ordering::Relaxed);
        let (outcome, mut answered) = oneshot::channel();
        let turn_by = Instant::now().checked_add(self.acquire_timeout);
        lock(&self.waiting).push(Waiting {
            number,
            job,
            stop,
            turn_by,
            outcome,
        });
        let conn = tokio::select! {
            biased;
            // Run in a group another apply started.
            outcome = &mut answered => return group_outcome(outcome),
            conn = self.connection() => conn,
        };
        match conn {
            Ok(conn) => {
                let group = std::mem::take(&mut *lock(&self.waiting));
                // Empty: a group that has ended ran this one, and answered.
                if !group.is_empty() {
                    let statements = Arc::clone(&self.statements);
                    let limits = Arc::clone(&self.limits);
                    let in_use = Arc::clone(&self.in_use);
                    let timeout = self.statement_timeout;
                    in_use.fetch_add(1, Ordering::Relaxed);
                    // Not awaited as such: the group runs to its end and
                    // answers every apply in it even if this one's caller
                    // goes away.
                    tokio::task::spawn_blocking(move || {
                        let mut conn = conn;
                        let outcomes = run_group(&mut conn, &statements, &limits, timeout, group);
                        // Free before anyone hears: a caller that applies
                        // again at once finds the connection free.
                        drop(conn);
                        in_use.fetch_sub(1, Ordering::Relaxed);
                        for (waiting, outcome) in outcomes {
                            waiting.answer(outcome);
                        }
                    });
                }
            }
            Err(timed_out) => {
                let mut waiting = lock(&self.waiting);
                if let Some(at) = waiting.iter().position(|w| w.number == number) {
                    waiting.remove(at);
                    return Err(timed_out);
                }
                // Already taken into a group: its outcome comes.
            }
        }
        group_outcome(answered.await)
    }

    fn pool_usage(&self) -> (usize, usize) {
        (self.in_use.load(Ordering::Relaxed), 1)
    }

    async fn inbox_lookup(&self, source: &str, event_id: &str) -> Result<InboxLookup, SinkError> {
        let conn = self.connection().await?;
        let (source, event_id) = (source.to_owned(), event_id.to_owned());
        tokio::task::spawn_blocking(move || {
            let found = conn.query_row(SELECT_INBOX, [&source, &event_id], |row| {
                Ok(InboxRecord {
                    received_at_ms: row.get::<_, Option<i64>>(0)?.unwrap_or_default(),
                    applied_at_ms: row.get(1)?,
                    entity_key: row.get(2)?,
                    superseded_by: row.get(3)?,
                })
            });
            match found {
                Ok(record) => Ok(InboxLookup::Found(record)),
                Err(rusqlite::Error::QueryReturnedNoRows) => Ok(InboxLookup::Absent),
                Err(e) => Err(classify(e)),
            }
        })
        .await
        .map_err(|e| SinkError::dependency("database", format!("lookup task failed: {e}")))?
    }

    fn destination(&self, _source: &str) -> String {
        self.described.clone()
    }
}

/// VM steps between two looks of the progress handler at [`Limits`]: a
/// stop lands within that many steps of the running statement.
const PROGRESS_EVERY: std::os::raw::c_int = 10_000;

/// The running event's deadline and stop flag, read by the connection's
/// progress handler on the thread that runs its statements.
#[derive(Debug, Default)]
struct Limits {
    current: std::sync::Mutex<Option<Current>>,
}

#[derive(Debug)]
struct Current {
    deadline: Option<Instant>,
    /// Set by the event's own caller going away: a flag per event, so a
    /// late stop never reaches the event after it.
    stop: Arc<AtomicBool>,
}

impl Limits {
    /// Starts the clock of an event about to run.
    fn begin(&self, timeout: Duration, stop: &Arc<AtomicBool>) {
        *lock(&self.current) = Some(Current {
            deadline: Instant::now().checked_add(timeout),
            stop: Arc::clone(stop),
        });
    }

    /// No event runs.
    fn end(&self) {
        *lock(&self.current) = None;
    }

    /// Whether the running statement must stop.
    fn should_stop(&self) -> bool {
        lock(&self.current).as_ref().is_some_and(|c| {
            c.stop.load(Ordering::Relaxed) || c.deadline.is_some_and(|d| Instant::now() >= d)
        })
    }
}

/// Sets its apply's stop flag when dropped: after the apply ended that
/// stops nothing.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The outcome a group sent, or a failure if the group's thread ended
/// without one (it panicked).
fn group_outcome(
    outcome: Result<Result<Applied, SinkError>, oneshot::error::RecvError>,
) -> Result<Applied, SinkError> {
    outcome.unwrap_or_else(|_| {
        Err(SinkError::dependency(
            "database",
            "apply task failed: the SQLite group ended without an outcome",
        ))
    })
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a group of applies in one transaction, each in a savepoint, and
/// returns each one's outcome. See the module doc.
fn run_group(
    conn: &mut Connection,
    statements: &Compiled,
    limits: &Limits,
    timeout: Duration,
    group: Vec<Waiting>,
) -> Vec<(Waiting, Result<Applied, SinkError>)> {
    let mut outcomes = Vec::with_capacity(group.len());
    let mut todo: VecDeque<Waiting> = group.into();
    while !todo.is_empty() {
        let begun = (if conn.is_autocommit() {
            Ok(())
        } else {
            // A previous transaction was left open (it should not be);
            // never run inside it.
            conn.execute_batch("ROLLBACK")
        })
        .and_then(|()| conn.execute_batch("BEGIN IMMEDIATE"));
        if let Err(error) = begun {
            let error = classify(error);
            outcomes.extend(todo.into_iter().map(|w| (w, Err(error.clone()))));
            return outcomes;
        }
        let mut applied: Vec<(Waiting, Applied)> = Vec::new();
        let mut rolled_back = false;
        while let Some(waiting) = todo.pop_front() {
            if waiting.stop.load(Ordering::Relaxed) {
                let stopped = SinkError::dependency(
                    "statement_timeout",
                    "stopped before it ran: its caller went away",
                );
                outcomes.push((waiting, Err(stopped)));
                continue;
            }
            if waiting.turn_by.is_some_and(|by| Instant::now() >= by) {
                // The events before it in its group took longer than the
                // acquire timeout: it fails as if it had waited for the
                // connection that long, and is not started.
                let late = SinkError::dependency(
                    "pool_timeout",
                    "timed out waiting for its turn on the SQLite connection",
                );
                outcomes.push((waiting, Err(late)));
                continue;
            }
            limits.begin(timeout, &waiting.stop);
            let outcome = in_savepoint(conn, statements, &waiting.job);
            limits.end();
            match outcome {
                Ok(outcome) => applied.push((waiting, outcome)),
                Err(error) => {
                    outcomes.push((waiting, Err(error)));
                    if conn.is_autocommit() {
                        // SQLite rolled the whole transaction back: the
                        // events applied in it so far run again.
                        for (again, _) in applied.drain(..).rev() {
                            todo.push_front(again);
                        }
                        rolled_back = true;
                        break;
                    }
                }
            }
        }
        if rolled_back {
            continue;
        }
        match conn.execute_batch("COMMIT") {
            Ok(()) => outcomes.extend(applied.into_iter().map(|(w, a)| (w, Ok(a)))),
            Err(error) => {
                let error = classify(error);
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                outcomes.extend(applied.into_iter().map(|(w, _)| (w, Err(error.clone()))));
            }
        }
    }
    outcomes
}

/// One event in a savepoint of the open transaction: released when it
/// applies, rolled back to when it fails. Should the rollback to the
/// savepoint fail, the whole transaction is rolled back, so nothing of a
/// failed event is ever committed (the caller sees the transaction gone).
fn in_savepoint(conn: &Connection, statements: &Compiled, job: &Job) -> Result<Applied, SinkError> {
    conn.execute_batch("SAVEPOINT apply").map_err(classify)?;
    match apply_one(conn, statements, job) {
        Ok(applied) => {
            conn.execute_batch("RELEASE apply").map_err(classify)?;
            Ok(applied)
        }
        Err(error) => {
            if !conn.is_autocommit()
                && conn
                    .execute_batch("ROLLBACK TO apply; RELEASE apply")
                    .is_err()
            {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(error)
        }
    }
}

/// The inbox row, then (if it is new and not superseded) the source's
/// statements.
fn apply_one(conn: &Connection, statements: &Compiled, job: &Job) -> Result<Applied, SinkError> {
    let inserted = conn
        .prepare_cached(INSERT_INBOX)
        .and_then(|mut s| {
            s.execute(rusqlite::params![
                job.event_id,
                job.source,
                job.entity_key,
                job.payload,
                job.received_at
            ])
        })
        .map_err(classify)?;
    if inserted == 0 {
        return Ok(Applied::Duplicate);
    }
    if let (Some(version), Some(key)) = (job.version, &job.entity_key)
        && let Some(by) = guard_version(conn, job, key, version)?
    {
        return Ok(Applied::Superseded { by });
    }
    let compiled = statements.get(&job.source).map_or(&[][..], Vec::as_slice);
    for (statement, values) in compiled.iter().zip(&job.values) {
        let mut prepared = conn.prepare_cached(&statement.sql).map_err(classify)?;
        let mut rows = prepared
            .query(rusqlite::params_from_iter(values.iter().map(to_sqlite)))
            .map_err(classify)?;
        // Drain, so statements with RETURNING (or a SELECT) run to the end.
        while rows.next().map_err(classify)?.is_some() {}
    }
    Ok(Applied::New)
}

/// The stale-event guard of a new event with a key and a version: the
/// newer event that supersedes it (its inbox row then says so), or `None`
/// after storing its version as its key's newest. One writer, so nothing
/// moves between the read and the write.
fn guard_version(
    conn: &Connection,
    job: &Job,
    key: &str,
    version: i64,
) -> Result<Option<String>, SinkError> {
    let stored: Option<(i64, String)> = match conn
        .prepare_cached(SELECT_VERSION)
        .and_then(|mut s| s.query_row([&job.source, key], |r| Ok((r.get(0)?, r.get(1)?))))
    {
        Ok(found) => Some(found),
        Err(rusqlite::Error::QueryReturnedNoRows) => None,
        Err(e) => return Err(classify(e)),
    };
    if let Some((_, by)) = stored.filter(|(newest, _)| *newest > version) {
        conn.prepare_cached(SUPERSEDE)
            .and_then(|mut s| s.execute(rusqlite::params![job.source, job.event_id, by]))
            .map_err(classify)?;
        return Ok(Some(by));
    }
    conn.prepare_cached(STORE_VERSION)
        .and_then(|mut s| s.execute(rusqlite::params![job.source, key, version, job.event_id]))
        .map_err(classify)?;
    Ok(None)
}

fn to_sqlite(value: &ParamValue) -> SqlValue {
    match value {
        ParamValue::Null | ParamValue::Json(Value::Null) => SqlValue::Null,
        ParamValue::Text(s) | ParamValue::Json(Value::String(s)) => SqlValue::Text(s.clone()),
        ParamValue::Json(Value::Bool(b)) => SqlValue::Integer(i64::from(*b)),
        ParamValue::Json(Value::Number(n)) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => n
                .as_f64()
                .map_or_else(|| SqlValue::Text(n.to_string()), SqlValue::Real),
        },
        ParamValue::Json(v) => SqlValue::Text(v.to_string()),
    }
}

/// Classifies a SQLite error by its primary result code.
pub(crate) fn classify(err: rusqlite::Error) -> SinkError {
    use FailureClass::{Dependency, Permanent};
    let message = err.to_string();
    let Some(sqlite) = err.sqlite_error() else {
        return match err {
            rusqlite::Error::InvalidParameterCount(..)
            | rusqlite::Error::InvalidParameterName(_)
            | rusqlite::Error::ToSqlConversionFailure(_)
            | rusqlite::Error::MultipleStatement => SinkError::permanent("sql", message),
            _ => SinkError::dependency("database", message),
        };
    };
    let (class, kind) = match sqlite.code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => (Dependency, "busy"),
        ErrorCode::ConstraintViolation => (Permanent, "constraint"),
        ErrorCode::TypeMismatch | ErrorCode::TooBig | ErrorCode::ParameterOutOfRange => {
            (Permanent, "data")
        }
        // SQLITE_ERROR: no such table or column, syntax: a config bug.
        ErrorCode::Unknown | ErrorCode::AuthorizationForStatementDenied => (Permanent, "sql"),
        ErrorCode::OperationInterrupted => (Dependency, "statement_timeout"),
        ErrorCode::DiskFull
        | ErrorCode::SystemIoFailure
        | ErrorCode::CannotOpen
        | ErrorCode::OutOfMemory
        | ErrorCode::ReadOnly
        | ErrorCode::PermissionDenied
        | ErrorCode::FileLockingProtocolFailed
        | ErrorCode::NoLargeFileSupport => (Dependency, "resources"),
        _ => (Dependency, "database"),
    };
    SinkError {
        class,
        kind,
        code: Some(sqlite.extended_code.to_string()),
        message,
        retry_after: None,
        target: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_reaches_only_the_apply_it_names() {
        let limits = Limits::default();
        let (first, second) = (Arc::default(), Arc::default());
        limits.begin(Duration::from_secs(60), &first);
        assert!(!limits.should_stop());
        first.store(true, Ordering::Relaxed);
        assert!(limits.should_stop());
        limits.end();
        assert!(!limits.should_stop(), "nothing runs");
        limits.begin(Duration::from_secs(60), &second);
        assert!(!limits.should_stop(), "the first's stop ended with it");
        second.store(true, Ordering::Relaxed);
        assert!(limits.should_stop());
        limits.begin(Duration::ZERO, &Arc::default());
        assert!(limits.should_stop(), "past its deadline");
    }

    #[test]
    fn urls() {
        assert_eq!(parse_url("sqlite::memory:"), Some(Location::Memory));
        assert_eq!(parse_url("sqlite://:memory:"), Some(Location::Memory));
        assert_eq!(
            parse_url("sqlite://data/bw.db?mode=rwc"),
            Some(Location::File("data/bw.db".into()))
        );
        assert_eq!(
            parse_url("sqlite:///var/lib/bw.db"),
            Some(Location::File("/var/lib/bw.db".into()))
        );
        assert_eq!(
            parse_url("sqlite:bw.db"),
            Some(Location::File("bw.db".into()))
        );
        assert_eq!(parse_url("sqlite://"), None);
        assert_eq!(parse_url("postgres://x"), None);
    }

    #[test]
    fn values_bind_with_sqlite_affinity() {
        use serde_json::json;
        assert_eq!(to_sqlite(&ParamValue::Json(json!(3))), SqlValue::Integer(3));
        assert_eq!(
            to_sqlite(&ParamValue::Json(json!(2.5))),
            SqlValue::Real(2.5)
        );
        assert_eq!(
            to_sqlite(&ParamValue::Json(json!(true))),
            SqlValue::Integer(1)
        );
        assert_eq!(
            to_sqlite(&ParamValue::Json(json!({"a": [1]}))),
            SqlValue::Text(r#"{"a":[1]}"#.into())
        );
        assert_eq!(to_sqlite(&ParamValue::Null), SqlValue::Null);
    }
}
