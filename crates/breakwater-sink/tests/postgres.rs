//! Integration tests of the PostgreSQL sink against a real server
//! (`postgres@127.0.0.1:5432`, trust auth; override with
//! `BREAKWATER_TEST_PG_URL`). Each test creates its own database and drops
//! it when done, even if the test panics. The server being unreachable is a
//! failure, never a skip.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use breakwater_sink::{
    Applied, Event, FailureClass, LockWaitersScope, Sink, SinkSettings, SinkSetupError,
    StatementSpec, connect,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::{Client, NoTls};

fn base_url() -> String {
    std::env::var("BREAKWATER_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn url_for(db: &str) -> String {
    let base = base_url();
    let (prefix, _) = base.rsplit_once('/').expect("the URL names a database");
    format!("{prefix}/{db}")
}

async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {url} is unreachable ({e}); these tests need it (CI={})",
                std::env::var("CI").unwrap_or_default()
            )
        });
    tokio::spawn(connection);
    client
}

/// A database of one's own, dropped on drop.
struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    async fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "bw_sink_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let admin = client(&base_url()).await;
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create the test database");
        }
        let url = url_for(&name);
        Self { name, url }
    }

    async fn client(&self) -> Client {
        client(&self.url).await
    }

    fn settings(&self) -> SinkSettings {
        let mut s = SinkSettings::new(self.url.clone());
        s.lock_timeout = Duration::from_millis(300);
        s.statement_timeout = Duration::from_millis(2000);
        s.acquire_timeout = Duration::from_millis(500);
        s.pool_max = 4;
        s
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Async drop does not exist: drop the database from a thread of its
        // own, with a runtime of its own, also when the test panicked.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((c, conn)) = tokio_postgres::connect(&base_url(), NoTls).await {
                    tokio::spawn(conn);
                    let _ = c
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

const ORDERS: &str = "
CREATE TYPE order_status AS ENUM ('pending', 'paid', 'refunded');
CREATE TABLE orders (
    id         bigint PRIMARY KEY,
    status     text NOT NULL CHECK (status IN ('pending', 'paid', 'refunded')),
    kind       order_status,
    amount     numeric(12, 2),
    ratio      float8,
    hits       int NOT NULL DEFAULT 0,
    updated_at timestamptz
);
CREATE TABLE event_log (event_id text, shop text, body jsonb);
INSERT INTO orders (id, status) VALUES (1042, 'pending'), (1043, 'pending');";

fn spec(sql: &str, params: &[(&str, &str)]) -> StatementSpec {
    StatementSpec {
        sql: sql.to_owned(),
        params: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn statements() -> BTreeMap<String, Vec<StatementSpec>> {
    let mut all = BTreeMap::new();
    all.insert(
        "stripe".to_owned(),
        vec![
            spec(
                "UPDATE orders SET status = $status, updated_at = now(), hits = hits + 1 \
                 WHERE id = $entity",
                &[("status", "json:/data/object/status")],
            ),
            spec(
                "INSERT INTO event_log (event_id, shop, body) VALUES ($event_id, $shop, $payload)",
                &[("shop", "header:X-Shop-Domain")],
            ),
        ],
    );
    all.insert(
        "typed".to_owned(),
        vec![spec(
            "UPDATE orders SET amount = $amount, kind = $kind, ratio = 1 / $n \
             WHERE id = $entity",
            &[
                ("amount", "json:/amount"),
                ("kind", "json:/kind"),
                ("n", "json:/n"),
            ],
        )],
    );
    all.insert(
        "plain".to_owned(),
        vec![spec(
            "UPDATE orders SET hits = hits + 1 WHERE id = $entity",
            &[],
        )],
    );
    all
}

fn headers() -> Vec<(String, String)> {
    vec![("x-shop-domain".to_owned(), "shop.example".to_owned())]
}

fn event<'a>(
    source: &'a str,
    id: &'a str,
    key: &'a str,
    headers: &'a [(String, String)],
    body: &'a [u8],
) -> Event<'a> {
    Event {
        source,
        event_id: id,
        entity_key: Some(key),
        headers,
        body,
        received_at_ms: 1_700_000_000_000,
        attempt: 1,
    }
}

async fn setup(db: &TestDb, settings: &SinkSettings) -> (Arc<dyn Sink>, Client) {
    let c = db.client().await;
    c.batch_execute(ORDERS).await.expect("schema");
    let sink = connect(settings, &statements()).await.expect("connect");
    (sink, c)
}

async fn hits(c: &Client, id: i64) -> i32 {
    c.query_one("SELECT hits FROM orders WHERE id = $1", &[&id])
        .await
        .expect("hits")
        .get(0)
}

#[tokio::test]
async fn new_then_duplicate_applies_once_with_converted_types() {
    let db = TestDb::new().await;
    let (sink, c) = setup(&db, &db.settings()).await;
    let h = headers();
    let body = br#"{"id":"evt_1","data":{"object":{"id":1042,"status":"paid"}}}"#;
    let ev = event("stripe", "evt_1", "1042", &h, body);

    assert_eq!(sink.apply(&ev).await.expect("first"), Applied::New);
    assert_eq!(sink.apply(&ev).await.expect("second"), Applied::Duplicate);

    let row = c
        .query_one(
            "SELECT status, hits, updated_at IS NOT NULL FROM orders WHERE id = 1042",
            &[],
        )
        .await
        .expect("order");
    assert_eq!(row.get::<_, String>(0), "paid");
    assert_eq!(row.get::<_, i32>(1), 1, "the statement ran once");
    assert!(row.get::<_, bool>(2));
    let log = c
        .query_one(
            "SELECT shop, body->'data'->'object'->>'status' FROM event_log",
            &[],
        )
        .await
        .expect("one log row");
    assert_eq!(log.get::<_, String>(0), "shop.example");
    assert_eq!(log.get::<_, String>(1), "paid");
    let inbox = c
        .query_one(
            "SELECT source, entity_key, payload->>'id', applied_at IS NOT NULL, \
             extract(epoch FROM received_at)::int8 FROM breakwater_inbox WHERE event_id = 'evt_1'",
            &[],
        )
        .await
        .expect("inbox row");
    assert_eq!(inbox.get::<_, String>(0), "stripe");
    assert_eq!(inbox.get::<_, String>(1), "1042");
    assert_eq!(inbox.get::<_, String>(2), "evt_1");
    assert!(inbox.get::<_, bool>(3));
    assert_eq!(inbox.get::<_, i64>(4), 1_700_000_000);

    // A body that is not JSON still applies when no statement needs JSON;
    // its payload is kept as a JSON string, never NULL.
    let ev = event("plain", "evt_2", "1043", &h, b"not json");
    assert_eq!(sink.apply(&ev).await.expect("plain"), Applied::New);
    assert_eq!(hits(&c, 1043).await, 1);
    let payload: Option<String> = c
        .query_one(
            "SELECT payload #>> '{}' FROM breakwater_inbox WHERE event_id = 'evt_2'",
            &[],
        )
        .await
        .expect("inbox row")
        .get(0);
    assert_eq!(payload.as_deref(), Some("not json"));
    // A signed body spelling a NUL (`\u0000`), which jsonb refuses, is
    // still applied; the inbox keeps it as a JSON string.
    let ev = event("plain", "evt_nul", "1043", &h, br#"{"note":"a\u0000b"}"#);
    assert_eq!(
        sink.apply(&ev).await.expect("a NUL in the payload"),
        Applied::New
    );
    assert_eq!(hits(&c, 1043).await, 2);
    // A source without statements records the event only.
    let ev = event("unknown", "evt_3", "1043", &h, b"{}");
    assert_eq!(sink.apply(&ev).await.expect("no statements"), Applied::New);
    assert_eq!(sink.pool_usage().1, 4);
}

/// Columns of domain types (a jsonb domain, an int[] domain) take their
/// base type's binary form: a jsonb domain needs jsonb's version byte (the
/// server refused it: "unsupported jsonb version number"), and an array
/// domain its member type (the driver panicked: "expected array type").
#[tokio::test]
async fn domain_typed_columns_apply() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "CREATE DOMAIN doc AS jsonb;
         CREATE DOMAIN item_ids AS int[] CHECK (cardinality(VALUE) > 0);
         CREATE TABLE tagged (id bigint PRIMARY KEY, body doc, items item_ids);",
    )
    .await
    .expect("schema");
    let mut statements = BTreeMap::new();
    statements.insert(
        "shop".to_owned(),
        vec![spec(
            "INSERT INTO tagged (id, body, items) VALUES ($entity, $payload, $items)",
            &[("items", "json:/items")],
        )],
    );
    let sink = connect(&db.settings(), &statements).await.expect("connect");
    let body = br#"{"kind":"order.paid","items":[7,8,9]}"#;
    let ev = event("shop", "evt_dom", "77", &[], body);
    assert_eq!(sink.apply(&ev).await.expect("applies"), Applied::New);
    let row = c
        .query_one(
            "SELECT body->>'kind', items::int[] FROM tagged WHERE id = 77",
            &[],
        )
        .await
        .expect("the row");
    assert_eq!(row.get::<_, String>(0), "order.paid");
    assert_eq!(row.get::<_, Vec<i32>>(1), vec![7, 8, 9]);
    // The domain's own check still runs on the server: a permanent error,
    // and the inbox row rolled back with it.
    let ev = event("shop", "evt_empty", "78", &[], br#"{"items":[]}"#);
    let err = sink.apply(&ev).await.expect_err("the CHECK refuses it");
    assert!(err.is_permanent(), "{err}");
    let inbox: i64 = c
        .query_one(
            "SELECT count(*) FROM breakwater_inbox WHERE event_id = 'evt_empty'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(inbox, 0, "nothing of a failed apply is committed");
}

#[tokio::test]
async fn numeric_enum_and_data_errors() {
    let db = TestDb::new().await;
    let (sink, c) = setup(&db, &db.settings()).await;
    let body = br#"{"amount": 12.34, "kind": "paid", "n": 4}"#;
    let ev = event("typed", "evt_t1", "1042", &[], body);
    assert_eq!(sink.apply(&ev).await.expect("typed"), Applied::New);
    let row = c
        .query_one(
            "SELECT amount::text, kind::text, ratio FROM orders WHERE id = 1042",
            &[],
        )
        .await
        .expect("order");
    assert_eq!(row.get::<_, String>(0), "12.34");
    assert_eq!(row.get::<_, String>(1), "paid");
    assert_eq!(row.get::<_, f64>(2), 0.0, "1 / 4 in integer arithmetic");

    // The entity key is not a bigint: converting it fails before the DB.
    let ev = event("typed", "evt_t2", "abc", &[], body);
    let err = sink.apply(&ev).await.expect_err("bad key");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "data"),
        "{err}"
    );

    // Division by zero is the database's data exception (class 22).
    let body = br#"{"amount": 1, "kind": "paid", "n": 0}"#;
    let ev = event("typed", "evt_t3", "1042", &[], body);
    let err = sink.apply(&ev).await.expect_err("division by zero");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "data"),
        "{err}"
    );
    assert_eq!(err.code.as_deref(), Some("22012"));

    // Not a label of the enum: invalid input value (22P02).
    let body = br#"{"amount": 1, "kind": "lost", "n": 1}"#;
    let ev = event("typed", "evt_t4", "1042", &[], body);
    let err = sink.apply(&ev).await.expect_err("bad enum label");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "data"),
        "{err}"
    );

    // A field the statement needs is missing; the body is not JSON.
    let ev = event("typed", "evt_t5", "1042", &[], br#"{"amount": 1}"#);
    let err = sink.apply(&ev).await.expect_err("missing");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "missing_param")
    );
    let ev = event("typed", "evt_t6", "1042", &[], b"<xml/>");
    let err = sink.apply(&ev).await.expect_err("not json");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "invalid_json")
    );

    // None of the failures left an inbox row behind.
    let n: i64 = c
        .query_one("SELECT count(*) FROM breakwater_inbox", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn constraint_violation_is_permanent_and_rolls_back() {
    let db = TestDb::new().await;
    let (sink, c) = setup(&db, &db.settings()).await;
    let h = headers();
    let body = br#"{"data":{"object":{"status":"bogus"}}}"#;
    let ev = event("stripe", "evt_c", "1042", &h, body);
    let err = sink.apply(&ev).await.expect_err("check violation");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Permanent, "constraint"),
        "{err}"
    );
    assert_eq!(err.code.as_deref(), Some("23514"));
    assert!(err.message.contains("orders_status_check"), "{err}");
    let n: i64 = c
        .query_one("SELECT count(*) FROM breakwater_inbox", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 0, "the inbox insert was rolled back");
    assert_ended_by_the_pipelined_commit(&c, &db).await;
    // The connection went back to the pool usable, and is the one reused.
    let ev = event("plain", "evt_ok", "1042", &h, b"{}");
    assert_eq!(sink.apply(&ev).await.expect("after"), Applied::New);
    assert_ended_by_the_pipelined_commit(&c, &db).await;
}

/// The last statement of each of the sink's own sessions in `db`, as
/// `pg_stat_activity` shows it once the session is idle.
async fn sink_sessions_last_statements(c: &Client, db: &TestDb) -> Vec<String> {
    let rows = c
        .query(
            "SELECT query FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = 'breakwater-sink' AND state = 'idle'",
            &[&db.name],
        )
        .await
        .expect("pg_stat_activity");
    rows.iter().map(|r| r.get(0)).collect()
}

/// A statement's error aborts the transaction, and the `COMMIT` pipelined
/// behind it ends it: the connection goes back to the pool with `COMMIT`
/// as its last statement, no `ROLLBACK` round trip after it.
async fn assert_ended_by_the_pipelined_commit(c: &Client, db: &TestDb) {
    let last = sink_sessions_last_statements(c, db).await;
    assert_eq!(last, vec!["COMMIT".to_owned()], "the sink's sessions");
}

async fn hold_row_lock(db: &TestDb, id: i64) -> (Client, i32) {
    let holder = db.client().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT * FROM orders WHERE id = {id} FOR UPDATE"
        ))
        .await
        .expect("lock the row");
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    (holder, pid)
}

#[tokio::test]
async fn a_held_row_lock_is_a_lock_timeout() {
    let db = TestDb::new().await;
    let settings = db.settings();
    let (sink, c) = setup(&db, &settings).await;
    let (holder, _) = hold_row_lock(&db, 1042).await;

    let ev = event("plain", "evt_l", "1042", &[], b"{}");
    let started = Instant::now();
    let err = sink.apply(&ev).await.expect_err("locked");
    let waited = started.elapsed();
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "lock_timeout"),
        "{err}"
    );
    assert_eq!(err.code.as_deref(), Some("55P03"));
    assert!(err.is_lock_related());
    assert!(
        waited >= settings.lock_timeout && waited < settings.lock_timeout * 4,
        "waited {waited:?}"
    );
    assert_ended_by_the_pipelined_commit(&c, &db).await;

    holder.batch_execute("ROLLBACK").await.expect("release");
    assert_eq!(sink.apply(&ev).await.expect("retry"), Applied::New);
    assert_eq!(hits(&c, 1042).await, 1);
}

#[tokio::test]
async fn lock_snapshot_sees_the_waiter_and_survives_a_full_pool() {
    let db = TestDb::new().await;
    let mut settings = db.settings();
    settings.lock_timeout = Duration::from_millis(3000);
    settings.statement_timeout = Duration::from_millis(5000);
    settings.pool_max = 1;
    settings.acquire_timeout = Duration::from_millis(200);
    let (sink, _c) = setup(&db, &settings).await;

    let idle = sink.lock_snapshot().await.expect("snapshot");
    assert_eq!(idle.waiting, 0);
    assert!(idle.blockers.is_empty());

    let (holder, holder_pid) = hold_row_lock(&db, 1042).await;
    let waiter = {
        let sink = Arc::clone(&sink);
        tokio::spawn(async move {
            let ev = event("plain", "evt_w", "1042", &[], b"{}");
            sink.apply(&ev).await
        })
    };
    // Let the waiter take the only connection and block on the row.
    let mut snapshot = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = sink.lock_snapshot().await.expect("snapshot");
        if s.waiting == 1 {
            snapshot = Some(s);
            break;
        }
    }
    let snapshot = snapshot.expect("one session waits on the lock");
    assert_eq!(snapshot.blockers, vec![holder_pid]);
    assert_eq!(sink.pool_usage(), (1, 1));

    // The pool is exhausted: an unrelated row cannot get a connection.
    let started = Instant::now();
    let ev = event("plain", "evt_other", "1043", &[], b"{}");
    let err = sink.apply(&ev).await.expect_err("pool exhausted");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "pool_timeout"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    holder.batch_execute("ROLLBACK").await.expect("release");
    let applied = waiter
        .await
        .expect("join")
        .expect("applied after the release");
    assert_eq!(applied, Applied::New);
    assert_eq!(
        sink.apply(&ev).await.expect("pool free again"),
        Applied::New
    );
}

/// Another application waiting on its own lock, in a table Breakwater never
/// touches, is not Breakwater's trouble: the default scope leaves it out,
/// the whole-database scope counts it.
#[tokio::test]
async fn another_applications_lock_waits_count_only_in_the_database_scope() {
    let db = TestDb::new().await;
    let settings = db.settings();
    let (ours, c) = setup(&db, &settings).await;
    let whole = connect(
        &SinkSettings {
            lock_waiters_scope: LockWaitersScope::Database,
            ..db.settings()
        },
        &statements(),
    )
    .await
    .expect("connect");
    c.batch_execute(
        "CREATE TABLE other_app (id int PRIMARY KEY); INSERT INTO other_app VALUES (1)",
    )
    .await
    .expect("other table");
    let holder = db.client().await;
    holder
        .batch_execute("BEGIN; SELECT * FROM other_app WHERE id = 1 FOR UPDATE")
        .await
        .expect("lock");
    let waiter = db.client().await;
    let blocked = tokio::spawn(async move {
        waiter
            .batch_execute("UPDATE other_app SET id = 1 WHERE id = 1")
            .await
    });
    let mut seen = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = whole.lock_snapshot().await.expect("snapshot");
        if s.waiting == 1 {
            seen = Some(s);
            break;
        }
    }
    assert!(seen.is_some(), "the whole-database scope sees the waiter");
    let s = ours.lock_snapshot().await.expect("snapshot");
    assert_eq!(s.waiting, 0, "another application's wait counted: {s:?}");
    holder.batch_execute("ROLLBACK").await.expect("release");
    blocked.await.expect("join").expect("the waiter's update");
}

#[tokio::test]
async fn unreachable_database_is_a_failure_worth_retrying_and_a_bad_url_is_not() {
    let mut settings = SinkSettings::new("postgres://postgres@127.0.0.1:1/test");
    settings.acquire_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = match connect(&settings, &BTreeMap::new()).await {
        Err(e) => e,
        Ok(_) => panic!("connected to a closed port"),
    };
    assert!(matches!(err, SinkSetupError::Unreachable(_)), "{err}");
    assert!(err.to_string().to_lowercase().contains("refused"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let bad = SinkSettings::new("postgres://postgres@127.0.0.1:5432/test?no_such_option=1");
    let err = match connect(&bad, &BTreeMap::new()).await {
        Err(e) => e,
        Ok(_) => panic!("accepted an unknown URL option"),
    };
    assert!(matches!(err, SinkSetupError::Connect(_)), "{err}");
}

/// A TCP proxy to PostgreSQL that can be cut.
struct Proxy {
    port: u16,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let tasks = Arc::new(std::sync::Mutex::new(Vec::new()));
        let accept = {
            let tasks = Arc::clone(&tasks);
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let upstream = upstream.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    tasks.lock().expect("tasks").push(task);
                }
            })
        };
        Self {
            port,
            tasks,
            accept,
        }
    }

    fn cut(&self) {
        self.accept.abort();
        for task in self.tasks.lock().expect("tasks").drain(..) {
            task.abort();
        }
    }
}

#[tokio::test]
async fn a_lost_connection_is_a_dependency_failure() {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute(ORDERS)
        .await
        .expect("schema");
    let proxy = Proxy::start("127.0.0.1:5432".to_owned()).await;
    let mut settings = db.settings();
    settings.url = format!("postgres://postgres@127.0.0.1:{}/{}", proxy.port, db.name);
    let sink = connect(&settings, &statements())
        .await
        .expect("connect through the proxy");
    let ev = event("plain", "evt_p1", "1042", &[], b"{}");
    assert_eq!(
        sink.apply(&ev).await.expect("through the proxy"),
        Applied::New
    );

    proxy.cut();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ev = event("plain", "evt_p2", "1042", &[], b"{}");
    let err = sink.apply(&ev).await.expect_err("database gone");
    assert_eq!(
        (err.class, err.kind),
        (FailureClass::Dependency, "connection"),
        "{err}"
    );
    assert!(sink.lock_snapshot().await.is_none());
}

#[tokio::test]
async fn config_bugs_surface_at_connect() {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute(ORDERS)
        .await
        .expect("schema");
    let mut bad = BTreeMap::new();
    bad.insert(
        "s".to_owned(),
        vec![spec("UPDATE orders SET status = $stauts", &[])],
    );
    match connect(&db.settings(), &bad).await {
        Err(SinkSetupError::Statement {
            source_name,
            index,
            message,
        }) => {
            assert_eq!((source_name.as_str(), index), ("s", 0));
            assert!(message.contains("$stauts"), "{message}");
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("accepted an unknown parameter"),
    }

    // Statements the database rejects stop the service at startup, naming
    // the source, the statement's index and the database's message.
    let good = spec("UPDATE orders SET hits = hits + 1 WHERE id = $entity", &[]);
    let x: &[(&str, &str)] = &[("x", "json:/x")];
    for (bad_sql, params, code, needle) in [
        (
            "UPDATE nope SET a = 1 WHERE id = $entity",
            &[][..],
            "42P01",
            "nope",
        ),
        (
            "UPDATE orders SET nope = 1 WHERE id = $entity",
            &[],
            "42703",
            "nope",
        ),
        (
            "UPDATE orders SET hits = 1 WHER id = $entity",
            &[],
            "42601",
            "WHER",
        ),
        (
            "UPDATE orders SET hits = 1 WHERE $x IS NULL",
            x,
            "42P18",
            "$1",
        ),
    ] {
        let mut all = BTreeMap::new();
        all.insert("fine".to_owned(), vec![good.clone()]);
        all.insert("s".to_owned(), vec![good.clone(), spec(bad_sql, params)]);
        match connect(&db.settings(), &all).await {
            Err(SinkSetupError::Statement {
                source_name,
                index,
                message,
            }) => {
                assert_eq!((source_name.as_str(), index), ("s", 1), "{message}");
                assert!(message.contains(code), "{bad_sql}: {message}");
                assert!(message.contains(needle), "{bad_sql}: {message}");
            }
            Err(other) => panic!("{bad_sql}: unexpected {other}"),
            Ok(_) => panic!("accepted {bad_sql}"),
        }
    }

    // Good statements pass the check and still apply.
    let mut fine = BTreeMap::new();
    fine.insert("s".to_owned(), vec![good]);
    let sink = connect(&db.settings(), &fine).await.expect("connect");
    assert_eq!(
        sink.apply(&event("s", "evt_x", "1042", &[], b"{}"))
            .await
            .expect("applied"),
        Applied::New
    );
    let c = db.client().await;
    assert_eq!(hits(&c, 1042).await, 1);
    // Connecting twice (a second node) leaves the inbox table alone.
    connect(&db.settings(), &BTreeMap::new())
        .await
        .expect("again");
}

#[tokio::test]
async fn the_same_event_id_from_two_sources_applies_twice() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(ORDERS).await.expect("schema");
    let bump = spec("UPDATE orders SET hits = hits + 1 WHERE id = $entity", &[]);
    let mut all = BTreeMap::new();
    all.insert("webhooks_a".to_owned(), vec![bump.clone()]);
    all.insert("webhooks_b".to_owned(), vec![bump]);
    let sink = connect(&db.settings(), &all).await.expect("connect");

    let a = event("webhooks_a", "msg_same", "1042", &[], b"{}");
    let b = event("webhooks_b", "msg_same", "1042", &[], b"{}");
    assert_eq!(sink.apply(&a).await.expect("a"), Applied::New);
    assert_eq!(sink.apply(&b).await.expect("b"), Applied::New);
    assert_eq!(hits(&c, 1042).await, 2, "both sources' statements ran");
    assert_eq!(sink.apply(&a).await.expect("a again"), Applied::Duplicate);
    assert_eq!(sink.apply(&b).await.expect("b again"), Applied::Duplicate);
    assert_eq!(hits(&c, 1042).await, 2, "redeliveries had no effect");
    let sources: Vec<String> = c
        .query(
            "SELECT source FROM breakwater_inbox WHERE event_id = 'msg_same' ORDER BY source",
            &[],
        )
        .await
        .expect("inbox")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(sources, ["webhooks_a", "webhooks_b"]);
}

#[tokio::test]
async fn an_inbox_keyed_on_event_id_alone_fails_setup() {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE breakwater_inbox (
                 event_id text PRIMARY KEY, source text NOT NULL, entity_key text,
                 payload jsonb, received_at timestamptz NOT NULL, applied_at timestamptz
             )",
        )
        .await
        .expect("old inbox");
    match connect(&db.settings(), &BTreeMap::new()).await {
        Err(SinkSetupError::Migrate(message)) => {
            assert!(message.contains("primary key (event_id)"), "{message}");
            assert!(message.contains("(source, event_id)"), "{message}");
            assert!(message.contains("RENAME"), "{message}");
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("accepted the old inbox key"),
    }
}

#[tokio::test]
async fn a_locked_table_at_startup_times_out_instead_of_hanging() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(ORDERS).await.expect("schema");
    let holder = db.client().await;
    holder
        .batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the table");
    let settings = db.settings();
    let started = Instant::now();
    match connect(&settings, &statements()).await {
        Err(SinkSetupError::Statement { message, .. }) => {
            assert!(message.contains("55P03"), "{message}");
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("prepared against a locked table"),
    }
    assert!(
        started.elapsed() < settings.lock_timeout * 5,
        "{:?}",
        started.elapsed()
    );
    holder.batch_execute("ROLLBACK").await.expect("release");
    connect(&settings, &statements())
        .await
        .expect("connects once the lock is gone");
}

/// PostgreSQL holds U+0000 in neither jsonb nor text. A signed body
/// spelling `\u0000` applies where no statement hands that value to the
/// server (the inbox keeps the payload as a JSON string); passed through
/// `$payload` into jsonb or as a text parameter, it is a permanent failure
/// of that one message (kind `data`, with its SQLSTATE), and nothing of it
/// is committed.
#[tokio::test]
async fn a_nul_reaching_jsonb_or_text_is_a_permanent_failure_with_its_sqlstate() {
    let db = TestDb::new().await;
    let (sink, c) = setup(&db, &db.settings()).await;
    let h = headers();
    let cases: [(&str, &[u8], &str); 2] = [
        (
            "evt_nul_payload",
            br#"{"data":{"object":{"status":"paid"}},"note":"a\u0000b"}"#,
            "22P05",
        ),
        (
            "evt_nul_text",
            br#"{"data":{"object":{"status":"pa\u0000id"}}}"#,
            "22021",
        ),
    ];
    for (id, body, sqlstate) in cases {
        let err = sink
            .apply(&event("stripe", id, "1042", &h, body))
            .await
            .expect_err("PostgreSQL refuses U+0000");
        assert!(err.is_permanent(), "{id}: {err}");
        assert_eq!(err.code.as_deref(), Some(sqlstate), "{id}: {err}");
        assert_eq!(err.kind, "data", "{id}: {err}");
        let inbox: i64 = c
            .query_one(
                "SELECT count(*) FROM breakwater_inbox WHERE event_id = $1",
                &[&id],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(inbox, 0, "{id}: nothing of a failed apply is committed");
    }
    assert_eq!(hits(&c, 1042).await, 0);
}

/// The stale-event guard's orders table and its one source: `shop`, whose
/// version is Shopify's `updated_at` (an RFC 3339 time), and whose
/// statement records the version it applied and may sleep (`sleep`, in
/// seconds) with the key's version row locked.
const VERSIONED: &str = "
CREATE TABLE versioned (
    id      bigint PRIMARY KEY,
    status  text NOT NULL,
    version bigint,
    hits    int NOT NULL DEFAULT 0
);
INSERT INTO versioned (id, status) VALUES (7, 'new'), (8, 'new');";

fn versioned_statements() -> BTreeMap<String, Vec<StatementSpec>> {
    let mut all = BTreeMap::new();
    all.insert(
        "shop".to_owned(),
        vec![
            spec(
                "UPDATE versioned SET status = $status, version = $version, hits = hits + 1 \
                 WHERE id = $entity::bigint",
                &[("status", "json:/status")],
            ),
            spec("SELECT pg_sleep($sleep)", &[("sleep", "json:/sleep")]),
        ],
    );
    all
}

fn versioned_settings(db: &TestDb) -> SinkSettings {
    let mut s = db.settings();
    s.versions
        .insert("shop".to_owned(), "json:/updated_at".to_owned());
    s
}

fn shop_body(status: &str, updated_at: Option<&str>, sleep: f64) -> Vec<u8> {
    let mut body = serde_json::json!({"status": status, "sleep": sleep});
    if let Some(at) = updated_at {
        body["updated_at"] = serde_json::Value::from(at);
    }
    serde_json::to_vec(&body).expect("json")
}

async fn applies_shop(sink: &dyn Sink, id: &str, key: &str, body: &[u8]) -> Applied {
    sink.apply(&event("shop", id, key, &[], body))
        .await
        .unwrap_or_else(|e| panic!("{id}: {e}"))
}

async fn versioned_row(c: &Client, id: i64) -> (String, Option<i64>, i32) {
    let row = c
        .query_one(
            "SELECT status, version, hits FROM versioned WHERE id = $1",
            &[&id],
        )
        .await
        .expect("row");
    (row.get(0), row.get(1), row.get(2))
}

async fn superseded_by(c: &Client, id: &str) -> Option<String> {
    c.query_one(
        "SELECT superseded_by FROM breakwater_inbox WHERE source = 'shop' AND event_id = $1",
        &[&id],
    )
    .await
    .unwrap_or_else(|e| panic!("{id} has an inbox row: {e}"))
    .get(0)
}

/// One key's webhooks applied newest first end at the newest: the older
/// ones are superseded (statements not run, inbox row kept naming the
/// newer event, a redelivery a duplicate); an equal version applies; an
/// event without a version applies as before; one whose
/// version is not one is a permanent failure saying which value and why.
#[tokio::test]
async fn version_guard_supersedes_older_events_of_a_key() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(VERSIONED).await.expect("schema");
    let sink = connect(&versioned_settings(&db), &versioned_statements())
        .await
        .expect("connect");
    let micros = |at: &str| {
        chrono::DateTime::parse_from_rfc3339(at)
            .expect("time")
            .timestamp_micros()
    };
    // Newest first; the last one in another offset, a second older.
    let newest = "2024-01-01T10:00:02-05:00";
    let sent = [
        ("evt_3", "refunded", newest),
        ("evt_2", "paid", "2024-01-01T10:00:01-05:00"),
        ("evt_1", "pending", "2024-01-01T16:00:01+01:00"),
    ];
    for (id, status, at) in sent {
        let applied = applies_shop(&*sink, id, "7", &shop_body(status, Some(at), 0.0)).await;
        let expected = if id == "evt_3" {
            Applied::New
        } else {
            Applied::Superseded {
                by: "evt_3".to_owned(),
            }
        };
        assert_eq!(applied, expected, "{id}");
    }
    assert_eq!(
        versioned_row(&c, 7).await,
        ("refunded".to_owned(), Some(micros(newest)), 1),
        "the newest state, its statement run once"
    );
    assert_eq!(superseded_by(&c, "evt_3").await, None);
    for id in ["evt_2", "evt_1"] {
        assert_eq!(
            superseded_by(&c, id).await.as_deref(),
            Some("evt_3"),
            "{id}"
        );
    }
    match sink.inbox_lookup("shop", "evt_2").await.expect("lookup") {
        breakwater_sink::InboxLookup::Found(r) => {
            assert_eq!(r.superseded_by.as_deref(), Some("evt_3"));
            assert!(r.applied_at_ms.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        applies_shop(
            &*sink,
            "evt_2",
            "7",
            &shop_body("paid", Some(sent[1].2), 0.0)
        )
        .await,
        Applied::Duplicate,
        "a superseded event delivered again"
    );

    // Another key is not held back by this one's version.
    assert_eq!(
        applies_shop(
            &*sink,
            "evt_8",
            "8",
            &shop_body("paid", Some(sent[2].2), 0.0)
        )
        .await,
        Applied::New
    );
    // An equal version applies, in the order it comes.
    assert_eq!(
        applies_shop(&*sink, "evt_3b", "7", &shop_body("paid", Some(newest), 0.0)).await,
        Applied::New
    );
    assert_eq!(
        versioned_row(&c, 7).await,
        ("paid".to_owned(), Some(micros(newest)), 2)
    );
    // No version: no guard, applied as it would be without one.
    assert_eq!(
        applies_shop(&*sink, "evt_none", "7", &shop_body("pending", None, 0.0)).await,
        Applied::New
    );
    assert_eq!(versioned_row(&c, 7).await, ("pending".to_owned(), None, 3));
    // A version that is not one: dead-lettered, saying which and why.
    let err = sink
        .apply(&event(
            "shop",
            "evt_bad",
            "7",
            &[],
            &shop_body("paid", Some("yesterday"), 0.0),
        ))
        .await
        .expect_err("not a version");
    assert!(err.is_permanent(), "{err}");
    assert_eq!(err.kind, "invalid_version");
    assert!(err.message.contains("json:/updated_at"), "{err}");
    assert!(err.message.contains("yesterday"), "{err}");
    let kept: i64 = c
        .query_one(
            "SELECT count(*) FROM breakwater_inbox WHERE event_id = 'evt_bad'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(kept, 0);
    let stored: (i64, String) = c
        .query_one(
            "SELECT version, event_id FROM breakwater_versions \
             WHERE source = 'shop' AND entity_key = '7'",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .expect("the key's version row");
    assert_eq!(stored, (micros(newest), "evt_3b".to_owned()));
}

/// Two sessions applying one key at once: the second waits for the
/// first's transaction (the version row's lock) and compares with what it
/// committed, so an older event never overwrites a newer one that is
/// still being applied, and a newer one applies after an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_guard_orders_two_sessions_of_one_key() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(VERSIONED).await.expect("schema");
    let mut settings = versioned_settings(&db);
    settings.lock_timeout = Duration::from_millis(3000);
    settings.statement_timeout = Duration::from_millis(6000);
    let sink = connect(&settings, &versioned_statements())
        .await
        .expect("connect");
    let (older, newer) = ("2024-01-01T10:00:00Z", "2024-01-01T10:00:05Z");
    for (key, first, second) in [("7", newer, older), ("8", older, newer)] {
        let slow = {
            let sink = Arc::clone(&sink);
            let body = shop_body(&format!("first {first}"), Some(first), 0.8);
            let id = format!("evt_{key}_first");
            tokio::spawn(async move { applies_shop(&*sink, &id, key, &body).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let then = applies_shop(
            &*sink,
            &format!("evt_{key}_second"),
            key,
            &shop_body(&format!("second {second}"), Some(second), 0.0),
        )
        .await;
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "key {key}: the second waited for the first's transaction"
        );
        assert_eq!(slow.await.expect("first"), Applied::New, "key {key}");
        let (status, _, hits) = versioned_row(&c, key.parse().expect("id")).await;
        assert_eq!(
            status,
            format!(
                "{} {newer}",
                if first == newer { "first" } else { "second" }
            )
        );
        if first == newer {
            assert_eq!(
                then,
                Applied::Superseded {
                    by: format!("evt_{key}_first")
                }
            );
            assert_eq!(hits, 1);
        } else {
            assert_eq!(then, Applied::New);
            assert_eq!(hits, 2);
        }
    }
}

/// An inbox made before the guard gains `superseded_by` at start, and a
/// start against it once it has the column changes nothing.
#[tokio::test]
async fn version_guard_adds_superseded_by_to_an_older_inbox() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(VERSIONED).await.expect("schema");
    c.batch_execute(
        "CREATE TABLE breakwater_inbox (event_id text NOT NULL, source text NOT NULL,
         entity_key text, payload jsonb, received_at timestamptz NOT NULL,
         applied_at timestamptz, PRIMARY KEY (source, event_id));
         INSERT INTO breakwater_inbox VALUES ('evt_old', 'shop', '7', '{}', now(), now());",
    )
    .await
    .expect("an older inbox");
    for _ in 0..2 {
        let sink = connect(&versioned_settings(&db), &versioned_statements())
            .await
            .expect("connect");
        assert_eq!(superseded_by(&c, "evt_old").await, None);
        drop(sink);
    }
    let sink = connect(&versioned_settings(&db), &versioned_statements())
        .await
        .expect("connect");
    let newer = shop_body("paid", Some("2024-01-01T10:00:05Z"), 0.0);
    let older = shop_body("pending", Some("2024-01-01T10:00:00Z"), 0.0);
    assert_eq!(
        applies_shop(&*sink, "evt_b", "7", &newer).await,
        Applied::New
    );
    assert_eq!(
        applies_shop(&*sink, "evt_a", "7", &older).await,
        Applied::Superseded {
            by: "evt_b".to_owned()
        }
    );
}

/// `$version` needs its source to have a version: a statement using it on
/// one without fails setup, naming the source and the statement.
#[tokio::test]
async fn version_parameter_without_a_source_version_fails_setup() {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute(VERSIONED)
        .await
        .expect("schema");
    let err = match connect(&db.settings(), &versioned_statements()).await {
        Err(e) => e,
        Ok(_) => panic!("connected without a version for $version"),
    };
    match err {
        SinkSetupError::Statement {
            source_name,
            index,
            message,
        } => {
            assert_eq!((source_name.as_str(), index), ("shop", 0));
            assert!(message.contains("$version"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}
