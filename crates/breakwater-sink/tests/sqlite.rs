//! Integration tests of the SQLite sink on a file in a temporary directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use breakwater_sink::{
    Applied, Event, FailureClass, SinkSettings, SinkSetupError, StatementSpec, connect,
};
use rusqlite::Connection;

fn statements() -> BTreeMap<String, Vec<StatementSpec>> {
    let mut params = BTreeMap::new();
    params.insert("status".to_owned(), "json:/data/object/status".to_owned());
    params.insert("amount".to_owned(), "json:/data/object/amount".to_owned());
    let mut all = BTreeMap::new();
    all.insert(
        "stripe".to_owned(),
        vec![
            StatementSpec {
                sql: "UPDATE orders SET status = $status, amount = $amount, hits = hits + 1, \
                      updated_at = datetime('now') WHERE id = $entity"
                    .to_owned(),
                params,
            },
            StatementSpec {
                sql: "INSERT INTO event_log (event_id, body) VALUES ($event_id, $payload) \
                      RETURNING rowid"
                    .to_owned(),
                params: BTreeMap::new(),
            },
        ],
    );
    all
}

fn schema(path: &Path) -> Connection {
    let c = Connection::open(path).expect("open");
    c.execute_batch(
        "CREATE TABLE orders (
             id INTEGER PRIMARY KEY,
             status TEXT NOT NULL CHECK (status IN ('pending', 'paid')),
             amount REAL,
             hits INTEGER NOT NULL DEFAULT 0,
             updated_at TEXT
         );
         CREATE TABLE event_log (event_id TEXT, body TEXT);
         INSERT INTO orders (id, status) VALUES (1042, 'pending');",
    )
    .expect("schema");
    c
}

fn settings(path: &Path) -> SinkSettings {
    let mut s = SinkSettings::new(format!("sqlite://{}", path.display()));
    s.lock_timeout = Duration::from_millis(200);
    s.acquire_timeout = Duration::from_millis(500);
    s
}

fn event<'a>(id: &'a str, body: &'a [u8]) -> Event<'a> {
    Event {
        source: "stripe",
        event_id: id,
        entity_key: Some("1042"),
        headers: &[],
        body,
        received_at_ms: 1_700_000_000_123,
        attempt: 1,
    }
}

#[tokio::test]
async fn new_then_duplicate_applies_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested/dir/bw.db");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    let c = schema(&path);
    let sink = connect(&settings(&path), &statements())
        .await
        .expect("connect");

    let body = br#"{"data":{"object":{"status":"paid","amount":12.5}}}"#;
    assert_eq!(
        sink.apply(&event("evt_1", body)).await.expect("new"),
        Applied::New
    );
    assert_eq!(
        sink.apply(&event("evt_1", body)).await.expect("dup"),
        Applied::Duplicate
    );
    let (status, amount, hits): (String, f64, i64) = c
        .query_row(
            "SELECT status, amount, hits FROM orders WHERE id = 1042",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("order");
    assert_eq!((status.as_str(), amount, hits), ("paid", 12.5, 1));
    let (payload, received, applied): (String, String, Option<String>) = c
        .query_row(
            "SELECT payload, received_at, applied_at FROM breakwater_inbox WHERE event_id = 'evt_1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("inbox");
    assert_eq!(payload.as_bytes(), body);
    assert_eq!(received, "2023-11-14T22:13:20.123Z");
    assert!(applied.is_some());
    let logged: i64 = c
        .query_row("SELECT count(*) FROM event_log", [], |r| r.get(0))
        .expect("log");
    assert_eq!(logged, 1);
    assert_eq!(sink.pool_usage(), (0, 1));
}

#[tokio::test]
async fn constraint_violation_is_permanent_and_rolls_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let sink = connect(&settings(&path), &statements())
        .await
        .expect("connect");
    let body = br#"{"data":{"object":{"status":"bogus","amount":1}}}"#;
    let err = sink.apply(&event("evt_c", body)).await.expect_err("check");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "constraint"),
        "{err}"
    );
    let n: i64 = c
        .query_row("SELECT count(*) FROM breakwater_inbox", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, 0, "rolled back");

    let err = sink
        .apply(&event("evt_m", br#"{"data":{}}"#))
        .await
        .expect_err("missing");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "missing_param")
    );
    let body = br#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    assert_eq!(
        sink.apply(&event("evt_ok", body)).await.expect("ok"),
        Applied::New
    );
}

#[tokio::test]
async fn a_writer_holding_the_lock_is_busy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    schema(&path);
    let s = settings(&path);
    let sink = connect(&s, &statements()).await.expect("connect");

    let other = Connection::open(&path).expect("open");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let body = br#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    let started = Instant::now();
    let err = sink.apply(&event("evt_b", body)).await.expect_err("busy");
    let waited = started.elapsed();
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "busy"),
        "{err}"
    );
    assert!(err.is_lock_related());
    assert!(
        waited >= s.lock_timeout && waited < s.lock_timeout * 5,
        "waited {waited:?}"
    );
    other.execute_batch("COMMIT").expect("release");
    assert_eq!(
        sink.apply(&event("evt_b", body)).await.expect("after"),
        Applied::New
    );
}

#[tokio::test]
async fn a_statement_past_statement_timeout_is_interrupted_and_rolled_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    schema(&path);
    let mut s = settings(&path);
    s.statement_timeout = Duration::from_millis(400);
    let mut all = BTreeMap::new();
    all.insert(
        "stripe".to_owned(),
        vec![
            StatementSpec {
                sql: "UPDATE orders SET hits = hits + 1 WHERE id = $entity".to_owned(),
                params: BTreeMap::new(),
            },
            // Runs for tens of seconds unless stopped: a scan the SQL did
            // not mean.
            StatementSpec {
                sql: SLOW_READ.to_owned(),
                params: BTreeMap::new(),
            },
        ],
    );
    all.insert("quick".to_owned(), all["stripe"][..1].to_vec());
    let sink = connect(&s, &all).await.expect("connect");
    let started = Instant::now();
    let err = sink
        .apply(&event("evt_slow", b"{}"))
        .await
        .expect_err("interrupted");
    let took = started.elapsed();
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "statement_timeout"),
        "{err}"
    );
    assert!(
        took >= s.statement_timeout && took < Duration::from_secs(5),
        "took {took:?}"
    );
    // Rolled back: neither the inbox row nor the first statement's update.
    let check = Connection::open(&path).expect("open");
    let (inbox, hits): (i64, i64) = check
        .query_row(
            "SELECT (SELECT count(*) FROM breakwater_inbox), hits FROM orders WHERE id = 1042",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("read");
    assert_eq!((inbox, hits), (0, 0));
    // The same connection is usable again: the interrupt does not linger.
    let quick = Event {
        source: "quick",
        ..event("evt_quick", b"{}")
    };
    assert_eq!(sink.apply(&quick).await.expect("quick"), Applied::New);

    // An apply dropped half-way (a worker aborted at shutdown) stops its
    // statement too: the connection is free again at once, not when the
    // statement would have ended.
    s.statement_timeout = Duration::from_secs(600);
    let sink = connect(&s, &all).await.expect("connect");
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        sink.apply(&event("evt_2", b"{}")),
    )
    .await;
    assert!(dropped.is_err(), "still running when dropped");
    let quick = Event {
        source: "quick",
        ..event("evt_quick_2", b"{}")
    };
    assert_eq!(
        sink.apply(&quick).await.expect("the connection came back"),
        Applied::New
    );
}

#[tokio::test]
async fn memory_urls_and_setup_errors() {
    let sink = connect(&SinkSettings::new("sqlite::memory:"), &BTreeMap::new())
        .await
        .expect("memory");
    assert_eq!(
        sink.apply(&event("e", b"x")).await.expect("new"),
        Applied::New
    );
    assert_eq!(
        sink.apply(&event("e", b"x")).await.expect("dup"),
        Applied::Duplicate
    );
    assert!(sink.lock_snapshot().await.is_none());

    let err = match connect(&SinkSettings::new("mysql://x"), &BTreeMap::new()).await {
        Err(e) => e,
        Ok(_) => panic!("accepted mysql"),
    };
    assert!(matches!(err, SinkSetupError::UnsupportedUrl(_)), "{err}");

    let mut bad = statements();
    bad.insert(
        "github".to_owned(),
        vec![StatementSpec {
            sql: "UPDATE t SET a = $nope".to_owned(),
            params: BTreeMap::new(),
        }],
    );
    let err = match connect(&SinkSettings::new("sqlite::memory:"), &bad).await {
        Err(e) => e,
        Ok(_) => panic!("accepted $nope"),
    };
    assert!(
        matches!(&err, SinkSetupError::Statement { source_name, index: 0, .. } if source_name == "github"),
        "{err}"
    );

    let mut s = SinkSettings::new("sqlite::memory:");
    s.statement_timeout = s.lock_timeout;
    let err = match connect(&s, &BTreeMap::new()).await {
        Err(e) => e,
        Ok(_) => panic!("accepted equal timeouts"),
    };
    assert!(matches!(err, SinkSetupError::Settings(_)), "{err}");
}

#[tokio::test]
async fn the_same_event_id_from_two_sources_applies_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let bump = StatementSpec {
        sql: "UPDATE orders SET hits = hits + 1 WHERE id = $entity".to_owned(),
        params: BTreeMap::new(),
    };
    let mut all = BTreeMap::new();
    all.insert("webhooks_a".to_owned(), vec![bump.clone()]);
    all.insert("webhooks_b".to_owned(), vec![bump]);
    let sink = connect(&settings(&path), &all).await.expect("connect");

    let a = Event {
        source: "webhooks_a",
        ..event("msg_same", b"{}")
    };
    let b = Event {
        source: "webhooks_b",
        ..event("msg_same", b"{}")
    };
    let hits = || -> i64 {
        c.query_row("SELECT hits FROM orders WHERE id = 1042", [], |r| r.get(0))
            .expect("hits")
    };
    assert_eq!(sink.apply(&a).await.expect("a"), Applied::New);
    assert_eq!(sink.apply(&b).await.expect("b"), Applied::New);
    assert_eq!(hits(), 2, "both sources' statements ran");
    assert_eq!(sink.apply(&a).await.expect("a again"), Applied::Duplicate);
    assert_eq!(sink.apply(&b).await.expect("b again"), Applied::Duplicate);
    assert_eq!(hits(), 2, "redeliveries had no effect");
    let rows: i64 = c
        .query_row(
            "SELECT count(*) FROM breakwater_inbox WHERE event_id = 'msg_same'",
            [],
            |r| r.get(0),
        )
        .expect("inbox");
    assert_eq!(rows, 2);
}

#[tokio::test]
async fn an_inbox_keyed_on_event_id_alone_fails_setup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    Connection::open(&path)
        .expect("open")
        .execute_batch(
            "CREATE TABLE breakwater_inbox (
                 event_id TEXT PRIMARY KEY NOT NULL, source TEXT NOT NULL, entity_key TEXT,
                 payload TEXT, received_at TEXT NOT NULL, applied_at TEXT
             )",
        )
        .expect("old inbox");
    match connect(&settings(&path), &BTreeMap::new()).await {
        Err(SinkSetupError::Migrate(message)) => {
            assert!(message.contains("primary key (event_id)"), "{message}");
            assert!(message.contains("(source, event_id)"), "{message}");
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("accepted the old inbox key"),
    }
}

#[tokio::test]
async fn statements_the_database_rejects_fail_setup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    schema(&path);
    for (bad_sql, needle) in [
        (
            "UPDATE nope SET a = 1 WHERE id = $entity",
            "no such table: nope",
        ),
        (
            "UPDATE orders SET nope = 1 WHERE id = $entity",
            "no such column: nope",
        ),
        (
            "UPDATE orders SET hits = 1 WHER id = $entity",
            "syntax error",
        ),
    ] {
        let mut all = statements();
        all.insert(
            "s".to_owned(),
            vec![
                StatementSpec {
                    sql: "UPDATE orders SET hits = hits + 1 WHERE id = $entity".to_owned(),
                    params: BTreeMap::new(),
                },
                StatementSpec {
                    sql: bad_sql.to_owned(),
                    params: BTreeMap::new(),
                },
            ],
        );
        match connect(&settings(&path), &all).await {
            Err(SinkSetupError::Statement {
                source_name,
                index,
                message,
            }) => {
                assert_eq!((source_name.as_str(), index), ("s", 1), "{message}");
                assert!(message.contains(needle), "{bad_sql}: {message}");
            }
            Err(other) => panic!("{bad_sql}: unexpected {other}"),
            Ok(_) => panic!("accepted {bad_sql}"),
        }
    }
    // The tables must exist when the sink connects.
    let err = match connect(&SinkSettings::new("sqlite::memory:"), &statements()).await {
        Err(e) => e,
        Ok(_) => panic!("accepted statements on missing tables"),
    };
    assert!(
        matches!(&err, SinkSetupError::Statement { source_name, index: 0, .. } if source_name == "stripe"),
        "{err}"
    );
}

/// A body that is not JSON, accepted by a source that takes any body, is
/// never applied with a NULL payload: the inbox keeps it as a JSON string.
#[tokio::test]
async fn a_body_that_is_not_json_is_kept_as_a_json_string() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let mut all = BTreeMap::new();
    all.insert(
        "plain".to_owned(),
        vec![StatementSpec {
            sql: "UPDATE orders SET hits = hits + 1 WHERE id = $entity".to_owned(),
            params: BTreeMap::new(),
        }],
    );
    let sink = connect(&settings(&path), &all).await.expect("connect");
    let ev = Event {
        source: "plain",
        ..event("evt_text", b"status=paid")
    };
    assert_eq!(sink.apply(&ev).await.expect("applied"), Applied::New);
    let payload: Option<String> = c
        .query_row(
            "SELECT payload FROM breakwater_inbox WHERE event_id = 'evt_text'",
            [],
            |r| r.get(0),
        )
        .expect("inbox");
    assert_eq!(payload.as_deref(), Some("\"status=paid\""));
}

/// [`statements`] plus a source `slow` whose one statement is `sql`.
fn with_slow_source(sql: &str) -> BTreeMap<String, Vec<StatementSpec>> {
    let mut all = statements();
    all.insert(
        "slow".to_owned(),
        vec![StatementSpec {
            sql: sql.to_owned(),
            params: BTreeMap::new(),
        }],
    );
    all
}

/// A read that runs for tens of seconds unless the statement timeout
/// stops it: a `slow` source ([`with_slow_source`]) that holds the
/// connection.
const SLOW_READ: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
                         WHERE i < 300000000) SELECT count(*) FROM n WHERE $entity <> ''";

/// Applies one event (id, source, body) from a task of its own.
fn spawn_apply(
    sink: &std::sync::Arc<dyn breakwater_sink::Sink>,
    (id, source, body): (&str, &str, &str),
) -> tokio::task::JoinHandle<Result<Applied, breakwater_sink::SinkError>> {
    let (sink, id, source, body) = (
        std::sync::Arc::clone(sink),
        id.to_owned(),
        source.to_owned(),
        body.to_owned(),
    );
    tokio::spawn(async move {
        sink.apply(&Event {
            source: &source,
            ..event(&id, body.as_bytes())
        })
        .await
    })
}

/// Applies `events` (event id, source, body) at once, each from a task of
/// its own, so those that wait for the connection commit as one group;
/// the outcomes in the order given.
async fn apply_at_once(
    sink: &std::sync::Arc<dyn breakwater_sink::Sink>,
    events: &[(&str, &str, &str)],
) -> Vec<Result<Applied, breakwater_sink::SinkError>> {
    let tasks: Vec<_> = events.iter().map(|&e| spawn_apply(sink, e)).collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("apply task"));
    }
    outcomes
}

/// The inbox's event ids, the order's hits and the event log's rows.
fn applied_state(c: &Connection) -> (Vec<String>, i64, i64) {
    let mut ids = c
        .prepare("SELECT event_id FROM breakwater_inbox ORDER BY event_id")
        .expect("prepare");
    let ids = ids
        .query_map([], |r| r.get(0))
        .expect("ids")
        .collect::<Result<Vec<String>, _>>()
        .expect("ids");
    let (hits, logged) = c
        .query_row(
            "SELECT hits, (SELECT count(*) FROM event_log) FROM orders WHERE id = 1042",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("order");
    (ids, hits, logged)
}

/// Applies waiting for the connection commit together, each in its own
/// savepoint: one event's constraint failure rolls back only its own
/// statements, and an event id twice in one group is applied once.
#[tokio::test]
async fn a_group_keeps_each_events_outcome_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let sink = connect(&settings(&path), &statements())
        .await
        .expect("connect");
    let paid = r#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    let bogus = r#"{"data":{"object":{"status":"bogus","amount":1}}}"#;
    let outcomes = apply_at_once(
        &sink,
        &[
            ("evt_g0", "stripe", paid),
            ("evt_g1", "stripe", paid),
            ("evt_g2", "stripe", bogus),
            ("evt_g3", "stripe", paid),
            ("evt_g4", "stripe", paid),
            ("evt_g4", "stripe", paid),
            ("evt_g5", "stripe", paid),
        ],
    )
    .await;
    let kinds: Vec<String> = outcomes
        .iter()
        .map(|o| match o {
            Ok(applied) => format!("{applied:?}"),
            Err(e) => format!("{:?} {}", e.class, e.kind),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "New",
            "New",
            "Permanent constraint",
            "New",
            "New",
            "Duplicate",
            "New"
        ]
    );
    let (ids, hits, logged) = applied_state(&c);
    assert_eq!(ids, ["evt_g0", "evt_g1", "evt_g3", "evt_g4", "evt_g5"]);
    assert_eq!(
        (hits, logged),
        (5, 5),
        "each applied event's statements once"
    );
}

/// A write stopped by the statement timeout makes SQLite roll the whole
/// transaction back: the stopped event fails alone, and the events applied
/// before it in its group run again and commit, once each.
#[tokio::test]
async fn an_interrupted_write_fails_alone_and_its_group_runs_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let mut s = settings(&path);
    s.statement_timeout = Duration::from_millis(300);
    // A write that runs for tens of seconds unless stopped.
    let all = with_slow_source(
        "UPDATE orders SET hits = hits + (WITH RECURSIVE n(i) AS (SELECT 1 \
         UNION ALL SELECT i + 1 FROM n WHERE i < 300000000) SELECT count(*) FROM n) \
         WHERE id = $entity",
    );
    let sink = connect(&s, &all).await.expect("connect");
    let paid = r#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    let outcomes = apply_at_once(
        &sink,
        &[
            ("evt_i0", "stripe", paid),
            ("evt_i1", "stripe", paid),
            ("evt_i2", "stripe", paid),
            ("evt_i3", "slow", paid),
            ("evt_i4", "stripe", paid),
            ("evt_i5", "stripe", paid),
        ],
    )
    .await;
    for (i, outcome) in outcomes.iter().enumerate() {
        match (i, outcome) {
            (3, Err(e)) => assert_eq!(
                (e.class, e.kind),
                (FailureClass::Dependency, "statement_timeout"),
                "{e}"
            ),
            (3, Ok(applied)) => panic!("the slow write applied: {applied:?}"),
            (_, outcome) => assert_eq!(outcome.as_ref().ok(), Some(&Applied::New), "{i}"),
        }
    }
    let (ids, hits, logged) = applied_state(&c);
    assert_eq!(ids, ["evt_i0", "evt_i1", "evt_i2", "evt_i4", "evt_i5"]);
    assert_eq!(
        (hits, logged),
        (5, 5),
        "each applied event's statements once"
    );
}

/// An apply still waiting for the connection when the acquire timeout
/// passes fails as `pool_timeout` and never runs later in someone else's
/// group (it leaves the waiting list, and its stop flag is set: either
/// alone keeps it from running; the test fails without both).
#[tokio::test]
async fn an_apply_waiting_past_the_acquire_timeout_never_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let mut s = settings(&path);
    s.statement_timeout = Duration::from_millis(1500);
    let sink = connect(&s, &with_slow_source(SLOW_READ))
        .await
        .expect("connect");
    let paid = r#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    let holder = spawn_apply(&sink, ("evt_holds", "slow", "{}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = sink
        .apply(&event("evt_waits", paid.as_bytes()))
        .await
        .expect_err("the connection is held");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "pool_timeout"),
        "{err}"
    );
    let held = holder.await.expect("task").expect_err("stopped");
    assert_eq!(held.kind, "statement_timeout", "{held}");
    // The next apply of the same event is its first: the one that timed
    // out did not run in this one's group.
    assert_eq!(
        sink.apply(&event("evt_waits", paid.as_bytes()))
            .await
            .expect("applies"),
        Applied::New
    );
    let (ids, hits, logged) = applied_state(&c);
    assert_eq!(ids, ["evt_waits"]);
    assert_eq!((hits, logged), (1, 1));
}

/// The acquire timeout bounds an apply's wait for its turn inside a group
/// too: events queued behind a slow one in their group, whose turn comes
/// past it, fail as `pool_timeout` and are never started (applied again,
/// each is new).
#[tokio::test]
async fn an_apply_whose_turn_in_a_group_comes_past_the_acquire_timeout_never_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let mut s = settings(&path);
    // Each slow read is stopped at 1 s. The holder's ends at about 1 s,
    // well before the others' acquire timeout (1.5 s after they joined at
    // about 0.1 s); the second slow one, first in the group they join,
    // runs from about 1 s to 2 s, past the turn of the two after it.
    s.statement_timeout = Duration::from_millis(1000);
    s.acquire_timeout = Duration::from_millis(1500);
    let sink = connect(&s, &with_slow_source(SLOW_READ))
        .await
        .expect("connect");
    let paid = r#"{"data":{"object":{"status":"paid","amount":1}}}"#;
    let holder = spawn_apply(&sink, ("evt_holds", "slow", "{}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Joined in this order: the group is taken in it.
    let mut group = Vec::new();
    for joining in [
        ("evt_slow", "slow", "{}"),
        ("evt_late1", "stripe", paid),
        ("evt_late2", "stripe", paid),
    ] {
        group.push(spawn_apply(&sink, joining));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kind = |outcome: Result<Applied, breakwater_sink::SinkError>| match outcome {
        Ok(applied) => format!("{applied:?}"),
        Err(e) => e.kind.to_owned(),
    };
    assert_eq!(kind(holder.await.expect("task")), "statement_timeout");
    let mut kinds = Vec::new();
    for task in group {
        kinds.push(kind(task.await.expect("task")));
    }
    assert_eq!(
        kinds,
        ["statement_timeout", "pool_timeout", "pool_timeout"],
        "the slow one ran its course; the two after it were not started"
    );
    let (ids, hits, logged) = applied_state(&c);
    assert!(ids.is_empty(), "nothing of the late ones applied: {ids:?}");
    assert_eq!((hits, logged), (0, 0));
    for id in ["evt_late1", "evt_late2"] {
        assert_eq!(
            sink.apply(&event(id, paid.as_bytes()))
                .await
                .expect("applies"),
            Applied::New,
            "{id} applies as new: it never ran"
        );
    }
}

/// The stale-event guard's source: `hook`, versioned by the Standard
/// Webhooks `webhook-timestamp` header (digits), its statement recording
/// the version it applied.
fn versioned(path: &Path) -> (SinkSettings, BTreeMap<String, Vec<StatementSpec>>) {
    let mut s = settings(path);
    s.versions
        .insert("hook".to_owned(), "header:webhook-timestamp".to_owned());
    let mut params = BTreeMap::new();
    params.insert("status".to_owned(), "json:/status".to_owned());
    let mut all = BTreeMap::new();
    all.insert(
        "hook".to_owned(),
        vec![StatementSpec {
            sql: "UPDATE orders SET status = $status, amount = $version, hits = hits + 1 \
                  WHERE id = $entity"
                .to_owned(),
            params,
        }],
    );
    (s, all)
}

fn hook_event<'a>(
    id: &'a str,
    key: Option<&'a str>,
    headers: &'a [(String, String)],
    body: &'a [u8],
) -> Event<'a> {
    Event {
        source: "hook",
        event_id: id,
        entity_key: key,
        headers,
        body,
        received_at_ms: 1_700_000_000_123,
        attempt: 1,
    }
}

fn stamped(at: &str) -> Vec<(String, String)> {
    vec![("webhook-timestamp".to_owned(), at.to_owned())]
}

fn order_state(c: &Connection) -> (String, Option<f64>, i64) {
    c.query_row(
        "SELECT status, amount, hits FROM orders WHERE id = 1042",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .expect("order")
}

fn superseded_by(c: &Connection, id: &str) -> Option<String> {
    c.query_row(
        "SELECT superseded_by FROM breakwater_inbox WHERE source = 'hook' AND event_id = ?1",
        [id],
        |r| r.get(0),
    )
    .unwrap_or_else(|e| panic!("{id} has an inbox row: {e}"))
}

/// SQLite keeps the newest version per key like PostgreSQL: newest first,
/// the older ones are superseded (statements not run, inbox row kept with
/// `superseded_by`); an equal version and a missing one apply; a version
/// that is not one is a permanent failure naming it.
#[tokio::test]
async fn version_guard_supersedes_older_events_of_a_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    let (settings, statements) = versioned(&path);
    let sink = connect(&settings, &statements).await.expect("connect");
    let apply = |id: &'static str, at: Option<&'static str>, status: &'static str| {
        let sink = std::sync::Arc::clone(&sink);
        async move {
            let headers = at.map(stamped).unwrap_or_default();
            let body = format!(r#"{{"status":"{status}"}}"#);
            sink.apply(&hook_event(id, Some("1042"), &headers, body.as_bytes()))
                .await
        }
    };
    // Newest first, concurrently too: one group, in the order they came.
    let (third, second, first) = tokio::join!(
        apply("evt_3", Some("1700000300"), "paid"),
        apply("evt_2", Some("1700000200"), "pending"),
        apply("evt_1", Some("1700000100"), "pending"),
    );
    assert_eq!(third.expect("evt_3"), Applied::New);
    for (id, applied) in [("evt_2", second), ("evt_1", first)] {
        assert_eq!(
            applied.expect(id),
            Applied::Superseded {
                by: "evt_3".to_owned()
            },
            "{id}"
        );
        assert_eq!(superseded_by(&c, id).as_deref(), Some("evt_3"));
    }
    assert_eq!(
        order_state(&c),
        ("paid".to_owned(), Some(1_700_000_300.0), 1)
    );
    assert_eq!(superseded_by(&c, "evt_3"), None);
    match sink.inbox_lookup("hook", "evt_1").await.expect("lookup") {
        breakwater_sink::InboxLookup::Found(r) => {
            assert_eq!(r.superseded_by.as_deref(), Some("evt_3"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        apply("evt_2", Some("1700000200"), "pending")
            .await
            .expect("again"),
        Applied::Duplicate
    );
    // Equal: applies. Missing: no guard.
    assert_eq!(
        apply("evt_3b", Some("1700000300"), "pending")
            .await
            .expect("equal"),
        Applied::New
    );
    assert_eq!(
        order_state(&c),
        ("pending".to_owned(), Some(1_700_000_300.0), 2)
    );
    assert_eq!(
        apply("evt_none", None, "paid").await.expect("no version"),
        Applied::New
    );
    assert_eq!(order_state(&c), ("paid".to_owned(), None, 3));
    let err = apply("evt_bad", Some("soon"), "paid")
        .await
        .expect_err("not a version");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "invalid_version")
    );
    assert!(err.message.contains("header:webhook-timestamp"), "{err}");
    assert!(err.message.contains("soon"), "{err}");
    let stored: (i64, String) = c
        .query_row(
            "SELECT version, event_id FROM breakwater_versions \
             WHERE source = 'hook' AND entity_key = '1042'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("the key's version row");
    assert_eq!(stored, (1_700_000_300, "evt_3b".to_owned()));
}

/// An inbox made before the guard gains `superseded_by` at open.
#[tokio::test]
async fn version_guard_adds_superseded_by_to_an_older_inbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.db");
    let c = schema(&path);
    c.execute_batch(
        "CREATE TABLE breakwater_inbox (event_id TEXT NOT NULL, source TEXT NOT NULL,
         entity_key TEXT, payload TEXT, received_at TEXT NOT NULL, applied_at TEXT,
         PRIMARY KEY (source, event_id));",
    )
    .expect("an older inbox");
    let (settings, statements) = versioned(&path);
    for _ in 0..2 {
        drop(connect(&settings, &statements).await.expect("connect"));
    }
    let sink = connect(&settings, &statements).await.expect("connect");
    let (newer, older) = (stamped("20"), stamped("10"));
    let body = br#"{"status":"paid"}"#;
    assert_eq!(
        sink.apply(&hook_event("evt_b", Some("1042"), &newer, body))
            .await
            .expect("newer"),
        Applied::New
    );
    assert_eq!(
        sink.apply(&hook_event("evt_a", Some("1042"), &older, body))
            .await
            .expect("older"),
        Applied::Superseded {
            by: "evt_b".to_owned()
        }
    );
    assert_eq!(superseded_by(&c, "evt_a").as_deref(), Some("evt_b"));
}
