//! Order per entity key through the real binary and a real PostgreSQL,
//! on the segment log and on Kafka: each order's webhooks are sent one
//! after another (each waits for its 2xx), and the statements must run in
//! that order through a locked row, a transient failure, a `kill -9` and
//! (Kafka) a fleet of three worker processes, so every row ends at its
//! last accepted state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::orders::BrokerQueue;
use crate::pg::ScratchDb;
use crate::utils::*;

/// The queue a test runs on.
#[derive(Debug, Clone, Copy)]
enum On {
    /// The segment log under the sandbox.
    Log,
    /// Topics of the test's own on the local Kafka (two partitions).
    Kafka,
}

/// A sandbox with the test's config on `on`, and the broker queue it uses
/// (deleted when dropped, after the sandbox's processes).
fn sandbox(db: &ScratchDb, on: On, extra: &str) -> (Sandbox, Option<BrokerQueue>) {
    let config = format!("{}{extra}", config(db));
    match on {
        On::Log => (Sandbox::new(&config), None),
        On::Kafka => {
            let queue = crate::kafka::queue();
            let toml = crate::kafka::queue_toml(&queue, &crate::kafka::kafka_url());
            (Sandbox::with_queue(&toml, &config), Some(queue))
        }
    }
}

/// Orders, and a log of every statement run: `run` is the order the
/// statements ran in, `seq` the order the webhooks were accepted in.
/// Sequence `flaky` is drawn by a trigger to fail an order's chosen
/// webhook with a serialization failure (a dependency failure, retried)
/// a few times: sequences are not rolled back with the transaction.
const SCHEMA: &str = "
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'new', seq int NOT NULL DEFAULT 0);
INSERT INTO orders (id) SELECT g FROM generate_series(1, 6) g;
INSERT INTO orders (id) VALUES (1042);
CREATE TABLE applied (run bigserial PRIMARY KEY, order_id bigint NOT NULL, seq int NOT NULL);
CREATE TABLE flaky_target (order_id bigint, seq int, failures int);
CREATE SEQUENCE flaky;
CREATE FUNCTION flaky_apply() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE f int;
BEGIN
  SELECT failures INTO f FROM flaky_target t WHERE t.order_id = NEW.order_id AND t.seq = NEW.seq;
  IF f IS NOT NULL THEN
    IF nextval('flaky') <= f THEN
      RAISE EXCEPTION 'transient failure of order % seq %', NEW.order_id, NEW.seq
        USING ERRCODE = '40001';
    END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER flaky BEFORE INSERT ON applied FOR EACH ROW EXECUTE FUNCTION flaky_apply();
";

fn config(db: &ScratchDb) -> String {
    format!(
        r#"
[sink]
url = "{}"
lock_timeout_ms = 300
statement_timeout_ms = 3000
pool_max = 8
acquire_timeout_ms = 1000

[workers]
max_concurrency = 8
max_attempts = 10
backoff_base_ms = 100
backoff_cap_ms = 400

[[source.statement]]
sql = "UPDATE orders SET status = $status, seq = $seq WHERE id = $entity"
params = {{ status = "json:/data/object/status", seq = "json:/seq" }}

[[source.statement]]
sql = "INSERT INTO applied (order_id, seq) VALUES ($entity, $seq)"
params = {{ seq = "json:/seq" }}
"#,
        db.url()
    )
}

/// Sends webhook `seq` of `order` and waits for its 202.
async fn send(http: &Http, server: &Server, order: i64, seq: i32) {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": format!("evt_{order}_{seq}"),
        "type": "order.updated",
        "seq": seq,
        "data": {"object": {"id": order, "status": format!("status-{seq}")}}
    }))
    .expect("json");
    let a = post_stripe(http, server, body).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
}

/// Per order, the sequence numbers in the order their statements ran.
async fn runs(db: &ScratchDb) -> BTreeMap<i64, Vec<i32>> {
    let rows = db
        .client
        .query("SELECT order_id, seq FROM applied ORDER BY run", &[])
        .await
        .expect("applied");
    let mut out: BTreeMap<i64, Vec<i32>> = BTreeMap::new();
    for r in rows {
        out.entry(r.get(0)).or_default().push(r.get(1));
    }
    out
}

async fn wait_until_applied(db: &ScratchDb, total: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: usize = runs(db).await.values().map(Vec::len).sum();
        if n >= total {
            return;
        }
        assert!(Instant::now() < deadline, "{n} of {total} applied in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every order's statements ran once each, in acceptance order, and its
/// row holds its last webhook's status.
async fn assert_in_order(db: &ScratchDb, sent: &BTreeMap<i64, i32>) {
    let runs = runs(db).await;
    for (&order, &last) in sent {
        let expected: Vec<i32> = (1..=last).collect();
        assert_eq!(runs.get(&order), Some(&expected), "order {order}");
        let row = db
            .client
            .query_one("SELECT status, seq FROM orders WHERE id = $1", &[&order])
            .await
            .expect("row");
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, i32>(1)),
            (format!("status-{last}"), last),
            "order {order} ends at its last accepted state"
        );
    }
}

/// Order 1042's row is held for 4 s while every order gets its webhooks
/// one after another: 1042's wait behind the locked one and run in order
/// once the lock lifts; the other orders are not held up meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_rows_webhooks_run_in_acceptance_order_once_it_frees() {
    a_locked_rows_webhooks_run_in_order(On::Log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_locked_rows_webhooks_run_in_acceptance_order() {
    a_locked_rows_webhooks_run_in_order(On::Kafka).await;
}

async fn a_locked_rows_webhooks_run_in_order(on: On) {
    let db = ScratchDb::create().await;
    db.client.batch_execute(SCHEMA).await.expect("schema");
    let (sandbox, queue) = sandbox(&db, on, "");
    let server = sandbox.start();
    let http = Http::default();

    let locker = db.lock_order(1042).await;
    let mut sent = BTreeMap::new();
    for seq in 1..=30 {
        for order in [1042, 1, 2, 3] {
            send(&http, &server, order, seq).await;
            sent.insert(order, seq);
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    wait_until_applied(&db, 90).await;
    assert!(!runs(&db).await.contains_key(&1042), "1042 is locked");
    tokio::time::sleep(Duration::from_secs(2)).await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");

    wait_until_applied(&db, 120).await;
    assert_in_order(&db, &sent).await;
    assert_eq!(queue_stats(&http, &server).await["dead_lettered"], 0);
    drop(server);
    drop(queue);
    db.drop_db().await;
}

/// One webhook of order 2 fails three times with a dependency failure
/// before it applies: the ones after it wait for it, and order 2 still
/// runs in acceptance order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_webhooks_of_a_key_wait_for_one_being_retried() {
    later_webhooks_wait_for_a_retry(On::Log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_later_webhooks_of_a_key_wait_for_one_being_retried() {
    later_webhooks_wait_for_a_retry(On::Kafka).await;
}

async fn later_webhooks_wait_for_a_retry(on: On) {
    let db = ScratchDb::create().await;
    db.client.batch_execute(SCHEMA).await.expect("schema");
    db.client
        .batch_execute("INSERT INTO flaky_target VALUES (2, 3, 3)")
        .await
        .expect("flaky");
    let (sandbox, queue) = sandbox(&db, on, "");
    let server = sandbox.start();
    let http = Http::default();
    let mut sent = BTreeMap::new();
    for seq in 1..=12 {
        for order in [1, 2] {
            send(&http, &server, order, seq).await;
            sent.insert(order, seq);
        }
    }
    wait_until_applied(&db, 24).await;
    let failed: i64 = db
        .client
        .query_one("SELECT last_value FROM flaky", &[])
        .await
        .expect("flaky")
        .get(0);
    assert!(failed >= 3, "the chosen webhook failed ({failed} draws)");
    assert_in_order(&db, &sent).await;
    drop(server);
    drop(queue);
    db.drop_db().await;
}

/// `kill -9` while a key's backlog waits behind its locked row (and
/// another key's webhook is being retried): after a restart the store's
/// lines are rebuilt and the backlogs still run in acceptance order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_survives_a_kill_9_while_a_key_waits() {
    order_survives_a_kill_9(On::Log).await;
}

/// On Kafka the restarted worker reads from the last commit, which held
/// at 1042's unfinished head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_order_survives_a_kill_9_while_a_key_waits() {
    order_survives_a_kill_9(On::Kafka).await;
}

async fn order_survives_a_kill_9(on: On) {
    let db = ScratchDb::create().await;
    db.client.batch_execute(SCHEMA).await.expect("schema");
    // And order 5's third webhook fails three times: its later ones wait.
    db.client
        .batch_execute("INSERT INTO flaky_target VALUES (5, 3, 3)")
        .await
        .expect("flaky");
    let (sandbox, queue) = sandbox(&db, on, "");
    let mut server = sandbox.start();
    let http = Http::default();
    let locker = db.lock_order(1042).await;
    let mut sent = BTreeMap::new();
    for seq in 1..=20 {
        for order in [1042, 5] {
            send(&http, &server, order, seq).await;
            sent.insert(order, seq);
        }
    }
    // The lock timeouts have parked 1042 and handed its head back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill9();
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let server = sandbox.start();
    wait_until_applied(&db, 40).await;
    assert_in_order(&db, &sent).await;
    drop(server);
    drop(queue);
    db.drop_db().await;
}

/// One ingress and three worker processes on Kafka sharing a breaker
/// through Redis: 1042's row is locked while every order gets its
/// webhooks, and one worker is killed mid-way (its partitions move to the
/// others, which read them again from the commit), and one webhook of
/// order 2 fails three times before it applies. Every order still runs in
/// acceptance order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_fleet_of_three_workers_keeps_each_key_in_order() {
    use crate::fleet::{one_fleet_at_a_time, shared_redis, start_node, unique_prefix};
    let _one = one_fleet_at_a_time().await;
    let db = ScratchDb::create().await;
    db.client.batch_execute(SCHEMA).await.expect("schema");
    let fleet = format!(
        "\n[fleet]\nredis_url = \"{}\"\nprefix = \"{}\"\n",
        shared_redis(),
        unique_prefix()
    );
    // And order 2's fifth webhook fails three times: its later ones wait.
    db.client
        .batch_execute("INSERT INTO flaky_target VALUES (2, 5, 3)")
        .await
        .expect("flaky");
    let (sandbox, queue) = sandbox(&db, On::Kafka, &fleet);
    let ingress = start_node(&sandbox, "ingress", "ingress", &[]);
    let mut workers: Vec<Server> = (1..=3)
        .map(|i| start_node(&sandbox, "worker", &format!("w{i}"), &[]))
        .collect();
    let http = Http::default();
    let locker = db.lock_order(1042).await;
    let mut sent = BTreeMap::new();
    for seq in 1..=24 {
        if seq == 12 {
            workers[0].kill9();
        }
        for order in [1042, 1, 2, 3, 4, 5, 6] {
            send(&http, &ingress, order, seq).await;
            sent.insert(order, seq);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    wait_until_applied(&db, 7 * 24).await;
    assert_in_order(&db, &sent).await;
    drop(workers);
    drop(ingress);
    drop(queue);
    db.drop_db().await;
}
